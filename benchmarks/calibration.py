"""Calibration of every interval and test the report prints, at the design of every shipped
preset: studies simulated from known truths, each statistic's coverage (intervals) or
type-I error (tests) with its Monte Carlo error, and whether the report prints it there.

    python benchmarks/calibration.py [--studies 1100] [--seed 0] [--only CHECK]
    python benchmarks/calibration.py --plan N | --shard K/N --out F.json | --merge F.json...

The full run (at most 16 core-hours here, about 8 summed by design) is a job of tasks of at most 100 studies, shared
out to N shards by projected time and merged (``calibration_jobs``; docs/statistics.md).

A design is read from each preset of ``scale_fpt.recipes.studies.STUDIES`` (never written here):
its seeds per arm, confirmation seeds, learning-rate candidates, model sizes and its
coarsest (budget, evaluation interval). Seed noise is normal; steps to a threshold are
log-normal, read at the preset's evaluation steps, censored at its budget, and 10% of seeds
diverge (they never reach it). A statistic is *calibrated* when its coverage is within the
one-sided binomial test rejects a coverage 0.03 below nominal (a type-I error 0.03 above it)
at level 0.05, so that a 0.92 interval or a 0.08 test fails at least 95% of the time at any
number of studies (``analysis.coverage.shows_calibrated``); a two-sided interval must also
not over-cover by more than ``TOLERANCE_Z`` Monte Carlo errors. Each row also says whether the report prints
the statistic at that design (its rule in ``scale_fpt.report.stats``); the run ends with
exit code 1 if the report prints anything that is not calibrated.

Checks are plain functions in ``CHECKS`` (design, n_studies, rng) -> rows, each row a rate
over independent studies (chunks of studies merge), the same rows in the same order
whatever the studies show; add yours there, with its ``SECONDS_PER_STUDY``.
The scaling laws' checks come from ``scale_fpt.analysis.coverage.law_checks``, at the design
of every preset that fits a law.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import calibration_jobs as jobs
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats as sp

from scale_fpt import analysis_plan
from scale_fpt.analysis import coverage
from scale_fpt.analysis.means import MEANS_FORMS, fit_size_means
from scale_fpt.analysis_plan import PLAN_FILE, AnalysisPlan
from scale_fpt.compaction import part_name
from scale_fpt.config import TrialConfig
from scale_fpt.recipes.studies import STUDIES
from scale_fpt.report import figures, stats, tables
from scale_fpt.report import scaling_laws as laws
from scale_fpt.report.comparisons import Comparisons, findings_display
from scale_fpt.report.sections import contrasts_display
from scale_fpt.report.tables.differences import LEARNED_MARGIN, MIXED_MIN_PAIRS, task_baseline
from scale_fpt.report.tables.matched import MATCHES
from scale_fpt.results import ResultsWriter, load_results, write_atomic
from scale_fpt.results_schema import SCHEMAS
from scale_fpt.results_schema import table as rows_table
from scale_fpt.vocabulary import CONFIRM_SUFFIX

TOLERANCE_Z = 2.326
"""Over-coverage allowed a two-sided interval row: this many Monte Carlo errors above
nominal (a calibrated row fails this side 1% of runs)."""
N_STUDIES = 1100
"""Studies per design of a full run: where every study prints the statistic, a calibrated
row passes ``coverage.shows_calibrated`` 99% of the time (a 0.92 interval or a 0.08 test
fails it at least 95% of the time at any number of studies)."""
QUICK_STUDIES = 150
"""``--quick``: catches gross failures (a planted defect); a calibrated row fails often
(too few studies to show it calibrated)."""
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
    one-sided: a conservative interval passes), 'test' (type-I error, one-sided), 'never' /
    'always' (a share that must be 0 / 1: zero-wide intervals, BH over the whole family) or
    'within 20%' (a predicted / simulated ratio)."""
    printed: bool = True
    """Whether the report prints this statistic at this design."""

    @property
    def calibrated(self) -> bool:
        if not self.n_studies:  # a statistic with no degree of freedom at this design
            return False
        tolerance = TOLERANCE_Z * math.sqrt(self.nominal * (1 - self.nominal) / self.n_studies)
        if self.kind == "never":  # e.g. zero-wide 95% intervals printed
            return self.coverage == 0
        if self.kind == "always":  # e.g. BH over the whole family
            return self.coverage == 1
        if self.kind == "within 20%":  # a ratio of prediction to simulation
            return abs(self.coverage - 1) <= 0.2
        # However few the studies, a rate 0.03 off nominal on the wrong side passes at most
        # 5% of the time (``coverage.shows_calibrated``).
        k = round(self.coverage * self.n_studies)
        if self.kind == "test":
            return coverage.shows_calibrated(k, self.n_studies, self.nominal, "level")
        shown = coverage.shows_calibrated(k, self.n_studies, self.nominal, "coverage")
        if self.kind == "interval, at least nominal":
            return shown
        return shown and self.coverage <= self.nominal + tolerance

    @property
    def off_nominal(self) -> bool:
        """A gross failure, the verdict of ``--quick`` (too few studies to show a right rate
        calibrated): not calibrated and more than 3 Monte Carlo errors of nominal off on the
        wrong side (or a share that must be 0 / 1, a ratio, failing at all)."""
        if self.calibrated or not self.n_studies:
            return not self.n_studies
        if self.kind in ("never", "always", "within 20%"):
            return True
        error = 3 * math.sqrt(self.nominal * (1 - self.nominal) / self.n_studies)
        if self.kind == "test":
            return self.coverage > self.nominal + error
        return self.coverage < self.nominal - error


def rate(hits, n: int) -> tuple[float, float]:
    if not len(hits):  # nothing printed to score
        return math.nan, math.nan
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
        # Welch-Satterthwaite is conservative at a few seeds of unequal spread: it says
        # less, nothing false.
        ("Welch 95% interval (sd 1 vs 3)", "welch", 0.95, "interval, at least nominal", True),
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


# --------------------------------------------------------------------------- results folders
# The report as assembled: results folders written with the project's own writer at a
# preset's design, read back with ``load_results`` and handed to the functions
# ``build_report`` calls (``Comparisons.compute`` and its findings, the tables' texts,
# ``scaling_laws``, ``analysis.power``), every printed number scored against the truth.

STEPS_MEDIAN = 0.25
"""Median steps to the threshold of a folder's seeds, as a share of the budget: the same in
both inits (no effect on steps)."""
FAMILY = "accuracy: pretrained - random"
SEARCH = "s"
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
"""Where simulated folders are written: memory, where the machine has it (a results file's
``fsync`` is then free; the files and their reads are the same)."""
INTERVAL_PATTERN = re.compile(r"\[(?:95% CI )?([+\-]?[\d,.]+), ([+\-]?[\d,.]+)\]")
"""A printed interval '[a, b]' or '[95% CI a, b]'."""


@dataclass(frozen=True)
class Truth:
    """One task of a simulated folder: the random arm's accuracy (%), the pretrained -
    random effect (points), seed noise in points (or, ``relative``, as a share of the
    error), and the share of random seeds that learn (the others stay at the task's
    baseline, its registry entry's). A seed's streams move both inits alike (``shared``)."""

    task: str
    name: str
    random: float
    effect: float
    noise: float
    relative: bool = False
    learns: float = 1.0

    def accuracy(self, pretrained: bool, shared: float, rng) -> float:
        mean = self.random + self.effect * pretrained
        if self.relative:
            error = (100 - mean) * math.exp(shared + rng.normal(0, self.noise))
            return float(np.clip(100 - error, 0, 100))
        if not pretrained and rng.random() >= self.learns:
            return task_baseline(self.task) + rng.normal(0, 0.5)
        return float(np.clip(mean + shared + rng.normal(0, self.noise), 0, 100))

    @property
    def difference(self) -> float:
        """The true pretrained - random difference of mean accuracy (points)."""
        if self.relative:  # E[exp(N(0, s))] = exp(s²/2) on each arm's error
            return self.effect * math.exp(self.noise**2)
        return self.effect + (1 - self.learns) * (self.random - task_baseline(self.task))

    def claimed(self, diff: float, n: int) -> float:
        """What a printed interval of ``n`` pairs claims to cover (``differences.learn_or_not``):
        below ``MIXED_MIN_PAIRS`` pairs an interval is printed only where every seed of each
        arm had one outcome (all learned, or all at the task's baseline), and it is of that
        outcome: here ``effect`` or the pretrained arm minus the baseline. Which one the seeds
        were seen in is the one nearer the printed difference ``diff``: they lie ``random -
        baseline`` (30) points apart, a pair's SD is 1.5. Elsewhere, the mean difference."""
        if self.learns == 1 or n >= MIXED_MIN_PAIRS:
            return self.difference
        outcomes = (self.effect, self.random + self.effect - task_baseline(self.task))
        return min(outcomes, key=lambda truth: abs(diff - truth))

    @property
    def sd_difference(self) -> float:
        """The true SD of a pair's difference where the noise is normal in points (else NaN)."""
        normal = not self.relative and self.learns == 1 and self.noise > 0
        return self.noise * math.sqrt(2) if normal else math.nan


FOLDER_TRUTHS = (
    Truth("bit-xor", "no effect, 3 pp noise", 80.0, 0.0, 3.0),
    Truth("bit-memory", "+5 pp, 3 pp noise", 85.0, 5.0, 3.0),
    Truth("listops", "+10 pp, noise 10% of the error", 30.0, 10.0, 0.1, relative=True),
    Truth("mnist", "every seed at the 100% ceiling", 100.0, 0.0, 0.0),
    Truth("cifar10", "learn or not: half the random seeds stay at chance", 40.0, 0.0, 1.0,
          learns=0.5),
)  # fmt: skip
"""One task per truth in every folder: the family "accuracy: pretrained - random" spans
them, as it spans a preset's tasks."""


class SweepWriter:
    """A simulated sweep as its driver leaves it once every trial has ended: the folder
    ``ResultsWriter`` makes, and its trials' and curves' rows in one compacted file each
    (what ``ResultsWriter.compact`` writes; ``load_results`` reads them as it reads a
    finished sweep), written when the ``with`` block ends: one write a table, not one a
    trial."""

    def __init__(self, root: Path, sweep: str):
        self.sweep = sweep
        self.root = ResultsWriter(root, sweep).root
        self.rows: dict[str, list[dict]] = {name: [] for name in SCHEMAS}

    def write_trial(self, row: dict) -> None:
        self.rows["trials"].append({**row, "sweep": self.sweep})

    def write_curve(self, trial_id: str, rows: list[dict]) -> None:
        self.rows["curves"] += [{**r, "sweep": self.sweep, "trial_id": trial_id} for r in rows]

    def __enter__(self) -> SweepWriter:
        return self

    def __exit__(self, *exc) -> None:
        for name, rows in self.rows.items():
            if rows and exc[0] is None:
                write_atomic(rows_table(rows, SCHEMAS[name]), self.root / name / part_name())


def trial_row(
    sweep: str, truth: Truth, init: str, lr: float, seed: int, design, acc, val, steps=None
):
    """One trial's row as the driver writes it (every column the report reads). ``steps``:
    (step, reached, never) of ``steps_sample`` (default: reached at the first evaluation);
    a seed that did not learn never reaches the threshold."""
    flat = {**TrialConfig().to_flat(), "task": truth.task, "model": "gpt2", "init": init,
            "finetune": "fpt", "lr": lr, "seed": seed, "max_steps": design.budget,
            "eval_every": design.eval_every}  # fmt: skip
    step, reached, never = steps or (design.eval_every, True, False)
    reached = reached and acc >= task_baseline(truth.task) + LEARNED_MARGIN
    return {
        **flat,
        "trial_id": f"{sweep}-{truth.task}-{init}-{lr:g}-{seed}",
        "status": "completed",
        "steps_done": design.budget if reached or not never else step,
        "stop_reason": "patience" if never and not reached else "budget",
        "best_val_accuracy": val / 100,
        "val_accuracy": val / 100,
        "test_accuracy": acc / 100,
        "selected_step": design.budget,
        "steps_to_threshold": step if reached else None,
        "final_test_accuracy": acc / 100,
        "best_test_accuracy": acc / 100,
        "total_params": 1.24e8,
        "trainable_params": 1e5,
        "wall_time_s": 10.0,
        "samples_seen": 1000,
        "total_flops": 1e15,
    }


def write_folder(
    root: Path, design: Design, rng, truths=FOLDER_TRUTHS, sweep=SEARCH, first_seed: int = 0
) -> None:
    """A sweep ``sweep`` at ``design`` (its seeds from ``first_seed`` on, lr candidates, budget
    and evaluation grid) over ``truths`` (one task each), its analysis plan declaring
    ``FAMILY``, and, where the design has
    candidates and confirmation seeds, its confirmation sweep: each arm's chosen rate
    (``tables.lr_fair``, the report's choice) re-run on fresh seeds."""
    lrs = [1e-4 * 10 ** (i / 2) for i in range(design.candidates)]
    seeds = range(first_seed, first_seed + design.seeds)
    confirm_seeds = range(first_seed + 100, first_seed + 100 + design.confirm_seeds)
    plan = AnalysisPlan(sweep=sweep, families={FAMILY: ["pretrained - random"]},
                        seeds={"selection": list(seeds), "confirmation": list(confirm_seeds)})  # fmt: skip

    def write(w, truth, lr, seed_list, inits):
        for seed in seed_list:
            shared = rng.normal(0, truth.noise)
            for init in inits:
                acc = truth.accuracy(init == "pretrained", shared, rng)
                val = float(np.clip(acc + rng.normal(0, max(truth.noise, 0.5) / 2), 0, 100))
                step, reached, never = steps_sample(design, 1, STEPS_MEDIAN * design.budget, rng)
                steps = (int(step[0]), bool(reached[0]), bool(never[0]))
                w.write_trial(trial_row(w.sweep, truth, init, lr, seed, design, acc, val, steps))

    with SweepWriter(root, sweep) as writer:
        (root / sweep / PLAN_FILE).write_text(json.dumps(dataclasses.asdict(plan)))
        for truth in truths:
            for lr in lrs:
                write(writer, truth, lr, seeds, ("pretrained", "random"))
    if design.candidates < 2 or not design.confirm_seeds:
        return
    trials = load_results(root).trials
    chosen = tables.lr_fair(trials[trials["sweep"] == sweep])
    by_task = {t.task: t for t in truths}
    with SweepWriter(root, f"{sweep}{CONFIRM_SUFFIX}") as confirm:
        for arm in chosen.to_dict("records"):
            if np.isfinite(arm["best_lr"]):
                write(confirm, by_task[arm["task"]], arm["best_lr"], confirm_seeds, (arm["init"],))


def scratch() -> tempfile.TemporaryDirectory:
    """A simulated results folder, removed after its study."""
    return tempfile.TemporaryDirectory(dir=SCRATCH, prefix="calibration-")


def family_tests(init: pd.DataFrame, lr: pd.DataFrame, family: str) -> list[tuple]:
    """(task, p, BH-adjusted p) of each test of the declared ``family`` in the
    pretrained-random (``init``) and LR-fair (``lr``) tables, a test both show counted once."""
    members = []
    if not init.empty:
        mine = init[init["accuracy_family"] == family]
        members += zip(mine["task"], mine["accuracy_p"], mine["accuracy_p_adjusted"], strict=True)
    if not lr.empty:
        mine = lr[lr["family"] == family]
        members += zip(mine["task"], mine["p"], mine["p_adjusted"], strict=True)
    return list(dict.fromkeys((t, p, a) for t, p, a in members if np.isfinite(p)))


def zero_wide(texts) -> int:
    """Printed intervals '[a, a]' in ``texts``."""
    return sum(a == b for text in texts for a, b in INTERVAL_PATTERN.findall(str(text)))


@depends("seeds", "confirm_seeds", "candidates", "budget", "eval_every")
def folder_checks(design: Design, n_studies: int, rng, truths=FOLDER_TRUTHS) -> list[Row]:
    """Simulated results folders through the report's comparisons (module section above):
    per truth, the coverage of every printed pretrained - random interval (both tables) of
    what it claims (``Truth.claimed``; where seeds learn or not, also of the mean over their
    chance to learn, which it does not claim) and the paired t's level where there is no
    effect; zero-wide intervals printed anywhere;
    BH-adjusted p against BH over the whole declared family (its level: ``bh_checks``); each
    row's status against its note; and the printed detectable difference against
    the one the true SD gives (at least ``stats.ASSURANCE`` of the statements)."""
    cover = {t.name: [] for t in truths}
    lottery = []  # learn-or-not intervals against the mean over seeds' chance to learn
    steps_cover, steps_null, medians = [], [], []
    power_range, power_family = [], []
    median_truth = true_median(design, STEPS_MEDIAN * design.budget)
    null_p, zero, texts, bh, status, power = [], 0, 0, [], [], []
    by_task = {t.task: t for t in truths}
    for _ in range(n_studies):
        with scratch() as tmp:
            write_folder(Path(tmp), design, rng, truths)
            results = load_results(tmp)
            plans = analysis_plan.plans(tmp, sorted(set(results.trials["sweep"])))
        found = Comparisons.compute(results.trials, results.curves, tables.DEFAULT_METRIC,
                                    None, plans)  # fmt: skip
        init, lr = found.init, found.lr
        rows = [(r, "accuracy_", by_task[r["task"]]) for r in init.to_dict("records")]
        if not lr.empty:
            lr = lr[lr["contrast"] == "pretrained - random"]
            rows += [(r, "", by_task[r["task"]]) for r in lr.to_dict("records")]
        statements = []  # this study's "detects X pp", scored once its family is known
        for r, prefix, truth in rows:
            if "[" in tables.interval_text(r, prefix):
                low, high = r[f"{prefix}ci_low"], r[f"{prefix}ci_high"]
                n = int(r[f"{prefix}n"])
                cover[truth.name].append(low <= truth.claimed(r[f"{prefix}diff"], n) <= high)
                if truth.learns < 1:
                    lottery.append(low <= truth.difference <= high)
            p = r[f"{prefix}p"]
            if truth.difference == 0 and truth.learns == 1 and np.isfinite(p):
                null_p.append(p < stats.ALPHA)
            if np.isfinite(truth.sd_difference) and np.isfinite(r[f"{prefix}detectable"]):
                statements.append((r, prefix, truth))
        # Steps to the threshold: the same law in both inits wherever every seed learns.
        for r in init.to_dict("records"):
            if by_task[r["task"]].learns < 1:
                continue
            if "[" in tables.interval_text(r, "steps_"):
                steps_cover.append(r["steps_ci_low"] <= 0 <= r["steps_ci_high"])
            if np.isfinite(r["steps_p"]):
                steps_null.append(r["steps_p"] < stats.ALPHA)
            for s in ("pretrained", "random"):
                if r[f"n_{s}"] >= stats.KM_INTERVAL_MIN_SEEDS:  # printed with its interval
                    low, high = r[f"steps_median_{s}_low"], r[f"steps_median_{s}_high"]
                    medians.append(low <= median_truth <= high)
        shown = [tables.difference_text(r) for r in init.to_dict("records")]
        findings = found.findings({})
        shown += list(findings_display(findings)["difference (pp) [95% CI]"])
        if not lr.empty:
            shown += list(contrasts_display(lr)["difference [95% CI]"])
        zero += zero_wide(shown)
        texts += len(shown)
        # BH over the declared family, a test both tables show counted once.
        family = f"{SEARCH}: {FAMILY}"
        tested = family_tests(init, lr, family)
        unique = sorted({p for _, p, _ in tested})
        expected = dict(zip(unique, stats.adjust_p(unique), strict=True))
        bh += [math.isclose(a, expected[p], rel_tol=1e-9) for _, p, a in tested]
        # "Detects X pp": at the SD's upper bound, its range over the SD's interval, and at
        # the level 0.05 / m of the family's m tests, each against the true SD's.
        for r, prefix, truth in statements:
            n = int(r[f"{prefix}n"])
            true = stats.detectable_difference(truth.sd_difference, n)
            power.append(r[f"{prefix}detectable"] >= true)
            power_range.append(
                r[f"{prefix}detectable_low"] <= true <= r[f"{prefix}detectable_high"]
            )
            m = len(unique) if r[f"{prefix}family" if prefix else "family"] == family else 1
            alpha = stats.ALPHA / max(m, 1)
            at_family = stats.detectable_difference(truth.sd_difference, n, alpha=alpha)
            power_family.append(r[f"{prefix}detectable_family"] >= at_family)
        for r in findings.to_dict("records"):
            if str(r["note"]).startswith("exploratory"):
                status.append(r["status"] == "exploratory")
    name = label(design)
    out = [
        Row(f"pretrained - random: printed 95% interval, {t.name}", name, 0.95,
            *rate(cover[t.name], len(cover[t.name]) or 1), len(cover[t.name]), "interval",
            bool(cover[t.name]))
        for t in truths
    ]  # fmt: skip
    return [
        *out,
        # What the intervals do not claim (``Truth.claimed``): at a few seeds that agree, a
        # task whose seeds learn or not looks like one whose seeds all learn (or none).
        Row("learn or not: printed intervals against the mean over the seeds' chance to learn "
            "(not their claim)", name, 0.95, *rate(lottery, len(lottery) or 1), len(lottery),
            "interval", False),
        Row("steps to threshold, no effect: printed 95% interval of the difference", name,
            0.95, *rate(steps_cover, len(steps_cover) or 1), len(steps_cover), "interval",
            bool(steps_cover)),
        Row("steps to threshold, no effect: log-rank (level 0.05)", name, 0.05,
            *rate(steps_null, len(steps_null) or 1), len(steps_null), "test", bool(steps_null)),
        Row("Kaplan-Meier median: printed 95% interval", name, 0.95,
            *rate(medians, len(medians) or 1), len(medians), "interval", bool(medians)),
        Row("pretrained - random: paired t-test, no effect (level 0.05)", name, 0.05,
            *rate(null_p, len(null_p) or 1), len(null_p), "test", True),
        Row("zero-wide 95% intervals printed (share of texts)", name, 0.0,
            zero / max(texts, 1), 0.0, n_studies, "never", True),
        Row("BH-adjusted p = BH over the whole declared family", name, 1.0,
            float(np.mean(bh)) if bh else 1.0, 0.0, n_studies, "always", True),
        Row("status 'exploratory' where the note says so", name, 1.0,
            float(np.mean(status)) if status else 1.0, 0.0, n_studies, "always", True),
        Row(f"detectable difference at or above the true SD's ({stats.ASSURANCE:.0%} of "
            "statements)", name, stats.ASSURANCE, *rate(power, len(power) or 1), len(power),
            "interval, at least nominal", bool(power)),
        Row("detectable difference: its range over the SD's 95% interval holds the true SD's",
            name, 0.95, *rate(power_range, len(power_range) or 1), len(power_range), "interval",
            bool(power_range)),
        Row(f"detectable difference at the family's level 0.05 / m at or above the true SD's "
            f"({stats.ASSURANCE:.0%})", name, stats.ASSURANCE,
            *rate(power_family, len(power_family) or 1), len(power_family),
            "interval, at least nominal", bool(power_family)),
    ]  # fmt: skip


BH_TASKS = ("bit-xor", "bit-memory", "listops", "mnist")
"""The tasks of a BH folder's sweeps, each at 2 learning rates: a family of 8 contrasts (and
the confirmation's, at a design with confirmation seeds)."""
BH_FOLDER = {"null": 0, "mixed": 1}
"""Sweep -> how many of ``BH_TASKS`` (the last ones) have a real effect (``BH_EFFECT``): a
family whose every contrast is null, and one that mixes 6 null contrasts with 2 real ones.
Sweep k runs seeds from 1000 k on (two sweeps of the same trials would be one study run
twice)."""
BH_EFFECT = 15.0
"""The real pretrained - random effect (points) of a mixed family, seed noise 3 points."""


def bh_truths(effects: int) -> tuple[Truth, ...]:
    k = len(BH_TASKS) - effects
    return tuple(Truth(task, "real effect" if i >= k else "no effect", 80.0,
                       BH_EFFECT * (i >= k), 3.0) for i, task in enumerate(BH_TASKS))  # fmt: skip


@depends("seeds", "confirm_seeds")
def bh_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Benjamini-Hochberg's level where the report prints it: folders of the ``BH_FOLDER``
    sweeps (one declared family each, at the design's seeds and confirmation seeds) through
    ``Comparisons.compute``, the rejections read from its BH-adjusted p (both tables, a test
    counted once): in the family whose every contrast is null, how often any is rejected
    (the family-wise error, which BH holds at 0.05 there), and in the mixed family the
    false discovery rate, the share of false rejections among rejections averaged over
    studies (BH holds it at 0.05 x the null share; a family-wise error of the mixed family's
    nulls is no claim BH makes)."""
    bh_design = dataclasses.replace(design, candidates=2)
    any_false, fdr = [], []
    for _ in range(n_studies):
        with scratch() as tmp:
            for k, (sweep, effects) in enumerate(BH_FOLDER.items()):
                write_folder(Path(tmp), bh_design, rng, bh_truths(effects), sweep, 1000 * k)
            results = load_results(tmp)
            plans = analysis_plan.plans(tmp, sorted(set(results.trials["sweep"])))
        found = Comparisons.compute(results.trials, results.curves, tables.DEFAULT_METRIC,
                                    None, plans)  # fmt: skip
        for sweep, effects in BH_FOLDER.items():
            null = {t.task for t in bh_truths(effects) if t.difference == 0}
            tests = family_tests(found.init, found.lr, f"{sweep}: {FAMILY}")
            rejected = [task for task, _, adjusted in tests if adjusted < stats.ALPHA]
            false = sum(task in null for task in rejected)
            if effects:
                fdr.append(false / max(1, len(rejected)))
            else:
                any_false.append(false > 0)
    name = f"{design.seeds} seeds" + (f"+{design.confirm_seeds} confirm" if design.confirm_seeds
                                      else "") + f", {len(BH_TASKS)} tasks x 2 lr"  # fmt: skip
    return [
        Row("BH-adjusted p, family of null contrasts: any rejected (level 0.05)", name, 0.05,
            *rate(any_false, n_studies), n_studies, "test", True),
        Row("BH-adjusted p, family of 6 null and 2 real contrasts: false discovery rate "
            "(level 0.05)", name, 0.05, *rate(fdr, n_studies), n_studies, "test", True),
    ]  # fmt: skip


CURVE_TRUTH = (55.0, 90.0, 0.3, 3.0, 1.0)
"""A seed's validation curve (%): from 55 towards 90 with time constant 0.3 of the budget,
a seed offset of sd 3 points kept over its steps and evaluation noise of sd 1; a seed that
stops early (``NEVER_SHARE``, at a uniform evaluation) is carried at its last value, as the
figure carries it."""


def curve_values(design: Design, n: int, rng) -> np.ndarray:
    """(n, evaluations) validation accuracies (%) of n seeds, carried after an early stop."""
    start, top, tau, seed_sd, noise = CURVE_TRUTH
    steps = np.arange(design.eval_every, design.budget + 1, design.eval_every)
    mean = top - (top - start) * np.exp(-steps / (tau * design.budget))
    values = mean + rng.normal(0, seed_sd, (n, 1)) + rng.normal(0, noise, (n, len(steps)))
    stops = np.where(rng.random(n) < NEVER_SHARE, rng.integers(0, len(steps), n), len(steps))
    held = np.take_along_axis(values, np.minimum(stops, len(steps) - 1)[:, None], axis=1)
    return np.where(np.arange(len(steps)) > stops[:, None], held, values)


@depends("seeds", "budget", "eval_every")
def curve_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """The learning-curve figure's 95% band (``figures.learning_curves_figure``, from curves
    rows written with the project's writer and read back) at every evaluation step, against
    the mean of the carried curves it claims (that mean from 200,000 simulated seeds)."""
    steps = np.arange(design.eval_every, design.budget + 1, design.eval_every)
    truth = curve_values(design, 200_000, np.random.default_rng(12345)).mean(axis=0)
    covered = []
    for _ in range(n_studies):
        with scratch() as tmp:
            with SweepWriter(Path(tmp), SEARCH) as writer:
                values = curve_values(design, design.seeds, rng)
                for seed, curve in enumerate(values):
                    stop = int(np.flatnonzero(np.diff(curve) != 0).max(initial=-1)) + 2
                    row = trial_row(SEARCH, FOLDER_TRUTHS[0], "pretrained", 1e-3, seed, design,
                                    curve[-1], curve[-1])  # fmt: skip
                    writer.write_trial(row)
                    writer.write_curve(row["trial_id"], [
                        {"step": int(step), "val_accuracy": v / 100}
                        for step, v in zip(steps[:stop], curve[:stop], strict=True)
                    ])  # fmt: skip
            results = load_results(tmp)
        _, band = figures.learning_curves_figure(results.trials, results.curves, "bit-xor")
        plt.close("all")
        band = band.set_index("step").reindex(steps)
        covered += list((band["ci_low"] <= truth) & (truth <= band["ci_high"]))
    name = f"{design.seeds} seeds, {design.budget} steps, evaluated every {design.eval_every}"
    return [
        Row("learning-curve band: 95% t band at each evaluation (carried seeds)", name, 0.95,
            *rate(covered, n_studies), n_studies, "interval", design.seeds >= 2),
    ]  # fmt: skip


LAW_SWEEPS = ("scale", "ladder")
"""Two sweeps of one folder that ran the same sizes on the same seeds (the same random
streams: ``seeding.py``), as scale-paper and ladder-paper do at gpt2's sizes."""
LAW_TRUTH = {"pretrained": (0.05, 0.3), "random": (0.08, 0.2)}
"""init -> (floor share of the error at the largest size, alpha); error 0.4 at the smallest."""
LAW_NOISE = 0.03
"""Seed noise of a size's error (log sd)."""


def law_folder(root: Path, sizes, seeds: int, rng) -> dict:
    """``LAW_SWEEPS`` written at ``sizes`` x ``seeds`` (frozen gpt2 ladder, both inits);
    returns {init: truth params}. A seed's noise is the same in both sweeps."""
    truths = {init: coverage.truth_params("power_floor", sizes, alpha, share)
              for init, (share, alpha) in LAW_TRUTH.items()}  # fmt: skip
    noise = rng.normal(0, LAW_NOISE, (len(truths), len(sizes), seeds))
    models = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
    for sweep in LAW_SWEEPS:
        with SweepWriter(root, sweep) as writer:
            for i, (init, truth) in enumerate(truths.items()):
                for j, (model, x) in enumerate(zip(models, sizes, strict=True)):
                    for seed in range(seeds):
                        error = (truth["E"] + truth["A"] * x ** -truth["alpha"]) * math.exp(
                            noise[i, j, seed]
                        )
                        row = trial_row(sweep, FOLDER_TRUTHS[0], init, 1e-3, seed,
                                        Design("", seeds, 0, 1, len(sizes), 1000, 100),
                                        100 * (1 - error), 100 * (1 - error))  # fmt: skip
                        row.update(model=model, total_params=x, total_flops=x * 6e6,
                                   trial_id=f"{sweep}-{init}-{model}-{seed}")  # fmt: skip
                        writer.write_trial(row)
    return truths


def law_folder_checks(design: coverage.Design, n_studies: int, rng) -> list[Row]:
    """Folders of ``LAW_SWEEPS`` at a 4-size ladder through the report's scaling section
    (``scaling_points``, ``arm_pairs``, ``gap_change``, ``fit_all``, ``law_table``): the
    measured gap's change between the smallest and largest size against the truth's, and
    every alpha the law table prints as an interval."""
    sizes = np.asarray(design.sizes[:4], dtype=float)
    gap, alpha, repeated, band = [], [], [], []
    band_studies = 0
    for _ in range(n_studies):
        with scratch() as tmp:
            truths = law_folder(Path(tmp), sizes, design.seeds, rng)
            trials = load_results(tmp).trials
        points = laws.scaling_points(trials, tables.DEFAULT_METRIC)
        # The truth: a seed is the same random streams in both sweeps; a law whose n counts
        # one twice is too narrow by an unknown amount.
        twice = points.duplicated(["arm", "total_params", "seed"])
        repeated += list(points.loc[~twice, "arm"].isin(points.loc[twice, "arm"]))
        mean = {init: t["E"] + t["A"] * sizes ** -t["alpha"] for init, t in truths.items()}
        change = (mean["random"] - mean["pretrained"])[[0, -1]] @ np.array([-1.0, 1.0])
        for a, b in laws.arm_pairs(points, "init", "pretrained", "random"):
            _, _, lo, hi = laws.gap_change(points[points["arm"] == a],
                                           points[points["arm"] == b], "total_params")  # fmt: skip
            gap.append(lo <= change <= hi)
        fits = laws.fit_all(points, "power_floor")
        table = laws.law_table(points, fits)
        for r in table.to_dict("records"):
            text = str(r.get("alpha", ""))
            if r.get("axis") == "total parameters" and text.count("[") == 1:
                lo, hi = (float(v) for v in text.split("[")[1].rstrip("]").split(","))
                init = "pretrained" if r["arm"].startswith("pretrained") else "random"
                alpha.append(lo <= truths[init]["alpha"] <= hi)
        # The law figure's band (``curve_frame``: NaN where not drawn) at each size. Its
        # sweeps' arms and a band's sizes are no independent studies: the rule and the Monte
        # Carlo error count the studies that drew one, the rate every size drawn.
        drew = False
        for (_, arm, axis), (fit, _) in fits.items():
            if fit is None or axis != "total_params":
                continue
            truth = truths["pretrained" if arm.startswith("pretrained") else "random"]
            curve = laws.curve_frame(fit, sizes)
            law = truth["E"] + truth["A"] * sizes ** -truth["alpha"]
            drawn = curve["band_lo"].notna().to_numpy()
            band += list(((curve["band_lo"] <= law) & (law <= curve["band_hi"]))[drawn])
            drew |= bool(drawn.any())
        band_studies += drew
    name = f"{len(sizes)} sizes x {design.seeds} seeds, sweeps {' and '.join(LAW_SWEEPS)}"
    return [
        Row("law points whose seed's streams count twice in their arm (share)", name, 0.0,
            float(np.mean(repeated)), 0.0, n_studies, "never", True),
        # Two sweeps' pairs per study: the rule counts studies.
        Row("gap change (Welch), two sweeps on the same seeds in one folder", name, 0.95,
            *rate(gap, n_studies), n_studies, "interval", bool(gap)),
        Row("alpha (power_floor): printed 95% interval", name, 0.95,
            *rate(alpha, len(alpha) or 1), len(alpha), "interval", bool(alpha)),
        Row("law figure: 95% band at each size, where drawn (power_floor)", name, 0.95,
            *rate(band, band_studies or 1), band_studies, "interval, at least nominal",
            bool(band)),
    ]  # fmt: skip


def next_run_checks(design: coverage.Design, n_studies: int, rng) -> list[Row]:
    """``next_runs``' one-more-seed option (as the report's scaling section calls it) at a
    ladder design against simulation: the share of studies where it predicts a narrower
    alpha interval (all of them: one more seed cannot widen it), and its median predicted
    ratio of half-widths against the simulated ratio of median half-widths with one more
    seed (within 20%). Law ``power`` (alpha identified at 4 sizes)."""
    sizes = np.asarray(design.sizes[:4], dtype=float)
    m = design.seeds
    truth = coverage.truth_params("power", sizes, 0.3)
    cost = pd.Series(sizes * 6e6, index=sizes)
    predicted, widths = [], {m: [], m + 1: []}
    for _ in range(n_studies):
        for seeds in (m, m + 1):
            draws, _ = coverage.simulate(truth, sizes, seeds, {"seed_sd": LAW_NOISE,
                                                               "size_sd": 0.0}, 1, rng)  # fmt: skip
            frame = pd.DataFrame({"N": np.repeat(sizes, seeds), "seed": np.tile(range(seeds),
                                  len(sizes)), "error": draws[0].ravel()})  # fmt: skip
            fit = fit_size_means(frame, "error", "N", "power")
            lo, hi = fit.intervals["alpha"]
            widths[seeds].append((hi - lo) / 2)
            if seeds == m:
                options = laws.next_runs(fit, cost)
                seed = options[options["option"].str.startswith("one more seed")].iloc[0]
                predicted.append(seed["half_width_after"] / seed["half_width_now"])
    simulated = float(np.median(widths[m + 1]) / np.median(widths[m]))
    name = f"{len(sizes)} sizes x {m} seeds, power"
    narrows = [p < 1 for p in predicted]
    return [
        Row("next_runs: one more seed narrows alpha's interval (share of studies)", name, 1.0,
            float(np.mean(narrows)), 0.0, n_studies, "always", True),
        Row(f"next_runs: predicted / simulated half-width ratio (simulated {simulated:.3f})",
            name, 1.0, float(np.median(predicted)) / simulated, 0.0, n_studies,
            "within 20%", True),
    ]  # fmt: skip


TRANSFER_SIZES = (1_000, 3_000, 10_000, 30_000)
"""train_examples both inits of a transfer folder ran at (no shipped preset varies them;
the report's section runs wherever a study does)."""
TRANSFER_TRUTH = {"smallest": 0.5, "E": 0.05, "alpha": 0.5, "multiple": 4.0, "noise": 0.03}
"""The random arm's error law E + A D^-alpha (0.5 at the smallest size); the pretrained arm
at D_F errs as the random one at ``multiple`` x D_F, so D_E = 4 D_F (D_T = 3 D_F: the two
largest sizes' D_E lie beyond the random arm's data); seed noise, log sd of the error."""


@depends("seeds")
def effective_data_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Folders of both inits at ``TRANSFER_SIZES`` x the design's seeds through the report's
    transfer section (``scaling_laws.transfer_rows``): at each D_F, how often its D_E
    interval holds the true D_E (D_T's interval is D_E's less D_F: the same coverage), and
    whether the report prints it (``withhold_transfer_intervals``)."""
    t = TRANSFER_TRUTH
    sizes = np.asarray(TRANSFER_SIZES, dtype=float)
    A = (t["smallest"] - t["E"]) * sizes[0] ** t["alpha"]
    covered: dict[float, list] = {float(d): [] for d in sizes}
    printed = False
    for _ in range(n_studies):
        with scratch() as tmp:
            with SweepWriter(Path(tmp), SEARCH) as writer:
                for init, factor in (("pretrained", t["multiple"]), ("random", 1.0)):
                    for d in sizes:
                        for seed in range(design.seeds):
                            noise = rng.normal(-(t["noise"] ** 2) / 2, t["noise"])
                            error = (t["E"] + A * (factor * d) ** -t["alpha"]) * math.exp(noise)
                            row = trial_row(SEARCH, FOLDER_TRUTHS[0], init, 1e-3, seed, design,
                                            100 * (1 - error), 100 * (1 - error))  # fmt: skip
                            row.update(train_examples=int(d), trial_id=f"{init}-{int(d)}-{seed}")
                            writer.write_trial(row)
            trials = load_results(tmp).trials
        table = laws.transfer_rows(trials, tables.DEFAULT_METRIC, intervals=True)
        printed |= bool(laws.withhold_transfer_intervals(table)["D_E_low"].notna().any())
        for r in table.to_dict("records"):
            truth = t["multiple"] * r["D_F"]
            covered[r["D_F"]].append(r["D_E_low"] <= truth <= r["D_E_high"])
    name = f"{design.seeds} seeds at {len(sizes)} train_examples sizes"
    return [
        Row(f"effective data: D_E 95% interval at D_F {d:g}"
            f"{' (extrapolated)' if t['multiple'] * d > sizes[-1] else ''}", name, 0.95,
            *rate(hits, len(hits) or 1), len(hits), "interval", printed)
        for d, hits in covered.items()
    ]  # fmt: skip


MATCHED_ARMS = {
    ("pretrained", "fpt"): (4e9, 85.0, 0.3),
    ("random", "fpt"): (4e9, 80.0, 0.3),
    ("pretrained", "full"): (6e9, 88.0, 0.15),
}
"""(init, finetune) -> (FLOPs per step, plateau accuracy %, time constant as a share of the
budget) of a matched folder's arms: every curve rises from 50% to its plateau; a full
fine-tuning step costs 1.5x a frozen one, so at equal FLOPs full reads 2/3 of its budget."""
MATCHED_NOISE = (3.0, 2.0)
"""Seed noise (points): shared by a seed's arms, and each arm's own; a trial keeps its
offset over its evaluations, so its best validation evaluation is its last within a
horizon."""


def matched_mean(arm: tuple[str, str], steps: np.ndarray, design: Design) -> np.ndarray:
    _, top, tau = MATCHED_ARMS[arm]
    return top - (top - 50.0) * np.exp(-steps / (tau * design.budget))


@depends("seeds", "budget", "eval_every")
def matched_checks(design: Design, n_studies: int, rng) -> list[Row]:
    """Folders of ``MATCHED_ARMS`` with their curves through the report's comparisons
    (``Comparisons.compute``: the Matched budgets rows at equal FLOPs and examples): how
    often each printed interval holds the true difference of the two arms' means at their
    last evaluations within the horizon, and zero-wide intervals printed."""
    steps = np.arange(design.eval_every, design.budget + 1, design.eval_every)
    # Every row of every chunk of studies, printed or not, in one order.
    covered: dict[str, list] = {f"{c} at equal {unit}": [] for c in ("full - fpt",
                                "pretrained - random") for _, unit in MATCHES.values()}  # fmt: skip
    zero = texts = 0
    for _ in range(n_studies):
        with scratch() as tmp:
            with SweepWriter(Path(tmp), SEARCH) as writer:
                for seed in range(design.seeds):
                    shared = rng.normal(0, MATCHED_NOISE[0])
                    for (init, finetune), (cost, _, _) in MATCHED_ARMS.items():
                        curve = matched_mean((init, finetune), steps, design) + shared + rng.normal(
                            0, MATCHED_NOISE[1])  # fmt: skip
                        row = trial_row(SEARCH, FOLDER_TRUTHS[0], init, 1e-3, seed, design,
                                        curve[-1], curve[-1])  # fmt: skip
                        row.update(finetune=finetune, flops_per_step=cost,
                                   trial_id=f"{init}-{finetune}-{seed}")  # fmt: skip
                        writer.write_trial(row)
                        writer.write_curve(row["trial_id"], [
                            {"step": int(s), "val_accuracy": v / 100, "test_accuracy": v / 100}
                            for s, v in zip(steps, curve, strict=True)
                        ])  # fmt: skip
            results = load_results(tmp)
        batch = float(results.trials["batch_size"].iloc[0])
        found = Comparisons.compute(results.trials, results.curves, tables.DEFAULT_METRIC,
                                    None, {})  # fmt: skip
        for r in found.matched.to_dict("records"):
            text = tables.interval_text(r, "")
            zero += zero_wide([text])
            texts += 1
            if "[" not in text:
                continue
            a, b = r["contrast"].split(" - ")
            arms = {a: ("pretrained", a), b: ("pretrained", b)}
            if a == "pretrained":
                arms = {a: (a, "fpt"), b: (b, "fpt")}
            means = []
            for arm in arms.values():
                per_step = MATCHED_ARMS[arm][0] if r["match"] == "FLOPs" else batch
                reached = steps[steps * per_step <= r["horizon"] * (1 + 1e-9)]
                means.append(matched_mean(arm, reached[-1:], design)[0])
            key = f"{r['contrast']} at equal {r['match']}"
            covered[key].append(r["ci_low"] <= means[0] - means[1] <= r["ci_high"])
    name = label(design)
    return [
        *(Row(f"matched budgets: {key}, printed 95% interval", name, 0.95,
              *rate(hits, len(hits) or 1), len(hits), "interval", True)
          for key, hits in covered.items()),
        Row("matched budgets: zero-wide 95% intervals printed (share of texts)", name, 0.0,
            zero / max(texts, 1), 0.0, n_studies, "never", True),
    ]  # fmt: skip


CHECKS = [
    accuracy_checks,
    steps_checks,
    selection_checks,
    folder_checks,
    bh_checks,
    curve_checks,
    effective_data_checks,
    matched_checks,
]
"""Each: (design, n_studies, rng) -> list of Row, marked with ``depends``. Add a check by
appending it."""


def law_rows(designs: list[coverage.Design], n_studies: int, seed: int) -> list[Row]:
    """The scaling laws' rows (``coverage.law_checks``) at each design that fits a law, for
    each form an analysis plan may declare, on studies apart from the report's own (seed + 1).
    Printed: what the report prints there, its own check (``scaling_laws.checks_at``: every
    scenario passes at ``CHECK_STUDIES``); an interval with no degree of freedom there is
    printed as "not identified". Conservative intervals (coverage above nominal) are valid,
    so these rows are judged one-sided."""
    rows = []
    for design in designs:
        for form in MEANS_FORMS:
            printed = laws.checks_at(tuple(design.sizes), design.seeds, form)
            rows += [
                Row(f"{r['name']} ({form})", r["design"], r["nominal"], r["coverage"],
                    r["mc_error"], r["n_studies"], "interval, at least nominal",
                    printed[r["name"].split(",")[0]])
                for r in coverage.law_checks(design, n_studies, seed + 1, form)
            ]  # fmt: skip
    return rows


LAW_CHECKS = ("law_rows", "law_folder_checks", "next_run_checks")
"""The scaling laws' checks, run at ``run``'s law designs (the folder and next-run ones at
ladders of 4 or more sizes)."""


SECONDS_PER_STUDY = {
    "accuracy_checks": 0.01,
    "steps_checks": 0.01,
    "selection_checks": 0.01,
    "folder_checks": 3.8,
    "bh_checks": 2.7,
    "curve_checks": 0.25,
    "law_rows": 0.06,
    "law_folder_checks": 0.65,
    "next_run_checks": 0.03,
    "effective_data_checks": 2.4,
    "matched_checks": 0.65,
}
"""Projected seconds of one study of each check at one design on one core: the most any
design took, measured on this project's shared 2-core CPU (2026-11-27 20:49-20:51 UTC,
``nice``, load average 4.8-6.0; 3 studies a design, ``law_rows`` 100, ``next_run_checks``
20; ``folder_checks`` took 0.3 s at one lr and 3 seeds, 2.1-3.8 s at lr-search's designs,
docs/statistics.md): what ``--plan`` and a shard's first line add up."""
WHOLE = ("law_rows", "next_run_checks")
"""Checks run whole at a design (not in chunks of studies): ``law_rows`` is vectorised over
its studies on a stream of its own, ``next_run_checks`` compares medians over all of them."""


def units(
    seed: int,
    designs: list[Design] | None = None,
    law_designs: list[coverage.Design] | None = None,
    checks=None,
    only: set[str] | None = None,
) -> list[tuple[str, object]]:
    """(check name, function (n_studies, rng) -> rows) of a run, in order: every check
    (``checks``, default ``CHECKS``) once per design of ``designs`` (default: every shipped
    preset's) that differs in what it ``depends`` on, and the scaling laws' at
    ``law_designs`` (default: every preset that fits a law; a ladder of 4 or more sizes also
    through the assembled scaling section); ``only``: the names of the checks to run (of
    ``CHECKS`` and ``LAW_CHECKS``), default all."""
    designs = preset_designs() if designs is None else designs
    if law_designs is None:
        law_designs = list(coverage.preset_designs(STUDIES).values())
    wanted = lambda name: only is None or name in only  # noqa: E731
    out = []
    for check in CHECKS if checks is None else checks:
        if not wanted(check.__name__):
            continue
        seen = set()
        for design in designs:
            key = tuple(getattr(design, f) for f in check.depends)
            if key not in seen:
                seen.add(key)
                out.append((check.__name__, functools.partial(check, design)))
    for design in law_designs:
        if wanted("law_rows"):
            out.append(("law_rows", lambda n, rng, d=design: law_rows([d], n, seed)))
        if len(design.sizes) >= 4:  # a ladder: the assembled scaling section
            for check in (law_folder_checks, next_run_checks):
                if wanted(check.__name__):
                    out.append((check.__name__, functools.partial(check, design)))
    return out


def tasks_of(work: list[tuple[str, object]], n_studies: int) -> list[jobs.Task]:
    """Each unit of ``work`` as tasks of at most ``jobs.CHUNK_STUDIES`` studies."""
    return [task for i, (name, _) in enumerate(work)
            for task in jobs.chunks(name, i, n_studies, SECONDS_PER_STUDY.get(name, 1.0),
                                    name in WHOLE)]  # fmt: skip


def run_shard(work, tasks: list[jobs.Task], seed: int, log=lambda *_: None) -> dict[str, list]:
    """{task key: rows} of ``tasks``, each on its own random stream (``Task.rng_key``)."""
    return jobs.run_tasks(
        tasks,
        lambda t: work[t.unit][1](t.studies, np.random.default_rng(t.rng_key(seed))),
        log,
    )


def run(
    n_studies: int,
    seed: int = 0,
    designs: list[Design] | None = None,
    law_designs: list[coverage.Design] | None = None,
    checks=None,
    only: set[str] | None = None,
) -> list[Row]:
    """Every task of ``units`` (same arguments) in this process, merged: the rows a run's
    shards merge into."""
    work = units(seed, designs, law_designs, checks, only)
    tasks = tasks_of(work, n_studies)
    return jobs.merge(tasks, run_shard(work, tasks, seed))


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


def verdict(rows: list[Row], quick: bool) -> int:
    """Prints the table and every printed row that fails; 1 if any does."""
    print(table(rows))
    wrong = [r for r in rows if r.printed and (r.off_nominal if quick else not r.calibrated)]
    for r in wrong:
        print(f"PRINTED BUT NOT CALIBRATED: {r.name} at {r.design}: {r.coverage:.3f}")
    return 1 if wrong else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=N_STUDIES,
                        help=f"studies per design (default {N_STUDIES}: see N_STUDIES)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_STUDIES} studies per design; fails only a printed row "
                        "more than 3 Monte Carlo errors off nominal")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    names = [c.__name__ for c in CHECKS] + list(LAW_CHECKS)
    parser.add_argument("--only", action="append", choices=names, metavar="CHECK",
                        help=f"run only this check (repeatable): {', '.join(names)}")  # fmt: skip
    parser.add_argument("--plan", type=int, metavar="N",
                        help="print the projected hours of each of N shards and exit")  # fmt: skip
    parser.add_argument("--shard", metavar="K/N",
                        help="run shard K of N (tasks balanced by projected time) and write "
                        "its rows to --out (benchmarks/calibration_jobs.py)")  # fmt: skip
    parser.add_argument("--out", type=Path,
                        help="a shard's JSON file (default calibration-shard-K-of-N.json)")  # fmt: skip
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="merge the JSON files of every shard of one run: its table "
                        "and verdict")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.studies = QUICK_STUDIES
    try:
        if args.studies < 1 or (args.plan is not None and args.plan < 1):
            raise ValueError("--studies and --plan take a positive number")
        shard = jobs.parse_shard(args.shard) if args.shard else None
        if args.merge:
            header, tasks, rows = jobs.read_shards(args.merge, Row)
    except ValueError as e:
        print(f"calibration: {e}", file=sys.stderr)
        return 2
    if args.merge:
        print(f"calibration, {len(args.merge)} shard files, {header['studies']} studies per "
              "design")  # fmt: skip
        return verdict(jobs.merge(tasks, rows), header["quick"])
    designs = preset_designs()
    work = units(args.seed, designs, only=set(args.only) if args.only else None)
    tasks = tasks_of(work, args.studies)
    if args.plan:
        print(jobs.plan_text(jobs.shards(tasks, args.plan)))
        return 0
    print(f"calibration, {datetime.date.today().isoformat()}, {args.studies} studies per design")
    for d in designs:
        print(f"- {label(d)}: {d.presets}")
    if shard:
        k, n = shard
        mine = jobs.shards(tasks, n)[k - 1]
        print(f"shard {k}/{n}: {len(mine)} of {len(tasks)} tasks, projected "
              f"{sum(t.seconds for t in mine) / 3600:.2f} h on one core")  # fmt: skip
        rows = run_shard(work, mine, args.seed, log=print)
        out = args.out or Path(f"calibration-shard-{k}-of-{n}.json")
        header = {"studies": args.studies, "seed": args.seed, "quick": args.quick,
                  "tasks": [dataclasses.asdict(t) for t in tasks]}  # fmt: skip
        jobs.write_shard(out, header, rows)
        print(f"wrote {out}")
        return 0
    return verdict(jobs.merge(tasks, run_shard(work, tasks, args.seed, log=print)), args.quick)


if __name__ == "__main__":
    sys.exit(main())
