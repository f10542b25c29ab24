"""The report's scaling laws: the study's questions answered with fitted laws and intervals.

Each arm (task x init x trained groups, transformers only, one learning rate per arm as in
the paper tables) with three or more model sizes is fitted as ``error = E + A x^-alpha``,
or as ``A x^-alpha`` where the data show no floor (``analysis.fit_floor_or_power``; Huber
on log residuals, L-BFGS-B, seeds resampled within each size)
on three axes: total parameters, trained parameters and training FLOPs (this project's
accounting: 4N + attention per token for a frozen body, 6N when the body trains; the
``total_flops`` column). ``error`` is 1 - the report's metric. From the fits:

- ``law_table``: every fit's exponent and floor with intervals, or why an arm was not fitted;
- ``exponent_table``: differences of exponents between two arms (pretrained - random: does
  the gap grow or shrink with size? frozen - full);
- ``holdout_table``: arms with four or more sizes fitted without their largest size and
  checked there (prediction interval of the seeds' mean);
- ``transfer_table``: effective data transferred where trials ran at several
  ``train_examples``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.analysis import compare_exponents, effective_data, fit_floor_or_power, holdout_check
from scale_fpt.analysis.predict import MIN_HOLDOUT_SIZES
from scale_fpt.report import tables

AXES = {
    "total_params": "total parameters",
    "trainable_params": "trained parameters",
    "total_flops": "training FLOPs",
}
"""Column -> axis label of every fit."""
MIN_SIZES = 3
"""Model sizes an arm needs for ``E + A x^-alpha`` (three parameters)."""
REPORT_BOOT = 200
"""Bootstrap resamples per fit in the report (the library's default is 1,000)."""


def scaling_points(trials: pd.DataFrame, metric: str, best_lr: bool = False) -> pd.DataFrame:
    """Used transformer trials with ``error`` (1 - metric) and an ``arm`` label
    (init · trained groups); one rate per arm: the paper's (``tables.fixed_lr``) or, with
    ``best_lr``, each search arm's best by validation (``tables.lr_points``)."""
    df = tables.prepare(trials, metric)
    df = df[df["used"] & (df["kind"] == "transformer")]
    if best_lr:
        points = tables.lr_points(trials, metric)
        if points.empty:
            return df.iloc[:0]
        best = points.loc[
            points.groupby(list(tables.SEARCH_ARM_KEYS), dropna=False)["score"].idxmax()
        ]
        ids = set(",".join(best["trial_ids"]).split(","))
        df = df[df["trial_id"].isin(ids)]
    else:
        df, _ = tables.fixed_lr(df)
    if "train_examples" not in df:
        df["train_examples"] = 0
    df = df[df["train_examples"].fillna(0) == 0]
    return df.assign(error=1 - df["value"] / 100, arm=arm_labels(df, best_lr))


def arm_labels(df: pd.DataFrame, best_lr: bool = False) -> pd.Series:
    """init · trained groups, plus every setting that varies within a task (so trials of
    different budgets or rates are never pooled into one law). At the best rate, the rate
    may vary with size by design."""
    label = df["init_label"] + " · " + df["finetune_label"]
    settings = ["batch_size", "max_steps", "weights"] + ([] if best_lr else ["lr"])
    for key in settings:
        varies = df.groupby(["task", "init_label", "finetune_label"])[key].transform("nunique") > 1
        label = label.where(~varies, label + f" · {key}=" + df[key].astype(str))
    return label


def fit_arm(group: pd.DataFrame, axis: str, n_boot: int):
    """(fit, None) or (None, why not) for one arm on one axis."""
    sizes = group["total_params"].nunique()
    if sizes < MIN_SIZES:
        return None, f"{sizes} model size(s); a law needs {MIN_SIZES}"
    if (group["error"] <= 0).any():
        return None, "error reaches 0 (accuracy 100%): no power law to fit"
    try:
        return fit_floor_or_power(group, "error", axis, groups="seed", n_boot=n_boot), None
    except ValueError as e:
        return None, str(e).removeprefix("fit_scaling_law: ")


def fit_all(points: pd.DataFrame, n_boot: int | None = None) -> dict:
    """{(task, arm, axis): (fit or None, reason or None)} for every arm run at two or more
    model sizes (an arm of one size has no scaling to fit or to explain), on every axis."""
    out = {}
    for (task, arm), group in points.groupby(["task", "arm"], sort=True):
        if group["total_params"].nunique() < 2:
            continue
        for axis in AXES:
            out[(task, arm, axis)] = fit_arm(group, axis, n_boot or REPORT_BOOT)
    return out


def interval_text(value: float, interval: tuple[float, float]) -> str:
    return f"{value:.3g} [{interval[0]:.3g}, {interval[1]:.3g}]"


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
            row.update(alpha="", E="", A="", r2_log="", note=reason)
        else:
            floored = "E" in fit.params
            row.update(
                alpha=interval_text(fit.params["alpha"], fit.intervals["alpha"]),
                E=interval_text(fit.params["E"], fit.intervals["E"]) if floored else "0",
                A=f"{fit.params['A']:.3g}",
                r2_log=f"{fit.goodness['r2_log']:.3f}",
                note=", ".join(
                    ([] if floored else [f"no floor ({fit.goodness['no_floor']}): E = 0"])
                    + [f"{p} at its bound" for p in fit.goodness["at_bound"]]
                ),
            )
        rows.append(row)
    return pd.DataFrame(rows)


def exponent_table(fits: dict, pairs: list[tuple[str, str]], readings) -> pd.DataFrame:
    """alpha(a) - alpha(b) with its interval for each (task, axis) where both arms fitted,
    read with ``readings`` (``reading``)."""
    rows = []
    tasks = sorted({task for task, _, _ in fits})
    for task in tasks:
        for a, b in pairs:
            for axis in AXES:
                fa, _ = fits.get((task, a, axis), (None, None))
                fb, _ = fits.get((task, b, axis), (None, None))
                if fa is None or fb is None:
                    continue
                diff = compare_exponents(fa, fb)
                rows.append(
                    {
                        "task": task,
                        "arms": f"{a} vs {b}",
                        "axis": AXES[axis],
                        "alpha difference": interval_text(
                            diff["estimate"], (diff["lo"], diff["hi"])
                        ),
                        "share of draws > 0": f"{diff['share_above_zero']:.2f}",
                        "reading": reading(diff["lo"], diff["hi"], readings),
                    }
                )
                if readings is GAP_READINGS:
                    change, lo, hi = gap_change(fa, fb)
                    rows[-1]["gap change, smallest to largest size"] = interval_text(
                        change, (lo, hi)
                    )
                    rows[-1]["gap reading"] = reading(lo, hi, GAP_CHANGE_READINGS)
    return pd.DataFrame(rows)


GAP_READINGS = (
    "pretrained error falls faster towards its floor (larger alpha)",
    "random error falls faster towards its floor (larger alpha)",
    "interval includes 0: the same rate",
)
"""Readings of alpha(pretrained) - alpha(random): above 0, below 0, either. Whether the
gap itself grows also depends on the floors: ``gap_change`` measures it."""
TUNING_READINGS = (
    "frozen error falls faster with size",
    "full fine-tuning error falls faster with size",
    "interval includes 0: same rate",
)
"""Readings of alpha(frozen) - alpha(full)."""
GAP_CHANGE_READINGS = (
    "the gap grows with size",
    "the gap shrinks with size",
    "interval includes 0: no detectable change of the gap",
)
"""Readings of the fitted gap's change from the smallest to the largest size."""


def gap_change(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """Change of the fitted gap (b - a, e.g. random - pretrained error) from the smallest to
    the largest x both fits share, with the percentile interval of paired bootstrap draws."""
    (column,) = a.x
    low = max(a.goodness["x_range"][column][0], b.goodness["x_range"][column][0])
    high = min(a.goodness["x_range"][column][1], b.goodness["x_range"][column][1])
    frame = pd.DataFrame({column: [low, high]})
    (pa_, boot_a), (pb_, boot_b) = a.curves(frame), b.curves(frame)
    n = min(len(boot_a), len(boot_b))
    gap = boot_b[:n] - boot_a[:n]
    change = gap[:, 1] - gap[:, 0]
    lo, hi = np.quantile(change, [(1 - level) / 2, (1 + level) / 2])
    return float((pb_[1] - pa_[1]) - (pb_[0] - pa_[0])), float(lo), float(hi)


def reading(lo: float, hi: float, readings: tuple[str, str, str]) -> str:
    """What an exponent difference's interval says (a larger alpha: error falls faster)."""
    return readings[0] if lo > 0 else readings[1] if hi < 0 else readings[2]


def arm_pairs(points: pd.DataFrame, column: str, first: str, second: str) -> list[tuple[str, str]]:
    """(arm with ``column`` == first, arm with ``column`` == second) pairs of each task that
    agree on the other arm column (init or finetune)."""
    other = {"init": "finetune", "finetune": "init"}[column]
    arms = points.drop_duplicates(["task", "arm"])[["arm", "init", "finetune"]].drop_duplicates()
    a = arms[arms[column] == first]
    b = arms[arms[column] == second]
    both = a.merge(b, on=other, suffixes=("_a", "_b"))
    return sorted(set(zip(both["arm_a"], both["arm_b"], strict=True)))


def holdout_rows(points: pd.DataFrame, n_boot: int | None = None) -> tuple[pd.DataFrame, dict]:
    """The held-out check of every arm with at least ``MIN_HOLDOUT_SIZES`` sizes (total
    parameters): (table, {(task, arm): HoldoutCheck})."""
    rows, checks = [], {}
    for (task, arm), group in points.groupby(["task", "arm"], sort=True):
        if group["total_params"].nunique() < MIN_HOLDOUT_SIZES or (group["error"] <= 0).any():
            continue
        try:
            check = holdout_check(
                group,
                "error",
                "total_params",
                "floor_or_power",
                groups="seed",
                n_boot=n_boot or REPORT_BOOT,
            )
        except ValueError as e:
            rows.append({"task": task, "arm": arm, "note": str(e)})
            continue
        checks[(task, arm)] = check
        held = check.rows.iloc[0]
        rows.append(
            {
                "task": task,
                "arm": arm,
                "held out (total params)": tables.human(held["total_params"]),
                "seeds": int(held["n_obs"]),
                "observed error": f"{held['observed']:.4f}",
                "predicted": f"{held['mean']:.4f}",
                "95% prediction interval": f"[{held['lo']:.4f}, {held['hi']:.4f}]",
                "relative error": f"{held['rel_error']:+.1%}",
                "inside": "yes" if held["inside"] else "NO",
            }
        )
    return pd.DataFrame(rows), checks


def transfer_rows(trials: pd.DataFrame, metric: str, n_boot: int | None = None) -> pd.DataFrame:
    """Effective data transferred per (task, model, trained groups) where both inits ran at
    three or more ``train_examples`` sizes."""
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
            table = effective_data(group, "error", n_boot=n_boot or REPORT_BOOT)
        except ValueError as e:
            out.append(pd.DataFrame([{"task": task, "model": model, "note": str(e)}]))
            continue
        out.append(table.assign(task=task, model=model, finetune=finetune))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """Numbers as short strings for the report's tables (the CSV keeps them raw)."""
    return frame.apply(
        lambda c: c.map(lambda v: f"{v:.3g}" if isinstance(v, float) and math.isfinite(v) else v)
    )


def seed_spread(group: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Per x: n, mean, std of the error over seeds."""
    return group.groupby(axis)["error"].agg(n="count", mean="mean", std="std").reset_index()


def curve_frame(fit, xs: np.ndarray) -> pd.DataFrame:
    frame = pd.DataFrame({fit.x[0]: xs})
    return pd.concat([frame, fit.predict(frame)], axis=1)


def grid(values) -> np.ndarray:
    """x values to draw a law at: the data's range and half as far again beyond the largest
    (the direction a scaling law is read in); below the smallest x a band only widens."""
    low, high = float(np.min(values)), float(np.max(values))
    return np.geomspace(low, high * 1.5, 60)
