"""The report's scaling laws: the study's questions answered with fitted laws and intervals
that say what the data can carry.

Each arm (task x init x trained groups, transformers only, one learning rate per arm as in
the paper tables) with three or more model sizes is fitted with the law the study's
analysis plan names (``form``: ``power_floor``, E + A x^-alpha, by default; or ``power``),
never a form chosen from the data: ``analysis.fit_size_means``, least squares on each size's
mean with a deviation per size, profile intervals. Every interval is printed only where
``analysis.coverage.law_checks`` finds it calibrated at the arm's own design (its sizes and
seeds); otherwise, and where the data do not bound it, the table says "not identified" or
"not calibrated". Axes: total parameters and trained parameters; training FLOPs only where
an arm's steps vary with size (at fixed steps FLOPs are N times a constant, plus attention,
and the law on them repeats the one on N). ``error`` is 1 - the report's metric. From the
fits:

- ``law_table``: every fit's exponent and floor with intervals, or why not;
- ``exponent_table``: differences of exponents between two arms of the one form
  (pretrained - random, frozen - full), and the change of the measured gap between the
  smallest and largest size (cell means, Welch);
- ``holdout_table``: arms with enough sizes fitted without their largest and checked there;
- ``next_run_table``: which next run most narrows each exponent's interval per FLOP;
- ``transfer_table``: effective data transferred where trials ran at several
  ``train_examples``.

Over 500 lines: the section's tables (laws, exponent differences, held-out checks, next runs,
transfer) share its arm labels, fits and calibration gate, computed once here; apart, each
would re-derive them.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import numpy as np
import pandas as pd
from scipy.stats import t as t_dist

from scale_fpt.analysis import effective_data, exponent_difference, fit_size_means, holdout_check
from scale_fpt.analysis.coverage import Design, law_checks
from scale_fpt.analysis.laws import LAWS
from scale_fpt.analysis.means import MEANS_FORMS, size_means
from scale_fpt.analysis.power import next_runs
from scale_fpt.report import tables
from scale_fpt.report.tables.lr import headline_stats

AXES = {
    "total_params": "total parameters",
    "trainable_params": "trained parameters",
    "total_flops": "training FLOPs",
}
"""Column -> axis label of every fit."""
DEFAULT_FORM = "power_floor"
"""The law of a ladder when the analysis plan names none."""
MIN_SIZES = 3
"""Model sizes an arm needs before a law is fitted (intervals need one more than the law's
parameters)."""
REPORT_BOOT = 200
"""Bootstrap resamples of the effective-data fits (the laws themselves need none)."""
CHECK_STUDIES = 600
"""Synthetic studies behind each calibration check (``law_checks``). The check's rule
(``coverage.shows_calibrated``) fails a 0.92 interval at least 95% of the time at any number
of studies, so fewer than the benchmark's 1,100 suffice for what is printed; they only
withhold more right intervals (a 0.95 one is printed 89% of the time at 600 bounded
studies, 99% at 1,100), at a tenth of the time: 600 take 3-20 s per design on a 2-core CPU."""


def scaling_points(trials: pd.DataFrame, metric: str, best_lr: bool = False) -> pd.DataFrame:
    """Used transformer trials with ``error`` (1 - metric) and an ``arm`` label
    (init · trained groups); one rate per arm: the paper's (``tables.fixed_lr``) or, with
    ``best_lr``, each search arm's best by validation on its confirmation seeds (the
    ``-confirm`` sweep: seeds that took no part in the choice). The selection seeds are never
    used: the winner of a search looks better on them than it is (the winner's curse).
    ``attrs["unconfirmed"]`` lists the search arms without confirmation seeds."""
    df = tables.prepare(trials, metric)
    df = df[df["used"] & (df["kind"] == "transformer")]
    unconfirmed = []
    if best_lr:
        points = tables.lr_points(trials, metric)
        if points.empty:
            return df.iloc[:0]
        scored = points[points["score"].notna()]
        best = scored.loc[
            scored.groupby(list(tables.SEARCH_ARM_KEYS), dropna=False)["score"].idxmax()
        ]
        prepared = tables.prepare(trials, metric)
        ids = set()
        for record in best.to_dict("records"):
            headline = headline_stats(prepared, record)
            if headline["headline"] == "confirmation":
                ids |= set(str(headline["trial_ids"]).split(","))
            else:
                unconfirmed.append(f"{record['task']}: {record['arm']}")
        df = df[df["trial_id"].isin(ids)]
    else:
        df, _ = tables.fixed_lr(df)
    if "train_examples" not in df:
        df["train_examples"] = 0
    df = df[df["train_examples"].fillna(0) == 0]
    setting = setting_labels(df, best_lr)
    arm = df["init_label"] + " · " + df["finetune_label"] + setting
    out = df.assign(error=1 - df["value"] / 100, arm=arm, setting=setting)
    out.attrs["unconfirmed"] = unconfirmed
    return out


def setting_labels(df: pd.DataFrame, best_lr: bool = False) -> pd.Series:
    """What an arm's label (init · trained groups) adds: ' · key=value' for every setting
    that varies within a task: the sweep (two sweeps' seeds may be the same random streams:
    never one law unless ``--pool`` made them one sweep), budget, batch size, weights and
    rate (trials of different budgets or rates are never pooled into one law; arms compared
    agree on all of them). At the best rate, the rate may vary with size by design."""
    label = pd.Series("", index=df.index, dtype=object)
    settings = ["sweep", "batch_size", "max_steps", "weights"] + ([] if best_lr else ["lr"])
    for key in settings:
        varies = df.groupby("task")[key].transform("nunique") > 1
        label = label.where(~varies, label + f" · {key}=" + df[key].astype(str))
    return label


def check_form(form: str) -> str:
    if form not in MEANS_FORMS:
        raise ValueError(f"law form {form!r}: the report fits {', '.join(MEANS_FORMS)}")
    return form


def fixed_steps(group: pd.DataFrame) -> bool:
    """Whether every size of an arm trained the same steps at the same batch size: then its
    FLOPs are N times a constant (plus attention) and a law on them repeats the one on N."""
    return group[["max_steps", "batch_size"]].drop_duplicates().shape[0] == 1


def arm_axes(group: pd.DataFrame) -> list[str]:
    return [a for a in AXES if a != "total_flops" or not fixed_steps(group)]


def fit_arm(group: pd.DataFrame, axis: str, form: str):
    """(fit, None) or (None, why not) for one arm on one axis."""
    sizes = group["total_params"].nunique()
    if sizes < MIN_SIZES:
        return None, f"{sizes} model size(s); a law needs {MIN_SIZES}"
    if (group["error"] <= 0).any():
        return None, "error reaches 0 (accuracy 100%): no power law to fit"
    try:
        return fit_size_means(group, "error", axis, form), None
    except ValueError as e:
        return None, str(e).removeprefix("fit_size_means: ")


def fit_all(points: pd.DataFrame, form: str = DEFAULT_FORM) -> dict:
    """{(task, arm, axis): (fit or None, reason or None)} for every arm run at two or more
    model sizes (an arm of one size has no scaling to fit or to explain), on its axes
    (``arm_axes``), all with the one ``form``."""
    check_form(form)
    out = {}
    for (task, arm), group in points.groupby(["task", "arm"], sort=True):
        if group["total_params"].nunique() < 2:
            continue
        for axis in arm_axes(group):
            out[(task, arm, axis)] = fit_arm(group, axis, form)
    return out


# --------------------------------------------------------------------------- calibration


def design_of(fit) -> Design:
    """The design a fit ran at: its sizes (on its axis) and the fewest seeds of a size."""
    sizes = tuple(float(v) for v in fit.means[fit.x[0]])
    return Design("this arm", sizes, int(fit.goodness["seeds"][0]))


@cache
def design_checks(sizes: tuple[float, ...], seeds: int, form: str) -> tuple[dict, ...]:
    """``law_checks`` at this design (memoised: arms of a study share their designs)."""
    return tuple(law_checks(Design("arm", sizes, seeds), CHECK_STUDIES, 0, form))


def checks_at(sizes: tuple[float, ...], seeds: int, form: str) -> dict[str, bool]:
    """{interval: calibrated in every scenario} at this design."""
    out: dict[str, bool] = {}
    for row in design_checks(sizes, seeds, form):
        name = row["name"].split(",")[0]
        out[name] = out.get(name, True) and row["calibrated"]
    return out


def calibrated(fit, interval: str, design: Design | None = None) -> bool:
    """Whether ``interval`` is calibrated at ``design`` (default: the fit's own)."""
    design = design or design_of(fit)
    checks = checks_at(design.sizes, design.seeds, fit.form)
    return next((ok for name, ok in checks.items() if name.startswith(interval)), False)


def calibration_rows(fits: dict) -> pd.DataFrame:
    """Per design the laws were fitted at (sizes x seeds, form) and interval: the lowest
    coverage over the scenarios with its Monte Carlo error, and whether the report prints
    it there."""
    designs = {}
    for (_, _, axis), (fit, _) in fits.items():
        if fit is not None:
            design = design_of(fit)
            designs[(design.sizes, design.seeds, fit.form)] = AXES[axis]
    rows = []
    for (sizes, seeds, form), axis in designs.items():
        by_interval: dict[str, list[dict]] = {}
        for row in design_checks(sizes, seeds, form):
            by_interval.setdefault(row["name"].split(",")[0], []).append(row)
        for interval, checks in by_interval.items():
            worst = min(checks, key=lambda r: (r["coverage"], -r["mc_error"]))
            rows.append(
                {
                    "design": f"{len(sizes)} sizes ({axis}: {sizes[0]:.3g} .. {sizes[-1]:.3g}) "
                    f"x {seeds} seeds",
                    "form": form,
                    "interval": interval.removesuffix(" (t"),
                    "lowest coverage over scenarios": "no degree of freedom"
                    if worst["n_studies"] == 0
                    else f"{worst['coverage']:.3f} ± {worst['mc_error']:.3f}",
                    "printed": "yes" if all(r["calibrated"] for r in checks) else "no",
                }
            )
    return pd.DataFrame(rows)


def interval_text(value: float, interval: tuple[float, float]) -> str:
    return f"{value:.3g} [{interval[0]:.3g}, {interval[1]:.3g}]"


def identified(fit, name: str) -> bool:
    """Whether the law table gives ``name`` an interval's bounds (the data identify it)."""
    return fit.goodness["df"] >= 1 and bool(fit.identified[name])


def parameter_text(fit, name: str) -> str:
    """``value [lo, hi]``, or what the data cannot say about ``name``."""
    value, (lo, hi) = fit.params[name], fit.intervals[name]
    if fit.goodness["df"] < 1:
        return (
            f"not identified ({fit.goodness['k']} sizes for the {len(fit.law.params)} "
            "parameters: no size-level deviation left to estimate)"
        )
    if not calibrated(fit, name):
        return f"{value:.3g} (interval not calibrated at this design)"
    if fit.identified[name]:
        return interval_text(value, (lo, hi))
    if math.isfinite(lo):
        return f"not identified ({name} >= {lo:.3g}; no upper bound from these sizes)"
    if math.isfinite(hi):
        return f"not identified ({name} <= {hi:.3g}; no lower bound from these sizes)"
    return f"not identified ({name} unbounded by these sizes)"


def law_table(points: pd.DataFrame, fits: dict) -> pd.DataFrame:
    rows = []
    for (task, arm, axis), (fit, reason) in fits.items():
        group = points[(points["task"] == task) & (points["arm"] == arm)]
        row = {
            "task": task,
            "arm": arm,
            "axis": AXES[axis],
            "sizes": group["total_params"].nunique(),
            "n": len(group),
        }
        if fit is None:
            row.update(form="", alpha="", E="", A="", note=reason)
        else:
            row.update(
                form=fit.form,
                alpha=parameter_text(fit, "alpha"),
                E=parameter_text(fit, "E") if "E" in fit.params else "0 (no floor in this form)",
                A=f"{fit.params['A']:.3g}",
                df=fit.goodness["df"],
                note=f"size means' relative sd {fit.goodness['rel_sd']:.3g}, seeds' "
                f"{fit.goodness['seed_sd']:.3g}"
                + (
                    f"; alpha at its bound {fit.params['alpha']:.3g}: the error does not fall "
                    "with size as the law says"
                    if fit.goodness["at_bound"]
                    else ""
                ),
            )
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- two arms


ALPHA_READINGS = (
    "alpha larger for the first arm",
    "alpha larger for the second arm",
    "interval includes 0: no difference of exponent detected",
)
"""Readings of alpha(a) - alpha(b) of one form. With floors (E + A x^-alpha) alpha is the
rate at which each arm approaches its own floor: it alone says nothing of whether the gap
between the arms grows; the gap columns say that, from the measured errors."""
GAP_CHANGE_READINGS = (
    "the gap grows with size",
    "the gap shrinks with size",
    "interval includes 0: no detectable change of the gap",
)
"""Readings of the change of the gap's size (``gap_reading``) from the smallest to the
largest size."""


def reading(lo: float, hi: float, readings: tuple[str, str, str]) -> str:
    """What a difference's interval says."""
    return readings[0] if lo > 0 else readings[1] if hi < 0 else readings[2]


def difference_text(a, b) -> tuple[str, str]:
    """(alpha(a) - alpha(b) with its interval, its reading), or why there is none."""
    if a.goodness["df"] < 1 or b.goodness["df"] < 1:
        return "not identified (no size-level deviation left to estimate)", ""
    if not (calibrated(a, "alpha difference") and calibrated(b, "alpha difference")):
        return "not calibrated at this design", ""
    diff = exponent_difference(a, b)
    if not diff["identified"]:
        return f"not identified ({diff['estimate']:.3g}; the sizes do not bound it)", ""
    return (
        interval_text(diff["estimate"], (diff["lo"], diff["hi"])),
        reading(diff["lo"], diff["hi"], ALPHA_READINGS),
    )


def gap_change(first: pd.DataFrame, second: pd.DataFrame, axis: str, level: float = 0.95):
    """The measured gap (second - first mean error) at the smallest and the largest x both
    arms ran, and its change between them: (gap at the smallest, change, lo, hi), the
    change's Welch interval over the four cells' seeds (Satterthwaite's degrees of freedom);
    nan where there is no pair of sizes or a cell has fewer than two seeds."""
    a, b = size_means(first, "error", axis), size_means(second, "error", axis)
    both = a.merge(b, on=axis, suffixes=("_a", "_b")).sort_values(axis)
    if len(both) < 2:
        return math.nan, math.nan, math.nan, math.nan
    ends = both.iloc[[0, -1]]
    gap = (ends["mean_b"] - ends["mean_a"]).to_numpy()
    change = float(gap[1] - gap[0])
    parts = np.concatenate([ends["std_a"] ** 2 / ends["n_a"], ends["std_b"] ** 2 / ends["n_b"]])
    counts = np.concatenate([ends["n_a"], ends["n_b"]])
    if (counts < 2).any():
        return float(gap[0]), change, math.nan, math.nan
    se = math.sqrt(parts.sum())
    dof = parts.sum() ** 2 / (parts**2 / (counts - 1)).sum()
    half = t_dist.ppf((1 + level) / 2, dof) * se
    return float(gap[0]), change, change - half, change + half


def gap_reading(gap: float, lo: float, hi: float) -> str:
    """Whether the gap's size grows: a change of the gap's own sign widens it."""
    sign = 1.0 if gap >= 0 else -1.0
    lo, hi = sorted((sign * lo, sign * hi))
    return reading(lo, hi, GAP_CHANGE_READINGS)


def exponent_table(points: pd.DataFrame, fits: dict, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """alpha(a) - alpha(b) (one form: the plan's) for each (task, axis) where both arms
    fitted, and the measured gap's change (b - a error) on total parameters."""
    rows = []
    for task in sorted({task for task, _, _ in fits}):
        for a, b in pairs:
            for axis in AXES:
                fa, _ = fits.get((task, a, axis), (None, None))
                fb, _ = fits.get((task, b, axis), (None, None))
                if fa is None or fb is None:
                    continue
                text, read = difference_text(fa, fb)
                row = {
                    "task": task,
                    "arms": f"{a} vs {b}",
                    "axis": AXES[axis],
                    "form": fa.form,
                    "alpha difference": text,
                    "reading": read,
                }
                if axis == "total_params":
                    arm_a = points[(points["task"] == task) & (points["arm"] == a)]
                    arm_b = points[(points["task"] == task) & (points["arm"] == b)]
                    gap, change, lo, hi = gap_change(arm_a, arm_b, axis)
                    row["gap (second - first error) at the smallest size"] = f"{gap:.3g}"
                    shown = math.isfinite(lo) and calibrated(fa, "gap change")
                    row["its change to the largest size"] = (
                        interval_text(change, (lo, hi)) if shown else "n/a"
                    )
                    row["gap reading"] = gap_reading(gap, lo, hi) if shown else ""
                rows.append(row)
    return pd.DataFrame(rows)


def arm_pairs(points: pd.DataFrame, column: str, first: str, second: str) -> list[tuple[str, str]]:
    """(arm with ``column`` == first, arm with ``column`` == second) pairs of each task that
    agree on the other arm column (init or finetune) and on every other setting (sweep,
    budget, rate: ``setting_labels``)."""
    other = {"init": "finetune", "finetune": "init"}[column]
    keys = ["arm", "init", "finetune", "setting"]
    arms = points.drop_duplicates(["task", "arm"])[keys].drop_duplicates()
    a = arms[arms[column] == first]
    b = arms[arms[column] == second]
    both = a.merge(b, on=[other, "setting"], suffixes=("_a", "_b"))
    return sorted(set(zip(both["arm_a"], both["arm_b"], strict=True)))


# --------------------------------------------------------------------------- held out


def holdout_rows(points: pd.DataFrame, form: str = DEFAULT_FORM) -> tuple[pd.DataFrame, dict]:
    """The held-out check of every arm with at least ``MIN_SIZES`` + 1 sizes (total
    parameters): the plan's law fitted without the largest size, its prediction interval
    of that size's mean (the size's own deviation included): (table, {(task, arm):
    HoldoutCheck}). An interval not identified (the smaller sizes leave no degree of
    freedom) or not calibrated at the design is said so."""
    rows, checks = [], {}
    p = len(LAWS[check_form(form)].params)
    for (task, arm), group in points.groupby(["task", "arm"], sort=True):
        sizes = group["total_params"].nunique()
        if sizes < MIN_SIZES + 1 or (group["error"] <= 0).any():
            continue
        if sizes - 1 <= p:
            rows.append(
                {"task": task, "arm": arm, "note": f"not identified: {sizes - 1} sizes fit the "
                 f"{p} parameters of {form} exactly, leaving no size-level deviation to "
                 "estimate the prediction's spread from"}
            )  # fmt: skip
            continue
        try:
            check = holdout_check(group, "error", "total_params", form, method="size_means")
        except ValueError as e:
            rows.append({"task": task, "arm": arm, "note": str(e)})
            continue
        held = check.rows.iloc[0]
        whole = Design(
            "this arm",
            tuple(float(v) for v in np.sort(group["total_params"].unique())),
            int(group.groupby("total_params").size().min()),
        )
        ok = calibrated(check.fit, "held-out prediction", whole)
        # The figure draws what the table prints: no prediction interval where it says
        # "not calibrated".
        checks[(task, arm)] = (
            check
            if ok
            else dataclasses.replace(check, rows=check.rows.assign(lo=np.nan, hi=np.nan))
        )
        rows.append(
            {
                "task": task,
                "arm": arm,
                "held out (total params)": tables.human(held["total_params"]),
                "seeds": int(held["n_obs"]),
                "observed error": f"{held['observed']:.4f}",
                "predicted": f"{held['mean']:.4f}",
                "95% prediction interval": f"[{held['lo']:.4f}, {held['hi']:.4f}]"
                if ok
                else "not calibrated at this design",
                "relative error": f"{held['rel_error']:+.1%}",
                "inside": ("yes" if held["inside"] else "NO") if ok else "",
            }
        )
    return pd.DataFrame(rows), checks


def next_run_rows(points: pd.DataFrame, fits: dict) -> pd.DataFrame:
    """Per fitted arm on total parameters: the next run that most narrows alpha's interval
    per FLOP (``analysis.power.next_runs``), with the cost in the trials' ``total_flops``."""
    rows = []
    for (task, arm, axis), (fit, _) in fits.items():
        if fit is None or axis != "total_params" or "total_flops" not in points:
            continue
        group = points[(points["task"] == task) & (points["arm"] == arm)]
        cost = group.groupby("total_params")["total_flops"].mean()
        if not np.all(np.isfinite(cost.to_numpy(dtype=float))):
            continue
        options = next_runs(fit, cost)
        best = options.iloc[0]
        rows.append(
            {
                "task": task,
                "arm": arm,
                "alpha's half-width now": f"{best['half_width_now']:.3g}"
                if identified(fit, "alpha")
                else parameter_text(fit, "alpha"),
                "best next run": best["option"],
                "half-width after": f"{best['half_width_after']:.3g}",
                "cost (FLOPs)": f"{best['flops']:.3g}",
                "other options": "; ".join(
                    f"{o['option']}: {o['half_width_after']:.3g} for {o['flops']:.3g} FLOPs"
                    for o in options.iloc[1:].to_dict("records")
                ),
            }
        )
    return pd.DataFrame(rows)


TRANSFER_INTERVALS = ("D_E_low", "D_E_high", "D_T_low", "D_T_high")
TRANSFER_NOTE = (
    "not calibrated at this design: the seed bootstrap's 95% interval of D_E covered "
    "0.80-0.95 of 60 simulated studies at 3 seeds x 4 train_examples sizes "
    "(benchmarks/calibration.py, effective_data_checks)"
)
"""Why the effective-data intervals are withheld: the bootstrap resamples 3 seeds (their
spread 2/3 of the truth's) and sees no deviation of a size from the random arm's law."""


def withhold_transfer_intervals(table: pd.DataFrame) -> pd.DataFrame:
    """The transfer table as printed: D_E's and D_T's intervals withheld
    (``TRANSFER_NOTE`` in ``interval_note``), the point estimates kept."""
    if table.empty or "D_E" not in table:
        return table
    return table.assign(**dict.fromkeys(TRANSFER_INTERVALS, np.nan), interval_note=TRANSFER_NOTE)


def transfer_rows(
    trials: pd.DataFrame, metric: str, n_boot: int | None = None, intervals: bool = False
) -> pd.DataFrame:
    """Effective data transferred per (task, model, trained groups) where both inits ran at
    three or more ``train_examples`` sizes; its intervals withheld
    (``withhold_transfer_intervals``) unless ``intervals`` (the calibration benchmark scores
    them)."""
    if "train_examples" not in trials:
        return pd.DataFrame()
    df = tables.prepare(trials, metric)
    df = df[df["used"] & (df["train_examples"].fillna(0) > 0)].assign(
        error=lambda d: 1 - d["value"] / 100
    )
    out = []
    for (task, model, finetune), group in df.groupby(["task", "model_label", "finetune_label"]):
        inits = set(group["init"])
        if not {"pretrained", "random"} <= inits or group["train_examples"].nunique() < MIN_SIZES:
            continue
        try:
            # A withheld interval's bootstrap is not run (REPORT_BOOT refits a group).
            boot = (n_boot or REPORT_BOOT) if intervals else 0
            table = effective_data(group, "error", n_boot=boot)
        except ValueError as e:
            out.append(pd.DataFrame([{"task": task, "model": model, "note": str(e)}]))
            continue
        out.append(table.assign(task=task, model=model, finetune=finetune))
    table = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    return table if intervals else withhold_transfer_intervals(table)


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """Numbers as short strings for the report's tables (the CSV keeps them raw)."""
    return frame.apply(
        lambda c: c.map(lambda v: f"{v:.3g}" if isinstance(v, float) and math.isfinite(v) else v)
    )


def seed_spread(group: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Per x: n, mean, std of the error over seeds and the t interval of the mean (lo,
    hi)."""
    return size_means(group, "error", axis)


def curve_frame(fit, xs: np.ndarray) -> pd.DataFrame:
    """The law at ``xs`` with its 95% band; the band NaN (not drawn) where the band's check
    fails at the fit's design, as the law table says."""
    frame = pd.DataFrame({fit.x[0]: xs})
    curve = pd.concat([frame, fit.predict(frame)], axis=1)
    if fit.goodness["df"] < 1 or not calibrated(fit, "band"):
        curve[["band_lo", "band_hi"]] = np.nan
    return curve


def grid(values) -> np.ndarray:
    """x values to draw a law at: the data's range and half as far again beyond the largest
    (the direction a scaling law is read in); below the smallest x a band only widens."""
    low, high = float(np.min(values)), float(np.max(values))
    return np.geomspace(low, high * 1.5, 60)
