"""The steps a sweep runs on a GPU, as ``--compile auto`` picks them (``steps.choice``), on a
CUDA GPU (``pytest -m gpu``; skipped where CUDA is absent): several training steps of each
path under CUDA's sync debug mode "error" (any host sync raises), no recompilation after the
warm-up, no CUDA graph skipped, compiled equal to eager, and the trial row naming the step.
The first stage of ``benchmarks/gpu_session.sh``."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from scale_fpt.config import TrialConfig
from scale_fpt.trial import TrialRun

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BASE = {
    "task": "bit-xor",
    "model": "gpt2-tiny",
    "init": "random",
    "batch_size": 4,
    "precision": "bf16",
    "dropout": 0.1,
    "max_steps": 8,
    "eval_every": 8,
    "log_evals": False,
    "val_batches": 1,
    "test_batches": 1,
    "accelerator": "cuda",
}
PATHS = {
    # path: (step kind, config, the step --compile auto takes)
    "engine": ("engine", {"finetune": "full", "compile": "off"}, "off"),
    "engine-compiled": ("engine", {"finetune": "full"}, "default"),
    "cohort-eager": ("cohort", {"compile": "off"}, "off"),
    "cohort-compiled": ("cohort", {}, "reduce-overhead"),
}
WARMUP = 3
"""Steps of compilation, CUDA-graph warm-up and recording."""


def trial(path: str, **overrides) -> TrialRun:
    kind, flat, _ = PATHS[path]
    run = TrialRun([TrialConfig.from_flat({**BASE, **flat, **overrides})], kind=kind)
    assert run.step.compilation.mode == PATHS[path][2]
    return run


@pytest.mark.parametrize("path", list(PATHS))
def test_every_step_path_trains_without_a_host_sync_or_a_recompile(path):
    torch._dynamo.reset()
    counters.clear()
    run = trial(path)
    try:
        for position in range(WARMUP):
            run.step.train_step(position)
        torch.cuda.synchronize()
        graphs = counters["stats"]["unique_graphs"]
        torch.cuda.set_sync_debug_mode("error")
        try:
            for position in range(WARMUP, WARMUP + 5):
                run.step.train_step(position)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert counters["stats"]["unique_graphs"] == graphs  # no recompilation
        assert counters["inductor"]["cudagraph_skips"] == 0
        assert torch.isfinite(run.step.metrics.last_loss).all()
        assert run.step.compilation.compiled == (PATHS[path][2] != "off")
    finally:
        run.close()


@pytest.mark.parametrize("eager, compiled", [("engine", "engine-compiled"), ("cohort-eager", "cohort-compiled")])  # fmt: skip
def test_the_compiled_step_trains_as_the_eager_one(eager, compiled):
    """Six fp32 steps (dropout keyed: the same masks): losses and trained weights agree."""
    results = []
    for path in (eager, compiled):
        torch._dynamo.reset()
        run = trial(path, precision="fp32")
        try:
            losses = []
            for position in range(6):
                run.step.train_step(position)
                losses.append(run.step.metrics.last_loss.clone())
            results.append((torch.stack(losses), run.step.member_weights(0)))
        finally:
            run.close()
    (eager_losses, eager_weights), (losses, weights) = results
    torch.testing.assert_close(losses, eager_losses, rtol=1e-3, atol=1e-4)
    for name, tensor in eager_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-3, atol=1e-4)


def test_a_trial_row_records_the_step_auto_ran_on_the_gpu():
    run = trial("cohort-compiled")
    try:
        rows = run.run()
    finally:
        run.close()
    assert [(r["step_kind"], r["step_mode"], r["step_compiled"]) for r in rows] == [
        ("cohort", "reduce-overhead", True)
    ]
