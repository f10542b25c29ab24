"""A trial's static profile (``profile.TrialProfile``) is computed once: on the driver's way
from a sweep config to Ray's resources, each trial is parsed once and each shape is built
on the meta device once, whoever reads it."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import TINY_TRIAL

from scale_fpt import config as config_module
from scale_fpt import planner, profile
from scale_fpt.cluster import GPUOffer
from scale_fpt.config import TrialConfig, parse_trial
from scale_fpt.gpus import GPUS
from scale_fpt.packing import search_pack
from scale_fpt.preflight import sweep_problems
from scale_fpt.sweep import Devices, SweepConfig, placement_on, plan_sweep
from scale_fpt.sweep.driver import trial_resources
from scale_fpt.sweep.plan import study_gpu_hours
from scale_fpt.trial import TrialRun


@pytest.fixture
def counted(monkeypatch):
    """(parses per trial, meta builds per shape) from a clean cache."""
    parses: Counter = Counter()
    builds: Counter = Counter()
    from_flat = TrialConfig.from_flat.__func__
    build_model = profile.build_model

    def counting_from_flat(cls, flat, **kwargs):
        parses[tuple(sorted(flat.items()))] += 1
        return from_flat(cls, flat, **kwargs)

    def counting_build(config, spec, *args):
        builds[(config.task, config.model, config.train.finetune)] += 1
        return build_model(config, spec, *args)

    monkeypatch.setattr(TrialConfig, "from_flat", classmethod(counting_from_flat))
    monkeypatch.setattr(profile, "build_model", counting_build)
    for cache in (config_module._parse_items, profile.config_profile, profile.meta_model):
        cache.cache_clear()
    yield parses, builds
    for cache in (config_module._parse_items, profile.config_profile, profile.meta_model):
        cache.cache_clear()


def test_a_packed_grid_is_parsed_once_per_trial_and_built_once_per_shape(counted):
    parses, builds = counted
    sweep = SweepConfig(
        name="s",
        base={"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained", "max_steps": 10},
        grid={"lr": [1e-3, 1e-2, 1e-1], "finetune": ["fpt", "full"]},
        seeds=(0, 1),
        pack="auto",
        gpu="a10g-24gb",
    )
    sweep.validate()
    trials = sweep.trials()
    problems = sweep_problems(trials)  # preflight
    offer = GPUOffer(GPUS["a10g-24gb"], 0, "declared")
    devices = Devices(gpus=1, slots=1, slot_bytes=offer.gpu.memory_bytes)
    plan = plan_sweep(sweep, placement_on(sweep, offer, devices), trials)
    resources = trial_resources(plan)
    for cohort in plan.cohorts:  # what the driver asks Ray for
        resources({"sweep": "s", "members": list(cohort.members)})
    cohorts = [cohort.members for cohort in plan.cohorts]
    search_pack(plan.profiles[:2], sweep.pack, sweep.search_trials, devices, False)
    study_gpu_hours(plan)

    assert problems == [] and [len(c) for c in cohorts] == [6, 1, 1, 1, 1, 1, 1]
    assert len(parses) == len(trials) == 12
    assert set(parses.values()) == {1}  # every reader shares one parse per trial
    # two shapes (fpt, full) whatever the seeds and learning rates: one meta build each
    assert sorted(builds.values()) == [1, 1]


def test_a_worker_parses_each_member_once(counted):
    parses, builds = counted
    members = [{**TINY_TRIAL, "lr": lr, "max_steps": 1} for lr in (1e-3, 1e-2)]
    configs = [parse_trial(m) for m in members]  # what tune_trial does with its members
    run = TrialRun(configs, sweep="s")
    try:
        rows = run.trial_rows()
    finally:
        run.close()
    assert run.kind == "cohort" and [r["cohort_size"] for r in rows] == [2, 2]
    assert sorted(parses.values()) == [1, 1] and sorted(builds.values()) == [1]


def test_the_profile_reads_as_the_trial_rows_and_the_plan_do():
    fpt = profile.profile_of({"task": "bit-xor", "model": "gpt2-tiny"})
    full = profile.profile_of({"task": "bit-xor", "model": "gpt2-tiny", "finetune": "full"})
    assert (fpt.kind, full.kind) == ("cohort", "engine")
    assert full.pack_problem.startswith("--finetune trains")
    assert fpt.built.trained_groups == ("input", "output", "ln", "pos")
    assert fpt.shape.trained_params == fpt.built.trainable_params < full.shape.trained_params
    assert fpt.flops[0] == fpt.shape.train_flops_per_example * fpt.config.train.batch_size
    # one memory policy for both step kinds: allocated bytes, slack, CUDA context
    body, member = fpt.cohort_memory_parts()
    assert planner.device_bytes(fpt.cohort_bytes(1)) == planner.device_bytes(body + member)
    assert profile.plan_trial(fpt.config, "auto", None) == planner.CPU_PLAN
