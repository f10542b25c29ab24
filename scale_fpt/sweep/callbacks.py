"""The driver's side of a sweep: the Tune callback that writes each reported evaluation to
Parquet as it arrives and compacts ended trials' rows as the sweep goes, and the handling of
writes that fail."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
import weakref
from pathlib import Path

from scale_fpt.compaction import recover
from scale_fpt.results import ResultsError, ResultsWriter
from scale_fpt.sweep.config import SweepConfig
from scale_fpt.sweep.progress import progress_callback_class, trial_error_text
from scale_fpt.sweep.tracking import tracking_callback_class
from scale_fpt.sweep.trainable import config_only_row, tune_members
from scale_fpt.trial import SEARCH_CONFIG, member_search_configs, without_search_configs
from scale_fpt.vocabulary import Status, StopReason

log = logging.getLogger(__name__)

COMPACT_EVERY_TRIALS = 256
COMPACT_EVERY_S = 600.0
"""The driver compacts in the background once this many trials ended, or this long after
the last compaction with any ended since; and once more when the experiment ends."""

WRITE_FAILURES: list[ResultsError] = []
"""Results writes that failed in this driver (a full disk, a directory gone read-only). Tune
turns an exception in a callback into a TuneError holding only traceback text; the sweep
re-raises the ResultsError itself from here, so the user gets its one-line message."""


def results_callback_class():
    from ray import tune

    class ResultsCallback(tune.Callback):
        """Writes each reported evaluation to Parquet on the driver, as it arrives. A failed
        write stops the sweep (``run_sweep`` raises its ResultsError; ``--resume`` continues
        once the directory takes writes again): rows that cannot be recorded are not run."""

        def __init__(self, writer: ResultsWriter):
            self.results_dir, self.sweep = str(writer.root.parent), writer.sweep
            self.last_rows: dict[str, dict] = {}
            self.search_configs: dict[str, dict[str, int]] = {}
            self._writer: ResultsWriter | None = writer
            self._compactor: Compactor | None = None

        def __getstate__(self):  # Tune pickles callbacks into its experiment state
            return {
                "results_dir": self.results_dir,
                "sweep": self.sweep,
                "last_rows": {},
                "search_configs": {},
            }

        def __setstate__(self, state):
            self.__dict__.update(state, _writer=None, _compactor=None)

        @property
        def writer(self) -> ResultsWriter:
            return self.opened()[0]

        @property
        def compactor(self) -> Compactor:
            return self.opened()[1]

        def opened(self) -> tuple[ResultsWriter, Compactor]:
            """The writer (the driver's; an unpickled copy makes its own) and its compactor,
            made on first use. Only the driver makes its callbacks, holding the sweep's
            driver lock: what a killed compaction left is removed first."""
            if self._writer is None:
                self._writer = ResultsWriter(self.results_dir, self.sweep)
            if self._compactor is None:
                recover(self._writer.root)
                self._compactor = Compactor(self._writer)
            return self._writer, self._compactor

        def on_trial_result(self, iteration, trials, trial, result, **info):
            with recording_write_failures():
                self.write_result(trial, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            with recording_write_failures():
                self.write_complete(trial)
            self.ended(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            with recording_write_failures():
                self.write_error(trial)
            self.ended(trial)

        def ended(self, trial) -> None:
            # Nothing of an ended trial stays in memory (a sweep of 10^5 trials).
            ids = [row["trial_id"] for row in self.reported_rows(trial)]
            self.last_rows.pop(trial.trial_id, None)
            self.search_configs.pop(trial.trial_id, None)
            with recording_write_failures():
                self.compactor.ended(ids)

        def on_experiment_end(self, trials, **info):
            with recording_write_failures():
                self.compactor.finish()

        def tagged(self, trial, rows: list[dict]) -> list[dict]:
            """Rows with the search configuration each belongs to (None for grid trials)."""
            if trial.trial_id not in self.search_configs:
                self.search_configs[trial.trial_id] = member_search_configs(
                    self.sweep, trial.config
                )
            numbers = self.search_configs[trial.trial_id]
            return [{**row, SEARCH_CONFIG: numbers.get(row["trial_id"])} for row in rows]

        def write_result(self, trial, result):
            # A Tune trial reports lists of rows: one trial's, or a packed cohort's.
            for row in result.get("curve_rows", []):
                self.writer.write_curve(row["trial_id"], [row])
            rows = self.tagged(trial, result.get("trial_rows", []))
            for row in rows:
                self.writer.write_trial(row)
            if rows:
                self.last_rows[trial.trial_id] = rows

        def reported_rows(self, trial) -> list[dict]:
            return self.last_rows.get(trial.trial_id) or self.tagged(
                trial, trial.last_result.get("trial_rows", [])
            )

        def write_complete(self, trial):
            checkpoint = trial.checkpoint.path if trial.checkpoint else None
            for row in self.reported_rows(trial):
                # "running" at the end: stopped by the scheduler before its last step.
                if row["status"] == Status.RUNNING:
                    row = {
                        **row,
                        "status": Status.STOPPED.value,
                        "stop_reason": StopReason.SCHEDULER.value,
                    }
                self.writer.write_trial({**row, "checkpoint": checkpoint})

        def write_error(self, trial):
            error = trial_error_text(trial)
            rows = self.reported_rows(trial)
            if not rows:  # never reported: every member fails with the trial's error
                _, members = tune_members(without_search_configs(trial.config))
                failed = [config_only_row(self.sweep, m, "failed", error) for m in members]
                rows = self.tagged(trial, failed)
            for row in rows:
                if row["status"] in (Status.RUNNING, Status.FAILED):
                    failed = {"status": "failed", "stop_reason": "failed", "error": error}
                    self.writer.write_trial({**row, **failed})

    return ResultsCallback


class Compactor:
    """Compacts a sweep's ended trials (``ResultsWriter.compact``) in a background thread
    while the driver writes: every ``COMPACT_EVERY_TRIALS`` ended trials or
    ``COMPACT_EVERY_S`` seconds, and at the end (``finish``). A trial written again while
    a compaction reads it stays in its own file until the next one (``finish`` takes all)."""

    def __init__(self, writer: ResultsWriter):
        self.writer = writer
        self.pending: set[str] = set()
        self.last = time.monotonic()
        self.thread: threading.Thread | None = None

    def ended(self, trial_ids: list[str]) -> None:
        for trial_id in trial_ids:
            self.writer.forget(trial_id)
        self.pending.update(trial_ids)
        due = len(self.pending) >= COMPACT_EVERY_TRIALS or (
            self.pending and time.monotonic() - self.last >= COMPACT_EVERY_S
        )
        if due and (self.thread is None or not self.thread.is_alive()):
            batch, self.pending = self.pending, set()
            self.last = time.monotonic()
            self.thread = threading.Thread(
                target=self.compact, args=(batch,), name="scale-fpt-compact", daemon=True
            )
            self.thread.start()

    def compact(self, trial_ids: set[str] | None) -> None:
        try:
            self.writer.compact(trial_ids)
        except (OSError, ResultsError) as e:
            # The rows stay in their own files (every trial still once); the next
            # compaction, or the next run, tries again.
            log.warning(f"scale-fpt: warning: compacting {self.writer.root} failed: {e}")

    def finish(self) -> None:
        """Wait for a compaction under way, then compact every ended trial."""
        if self.thread is not None:
            self.thread.join()
        self.pending.clear()
        self.compact(None)


class recording_write_failures:
    """Context manager: a ResultsError raised inside is kept in WRITE_FAILURES (and raised)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if isinstance(error, ResultsError):
            WRITE_FAILURES.append(error)
        return False


def fit_reporting_write_failures(tuner):
    """``tuner.fit()``; a sweep stopped by a failed results write raises that ResultsError."""
    from ray.tune.error import TuneError

    WRITE_FAILURES.clear()
    try:
        return tuner.fit()
    except TuneError:
        if WRITE_FAILURES:
            raise WRITE_FAILURES[0] from None
        raise


def driver_callbacks_class():
    from ray.tune.callback import CallbackList

    class DriverCallbacks(CallbackList):
        """This driver's callbacks as one Tune callback (``CallbackList`` hands each event
        to each in turn). Tune pickles its callbacks into the experiment state and
        ``Tuner.restore`` brings those back (it takes none): this one pickles as a reference
        (``restored_callbacks``), so a restored experiment writes where the command restoring
        it says, not where the saved state was written."""

        def __init__(self, results_dir: str, callbacks: list):
            super().__init__(callbacks)
            self.results_dir = results_dir
            self.token = secrets.token_hex(8)
            LIVE[self.token] = self

        @property
        def results(self):
            """The results callback (the first)."""
            return self[0]

        def on_trial_result(self, **info):
            super().on_trial_result(**info)
            # Its curve rows are written (Parquet, Tune's result.json) and shown; Tune keeps
            # each trial's last result in memory for the whole sweep and writes all of them
            # at each save of the experiment state (a one-evaluation trial's: 27 -> 25 KB).
            info["result"].pop("curve_rows", None)

        def __reduce__(self):
            return restored_callbacks, (self.token, self.results_dir)

    return DriverCallbacks


LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
"""This process's driver callbacks by token (a copy of one, in this process, is itself)."""
SERVING: list = []
"""The driver callbacks of the experiment this process is restoring (``serving``)."""
RESTORED_FROM: list[str] = []
"""The results directories the driver callbacks in a restored experiment state wrote to."""


def restored_callbacks(token: str, results_dir: str):
    """What a pickled ``DriverCallbacks`` becomes: in a driver restoring the experiment
    (``serving``), that driver's callbacks (the same process may have made the saved ones);
    else itself in the process that made it (a copy); elsewhere (a reader of the state),
    callbacks that do nothing."""
    if SERVING:
        RESTORED_FROM.append(str(Path(results_dir).absolute()))
        return SERVING[-1]
    if token in LIVE:
        return LIVE[token]
    return driver_callbacks_class()(results_dir, [])


@contextlib.contextmanager
def serving(callbacks):
    """While restoring a Tune experiment: its saved driver callbacks become ``callbacks``."""
    SERVING.append(callbacks)
    RESTORED_FROM.clear()
    try:
        yield
    finally:
        SERVING.pop()


def sweep_callbacks(
    writer: ResultsWriter, planned_steps: int = 0, loggers: tuple[str, ...] = (), fields=()
):
    """The driver's callbacks (``DriverCallbacks``) of the experiment whose rows ``writer``
    writes: our own rows first, Tune's result.json (its ResultGrid reads it, and
    ``recovery`` re-derives lost rows from it), the live progress (``planned_steps``: its
    member trial-steps, for the ETA) and the trackers of ``loggers``, whose runs are named
    by ``fields`` (``SweepConfig.varying_fields``). (Tune's own TensorBoard and CSV loggers
    would only warn about the nested row lists; ``tracking`` logs per member trial
    instead.)"""
    from ray.tune.logger import JsonLoggerCallback

    callbacks = [
        results_callback_class()(writer),
        JsonLoggerCallback(),
        progress_callback_class()(writer.sweep, planned_steps),
    ]
    if set(loggers) - {"none"}:
        tracking = tracking_callback_class()
        callbacks.append(tracking(str(writer.root), loggers, writer.sweep, fields))
    return driver_callbacks_class()(str(writer.root.parent), callbacks)


def refuse_moved_search(sweep: SweepConfig, callbacks) -> None:
    """After restoring: a search whose saved state wrote to another results directory is
    refused; its restored Optuna searcher keeps the study in that directory's default
    database (a grid writes where this command says: ``DriverCallbacks``)."""
    stored = set(RESTORED_FROM) - {callbacks.results_dir}
    if sweep.search and not sweep.optuna_storage and stored:
        raise ResultsError(
            [
                f"--resume: the Ray Tune state in {sweep.ray_storage} belongs to the search "
                f"with results in {', '.join(sorted(stored))}, whose Optuna study is there; "
                f"resume it with --results {', '.join(sorted(stored))}"
            ]
        )
