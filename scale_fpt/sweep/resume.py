"""How much of an interrupted sweep is left: Tune's saved experiment state and the rows on
disk, counted for ``--resume``; and Tune's saved trial generator pointed at the storage the
sweep resumes from."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from scale_fpt.results import ResultsWriter
from scale_fpt.sweep.plan import SweepPlan
from scale_fpt.trial import trial_id_for
from scale_fpt.vocabulary import Status


def saved_unfinished(path: str) -> int:
    """Trials that Tune's saved experiment state holds as neither finished nor errored. (Not
    the ResultGrid's count: on Ctrl-C, Tune saves its state and then stops the running
    trials, which the returned ResultGrid calls TERMINATED.) Reads Tune's state
    (cloudpickle): only for a sweep resumed with ``--resume``, which trusts its storage."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(path).trials
    return sum(trial.status not in ("TERMINATED", "ERROR") for trial in trials)


def unfinished_trials(plan: SweepPlan, writer: ResultsWriter, searcher=None) -> int:
    """Trials of the planned sweep still to run after its experiment returned: for a grid,
    each arm without a final row on disk (the project's own Parquet rows, read by the
    sweep's ``writer``); for a fresh search, the configurations its live ``searcher`` has
    not told; for a search resumed
    with ``--resume`` (``searcher`` None: Tune restored its own), ``search_trials`` per
    searched arm less the trials Tune's saved state holds as finished, read only then
    (``--resume`` trusts the Tune storage). A fresh sweep never reads the folder's Tune
    state."""
    sweep = plan.sweep
    if not sweep.search:
        return unfinished_arms(plan, writer)
    if searcher is not None:
        return searcher.remaining()
    path = os.path.join(sweep.ray_storage, sweep.name)
    if not saved_unfinished(path):
        return 0
    return max(0, sweep.search_trials * len(plan.searches) - saved_finished(path))


def unfinished_arms(plan: SweepPlan, writer: ResultsWriter) -> int:
    """Planned grid trials without a final row of their sweep on disk (``writer``'s)."""
    ids = [trial_id_for(writer.sweep, config.to_flat()) for config in plan.configs]
    return sum(writer.status(trial_id) in (None, Status.RUNNING) for trial_id in ids)


def saved_finished(path: str) -> int:
    """Trials Tune's saved experiment state at ``path`` holds as finished or errored."""
    from ray.tune import ExperimentAnalysis

    if not os.path.exists(path):
        return 0
    return sum(t.status in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(path).trials)


GENERATOR_STATE_FILES = ("basic-variant-state-*.json", "search_gen_state-*.json")
"""Tune's saved trial generators (a grid's variant generator, a searcher's wrapper): pickles
holding the experiment's spec, whose storage context says where new trials go."""


def repoint_trial_generator(experiment_path: str) -> int:
    """Point the storage of Tune's saved trial generator in ``experiment_path`` (an
    experiment folder on local or mounted storage) at that folder; returns the files
    rewritten. ``Tuner.restore`` moves the trials it restores to the folder it restores
    from, but the generator keeps the storage of the run that saved it: a copied sweep's
    resume would put every trial Tune first generates then under the original's storage.
    The files are Tune's own pickles, which ``Tuner.restore`` unpickles anyway."""
    import ray.cloudpickle as cloudpickle
    from ray.train._internal.storage import StorageContext

    folder = Path(experiment_path)
    storage_fs_path, experiment = folder.parent.as_posix(), folder.name
    rewritten = 0
    for pattern in GENERATOR_STATE_FILES:
        for path in sorted(folder.glob(pattern)):
            try:
                state = cloudpickle.loads(path.read_bytes())
            except (EOFError, pickle.UnpicklingError):
                continue  # left half-written by a killed driver: Tune reads the saved ones
            stale = [
                context
                for context in reachable(state)
                if isinstance(context, StorageContext)
                and (context.storage_fs_path, context.experiment_dir_name)
                != (storage_fs_path, experiment)
            ]
            if not stale:
                continue
            for context in stale:
                context.storage_fs_path, context.experiment_dir_name = storage_fs_path, experiment
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(cloudpickle.dumps(state))
            os.replace(tmp, path)
            rewritten += 1
    return rewritten


def reachable(root) -> list:
    """Every object reachable from ``root`` through dict values, list, tuple and set items
    and instance attributes (each once)."""
    seen, stack, found = set(), [root], []
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend(vars(item).values())
    return found
