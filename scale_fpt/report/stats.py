"""The statistics a comparison of arms rests on, all from ``scipy.stats``.

- ``summarize``: a cell over seeds: mean, sample std, Student-t 95% interval.
- ``welch_difference``: two independent groups of seeds (arms that share no seed streams).
- ``paired_difference``: two arms trained on the same seeds (the same seed gives both arms
  the same heads, data and dropout streams, ``seeding.py``), paired on the seed: the mean
  difference with its paired-t interval, the paired t and Wilcoxon signed-rank p-values,
  and Hedges' g with a bootstrap interval over the seed pairs.
- ``adjust_p``: Benjamini-Hochberg over one table's family of comparisons.
- ``steps_survival`` / ``steps_logrank``: steps to a threshold as right-censored data (a
  seed that never reached it is censored at its last step): Kaplan-Meier median with its
  interval, and the log-rank test of two arms.

Every function takes plain sequences; non-finite values (a seed with no score) are dropped,
and a quantity that needs more seeds than there are is NaN, never a guess.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MIN_PAIRS = 5
"""Fewer pairs than this give Hedges' g no bootstrap interval: 3 pairs have 10 distinct
resamples, several of them with no spread at all, and the percentile interval means nothing."""
BOOTSTRAP_SEED = 0
"""Seeds the bootstrap's resampling, so a report is the same every time it is built."""


def finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``t_quantile(0.975, 2)`` = 4.303)."""
    return float(stats.t.ppf(p, df))


def summarize(values) -> dict:
    """{n, mean, std, ci95, ci_low, ci_high} of the finite ``values`` (std with n-1; the
    spread and interval are NaN for a single seed, everything is NaN for none)."""
    x = finite(values)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "ci95": half,
        "ci_low": mean - half,
        "ci_high": mean + half,
    }


def interval(diff: float, low: float, high: float) -> dict:
    return {"diff": diff, "ci95": (high - low) / 2, "ci_low": low, "ci_high": high}


def welch_difference(a, b) -> dict:
    """The difference of means ``mean(a) - mean(b)`` of two independent groups of seeds, with
    Welch's 95% t-interval (``scipy.stats.ttest_ind(equal_var=False)``): {diff, se, df,
    ci95, ci_low, ci_high, p, n_a, n_b}. The interval is NaN with fewer than two values in a
    group, and zero wide when neither group varies."""
    x, y = finite(a), finite(b)
    out = {"n_a": len(x), "n_b": len(y)}
    diff = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2:
        return {**out, **interval(diff, math.nan, math.nan), "se": math.nan, "df": math.nan,
                "p": math.nan}  # fmt: skip
    se = math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
    if se == 0:
        return {**out, **interval(diff, diff, diff), "se": 0.0, "df": math.nan, "p": math.nan}
    test = stats.ttest_ind(x, y, equal_var=False)
    ci = test.confidence_interval(CONFIDENCE)
    return {
        **out,
        **interval(diff, float(ci.low), float(ci.high)),
        "se": se,
        "df": float(test.df),
        "p": float(test.pvalue),
    }


def hedges_g(x: np.ndarray, y: np.ndarray) -> float:
    """Standardised mean difference of two groups: (mean x - mean y) / pooled std, times
    Hedges' small-sample correction J = 1 - 3 / (4 df - 1), df = n_x + n_y - 2."""
    df = len(x) + len(y) - 2
    pooled = ((len(x) - 1) * x.var(ddof=1) + (len(y) - 1) * y.var(ddof=1)) / df
    if pooled == 0:
        return math.nan
    return float((x.mean() - y.mean()) / math.sqrt(pooled) * (1 - 3 / (4 * df - 1)))


def paired_difference(a: dict, b: dict) -> dict:
    """Arm ``a`` minus arm ``b`` over the seeds both ran (``{seed: value}`` each; a seed
    missing or non-finite in either arm is left out of the pairs):

    {n (pairs), diff (mean of the paired differences), ci95/ci_low/ci_high (paired t,
    ``scipy.stats.ttest_rel``), p_t, p_wilcoxon (``scipy.stats.wilcoxon``, exact signed-rank;
    NaN when every difference is 0), g (Hedges' g of the two arms' values), g_low/g_high
    (percentile interval of ``scipy.stats.bootstrap(paired=True)``'s resamples of
    the seed pairs; NaN below BOOTSTRAP_MIN_PAIRS pairs)}.
    With fewer than two pairs everything but ``diff`` is NaN; with identical differences the
    interval is zero wide."""
    seeds = sorted(s for s in set(a) & set(b) if np.isfinite(a[s]) and np.isfinite(b[s]))
    x = np.array([a[s] for s in seeds], dtype=float)
    y = np.array([b[s] for s in seeds], dtype=float)
    d = x - y
    n = len(seeds)
    nan = {"p_t": math.nan, "p_wilcoxon": math.nan, "g": math.nan}
    diff = float(d.mean()) if n else math.nan
    out = {"n": n, "seeds": seeds, **nan, "g_low": math.nan, "g_high": math.nan}
    if n < 2:
        return {**out, **interval(diff, math.nan, math.nan)}
    if np.allclose(d, d[0], rtol=0, atol=1e-12):  # differences equal up to float rounding
        out.update(interval(diff, diff, diff))
    else:
        test = stats.ttest_rel(x, y)
        ci = test.confidence_interval(CONFIDENCE)
        out.update(interval(diff, float(ci.low), float(ci.high)), p_t=float(test.pvalue))
    if np.any(d != 0):
        out["p_wilcoxon"] = float(stats.wilcoxon(x, y, method="exact").pvalue)
    out["g"] = hedges_g(x, y)
    if n >= BOOTSTRAP_MIN_PAIRS and math.isfinite(out["g"]):
        with warnings.catch_warnings():  # resamples without a g make scipy's interval NaN
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            boot = stats.bootstrap(
                (x, y),
                hedges_g,
                paired=True,
                vectorized=False,
                method="percentile",
                n_resamples=BOOTSTRAP_RESAMPLES,
                confidence_level=CONFIDENCE,
                rng=np.random.default_rng(BOOTSTRAP_SEED),
            )
        # A resample that draws one pair n times has no spread and no g: left out.
        tail = (1 - CONFIDENCE) / 2 * 100
        low, high = np.nanpercentile(boot.bootstrap_distribution, [tail, 100 - tail])
        out["g_low"], out["g_high"] = float(low), float(high)
    return out


def adjust_p(p_values) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values of one family of comparisons
    (``scipy.stats.false_discovery_control``); NaN entries stay NaN and are not counted."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    known = np.isfinite(p)
    if known.any():
        out[known] = stats.false_discovery_control(p[known], method="bh")
    return out


def censored(steps, reached) -> stats.CensoredData:
    """Steps to a threshold: the step where a seed reached it, or its last step (censored)."""
    steps = np.asarray(steps, dtype=float)
    reached = np.asarray(reached, dtype=bool)
    return stats.CensoredData(uncensored=steps[reached], right=steps[~reached])


def steps_survival(steps, reached) -> dict:
    """Kaplan-Meier estimate of steps to the threshold (``scipy.stats.ecdf`` on censored
    data): {n, events (seeds that reached it), median, median_low, median_high}. The median
    is the first step where the share of seeds still short of the threshold falls to 0.5 or
    below (inf where it never does: fewer than half reached it); its interval comes from the
    survival function's 95% log-log band (the steps where the band's limits cross 0.5)."""
    reached = np.asarray(reached, dtype=bool)
    out = {"n": len(reached), "events": int(reached.sum())}
    if not reached.any():
        return {**out, "median": math.inf, "median_low": math.inf, "median_high": math.inf}
    sf = stats.ecdf(censored(steps, reached)).sf
    with warnings.catch_warnings():  # scipy warns where the band is undefined (NaN below)
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(CONFIDENCE, method="log-log")

    def crossing(probabilities, undefined: float) -> float:
        below = np.flatnonzero(np.nan_to_num(probabilities, nan=undefined) <= 0.5)
        return float(sf.quantiles[below[0]]) if len(below) else math.inf

    # Where the band is undefined (too few seeds) it bounds nothing: the lower limit falls
    # to 0 and the upper rises to 1, so the median's interval widens to the widest.
    return {
        **out,
        "median": crossing(sf.probabilities, 1.0),
        "median_low": crossing(band.low.probabilities, 0.0),
        "median_high": crossing(band.high.probabilities, 1.0),
    }


def steps_logrank(steps_a, reached_a, steps_b, reached_b) -> dict:
    """Log-rank test that two arms reach the threshold equally fast (``scipy.stats.logrank``;
    unreached seeds censored at their last step): {statistic, p}; NaN when neither arm has
    an event."""
    if not (np.any(reached_a) or np.any(reached_b)):
        return {"statistic": math.nan, "p": math.nan}
    with np.errstate(invalid="ignore", divide="ignore"):  # identical arms: p is NaN
        test = stats.logrank(censored(steps_a, reached_a), censored(steps_b, reached_b))
    return {"statistic": float(test.statistic), "p": float(test.pvalue)}
