"""Trial packing: a packed member trains exactly as the same trial alone (DeepSpeed, one
process), diverges alone, resumes exactly, is grouped only with compatible trials, and a
packed cohort run by Ray Tune writes every member's rows once."""

from __future__ import annotations

import math

import pytest
import torch

from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.packing import Cohort, cohorts, pack_problem
from scale_fpt.results import CURVE_SCHEMA, TRIAL_SCHEMA, table
from scale_fpt.trial import Trial, trial_id_for

RTOL = 1e-4
SWEEP = "packing-test"

# Members differ in lr, seed and the trained subset of input/output/ln/pos.
MEMBERS = [
    {"lr": 1e-3, "seed": 0, "finetune": "fpt"},
    {"lr": 3e-3, "seed": 1, "finetune": "input+output+ln"},
    {"lr": 1e-4, "seed": 2, "finetune": "output+pos", "grad_clip": 0.5},
]
DIVERGING = {"lr": 1e30, "seed": 3, "finetune": "fpt"}


@pytest.fixture(scope="module")
def base(tiny_gpt2_dir) -> dict:
    """A tiny pretrained backbone (perturbed layer norms and biases), dropout 0, per-step
    evaluations so that every step's train loss is in the curve."""
    return {
        "task": "bit-xor",
        "test_batches": 2,
        "model": tiny_gpt2_dir,
        "init": "pretrained",
        "dropout": 0.0,
        "batch_size": 4,
        "max_steps": 10,
        "eval_every": 1,
        "eval_batch_size": 32,
        "accelerator": "cpu",
    }


def config(base: dict, member: dict) -> TrialConfig:
    return TrialConfig.from_flat({**base, **member})


@pytest.fixture(scope="module")
def solo(base):
    """Each member run alone through the ordinary trial path (DeepSpeed): (state, row)."""
    out = {}
    for member in [*MEMBERS, DIVERGING]:
        cfg = config(base, member)
        trial = Trial(cfg, sweep=SWEEP)
        try:
            row = trial.run()
            out[cfg] = (trial.trainer.state, row)
        finally:
            trial.close()
    return out


def run_cohort(base, members) -> Cohort:
    cohort = Cohort([config(base, m) for m in members], sweep=SWEEP)
    cohort.fit()
    return cohort


def assert_same_curve(packed_state, solo_state):
    assert packed_state.status == solo_state.status
    assert packed_state.step == solo_state.step
    assert len(packed_state.history) == len(solo_state.history)
    for p, s in zip(packed_state.history, solo_state.history, strict=True):
        assert p.step == s.step
        for name in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            assert getattr(p, name) == pytest.approx(getattr(s, name), rel=RTOL), (name, p.step)


def test_packed_members_match_their_solo_runs(base, solo):
    cohort = run_cohort(base, MEMBERS)
    for member in cohort.members:
        solo_state, _ = solo[member.config]
        assert member.state.status == "completed"
        assert len(member.state.history) == 10
        assert_same_curve(member.state, solo_state)


def test_a_diverging_member_ends_alone(base, solo):
    cohort = run_cohort(base, [MEMBERS[0], DIVERGING, MEMBERS[1], MEMBERS[2]])
    statuses = [m.state.status for m in cohort.members]
    assert statuses == ["completed", "diverged", "completed", "completed"]
    for member in cohort.members:
        assert_same_curve(member.state, solo[member.config][0])
    diverged = cohort.members[1].state
    assert diverged.step < 10
    assert all(math.isfinite(e.test_loss) for e in diverged.history)


def test_packed_rows_are_the_solo_rows(base, solo):
    cohort = run_cohort(base, MEMBERS[:2])
    rows = cohort.trial_rows()
    for member, row in zip(cohort.members, rows, strict=True):
        _, solo_row = solo[member.config]
        assert row["trial_id"] == trial_id_for(SWEEP, member.config.to_flat())
        assert row["trial_id"] == solo_row["trial_id"]
        same = ["status", "steps_done", "trainable_params", "total_params", "trained_groups"]
        same += ["group_params", "n_layer", "d_model", "n_tokens", "flops_per_step", "device"]
        same += ["lr", "seed", "finetune", "model", "task", "samples_seen"]
        assert {k: row[k] for k in same} == {k: solo_row[k] for k in same}
        assert row["final_test_accuracy"] == pytest.approx(solo_row["final_test_accuracy"])
    # The rows fit the Parquet schemas as they are.
    assert table(rows, TRIAL_SCHEMA).num_rows == 2
    curves = [cohort.curve_row(i) for i in range(2)]
    assert table(curves, CURVE_SCHEMA).num_rows == 2


def test_resumed_cohort_matches_uninterrupted(base, tmp_path):
    whole = run_cohort(base, MEMBERS)

    class Stop(Exception):
        pass

    first = Cohort([config(base, m) for m in MEMBERS], sweep=SWEEP)

    def stop_at_4(step, evaluated):
        if step == 4:
            first.save(str(tmp_path / "ckpt"))
            raise Stop

    with pytest.raises(Stop):
        first.fit(stop_at_4)
    first.close()
    resumed = Cohort([config(base, m) for m in MEMBERS], sweep=SWEEP)
    torch.manual_seed(999)  # the checkpoint's RNG state must win over whatever came before
    resumed.restore(str(tmp_path / "ckpt"))
    resumed.fit()
    for a, b in zip(whole.members, resumed.members, strict=True):
        assert [e.step for e in a.state.history] == [e.step for e in b.state.history]
        assert [e.train_loss for e in a.state.history] == pytest.approx(
            [e.train_loss for e in b.state.history], rel=1e-6
        )
        assert [e.test_loss for e in a.state.history] == pytest.approx(
            [e.test_loss for e in b.state.history], rel=1e-6
        )


# --------------------------------------------------------------------------- grouping


def arm(**fields) -> dict:
    return {"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained", **fields}


def test_cohorts_group_only_compatible_arms():
    arms = [
        arm(lr=1e-3, seed=0),  # 0: pretrained: any seed, lr, finetune within fpt share
        arm(lr=1e-4, seed=1, finetune="output+ln"),  # 1
        arm(lr=1e-3, seed=0, finetune="fpt+ff"),  # 2: trains ff: not packable
        arm(init="random", seed=0, lr=1e-3),  # 3: random backbones depend on the seed
        arm(init="random", seed=0, lr=1e-2),  # 4: same seed: shares with 3
        arm(init="random", seed=1, lr=1e-3),  # 5: another backbone
        arm(lr=1e-3, seed=0, batch_size=8),  # 6: another batch size
        arm(model="lstm", init="random"),  # 7: no transformer body
        arm(lr=1e-3, seed=5, precision="fp16"),  # 8: fp16 is not packed
        arm(lr=1e-3, seed=6, dropout=0.0),  # 9: another dropout
        arm(lr=1e-3, seed=7, task="cifar10"),  # 10: another task
    ]
    groups = cohorts(arms, k=16)
    as_indices = [[arms.index(a) for a in g] for g in groups]
    assert sorted(map(sorted, as_indices)) == sorted(
        [[0, 1], [2], [3, 4], [5], [6], [7], [8], [9], [10]]
    )
    assert [g for g in as_indices if len(g) > 1] == [[0, 1], [3, 4]]  # first-seen order
    assert pack_problem(arms[2]) and pack_problem(arms[7]) and pack_problem(arms[8])
    assert pack_problem(arms[0]) is None


def test_cohorts_split_large_groups_evenly_and_keep_every_arm():
    arms = [arm(lr=10.0**-e, seed=s) for e in range(2, 5) for s in range(3)]  # 9 compatible
    groups = cohorts(arms, k=4)
    assert [len(g) for g in groups] == [3, 3, 3]
    assert [a for g in groups for a in g] == arms
    assert cohorts(arms, k=1) == [[a] for a in arms]
    assert cohorts(arms, k=16) == [arms]
    with pytest.raises(ValueError):
        cohorts(arms, k=0)


def test_cohort_refuses_incompatible_members(base):
    with pytest.raises(ConfigError, match="differ"):
        Cohort([config(base, MEMBERS[0]), config({**base, "batch_size": 8}, MEMBERS[1])])
    with pytest.raises(ConfigError, match="ff"):
        Cohort([config(base, {**MEMBERS[0], "finetune": "fpt+ff"})])


# --------------------------------------------------------------------------- Ray Tune


@pytest.mark.slow
def test_tune_cohort_writes_every_member_once(base, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    import pandas as pd
    from ray import tune

    from scale_fpt.packing import tune_cohort
    from scale_fpt.sweep import results_callback_class

    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    flat = {**base, "max_steps": 6, "eval_every": 3}
    packed = [{**flat, **m} for m in MEMBERS]
    unpackable = [{**flat, **MEMBERS[0], "finetune": "fpt+ff"}]  # runs through tune_trial
    results_dir = tmp_path / "results"
    started_here = not ray.is_initialized()  # another test module may have started it
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            tune.with_resources(tune_cohort, {"cpu": 1}),
            param_space={"sweep": SWEEP, "members": tune.grid_search([packed, unpackable])},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(
                name="packing",
                storage_path=str(tmp_path / "ray"),
                callbacks=[results_callback_class()(str(results_dir), SWEEP)],
                verbose=0,
            ),
        )
        grid = tuner.fit()
    finally:
        if started_here:
            ray.shutdown()
    assert grid.num_errors == 0
    trials = pd.read_parquet(results_dir / SWEEP / "trials")
    curves = pd.read_parquet(results_dir / SWEEP / "curves")
    expected = {
        trial_id_for(SWEEP, TrialConfig.from_flat(m).to_flat()) for m in [*packed, *unpackable]
    }
    assert sorted(trials["trial_id"]) == sorted(expected)
    assert set(trials["status"]) == {"completed"}
    assert not curves.duplicated(["trial_id", "step"]).any()
    assert sorted(curves.groupby("trial_id")["step"].apply(list).tolist()) == [[3, 6]] * 4


def test_packed_token_inputs_match_solo_runs(base):
    """Discrete tokens (an embedding per member) and variable lengths (generated ListOps):
    padding to the longest member batch changes nothing under causal attention."""
    listops = {**base, "task": "listops", "max_length": 48, "listops_max_depth": 3}
    listops.update(max_steps=4, eval_every=2, eval_batch_size=16, test_batches=1)
    members = [MEMBERS[0], {**MEMBERS[1], "finetune": "input+ln"}]
    cohort = run_cohort(listops, members)
    for member in cohort.members:
        trial = Trial(member.config, sweep=SWEEP)
        try:
            trial.run()
            assert_same_curve(member.state, trial.trainer.state)
        finally:
            trial.close()


def test_bf16_cohort_trains(base):
    """bf16: the body in bf16, fp32 master copies of the trained tensors (as DeepSpeed)."""
    cohort = run_cohort({**base, "precision": "bf16", "max_steps": 3, "eval_every": 3}, MEMBERS)
    assert cohort.model.frozen[0][0].dtype == torch.bfloat16
    assert cohort.model.ln_f_weight.dtype == torch.float32
    for member in cohort.members:
        assert member.state.status == "completed"
        assert math.isfinite(member.state.last.test_loss)


def test_cohort_memory_counts_the_body_once():
    from scale_fpt.packing import cohort_memory_bytes

    one = cohort_memory_bytes([arm(model="gpt2", task="cifar10", lr=1e-3)])
    sixteen = cohort_memory_bytes([arm(model="gpt2", task="cifar10", lr=i) for i in range(1, 17)])
    assert 85e6 * 4 < one < sixteen < 16 * one - 15 * 85e6 * 4  # the body once, not 16 times
