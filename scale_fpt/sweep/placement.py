"""Where a sweep's trials run: the GPUs it is planned for, the slots of a cluster, the
cohorts ``--pack`` makes of a grid or a search, and the Ray bundles of a plan (what each
Tune trial asks for is planned once: ``sweep.plan``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scale_fpt import gpus, planner, scaling
from scale_fpt.cluster import (
    GPUOffer,
    autoscaler_offer,
    config_file_offer,
    gpu_offer,
    running_nodes_offer,
)
from scale_fpt.config import ConfigError
from scale_fpt.packing import cohorts
from scale_fpt.profile import pack_problem, profile_of
from scale_fpt.sweep.config import SweepConfig, arm_label


def sweep_gpus(sweep: SweepConfig) -> GPUOffer:
    """What GPUs the sweep's trials are planned for: a declared ``gpu`` / ``gpu_memory_gb``
    is taken as said (with the widest node of ``cluster_config``, if one is found); else what
    the connected cluster has or can launch (``cluster.gpu_offer``); ``gpus_per_trial`` 0
    plans none."""
    if planner.parse_gpus_per_trial(sweep.gpus_per_trial)[0] == "cpu":
        return GPUOffer(None, 0, "--gpus-per-trial 0")
    if not (sweep.gpu or sweep.gpu_memory_gb):
        return gpu_offer(sweep.cluster_config)
    if sweep.gpu_memory_gb:
        gpu = gpus.gpu_with_memory(sweep.gpu_memory_gb, sweep.gpu)
    else:
        gpu = gpus.gpu_named(sweep.gpu)
    found = config_file_offer(sweep.cluster_config)
    return GPUOffer(gpu, found.max_gpus_per_node if found else 0, "declared")


def trial_plan(flat: dict, sweep: SweepConfig, offer: GPUOffer) -> planner.TrialPlan:
    """The planner's decision for one trial of the sweep (``TrialProfile.plan``). A config
    that cannot be built plans CPU: the trial fails at once and is recorded as failed."""
    try:
        return profile_of(flat).plan(sweep.gpus_per_trial, offer.gpu, offer.max_gpus_per_node or 8)
    except ConfigError:
        return planner.CPU_PLAN


def planned_arms(arms: list[dict], sweep: SweepConfig, offer: GPUOffer) -> list[dict]:
    """The arms, each trial that the planner spreads over several GPUs set to run that way
    (its ZeRO stage and ``workers``: ``planner.with_plan``); others stay as declared, so
    their trial ids do not depend on the cluster. ConfigError naming every trial that fits
    no GPU of the offer."""
    out, problems = [], []
    for arm in arms:
        plan = trial_plan(arm, sweep, offer)
        if not plan.fits:
            problems.append(
                f"{arm_label(arm)}: does not fit: {plan.describe()}; use a larger --gpu, a "
                "smaller batch or fewer trained groups"
            )
        elif problem := unplaceable(plan, offer):
            problems.append(f"{arm_label(arm)}: {problem}")
        out.append(planner.with_plan(arm, plan) if plan.gpus > 1 else arm)
    if problems:
        raise ConfigError(problems)
    return out


def unplaceable(plan: planner.TrialPlan, offer: GPUOffer) -> str | None:
    """Why no node can ever hold the trial of ``plan`` (None: one can, or the widest node is
    unknown). A trial's GPUs are one placement group packed on one node (STRICT_PACK), which
    Ray would wait for forever."""
    if not plan.gpus:
        return None
    if offer.gpu is None or offer.source == "none":
        return (
            f"asks for {plan.gpu_share:g} GPU(s), but the cluster has and can launch no GPU; "
            "use --gpus-per-trial 0 or auto, or a cluster with GPU nodes"
        )
    widest = offer.max_gpus_per_node
    if widest and plan.gpus > widest:
        return (
            f"asks for {plan.gpus} GPUs on one node, but the widest node has {widest} "
            f"({offer.source}); use --gpus-per-trial {widest} or less, fewer workers, or "
            "larger nodes"
        )
    return None


def with_node_width(offer: GPUOffer) -> GPUOffer:
    """A declared GPU's offer with the widest node of the connected cluster (its
    autoscaler's node groups, else its running nodes) where no cluster config said it, so
    that ``unplaceable`` can refuse what no node holds; unchanged when nothing says."""
    if offer.gpu is None or offer.max_gpus_per_node:
        return offer
    found = autoscaler_offer() or running_nodes_offer()
    if found is None:
        return offer
    return replace(offer, max_gpus_per_node=found.max_gpus_per_node, source=found.source)


def plan_bundles(plan: planner.TrialPlan, cpus: int, workers: int = 1) -> list[dict]:
    """Ray placement-group bundles of a planned trial: one bundle on CPU or on (a share of)
    one GPU; one bundle per GPU for a data-parallel trial (packed on one node, the
    multi-GPU node type; the trial's process runs in the first); one CPU bundle per worker
    for a trial of ``workers`` processes on CPUs."""
    if not plan.gpus:
        return [{"CPU": cpus} for _ in range(workers)]
    if plan.gpus == 1:
        return [{"CPU": cpus, "GPU": plan.gpu_share}]
    return [{"CPU": cpus, "GPU": 1} for _ in range(plan.gpus)]


@dataclass(frozen=True)
class Devices:
    """Where a sweep's cohorts run side by side (read from the Ray cluster)."""

    gpus: int
    """GPUs in the cluster (0: CPUs only)."""
    slots: int
    """Cohorts that run at once: one per GPU, else one per ``cpus_per_trial`` CPUs (at most
    ``max_concurrent``)."""
    slot_bytes: int
    """Memory of one slot: the offered GPU's, else the cluster's memory per slot."""


def cluster_devices(sweep: SweepConfig, resources: dict, offer: GPUOffer) -> Devices:
    """The slots of a cluster with Ray ``resources`` (``ray.cluster_resources()``) whose
    GPUs are ``offer.gpu`` (its memory from ``gpus.GPUS`` or ``gpu_memory_gb``)."""
    gpus = int(resources.get("GPU", 0)) if offer.gpu is not None else 0
    if gpus:
        slots, slot_bytes = gpus, offer.gpu.memory_bytes
    else:
        slots = max(1, int(resources.get("CPU", 1)) // sweep.cpus_per_trial)
        slot_bytes = int(resources.get("memory", 0)) // slots
    if sweep.max_concurrent:
        slots = min(slots, sweep.max_concurrent)
    return Devices(gpus, slots, slot_bytes)


def fuses_attention(devices: Devices) -> bool:
    """Whether the cohorts of ``devices`` run attention fused (GPUs with the Triton kernel:
    no (B, H, T, T) tensors in their memory)."""
    return bool(devices.gpus) and planner.gpu_fuses_attention()


def auto_pack(member: dict, n_members: int, devices: Devices, fused_attention: bool) -> int:
    """``--pack auto``'s cohort size for ``n_members`` trials compatible with ``member``:
    spread over the slots, as many per cohort as fit in a slot's memory (the cohort step's
    memory model, ``TrialProfile.cohort_memory_parts``, under the planner's one memory
    policy, ``planner.device_bytes``)."""
    parts = profile_of(member).cohort_memory_parts(fused_attention)
    fits = planner.members_that_fit(*parts, devices.slot_bytes, gpu=bool(devices.gpus))
    return scaling.auto_cohort_size(n_members, devices.slots, fits)


def grid_cohorts(
    sweep: SweepConfig, arms: list[dict], devices: Devices, fused_attention: bool | None = None
) -> list[list[dict]]:
    """The grid's arms grouped into the cohorts ``sweep.pack`` asks for (``fused_attention``
    None: ``fuses_attention(devices)``)."""
    if sweep.pack != "auto":
        return cohorts(arms, sweep.pack)
    if sweep.asha:
        return [[arm] for arm in arms]
    fused = fuses_attention(devices) if fused_attention is None else fused_attention
    return cohorts(arms, lambda group: auto_pack(group[0], len(group), devices, fused))


def search_pack(sweep: SweepConfig, seed_arms: list[dict], devices: Devices) -> int:
    """Members per cohort of a search (``sweep.pack``, or ``auto``'s choice for every seed
    of every configuration the run asks for)."""
    if sweep.pack != "auto":
        return sweep.pack
    if pack_problem(seed_arms[0]):
        return 1
    n_members = len(seed_arms) * sweep.search_trials
    return auto_pack(seed_arms[0], n_members, devices, fuses_attention(devices))


def study_gpu_hours(
    trials: list[dict], gpus_per_trial: str, gpu: gpus.GPU, max_gpus: int = 8
) -> dict[str, float]:
    """GPU-hours of a study's trials on ``gpu`` per model (and ``total``): each trial's plan
    (``TrialProfile.plan``) held for its ``max_steps`` at ``planner.step_seconds``."""
    out: dict[str, float] = {}
    for flat in trials:
        profile = profile_of(flat)
        config = profile.config
        plan = profile.plan(gpus_per_trial, gpu, max_gpus)
        if not plan.gpus or plan.gpu is None:
            continue
        seconds = planner.step_seconds(profile.shape, config.train.batch_size, plan)
        hours = planner.gpu_hours(plan, config.train.max_steps, seconds)
        out[config.model.model] = out.get(config.model.model, 0.0) + hours
    out["total"] = sum(out.values())
    return out
