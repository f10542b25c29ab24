"""Results folders of any size, fast, in the layout the project writes (``scale_fpt.results``).

    from _study_folders import build_results_folder
    build_results_folder(path, trials=10_000, seeds_per_arm=1_000, sweeps=1, evals=20)

The arms are the ``scale`` study's ``local`` preset's (each trial config parsed and
completed by ``scale_fpt.config``, so every column holds what a real row holds), widened
with more learning rates where more arms are asked for, each copied as ``seeds_per_arm``
seeds; outcomes and curves are drawn from a seeded generator (accuracies in [0.5, 1]).
Rows are built as Arrow columns, never one dict per row. ``compacted=True`` writes each table
as the driver's compaction leaves it (``compaction.Generation``, ``PART_TRIALS`` trials per
file); ``compacted=False`` as the driver writes during a sweep, one file per trial and table
(what a folder written before compaction existed holds).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scale_fpt.compaction import PART_TRIALS, Generation, part_name
from scale_fpt.config import parse_trial
from scale_fpt.recipes import load_study
from scale_fpt.results import ResultsWriter, table
from scale_fpt.results_schema import CURVE_SCHEMA, SCHEMA_VERSION, TRIAL_SCHEMA

LR_FACTORS = (1.0, 0.3, 3.0, 0.1, 10.0, 0.03, 30.0, 0.01)


def preset_arms() -> list[dict]:
    """The local scale study's arms (its trials without the seed), each config completed."""
    sweep = load_study("scale").presets["local"]()
    arms = {}
    for trial in sweep.trials():
        flat = parse_trial({**trial, "seed": 0}).to_flat()
        arms[tuple(sorted(flat.items()))] = flat
    return list(arms.values())


def arms_for(count: int) -> list[dict]:
    """``count`` distinct arms: the preset's, then the same at other learning rates."""
    base = preset_arms()
    widened = [{**arm, "lr": arm["lr"] * factor} for factor in LR_FACTORS for arm in base] + [
        {**arm, "lr": arm["lr"] * 1.01**k} for k in range(1, count) for arm in base
    ]
    return widened[:count]


def trial_ids(sweep: str, arm: int, seeds: np.ndarray) -> list[str]:
    return [hashlib.sha1(f"{sweep}/{arm}/{s}".encode()).hexdigest()[:12] for s in seeds]


def sweep_tables(
    sweep: str, arms: list[dict], seeds_per_arm: int, evals: int, rng: np.random.Generator
) -> tuple[pa.Table, pa.Table]:
    """(trials, curves) of one sweep: every arm at seeds 0..seeds_per_arm-1."""
    steps = int(arms[0]["max_steps"])
    template = table(
        [
            {
                **arm,
                "sweep": sweep,
                "status": "completed",
                "stop_reason": "budget",
                "steps_done": steps,
                "trained_groups": "input+output+ln+pos",
                "group_params": "{}",
                "device": "cpu",
                "hostname": "host",
                "git_sha": "0" * 40,
                "versions": "{}",
                "cohort_size": 1,
                "finished_at": "2026-11-27T00:00:00+00:00",
                "schema_version": SCHEMA_VERSION,
            }
            for arm in arms
        ],
        TRIAL_SCHEMA,
    )
    arm_of = np.repeat(np.arange(len(arms)), seeds_per_arm)
    seed = np.tile(np.arange(seeds_per_arm), len(arms))
    trials = template.take(pa.array(arm_of))
    ids = [i for a in range(len(arms)) for i in trial_ids(sweep, a, np.arange(seeds_per_arm))]
    n = len(ids)
    accuracy = rng.uniform(0.5, 1.0, n)
    columns = {
        "trial_id": pa.array(ids),
        "seed": pa.array(seed, pa.int64()),
        "test_accuracy": pa.array(accuracy),
        "val_accuracy": pa.array(np.clip(accuracy + rng.normal(0, 0.02, n), 0, 1)),
        "best_val_accuracy": pa.array(np.clip(accuracy + 0.02, 0, 1)),
        "final_test_accuracy": pa.array(accuracy),
        "best_test_accuracy": pa.array(np.clip(accuracy + 0.01, 0, 1)),
        "final_test_loss": pa.array(rng.uniform(0.1, 0.7, n)),
        "final_train_loss": pa.array(rng.uniform(0.1, 0.7, n)),
        "selected_step": pa.array(np.full(n, steps), pa.int64()),
        "wall_time_s": pa.array(rng.uniform(5, 50, n)),
        "train_time_s": pa.array(rng.uniform(4, 40, n)),
    }
    for name, column in columns.items():
        trials = trials.set_column(TRIAL_SCHEMA.get_field_index(name), name, column)
    at = np.unique(np.linspace(steps / evals, steps, evals).astype(np.int64))
    k = len(at)
    curves = trials.select([f.name for f in CURVE_SCHEMA if f.name in TRIAL_SCHEMA.names])
    curves = curves.take(pa.array(np.repeat(np.arange(n), k)))
    progress = np.tile(np.arange(1, k + 1) / k, n)
    final = np.repeat(accuracy, k)
    measured = {
        "step": pa.array(np.tile(at, n)),
        "train_loss": pa.array(0.7 - 0.5 * progress),
        "train_accuracy": pa.array(0.5 + (final - 0.5) * progress),
        "val_loss": pa.array(0.7 - 0.4 * progress),
        "val_accuracy": pa.array(0.5 + (final - 0.5) * progress),
        "test_loss": pa.array(0.7 - 0.4 * progress),
        "test_accuracy": pa.array(0.5 + (final - 0.5) * progress),
        "samples_per_s": pa.array(np.full(n * k, 1000.0)),
        "wall_time_s": pa.array(progress * 30),
    }
    curves = pa.Table.from_arrays(
        [measured[f.name] if f.name in measured else curves[f.name] for f in CURVE_SCHEMA],
        schema=CURVE_SCHEMA,
    )
    return trials, curves


def write_compacted(table_dir: Path, rows: pa.Table) -> None:
    """``rows`` as compaction leaves them: files of ``PART_TRIALS`` trials, swapped in."""
    ids = pc.unique(rows["trial_id"])
    generation = Generation(table_dir)
    for start in range(0, len(ids), PART_TRIALS):
        chunk = rows.filter(pc.is_in(rows["trial_id"], ids[start : start + PART_TRIALS]))
        generation.write(part_name(), chunk)
    generation.publish(set())


def write_per_trial(table_dir: Path, rows: pa.Table, per_trial: int) -> None:
    """``rows`` (``per_trial`` rows of each trial, in order) one file per trial."""
    ids = rows["trial_id"]
    for start in range(0, rows.num_rows, per_trial):
        pq.write_table(rows.slice(start, per_trial), table_dir / f"{ids[start].as_py()}.parquet")


def build_results_folder(
    path: str | os.PathLike,
    trials: int,
    seeds_per_arm: int,
    sweeps: int = 1,
    evals: int = 20,
    compacted: bool = True,
    seed: int = 0,
) -> Path:
    """A results folder of about ``trials`` trials (rounded to whole arms) over ``sweeps``
    sweeps (``scale-0``, ``scale-1``, ...), ``seeds_per_arm`` seeds per arm and ``evals``
    evaluations per curve. Returns ``path``."""
    root = Path(path)
    rng = np.random.default_rng(seed)
    per_sweep = max(1, math.ceil(trials / sweeps / seeds_per_arm))
    arms = arms_for(per_sweep)
    for s in range(sweeps):
        name = f"scale-{s}"
        writer = ResultsWriter(root, name)  # the schema file and the table directories
        trial_rows, curve_rows = sweep_tables(name, arms, seeds_per_arm, evals, rng)
        for table_name, rows in (("trials", trial_rows), ("curves", curve_rows)):
            if compacted:
                write_compacted(writer.root / table_name, rows)
            else:
                per_trial = rows.num_rows // trial_rows.num_rows
                write_per_trial(writer.root / table_name, rows, per_trial)
    return root
