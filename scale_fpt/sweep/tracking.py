"""Experiment trackers fed by the driver: TensorBoard event files per member trial.

The driver already receives every evaluation (``ResultsCallback``); the same rows go to
``RESULTS/<sweep>/tensorboard/<trial_id>/``: one scalar per curve metric at its step, and
the trial's config as TensorBoard hparams (with its best validation accuracy as the
hparams metric), so ``tensorboard --logdir RESULTS/<sweep>/tensorboard`` shows the curves
and compares arms in its HParams tab. Written on the driver, so it works the same on a
cluster (the results directory is shared storage there).
"""

from __future__ import annotations

import math
from pathlib import Path

LOGGERS = ("tensorboard", "none")
"""Values of ``SweepConfig.loggers``: ``none`` alone turns tracking off."""

CURVE_SCALARS = (
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "test_loss",
    "test_accuracy",
    "samples_per_s",
)
"""Curve columns written as TensorBoard scalars (tag ``<split>/<metric>``)."""

HPARAM_METRIC = "val/best_accuracy"
"""The hparams metric tag: the member's best validation accuracy so far (never test)."""


def scalar_tag(column: str) -> str:
    split, _, metric = column.partition("_")
    return f"{split}/{metric}"


def hparams_of(row: dict) -> dict:
    """The trial config fields of a trial row, as TensorBoard hparams (scalars only)."""
    from scale_fpt.config import FIELD_TYPES

    return {
        k: v
        for k, v in row.items()
        if k in FIELD_TYPES and isinstance(v, bool | int | float | str) and v == v
    }


class TensorBoardWriters:
    """One ``SummaryWriter`` per member trial under ``root``, opened on its first rows."""

    def __init__(self, root: Path):
        self.root = root
        self.writers: dict = {}

    def writer(self, trial_id: str, row: dict | None):
        if trial_id not in self.writers:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams

            writer = SummaryWriter(log_dir=str(self.root / trial_id))
            if row is not None:
                # The hparams' session records the config; the metric itself is the scalar
                # HPARAM_METRIC, written with every report.
                for summary in hparams(hparams_of(row), {HPARAM_METRIC: 0.0}):
                    writer.file_writer.add_summary(summary)
            self.writers[trial_id] = writer
        return self.writers[trial_id]

    def write(self, curve_rows: list[dict], trial_rows: list[dict]) -> None:
        configs = {row["trial_id"]: row for row in trial_rows}
        for row in curve_rows:
            writer = self.writer(row["trial_id"], configs.get(row["trial_id"]))
            for column in CURVE_SCALARS:
                value = row.get(column)
                if isinstance(value, int | float) and not math.isnan(value):
                    writer.add_scalar(scalar_tag(column), value, row["step"])
        for row in trial_rows:
            best = row.get("best_val_accuracy")
            if isinstance(best, int | float) and not math.isnan(best):
                step = int(row.get("steps_done") or 0)
                self.writer(row["trial_id"], row).add_scalar(HPARAM_METRIC, best, step)
            if row.get("status") in ("completed", "diverged", "failed", "stopped"):
                self.close(row["trial_id"])

    def close(self, trial_id: str | None = None) -> None:
        for key in [trial_id] if trial_id else list(self.writers):
            writer = self.writers.pop(key, None)
            if writer is not None:
                writer.close()


def tracking_callback_class():
    from ray import tune

    class TensorBoardCallback(tune.Callback):
        """Writes each reported evaluation's rows as TensorBoard event files."""

        def __init__(self, sweep_dir: str):
            self.sweep_dir = sweep_dir
            self.writers = TensorBoardWriters(Path(sweep_dir) / "tensorboard")

        def __getstate__(self):  # Tune pickles callbacks; open files do not pickle
            return {"sweep_dir": self.sweep_dir}

        def __setstate__(self, state):
            self.__init__(state["sweep_dir"])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.writers.write(result.get("curve_rows", []), result.get("trial_rows", []))

        def on_experiment_end(self, trials, **info):
            self.writers.close()

    return TensorBoardCallback
