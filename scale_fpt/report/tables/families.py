"""Multiplicity families as the analysis plan declared them (``scale_fpt.analysis_plan``),
not as a results folder happens to group them: each comparison's p-values are
Benjamini-Hochberg adjusted within its declared family of its sweep; a comparison the plan
did not declare (or a sweep without a plan) is "exploratory", adjusted only among the
exploratory ones of its table and marked so."""

from __future__ import annotations

import pandas as pd

from scale_fpt.report.stats import adjust_p

EXPLORATORY = "exploratory (not in the analysis plan)"


def family_labels(frame: pd.DataFrame, plans: dict, kind: str, contrast) -> pd.Series:
    """Per row: '<sweep>: <family>' where its sweep's plan declares ``contrast`` (a column
    name or one contrast for every row) for ``kind``, else ``EXPLORATORY``."""
    contrasts = frame[contrast] if contrast in frame else pd.Series(contrast, index=frame.index)
    labels = []
    for sweep, name in zip(frame["sweep"], contrasts, strict=True):
        plan = plans.get(sweep)
        family = plan.family_of(name, kind) if plan else None
        labels.append(f"{sweep}: {family}" if family else EXPLORATORY)
    return pd.Series(labels, index=frame.index, dtype=str)


def adjust_in_families(
    frame: pd.DataFrame, plans: dict, kind: str, p_column: str, contrast, family_column: str
) -> pd.DataFrame:
    """``frame`` with ``family_column`` (``family_labels``) and ``<p_column>_adjusted``
    recomputed within each family."""
    if frame.empty:
        return frame
    out = frame.assign(**{family_column: family_labels(frame, plans, kind, contrast)})
    adjusted = pd.Series(float("nan"), index=out.index)
    for _, rows in out.groupby(family_column, sort=False):
        adjusted[rows.index] = adjust_p(rows[p_column])
    return out.assign(**{f"{p_column}_adjusted": adjusted})
