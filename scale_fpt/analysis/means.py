"""Laws fitted to the mean of each model size, with a random effect per size: the report's
fits, whose intervals say what a few sizes and seeds can carry.

    fit = fit_size_means(df, y="error", x="total_params", form="power_floor")
    fit.params, fit.intervals, fit.identified, fit.predict(new_df)

**Model.** Each size i has m seeds; their mean ȳ_i = f(x_i) (1 + δ_i), where δ_i holds the
seeds' noise and a deviation of the size itself from the law (its data order, its
pretraining run, ...): Var δ_i = τ² + σ²/m, the same at every size when every size has
m seeds. Seeds alone cannot see τ; the spread of the size means around the law can. So the
law is fitted to the k size means by weighted least squares (weights 1/ȳ_i², i.e. relative
errors), and its residual variance, with k - p degrees of freedom (p: the law's parameters),
estimates τ² + σ²/m. With k = p (three sizes for E + A x^-alpha) nothing is left to estimate
it: every interval is "not identified".

**Intervals by profiling.** Given alpha, both forms are linear in the rest (``power``:
A x^-alpha; ``power_floor``: E + A x^-alpha), so the weighted residual sum of squares
RSS(alpha) is closed-form on a grid of alpha (``ALPHA_GRID``). A parameter's interval is
the set of its values whose profiled RSS exceeds the minimum by at most
F(1, k - p; level) · RSS_min / (k - p): the likelihood-ratio (F) confidence set of a normal
nonlinear regression, exact for the linear parameters at fixed alpha and accurate for alpha
itself (Bates & Watts 1988, ch. 6; it follows the curvature a Wald interval ignores). The
same construction gives the band of the curve (the fitted value at x0 constrained) and the
prediction interval of a new size's mean (a new observation added): for a linear model the
latter is exactly the t prediction interval. No bootstrap: a fit costs a few milliseconds,
and the calibration (``coverage.law_checks``) runs thousands of studies.

The seeds cannot tell whether the noise is relative to the error (the weights above) or
constant in accuracy points (weights 1); alpha's and E's printed intervals are the hull of
the profile intervals under both (``law_intervals``), so they hold either way (alpha at
Pythia's 8 sizes with noise in points: 0.945 under relative weights alone, 0.978 as the
hull, about 8% wider; at 4 sizes the two nearly agree).

A set that reaches alpha = 0 has lower end 0 (exponents are >= 0 by definition; as alpha
-> 0, E + A x^-alpha tends to a line in log x, with E -> -inf: E's lower end is then -inf).
A set that reaches the grid's largest alpha is unbounded above: the data cannot bound the
exponent, and the parameter is "not identified" (``identified``); its interval holds inf.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import f as f_dist
from scipy.stats import t as t_dist

from scale_fpt.analysis.laws import LAWS, Law

ALPHA_STEP = 0.01
ALPHA_MAX = 5.0
ALPHA_GRID = np.arange(1, round(ALPHA_MAX / ALPHA_STEP) + 1) * ALPHA_STEP
"""Exponents profiled over. Published exponents lie within 0.05..1; a set still open at 5
is open for any purpose a ladder has."""
MEANS_FORMS = ("power", "power_floor")
"""The forms linear in all but alpha, which ``fit_size_means`` profiles."""


# --------------------------------------------------------------------------- profiles


@dataclass
class Profile:
    """Weighted least squares of size means on the basis (1, u) or (u), u = z^-alpha, for
    every alpha of ``ALPHA_GRID`` and every study at once. Arrays are (S, G): S studies, G
    exponents; ``z`` are the sizes divided by their geometric mean."""

    floor: bool
    z: np.ndarray
    y: np.ndarray  # (S, k) size means
    w: np.ndarray  # (S, k) weights 1 / ybar^2
    u: np.ndarray = field(init=False)  # (G, k)
    rss: np.ndarray = field(init=False)
    amp: np.ndarray = field(init=False)  # A at z (times z^-alpha)
    level0: np.ndarray = field(init=False)  # E (0 without a floor)
    W: np.ndarray = field(init=False)
    u_bar: np.ndarray = field(init=False)
    s_uu: np.ndarray = field(init=False)

    def __post_init__(self):
        self.u = self.z[None, :] ** -ALPHA_GRID[:, None]
        w, y, u = self.w, self.y, self.u
        swu = w @ u.T
        swuu = w @ (u**2).T
        swuy = (w * y) @ u.T
        self.W = w.sum(axis=1, keepdims=True)
        if self.floor:
            y_bar = (w * y).sum(axis=1, keepdims=True) / self.W
            self.u_bar = swu / self.W
            self.s_uu = swuu - self.W * self.u_bar**2
            s_uy = swuy - self.W * self.u_bar * y_bar
            s_yy = (w * (y - y_bar) ** 2).sum(axis=1, keepdims=True)
            self.amp = s_uy / self.s_uu
            self.level0 = y_bar - self.amp * self.u_bar
            self.rss = s_yy - s_uy**2 / self.s_uu
        else:
            self.u_bar = np.zeros_like(swu)
            self.s_uu = swuu
            self.amp = swuy / swuu
            self.level0 = np.zeros_like(swu)
            self.rss = (w * y**2).sum(axis=1, keepdims=True) - swuy**2 / swuu
        self.rss = np.maximum(self.rss, 0.0)

    def leverage(self, u0: np.ndarray) -> np.ndarray:
        """x0ᵀ (XᵀWX)⁻¹ x0 at new basis values ``u0`` (G, m): (S, G, m)."""
        h = (u0[None] - self.u_bar[..., None]) ** 2 / self.s_uu[..., None]
        return h + 1 / self.W[..., None] if self.floor else h

    def fitted(self, u0: np.ndarray) -> np.ndarray:
        """The law at new basis values ``u0`` (G, m) for every alpha: (S, G, m)."""
        return self.level0[..., None] + self.amp[..., None] * u0[None]


def interval_at(profile: Profile, z0: np.ndarray, df: int, level: float, noise: float):
    """(lo, hi), each (S, m): the profile interval of the law's value at ``z0`` (``noise``
    0: the curve's band) or of a new size mean there (``noise`` 1, or the share of a fitted
    size mean's variance a new mean has, ``MeansFit.new_mean_share``). For each alpha the
    value may move by sqrt(room · (h0 + noise · ŷ0²)), room the allowance the profile leaves
    at that alpha and ŷ0² the new mean's relative variance scale (weights 1/ȳ²); the
    interval is the hull over alpha."""
    u0 = z0[None, :] ** -ALPHA_GRID[:, None]  # (G, m)
    fitted = profile.fitted(u0)  # (S, G, m)
    h0 = profile.leverage(u0)
    rss_min = profile.rss.min(axis=1, keepdims=True)
    thr = threshold(rss_min[:, 0], df, level)[:, None]
    room = (thr - (profile.rss - rss_min))[..., None]  # (S, G, 1)
    with np.errstate(invalid="ignore"):
        spread = np.sqrt(np.where(room >= 0, room, np.nan) * (h0 + noise * fitted**2))
    lo = np.nanmin(np.where(np.isnan(spread), np.inf, fitted - spread), axis=1)
    hi = np.nanmax(np.where(np.isnan(spread), -np.inf, fitted + spread), axis=1)
    if df < 1:
        lo, hi = np.full_like(lo, np.nan), np.full_like(hi, np.nan)
    return lo, hi


def crossing(excess: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) alphas of the hull of the grid points ``inside``, each end moved to where
    the profile's ``excess`` (RSS - RSS_min - threshold, < 0 inside) crosses 0 by linear
    interpolation; lo 0 where the set reaches the grid's first point, hi inf at its last."""
    G = len(ALPHA_GRID)
    first = np.argmax(inside, axis=1)
    last = G - 1 - np.argmax(inside[:, ::-1], axis=1)
    rows = np.arange(len(excess))
    lo = np.where(first == 0, 0.0, np.nan)
    hi = np.where(last == G - 1, np.inf, np.nan)
    inner = first > 0
    a, b = excess[rows[inner], first[inner] - 1], excess[rows[inner], first[inner]]
    lo[inner] = ALPHA_GRID[first[inner] - 1] + ALPHA_STEP * a / (a - b)
    inner = last < G - 1
    a, b = excess[rows[inner], last[inner]], excess[rows[inner], last[inner] + 1]
    hi[inner] = ALPHA_GRID[last[inner]] + ALPHA_STEP * a / (a - b)
    return lo, hi


def threshold(rss_min: np.ndarray, df: int, level: float) -> np.ndarray:
    """The profile's allowance: F(1, df; level) · RSS_min / df (nan when df < 1)."""
    if df < 1:
        return np.full_like(rss_min, np.nan)
    return f_dist.ppf(level, 1, df) * rss_min / df


def refine_minimum(rss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, alpha) of each row's minimum, alpha refined by the parabola through the
    grid minimum and its neighbours."""
    i = np.clip(np.argmin(rss, axis=1), 1, len(ALPHA_GRID) - 2)
    rows = np.arange(len(rss))
    a, b, c = rss[rows, i - 1], rss[rows, i], rss[rows, i + 1]
    curvature = a - 2 * b + c
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(curvature > 0, 0.5 * (a - c) / curvature, 0.0)
    at_edge = np.argmin(rss, axis=1)
    alpha = np.where(
        (at_edge == 0) | (at_edge == len(ALPHA_GRID) - 1),
        ALPHA_GRID[at_edge],
        ALPHA_GRID[i] + ALPHA_STEP * np.clip(shift, -1, 1),
    )
    return at_edge, alpha


@dataclass
class Intervals:
    """Point estimates and profile intervals for S studies at once (arrays of length S)."""

    alpha: np.ndarray
    A: np.ndarray
    E: np.ndarray
    alpha_lo: np.ndarray
    alpha_hi: np.ndarray
    E_lo: np.ndarray
    E_hi: np.ndarray
    rss_min: np.ndarray
    df: int


def profile_intervals(profile: Profile, df: int, level: float, z_ref: float) -> Intervals:
    """Every study's estimates and intervals of alpha and E (``Intervals``)."""
    rss_min = profile.rss.min(axis=1)
    thr = threshold(rss_min, df, level)
    excess = profile.rss - rss_min[:, None] - thr[:, None]
    inside = excess <= 0
    best, alpha = refine_minimum(profile.rss)
    rows = np.arange(len(rss_min))
    amp_z = profile.amp[rows, best]
    # A in the data's x units: A_z z^-alpha = A_z x_ref^alpha x^-alpha
    amp = amp_z * z_ref**alpha
    E = profile.level0[rows, best]
    alpha_lo, alpha_hi = crossing(excess, inside)
    E_lo = np.full_like(rss_min, np.nan)
    E_hi = np.full_like(rss_min, np.nan)
    if profile.floor:
        # fixing E at E0 adds c (E0 - Ê(alpha))² to RSS(alpha), c = 1 / [(XᵀWX)⁻¹]_EE
        c = 1 / (1 / profile.W + profile.u_bar**2 / profile.s_uu)
        with np.errstate(invalid="ignore"):
            half = np.sqrt(np.where(inside, -excess, np.nan) / c)
        E_lo = np.nanmin(profile.level0 - half, axis=1, initial=np.inf)
        E_hi = np.nanmax(profile.level0 + half, axis=1, initial=-np.inf)
        E_lo = np.where(alpha_lo == 0, -np.inf, E_lo)
    if df < 1:
        alpha_lo = alpha_hi = E_lo = E_hi = np.full_like(rss_min, np.nan)
    return Intervals(alpha, amp, E, alpha_lo, alpha_hi, E_lo, E_hi, rss_min, df)


VARIANCE_MODELS = ("relative", "points")
"""How a size mean's noise may scale with the error: relative to it (weights 1/ȳ², the
estimates' model) or constant in accuracy points (weights 1). Three seeds a size cannot tell
them apart, and an interval right under one is not under the other (alpha at Pythia's 8
sizes with noise in points covered 0.945 under relative weights): ``law_intervals``."""


def model_weights(ybar: np.ndarray, model: str) -> np.ndarray:
    """The weights of ``VARIANCE_MODELS``' ``model`` for size means ``ybar``."""
    return 1 / ybar**2 if model == "relative" else np.ones_like(ybar)


def law_intervals(floor: bool, z: np.ndarray, ybar: np.ndarray, df: int, level: float,
                  z_ref: float) -> Intervals:  # fmt: skip
    """Estimates under relative noise, and for alpha and E the hull of their profile
    intervals under each of ``VARIANCE_MODELS``: bounded only where every model bounds it,
    so the interval holds whichever way the noise scales (``coverage.law_checks`` scores
    both)."""
    each = [profile_intervals(Profile(floor, z, ybar, model_weights(ybar, m)), df, level, z_ref)
            for m in VARIANCE_MODELS]  # fmt: skip
    with np.errstate(invalid="ignore"):
        hull = {f"{name}_lo": np.min([getattr(e, f"{name}_lo") for e in each], axis=0)
                for name in ("alpha", "E")}  # fmt: skip
        hull |= {f"{name}_hi": np.max([getattr(e, f"{name}_hi") for e in each], axis=0)
                 for name in ("alpha", "E")}  # fmt: skip
    return dataclasses.replace(each[0], **hull)


def size_means(df: pd.DataFrame, y: str, x: str) -> pd.DataFrame:
    """Per x: n (rows), mean, std of ``y``, and the t interval of the mean (``lo``, ``hi``,
    95%; nan with one row)."""
    out = df.groupby(x)[y].agg(n="count", mean="mean", std="std").reset_index()
    half = t_dist.ppf(0.975, np.maximum(out["n"] - 1, 1)) * out["std"] / np.sqrt(out["n"])
    return out.assign(lo=out["mean"] - half, hi=out["mean"] + half)


# --------------------------------------------------------------------------- the fit


@dataclass
class MeansFit:
    """A law fitted to size means (module docstring): ``ScalingFit``'s ``form``, ``x``,
    ``params``, ``intervals``, ``level``, ``goodness`` and ``predict``, plus ``identified``,
    ``means`` and ``point`` (no bootstrap draws)."""

    form: str
    y: str
    x: list[str]
    params: dict[str, float]
    """alpha, A and (power_floor) E at the least-squares fit."""
    intervals: dict[str, tuple[float, float]]
    """Profile interval of alpha and (power_floor) E at ``level``: (-)inf at an end the
    data do not bound, nan with no degrees of freedom left (k = p)."""
    identified: dict[str, bool]
    """Whether each interval is bounded (both ends finite): otherwise "not identified"."""
    level: float
    goodness: dict
    """k (sizes), n (rows), df (k - p), seeds (min, max per size), rel_sd (the size means'
    residual sd, relative: sqrt of τ² + σ²/m), seed_sd (the seeds' pooled relative sd σ),
    x_range, at_bound (["alpha"] when the best exponent is an end of ``ALPHA_GRID``)."""
    means: pd.DataFrame = field(repr=False)
    """``size_means`` of the data (x, n, mean, std, lo, hi)."""
    z_ref: float = field(repr=False, default=1.0)

    @property
    def law(self) -> Law:
        return LAWS[self.form]

    def profile(self) -> Profile:
        z = self.means[self.x[0]].to_numpy(dtype=float) / self.z_ref
        y = self.means["mean"].to_numpy(dtype=float)[None]
        return Profile(self.form == "power_floor", z, y, 1 / y**2)

    def predict(self, frame: pd.DataFrame, level: float | None = None, n_obs: int | None = None):
        """Per row of ``frame``: ``mean`` (the fitted law), ``lo``/``hi`` (prediction
        interval of a new size's mean over ``n_obs`` seeds: its own deviation from the law
        included; default the fit's seeds per size), ``band_lo``/``band_hi`` (the curve's
        own interval). All nan when no degree of freedom is left."""
        level = self.level if level is None else level
        z0 = frame[self.x[0]].to_numpy(dtype=float) / self.z_ref
        profile, df = self.profile(), self.goodness["df"]
        lo, hi = interval_at(profile, z0, df, level, self.new_mean_share(n_obs))
        band_lo, band_hi = interval_at(profile, z0, df, level, 0.0)
        return pd.DataFrame(
            {"mean": self.point(frame), "lo": lo[0], "hi": hi[0], "band_lo": band_lo[0],
             "band_hi": band_hi[0]},
            index=frame.index,
        )  # fmt: skip

    def new_mean_share(self, n_obs: int | None) -> float:
        """Variance of a new size's mean over ``n_obs`` seeds, relative to that of the fitted
        size means (1 at the fit's own seeds per size): τ² + σ²/n_obs over τ² + σ²/m."""
        m = self.goodness["seeds"][0]
        if n_obs is None or n_obs == m:
            return 1.0
        v, s2 = self.goodness["rel_sd"] ** 2, self.goodness["seed_sd"] ** 2
        return max(v + s2 * (1 / n_obs - 1 / m), s2 / n_obs) / v if v > 0 else 1.0

    def point(self, frame: pd.DataFrame) -> np.ndarray:
        x0 = frame[self.x[0]].to_numpy(dtype=float)
        return self.params.get("E", 0.0) + self.params["A"] * x0 ** -self.params["alpha"]


def design_problems(df, y, x, form, groups, level) -> list[str]:
    problems = []
    if form not in MEANS_FORMS:
        problems.append(f"unknown form {form!r}; size-mean fits take {', '.join(MEANS_FORMS)}")
    for c in [y, x, *([groups] if groups else [])]:
        if c not in df:
            problems.append(f"column {c!r} not in the frame (it has {list(df.columns)})")
    if not 0 < level < 1:
        problems.append(f"level must be within (0, 1), got {level}")
    if problems:
        return problems
    for c in (y, x):
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            problems.append(f"{c}: values must be finite and positive")
    if not problems and df[x].nunique() < len(LAWS[form].params):
        problems.append(
            f"{df[x].nunique()} size(s) for the {len(LAWS[form].params)} parameters of {form}"
        )
    return problems


def fit_size_means(
    df: pd.DataFrame,
    y: str,
    x: str,
    form: str = "power_floor",
    groups: str | None = "seed",
    level: float = 0.95,
) -> MeansFit:
    """Fit ``form`` (``power`` or ``power_floor``) to the means of ``y`` at each ``x``
    (module docstring). ``groups`` (the seed column) only counts seeds. ValueError naming
    every problem for bad input."""
    problems = design_problems(df, y, x, form, groups, level)
    if problems:
        raise ValueError("fit_size_means: " + "; ".join(problems))
    means = size_means(df, y, x)
    k, p = len(means), len(LAWS[form].params)
    xs = means[x].to_numpy(dtype=float)
    z_ref = float(np.exp(np.log(xs).mean()))
    ybar = means["mean"].to_numpy(dtype=float)
    est = law_intervals(form == "power_floor", xs / z_ref, ybar[None], k - p, level, z_ref)
    params = {"A": float(est.A[0]), "alpha": float(est.alpha[0])}
    intervals = {"alpha": (float(est.alpha_lo[0]), float(est.alpha_hi[0]))}
    if form == "power_floor":
        params["E"] = float(est.E[0])
        intervals["E"] = (float(est.E_lo[0]), float(est.E_hi[0]))
    identified = {name: bool(np.all(np.isfinite(iv))) for name, iv in intervals.items()}
    if form == "power_floor" and not identified["alpha"]:
        identified["E"] = False  # E's set was profiled over a truncated alpha range
    relative = df[y].to_numpy(dtype=float) / df.groupby(x)[y].transform("mean").to_numpy() - 1
    within = len(df) - k
    goodness = {
        "k": k,
        "n": len(df),
        "df": k - p,
        "seeds": (int(means["n"].min()), int(means["n"].max())),
        "rel_sd": float(np.sqrt(est.rss_min[0] / (k - p))) if k > p else float("nan"),
        "seed_sd": float(np.sqrt((relative**2).sum() / within)) if within else float("nan"),
        "x_range": {x: (float(xs.min()), float(xs.max()))},
        # the best exponent on the grid's first or last point: the error does not fall with
        # size (or falls as a step); the law does not describe these data
        "at_bound": ["alpha"] if params["alpha"] in (ALPHA_GRID[0], ALPHA_GRID[-1]) else [],
    }
    return MeansFit(
        form=form,
        y=y,
        x=[x],
        params=params,
        intervals=intervals,
        identified=identified,
        level=level,
        goodness=goodness,
        means=means,
        z_ref=z_ref,
    )


# --------------------------------------------------------------------------- two laws


def difference_profile(rss_a: np.ndarray, rss_b: np.ndarray) -> np.ndarray:
    """min over alpha_a of RSS_a(alpha_a) + RSS_b(alpha_a - d) for every d = j · step,
    j = -(G-1) .. G-1: (S, 2G - 1)."""
    S, G = rss_a.shape
    out = np.full((S, 2 * G - 1), np.inf)
    for j in range(-(G - 1), G):
        total = rss_a[:, j:] + rss_b[:, : G - j] if j >= 0 else rss_a[:, : G + j] + rss_b[:, -j:]
        out[:, j + G - 1] = total.min(axis=1)
    return out


def alpha_variance(rss: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Each study's variance of alpha-hat, v · 2 / RSS''(alpha-hat) from the profile's
    curvature on the grid; inf where the minimum lies on the grid's edge or the profile is
    flat there (the data do not pin alpha down)."""
    i = np.argmin(rss, axis=1)
    inner = (i > 0) & (i < len(ALPHA_GRID) - 1)
    j = np.clip(i, 1, len(ALPHA_GRID) - 2)
    rows = np.arange(len(rss))
    curvature = (rss[rows, j - 1] - 2 * rss[rows, j] + rss[rows, j + 1]) / ALPHA_STEP**2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inner & (curvature > 0), 2 * v / curvature, np.inf)


def exponent_difference_arrays(a: Profile, b: Profile, df_a: int, df_b: int, level: float):
    """(estimate, lo, hi) of alpha_a - alpha_b per study. Each arm keeps its own relative
    variance v (its RSS_min / df): the statistic is min over alpha_a of
    (RSS_a(alpha_a) - RSS_a,min) / v_a + (RSS_b(alpha_a - d) - RSS_b,min) / v_b, compared
    with F(1, nu), nu Welch-Satterthwaite's degrees of freedom from the two arms' variances of
    alpha-hat (``alpha_variance``), so an arm noisier than the other widens the interval as
    it should. ±inf at an end reached only at the grid's edge; nan when an arm has no
    degree of freedom."""
    G = len(ALPHA_GRID)
    rss_a, rss_b = a.rss.min(axis=1), b.rss.min(axis=1)
    if df_a < 1 or df_b < 1:
        nan = np.full_like(rss_a, np.nan)
        return nan, nan, nan
    v_a, v_b = rss_a / df_a, rss_b / df_b
    scaled_a = (a.rss - rss_a[:, None]) / v_a[:, None]
    scaled_b = (b.rss - rss_b[:, None]) / v_b[:, None]
    profile = difference_profile(scaled_a, scaled_b)
    var_a, var_b = alpha_variance(a.rss, v_a), alpha_variance(b.rss, v_b)
    with np.errstate(invalid="ignore"):
        share_a = np.where(np.isinf(var_a), 1.0, var_a / (var_a + var_b))
    share_a = np.where(np.isinf(var_b) & np.isfinite(var_a), 0.0, share_a)
    nu = 1 / (share_a**2 / df_a + (1 - share_a) ** 2 / df_b)
    thr = f_dist.ppf(level, 1, nu)
    excess = profile - profile.min(axis=1, keepdims=True) - thr[:, None]
    inside = excess <= 0
    d_grid = np.arange(-(G - 1), G) * ALPHA_STEP
    first = np.argmax(inside, axis=1)
    last = 2 * G - 2 - np.argmax(inside[:, ::-1], axis=1)
    rows = np.arange(len(rss_a))
    lo = np.where(first == 0, -np.inf, d_grid[first] - ALPHA_STEP)
    hi = np.where(last == 2 * G - 2, np.inf, d_grid[last] + ALPHA_STEP)
    inner = first > 0
    e0, e1 = excess[rows[inner], first[inner] - 1], excess[rows[inner], first[inner]]
    lo[inner] = d_grid[first[inner] - 1] + ALPHA_STEP * e0 / (e0 - e1)
    inner = last < 2 * G - 2
    e0, e1 = excess[rows[inner], last[inner]], excess[rows[inner], last[inner] + 1]
    hi[inner] = d_grid[last[inner]] + ALPHA_STEP * e0 / (e0 - e1)
    # an end at the largest |d| the grid spans pairs an exponent with the grid's edge
    reach = ALPHA_MAX - 2 * ALPHA_STEP
    lo = np.where(lo <= -reach, -np.inf, lo)
    hi = np.where(hi >= reach, np.inf, hi)
    _, alpha_a = refine_minimum(a.rss)
    _, alpha_b = refine_minimum(b.rss)
    return alpha_a - alpha_b, lo, hi


def exponent_difference(a: MeansFit, b: MeansFit, level: float = 0.95) -> dict:
    """alpha(a) - alpha(b) of two size-mean fits of one form, with the profile interval of
    their joint fit (``exponent_difference_arrays``). ValueError for fits of different
    forms: their exponents are not the same quantity (E + A x^-alpha approaches a floor,
    A x^-alpha does not)."""
    if a.form != b.form:
        raise ValueError(
            f"exponent_difference: {a.form} vs {b.form}; exponents compare only within one form"
        )
    df_a, df_b = a.goodness["df"], b.goodness["df"]
    estimate, lo, hi = exponent_difference_arrays(a.profile(), b.profile(), df_a, df_b, level)
    return {
        "param": "alpha",
        "estimate": float(estimate[0]),
        "lo": float(lo[0]),
        "hi": float(hi[0]),
        "df": (df_a, df_b),
        "identified": bool(np.isfinite(lo[0]) and np.isfinite(hi[0])),
        "level": level,
    }
