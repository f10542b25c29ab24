"""Sweeps: a grid (or an Optuna search per arm) over trial configs, run by Ray Tune.

    SweepConfig (config.py) --trials()--> flat trial configs
        --placement.py: checked against the cluster's GPUs, grouped into cohorts (--pack)-->
        --plan.py: the SweepPlan, made once: each Tune trial's members, step, GPU share,
        memory and Ray bundles (what --plan prints)-->
        --driver.py: one Tuner per grid (or per searched arm), resources looked up in it-->
        trainable.py: tune_trial (one ``TrialRun`` per member list: one trial, or a packed
        cohort); each evaluation: ray.tune.report(rows, checkpoint)
        --> callbacks.py: ResultsCallback on the driver --> Parquet rows
            (results.ResultsWriter: keyed, atomic, de-duplicated)
        resume.py: what an interrupted sweep has left, for ``--resume``
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
    "Devices": "placement",
    "cluster_devices": "placement",
    "grid_cohorts": "placement",
    "plan_bundles": "placement",
    "planned_arms": "placement",
    "search_pack": "placement",
    "PlannedCohort": "plan",
    "SweepPlan": "plan",
    "plan_cohort": "plan",
    "plan_sweep": "plan",
    "saved_unfinished": "resume",
    "report_metrics": "trainable",
    "tune_members": "trainable",
    "tune_trial": "trainable",
}
"""Each public name and the module of this package that defines it."""
__all__ = sorted(EXPORTS)
# ``scale_fpt.sweep.config`` alone (the command line's flags) loads neither Ray nor torch.
__getattr__ = lazy_exports(__name__, EXPORTS)
