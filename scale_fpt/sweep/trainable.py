"""What runs inside a Ray Tune trial: ``tune_trial`` trains one trial or a packed cohort
(``TrialRun``) and reports each evaluation's rows with where it ran."""

from __future__ import annotations

from scale_fpt.config import ConfigError, TrialConfig, parse_trial
from scale_fpt.distributed import rank_workers, train_rank
from scale_fpt.prebuild import prebuild_ops
from scale_fpt.profile import step_kind
from scale_fpt.sweep.config import VALIDATION_METRICS
from scale_fpt.trial import (
    TrialRun,
    config_trial_id,
    error_text,
    provenance,
    without_search_configs,
)
from scale_fpt.vocabulary import StepKind


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
    failed: list[dict] = []
    configs: list[tuple[dict, TrialConfig]] = []
    for member in members:
        try:
            configs.append((member, parse_trial(member)))
        except ConfigError as e:
            failed.append(config_only_row(sweep, member, "failed", error_text(e)))
    if not configs:
        report_placed({"step": 0, **report_metrics(failed), "trial_rows": failed, "final": True})
        return
    lone = configs[0][1] if len(configs) == 1 else None  # only a lone trial spans workers
    # The first trial on a node builds its kernels; the others wait for it. DeepSpeed's op
    # only for a trial on an engine: a cohort never imports DeepSpeed.
    prebuild_ops(deepspeed=lone is not None and step_kind(lone) == StepKind.ENGINE)
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
    tune_trial(without_search_configs(tune_config))


REPORTED_METRICS = {metric: metric for metric in VALIDATION_METRICS}
"""Scheduler-facing metric -> trials column it reports (at the selected evaluation):
validation only, so no scheduler or searcher can read test."""


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
