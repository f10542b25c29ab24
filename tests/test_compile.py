"""``--compile``: a cohort's model under torch.compile traces whole (no graph breaks), is
compiled once per mode (training, evaluation) however many steps run, and trains as the eager
step does, dropout included: its keys are device tensors passed in (``ops.DropoutSites``),
not state read from outside the graph. On a GPU, ``reduce-overhead`` replays that one graph
with CUDA graphs (``tests/test_gpu.py``); here, on a CPU, inductor compiles it."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.trial import TrialRun

pytestmark = pytest.mark.slow

BASE = {
    "task": "bit-xor",
    "val_batches": 1,
    "test_batches": 1,
    "model": "gpt2-tiny",
    "init": "random",
    "dropout": 0.1,
    "batch_size": 4,
    "max_steps": 6,
    "eval_every": 3,
    "log_evals": False,
    "accelerator": "cpu",
}
MEMBERS = [{"lr": 1e-3}, {"lr": 3e-3, "finetune": "input+output+ln"}]


def train(compile_mode: str) -> list:
    configs = [TrialConfig.from_flat({**BASE, **m, "compile": compile_mode}) for m in MEMBERS]
    run = TrialRun(configs)
    try:
        run.run()
        return run.states
    finally:
        run.close()


def test_compiled_cohort_traces_whole_compiles_once_per_mode_and_equals_eager():
    eager = train("off")
    torch._dynamo.reset()
    counters.clear()
    compiled = train("reduce-overhead")
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # training and evaluation, not per step
    for ours, theirs in zip(compiled, eager, strict=True):
        assert [e.step for e in ours.history] == [3, 6]
        for a, b in zip(ours.history, theirs.history, strict=True):
            assert a.train_loss == pytest.approx(b.train_loss, rel=1e-4)
            assert a.val_loss == pytest.approx(b.val_loss, rel=1e-4)


def test_compile_is_refused_for_trials_on_a_deepspeed_engine_and_checked_by_name():
    full = TrialConfig.from_flat({**BASE, "finetune": "full", "compile": "default"})
    with pytest.raises(ConfigError, match=r"--compile default: .*--finetune trains attn\+ff"):
        TrialRun([full])
    with pytest.raises(ConfigError, match=r"compile.*'fast'.*off, default, reduce-overhead"):
        TrialConfig.from_flat({**BASE, "compile": "fast"})
