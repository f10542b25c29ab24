"""A sweep's plan, made once on the driver after its arms are validated and handed along:
which members share each Tune trial (a cohort), the step they take, the GPU share and memory
that step needs (each step kind by its own memory model), and the Ray bundles asked for.

``--plan`` prints this value, ``scale-fpt plan`` prints one trial's ``PlannedCohort``, and
the driver's Ray resources callback is a lookup in it: what is printed is what runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from scale_fpt import planner
from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError, TrialConfig, parse_trial
from scale_fpt.profile import TrialProfile, profile_of
from scale_fpt.sweep.config import SweepConfig
from scale_fpt.sweep.placement import (
    Devices,
    cluster_devices,
    fuses_attention,
    grid_cohorts,
    plan_bundles,
    planned_arms,
    search_pack,
)
from scale_fpt.vocabulary import StepKind


@dataclass(frozen=True)
class PlannedCohort:
    """One Tune trial of a sweep: its members and how they run."""

    members: tuple[dict, ...]
    """The members' flat configs, as the Tune trial receives them."""
    profile: TrialProfile | None
    """The members' shared profile (None: the config does not validate; the trial fails at
    once and is recorded as failed)."""
    kind: StepKind
    """The step the members take: ``cohort`` (K >= 1 over one shared frozen body) or
    ``engine`` (one DeepSpeed engine, a trial alone)."""
    plan: planner.TrialPlan
    """GPUs (or a share of one), ZeRO stage, workers, and the memory the step needs there:
    the engine's memory model for ``engine``, the cohort's for ``cohort``."""
    bundles: tuple[dict, ...]
    """Ray placement-group bundles (``placement.plan_bundles``)."""

    @property
    def device_bytes(self) -> int:
        """Memory the step needs of each GPU, allocator slack and CUDA context included (0:
        on CPUs, or a share declared without a plan)."""
        plan = self.plan
        return plan.memory.device if plan.gpus and plan.memory else 0

    @property
    def strategy(self) -> str:
        """A trial's GPUs are one placement group on one node."""
        return "STRICT_PACK" if len(self.bundles) > 1 else "PACK"

    def resources(self):
        """Ray Tune's resource request of this trial."""
        from ray import tune  # Ray: only where a sweep runs

        return tune.PlacementGroupFactory(list(self.bundles), strategy=self.strategy)

    def describe(self) -> str:
        """'K members, cohort step: H100, 1/4 GPU; 12.3 GiB' (the step's own memory)."""
        members = f"{len(self.members)} member{'s' if len(self.members) > 1 else ''}"
        plan = self.plan
        if not plan.gpus:
            return f"{members}, {self.kind} step: CPU"
        where = f"{plan.gpus} x {plan.gpu.name}" if plan.gpus > 1 else plan.gpu.name
        share = f", {plan.trials_per_gpu} per GPU" if plan.trials_per_gpu > 1 else ""
        zero = f", ZeRO {plan.zero_stage}" if self.kind == StepKind.ENGINE else ""
        need = (
            f"{self.device_bytes / 2**30:.1f} GiB per GPU" if self.device_bytes else "as declared"
        )
        fits = "" if plan.fits else " (DOES NOT FIT)"
        return f"{members}, {self.kind} step: {where}{zero}{share}; {need}{fits}"


def member_key(members) -> tuple[str, ...]:
    return tuple(json.dumps(m, sort_keys=True, default=str) for m in members)


@dataclass(frozen=True)
class SweepPlan:
    """Every Tune trial of one experiment of a sweep, planned (module docstring)."""

    sweep: SweepConfig
    arms: tuple[dict, ...]
    """The experiment's trials, validated and set to run as planned
    (``placement.planned_arms``)."""
    configs: tuple[TrialConfig, ...]
    """``arms`` parsed, once."""
    offer: GPUOffer
    """The GPUs planned for (``placement.sweep_gpus``)."""
    devices: Devices
    """Where cohorts run side by side (``--pack auto`` sizes cohorts for them)."""
    fused_attention: bool
    """Whether a GPU step's attention runs fused (no (B, H, T, T) tensors counted)."""
    cohorts: tuple[PlannedCohort, ...]
    """A grid's Tune trials; empty for a search, whose members are drawn as it runs."""
    searches: tuple[tuple[tuple[dict, ...], int], ...] = ()
    """A search's: each searched arm's seeds (one search each) with the members per cohort
    its drawn configurations run in (``placement.search_pack``)."""
    _found: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def planned_steps(self) -> int:
        """Member trial-steps the experiment trains in all: each arm's ``max_steps``, times
        the configurations a search tries per arm (for the progress ETA)."""
        steps = sum(config.train.max_steps for config in self.configs)
        return steps * (self.sweep.search_trials if self.sweep.search else 1)

    def cohort(self, members: list[dict]) -> PlannedCohort:
        """The planned cohort of these members: a lookup for a grid's; a search's (drawn as
        it runs) planned by the same rule on first sight."""
        key = member_key(members)
        if not self._found:
            self._found.update((member_key(c.members), c) for c in self.cohorts)
        if key not in self._found:
            self._found[key] = plan_cohort(members, self.sweep, self.offer, self.fused_attention)
        return self._found[key]


def plan_cohort(
    members: list[dict], sweep: SweepConfig, offer: GPUOffer, fused_attention: bool
) -> PlannedCohort:
    """How ``members`` (one Tune trial) run under ``sweep`` on ``offer``: their profile's
    plan for their step kind and number (``TrialProfile.plan``) and its Ray bundles. A
    config that does not validate plans CPU: the trial fails at once, recorded as failed."""
    try:
        profile = profile_of(members[0])
    except ConfigError:
        plan = planner.CPU_PLAN
        bundles = tuple(plan_bundles(plan, sweep.cpus_per_trial))
        return PlannedCohort(tuple(members), None, StepKind.ENGINE, plan, bundles)
    max_gpus = offer.max_gpus_per_node or 8
    plan = profile.plan(sweep.gpus_per_trial, offer.gpu, max_gpus, len(members), fused_attention)
    workers = profile.config.train.workers
    bundles = tuple(plan_bundles(plan, sweep.cpus_per_trial, workers))
    return PlannedCohort(tuple(members), profile, profile.kind, plan, bundles)


def plan_sweep(
    sweep: SweepConfig,
    trials: list[dict],
    offer: GPUOffer,
    devices: Devices,
    fused_attention: bool | None = None,
) -> SweepPlan:
    """The plan of an experiment of ``trials`` (``SweepConfig.trials``): each checked
    against the offer and set to run as planned (``placement.planned_arms``: ConfigError
    naming every trial no GPU holds), then a grid's cohorts (``sweep.pack``) each planned; a
    search's cohort sizes, its cohorts planned as it draws them.
    ``fused_attention`` None: as a GPU of this machine's software would run it."""
    if fused_attention is None:
        fused_attention = fuses_attention(devices)
    arms = planned_arms(trials, sweep, offer)
    configs = tuple(parse_trial(arm) for arm in arms)
    if sweep.search:
        from scale_fpt.search import seed_groups  # Ray Tune's searcher: only for a search

        searches = tuple(
            (tuple(group), search_pack(sweep, group, devices)) for group in seed_groups(arms)
        )
        return SweepPlan(sweep, tuple(arms), configs, offer, devices, fused_attention, (), searches)
    groups = grid_cohorts(sweep, arms, devices, fused_attention)
    cohorts = tuple(plan_cohort(g, sweep, offer, fused_attention) for g in groups)
    return SweepPlan(sweep, tuple(arms), configs, offer, devices, fused_attention, cohorts)


def search_cohorts(plan: SweepPlan) -> list[PlannedCohort]:
    """Per searched arm, the cohort its drawn configurations will run in: as many members as
    its search packs, each of the arm's shape (what a cohort's memory depends on)."""
    return [plan.cohort([arm] * pack) for group, pack in plan.searches for arm in group]


def assumed_devices(sweep: SweepConfig, offer: GPUOffer) -> Devices:
    """The slots ``--plan`` sizes cohorts for without a cluster: one node of the offered
    GPU (its widest node, else 8 GPUs), or this machine's CPUs and memory."""
    if offer.gpu is not None:
        resources = {"GPU": offer.max_gpus_per_node or 8}
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        resources = {"CPU": os.cpu_count() or 1, "memory": memory}
    return cluster_devices(sweep, resources, offer)
