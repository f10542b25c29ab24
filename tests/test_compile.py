"""``--compile``: a cohort's model under torch.compile traces whole (no graph breaks), is
compiled once per mode (training, evaluation) however many steps run, and trains as the eager
step does, dropout included: its keys are device tensors passed in (``ops.DropoutSites``),
not state read from outside the graph. On a GPU, ``reduce-overhead`` replays that one graph
with CUDA graphs (``tests/test_gpu.py``); here, on a CPU, inductor compiles it."""

from __future__ import annotations

import logging

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


def train(compile_mode: str, members=MEMBERS, **base) -> tuple[list, list[dict]]:
    """The members' states and final trial rows."""
    configs = [
        TrialConfig.from_flat({**BASE, **base, **m, "compile": compile_mode}) for m in members
    ]
    run = TrialRun(configs)
    try:
        rows = run.run()
        return run.states, rows
    finally:
        run.close()


def step_columns(rows: list[dict]) -> set[tuple]:
    return {(r["step_kind"], r["step_mode"], r["step_compiled"]) for r in rows}


def assert_same_curves(ours: list, theirs: list, rel: float) -> None:
    for a_state, b_state in zip(ours, theirs, strict=True):
        assert [e.step for e in a_state.history] == [3, 6]
        for a, b in zip(a_state.history, b_state.history, strict=True):
            assert a.train_loss == pytest.approx(b.train_loss, rel=rel)
            assert a.val_loss == pytest.approx(b.val_loss, rel=rel)


def test_compiled_cohort_traces_whole_compiles_once_per_mode_and_equals_eager():
    eager, eager_rows = train("auto")  # auto on a CPU: eager
    assert step_columns(eager_rows) == {("cohort", "off", False)}
    torch._dynamo.reset()
    counters.clear()
    compiled, rows = train("reduce-overhead")
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # training and evaluation, not per step
    assert step_columns(rows) == {("cohort", "reduce-overhead", True)}
    assert_same_curves(compiled, eager, 1e-4)


def test_a_step_whose_compilation_fails_runs_eagerly_after_one_warning(monkeypatch, caplog):
    import torch._inductor.compile_fx as compile_fx

    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")

    eager, _ = train("off")
    torch._dynamo.reset()
    monkeypatch.setattr(compile_fx, "compile_fx", fail)
    with caplog.at_level(logging.WARNING, logger="scale_fpt.steps.choice"):
        fallen, rows = train("default")
    warnings = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "no compiler here" in warnings[0], warnings
    assert step_columns(rows) == {("cohort", "default", False)}
    assert_same_curves(fallen, eager, 0.0)  # the eager step itself


def test_a_world_of_one_engine_compiles_its_module_and_equals_eager():
    full = [{"finetune": "full", "lr": 1e-3}]
    eager, _ = train("off", full)
    torch._dynamo.reset()
    counters.clear()
    compiled, rows = train("default", full)
    assert step_columns(rows) == {("engine", "default", True)}
    assert dict(counters["graph_break"]) == {}
    assert_same_curves(compiled, eager, 1e-4)


def test_compile_modes_a_deepspeed_engine_cannot_take_are_refused_by_name():
    zero = TrialConfig.from_flat(
        {**BASE, "finetune": "full", "zero_stage": 1, "compile": "default"}
    )
    with pytest.raises(ConfigError, match=r"--compile default: .*--zero-stage 1"):
        TrialRun([zero])
    full = TrialConfig.from_flat({**BASE, "finetune": "full", "compile": "reduce-overhead"})
    with pytest.raises(ConfigError, match=r"--compile reduce-overhead: .*CUDA graphs"):
        TrialRun([full])
    with pytest.raises(ConfigError, match=r"compile.*'fast'.*auto, off, default, reduce-overhead"):
        TrialConfig.from_flat({**BASE, "compile": "fast"})
