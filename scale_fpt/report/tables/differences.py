"""Pretrained - random within an arm: accuracy and steps differences with their intervals.

The two inits of one setting usually share seeds, and a seed gives both the same heads,
data and dropout streams (``seeding.py``): the comparison is then paired on the seed (paired
t interval, paired t and Wilcoxon signed-rank tests, Hedges' g with a bootstrap interval).
Arms without a shared seed are compared as independent groups (Welch). Steps to the
threshold are right-censored (a seed that never reached it is censored at its last step):
Kaplan-Meier medians per arm and the log-rank test. The p-values of the table's rows form
one family, adjusted with Benjamini-Hochberg.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.report.stats import (
    adjust_p,
    paired_difference,
    steps_logrank,
    steps_survival,
    welch_difference,
)
from scale_fpt.report.tables.cells import ARM_KEYS, DEFAULT_METRIC, prepare
from scale_fpt.report.tables.steps import steps_to_threshold, thresholds_for

PAIR_KEYS = tuple(k for k in ARM_KEYS if k not in ("init", "weights"))
"""Arms that agree on these and differ only in init are compared by ``init_difference``."""
INTERVAL = ("diff", "ci95", "ci_low", "ci_high")


def compare_arms(a: pd.DataFrame, b: pd.DataFrame, column: str) -> dict:
    """``column`` of arm a minus arm b: paired on shared seeds where there are two or more,
    else Welch over the two groups. {design, n_pairs, diff, ci95, ci_low, ci_high, p,
    p_wilcoxon, g, g_low, g_high}."""
    by_seed = [dict(zip(arm["seed"].astype(int), arm[column].astype(float), strict=True))
               for arm in (a, b)]  # fmt: skip
    paired = paired_difference(*by_seed)
    if paired["n"] >= 2:
        return {
            "design": f"paired over {paired['n']} shared seeds",
            "n_pairs": paired["n"],
            **{k: paired[k] for k in INTERVAL},
            "p": paired["p_t"],
            **{k: paired[k] for k in ("p_wilcoxon", "g", "g_low", "g_high")},
        }
    welch = welch_difference(a[column], b[column])
    few = min(welch["n_a"], welch["n_b"]) < 2
    return {
        "design": "too few seeds for an interval" if few else "independent seeds (Welch)",
        "n_pairs": paired["n"],
        **{k: welch[k] for k in INTERVAL},
        "p": welch["p"],
        **dict.fromkeys(("p_wilcoxon", "g", "g_low", "g_high"), math.nan),
    }


def with_task_thresholds(trials: pd.DataFrame, curves: pd.DataFrame, thresholds=None):
    """``trials`` with ``steps_to_threshold``, ``steps_done`` and ``accuracy_threshold``
    re-read from each trial's validation curve at its task's threshold (``thresholds_for``:
    90% of the paper's FPT accuracy by default, as Table 4), not the flat threshold the trial
    was run with."""
    limits = thresholds_for(sorted(set(trials["task"])), thresholds)
    by_trial = {key: c for key, c in curves.groupby(["sweep", "trial_id"])}
    steps, last = [], []
    for row in trials.itertuples(index=False):
        curve = by_trial.get((row.sweep, row.trial_id))
        hit, end = (
            (math.nan, math.nan) if curve is None else steps_to_threshold(curve, limits[row.task])
        )
        steps.append(hit)
        last.append(row.steps_done if math.isnan(end) else end)
    return trials.assign(
        steps_to_threshold=steps,
        steps_done=last,
        accuracy_threshold=trials["task"].map(limits),
    )


def init_difference(
    trials: pd.DataFrame, metric: str = DEFAULT_METRIC, curves=None, thresholds=None
) -> pd.DataFrame:
    """Language-pretrained minus random init, per task and setting (same sweep, model,
    trained groups, lr, batch size, budget and every other setting): the accuracy difference
    (percentage points; ``accuracy_*``: diff, 95% interval, p, Wilcoxon p, Hedges' g and its
    bootstrap interval, ``accuracy_design``), and steps to the accuracy threshold
    (``steps_to_threshold``, unreached seeds censored at ``steps_done``): Kaplan-Meier
    medians (``steps_median_*`` with intervals), the log-rank p (``steps_p``) and, when every
    seed of both arms reached it, the (paired) difference of steps (``steps_diff``...).
    ``*_p_adjusted``: Benjamini-Hochberg over the rows of the table. With ``curves``, steps
    are read at each task's threshold (``with_task_thresholds``); without, the trials' own
    ``steps_to_threshold`` (their ``accuracy_threshold``)."""
    if curves is not None and len(curves):
        trials = with_task_thresholds(trials, curves, thresholds)
    df = prepare(trials, metric)
    df = df[df["used"] & df["init_label"].isin(("pretrained", "random"))]
    records = []
    for key, group in df.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        arms = {init: g for init, g in group.groupby("init_label")}
        if set(arms) != {"pretrained", "random"}:
            continue
        pre, rnd = arms["pretrained"], arms["random"]
        accuracy = compare_arms(pre, rnd, "value")
        steps = {s: arms[s]["steps_to_threshold"].astype(float) for s in arms}
        reached = {s: int(v.notna().sum()) for s, v in steps.items()}
        all_reached = all(reached[s] == len(arms[s]) for s in arms)
        step_diff = compare_arms(pre, rnd, "steps_to_threshold") if all_reached else {}
        survival = {
            s: steps_survival(
                steps[s].fillna(arms[s]["steps_done"].astype(float)), steps[s].notna()
            )
            for s in arms
        }
        logrank = steps_logrank(
            *(
                arg
                for s in ("pretrained", "random")
                for arg in (steps[s].fillna(arms[s]["steps_done"].astype(float)), steps[s].notna())
            )
        )
        records.append(
            {
                **dict(zip(PAIR_KEYS, key, strict=True)),
                "n_pretrained": len(pre),
                "n_random": len(rnd),
                "accuracy_pretrained": float(pre["value"].mean()),
                "accuracy_random": float(rnd["value"].mean()),
                **{f"accuracy_{k}": v for k, v in accuracy.items()},
                **{f"steps_{k}": step_diff.get(k, math.nan) for k in (*INTERVAL, "p")},
                "steps_pretrained": float(steps["pretrained"].mean()),
                "steps_random": float(steps["random"].mean()),
                **{
                    f"steps_median_{s}{suffix}": survival[s][f"median{suffix}"]
                    for s in ("pretrained", "random")
                    for suffix in ("", "_low", "_high")
                },
                "steps_logrank_p": logrank["p"],
                "steps_note": "" if all_reached else steps_bound(arms, steps, reached),
            }
        )
    out = pd.DataFrame(records)
    if not out.empty:
        for column in ("accuracy_p", "accuracy_p_wilcoxon", "steps_logrank_p"):
            out[f"{column}_adjusted"] = adjust_p(out[column])
    return out


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


def median_text(median: float, low: float, high: float) -> str:
    def steps(v: float) -> str:
        return "not reached" if not np.isfinite(v) else f"{v:,.0f}"

    return f"{steps(median)} [{steps(low)}, {steps(high)}]"


def difference_text(row) -> str:
    """'pretrained - random, paired over 3 shared seeds: accuracy +14.3 pp [95% CI +10.1,
    +18.5] (p 0.01, BH 0.02); steps to threshold: Kaplan-Meier median 400 [100, 700] vs not
    reached [...], log-rank p 0.02; ...'."""
    text = (
        f"pretrained - random, {row['accuracy_design']}: accuracy {row['accuracy_diff']:+.1f} pp "
        f"[95% CI {row['accuracy_ci_low']:+.1f}, {row['accuracy_ci_high']:+.1f}] "
        f"(n={int(row['n_pretrained'])} vs {int(row['n_random'])}"
    )
    if np.isfinite(row["accuracy_p"]):
        text += f"; p {row['accuracy_p']:.2g}, BH-adjusted {row['accuracy_p_adjusted']:.2g}"
    text += ")"
    medians = " vs ".join(
        median_text(*(row[f"steps_median_{s}{x}"] for x in ("", "_low", "_high")))
        for s in ("pretrained", "random")
    )
    text += f"; steps to threshold, Kaplan-Meier median [95% CI] {medians}"
    if np.isfinite(row["steps_logrank_p"]):
        text += f", log-rank p {row['steps_logrank_p']:.2g}"
    if np.isfinite(row["steps_diff"]):
        low, high = row["steps_ci_low"], row["steps_ci_high"]
        return text + f"; difference {row['steps_diff']:+.0f} [95% CI {low:+.0f}, {high:+.0f}]"
    return text + f"; {row['steps_note']}"
