"""Pretrained - random within an arm: accuracy and steps differences with their intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.report.stats import welch_difference
from scale_fpt.report.tables.cells import ARM_KEYS, DEFAULT_METRIC, prepare

PAIR_KEYS = tuple(k for k in ARM_KEYS if k not in ("init", "weights"))
"""Arms that agree on these and differ only in init are compared by ``init_difference``."""


def init_difference(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Language-pretrained minus random init, per task and setting (same model, trained
    groups, lr, batch size, budget): the difference of mean accuracy (percentage points) and
    of mean steps to the accuracy threshold (``steps_to_threshold``), each with Welch's 95%
    interval over the seeds of the two arms. Steps get an interval only when every seed of both
    arms reached the threshold; otherwise ``steps_note`` says how many did and bounds the
    difference, counting each unreached seed at its last step (``steps_done``)."""
    df = prepare(trials, metric)
    df = df[df["used"] & df["init_label"].isin(("pretrained", "random"))]
    records = []
    for key, group in df.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        arms = {init: g for init, g in group.groupby("init_label")}
        if set(arms) != {"pretrained", "random"}:
            continue
        pre, rnd = arms["pretrained"], arms["random"]
        accuracy = welch_difference(pre["value"], rnd["value"])
        steps = {s: arms[s]["steps_to_threshold"].astype(float) for s in arms}
        reached = {s: int(v.notna().sum()) for s, v in steps.items()}
        all_reached = all(reached[s] == len(arms[s]) for s in arms)
        step_diff = welch_difference(steps["pretrained"], steps["random"]) if all_reached else {}
        records.append(
            {
                **dict(zip(PAIR_KEYS, key, strict=True)),
                "n_pretrained": len(pre),
                "n_random": len(rnd),
                "accuracy_pretrained": float(pre["value"].mean()),
                "accuracy_random": float(rnd["value"].mean()),
                **{f"accuracy_{k}": accuracy[k] for k in ("diff", "ci95", "ci_low", "ci_high")},
                **{
                    f"steps_{k}": step_diff.get(k, math.nan)
                    for k in ("diff", "ci95", "ci_low", "ci_high")
                },
                "steps_pretrained": float(steps["pretrained"].mean()),
                "steps_random": float(steps["random"].mean()),
                "steps_note": "" if all_reached else steps_bound(arms, steps, reached),
            }
        )
    return pd.DataFrame(records)


def steps_bound(arms: dict, steps: dict, reached: dict) -> str:
    """What can be said of steps to threshold when some seed never reached it: how many did,
    and, when every pretrained seed did, an upper bound on pretrained - random (unreached
    random seeds counted at their last step, which they needed more than)."""
    counts = (
        f"threshold reached by {reached['pretrained']}/{len(arms['pretrained'])} pretrained "
        f"and {reached['random']}/{len(arms['random'])} random seeds"
    )
    if reached["pretrained"] < len(arms["pretrained"]) or not reached["random"] < len(
        arms["random"]
    ):
        return counts + ": no difference computed"
    random_bound = steps["random"].fillna(arms["random"]["steps_done"].astype(float)).mean()
    bound = steps["pretrained"].mean() - random_bound
    return (
        counts + f": pretrained - random < {bound:+.0f} steps (unreached seeds at their last step)"
    )


def difference_text(row) -> str:
    """'pretrained - random: accuracy +14.3 pp [95% CI +10.1, +18.5] (n=3 vs 3); steps to
    threshold -1200 [95% CI -1500, -900]'."""
    text = (
        f"pretrained - random: accuracy {row['accuracy_diff']:+.1f} pp "
        f"[95% CI {row['accuracy_ci_low']:+.1f}, {row['accuracy_ci_high']:+.1f}] "
        f"(n={int(row['n_pretrained'])} vs {int(row['n_random'])})"
    )
    if np.isfinite(row["steps_diff"]):
        low, high = row["steps_ci_low"], row["steps_ci_high"]
        return text + (
            f"; steps to threshold {row['steps_diff']:+.0f} [95% CI {low:+.0f}, {high:+.0f}]"
        )
    return text + f"; steps to threshold: {row['steps_note']}"
