"""Sweeps: a grid (or an Optuna search per arm) over trial configs, run by Ray Tune.

    SweepConfig (config.py) --trials()--> flat trial configs
        --placement.py: planned on the cluster's GPUs, grouped into cohorts (--pack)-->
        --driver.py: one Tuner per grid (or per searched arm)-->
        trainable.py: tune_trial (one ``TrialRun`` per member list: one trial, or a packed
        cohort); each evaluation: ray.tune.report(rows, checkpoint)
        --> callbacks.py: ResultsCallback on the driver --> Parquet rows
            (results.ResultsWriter: keyed, atomic, de-duplicated)
        resume.py: what an interrupted sweep has left, for ``--resume``

A retried or moved trial resumes from its last Tune checkpoint; ``run_sweep(resume=True)``
restores an interrupted sweep with ``Tuner.restore`` so finished trials are not run again.
"""

from scale_fpt.sweep.callbacks import results_callback_class
from scale_fpt.sweep.config import SweepConfig, arm_label
from scale_fpt.sweep.driver import SweepOutcome, connect_ray, run_sweep
from scale_fpt.sweep.placement import (
    Devices,
    cluster_devices,
    grid_cohorts,
    plan_bundles,
    planned_arms,
    search_pack,
    trial_resources,
)
from scale_fpt.sweep.resume import saved_unfinished
from scale_fpt.sweep.trainable import report_metrics, tune_members, tune_trial

__all__ = [
    "Devices",
    "SweepConfig",
    "SweepOutcome",
    "arm_label",
    "cluster_devices",
    "connect_ray",
    "grid_cohorts",
    "plan_bundles",
    "planned_arms",
    "report_metrics",
    "results_callback_class",
    "run_sweep",
    "saved_unfinished",
    "search_pack",
    "trial_resources",
    "tune_members",
    "tune_trial",
]
