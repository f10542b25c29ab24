"""The results' Parquet schema: the columns of the trials and curves tables (every config
field of ``scale_fpt.config`` is a trials column of the same name, beside each trial's
outcome), and the version stamped in each sweep's ``_schema.json``."""

from __future__ import annotations

from dataclasses import fields

import pyarrow as pa

from scale_fpt.config import CONCERNS, FIELD_TYPES

SCHEMA_VERSION = 2

ARROW_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def recorded_config(values: dict) -> dict:
    """The one allow-list of what any artefact records of a trial's config (the Parquet
    rows, TensorBoard hparams, W&B config, MLflow params, hence the report): the declared
    trial config fields (``config.FIELD_TYPES``) with scalar values. Every other key of
    ``values`` (a sweep setting, a storage URL, anything of the environment) is left out."""
    return {
        k: v
        for k, v in values.items()
        if k in FIELD_TYPES and isinstance(v, bool | int | float | str) and v == v
    }


def config_columns() -> list[pa.Field]:
    return [
        pa.field(f.name, ARROW_TYPES[type(getattr(concern(), f.name))])
        for concern in CONCERNS
        for f in fields(concern)
    ]


TRIAL_OUTCOME = [
    ("status", pa.string(), "completed | diverged | failed | stopped (| running mid-trial)"),
    (
        "stop_reason",
        pa.string(),
        "why it ended: budget | patience | diverged | scheduler | failed (null while running)",
    ),
    ("steps_done", pa.int64(), "gradient steps taken"),
    ("best_val_accuracy", pa.float64(), "best validation accuracy over all evaluations"),
    (
        "selected_step",
        pa.int64(),
        "the evaluation with the best validation accuracy (the earliest on ties)",
    ),
    ("val_accuracy", pa.float64(), "validation accuracy at selected_step"),
    ("test_accuracy", pa.float64(), "test accuracy at selected_step (reported, never selected on)"),
    (
        "final_test_accuracy",
        pa.float64(),
        "test accuracy of the last evaluation (before divergence)",
    ),
    (
        "best_test_accuracy",
        pa.float64(),
        "best test accuracy over all evaluations (not a result: "
        "selecting on test is optimistic; use test_accuracy)",
    ),
    ("final_test_loss", pa.float64(), "test loss of the last evaluation"),
    ("final_train_loss", pa.float64(), "mean train loss since the evaluation before the last"),
    (
        "steps_to_threshold",
        pa.int64(),
        "first evaluated step with validation accuracy >= accuracy_threshold",
    ),
    (
        "trainable_params",
        pa.int64(),
        "parameters trained (positions: the task's sequence-length rows of the table)",
    ),
    (
        "total_params",
        pa.int64(),
        "all parameters of the model (the unused word embedding excluded)",
    ),
    ("trained_groups", pa.string(), "'+'-joined groups actually trained"),
    (
        "group_params",
        pa.string(),
        "JSON {group: {total, trainable}} (pos: trainable = used rows, total = whole table)",
    ),
    ("n_layer", pa.int64(), "backbone layers"),
    ("d_model", pa.int64(), "backbone width"),
    ("n_tokens", pa.int64(), "sequence length"),
    ("flops_per_step", pa.float64(), "training FLOPs of one step (4N+attention frozen, 6N full)"),
    ("total_flops", pa.float64(), "flops_per_step x steps_done"),
    ("samples_seen", pa.int64(), "training examples processed"),
    ("wall_time_s", pa.float64(), "seconds of training and evaluation, summed over resumes"),
    ("train_time_s", pa.float64(), "seconds spent in training steps only"),
    ("device", pa.string(), "cpu, or the CUDA device name"),
    (
        "cohort_size",
        pa.int64(),
        "trials trained together on the trial's step (1: alone; null in rows written before)",
    ),
    ("step_kind", pa.string(), "the step the trial trained on: cohort or engine"),
    (
        "step_mode",
        pa.string(),
        "its torch.compile mode (off: eager), --compile auto resolved for the trial's device",
    ),
    (
        "step_compiled",
        pa.bool_(),
        "whether the step ran compiled to the end (false: eager, or compilation failed and it "
        "fell back to eager)",
    ),
    ("node_id", pa.string(), "Ray node id that ran the trial (last attempt; null outside Ray)"),
    ("gpu_ids", pa.string(), "JSON list of Ray's GPU ids assigned to the trial ([] for none)"),
    ("gpu_model", pa.string(), "CUDA device name the trial saw (null: no CUDA device visible)"),
    (
        "resources_requested",
        pa.string(),
        "JSON list of the Ray placement bundles the trial asked for",
    ),
    ("hostname", pa.string(), "node that ran the trial (last attempt)"),
    ("git_sha", pa.string(), "commit of scale_fpt that ran it ('-dirty' with local changes)"),
    ("versions", pa.string(), "JSON {package: version} of the stack"),
    (
        "search_config",
        pa.int64(),
        "the Optuna trial number of the search configuration this seed trains (null: grid)",
    ),
    ("error", pa.string(), "error text of a failed trial, else null"),
    (
        "checkpoint",
        pa.string(),
        "directory of the trial's last checkpoint (trainable weights): relative to the results "
        "directory when it lies under it (the default storage), else absolute",
    ),
    ("finished_at", pa.string(), "UTC time the row was written (ISO 8601)"),
    ("schema_version", pa.int64(), "version of this schema"),
]

TRIAL_SCHEMA = pa.schema(
    [pa.field("sweep", pa.string()), pa.field("trial_id", pa.string())]
    + config_columns()
    + [pa.field(name, kind) for name, kind, _ in TRIAL_OUTCOME]
)

CURVE_ARMS = ("task", "model", "init", "finetune", "lr", "batch_size", "seed")
CURVE_SCHEMA = pa.schema(
    [pa.field("sweep", pa.string()), pa.field("trial_id", pa.string())]
    + [
        pa.field("step", pa.int64()),
        pa.field("train_loss", pa.float64()),
        pa.field("train_accuracy", pa.float64()),
        pa.field("val_loss", pa.float64()),
        pa.field("val_accuracy", pa.float64()),
        pa.field("test_loss", pa.float64()),
        pa.field("test_accuracy", pa.float64()),
        pa.field("samples_per_s", pa.float64()),
        pa.field("wall_time_s", pa.float64()),
    ]
    + [f for f in config_columns() if f.name in CURVE_ARMS]
)

SCHEMAS = {"trials": TRIAL_SCHEMA, "curves": CURVE_SCHEMA}


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema)
