"""``--compile auto`` (the default): which step a trial takes on each device, and what
``scale-fpt plan`` says of it (``steps.choice``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scale_fpt import cli
from scale_fpt.config import ConfigError, TrainConfig
from scale_fpt.steps.choice import step_choice
from scale_fpt.vocabulary import StepKind

COHORT, ENGINE = StepKind.COHORT, StepKind.ENGINE


@pytest.mark.parametrize(
    "kind, train, device, mode",
    [
        (COHORT, {}, "cuda", "reduce-overhead"),
        (COHORT, {"precision": "bf16"}, "cuda", "reduce-overhead"),
        (COHORT, {}, "cpu", "off"),
        (ENGINE, {"finetune": "full", "precision": "bf16"}, "cuda", "default"),
        (ENGINE, {"finetune": "full"}, "cpu", "off"),
        (ENGINE, {"zero_stage": 1}, "cuda", "off"),
        (ENGINE, {"precision": "fp16"}, "cuda", "off"),
        (ENGINE, {"workers": 2, "batch_size": 4}, "cuda", "off"),
        (ENGINE, {"activation_checkpointing": True}, "cuda", "off"),
        (COHORT, {"compile": "default"}, "cpu", "default"),
        (COHORT, {"compile": "off"}, "cuda", "off"),
        (ENGINE, {"compile": "default"}, "cpu", "default"),
    ],
)
def test_auto_compiles_where_it_pays_and_an_asked_mode_is_taken(kind, train, device, mode):
    choice = step_choice(kind, TrainConfig(**train), device)
    assert (choice.kind, choice.mode, choice.compiled) == (kind, mode, mode != "off")
    if train.get("compile", "auto") == "auto" and mode == "off":
        assert choice.why  # auto says why it left the step eager


@pytest.mark.parametrize(
    "train, match",
    [
        ({"compile": "default", "zero_stage": 2}, "--zero-stage 2"),
        ({"compile": "default", "precision": "fp16"}, "fp16"),
        ({"compile": "reduce-overhead"}, "CUDA graphs"),
    ],
)
def test_an_engine_refuses_a_mode_it_cannot_take_by_name(train, match):
    with pytest.raises(ConfigError, match=match):
        step_choice(ENGINE, TrainConfig(**train), "cuda")


@pytest.mark.parametrize(
    "flags, line, mode",
    [
        ([], "step: cohort step, compiled (reduce-overhead)", "reduce-overhead"),
        (["--finetune", "full"], "step: engine step, compiled (default)", "default"),
        (["--finetune", "full", "--zero-stage", "1"], "step: engine step, eager: --zero", "off"),
        (["--compile", "off"], "step: cohort step, eager", "off"),
    ],
)
def test_plan_prints_the_step_a_trial_takes_on_the_named_gpu(capsys, flags, line, mode):
    argv = ["plan", "--model", "gpt2-tiny", "--task", "bit-xor", "--gpu", "h100-80gb", *flags]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert line in out
    assert json.loads(out.strip().splitlines()[-1])["step_mode"] == mode


def test_the_sweep_driver_does_not_import_dynamo():
    """A driver process (``scale-fpt sweep``) compiles nothing: importing it in a fresh
    interpreter leaves ``torch._dynamo`` (about 1.5 s of CPU) unimported."""
    code = "import sys, scale_fpt.sweep.driver; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
