"""GPU paths, on a CUDA GPU (`pytest -m gpu`); every test is skipped where CUDA is absent.

A bf16 trial learns bit-xor; fp16 trains with DeepSpeed's loss scaling; a packed cohort
compiled with torch.compile equals the unpacked trials at dropout 0.1; draws, batches and
dropout masks equal the CPU ones; the Triton attention kernel draws the CPU's masks and
computes the CPU's attention, fp32 and bf16; a cohort's training step never synchronises with the host; the custom attention equals SDPA on
CUDA; four trials share one GPU through fractional Ray resources; a trial spans two GPUs at
ZeRO-3 (two GPUs and TrainConfig's ``workers`` needed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import own_ray

from scale_fpt.config import FIELD_TYPES, TrialConfig
from scale_fpt.sweep import SweepConfig
from scale_fpt.trial import TrialRun

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

XOR = {"task": "bit-xor", "test_batches": 4, "accelerator": "cuda"}


def run_trial(flat: dict) -> tuple[TrialRun, dict]:
    run = TrialRun([TrialConfig.from_flat(flat)])
    try:
        (row,) = run.run()
        return run, row
    finally:
        run.close()


def test_bf16_trial_learns_bit_xor():
    """gpt2, random init, frozen (fpt), bf16: the run of issue 10 (test accuracy 1.0 after
    3000 steps on one H100)."""
    _, row = run_trial(
        {**XOR, "model": "gpt2", "init": "random", "precision": "bf16", "max_steps": 3000}
    )
    assert row["status"] == "completed" and row["device"] == torch.cuda.get_device_name()
    assert row["best_test_accuracy"] >= 0.95


def test_fp16_trains_with_loss_scaling():
    flat = {**XOR, "model": "gpt2-tiny", "init": "random", "finetune": "full"}
    config = {**flat, "precision": "fp16", "max_steps": 200, "eval_every": 20, "log_evals": False}
    run = TrialRun([TrialConfig.from_flat(config)])  # fp16 trains on the DeepSpeed engine step
    try:
        (row,) = run.run()
        first = run.states[0].history[0].train_loss  # mean over the first 20 steps
        # DeepSpeed's dynamic loss scaler: 0.19.8's fp16 optimizers (fused and unfused) keep
        # it in their LossScaleConfig (no ``cur_scale`` attribute of their own).
        scale = run.step.engine.optimizer.loss_scale_config.cur_scale
    finally:
        run.close()
    assert row["status"] == "completed"
    assert 1 <= scale <= 2**16  # started at 2^16 (initial_scale_power), moved by overflows
    assert row["final_train_loss"] < first


def test_packed_compiled_cohort_equals_the_unpacked_trials(tiny_gpt2_dir):
    """At dropout 0.1: the cohort's last block computes only the read-out rows, the engine's
    GPT-2 all rows, and both draw the same masks for the rows read out (masks keyed on each
    element's place among all tokens; both attentions run the Triton kernel)."""
    base = {**XOR, "model": tiny_gpt2_dir, "init": "pretrained", "dropout": 0.1}
    base.update(batch_size=4, max_steps=10, eval_every=5)
    members = [{"lr": 1e-3, "seed": 0}, {"lr": 3e-3, "seed": 1, "finetune": "input+output+ln"}]
    configs = [TrialConfig.from_flat({**base, **m}) for m in members]
    compiled = [TrialConfig.from_flat({**base, **m, "compile": "reduce-overhead"}) for m in members]
    cohort = TrialRun(compiled)
    try:
        cohort.run()
        packed = cohort.states
    finally:
        cohort.close()
    for config, state in zip(configs, packed, strict=True):
        solo = TrialRun([config], kind="engine")  # unpacked, on a DeepSpeed engine
        try:
            solo.run()
            (reference,) = solo.states
        finally:
            solo.close()
        assert [e.step for e in state.history] == [e.step for e in reference.history]
        for p, s in zip(state.history, reference.history, strict=True):
            assert p.train_loss == pytest.approx(s.train_loss, rel=1e-3)
            assert p.test_accuracy == pytest.approx(s.test_accuracy, abs=1e-6)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float32, {"rtol": 1e-4, "atol": 1e-4}), (torch.bfloat16, {"rtol": 2e-2, "atol": 2e-2})],
)
def test_custom_attention_equals_sdpa_on_cuda(dtype, tolerance):
    """In the dtype trials train in (bf16: what a bf16 trial's attention runs in, SDPA's own
    bf16 kernels as the reference), forward and gradients."""
    from scale_fpt.models import ops

    torch.manual_seed(0)
    shape = (2, 4, 64, 32)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    every = torch.arange(64, device="cuda").expand(2, 64)  # every query at its own position
    custom = ops.causal_attention(q, k, v, scale=32**-0.5, query_positions=every)
    assert custom.dtype == dtype
    torch.testing.assert_close(custom, expected, **tolerance)
    last = ops.causal_attention(q[:, :, -3:], k, v, 32**-0.5, query_positions=every[:, -3:])
    torch.testing.assert_close(last, expected[:, :, -3:], **tolerance)
    grads = torch.autograd.grad(custom.sum(), (q, k, v))
    sdpa_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for mine, theirs in zip(grads, sdpa_grads, strict=True):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine, theirs, **tolerance)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        (torch.float32, {"rtol": 0, "atol": 1e-5}),
        # bf16 inputs, fp32 accumulation, probabilities rounded to bf16 for the products with
        # v (flash attention's scheme), against the fp32 CPU attention of the same inputs
        (torch.bfloat16, {"rtol": 2e-2, "atol": 3e-2}),
    ],
)
def test_flash_attention_equals_the_cpu_attention(dtype, tolerance):
    """The compiled Triton kernel draws the CPU's keyed masks (uint64 SplitMix64 on the GPU)
    and computes the CPU's materialised attention, forward and backward, for all queries
    and for read-out queries, across block edges (T = 200, blocks of 64)."""
    from scale_fpt.models import ops
    from scale_fpt.models.flash_attention import flash_attention

    generator = torch.Generator().manual_seed(0)
    N, H, T, hd = 4, 3, 200, 64
    cpu = [torch.randn(N, H, T, hd, generator=generator).to(dtype) for _ in range(3)]
    weights = torch.randn(N, H, T, hd, generator=generator)
    positions = torch.tensor([[198, 199], [60, 64], [0, 0], [127, 199]])
    index = positions[:, None, :, None].expand(-1, H, -1, hd)
    seeds = [21, 22]
    for chosen in (None, positions):
        q_cpu = cpu[0] if chosen is None else cpu[0].gather(2, index)
        exact = [t.float().requires_grad_() for t in (q_cpu, *cpu[1:])]
        sites = ops.DropoutSites(ops.step_keys(seeds, 7))
        expected = ops.causal_attention(*exact, 0.125, 0.1, chosen, sites)
        w = weights if chosen is None else weights.gather(2, index)
        expected_grads = torch.autograd.grad((expected * w).sum(), exact)
        inputs = [t.cuda().requires_grad_() for t in (q_cpu, *cpu[1:])]
        keys = ops.step_keys(seeds, 7).cuda()  # the kernel makes site 0's keys from them
        out = flash_attention(*inputs, 0.125, None if chosen is None else chosen.cuda(), keys, 0.1)
        grads = torch.autograd.grad((out.float() * w.cuda()).sum(), inputs)
        torch.testing.assert_close(out.float().cpu(), expected, **tolerance)
        for mine, theirs in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(mine.float().cpu(), theirs, **tolerance)


def test_keyed_attention_on_cuda_takes_the_triton_kernel():
    from scale_fpt.models import ops

    q = torch.zeros(1, 1, 4, 8, device="cuda")
    assert ops.FLASH
    assert ops.attention_path(q, 0.1, keyed=True, chosen_queries=False) == "flash"
    assert ops.attention_path(q, 0.0, keyed=False, chosen_queries=True) == "flash"
    assert ops.attention_path(q, 0.1, keyed=False, chosen_queries=False) == "sdpa"
    assert ops.attention_path(q, 0.0, keyed=False, chosen_queries=False) == "sdpa"


def test_draws_batches_and_dropout_masks_are_the_cpu_ones():
    """Counter-based draws make a trial's data and masks independent of where it ran."""
    from scale_fpt.config import TaskConfig
    from scale_fpt.keyed_random import Draws
    from scale_fpt.models import ops
    from scale_fpt.tasks import build_task

    assert torch.equal(Draws(2**62 + 5, "cuda").bits(10_000).cpu(), Draws(2**62 + 5).bits(10_000))
    ones = torch.ones(3 * 4099)
    cpu_mask = ops.keyed_keep(ones, 0.1, [1, 2, 3])
    assert torch.equal(ops.keyed_keep(ones.cuda(), 0.1, [1, 2, 3]).cpu(), cpu_mask)
    for name in ("bit-xor", "bit-memory"):
        config = TaskConfig(task=name, test_batches=2, val_batches=2)
        host, gpu = build_task(config, seed=3), build_task(config, seed=3).to("cuda")
        for step in (0, 11):  # on the GPU drawn by compiled code (Task.drawn), bit for bit
            ours, theirs = gpu.train_batch(step, 8), host.train_batch(step, 8)
            assert ours.x.is_cuda and torch.equal(ours.x.cpu(), theirs.x)
            assert torch.equal(ours.y.cpu(), theirs.y)
            ours, theirs = gpu.cohort_batch(step, 8, [3, 4]), host.cohort_batch(step, 8, [3, 4])
            assert torch.equal(ours.x.cpu(), theirs.x) and torch.equal(ours.y.cpu(), theirs.y)


@pytest.mark.parametrize("compile_mode", ["off", "reduce-overhead"])
def test_a_cohort_step_reads_nothing_on_the_host(compile_mode):
    """The training step and the evaluation of a packed cohort on a GPU queue their work and
    return: CUDA's sync debug mode raises at any synchronising call (a .item(), a pageable
    copy, a nonzero). Compiled with CUDA graphs, no graph is skipped (a skip falls back to
    eager launches silently)."""
    from torch._dynamo.utils import counters

    from scale_fpt.steps.cohort import CohortStep
    from scale_fpt.tasks import build_task

    base = {**XOR, "model": "gpt2-tiny", "init": "random", "max_steps": 10, "dropout": 0.1}
    base.update(compile=compile_mode, eval_batch_size=32)
    # Random-init members share one backbone only with one seed: they differ in lr.
    configs = [TrialConfig.from_flat({**base, "lr": 1e-3 * (s + 1)}) for s in range(4)]
    counters.clear()
    step = CohortStep(configs, build_task(configs[0].task, configs[0].train.seed))
    try:
        for position in range(3):  # first use: compilation, CUDA-graph warm-up and recording
            step.train_step(position)
        step.evaluate("val")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for position in range(3, 8):
                step.train_step(position)
            for split in ("val", "test"):
                step.evaluate(split)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.isfinite(step.metrics.last_loss).all()
        assert counters["inductor"]["cudagraph_skips"] == 0
    finally:
        step.close()


def test_restoring_more_cuda_rng_states_than_visible_devices():
    """A checkpoint written where more GPUs were visible resumes where fewer are."""
    from scale_fpt.runtime import restore_rng, rng_state

    saved = rng_state()
    extra = [*saved["cuda_rng"], saved["cuda_rng"][0]]  # one device more than visible
    restore_rng({**saved, "cuda_rng": extra})
    assert torch.equal(torch.cuda.get_rng_state(0), saved["cuda_rng"][0])


@pytest.fixture
def gpu_ray():
    with own_ray(num_gpus=torch.cuda.device_count()):
        yield


def test_four_trials_share_one_gpu_through_fractional_resources(gpu_ray, tmp_path):
    """Four Ray trials (``pack: 1``: ``auto`` would make them one cohort, one Tune trial)
    of a quarter GPU each train on the same GPU at the same time."""
    from scale_fpt.sweep import run_sweep

    base = {**XOR, "model": "gpt2-tiny", "init": "random", "max_steps": 3000}
    sweep = SweepConfig(
        name="share",
        base={**base, "eval_every": 1000, "log_evals": False},
        grid={"lr": [1e-4, 3e-4, 1e-3, 3e-3]},
        gpus_per_trial="0.25",
        pack=1,
        max_concurrent=4,
        results_dir=str(tmp_path),
    )
    assert run_sweep(sweep).finished
    trials = pd.read_parquet(tmp_path / "share" / "trials")
    assert len(trials) == 4 and (trials["status"] == "completed").all()
    assert trials["checkpoint"].map(lambda c: Path(c).parent).nunique() == 4  # 4 Tune trials
    assert [json.loads(r) for r in trials["resources_requested"]] == [[{"CPU": 1, "GPU": 0.25}]] * 4
    assert trials["gpu_ids"].nunique() == 1 and len(json.loads(trials["gpu_ids"].iloc[0])) == 1
    assert (trials["gpu_model"] == torch.cuda.get_device_name()).all()
    end = pd.to_datetime(trials["finished_at"])
    start = end - pd.to_timedelta(trials["wall_time_s"], unit="s")
    assert start.max() < end.min()  # every trial trained while every other did


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.skipif("workers" not in FIELD_TYPES, reason="needs TrainConfig.workers")
def test_trial_over_two_gpus_at_zero_3(gpu_ray, tmp_path):
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="zero3",
        base={**XOR, "model": "gpt2", "init": "random", "finetune": "full"},
        grid={"max_steps": [100]},
        overrides=(({}, {"workers": 2, "zero_stage": 3, "eval_every": 50}),),
        gpus_per_trial="2",
        results_dir=str(tmp_path),
    )
    assert run_sweep(sweep).finished
    trials = pd.read_parquet(tmp_path / "zero3" / "trials")
    assert (trials["status"] == "completed").all() and (trials["steps_done"] == 100).all()
    assert json.loads(trials["resources_requested"].iloc[0]) == [{"CPU": 1, "GPU": 1}] * 2
    assert (trials["zero_stage"] == 3).all()
