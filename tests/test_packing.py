"""Trial packing: a packed member trains exactly as the same trial alone (on DeepSpeed at
dropout 0 and 0.1, and as a K = 1 cohort at the paper's dropout 0.1: keyed masks), diverges alone,
resumes exactly, is grouped only with compatible trials, and a packed cohort run by Ray
Tune writes every member's rows once."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.packing import cohorts
from scale_fpt.profile import pack_problem, profile_of, step_kind
from scale_fpt.results import ResultsWriter, table
from scale_fpt.results_schema import CURVE_SCHEMA, TRIAL_SCHEMA
from scale_fpt.trial import TrialRun, trial_id_for

RTOL = 1e-4
SWEEP = "packing-test"
METRICS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy")

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
        "val_batches": 2,
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


def run_alone(cfg: TrialConfig, kind: str | None = None):
    """The trial run by itself: (state, row)."""
    trial = TrialRun([cfg], sweep=SWEEP, kind=kind)
    try:
        (row,) = trial.run()
        return trial.states[0], row
    finally:
        trial.close()


@pytest.fixture(scope="module")
def solo(base):
    """Each member run alone on a DeepSpeed engine (the other step kind): (state, row)."""
    return {config(base, m): run_alone(config(base, m), "engine") for m in [*MEMBERS, DIVERGING]}


class Cohort(TrialRun):
    """A packed run with each member's state and config at hand."""

    @property
    def members(self):
        return [
            SimpleNamespace(config=r.config, state=s)
            for r, s in zip(self.records, self.states, strict=True)
        ]


def run_cohort(base, members) -> Cohort:
    cohort = Cohort([config(base, m) for m in members], sweep=SWEEP)
    try:
        cohort.run()
    finally:
        cohort.close()
    return cohort


def assert_same_curve(packed_state, solo_state):
    assert packed_state.status == solo_state.status
    assert packed_state.step == solo_state.step
    assert len(packed_state.history) == len(solo_state.history)
    for p, s in zip(packed_state.history, solo_state.history, strict=True):
        assert p.step == s.step
        for name in METRICS:
            assert getattr(p, name) == pytest.approx(getattr(s, name), rel=RTOL), (name, p.step)


def test_packed_members_match_their_solo_runs(base, solo):
    cohort = run_cohort(base, MEMBERS)
    for member in cohort.members:
        solo_state, _ = solo[member.config]
        assert member.state.status == "completed"
        assert len(member.state.history) == 10
        assert_same_curve(member.state, solo_state)


def test_packed_members_match_their_solo_runs_at_dropout(base):
    """At the paper's dropout 0.1, for 20 steps: each member's masks are keyed on (its
    dropout seed, step, site), so its curve in a cohort of 3 equals its run alone (K = 1)
    and is not the curve it would have with another member's masks."""
    at_dropout = {**base, "dropout": 0.1, "max_steps": 20, "eval_every": 1}
    cohort = run_cohort(at_dropout, MEMBERS)
    for member in cohort.members:
        assert step_kind(member.config) == "cohort"
        alone, _ = run_alone(member.config)
        assert len(alone.history) == 20
        assert_same_curve(member.state, alone)
    # Dropout is on and matters: without it the curve differs.
    no_dropout, _ = run_alone(config({**at_dropout, "dropout": 0.0}, MEMBERS[0]))
    losses = [e.train_loss for e in cohort.members[0].state.history]
    assert losses != pytest.approx([e.train_loss for e in no_dropout.history], rel=RTOL)


def test_packed_members_match_their_engine_runs_at_dropout(base):
    """At dropout 0.1 a cohort's last block computes only the read-out rows, a DeepSpeed
    engine's GPT-2 every row; masks keyed on each element's place among all tokens make
    them draw the same masks for the rows read out, so the curves agree (the CPU twin of
    the compiled-cohort GPU test)."""
    at_dropout = {**base, "dropout": 0.1, "max_steps": 5, "eval_every": 1}
    cohort = run_cohort(at_dropout, MEMBERS[:2])
    for member in cohort.members:
        engine, _ = run_alone(member.config, "engine")
        assert_same_curve(member.state, engine)


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
        same = ["status", "stop_reason", "steps_done", "trainable_params", "total_params"]
        same += ["trained_groups", "selected_step"]
        same += ["group_params", "n_layer", "d_model", "n_tokens", "flops_per_step", "device"]
        same += ["lr", "seed", "finetune", "model", "task", "samples_seen"]
        assert {k: row[k] for k in same} == {k: solo_row[k] for k in same}
        assert row["final_test_accuracy"] == pytest.approx(solo_row["final_test_accuracy"])
    # The rows fit the Parquet schemas as they are.
    assert table(rows, TRIAL_SCHEMA).num_rows == 2
    curves = [
        r.curve_row(s.history[-1]) for r, s in zip(cohort.records, cohort.states, strict=True)
    ]
    assert table(curves, CURVE_SCHEMA).num_rows == 2


def test_resumed_cohort_matches_uninterrupted(base, tmp_path):
    whole = run_cohort(base, MEMBERS)

    class Stop(Exception):
        pass

    first = Cohort([config(base, m) for m in MEMBERS], sweep=SWEEP)

    def stop_at_4(curve_rows, trial_rows):
        if first.position == 4:
            first.save(str(tmp_path / "ckpt"))
            raise Stop

    with pytest.raises(Stop):
        first.run(stop_at_4)
    first.close()
    resumed = Cohort([config(base, m) for m in MEMBERS], sweep=SWEEP)
    torch.manual_seed(999)  # the checkpoint's RNG state must win over whatever came before
    resumed.restore(str(tmp_path / "ckpt"))
    assert resumed.position == 4
    resumed.run()
    resumed.close()
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
        Cohort([config(base, {**MEMBERS[0], "finetune": "fpt+ff"})], kind="cohort")


def test_step_kind_of_each_config(base):
    """Packable trials take the cohort step (K = 1 alone); the rest a DeepSpeed engine."""
    assert step_kind(config(base, MEMBERS[0])) == "cohort"
    for unpackable in ({"finetune": "fpt+ff"}, {"zero_stage": 2}, {"model": "lstm"}):
        flat = {**base, **MEMBERS[0], **unpackable}
        if unpackable.get("model") == "lstm":
            flat["init"] = "random"
        assert step_kind(TrialConfig.from_flat(flat)) == "engine", unpackable


# --------------------------------------------------------------------------- Ray Tune


@pytest.mark.slow
def test_tune_cohort_writes_every_member_once(base, tmp_path, monkeypatch):
    import pandas as pd
    from ray import tune

    from scale_fpt.models.backbones import scale_fpt_home
    from scale_fpt.sweep import connect_ray, results_callback_class, tune_trial

    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    flat = {**base, "max_steps": 6, "eval_every": 3}
    packed = [{**flat, **m} for m in MEMBERS]
    unpackable = [{**flat, **MEMBERS[0], "finetune": "fpt+ff"}]  # alone, on an engine
    results_dir = tmp_path / "results"
    # The local Ray run_sweep would start, left up for the modules after this one (their
    # sweeps attach to it instead of starting their own); another module's, if it is up.
    connect_ray(runtime_env={"env_vars": {"SCALE_FPT_HOME": str(scale_fpt_home())}})
    tuner = tune.Tuner(
        tune.with_resources(tune_trial, {"cpu": 1}),
        param_space={"sweep": SWEEP, "members": tune.grid_search([packed, unpackable])},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name="packing",
            storage_path=str(tmp_path / "ray"),
            callbacks=[results_callback_class()(ResultsWriter(results_dir, SWEEP))],
            verbose=0,
        ),
    )
    grid = tuner.fit()
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
        assert_same_curve(member.state, run_alone(member.config, "engine")[0])


def test_bf16_cohort_trains(base):
    """bf16: the body in bf16, fp32 master copies of the trained tensors (as DeepSpeed)."""
    cohort = Cohort(
        [config({**base, "precision": "bf16", "max_steps": 3, "eval_every": 3}, m) for m in MEMBERS]
    )
    try:
        assert cohort.step.model.frozen[0][0].dtype == torch.bfloat16
        assert cohort.step.model.ln_f_weight.dtype == torch.float32
        cohort.run()
    finally:
        cohort.close()
    for member in cohort.members:
        assert member.state.status == "completed"
        assert math.isfinite(member.state.last.test_loss)


def test_cohort_memory_counts_the_body_once():
    one = profile_of(arm(model="gpt2", task="cifar10", lr=1e-3)).cohort_bytes(1)
    sixteen = profile_of(arm(model="gpt2", task="cifar10", lr=1)).cohort_bytes(16)
    assert 85e6 * 4 < one < sixteen < 16 * one - 15 * 85e6 * 4  # the body once, not 16 times
