"""A sweep's plan, made once on the driver after its arms are validated and handed along.

``sweep_placement`` says where the sweep's trials run (``Placement``: the GPUs planned for,
the cluster's slots, the GPU request, whether attention runs fused); ``plan_sweep`` then
parses and profiles each trial once, checks it against the GPUs, groups a grid into cohorts
(``--pack``: ``packing.grid_cohorts``) or sizes a search's (``packing.search_pack``), and
plans each cohort: its members, their profile, the step they take, the GPU share and memory
that step needs (each step kind by its own memory model, ``planner.step_plan``) and the Ray
bundles asked for (``TrialPlan.bundles``).

Everything downstream reads this one frozen value: ``--plan`` prints it, ``scale-fpt plan``
prints one trial's ``PlannedCohort``, the driver's Ray resources callback is a lookup in it,
the searcher, resume's count of unfinished trials and the confirmation sweep take it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scale_fpt import planner
from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.packing import Devices, grid_cohorts, search_pack, seed_groups
from scale_fpt.profile import TrialProfile, config_profile, profile_of
from scale_fpt.sweep.config import SweepConfig, arm_label
from scale_fpt.vocabulary import StepKind

# --------------------------------------------------------------------------- where


@dataclass(frozen=True)
class Placement:
    """Where a sweep's trials run, decided once (``sweep_placement``)."""

    offer: GPUOffer
    """The GPUs planned for (``cluster.planned_offer``)."""
    devices: Devices
    """The slots cohorts run in side by side (``--pack auto`` sizes cohorts for them)."""
    request: planner.GPURequest
    """``--gpus-per-trial``, parsed."""
    cpus_per_trial: int
    fused_attention: bool
    """Whether a GPU step's attention runs fused (no (B, H, T, T) tensors counted)."""

    @property
    def max_gpus(self) -> int:
        """The widest trial a node holds (8 where the cluster does not say)."""
        return self.offer.max_gpus_per_node or 8

    def trial_plan(self, profile: TrialProfile, members: int = 1) -> planner.TrialPlan:
        """The plan of a cohort of ``members`` trials of ``profile`` here, by its own step
        kind's memory model (``planner.step_plan``)."""
        return planner.step_plan(
            profile.kind,
            profile.shape,
            profile.config.train,
            self.request,
            self.offer.gpu,
            self.max_gpus,
            members,
            self.fused_attention,
        )


def sweep_placement(
    sweep: SweepConfig, offer: GPUOffer, resources: dict | None = None
) -> Placement:
    """Where ``sweep``'s trials run: on the GPUs of ``offer`` (``cluster.planned_offer``) in
    the connected Ray cluster of ``resources`` (``ray.cluster_resources()``), or, None,
    where ``--plan`` assumes without a cluster (``assumed_resources``)."""
    if resources is None:
        resources = assumed_resources(offer)
    devices = cluster_devices(sweep, resources, offer)
    fused = bool(devices.gpus) and planner.gpu_fuses_attention()
    return Placement(offer, devices, sweep.gpu_request, sweep.cpus_per_trial, fused)


def placement_on(
    sweep: SweepConfig, offer: GPUOffer, devices: Devices, fused_attention: bool = False
) -> Placement:
    """``sweep``'s trials on the GPUs of a known ``offer`` in the slots of ``devices`` (what
    ``scale-fpt plan`` plans one trial at)."""
    return Placement(offer, devices, sweep.gpu_request, sweep.cpus_per_trial, fused_attention)


def assumed_resources(offer: GPUOffer) -> dict:
    """The cluster ``--plan`` sizes cohorts for without one: one node of the offered GPU
    (its widest node, else 8 GPUs), or this machine's CPUs and memory."""
    if offer.gpu is not None:
        return {"GPU": offer.max_gpus_per_node or 8}
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"CPU": os.cpu_count() or 1, "memory": memory}


def cluster_devices(sweep: SweepConfig, resources: dict, offer: GPUOffer) -> Devices:
    """The slots of a cluster with Ray ``resources`` (``ray.cluster_resources()``) whose
    GPUs are ``offer.gpu`` (its memory from ``gpus.GPUS`` or ``gpu_memory_gb``)."""
    n_gpus = int(resources.get("GPU", 0)) if offer.gpu is not None else 0
    if n_gpus:
        slots, slot_bytes = n_gpus, offer.gpu.memory_bytes
    else:
        slots = max(1, int(resources.get("CPU", 1)) // sweep.cpus_per_trial)
        slot_bytes = int(resources.get("memory", 0)) // slots
    if sweep.max_concurrent:
        slots = min(slots, sweep.max_concurrent)
    return Devices(n_gpus, slots, slot_bytes)


# --------------------------------------------------------------------------- cohorts


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
    """Ray placement-group bundles (``TrialPlan.bundles``)."""

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


def plan_cohort(
    members: Sequence[dict], profile: TrialProfile | None, placement: Placement
) -> PlannedCohort:
    """How ``members`` (one Tune trial) of ``profile`` run at ``placement``: the profile's
    plan for its step kind and number (``planner.step_plan``) and its Ray bundles
    (``TrialPlan.bundles``). A config that does not validate (``profile`` None) plans CPU:
    the trial fails at once, recorded as failed."""
    if profile is None:
        plan, kind, workers = planner.CPU_PLAN, StepKind.ENGINE, 1
    else:
        plan = placement.trial_plan(profile, len(members))
        kind, workers = profile.kind, profile.config.train.workers
    bundles = tuple(plan.bundles(placement.cpus_per_trial, workers))
    return PlannedCohort(tuple(members), profile, kind, plan, bundles)


def member_key(members) -> tuple[str, ...]:
    return tuple(json.dumps(m, sort_keys=True, default=str) for m in members)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SweepPlan:
    """Every Tune trial of one experiment of a sweep, planned (module docstring)."""

    sweep: SweepConfig
    placement: Placement
    arms: tuple[dict, ...]
    """The experiment's trials, validated and set to run as planned (``planned_arms``)."""
    profiles: tuple[TrialProfile, ...]
    """``arms`` parsed and profiled, once."""
    cohorts: tuple[PlannedCohort, ...]
    """A grid's Tune trials; empty for a search, whose members are drawn as it runs."""
    searches: tuple[tuple[tuple[dict, ...], int], ...] = ()
    """A search's: each searched arm's seeds (one search each) with the members per cohort
    its drawn configurations run in (``search_pack``)."""
    varying_fields: tuple[str, ...] = ()
    """The fields that tell the experiment's trials apart (``SweepConfig.varying_fields``):
    what names a tracker's runs."""
    choice_fields: tuple[str, ...] = ()
    """What the sweep chooses within an arm (``SweepConfig.choice_fields``): what its
    confirmation trains again on fresh seeds (``sweep.confirm``)."""
    _found: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def configs(self) -> tuple[TrialConfig, ...]:
        return tuple(profile.config for profile in self.profiles)

    @property
    def offer(self) -> GPUOffer:
        return self.placement.offer

    @property
    def devices(self) -> Devices:
        return self.placement.devices

    @property
    def fused_attention(self) -> bool:
        return self.placement.fused_attention

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
            try:
                profile = profile_of(members[0])
            except ConfigError:
                profile = None
            self._found[key] = plan_cohort(members, profile, self.placement)
        return self._found[key]


def plan_sweep(
    sweep: SweepConfig, placement: Placement, trials: list[dict] | None = None
) -> SweepPlan:
    """The plan of an experiment of ``trials`` (None: ``sweep.trials()``) at ``placement``:
    each trial parsed and profiled once, checked against the GPUs and set to run as planned
    (``planned_arms``: ConfigError naming every trial no GPU holds), then a grid's cohorts
    (``sweep.pack``) each planned; a search's cohort sizes, its cohorts planned as it draws
    them."""
    varying, choice = sweep.varying_fields(), sweep.choice_fields()
    if trials is None:
        trials = sweep.trials()
    profiles = [profile_of(arm) for arm in trials]
    arms, profiles = planned_arms(trials, profiles, placement)
    devices, fused = placement.devices, placement.fused_attention
    if sweep.search:
        groups = seed_groups(arms)
        searches = tuple(
            (
                tuple(arms[i] for i in group),
                search_pack(
                    [profiles[i] for i in group], sweep.pack, sweep.search_trials, devices, fused
                ),
            )
            for group in groups
        )
        return SweepPlan(
            sweep, placement, tuple(arms), tuple(profiles), (), searches, varying, choice
        )
    groups = grid_cohorts(profiles, sweep.pack, sweep.asha, devices, fused)
    cohorts = tuple(
        plan_cohort([arms[i] for i in group], profiles[group[0]], placement) for group in groups
    )
    return SweepPlan(sweep, placement, tuple(arms), tuple(profiles), cohorts, (), varying, choice)


def planned_arms(
    trials: list[dict], profiles: list[TrialProfile], placement: Placement
) -> tuple[list[dict], list[TrialProfile]]:
    """(The trials, their profiles) as planned: each trial (of its ``profiles``) that the
    planner spreads over several GPUs set to run that way (its ZeRO stage and ``workers``);
    others stay as declared, so their trial ids do not depend on the cluster. ConfigError
    naming every trial that no GPU of the offer holds, or no node
    (``planner.plan_problem``)."""
    arms, planned, problems = [], [], []
    for arm, profile in zip(trials, profiles, strict=True):
        config = profile.config
        plan = placement.trial_plan(profile)
        if problem := planner.plan_problem(plan, placement.offer):
            problems.append(f"{arm_label(arm)}: {problem}")
        if plan.gpus > 1:  # run as planned: its ZeRO stage over its workers
            arm = {**arm, "zero_stage": plan.zero_stage, "workers": plan.workers}
            train = replace(config.train, zero_stage=plan.zero_stage, workers=plan.workers)
            profile = config_profile(replace(config, train=train))
        arms.append(arm)
        planned.append(profile)
    if problems:
        raise ConfigError(problems)
    return arms, planned


def search_cohorts(plan: SweepPlan) -> list[PlannedCohort]:
    """Per searched arm, the cohort its drawn configurations will run in: as many members as
    its search packs, each of the arm's shape (what a cohort's memory depends on)."""
    return [plan.cohort([arm] * pack) for group, pack in plan.searches for arm in group]


def study_gpu_hours(plan: SweepPlan) -> dict[str, float]:
    """GPU-hours of the plan's trials per model (and ``total``): each trial's plan alone
    (``planner.step_plan``) held for its ``max_steps`` at ``planner.step_seconds``, for
    every configuration a search tries."""
    out: dict[str, float] = {}
    per_arm = plan.sweep.search_trials if plan.sweep.search else 1
    for profile in plan.profiles:
        step = plan.placement.trial_plan(profile)
        if not step.gpus or step.gpu is None:
            continue
        train = profile.config.train
        seconds = planner.step_seconds(profile.shape, train.batch_size, step)
        hours = per_arm * planner.gpu_hours(step, train.max_steps, seconds)
        out[profile.config.model.model] = out.get(profile.config.model.model, 0.0) + hours
    out["total"] = sum(out.values())
    return out
