"""What a fitted law is used for: extrapolating to a held-out size, comparing two laws'
exponents, the two-step route from size to loss to accuracy, and the data a pretrained
start is worth (effective data transferred, Hernandez et al. 2021).

Every function takes DataFrame rows, fits with ``fit_scaling_law`` and returns plain
DataFrames or dicts, so a notebook can use them on any results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from scale_fpt.analysis.fit import ScalingFit, as_columns, fit_scaling_law
from scale_fpt.analysis.means import fit_size_means

MIN_HOLDOUT_SIZES = 4
"""Sizes needed for a held-out check: three to fit a floored law, one to predict."""


@dataclass
class HoldoutCheck:
    """A law fitted on every size but the largest, checked at the largest."""

    fit: ScalingFit
    """The law fitted without the largest size."""
    rows: pd.DataFrame
    """Per held-out x: n_obs, observed (mean of its rows), mean, lo, hi (prediction
    interval of the mean of n_obs observations), rel_error ((mean - observed) / observed),
    inside (observed within [lo, hi])."""
    size: str
    """The column whose largest value was held out."""

    @property
    def inside(self) -> bool:
        """Whether every held-out observation fell inside its prediction interval."""
        return bool(self.rows["inside"].all())

    @property
    def rel_error(self) -> float:
        """The largest relative error of the held-out predictions (signed)."""
        errors = self.rows["rel_error"]
        return float(errors.iloc[int(np.argmax(np.abs(errors.to_numpy())))])


HOLDOUT_METHODS = ("bootstrap", "size_means")


def holdout_check(
    df: pd.DataFrame,
    y: str,
    x,
    form: str = "power_floor",
    size: str | None = None,
    method: str = "bootstrap",
    **fit_kw,
) -> HoldoutCheck:
    """Fit on every value of ``size`` (default: the first x column) but the largest, predict
    the largest, and say whether its observed mean lies inside the prediction interval.
    ``method`` "bootstrap": ``fit_scaling_law`` (seeds resampled within sizes: the interval
    does not see a size's own deviation from the law); "size_means": ``fit_size_means`` (a
    deviation per size included; the report's). Raises ValueError when the data hold fewer
    than ``MIN_HOLDOUT_SIZES`` sizes."""
    if method not in HOLDOUT_METHODS:
        raise ValueError(f"holdout_check: method {method!r}; choose from {HOLDOUT_METHODS}")
    xs = as_columns(x)
    size = size or xs[0]
    if size not in df:
        raise ValueError(f"holdout_check: size column {size!r} not in the frame")
    sizes = np.sort(df[size].dropna().unique())
    if len(sizes) < MIN_HOLDOUT_SIZES:
        raise ValueError(
            f"holdout_check: {len(sizes)} distinct {size} value(s); a held-out check needs at "
            f"least {MIN_HOLDOUT_SIZES} (fit on all but the largest, predict the largest)"
        )
    largest = sizes[-1]
    kept = df[df[size] < largest]
    if method == "size_means":
        fit = fit_size_means(kept, y, size, form, **fit_kw)
    else:
        fit = fit_scaling_law(kept, y, xs, form, **fit_kw)
    held = df[df[size] == largest].groupby(xs, as_index=False)[y].agg(["mean", "count"])
    rows = []
    for record in held.to_dict("records"):
        point = pd.DataFrame([{c: record[c] for c in xs}])
        predicted = fit.predict(point, n_obs=int(record["count"])).iloc[0]
        observed = float(record["mean"])
        rows.append(
            {
                **{c: record[c] for c in xs},
                "n_obs": int(record["count"]),
                "observed": observed,
                **predicted.to_dict(),
                "rel_error": (predicted["mean"] - observed) / observed,
                "inside": bool(predicted["lo"] <= observed <= predicted["hi"]),
            }
        )
    return HoldoutCheck(fit=fit, rows=pd.DataFrame(rows), size=size)


def compare_exponents(a: ScalingFit, b: ScalingFit, param: str = "alpha") -> dict:
    """``a.param - b.param`` with the percentile interval of the difference of independent
    bootstrap draws (the two fits share no trial) and the share of draws above 0. Fits of
    different forms are refused: alpha of E + A x^-alpha (the rate towards a floor) and of
    A x^-alpha are not the same quantity."""
    if a.form != b.form:
        raise ValueError(
            f"compare_exponents: {a.form} vs {b.form}; exponents compare only within one form"
        )
    for fit in (a, b):
        if param not in fit.params:
            raise ValueError(f"compare_exponents: {fit.form} has no parameter {param!r}")
    draws_a, draws_b = a.samples[param].to_numpy(), b.samples[param].to_numpy()
    n = min(len(draws_a), len(draws_b))
    if n == 0:
        raise ValueError("compare_exponents: both fits need bootstrap draws (n_boot > 0)")
    diff = draws_a[:n] - draws_b[:n]
    level = min(a.level, b.level)
    lo, hi = np.quantile(diff, [(1 - level) / 2, (1 + level) / 2])
    return {
        "param": param,
        "estimate": a.params[param] - b.params[param],
        "lo": float(lo),
        "hi": float(hi),
        "share_above_zero": float(np.mean(diff > 0)),
        "level": level,
    }


@dataclass
class TwoStepFit:
    """Size -> loss (a power law) -> accuracy (a sigmoid of the loss), as OLMo's ladder
    predicts downstream accuracy; draws of the two fits are paired in order."""

    loss_fit: ScalingFit
    """The loss law on the size column(s)."""
    accuracy_fit: ScalingFit
    """The ``sigmoid`` law of accuracy on loss."""

    def predict(self, frame: pd.DataFrame, level: float | None = None) -> pd.DataFrame:
        """Accuracy per row of ``frame``: mean, lo/hi (with the accuracy fit's residual
        noise), band_lo/band_hi (the chained curves alone)."""
        level = self.loss_fit.level if level is None else level
        loss_point, loss_boot = self.loss_fit.curves(frame)
        law, acc = self.accuracy_fit.law, self.accuracy_fit
        n = min(len(loss_boot), len(acc.draws))
        point = np.exp(law.log_predict(acc.theta, loss_point[:, None]))
        boot = np.stack(
            [np.exp(law.log_predict(acc.draws[i], loss_boot[i][:, None])) for i in range(n)]
        ).reshape(n, -1)
        return acc.with_intervals(point, boot, level, 1, frame.index)


def two_step_fit(
    df: pd.DataFrame, loss: str, accuracy: str, x, loss_form: str = "power_floor", **fit_kw
) -> TwoStepFit:
    """Fit ``loss`` on ``x`` and ``accuracy`` on ``loss`` (sigmoid), same resampling."""
    return TwoStepFit(
        loss_fit=fit_scaling_law(df, loss, x, loss_form, **fit_kw),
        accuracy_fit=fit_scaling_law(df, accuracy, loss, "sigmoid", **fit_kw),
    )


def invert_power_floor(params: np.ndarray, value: np.ndarray) -> np.ndarray:
    """x at which E + A x^-alpha equals ``value``; inf where value <= E (never reached)."""
    A, alpha, E = (params[..., i] for i in range(3))
    gap = value - E
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (A / gap) ** (1 / alpha)
    return np.where(gap > 0, x, np.inf)


def effective_data(
    df: pd.DataFrame,
    y: str,
    data: str = "train_examples",
    arm: str = "init",
    pretrained="pretrained",
    scratch="random",
    groups: str | None = "seed",
    level: float = 0.95,
    **fit_kw,
) -> pd.DataFrame:
    """Effective data transferred (Hernandez et al. 2021): per fine-tuning data size D_F,
    the data D_E a model trained from ``scratch`` needs to reach the ``pretrained`` arm's
    loss (or error) ``y`` at D_F, and D_T = D_E - D_F.

    The scratch arm's ``y`` is fitted as E + A D^-alpha on ``data``; its bootstrap draws are
    paired with resamples of the pretrained arm's ``groups`` (seeds) at each D_F, so the
    interval covers both arms' seed noise. D_E is inf where the pretrained value is below
    the scratch law's floor E: no amount of data from scratch reaches it.
    With ``n_boot=0`` in ``fit_kw`` no bootstrap runs and the intervals are nan.

    Columns (the report's vocabulary, ``report.columns``): D_F, n (its seeds), pretrained
    (mean y), D_E, D_E_low, D_E_high, D_T, D_T_low, D_T_high,
    fraction (D_T / D_E: the share of the effective data that pretraining supplied),
    extrapolated (D_E beyond the largest ``data`` the scratch arm ran: the law is read where
    it was not fitted)."""
    for column in (y, data, arm):
        if column not in df:
            raise ValueError(f"effective_data: column {column!r} not in the frame")
    arms = set(df[arm])
    if not {pretrained, scratch} <= arms:
        raise ValueError(
            f"effective_data: {arm} needs both {pretrained!r} and {scratch!r}; has {sorted(arms)}"
        )
    fit = fit_scaling_law(
        df[df[arm] == scratch], y, data, "power_floor", groups=groups, level=level, **fit_kw
    )
    natural = fit.law.natural(fit.theta)
    draws = fit.samples.to_numpy()
    rng = np.random.default_rng(fit.seed + 2)
    q = [(1 - level) / 2, (1 + level) / 2]
    rows = []
    for size, rows_p in df[df[arm] == pretrained].groupby(data):
        values = rows_p[y].to_numpy(dtype=float)
        observed = values.mean()
        d_e = float(invert_power_floor(natural, observed))
        lo = hi = np.nan  # n_boot=0: no interval
        if len(draws):
            resampled = rng.choice(values, size=(len(draws), len(values))).mean(axis=1)
            d_e_boot = invert_power_floor(draws, resampled)
            lo, hi = np.quantile(d_e_boot, q, method="inverted_cdf")
        rows.append(
            {
                "D_F": float(size),
                "n": len(values),
                "pretrained": observed,
                "D_E": d_e,
                "D_E_low": float(lo),
                "D_E_high": float(hi),
                "D_T": d_e - size,
                "D_T_low": float(lo) - size,
                "D_T_high": float(hi) - size,
                "fraction": (d_e - size) / d_e if np.isfinite(d_e) else 1.0,
                "extrapolated": bool(d_e > fit.goodness["x_range"][data][1]),
            }
        )
    out = pd.DataFrame(rows)
    out.attrs["scratch_fit"] = fit
    return out
