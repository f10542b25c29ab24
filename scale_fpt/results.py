"""Results on disk: typed Parquet tables of trials and learning curves.

Layout (``pandas.read_parquet`` reads each table directory whole)::

    RESULTS_DIR/<sweep>/_schema.json            schema version of this sweep's files
    RESULTS_DIR/<sweep>/trials/<trial_id>.parquet   one row: the trial's config and outcome
    RESULTS_DIR/<sweep>/curves/<trial_id>.parquet   one row per evaluation, sorted by step

Every file is keyed by its trial, and every write replaces the whole file atomically (written
to a hidden temporary file, fsynced, then renamed; readers skip names starting with '.'/'_').
So a retried, restored or resumed trial overwrites its own rows instead of adding copies, a
curve keeps one row per step (the last reported wins), and no reader ever sees half a file.

Columns: ``TRIAL_SCHEMA`` and ``CURVE_SCHEMA`` below (every config field of
``scale_fpt.config`` is a trials column of the same name).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from scale_fpt.config import CONCERNS, FIELD_TYPES, ConfigError

log = logging.getLogger(__name__)

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


class ResultsError(ConfigError):
    """The results directory, or a storage of the sweep, cannot be used (unwritable, full,
    other schema, a bad URL). Its message is
    the problem itself, without ConfigError's "invalid configuration" framing: a full disk
    is not a bad flag."""

    def __init__(self, problems: list[str]):
        ValueError.__init__(self, "\n".join(problems))
        self.problems = list(problems)


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema)


def write_atomic(table_: pa.Table, path: Path) -> None:
    """Write ``path`` so that it is either the old file or the complete new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table_, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        # Whatever stopped the write (a full disk, an interrupt), leave no temporary behind.
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise ResultsError(
                [
                    f"cannot write results file {path}: {e.strerror or e} (the rows written "
                    "before are intact; free space or fix the directory, then rerun, with "
                    "--resume for a sweep)"
                ]
            ) from None
        raise


class ResultsWriter:
    """Writes one sweep's rows; safe to re-create on resume (rows are keyed, not appended)."""

    def __init__(self, results_dir: str | os.PathLike, sweep: str):
        self.root = Path(results_dir).absolute() / sweep
        self.sweep = sweep
        self.curves: dict[str, dict[int, dict]] = {}
        self.prepare()

    def prepare(self) -> None:
        """Fail at start-up, not mid-sweep, if the directory is unusable. A directory that
        fails here is left as it was: no probe file, no empty folders made by this call."""
        marker = self.root / "_schema.json"
        folders = (
            *reversed(self.root.parents),
            self.root,
            self.root / "trials",
            self.root / "curves",
        )
        made = [p for p in folders if not p.exists()]
        try:
            existing = marker.exists()
            if existing:
                version = read_schema_version(self.root)
                if version != SCHEMA_VERSION:
                    raise ResultsError(
                        [
                            f"--results: {self.root} holds results of schema version {version}, "
                            f"this scale_fpt writes version {SCHEMA_VERSION}; use a new results "
                            "directory (or another --sweep name)"
                        ]
                    )
            for sub in ("trials", "curves"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            # Probe even an existing sweep (a resumed one may now be read-only or full); the
            # name is per process, so writers starting side by side never remove each other's.
            probe = self.root / f".write-probe.{os.getpid()}"
            try:
                probe.write_bytes(b"x" * 4096)
            finally:
                with contextlib.suppress(OSError):
                    probe.unlink()
            if not existing:
                write_text_atomic(marker, json.dumps({"schema_version": SCHEMA_VERSION}))
        except (OSError, ResultsError) as e:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()  # only ever empty folders: what this call made
            if isinstance(e, ResultsError):
                raise
            raise ResultsError(
                [f"--results: cannot write to {self.root}: {e.strerror or e}"]
            ) from None

    def write_trial(self, row: dict) -> None:
        path = self.root / "trials" / f"{row['trial_id']}.parquet"
        checkpoint = recorded_checkpoint(row.get("checkpoint"), self.root.parent)
        write_atomic(
            table([{**row, "sweep": self.sweep, "checkpoint": checkpoint}], TRIAL_SCHEMA), path
        )

    def curve(self, trial_id: str) -> dict[int, dict]:
        """A trial's curve rows on disk by step (read once, then kept current). A damaged
        file counts as empty (with one warning): the rows written from now on replace it,
        and ``--resume`` puts back the earlier ones from Ray Tune's log (``recovery``)."""
        if trial_id not in self.curves:
            path = self.root / "curves" / f"{trial_id}.parquet"
            found = read_parquet(path, CURVE_SCHEMA) if path.exists() else None
            self.curves[trial_id] = (
                {r["step"]: r for r in found.to_pylist()} if found is not None else {}
            )
        return self.curves[trial_id]

    def write_curve(self, trial_id: str, rows: list[dict]) -> None:
        """Add evaluation rows to a trial's curve; a step seen before is replaced."""
        curve = self.curve(trial_id)
        for row in rows:
            curve[row["step"]] = {**row, "sweep": self.sweep, "trial_id": trial_id}
        path = self.root / "curves" / f"{trial_id}.parquet"
        write_atomic(table([curve[s] for s in sorted(curve)], CURVE_SCHEMA), path)

    def status(self, trial_id: str) -> str | None:
        """The status in the trial's row on disk; None without a readable row (a damaged
        file warns once)."""
        path = self.root / "trials" / f"{trial_id}.parquet"
        found = read_parquet(path, TRIAL_SCHEMA) if path.exists() else None
        return found.column("status")[0].as_py() if found is not None and found.num_rows else None


def recorded_checkpoint(path: str | os.PathLike | None, results_dir: Path) -> str | None:
    """A checkpoint directory as a trials row records it: relative to ``results_dir`` when
    it lies under it (the default storage ``RESULTS/_ray``, a ``--checkpoint-dir`` inside
    the results), so a moved or copied results directory finds its own checkpoints and
    never its original's; otherwise absolute (storage elsewhere: there is only that one)."""
    if path is None or str(path) == "":
        return None
    if not os.path.isabs(path):
        path = os.path.abspath(path)  # a --checkpoint-dir given relative to the cwd
    for base, target in (
        (os.path.abspath(results_dir), path),
        (os.path.realpath(results_dir), os.path.realpath(path)),  # through symlinks
    ):
        if Path(target).is_relative_to(base):
            return Path(target).relative_to(base).as_posix()
    return str(path)


def checkpoint_dir(recorded: str, results_dir: str | os.PathLike) -> Path:
    """Where a trials row's ``checkpoint`` is: a relative one under ``results_dir`` (the
    directory the rows were read from), an absolute one where it says."""
    return Path(recorded) if os.path.isabs(recorded) else Path(results_dir) / recorded


def read_schema_version(sweep_dir: Path):
    """The schema version in ``sweep_dir/_schema.json``; ResultsError if it is unreadable."""
    marker = sweep_dir / "_schema.json"
    try:
        return json.loads(marker.read_text()).get("schema_version")
    except (OSError, ValueError, AttributeError) as e:
        raise ResultsError(
            [
                f"{marker} is not a readable scale_fpt schema file ({e}); this is not a "
                "scale_fpt results directory, or it was damaged: use a new results directory"
            ]
        ) from None


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ResultsError([f"cannot write {path}: {e.strerror or e}"]) from None


@dataclass
class Results:
    """A results directory in pandas: ``trials`` (one row per trial), ``curves`` (one row per
    evaluation). Columns and types: ``TRIAL_SCHEMA`` and ``CURVE_SCHEMA``."""

    trials: object  # pandas.DataFrame
    curves: object  # pandas.DataFrame


def sweep_dirs(results_dir: str | os.PathLike) -> list[Path]:
    root = Path(results_dir)
    if (root / "_schema.json").exists():
        return [root]
    return sorted(p.parent for p in root.glob("*/_schema.json"))


def load_results(results_dir: str | os.PathLike, sweep: str | None = None) -> Results:
    """Load every sweep under ``results_dir`` (or one ``sweep``, or a sweep directory itself)."""

    dirs = sweep_dirs(results_dir)
    if sweep is not None:
        dirs = [d for d in dirs if d.name == sweep]
    if not dirs:
        raise ResultsError([f"no scale_fpt results under {results_dir} (no */_schema.json)"])
    trials, curves = [], []
    for d in dirs:
        version = read_schema_version(d)
        if version != SCHEMA_VERSION:
            raise ResultsError(
                [f"{d}: schema version {version}, this scale_fpt reads {SCHEMA_VERSION}"]
            )
        trials.append(read_table_dir(d / "trials", TRIAL_SCHEMA))
        curves.append(read_table_dir(d / "curves", CURVE_SCHEMA))
    trial_df = pa.concat_tables(trials).to_pandas()
    curve_df = pa.concat_tables(curves).to_pandas()
    curve_df = curve_df.sort_values(["sweep", "trial_id", "step"], ignore_index=True)
    return Results(
        trials=trial_df.sort_values(["sweep", "trial_id"], ignore_index=True), curves=curve_df
    )


def read_table_dir(path: Path, schema: pa.Schema) -> pa.Table:
    """Every readable file of a table directory; a damaged one is skipped with a warning."""
    tables = [read_parquet(f, schema) for f in sorted(path.glob("[!._]*.parquet"))]
    tables = [t for t in tables if t is not None]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def read_parquet(path: Path, schema: pa.Schema) -> pa.Table | None:
    """The table in ``path``; None, with one warning line naming the file, when it is not a
    readable Parquet file of ``schema`` (truncated, garbage, another table's file)."""
    try:
        return pq.read_table(path, schema=schema)
    except (pa.ArrowException, OSError) as e:
        detail = str(e).split(f"'{path}': ")[-1]  # pyarrow repeats the path first
        cause = " ".join(f"{type(e).__name__}: {detail}".split())[:160]
        log.warning(
            f"scale-fpt: warning: skipping damaged results file {path} ({cause}); "
            "--resume of its sweep re-derives its rows from Ray Tune's log"
        )
        return None
