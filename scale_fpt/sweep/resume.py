"""How much of an interrupted sweep is left: Tune's saved experiment state and the rows on
disk, counted for ``--resume``."""

from __future__ import annotations

import os

from scale_fpt.config import parse_trial
from scale_fpt.results import ResultsWriter
from scale_fpt.sweep.config import SweepConfig
from scale_fpt.trial import (
    trial_id_for,
)
from scale_fpt.vocabulary import Status


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
    arm without a final row on disk; for a search, ``search_trials`` per arm less the
    trials Tune finished in the experiment (``experiments``: the sweep's)."""
    if sweep.search:
        from scale_fpt.search import seed_groups  # Ray Tune: only a search needs it

        planned = sweep.search_trials * len(seed_groups(sweep.trials()))
        return sum(
            max(0, planned - saved_finished(os.path.join(sweep.ray_storage, name)))
            for name in experiments
        )
    return unfinished_arms(sweep, sweep.trials())


def unfinished_arms(sweep: SweepConfig, arms: list[dict]) -> int:
    """Grid trials of ``arms`` (flat configs) without a final row of ``sweep`` on disk."""
    writer = ResultsWriter(sweep.results_dir, sweep.name)
    ids = [trial_id_for(sweep.name, parse_trial(arm).to_flat()) for arm in arms]
    return sum(writer.status(trial_id) in (None, Status.RUNNING) for trial_id in ids)


def saved_finished(path: str) -> int:
    """Trials Tune's saved experiment state at ``path`` holds as finished or errored."""
    from ray.tune import ExperimentAnalysis

    if not os.path.exists(path):
        return 0
    return sum(t.status in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(path).trials)
