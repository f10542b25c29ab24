"""Arms compared at equal compute or equal examples seen, not at their own budgets.

Two arms of one setting that train different parameters (full - fpt) or start from
different weights (pretrained - random) may run different budgets, batch sizes and step
costs: a full fine-tuning step costs about 6N FLOPs, a frozen one 4N plus the attention
(``scaling.train_step_flops``, the trials' ``flops_per_step``). Here each pair is scored
again with every trial cut at the same horizon: the least FLOPs (or examples) any trial of
the two arms reached. A trial's score at the horizon is test accuracy at its evaluation
with the best validation accuracy among those within the horizon, so the cut, like the
selection, reads validation only. The difference is paired on shared seeds (``stats``),
Benjamini-Hochberg adjusted over each table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.report.stats import adjust_p
from scale_fpt.report.tables.cells import ARM_KEYS, prepare
from scale_fpt.report.tables.differences import compare_arms

MATCHES = {
    "flops": ("flops_per_step", "FLOPs"),
    "examples": ("batch_size", "examples"),
}
"""What a horizon counts: per-step cost column of a trial and its name."""
CONTRASTS = (("finetune_label", "full", "fpt"), ("init_label", "pretrained", "random"))
BUDGET_KEYS = ("max_steps", "patience", "batch_size", "finetune", "init", "weights")
"""Settings a matched pair may differ in besides the contrast: the budget and its cost."""


def horizon_scores(
    trials: pd.DataFrame, curves: pd.DataFrame, cost: str, horizon: float
) -> pd.Series:
    """Per trial (index trial_id): test accuracy (%) at its best-validation evaluation among
    those whose cumulative cost (step x ``cost`` per step) is within ``horizon``."""
    per_step = trials.set_index("trial_id")[cost].astype(float)
    data = curves[curves["trial_id"].isin(per_step.index)]
    data = data.assign(spent=data["step"] * data["trial_id"].map(per_step))
    data = data[data["spent"] <= horizon * (1 + 1e-9)].sort_values(["trial_id", "step"])
    best = data.loc[data.groupby("trial_id")["val_accuracy"].idxmax()]  # earliest on ties
    return best.set_index("trial_id")["test_accuracy"].astype(float) * 100


def matched_differences(
    trials: pd.DataFrame, curves: pd.DataFrame, match: str = "flops"
) -> pd.DataFrame:
    """full - fpt and pretrained - random at an equal ``match`` ('flops' or 'examples')
    horizon per pair: the horizon, each arm's seeds and the paired difference with its
    interval, p-values (BH-adjusted over the table) and Hedges' g."""
    cost, unit = MATCHES[match]
    df = prepare(trials)
    df = df[df["used"] & df[cost].notna()]
    if df.empty or curves.empty:
        return pd.DataFrame()
    df = df.assign(spent=df["steps_done"].astype(float) * df[cost].astype(float))
    records = []
    for column, a, b in CONTRASTS:
        keys = [k for k in ARM_KEYS if k not in (column, *BUDGET_KEYS)]
        for key, group in df.groupby(keys, dropna=False, sort=False):
            arms = {name: g for name, g in group.groupby(column) if name in (a, b)}
            if len(arms) != 2:
                continue
            horizon = float(group.loc[group[column].isin((a, b)), "spent"].min())
            scored = {
                name: arm.assign(
                    value=arm["trial_id"].map(horizon_scores(arm, curves, cost, horizon))
                )
                for name, arm in arms.items()
            }
            scored = {name: arm[np.isfinite(arm["value"])] for name, arm in scored.items()}
            diff = compare_arms(scored[a], scored[b], "value")
            records.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "contrast": f"{a} - {b}",
                    "match": unit,
                    "horizon": horizon,
                    "n_a": len(scored[a]),
                    "n_b": len(scored[b]),
                    "mean_a": float(scored[a]["value"].mean()),
                    "mean_b": float(scored[b]["value"].mean()),
                    **diff,
                }
            )
    out = pd.DataFrame(records)
    if not out.empty:
        out["p_adjusted"] = adjust_p(out["p"])
    return out


def matched_text(row) -> str:
    """'full - fpt at 1.2e+15 FLOPs: +3.1 pp [95% CI -1.0, +7.2] (paired over 3 shared
    seeds; p 0.1, BH 0.2)'."""
    interval = ", ".join(f"{row[k]:+.1f}" for k in ("ci_low", "ci_high"))
    p = "" if not math.isfinite(row["p"]) else f"; p {row['p']:.2g}, BH {row['p_adjusted']:.2g}"
    return (
        f"{row['contrast']} at {row['horizon']:.3g} {row['match']}: {row['diff']:+.1f} pp "
        f"[95% CI {interval}] ({row['design']}{p})"
    )
