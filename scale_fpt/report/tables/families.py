"""Multiplicity families as the analysis plan declared them (``scale_fpt.analysis_plan``),
not as a results folder happens to group them: each comparison's p-values are
Benjamini-Hochberg adjusted within its declared family of its sweep, whichever tables show
its rows (the pretrained-random table and the LR-fair table share the family "accuracy:
pretrained - random"), and a test shown in two tables counts once. A confirmation sweep's
rows belong to the family of the sweep whose plan they follow. A comparison the plan did
not declare (or a sweep without a plan) is "exploratory", adjusted only among the
exploratory ones of its table and marked so."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from scale_fpt.report.stats import adjust_p

EXPLORATORY = "exploratory (not in the analysis plan)"


def family_labels(frame: pd.DataFrame, plans: dict, kind: str, contrast) -> pd.Series:
    """Per row: '<plan's sweep>: <family>' where its sweep's plan (a confirmation sweep's is
    its search sweep's) declares ``contrast`` (a column name or one contrast for every row)
    for ``kind``, else ``EXPLORATORY``."""
    contrasts = frame[contrast] if contrast in frame else pd.Series(contrast, index=frame.index)
    labels = []
    for sweep, name in zip(frame["sweep"], contrasts, strict=True):
        plan = plans.get(sweep)
        family = plan.family_of(name, kind) if plan else None
        labels.append(f"{plan.sweep}: {family}" if family else EXPLORATORY)
    return pd.Series(labels, index=frame.index, dtype=str)


@dataclass(frozen=True)
class Shown:
    """One table's rows of a kind of comparison: its ``frame``, the column of each row's
    ``family`` (``family_labels``), its ``p`` column and the ``test`` columns that make two
    rows of different tables one test (the same numbers from the same seeds)."""

    frame: pd.DataFrame
    family: str
    p: str
    test: tuple[str, ...]


def adjust_together(tables: list[Shown]) -> list[pd.DataFrame]:
    """Each table's frame with ``<p>_adjusted``: Benjamini-Hochberg within each family over
    the rows of every table at once, a test shown in two tables counted once; exploratory
    rows only among those of their own table; ``<p>_family_size``: the tests of its
    family (the power statements' level, 0.05 / size); and ``<outcome>status``: 'planned' or
    'exploratory' (``report.columns``: ``accuracy_p`` -> ``accuracy_status``)."""
    parts = [
        pd.DataFrame(
            {
                "table": i,
                "row": t.frame.index,
                "family": t.frame[t.family].where(
                    t.frame[t.family] != EXPLORATORY, EXPLORATORY + f" {i}"
                ),
                "p": t.frame[t.p].astype(float),
                "test": test_keys(t, i),
            }
        )
        for i, t in enumerate(tables)
        if not t.frame.empty
    ]
    if not parts:
        return [t.frame for t in tables]
    long = pd.concat(parts, ignore_index=True)
    once = long.drop_duplicates(["family", "test"])
    adjusted = pd.Series(float("nan"), index=once.index)
    for _, rows in once.groupby("family", sort=False):
        adjusted[rows.index] = adjust_p(rows["p"])
    by_test = dict(zip(zip(once["family"], once["test"], strict=True), adjusted, strict=True))
    long["adjusted"] = [by_test[key] for key in zip(long["family"], long["test"], strict=True)]
    sizes = once[once["p"].notna()].groupby("family").size()
    long["size"] = long["family"].map(sizes).fillna(1).astype(int)
    out = []
    for i, t in enumerate(tables):
        if t.frame.empty:
            out.append(t.frame)
            continue
        mine = long[long["table"] == i].set_index("row")
        out.append(
            t.frame.assign(**{
                f"{t.p}_adjusted": mine["adjusted"].reindex(t.frame.index),
                f"{t.p}_family_size": mine["size"].reindex(t.frame.index),
                f"{t.p.removesuffix('p')}status": status(t.frame[t.family]),
            })
        )  # fmt: skip
    return out


def status(families: pd.Series) -> pd.Series:
    """'exploratory' or 'planned' per row of ``families`` (``family_labels``)."""
    return families.eq(EXPLORATORY).map({True: "exploratory", False: "planned"})


def test_keys(shown: Shown, table: int) -> list[tuple]:
    """What makes a row of ``shown`` the same test as a row of another table: its task and
    ``shown.test`` numbers; with no ``test`` columns, every row is a test of its own."""
    frame = shown.frame
    if not shown.test:
        return [(table, row) for row in frame.index]
    # As text: a NaN (a row with no test) is then equal to itself, as a key must be.
    numbers = (frame[c].astype(float).round(12).map(repr) for c in shown.test)
    return list(zip(frame["task"], *numbers, strict=True))


def adjust_in_families(
    frame: pd.DataFrame, plans: dict, kind: str, p_column: str, contrast, family_column: str
) -> pd.DataFrame:
    """``frame`` with ``family_column`` (``family_labels``) and ``<p_column>_adjusted``
    recomputed within each family (a family shown in this table only)."""
    if frame.empty:
        return frame
    out = frame.assign(**{family_column: family_labels(frame, plans, kind, contrast)})
    return adjust_together([Shown(out, family_column, p_column, ())])[0]
