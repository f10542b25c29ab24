"""Fault injection: every test causes a real fault and then asserts the exact rows that must
exist afterwards. README.md "Guarantees under faults" lists each guarantee with its test.

- Trials: divergence (a real lr blow-up), a SIGKILLed trial process, a corrupt checkpoint,
  a real out-of-memory (an allocation beyond the worker's RLIMIT_AS), a SIGKILLed worker
  node of a multi-node Ray cluster started here.
- Results: a writer SIGKILLed mid-write, a disk that fills up (a small tmpfs; RLIMIT_FSIZE),
  a results directory that is full or read-only from the start.
- Bad input is no fault: its tests are in test_bad_input.py.

The Ray sweeps of this module share one local Ray (``local_ray``): its workers run with
RLIMIT_AS at ``WORKER_ADDRESS_SPACE``, so a trial that asks for too much memory fails at
once, as on a node without that memory, instead of swapping a shared machine. The trial
process to kill is found from Ray Tune's own per-trial ``result.json`` (each report records
the ``pid`` that made it); the same file shows from which step a retried trial continued.
The killed-driver test is ``tests/test_sweep.py::test_second_driver_is_refused_and_killed_driver_resume_matches_uninterrupted_sweep``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import TINY_TRIAL, TRAIN, files_under, own_ray, truncate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray_clusters import LocalCluster, wait_until

from scale_fpt import cli
from scale_fpt.compaction import PART_PREFIX, part_index
from scale_fpt.config import TrialConfig
from scale_fpt.recovery import tune_reports  # each report also records the ``pid`` that made it
from scale_fpt.results import ResultsError, ResultsWriter, load_results
from scale_fpt.sweep import SweepConfig, run_sweep

pytestmark = pytest.mark.faults

TINY = {
    **TINY_TRIAL,
    "accelerator": "cpu",  # never a CUDA context, whose address space is beyond RLIMIT_AS
}
METRICS = ["train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy"]
WORKER_ADDRESS_SPACE = 16 * 2**30
"""RLIMIT_AS of the module's Ray workers: ~4x what a tiny trial's worker maps (3.5 GiB)."""
HUGE_BATCH = 2**30
"""A bit-xor batch whose first tensor needs tens of GiB: beyond WORKER_ADDRESS_SPACE."""


# ---------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One local Ray for this module's in-process sweeps. Workers: RLIMIT_AS, CPU only, and
    an empty SCALE_FPT_HOME (no locally pretrained backbones)."""
    limit = WORKER_ADDRESS_SPACE
    home = tmp_path_factory.mktemp("empty_scale_fpt_home")

    def limit_address_space():  # runs in every worker process as it starts
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    # CPU-only workers (num_gpus=0): on a GPU machine they must not see the GPU either
    with own_ray(
        home,
        limit_address_space,
        cpu_only=True,
        num_cpus=2,
        num_gpus=0,
        object_store_memory=200 * 2**20,
    ):
        yield


def sweep_config(tmp_path: Path, name: str, **fields) -> SweepConfig:
    fields.setdefault("max_concurrent", 2)
    return SweepConfig(name=name, results_dir=str(tmp_path / "results"), **fields)


def tune_trial_dir(sweep: SweepConfig, **arm) -> Path | None:
    """Ray Tune's storage directory of the trial whose arm has these values."""
    for directory in (Path(sweep.ray_storage) / sweep.name).glob("tune_trial_*"):
        try:
            params = json.loads((directory / "params.json").read_text())
        except (OSError, ValueError):
            continue
        members = params.get("members", [{}])
        if len(members) == 1 and all(members[0].get(k) == v for k, v in arm.items()):
            return directory
    return None


SWEEP_DEADLINE_S = 480


def run_sweep_with_deadline(sweep: SweepConfig, resume: bool = False):
    """run_sweep, interrupted like a Ctrl-C after SWEEP_DEADLINE_S (Tune then returns with
    unfinished trials): a hung sweep fails its test instead of hanging the run."""
    timer = threading.Timer(SWEEP_DEADLINE_S, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        return run_sweep(sweep, resume=resume)
    finally:
        timer.cancel()


def run_with_fault(sweep: SweepConfig, fault):
    """Run the sweep in this thread while ``fault(done)`` injects its fault from another;
    returns (what run_sweep returned or raised, what ``fault`` returned)."""
    done = threading.Event()
    box: dict = {}

    def inject():
        try:
            box["fault"] = fault(done)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=inject, daemon=True)
    thread.start()
    try:
        outcome = run_sweep_with_deadline(sweep)
    except Exception as e:
        outcome = e
    finally:
        done.set()
        thread.join(timeout=60)
    if "error" in box:
        raise box["error"]
    return outcome, box.get("fault")


def freeze_running_trial(sweep, arm: dict, reports: int, done) -> tuple[Path, int]:
    """Wait until the trial of ``arm`` has made ``reports`` reports (each with a checkpoint)
    and is still running, then SIGSTOP its process, so that it reports nothing more, and
    wait until the driver has recorded what it had already sent (its report log stays the
    same for a second). Returns (Tune's trial dir, pid)."""

    def running():
        directory = tune_trial_dir(sweep, **arm)
        found = tune_reports(directory) if directory else []
        return len(found) >= reports and not found[-1]["final"] and (directory, found[-1]["pid"])

    directory, pid = wait_until(running, f"{reports} reports of trial {arm}", done)
    os.kill(pid, signal.SIGSTOP)
    seen = [-1]

    def settled():
        count, seen[0] = seen[0], len(tune_reports(directory))
        time.sleep(1.0)
        return count == seen[0]

    try:
        wait_until(settled, "the driver to record the frozen trial's reports", timeout=30)
    except BaseException:
        os.kill(pid, signal.SIGCONT)  # never leave the sweep waiting on a stopped trial
        raise
    return directory, pid


def steps_by_pid(trial_dir: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for report in tune_reports(trial_dir):
        out.setdefault(report["pid"], []).append(report["step"])
    return out


def resumed_after_reported_steps(before: list[int], retry: list[int], every: int):
    """``retry`` (a retry's steps) resumed after a checkpoint of the killed process whose steps
    Tune's ``result.json`` holds as ``before``. The file can lack the killed process's last
    reports: Tune writes it on the driver and copies it to storage in the background when it
    saves the experiment state, and a retry's start copies the storage copy back over the
    driver's (``LoggerCallback._restore_from_remote``). So the retry starts after the
    checkpoint before ``before``'s last step (a kill between a report and the persisting of
    its checkpoint: Ray reports that step again, the results keep it once) or later."""
    assert before == list(range(every, before[-1] + 1, every)), before
    assert retry[0] > before[-1] - every, (before, retry)
    assert retry == list(range(retry[0], retry[-1] + 1, every)), retry


def uninterrupted_curve(sweep: SweepConfig, **arm) -> pd.DataFrame:
    """The curve the trial of ``arm`` has when nothing interrupts it (run here, in-process)."""
    from scale_fpt.trial import TrialRun

    (flat,) = [a for a in sweep.trials() if all(a.get(k) == v for k, v in arm.items())]
    trial = TrialRun([TrialConfig.from_flat(flat)], sweep=sweep.name)
    rows: list[dict] = []
    try:
        trial.run(on_eval=lambda curve_rows, trial_rows: rows.extend(curve_rows))
    finally:
        trial.close()
    return pd.DataFrame(rows)


def assert_same_curve(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        actual[["step", *METRICS]].reset_index(drop=True),
        expected[["step", *METRICS]].reset_index(drop=True),
        check_dtype=False,
    )


def rows_by(frame: pd.DataFrame, column: str) -> dict:
    return {key: group.reset_index(drop=True) for key, group in frame.groupby(column)}


def visible_parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


# ------------------------------------------------------------------------- trial faults


@pytest.fixture(scope="module")
def failing_trials_sweep(local_ray, tmp_path_factory):
    """One finished sweep whose trials fail in every way that needs no outside fault, each
    checked by its own test below: lr 1e5 and 2e5 diverge (Attention trained at lr 1e5, the
    paper's Table 8 blow-up), lr 2e-3 cannot be built, lr 3e-3 runs out of memory (a batch
    beyond the workers' RLIMIT_AS) on every attempt, lr 1e-3 is healthy. One sweep instead
    of one per fault: a sweep's start-up (Tune, worker processes, imports) is most of its
    time. max_failures=1: the out-of-memory trial is retried once; the others are never
    retried whatever it is."""
    sweep = sweep_config(
        tmp_path_factory.mktemp("failing"),
        "failing",
        base={**TINY, "max_steps": 20, "eval_every": 10},
        grid={"lr": [1e-3, 1e5, 2e5, 2e-3, 3e-3]},
        overrides=(
            ({"lr": 1e5}, {"finetune": "fpt+attn", "eval_every": 1}),
            ({"lr": 2e5}, {"finetune": "fpt+attn"}),
            ({"lr": 2e-3}, {"init": "pretrained"}),  # no locally pretrained gpt2-tiny
            ({"lr": 3e-3}, {"batch_size": HUGE_BATCH}),
        ),
        max_failures=1,
        pack=1,  # one trial per Tune trial (and process), as the faults are aimed
    )
    outcome = run_sweep_with_deadline(sweep)
    results = load_results(sweep.results_dir, sweep.name)
    return SimpleNamespace(
        outcome=outcome,
        trials=results.trials.set_index("lr"),
        curves=rows_by(results.curves, "trial_id"),
        results=results,
    )


@pytest.mark.slow
def test_diverging_and_unbuildable_trials_are_recorded_and_the_sweep_goes_on(
    failing_trials_sweep,
):
    """Attention trained at lr 1e5 (the paper's Table 8 blow-up): a trial that diverges
    after some evaluations keeps its curve up to the last finite one; one that diverges
    before its first evaluation, and one that cannot be built (pretrained weights that do
    not exist), end with their own rows. None stops the sweep; the healthy trial completes."""
    outcome, trials = failing_trials_sweep.outcome, failing_trials_sweep.trials
    results, curves = failing_trials_sweep.results, failing_trials_sweep.curves
    assert outcome.finished and outcome.trials == 5
    assert len(trials) == 5 and trials["trial_id"].is_unique
    assert not results.curves.duplicated(["trial_id", "step"]).any()

    healthy = trials.loc[1e-3]
    assert (healthy["status"], healthy["steps_done"]) == ("completed", 20)
    assert curves[healthy["trial_id"]]["step"].tolist() == [10, 20]

    late = trials.loc[1e5]
    curve = curves[late["trial_id"]]
    assert late["status"] == "diverged" and pd.isna(late["error"])
    assert 1 < late["steps_done"] < 20
    assert curve["step"].tolist() == list(range(1, len(curve) + 1))  # every finite evaluation
    assert len(curve) <= late["steps_done"]
    assert curve[["train_loss", "test_loss"]].map(pd.notna).all().all()
    assert late["final_test_accuracy"] == curve["test_accuracy"].iloc[-1]
    assert late["final_test_loss"] == curve["test_loss"].iloc[-1]
    assert late["best_test_accuracy"] == curve["test_accuracy"].max()

    early = trials.loc[2e5]
    assert early["status"] == "diverged" and 1 <= early["steps_done"] < 10
    assert early["trial_id"] not in curves  # no evaluation happened
    assert pd.isna(early["final_test_accuracy"]) and pd.isna(early["best_test_accuracy"])

    unbuildable = trials.loc[2e-3]
    assert (unbuildable["status"], unbuildable["steps_done"]) == ("failed", 0)
    assert "scale-fpt pretrain" in unbuildable["error"]
    assert "Failure #" not in unbuildable["error"]  # recorded by the trial: never retried
    assert unbuildable["trial_id"] not in curves


@pytest.mark.slow
def test_out_of_memory_trial_is_retried_then_failed(failing_trials_sweep):
    """A batch too large for the worker's memory (RLIMIT_AS) fails with the allocator's
    out-of-memory error on every attempt: retried max_failures times, then one failed row
    with the error; the other trials complete or end as they would alone."""
    outcome, trials = failing_trials_sweep.outcome, failing_trials_sweep.trials
    curves = failing_trials_sweep.curves
    assert outcome.finished
    oom, healthy = trials.loc[3e-3], trials.loc[1e-3]
    assert oom["batch_size"] == HUGE_BATCH
    assert (oom["status"], oom["steps_done"]) == ("failed", 0)
    assert "can't allocate memory" in oom["error"]
    assert "Failure # 2" in oom["error"]  # Tune's record: the first attempt and one retry
    assert "Failure # 3" not in oom["error"]
    assert oom["trial_id"] not in curves
    assert (healthy["status"], healthy["steps_done"]) == ("completed", 20)
    assert curves[healthy["trial_id"]]["step"].tolist() == [10, 20]


def in_parallel(*faults):
    """One fault (for ``run_with_fault``) that injects ``faults`` side by side, each in its
    own thread (a trial can finish while another fault is still being set up); returns
    their results in order."""

    def fault(done):
        found: list = [None] * len(faults)
        errors: list[BaseException] = []

        def inject(i):
            try:
                found[i] = faults[i](done)
            except BaseException as e:
                errors.append(e)

        threads = [
            threading.Thread(target=inject, args=(i,), daemon=True) for i in range(len(faults))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return found

    return fault


@pytest.fixture(scope="module")
def killed_trials_sweep(local_ray, tmp_path_factory):
    """One sweep of three trials (max_failures=1), each checked by its own test below: the
    process of lr 2e-3 is SIGKILLed after its second report; lr 3e-3's checkpoint files are
    overwritten with garbage, then its process is SIGKILLed; lr 1e-3 is left alone. (One
    sweep for both faults: a sweep's start-up is most of its time.)"""
    sweep = sweep_config(
        tmp_path_factory.mktemp("killed"),
        "killed",
        base={**TINY, "max_steps": 60, "eval_every": 5},
        grid={"lr": [1e-3, 2e-3, 3e-3]},
        max_failures=1,
        pack=1,  # one trial per process: three trials on two slots would be packed
    )

    def kill(done):
        trial_dir, pid = freeze_running_trial(sweep, {"lr": 2e-3}, 2, done)
        os.kill(pid, signal.SIGKILL)
        return trial_dir, pid

    def corrupt_then_kill(done):
        trial_dir, pid = freeze_running_trial(sweep, {"lr": 3e-3}, 2, done)
        try:
            corrupted = list(trial_dir.glob("checkpoint_*/**/*.pt"))
            for path in corrupted:
                path.write_bytes(b"this is not a checkpoint " * 64)
        finally:
            os.kill(pid, signal.SIGKILL)
        return trial_dir, pid, corrupted

    outcome, (killed, corrupt) = run_with_fault(sweep, in_parallel(kill, corrupt_then_kill))
    assert not isinstance(outcome, Exception), outcome
    results = load_results(sweep.results_dir, sweep.name)
    return SimpleNamespace(
        sweep=sweep,
        outcome=outcome,
        killed=killed,
        corrupt=corrupt,
        trials=results.trials.set_index("lr"),
        curves=rows_by(results.curves, "trial_id"),
    )


@pytest.mark.slow
def test_killed_trial_process_is_retried_from_its_checkpoint(killed_trials_sweep):
    """SIGKILL the process running one trial mid-way: Tune retries it, the retry restores
    the last checkpoint (its first report is the evaluation after it), the curve has every
    step once and equals an uninterrupted run's; the other trial never notices."""
    sweep, outcome = killed_trials_sweep.sweep, killed_trials_sweep.outcome
    trials, curves = killed_trials_sweep.trials, killed_trials_sweep.curves
    trial_dir, pid = killed_trials_sweep.killed
    assert outcome.finished
    assert len(trials) == 3
    for lr in (1e-3, 2e-3):
        assert (trials.loc[lr, "status"], trials.loc[lr, "steps_done"]) == ("completed", 60)
        assert curves[trials.loc[lr, "trial_id"]]["step"].tolist() == list(range(5, 61, 5))

    by_pid = steps_by_pid(trial_dir)
    before = by_pid.pop(pid)  # what the killed process reported
    assert before == list(range(5, before[-1] + 1, 5)) and before[-1] < 60
    (retry,) = by_pid.values()  # one retry, in a new process
    resumed_after_reported_steps(before, retry, every=5)
    assert retry == list(range(retry[0], 61, 5))
    other = tune_trial_dir(sweep, lr=1e-3)
    assert len(steps_by_pid(other)) == 1  # the other trial ran in one process throughout

    killed_curve = curves[trials.loc[2e-3, "trial_id"]]
    assert_same_curve(killed_curve, uninterrupted_curve(sweep, lr=2e-3))
    assert trials.loc[2e-3, "final_test_loss"] == killed_curve["test_loss"].iloc[-1]


@pytest.mark.slow
def test_corrupt_checkpoint_fails_the_trial_without_retry(killed_trials_sweep):
    """Overwrite a trial's checkpoint files with garbage, then SIGKILL it: the retry finds
    the checkpoint damaged and fails the trial at once (a damaged file stays damaged: no
    further retry, no training), the row says failed with the error naming the file, the
    curve keeps what was reported; the other trial completes."""
    outcome, trials = killed_trials_sweep.outcome, killed_trials_sweep.trials
    curves = killed_trials_sweep.curves
    trial_dir, pid, corrupted = killed_trials_sweep.corrupt
    assert outcome.finished and corrupted
    (killed_pid, before), *retries = steps_by_pid(trial_dir).items()
    assert killed_pid == pid and before == list(range(5, before[-1] + 1, 5)) and before[-1] < 60
    assert [steps for _, steps in retries] == [[0]]  # one retry: its failed row, no step

    failed, healthy = trials.loc[3e-3], trials.loc[1e-3]
    assert failed["status"] == "failed"
    assert "not a torch checkpoint (damaged or truncated" in failed["error"]
    assert re.search(r"cannot read \S+\.pt: not a torch checkpoint", failed["error"])
    # What the killed process reported (result.json may lack its last reports: see
    # resumed_after_reported_steps), each once, as an uninterrupted run has it.
    curve = curves[failed["trial_id"]]
    assert curve["step"].tolist()[: len(before)] == before and curve["step"].max() < 60
    uninterrupted = uninterrupted_curve(killed_trials_sweep.sweep, lr=3e-3)
    assert_same_curve(curve, uninterrupted[: len(curve)])
    assert (healthy["status"], healthy["steps_done"]) == ("completed", 60)
    assert curves[healthy["trial_id"]]["step"].tolist() == list(range(5, 61, 5))


def interrupted_after_two_evaluations(sweep: SweepConfig):
    """Run the sweep and Ctrl-C it (SIGINT to this process) once a curve has two rows;
    returns what run_sweep returned."""
    curve_dir = Path(sweep.results_dir) / sweep.name / "curves"

    def interrupt(done):
        def two_rows():
            files = list(curve_dir.glob("[!.]*.parquet"))
            return files and pq.read_table(files[0]).num_rows >= 2

        wait_until(two_rows, "two curve rows", done)
        os.kill(os.getpid(), signal.SIGINT)

    outcome, _ = run_with_fault(sweep, interrupt)
    assert not isinstance(outcome, Exception), outcome
    return outcome


def holding(table_dir: Path, trial_id: str) -> Path:
    """The file holding a trial's rows: its own, or (an ended trial's) a compacted one."""
    own = table_dir / f"{trial_id}.parquet"
    return own if own.exists() else table_dir / part_index(table_dir)[trial_id][0]


def damage(sweep_dir: Path, trial_id: str, curve_id: str) -> list[Path]:
    """Truncate the file holding the trials row of ``trial_id`` and the one holding the
    curve of ``curve_id``, and put a garbage ``*.parquet`` beside each: the damaged files,
    as readers must name them."""
    damaged = [holding(sweep_dir / "trials", trial_id), holding(sweep_dir / "curves", curve_id)]
    for path in damaged:
        truncate(path)
    for table in ("trials", "curves"):
        garbage = sweep_dir / table / "stray.parquet"
        garbage.write_bytes(b"PAR1 this was never a Parquet file " * 8)
        damaged.append(garbage)
    return damaged


def warned_files(caplog) -> list[str]:
    """The files named by the damaged-file warnings logged since the last call."""
    names = [
        record.getMessage().split("damaged results file ")[1].split(" (")[0]
        for record in caplog.records
        if "damaged results file" in record.getMessage()
    ]
    caplog.clear()
    return sorted(names)


def assert_readers_skip_and_name(sweep: SweepConfig, damaged: list[Path], caplog, out: Path):
    """load_results, the end-of-sweep summary and `scale-fpt report` read around the damaged
    files, naming each once; returns what load_results read."""
    from scale_fpt.study import summary_table

    caplog.clear()
    results = load_results(sweep.results_dir, sweep.name)
    assert warned_files(caplog) == sorted(map(str, damaged))
    summary = summary_table(sweep)
    if results.trials.empty:
        assert summary == "(no trials)"
    else:
        assert f"statuses {results.trials['status'].value_counts().to_dict()}" in summary
    assert warned_files(caplog) == sorted(map(str, damaged))
    report = ["report", sweep.results_dir, "--out", str(out), "--no-attention"]
    assert cli.main(report) == (2 if results.trials.empty else 0)  # 2: "nothing to report"
    assert warned_files(caplog) == sorted(map(str, damaged))
    return results


def directory_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_interrupted_sweep_is_reported_unfinished_and_resume_completes_it(
    local_ray, tmp_path, monkeypatch, caplog
):
    """Ctrl-C (SIGINT to the driver) mid-sweep: Tune returns without raising; the sweep
    reports every trial of its grid unfinished (the two Tune had not generated yet too; the
    scripts then exit 130 and say --resume), the running trial's row stays `running` next to
    its curve so far. Then its files are damaged (truncated, plus garbage files): readers
    skip and name them, and resuming re-derives the lost rows from Tune's log and finishes
    every trial with every step once."""
    from scale_fpt.sweep import saved_unfinished

    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # Tune generates trials one by one
    sweep = sweep_config(
        tmp_path,
        "interrupt",
        base={**TINY, "max_steps": 60, "eval_every": 5},
        grid={"lr": [1e-3, 2e-3, 3e-3]},
        overrides=(({"lr": 2e-3}, {"max_steps": 10}), ({"lr": 3e-3}, {"max_steps": 10})),
        max_concurrent=1,
    )
    sweep_dir = Path(sweep.results_dir) / sweep.name
    outcome = interrupted_after_two_evaluations(sweep)
    assert saved_unfinished(str(Path(sweep.ray_storage) / sweep.name)) < 3  # not all generated
    assert (outcome.unfinished, outcome.finished) == (3, False)
    partial = load_results(sweep.results_dir, sweep.name)
    steps = partial.curves["step"].tolist()
    assert 2 <= len(steps) < 12 and steps == list(range(5, 5 * len(steps) + 1, 5))
    (row,) = partial.trials.to_dict("records")
    assert row["status"] == "running" and row["steps_done"] == steps[-1]

    damaged = damage(sweep_dir, row["trial_id"], row["trial_id"])
    skipped = assert_readers_skip_and_name(sweep, damaged, caplog, tmp_path / "report")
    assert skipped.trials.empty and skipped.curves.empty

    outcome = run_sweep_with_deadline(sweep, resume=True)  # names the damaged files too
    assert outcome.finished
    caplog.clear()
    results = load_results(sweep.results_dir, sweep.name)
    assert warned_files(caplog) == sorted(str(p) for p in damaged if p.stem == "stray")
    trials = results.trials.set_index("lr")
    assert (trials["status"] == "completed").all() and len(trials) == 3
    assert trials.sort_index()["steps_done"].tolist() == [60, 10, 10]
    curve = results.curves[results.curves["trial_id"] == row["trial_id"]]
    assert curve["step"].tolist() == list(range(5, 61, 5))
    assert not results.curves.duplicated(["trial_id", "step"]).any()


@pytest.fixture(scope="module")
def resumed_copy(local_ray, tmp_path_factory):
    """A sweep interrupted (Ctrl-C) in results C with Tune storage Cstore, with what it left
    in C; then Cstore copied to Estore and the copy resumed with results E, with what that
    left in C and E. Two tests below check it: one reads C and E, the other then damages E,
    a finished sweep, and resumes it in place (each touches only what is its own)."""
    import dataclasses

    root = tmp_path_factory.mktemp("moved")
    sweep = sweep_config(
        root / "C",
        "moved",
        base={**TINY, "max_steps": 30, "eval_every": 5},
        grid={"lr": [1e-3, 2e-3]},
        max_concurrent=1,
        pack=1,  # two Tune trials: the second is generated after the interruption
        storage_path=str(root / "Cstore"),
    )
    # max_concurrent 1: Tune generates the second trial only once the first has ended, so
    # the interruption comes before it exists and the copy's resume generates it.
    outcome = interrupted_after_two_evaluations(sweep)
    in_c = directory_files(Path(sweep.results_dir))
    in_cstore = directory_files(root / "Cstore")
    shutil.copytree(root / "Cstore", root / "Estore")
    copy = dataclasses.replace(
        sweep, results_dir=str(root / "E"), storage_path=str(root / "Estore")
    )
    copy_outcome = run_sweep_with_deadline(copy, resume=True)
    return SimpleNamespace(
        root=root,
        outcome=outcome,
        in_c=in_c,
        in_c_after_copy=directory_files(Path(sweep.results_dir)),
        in_cstore=in_cstore,
        in_cstore_after_copy=directory_files(root / "Cstore"),
        copy=copy,
        copy_outcome=copy_outcome,
        copy_results=load_results(copy.results_dir, copy.name),
    )


@pytest.mark.slow
def test_resumed_copy_of_a_sweep_writes_where_the_command_says(resumed_copy):
    """A sweep interrupted in results C with Tune storage Cstore before Tune generated its
    second trial; Cstore is copied to Estore and the sweep resumed with results E and
    storage Estore: every trial's rows land in E, complete (the steps run before the copy
    re-derived from Tune's log), every trial's Tune folder (the one generated during the
    resume too) in Estore, and no file under C or Cstore changes (the restored Tune state
    names them; the resume writes to E and Estore regardless)."""
    assert not resumed_copy.outcome.finished and resumed_copy.in_c
    assert resumed_copy.copy_outcome.finished
    assert resumed_copy.in_c_after_copy == resumed_copy.in_c
    assert resumed_copy.in_cstore_after_copy == resumed_copy.in_cstore
    copied = sorted(p.name for p in (resumed_copy.root / "Cstore" / "moved").glob("tune_trial_*"))
    assert len(copied) == 1  # interrupted before the second trial existed
    trial_dirs = sorted((resumed_copy.root / "Estore" / "moved").glob("tune_trial_*"))
    assert len(trial_dirs) == 2 and copied[0] in [d.name for d in trial_dirs]
    assert all((d / "result.json").stat().st_size for d in trial_dirs)
    results = resumed_copy.copy_results
    assert len(results.trials) == 2 and (results.trials["status"] == "completed").all()
    for _, curve in results.curves.groupby("trial_id"):
        assert curve["step"].tolist() == list(range(5, 31, 5))


@pytest.mark.slow
def test_damaged_results_files_of_a_finished_sweep_are_named_then_rederived_by_resume(
    resumed_copy, caplog
):
    """A finished sweep whose files are damaged afterwards (the compacted files holding one
    trial's row and the other's curve truncated, garbage files beside them): load_results,
    the summary and `scale-fpt report` read the rest and name each damaged file; --resume
    rewrites the trials' rows from Tune's log, equal to what was there before; the damaged
    files, no trial's now, stay named. (The finished sweep: E of ``resumed_copy``, finished
    by resuming a copy of an interrupted sweep's Tune state.)"""
    sweep = resumed_copy.copy
    before = load_results(sweep.results_dir, sweep.name)
    assert len(before.trials) == 2 and (before.trials["status"] == "completed").all()
    first, second = before.trials["trial_id"]
    damaged = damage(Path(sweep.results_dir) / sweep.name, first, second)
    # The driver compacted the ended trials: one file holds both rows, one both curves.
    assert [p.name.startswith(PART_PREFIX) for p in damaged] == [True, True, False, False]

    out = resumed_copy.root / "damaged_report"
    skipped = assert_readers_skip_and_name(sweep, damaged, caplog, out)
    assert skipped.trials.empty and skipped.curves.empty

    assert run_sweep_with_deadline(sweep, resume=True).finished  # names the damaged files too
    caplog.clear()
    after = load_results(sweep.results_dir, sweep.name)
    assert warned_files(caplog) == sorted(map(str, damaged))
    pd.testing.assert_frame_equal(after.trials, before.trials)
    pd.testing.assert_frame_equal(after.curves, before.curves)


@pytest.mark.slow
def test_resumed_copy_of_a_search_into_other_results_is_refused(local_ray, tmp_path):
    """An Optuna search's restored searcher keeps its study in the first results directory's
    optuna.db: resuming a copy of its Tune state with other --results is refused (one line
    naming the first directory, exit code 2 in the scripts) before anything runs or is
    written, instead of adding trials to the first directory's study."""
    import dataclasses

    sweep = sweep_config(
        tmp_path / "C",
        "search",
        base={**TINY, "max_steps": 2, "eval_every": 2},
        search={"lr": ("loguniform", 1e-4, 1e-2)},
        search_trials=1,
        storage_path=str(tmp_path / "Cstore"),
    )
    assert run_sweep_with_deadline(sweep).finished
    optuna_db = (Path(sweep.results_dir) / sweep.name / "optuna.db").read_bytes()
    shutil.copytree(tmp_path / "Cstore", tmp_path / "Estore")
    copy = dataclasses.replace(
        sweep, results_dir=str(tmp_path / "E"), storage_path=str(tmp_path / "Estore")
    )
    with pytest.raises(ResultsError) as error:
        run_sweep_with_deadline(copy, resume=True)
    (line,) = str(error.value).splitlines()
    assert f"resume it with --results {tmp_path / 'C'}" in line
    assert (Path(sweep.results_dir) / sweep.name / "optuna.db").read_bytes() == optuna_db
    assert visible_parquet_files(tmp_path / "E") == []


# ----------------------------------------------------------------------------- disk faults


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, unmounted afterwards; skipped where this process may not mount."""
    mountpoint = tmp_path / "small_disk"
    mountpoint.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command here")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no block left: a real ENOSPC for the next writer."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    assert os.statvfs(disk).f_bavail == 0
    return filler


@pytest.mark.slow
def test_disk_full_mid_sweep_stops_with_one_error_then_resume_finishes(
    local_ray, tmp_path, small_disk
):
    """The results disk fills up while a sweep runs (another process takes the last block):
    the sweep stops with the failing write's one-line error, every file already written is
    intact, and --resume after space is freed finishes with every row exactly once."""
    sweep = sweep_config(
        small_disk,
        "full",
        base={**TINY, "max_steps": 40, "eval_every": 5},
        grid={"lr": [1e-3]},
        storage_path=str(tmp_path / "ray"),  # checkpoints elsewhere: only results fill up
    )
    curve_dir = Path(sweep.results_dir) / sweep.name / "curves"

    def fill_after_two_evaluations(done):
        def two_rows():
            files = list(curve_dir.glob("[!.]*.parquet"))
            return files and pq.read_table(files[0]).num_rows >= 2

        wait_until(two_rows, "two curve rows", done)
        return fill(small_disk)

    error, filler = run_with_fault(sweep, fill_after_two_evaluations)
    assert isinstance(error, ResultsError), error
    (message,) = str(error).splitlines()
    assert "No space left on device" in message and str(small_disk) in message
    assert "--resume" in message

    # What was written before the disk filled up is whole and consistent.
    root = Path(sweep.results_dir) / sweep.name
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    for path in visible_parquet_files(root):
        pq.read_table(path)
    partial = load_results(sweep.results_dir, sweep.name)
    steps = partial.curves["step"].tolist()
    assert 2 <= len(steps) < 8 and steps == list(range(5, 5 * len(steps) + 1, 5))
    (row,) = partial.trials.to_dict("records")
    # An evaluation writes its curve row, then the trial row: a disk that fills between the
    # two leaves the trial row one evaluation behind (never ahead); --resume rewrites both.
    assert row["status"] == "running" and row["steps_done"] in steps[-2:]

    filler.unlink()
    outcome = run_sweep_with_deadline(sweep, resume=True)
    assert outcome.finished
    results = load_results(sweep.results_dir, sweep.name)
    (row,) = results.trials.to_dict("records")
    assert (row["status"], row["steps_done"]) == ("completed", 40)
    assert results.curves["step"].tolist() == list(range(5, 41, 5))


def limit_file_size(size: int):
    """preexec_fn: files this process writes may not exceed ``size`` bytes (EFBIG beyond,
    instead of the default SIGXFSZ that kills it)."""

    def apply():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return apply


@pytest.mark.slow
def test_results_write_beyond_the_file_size_limit_stops_train_with_one_error(tmp_path):
    """`scale-fpt train` whose writes may not exceed 8 KiB (RLIMIT_FSIZE): the first curve
    file (~5 KiB) is written, the first trials file (~16 KiB) is not. Exit code 2, one line
    naming the file and the cause, no traceback; the curve already written is intact."""
    results = tmp_path / "results"
    done = subprocess.run(
        [*TRAIN, "--steps", "20", "--eval-every", "5", "--results", str(results)],
        preexec_fn=limit_file_size(8192),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("scale-fpt: error: cannot write results file ")
    assert "File too large" in line and str(results / "train" / "trials") in line
    sweep_dir = results / "train"
    (curve_file,) = visible_parquet_files(sweep_dir / "curves")
    assert pq.read_table(curve_file).column("step").to_pylist() == [5]
    assert files_under(sweep_dir) == ["_schema.json", f"curves/{curve_file.name}"]


def test_full_or_read_only_results_dir_fails_at_start_up(tmp_path, small_disk, capfd):
    """A results directory on a full disk, then on a read-only one: `scale-fpt sweep` and
    `scale-fpt train` stop before any trial runs, exit code 2, one line naming the directory
    and the cause; nothing is written."""
    yaml_file = tmp_path / "sweep.yaml"
    yaml_file.write_text(
        "name: startup\nbase: {task: bit-xor, model: gpt2-tiny, init: random, max_steps: 2}\n"
    )
    results = small_disk / "results"
    fill(small_disk)
    for argv in (["sweep", str(yaml_file)], [*TRAIN[1:], "--steps", "2"]):
        code = cli.main([*argv, "--results", str(results)])
        _, err = capfd.readouterr()
        assert code == 2, err
        (line,) = [x for x in err.splitlines() if x.startswith("scale-fpt")]
        assert "No space left on device" in line and str(results) in line
        assert "Traceback" not in err
    assert files_under(results) == []

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for argv in (["sweep", str(yaml_file)], [*TRAIN[1:], "--steps", "2"]):
        code = cli.main([*argv, "--results", str(small_disk / "elsewhere")])
        _, err = capfd.readouterr()
        assert code == 2, err
        (line,) = [x for x in err.splitlines() if x.startswith("scale-fpt")]
        assert "Read-only file system" in line and str(small_disk / "elsewhere") in line
    assert not (small_disk / "elsewhere").exists()


BAD_STORAGE = {
    "read-only storage path": (["--storage", "{ro}/ray"], "Read-only file system"),
    "unknown storage scheme": (["--storage", "notaurl://x"], "Unrecognized filesystem type"),
    "Optuna URL of no database": (["--optuna-storage", "notaurl://x"], "not a database URL"),
    "SQLite file in no directory": (
        ["--optuna-storage", "sqlite:////nonexistent/x.db"],
        "directory /nonexistent does not exist",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_STORAGE))
def test_bad_storage_exits_2_before_ray_starts_and_writes_nothing(
    case, tmp_path, capsys, monkeypatch, request
):
    """A grid sweep (which uses no Optuna storage, and still checks a given URL) with a bad
    --storage or --optuna-storage: one line naming the flag and the cause, exit code 2, Ray
    never started, no results skeleton. The same through `scale-fpt sweep FILE.yaml`."""
    from scale_fpt.study import study_main
    from scale_fpt.sweep import driver as sweep_driver

    def ray_must_not_start(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(sweep_driver, "connect_ray", ray_must_not_start)
    flags, cause = BAD_STORAGE[case]
    if "{ro}" in flags[1]:
        disk = request.getfixturevalue("small_disk")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        flags = [flags[0], flags[1].format(ro=disk)]
    presets = {"local": lambda: SweepConfig(name="store", base={**TINY, "max_steps": 2})}
    results = tmp_path / "results"
    assert study_main("store", presets, ["--results", str(results), *flags]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"error: {flags[0]} " in line and cause in line, line

    field = {"--storage": "storage_path", "--optuna-storage": "optuna_storage"}[flags[0]]
    yaml_file = tmp_path / "sweep.yaml"
    yaml_file.write_text(f"name: store\nbase: {{task: bit-xor}}\n{field}: '{flags[1]}'\n")
    assert cli.main(["sweep", str(yaml_file), "--results", str(results)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"scale-fpt: error: {flags[0]} ") and cause in line, line
    assert not results.exists()


WRITER_LOOP = """
import os, sys, time
from scale_fpt.results import ResultsWriter
from scale_fpt.config import TrialConfig
root, start, stall_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fsyncs, real_fsync = 0, os.fsync

def fsync(fd):  # the stall_at-th write stops between its bytes and its rename, to be killed
    global fsyncs
    fsyncs += 1
    if fsyncs == stall_at:
        print("stalled", flush=True)
        time.sleep(600)
    real_fsync(fd)

os.fsync = fsync
flat = TrialConfig().to_flat()
writer = ResultsWriter(root, "s")
for step in range(start, 10**9):
    for trial_id in ("a", "b"):
        writer.write_curve(trial_id, [dict(flat, step=step, test_accuracy=step / 7)])
        writer.write_trial(dict(flat, trial_id=trial_id, status="running", steps_done=step))
"""


@pytest.mark.slow
def test_writer_killed_mid_write_never_leaves_a_broken_file(tmp_path):
    """SIGKILL a process that rewrites results files as fast as it can, eight times,
    restarting it each time: at random moments, and (every other time) inside a write, its
    bytes in a temporary not yet renamed. Every file a reader sees is a whole Parquet file
    whose rows are consistent (each curve 1..n, once each); the temporaries that kills left
    are hidden from every reader."""
    import random

    rng = random.Random(0)
    root = tmp_path / "results"
    start = 1
    for kill in range(8):
        stall_at = rng.randint(1, 8) if kill % 2 else 0  # 0: never
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER_LOOP, str(root), str(start), str(stall_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if stall_at:
            assert writer.stdout.readline() == "stalled\n", writer.stderr.read()[-2000:]
        else:
            wait_until(
                lambda w=writer: (
                    len(visible_parquet_files(root / "s")) == 4 or w.poll() is not None
                ),
                "the writer's first files",
            )
            time.sleep(rng.uniform(0.2, 0.6))
        writer.kill()
        _, err = writer.communicate()
        assert writer.returncode == -signal.SIGKILL, err[-2000:]

        if stall_at:  # the kill inside a write left its temporary, which readers must skip
            assert len(list(root.rglob(f".*.{writer.pid}.tmp"))) == 1
        for path in visible_parquet_files(root):
            pq.read_table(path)
        results = load_results(root, "s")
        assert sorted(results.trials["trial_id"]) == ["a", "b"]
        for trial_id, curve in rows_by(results.curves, "trial_id").items():
            assert curve["step"].tolist() == list(range(1, len(curve) + 1)), trial_id
            done = results.trials.set_index("trial_id").loc[trial_id, "steps_done"]
            assert done <= len(curve) <= done + 1  # the curve is written before the row
        start = int(results.trials["steps_done"].min()) + 1


# ------------------------------------------------------------------------ a killed node


@pytest.fixture
def ray_cluster():
    """A head and one worker node of one CPU each, torn down by pid whatever happens. The
    head's GCS checks its nodes every 0.5 s and declares one dead after 3 failed checks in a
    row (Ray's defaults: 3 s and 5, i.e. ~15 s of waiting after the kill); a killed raylet
    fails every check at once (connection refused), a slow one still has each check's timeout."""
    cluster = LocalCluster(RAY_health_check_period_ms="500", RAY_health_check_failure_threshold="3")
    try:
        cluster.launch(workers=1)
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_killed_worker_node_trials_resume_elsewhere_from_checkpoints(ray_cluster, tmp_path):
    """Two trials on a two-node cluster, driven by `scale-fpt sweep FILE.yaml` attached
    through RAY_ADDRESS (its own process: Ray's per-process state stays out of the test).
    SIGKILL every process of the worker node (raylet, agents, the trial's worker) mid-trial:
    its trial is rescheduled on the head node and resumes from its last checkpoint (storage
    both nodes see); the Parquet output has each trial once, each (trial_id, step) once,
    equal to an uninterrupted run."""
    import dataclasses

    sweep_file = tmp_path / "node.yaml"
    sweep_file.write_text(
        "name: node\n"
        "base: {task: bit-xor, model: gpt2-tiny, init: random, test_batches: 2,\n"
        "       accelerator: cpu, max_steps: 60, eval_every: 5}\n"
        "grid: {lr: [0.001, 0.002]}\n"
        "max_concurrent: 2\nmax_failures: 2\npack: 1\n"  # a Tune trial each: one per node
    )
    results = tmp_path / "results"
    sweep = dataclasses.replace(SweepConfig.from_yaml(sweep_file), results_dir=str(results))
    env = {**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scale_fpt.cli",
            "sweep",
            str(sweep_file),
            "--results",
            str(results),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker_node = ray_cluster.workers[0]
    try:

        def trial_on_worker_node():
            pids = {p.pid for p in ray_cluster.processes(worker_node)}
            for lr in (1e-3, 2e-3):
                directory = tune_trial_dir(sweep, lr=lr)
                found = tune_reports(directory) if directory else []
                if len(found) >= 2 and not found[-1]["final"] and found[-1]["pid"] in pids:
                    return directory, found[-1]["pid"], lr
            return None

        driver_done = SimpleNamespace(is_set=lambda: driver.poll() is not None)
        try:
            found = wait_until(trial_on_worker_node, "a trial on the worker", driver_done)
        except AssertionError as e:
            driver.kill()  # its output ends: a driver still retrying would hold the pipe open
            printed = driver.communicate()[0][-3000:]
            raise AssertionError(
                f"{e}; the driver printed:\n{printed}\n{ray_cluster.logs()}"
            ) from e
        trial_dir, pid, lr = found
        killed = ray_cluster.kill(worker_node)
        output, _ = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, output[-3000:]
    assert pid in killed and len(killed) >= 3  # at least ray start, the raylet, the trial

    results = load_results(sweep.results_dir, sweep.name)
    trials = results.trials.set_index("lr")
    assert len(trials) == 2 and trials["trial_id"].is_unique
    assert (trials["status"] == "completed").all() and (trials["steps_done"] == 60).all()
    assert not results.curves.duplicated(["trial_id", "step"]).any()
    curves = rows_by(results.curves, "trial_id")
    for trial_id in trials["trial_id"]:
        assert curves[trial_id]["step"].tolist() == list(range(5, 61, 5))

    by_pid = steps_by_pid(trial_dir)
    before = by_pid.pop(pid)  # what the trial reported on the worker node
    assert before == list(range(5, before[-1] + 1, 5)) and before[-1] < 60
    (retry,) = by_pid.values()  # one retry, in a new process
    resumed_after_reported_steps(before, retry, every=5)
    assert retry == list(range(retry[0], 61, 5))
    assert_same_curve(curves[trials.loc[lr, "trial_id"]], uninterrupted_curve(sweep, lr=lr))


# ------------------------------------------------- the results callback under interleavings

MAX_STEP = 4
PROP_SWEEP = "prop"
TRIAL_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("report"), st.integers(0, 2)),
        # the trial process dies; its retry restores a checkpoint `back` reports old (it may
        # report a step again; 0 and progress: from scratch)
        st.tuples(st.just("retry"), st.integers(0, 2), st.integers(0, MAX_STEP)),
        st.tuples(st.just("driver restart")),
        st.tuples(st.just("end"), st.integers(0, 2), st.sampled_from(["complete", "error"])),
    ),
    max_size=30,
)


def prop_value(index: int, step: int) -> float:
    return round(0.1 * index + 0.01 * step, 6)  # a deterministic trial: same step, same value


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=TRIAL_EVENTS)
def test_interleaved_retries_and_driver_restarts_keep_one_row_per_key(events):
    """Three trials reporting through the driver's real results callback while processes
    die and retry from older checkpoints (steps reported again), the driver restarts (the
    callback is rebuilt from its pickled state, as Tune restores it) and trials complete or
    fail: the Parquet output always has one row per trial with its latest state and one
    curve row per (trial, step) reached, whatever the interleaving."""
    from ray import cloudpickle

    from scale_fpt.sweep import results_callback_class, tune_members
    from scale_fpt.trial import trial_id_for

    root = Path(tempfile.mkdtemp(prefix="faults-prop-"))
    try:
        callback = results_callback_class()(ResultsWriter(root, PROP_SWEEP))
        arms = [{**TINY, "lr": 10.0 ** -(i + 2)} for i in range(3)]
        ids = [trial_id_for(PROP_SWEEP, TrialConfig.from_flat(a).to_flat()) for a in arms]
        tune_trials = [
            SimpleNamespace(
                trial_id=f"tune_{i}",
                config={"sweep": PROP_SWEEP, "members": [arm]},
                last_result={},
                checkpoint=None,
                error_file=None,
                error_msg=f"boom {i}",
            )
            for i, arm in enumerate(arms)
        ]
        progress, reached, last_reported, ended = [0, 0, 0], [0, 0, 0], {}, {}

        def report(i: int, status: str = "running") -> None:
            progress[i] += 1
            step = progress[i]
            reached[i] = max(reached[i], step)
            last_reported[i] = step
            (flat,) = tune_members(tune_trials[i].config)[1]
            curve = {"trial_id": ids[i], "step": step, "test_accuracy": prop_value(i, step)}
            row = {"sweep": PROP_SWEEP, "trial_id": ids[i], **flat, "status": status}
            row.update(steps_done=step, final_test_accuracy=prop_value(i, step))
            result = {"step": step, "curve_rows": [{**flat, **curve}], "trial_rows": [row]}
            tune_trials[i].last_result = result
            callback.on_trial_result(0, [], tune_trials[i], result)

        for event in events:
            kind, *args = event
            if kind == "driver restart":
                callback = cloudpickle.loads(cloudpickle.dumps(callback))  # as Tune does
            elif args[0] in ended:
                continue
            elif kind == "report" and progress[args[0]] < MAX_STEP - 1:
                report(args[0])
            elif kind == "retry":
                progress[args[0]] = max(0, progress[args[0]] - args[1])
            elif kind == "end" and args[1] == "complete":
                i = args[0]
                while progress[i] < MAX_STEP:
                    report(i, "completed" if progress[i] == MAX_STEP - 1 else "running")
                callback.on_trial_complete(0, [], tune_trials[i])
                ended[i] = "completed"
            elif kind == "end":
                callback.on_trial_error(0, [], tune_trials[args[0]])
                ended[args[0]] = "failed"

        expected_ids = sorted(ids[i] for i in range(3) if i in last_reported or i in ended)
        if not expected_ids:
            assert visible_parquet_files(root) == []
            return
        results = load_results(root, PROP_SWEEP)
        trials = results.trials.set_index("trial_id")
        assert sorted(trials.index) == expected_ids
        for i in range(3):
            if ids[i] not in trials.index:
                continue
            row = trials.loc[ids[i]]
            status = ended.get(i, "running")
            assert row["status"] == status
            assert row["steps_done"] == last_reported.get(i, 0)
            error = None if pd.isna(row["error"]) else row["error"]
            assert error == (f"boom {i}" if status == "failed" else None)
            curve = results.curves[results.curves["trial_id"] == ids[i]]
            assert curve["step"].tolist() == list(range(1, reached[i] + 1))
            assert curve["test_accuracy"].tolist() == [
                prop_value(i, s) for s in range(1, reached[i] + 1)
            ]
        assert not [p for p in root.rglob("*.tmp")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
