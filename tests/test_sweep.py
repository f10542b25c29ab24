"""Sweeps through a real local Ray: grids, rows in Parquet, a second driver refused and
resume after a killed driver, ASHA, packed grids, resources, bad sweep configs. (Searches:
tests/test_search.py; the driver lock alone: tests/test_driver_lock.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import TINY_TRIAL as TINY

from scale_fpt.config import ConfigError
from scale_fpt.profile import profile_of
from scale_fpt.recipes import load_study
from scale_fpt.results import ResultsWriter, checkpoint_dir, load_results
from scale_fpt.results_schema import CURVE_SCHEMA, TRIAL_SCHEMA
from scale_fpt.study import study_main
from scale_fpt.sweep import Devices, SweepConfig, SweepPlan, placement_on
from scale_fpt.sweep.lock import LOCK_FILE

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_TRIAL_COLUMNS = {
    "sweep", "trial_id", "task", "model", "init", "finetune", "lr", "batch_size", "seed",
    "max_steps", "status", "steps_done", "final_test_accuracy", "best_test_accuracy",
    "final_test_loss", "trainable_params", "total_params", "wall_time_s", "device", "git_sha",
    "error",
}  # fmt: skip
CONTRACT_CURVE_COLUMNS = {
    "sweep", "trial_id", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
    "samples_per_s", "wall_time_s",
}  # fmt: skip
# Columns that legitimately differ between two runs of the same trial.
VOLATILE = {
    "wall_time_s", "train_time_s", "samples_per_s", "finished_at", "hostname", "checkpoint",
    "node_id",  # a resumed sweep runs on a new local Ray, whose node has another id
}  # fmt: skip


def sweep_command(results: Path, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "sweeps" / "scale.py"), "--results", str(results), *flags]


def stable(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    columns = [c for c in frame.columns if c not in VOLATILE]
    return frame[columns].sort_values(keys, ignore_index=True)


def test_sweep_config_validation_names_every_problem():
    bad = SweepConfig(
        name="bad name!",
        base={"task": "nope", "warp": 9},
        grid={"lr": []},
        asha=True,
        search={"lr": ("loguniform", 1e-5, 1e-2)},
    )
    with pytest.raises(ConfigError) as e:
        bad.validate()
    text = str(e.value)
    for expected in ("bad name!", "'warp'", "grid 'lr'", "asha with search"):
        assert expected in text
    with pytest.raises(ConfigError, match="--task: unknown value 'nope'"):
        SweepConfig(name="ok", base={"task": "nope"}).validate()


def test_decisions_read_validation_only_and_asha_compares_one_design():
    with pytest.raises(ConfigError) as e:
        SweepConfig(name="s", metric="best_test_accuracy").validate()
    assert e.value.problems == [
        "metric 'best_test_accuracy': searches and ASHA decide on validation only; choose "
        "from best_val_accuracy, val_accuracy"
    ]
    with pytest.raises(ConfigError) as e:
        SweepConfig(
            name="s", grid={"task": ["bit-xor", "listops"], "lr": [1e-3]}, asha=True
        ).validate()
    assert e.value.problems == [
        "asha with a grid over task: ASHA would rank different arms against each other; grid "
        "only over lr, batch_size (one sweep per arm) or drop asha"
    ]
    SweepConfig(name="s", grid={"lr": [1e-3, 1e-4], "batch_size": [8]}, asha=True).validate()


def test_arms_cross_grid_and_seeds_with_overrides():
    sweep = SweepConfig(
        name="s",
        base={"model": "gpt2-tiny"},
        grid={"task": ["bit-xor", "homology"], "init": ["pretrained", "random"]},
        seeds=(0, 1),
        overrides=(({"task": "homology"}, {"lr": 1e-4}),),
    )
    arms = sweep.trials()
    assert len(arms) == 8
    assert {a["lr"] for a in arms if a["task"] == "homology"} == {1e-4}
    assert all("lr" not in a for a in arms if a["task"] == "bit-xor")
    assert {(a["task"], a["init"], a["seed"]) for a in arms} == {
        (t, i, s) for t in ("bit-xor", "homology") for i in ("pretrained", "random") for s in (0, 1)
    }


def test_reported_metrics_are_the_best_members_and_nan_before_any_evaluation():
    import math

    from scale_fpt.sweep import report_metrics

    rows = [
        {"val_accuracy": 0.6, "best_val_accuracy": 0.7, "test_accuracy": 0.9},
        {"val_accuracy": 0.8, "best_val_accuracy": 0.8, "test_accuracy": 0.5},
        {"val_accuracy": None, "best_val_accuracy": None},  # not evaluated yet
    ]
    metrics = report_metrics(rows)
    assert metrics == {"val_accuracy": 0.8, "best_val_accuracy": 0.8}  # no test metric
    assert all(math.isnan(v) for v in report_metrics(rows[2:]).values())


def test_trial_resources_are_declared_by_the_plan_not_probed():
    from scale_fpt.cluster import GPUOffer
    from scale_fpt.gpus import GPUS

    a10g = GPUOffer(GPUS["a10g-24gb"], 4, "declared")
    sweep = SweepConfig(name="s", gpu="a10g-24gb")

    def planned(flat, sweep=sweep, offer=a10g):
        """The lookup of the resources callback: ``flat`` alone, planned on first sight."""
        placement = placement_on(sweep, offer, Devices(1, 1, 0))
        return SweepPlan(sweep, placement, (), (), ()).cohort([flat])

    def bundles(flat, sweep=sweep, offer=a10g):
        return planned(flat, sweep, offer).resources().bundles

    assert bundles({"model": "gpt2-large"}, offer=GPUOffer(None, 0, "none")) == [{"CPU": 1}]
    assert bundles({"model": "gpt2", "batch_size": 4}) == [{"CPU": 1, "GPU": 0.25}]
    assert bundles({"model": "gpt2-large", "finetune": "full"}) == [{"CPU": 1, "GPU": 1.0}]
    xl_full = {"model": "gpt2-xl", "finetune": "full", "precision": "bf16", "batch_size": 8}
    assert bundles(xl_full) == [{"CPU": 1, "GPU": 1}] * 2  # two GPUs, ZeRO 2
    assert planned(xl_full).resources().strategy == "STRICT_PACK"
    cpu_sweep = SweepConfig(name="s", gpus_per_trial="0")
    assert bundles({"model": "gpt2"}, sweep=cpu_sweep) == [{"CPU": 1}]
    half = SweepConfig(name="s", gpus_per_trial="0.5")
    assert bundles({"model": "gpt2"}, sweep=half) == [{"CPU": 1, "GPU": 0.5}]
    # an arm that cannot be built asks for a CPU: it fails at once and is recorded
    assert bundles({"model": "gpt2", "finetune": "nope"}) == [{"CPU": 1}]


def test_planned_arms_set_workers_and_zero_stage_only_for_multi_gpu_trials():
    from scale_fpt.cluster import GPUOffer
    from scale_fpt.gpus import GPUS
    from scale_fpt.sweep import planned_arms

    sweep = SweepConfig(name="s")
    offer = GPUOffer(GPUS["a10g-24gb"], 4, "declared")
    small = {"model": "gpt2", "precision": "bf16"}
    xl_full = {"model": "gpt2-xl", "finetune": "full", "precision": "bf16", "batch_size": 8}
    placement = placement_on(sweep, offer, Devices(1, 1, 0))
    planned, profiles = planned_arms(
        [small, xl_full], [profile_of(small), profile_of(xl_full)], placement
    )
    assert planned[0] == small  # unchanged: its trial id does not depend on the cluster
    assert (planned[1]["zero_stage"], planned[1]["workers"]) == (2, 2)
    assert profiles[1].config.train.workers == 2  # profiled as it runs
    huge = [{**xl_full, "batch_size": 4096}, {**xl_full, "seed": 1, "batch_size": 4096}]
    with pytest.raises(ConfigError, match="does not fit") as e:
        planned_arms(
            huge,
            [profile_of(arm) for arm in huge],
            placement_on(sweep, GPUOffer(GPUS["a10g-24gb"], 1, "declared"), Devices(1, 1, 0)),
        )
    assert len(e.value.problems) == 2


def test_a_trial_wider_than_every_node_is_refused_at_plan_time():
    """A trial's GPUs are one STRICT_PACK placement group: asking for more than the widest
    node has would wait forever, so the plan refuses it, naming the arm and the limit."""
    from scale_fpt.cluster import GPUOffer
    from scale_fpt.gpus import GPUS
    from scale_fpt.sweep import planned_arms

    four = GPUOffer(GPUS["a10g-24gb"], 4, "cluster.yaml")
    nothing = GPUOffer(None, 0, "none")

    def arms(trials, offer=four, **sweep):
        placement = placement_on(SweepConfig(name="s", **sweep), offer, Devices(1, 1, 0))
        return planned_arms(trials, [profile_of(arm) for arm in trials], placement)[0]

    small = {"model": "gpt2-tiny", "task": "bit-xor"}
    assert arms([small], gpus_per_trial="4")
    with pytest.raises(ConfigError) as e:
        arms([small], gpus_per_trial="8")
    (problem,) = e.value.problems
    assert "asks for 8 GPUs on one node, but the widest node has 4 (cluster.yaml)" in problem
    assert problem.startswith("bit-xor") or "gpt2-tiny" in problem
    with pytest.raises(ConfigError, match="asks for 8 GPUs"):  # workers ask for GPUs too
        arms([{**small, "workers": 8}])
    with pytest.raises(ConfigError, match="the cluster has and can launch no GPU"):
        arms([small], nothing, gpus_per_trial="0.5")
    assert arms([small], nothing) == [small]  # auto: CPU


def test_gpu_declarations_are_validated_at_once():
    sweep = SweepConfig(name="s", gpus_per_trial="lots", gpu="v100", gpu_memory_gb=-1)
    with pytest.raises(ConfigError) as e:
        sweep.validate()
    text = str(e.value)
    assert "--gpus-per-trial: 'lots'" in text and "--gpu: unknown GPU 'v100'" in text
    assert "--gpu-memory" in text


GRID_STEPS = 20


@pytest.fixture(scope="module")
def lr_grid(tmp_path_factory) -> SweepConfig:
    """An unpacked grid over two lrs, run once through the in-process Ray for this module's
    tests that read it (rows of the contract; the reference of the packed sweep). Dropout 0:
    a packed member trains draw-for-draw as it does alone."""
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="grid",
        base={**TINY, "max_steps": GRID_STEPS, "eval_every": 10, "dropout": 0.0},
        grid={"lr": [1e-3, 3e-3]},
        seeds=(0,),
        results_dir=str(tmp_path_factory.mktemp("grid")),
        max_concurrent=2,
        gpus_per_trial="0",  # CPU trials, one per core, even where a GPU is visible
    )
    outcome = run_sweep(sweep)
    assert outcome.finished and outcome.trials == 2  # auto packing: one trial per slot
    return sweep


@pytest.mark.slow
def test_grid_sweep_writes_contract_rows_once(lr_grid):
    tmp_path = Path(lr_grid.results_dir)
    trials = pd.read_parquet(tmp_path / "grid" / "trials")
    curves = pd.read_parquet(tmp_path / "grid" / "curves")
    assert set(trials.columns) >= CONTRACT_TRIAL_COLUMNS
    assert set(trials.columns) == set(TRIAL_SCHEMA.names)
    assert set(curves.columns) >= CONTRACT_CURVE_COLUMNS and set(curves.columns) == set(
        CURVE_SCHEMA.names
    )
    assert sorted(trials["lr"]) == [1e-3, 3e-3]
    assert (trials["status"] == "completed").all() and (trials["steps_done"] == GRID_STEPS).all()
    assert trials["trial_id"].is_unique
    assert not curves.duplicated(["trial_id", "step"]).any()
    assert sorted(curves["step"]) == [10, 10, 20, 20]
    assert trials["git_sha"].str.len().min() >= 7
    assert (trials["stop_reason"] == "budget").all()
    assert set(curves["val_accuracy"].between(0, 1)) == {True}
    # Every trial's checkpoint holds its trained weights (what the report rebuilds it from),
    # recorded relative to the results directory (the default storage is inside it).
    assert trials["checkpoint"].str.startswith("_ray/grid/").all()
    weights = trials.apply(
        lambda r: checkpoint_dir(r["checkpoint"], tmp_path) / f"weights-{r['trial_id']}.pt", axis=1
    )
    assert weights.map(Path.is_file).all()
    # where each trial ran and what it asked for (no GPU here: CPU only, none assigned)
    import ray

    assert set(trials["node_id"]) <= {n["NodeID"] for n in ray.nodes()}
    assert (trials["gpu_ids"] == "[]").all() and trials["gpu_model"].isna().all()
    assert [json.loads(r) for r in trials["resources_requested"]] == [[{"CPU": 1}]] * 2
    # The driver compacted the ended trials when the experiment ended: one file per table.
    for table in ("trials", "curves"):
        assert [p.name[:10] for p in (tmp_path / "grid" / table).iterdir()] == ["compacted-"]


@pytest.mark.slow
@pytest.mark.faults
def test_second_driver_is_refused_and_killed_driver_resume_matches_uninterrupted_sweep(tmp_path):
    """Real drivers (``sweeps/scale.py``) on one results directory and sweep name: while the
    first is mid-sweep, a second exits 2 at start-up with one line naming the first and
    changes nothing; after ``kill -9`` of the first (and its local Ray), ``--resume`` takes
    the lock and finishes the sweep, and its Parquet output equals an uninterrupted sweep's,
    every trial once and every (trial, step) once."""
    flags = ["--tasks", "bit-xor", "--inits", "random", "--seeds", "0,1", "--steps", "60"]
    flags += ["--set", "eval_every=20", "--set", "test_batches=2", "--set", "val_batches=2"]
    flags += ["--set", "log_evals=false"]
    flags += ["--max-concurrent", "1", "--name", "kill"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    killed = tmp_path / "killed"
    driver = subprocess.Popen(
        sweep_command(killed, *flags),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the local Ray dies with it
    )
    try:
        curves_dir = killed / "kill" / "curves"
        deadline = time.time() + 240
        while time.time() < deadline:  # after the first evaluation: mid-way through a trial
            written = list(curves_dir.glob("*.parquet")) if curves_dir.exists() else []
            if written:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the sweep wrote no curves in time")
        # Frozen where it is (driver, Ray and trial alike): a live driver holding the lock,
        # mid-way through a trial, whatever the second driver's start-up takes.
        os.killpg(driver.pid, signal.SIGSTOP)
        lock = killed / "kill" / LOCK_FILE
        holder = json.loads(lock.read_text())
        assert holder["pid"] == driver.pid
        before = {path: path.stat().st_mtime_ns for path in (killed / "kill").rglob("*")}
        second = subprocess.run(
            sweep_command(killed, *flags), env=env, capture_output=True, text=True, timeout=120
        )
        assert driver.poll() is None, "the first driver ended before the second one started"
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = second.stderr.strip().splitlines()
        assert ": error: another driver is running sweep 'kill' in " in line
        assert f"host {holder['host']}, pid {driver.pid}, started {holder['started']}" in line
        assert json.loads(lock.read_text()) == holder  # the refused driver changed nothing
        assert {path: path.stat().st_mtime_ns for path in (killed / "kill").rglob("*")} == before
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    # Whatever write the kill interrupted, every Parquet file a reader can see is whole (a
    # write in progress is a hidden temporary, which readers skip), and its rows are unique.
    for path in (killed / "kill").rglob("*.parquet"):
        pq.read_table(path)
    partial = load_results(killed, "kill")
    assert partial.trials["trial_id"].is_unique
    assert not partial.curves.duplicated(["trial_id", "step"]).any()
    assert len(partial.curves) < 6, "killed too late to test resume"

    # The resumed driver is a new process with its own local Ray, as a user's rerun is. The
    # uninterrupted reference runs beside it, here, through the same command line on this
    # process's Ray (one Ray start-up fewer than a third driver).
    resume_log = tmp_path / "resume.log"
    with open(resume_log, "w") as log:
        resumed = subprocess.Popen(
            sweep_command(killed, *flags, "--resume"), env=env, stdout=log, stderr=log
        )
    reference = tmp_path / "reference"
    scale = load_study("scale")
    assert study_main(scale.description, scale.presets, ["--results", str(reference), *flags]) == 0
    assert resumed.wait(timeout=300) == 0, resume_log.read_text()[-3000:]

    expected, actual = load_results(reference, "kill"), load_results(killed, "kill")
    assert len(actual.trials) == 2 and actual.trials["trial_id"].is_unique
    assert len(actual.curves) == 6 and not actual.curves.duplicated(["trial_id", "step"]).any()
    assert (actual.trials["status"] == "completed").all()
    pd.testing.assert_frame_equal(
        stable(actual.trials, ["trial_id"]), stable(expected.trials, ["trial_id"])
    )
    pd.testing.assert_frame_equal(
        stable(actual.curves, ["trial_id", "step"]), stable(expected.curves, ["trial_id", "step"])
    )


@pytest.mark.slow
def test_asha_stops_weak_trials_and_records_them_stopped(tmp_path):
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="asha",
        # bit-xor needs ~50 steps at lr 3e-3 to rise clearly above chance (0.54 at step 50 for
        # this seed, where the tiny lr stays at ~0.51): the first sets the bar, the second
        # falls below it at the first rung
        base={**TINY, "max_steps": 150, "eval_every": 50, "log_evals": False},
        grid={"lr": [3e-3, 1e-6]},
        results_dir=str(tmp_path),
        max_concurrent=1,  # one at a time: the rung comparisons, and so the outcome, are fixed
        asha=True,
        asha_grace_evals=1,
    )
    assert run_sweep(sweep).finished
    trials = load_results(tmp_path, "asha").trials.set_index("lr")
    curves = load_results(tmp_path, "asha").curves
    assert len(trials) == 2 and trials.loc[1e-6, "status"] == "stopped"
    stopped = trials[trials["status"] == "stopped"]
    assert (stopped["steps_done"] < 150).all()
    assert (stopped["stop_reason"] == "scheduler").all()
    assert trials.loc[3e-3, "status"] == "completed" and trials.loc[3e-3, "steps_done"] == 150
    for trial_id, row in trials.set_index("trial_id").iterrows():
        steps = curves.loc[curves["trial_id"] == trial_id, "step"].tolist()
        assert steps == list(range(50, row["steps_done"] + 1, 50))  # curve kept up to the stop


@pytest.mark.slow
def test_packed_sweep_rows_match_the_unpacked_sweep(lr_grid, tmp_path):
    """--pack: one process trains the lr grid over one backbone, and every member's rows are
    the rows it gets alone in the unpacked sweep (``lr_grid``): same trial ids, same curves
    (dropout 0: draw-for-draw equal)."""
    from scale_fpt.sweep import run_sweep

    packed = dataclasses.replace(lr_grid, results_dir=str(tmp_path), pack=2, max_concurrent=1)
    outcome = run_sweep(packed)
    assert outcome.finished and outcome.trials == 1  # one Tune trial: the cohort
    a, b = load_results(tmp_path, "grid"), load_results(lr_grid.results_dir, "grid")
    assert len(b.trials) == 2
    assert sorted(a.trials["trial_id"]) == sorted(b.trials["trial_id"])
    assert (a.trials["status"] == "completed").all() and len(a.curves) == 4
    keys = ["trial_id", "step"]
    for column in ("train_loss", "test_loss", "test_accuracy"):
        merged = a.curves.merge(b.curves, on=keys, suffixes=("_packed", "_alone"))
        assert len(merged) == 4
        assert merged[f"{column}_packed"].to_numpy() == pytest.approx(
            merged[f"{column}_alone"].to_numpy(), rel=1e-4, abs=1e-6
        )


def test_a_restored_experiment_state_writes_where_the_restoring_command_says(tmp_path):
    """Tune pickles its callbacks into the experiment state and ``Tuner.restore`` brings
    them back: the driver's pickle as a reference that is itself in the process that made
    it, the restoring driver's callbacks in another, and nothing elsewhere; the results
    directory it was made for is kept (a moved search is refused on it)."""
    import cloudpickle

    from scale_fpt.sweep import callbacks as cb

    def made(results: Path):
        return cb.sweep_callbacks(ResultsWriter(results, "s"))

    first = made(tmp_path / "C")
    assert first.results.results_dir == str(tmp_path / "C")
    saved = cloudpickle.dumps([first])
    assert cloudpickle.loads(saved)[0] is first  # Tune's copies in this process
    here = made(tmp_path / "E")
    with cb.serving(here):  # restored by the process that saved it, or by a new one
        assert cloudpickle.loads(saved)[0] is here
    assert [str(tmp_path / "C")] == cb.RESTORED_FROM
    del first  # a new process never made it
    inert = cloudpickle.loads(saved)[0]  # read outside a driver: does nothing
    assert len(inert) == 0 and inert.results_dir == str(tmp_path / "C")
    search = SweepConfig(
        name="s",
        results_dir=str(tmp_path / "E"),
        base=TINY,
        search={"lr": ("loguniform", 1e-4, 1e-2)},
    )
    with pytest.raises(ConfigError, match=f"resume it with --results {tmp_path / 'C'}"):
        cb.refuse_moved_search(search, here)


def test_a_half_written_trial_generator_state_is_left_to_tune(tmp_path):
    """A driver killed while Tune saved its trial generator leaves the file empty: repointing
    the saved generators skips it (Tune reads the states it saved whole) instead of failing
    the resume."""
    from scale_fpt.sweep.resume import repoint_trial_generator

    (tmp_path / "basic-variant-state-2026-11-27_13-00-00.json").write_bytes(b"")
    assert repoint_trial_generator(str(tmp_path)) == 0
