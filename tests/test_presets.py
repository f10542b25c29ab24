"""Every shipped preset works as shipped: built, validated and planned; and each local preset
(the laptop default) passes its preflight and starts on a fresh machine: empty Hugging Face
and scale_fpt caches, no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scale_fpt.recipes.studies import STUDIES
from scale_fpt.study import placement_table

PRESETS = [(study, preset) for study, s in STUDIES.items() for preset in s.presets]
LOCAL_PRESETS = [(study, preset) for study, preset in PRESETS if preset.startswith("local")]

FRESH_MACHINE = """
import json, sys
from scale_fpt.config import parse_trial
from scale_fpt.preflight import preflight_problems, weights_needed
from scale_fpt.recipes.studies import STUDIES
from scale_fpt.trial import TrialRun

out = {}
for study, preset in json.loads(sys.argv[1]):
    sweep = STUDIES[study].presets[preset]()
    trials = sweep.trials()
    problems = preflight_problems(trials)
    # Start one trial that needs nothing made first (a pretrained CPU preset's backbone is
    # pretrained by the sweep itself, minutes on a CPU): a few steps on its own config.
    drawn = [t for t in trials if parse_trial(t).model.init != "pretrained"]
    steps = None
    if drawn and weights_needed(parse_trial(drawn[0])) == ("", False):
        short = {"max_steps": 2, "eval_every": 1, "test_batches": 1, "val_batches": 1}
        run = TrialRun([parse_trial({**drawn[0], **short})], sweep=sweep.name)
        try:
            (row,) = run.run()
        finally:
            run.close()
        steps = (row["status"], row["steps_done"])
    out[f"{study}/{preset}"] = {"problems": problems, "started": steps}
print(json.dumps(out))
"""


@pytest.mark.parametrize(("study", "preset"), PRESETS, ids=[f"{s}/{p}" for s, p in PRESETS])
def test_every_shipped_preset_builds_validates_and_plans(study, preset):
    sweep = STUDIES[study].presets[preset]()
    sweep.validate()
    table = placement_table(sweep).splitlines()
    assert table[0].startswith(f"{sweep.name}: {len(sweep.trials())} ")
    assert "DOES NOT FIT" not in "\n".join(table)


@pytest.mark.slow
def test_local_presets_preflight_and_start_on_a_fresh_machine(tmp_path):
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "SCALE_FPT_HOME": str(tmp_path / "scale_fpt"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    child = subprocess.run(
        [sys.executable, "-c", FRESH_MACHINE, json.dumps(LOCAL_PRESETS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert {name: r["problems"] for name, r in found.items() if r["problems"]} == {}
    started = {name: r["started"] for name, r in found.items()}
    # finetune's local preset trains pretrained bodies only: its preflight is what runs here
    assert started == {
        name: (None if name == "finetune/local" else ["completed", 2]) for name in started
    }


@pytest.mark.parametrize(("study", "preset"), PRESETS, ids=[f"{s}/{p}" for s, p in PRESETS])
def test_the_printed_plan_is_what_the_driver_asks_ray_for(study, preset):
    """``--plan`` prints the SweepPlan whose cohorts are the driver's grid and whose lookups
    are its Ray resources: members per cohort, GPU share and memory agree, each step sized
    by its own memory model."""
    from scale_fpt import planner
    from scale_fpt.packing import grid_cohorts
    from scale_fpt.study import sweep_plan
    from scale_fpt.sweep.driver import trial_resources
    from scale_fpt.sweep.plan import search_cohorts
    from scale_fpt.vocabulary import StepKind

    sweep = STUDIES[study].presets[preset]()
    plan = sweep_plan(sweep)
    table = placement_table(sweep)
    resources = trial_resources(plan)
    if sweep.search:
        cohorts = search_cohorts(plan)
        assert plan.cohorts == () and len(cohorts) == len(plan.arms)
    else:
        cohorts = plan.cohorts
        grid = grid_cohorts(
            plan.profiles, sweep.pack, sweep.asha, plan.devices, plan.fused_attention
        )
        assert [list(c.members) for c in cohorts] == [[plan.arms[i] for i in g] for g in grid]
        assert sum(len(c.members) for c in cohorts) == len(plan.arms)
    for cohort in cohorts:
        asked = resources({"sweep": sweep.name, "members": list(cohort.members)})
        assert asked.bundles == list(cohort.bundles) and asked.strategy == cohort.strategy
        assert cohort.describe() in table
        step = cohort.plan
        if not step.gpus:
            continue
        gpu_share = sum(b.get("GPU", 0) for b in asked.bundles)
        assert gpu_share == pytest.approx(
            step.gpus * step.gpu_share if step.gpus > 1 else step.gpu_share
        )
        if cohort.kind == StepKind.COHORT:  # K members over one body: the cohort's model
            allocated = cohort.profile.cohort_bytes(len(cohort.members), plan.fused_attention)
            assert cohort.device_bytes == planner.device_bytes(allocated)
        else:  # an engine: the engine's model
            assert cohort.device_bytes == step.memory.device
        assert cohort.device_bytes * step.trials_per_gpu <= step.gpu.memory_bytes
