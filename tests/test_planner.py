"""The memory planner (scale_fpt.planner): exact bytes, plans, GPU-hours, `scale-fpt plan`."""

from __future__ import annotations

import json
import math

import pytest

from scale_fpt import planner, scaling
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.planner import GPUS, ModelShape, TrialMemory, trial_memory

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
    assert trial_memory(SHAPE, "bf16", 2).allocated == 8552
    # activations: layers x batch x tokens x width x 34 values x 2 bytes / 2
    assert 2 * 2 * 4 * 8 * 34 == 4352


def test_zero_stages_shard_optimizer_then_gradients_then_weights():
    one = trial_memory(SHAPE, "bf16", 2, zero_stage=0, workers=2)
    assert one == TrialMemory(2000, 600, 1600, 2176)  # micro batch 1 per worker
    stage1 = trial_memory(SHAPE, "bf16", 2, zero_stage=1, workers=2)
    assert stage1 == TrialMemory(2000, 200 + 200, 800, 2176)
    stage2 = trial_memory(SHAPE, "bf16", 2, zero_stage=2, workers=2)
    # 16-bit grads halved plus one reduce bucket (all 100 trained elements, 2 bytes each)
    assert stage2 == TrialMemory(2000, 100 + 200 + 200, 800, 2176)
    stage3 = trial_memory(SHAPE, "bf16", 2, zero_stage=3, workers=2)
    assert stage3.weights == 1000 + 2 * 300 * 2  # half the weights + two gathered blocks


def test_no_backward_through_the_body_keeps_one_block_of_activations():
    head_only = ModelShape(**{**SHAPE.__dict__, "backbone_backward": False})
    assert trial_memory(head_only, "bf16", 2).activations == 4352 // 2


def test_device_memory_adds_allocator_slack_and_cuda_context():
    memory = TrialMemory(1000, 0, 0, 0)
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
    fpt = planner.model_shape(TrialConfig.from_flat({"model": "gpt2", "task": "cifar10"}))
    heads = scaling.head_params(768, 48, 0, 10)  # cifar10: 4x4 patches x 3 channels
    assert fpt.n_tokens == 64 and fpt.n_layer == 12 and fpt.d_model == 768
    assert fpt.total_params == sum(groups.values()) + sum(heads.values())
    trained_pos = 64 * 768  # only the task's 64 positions ever get a gradient
    assert fpt.trained_params == groups["ln"] + trained_pos + sum(heads.values())
    ff = planner.model_shape(
        TrialConfig.from_flat({"model": "gpt2", "task": "cifar10", "finetune": "fpt+ff+attn"})
    )
    assert ff.trained_params == fpt.trained_params + groups["ff"] + groups["attn"]
    assert fpt.block_params == (groups["attn"] + groups["ff"] + groups["ln"] - 2 * 768) // 12
    listops = planner.model_shape(TrialConfig.from_flat({"model": "gpt2", "task": "listops"}))
    assert listops.n_tokens == 512


def plan_of(flat: dict, gpu: str, gpus: str = "auto", max_gpus: int = 8):
    return planner.plan_trial(TrialConfig.from_flat(flat), gpus, GPUS[gpu], max_gpus)


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
    assert planner.plan_trial(config, "auto", None) == planner.CPU_PLAN


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
    # scaling.DEVICE_PEAKS by the device name CUDA reports (as the benchmarks' MFU does), and
    # the planner's figure is that entry's. A GPU added to the planner without an entry, or
    # a pattern that catches another chip (A10G's catching an A100), fails here.
    for name, gpu in GPUS.items():
        found = scaling.device_peak(gpu.model, "bf16")
        assert found is not None, f"{name} ({gpu.model}) has no entry in scaling.DEVICE_PEAKS"
        peak, flops = found
        chip = name.split("-")[0].upper()  # h100-80gb -> H100, a10g-24gb -> A10G
        assert peak.name.split()[0] == chip or peak.name.startswith(chip + " "), (name, peak)
        assert gpu.bf16_flops == flops == peak.bf16
        assert planner.gpu_with_memory(10, name).bf16_flops == flops  # --gpu with --gpu-memory


def test_a_gpu_without_a_published_peak_has_unknown_gpu_hours():
    from scale_fpt.study import placement_table
    from scale_fpt.sweep import SweepConfig

    unnamed = planner.gpu_with_memory(40)  # --gpu-memory 40 alone: no chip, no peak
    assert unnamed.bf16_flops == 0.0
    big = ModelShape(**{**SHAPE.__dict__, "train_flops_per_example": 10**15})
    plan = planner.TrialPlan(1, 1.0, 1, 0, 1, None, unnamed)
    assert math.isnan(planner.step_seconds(big, 2, plan))
    arms = {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000}
    table = placement_table(SweepConfig(name="s", base=arms, gpu_memory_gb=40)).splitlines()
    assert table[0] == "s: 1 arms x 1 trial(s) on 40gb"
    assert table[-1].endswith(
        "unknown: 40gb has no published bf16 peak (scaling.DEVICE_PEAKS); "
        f"name the GPU with --gpu ({', '.join(GPUS)})"
    )


def test_study_gpu_hours_sum_over_models():
    arms = [
        {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000},
        {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000, "seed": 1},
    ]
    hours = planner.study_gpu_hours(arms, "auto", GPUS["a10g-24gb"])
    one = 0.25 * 1000 * 12 * planner.STEP_LATENCY_PER_LAYER_S / 3600
    assert hours == pytest.approx({"gpt2": 2 * one, "total": 2 * one})
    assert planner.study_gpu_hours(arms, "0", GPUS["a10g-24gb"]) == {"total": 0.0}


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


@pytest.mark.gpu
def test_plan_bounds_the_memory_of_a_real_step_from_above_within_25_percent():
    """A full bf16 fine-tuning step of gpt2 on the GPU: the plan's allocated bytes are at
    least torch's peak and at most 25% above it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from scale_fpt.trial import TrialRun

    flat = {"model": "gpt2", "init": "random", "task": "bit-xor", "finetune": "full"}
    flat.update(precision="bf16", batch_size=16, max_steps=2, eval_every=2, test_batches=1)
    config = TrialConfig.from_flat({**flat, "accelerator": "cuda"})
    torch.cuda.reset_peak_memory_stats()
    run = TrialRun([config])  # full fine-tuning: the DeepSpeed engine step
    try:
        run.step.train_step(0)
        run.step.train_step(1)
        measured = torch.cuda.max_memory_allocated()
    finally:
        run.close()
    planned = planner.trial_memory(planner.model_shape(config), "bf16", 16).allocated
    assert measured <= planned <= 1.25 * measured, (planned, measured)


def test_study_plan_lists_placements_and_gpu_hours_without_ray():
    from scale_fpt.study import placement_table
    from scale_fpt.sweep import SweepConfig

    arms = {"model": "gpt2", "task": "bit-xor", "precision": "bf16", "max_steps": 1000}
    sweep = SweepConfig(name="s", base=arms, seeds=(0, 1), gpu="a10g-24gb")
    table = placement_table(sweep).splitlines()
    assert table[0] == "s: 2 arms x 1 trial(s) on a10g-24gb"
    assert table[1] == "  seeds 0, 1"
    assert table[2].startswith(
        "    2 x gpt2 fpt bit-xor, 1,000 steps, bs 16: a10g-24gb, ZeRO 0, 4 trials per GPU;"
    )
    hours = planner.study_gpu_hours(sweep.arms(), "auto", GPUS["a10g-24gb"])
    assert table[-1].endswith(f"gpt2 {hours['gpt2']:,.1f}, total {hours['total']:,.1f}")
    cpu = placement_table(SweepConfig(name="s", base=arms, gpus_per_trial="0")).splitlines()
    assert cpu == [
        "s: 1 arms x 1 trial(s) on CPUs",
        "  seeds 0",
        "    1 x gpt2 fpt bit-xor, 1,000 steps, bs 16: CPU",
    ]


def test_sweep_yaml_and_study_flags_declare_gpus(tmp_path):
    import argparse

    from scale_fpt.study import narrow, parser
    from scale_fpt.sweep import SweepConfig

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
