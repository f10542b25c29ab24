"""What a running sweep shows on the driver: its state as it changes, each failure at once.

On a terminal a status block is redrawn in place about once a second; elsewhere (cluster
logs, ``ray job logs``, a file) plain lines are written every ``SCALE_FPT_PROGRESS_EVERY``
seconds (default 30) and when the experiment ends. Both show the Tune trials done, running,
pending and failed, member trial-steps per second, an ETA from the planned steps, and the
best validation accuracy so far of each arm (seeds pooled). A finished member trial gets one
line (its validation and test accuracy), a failed or diverged one its error in one line, as
it happens.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from scale_fpt.confined import printable
from scale_fpt.sweep.trainable import tune_members
from scale_fpt.trial import config_trial_id, without_search_configs
from scale_fpt.vocabulary import ARM_LABEL_FIELDS, ENDED, Status

PLAIN_EVERY_S = 30.0
"""Seconds between plain status lines when the output is not a terminal."""

TERMINAL_EVERY_S = 1.0
"""Seconds between redraws of the status block on a terminal."""

MAX_ARM_LINES = 12
"""Arms shown in the terminal block (the best-known ones of a large sweep)."""


def duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def one_line(error: str) -> str:
    """The exception line of an error text: the last line of a Python traceback (Tune's
    error files), else the first (``trial.error_text``: the exception, then where)."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    traceback = any(line.startswith("Traceback (most recent call last)") for line in lines)
    # Printed to a terminal: an error may quote a results folder's text (escape sequences).
    return printable((lines[-1] if traceback else lines[0])[:300])


def arm_of(row: dict) -> str:
    """The arm of a row as ``task/model/init/finetune``: the seeds of one arm share a line."""
    return "/".join(str(row[k]) for k in ARM_LABEL_FIELDS if row.get(k) is not None)


class SweepProgress:
    """The state of one Tune experiment as the driver sees it, and its rendering.

    ``planned_steps``: the member trial-steps the experiment will train in all (the sum of
    ``max_steps`` over its members), for the ETA; 0 when unknown."""

    def __init__(self, name: str, planned_steps: int, stream=None, every_s: float | None = None):
        self.name, self.planned_steps = name, planned_steps
        self.stream = stream or sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        if every_s is None:
            every_s = (
                TERMINAL_EVERY_S
                if self.terminal
                else float(os.environ.get("SCALE_FPT_PROGRESS_EVERY", PLAIN_EVERY_S))
            )
        self.every_s = every_s
        self.started = time.monotonic()
        self.last_shown = self.started
        self.steps: dict[str, int] = {}
        """Member trial id -> steps done."""
        self.ended: dict[str, str] = {}
        """Member trial id -> its final status, once announced."""
        self.best: dict[str, float] = {}
        """Arm -> best validation accuracy so far."""
        self.counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}
        self.drawn_lines = 0
        self.state_saves = 0
        """Ray Tune's saves of the experiment state (each writes every trial's state)."""

    def __getstate__(self):  # Tune pickles callbacks; a stream does not pickle
        return {"name": self.name, "planned_steps": self.planned_steps, "every_s": None}

    def __setstate__(self, state):
        self.__init__(state["name"], state["planned_steps"])

    # --- what Tune tells the driver -------------------------------------------------------

    def update_trials(self, trials: list[tuple[str, list[str]]]) -> None:
        """Counts of member trials from the experiment's Tune trials, given as (Tune status,
        member trial ids): a member whose end was reported counts by its own status
        (diverged is an outcome, done; failed is failed), the others by their Tune
        trial's (a Tune trial that errored fails every member it had not finished)."""
        counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}
        for status, members in trials:
            for member in members:
                ended = self.ended.get(member)
                if ended is not None:
                    counts["failed" if ended == "failed" else "done"] += 1
                elif status == "TERMINATED":
                    counts["done"] += 1
                elif status == "ERROR":
                    counts["failed"] += 1
                elif status == "RUNNING":
                    counts["running"] += 1
                else:  # PENDING, PAUSED
                    counts["pending"] += 1
        self.counts = counts

    def add_rows(self, rows: list[dict]) -> None:
        """A report's trial rows (one per member): steps, best accuracy, and a line for each
        member that finished, diverged or failed since the last report."""
        for row in rows:
            member = row["trial_id"]
            self.steps[member] = int(row.get("steps_done") or 0)
            best = row.get("best_val_accuracy")
            if best is not None and best == best:  # not NaN: at least one evaluation
                arm = arm_of(row)
                self.best[arm] = max(best, self.best.get(arm, 0.0))
            status = row.get("status")
            if status in ENDED and member not in self.ended:
                self.ended[member] = status
                self.say(self.member_line(row))

    def trial_failed(self, trial_id: str, members: list[str], error: str) -> None:
        """A Tune trial's process failed: one line naming it, its members and its error."""
        for member in members:
            self.ended.setdefault(member, "failed")
        who = ", ".join(members) if members else trial_id
        self.say(f"[scale-fpt] FAILED {who}: {one_line(error)}")

    # --- rendering --------------------------------------------------------------------------

    def member_line(self, row: dict) -> str:
        arm = arm_of(row)
        lr = row.get("lr")
        lr_text = f", lr {lr:g}" if isinstance(lr, int | float) else ""
        where = f"{row['trial_id']} ({arm}, seed {row.get('seed')}{lr_text})"
        if row["status"] in (Status.COMPLETED, Status.STOPPED):
            return (
                f"[scale-fpt] {'done' if row['status'] == 'completed' else 'stopped'} {where}: val {row.get('val_accuracy', float('nan')):.3f}, "
                f"test {row.get('test_accuracy', float('nan')):.3f} at step "
                f"{row.get('selected_step')} of {row.get('steps_done')}"
            )
        reason = one_line(row.get("error") or row.get("stop_reason") or row["status"])
        return (
            f"[scale-fpt] {row['status'].upper()} {where} at step {row.get('steps_done')}: {reason}"
        )

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return sum(self.steps.values()) / elapsed if elapsed > 0 else 0.0

    def status_line(self) -> str:
        c = self.counts
        rate = self.rate()
        done_steps = sum(self.steps.values())
        eta = ""
        if self.planned_steps and rate > 0:
            eta = f", ETA {duration((self.planned_steps - done_steps) / rate)}"
        saves = f"; experiment state saved {self.state_saves} times" if self.state_saves else ""
        return (
            f"[scale-fpt] {self.name}: trials {c['done']} done, {c['running']} running, "
            f"{c['pending']} pending, {c['failed']} failed; {rate:,.1f} trial-steps/s"
            f"{eta}; elapsed {duration(time.monotonic() - self.started)}{saves}"
        )

    def best_arms(self, limit: int | None = None) -> tuple[list[tuple[str, float]], int]:
        """The ``limit`` arms of best validation accuracy, best first, and how many more."""
        ranked = sorted(self.best.items(), key=lambda item: -item[1])
        shown = ranked if limit is None else ranked[:limit]
        return shown, len(ranked) - len(shown)

    def arm_lines(self, limit: int | None = None) -> list[str]:
        shown, more = self.best_arms(limit)
        lines = [f"  best val acc {acc:.3f}  {arm}" for arm, acc in shown]
        return lines + ([f"  ... and {more} more arms"] if more else [])

    def tick(self, force: bool = False) -> None:
        """Show the state if ``every_s`` passed since it was last shown (or ``force``)."""
        now = time.monotonic()
        if not force and now - self.last_shown < self.every_s:
            return
        self.last_shown = now
        if self.terminal:
            self.draw([self.status_line(), *self.arm_lines(MAX_ARM_LINES)])
        else:
            # One line per interval whatever the sweep's size: the best arms, not every arm.
            shown, more = self.best_arms(MAX_ARM_LINES)
            best = "; ".join(f"{arm} {acc:.3f}" for arm, acc in shown)
            best += f"; ... and {more} more arms" if more else ""
            self.say(self.status_line() + (f"; best val acc: {best}" if best else ""))

    def draw(self, lines: list[str]) -> None:
        """Replace the block drawn last with ``lines`` (ANSI cursor-up and erase-line)."""
        erase = "\x1b[1A\x1b[2K" * self.drawn_lines
        self.stream.write(erase + "".join(line + "\n" for line in lines))
        self.stream.flush()
        self.drawn_lines = len(lines)

    def say(self, line: str) -> None:
        """A line that stays (above the redrawn block on a terminal)."""
        if self.terminal and self.drawn_lines:
            self.stream.write("\x1b[1A\x1b[2K" * self.drawn_lines)
            self.drawn_lines = 0
        self.stream.write(line + "\n")
        self.stream.flush()


def trial_error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        return Path(path).read_text()[-4000:]
    return str(getattr(trial, "error_msg", None) or "trial failed")


def progress_callback_class():
    from ray import tune

    class ProgressCallback(tune.Callback):
        """Feeds ``SweepProgress`` from Tune's driver events."""

        def __init__(self, name: str, planned_steps: int):
            self.progress = SweepProgress(name, planned_steps)
            self.member_ids: dict[str, list[str]] = {}

        def __getstate__(self):  # Tune pickles callbacks into its experiment state
            return {"progress": self.progress, "member_ids": {}}

        def members(self, trial) -> list[str]:
            """The member trial ids of a Tune trial (the ids of its Parquet rows)."""
            if trial.trial_id not in self.member_ids:
                sweep, members = tune_members(without_search_configs(trial.config))
                self.member_ids[trial.trial_id] = [config_trial_id(sweep, m) for m in members]
            return self.member_ids[trial.trial_id]

        def states(self, trials) -> list[tuple[str, list[str]]]:
            return [(trial.status, self.members(trial)) for trial in trials]

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.progress.last_shown >= self.progress.every_s:
                self.progress.update_trials(self.states(trials))
                self.progress.tick()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.progress.add_rows(result.get("trial_rows", []))

        def get_state(self):
            # Tune asks every callback for its state at each save of the experiment state.
            self.progress.state_saves += 1
            return None

        def on_trial_error(self, iteration, trials, trial, **info):
            ids = [m for m in self.members(trial) if m not in self.progress.ended]
            self.progress.trial_failed(trial.trial_id, ids, trial_error_text(trial))

        def on_experiment_end(self, trials, **info):
            self.progress.update_trials(self.states(trials))
            self.progress.tick(force=True)
            if self.progress.terminal:  # the block stays as the experiment's last word
                self.progress.drawn_lines = 0

    return ProgressCallback
