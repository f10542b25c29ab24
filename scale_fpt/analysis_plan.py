"""The analysis plan of a sweep, written when it starts, before any result exists:
``RESULTS_DIR/<sweep>/analysis_plan.json`` (versioned by ``schema_version``).

It fixes what the report will treat as confirmatory: the primary metric and the selection
metric, the threshold per task for steps to threshold, the tests of each comparison, the
multiplicity families (Benjamini-Hochberg within each), the scaling law's form, and which
seeds select (``selection``) and which estimate (``confirmation``). The report follows it
and marks every comparison outside it "exploratory"; ``read_plan(...).law_form`` is the
form the scaling laws are fitted with.

A resumed sweep keeps the plan it started with (a plan is never rewritten).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scale_fpt import published
from scale_fpt.confined import ResultsError, make_folders, printable, read_text, write_text
from scale_fpt.vocabulary import CONFIRM_SUFFIX

PLAN_FILE = "analysis_plan.json"
SCHEMA_VERSION = 1
PRIMARY_METRIC = "test_accuracy"
"""Test accuracy at each trial's best-validation evaluation (``selected_step``)."""
DEFAULT_THRESHOLDS = {
    task: round(0.9 * value / 100, 4)
    for task, value in zip(
        published.TASK_COLUMNS, published.ACCURACY["T2"]["language (FPT)"], strict=True
    )
}
"""Steps-to-threshold default per task: 90% of the paper's FPT accuracy (Table 2)."""


def thresholds_for(tasks, thresholds=None) -> dict[str, float]:
    """Per-task accuracy threshold (a fraction): a number for every task, a {task: value}
    dict (others keep the default), or None for ``DEFAULT_THRESHOLDS``."""
    if isinstance(thresholds, int | float):
        return dict.fromkeys(tasks, float(thresholds))
    given = thresholds or {}
    return {t: float(given.get(t, DEFAULT_THRESHOLDS.get(t, 0.9))) for t in tasks}


LAW_FORM = "power_floor"
"""The declared scaling law: error = E + A x^-alpha (``scale_fpt.analysis`` forms)."""
CONTRASTS = {
    "pretrained - random": ("init", ("pretrained", "random")),
    "full - fpt": ("finetune", ("full", "fpt")),
}
"""Comparisons a plan can declare: the grid field that differs and its two values."""
TESTS = {
    "accuracy": "paired t (95% interval, p), d_z with its exact noncentral-t interval, exact "
    "sign-flip p where its n can reach 0.05; Welch where no seed is shared",
    "steps to threshold": "Kaplan-Meier medians; log-rank, exact permutation p",
    "matched budgets": "paired t at equal FLOPs and at equal examples",
}


@dataclass(frozen=True)
class AnalysisPlan:
    sweep: str
    primary_metric: str = PRIMARY_METRIC
    selection_metric: str = "best_val_accuracy"
    thresholds: dict = field(default_factory=dict)
    tests: dict = field(default_factory=lambda: dict(TESTS))
    families: dict = field(default_factory=dict)
    """Family name -> the comparisons adjusted together (Benjamini-Hochberg)."""
    law_form: str = LAW_FORM
    seeds: dict = field(default_factory=dict)
    """{'selection': [...], 'confirmation': [...]}."""
    written: str = ""
    schema_version: int = SCHEMA_VERSION

    def family_of(self, contrast: str, kind: str) -> str | None:
        """The declared family of ``contrast`` measured as ``kind`` ('accuracy', 'steps to
        threshold', 'matched budgets'), or None: exploratory."""
        name = f"{kind}: {contrast}"
        return name if contrast in self.families.get(name, ()) else None


class PlannedSweep(Protocol):
    """What a plan reads of its sweep (``sweep.config.SweepConfig`` has these fields): named
    here because the sweep package imports this module, and a plan is read without it."""

    name: str
    metric: str
    base: dict
    grid: dict
    seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    results_dir: str


def declared_contrasts(sweep: PlannedSweep) -> list[str]:
    """The contrasts whose two arms the sweep's grid runs side by side."""
    out = []
    for contrast, (key, values) in CONTRASTS.items():
        values_run = set(sweep.grid.get(key, [sweep.base.get(key)]))
        if set(values) <= values_run:
            out.append(contrast)
    return out


def plan_for(sweep: PlannedSweep, trials: list[dict]) -> AnalysisPlan:
    """The plan of ``sweep`` running ``trials`` (its flat configs, ``SweepConfig.trials``):
    its tasks' thresholds, one family per (measure, contrast) it runs, its seeds."""
    tasks = sorted({str(arm["task"]) for arm in trials})
    families = {
        f"{kind}: {contrast}": [contrast]
        for contrast in declared_contrasts(sweep)
        for kind in ("accuracy", "steps to threshold", "matched budgets")
    }
    return AnalysisPlan(
        sweep=sweep.name,
        selection_metric=sweep.metric,
        thresholds=thresholds_for(tasks),
        families=families,
        seeds={"selection": list(sweep.seeds), "confirmation": list(sweep.confirm_seeds)},
        written=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def write_plan(sweep: PlannedSweep, trials: list[dict]) -> Path:
    """Write the plan of ``sweep`` running ``trials`` (``plan_for``) where its results go,
    unless one is there (a resumed sweep keeps its first plan); returns its path."""
    path = Path(sweep.results_dir) / sweep.name / PLAN_FILE
    if not os.path.lexists(path):
        text = json.dumps(dataclasses.asdict(plan_for(sweep, trials)), indent=2) + "\n"
        make_folders(path.parent)
        write_text(path, text)
    return path


FIELD_CHECKS = {
    "sweep": (str, "a text"),
    "primary_metric": (str, "a text"),
    "selection_metric": (str, "a text"),
    "thresholds": (dict, "an object {task: accuracy}"),
    "tests": (dict, "an object"),
    "families": (dict, "an object {family: [comparison, ...]}"),
    "law_form": (str, "a text"),
    "seeds": (dict, "an object {'selection': [...], 'confirmation': [...]}"),
    "written": (str, "a text"),
}
"""What each field of a plan file must hold (the file is a results folder's: untrusted)."""


def plan_problems(data) -> list[str]:
    """What is wrong with a plan file's parsed JSON (empty when it is a plan)."""
    if not isinstance(data, dict):
        return [f"holds a JSON {type(data).__name__}, not an object"]
    problems = [
        f"field {name!r} must be {what}"
        for name, (kind, what) in FIELD_CHECKS.items()
        if name in data and not isinstance(data[name], kind)
    ]
    thresholds = data.get("thresholds")
    if isinstance(thresholds, dict) and not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in thresholds.values()
    ):
        problems.append("field 'thresholds' must map each task to a number")
    families = data.get("families")
    if isinstance(families, dict) and not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in families.values()
    ):
        problems.append("field 'families' must map each family to a list of comparisons")
    seeds = data.get("seeds")
    if isinstance(seeds, dict) and not all(
        isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        for v in seeds.values()
    ):
        problems.append("field 'seeds' must map each use to a list of integer seeds")
    return problems


def read_plan(sweep_dir: str | Path) -> AnalysisPlan | None:
    """The plan under ``sweep_dir`` (None when the sweep wrote none); a plan of another
    schema version, or a file that is no plan (not JSON, empty, a list, a field of the wrong
    type), is one ``ResultsError`` line naming the file (exit code 2 on the CLI)."""
    path = Path(sweep_dir) / PLAN_FILE
    if not os.path.lexists(path):
        return None
    shown = printable(str(path))
    try:
        data = json.loads(read_text(path))
    except ValueError as e:
        raise ResultsError(
            [f"{shown}: not an analysis plan (not JSON: {printable(str(e))}); remove or "
             "restore the file"]
        ) from None  # fmt: skip
    problems = plan_problems(data)
    if problems:
        raise ResultsError(
            [f"{shown}: not an analysis plan ({'; '.join(problems)}); remove or restore the file"]
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError([
            f"{shown}: analysis plan schema version "
            f"{printable(repr(data.get('schema_version')))}; this scale_fpt reads version "
            f"{SCHEMA_VERSION}"
        ])  # fmt: skip
    known = {f.name for f in dataclasses.fields(AnalysisPlan)}
    return AnalysisPlan(**{k: v for k, v in data.items() if k in known})


def plans(results_dir: str | Path, sweeps) -> dict[str, AnalysisPlan]:
    """{sweep: plan} for the ``sweeps`` under ``results_dir`` that have one; a confirmation
    sweep (``<name>-confirm``) follows its search sweep's plan."""
    out = {}
    for sweep in sweeps:
        owner = sweep[: -len(CONFIRM_SUFFIX)] if sweep.endswith(CONFIRM_SUFFIX) else sweep
        plan = read_plan(Path(results_dir) / sweep) or read_plan(Path(results_dir) / owner)
        if plan is not None:
            out[sweep] = plan
    return out
