"""How often ``fit_scaling_law``'s intervals cover the truth, over synthetic studies drawn
from a known law: the calibration check of the bootstrap (tests/test_scaling_laws.py runs a
small one, ``benchmarks/scaling_coverage.py`` a large one; docs/scaling-laws.md).

A study has ``seeds`` rows at each of ``sizes``: the law times log-normal noise (sd
``noise`` in log y), as seeds of one model size scatter; it is fitted with ``groups="seed"``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from scale_fpt.analysis.fit import fit_scaling_law
from scale_fpt.analysis.laws import LAWS


def synthetic_study(form: str, truth: dict, sizes, seeds: int, noise: float, rng) -> pd.DataFrame:
    """Columns N, seed, y: ``seeds`` noisy rows of the one-variable law ``form`` at each size."""
    law = LAWS[form]
    theta = np.array([truth[p] for p in law.params], dtype=float)
    theta[list(law.logged)] = np.log(theta[list(law.logged)])
    N = np.repeat(np.asarray(sizes, dtype=float), seeds)
    mean = np.exp(law.log_predict(theta, law.transform(N[:, None])))
    return pd.DataFrame(
        {
            "N": N,
            "seed": np.tile(np.arange(seeds), len(sizes)),
            "y": mean * np.exp(rng.normal(0, noise, len(N))),
        }
    )


def coverage_study(
    form: str,
    truth: dict,
    sizes,
    seeds: int,
    noise: float,
    draws: int,
    n_boot: int,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (study, parameter): estimate, lo, hi, covered. Study k draws its data
    from ``default_rng([seed, k])`` and bootstraps with seed k, so the result is fixed."""
    rows = []
    for k in range(draws):
        study = synthetic_study(form, truth, sizes, seeds, noise, np.random.default_rng([seed, k]))
        fit = fit_scaling_law(
            study, "y", "N", form, groups="seed", n_boot=n_boot, level=level, seed=k
        )
        for p, value in truth.items():
            lo, hi = fit.intervals[p]
            rows.append(
                {
                    "study": k,
                    "param": p,
                    "estimate": fit.params[p],
                    "lo": lo,
                    "hi": hi,
                    "covered": bool(lo <= value <= hi),
                    "no_floor": p == "E" and "E" in fit.goodness["at_bound"],
                }
            )
    return pd.DataFrame(rows)


def coverage_table(study: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per parameter: n studies, covered count, coverage and its Clopper-Pearson 95% interval,
    and the two-sided binomial test's p-value against ``level``."""
    out = []
    for p, rows in study.groupby("param", sort=False):
        n, k = len(rows), int(rows["covered"].sum())
        test = binomtest(k, n, level)
        ci = test.proportion_ci(0.95, method="exact")
        out.append(
            {
                "param": p,
                "n": n,
                "covered": k,
                "coverage": k / n,
                "lo": ci.low,
                "hi": ci.high,
                "p_value": test.pvalue,
            }
        )
    return pd.DataFrame(out)
