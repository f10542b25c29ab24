"""Benchmark accounting: the model FLOPs every benchmark divides by (``profile.step_flops``)
against what torch's FlopCounterMode counts on a real training step of each path, and the
table of published device peaks that MFU divides by on a GPU."""

from __future__ import annotations

import pytest
from torch.utils.flop_counter import FlopCounterMode

from scale_fpt import gpus, scaling
from scale_fpt.config import TrialConfig
from scale_fpt.profile import step_flops
from scale_fpt.trial import TrialRun

BATCH = 4


def config(task: str) -> TrialConfig:
    # dropout > 0: attention is composed of matmuls (torch's fused SDPA kernel is not
    # counted by FlopCounterMode on a CPU)
    return TrialConfig.from_flat(
        {"task": task, "model": "gpt2-tiny", "init": "random", "batch_size": BATCH, "dropout": 0.1}
    )


def head_flops_not_run(built, spec) -> int:
    """What the 4N/6N model-FLOP convention counts but no step runs: the gradient of the
    input layer's input (the data needs none) and the output head over the tokens that are
    not read out (it is applied to the last ``n_predicting_tokens`` only). By hand, from the
    shapes: <= 4% of a gpt2-tiny step, ~0.1% of a gpt2 one."""
    d, T, k = built.d_model, spec.n_tokens, spec.n_predicting_tokens
    input_weights = 0 if spec.discrete else spec.token_width * d  # an embedding: no matmul
    output_weights = d * spec.outputs_per_token * spec.n_classes
    return BATCH * (2 * input_weights * T + (T - k) * output_weights * (2 + 2 + 2))


def counted(step) -> int:
    step(0)  # warm-up: lazy initialisation outside the count
    with FlopCounterMode(display=False) as counter:
        step(1)
    return counter.get_total_flops()


@pytest.mark.parametrize("task", ["bit-xor", "listops", "bit-memory"])
def test_trial_step_runs_the_model_flops(task):
    run = TrialRun([config(task)], kind="engine")
    try:
        built, spec = run.records[0].profile.built, run.records[0].profile.spec
        model_flops = step_flops(built, spec, BATCH)[0]
        assert counted(run.step.train_step) == model_flops - head_flops_not_run(built, spec)
    finally:
        run.close()


@pytest.mark.parametrize("task", ["bit-xor", "listops"])
def test_packed_step_runs_the_model_flops_less_the_skipped_readout(task):
    run = TrialRun([config(task)], kind="cohort")
    try:
        record = run.records[0]
        built, spec = record.profile.built, record.profile.spec
        model_flops = record.profile.flops[0]  # what benchmarks divide by on both paths
        skipped = scaling.readout_flops_skipped(
            built.d_model, 4 * built.d_model, spec.n_tokens, spec.n_predicting_tokens, BATCH
        )
        executed = model_flops - head_flops_not_run(built, spec) - skipped
        assert counted(run.step.train_step) == executed
    finally:
        run.close()


@pytest.mark.parametrize(
    ("device", "precision", "name", "flops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756e12),
        ("NVIDIA H100 PCIe", "fp32", "H100 PCIe", 51e12),
        ("NVIDIA H200", "bf16", "H200 SXM", 989.4e12),
        ("NVIDIA A100-SXM4-40GB", "tf32", "A100 40GB/80GB", 156e12),
        ("NVIDIA A100 80GB PCIe", "bf16", "A100 40GB/80GB", 312e12),
        ("NVIDIA A10G", "bf16", "A10G", 125e12),
        ("NVIDIA L4", "fp16", "L4", 121e12),
    ],
)
def test_published_dense_peaks(device, precision, name, flops):
    peak, value = gpus.device_peak(device, precision)
    assert (peak.name, value) == (name, flops)


def test_devices_without_a_published_peak():
    assert gpus.device_peak("NVIDIA L40S", "bf16") is None  # not the L4
    assert gpus.device_peak("Tesla T4", "fp16") is None
    # every entry: dense tensor rates at or above fp32, bf16 = fp16 = 2 x tf32
    for peak in gpus.CHIPS:
        assert peak.fp32 < peak.tf32 < peak.bf16 == peak.fp16
        assert peak.bf16 == pytest.approx(2 * peak.tf32, rel=0.02)
