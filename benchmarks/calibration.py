"""Calibration of every interval and test the report prints, at the design of every shipped
preset: studies simulated from known truths, each statistic's coverage (intervals) or
type-I error (tests) with its Monte Carlo error, and whether the report prints it there.

    python benchmarks/calibration.py [--studies 400] [--seed 0]

A design is read from each preset of ``scale_fpt.recipes.studies.STUDIES`` (never written here):
its seeds per arm, confirmation seeds, learning-rate candidates, model sizes and its
coarsest (budget, evaluation interval). Seed noise is normal; steps to a threshold are
log-normal, read at the preset's evaluation steps, censored at its budget, and 10% of seeds
diverge (they never reach it). A statistic is *calibrated* when its coverage is within the
binomial tolerance of nominal (99.9%: 3.29 Monte Carlo errors of the nominal rate), or, for a
test, when its type-I error is not above it. Each row also says whether the report prints
the statistic at that design (its rule in ``scale_fpt.report.stats``); the run ends with
exit code 1 if the report prints anything that is not calibrated.

Checks are plain functions in ``CHECKS`` (design, n_studies, rng) -> rows; add yours there.
The scaling laws' checks come from ``scale_fpt.analysis.coverage.law_checks``, at the design
of every preset that fits a law.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from dataclasses import dataclass

import numpy as np
from scipy import stats as sp

from scale_fpt.analysis import coverage
from scale_fpt.analysis.means import MEANS_FORMS
from scale_fpt.config import TrialConfig
from scale_fpt.recipes.studies import STUDIES
from scale_fpt.report import stats

TOLERANCE_Z = 3.291
"""Binomial tolerance: a rate within this many Monte Carlo errors of nominal (99.9%: with
some 50 rows, one in 20 runs of a perfectly calibrated report would flag a row at 99%)."""
NEVER_SHARE = 0.1
"""Share of simulated seeds that diverge before reaching the threshold."""
STEPS_SPREAD = 0.6
"""Log-sd of simulated steps to the threshold (seeds of one arm)."""


@dataclass(frozen=True)
class Design:
    """What calibration depends on in a preset."""

    presets: str
    seeds: int
    confirm_seeds: int
    candidates: int
    sizes: int
    budget: int
    eval_every: int


@dataclass(frozen=True)
class Row:
    name: str
    design: str
    nominal: float
    coverage: float
    mc_error: float
    n_studies: int
    kind: str = "interval"
    """'interval' (coverage, two-sided tolerance), 'interval, at least nominal' (coverage,
    one-sided: a conservative interval passes) or 'test' (type-I error, one-sided)."""
    printed: bool = True
    """Whether the report prints this statistic at this design."""

    @property
    def calibrated(self) -> bool:
        if not self.n_studies:  # a statistic with no degree of freedom at this design
            return False
        tolerance = TOLERANCE_Z * math.sqrt(self.nominal * (1 - self.nominal) / self.n_studies)
        if self.kind == "test":
            return self.coverage <= self.nominal + tolerance
        if self.kind == "interval, at least nominal":
            return self.coverage >= self.nominal - tolerance
        return abs(self.coverage - self.nominal) <= tolerance


def rate(hits, n: int) -> tuple[float, float]:
    p = float(np.mean(hits))
    return p, math.sqrt(max(p * (1 - p), 1 / n) / n)


def preset_values(sweep, key: str) -> list:
    """Every value ``key`` takes in a preset: its base, grid and overrides."""
    values = [sweep.base[key]] if key in sweep.base else []
    values += list(sweep.grid.get(key, []))
    values += [change[key] for _, change in sweep.overrides if key in change]
    return values


def preset_designs() -> list[Design]:
    """One design per distinct (seeds, confirmation seeds, candidates, sizes, budget, eval
    interval) over the shipped presets, naming the presets that share it."""
    defaults = TrialConfig().to_flat()
    found: dict[tuple, list[str]] = {}
    for study_name, study in STUDIES.items():
        for preset_name, make in study.presets.items():
            sweep = make()
            budgets = preset_values(sweep, "max_steps") or [defaults["max_steps"]]
            evals = preset_values(sweep, "eval_every") or [defaults["eval_every"]]
            candidates = len(sweep.grid.get("lr", [])) or (
                sweep.search_trials if sweep.search else 1
            )
            # The coarsest evaluation grid: fewest evaluations within a budget.
            budget = min(budgets)
            key = (
                len(sweep.seeds),
                len(sweep.confirm_seeds),
                candidates,
                len(sweep.grid.get("model", [None])),
                int(budget),
                int(min(max(evals), budget)),
            )
            found.setdefault(key, []).append(f"{study_name}/{preset_name}")
    return [Design(", ".join(names), *key) for key, names in found.items()]


def label(design: Design) -> str:
    confirm = f"+{design.confirm_seeds} confirm" if design.confirm_seeds else ""
    return (
        f"{design.seeds} seeds{confirm}, {design.candidates} lr, {design.sizes} sizes, "
        f"{design.budget} steps/{design.eval_every}"
    )


def depends(*fields: str):
    """Declares the design fields a check's outcome depends on: designs that agree on them
    are checked once (``run``)."""

    def mark(check):
        check.depends = fields
        return check

    return mark


# --------------------------------------------------------------------------- checks


@depends("seeds")
def accuracy_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Cell mean t interval, paired-t interval and test, d_z's exact interval, the exact
    sign-flip test and Welch's interval (unequal spreads) at the design's seeds."""
    n = design.seeds
    truth, delta = 70.0, 2.0
    cover = {k: [] for k in ("cell", "paired", "t_null", "d_z", "flip_null", "welch")}
    for _ in range(n_studies):
        shared = rng.normal(0, 3, n)  # a seed's streams move both arms together
        a = truth + delta + shared + rng.normal(0, 2, n)
        b = truth + shared + rng.normal(0, 2, n)
        cell = stats.summarize(a)
        cover["cell"].append(cell["ci_low"] <= truth + delta <= cell["ci_high"])
        pair = stats.paired_difference(dict(enumerate(a)), dict(enumerate(b)))
        cover["paired"].append(pair["ci_low"] <= delta <= pair["ci_high"])
        effect = delta / (2 * math.sqrt(2))
        cover["d_z"].append(pair["d_z_low"] <= effect <= pair["d_z_high"])
        null = stats.paired_difference(dict(enumerate(b + rng.normal(0, 2, n))), dict(enumerate(b)))
        cover["t_null"].append(null["p_t"] < stats.ALPHA)
        cover["flip_null"].append(null["p_sign_flip"] < stats.ALPHA)
        welch = stats.welch_difference(truth + rng.normal(0, 1, n), truth + rng.normal(0, 3, n))
        cover["welch"].append(welch["ci_low"] <= 0 <= welch["ci_high"])
    name = f"{n} seeds"
    flip_printed = stats.smallest_sign_flip_p(n) < stats.ALPHA
    specs = (
        ("cell mean: Student-t 95% interval", "cell", 0.95, "interval", True),
        ("paired difference: paired-t 95% interval", "paired", 0.95, "interval", True),
        ("paired t-test (level 0.05)", "t_null", 0.05, "test", True),
        ("d_z: exact noncentral-t 95% interval", "d_z", 0.95, "interval", True),
        ("sign-flip test, exact (level 0.05)", "flip_null", 0.05, "test", flip_printed),
        ("Welch 95% interval (sd 1 vs 3)", "welch", 0.95, "interval", True),
    )
    return [
        Row(title, name, nominal, *rate(cover[key], n_studies), n_studies, kind, printed)
        for title, key, nominal, kind, printed in specs
    ]


def steps_sample(design: Design, n: int, median: float, rng) -> tuple:
    """(steps, reached, never) of n simulated seeds: log-normal steps to the threshold read
    at the next evaluation, censored at the budget; ``NEVER_SHARE`` diverge at a random
    step before reaching it."""
    raw = median * np.exp(rng.normal(0, STEPS_SPREAD, n))
    steps = np.ceil(raw / design.eval_every) * design.eval_every
    never = rng.random(n) < NEVER_SHARE
    reached = (steps <= design.budget) & ~never
    ended = np.ceil(rng.random(n) * steps / design.eval_every) * design.eval_every
    last = np.where(never, np.minimum(ended, design.budget), design.budget)
    return np.where(reached, steps, last), reached, never


def true_median(design: Design, median: float) -> float:
    """The step at which half of all seeds (divergent ones never) have reached the
    threshold, on the evaluation grid."""
    share = 0.5 / (1 - NEVER_SHARE)
    raw = median * math.exp(STEPS_SPREAD * sp.norm.ppf(share))
    return math.ceil(raw / design.eval_every) * design.eval_every


@depends("seeds", "budget", "eval_every")
def steps_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Kaplan-Meier median interval coverage, and the log-rank test's type-I error, exact
    (printed) and asymptotic (not printed), at the design's seeds and evaluation grid."""
    n = design.seeds
    median = design.budget / 4
    truth = true_median(design, median)
    km, exact, asymptotic = [], [], []
    for _ in range(n_studies):
        a = steps_sample(design, n, median, rng)
        b = steps_sample(design, n, median, rng)
        survival = stats.steps_survival(*a)
        km.append(survival["median_low"] <= truth <= survival["median_high"])
        test = stats.steps_logrank(a[0], a[1], b[0], b[1], a[2], b[2])
        exact.append(test["p"] < stats.ALPHA)
        asymptotic.append(test["p_asymptotic"] < stats.ALPHA)
    name = f"{n} seeds, {design.budget} steps, evaluated every {design.eval_every}"
    return [
        Row("Kaplan-Meier median: log-log 95% interval", name, 0.95, *rate(km, n_studies),
            n_studies, "interval", n >= stats.KM_INTERVAL_MIN_SEEDS),
        Row("log-rank, exact permutation (level 0.05)", name, 0.05, *rate(exact, n_studies),
            n_studies, "test", True),
        Row("log-rank, asymptotic (level 0.05)", name, 0.05, *rate(asymptotic, n_studies),
            n_studies, "test", False),
    ]  # fmt: skip


@depends("seeds", "confirm_seeds", "candidates")
def selection_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Every candidate lr equally good: how often the chosen one's t interval covers its
    true mean on the selection seeds (the winner's curse) and on the confirmation seeds (the
    LR-fair headline)."""
    if design.candidates < 2 or not design.confirm_seeds:
        return []
    truth = 70.0
    selection, confirmation = [], []
    for _ in range(n_studies):
        scores = truth + rng.normal(0, 2, (design.candidates, design.seeds))
        chosen = scores[np.argmax(scores.mean(1))]
        cell = stats.summarize(chosen)
        selection.append(cell["ci_low"] <= truth <= cell["ci_high"])
        fresh = stats.summarize(truth + rng.normal(0, 2, design.confirm_seeds))
        confirmation.append(fresh["ci_low"] <= truth <= fresh["ci_high"])
    name = f"{design.candidates} lr x {design.seeds} seeds, {design.confirm_seeds} confirmation"
    return [
        Row("chosen lr's mean on its selection seeds: t interval", name, 0.95,
            *rate(selection, n_studies), n_studies, "interval", False),
        Row("chosen lr's mean on confirmation seeds: t interval (headline)", name, 0.95,
            *rate(confirmation, n_studies), n_studies, "interval", True),
    ]  # fmt: skip


CHECKS = [accuracy_checks, steps_checks, selection_checks]
"""Each: (design, n_studies, rng) -> list of Row, marked with ``depends``. Add a check by
appending it."""


def law_rows(designs: list[coverage.Design], n_studies: int, seed: int) -> list[Row]:
    """The scaling laws' rows (``coverage.law_checks``) at each design that fits a law, for
    each form an analysis plan may declare. The report prints a law's interval only where
    its check passes at the arm's own design (``calibrated``); an interval with no degree of
    freedom there is printed as "not identified". Conservative intervals (coverage above
    nominal) are valid, so these rows are judged one-sided."""
    return [
        Row(f"{r['name']} ({form})", r["design"], r["nominal"], r["coverage"], r["mc_error"],
            r["n_studies"], "interval, at least nominal", bool(r["calibrated"]))
        for design in designs
        for form in MEANS_FORMS
        for r in coverage.law_checks(design, n_studies, seed, form)
    ]  # fmt: skip


def run(
    n_studies: int,
    seed: int = 0,
    designs: list[Design] | None = None,
    law_designs: list[coverage.Design] | None = None,
) -> list[Row]:
    """Every check at ``designs`` (default: every shipped preset's) and the scaling laws'
    at ``law_designs`` (default: every preset that fits a law)."""
    designs = preset_designs() if designs is None else designs
    if law_designs is None:
        law_designs = list(coverage.preset_designs(STUDIES).values())
    rng = np.random.default_rng(seed)
    rows = []
    for check in CHECKS:
        seen = set()
        for design in designs:
            key = tuple(getattr(design, f) for f in check.depends)
            if key not in seen:
                seen.add(key)
                rows += check(design, n_studies, rng)
    return rows + law_rows(law_designs, n_studies, seed)


def table(rows: list[Row]) -> str:
    lines = [
        "| statistic | design | nominal | coverage / type-I | MC error | studies | calibrated "
        "| printed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.design} | {r.nominal:g} | {r.coverage:.3f} | {r.mc_error:.3f} "
            f"| {r.n_studies} | {'yes' if r.calibrated else 'NO'} | "
            f"{'yes' if r.printed else 'no'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=400, help="studies per design (>= 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    designs = preset_designs()
    print(f"calibration, {datetime.date.today().isoformat()}, {args.studies} studies per design")
    for d in designs:
        print(f"- {label(d)}: {d.presets}")
    rows = run(args.studies, args.seed, designs)
    print(table(rows))
    wrong = [r for r in rows if r.printed and not r.calibrated]
    for r in wrong:
        print(f"PRINTED BUT NOT CALIBRATED: {r.name} at {r.design}: {r.coverage:.3f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
