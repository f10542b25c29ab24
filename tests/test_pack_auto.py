"""``--pack auto``: cohorts sized from the devices (one per GPU or CPU slot) and from the
memory plan (members that fit beside one frozen body), as pure functions of the cluster."""

from __future__ import annotations

import pytest

from scale_fpt import planner
from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError
from scale_fpt.gpus import gpu_with_memory
from scale_fpt.packing import Devices, grid_cohorts, search_pack
from scale_fpt.profile import profile_of
from scale_fpt.study import narrow, parser
from scale_fpt.sweep import SweepConfig, cluster_devices

GIB = 2**30


def sizes(sweep: SweepConfig, arms: list[dict], devices: Devices) -> list[int]:
    """Members per cohort of the grid ``arms`` on ``devices``."""
    profiles = [profile_of(a) for a in arms]
    return [len(c) for c in grid_cohorts(profiles, sweep.pack, sweep.asha, devices, False)]


def arm(**values) -> dict:
    return {"task": "bit-xor", "model": "gpt2", "init": "pretrained", **values}


def test_members_that_fit_beside_one_body():
    # 0.9 x 10 GiB usable: 9 GiB - 1 GiB body = 8 GiB for 1-GiB members.
    # The one memory policy: allocated bytes x 1.15 (allocator slack) fill the device.
    assert planner.members_that_fit(GIB, GIB, 10 * GIB, gpu=False) == 7
    assert planner.members_that_fit(GIB, 3 * GIB, 10 * GIB, gpu=False) == 2
    assert planner.members_that_fit(9 * GIB, GIB, 10 * GIB, gpu=False) == 0  # not even one
    assert planner.members_that_fit(10 * GIB, GIB, 10 * GIB, gpu=False) == 0


def test_auto_cohort_size_spreads_over_slots_within_memory():
    assert planner.auto_cohort_size(64, slots=1, fits=1000) == 64  # one GPU: one cohort
    assert planner.auto_cohort_size(64, slots=4, fits=1000) == 16  # one cohort per GPU
    assert planner.auto_cohort_size(64, slots=1, fits=20) == 20  # memory caps K
    assert planner.auto_cohort_size(8, slots=2, fits=1000) == 4  # one cohort per core
    assert planner.auto_cohort_size(1, slots=2, fits=1000) == 1
    assert planner.auto_cohort_size(64, slots=1, fits=0) == 1  # too big: one trial alone


def test_cohort_memory_parts_add_up():
    members = [arm(task="cifar10", lr=10.0**-i) for i in range(1, 6)]
    body, per_member = profile_of(members[0]).cohort_memory_parts()
    assert profile_of(members[0]).cohort_bytes(len(members)) == body + 5 * per_member
    # gpt2's frozen attention + MLP matrices in fp32: ~85M parameters.
    assert 80e6 * 4 < body < 90e6 * 4
    bf16_body, _ = profile_of({**members[0], "precision": "bf16"}).cohort_memory_parts()
    assert bf16_body == body // 2


def test_auto_packs_a_gpu_grid_by_its_memory_plan():
    sweep = SweepConfig(name="s", pack="auto")
    grid = [arm(lr=10.0 ** (-i / 4), seed=s) for i in range(16) for s in range(4)]  # 64
    body, per_member = profile_of(grid[0]).cohort_memory_parts()
    roomy = Devices(gpus=1, slots=1, slot_bytes=80 * GIB)
    assert sizes(sweep, grid, roomy) == [64]
    two_gpus = Devices(gpus=2, slots=2, slot_bytes=80 * GIB)
    assert sizes(sweep, grid, two_gpus) == [32, 32]
    # A device that holds the body and 10 members: 64 trials in 7 cohorts of <= 10.
    tight = Devices(gpus=1, slots=1, slot_bytes=planner.device_bytes(int(body + 10.5 * per_member)))
    tight_sizes = sizes(sweep, grid, tight)
    assert max(tight_sizes) == 10 and sum(tight_sizes) == 64 and len(tight_sizes) == 7


def test_auto_packs_one_cohort_per_cpu_slot_and_leaves_what_does_not_pack():
    sweep = SweepConfig(name="s", pack="auto")
    cpu = Devices(gpus=0, slots=2, slot_bytes=12 * GIB)
    grid = [arm(model="gpt2-tiny", lr=10.0**-i) for i in range(1, 9)]
    full = [arm(model="gpt2-tiny", finetune="full", lr=1e-3)]
    assert sizes(sweep, grid + full, cpu) == [4, 4, 1]
    two = [profile_of(a) for a in grid[:2]]  # as many as slots: each runs alone
    assert grid_cohorts(two, "auto", False, cpu, False) == [[0], [1]]
    asha = SweepConfig(name="s", pack="auto", asha=True)  # ASHA stops whole Tune trials
    assert sizes(asha, grid, cpu) == [1] * len(grid)
    fixed = SweepConfig(name="s", pack=3)
    assert sizes(fixed, grid, cpu) == [2, 3, 3]


def test_auto_search_pack_covers_the_seeds_of_the_configurations_asked():
    sweep = SweepConfig(name="s", pack="auto", search_trials=8, seeds=(0, 1, 2))
    seed_arms = [arm(model="gpt2-tiny", seed=s) for s in (0, 1, 2)]
    cpu = Devices(gpus=0, slots=2, slot_bytes=12 * GIB)
    seed_profiles = [profile_of(a) for a in seed_arms]
    assert (
        search_pack(seed_profiles, sweep.pack, sweep.search_trials, cpu, False) == 12
    )  # 24 over 2 slots
    full = [profile_of({**a, "finetune": "full"}) for a in seed_arms]
    assert search_pack(full, sweep.pack, sweep.search_trials, cpu, False) == 1


def test_pack_accepts_auto_or_a_positive_count_from_flags_and_yaml(tmp_path):
    assert SweepConfig(name="s").pack == "auto"
    SweepConfig(name="s", pack=4).validate()
    for bad in (0, "sometimes", True):
        with pytest.raises(ConfigError, match="--pack: 'auto' or a positive number"):
            SweepConfig(name="s", pack=bad).validate()
    for text, expected in (("4", 4), ("auto", "auto")):
        path = tmp_path / f"p{text}.yaml"
        path.write_text(f"name: s\nbase: {{task: bit-xor}}\npack: {text}\n")
        assert SweepConfig.from_yaml(path).pack == expected

    presets = {"local": lambda: SweepConfig(name="s", pack=1)}
    p = parser("test", presets)
    assert narrow(presets["local"](), p.parse_args(["--pack", "auto"])).pack == "auto"
    assert narrow(presets["local"](), p.parse_args(["--pack", "16"])).pack == 16
    assert narrow(presets["local"](), p.parse_args([])).pack == 1  # the preset's
    with pytest.raises(ConfigError, match="--pack: 'auto' or a positive number"):
        narrow(presets["local"](), p.parse_args(["--pack", "0"])).validate()


def test_cluster_slots_are_gpus_or_cpu_groups():
    sweep = SweepConfig(name="s", cpus_per_trial=1)
    h100s = GPUOffer(gpu_with_memory(80), 4, "declared")
    gpu_node = {"CPU": 16.0, "GPU": 4.0, "memory": 100 * GIB}
    assert cluster_devices(sweep, gpu_node, h100s) == Devices(4, 4, 80 * GIB)
    # --gpus-per-trial 0 (no GPU offered): the GPU node's CPUs are the slots
    cpu_only = GPUOffer(None, 0, "--gpus-per-trial 0")
    assert cluster_devices(sweep, gpu_node, cpu_only) == Devices(0, 16, 100 * GIB // 16)
    cpu_node = {"CPU": 8.0, "memory": 16 * GIB}
    assert cluster_devices(sweep, cpu_node, h100s) == Devices(0, 8, 2 * GIB)
    two_per_trial = SweepConfig(name="s", cpus_per_trial=2, max_concurrent=3)
    assert cluster_devices(two_per_trial, cpu_node, cpu_only) == Devices(0, 3, 4 * GIB)
