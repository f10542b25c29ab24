"""The report's statistics (scale_fpt.report.stats), each cross-checked against scipy.stats
computed here from the raw numbers, and against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sp

from scale_fpt.report import stats

PRE = {0: 0.90, 1: 0.95, 2: 1.00, 3: 0.97, 4: 0.99}
RND = {0: 0.80, 1: 0.85, 2: 0.82, 3: 0.90, 4: 0.91, 7: 0.5}  # seed 7: no pretrained partner


def test_summary_interval_is_scipys_t_interval():
    x = [0.5, 0.6, 0.7, 0.65]
    s = stats.summarize([*x, None, float("nan")])
    low, high = sp.t.interval(0.95, 3, loc=np.mean(x), scale=sp.sem(x))
    assert s["n"] == 4 and (s["ci_low"], s["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302652729749464, abs=1e-12)


def test_welch_interval_and_p_are_scipys():
    a, b = [1, 2, 3], [4, 6, 8]
    d = stats.welch_difference(a, b)
    test = sp.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(0.95)
    assert (d["ci_low"], d["ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d["p"] == pytest.approx(test.pvalue) and d["df"] == pytest.approx(50 / 17)


def test_paired_difference_pairs_on_shared_seeds():
    d = stats.paired_difference(PRE, RND)
    assert d["n"] == 5 and d["seeds"] == [0, 1, 2, 3, 4]  # seed 7 has no partner
    x = np.array([PRE[s] for s in range(5)])
    y = np.array([RND[s] for s in range(5)])
    ci = sp.ttest_rel(x, y).confidence_interval(0.95)
    assert d["diff"] == pytest.approx(0.106)
    assert (d["ci_low"], d["ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d["p_t"] == pytest.approx(sp.ttest_rel(x, y).pvalue)
    # Five positive differences: the exact two-sided signed-rank p is 2 / 2^5.
    assert d["p_wilcoxon"] == pytest.approx(2 / 32)
    # Hedges' g by hand: pooled std of the two arms, times J = 1 - 3 / (4 * 8 - 1).
    pooled = math.sqrt((x.var(ddof=1) + y.var(ddof=1)) / 2)
    assert d["g"] == pytest.approx((x.mean() - y.mean()) / pooled * (1 - 3 / 31))
    assert d["g_low"] < d["g"] < d["g_high"]
    assert stats.paired_difference(PRE, RND) == d  # the bootstrap is seeded: same report


def test_paired_interval_is_narrower_than_welchs_when_seeds_share_streams():
    """The same seed moves both arms together: pairing removes that shared variation."""
    paired = stats.paired_difference(PRE, RND)
    welch = stats.welch_difference([PRE[s] for s in range(5)], [RND[s] for s in range(5)])
    assert paired["ci95"] < welch["ci95"]


def test_paired_difference_with_too_few_or_identical_pairs():
    one = stats.paired_difference({0: 0.9}, {0: 0.5, 1: 0.6})
    assert one["n"] == 1 and one["diff"] == pytest.approx(0.4) and math.isnan(one["ci95"])
    same = stats.paired_difference({0: 0.9, 1: 0.8, 2: 0.7}, {0: 0.8, 1: 0.7, 2: 0.6})
    assert same["ci95"] == 0 and same["diff"] == pytest.approx(0.1)
    assert math.isnan(same["g_low"])  # three pairs: no bootstrap interval
    zero = stats.paired_difference({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.6})
    assert math.isnan(zero["p_wilcoxon"]) and zero["diff"] == 0


def test_benjamini_hochberg_is_scipys_and_skips_nan():
    p = [0.01, 0.04, float("nan"), 0.03, 0.2]
    adjusted = stats.adjust_p(p)
    expected = sp.false_discovery_control([0.01, 0.04, 0.03, 0.2])
    assert np.isnan(adjusted[2])
    np.testing.assert_allclose(adjusted[[0, 1, 3, 4]], expected)
    # By hand: sorted 0.01, 0.03, 0.04, 0.2 -> 0.04, 0.04*4/3 ... min from the top.
    np.testing.assert_allclose(adjusted[[0, 3, 1, 4]], [0.04, 16 / 300, 16 / 300, 0.2])


def test_kaplan_meier_median_with_censored_seeds():
    """Three seeds reach the threshold at 100, 200, 300; two never do (censored at 2000).
    The survival steps 0.8, 0.6, 0.4: the median is 300, the first step at or below 0.5."""
    steps, reached = [100, 200, 300, 2000, 2000], [True, True, True, False, False]
    km = stats.steps_survival(steps, reached)
    assert (km["n"], km["events"], km["median"]) == (5, 3, 300.0)
    sf = sp.ecdf(sp.CensoredData(uncensored=[100, 200, 300], right=[2000, 2000])).sf
    np.testing.assert_allclose(sf.probabilities, [0.8, 0.6, 0.4, 0.4])
    band = sf.confidence_interval(0.95, method="log-log")
    low_first = sf.quantiles[np.flatnonzero(band.low.probabilities <= 0.5)[0]]
    assert km["median_low"] == low_first and km["median_high"] == math.inf
    # Fewer than half reached it: the median is beyond every step (not the last step).
    assert stats.steps_survival([100, 2000, 2000], [True, False, False])["median"] == math.inf
    assert stats.steps_survival([2000, 2000], [False, False])["events"] == 0


def test_logrank_is_scipys():
    a = ([100, 200, 300], [True, True, True])
    b = ([2000, 2000, 2000], [False, False, False])
    test = stats.steps_logrank(*a, *b)
    expected = sp.logrank(sp.CensoredData(uncensored=a[0]), sp.CensoredData(right=b[0]))
    assert test["p"] == pytest.approx(expected.pvalue) and test["p"] < 0.05
    assert math.isnan(stats.steps_logrank(*b, *b)["p"])
