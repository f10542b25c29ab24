"""Arms compared at equal compute or equal examples seen, not at their own budgets.

Two arms of one setting that train different parameters (full - fpt) or start from
different weights (pretrained - random) may run different budgets, batch sizes and step
costs: a full fine-tuning step costs about 6N FLOPs, a frozen one 4N plus the attention
(``scaling.train_step_flops``, the trials' ``flops_per_step``). Here each pair is scored
again with every trial cut at the same horizon: the smaller of the two arms' planned budgets
(``max_steps`` x the per-step cost), so no single trial that diverged or stopped on patience
early cuts every other. A trial's score at the horizon is test accuracy at its evaluation
with the best validation accuracy among those within the horizon (a trial that ended
earlier keeps its best before it ended, as in the tables), so the cut, like the selection,
reads validation only. Each pair differs only in what it compares: full - fpt within one
init (and weights), pretrained - random within one set of trained groups. The difference is paired on shared seeds (``stats``),
Benjamini-Hochberg adjusted over each table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scale_fpt.report.stats import adjust_p
from scale_fpt.report.tables.cells import ARM_KEYS, prepare
from scale_fpt.report.tables.differences import accuracy_text, compare_arms, task_baseline

MATCHES = {
    "flops": ("flops_per_step", "FLOPs"),
    "examples": ("batch_size", "examples"),
}
"""What a horizon counts: per-step cost column of a trial and its name."""
CONTRASTS = (
    ("finetune_label", "full", "fpt", ("finetune_label",)),
    ("init_label", "pretrained", "random", ("init", "weights")),
)
"""(what differs, arm a, arm b, the arm keys that column stands for) of each a - b."""
BUDGET_KEYS = ("max_steps", "patience", "batch_size")
"""Settings a matched pair may differ in besides the contrast: the budget and its cost."""


def horizon_scores(
    trials: pd.DataFrame, curves: pd.DataFrame, rows: dict, cost: str, horizon: float
) -> pd.Series:
    """Per trial (index trial_id): test accuracy (%) at its best-validation evaluation among
    those whose cumulative cost (step x ``cost`` per step) is within ``horizon``. ``rows``:
    each trial's curve positions (``curves.groupby("trial_id").indices``), so an arm reads
    its own rows, not the whole table."""
    per_step = trials.set_index("trial_id")[cost].astype(float)
    mine = [rows[t] for t in per_step.index if t in rows]
    data = curves.iloc[np.concatenate(mine) if mine else []]
    data = data.assign(spent=data["step"] * data["trial_id"].map(per_step))
    data = data[data["spent"] <= horizon * (1 + 1e-9)].sort_values(["trial_id", "step"])
    best = data.loc[data.groupby("trial_id")["val_accuracy"].idxmax()]  # earliest on ties
    return best.set_index("trial_id")["test_accuracy"].astype(float) * 100


def matched_differences(
    trials: pd.DataFrame, curves: pd.DataFrame, match: str = "flops"
) -> pd.DataFrame:
    """full - fpt and pretrained - random at an equal ``match`` ('flops' or 'examples')
    horizon per pair: the horizon, each arm's seeds and the paired difference with its
    interval, p-values (BH-adjusted over the table), d_z and the detectable difference."""
    cost, unit = MATCHES[match]
    df = prepare(trials)
    df = df[df["used"] & df[cost].notna()]
    if df.empty or curves.empty:
        return pd.DataFrame()
    df = df.assign(budget=df["max_steps"].astype(float) * df[cost].astype(float))
    rows = curves.groupby("trial_id").indices
    records = []
    for column, a, b, contrasted in CONTRASTS:
        keys = [k for k in ARM_KEYS if k not in (*contrasted, *BUDGET_KEYS)]
        for key, group in df.groupby(keys, dropna=False, sort=False):
            arms = {name: g for name, g in group.groupby(column) if name in (a, b)}
            if len(arms) != 2:
                continue
            horizon = float(group.loc[group[column].isin((a, b)), "budget"].min())
            scored = {
                name: arm.assign(
                    value=arm["trial_id"].map(horizon_scores(arm, curves, rows, cost, horizon))
                )
                for name, arm in arms.items()
            }
            scored = {name: arm[np.isfinite(arm["value"])] for name, arm in scored.items()}
            diff = compare_arms(scored[a], scored[b], "value", task_baseline(group["task"].iloc[0]))
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
    """'full - fpt at 1.2e+15 FLOPs: +3.1 pp [95% CI -1.0, +7.2], d_z ...; t-test p 0.1,
    BH-adjusted 0.2; detects 5.0 pp at 80% power (paired over 3 shared seeds)'."""
    return (
        f"{row['contrast']} at {row['horizon']:.3g} {row['match']}: "
        f"{accuracy_text(row, prefix='')} ({row['design']})"
    )
