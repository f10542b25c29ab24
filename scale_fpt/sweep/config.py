"""A sweep declared: ``SweepConfig`` (grid, seeds, search, scheduling, placement), its YAML
form and its one validation pass."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from scale_fpt import planner
from scale_fpt.config import FIELD_TYPES, ConfigError, flag, parse_trial
from scale_fpt.flags import load_mapping
from scale_fpt.gpus import GPU, GPUS, gpu_named, gpu_with_memory
from scale_fpt.task_registry import data_folder

SEARCH_KINDS = ("loguniform", "uniform", "int", "choice")
VALIDATION_METRICS = ("best_val_accuracy", "val_accuracy")
"""What a search or ASHA may maximise (``metric``): validation metrics only, the only ones
reported to Ray Tune's schedulers and searchers; test is never read for a decision."""
TUNED_FIELDS = ("lr", "batch_size")
"""Grid fields that are tuned within one design, not part of it: ASHA may compare trials
across them, and a grid over them is a search whose choice ``confirm_seeds`` re-runs. A grid
over anything else (task, model, init, finetune, ...) holds several arms, and ASHA would
rank them against each other (ListOps against XOR) and stop the weaker arms' trials."""

LOGGERS = ("tensorboard", "wandb", "mlflow", "none")
"""Values of ``SweepConfig.loggers``: ``none`` alone turns tracking off."""

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""The module each logger imports."""

PIP_NAMES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
"""What ``pip install`` takes for each logger (also in the ``tracking`` extra)."""


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
    confirm_seeds: tuple[int, ...] = ()
    """Fresh seeds, disjoint from ``seeds``, on which each arm's chosen configuration is
    trained again once the search (or a grid over lr / batch size) is done: the sweep
    ``<name>-confirm``, whose rows are the LR-fair table's headline, free of the winner's
    curse of the seeds that made the choice. The choice: the configuration with the best
    mean ``metric`` over every one of ``seeds`` (a failed, diverged or stopped seed
    disqualifies it; ties: the lower values). Empty: no confirmation."""
    metric: str = "best_val_accuracy"
    """What searches and ASHA maximise: one of ``VALIDATION_METRICS`` (the best validation
    accuracy so far, or the one at the selected step); a test metric is refused (test is
    measured at the selected step and reported, never chosen on)."""
    results_dir: str = "results"
    """Parquet results go to ``results_dir/name``."""
    storage_path: str = ""
    """Ray Tune's experiment storage (checkpoints, state); shared storage on a cluster.
    Empty: ``results_dir/_ray``."""
    optuna_storage: str = ""
    """Optuna storage: an RDB URL, or a journal file (``*.journal``, safe on a shared file
    system). Empty: under the sweep's results directory, a journal file when that is on a
    shared file system (NFS, ...), else an SQLite file (``storage.default_optuna_storage``)."""
    max_concurrent: int = 0
    """At most this many trials at once; 0 = unlimited (as many as resources allow)."""
    max_failures: int = 2
    """Retries of a crashed trial, each from its last checkpoint; 0 = no retries."""
    asha: bool = False
    """Stop weak trials early with ASHA (on ``metric``, in evaluation steps). Only for a
    sweep of one design: a grid over ``TUNED_FIELDS`` (lr, batch size) and seeds; stopped
    trials are rows with status ``stopped`` that every table shows."""
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
    """The GPU trials run on: a name of ``scale_fpt.gpus.GPUS`` (``scale-fpt sweep --help``
    lists them). Empty: the GPU named by the cluster's GPU node types
    (``cluster_config``), else by the running nodes' Ray accelerator type."""
    gpu_memory_gb: float = 0.0
    """Memory of one GPU in GiB, for a GPU the table lacks (0: the memory of ``gpu``)."""
    cluster_config: str = ""
    """The cluster launcher YAML whose node types the autoscaler can launch (what ``auto``
    plans for). Empty: ``~/ray_bootstrap_config.yaml`` when it exists (``ray up`` leaves it on
    the head, where ``ray submit`` runs the sweep)."""
    data_root: str = ""
    """A folder of the tasks' data, one subfolder per dataset (``task_registry``:
    listops, homology, mnist, cifar10): a trial of a task whose folder exists there and whose
    ``data_dir`` is not set reads ``data_root/<folder>``; the others keep their default
    source (the seeded generator for ListOps, the Hugging Face cache or hub for images).
    Empty: every task its default source or its ``data_dir``."""
    loggers: tuple[str, ...] = ("tensorboard",)
    """Trackers the driver feeds with every evaluation, one run per member trial
    (``sweep.tracking``): ``tensorboard`` (event files in ``results_dir/name/tensorboard``),
    ``wandb`` (``results_dir/name/wandb``; ``WANDB_MODE=offline`` needs no network),
    ``mlflow`` (``$MLFLOW_TRACKING_URI``, else a file store ``results_dir/name/mlruns``);
    ``none``: only the Parquet rows."""
    reuse_actors: bool = True
    """Reuse trial processes (saves the import and start-up of torch and DeepSpeed)."""
    pack: int | str = "auto"
    """Trials per cohort: up to this many compatible grid trials (same frozen backbone,
    differing in lr, seed or trained subset of input/output/ln/pos) train together in one
    process over one copy of the backbone (``scale_fpt.packing``); each keeps its own rows.
    1: one trial per process. ``auto``: each group of compatible trials is spread over the
    cluster's slots (one cohort per GPU, or per ``cpus_per_trial`` CPUs), at most as many
    members per cohort as fit in a slot's memory beside one frozen body
    (``planner.cohort_size``); nothing is packed under ASHA (it stops whole Tune
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
        if self.metric not in VALIDATION_METRICS:
            out.append(
                f"metric {self.metric!r}: searches and ASHA decide on validation only; "
                f"choose from {', '.join(VALIDATION_METRICS)}"
            )
        arm_axes = sorted(k for k in self.grid if k not in TUNED_FIELDS)
        if self.asha and arm_axes:
            out.append(
                f"asha with a grid over {', '.join(arm_axes)}: ASHA would rank different arms "
                f"against each other; grid only over {', '.join(TUNED_FIELDS)} (one sweep per "
                "arm) or drop asha"
            )
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
        out += logger_problems(self.loggers)
        return out

    def varying_fields(self) -> tuple[str, ...]:
        """The trial fields that tell this sweep's trials apart: grid axes of more than one
        value, searched fields, and ``seed`` when there are several seeds (what a tracker's
        run name shows; per-task overrides follow the task and tell nothing more)."""
        axes = [k for k, values in self.grid.items() if len(values) > 1]
        seed = ["seed"] if len(self.seeds) > 1 else []
        return tuple(dict.fromkeys([*axes, *self.search, *seed]))

    def choice_fields(self) -> tuple[str, ...]:
        """What the sweep chooses within an arm: searched fields and tuned grid axes."""
        return tuple(sorted({*self.search, *(k for k in self.grid if k in TUNED_FIELDS)}))

    def seed_problems(self) -> list[str]:
        """Seeds are integers, and only ``seeds`` sets them: a ``seed`` in ``base`` or
        ``grid`` would be replaced by each of ``seeds`` without a word."""
        out = [f"seeds: {s!r} is not an integer seed" for s in self.seeds if not is_of_type(s, int)]
        out += [
            f"confirm_seeds: {s!r} is not an integer seed"
            for s in self.confirm_seeds
            if not is_of_type(s, int)
        ]
        shared = sorted(set(self.confirm_seeds) & set(self.seeds), key=str)
        if shared:
            out.append(
                f"confirm_seeds: {shared} also choose the configuration (seeds); confirmation "
                "seeds must be fresh"
            )
        if self.confirm_seeds and not self.choice_fields():
            out.append(
                "confirm_seeds: nothing is chosen to confirm; search a space or grid over "
                f"{', '.join(TUNED_FIELDS)}"
            )
        if not self.seeds:
            out.append("seeds: at least one seed")
        for where, values in (("base", self.base), ("grid", self.grid)):
            if "seed" in values:
                out.append(
                    f"{where} 'seed': seeds are set by 'seeds' (which would replace this "
                    f"value); write seeds: {values['seed']!r} instead"
                )
        return out

    def trials(self) -> list[dict]:
        """Flat configs of every trial: each grid point (an arm) for each seed (searched fields
        left at base values)."""
        keys = list(self.grid)
        arms = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            for seed in self.seeds:
                arm = {**self.base, **dict(zip(keys, values, strict=True)), "seed": seed}
                for match, extra in self.overrides:
                    if all(arm.get(k) == v for k, v in match.items()):
                        arm.update(extra)
                arms.append(with_data_root(arm, self.data_root))
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
        for arm in shaped.trials():
            try:
                parse_trial(arm)
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
        data = load_mapping(path, "sweep file", "SweepConfig fields")
        problems, values = yaml_field_problems(cls, data)
        if "name" not in data:
            problems.append("'name' is required")
        values.setdefault("name", "sweep")  # missing or mistyped: already a problem
        # The well-typed fields make a sweep whose own problems (grid shapes, seeds, every
        # arm's trial config) join the type problems: all of them in one message.
        sweep = cls(**values)
        problems += sweep.problems() + sweep.arm_problems()
        if problems:
            raise ConfigError([f"{path}: {p}" for p in dict.fromkeys(problems)])
        return sweep

    def updated(self, data: dict, where: str) -> SweepConfig:
        """This sweep with the fields of a YAML mapping (``--config`` FILE) in place of its
        own; one ConfigError naming ``where`` and every unknown key or value of the wrong
        type (the sweep's own problems: ``validate``)."""
        problems, values = yaml_field_problems(type(self), data)
        if problems:
            raise ConfigError([f"{where}: {p}" for p in problems])
        return dataclasses.replace(self, **values)

    @property
    def sweep_dir(self) -> Path:
        return Path(self.results_dir).absolute() / self.name

    @property
    def ray_storage(self) -> str:
        return self.storage_path or str(Path(self.results_dir).absolute() / "_ray")

    @property
    def gpu_request(self) -> planner.GPURequest:
        """``gpus_per_trial``, parsed (``planner.parse_gpus_per_trial``: ConfigError for a
        value it does not take)."""
        return planner.parse_gpus_per_trial(self.gpus_per_trial)

    @property
    def declared_gpu(self) -> GPU | None:
        """The GPU ``gpu`` and ``gpu_memory_gb`` declare (``gpus.gpu_with_memory``,
        ``gpus.gpu_named``: ConfigError for a name it does not know); None: neither does."""
        if self.gpu_memory_gb:
            return gpu_with_memory(self.gpu_memory_gb, self.gpu)
        return gpu_named(self.gpu) if self.gpu else None


def yaml_field_problems(cls, data: dict) -> tuple[list[str], dict]:
    """(problems, SweepConfig keyword values) of a YAML mapping: unknown keys and fields of
    the wrong type. A field of the wrong type is left out of the values (its default stands
    in), so the rest can still be checked."""
    known = [f.name for f in fields(cls)]
    problems = [
        f"unknown key {k!r}; known keys: {', '.join(known)}" for k in data if k not in known
    ]
    values = {k: v for k, v in data.items() if k in known}
    gpus = values.get("gpus_per_trial")
    if isinstance(gpus, int | float) and not isinstance(gpus, bool):
        values["gpus_per_trial"] = str(gpus)  # `gpus_per_trial: 1` means "1"
    for key, kind in (
        ("base", dict),
        ("grid", dict),
        ("search", dict),
        ("seeds", list),
        ("confirm_seeds", list),
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
    if "overrides" in values:
        pairs = values["overrides"]
        if not all(
            isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(m, dict) for m in p)
            for p in pairs
        ):
            problems.append("'overrides' is a list of [match, values] pairs of mappings")
            pairs = []
        values["overrides"] = tuple((dict(m), dict(v)) for m, v in pairs)
    for key in ("seeds", "confirm_seeds", "loggers"):
        if key in values and isinstance(values[key], list):
            values[key] = tuple(values[key])
    if "search" in values:
        values["search"] = {k: tuple(v) for k, v in values["search"].items()}
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


def with_data_root(arm: dict, data_root: str) -> dict:
    """``arm`` reading its task's folder of ``data_root`` when that folder exists and the arm
    names no ``data_dir`` of its own (``SweepConfig.data_root``)."""
    folder = data_folder(arm.get("task", ""))
    if not data_root or not folder or arm.get("data_dir"):
        return arm
    path = Path(data_root).absolute() / folder
    return {**arm, "data_dir": str(path)} if path.is_dir() else arm


def arm_label(flat: dict) -> str:
    keys = ("task", "model", "init", "finetune", "seed")
    return "/".join(str(flat[k]) for k in keys if k in flat)


def missing_packages(loggers) -> list[str]:
    """One line per chosen logger whose package is not installed (checked before Ray)."""
    return [
        f"--logger {name}: the {PACKAGES[name]} package is not installed; pip install "
        f"{PIP_NAMES[name]} (or pip install 'scale-fpt[tracking]')"
        for name in loggers
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name]) is None
    ]


def logger_problems(loggers) -> list[str]:
    """Unknown logger names, then chosen loggers whose package is missing."""
    choices = f"a comma list of {', '.join(n for n in LOGGERS if n != 'none')}, or none"
    if not isinstance(loggers, list | tuple) or not loggers:
        return [f"--logger: expected {choices}; got {loggers!r}"]
    unknown = [str(n) for n in loggers if n not in LOGGERS]
    if unknown:
        return [f"--logger: unknown logger(s) {', '.join(unknown)}; expected {choices}"]
    if "none" in loggers and len(loggers) > 1:
        return [f"--logger: none turns tracking off and goes alone; got {','.join(loggers)}"]
    return missing_packages(loggers)


def placement_problems(sweep: SweepConfig) -> list[str]:
    """Problems of the sweep's GPU declarations (``gpus_per_trial``, ``gpu``, memory)."""
    out = []
    try:
        planner.parse_gpus_per_trial(sweep.gpus_per_trial)
    except ConfigError as e:
        out += e.problems
    if sweep.gpu and sweep.gpu not in GPUS:
        out.append(f"--gpu: unknown GPU {sweep.gpu!r}; choose from {', '.join(GPUS)}")
    if sweep.gpu_memory_gb < 0:
        out.append(f"--gpu-memory: must be >= 0 GiB, got {sweep.gpu_memory_gb}")
    return out
