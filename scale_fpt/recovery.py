"""Rows a sweep's Parquet results lack, re-derived from Ray Tune's own record of the sweep.

Tune keeps every report of a trial in its ``result.json`` (with the rows each report
carried) and each trial's status in the experiment state. Before a resumed sweep
(``--resume``) continues, ``restore_missing_rows`` puts back what the results directory
lacks: curve steps missing from a trial's file or held in a damaged (unreadable) one, and
trial rows missing or damaged, of finished and unfinished trials alike. The rows are written
by the driver's results callback itself, so they are the rows it wrote the first time (a
finished trial's final status and checkpoint, a failed one's error text).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

TUNE_RESULTS_FILE = "result.json"


log = logging.getLogger(__name__)


def tune_reports(trial_dir: str | Path) -> list[dict]:
    """Every result Tune recorded for a trial, in order (one JSON line per report); a line
    cut short by a killed driver is skipped."""
    reports = []
    with contextlib.suppress(FileNotFoundError), open(Path(trial_dir, TUNE_RESULTS_FILE)) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                reports.append(json.loads(line))
    return reports


def logged_rows(reports: list[dict]) -> tuple[dict[str, dict[int, dict]], dict[str, dict]]:
    """(curve rows by trial id and step, the last trial row by trial id) of a Tune trial's
    reports (one trial's, or a packed cohort's members'); a step reported again after a
    retry keeps its last report, as the results callback does."""
    curves: dict[str, dict[int, dict]] = {}
    last_rows: dict[str, dict] = {}
    for report in reports:
        for row in report.get("curve_rows", []):
            curves.setdefault(row["trial_id"], {})[row["step"]] = row
        for row in report.get("trial_rows", []):
            last_rows[row["trial_id"]] = row
    return curves, last_rows


def restore_missing_rows(callback, experiment_path: str) -> set[str]:
    """Write, through the driver's results ``callback`` (``sweep.results_callback_class``),
    every row of the experiment at ``experiment_path`` that Tune logged and the results
    directory lacks. Returns the ids of the trials (scale_fpt's) whose rows were put back."""
    from ray.tune import ExperimentAnalysis

    writer = callback.writer
    restored = set()
    try:
        trials = ExperimentAnalysis(experiment_path).trials
    except (OSError, ValueError) as e:
        # A driver killed while Tune rewrote its state file leaves one that does not parse;
        # Tune restores from its own copy, and rows not re-derived now are rewritten as the
        # resumed trials report.
        log.warning("cannot re-derive rows from %s (%s); resuming without", experiment_path, e)
        return restored
    for trial in trials:
        curves, last_rows = logged_rows(tune_reports(trial.path))
        for trial_id, logged in curves.items():
            on_disk = writer.curve_steps(trial_id)
            missing = [logged[step] for step in sorted(logged) if step not in on_disk]
            if missing:
                writer.write_curve(trial_id, missing)
                restored.add(trial_id)
        lost = [row for trial_id, row in last_rows.items() if writer.status(trial_id) is None]
        if not lost:
            continue
        restored.update(row["trial_id"] for row in lost)
        lost = callback.tagged(trial, lost)  # a search's rows: their search_config
        callback.last_rows[trial.trial_id] = lost
        if trial.status == "TERMINATED":
            callback.write_complete(trial)
        elif trial.status == "ERROR":
            callback.write_error(trial)
        else:  # unfinished: its row stays running until the resumed trial reports
            for row in lost:
                writer.write_trial(row)
    return restored
