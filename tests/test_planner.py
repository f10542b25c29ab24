"""The memory planner (scale_fpt.planner): exact bytes, plans, GPU-hours, `scale-fpt plan`."""

from __future__ import annotations

import json
import math
import os

import pytest
from helpers import run_pytest_child

from scale_fpt import gpus, planner, scaling
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.gpus import GPUS
from scale_fpt.planner import ModelShape, TrialMemory, trial_memory
from scale_fpt.profile import model_shape, plan_trial, profile_of
from scale_fpt.study import sweep_plan
from scale_fpt.sweep import SweepConfig
from scale_fpt.sweep.plan import study_gpu_hours

SHAPE = ModelShape(
    total_params=1000,
    trained_params=100,
    n_layer=2,
    d_model=8,
    n_tokens=4,
    block_params=300,
    backbone_backward=True,
)


def test_one_process_memory_counts_every_byte_per_precision():
    # bf16: 2-byte weights; 2-byte module grads + DeepSpeed's fp32 grads; fp32 master, Adam's
    # two moments and the step's sqrt(v) temporary.
    assert trial_memory(SHAPE, "bf16", batch_size=2) == TrialMemory(
        weights=2000, gradients=100 * 2 + 100 * 4, optimizer=100 * 16, activations=4352
    )
    assert trial_memory(SHAPE, "fp16", batch_size=2) == trial_memory(SHAPE, "bf16", batch_size=2)
    # fp32: no master copy, no second gradient; activations twice as wide.
    assert trial_memory(SHAPE, "fp32", batch_size=2) == TrialMemory(4000, 400, 1200, 8704)
    assert trial_memory(SHAPE, "bf16", 2).allocated == 8552 + planner.CUDA_WORKSPACE_BYTES
    # activations: layers x batch x tokens x width x 34 values x 2 bytes / 2
    assert 2 * 2 * 4 * 8 * 34 == 4352


def test_zero_stages_shard_optimizer_then_gradients_then_weights():
    one = trial_memory(SHAPE, "bf16", 2, zero_stage=0, workers=2)
    assert one == TrialMemory(2000, 600, 1600, 2176)  # micro batch 1 per worker
    # DeepSpeed allocates its reduce bucket whole (fp32) from stage 1 on, however few
    # parameters train: the planner's bucket size, which every ZeRO engine is configured with.
    bucket = planner.ZERO_BUCKET_ELEMENTS * 4
    stage1 = trial_memory(SHAPE, "bf16", 2, zero_stage=1, workers=2)
    assert stage1 == TrialMemory(2000, 200 + 200 + bucket, 800, 2176)
    stage2 = trial_memory(SHAPE, "bf16", 2, zero_stage=2, workers=2)
    assert stage2 == TrialMemory(2000, 100 + 200 + bucket, 800, 2176)  # 16-bit grads halved
    stage3 = trial_memory(SHAPE, "bf16", 2, zero_stage=3, workers=2)
    assert stage3.weights == 1000 + 2 * 300 * 2  # half the weights + two gathered blocks
    assert stage3.gradients == 100 + 200 + 2 * bucket  # overlap_comm's double buffer


def test_zero_engines_are_configured_with_the_planned_buckets():
    """The planner's bucket is what a ZeRO engine allocates: DeepSpeed's default (5e8
    elements, 2 GB in fp32 per rank) would be 10x the plan."""
    from scale_fpt.models import build_model
    from scale_fpt.steps.engine import EngineStep
    from scale_fpt.tasks import build_task

    flat = {"task": "bit-xor", "model": "gpt2-tiny", "init": "random", "zero_stage": 1}
    config = TrialConfig.from_flat({**flat, "accelerator": "cpu", "test_batches": 1})

    task = build_task(config.task, 0)
    step = EngineStep(config.train, task, build_model(config, task.spec))
    try:
        optimizer = step.engine.optimizer
        assert optimizer.reduce_bucket_size == planner.ZERO_BUCKET_ELEMENTS
        assert optimizer.allgather_bucket_size == planner.ZERO_BUCKET_ELEMENTS
    finally:
        step.close()


def test_no_backward_through_the_body_keeps_one_block_of_activations():
    head_only = ModelShape(**{**SHAPE.__dict__, "backbone_backward": False})
    assert trial_memory(head_only, "bf16", 2).activations == 4352 // 2


def test_attention_with_dropout_counts_the_materialised_scores_and_the_mask_draw():
    """Keyed dropout forces the materialised attention path: (B, H, T, T) tensors per block."""
    shape = ModelShape(**{**SHAPE.__dict__, "n_head": 2, "dropout": 0.1})
    elements = 2 * 2 * 4 * 4  # batch x heads x tokens x tokens
    draw = elements * 56  # the mask's SplitMix64 temporaries, one block

    def attention(shape: ModelShape, fused: bool = False) -> int:
        return trial_memory(shape, "bf16", 2, fused_attention=fused).attention

    # forward at the last block: 3 kept by the block below, 4 working, the draw; backward's
    # start: 3 kept per block and 4 working gradients: the forward is larger here
    assert attention(shape) == (3 + 4) * elements * 2 + draw
    assert (3 + 4) * elements * 2 + draw > (2 * 3 + 4) * elements * 2
    materialised = trial_memory(shape, "bf16", 2, fused_attention=False)
    workspace = planner.CUDA_WORKSPACE_BYTES
    assert materialised.allocated == 8552 + (3 + 4) * elements * 2 + draw + workspace
    assert attention(ModelShape(**{**shape.__dict__, "backbone_backward": False})) == (
        4 * elements * 2 + draw
    )
    assert attention(ModelShape(**{**shape.__dict__, "dropout": 0.0})) == 0  # SDPA
    # the Triton kernel: no (B, H, T, T) tensors, its dropout bits kept per block
    assert attention(shape, fused=True) == 2 * 2 * 2 * 4 * 1  # blocks x B x H x T x T / 8
    # a long sequence on a GPU without the fused kernel: gpt2-large on cifar10-lra (T =
    # 1024) at batch 8 no longer "fits" an A10G; without dropout, or fused, it does
    lra = {"model": "gpt2-large", "task": "cifar10-lra", "precision": "bf16", "batch_size": 8}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "gpu_fuses_attention", lambda: False)
        assert plan_of(lra, "a10g-24gb").gpus == 4
        assert plan_of({**lra, "dropout": 0.0}, "a10g-24gb").gpus == 1
        patch.setattr(planner, "gpu_fuses_attention", lambda: True)
        assert plan_of(lra, "a10g-24gb").gpus == 1


class HostAllocated:
    """Peak bytes that torch's CPU allocator (glibc malloc: torch allocates CPU tensors with
    posix_memalign) holds while the block runs, above what it held when the block began,
    read with glibc's ``mallinfo2`` (bytes in use in the heap and in mmapped chunks) after
    every aten operator (a dispatch mode sees each one, backward's included). Sound where
    RSS is not: freed blocks the heap keeps are not "in use", and pages are counted when
    allocated, not when touched; tracemalloc sees only Python's allocations. It misses only
    a kernel's internal scratch, freed before the operator returns."""

    def __init__(self):
        import ctypes

        from torch.utils._python_dispatch import TorchDispatchMode

        names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2

        def in_use() -> int:
            info = libc.mallinfo2()
            return info.uordblks + info.hblkhd

        outer = self

        class Sample(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                outer.peak = max(outer.peak, in_use() - outer.base)
                return out

        self.in_use, self.mode = in_use, Sample()

    def __enter__(self):
        self.base, self.peak = self.in_use(), 0
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def live_storages() -> dict:
    """Every CPU tensor storage alive now, by address (each storage once), after a collection."""
    import gc

    import torch

    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        # Plain tensors and parameters only: fake tensors that earlier compiled tests leave
        # alive have no storage.
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage
    return storages


def bytes_beyond(earlier: dict) -> int:
    """Bytes of the CPU tensor storages alive now that were not alive in ``earlier``. The
    caller holds ``earlier``, so none of its storages is freed and its address reused."""
    return sum(s.nbytes() for ptr, s in live_storages().items() if ptr not in earlier)


ALONE = os.environ.get("SCALE_FPT_TEST_ALONE") == "1"
"""Set in the child that ``test_memory_measurements_in_a_fresh_process`` starts."""
alone = pytest.mark.skipif(
    not ALONE, reason="runs in the fresh child of test_memory_measurements_in_a_fresh_process"
)


@pytest.mark.slow
@pytest.mark.skipif(ALONE, reason="the child itself")
def test_memory_measurements_in_a_fresh_process():
    """Host memory is measured in a process of its own: threads that earlier tests leave
    running (Ray's, TensorBoard writers) allocate at random into a measured window, and
    under load they did so into every one of three steps (204.5 MB measured for 189.2)."""
    output = run_pytest_child(__file__, {"SCALE_FPT_TEST_ALONE": "1"}, "-k", "on_the_cpu")
    assert "\n2 passed, " in output  # both measurements ran


@alone
@pytest.mark.parametrize("draw_block", [None, 2**20])
def test_plan_bounds_a_long_sequence_step_on_the_cpu(long_proteins_dir, monkeypatch, draw_block):
    """A training step at T = 1024 with dropout, on the torch-op path a GPU takes (keyed masks
    drawn with torch ops, materialised attention): the plan's allocated bytes are at least
    what the step holds (the trial's tensors alive before it plus its peak above them) and
    at most 25% above. Without the attention term the plan was 20x under. With ``draw_block`` the mask
    of (B, H, T, T) = 4.2M elements is drawn in 4 blocks."""

    from scale_fpt import keyed_random
    from scale_fpt.models import ops
    from scale_fpt.trial import TrialRun

    monkeypatch.setattr(ops, "_fused", lambda *tensors: None)  # the CPU's fused kernels off
    if draw_block:
        monkeypatch.setattr(keyed_random, "DRAW_BLOCK", draw_block)
    flat = {"task": "homology", "data_dir": long_proteins_dir, "model": "gpt2-tiny"}
    flat.update(init="random", batch_size=1, dropout=0.1, accelerator="cpu", test_batches=1)
    config = TrialConfig.from_flat(flat)
    # Tensors that earlier tests in this process left alive are not the trial's.
    earlier = live_storages()
    run = TrialRun([config], kind="engine")  # every block whole (a cohort cuts the last one)
    try:
        run.step.train_step(0)  # first use: the optimizer's state, lazy buffers
        # Every step holds the same tensors: the least of three is the step's own peak.
        measured = math.inf
        for position in (1, 2, 3):
            before = bytes_beyond(earlier)
            with HostAllocated() as held:
                run.step.train_step(position)
            measured = min(measured, before + held.peak)
    finally:
        run.close()
    plan = trial_memory(model_shape(config), "fp32", 1, fused_attention=False)
    assert plan.attention > 5 * plan.activations  # what the planner left out
    allocated = plan.allocated - plan.workspace  # no CUDA libraries on a CPU
    assert measured <= allocated <= 1.25 * measured, (plan, measured)


def test_device_memory_adds_allocator_slack_and_cuda_context():
    memory = TrialMemory(1000, 0, 0, 0, workspace=0)
    assert memory.device == 1150 + planner.CUDA_CONTEXT_BYTES


def test_trials_per_gpu_is_a_power_of_two_up_to_four():
    assert planner.trials_per_gpu(10, 100) == 4
    assert planner.trials_per_gpu(30, 100) == 2
    assert planner.trials_per_gpu(50, 100) == 2
    assert planner.trials_per_gpu(51, 100) == 1
    assert planner.trials_per_gpu(200, 100) == 1


def test_model_shape_reads_any_finetune_subset_and_the_tasks_sequence():
    size = scaling.GPT2_SIZES["gpt2"]
    groups = scaling.gpt2_group_params(size)
    fpt = model_shape(TrialConfig.from_flat({"model": "gpt2", "task": "cifar10"}))
    heads = scaling.head_params(768, 48, 0, 10)  # cifar10: 4x4 patches x 3 channels
    assert fpt.n_tokens == 64 and fpt.n_layer == 12 and fpt.d_model == 768
    assert fpt.total_params == sum(groups.values()) + sum(heads.values())
    trained_pos = 64 * 768  # only the task's 64 positions ever get a gradient
    assert fpt.trained_params == groups["ln"] + trained_pos + sum(heads.values())
    ff = model_shape(
        TrialConfig.from_flat({"model": "gpt2", "task": "cifar10", "finetune": "fpt+ff+attn"})
    )
    assert ff.trained_params == fpt.trained_params + groups["ff"] + groups["attn"]
    assert fpt.block_params == (groups["attn"] + groups["ff"] + groups["ln"] - 2 * 768) // 12
    listops = model_shape(TrialConfig.from_flat({"model": "gpt2", "task": "listops"}))
    assert listops.n_tokens == 512


def plan_of(flat: dict, gpu: str, gpus: str = "auto", max_gpus: int = 8):
    return plan_trial(TrialConfig.from_flat(flat), gpus, GPUS[gpu], max_gpus)


def test_plans_share_a_gpu_take_one_or_span_several_at_zero_2():
    xl_full = {"model": "gpt2-xl", "finetune": "full", "task": "cifar10", "precision": "bf16"}
    xl_full["batch_size"] = 8
    on_a10g = plan_of(xl_full, "a10g-24gb")
    assert (on_a10g.gpus, on_a10g.zero_stage, on_a10g.workers, on_a10g.trials_per_gpu) == (
        2,
        2,
        2,
        1,
    )
    assert on_a10g.gpu_share == 2.0 and on_a10g.fits
    on_h100 = plan_of(xl_full, "h100-80gb")
    assert (on_h100.gpus, on_h100.zero_stage, on_h100.trials_per_gpu) == (1, 0, 1)
    assert on_h100.gpu_share == 1.0
    small = plan_of({"model": "gpt2", "task": "bit-xor", "precision": "bf16"}, "l4-24gb")
    assert (small.gpus, small.trials_per_gpu, small.gpu_share) == (1, 4, 0.25)
    asked = plan_of(xl_full, "h100-80gb", gpus="4")
    assert (asked.gpus, asked.zero_stage, asked.workers) == (4, 2, 4)
    kept = plan_of({**xl_full, "zero_stage": 3}, "a10g-24gb")
    assert (kept.gpus, kept.zero_stage) == (2, 3)
    share = plan_of(xl_full, "a10g-24gb", gpus="0.25")
    assert (share.gpus, share.gpu_share, share.trials_per_gpu) == (1, 0.25, 4)
    assert plan_of(xl_full, "a10g-24gb", gpus="0") == planner.CPU_PLAN
    too_big = plan_of({**xl_full, "batch_size": 512}, "a10g-24gb", max_gpus=4)
    assert not too_big.fits and too_big.gpus == 4 and too_big.zero_stage == 3
    assert "DOES NOT FIT" in too_big.describe()


def test_auto_without_any_gpu_plans_cpu():
    config = TrialConfig.from_flat({"model": "gpt2-large"})
    assert plan_trial(config, "auto", None) == planner.CPU_PLAN


def test_gpus_per_trial_values():
    parse = planner.parse_gpus_per_trial
    assert parse("auto") == ("auto", 0.0)
    assert parse("0") == ("cpu", 0.0)
    assert parse("2") == ("gpus", 2.0)
    assert parse("0.25") == ("share", 0.25)
    for bad in ("1.5", "-1", "x", ""):
        with pytest.raises(ConfigError, match="--gpus-per-trial"):
            parse(bad)


def test_gpu_hours_hold_the_trials_share_for_its_steps():
    plan = planner.gpu_share(0.25, GPUS["h100-80gb"])
    assert planner.gpu_hours(plan, steps=3600, seconds_per_step=2.0) == 0.5
    small = ModelShape(**{**SHAPE.__dict__, "train_flops_per_example": 1000})
    one = planner.TrialPlan(1, 1.0, 1, 0, 1, None, GPUS["h100-80gb"])
    # a tiny step is bound by per-block latency, not FLOPs
    assert planner.step_seconds(small, 8, one) == 2 * planner.STEP_LATENCY_PER_LAYER_S
    big = ModelShape(**{**SHAPE.__dict__, "train_flops_per_example": 10**15})
    # compute-bound: the H100 SXM's published dense bf16 peak (989.4 TFLOPS) at ASSUMED_MFU
    assert planner.step_seconds(big, 2, one) == pytest.approx(
        2e15 / (989.4e12 * planner.ASSUMED_MFU)
    )


def test_every_planner_gpu_takes_its_peak_from_the_published_table():
    # One table of peaks: each GPU --gpu accepts finds its own chip's entry of
    # gpus.CHIPS by the device name CUDA reports (as the benchmarks' MFU does), and
    # the planner's figure is that entry's. A GPU added to the planner without an entry, or
    # a pattern that catches another chip (A10G's catching an A100), fails here.
    for name, gpu in GPUS.items():
        found = gpus.device_peak(gpu.model, "bf16")
        assert found is not None, f"{name} ({gpu.model}) has no entry in gpus.CHIPS"
        peak, flops = found
        chip = name.split("-")[0].upper()  # h100-80gb -> H100, a10g-24gb -> A10G
        assert peak.name.split()[0] == chip or peak.name.startswith(chip + " "), (name, peak)
        assert gpu.bf16_flops == flops == peak.bf16
        assert gpus.gpu_with_memory(10, name).bf16_flops == flops  # --gpu with --gpu-memory


def test_a_gpu_without_a_published_peak_has_unknown_gpu_hours():
    from scale_fpt.study import placement_table

    unnamed = gpus.gpu_with_memory(40)  # --gpu-memory 40 alone: no chip, no peak
    assert unnamed.bf16_flops == 0.0
    big = ModelShape(**{**SHAPE.__dict__, "train_flops_per_example": 10**15})
    plan = planner.TrialPlan(1, 1.0, 1, 0, 1, None, unnamed)
    assert math.isnan(planner.step_seconds(big, 2, plan))
    arms = {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000}
    table = placement_table(SweepConfig(name="s", base=arms, gpu_memory_gb=40)).splitlines()
    assert table[0] == "s: 1 arms x 1 trial(s) on 40gb"
    assert table[-1].endswith(
        "unknown: 40gb has no published bf16 peak (gpus.CHIPS); "
        f"name the GPU with --gpu ({', '.join(GPUS)})"
    )


def test_study_gpu_hours_sum_over_models():
    arm = {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000}
    sweep = SweepConfig(name="s", base=arm, seeds=(0, 1), gpu="a10g-24gb", pack=1)
    hours = study_gpu_hours(sweep_plan(sweep))
    one = 0.25 * 1000 * 12 * planner.STEP_LATENCY_PER_LAYER_S / 3600
    assert hours == pytest.approx({"gpt2": 2 * one, "total": 2 * one})
    cpu = SweepConfig(name="s", base=arm, seeds=(0, 1), gpus_per_trial="0")
    assert study_gpu_hours(sweep_plan(cpu)) == {"total": 0.0}
    searched = SweepConfig(
        name="s", base=arm, gpu="a10g-24gb", search={"lr": ["loguniform", 1e-4, 1e-2]}
    )
    per_configuration = study_gpu_hours(sweep_plan(searched))["gpt2"]
    assert per_configuration == pytest.approx(searched.search_trials * one)


def test_plan_command_prints_gpus_zero_stage_and_trials_per_gpu(capsys):
    from scale_fpt import cli

    args = ["plan", "--task", "cifar10", "--model", "gpt2-xl", "--finetune", "full"]
    args += ["--precision", "bf16", "--batch-size", "8"]
    assert cli.main([*args, "--gpu", "a10g-24gb"]) == 0
    out = capsys.readouterr().out
    assert "GPUs needed: 2; ZeRO stage: 2; trials per GPU: 1" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["gpus"], summary["zero_stage"], summary["workers"]) == (2, 2, 2)
    assert cli.main([*args, "--gpu", "h100-80gb"]) == 0
    assert "GPUs needed: 1; ZeRO stage: 0; trials per GPU: 1" in capsys.readouterr().out
    assert cli.main([*args, "--gpu", "v100", "--gpus-per-trial", "two"]) == 2
    err = capsys.readouterr().err
    assert "--gpu: unknown GPU 'v100'" in err and "--gpus-per-trial: 'two'" in err


def test_plan_command_on_cpus_or_a_gpu_share_says_where_and_which_step(capsys):
    """``--gpus-per-trial 0`` plans the CPU step (no GPU to name), a share plans the
    declared GPU's share, and an unknown ``--gpu`` is one line naming the valid GPUs."""
    from scale_fpt import cli

    args = ["plan", "--task", "bit-xor", "--model", "gpt2-tiny"]
    assert cli.main([*args, "--gpus-per-trial", "0"]) == 0
    out = capsys.readouterr().out
    assert "on CPUs: 1 member, cohort step: CPU\n" in out
    assert "GPUs needed: 0; ZeRO stage: 0; trials per GPU: 1" in out
    assert "step: cohort step, eager: on a CPU compilation costs more than it saves" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["gpu"], summary["gpus"], summary["step_mode"]) == (None, 0, "off")
    # the memory of the cohort step it takes (one member), not an engine's
    cohort = profile_of({"task": "bit-xor", "model": "gpt2-tiny"}).cohort_memory(1)
    assert "memory of one process (cohort step): " in out
    assert summary["state_bytes"] == cohort.weights + cohort.gradients + cohort.optimizer
    assert summary["activation_bytes"] == cohort.activations
    assert cli.main([*args, "--gpus-per-trial", "0.5", "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    h100 = GPUS["h100-80gb"]
    assert (
        f"on h100-80gb ({h100.memory_mib:,} MiB): 1 member, cohort step: h100-80gb, 2 per GPU"
        in out
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["gpu"], summary["gpus"], summary["trials_per_gpu"]) == ("h100-80gb", 1, 2)
    assert cli.main([*args, "--gpus-per-trial", "0", "--gpu", "k80"]) == 2
    err = capsys.readouterr().err
    assert "--gpu: unknown GPU 'k80'; choose from " + ", ".join(GPUS) in err


def test_sweep_plan_on_cpus_or_gpu_shares_and_an_unknown_gpu(capsys):
    """``scale-fpt sweep --plan`` with ``--gpus-per-trial 0`` or a share prints its plan;
    an unknown ``--gpu`` exits 2 naming the valid GPUs."""
    from scale_fpt import cli

    args = ["sweep", "scale", "--plan", "--tasks", "bit-xor", "--seeds", "0"]
    assert cli.main([*args, "--gpus-per-trial", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("trial(s) on CPUs")
    trials = [line for line in lines if " x gpt2-tiny fpt bit-xor" in line]
    assert trials and all(": CPU; eager: on a CPU" in line for line in trials)
    assert cli.main([*args, "--gpus-per-trial", "0.5", "--gpu", "l4-24gb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("trial(s) on l4-24gb")
    trials = [line for line in lines if " x gpt2-tiny fpt bit-xor" in line]
    assert trials and all("step: l4-24gb, 2 per GPU; as declared" in line for line in trials)
    assert cli.main([*args, "--gpu", "k80"]) == 2
    err = capsys.readouterr().err
    assert "--gpu: unknown GPU 'k80'; choose from " + ", ".join(GPUS) in err


@pytest.mark.gpu
def test_plan_bounds_the_memory_of_a_real_step_from_above_within_25_percent():
    """A full bf16 fine-tuning step of gpt2 on the GPU: the plan's allocated bytes are at
    least torch's peak and at most 25% above it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")

    flat = {"model": "gpt2", "init": "random", "task": "bit-xor", "finetune": "full"}
    flat.update(precision="bf16", batch_size=16, max_steps=2, eval_every=2, test_batches=1)
    config = TrialConfig.from_flat({**flat, "accelerator": "cuda"})
    measured = cuda_step_peak(config)  # full fine-tuning: the DeepSpeed engine step
    planned = planner.trial_memory(model_shape(config), "bf16", 16).allocated
    assert measured <= planned <= 1.25 * measured, (planned, measured)


def cuda_step_peak(config: TrialConfig, kind: str | None = None) -> int:
    """Peak bytes torch's CUDA allocator holds over a trial's first two training steps, above
    what earlier tests of the session left allocated."""
    import torch

    from scale_fpt.trial import TrialRun

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run = TrialRun([config], kind=kind)
    try:
        run.step.train_step(0)
        run.step.train_step(1)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    finally:
        run.close()


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind", ["cohort", "engine"])
def test_plan_bounds_a_long_sequence_bf16_step_on_the_gpu(
    long_proteins_dir, kind, fused, monkeypatch
):
    """gpt2 at T = 1024 in bf16 with keyed dropout, through the Triton kernel (``fused``) or
    the materialised attention (``ops.FLASH`` off): the plan is at least
    torch.cuda.max_memory_allocated and at most 25% above, on either step."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from scale_fpt.models import ops

    if fused and not ops.FLASH:
        pytest.skip("needs Triton (the fused kernel)")
    monkeypatch.setattr(ops, "FLASH", fused)
    flat = {"task": "homology", "data_dir": long_proteins_dir, "model": "gpt2", "init": "random"}
    flat.update(precision="bf16", batch_size=8, dropout=0.1, test_batches=1, accelerator="cuda")
    config = TrialConfig.from_flat(flat)
    measured = cuda_step_peak(config, kind)
    plan = planner.trial_memory(model_shape(config), "bf16", 8, fused_attention=fused)
    assert (plan.attention > plan.activations) != fused
    assert measured <= plan.allocated <= 1.25 * measured, (plan, measured)


def test_study_plan_lists_placements_and_gpu_hours_without_ray():
    from scale_fpt.study import placement_table

    arms = {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000}
    sweep = SweepConfig(name="s", base=arms, seeds=(0, 1), gpu="a10g-24gb")
    table = placement_table(sweep).splitlines()
    assert table[0] == "s: 2 arms x 1 trial(s) on a10g-24gb"
    assert table[1] == "  seeds 0, 1"
    assert table[2] == "  Ray trials (of the grid; --pack auto for 8 GPU slot(s)):"
    # A packable trial alone is a cohort of one, sized by the cohort step's memory model.
    assert table[3].startswith(
        "    2 x gpt2 fpt bit-xor, 1,000 steps, bs 16: 1 member, cohort step: a10g-24gb, 4 per GPU;"
    )
    hours = study_gpu_hours(sweep_plan(sweep))
    assert table[-1].endswith(f"gpt2 {hours['gpt2']:,.1f}, total {hours['total']:,.1f}")
    cpu = placement_table(SweepConfig(name="s", base=arms, gpus_per_trial="0")).splitlines()
    assert cpu[:2] == ["s: 1 arms x 1 trial(s) on CPUs", "  seeds 0"]
    assert cpu[2].startswith("  Ray trials (of the grid; --pack auto for ")
    assert cpu[3:] == [
        "    1 x gpt2 fpt bit-xor, 1,000 steps, bs 16: 1 member, cohort step: CPU; eager: on a "
        "CPU compilation costs more than it saves"
    ]
    assert table[3].endswith("; compiled (reduce-overhead)")  # the GPU's step


def test_sweep_yaml_and_study_flags_declare_gpus(tmp_path):
    import argparse

    from scale_fpt.study import narrow, parser

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nbase: {model: gpt2}\ngpus_per_trial: 1\ngpu: h100-80gb\n")
    sweep = SweepConfig.from_yaml(path)
    assert (sweep.gpus_per_trial, sweep.gpu) == ("1", "h100-80gb")
    flags = ["--gpus-per-trial", "0.5", "--gpu", "l4-24gb", "--cluster-config", "c.yaml"]
    args = parser("d", {"local": None}).parse_args(flags)
    assert isinstance(args, argparse.Namespace)
    narrowed = narrow(sweep, args)
    assert (narrowed.gpus_per_trial, narrowed.gpu, narrowed.cluster_config) == (
        "0.5",
        "l4-24gb",
        "c.yaml",
    )
    path.write_text("name: s\ngpus_per_trial: two\n")
    with pytest.raises(ConfigError, match="--gpus-per-trial: 'two'"):
        SweepConfig.from_yaml(path)
