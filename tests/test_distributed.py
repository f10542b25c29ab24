"""Trials over several workers: a world of 2 (gloo on CPU, real Ray, real DeepSpeed) trains
as a world of 1 does at ZeRO stages 0 and 3; a 2-worker trial whose worker process is
SIGKILLed resumes from its checkpoint with the curve of an uninterrupted run; ZeRO-Offload
and activation checkpointing leave the curve unchanged; the rules that split a trial.

The Ray sweeps share one local Ray with 4 logical CPUs (``ray_4_cpus``): a 2-worker trial
is a placement group of 2 one-CPU bundles (the Tune function is rank 0, a ``RankWorker``
actor rank 1), and two such trials run side by side.
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from helpers import own_ray
from ray_clusters import wait_until
from test_faults import (
    resumed_after_reported_steps,
    rows_by,
    run_with_fault,
    sweep_config,
    tune_trial_dir,
)

from scale_fpt import cli, planner
from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.profile import pack_problem, profile_of, step_kind
from scale_fpt.recovery import tune_reports
from scale_fpt.results import load_results
from scale_fpt.steps.engine import deepspeed_config
from scale_fpt.sweep import Devices, SweepConfig, placement_on, plan_cohort
from scale_fpt.tasks.base import Batch
from scale_fpt.trial import TrialRun
from scale_fpt.world import World, rank_seed, shard_bounds

TINY = {
    "task": "bit-xor",
    "model": "gpt2-tiny",
    "init": "random",
    "test_batches": 2,  # 64 test examples: batches of 21, 21, 21 and 1 (an empty rank slice)
    "val_batches": 2,
    "eval_batch_size": 21,
    "batch_size": 8,
    "accelerator": "cpu",
}
EQUIVALENT = {**TINY, "dropout": 0.0, "max_steps": 10, "eval_every": 5}
"""No dropout: each rank draws its own masks, so only a dropout-free world of 2 is the world
of 1 up to float rounding."""
METRICS = ["train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy"]


# ------------------------------------------------------------------------- rules, no Ray


def test_rank_slices_are_disjoint_cover_the_batch_and_match_tensor_split():
    batch = Batch(torch.arange(10).view(10, 1), torch.arange(10).view(10, 1, 1))
    for size in (1, 2, 3, 4, 16):
        parts = [World(rank, size).shard(batch).x.flatten().tolist() for rank in range(size)]
        assert [row for part in parts for row in part] == list(range(10))
        assert parts == [t.flatten().tolist() for t in torch.tensor_split(batch.x, size)]
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]


def test_rank_zero_keeps_the_trial_seed_and_other_ranks_draw_their_own():
    assert rank_seed(7, 0) == 7
    seeds = {rank_seed(7, r) for r in range(1, 9)} | {rank_seed(8, r) for r in range(1, 9)}
    assert len(seeds) == 16 and all(0 <= s < 2**63 for s in seeds)


def test_placement_one_bundle_per_worker_on_one_node():
    assert planner.CPU_PLAN.bundles(2, 3) == [{"CPU": 2}] * 3
    assert planner.CPU_PLAN.bundles(1) == [{"CPU": 1}]
    sweep = SweepConfig(name="placement", cpus_per_trial=1)
    cpus = placement_on(sweep, GPUOffer(None, 0, "none"), Devices(0, 1, 0))
    workers = {**TINY, "workers": 2}
    two = plan_cohort([workers], profile_of(workers), cpus).resources()
    assert two.bundles == [{"CPU": 1}] * 2 and two.strategy == "STRICT_PACK"
    one = plan_cohort([TINY], profile_of(TINY), cpus).resources()
    assert one.bundles == [{"CPU": 1}] and one.strategy == "PACK"


def test_deepspeed_config_splits_the_global_batch_and_offloads_on_request():
    train = TrialConfig.from_flat(
        {"batch_size": 16, "workers": 4, "zero_stage": 3, "zero_offload": True}
    ).train
    ds = deepspeed_config(train)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"]) == (16, 4)
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    plain = deepspeed_config(TrialConfig().train)
    assert plain["train_micro_batch_size_per_gpu"] == plain["train_batch_size"] == 16
    assert "offload_optimizer" not in plain["zero_optimization"]


def test_bad_splits_are_one_config_error_naming_every_flag():
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_flat(
            {"batch_size": 10, "workers": 4, "zero_offload": True, "zero_stage": 1}
        )
    text = str(e.value)
    assert "--workers 4 must divide --batch-size 10" in text and "--batch-size 12" in text
    assert "--zero-offload: needs --zero-stage 2 or 3 (got 1)" in text
    with pytest.raises(ConfigError, match="--workers: must be >= 1"):
        TrialConfig.from_flat({"workers": 0})
    with pytest.raises(ConfigError, match=r"--activation-checkpointing: .*lstm"):
        TrialConfig.from_flat({"model": "lstm", "init": "random", "activation_checkpointing": 1})


def test_a_multi_worker_trial_is_never_packed():
    assert "--workers 2" in pack_problem({**TINY, "workers": 2})
    assert pack_problem({**TINY, "workers": 1}) is None
    for engine_only in ({"workers": 2}, {"activation_checkpointing": True}):
        assert step_kind(TrialConfig.from_flat({**TINY, **engine_only})) == "engine"


def test_a_multi_worker_trial_outside_a_sweep_is_a_config_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--workers 2: this process is one of 1"):
        TrialRun([TrialConfig.from_flat({**TINY, "workers": 2})])
    args = ["train", "--task", "bit-xor", "--model", "gpt2-tiny", "--init", "random"]
    code = cli.main([*args, "--workers", "2", "--batch-size", "8", "--results", str(tmp_path)])
    assert code == 2 and "a trial over several workers runs in a sweep" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def curve_of(flat: dict) -> pd.DataFrame:
    """The curve of a world of one, run here (real DeepSpeed, no Ray)."""
    trial = TrialRun([TrialConfig.from_flat(flat)], kind="engine")
    rows: list[dict] = []
    try:
        trial.run(on_eval=lambda curve_rows, trial_rows: rows.extend(curve_rows))
    finally:
        trial.close()
    return pd.DataFrame(rows)[["step", *METRICS]]


def assert_close_curves(actual: pd.DataFrame, expected: pd.DataFrame, **tolerance) -> None:
    pd.testing.assert_frame_equal(
        actual[["step", *METRICS]].reset_index(drop=True),
        expected[["step", *METRICS]].reset_index(drop=True),
        check_dtype=False,
        **tolerance,
    )


def test_offload_and_activation_checkpointing_train_the_same_curve():
    """ZeRO-2 with the optimizer state offloaded, and activation checkpointing (dropout on:
    the recomputed blocks must replay the same masks), equal the plain trial's curve."""
    flat = {**TINY, "finetune": "fpt+attn", "dropout": 0.1, "max_steps": 6, "eval_every": 3}
    plain = curve_of({**flat, "zero_stage": 2})
    assert_close_curves(curve_of({**flat, "zero_stage": 2, "zero_offload": True}), plain)
    assert_close_curves(
        curve_of({**flat, "zero_stage": 2, "activation_checkpointing": True}), plain
    )


# ------------------------------------------------------------------------ Ray: worlds of 2


@pytest.fixture(scope="module")
def ray_4_cpus(tmp_path_factory):
    """A local Ray of this module's own with 4 logical CPUs: a Tune trial and its worker, or
    two 2-worker trials at once."""
    home = tmp_path_factory.mktemp("empty_scale_fpt_home")
    with own_ray(home, num_cpus=4, num_gpus=0, object_store_memory=200 * 2**20):
        yield


def rank_worker_actors(state: str | None = None) -> list[dict]:
    """Ray's record of every ``RankWorker`` actor (GCS actor table: ``Name``, ``State``,
    ``Pid``). Ray's state API would need the dashboard, which these tests do not start."""
    from ray._private.state import actors

    return [
        a
        for a in actors().values()
        if a["ActorClassName"] == "RankWorker" and state in (None, a["State"])
    ]


KILLED, TWIN, ZERO_0, ZERO_3 = 0.95, 0.9, 0.85, 0.8
"""The four trials of ``two_worker_sweep``, told apart by accuracy_threshold (which does not
touch training: it only names the first step that reaches it)."""


@pytest.fixture(scope="module")
def two_worker_sweep(ray_4_cpus, tmp_path_factory):
    """One sweep of four 2-worker trials, two at a time, read by the two tests below (one
    sweep, not one per test: a sweep's start-up and the processes of its trials are most of
    its time, and Tune runs a later trial in an earlier one's process). ``ZERO_0`` and
    ``ZERO_3``: ``EQUIVALENT`` at ZeRO 0 and 3. ``TWIN`` and ``KILLED``: identical ZeRO-2
    trials with dropout on, 30 steps; the rank-1 process of ``KILLED`` is SIGKILLed after
    its second evaluation."""
    sweep = sweep_config(
        tmp_path_factory.mktemp("world2"),
        "world2",
        base={**TINY, "workers": 2, "zero_stage": 2, "max_steps": 30, "eval_every": 5},
        grid={"accuracy_threshold": [ZERO_0, ZERO_3, TWIN, KILLED]},
        overrides=(
            ({"accuracy_threshold": ZERO_0}, {**EQUIVALENT, "zero_stage": 0}),
            ({"accuracy_threshold": ZERO_3}, {**EQUIVALENT, "zero_stage": 3}),
        ),
        max_concurrent=2,
        max_failures=2,
    )

    def trial_dir():
        return tune_trial_dir(sweep, accuracy_threshold=KILLED)

    def kill_rank_1(done):
        def reported_twice():
            directory = trial_dir()
            found = tune_reports(directory) if directory else []
            return len(found) >= 2 and not found[-1]["final"] and found

        reports = wait_until(reported_twice, "2 reports of the trial", done)
        trial_id = reports[-1]["trial_rows"][0]["trial_id"]
        (worker,) = [a for a in rank_worker_actors("ALIVE") if a["Name"].startswith(trial_id)]
        os.kill(worker["Pid"], signal.SIGKILL)
        return reports[-1]["step"]

    outcome, step_at_kill = run_with_fault(sweep, kill_rank_1)
    assert not isinstance(outcome, Exception), outcome
    results = load_results(sweep.results_dir, sweep.name)
    return SimpleNamespace(
        outcome=outcome,
        step_at_kill=step_at_kill,
        killed_reports=tune_reports(trial_dir()),
        trials=results.trials.set_index("accuracy_threshold"),
        curves=rows_by(results.curves, "trial_id"),
        rank_1_actors=rank_worker_actors(),
    )


def rank_1_actors_of(swept, threshold: float) -> list[dict]:
    """The ``RankWorker`` actors (rank 1) that the trial of ``threshold`` started: each is
    named after its trial."""
    trial_id = swept.trials.loc[threshold, "trial_id"]
    return [a for a in swept.rank_1_actors if a["Name"].split("/")[0] == trial_id]


@pytest.mark.slow
def test_world_of_two_trains_as_world_of_one_at_zero_0_and_3(two_worker_sweep):
    """Two 2-worker trials (ZeRO 0: gradients all-reduced; ZeRO 3: parameters, gradients
    and optimizer state partitioned, what ZeRO 2 partitions and more) through a real sweep:
    each ran as 2 processes, has the rows of a one-process trial, and its curve equals a
    world of one's (here, in this process) up to float rounding. ZeRO 2 over 2 workers
    trains, checkpoints and resumes in the killed-worker test below."""
    assert two_worker_sweep.outcome.finished
    trials, curves = two_worker_sweep.trials, two_worker_sweep.curves
    assert len(trials) == 4 and (trials["status"] == "completed").all()
    assert (trials["workers"] == 2).all()
    for threshold, stage in ((ZERO_0, 0), (ZERO_3, 3)):
        trial = trials.loc[threshold]
        assert trial["zero_stage"] == stage
        assert (trial["steps_done"], trial["samples_seen"]) == (10, 80)
        (worker,) = rank_1_actors_of(two_worker_sweep, threshold)  # one per trial
        assert worker["State"] == "DEAD"
        world2 = curves[trial["trial_id"]]
        assert world2["step"].tolist() == [5, 10]
        world1 = curve_of({**EQUIVALENT, "zero_stage": stage})
        assert_close_curves(world2, world1, rtol=1e-4, atol=1e-6)
        assert trial["final_test_loss"] == world2["test_loss"].iloc[-1]


@pytest.mark.slow
@pytest.mark.faults
def test_killed_worker_process_of_a_two_worker_trial_resumes_from_its_checkpoint(
    two_worker_sweep,
):
    """Two identical 2-worker trials (ZeRO-2, dropout on, so every rank's RNG state must be
    restored; they differ only in accuracy_threshold, which does not touch training). SIGKILL
    the rank-1 process of one after 2 evaluations: Tune retries the trial, every rank
    restores the last checkpoint, and its curve has each step once and equals the
    uninterrupted twin's."""
    assert two_worker_sweep.outcome.finished
    trials, curves = two_worker_sweep.trials, two_worker_sweep.curves
    for threshold in (KILLED, TWIN):
        assert (trials.loc[threshold, "status"], trials.loc[threshold, "steps_done"]) == (
            "completed",
            30,
        )
    killed, twin = (curves[trials.loc[t, "trial_id"]] for t in (KILLED, TWIN))
    assert killed["step"].tolist() == twin["step"].tolist() == list(range(5, 31, 5))
    # The killed trial's rank 1 and its retry's; the twin's one, never killed.
    assert [a["State"] for a in rank_1_actors_of(two_worker_sweep, KILLED)] == ["DEAD"] * 2
    assert len(rank_1_actors_of(two_worker_sweep, TWIN)) == 1

    reports = two_worker_sweep.killed_reports
    restarts = [i for i, r in enumerate(reports) if r["iterations_since_restore"] == 1]
    assert len(restarts) == 2  # the first attempt and one retry
    before, retry = reports[: restarts[1]], reports[restarts[1] :]
    assert [r["step"] for r in before][-1] >= two_worker_sweep.step_at_kill
    # The retry continued after a checkpoint (never from step 5 again) up to the end.
    before_steps, retry_steps = [r["step"] for r in before], [r["step"] for r in retry]
    resumed_after_reported_steps(before_steps, retry_steps, every=5)
    assert retry_steps[0] > 5 and retry_steps[-1] == 30
    assert_close_curves(killed, twin)
    assert trials.loc[KILLED, "final_test_loss"] == killed["test_loss"].iloc[-1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpu_zero3_bf16_trial_trains_as_one_gpu(tmp_path):
    """A 2-worker ZeRO-3 bf16 trial on 2 GPUs (NCCL, one whole GPU per rank) completes with
    the curve of a one-GPU trial, within bf16 rounding. A Ray of its own, with the GPUs."""
    from scale_fpt.sweep import run_sweep

    with own_ray(num_cpus=4, num_gpus=2, object_store_memory=200 * 2**20):
        flat = {**EQUIVALENT, "accelerator": "cuda", "precision": "bf16", "zero_stage": 3}
        sweep = sweep_config(tmp_path, "gpu2", base={**flat, "workers": 2})
        assert run_sweep(sweep).finished
        results = load_results(sweep.results_dir, sweep.name)
        (trial,) = results.trials.to_dict("records")
        assert trial["status"] == "completed" and trial["device"] != "cpu"
        assert_close_curves(results.curves, curve_of(flat), rtol=0.05, atol=0.02)
