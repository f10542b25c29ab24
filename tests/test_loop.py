"""The loop and the trial path on CPU: determinism, exact resume under ZeRO 0-3, checkpoints
without frozen weights, real divergence on both step kinds, precisions, metrics, selection,
patience, the evaluation schedule, and the trial row.

Every trial is gpt2-tiny (random init, no download) on Bit XOR with a two-chunk test set and a
few dozen steps. The first engine of the process pays for the gloo rendezvous (~3 s); later
ones start in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

from scale_fpt.checkpoints import DamagedCheckpointError
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.loop import Evaluation, TrialState, evaluation_steps
from scale_fpt.results import ResultsWriter, load_results
from scale_fpt.results_schema import TRIAL_SCHEMA
from scale_fpt.steps import member_losses, model_inputs
from scale_fpt.steps.engine import CHECKPOINT_TAG
from scale_fpt.trial import TrialRun

ROOT = Path(__file__).resolve().parents[1]
TIMING_FIELDS = ("samples_per_s", "wall_time_s")
CURVE_FIELDS = tuple(f.name for f in dataclasses.fields(Evaluation) if f.name not in TIMING_FIELDS)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine, two threads contend and a tiny step
    runs ~50x slower; one thread is also what makes results bit-for-bit repeatable."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(**overrides) -> TrialConfig:
    flat = {
        "task": "bit-xor",
        "model": "gpt2-tiny",
        "init": "random",
        "test_batches": 2,
        "val_batches": 2,  # bf16 matmuls are slow on a CPU: keep evaluations small
        "batch_size": 8,
        "eval_batch_size": 32,
        "max_steps": 30,
        "eval_every": 10,
        "seed": 0,
        **overrides,
    }
    return TrialConfig.from_flat(flat)


def trial_run(cfg: TrialConfig, kind: str | None = None) -> TrialRun:
    return TrialRun([cfg], sweep="t", kind=kind)


def run(cfg: TrialConfig, on_eval=None, progress=None, kind=None) -> tuple[dict, TrialState]:
    trial = trial_run(cfg, kind)
    try:
        (row,) = trial.run(on_eval=on_eval, progress=progress)
        return row, trial.states[0]
    finally:
        trial.close()


def curve(state: TrialState) -> list[tuple]:
    """The learning curve without its timings (which no two runs share)."""
    return [tuple(getattr(e, name) for name in CURVE_FIELDS) for e in state.history]


def is_zero3(engine) -> bool:
    return hasattr(engine.optimizer, "fp32_partitioned_groups_flat")


def weights(engine) -> dict[str, torch.Tensor]:
    """Every parameter of the engine's module, whole (gathered under ZeRO-3)."""
    module = engine.module
    if not is_zero3(engine):
        return {n: p.detach().clone() for n, p in module.named_parameters()}
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        return {n: p.detach().clone() for n, p in module.named_parameters()}


def adam_moments(engine) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam's exp_avg and exp_avg_sq over all trained parameters, flattened in order."""
    if is_zero3(engine):
        params, state = (
            engine.optimizer.fp32_partitioned_groups_flat,
            engine.optimizer.optimizer.state,
        )
    else:  # torch Adam itself, or the one inside DeepSpeed's mixed-precision / ZeRO-1/2 wrapper
        basic = engine.basic_optimizer
        params, state = [p for g in basic.param_groups for p in g["params"]], basic.state
    assert params and all(p in state for p in params), "optimizer has no state yet"
    return tuple(
        torch.cat([state[p][k].detach().flatten().float() for p in params])
        for k in ("exp_avg", "exp_avg_sq")
    )


def trainable_names(engine) -> set[str]:
    return {n for n, p in engine.module.named_parameters() if p.requires_grad}


# ------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("kind", ["cohort", "engine"])
def test_same_seed_same_curve_other_seed_differs(kind):
    cfg = config(max_steps=20)
    _, first = run(cfg, kind=kind)
    _, again = run(cfg, kind=kind)
    _, other = run(cfg.replace(seed=1), kind=kind)
    assert [e.step for e in first.history] == [10, 20]
    assert curve(first) == curve(again)
    assert curve(first) != curve(other)
    assert all(math.isfinite(v) for row in curve(first) for v in row)


# ------------------------------------------------------------------------------------ resume


class Crash(Exception):
    """A trial process dying right after its checkpoint at step 10."""


RESUME_CASES = [
    pytest.param(0, "fp32", id="zero0"),
    pytest.param(1, "fp32", id="zero1"),
    pytest.param(2, "fp32", id="zero2"),
    pytest.param(3, "fp32", id="zero3", marks=pytest.mark.slow),  # 4 s of CPU, the others 1
    pytest.param(0, "bf16", id="zero0-bf16"),
    pytest.param(2, "bf16", id="zero2-bf16"),
]


@pytest.mark.parametrize(("zero_stage", "precision"), RESUME_CASES)
def test_resume_mid_way_is_identical_to_uninterrupted(tmp_path, zero_stage, precision):
    # 20 steps: the checkpoint of step 10, then a segment trained after the restore
    cfg = config(zero_stage=zero_stage, precision=precision, dropout=0.1, max_steps=20)
    _, uninterrupted = run(cfg, kind="engine")
    assert [e.step for e in uninterrupted.history] == [10, 20]

    # B: checkpoints at step 10, then its process "dies".
    checkpoint = str(tmp_path / "ckpt")
    crashing = trial_run(cfg, "engine")
    initial = weights(crashing.step.engine)
    saved: dict = {}

    def save_then_crash(curve_rows, trial_rows):
        assert [r["step"] for r in curve_rows] == [10]
        crashing.save(checkpoint)
        saved["weights"] = weights(crashing.step.engine)
        saved["moments"] = adam_moments(crashing.step.engine)
        raise Crash

    with pytest.raises(Crash):
        crashing.run(on_eval=save_then_crash)
    trainable = trainable_names(crashing.step.engine)
    crashing.close()
    assert trainable and len(trainable) < len(initial)
    # Training never touches frozen weights (deepspeed 4776: ZeRO updated frozen ones).
    for name in initial.keys() - trainable:
        assert torch.equal(saved["weights"][name], initial[name]), name
    assert any(not torch.equal(saved["weights"][n], initial[n]) for n in trainable)

    # C: a fresh process rebuilds the trial from its config and restores the checkpoint.
    resumed = trial_run(cfg, "engine")
    try:
        rebuilt = weights(resumed.step.engine)
        resumed.restore(checkpoint)
        restored = weights(resumed.step.engine)
        for name, value in restored.items():
            expected = saved["weights"][name] if name in trainable else rebuilt[name]
            assert value.dtype == expected.dtype and torch.equal(value, expected), name
        for got, want in zip(adam_moments(resumed.step.engine), saved["moments"], strict=True):
            assert torch.equal(got, want)
        assert resumed.states[0].step == resumed.position == 10
        assert curve(resumed.states[0]) == curve(uninterrupted)[:1]

        (row,) = resumed.run()
        state = resumed.states[0]
    finally:
        resumed.close()
    assert curve(state) == curve(uninterrupted)
    assert row["status"] == "completed" and row["steps_done"] == 20
    # Time is summed over both attempts, not restarted.
    assert state.history[-1].wall_time_s > state.history[0].wall_time_s > 0


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_checkpoint_holds_trainable_state_only(tmp_path, zero_stage):
    """A GPT-2 whose frozen MLPs dwarf what fpt trains: the checkpoint is a small fraction of
    the model, holds no frozen tensor, and restores Adam's moments exactly."""
    from transformers import GPT2Config

    arch = tmp_path / "wide-mlp"
    GPT2Config(
        n_layer=2, n_embd=64, n_head=2, n_inner=4096, n_positions=16, vocab_size=8
    ).save_pretrained(arch)
    cfg = config(model=str(arch), max_steps=4, eval_every=4, zero_stage=zero_stage)

    trial = trial_run(cfg, "engine")
    try:
        trial.run()
        engine = trial.step.engine
        trainable = trainable_names(engine)
        params = dict(engine.module.named_parameters())
        model_bytes = sum(p.numel() * p.element_size() for p in params.values())
        trainable_bytes = sum(params[n].numel() * params[n].element_size() for n in trainable)
        assert trainable_bytes < model_bytes / 100  # fpt on this model: ~0.2% trains
        moments = adam_moments(engine)
        trial.save(str(tmp_path / "ckpt"))
    finally:
        trial.close()

    files = [p for p in (tmp_path / "ckpt" / CHECKPOINT_TAG).rglob("*") if p.is_file()]
    checkpoint_bytes = sum(p.stat().st_size for p in files)
    # Weights + two Adam moments of the trained tensors, plus a few tens of kB of pickling.
    assert checkpoint_bytes < 4 * trainable_bytes + 100_000
    assert checkpoint_bytes < model_bytes / 20, (checkpoint_bytes, model_bytes)
    model_states = [p for p in files if p.name.endswith("model_states.pt")]
    assert len(model_states) == 1
    saved = torch.load(model_states[0], map_location="cpu", weights_only=False)
    assert set(saved["module"]) == trainable
    assert not saved.get("frozen_param_fragments") and not saved.get("frozen_param_shapes")

    restored = trial_run(cfg, "engine")
    try:
        # A fresh engine has no optimiser state until it steps; the checkpoint brings it.
        restored.restore(str(tmp_path / "ckpt"))
        for got, want in zip(adam_moments(restored.step.engine), moments, strict=True):
            assert torch.equal(got, want)
        assert restored.states[0].step == 4
        assert restored.states[0].status == "completed"
    finally:
        restored.close()


@pytest.mark.parametrize("kind", ["cohort", "engine"])
def test_restore_from_an_empty_directory_says_so(tmp_path, kind):
    trial = trial_run(config(max_steps=2, eval_every=2), kind)
    try:
        with pytest.raises(DamagedCheckpointError, match="no trial checkpoint"):
            trial.restore(str(tmp_path))
    finally:
        trial.close()


def test_restore_of_another_trial_is_refused(tmp_path):
    first = trial_run(config(max_steps=2, eval_every=2))
    try:
        first.run()
        first.save(str(tmp_path / "ckpt"))
    finally:
        first.close()
    other = trial_run(config(max_steps=2, eval_every=2, lr=0.05))
    try:
        with pytest.raises(DamagedCheckpointError, match="belongs to other trials"):
            other.restore(str(tmp_path / "ckpt"))
    finally:
        other.close()


# -------------------------------------------------------------------------------- divergence


def test_real_divergence_keeps_the_curve_up_to_it(tmp_path):
    """Attention and heads trained with lr=1e5: the loss explodes and turns non-finite within
    a few steps (deterministically, from the seed)."""
    cfg = config(finetune="fpt+attn", lr=1e5, max_steps=20, eval_every=1)
    losses: list[float] = []
    writer = ResultsWriter(tmp_path, "t")
    curve_rows: list[dict] = []

    def on_eval(curves, trial_rows):
        for curve_row in curves:
            curve_rows.append(curve_row)
            writer.write_curve(curve_row["trial_id"], [curve_row])
        writer.write_trial(trial_rows[0])

    trial = trial_run(cfg)
    assert trial.kind == "engine"  # attention trains: DeepSpeed
    try:
        # Reading the step's device loss after every step syncs: a test may, the loop does not.
        (row,) = trial.run(
            on_eval=on_eval, progress=lambda _: losses.append(trial.step.metrics.last_loss.item())
        )
        state = trial.states[0]
    finally:
        trial.close()
    writer.write_trial(row)

    assert state.status == "diverged" and row["status"] == "diverged"
    assert row["stop_reason"] == "diverged"
    assert all(math.isfinite(v) for v in losses[: state.step])  # steps_done: finite steps
    assert 1 <= row["steps_done"] == state.step < cfg.train.max_steps
    assert max(losses) > 1e6  # it really blew up before going non-finite
    history = state.history
    assert history, "no evaluation before the divergence"
    assert [e.step for e in history] == list(range(1, history[-1].step + 1))
    assert history[-1].step <= state.step
    assert all(math.isfinite(e.test_loss) and math.isfinite(e.train_loss) for e in history)
    assert row["final_test_accuracy"] == history[-1].test_accuracy
    assert row["final_test_loss"] == history[-1].test_loss
    assert row["best_test_accuracy"] == max(e.test_accuracy for e in history)
    assert row["best_val_accuracy"] == max(e.val_accuracy for e in history)
    assert len(curve_rows) == len(history)

    results = load_results(tmp_path)
    assert results.trials.loc[0, "status"] == "diverged"
    assert results.trials.loc[0, "steps_done"] == state.step
    assert list(results.curves["step"]) == [e.step for e in history]


@pytest.mark.parametrize("kind", ["cohort", "engine"])
@pytest.mark.parametrize("poison_step", [4, 6])
def test_update_that_poisons_the_weights_is_divergence(poison_step, kind):
    """A step whose loss was finite but whose update made the weights non-finite: the next
    evaluation is NaN. That evaluation is not a result (final_test_accuracy stays the last
    finite one), and the trial is diverged, even when it was the last step."""

    def poison(step):
        if step == poison_step:
            with torch.no_grad():
                if kind == "engine":
                    trial.step.engine.module.output.weight.fill_(float("nan"))
                else:
                    trial.step.model.output_weight.fill_(float("nan"))

    trial = trial_run(config(max_steps=6, eval_every=2), kind)
    try:
        (row,) = trial.run(progress=poison)
        state = trial.states[0]
    finally:
        trial.close()
    assert state.status == "diverged" and row["status"] == "diverged"
    assert row["stop_reason"] == "diverged" and row["steps_done"] == poison_step
    assert [e.step for e in state.history] == list(range(2, poison_step, 2))
    assert row["final_test_accuracy"] == state.history[-1].test_accuracy
    assert math.isfinite(row["final_test_loss"])


# ---------------------------------------------------------------------------------- metrics


def at(step: int, val_accuracy: float, test_accuracy: float = 0.5) -> Evaluation:
    return Evaluation(step, 0.5, 0.5, 0.5, val_accuracy, 0.5, test_accuracy, 1.0, 1.0)


def test_steps_to_threshold_selection_and_best_accuracy():
    """Selection and steps-to-threshold read validation accuracy; test accuracy is reported
    at the selected evaluation (the earliest of equally good ones)."""
    state = TrialState(
        step=60,
        status="completed",
        history=[
            at(10, 0.5, 0.6),
            at(20, 0.89, 0.99),  # the best test accuracy is not what selection reads
            at(30, 0.9, 0.7),
            at(40, 0.95, 0.8),
            at(50, 0.7, 0.75),
            at(60, 0.95, 0.9),  # as good as step 40 on validation: the earlier one stays
        ],
    )
    assert state.steps_to_threshold(0.9) == 30  # the first reaching it, >= inclusive
    assert state.steps_to_threshold(0.95) == 40
    assert state.steps_to_threshold(0.5) == 10
    assert state.steps_to_threshold(0.96) is None
    assert state.selected().step == 40 and state.best_val_accuracy() == 0.95
    assert state.steps_since_best() == 20
    assert state.best_test_accuracy() == 0.99
    assert math.isnan(TrialState().best_test_accuracy())
    assert math.isnan(TrialState().best_val_accuracy())
    assert TrialState().steps_to_threshold(0.0) is None

    trial = trial_run(config(accuracy_threshold=0.9, max_steps=60))
    try:
        row = trial.records[0].trial_row(state)
        never = trial.records[0].trial_row(TrialState(step=50, history=[at(50, 0.1)]))
    finally:
        trial.close()
    assert row["steps_to_threshold"] == 30
    assert (row["selected_step"], row["val_accuracy"], row["test_accuracy"]) == (40, 0.95, 0.8)
    assert row["best_val_accuracy"] == 0.95
    assert row["best_test_accuracy"] == 0.99 and row["final_test_accuracy"] == 0.9
    assert never["steps_to_threshold"] is None


def test_evaluation_schedule_is_regular_plus_log_spaced():
    assert evaluation_steps(30, 10, log_evals=True) == [10, 20, 30]
    assert evaluation_steps(25, 10, log_evals=False) == [10, 20, 25]  # and the last step
    assert evaluation_steps(5000, 1000, log_evals=False) == [1000, 2000, 3000, 4000, 5000]
    assert evaluation_steps(5000, 1000, log_evals=True) == [
        100, 150, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000
    ]  # fmt: skip
    many = evaluation_steps(100_000, 10_000, log_evals=True)
    assert many[:8] == [100, 150, 200, 300, 500, 700, 1000, 1500]
    assert {7000, 10_000, 15_000, 20_000, 70_000, 100_000} <= set(many)
    assert many == sorted(set(many)) and many[-1] == 100_000


@pytest.mark.parametrize("kind", ["cohort", "engine"])
def test_every_evaluation_measures_validation_and_test(kind):
    """Both splits are measured at every scheduled step, log-spaced ones included, and the
    row selects on validation."""
    row, state = run(config(max_steps=150, eval_every=150, log_evals=True), kind=kind)
    assert [e.step for e in state.history] == [100, 150]  # 100: log-spaced only
    for e in state.history:
        assert 0.0 <= e.val_accuracy <= 1.0 and 0.0 <= e.test_accuracy <= 1.0
        assert math.isfinite(e.val_loss) and math.isfinite(e.test_loss)
    selected = state.selected()
    assert row["selected_step"] == selected.step
    assert (row["val_accuracy"], row["test_accuracy"]) == (
        selected.val_accuracy,
        selected.test_accuracy,
    )
    assert (row["status"], row["stop_reason"]) == ("completed", "budget")


def test_patience_counts_steps_since_the_best_evaluation():
    """lr 0 never improves after the first evaluation: patience 20 (steps) stops at the first
    evaluation 20 steps after it, completed with stop_reason patience and the steps taken."""
    row, state = run(config(lr=1e-12, max_steps=100, eval_every=10, patience=20))
    assert [e.step for e in state.history] == [10, 20, 30]
    assert (row["status"], row["stop_reason"], row["steps_done"]) == ("completed", "patience", 30)
    assert row["selected_step"] == 10


def test_patience_in_steps_spares_a_slow_starter_on_the_log_spaced_schedule():
    """Evaluations at 100, 150, 200, 300 (log-spaced): three evaluations without a better
    validation accuracy are only 200 steps; patience 250 (steps) waits for step 500."""
    state = TrialState(history=[at(100, 0.5), at(150, 0.5), at(200, 0.5), at(300, 0.5)])
    assert state.steps_since_best() == 200  # under patience 250: the trial goes on
    state.history.append(at(500, 0.5))
    assert state.steps_since_best() == 400


def test_a_non_finite_test_loss_alone_ends_nothing():
    """Test is measured, never decided on: with the test split's loss NaN at every
    evaluation the trial trains its whole budget, selects on validation, and records the
    NaN."""
    trial = trial_run(config(max_steps=20, eval_every=10))
    evaluate = trial.step.evaluate

    def nan_test(split):
        out = evaluate(split)
        return out.fill_(float("nan")) if split == "test" else out

    trial.step.evaluate = nan_test
    try:
        (row,) = trial.run()
        state = trial.states[0]
    finally:
        trial.close()
    assert (row["status"], row["stop_reason"], row["steps_done"]) == ("completed", "budget", 20)
    assert [e.step for e in state.history] == [10, 20]
    assert all(math.isnan(e.test_loss) and math.isfinite(e.val_loss) for e in state.history)
    assert math.isfinite(row["best_val_accuracy"])


def test_accuracy_counts_every_bit():
    # 2 examples x 3 predicting tokens x 4 bits, 2 classes: 24 predictions.
    targets = torch.tensor(
        [
            [[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]],
            [[0, 1, 0, 1], [1, 0, 0, 1], [0, 0, 1, 1]],
        ]
    )
    predicted = targets.clone()
    wrong = [(0, 0, 0), (0, 2, 3), (1, 1, 1), (1, 1, 2), (1, 2, 0)]
    for index in wrong:
        predicted[index] = 1 - predicted[index]
    logits = torch.nn.functional.one_hot(predicted, 2).float() * 3.0 - 1.0  # margin 3
    loss, correct = (t[0] for t in member_losses(logits[None], targets[None]))
    assert correct.item() == targets.numel() - len(wrong) == 19
    assert correct.item() / targets.numel() == pytest.approx(19 / 24)
    # Cross-entropy of a margin-3 two-class logit pair, right or wrong.
    right_ce, wrong_ce = math.log1p(math.exp(-3.0)), math.log1p(math.exp(3.0))
    expected = (19 * right_ce + 5 * wrong_ce) / 24
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # bf16 logits are scored in float32.
    loss16, correct16 = (t[0] for t in member_losses(logits.bfloat16()[None], targets[None]))
    assert correct16.item() == 19 and loss16.dtype == torch.float32


# ------------------------------------------------------------------------------- precisions


def test_bf16_trains_on_cpu_with_fp32_master_weights():
    trial = trial_run(config(precision="bf16", max_steps=4, eval_every=2), "engine")
    try:
        (row,) = trial.run()
        engine = trial.step.engine
        module_dtypes = {p.dtype for p in engine.module.parameters()}
        frozen = [p for p in engine.module.parameters() if not p.requires_grad]
        master = [p for g in engine.basic_optimizer.param_groups for p in g["params"]]
        # The engine's own autocast section makes its forward bf16: on a GPU its forward
        # switches off whatever autocast the caller entered.
        assert not torch.is_autocast_enabled("cpu")
        x, lengths, _ = model_inputs(trial.step.task.train_batch(0, 8), torch.bfloat16)
        logits = engine(x, lengths)
    finally:
        trial.close()
    assert logits.dtype == torch.bfloat16
    assert row["status"] == "completed" and math.isfinite(row["final_test_loss"])
    assert all(math.isfinite(e.train_loss) for e in trial.states[0].history)
    # Frozen weights are held in bf16 (half their memory) and the trained parameters are the
    # fp32 masters the optimiser steps; the step computes in bf16 under the engine's autocast
    # (``engine.lean_engine``: DeepSpeed's bf16 wrapper read every gradient on the host).
    assert frozen and {p.dtype for p in frozen} == {torch.bfloat16}
    assert module_dtypes == {torch.bfloat16, torch.float32}
    assert {p.dtype for p in master} == {torch.float32}
    # (the whole positional table is in the optimiser; its rows past the task's T never move)
    assert sum(p.numel() for p in master) == row["trainable_params"] + (1024 - 10) * 128


def test_a_closed_zero_3_trial_leaves_torch_functional_linear_as_it_found_it():
    """A ZeRO-3 engine replaces ``torch.nn.functional.linear`` for its whole process; left in,
    a reused actor's next trial (a 2-worker ZeRO-2 one) trained another curve than in a fresh
    process (docs/faults.md)."""
    linear = torch.nn.functional.linear
    trial = trial_run(config(zero_stage=3, max_steps=2, eval_every=2), "engine")
    try:
        replaced_while_it_lives = torch.nn.functional.linear is not linear
        (row,) = trial.run()
    finally:
        trial.close()
    assert row["status"] == "completed" and replaced_while_it_lives
    assert torch.nn.functional.linear is linear


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is allowed where CUDA is")
def test_fp16_without_cuda_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        trial_run(config(precision="fp16"))
    assert "CUDA" in str(info.value) and "--precision fp16" in str(info.value)
    assert len(info.value.problems) == 1


# -------------------------------------------------------------------------------- trial row

# gpt2-tiny by hand: 2 blocks of width 128 (MLP 512), 1024 positions. Bit XOR: 10 tokens of
# width 1 in (input Linear(1, 128)), one bit per predicting token out (Linear(128, 2)).
L, D, INNER, POSITIONS, T = 2, 128, 512, 1024, 10
BLOCK_MATMUL = D * 3 * D + D * D + D * INNER + INNER * D  # c_attn, attn c_proj, c_fc, mlp c_proj
INPUT_W, OUTPUT_W = 1 * D, D * 2
MATMUL = L * BLOCK_MATMUL + INPUT_W + OUTPUT_W  # weight matrices that multiply activations
ATTENTION_FWD = L * 2 * 2 * T * T * D  # QK^T and AV, forward, per sequence
GROUPS = {
    "input": D + D,
    "output": 2 * D + 2,
    "ln": L * 2 * 2 * D + 2 * D,
    "pos": POSITIONS * D,
    "ff": L * (D * INNER + INNER + INNER * D + D),
    "attn": L * (D * 3 * D + 3 * D + D * D + D),
}
TRAINED = {**GROUPS, "pos": T * D}
"""What trains of each group: the positional table's first T rows only."""


def step_flops_by_hand(batch: int, trained_matmul: int) -> int:
    # forward 2N, activation gradients 2N (through everything: the input layer trains),
    # weight gradients 2 per trained weight; attention products: forward + 2x backward.
    per_token = 2 * MATMUL + 2 * MATMUL + 2 * trained_matmul
    return batch * (T * per_token + 3 * ATTENTION_FWD)


@pytest.mark.parametrize(
    ("finetune", "trained_groups", "trained_matmul"),
    [
        pytest.param("fpt", ("input", "output", "ln", "pos"), INPUT_W + OUTPUT_W, id="fpt"),
        pytest.param("full", tuple(GROUPS), MATMUL, id="full"),
    ],
)
def test_trial_row_contents(tmp_path, finetune, trained_groups, trained_matmul):
    # On the CPU whatever the machine has (accelerator auto would train on a visible GPU).
    cfg = config(finetune=finetune, max_steps=4, eval_every=2, batch_size=4, accelerator="cpu")
    trial = trial_run(cfg, "engine")
    try:
        (row,) = trial.run()
        module = trial.step.engine.module
        unused_rows = (POSITIONS - T) * D if "pos" in trained_groups else 0
        trainable = sum(p.numel() for p in module.parameters() if p.requires_grad) - unused_rows
        total = sum(p.numel() for p in module.parameters())
    finally:
        trial.close()

    # Placement columns (sweep.report_placed) and search_config are filled by a sweep; a
    # trial run outside Ray leaves them null.
    placement = {"node_id", "gpu_ids", "gpu_model", "resources_requested", "search_config"}
    assert set(TRIAL_SCHEMA.names) - placement <= set(row), set(TRIAL_SCHEMA.names) - set(row)
    assert row["sweep"] == "t" and re.fullmatch(r"[0-9a-f]{12}", row["trial_id"])
    assert {k: row[k] for k in cfg.to_flat()} == cfg.to_flat()
    assert row["status"] == "completed" and row["steps_done"] == 4 and row["error"] is None
    assert row["trainable_params"] == trainable == sum(TRAINED[g] for g in trained_groups)
    assert row["total_params"] == total == sum(GROUPS.values())
    assert row["trained_groups"] == "+".join(trained_groups)
    assert json.loads(row["group_params"]) == {
        g: {"total": n, "trainable": TRAINED[g] if g in trained_groups else 0}
        for g, n in GROUPS.items()
    }
    assert (row["n_layer"], row["d_model"], row["n_tokens"]) == (L, D, T)

    flops = step_flops_by_hand(4, trained_matmul)
    assert row["flops_per_step"] == flops
    assert row["total_flops"] == 4 * flops and row["samples_seen"] == 16
    if finetune == "full":
        assert flops == 4 * (T * 6 * MATMUL + 3 * ATTENTION_FWD)
    else:  # frozen backbone: ~4N per token, i.e. two thirds of full fine-tuning
        ratio = flops / step_flops_by_hand(4, MATMUL)
        assert 0.66 < ratio < 0.68

    assert row["git_sha"] and isinstance(row["git_sha"], str)
    if (ROOT / ".git").exists() and "SCALE_FPT_GIT_SHA" not in os.environ:
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", row["git_sha"]), row["git_sha"]
    versions = json.loads(row["versions"])
    assert {"torch", "deepspeed"} <= set(versions)
    assert versions["torch"] == torch.__version__
    assert row["device"] == "cpu" and row["hostname"]
    assert row["wall_time_s"] >= row["train_time_s"] > 0

    # The row is what the results table holds.
    writer = ResultsWriter(tmp_path, "t")
    writer.write_trial(row)
    stored = load_results(tmp_path).trials.iloc[0]
    for column in ("trial_id", "status", "steps_done", "trainable_params", "flops_per_step"):
        assert stored[column] == row[column], column


@pytest.mark.parametrize("kind", ["cohort", "engine"])
def test_the_checkpoints_weights_file_holds_the_selected_evaluations_weights(tmp_path, kind):
    """What the report rebuilds a trial from (attention maps) is the model at the step its
    row reports, not the last step's."""
    trial = trial_run(config(max_steps=40, eval_every=10, lr=3e-3), kind)
    seen = {}

    def on_eval(curves, rows):
        seen[trial.position] = trial.step.member_weights(0)

    try:
        trial.run(on_eval=on_eval)
        trial.save(str(tmp_path))
        selected = trial.states[0].selected().step
    finally:
        trial.close()
    saved = torch.load(tmp_path / f"weights-{trial.trial_ids[0]}.pt", weights_only=False)
    assert sorted(seen) == [10, 20, 30, 40] and selected == 30  # validation 0.5625 at 30
    for name, tensor in seen[30].items():
        torch.testing.assert_close(saved["module"][name], tensor, rtol=0, atol=0)
    assert any(not torch.equal(seen[40][n], t) for n, t in seen[30].items())  # moved on
