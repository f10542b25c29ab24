"""Experiment trackers fed by the driver: TensorBoard, Weights & Biases and MLflow, one run
per member trial.

The driver already receives every evaluation (``ResultsCallback``); ``Trackers`` hands the
same rows to each logger of ``SweepConfig.loggers`` through one interface (``TrialLogger``):
a member trial starts with its run name (``run_name``: its values of the fields that vary in
the sweep, ``bit-xor pretrained lr=0.001 seed=0``), its trial id and arm, and its flat config
as ``results_schema.recorded_config`` allows it (TensorBoard hparams, W&B config, MLflow params;
nothing of the environment), gets the curve scalars at each evaluated step
(``CURVE_SCALARS`` as ``<split>/<metric>``, and ``val/best_accuracy``), and finishes with
its status and final metrics (the trials table's columns, ``FINAL_COLUMNS``). Where they
land, grouped by sweep:

- tensorboard: ``RESULTS/<sweep>/tensorboard/<run name>/`` event files (hparams: the config,
  ``trial_id`` and ``arm``);
- wandb: ``RESULTS/<sweep>/wandb/`` (W&B's run directories; ``WANDB_MODE=offline`` writes
  them with no network, ``wandb sync`` uploads them later); project ``$WANDB_PROJECT`` or
  the sweep's name, group the sweep, run id the trial id (config ``trial_id``, ``arm``);
- mlflow: ``$MLFLOW_TRACKING_URI``, else a file store ``RESULTS/<sweep>/mlruns``; one
  experiment per sweep, one run per member trial (tags ``trial_id``, ``arm``; a resumed
  trial goes on in its run).

Written on the driver, so it works the same on a cluster (the results directory is shared
storage there). Ray Tune's own ``WandbLoggerCallback`` and ``MLflowLoggerCallback`` log one
run per Tune trial from its flat result; here a Tune trial is often a packed cohort whose
result holds lists of rows of several member trials, so those callbacks would merge the
members into one run. A logger that fails (W&B cannot start, a tracking server is down) is
dropped with one warning line; the trials and the other loggers go on.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from scale_fpt.confined import make_folders, refuse_links
from scale_fpt.results_schema import recorded_config
from scale_fpt.sweep.progress import arm_of
from scale_fpt.vocabulary import ARM_LABEL_FIELDS, ENDED, Status

CURVE_SCALARS = (
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "test_loss",
    "test_accuracy",
    "samples_per_s",
)
"""Curve columns written as scalars (tag ``<split>/<metric>``)."""

HPARAM_METRIC = "val/best_accuracy"
"""The member's best validation accuracy so far (never test): a scalar of every logger, and
TensorBoard's hparams metric."""

FINAL_COLUMNS = (
    "steps_done",
    "selected_step",
    "val_accuracy",
    "test_accuracy",
    "best_val_accuracy",
    "final_test_accuracy",
    "best_test_accuracy",
    "final_test_loss",
    "trainable_params",
    "total_params",
    "wall_time_s",
)
"""Columns of the trials table a finished member trial reports to each logger, by the same
names (``test_accuracy``: at the step of best validation accuracy)."""


def scalar_tag(column: str) -> str:
    split, _, metric = column.partition("_")
    return f"{split}/{metric}"


def number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def final_values(row: dict) -> dict:
    return {k: row[k] for k in FINAL_COLUMNS if number(row.get(k))}


def value_text(value) -> str:
    """A config value in a run name: a float as ``%g``, a hub id or a local directory by its
    last part (``EleutherAI/pythia-70m``: ``pythia-70m``; a run name is a directory name)."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).rstrip("/").rsplit("/", 1)[-1]


def run_name(row: dict, fields: tuple[str, ...]) -> str:
    """A member trial's name in every tracker: its values of ``fields`` (the fields that vary
    in its sweep, ``SweepConfig.varying_fields``; the arm's fields when none does), the arm's
    bare and first, the others as ``field=value``, the seed last:
    ``bit-xor gpt2-tiny pretrained fpt lr=0.001 seed=0``."""
    arm = [f for f in ARM_LABEL_FIELDS if f in fields or not fields]
    others = [f for f in fields if f not in (*ARM_LABEL_FIELDS, "seed")]
    shown = [*arm, *others, *(["seed"] if "seed" in fields else [])]
    parts = [
        value_text(row[f]) if f in ARM_LABEL_FIELDS else f"{f}={value_text(row[f])}"
        for f in shown
        if row.get(f) is not None
    ]
    return " ".join(p for p in parts if p)


class TrialLogger:
    """One tracker's runs, one per member trial (``Trackers`` calls it)."""

    def start(self, trial_id: str, name: str, config: dict, arm: str) -> None:
        """Open the run of ``trial_id``, named ``name``, with its flat ``config`` and its
        ``arm`` (``task/model/init/finetune``)."""

    def log(self, trial_id: str, scalars: dict[str, float], step: int) -> None:
        """Scalars of an open run at a training step."""

    def finish(self, trial_id: str, status: str, final: dict) -> None:
        """Close a run: its status (``ENDED``) and final metrics (``FINAL_COLUMNS``)."""

    def close(self) -> None:
        """Release what the logger holds (every run was finished before)."""


class TensorBoardLogger(TrialLogger):
    """One ``SummaryWriter`` per member trial in ``sweep_dir/tensorboard/<run name>``."""

    def __init__(self, sweep_dir: Path, experiment: str):
        from torch.utils.tensorboard import SummaryWriter

        self.root, self.new_writer = sweep_dir / "tensorboard", SummaryWriter
        self.writers: dict = {}

    def start(self, trial_id, name, config, arm):
        from torch.utils.tensorboard.summary import hparams

        make_folders(self.root, name)  # a planted link there is refused, never written through
        writer = self.writers[trial_id] = self.new_writer(log_dir=str(self.root / name))
        # The hparams' session records the config; the metric itself is the scalar
        # HPARAM_METRIC, written with every report.
        labels = {**config, "trial_id": trial_id, "arm": arm}
        for summary in hparams(labels, {HPARAM_METRIC: 0.0}):
            writer.file_writer.add_summary(summary)

    def log(self, trial_id, scalars, step):
        for tag, value in scalars.items():
            self.writers[trial_id].add_scalar(tag, value, step)

    def finish(self, trial_id, status, final):
        self.writers.pop(trial_id).close()


LOGIN_TIMEOUT_S = 60.0
"""Seconds W&B's login prompt may hold the driver (online mode with no API key)."""


class WandbLogger(TrialLogger):
    """One W&B run per member trial (id = trial id, group = the sweep), its files under
    ``sweep_dir/wandb``."""

    def __init__(self, sweep_dir: Path, experiment: str):
        import wandb

        make_folders(sweep_dir, "wandb")  # W&B writes its runs there: a link is refused
        self.wandb, self.dir, self.group = wandb, sweep_dir, experiment
        self.project = os.environ.get("WANDB_PROJECT") or experiment
        self.runs: dict = {}

    def start(self, trial_id, name, config, arm):
        self.runs[trial_id] = self.wandb.init(
            dir=str(self.dir),
            project=self.project,
            id=trial_id,
            name=name,
            group=self.group,
            config={**config, "trial_id": trial_id, "arm": arm},
            resume="allow",
            reinit="create_new",  # the driver holds one run per running member trial
            # The driver's output is the sweep's, and one machine's statistics are not a
            # member trial's: neither is captured. Without credentials, W&B's login prompt
            # on the driver's terminal waits LOGIN_TIMEOUT_S, then the logger is dropped.
            settings=self.wandb.Settings(
                console="off", x_disable_stats=True, silent=True, login_timeout=LOGIN_TIMEOUT_S
            ),
        )

    def log(self, trial_id, scalars, step):
        self.runs[trial_id].log(scalars, step=step)

    def finish(self, trial_id, status, final):
        run = self.runs.pop(trial_id)
        run.summary.update({**final, "status": status})
        run.finish(exit_code=0 if status in (Status.COMPLETED, Status.STOPPED) else 1)


MLFLOW_STATUS = {
    Status.COMPLETED: "FINISHED",
    Status.STOPPED: "KILLED",
    Status.DIVERGED: "FAILED",
    Status.FAILED: "FAILED",
}
"""The MLflow run status of each trial status."""


class MlflowLogger(TrialLogger):
    """One MLflow run per member trial in the experiment named after the sweep."""

    def __init__(self, sweep_dir: Path, experiment: str):
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow 3 keeps its file store in maintenance mode behind this switch; a file
            # store needs no server or database migrations (a SQLite store takes seconds
            # to create) and is safe on a shared file system.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            store = sweep_dir / "mlruns"
            make_folders(store)  # the file store and its experiments: links are refused
            refuse_links(*store.iterdir())
            uri = store.absolute().as_uri()
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id if found else self.client.create_experiment(experiment)
        )
        self.runs: dict[str, str] = {}

    def start(self, trial_id, name, config, arm):
        from mlflow.entities import Param

        (earlier,) = self.client.search_runs(
            [self.experiment_id], f"tags.trial_id = '{trial_id}'", max_results=1
        ) or (None,)
        if earlier is not None:  # a resumed or retried trial goes on in its run
            self.runs[trial_id] = earlier.info.run_id
            self.client.update_run(earlier.info.run_id, status="RUNNING")
            return
        run = self.client.create_run(
            self.experiment_id, run_name=name, tags={"trial_id": trial_id, "arm": arm}
        )
        self.runs[trial_id] = run.info.run_id
        params = [Param(k, str(v)) for k, v in config.items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(run.info.run_id, params=params[start : start + 100])

    def log(self, trial_id, scalars, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in scalars.items()]
        self.client.log_batch(self.runs[trial_id], metrics=metrics)

    def finish(self, trial_id, status, final):
        from mlflow.entities import Metric, RunTag

        run_id, now = self.runs.pop(trial_id), int(time.time() * 1000)
        step = int(final.get("steps_done", 0))
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, step) for k, v in final.items()],
            tags=[RunTag("status", status)],
        )
        self.client.set_terminated(run_id, MLFLOW_STATUS[status])


LOGGER_CLASSES = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MlflowLogger}


class Trackers:
    """The loggers of one experiment, fed with the rows the driver receives. A logger that
    raises is dropped with one warning line (``warn``); the sweep never fails for it."""

    def __init__(self, sweep_dir: Path, names, experiment: str, fields=(), warn=None):
        self.sweep_dir, self.experiment, self.fields = sweep_dir, experiment, tuple(fields)
        self.loggers: dict[str, TrialLogger | None] = {n: None for n in names if n != "none"}
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.open: set[str] = set()
        """Member trials whose runs are open."""
        self.named: dict[str, str] = {}
        """Run name -> the member trial that has it."""

    def each(self, method: str, *args) -> None:
        for name in list(self.loggers):
            try:
                logger = self.loggers[name]
                if logger is None and method == "close":
                    continue
                if logger is None:
                    logger = self.loggers[name] = LOGGER_CLASSES[name](
                        self.sweep_dir, self.experiment
                    )
                getattr(logger, method)(*args)
            except Exception as e:  # any tracker error: recorded, never the trial's failure
                del self.loggers[name]
                self.warn(
                    f"[scale-fpt] warning: the {name} logger failed and is off for the rest of "
                    f"{self.experiment} ({type(e).__name__}: {str(e).strip()[:300]})"
                )

    def name(self, trial_id: str, row: dict) -> str:
        """``run_name`` of the member trial, with its trial id where that name is taken (two
        searched values equal to six digits) or says nothing (no config)."""
        name = run_name(row, self.fields)
        if not name.strip(". ") or self.named.setdefault(name, trial_id) != trial_id:
            name = f"{name} {trial_id}".strip()
        return name

    def start(self, trial_id: str, row: dict | None) -> None:
        if trial_id not in self.open:
            self.open.add(trial_id)
            row = row or {}
            name = self.name(trial_id, row)
            self.each("start", trial_id, name, recorded_config(row), arm_of(row))

    def write(self, curve_rows: list[dict], trial_rows: list[dict]) -> None:
        configs = {row["trial_id"]: row for row in trial_rows}
        for row in curve_rows:
            self.start(row["trial_id"], configs.get(row["trial_id"]))
            scalars = {scalar_tag(c): row[c] for c in CURVE_SCALARS if number(row.get(c))}
            self.each("log", row["trial_id"], scalars, int(row["step"]))
        for row in trial_rows:
            self.start(row["trial_id"], row)
            if number(row.get("best_val_accuracy")):
                step = int(row.get("steps_done") or 0)
                self.each("log", row["trial_id"], {HPARAM_METRIC: row["best_val_accuracy"]}, step)
            if row.get("status") in ENDED:
                self.finish(row["trial_id"], row["status"], row)

    def finish(self, trial_id: str, status: str, row: dict | None = None) -> None:
        if trial_id in self.open:
            self.open.discard(trial_id)
            self.each("finish", trial_id, status, final_values(row or {}))

    def close(self) -> None:
        """Finish runs left open (an interrupted sweep: ``stopped``), then the loggers."""
        for trial_id in sorted(self.open):
            self.finish(trial_id, "stopped")
        self.each("close")


def tracking_callback_class():
    from ray import tune

    class TrackingCallback(tune.Callback):
        """Feeds each reported evaluation's rows to the sweep's loggers (``Trackers``)."""

        def __init__(self, sweep_dir: str, loggers: tuple[str, ...], experiment: str, fields=()):
            self.args = (sweep_dir, tuple(loggers), experiment, tuple(fields))
            self.trackers = Trackers(Path(sweep_dir), loggers, experiment, fields)
            self.members: dict[str, set[str]] = {}
            """Tune trial id -> the member trials its rows named."""

        def __getstate__(self):  # Tune pickles callbacks; open runs do not pickle
            return {"args": self.args}

        def __setstate__(self, state):
            self.__init__(*state["args"])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            rows = result.get("trial_rows", [])
            self.members.setdefault(trial.trial_id, set()).update(r["trial_id"] for r in rows)
            self.trackers.write(result.get("curve_rows", []), rows)

        def end_members(self, trial, status: str) -> None:
            for trial_id in sorted(self.members.pop(trial.trial_id, ())):
                self.trackers.finish(trial_id, status)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.end_members(trial, "stopped")  # still open: stopped by the scheduler

        def on_trial_error(self, iteration, trials, trial, **info):
            self.end_members(trial, "failed")

        def on_experiment_end(self, trials, **info):
            self.trackers.close()

    return TrackingCallback
