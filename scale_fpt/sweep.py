"""Sweeps: a grid (or an Optuna search per arm) over trial configs, run by Ray Tune.

    SweepConfig --arms()--> flat trial configs --packing.cohorts(pack)--> member lists
        --Tuner--> tune_trial (one ``TrialRun`` per list: one trial, or a packed cohort)
        each evaluation: ray.tune.report(metrics, checkpoint)  ->  ResultsCallback (driver)
        -> Parquet rows (results.ResultsWriter: keyed, atomic, de-duplicated)

Resources per trial are derived from the trial's model and precision (``trial_resources``).
A retried or moved trial resumes from its last Tune checkpoint; ``resume=True`` restores an
interrupted sweep with ``Tuner.restore`` so finished trials are not run again.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from scale_fpt import planner, scaling
from scale_fpt.cluster import GPUOffer, config_file_offer, gpu_offer
from scale_fpt.config import FIELD_TYPES, ConfigError, TrialConfig, flag
from scale_fpt.distributed import rank_workers, train_rank
from scale_fpt.loop import evaluation_steps
from scale_fpt.packing import cohorts
from scale_fpt.prebuild import prebuild_ops
from scale_fpt.recovery import restore_missing_rows
from scale_fpt.results import ResultsError, ResultsWriter
from scale_fpt.storage import check_sweep_storage
from scale_fpt.trial import (
    TrialRun,
    config_trial_id,
    error_text,
    git_sha,
    provenance,
    trial_id_for,
)

SEARCH_KINDS = ("loguniform", "uniform", "int", "choice")


@dataclass(frozen=True)
class SweepConfig:
    """A study: which trials to run, how to search, where results go, how to schedule."""

    name: str
    """Sweep name: the results subdirectory and the Ray experiment name."""
    base: dict = field(default_factory=dict)
    """Flat trial-config values shared by every trial (``TrialConfig`` field names)."""
    grid: dict = field(default_factory=dict)
    """Flat field -> list of values; every combination is one arm (x ``seeds``)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds per arm (``seed`` in the trial config)."""
    overrides: tuple = ()
    """``((match, values), ...)``: arms whose fields equal ``match`` also get ``values``
    (e.g. ``(({"task": "homology"}, {"lr": 1e-4}),)``: the paper's per-task settings)."""
    search: dict = field(default_factory=dict)
    """Optuna search space per arm, field -> (kind, ...): ("loguniform", lo, hi),
    ("uniform", lo, hi), ("int", lo, hi) or ("choice", [values]). Empty: a plain grid."""
    search_trials: int = 8
    """Optuna trials per arm (and per seed)."""
    metric: str = "best_val_accuracy"
    """What searches and ASHA maximise: the best validation accuracy so far (never a test
    metric; test is measured at the selected step and reported)."""
    results_dir: str = "results"
    """Parquet results go to ``results_dir/name``."""
    storage_path: str = ""
    """Ray Tune's experiment storage (checkpoints, state); shared storage on a cluster.
    Empty: ``results_dir/_ray``."""
    optuna_storage: str = ""
    """Optuna storage URL (an RDB URL on a cluster). Empty: an SQLite file under the sweep's
    results directory."""
    max_concurrent: int = 0
    """At most this many trials at once (0: as many as resources allow)."""
    max_failures: int = 2
    """Retries of a crashed trial, each from its last checkpoint."""
    asha: bool = False
    """Stop weak trials early with ASHA (on ``metric``, in evaluation steps)."""
    asha_grace_evals: int = 2
    """ASHA: evaluations every trial gets before it can be stopped."""
    cpus_per_trial: int = 1
    """CPU cores per trial."""
    gpus_per_trial: str = "auto"
    """GPUs each trial asks Ray for, whether or not a GPU node is up yet (the autoscaler
    launches GPU nodes for pending trials): ``auto`` (the memory planner sizes each trial on
    ``gpu``: a share of one GPU, one GPU, or N GPUs at ZeRO 2/3; CPU when the cluster has and
    can launch no GPU), ``0`` (CPU only), ``N`` (N GPUs) or a fraction (``0.25``: four
    trials per GPU)."""
    gpu: str = ""
    """The GPU trials run on (``scale_fpt.planner.GPUS``: h100-80gb, a100-80gb, a100-40gb,
    a10g-24gb, l4-24gb). Empty: the GPU named by the cluster's GPU node types
    (``cluster_config``), else by the running nodes' Ray accelerator type."""
    gpu_memory_gb: float = 0.0
    """Memory of one GPU in GiB, for a GPU the table lacks (0: the memory of ``gpu``)."""
    cluster_config: str = ""
    """The cluster launcher YAML whose node types the autoscaler can launch (what ``auto``
    plans for). Empty: ``~/ray_bootstrap_config.yaml`` when it exists (``ray up`` leaves it on
    the head, where ``ray submit`` runs the sweep)."""
    reuse_actors: bool = True
    """Reuse trial processes (saves the import and start-up of torch and DeepSpeed)."""
    pack: int | str = "auto"
    """Trials per cohort: up to this many compatible grid trials (same frozen backbone,
    differing in lr, seed or trained subset of input/output/ln/pos) train together in one
    process over one copy of the backbone (``scale_fpt.packing``); each keeps its own rows.
    1: one trial per process. ``auto``: each group of compatible trials is spread over the
    cluster's slots (one cohort per GPU, or per ``cpus_per_trial`` CPUs), at most as many
    members per cohort as fit in a slot's memory beside one frozen body
    (``scaling.auto_cohort_size``); nothing is packed under ASHA (it stops whole Tune
    trials). A search packs too: where an arm packs, it asks for as many configurations at
    once as fill a cohort beside the seeds (``search.configs_per_ask``)."""

    def problems(self) -> list[str]:
        out = []
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or ""):
            out.append(f"sweep name {self.name!r}: use letters, digits, '-', '_', '.'")
        known = FIELD_TYPES
        override_keys = [k for match, values in self.overrides for k in (*match, *values)]
        for key in (*self.base, *self.grid, *self.search, *override_keys):
            if key not in known:
                out.append(
                    f"sweep field {key!r} is not a trial config field ({', '.join(sorted(known))})"
                )
        for key, values in self.grid.items():
            if not isinstance(values, list | tuple) or not values:
                out.append(f"grid {key!r}: needs a non-empty list of values")
        for key, spec in self.search.items():
            if not spec or spec[0] not in SEARCH_KINDS:
                out.append(f"search {key!r}: kind must be one of {', '.join(SEARCH_KINDS)}")
        out += self.seed_problems()
        if self.asha and self.search:
            out.append(
                "asha with search: Ray records early-stopped trials in Optuna as complete with "
                "their truncated value, which misleads the sampler; use one or the other"
            )
        for name in ("search_trials", "asha_grace_evals", "cpus_per_trial"):
            if getattr(self, name) < 1:
                out.append(f"{flag(name)}: must be positive, got {getattr(self, name)}")
        if self.pack != "auto" and not (
            isinstance(self.pack, int) and not isinstance(self.pack, bool) and self.pack >= 1
        ):
            out.append(f"--pack: 'auto' or a positive number of trials, got {self.pack!r}")
        for name, zero in (("max_concurrent", "unlimited"), ("max_failures", "no retries")):
            if getattr(self, name) < 0:
                out.append(f"{flag(name)}: must be >= 0 (0 = {zero}), got {getattr(self, name)}")
        out += placement_problems(self)
        return out

    def seed_problems(self) -> list[str]:
        """Seeds are integers, and only ``seeds`` sets them: a ``seed`` in ``base`` or
        ``grid`` would be replaced by each of ``seeds`` without a word."""
        out = [f"seeds: {s!r} is not an integer seed" for s in self.seeds if not is_of_type(s, int)]
        if not self.seeds:
            out.append("seeds: at least one seed")
        for where, values in (("base", self.base), ("grid", self.grid)):
            if "seed" in values:
                out.append(
                    f"{where} 'seed': seeds are set by 'seeds' (which would replace this "
                    f"value); write seeds: {values['seed']!r} instead"
                )
        return out

    def arms(self) -> list[dict]:
        """Flat configs of every grid point and seed (searched fields left at base values)."""
        keys = list(self.grid)
        arms = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            for seed in self.seeds:
                arm = {**self.base, **dict(zip(keys, values, strict=True)), "seed": seed}
                for match, extra in self.overrides:
                    if all(arm.get(k) == v for k, v in match.items()):
                        arm.update(extra)
                arms.append(arm)
        return arms

    def validate(self) -> SweepConfig:
        """Every problem of the sweep and of each of its trial configs, raised once."""
        problems = self.problems() + self.arm_problems()
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)))
        return self

    def arm_problems(self) -> list[str]:
        """Problems of each trial config, over the well-formed part of the sweep: a malformed
        grid axis, seed or unknown field is a problem of ``problems`` and is left out here,
        so that one message names the sweep's problems and its trials' together."""
        known = FIELD_TYPES
        seeds = tuple(s for s in self.seeds if is_of_type(s, int)) or (0,)
        shaped = dataclasses.replace(
            self,
            base={k: v for k, v in self.base.items() if k in known and k != "seed"},
            grid={
                k: v
                for k, v in self.grid.items()
                if k in known and k != "seed" and isinstance(v, list | tuple) and v
            },
            seeds=seeds,
            overrides=tuple(
                (match, {k: v for k, v in values.items() if k in known})
                for match, values in self.overrides
                if all(k in known for k in match)
            ),
        )
        out = []
        for arm in shaped.arms():
            try:
                TrialConfig.from_flat(arm)
            except ConfigError as e:
                out += [f"{arm_label(arm)}: {p}" for p in e.problems]
        return out

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> SweepConfig:
        """A sweep declared in YAML: the SweepConfig fields as keys, e.g.

            name: lr-grid
            base: {task: bit-xor, model: gpt2-tiny, max_steps: 2000}
            grid: {lr: [1.0e-4, 1.0e-3, 1.0e-2], init: [pretrained, random]}
            seeds: [0, 1, 2]
            overrides: [[{task: homology}, {lr: 1.0e-4}]]

        Every problem (syntax, unknown keys, wrong types, invalid trial configs) is raised
        as one ConfigError naming the file."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ConfigError([f"{path}: cannot read sweep file ({e.strerror})"]) from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(
                [f"{path}:{where} YAML syntax error: {getattr(e, 'problem', e)}"]
            ) from None
        if not isinstance(data, dict):
            raise ConfigError([f"{path}: a sweep file is a mapping of SweepConfig fields"])
        gpus = data.get("gpus_per_trial")
        if isinstance(gpus, int | float) and not isinstance(gpus, bool):
            data["gpus_per_trial"] = str(gpus)  # `gpus_per_trial: 1` means "1"
        problems, values = yaml_field_problems(cls, data)
        # The well-typed fields make a sweep whose own problems (grid shapes, seeds, every
        # arm's trial config) join the type problems: all of them in one message.
        sweep = cls(**values)
        problems += sweep.problems() + sweep.arm_problems()
        if problems:
            raise ConfigError([f"{path}: {p}" for p in dict.fromkeys(problems)])
        return sweep

    @property
    def sweep_dir(self) -> Path:
        return Path(self.results_dir).absolute() / self.name

    @property
    def ray_storage(self) -> str:
        return self.storage_path or str(Path(self.results_dir).absolute() / "_ray")


def yaml_field_problems(cls, data: dict) -> tuple[list[str], dict]:
    """(problems, SweepConfig keyword values) of a YAML mapping: unknown keys, missing name,
    fields of the wrong type. A field of the wrong type is left out of the values (its
    default stands in), so the rest can still be checked."""
    known = [f.name for f in fields(cls)]
    problems = [
        f"unknown key {k!r}; known keys: {', '.join(known)}" for k in data if k not in known
    ]
    values = {k: v for k, v in data.items() if k in known}
    if "name" not in data:
        problems.append("'name' is required")
    for key, kind in (
        ("base", dict),
        ("grid", dict),
        ("search", dict),
        ("seeds", list),
        ("overrides", list),
    ):
        if key in values and not isinstance(values[key], kind):
            problems.append(f"{key!r} must be a {kind.__name__}, got {type(values[key]).__name__}")
            del values[key]
    for key, kind in scalar_field_types(cls).items():
        if key in values and not is_of_type(values[key], kind):
            problems.append(
                f"{key!r} must be {'an' if kind is int else 'a'} {kind.__name__}, "
                f"got {values[key]!r}"
            )
            del values[key]
    for key, spec in dict(values.get("search", {})).items():
        if not isinstance(spec, list):
            problems.append(
                f"search {key!r} must be a list [kind, ...] with kind one of "
                f"{', '.join(SEARCH_KINDS)}, got {spec!r}"
            )
            del values["search"][key]
    pairs = values.get("overrides", [])
    if not all(
        isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(m, dict) for m in p)
        for p in pairs
    ):
        problems.append("'overrides' is a list of [match, values] pairs of mappings")
        pairs = []
    values["overrides"] = tuple((dict(m), dict(v)) for m, v in pairs)
    values["seeds"] = tuple(values.get("seeds", cls.seeds))
    values["search"] = {k: tuple(v) for k, v in values.get("search", {}).items()}
    values.setdefault("name", "sweep")  # missing or mistyped: already a problem
    return problems, values


def scalar_field_types(cls) -> dict[str, type]:
    """SweepConfig's scalar fields and their types (from their defaults; ``name``: str)."""
    out = {"name": str}
    for f in fields(cls):
        if "|" in str(f.type):  # int or str (``pack``): checked by SweepConfig.problems
            continue
        if isinstance(f.default, str | int | float | bool):
            out[f.name] = type(f.default)
    return out


def is_of_type(value, kind: type) -> bool:
    """YAML scalars as the field needs them: no bool for a number, an int is a float."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind) and not isinstance(value, bool)


def arm_label(flat: dict) -> str:
    keys = ("task", "model", "init", "finetune", "seed")
    return "/".join(str(flat[k]) for k in keys if k in flat)


# --------------------------------------------------------------------------- resources


def placement_problems(sweep: SweepConfig) -> list[str]:
    """Problems of the sweep's GPU declarations (``gpus_per_trial``, ``gpu``, memory)."""
    out = []
    try:
        planner.parse_gpus_per_trial(sweep.gpus_per_trial)
    except ConfigError as e:
        out += e.problems
    if sweep.gpu and sweep.gpu not in planner.GPUS:
        out.append(f"--gpu: unknown GPU {sweep.gpu!r}; choose from {', '.join(planner.GPUS)}")
    if sweep.gpu_memory_gb < 0:
        out.append(f"--gpu-memory: must be >= 0 GiB, got {sweep.gpu_memory_gb}")
    return out


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
        gpu = planner.gpu_with_memory(sweep.gpu_memory_gb, sweep.gpu)
    else:
        gpu = planner.gpu_named(sweep.gpu)
    found = config_file_offer(sweep.cluster_config)
    return GPUOffer(gpu, found.max_gpus_per_node if found else 0, "declared")


def trial_plan(flat: dict, sweep: SweepConfig, offer: GPUOffer) -> planner.TrialPlan:
    """The planner's decision for one trial of the sweep (``planner.plan_trial``). A config
    that cannot be built plans CPU: the trial fails at once and is recorded as failed."""
    try:
        config = TrialConfig.from_flat(flat)
        return planner.plan_trial(
            config, sweep.gpus_per_trial, offer.gpu, offer.max_gpus_per_node or 8
        )
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
        out.append(planner.with_plan(arm, plan) if plan.gpus > 1 else arm)
    if problems:
        raise ConfigError(problems)
    return out


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


def trial_resources(flat: dict, sweep: SweepConfig, offer: GPUOffer):
    """Ray resources of one trial, as the planner sizes it (``trial_plan``)."""
    from ray import tune

    plan = trial_plan(flat, sweep, offer)
    bundles = plan_bundles(plan, sweep.cpus_per_trial, trial_workers(flat))
    strategy = "STRICT_PACK" if len(bundles) > 1 else "PACK"
    return tune.PlacementGroupFactory(bundles, strategy=strategy)


def trial_workers(flat: dict) -> int:
    """Processes of the trial ``flat`` (its ``workers``; 1 for a config that does not
    validate, which fails as one process)."""
    try:
        return TrialConfig.from_flat(flat).train.workers
    except ConfigError:
        return 1


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
    GPUs are ``offer.gpu`` (its memory from the planner's table or ``gpu_memory_gb``)."""
    gpus = int(resources.get("GPU", 0)) if offer.gpu is not None else 0
    if gpus:
        slots, slot_bytes = gpus, offer.gpu.memory_bytes
    else:
        slots = max(1, int(resources.get("CPU", 1)) // sweep.cpus_per_trial)
        slot_bytes = int(resources.get("memory", 0)) // slots
    if sweep.max_concurrent:
        slots = min(slots, sweep.max_concurrent)
    return Devices(gpus, slots, slot_bytes)


def auto_pack(member: dict, n_members: int, devices: Devices) -> int:
    """``--pack auto``'s cohort size for ``n_members`` trials compatible with ``member``:
    spread over the slots, as many per cohort as fit in a slot's memory."""
    from scale_fpt.packing import cohort_memory_parts

    fits = scaling.members_that_fit(*cohort_memory_parts(member), devices.slot_bytes)
    return scaling.auto_cohort_size(n_members, devices.slots, fits)


def grid_cohorts(sweep: SweepConfig, arms: list[dict], devices: Devices) -> list[list[dict]]:
    """The grid's arms grouped into the cohorts ``sweep.pack`` asks for."""
    if sweep.pack != "auto":
        return cohorts(arms, sweep.pack)
    if sweep.asha:
        return [[arm] for arm in arms]
    return cohorts(arms, lambda group: auto_pack(group[0], len(group), devices))


def search_pack(sweep: SweepConfig, seed_arms: list[dict], devices: Devices) -> int:
    """Members per cohort of a search (``sweep.pack``, or ``auto``'s choice for every seed
    of every configuration the run asks for)."""
    from scale_fpt.packing import pack_problem

    if sweep.pack != "auto":
        return sweep.pack
    if pack_problem(seed_arms[0]):
        return 1
    return auto_pack(seed_arms[0], len(seed_arms) * sweep.search_trials, devices)


def cohort_resources(members: list[dict], sweep: SweepConfig, offer: GPUOffer):
    """Ray resources of a packed cohort: the CPUs of a lone trial (a cohort's products are
    K times taller, not more numerous; one cohort per core is the fastest placement on a
    CPU, benchmarks/packing.py), or a GPU share sized by its memory (one GPU at most)."""
    from ray import tune

    kind = planner.parse_gpus_per_trial(sweep.gpus_per_trial)[0]
    if offer.gpu is None:
        return tune.PlacementGroupFactory([{"CPU": sweep.cpus_per_trial}])
    if kind == "share":
        plan = planner.gpu_share(float(sweep.gpus_per_trial), offer.gpu)
    else:
        from scale_fpt.packing import cohort_memory_bytes

        device = cohort_memory_bytes(members) + planner.CUDA_CONTEXT_BYTES
        share = planner.trials_per_gpu(device, offer.gpu.memory_bytes)
        plan = planner.TrialPlan(1, 1 / share, share, 0, 1, None, offer.gpu)
    return tune.PlacementGroupFactory(plan_bundles(plan, sweep.cpus_per_trial))


def placement_columns() -> dict:
    """Where this Ray trial runs, for its rows: node id, Ray's GPU ids, the CUDA device's
    model (null without CUDA: a node whose GPU CUDA cannot see runs the trial on its CPU,
    and ``device`` says ``cpu``), and the resources the trial asked for."""
    import json

    import ray
    import torch
    from ray import tune

    context = ray.get_runtime_context()
    gpu_ids = context.get_accelerator_ids().get("GPU", [])
    requested = tune.get_context().get_trial_resources()
    return {
        "node_id": context.get_node_id(),
        "gpu_ids": json.dumps(list(gpu_ids)),
        "gpu_model": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "resources_requested": json.dumps(getattr(requested, "bundles", requested)),
    }


def report_placed(metrics: dict, checkpoint=None) -> None:
    """``ray.tune.report`` with every reported trial row carrying ``placement_columns``."""
    from ray import tune

    placement = placement_columns()
    rows = [{**row, **placement} for row in metrics.get("trial_rows", [])]
    tune.report({**metrics, "trial_rows": rows}, checkpoint=checkpoint)


# --------------------------------------------------------------------------- the trainable


def tune_trial(tune_config: dict) -> None:
    """The Ray Tune function trainable of one trial or one packed cohort: config ``{"sweep":
    name, "members": [flat, ...], **shared}`` (the shared keys apply to every member; a
    search puts its suggested values there; no ``members``: one trial of the shared keys).
    Each report carries the ``curve_rows`` of the members evaluated and the ``trial_rows``
    of all; a retried trial resumes from Tune's checkpoint. A member whose config is bad
    gets a failed row and the others train. A lone trial of ``workers`` > 1 is this process
    as rank 0 plus worker actors in the trial's placement group (``scale_fpt.distributed``);
    only rank 0 reports."""
    from ray import tune

    sweep, members = tune_members(tune_config)
    prebuild_ops()  # the first trial on a node builds its kernels; the others wait for it
    failed: list[dict] = []
    configs: list[tuple[dict, TrialConfig]] = []
    for member in members:
        try:
            configs.append((member, TrialConfig.from_flat(member)))
        except ConfigError as e:
            failed.append(config_only_row(sweep, member, "failed", error_text(e)))
    if not configs:
        report_placed({"step": 0, **report_metrics(failed), "trial_rows": failed, "final": True})
        return
    checkpoint = tune.get_checkpoint()
    reported_final = False

    def report(curve_rows: list[dict], trial_rows: list[dict], directory: str) -> None:
        nonlocal reported_final
        reported_final = run.finished
        report_placed(
            {
                "step": run.position,
                **report_metrics(trial_rows),
                "curve_rows": curve_rows,
                "trial_rows": failed + trial_rows,
                "final": reported_final,
            },
            checkpoint=tune.Checkpoint.from_directory(directory),
        )

    lone = configs[0][1] if len(configs) == 1 else None  # only a lone trial spans workers
    try:
        with rank_workers(lone, sweep, checkpoint) as (world, staging):
            run = TrialRun([c for _, c in configs], sweep=sweep, world=world)
            try:
                rows = train_rank(run, checkpoint, staging, report)
            finally:
                run.close()
    except ConfigError as e:
        # A bad combination fails the same way on every retry: record it, do not retry.
        failed += [config_only_row(sweep, m, "failed", error_text(e)) for m, _ in configs]
        report_placed({"step": 0, **report_metrics(failed), "trial_rows": failed, "final": True})
        return
    if not reported_final:  # restored when already finished: report the end once more
        report_placed(
            {
                "step": run.position,
                **report_metrics(rows),
                "trial_rows": failed + rows,
                "final": True,
            }
        )


def tune_members(tune_config: dict) -> tuple[str, list[dict]]:
    """(sweep name, every member's flat config) of a Tune trial config."""
    shared = dict(tune_config)
    sweep = shared.pop("sweep")
    members = shared.pop("members", None) or [{}]
    return sweep, [{**shared, **m} for m in members]


def tune_search_members(tune_config: dict) -> None:
    """Ray Tune function trainable of a search's trial: ``{"sweep": name, "members": [flat
    config tagged with its search_config, ...]}`` (``search.SeedMeanSearcher``), trained
    untagged by ``tune_trial``."""
    from scale_fpt.search import without_search_configs

    tune_trial(without_search_configs(tune_config))


REPORTED_METRICS = {
    "val_accuracy": "val_accuracy",
    "best_val_accuracy": "best_val_accuracy",
    "test_accuracy": "test_accuracy",
    "best_test_accuracy": "best_test_accuracy",
}
"""Scheduler-facing metric -> trials column it reports (at the selected evaluation)."""


def report_metrics(rows: list[dict]) -> dict:
    """The scheduler-facing metrics of a trial or cohort: its best member's (ASHA stops
    whole cohorts). Tune rejects a result without the sweep's metric (and stops the whole
    sweep), so a trial without any evaluation yet reports them as NaN."""
    out = {}
    for metric, column in REPORTED_METRICS.items():
        values = [float(r[column]) for r in rows if r.get(column) is not None]
        out[metric] = max(values, default=float("nan"))
    return out


def config_only_row(sweep: str, flat: dict, status: str, error: str | None) -> dict:
    """The row of a trial that never built (bad combination) or never reported."""
    return {
        "sweep": sweep,
        "trial_id": config_trial_id(sweep, flat),
        **flat,
        "status": status,
        "stop_reason": "failed" if status == "failed" else None,
        "steps_done": 0,
        "error": error,
        **provenance(),
    }


# --------------------------------------------------------------------------- driver side


WRITE_FAILURES: list[ResultsError] = []
"""Results writes that failed in this driver (a full disk, a directory gone read-only). Tune
turns an exception in a callback into a TuneError holding only traceback text; the sweep
re-raises the ResultsError itself from here, so the user gets its one-line message."""


def results_callback_class():
    from ray import tune

    class ResultsCallback(tune.Callback):
        """Writes each reported evaluation to Parquet on the driver, as it arrives. A failed
        write stops the sweep (``run_sweep`` raises its ResultsError; ``--resume`` continues
        once the directory takes writes again): rows that cannot be recorded are not run."""

        def __init__(self, results_dir: str, sweep: str):
            self.results_dir, self.sweep = results_dir, sweep
            self.last_rows: dict[str, dict] = {}
            self.search_configs: dict[str, dict[str, int]] = {}
            self._writer: ResultsWriter | None = None

        def __getstate__(self):  # Tune pickles callbacks into its experiment state
            return {
                "results_dir": self.results_dir,
                "sweep": self.sweep,
                "last_rows": {},
                "search_configs": {},
            }

        def __setstate__(self, state):
            self.__dict__.update(state, _writer=None)

        @property
        def writer(self) -> ResultsWriter:
            if self._writer is None:
                self._writer = ResultsWriter(self.results_dir, self.sweep)
            return self._writer

        def on_trial_result(self, iteration, trials, trial, result, **info):
            with recording_write_failures():
                self.write_result(trial, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            with recording_write_failures():
                self.write_complete(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            with recording_write_failures():
                self.write_error(trial)

        def tagged(self, trial, rows: list[dict]) -> list[dict]:
            """Rows with the search configuration each belongs to (None for grid trials)."""
            from scale_fpt.search import SEARCH_CONFIG, member_search_configs

            if trial.trial_id not in self.search_configs:
                self.search_configs[trial.trial_id] = member_search_configs(
                    self.sweep, trial.config
                )
            numbers = self.search_configs[trial.trial_id]
            return [{**row, SEARCH_CONFIG: numbers.get(row["trial_id"])} for row in rows]

        def write_result(self, trial, result):
            # A Tune trial reports lists of rows: one trial's, or a packed cohort's.
            for row in result.get("curve_rows", []):
                self.writer.write_curve(row["trial_id"], [row])
            rows = self.tagged(trial, result.get("trial_rows", []))
            for row in rows:
                self.writer.write_trial(row)
            if rows:
                self.last_rows[trial.trial_id] = rows

        def reported_rows(self, trial) -> list[dict]:
            return self.last_rows.get(trial.trial_id) or self.tagged(
                trial, trial.last_result.get("trial_rows", [])
            )

        def write_complete(self, trial):
            checkpoint = trial.checkpoint.path if trial.checkpoint else None
            for row in self.reported_rows(trial):
                # "running" at the end: stopped by the scheduler before its last step.
                if row["status"] == "running":
                    row = {**row, "status": "stopped", "stop_reason": "scheduler"}
                self.writer.write_trial({**row, "checkpoint": checkpoint})

        def write_error(self, trial):
            from scale_fpt.search import without_search_configs

            error = trial_error_text(trial)
            rows = self.reported_rows(trial)
            if not rows:  # never reported: every member fails with the trial's error
                _, members = tune_members(without_search_configs(trial.config))
                failed = [config_only_row(self.sweep, m, "failed", error) for m in members]
                rows = self.tagged(trial, failed)
            for row in rows:
                if row["status"] in ("running", "failed"):
                    failed = {"status": "failed", "stop_reason": "failed", "error": error}
                    self.writer.write_trial({**row, **failed})

    return ResultsCallback


class recording_write_failures:
    """Context manager: a ResultsError raised inside is kept in WRITE_FAILURES (and raised)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if isinstance(error, ResultsError):
            WRITE_FAILURES.append(error)
        return False


def fit_reporting_write_failures(tuner):
    """``tuner.fit()``; a sweep stopped by a failed results write raises that ResultsError."""
    from ray.tune.error import TuneError

    WRITE_FAILURES.clear()
    try:
        return tuner.fit()
    except TuneError:
        if WRITE_FAILURES:
            raise WRITE_FAILURES[0] from None
        raise


def trial_error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        return Path(path).read_text()[-4000:]
    return str(getattr(trial, "error_msg", None) or "trial failed")


def search_algorithm(sweep: SweepConfig, seed_arms: list[dict], study_name: str, devices: Devices):
    """The searcher of one arm: its configurations trained for every seed of ``seed_arms``
    and scored on the seed mean (``search.SeedMeanSearcher``)."""
    from scale_fpt.search import SeedMeanSearcher

    return SeedMeanSearcher(
        sweep=sweep.name,
        seed_arms=seed_arms,
        search=sweep.search,
        study_name=study_name,
        storage_url=sweep.optuna_storage or f"sqlite:///{sweep.sweep_dir / 'optuna.db'}",
        n_configs=sweep.search_trials,
        pack=search_pack(sweep, seed_arms, devices),
        parallel=sweep.max_concurrent or devices.slots,
        metric=sweep.metric,
    )


def connect_ray(runtime_env: dict | None = None, **init_kwargs) -> None:
    """Attach to the running Ray cluster (``ray submit``, RAY_ADDRESS) or start a local one.

    Workers that Ray assigns no GPU see none (``CUDA_VISIBLE_DEVICES=""``). Workers get the
    driver's git SHA (nodes may lack .git) and SCALE_FPT_HOME (where the
    driver built local backbones; shared storage on a cluster)."""
    import ray

    if ray.is_initialized():
        return
    env = {
        "SCALE_FPT_GIT_SHA": git_sha(),
        # A worker assigned no GPU gets CUDA_VISIBLE_DEVICES="" from Ray before the trial
        # imports torch, so CPU trials never create a CUDA context (torch's Adam would).
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1",
        **(runtime_env or {}).get("env_vars", {}),
    }
    # Tune snapshots its state at every checkpoint of a short trial; that is intended here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    init_kwargs.setdefault("log_to_driver", os.environ.get("SCALE_FPT_WORKER_LOGS") == "1")
    ray.init(runtime_env={**(runtime_env or {}), "env_vars": env}, **init_kwargs)


@dataclass
class SweepOutcome:
    experiments: list[str]
    """Ray Tune experiment names (one per arm for searches)."""
    trials: int
    """Tune trials run or restored."""
    unfinished: int
    """Trials neither finished nor errored (the sweep was interrupted: resume it)."""

    @property
    def finished(self) -> bool:
        return self.unfinished == 0


def run_sweep(sweep: SweepConfig, resume: bool = False) -> SweepOutcome:
    """Run (or resume) the sweep. An interrupted run (Ctrl-C) returns with ``unfinished``
    trials instead of raising: its rows so far are on disk, ``resume=True`` continues it."""
    sweep.validate()
    check_sweep_storage(sweep)
    ResultsWriter(sweep.results_dir, sweep.name)  # fail now if results cannot be written
    from scale_fpt.models.backbones import scale_fpt_home

    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    connect_ray(runtime_env={"env_vars": {"SCALE_FPT_HOME": str(scale_fpt_home())}})
    offer = sweep_gpus(sweep)
    arms = planned_arms(sweep.arms(), sweep, offer)
    import ray

    devices = cluster_devices(sweep, ray.cluster_resources(), offer)
    if sweep.search:  # one Optuna study per arm, each of its configurations for every seed
        from scale_fpt.search import seed_groups

        plans = [
            (f"{sweep.name}-{slug(arm_label({**group[0], 'seed': 'seeds'}))}", group)
            for group in seed_groups(arms)
        ]
    else:
        plans = [(sweep.name, arms)]
    trials = unfinished = 0
    for index, (experiment, arms) in enumerate(plans):
        grid = run_experiment(sweep, experiment, arms, offer, devices, resume)
        trials += len(grid)
        if saved_unfinished(os.path.join(sweep.ray_storage, experiment)):
            unfinished = unfinished_trials(sweep, [name for name, _ in plans[index:]])
            break  # interrupted: later arms wait for --resume
    return SweepOutcome([name for name, _ in plans], trials, unfinished)


def saved_unfinished(path: str) -> int:
    """Trials that Tune's saved experiment state holds as neither finished nor errored: what
    ``--resume`` continues. (Not the ResultGrid's count: on Ctrl-C, Tune saves its state and
    then stops the running trials, which the returned ResultGrid calls TERMINATED.) Trials
    Tune had not generated yet are not in it: ``unfinished_trials`` counts those too."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(path).trials
    return sum(trial.status not in ("TERMINATED", "ERROR") for trial in trials)


def unfinished_trials(sweep: SweepConfig, experiments: list[str]) -> int:
    """Trials of an interrupted sweep still to run, counted from the sweep's own grid: each
    arm without a final row on disk; for a search, ``search_trials`` per arm's experiment
    less the trials Tune finished in it (``experiments``: the current one and those after)."""
    if sweep.search:
        return sum(
            max(0, sweep.search_trials - saved_finished(os.path.join(sweep.ray_storage, name)))
            for name in experiments
        )
    writer = ResultsWriter(sweep.results_dir, sweep.name)
    ids = [trial_id_for(sweep.name, TrialConfig.from_flat(arm).to_flat()) for arm in sweep.arms()]
    return sum(writer.status(trial_id) in (None, "running") for trial_id in ids)


def saved_finished(path: str) -> int:
    """Trials Tune's saved experiment state at ``path`` holds as finished or errored."""
    from ray.tune import ExperimentAnalysis

    if not os.path.exists(path):
        return 0
    return sum(t.status in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(path).trials)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def sweep_callbacks(sweep: SweepConfig) -> list:
    """The driver's callbacks: our own rows, plus Tune's result.json (its ResultGrid reads it,
    and ``recovery`` re-derives lost rows from it); Tune's TensorBoard and CSV loggers would
    only warn about the nested row lists."""
    from ray.tune.logger import JsonLoggerCallback

    results_dir = str(Path(sweep.results_dir).absolute())
    return [results_callback_class()(results_dir, sweep.name), JsonLoggerCallback()]


def write_where_told(tuner, sweep: SweepConfig, callbacks: list) -> None:
    """Give a restored Tuner this command's callbacks. ``Tuner.restore`` brings back the
    callbacks pickled in the experiment state, whose results directory is the one of the run
    that made it (another one when the state was copied or moved); ``Tuner.restore`` takes
    no callbacks, so they are replaced in its run config. A search is refused instead: its
    restored Optuna searcher keeps the study in the other directory's default database."""
    run_config = tuner._local_tuner.get_run_config()
    stored = {
        str(Path(c.results_dir).absolute())
        for c in run_config.callbacks
        if hasattr(c, "results_dir")
    }
    here = callbacks[0].results_dir
    if sweep.search and not sweep.optuna_storage and stored - {here}:
        raise ResultsError(
            [
                f"--resume: the Ray Tune state in {sweep.ray_storage} belongs to the search "
                f"with results in {', '.join(sorted(stored))}, whose Optuna study is there; "
                f"resume it with --results {', '.join(sorted(stored))}"
            ]
        )
    run_config.callbacks = callbacks


def run_experiment(
    sweep: SweepConfig,
    experiment: str,
    arms: list[dict],
    offer: GPUOffer,
    devices: Devices,
    resume: bool,
):
    from ray import tune

    path = os.path.join(sweep.ray_storage, experiment)

    def resources(config: dict) -> tune.PlacementGroupFactory:
        _, members = tune_members(without_search_configs(config))
        if len(members) > 1:
            return cohort_resources(members, sweep, offer)
        return trial_resources(members[0], sweep, offer)

    from scale_fpt.search import without_search_configs

    trainable = tune.with_resources(tune_search_members if sweep.search else tune_trial, resources)
    callbacks = sweep_callbacks(sweep)
    if resume and tune.Tuner.can_restore(path):
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True)
        write_where_told(tuner, sweep, callbacks)
        restore_missing_rows(callbacks[0], path)
        return fit_reporting_write_failures(tuner)

    if sweep.search:
        param_space = {"sweep": sweep.name}
        search_alg = search_algorithm(sweep, arms, experiment, devices)
        num_samples = -1  # the searcher says when it is done (Searcher.FINISHED)
    else:
        search_alg, num_samples = None, 1
        # One grid axis over whole member lists: exactly arms(), overrides included, in
        # the cohorts ``pack`` asks for (one arm per Tune trial when they do not pack).
        groups = grid_cohorts(sweep, arms, devices)
        param_space = {"sweep": sweep.name, "members": tune.grid_search(groups)}
    scheduler = None
    if sweep.asha:
        trains = [TrialConfig.from_flat(a).train for a in arms]
        max_evals = max(
            len(evaluation_steps(t.max_steps, t.eval_every, t.log_evals)) for t in trains
        )
        scheduler = tune.schedulers.ASHAScheduler(
            time_attr="training_iteration",
            max_t=max(max_evals, sweep.asha_grace_evals),
            grace_period=sweep.asha_grace_evals,
        )
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            scheduler=scheduler,
            num_samples=num_samples,
            metric=sweep.metric,
            mode="max",
            max_concurrent_trials=sweep.max_concurrent or None,
            reuse_actors=sweep.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=experiment,
            storage_path=sweep.ray_storage,
            callbacks=callbacks,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            verbose=0,
        ),
    )
    return fit_reporting_write_failures(tuner)
