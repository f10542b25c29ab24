"""Fitting a scaling law to rows of a DataFrame, with bootstrap intervals.

    fit = fit_scaling_law(df, y="error", x="trainable_params", form="power_floor", groups="seed")

The point estimate minimises the mean Huber loss of log residuals, ``log ŷ - log y``
(``huber_delta`` 1e-3, as in Hoffmann et al. 2022 and Besiroglu et al. 2024), with
L-BFGS-B (scipy): every point of the form's starting grid is scored in one vectorised pass,
and L-BFGS-B refines the ``starts`` best of them; the lowest loss wins.

Intervals come from a grouped, stratified bootstrap: the units resampled are the values of
``groups`` (e.g. seeds; each row alone when ``groups`` is None), resampled within each
stratum (by default each distinct x, i.e. each model size, when every size holds at least two
units; otherwise across all rows). A stratum of m units resampled with replacement spreads
(m-1)/m as much as the population it was drawn from, which matters for the usual three to
five seeds; each resampled stratum's deviations from its mean (in log y) are therefore scaled
by sqrt(m/(m-1)). Every resample is refitted by L-BFGS-B started from the point estimate.
Intervals are percentile intervals of the refitted parameters.

The bootstrap sees the seeds' noise only: a model size's own deviation from the law (shared
by its seeds) is invisible to it, and with three seeds a size's mean is resampled from three
values. For seeded ladders, ``analysis.means.fit_size_means`` (the report's fits) counts that
deviation.

``ScalingFit.predict`` gives, per row, the point prediction, the band of the fitted curve
(bootstrap percentiles) and the prediction interval of a new observation (or of the mean of
``n_obs`` new observations): each bootstrap curve times the exponential of residuals drawn
from the fit's log residuals, inflated by sqrt(n / (n - p)) for the parameters fitted.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import huber
from threadpoolctl import threadpool_limits

from scale_fpt.analysis.laws import LAWS, MAX_EXPONENT, Law

DEFAULT_DELTA = 1e-3
"""Huber threshold on log residuals (Hoffmann et al. 2022; Besiroglu et al. 2024), kept for
their data (one run per point, residuals ~1e-2). On seeded studies it acts as least absolute
deviations (~64% efficiency under normal noise): pass about 1.345 x the residual sd in log y
there for 95% efficiency (docs/scaling-laws.md, "Huber's delta")."""
LINE_SEARCH_STOP = 2
"""L-BFGS-B's status when its line search finds no decrease: near a Huber optimum the
curvature jumps (residuals crossing delta) and the search can stop there; it counts as
converged. Status 1 (iteration limit) and non-finite losses do not."""
MAX_FAILED_SHARE = 0.1
"""Share of bootstrap refits allowed to fail before the intervals are refused."""


# --------------------------------------------------------------------------- objective


class Objective:
    """Mean Huber loss of log residuals (divided by delta, so it reads like |residual|) and
    its gradient, for one data set (Z, log y)."""

    def __init__(self, law: Law, Z: np.ndarray, log_y: np.ndarray, delta: float):
        self.law, self.Z, self.log_y, self.delta = law, Z, log_y, delta

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        log_y, J = self.law.evaluate(theta, self.Z)
        r = log_y - self.log_y
        if not np.all(np.isfinite(r)):
            return np.inf, np.zeros_like(theta)
        n = len(r)
        value = huber(self.delta, r).sum() / (n * self.delta)
        slope = np.clip(r, -self.delta, self.delta) / (n * self.delta)
        return float(value), slope @ J

    def batch(self, thetas: np.ndarray) -> np.ndarray:
        """Loss of every row of ``thetas`` (G, p) at once (non-finite -> inf)."""
        r = self.law.log_predict(thetas, self.Z) - self.log_y
        value = huber(self.delta, r).mean(axis=-1) / self.delta
        return np.where(np.isfinite(value), value, np.inf)


def refine(objective: Objective, theta0: np.ndarray):
    """L-BFGS-B from ``theta0``: (theta, loss, converged)."""
    bounds = objective.law.bounds()
    result = minimize(
        objective,
        theta0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-9},
    )
    ok = bool(np.isfinite(result.fun)) and (result.success or result.status == LINE_SEARCH_STOP)
    return result.x, float(result.fun), ok


def multistart(objective: Objective, grid: np.ndarray, starts: int):
    """Refine the ``starts`` best points of ``grid``; (theta, loss) of the best converged fit,
    or None when none converged."""
    scores = objective.batch(grid)
    order = np.argsort(scores)[:starts]
    best = None
    for i in order:
        if not np.isfinite(scores[i]):
            continue
        theta, loss, ok = refine(objective, grid[i])
        if ok and (best is None or loss < best[1]):
            best = (theta, loss)
    return best


# --------------------------------------------------------------------------- bootstrap


def resample_plan(X: np.ndarray, units: np.ndarray, strata: str | None):
    """(strata, by_x): the stratified resampling layout, [(rows of each unit of a stratum) per
    stratum], and whether each stratum is one x (True) or all rows (False).

    ``strata`` "auto": each distinct x row is a stratum when every one holds two or more
    units, else one stratum of everything; "x": always by x; None: one stratum."""
    if strata not in ("auto", "x", None):
        raise ValueError(f"strata must be 'auto', 'x' or None, got {strata!r}")
    _, x_key = np.unique(X, axis=0, return_inverse=True)
    x_key = x_key.ravel()
    layout = []
    for s in np.unique(x_key):
        rows = np.flatnonzero(x_key == s)
        layout.append([rows[units[rows] == u] for u in np.unique(units[rows])])
    if strata == "x" or (strata == "auto" and min(len(s) for s in layout) >= 2):
        return layout, True
    return [[np.flatnonzero(units == u) for u in np.unique(units)]], False


def draw_resample(layout, by_x: bool, log_y: np.ndarray, rng: np.random.Generator):
    """(row indices, their log y) of one stratified resample. In strata of one x the
    deviations from the stratum's mean are rescaled by sqrt(m/(m-1)); a stratum of all rows
    (a case bootstrap) is left as drawn: its mean follows the law, not one value, so scaling
    deviations from it would stretch the law itself."""
    rows, values = [], []
    for stratum in layout:
        m = len(stratum)
        chosen = [stratum[i] for i in rng.integers(0, m, size=m)]
        idx = np.concatenate(chosen)
        v = log_y[idx]
        if by_x and m > 1:
            centre = np.mean(log_y[np.concatenate(stratum)])
            v = centre + (v - centre) * np.sqrt(m / (m - 1))
        rows.append(idx)
        values.append(v)
    return np.concatenate(rows), np.concatenate(values)


def refit_all(form: str, Z, resamples, theta, delta) -> list[tuple[np.ndarray, bool]]:
    """(theta, converged) of each resample, L-BFGS-B started at the point estimate."""
    law = LAWS[form]
    with threadpool_limits(limits=1, user_api="blas"):
        return [refine(Objective(law, Z[idx], v, delta), theta)[::2] for idx, v in resamples]


def bootstrap_refits(form, Z, resamples, theta, delta, workers: int):
    """``refit_all`` here, or split over ``workers`` processes. The resamples are drawn
    before, in this process, so the draws do not depend on ``workers``."""
    if workers <= 1 or len(resamples) < 2 * workers:
        return refit_all(form, Z, resamples, theta, delta)
    chunks = np.array_split(np.arange(len(resamples)), workers)
    # spawn, not fork: the caller may hold threads (Ray, torch) that a fork would copy
    # mid-operation.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = pool.map(
            refit_all,
            *zip(
                *[(form, Z, [resamples[i] for i in c], theta, delta) for c in chunks], strict=True
            ),
        )
        return [refit for part in parts for refit in part]


# --------------------------------------------------------------------------- the fit


@dataclass
class ScalingFit:
    """A fitted scaling law: point estimates, bootstrap intervals, predictions."""

    form: str
    """The law's name (``laws.LAWS``)."""
    y: str
    """The response column."""
    x: list[str]
    """The x columns, in the law's order (N, D for chinchilla)."""
    params: dict[str, float]
    """Point estimates of the reported parameters."""
    intervals: dict[str, tuple[float, float]]
    """Bootstrap percentile interval of each parameter at ``level``."""
    level: float
    """Coverage of the intervals (0.95)."""
    goodness: dict
    """n, n_params, loss (mean Huber / delta), rmse_log, r2_log, mape, n_boot, n_failed,
    strata, units, x_range ({column: (min, max)}), at_bound (exponents on a bound of the
    search box, and the floor E when it is <= 0: no floor detected)."""
    theta: np.ndarray = field(repr=False)
    """The point estimate in the law's coordinates (``laws`` module docstring)."""
    draws: np.ndarray = field(repr=False)
    """Bootstrap refits in the law's coordinates, (n_boot - n_failed, p)."""
    residuals: np.ndarray = field(repr=False)
    """Log residuals log y - log ŷ of the point fit."""
    seed: int = 0
    """Seed of the bootstrap and of the prediction intervals' residual draws."""

    @property
    def law(self) -> Law:
        return LAWS[self.form]

    @property
    def samples(self) -> pd.DataFrame:
        """Bootstrap draws of the reported parameters, one row per resample."""
        return pd.DataFrame(self.law.natural(self.draws), columns=list(self.law.params))

    def summary(self) -> pd.DataFrame:
        """One row per parameter: estimate, lo, hi."""
        return pd.DataFrame(
            [
                {"param": p, "estimate": v, "lo": self.intervals[p][0], "hi": self.intervals[p][1]}
                for p, v in self.params.items()
            ]
        )

    def design(self, frame) -> np.ndarray:
        """The law's transformed inputs from ``frame``'s x columns (validated)."""
        missing = [c for c in self.x if c not in frame]
        if missing:
            raise ValueError(f"predict: columns {missing} missing (the fit's x: {self.x})")
        X = frame[self.x].to_numpy(dtype=float)
        if not np.all(np.isfinite(X)) or (self.law.log_x and np.any(X <= 0)):
            raise ValueError(f"predict: {self.x} must be finite and positive")
        return self.law.transform(X)

    def curves(self, frame) -> tuple[np.ndarray, np.ndarray]:
        """(point curve (m,), bootstrap curves (B, m)) at ``frame``'s rows."""
        Z = self.design(frame)
        draws = self.draws if len(self.draws) else self.theta[None]  # n_boot=0: no band
        return np.exp(self.law.log_predict(self.theta, Z)), np.exp(self.law.log_predict(draws, Z))

    def predict(self, frame, level: float | None = None, n_obs: int = 1) -> pd.DataFrame:
        """Per row of ``frame``: ``mean`` (the fitted law), ``lo``/``hi`` (prediction
        interval of the mean of ``n_obs`` new observations), ``band_lo``/``band_hi`` (the
        fitted curve's own interval)."""
        level = self.level if level is None else level
        point, boot = self.curves(frame)
        return self.with_intervals(point, boot, level, n_obs, frame.index)

    def with_intervals(self, point, boot, level, n_obs, index) -> pd.DataFrame:
        q = [(1 - level) / 2, (1 + level) / 2]
        rng = np.random.default_rng(self.seed + 1)
        n, p = len(self.residuals), len(self.theta)
        spread = self.residuals * np.sqrt(n / max(n - p, 1))
        noise = rng.choice(spread, size=(*boot.shape, n_obs))
        observed = boot * np.exp(noise).mean(axis=-1)
        band = np.quantile(boot, q, axis=0)
        interval = np.quantile(observed, q, axis=0)
        return pd.DataFrame(
            {
                "mean": point,
                "lo": interval[0],
                "hi": interval[1],
                "band_lo": band[0],
                "band_hi": band[1],
            },
            index=index,
        )


def as_columns(x) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def validate(df, y, xs, law: Law, groups, n_boot, level, huber_delta) -> list[str]:
    """Every problem with the inputs, as sentences (empty when the fit can start)."""
    problems = []
    if not isinstance(df, pd.DataFrame):
        return [f"expected a pandas DataFrame, got {type(df).__name__}"]
    if len(xs) != law.n_vars:
        problems.append(f"form {law.name!r} takes {law.n_vars} x column(s), got {xs}")
    columns = [y, *xs, *([groups] if groups else [])]
    missing = [c for c in columns if c not in df]
    if missing:
        problems.append(f"columns {missing} not in the frame (it has {list(df.columns)})")
        return problems
    for c in [y, *xs]:
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(values)):
            problems.append(
                f"{c}: {int((~np.isfinite(values)).sum())} missing or non-finite values"
            )
        elif (c == y or law.log_x) and np.any(values <= 0):
            problems.append(f"{c}: {int((values <= 0).sum())} non-positive values (logs are taken)")
    if groups and df[groups].isna().any():
        problems.append(f"groups column {groups!r} has missing values")
    if n_boot < 0:
        problems.append(f"n_boot must be >= 0, got {n_boot}")
    if not 0 < level < 1:
        problems.append(f"level must be within (0, 1), got {level}")
    if not huber_delta > 0:
        problems.append(f"huber_delta must be positive, got {huber_delta}")
    if problems:
        return problems
    p = len(law.params)
    if len(df) <= p:
        problems.append(f"{len(df)} points for {p} parameters of {law.name}: need at least {p + 1}")
    distinct = len(df[xs].drop_duplicates())
    if distinct < min(p, len(df)):
        problems.append(f"{distinct} distinct x value(s) for {p} parameters: need at least {p}")
    for c in xs:
        if df[c].nunique() < 2:
            problems.append(f"{c} is constant: no trend can be fitted")
    if df[y].nunique() < 2:
        problems.append(f"{y} is constant (flat data): no law can be fitted")
    return problems


def fit_scaling_law(
    df: pd.DataFrame,
    y: str,
    x: str | list[str],
    form: str = "power_floor",
    groups: str | None = None,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    huber_delta: float = DEFAULT_DELTA,
    strata: str | None = "auto",
    starts: int = 5,
    seed: int = 0,
    workers: int = 1,
) -> ScalingFit:
    """Fit ``form`` (``power``, ``power_floor``, ``chinchilla``, ``sigmoid``) of ``y`` on
    ``x`` with bootstrap intervals; see the module docstring. Raises one ValueError naming
    every problem (unknown form, missing columns, non-positive values, too few points,
    flat data, no converged fit). ``workers`` > 1 refits the bootstrap resamples in that
    many processes (same result as 1)."""
    if form not in LAWS:
        raise ValueError(f"fit_scaling_law: unknown form {form!r}: choose one of {', '.join(LAWS)}")
    law = LAWS[form]
    xs = as_columns(x)
    problems = validate(df, y, xs, law, groups, n_boot, level, huber_delta)
    if problems:
        raise ValueError("fit_scaling_law: " + "; ".join(problems))
    # Thousands of tiny BLAS calls (inside L-BFGS-B and the Jacobian product): threads only
    # add synchronisation, ~10x slower on a busy 2-core machine than one thread.
    with threadpool_limits(limits=1, user_api="blas"):
        return estimate(
            df, y, xs, law, groups, n_boot, level, huber_delta, strata, starts, seed, workers
        )


def estimate(df, y, xs, law, groups, n_boot, level, huber_delta, strata, starts, seed, workers):
    """The fit itself, on validated inputs (``fit_scaling_law``)."""
    X = df[xs].to_numpy(dtype=float)
    log_y = np.log(df[y].to_numpy(dtype=float))
    Z = law.transform(X)
    objective = Objective(law, Z, log_y, huber_delta)
    best = multistart(objective, law.start_grid(Z, np.exp(log_y)), starts)
    if best is None:
        raise ValueError(
            f"fit_scaling_law: no start of the {law.name} fit of {y} on {xs} converged "
            "(L-BFGS-B); the data may not follow this form"
        )
    theta, loss = best
    # integer codes of the groups (any dtype of labels); each row its own unit without groups
    units = pd.factorize(df[groups])[0] if groups else np.arange(len(df))
    layout, by_x = resample_plan(X, units, strata)
    rng = np.random.default_rng(seed)
    resamples = [draw_resample(layout, by_x, log_y, rng) for _ in range(n_boot)]
    refits = bootstrap_refits(law.name, Z, resamples, theta, huber_delta, workers)
    draws = [refit for refit, ok in refits if ok]
    failed = n_boot - len(draws)
    if n_boot and failed > MAX_FAILED_SHARE * n_boot:
        raise ValueError(
            f"fit_scaling_law: {failed} of {n_boot} bootstrap refits did not converge; the "
            f"{law.name} law is not identified by these data"
        )
    draws = np.array(draws).reshape(-1, len(theta))
    natural, boot = law.natural(theta), law.natural(draws)
    q = [(1 - level) / 2, (1 + level) / 2]
    bounds = np.quantile(boot, q, axis=0) if len(boot) else np.full((2, len(theta)), np.nan)
    residuals = log_y - law.log_predict(theta, Z)
    box = law.bounds()
    at_bound = [
        law.params[i]
        for i, (lo, hi) in enumerate(box)
        if hi == MAX_EXPONENT and (theta[i] <= lo + 1e-9 or theta[i] >= hi - 1e-9)
    ]
    if law.floor is not None and theta[law.floor] <= 0:
        at_bound.append(law.params[law.floor])  # no floor detected
    goodness = {
        "n": len(df),
        "n_params": len(theta),
        "loss": loss,
        "rmse_log": float(np.sqrt(np.mean(residuals**2))),
        "r2_log": float(1 - np.sum(residuals**2) / np.sum((log_y - log_y.mean()) ** 2)),
        "mape": float(np.mean(np.abs(np.expm1(-residuals)))),
        "n_boot": n_boot,
        "n_failed": failed,
        "strata": len(layout),
        "x_range": {c: (float(X[:, i].min()), float(X[:, i].max())) for i, c in enumerate(xs)},
        "units": int(units.max() + 1),
        "at_bound": at_bound,
    }
    return ScalingFit(
        form=law.name,
        y=y,
        x=xs,
        params=dict(zip(law.params, map(float, natural), strict=True)),
        intervals={p: (float(bounds[0, i]), float(bounds[1, i])) for i, p in enumerate(law.params)},
        level=level,
        goodness=goodness,
        theta=theta,
        draws=draws,
        residuals=residuals,
        seed=seed,
    )
