"""How often the intervals of a scaling law cover the truth, over synthetic studies drawn
from a known law at a known design.

- ``law_checks(design, n_studies, seed)``: every interval the report's scaling section prints
  (``analysis.means``: a size's mean, alpha, E, alpha differences, the held-out prediction,
  the curve's band), at the design of a shipped preset (``DESIGNS``: its sizes and seeds),
  each with its coverage, Monte Carlo error and whether it is calibrated there. The report
  prints an interval only where it is (``report.scaling_laws``);
  ``benchmarks/scaling_coverage.py`` prints them all.
- ``coverage_study``/``coverage_table``: the same question for ``fit_scaling_law``'s
  bootstrap (seeds resampled within sizes; no size-level deviation).

A study has ``seeds`` rows at each of ``sizes``: the law times log-normal noise, as seeds of
one model size scatter, and (``size_sd``) times a deviation shared by a size's seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import binom, binomtest
from scipy.stats import t as t_dist

from scale_fpt.analysis.fit import fit_scaling_law
from scale_fpt.analysis.laws import LAWS
from scale_fpt.analysis.means import (
    Profile,
    exponent_difference_arrays,
    interval_at,
    law_intervals,
)
from scale_fpt.scaling import GPT2_SIZES, PYTHIA_SIZES, gpt2_group_params


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


# --------------------------------------------------------------------------- law checks


@dataclass(frozen=True)
class Design:
    """Where a scaling law is fitted: the sizes (parameters) and seeds per size of a preset."""

    name: str
    sizes: tuple[float, ...]
    seeds: int


TRUTH = {"alpha": 0.3, "smallest": 0.4, "floor_share": 0.3, "alpha_b": 0.2}
"""The laws drawn from, scaled to each design: error 0.4 at the smallest size, alpha 0.3,
the floor E 30% of the error at the largest size (``power_floor``); the second arm of an
exponent difference has alpha 0.2 and the same floor share."""
SCENARIOS = (
    {"seed_sd": 0.03, "size_sd": 0.0},
    {"seed_sd": 0.03, "size_sd": 0.03},
    {"seed_sd": 0.03, "size_sd": 0.03, "floor_share": 0.84},
    {"seed_sd": 0.01, "size_sd": 0.0, "points": True},
)
"""Seed noise (sd of log y between seeds) and a deviation of each size from the law (sd of
log y shared by a size's seeds): the issue's size effect of sd 0.03, and none; a floor that
is 84% of the error at the largest size; and noise constant in accuracy points (``points``:
the sds are of y itself, 1 point between seeds) rather than relative."""
UNEQUAL_ARMS = ({"seed_sd": 0.02, "size_sd": 0.0}, {"seed_sd": 0.06, "size_sd": 0.03})
"""Two arms of an exponent difference that differ in noise (the second three times noisier
between seeds, and off the law per size): its interval keeps each arm's own variance."""
NOMINAL = 0.95
MISCALIBRATED = 0.03
"""How far off nominal, on the wrong side, a rate is wrong: coverage 0.92 of a 95% interval,
a type-I error of 0.08 of a 0.05 test."""
POWER = 0.95
"""The share of checks a rate ``MISCALIBRATED`` off nominal fails, at any number of studies
(``shows_calibrated``)."""


def shows_calibrated(k: int, n: int, nominal: float = NOMINAL, kind: str = "coverage") -> bool:
    """Whether ``k`` of ``n`` studies show a rate calibrated: a one-sided binomial test at
    level 1 - ``POWER`` rejects a rate ``MISCALIBRATED`` off ``nominal`` on the wrong side
    (``kind`` 'coverage': k intervals covered, a conservative one passes; 'level': k tests
    rejected a true null). A wrong rate passes at most 5% of the time whatever ``n``; fewer
    studies only fail a right one more often (a 0.95 coverage passes 89% of the time at 600
    studies, 99% at 1,100; none below 36)."""
    if n == 0:
        return False
    if kind == "coverage":
        return bool(binom.sf(k - 1, n, nominal - MISCALIBRATED) <= 1 - POWER)
    return bool(binom.cdf(k, n, nominal + MISCALIBRATED) <= 1 - POWER)


def model_params(name: str) -> float:
    """Backbone parameters of a GPT-2 or Pythia preset, from the planner's tables."""
    if name in GPT2_SIZES:
        return float(sum(gpt2_group_params(GPT2_SIZES[name]).values()))
    return float(PYTHIA_SIZES[name].published_params)


def preset_designs(studies, min_sizes: int = 3) -> dict[str, Design]:
    """The design of every preset of ``studies`` (``scale_fpt.recipes.studies.STUDIES``: the
    library never imports the recipes) that runs ``min_sizes`` or more model sizes (the report
    fits a law to each of its arms): {sweep name: Design}."""
    out = {}
    for study in studies.values():
        for make in study.presets.values():
            sweep = make()
            models = sweep.grid.get("model", [])
            if len(models) >= min_sizes:
                sizes = tuple(sorted(model_params(m) for m in models))
                out[sweep.name] = Design(sweep.name, sizes, len(sweep.seeds))
    return out


def truth_params(form: str, sizes, alpha: float, floor_share: float | None = None) -> dict:
    """A, alpha, E of ``TRUTH`` at these sizes (module constants; ``floor_share``: E's share
    of the error at the largest size, ``TRUTH``'s by default)."""
    x = np.asarray(sizes, dtype=float)
    if form == "power":
        return {"A": TRUTH["smallest"] * x[0] ** alpha, "alpha": alpha, "E": 0.0}
    # E + A x0^-a = s; E = share (E + A x1^-a)  ->  A (x0^-a - x1^-a share/(1-share)) ... solved:
    share = TRUTH["floor_share"] if floor_share is None else floor_share
    ratio = (x[-1] / x[0]) ** -alpha
    A = TRUTH["smallest"] * (1 - share) / ((1 - share) + share * ratio) * x[0] ** alpha
    E = share / (1 - share) * A * x[-1] ** -alpha
    return {"A": A, "alpha": alpha, "E": E}


def simulate(truth: dict, sizes, seeds: int, scenario: dict, n: int, rng):
    """(errors (n, k, seeds), each size's own mean (n, k)): the law times mean-one
    log-normal deviations of each size and of each seed, or (``scenario["points"]``) plus
    normal ones in the error's own units."""
    x = np.asarray(sizes, dtype=float)
    mean = truth["E"] + truth["A"] * x ** -truth["alpha"]
    size_sd, seed_sd = scenario["size_sd"], scenario["seed_sd"]
    if scenario.get("points"):
        own = mean[None, :, None] + rng.normal(0, size_sd, (n, len(x), 1))
        return own + rng.normal(0, seed_sd, (n, len(x), seeds)), own[..., 0]
    u = rng.normal(-(size_sd**2) / 2, size_sd, (n, len(x), 1))
    e = rng.normal(-(seed_sd**2) / 2, seed_sd, (n, len(x), seeds))
    own = mean[None, :, None] * np.exp(u)
    return own * np.exp(e), own[..., 0]


def profiles(draws: np.ndarray, sizes, form: str) -> tuple[Profile, float]:
    x = np.asarray(sizes, dtype=float)
    z_ref = float(np.exp(np.log(x).mean()))
    ybar = draws.mean(axis=2)
    return Profile(form == "power_floor", x / z_ref, ybar, 1 / ybar**2), z_ref


def check_row(name, design, covered: np.ndarray, identified: np.ndarray | None = None) -> dict:
    n = len(covered)
    if not n:  # no study gave a printed interval
        return {**no_df_row(name, design), "identified": 0.0}
    k = int(covered.sum())
    coverage = k / n
    return {
        "name": name,
        "design": design.name,
        "nominal": NOMINAL,
        "coverage": coverage,
        "mc_error": float(np.sqrt(coverage * (1 - coverage) / n)),
        "n_studies": n,
        "calibrated": shows_calibrated(k, n),
        "identified": float(np.mean(identified)) if identified is not None else 1.0,
    }


def law_checks(
    design: Design | dict, n_studies: int = 200, seed: int = 0, form: str = "power_floor"
) -> list[dict]:
    """Coverage of every interval the report's scaling section prints, at ``design``, for
    laws of ``form`` (the analysis plan's), in each of ``SCENARIOS``: a size's mean (t),
    alpha, E (power_floor), the curve's band at the largest size, alpha differences (also
    between arms of ``UNEQUAL_ARMS``), the measured gap's change (Welch) and the held-out
    prediction of the largest size. A list of dicts with
    name ("<interval>, <scenario>"), design, nominal, coverage, mc_error, n_studies,
    calibrated (``shows_calibrated``) and identified (share of studies whose interval was bounded:
    an unbounded one is printed as "not identified" and counts as covering where it holds
    the truth). An interval with no degree of freedom at this design (sizes <= the law's
    parameters) has coverage nan and calibrated False. Vectorised: 200 studies take about a
    second per design. ``design`` may also be a mapping with ``name``, ``sizes``, ``seeds``."""
    if not isinstance(design, Design):
        design = Design(design["name"], tuple(design["sizes"]), int(design["seeds"]))
    rng = np.random.default_rng(seed)
    sizes = np.asarray(design.sizes, dtype=float)
    k, p = len(sizes), len(LAWS[form].params)
    rows = []
    for scenario in SCENARIOS:
        tag = scenario_tag(scenario)
        truth = truth_params(form, sizes, TRUTH["alpha"], scenario.get("floor_share"))
        draws, own = simulate(truth, sizes, design.seeds, scenario, n_studies, rng)
        rows.append(size_mean_row(draws, own, design, tag))
        profile, z_ref = profiles(draws, sizes, form)
        est = law_intervals(profile.floor, profile.z, profile.y, k - p, NOMINAL, z_ref)
        names = ["alpha", "E"] if form == "power_floor" else ["alpha"]
        for name in names:
            lo, hi = getattr(est, f"{name}_lo"), getattr(est, f"{name}_hi")
            bounded = np.isfinite(lo) & np.isfinite(hi)
            if k <= p:
                rows.append(no_df_row(f"{name}, {tag}", design))
            else:
                # What a reader sees as an interval is a bounded one (an unbounded one is
                # printed "not identified"): its coverage is that of the bounded ones.
                covered = (lo <= truth[name]) & (truth[name] <= hi)
                rows.append(check_row(f"{name}, {tag}", design, covered[bounded], bounded))
        rows.append(band_row(profile, sizes, z_ref, truth, k - p, design, tag))
        rows.append(difference_row(sizes, design, scenario, scenario, form, n_studies, rng, tag))
        rows.append(gap_change_row(draws, own, sizes, design, form, scenario, n_studies, rng, tag))
        rows.append(holdout_row(draws, sizes, truth, design, form, scenario, tag))
    a, b = UNEQUAL_ARMS
    tag = f"arms of seed sd {a['seed_sd']} and {b['seed_sd']} with size sd {b['size_sd']}"
    rows.append(difference_row(sizes, design, a, b, form, n_studies, rng, tag))
    return rows


def scenario_tag(scenario: dict) -> str:
    """'seed sd 0.03, size sd 0.03' (+ ', floor 84%', + ', in points')."""
    tag = f"seed sd {scenario['seed_sd']}, size sd {scenario['size_sd']}"
    if "floor_share" in scenario:
        tag += f", floor {scenario['floor_share']:.0%}"
    return tag + (", in points" if scenario.get("points") else "")


def no_df_row(name: str, design: Design) -> dict:
    return {**check_row(name, design, np.zeros(1, bool)), "coverage": float("nan"),
            "mc_error": float("nan"), "n_studies": 0, "calibrated": False, "identified": 0.0}  # fmt: skip


def band_row(profile, sizes, z_ref, truth, df, design, tag) -> dict:
    """The curve's band at the largest size against the law there."""
    name = f"band at the largest size, {tag}"
    if df < 1:
        return no_df_row(name, design)
    x = sizes[-1]
    lo, hi = interval_at(profile, np.array([x / z_ref]), df, NOMINAL, 0.0)
    target = truth["E"] + truth["A"] * x ** -truth["alpha"]
    return check_row(name, design, (lo[:, 0] <= target) & (target <= hi[:, 0]))


def difference_row(sizes, design, scenario_a, scenario_b, form, n, rng, tag) -> dict:
    """alpha(a) - alpha(b) of two independent arms at this design (alpha 0.3 vs 0.2), each
    drawn with its own scenario."""
    name = f"alpha difference, {tag}"
    k, p = len(sizes), len(LAWS[form].params)
    if k <= p:
        return no_df_row(name, design)
    truth_a = truth_params(form, sizes, TRUTH["alpha"])
    truth_b = truth_params(form, sizes, TRUTH["alpha_b"])
    draws_a, _ = simulate(truth_a, sizes, design.seeds, scenario_a, n, rng)
    draws_b, _ = simulate(truth_b, sizes, design.seeds, scenario_b, n, rng)
    (profile_a, _), (profile_b, _) = profiles(draws_a, sizes, form), profiles(draws_b, sizes, form)
    _, lo, hi = exponent_difference_arrays(profile_a, profile_b, k - p, k - p, NOMINAL)
    d = truth_a["alpha"] - truth_b["alpha"]
    bounded = np.isfinite(lo) & np.isfinite(hi)
    return check_row(name, design, ((lo <= d) & (d <= hi))[bounded], bounded)


def holdout_row(draws, sizes, truth, design, form, scenario, tag) -> dict:
    """The law fitted without the largest size predicts that size's observed mean."""
    name = f"held-out prediction of the largest size, {tag}"
    k, p = len(sizes), len(LAWS[form].params)
    if k - 1 <= p:
        return no_df_row(name, design)
    profile, z_ref = profiles(draws[:, :-1], sizes[:-1], form)
    lo, hi = interval_at(profile, np.array([sizes[-1] / z_ref]), k - 1 - p, NOMINAL, 1.0)
    observed = draws[:, -1].mean(axis=1)
    return check_row(name, design, (lo[:, 0] <= observed) & (observed <= hi[:, 0]))


def gap_change_row(draws_a, own_a, sizes, design, form, scenario, n, rng, tag) -> dict:
    """The measured gap (arm b - arm a mean error) at the largest size minus at the
    smallest, Welch interval over the four cells' seeds, against the same change of the two
    arms' own size means (``report.scaling_laws.gap_change``)."""
    name = f"gap change (Welch), {tag}"
    if design.seeds < 2:
        return no_df_row(name, design)
    draws_b, own_b = simulate(truth_params(form, sizes, TRUTH["alpha_b"]), sizes, design.seeds,
                              scenario, n, rng)  # fmt: skip
    ends = [0, len(sizes) - 1]
    cells = np.concatenate([draws_a[:, ends], draws_b[:, ends]], axis=1)  # (n, 4, seeds)
    # (b_L - a_L) - (b_S - a_S) over the cells a_S, a_L, b_S, b_L
    coefficient = np.array([1.0, -1.0, -1.0, 1.0])
    estimate = (cells.mean(axis=2) * coefficient).sum(axis=1)
    truth = (np.concatenate([own_a[:, ends], own_b[:, ends]], axis=1) * coefficient).sum(axis=1)
    m = design.seeds
    parts = cells.var(axis=2, ddof=1) / m
    dof = parts.sum(axis=1) ** 2 / (parts**2 / (m - 1)).sum(axis=1)
    half = t_dist.ppf(0.975, dof) * np.sqrt(parts.sum(axis=1))
    return check_row(name, design, np.abs(estimate - truth) <= half)


def size_mean_row(draws, own, design, tag) -> dict:
    """A size's mean: t interval over its seeds, against that size's own mean."""
    m = design.seeds
    name = f"size mean (t, {m} seeds), {tag}"
    if m < 2:
        return no_df_row(name, design)
    ybar, sd = draws.mean(axis=2), draws.std(axis=2, ddof=1)
    half = t_dist.ppf(0.975, m - 1) * sd / np.sqrt(m)
    return check_row(name, design, np.abs(ybar - own)[:, 0] <= half[:, 0])
