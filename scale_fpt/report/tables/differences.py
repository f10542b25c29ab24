"""Pretrained - random within an arm: accuracy and steps differences with their intervals.

The two inits of one setting usually share seeds, and a seed gives both the same heads,
data and dropout streams (``seeding.py``): the comparison is then paired on the seed (paired
t interval and p, d_z with its exact interval, the exact sign-flip p with the least p its n
can give, the smallest difference the n detects at 80% power). Arms without a shared seed
are compared as independent groups (Welch). Steps to the threshold are censored data: a seed
that ran its budget without reaching it is censored at its last step; one that diverged or
stopped on patience never reaches it (``stats.outcomes``). Kaplan-Meier medians per arm and
the log-rank test with its exact permutation p. The p-values of the table's rows form one
family, adjusted with Benjamini-Hochberg.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.report.stats import (
    ALPHA,
    KM_INTERVAL_MIN_SEEDS,
    MONTE_CARLO_DRAWS,
    adjust_p,
    paired_difference,
    steps_logrank,
    steps_survival,
    welch_difference,
)
from scale_fpt.report.tables.cells import ARM_KEYS, DEFAULT_METRIC, prepare
from scale_fpt.report.tables.steps import steps_to_threshold, thresholds_for
from scale_fpt.task_registry import TASKS

PAIR_KEYS = tuple(k for k in ARM_KEYS if k not in ("init", "weights"))
"""Arms that agree on these and differ only in init are compared by ``init_difference``."""
DETECTABLE = ("detectable", "detectable_low", "detectable_high", "detectable_family")
"""``stats.power_statement``'s keys."""
INTERVAL = ("diff", "ci95", "ci_low", "ci_high", "interval_note")
PAIRED = ("p_sign_flip", "p_sign_flip_se", "p_sign_flip_min", "d_z", "d_z_low", "d_z_high",
          "sd_diff", *DETECTABLE)  # fmt: skip
"""What a paired comparison adds to the interval and its paired-t p (``stats``)."""


def compare_arms(
    a: pd.DataFrame, b: pd.DataFrame, column: str, baseline=math.nan, elsewhere: str = ""
) -> dict:
    """``column`` of arm a minus arm b: paired on shared seeds where there are two or more,
    else Welch over the two groups. {design, n (pairs; 0 or 1 under Welch), diff, ci95,
    ci_low, ci_high, interval_note, p, test and ``PAIRED`` (NaN under Welch)}
    (``report.columns``). With the task's ``baseline`` (its
    accuracy without learning, %), an arm whose seeds learn or not (``learn_or_not``) below
    ``MIXED_MIN_PAIRS`` pairs gets no interval: the paired t's is not calibrated there."""
    by_seed = [dict(zip(arm["seed"].astype(int), arm[column].astype(float), strict=True))
               for arm in (a, b)]  # fmt: skip
    paired = paired_difference(*by_seed)
    if paired["n"] >= 2:
        out = {
            "design": f"paired over {paired['n']} shared seeds",
            "n": paired["n"],
            **{k: paired[k] for k in INTERVAL},
            "p": paired["p_t"],
            "test": "paired t",
            **{k: paired[k] for k in PAIRED},
        }
    else:
        welch = welch_difference(a[column], b[column])
        few = min(welch["n_a"], welch["n_b"]) < 2
        out = {
            "design": "too few seeds for an interval" if few else "independent seeds (Welch)",
            "n": paired["n"],
            **{k: welch[k] for k in INTERVAL},
            "p": welch["p"],
            "test": "" if few else "Welch t",
            **dict.fromkeys(PAIRED, math.nan),
        }
    n = max(paired["n"], len(a), len(b))
    return {**out, **withheld(a[column], b[column], baseline, n, elsewhere)}


def withheld(a: pd.Series, b: pd.Series, baseline: float, n: int, elsewhere: str = "") -> dict:
    """{} where the t interval of a - b stands; where an arm's seeds learn or not
    (``learn_or_not``; ``elsewhere``: the same seen in the arms' setting, ``mixed_settings``)
    below ``MIXED_MIN_PAIRS`` seeds, NaN interval keys with an ``interval_note`` saying why
    it is not calibrated."""
    mixed = learn_or_not(a, baseline) or learn_or_not(b, baseline) or elsewhere
    if not mixed or n >= MIXED_MIN_PAIRS:
        return {}
    return {
        **dict.fromkeys(("ci95", "ci_low", "ci_high"), math.nan),
        "interval_note": f"not calibrated at this design: {mixed}, and the t interval needs "
        f"{MIXED_MIN_PAIRS}+ seeds there",
    }


LEARNED_MARGIN = 10.0
"""Accuracy points above the task's baseline within which a seed did not learn the task."""
MIXED_MIN_PAIRS = 10
"""Seeds below which an arm whose seeds learn or not gets no t interval: a two-point
mixture of seeds is far from normal. Below it, a printed interval is of the one outcome
every seed of each arm had (all learned, or all at the baseline): it covers that outcome's
difference at nominal, not the mean over an arm's chance to learn, which agreeing seeds
cannot show (``benchmarks/calibration.py``, the learn-or-not truth: ``Truth.claimed``)."""


SETTING = ("task", "model", "finetune_label", "max_steps", "lr")
"""An init's seeds of one setting over its sweeps (a search's selection seeds and its
confirmation seeds at the same rate): three seeds that happen to agree (all learned, or
none) hide a task that learns or not there; the setting's other seeds may show it. Never
over rates: a rate at which nothing learns is no seed's chance."""


def mixed_settings(df: pd.DataFrame) -> dict:
    """{(*SETTING, init_label): reason} of the used rows of ``df`` (``prepare``d) whose seeds
    learn or not (``learn_or_not``) over the setting's sweeps."""
    out = {}
    for key, group in df.groupby([*SETTING, "init_label"], dropna=False, sort=False):
        reason = learn_or_not(group["value"], task_baseline(key[0]))
        if reason:
            out[key] = f"{reason} (this setting's {key[-1]} seeds over its sweeps)"
    return out


def setting_mixed(mixed: dict, row, inits) -> str:
    """The reason ``mixed_settings`` gives for ``row``'s setting at any of ``inits``, or ''."""
    keys = [(*(row[k] for k in SETTING), init) for init in inits]
    return next((mixed[k] for k in keys if k in mixed), "")


def task_baseline(task: str) -> float:
    """The task's accuracy without learning it (%, its registry entry's baseline); NaN if
    unknown."""
    entry = TASKS.get(task)
    return entry.baseline.accuracy if entry is not None else math.nan


def learn_or_not(values: pd.Series, baseline: float) -> str:
    """'2 of 3 seeds at the task's baseline, the rest above' where some seeds of an arm
    stayed within ``LEARNED_MARGIN`` of ``baseline`` and others learned; '' otherwise (or
    without a baseline)."""
    x = values.astype(float).dropna()
    if not math.isfinite(baseline) or x.empty:
        return ""
    stuck = int((x <= baseline + LEARNED_MARGIN).sum())
    if 0 < stuck < len(x):
        return f"{stuck} of {len(x)} seeds at the task's baseline, the rest above"
    return ""


def interval_text(row, prefix: str = "", digits: str = "+.1f", label: str = "95% CI ") -> str:
    """'+14.3 [95% CI +10.1, +18.5]' of ``row``'s diff, ci_low, ci_high after ``prefix``;
    without a finite interval, its ``interval_note`` ('+0.0 (no spread (all 3 seeds
    equal))') or '(no interval)': never a zero-wide 95% interval."""

    def get(key):
        value = row.get(prefix + key, math.nan)
        return math.nan if value is None else value

    diff, low, high = (float(get(k)) for k in ("diff", "ci_low", "ci_high"))
    if not math.isfinite(diff):
        return "—"
    if math.isfinite(low) and math.isfinite(high):
        # An interval narrower than the printed precision gets the digits that tell its
        # ends apart (seeds that nearly tie), never '[+29.7, +29.7]'.
        if f"{low:{digits}}" == f"{high:{digits}}" and low < high:
            digits = f"{digits.split('.')[0]}.{significant(low, high)}f"
        return f"{diff:{digits}} [{label}{low:{digits}}, {high:{digits}}]"
    note = get("interval_note")
    return f"{diff:{digits}} ({note if isinstance(note, str) and note else 'no interval'})"


def significant(low: float, high: float) -> int:
    """Decimals at which ``low`` < ``high`` print apart."""
    return max(0, math.ceil(-math.log10(high - low)) + 1)


def with_task_thresholds(trials: pd.DataFrame, curves: pd.DataFrame, thresholds=None):
    """``trials`` with ``steps_to_threshold``, ``steps_done`` and ``accuracy_threshold``
    re-read from each trial's validation curve at its task's threshold (``thresholds_for``:
    90% of the paper's FPT accuracy by default, as Table 4), not the flat threshold the trial
    was run with."""
    limits = thresholds_for(sorted(set(trials["task"])), thresholds)
    steps, last = steps_to_threshold(trials, curves, limits)
    return trials.assign(
        steps_to_threshold=steps,
        steps_done=np.where(np.isnan(last), trials["steps_done"], last),
        accuracy_threshold=trials["task"].map(limits),
    )


def init_difference(
    trials: pd.DataFrame, metric: str = DEFAULT_METRIC, curves=None, thresholds=None
) -> pd.DataFrame:
    """Language-pretrained minus random init, per task and setting (same sweep, model,
    trained groups, lr, batch size, budget and every other setting): the accuracy difference
    (percentage points; ``accuracy_*``: ``compare_arms``'s keys, ``accuracy_design``), and
    steps to the accuracy threshold (``steps_to_threshold``; ``seed_outcomes``): Kaplan-Meier
    medians (``steps_median_*`` with intervals), the log-rank test (``steps_p``, its least
    possible value ``steps_p_min``, ``steps_test``: 'exact log-rank', ...) and, when every
    seed of both arms reached it, the (paired) difference of steps with its interval
    (``steps_diff``, ``steps_ci_low``...). ``*_p_adjusted``: Benjamini-Hochberg over the rows
    of the table. Column names: ``report.columns``. With ``curves``, steps
    are read at each task's threshold (``with_task_thresholds``); without, the trials' own
    ``steps_to_threshold`` (their ``accuracy_threshold``)."""
    if curves is not None and len(curves):
        trials = with_task_thresholds(trials, curves, thresholds)
    df = prepare(trials, metric)
    df = df[df["used"] & df["init_label"].isin(("pretrained", "random"))]
    mixed = mixed_settings(df)
    records = []
    for key, group in df.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        arms = {init: g for init, g in group.groupby("init_label")}
        if set(arms) != {"pretrained", "random"}:
            continue
        pre, rnd = arms["pretrained"], arms["random"]
        elsewhere = setting_mixed(mixed, group.iloc[0], ("pretrained", "random"))
        accuracy = compare_arms(pre, rnd, "value", task_baseline(group["task"].iloc[0]), elsewhere)
        steps = {s: arms[s]["steps_to_threshold"].astype(float) for s in arms}
        reached = {s: int(v.notna().sum()) for s, v in steps.items()}
        all_reached = all(reached[s] == len(arms[s]) for s in arms)
        step_diff = compare_arms(pre, rnd, "steps_to_threshold") if all_reached else {}
        outcome = {s: seed_outcomes(arms[s], steps[s]) for s in arms}
        survival = {s: steps_survival(*outcome[s]) for s in arms}
        logrank = steps_logrank(
            *outcome["pretrained"][:2], *outcome["random"][:2],
            outcome["pretrained"][2], outcome["random"][2],
        )  # fmt: skip
        records.append(
            {
                **dict(zip(PAIR_KEYS, key, strict=True)),
                "n_pretrained": len(pre),
                "n_random": len(rnd),
                "accuracy_pretrained": float(pre["value"].mean()),
                "accuracy_random": float(rnd["value"].mean()),
                **{f"accuracy_{k}": v for k, v in accuracy.items()},
                **{f"steps_{k}": step_diff.get(k, math.nan) for k in INTERVAL},
                "steps_pretrained": float(steps["pretrained"].mean()),
                "steps_random": float(steps["random"].mean()),
                **{
                    f"steps_median_{s}{suffix}": survival[s][f"median{suffix}"]
                    for s in ("pretrained", "random")
                    for suffix in ("", "_low", "_high")
                },
                "steps_p": logrank["p"],
                "steps_p_min": logrank["p_min"],
                "steps_p_se": logrank["p_se"],
                "steps_test": f"{logrank['p_method']} log-rank" if logrank["p_method"] else "",
                **{f"steps_never_{s}": survival[s]["never"] for s in ("pretrained", "random")},
                "steps_note": "" if all_reached else steps_bound(arms, steps, reached),
            }
        )
    out = pd.DataFrame(records)
    if not out.empty:
        for column in ("accuracy_p", "steps_p"):
            out[f"{column}_adjusted"] = adjust_p(out[column])
    return out


NEVER_REACHES = ("diverged", "patience")
"""Stop reasons after which a seed cannot reach the threshold any more (it stopped
training): not censored at its last step but kept unreached for good."""


def seed_outcomes(arm: pd.DataFrame, steps: pd.Series) -> tuple:
    """(steps, reached, never) of one arm's seeds for ``stats.steps_survival``: the step it
    reached the threshold, else its last step; ``never`` for a seed that diverged or
    stopped on patience before reaching it."""
    reached = steps.notna()
    stop = arm["stop_reason"] if "stop_reason" in arm else pd.Series("", index=arm.index)
    ended = arm["status"].eq("diverged") | stop.isin(NEVER_REACHES)
    return (
        steps.fillna(arm["steps_done"].astype(float)).to_numpy(),
        reached.to_numpy(),
        (ended & ~reached).to_numpy(),
    )


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


def median_text(median: float, low: float, high: float, n: int) -> str:
    """'400 [100, 700]'; the interval only from ``KM_INTERVAL_MIN_SEEDS`` seeds (below, the
    log-log band is not calibrated: ``benchmarks/calibration.py``)."""

    def steps(v: float) -> str:
        return "not reached" if not np.isfinite(v) else f"{v:,.0f}"

    if n < KM_INTERVAL_MIN_SEEDS:
        return steps(median)
    return f"{steps(median)} [95% CI {steps(low)}, {steps(high)}]"


# The smallest p a float64 holds to two digits; a test's p below it (a t-test at 1,000 seeds
# apart by many SDs) underflows to 0, which would read as a certainty no test gives.
SMALLEST_SHOWN_P = 1e-300


def two_digits(x: float) -> str:
    """Two significant digits without an exponent a reader must decode: '0.57', '34',
    '100' or '1,200' (``:.2g`` writes 100 as '1e+02')."""
    rounded = float(f"{x:.2g}")
    return f"{rounded:.2g}" if not abs(rounded) >= 100 else f"{rounded:,.0f}"


def p_number(p: float) -> str:
    """'0.012', or '< 1e-300' for a p that underflowed to zero."""
    return f"< {SMALLEST_SHOWN_P:.0e}" if p < SMALLEST_SHOWN_P else f"{p:.2g}"


def p_bh_text(p: float, adjusted: float) -> str:
    """'0.012 (0.03)': a raw p and its BH-adjusted p, as the 'p (BH)' columns show them."""
    return f"{p_number(p)} ({p_number(adjusted)})" if np.isfinite(p) else "—"


def monte_carlo_text(p: float, se: float) -> str:
    """'0.012', or with a Monte Carlo p its standard error: '0.012 ± 0.0008 (Monte Carlo,
    20,000 draws)'."""
    if np.isfinite(se) and se > 0:
        return f"{p_number(p)} ± {se:.1g} (Monte Carlo, {MONTE_CARLO_DRAWS:,} draws)"
    return p_number(p)


def p_text(p: float, adjusted: float, least: float = math.nan, se: float = math.nan) -> str:
    """'p 0.1 (least possible 0.1), BH-adjusted 0.2'; a Monte Carlo p with its SE."""
    text = f"p {monte_carlo_text(p, se)}"
    if np.isfinite(least):
        text += f" (least possible {least:.2g})"
    return text + f", BH-adjusted {p_number(adjusted)}"


def accuracy_text(row, prefix: str = "accuracy_") -> str:
    """'+14.3 pp [95% CI +10.1, +18.5], d_z 3.1 [0.2, 6.0], paired t p 0.01 ...; detects
    4.1 pp at 80% power' of one compared pair of arms (``compare_arms`` keys after
    ``prefix``)."""

    def get(key):
        return row.get(prefix + key, math.nan)

    text = interval_text(row, prefix).replace(" ", " pp ", 1)
    if np.isfinite(get("d_z")):
        d_z = (two_digits(get(k)) for k in ("d_z", "d_z_low", "d_z_high"))
        text += ", d_z {} [{}, {}]".format(*d_z)
    if np.isfinite(get("p")):
        text += "; t-test " + p_text(get("p"), get("p_adjusted"))
    if np.isfinite(get("p_sign_flip")) and get("p_sign_flip_min") < ALPHA:
        method = "" if get("p_sign_flip_se") > 0 else " (exact)"
        text += (
            f"; sign-flip p {monte_carlo_text(get('p_sign_flip'), get('p_sign_flip_se'))}{method}"
        )
    if np.isfinite(get("detectable")):
        text += f"; detects {detectable_text(row, prefix)}"
    return text


def detectable_text(row, prefix: str = "") -> str:
    """'21 pp at 80% power [9.4, 97] (SD's upper 80% bound; over its 95% interval), 30 at
    the family's BH level' (``stats.power_statement``)."""

    def get(key):
        value = row.get(prefix + key, math.nan)
        return math.nan if value is None else float(value)

    text = (
        f"{two_digits(get('detectable'))} pp at 80% power [{two_digits(get('detectable_low'))}, "
        f"{two_digits(get('detectable_high'))}] (SD's upper 80% bound; over its 95% interval)"
    )
    if np.isfinite(get("detectable_family")) and get("detectable_family") > get("detectable"):
        text += f", {two_digits(get('detectable_family'))} at the family's BH level"
    return text


def difference_text(row) -> str:
    """'pretrained - random, paired over 3 shared seeds: accuracy +14.3 pp [95% CI +10.1,
    +18.5], d_z ... (n=3 vs 3; t-test p 0.01, BH-adjusted 0.02; detects 4.1 pp at 80%
    power); steps to threshold, Kaplan-Meier median 400 vs not reached (2 seeds
    diverged or stopped on patience), log-rank p 0.1 (least possible 0.1) ...'."""
    text = (
        f"pretrained - random, {row['accuracy_design']}: accuracy "
        f"{accuracy_text(row)} (n={int(row['n_pretrained'])} vs {int(row['n_random'])})"
    )
    medians = " vs ".join(
        median_text(
            *(row[f"steps_median_{s}{x}"] for x in ("", "_low", "_high")), int(row[f"n_{s}"])
        )
        for s in ("pretrained", "random")
    )
    text += f"; steps to threshold, Kaplan-Meier median {medians}"
    never = [f"{int(row.get(f'steps_never_{s}', 0))} {s}" for s in ("pretrained", "random")
             if row.get(f"steps_never_{s}", 0)]  # fmt: skip
    if never:
        text += f" ({' and '.join(never)} seeds diverged or stopped on patience: never reached)"
    if np.isfinite(row["steps_p"]):
        text += f", {row['steps_test']} " + p_text(
            row["steps_p"], row["steps_p_adjusted"], row["steps_p_min"], row["steps_p_se"]
        )
    if np.isfinite(row["steps_diff"]):
        return text + f"; difference {interval_text(row, 'steps_', '+.0f')}"
    return text + f"; {row['steps_note']}"
