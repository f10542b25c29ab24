"""Running a sweep: connect to (or start) Ray, plan the arms, one Tune experiment for a grid
or for every searched arm side by side, resume an interrupted one."""

from __future__ import annotations

import os
import re
import secrets
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

from scale_fpt import analysis_plan
from scale_fpt.cluster import planned_offer
from scale_fpt.confined import refuse_links
from scale_fpt.loop import evaluation_steps
from scale_fpt.models.backbones import scale_fpt_home
from scale_fpt.recovery import restore_missing_rows
from scale_fpt.results import ResultsWriter
from scale_fpt.storage import JOURNAL_SUFFIX, check_sweep_storage
from scale_fpt.sweep.callbacks import (
    fit_reporting_write_failures,
    refuse_moved_search,
    serving,
    sweep_callbacks,
)
from scale_fpt.sweep.config import SweepConfig, arm_label
from scale_fpt.sweep.confirm import Confirmation, confirmation
from scale_fpt.sweep.lock import driver_lock
from scale_fpt.sweep.plan import SweepPlan, plan_sweep, sweep_placement
from scale_fpt.sweep.resume import repoint_trial_generator, unfinished_arms, unfinished_trials
from scale_fpt.sweep.trainable import tune_members, tune_search_members, tune_trial
from scale_fpt.trial import (
    git_sha,
    without_search_configs,
)
from scale_fpt.vocabulary import CONFIRM_SUFFIX

KEPT_CHECKPOINTS = 2
"""Checkpoints Tune keeps per trial. Tune saves the whole experiment state (every trial's
last result: O(trials)) at the latest when a trial has made this many checkpoints since the
last save, so that the state never names a deleted checkpoint; else every
``TUNE_GLOBAL_CHECKPOINT_S`` (``auto``: at least 10 s, and about 5% of the driver's time).
With 1, every evaluation of every trial saved the state: O(trials^2) over a sweep (2.7 MB
written 113 times for 100 one-evaluation trials). With 2, a trial that evaluates once never
forces a save, and a longer one at most every second evaluation (docs/performance.md)."""


class SharedGrid(dict):
    """A grid axis (``tune.grid_search``'s ``{"grid_search": values}``) that Ray Tune's
    variant generator shares instead of copying. It deep-copies the whole search space, the
    axis's every value included, for each trial it makes: O(trials) a trial, O(trials^2) a
    sweep (36 ms of CPU a trial at 2,000 Tune trials; 0.07 ms shared). Tune swaps the list
    inside for its own copy once (its placeholders); each trial's config gets its own value,
    which nothing mutates."""

    def __deepcopy__(self, memo):
        return self


def search_algorithm(plan: SweepPlan, optuna_storage: str):
    """The searcher of a sweep's searched arms: one ``search.SeedMeanSearcher`` per arm (its
    configurations trained for every seed, scored on the seed mean, in the arm's own Optuna
    study ``<sweep>-<arm>`` in ``optuna_storage``, in cohorts of the plan's size), all run
    side by side (``search.ArmSearchers``)."""
    from scale_fpt.search import ArmSearchers, SeedMeanSearcher  # Ray Tune

    sweep = plan.sweep
    searchers = [
        SeedMeanSearcher(
            sweep=sweep.name,
            seed_arms=list(group),
            search=sweep.search,
            study_name=f"{sweep.name}-{slug(arm_label({**group[0], 'seed': 'seeds'}))}",
            storage_url=optuna_storage,
            n_configs=sweep.search_trials,
            pack=pack,
            parallel=sweep.max_concurrent or plan.placement.devices.slots,
            metric=sweep.metric,
        )
        for group, pack in plan.searches
    ]
    return searchers[0] if len(searchers) == 1 else ArmSearchers(searchers, sweep.metric)


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
    # A trial that evaluates twice between two saves of the experiment state forces a save
    # (KEPT_CHECKPOINTS); Tune's warning about frequent forced saves then says nothing new.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    init_kwargs.setdefault("log_to_driver", os.environ.get("SCALE_FPT_WORKER_LOGS") == "1")
    # A Ray this call starts itself (a laptop run) needs no dashboard: the sweep prints its
    # own progress, and the dashboard's processes cost ~1 s of start-up and CPU beside the
    # trials. Ray ignores this when attaching: a cluster head keeps the dashboard that
    # `ray start` gave it (what `ray job submit` talks to).
    init_kwargs.setdefault("include_dashboard", False)
    ray.init(runtime_env={**(runtime_env or {}), "env_vars": env}, **init_kwargs)


@dataclass
class SweepOutcome:
    experiments: list[str]
    """Ray Tune experiment names (the sweep's one)."""
    trials: int
    """Tune trials run or restored."""
    unfinished: int
    """Trials neither finished nor errored (the sweep was interrupted: resume it)."""

    @property
    def finished(self) -> bool:
        return self.unfinished == 0


def run_sweep(sweep: SweepConfig, resume: bool = False) -> SweepOutcome:
    """Run (or resume) the sweep. An interrupted run (Ctrl-C) returns with ``unfinished``
    trials instead of raising: its rows so far are on disk, ``resume=True`` continues it.
    One driver per sweep: a second one on the same results and name is refused at start-up,
    naming the live one (``sweep.lock``)."""
    sweep.validate()
    optuna_storage = check_sweep_storage(sweep)
    # The sweep's one writer, made now to fail at once if results cannot be written: the
    # results callback writes through it, resume counts and restores with it, and the
    # confirmation chooses from what it reads.
    writer = ResultsWriter(sweep.results_dir, sweep.name)
    refuse_links(*written_folders(sweep))
    with driver_lock(writer.root):
        return run_locked(sweep, writer, optuna_storage, resume)


def written_folders(sweep: SweepConfig) -> list[Path]:
    """What else a sweep writes in its results folder (Tune's experiments, Optuna's default
    storage, TensorBoard): a link planted at any of them is refused, never written through."""
    storage = Path(sweep.ray_storage)
    tune = [storage / sweep.name, storage / (sweep.name + CONFIRM_SUFFIX)]
    own = [
        sweep.sweep_dir / name for name in ("optuna.db", f"optuna{JOURNAL_SUFFIX}", "tensorboard")
    ]
    return [*([] if sweep.storage_path else [storage]), *tune, *own]


def run_locked(
    sweep: SweepConfig, writer: ResultsWriter, optuna_storage: str, resume: bool
) -> SweepOutcome:
    """``run_sweep`` once this process holds the sweep's driver lock."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    connect_ray(runtime_env={"env_vars": {"SCALE_FPT_HOME": str(scale_fpt_home())}})
    import ray

    # The sweep planned once, here, for the GPUs it declares or its cluster offers: every
    # later step (Ray's resources, the searcher, resume's count, the confirmation sweep)
    # reads this plan.
    cpu_only = sweep.gpu_request.kind == "cpu"
    offer = planned_offer(cpu_only, sweep.declared_gpu, sweep.cluster_config, connected=True)
    placement = sweep_placement(sweep, offer, ray.cluster_resources())
    plan = plan_sweep(sweep, placement)
    analysis_plan.write_plan(sweep, plan.arms)  # before any result: what the report confirms
    # One Tune experiment: a grid's trials, or every searched arm side by side (one Optuna
    # study per arm, each configuration trained for every seed).
    grid, searcher = run_experiment(plan, writer, resume, optuna_storage)
    trials, experiments = len(grid), [sweep.name]
    unfinished = unfinished_trials(plan, writer, searcher)
    if sweep.confirm_seeds and not unfinished:
        # Each arm's choice, read from the sweep's rows, planned where the sweep ran.
        confirm = confirmation(plan, writer)
        confirmed, unfinished = run_confirmation(confirm, resume)
        trials += confirmed
        experiments.append(sweep.name + CONFIRM_SUFFIX)
    return SweepOutcome(experiments, trials, unfinished)


def run_confirmation(confirm: Confirmation, resume: bool) -> tuple[int, int]:
    """Each arm's chosen configuration on ``confirm_seeds`` (``sweep.confirm``, planned where
    the sweep ran): (trials run, trials left unfinished)."""
    for label in confirm.unchosen:
        print(
            f"[scale-fpt] {label}: no configuration completed every seed; nothing to confirm",
            file=sys.stderr,
        )
    if confirm.plan is None:
        return 0, 0
    grid, _ = run_experiment(confirm.plan, confirm.writer, resume)
    return len(grid), unfinished_arms(confirm.plan, confirm.writer)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def trial_resources(plan: SweepPlan) -> PlannedResources:
    """Ray Tune's resources callback of an experiment: each Tune trial's request, looked up
    in its plan."""
    return PlannedResources(plan)


class PlannedResources:
    """Each Tune trial's resources, looked up in the plan. Tune registers the trainable, this
    callback with it, and unpickles it again for every trial it makes: it pickles as a
    token (``planned_resources``), not as the plan, whose size and lookup table grow with
    the sweep (O(cohorts) a trial, O(trials^2) a sweep)."""

    def __init__(self, plan: SweepPlan):
        self.plan = plan
        self.token = secrets.token_hex(8)
        LIVE_PLANS[self.token] = self

    def __call__(self, config: dict):
        _, members = tune_members(without_search_configs(config))
        return self.plan.cohort(members).resources()

    def __reduce__(self):
        return planned_resources, (self.token,)


LIVE_PLANS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
"""This process's resources callbacks by token: the driver's, while its Tuner holds them."""


def planned_resources(token: str):
    """What a pickled ``PlannedResources`` becomes: the driver's own (Tune asks it for every
    trial on the driver), or elsewhere (a worker, which never asks) a callback that says
    why it cannot answer."""
    if token in LIVE_PLANS:
        return LIVE_PLANS[token]

    def elsewhere(config: dict):
        raise RuntimeError("a sweep's trial resources are looked up on its driver only")

    return elsewhere


def run_experiment(plan: SweepPlan, writer: ResultsWriter, resume: bool, optuna_storage: str = ""):
    """Run (or, ``resume``, restore and continue) one Tune experiment, its rows written by
    ``writer``: (its ResultGrid, the searcher of a fresh searched experiment, None
    otherwise; a search's studies in ``optuna_storage``). Only ``resume`` reads the Tune
    state in the folder (cloudpickle: ``docs/security.md``)."""
    from ray import tune

    sweep = plan.sweep
    experiment = sweep.name
    path = os.path.join(sweep.ray_storage, experiment)
    trainable = tune.with_resources(
        tune_search_members if sweep.search else tune_trial, trial_resources(plan)
    )
    callbacks = sweep_callbacks(writer, plan.planned_steps, sweep.loggers, plan.varying_fields)
    if resume and tune.Tuner.can_restore(path):
        repoint_trial_generator(path)  # a copied sweep generates its new trials here too
        with serving(callbacks):
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True)
        refuse_moved_search(sweep, callbacks)
        restore_missing_rows(callbacks.results, path)
        return fit_reporting_write_failures(tuner), None

    run = run_config(experiment, sweep.ray_storage, callbacks, sweep.max_failures)
    if sweep.search:
        param_space = {"sweep": sweep.name}
        search_alg = search_algorithm(plan, optuna_storage)
        num_samples = -1  # the searcher says when it is done (Searcher.FINISHED)
    else:
        search_alg, num_samples = None, 1
        # One grid axis over whole member lists: exactly arms(), overrides included, in
        # the planned cohorts (one arm per Tune trial when they do not pack).
        groups = [list(cohort.members) for cohort in plan.cohorts]
        param_space = {"sweep": sweep.name, "members": SharedGrid(grid_search=groups)}
    scheduler = None
    if sweep.asha:
        trains = [config.train for config in plan.configs]
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
        run_config=run,
    )
    return fit_reporting_write_failures(tuner), search_alg


def run_config(experiment: str, storage: str, callbacks, max_failures: int):
    """Ray Tune's run configuration of a sweep's experiment: its storage, the driver's
    callbacks, retries, ``KEPT_CHECKPOINTS`` per trial, and no trial table (``progress``)."""
    from ray import tune

    return tune.RunConfig(
        name=experiment,
        storage_path=storage,
        callbacks=[callbacks],
        failure_config=tune.FailureConfig(max_failures=max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=KEPT_CHECKPOINTS),
        verbose=0,
    )
