"""The statistics a comparison of arms rests on, each calibrated at the designs the presets
run (3 seeds an arm; ``benchmarks/calibration.py`` prints every coverage and type-I error).

- ``summarize``: a cell over seeds: mean, sample std, Student-t 95% interval.
- ``welch_difference``: two independent groups of seeds (arms that share no seed streams).
- ``paired_difference``: two arms trained on the same seeds (the same seed gives both arms
  the same heads, data and dropout streams, ``seeding.py``), paired on the seed: the mean
  difference with its paired-t interval and p-value, the standardised effect d_z (mean
  difference / SD of the differences) with its exact noncentral-t interval, the exact
  sign-flip permutation p-value with the smallest p it can reach at that n, and the smallest
  difference the n pairs detect at 80% power.
- ``adjust_p``: Benjamini-Hochberg over one declared family of comparisons.
- ``steps_survival`` / ``steps_logrank``: steps to a threshold as censored data. A seed that
  ran its whole budget without reaching it is censored at its last step (it might have
  reached it later); a seed that diverged or stopped on patience never reaches it (kept at
  risk beyond every observed step). Kaplan-Meier median with its interval, and the log-rank
  test with its exact permutation p-value.
- ``detectable_difference`` / ``seeds_needed``: power of the paired t-test;
  ``power_statement``: what a pilot's n pairs detect, at the SD's upper confidence bound
  (``ASSURANCE``), with the range over the SD's 95% interval and at the family's level.

Every function takes plain sequences; non-finite values (a seed with no score) are dropped,
and a quantity that needs more seeds than there are is NaN, never a guess.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
from scipy import optimize, special, stats

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
POWER = 0.8
"""The power at which ``detectable_difference`` states a comparison's smallest effect."""
ASSURANCE = 0.8
"""The share of pilots whose planned seeds must reach ``POWER``: power statements and seed
plans use the SD's one-sided upper ``ASSURANCE`` confidence bound (``sd_upper``), not the
pilot's SD itself (from 3 pairs its 95% interval spans 0.5x-6.3x)."""
PERMUTATION_LIMIT = 20_000
"""Relabellings enumerated exactly up to this many; beyond, this many drawn at random."""
PERMUTATION_SEED = 0
"""Seeds the random relabellings (only past ``PERMUTATION_LIMIT``): a report is repeatable."""
KM_INTERVAL_MIN_SEEDS = 10
"""Seeds an arm needs before the Kaplan-Meier median's 95% interval is printed: below it the
log-log band's coverage of the true median is off nominal at the presets' designs
(``benchmarks/calibration.py``: 3 seeds, 5 seeds)."""


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


def sign_flip_p(d: np.ndarray) -> float:
    """Exact two-sided p of the sign-flip permutation test of a zero mean difference (every
    one of the 2^n sign patterns, ``scipy.stats.permutation_test``); NaN when every
    difference is 0."""
    if not np.any(d != 0):
        return math.nan
    test = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    )
    return float(test.pvalue)


def smallest_sign_flip_p(n: int) -> float:
    """The least p the exact two-sided sign-flip test can give with n pairs: 2 / 2^n (0.25
    at 3 pairs, 0.0625 at 5: it cannot reach 0.05 below 6)."""
    return min(1.0, 2.0 / 2**n) if n else math.nan


def paired_difference(a: dict, b: dict) -> dict:
    """Arm ``a`` minus arm ``b`` over the seeds both ran (``{seed: value}`` each; a seed
    missing or non-finite in either arm is left out of the pairs):

    {n (pairs), seeds, diff (mean of the paired differences), sd_diff, ci95/ci_low/ci_high
    (paired t, ``scipy.stats.ttest_rel``), p_t, d_z/d_z_low/d_z_high (``effect_size``),
    p_sign_flip (``sign_flip_p``), p_sign_flip_min (``smallest_sign_flip_p``), detectable,
    detectable_low, detectable_high, detectable_family (``power_statement``, a family of
    one)}. With fewer than two pairs everything but
    ``diff`` is NaN; with identical differences there is no interval, and ``interval_note``
    says why (``no_spread_note``)."""
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
    out["p_sign_flip"] = sign_flip_p(d)
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
    high = 1.0
    while paired_t_power(high, n, alpha) < power:
        high *= 2
    effect = optimize.brentq(lambda e: paired_t_power(e, n, alpha) - power, 0.0, high, xtol=1e-10)
    return float(effect * sd)


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
    over the distinct event times. NaN where the variance is 0."""
    event_times = np.unique(times[events])
    at_risk = (times[None, :] >= event_times[:, None]).astype(float)  # J x N
    happened = ((times[None, :] == event_times[:, None]) & events[None, :]).astype(float)
    n_all, d_all = at_risk.sum(1, keepdims=True), happened.sum(1, keepdims=True)
    n_one, d_one = at_risk @ groups.T, happened @ groups.T  # J x P
    expected = d_all * n_one / n_all
    share = n_one / n_all
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = d_all * share * (1 - share) * (n_all - d_all) / np.maximum(n_all - 1, 1)
        z = (d_one - expected).sum(0) / np.sqrt(variance.sum(0))
    return np.where(variance.sum(0) > 0, z, np.nan)


def relabellings(n: int, k: int) -> tuple[np.ndarray, bool]:
    """(0/1 rows choosing k of n seeds as arm 1, exact): every choice when there are at most
    ``PERMUTATION_LIMIT``, else that many drawn at random (seeded)."""
    if special.comb(n, k, exact=True) <= PERMUTATION_LIMIT:
        rows = np.zeros((special.comb(n, k, exact=True), n))
        for i, chosen in enumerate(itertools.combinations(range(n), k)):
            rows[i, list(chosen)] = 1
        return rows, True
    rng = np.random.default_rng(PERMUTATION_SEED)
    rows = np.zeros((PERMUTATION_LIMIT, n))
    for row in rows:
        row[rng.choice(n, k, replace=False)] = 1
    return rows, False


def steps_logrank(steps_a, reached_a, steps_b, reached_b, never_a=None, never_b=None) -> dict:
    """Log-rank test that two arms reach the threshold equally fast, ``outcomes`` coding the
    seeds: {statistic (z of arm a), p (permutation: the share of relabellings of the seeds
    into two arms of these sizes whose |z| is at least the observed; exact when every one is
    enumerated), p_min (the least p the design can give: 2 / C(n_a + n_b, n_a) at best, 0.1
    for 3 + 3 seeds), p_asymptotic (``scipy.stats.logrank``'s normal approximation, kept for
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
    nan = {"statistic": math.nan, "p": math.nan, "p_min": math.nan, "p_asymptotic": math.nan}
    if not events.any() or not na or not nb:
        return nan
    observed = np.zeros((1, na + nb))
    observed[0, :na] = 1
    z = float(logrank_statistics(times, events, observed)[0])
    if not math.isfinite(z):
        return nan
    rows, exact = relabellings(na + nb, na)
    null = np.nan_to_num(np.abs(logrank_statistics(times, events, rows)), nan=0.0)
    extreme = int(np.sum(null >= abs(z) - 1e-9))
    p = extreme / len(rows) if exact else (extreme + 1) / (len(rows) + 1)
    return {
        "statistic": z,
        "p": p,
        "p_min": ((2 if na == nb else 1) / len(rows)) if exact else 1 / (len(rows) + 1),
        "p_asymptotic": float(2 * stats.norm.sf(abs(z))),
    }
