"""Sweeps: a grid (or an Optuna search per arm) over trial configs, run by Ray Tune.

    SweepConfig (config.py) --trials()--> flat trial configs
        --plan.py: the SweepPlan, made once: where trials run (the cluster's GPUs and
        slots), each trial parsed and profiled, checked against the GPUs, grouped into
        cohorts (--pack), each Tune trial's members, step, GPU share, memory and Ray
        bundles (what --plan prints)-->
        --driver.py: built once at start-up and handed along: the storages checked (the
        Optuna storage a search uses), the sweep's one results.ResultsWriter (keyed,
        atomic, de-duplicated), the plan; one Tuner per grid (or every searched arm side by
        side): resources looked up in the plan, the searcher given the plan and the
        Optuna storage, the callbacks the writer-->
        trainable.py: tune_trial (one ``TrialRun`` per member list: one trial, or a packed
        cohort); each evaluation: ray.tune.report(rows, checkpoint)
        --> callbacks.py: ResultsCallback on the driver --> Parquet rows, through the writer
        resume.py: what an interrupted sweep has left (the plan counted against the
            writer's rows), for ``--resume``
        confirm.py: each arm's chosen configuration (from the writer's trial rows) on fresh
            seeds, planned at the sweep's placement, written by its own writer
        lock.py: one driver per sweep

A retried or moved trial resumes from its last Tune checkpoint; ``run_sweep(resume=True)``
restores an interrupted sweep with ``Tuner.restore`` so finished trials are not run again.
"""

from scale_fpt.lazy import lazy_exports

EXPORTS = {
    "results_callback_class": "callbacks",
    "SweepConfig": "config",
    "arm_label": "config",
    "SweepOutcome": "driver",
    "connect_ray": "driver",
    "run_sweep": "driver",
    "Devices": "plan",
    "Placement": "plan",
    "PlannedCohort": "plan",
    "SweepPlan": "plan",
    "cluster_devices": "plan",
    "plan_cohort": "plan",
    "placement_on": "plan",
    "plan_sweep": "plan",
    "planned_arms": "plan",
    "sweep_placement": "plan",
    "saved_unfinished": "resume",
    "report_metrics": "trainable",
    "tune_members": "trainable",
    "tune_trial": "trainable",
}
"""Each public name and the module of this package that defines it."""
__all__ = sorted(EXPORTS)
# ``scale_fpt.sweep.config`` alone (the command line's flags) loads neither Ray nor torch.
__getattr__ = lazy_exports(__name__, EXPORTS)
