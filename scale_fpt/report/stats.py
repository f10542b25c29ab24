"""Spread of a cell over seeds: mean, sample standard deviation and a 95% t-interval; the
difference of two arms with Welch's t-interval (``welch_difference``).

The interval is ``mean ± t(0.975, n-1) · std / sqrt(n)`` (Student's t, seeds treated as
independent draws). The t quantile is computed here (numerical integration of the density
and bisection) so that reports need nothing beyond numpy.
"""

from __future__ import annotations

import math

import numpy as np


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    grid = np.linspace(0.0, x, 4001)  # Simpson's rule on an even number of intervals
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
    h = grid[1] - grid[0] if x > 0 else 0.0
    area = (
        h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum())
    )
    return 0.5 + float(area)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (``t_quantile(0.975, 2)`` = 4.303)."""
    if not 0.5 <= p < 1:
        return -t_quantile(1 - p, df) if 0 < p < 0.5 else math.nan
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def summarize(values) -> dict:
    """{n, mean, std, ci95, ci_low, ci_high} of the finite ``values`` (std with n-1; the
    spread and interval are NaN for a single seed, everything is NaN for none)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    half = t_quantile(0.975, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "ci95": half,
        "ci_low": mean - half,
        "ci_high": mean + half,
    }


def welch_difference(a, b) -> dict:
    """The difference of means ``mean(a) - mean(b)`` of two independent groups of seeds, with
    Welch's 95% t-interval (unequal variances; Welch-Satterthwaite degrees of freedom):
    {diff, se, df, ci95, ci_low, ci_high, n_a, n_b}. Non-finite values are dropped; the
    interval is NaN with fewer than two values in a group, and zero wide when neither group
    varies."""
    x = np.asarray([v for v in a if v is not None and np.isfinite(v)], dtype=float)
    y = np.asarray([v for v in b if v is not None and np.isfinite(v)], dtype=float)
    out = {"n_a": len(x), "n_b": len(y)}
    diff = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2:
        se = df = half = math.nan
    else:
        va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
        se = math.sqrt(va + vb)  # standard error of the difference
        if se == 0:
            df, half = math.nan, 0.0
        else:
            df = float((va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)))
            half = t_quantile(0.975, df) * se
    return {
        **out,
        "diff": diff,
        "se": se,
        "df": df,
        "ci95": half,
        "ci_low": diff - half,
        "ci_high": diff + half,
    }
