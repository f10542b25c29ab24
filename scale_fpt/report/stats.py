"""The statistics a comparison of arms rests on, each calibrated at the designs the presets
run (3 seeds an arm; ``benchmarks/calibration.py`` prints every coverage and type-I error).

- ``summarize``: a cell over seeds: mean, sample std, Student-t 95% interval.
- ``welch_difference``: two independent groups of seeds (arms that share no seed streams).
- ``paired_difference``: two arms trained on the same seeds (the same seed gives both arms
  the same heads, data and dropout streams, ``seeding.py``), paired on the seed: the mean
  difference with its paired-t interval and p-value, the standardised effect d_z (mean
  difference / SD of the differences) with its exact noncentral-t interval, the exact
  sign-flip permutation p-value (exact up to ``EXACT_PATTERNS`` sign patterns, a seeded
  Monte Carlo with its error beyond) with the smallest p it can reach at that n, and the
  smallest difference the n pairs detect at 80% power.
- ``adjust_p``: Benjamini-Hochberg over one declared family of comparisons.
- ``steps_survival`` / ``steps_logrank``: steps to a threshold as censored data. A seed that
  ran its whole budget without reaching it is censored at its last step (it might have
  reached it later); a seed that diverged or stopped on patience never reaches it (kept at
  risk beyond every observed step). Kaplan-Meier median with its interval, and the log-rank
  test with its permutation p-value (exact up to ``EXACT_PATTERNS`` relabellings, a seeded
  Monte Carlo beyond).
- ``detectable_difference`` / ``seeds_needed``: power of the paired t-test;
  ``power_statement``: what a pilot's n pairs detect, at the SD's upper confidence bound
  (``ASSURANCE``), with the range over the SD's 95% interval and at the family's level.

Every function takes plain sequences; non-finite values (a seed with no score) are dropped,
and a quantity that needs more seeds than there are is NaN, never a guess. Every one runs from
2 to 10,000 seeds in bounded time and memory: no enumeration past ``EXACT_PATTERNS``, Monte
Carlo draws made ``DRAW_BATCH`` cells at a time, least p-values in log space.

Over 500 lines: every test and interval the report prints sits here beside the constants that
set their exact, Monte Carlo and normal regimes (``EXACT_PATTERNS``, ``MONTE_CARLO_DRAWS``,
``LOGRANK_NORMAL_FROM``) and the level, so that one limit changes every test alike.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
from scipy import optimize, special, stats

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
POWER = 0.8
"""The power at which ``detectable_difference`` states a comparison's smallest effect."""
EXACT_PATTERNS = 2**16
"""Sign patterns (sign-flip test) or relabellings (log-rank) enumerated exactly up to this
many (16 pairs; 9 + 9 seeds); beyond, ``MONTE_CARLO_DRAWS`` drawn at random."""
MONTE_CARLO_DRAWS = 20_000
"""Random sign patterns or relabellings past ``EXACT_PATTERNS``: the Monte Carlo standard
error of a p is then at most 0.0035 (0.0015 at p = 0.05), printed beside it."""
ASSURANCE = 0.8
"""The share of pilots whose planned seeds must reach ``POWER``: power statements and seed
plans use the SD's one-sided upper ``ASSURANCE`` confidence bound (``sd_upper``), not the
pilot's SD itself (from 3 pairs its 95% interval spans 0.5x-6.3x)."""
PERMUTATION_SEED = 0
"""Seeds the random draws (only past ``EXACT_PATTERNS``): a report is repeatable."""
LOGRANK_NORMAL_FROM = 200
"""Seeds (both arms) from which the log-rank p is the normal approximation's: relabelling
that many seeds 20,000 times costs seconds a comparison, and at that many seeds the
normal approximation is what the permutation p estimates."""
DRAW_BATCH = 2**22
"""Cells (draws x seeds) of one batch of random draws: memory stays at tens of MB whatever
the number of seeds."""
KM_INTERVAL_MIN_SEEDS = 10
"""Seeds an arm needs before the Kaplan-Meier median's 95% interval is printed: below it the
log-log band's coverage of the true median is off nominal at the presets' designs
(``benchmarks/calibration.py``: 3 seeds, 5 seeds)."""


def finite(values) -> np.ndarray:
    if not hasattr(values, "__array__") and not isinstance(values, list | tuple):
        values = list(values)  # a generator, dict values
    x = np.asarray(values, dtype=float).ravel()  # None becomes NaN
    return x[np.isfinite(x)]


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``t_quantile(0.975, 2)`` = 4.303)."""
    return float(stats.t.ppf(p, df))


def t_half_width(std, n):
    """Half the Student-t 95% interval of a mean of ``n`` values whose sample std is ``std``
    (numbers or arrays alike, e.g. every arm of a sweep at once); NaN below two values."""
    n = np.asarray(n, dtype=float)
    df = np.where(n > 1, n - 1, np.nan)
    return stats.t.ppf(0.5 + CONFIDENCE / 2, df) * std / np.sqrt(np.where(n > 1, n, np.nan))


def summarize(values) -> dict:
    """{n, mean, std, ci95, ci_low, ci_high} of the finite ``values`` (std with n-1; the
    spread and interval are NaN for a single seed, everything is NaN for none)."""
    x = finite(values)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    half = float(t_half_width(std, n))
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "ci95": half,
        "ci_low": mean - half,
        "ci_high": mean + half,
    }


def interval(diff: float, low: float, high: float, note: str = "") -> dict:
    """A difference with its interval; ``note`` says why a finite one is not given."""
    return {"diff": diff, "ci95": (high - low) / 2, "ci_low": low, "ci_high": high,
            "interval_note": note}  # fmt: skip


def no_spread_note(n: int) -> str:
    """Why seeds that all tie (a ceiling, steps on an evaluation grid) get no 95% interval:
    a zero-wide one would claim certainty that n seeds cannot give."""
    return f"no spread (all {n} seeds equal)"


def welch_difference(a, b) -> dict:
    """The difference of means ``mean(a) - mean(b)`` of two independent groups of seeds, with
    Welch's 95% t-interval (``scipy.stats.ttest_ind(equal_var=False)``): {diff, se, df,
    ci95, ci_low, ci_high, interval_note, p, n_a, n_b}. The interval is NaN with fewer than
    two values in a group, and when neither group varies (``no_spread_note``)."""
    x, y = finite(a), finite(b)
    out = {"n_a": len(x), "n_b": len(y)}
    diff = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2:
        return {**out, **interval(diff, math.nan, math.nan), "se": math.nan, "df": math.nan,
                "p": math.nan}  # fmt: skip
    se = math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
    if se == 0:
        return {**out, **interval(diff, math.nan, math.nan, no_spread_note(len(x) + len(y))),
                "se": 0.0, "df": math.nan, "p": math.nan}  # fmt: skip
    test = stats.ttest_ind(x, y, equal_var=False)
    ci = test.confidence_interval(CONFIDENCE)
    return {
        **out,
        **interval(diff, float(ci.low), float(ci.high)),
        "se": se,
        "df": float(test.df),
        "p": float(test.pvalue),
    }


MAX_WIDENINGS = 40
"""Doublings of the search bracket for a noncentrality before giving up (NaN)."""


def noncentrality_interval(t_observed: float, df: int) -> tuple[float, float]:
    """The 95% confidence interval of a noncentral t's noncentrality from one observed t
    (inverting ``scipy.stats.nct.cdf``, which falls as the noncentrality grows)."""

    def limit(target: float) -> float:
        def gap(nc: float) -> float:
            cdf = stats.nct.cdf(t_observed, df, nc)
            if math.isnan(cdf):  # scipy's nct is NaN far in a tail: 1 below t, 0 above
                cdf = 1.0 if nc < t_observed else 0.0
            return float(cdf) - target

        low, high = t_observed - 10, t_observed + 10
        for _ in range(MAX_WIDENINGS):
            if gap(low) >= 0 and gap(high) <= 0:
                return float(optimize.brentq(gap, low, high, xtol=1e-10))
            low, high = low - (high - low), high + (high - low)
        return math.nan  # beyond what scipy's noncentral t resolves

    return limit(1 - ALPHA / 2), limit(ALPHA / 2)


def no_spread(d: np.ndarray) -> bool:
    """Differences equal up to float rounding (0.9 - 0.8 and 0.8 - 0.7 differ in the last
    bit): no SD to standardise by."""
    return bool(np.allclose(d, d[0], rtol=0, atol=1e-12))


def effect_size(d: np.ndarray) -> dict:
    """d_z = mean / SD of the paired differences, with its exact 95% interval: t = d_z·√n
    follows a noncentral t with n-1 degrees of freedom and noncentrality δ·√n (normal
    differences), so the interval of δ is that of the noncentrality over √n. NaN below two
    pairs or when the differences do not vary."""
    n = len(d)
    if n < 2 or no_spread(d):
        return {"d_z": math.nan, "d_z_low": math.nan, "d_z_high": math.nan}
    sd = float(d.std(ddof=1))
    t_observed = float(d.mean()) / sd * math.sqrt(n)
    low, high = noncentrality_interval(t_observed, n - 1)
    return {"d_z": t_observed / math.sqrt(n), "d_z_low": low / math.sqrt(n),
            "d_z_high": high / math.sqrt(n)}  # fmt: skip


def exact_patterns(n: int) -> bool:
    """Whether the 2^n sign patterns of n pairs are few enough to enumerate."""
    return n <= math.log2(EXACT_PATTERNS)


def monte_carlo_p(extreme: int, draws: int) -> tuple[float, float]:
    """(p, its Monte Carlo standard error) from ``extreme`` of ``draws`` random draws at
    least as extreme as the observed: (extreme + 1) / (draws + 1), a valid p (Phipson and
    Smyth 2010), and the binomial SE of the share."""
    p = (extreme + 1) / (draws + 1)
    return p, math.sqrt(p * (1 - p) / draws)


def batches(total: int, width: int):
    """Row counts of batches of at most ``DRAW_BATCH`` cells, ``width`` cells a row."""
    rows = max(1, DRAW_BATCH // max(width, 1))
    for start in range(0, total, rows):
        yield min(rows, total - start)


def sign_flip_p(d: np.ndarray) -> tuple[float, float]:
    """(p, Monte Carlo SE) of the two-sided sign-flip permutation test of a zero mean
    difference: the share of sign patterns whose |sum| reaches the observed one, over every
    one of the 2^n patterns while ``exact_patterns(n)`` (SE 0), else over
    ``MONTE_CARLO_DRAWS`` seeded random patterns (``monte_carlo_p``); (NaN, NaN) when every
    difference is 0."""
    d = np.asarray(d, dtype=float)
    if not np.any(d != 0):
        return math.nan, math.nan
    n, total = len(d), float(d.sum())
    observed = abs(total) * (1 - 1e-9) - 1e-12  # float ties with the observed count as extreme
    exact = exact_patterns(n)
    rng = np.random.default_rng(PERMUTATION_SEED)
    extreme, start = 0, 0
    for rows in batches(2**n if exact else MONTE_CARLO_DRAWS, n):
        if exact:  # pattern i flips the pairs at the 1-bits of i
            codes = np.arange(start, start + rows, dtype=np.int64)[:, None]
            bits = ((codes >> np.arange(n)) & 1).astype(float)
            start += rows
        else:  # packed random bits: 8 signs a byte, as float for a BLAS product
            drawn = rng.integers(0, 256, (rows, -(-n // 8)), dtype=np.uint8)
            bits = np.unpackbits(drawn, axis=1, count=n).astype(float)
        extreme += int(np.sum(np.abs(total - 2 * (bits @ d)) >= observed))
    return (extreme / 2**n, 0.0) if exact else monte_carlo_p(extreme, MONTE_CARLO_DRAWS)


def smallest_sign_flip_p(n: int) -> float:
    """The least p the two-sided sign-flip test as run gives with n pairs: exact, 2 / 2^n
    (0.25 at 3 pairs, 0.0625 at 5: it cannot reach 0.05 below 6); Monte Carlo (past
    ``EXACT_PATTERNS``), 1 / (``MONTE_CARLO_DRAWS`` + 1). Computed as a power of two, never
    2^n itself, so no n overflows."""
    if not n:
        return math.nan
    if exact_patterns(n):
        return min(1.0, math.ldexp(1.0, 1 - n))
    return 1 / (MONTE_CARLO_DRAWS + 1)


def paired_difference(a: dict, b: dict) -> dict:
    """Arm ``a`` minus arm ``b`` over the seeds both ran (``{seed: value}`` each; a seed
    missing or non-finite in either arm is left out of the pairs):

    {n (pairs), seeds, diff (mean of the paired differences), sd_diff, ci95/ci_low/ci_high
    (paired t, ``scipy.stats.ttest_rel``), p_t, d_z/d_z_low/d_z_high (``effect_size``),
    p_sign_flip and p_sign_flip_se (``sign_flip_p``: its Monte Carlo SE, 0 when exact),
    p_sign_flip_min (``smallest_sign_flip_p``), detectable, detectable_low, detectable_high,
    detectable_family (``power_statement``, a family of one)}. With fewer than two pairs
    everything but ``diff`` is NaN; with identical differences there is no interval, and
    ``interval_note`` says why (``no_spread_note``)."""
    seeds = sorted(s for s in set(a) & set(b) if np.isfinite(a[s]) and np.isfinite(b[s]))
    x = np.array([a[s] for s in seeds], dtype=float)
    y = np.array([b[s] for s in seeds], dtype=float)
    d = x - y
    n = len(seeds)
    diff = float(d.mean()) if n else math.nan
    out = {
        "n": n,
        "seeds": seeds,
        "p_t": math.nan,
        "sd_diff": float(d.std(ddof=1)) if n > 1 and not no_spread(d) else math.nan,
        **effect_size(d),
        "p_sign_flip": math.nan,
        "p_sign_flip_se": math.nan,
        "p_sign_flip_min": smallest_sign_flip_p(n),
    }
    out.update(power_statement(out["sd_diff"], n))
    if n < 2:
        return {**out, **interval(diff, math.nan, math.nan)}
    if no_spread(d):
        out.update(interval(diff, math.nan, math.nan, no_spread_note(n)))
    else:
        test = stats.ttest_rel(x, y)
        ci = test.confidence_interval(CONFIDENCE)
        out.update(interval(diff, float(ci.low), float(ci.high)), p_t=float(test.pvalue))
    out["p_sign_flip"], out["p_sign_flip_se"] = sign_flip_p(d)
    return out


def sd_interval(sd: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The chi-square interval of a normal SD from a sample SD ``sd`` of ``n`` values."""
    if n < 2 or not math.isfinite(sd):
        return math.nan, math.nan
    df = n - 1
    tail = (1 - confidence) / 2
    return (float(sd * math.sqrt(df / stats.chi2.ppf(1 - tail, df))),
            float(sd * math.sqrt(df / stats.chi2.ppf(tail, df))))  # fmt: skip


def sd_upper(sd: float, n: int, assurance: float = ASSURANCE) -> float:
    """The one-sided upper ``assurance`` confidence bound of a normal SD from a sample SD
    ``sd`` of ``n`` values: the true SD lies below it in that share of pilots."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return float(sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - assurance, n - 1)))


def power_statement(sd: float, n: int, family_size: int = 1) -> dict:
    """What n pairs with paired differences of sample SD ``sd`` detect at ``POWER``:
    {detectable (at ``sd_upper``: reached in ``ASSURANCE`` of pilots), detectable_low /
    detectable_high (at the ends of the SD's 95% interval), detectable_family (at
    ``sd_upper`` and the level 0.05 / ``family_size``, below which Benjamini-Hochberg
    rejects the test whatever the family's other p-values)}; NaN without a spread."""
    low, high = sd_interval(sd, n)
    upper = sd_upper(sd, n)
    return {
        "detectable": detectable_difference(upper, n),
        "detectable_low": detectable_difference(low, n),
        "detectable_high": detectable_difference(high, n),
        "detectable_family": detectable_difference(upper, n, alpha=ALPHA / max(family_size, 1)),
    }


def paired_t_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` pairs when the true
    mean difference is ``effect`` SDs of the differences (noncentral t)."""
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    nc = effect * math.sqrt(n)
    # scipy's nct is NaN far in a tail, where the probability is 0 to double precision
    tails = np.nan_to_num([stats.nct.sf(critical, df, nc), stats.nct.cdf(-critical, df, nc)])
    return float(tails.sum())


def detectable_difference(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true mean difference the two-sided paired t-test (level ``alpha``)
    detects with probability ``power`` from ``n`` pairs whose differences have SD ``sd``;
    NaN below two pairs or without a spread. A pilot's SD understates it as often as not:
    ``power_statement`` gives it at the SD's upper bound."""
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return math.nan
    return float(detectable_effect(int(n), float(power), float(alpha)) * sd)


@functools.lru_cache(maxsize=4096)
def detectable_effect(n: int, power: float, alpha: float) -> float:
    """``detectable_difference`` in SDs of the differences: the power depends on the
    difference only through it, so a report's many rows of one n solve it once."""
    high = 1.0
    while paired_t_power(high, n, alpha) < power:
        high *= 2
    return optimize.brentq(lambda e: paired_t_power(e, n, alpha) - power, 0.0, high, xtol=1e-10)


def seeds_needed(
    sd: float, difference: float, power: float = POWER, most: int = 10_000, alpha: float = ALPHA
):
    """The fewest pairs of seeds whose paired t-test (two-sided, level ``alpha``) detects a
    true ``difference`` with probability ``power`` when the differences have SD ``sd`` (for
    a plan from a pilot, its ``sd_upper``); None past ``most``."""
    if not sd > 0 or not difference:
        raise ValueError(f"seeds_needed: need sd > 0 and a non-zero difference (got {sd}, "
                         f"{difference})")  # fmt: skip
    effect = abs(difference) / sd
    for n in range(2, most + 1):
        if paired_t_power(effect, n, alpha) >= power:
            return n
    return None


def adjust_p(p_values) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values of one family of comparisons
    (``scipy.stats.false_discovery_control``); NaN entries stay NaN and are not counted."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    known = np.isfinite(p)
    if known.any():
        out[known] = stats.false_discovery_control(p[known], method="bh")
    return out


def outcomes(steps, reached, never=None) -> tuple[np.ndarray, np.ndarray, float]:
    """(times, events, beyond): seeds that never reach the threshold (``never``: diverged or
    stopped on patience) get a time past every observed step (``beyond``), censored there,
    so they stay at risk and never count as an event; other unreached seeds are censored at
    their last step."""
    times = np.asarray(steps, dtype=float).copy()
    events = np.asarray(reached, dtype=bool)
    never = np.zeros(len(times), bool) if never is None else np.asarray(never, dtype=bool)
    never = never & ~events
    beyond = float(np.nanmax(times) * 2 + 1) if len(times) else 1.0
    times[never] = beyond
    return times, events, beyond


def censored(times, events) -> stats.CensoredData:
    times = np.asarray(times, dtype=float)
    events = np.asarray(events, dtype=bool)
    return stats.CensoredData(uncensored=times[events], right=times[~events])


def steps_survival(steps, reached, never=None) -> dict:
    """Kaplan-Meier estimate of steps to the threshold (``scipy.stats.ecdf`` on censored
    data; ``outcomes`` for ``never``): {n, events, never, median, median_low, median_high}.
    The median is the first step where the share of seeds still short of the threshold
    falls to 0.5 or below (inf where it never does: fewer than half reached it); its
    interval comes from the survival function's 95% log-log band (the steps where the
    band's limits cross 0.5)."""
    times, events, beyond = outcomes(steps, reached, never)
    out = {"n": len(events), "events": int(events.sum()),
           "never": int(np.sum(times == beyond)) if len(times) else 0}  # fmt: skip
    if not events.any():
        return {**out, "median": math.inf, "median_low": math.inf, "median_high": math.inf}
    sf = stats.ecdf(censored(times, events)).sf
    with warnings.catch_warnings():  # scipy warns where the band is undefined (NaN below)
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(CONFIDENCE, method="log-log")

    def crossing(probabilities, undefined: float) -> float:
        below = np.flatnonzero(np.nan_to_num(probabilities, nan=undefined) <= 0.5)
        step = float(sf.quantiles[below[0]]) if len(below) else math.inf
        return math.inf if step >= beyond else step

    # Where the band is undefined (too few seeds) it bounds nothing: the lower limit falls
    # to 0 and the upper rises to 1, so the median's interval widens to the widest.
    return {
        **out,
        "median": crossing(sf.probabilities, 1.0),
        "median_low": crossing(band.low.probabilities, 0.0),
        "median_high": crossing(band.high.probabilities, 1.0),
    }


def logrank_statistics(times: np.ndarray, events: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The log-rank z of arm 1 against arm 0 for every row of ``groups`` (relabellings, 0/1
    per seed): (observed - expected events of arm 1) / sqrt(hypergeometric variance), summed
    over the distinct event times. NaN where the variance is 0. Seeds at risk and events of
    arm 1 at each event time are differences of running sums over the seeds sorted by time:
    O(rows x seeds), never rows x seeds x event times."""
    order = np.argsort(times, kind="stable")
    t, e = times[order], events[order].astype(float)
    g = np.asarray(groups, dtype=float)[:, order]
    event_times = np.unique(times[events])
    lo = np.searchsorted(t, event_times, "left")  # first seed still at risk at each time
    hi = np.searchsorted(t, event_times, "right")
    n_all = (len(t) - lo).astype(float)
    d_all = np.concatenate([[0.0], np.cumsum(e)])
    d_all = d_all[hi] - d_all[lo]
    running = np.zeros((len(g), len(t) + 1))
    np.cumsum(g, axis=1, out=running[:, 1:])
    n_one = running[:, -1:] - running[:, lo]  # rows x J
    np.cumsum(g * e, axis=1, out=running[:, 1:])
    d_one = running[:, hi] - running[:, lo]
    share = n_one / n_all
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = (d_all * share * (1 - share) * (n_all - d_all) / np.maximum(n_all - 1, 1)).sum(1)
        z = (d_one - d_all * share).sum(1) / np.sqrt(variance)
    return np.where(variance > 0, z, np.nan)


def relabellings(n: int, k: int):
    """(batches of 0/1 rows choosing k of n seeds as arm 1, exact): every choice when there
    are at most ``EXACT_PATTERNS``, else ``MONTE_CARLO_DRAWS`` drawn at random (seeded), in
    batches of at most ``DRAW_BATCH`` cells."""
    if special.comb(n, k, exact=True) <= EXACT_PATTERNS:
        chosen = np.array(list(itertools.combinations(range(n), k)), dtype=np.intp)
        rows = np.zeros((len(chosen), n))
        np.put_along_axis(rows, chosen.reshape(len(chosen), k), 1.0, axis=1)
        return [rows], True
    rng = np.random.default_rng(PERMUTATION_SEED)
    base = np.zeros(n)
    base[:k] = 1
    draws = (
        rng.permuted(np.tile(base, (size, 1)), axis=1) for size in batches(MONTE_CARLO_DRAWS, n)
    )
    return draws, False


def steps_logrank(steps_a, reached_a, steps_b, reached_b, never_a=None, never_b=None) -> dict:
    """Log-rank test that two arms reach the threshold equally fast, ``outcomes`` coding the
    seeds: {statistic (z of arm a), p (permutation: the share of relabellings of the seeds
    into two arms of these sizes whose |z| is at least the observed; exact when every one is
    enumerated, else ``monte_carlo_p``; from ``LOGRANK_NORMAL_FROM`` seeds the normal
    approximation's), p_se (its Monte Carlo SE; 0 when exact, NaN when normal), p_method
    ("exact", "Monte Carlo" or "normal"), p_min (the least p the design can give: 2 /
    C(n_a + n_b, n_a) at best, 0.1 for 3 + 3 seeds; 0 for the normal), p_asymptotic (``scipy.stats.logrank``'s normal approximation, kept for
    comparison; off nominal at a few seeds)}; NaN when neither arm has an event."""
    na, nb = len(np.asarray(steps_a)), len(np.asarray(steps_b))
    never = [
        np.zeros(m, bool) if v is None else np.asarray(v, dtype=bool)
        for m, v in ((na, never_a), (nb, never_b))
    ]
    times, events, _ = outcomes(
        np.concatenate([np.asarray(steps_a, float), np.asarray(steps_b, float)]),
        np.concatenate([np.asarray(reached_a, bool), np.asarray(reached_b, bool)]),
        np.concatenate(never),
    )
    nan = {**dict.fromkeys(("statistic", "p", "p_se", "p_min", "p_asymptotic"), math.nan),
           "p_method": ""}  # fmt: skip
    if not events.any() or not na or not nb:
        return nan
    observed = np.zeros((1, na + nb))
    observed[0, :na] = 1
    z = float(logrank_statistics(times, events, observed)[0])
    if not math.isfinite(z):
        return nan
    asymptotic = float(2 * stats.norm.sf(abs(z)))
    if na + nb >= LOGRANK_NORMAL_FROM:
        return {"statistic": z, "p": asymptotic, "p_se": math.nan, "p_min": 0.0,
                "p_method": "normal", "p_asymptotic": asymptotic}  # fmt: skip
    draws, exact = relabellings(na + nb, na)
    extreme, total = 0, 0
    for rows in draws:
        null = np.nan_to_num(np.abs(logrank_statistics(times, events, rows)), nan=0.0)
        extreme += int(np.sum(null >= abs(z) - 1e-9))
        total += len(rows)
    if exact:
        p, se, least = extreme / total, 0.0, (2 if na == nb else 1) / total
    else:
        (p, se), least = monte_carlo_p(extreme, total), 1 / (total + 1)
    return {
        "statistic": z,
        "p": p,
        "p_se": se,
        "p_min": least,
        "p_method": "exact" if exact else "Monte Carlo",
        "p_asymptotic": asymptotic,
    }
