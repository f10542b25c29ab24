"""Trial packing: which trials may share one cohort (``steps.cohort.CohortStep``: K trials
over one shared frozen backbone in one process), how to group a sweep's grid into cohorts
(``grid_cohorts``: ``--pack``, ``auto`` sized for the cluster's slots, ``Devices``) and how
many members a search's cohorts take (``search_pack``, one search per arm's seeds:
``seed_groups``). Whether
one trial can be packed at all, and what a cohort of its kind needs in memory, are parts of
its profile (``profile.TrialProfile``).

A frozen body of the gpt2, gpt-neox or llama family (FPT: ``input+output+ln+pos`` trained,
attention and feed-forward frozen) is the same for every trial of a grid that differs only in learning rate, seed (pretrained
weights), the trained subset of input/output/ln/pos, clipping, threshold or patience.
Running those trials one per process repeats the frozen weights K times in memory and runs
K small matrix products where one K-times-taller product would do.

The packed path is plain torch, not a DeepSpeed engine: the trained tensors are a few MB,
so ZeRO has nothing to shard, and DeepSpeed's clipping is global over the engine's
parameters, which would couple the members; per-member clipping, learning rates and
divergence need an optimiser that knows the member axis (``steps.adam.PackedAdam``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scale_fpt import planner
from scale_fpt.config import TrialConfig
from scale_fpt.profile import TrialProfile, config_profile, profile_of

MEMBER_FIELDS = ("lr", "seed", "finetune", "grad_clip", "accuracy_threshold", "patience")
"""Config fields that may differ inside a cohort (``seed`` only when the backbone does not
depend on it, i.e. ``init=pretrained``). Every other field (task and its data, model, init,
weights, dropout, precision, batch size, steps, evaluation schedule, device) is shared."""


@dataclass(frozen=True)
class Devices:
    """Where a sweep's cohorts run side by side (read from the Ray cluster): the slots
    ``--pack auto`` sizes cohorts for."""

    gpus: int
    """GPUs in the cluster (0: CPUs only)."""
    slots: int
    """Cohorts that run at once: one per GPU, else one per ``cpus_per_trial`` CPUs (at most
    ``max_concurrent``)."""
    slot_bytes: int
    """Memory of one slot: the offered GPU's, else the cluster's memory per slot."""


# --------------------------------------------------------------------------- grouping


def cohort_problems(configs: list[TrialConfig]) -> list[str]:
    """Why ``configs`` cannot train as one cohort (empty: they can)."""
    problems = [p for c in configs if (p := config_profile(c).pack_problem)]
    if len({cohort_key(c) for c in configs}) > 1:
        problems.append(
            "cohort members differ in fields they must share (only "
            f"{', '.join(MEMBER_FIELDS)} may differ; seed only with --init pretrained)"
        )
    return list(dict.fromkeys(problems))


def cohort_key(config: TrialConfig) -> tuple:
    """Members with equal keys can share one frozen backbone and one step loop."""
    varying = set(MEMBER_FIELDS)
    if config.model.init != "pretrained":  # random/stats backbones are drawn from the seed
        varying.discard("seed")
    return tuple(sorted((k, v) for k, v in config.to_flat().items() if k not in varying))


def cohorts(arms: list[dict], k: int) -> list[list[dict]]:
    """Flat trial configs grouped into cohorts of at most ``k`` (``cohort_groups``)."""
    groups = cohort_groups([profile_of(arm) for arm in arms], k)
    return [[arms[i] for i in group] for group in groups]


def cohort_groups(
    profiles: Sequence[TrialProfile], k: int | Callable[[list[TrialProfile]], int]
) -> list[list[int]]:
    """Trials (by their profiles) grouped into cohorts of at most ``k`` compatible members,
    as indices (``k`` may be a function of each compatible group's profiles: ``--pack
    auto`` sizes cohorts per group).

    Compatible: the same task config, model, init, weights, dropout, precision, batch size,
    max/eval steps, evaluation batch size and device, a frozen body (finetune within
    input/output/ln/pos), and the same backbone weights (any seeds when pretrained, the same
    seed for random or stats inits). Members may differ in lr, seed, finetune subset,
    grad_clip and accuracy_threshold. A group larger than ``k`` is split into
    ceil(n / k) cohorts of near-equal size. Trials that cannot be packed come back alone
    (``[i]``), in order. Every trial appears in exactly one cohort.
    """
    if not callable(k) and k < 1:
        raise ValueError(f"cohort size must be >= 1, got {k}")
    size = k if callable(k) else lambda group: k
    order: list[tuple] = []  # ("one", index) or ("group", key), in order of first appearance
    groups: dict[tuple, list[int]] = {}
    for i, profile in enumerate(profiles):
        if k == 1 or profile.pack_problem:
            order.append(("one", i))
            continue
        key = cohort_key(profile.config)
        if key not in groups:
            groups[key] = []
            order.append(("group", key))
        groups[key].append(i)
    out: list[list[int]] = []
    for kind, item in order:
        if kind == "one":
            out.append([item])
            continue
        members = groups[item]
        group_k = size([profiles[i] for i in members])
        if group_k < 1:
            raise ValueError(f"cohort size must be >= 1, got {group_k}")
        n_cohorts = math.ceil(len(members) / group_k)
        out.extend(
            members[j * len(members) // n_cohorts : (j + 1) * len(members) // n_cohorts]
            for j in range(n_cohorts)
        )
    return out


# --------------------------------------------------------------------------- a sweep's cohorts


def grid_cohorts(
    profiles: Sequence[TrialProfile],
    pack: int | str,
    asha: bool,
    devices: Devices,
    fused_attention: bool,
) -> list[list[int]]:
    """A grid's trials (by their ``profiles``) grouped into the cohorts ``pack`` asks for
    (``SweepConfig.pack``), as indices: ``auto`` sizes each compatible group for the slots
    of ``devices`` (``auto_pack``), and packs nothing under ``asha`` (it stops whole Tune
    trials)."""
    if pack != "auto":
        return cohort_groups(profiles, pack)
    if asha:
        return [[i] for i in range(len(profiles))]
    return cohort_groups(
        profiles, lambda group: auto_pack(group[0], len(group), devices, fused_attention)
    )


def search_pack(
    seed_profiles: Sequence[TrialProfile],
    pack: int | str,
    search_trials: int,
    devices: Devices,
    fused_attention: bool,
) -> int:
    """Members per cohort of a search of one arm's seeds (``pack``, or ``auto``'s choice for
    every seed of each of the ``search_trials`` configurations the run asks for)."""
    if pack != "auto":
        return pack
    if seed_profiles[0].pack_problem:
        return 1
    n_members = len(seed_profiles) * search_trials
    return auto_pack(seed_profiles[0], n_members, devices, fused_attention)


def auto_pack(
    profile: TrialProfile, n_members: int, devices: Devices, fused_attention: bool
) -> int:
    """``--pack auto``'s cohort size for ``n_members`` trials compatible with ``profile``
    in the slots of ``devices`` (``planner.cohort_size``: the cohort step's memory model)."""
    train = profile.config.train
    return planner.cohort_size(
        profile.shape,
        train.precision,
        train.batch_size,
        n_members,
        devices.slots,
        devices.slot_bytes,
        gpu=bool(devices.gpus),
        fused_attention=fused_attention,
    )


def seed_groups(arms: Sequence[dict]) -> list[list[int]]:
    """Trials grouped by everything but their seed (``SweepConfig.trials`` order), as
    indices: one search per group, whose configurations are each trained for every seed of
    the group."""
    groups: dict[tuple, list[int]] = {}
    for i, arm in enumerate(arms):
        key = tuple(sorted((k, repr(v)) for k, v in arm.items() if k != "seed"))
        groups.setdefault(key, []).append(i)
    return list(groups.values())
