"""The one training loop: every trial, packed or alone, on any step kind, runs ``fit``.

    trial.TrialRun(configs) builds the task, one TrialState per member and a *step*:
        CohortStep  K >= 1 packable trials over one shared frozen backbone (plain torch);
                    an unpacked packable trial is K = 1
        EngineStep  one trial on a DeepSpeed engine (ZeRO, several workers, ff/attn/full
                    fine-tuning, fp16, LSTM, non-GPT-2 backbones)
        (``profile.step_kind`` decides; ``packing`` also decides which trials share a cohort)
    fit(step, states, train, position) owns everything between the steps:
        for each position < max_steps:  step.train_step(position)  (reads nothing on the host)
        at each of evaluation_steps(max_steps, eval_every, log_evals):
            one host read: every member's train-loss/accuracy sums and diverged_at
            members whose training loss went non-finite end ``diverged`` (their curve
                keeps every finite evaluation; steps_done = the steps before the
                non-finite one)
            evaluate the others on ``val`` and ``test`` -> one Evaluation each (a
                non-finite validation loss ends the member ``diverged`` instead; test is
                recorded, never read for a decision)
            members end at the budget (``max_steps``) or ``patience`` steps after their
                best validation accuracy; ended members leave the step
            on_eval(position, evaluated members)  (rows, Tune reports, checkpoints)

The step protocol (``Step`` below): the loop never looks inside a step, and a step never
decides when to evaluate, stop or checkpoint.

Checkpoints (one format for both step kinds): a directory with the step's own files
(``step.save``: trained tensors and optimiser state, never the frozen body, what resuming
needs), ``weights-<trial_id>.pt`` per member (``{"module": trained tensors named as in the
trial's own ``build_model`` module}`` at the member's selected evaluation: what the report
rebuilds a trial from, whichever step trained it) and ``progress.pt`` (written last):
format version, the members' trial ids, the loop position, every member's TrialState and
torch's global RNG state. Resuming at an evaluation gives exactly the curve of an
uninterrupted run (data and dropout masks are functions of (seed, step), not of process
state).

Every file of a checkpoint holds tensors and plain data only (dicts, lists, str, int, float,
None) and is read back with ``checkpoints.load_checkpoint_file``: torch's weights-only loader, which
refuses any other pickled object, because unpickling one can run code and results folders
travel between people and machines (``docs/security.md``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from scale_fpt.checkpoints import DamagedCheckpointError, load_checkpoint_file, weights_file
from scale_fpt.config import TrainConfig
from scale_fpt.confined import ResultsError, make_folders, printable, read_text, write_text
from scale_fpt.runtime import restore_rng, rng_state
from scale_fpt.steps import NEVER, MemberMetrics
from scale_fpt.tasks.base import EVAL_SPLITS
from scale_fpt.vocabulary import Status, StopReason

PROGRESS_FILE = "progress.pt"
CHECKPOINT_FORMAT = 1
LOG_EVAL_START = 100
"""Log-spaced evaluations start at this step (below it, ``eval_every`` resolves enough)."""
LOG_EVAL_MANTISSAS = (1, 1.5, 2, 3, 5, 7)
"""Log-spaced evaluations: these multiples of each power of ten from LOG_EVAL_START."""


class Step(Protocol):
    """What ``fit`` drives. Members are indices 0..size-1 of the step's trials."""

    size: int
    """K: the number of member trials."""
    rank: int
    """This process's rank in the trial's data-parallel world (0 in a world of one): every
    rank writes its part of the step's tensors, rank 0 alone the checkpoint's other files."""
    metrics: MemberMetrics
    """Device sums of the members' train loss and accuracy since the last evaluation
    (``take``), ``diverged_at`` (K,) (first step with a non-finite loss, NEVER if none) and
    ``last_loss`` (K,) (the latest step's losses; reading it syncs: tests and tools only)."""

    def set_active(self, members: list[int]) -> None:
        """Train and evaluate only ``members`` from now on (the others have ended)."""

    def train_step(self, step: int) -> None:
        """One optimiser step of every active member on its batch of ``step``; no host read,
        updates of members with a non-finite loss masked."""

    def evaluate(self, split: str) -> torch.Tensor:
        """(Ka, 2) [loss, accuracy] of the active members on ``split`` (on the device)."""

    def save(self, directory: str) -> None:
        """Write the step's tensors (trained weights, optimiser state, metrics) to
        ``directory``."""

    def member_weights(self, member: int) -> dict[str, torch.Tensor]:
        """The member's trained tensors under the names of its ``build_model`` module (CPU,
        float32): what ``weights-<trial_id>.pt`` holds for tools that rebuild one trial."""

    def restore(self, directory: str) -> None:
        """Read back what ``save`` wrote."""

    def close(self) -> None:
        """Free the step's memory."""


@dataclass
class Evaluation:
    """One row of a trial's learning curve."""

    step: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    test_loss: float
    test_accuracy: float
    samples_per_s: float
    wall_time_s: float


@dataclass
class TrialState:
    """Everything about a trial in progress that a checkpoint must carry besides weights."""

    step: int = 0
    status: str = Status.RUNNING.value
    stop_reason: str | None = None
    history: list[Evaluation] = field(default_factory=list)
    train_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def last(self) -> Evaluation | None:
        return self.history[-1] if self.history else None

    @property
    def running(self) -> bool:
        return self.status == Status.RUNNING

    def selected(self) -> Evaluation | None:
        """The evaluation with the best validation accuracy (the earliest on ties)."""
        return max(self.history, key=lambda e: e.val_accuracy, default=None)

    def best_val_accuracy(self) -> float:
        best = self.selected()
        return float("nan") if best is None else best.val_accuracy

    def best_test_accuracy(self) -> float:
        return max((e.test_accuracy for e in self.history), default=float("nan"))

    def steps_since_best(self) -> int:
        """Steps trained since the evaluation with the best validation accuracy (patience
        counts steps, not evaluations: on the log-spaced schedule evaluations thin out, so a
        count of evaluations would give a slow starter flat from step 100 only until 300)."""
        best = self.selected()
        return 0 if best is None else self.history[-1].step - best.step

    def steps_to_threshold(self, threshold: float) -> int | None:
        """The first evaluated step whose validation accuracy reaches ``threshold``."""
        return next((e.step for e in self.history if e.val_accuracy >= threshold), None)

    def end(self, reason: str) -> None:
        self.status = (Status.DIVERGED if reason == StopReason.DIVERGED else Status.COMPLETED).value
        self.stop_reason = StopReason(reason).value

    def to_dict(self) -> dict:
        return asdict(self)  # nested Evaluations become dicts too

    @classmethod
    def from_dict(cls, saved: dict) -> TrialState:
        return cls(**{**saved, "history": [Evaluation(**e) for e in saved["history"]]})


def evaluation_steps(max_steps: int, eval_every: int, log_evals: bool) -> list[int]:
    """The steps after which a trial evaluates: every ``eval_every``, the last step, and with
    ``log_evals`` also LOG_EVAL_MANTISSAS x 10^n from LOG_EVAL_START (100, 150, 200, 300,
    500, 700, 1000, 1500, ...), so steps-to-threshold resolves early differences that
    ``eval_every`` alone quantises."""
    steps = set(range(eval_every, max_steps + 1, eval_every)) | {max_steps}
    decade = LOG_EVAL_START
    while log_evals and decade <= max_steps:
        steps |= {int(decade * m) for m in LOG_EVAL_MANTISSAS if decade * m <= max_steps}
        decade *= 10
    return sorted(steps)


def fit(
    step: Step,
    states: list[TrialState],
    train: TrainConfig,
    position: int = 0,
    on_eval: Callable[[int, list[int]], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Train the running members of ``states`` from ``position`` to ``train.max_steps`` (or
    their end); returns the position reached. ``on_eval(position, evaluated)`` after each
    evaluation (``evaluated``: the members that got a new Evaluation); ``progress(position)``
    after every step (it must not read device values unless it accepts a sync)."""
    schedule = set(evaluation_steps(train.max_steps, train.eval_every, train.log_evals))
    running = [i for i, s in enumerate(states) if s.running]
    if running:
        step.set_active(running)
    steps_since = 0
    segment_start = train_start = time.perf_counter()
    while running and position < train.max_steps:
        step.train_step(position)
        position += 1
        steps_since += 1
        if progress:
            progress(position)
        if position not in schedule:
            continue
        # The host reads the device here (and below). On a GPU the steps were only queued:
        # reading their sums waits for them, so the clock is read after it, not before.
        sums = step.metrics.take().tolist()
        train_seconds = time.perf_counter() - train_start
        diverged_at = step.metrics.diverged_at.tolist()
        for i in running:
            states[i].train_seconds += train_seconds
            if diverged_at[i] != NEVER:
                states[i].step = diverged_at[i]
                states[i].end(StopReason.DIVERGED)
        alive = [i for i in running if states[i].running]
        evaluated = []
        if alive:
            if alive != running:
                step.set_active(alive)
            metrics = torch.cat([step.evaluate(split) for split in EVAL_SPLITS], 1).tolist()
        now = time.perf_counter()
        for i in running:
            states[i].wall_seconds += now - segment_start
        for i, (val_loss, val_accuracy, test_loss, test_accuracy) in zip(
            alive, metrics if alive else [], strict=True
        ):
            state = states[i]
            state.step = position
            if not math.isfinite(val_loss):
                # The last update left the model with non-finite outputs: this evaluation
                # means nothing, so the curve (and final_*) end at the one before. Test is
                # measured, never read for a decision: a non-finite test loss alone ends
                # nothing (and is recorded as it is).
                state.end(StopReason.DIVERGED)
                continue
            state.history.append(
                Evaluation(
                    step=position,
                    train_loss=sums[i][0] / steps_since,
                    train_accuracy=sums[i][1] / steps_since,
                    val_loss=val_loss,
                    val_accuracy=val_accuracy,
                    test_loss=test_loss,
                    test_accuracy=test_accuracy,
                    samples_per_s=steps_since * train.batch_size / max(train_seconds, 1e-9),
                    wall_time_s=state.wall_seconds,
                )
            )
            evaluated.append(i)
            if position == train.max_steps:
                state.end(StopReason.BUDGET)
            elif train.patience and state.steps_since_best() >= train.patience:
                state.end(StopReason.PATIENCE)
        running = [i for i in running if states[i].running]
        if running and running != alive:
            step.set_active(running)
        if on_eval:
            on_eval(position, evaluated)
        steps_since = 0
        segment_start = train_start = time.perf_counter()
    return position


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    directory: str,
    step: Step,
    states: list[TrialState],
    trial_ids: list[str],
    position: int,
    selected: dict[int, dict[str, torch.Tensor]] | None = None,
) -> None:
    """The step's tensors, then ``progress.pt`` (see the module docstring). Each member's
    ``weights-<trial_id>.pt`` holds ``selected[member]`` where given (its trained tensors at
    its selected evaluation, which the report rebuilds it from), else the current ones."""
    os.makedirs(directory, exist_ok=True)
    step.save(directory)
    for member, trial_id in enumerate(trial_ids):
        current = step.member_weights(member)  # collective under ZeRO-3: every rank, always
        weights = {"module": (selected or {}).get(member, current)}
        if step.rank == 0:
            torch.save(weights, os.path.join(directory, weights_file(trial_id)))
    if step.rank != 0:
        return
    progress = {
        "format": CHECKPOINT_FORMAT,
        "trial_ids": trial_ids,
        "position": position,
        "states": [s.to_dict() for s in states],
        **rng_state(),
    }
    torch.save(progress, os.path.join(directory, PROGRESS_FILE))


def restore_checkpoint(
    directory: str, step: Step, trial_ids: list[str]
) -> tuple[list[TrialState], int]:
    """(members' states, loop position) from a checkpoint of the same trials; the step's
    tensors and torch's RNG state are restored in place."""
    path = Path(directory) / PROGRESS_FILE
    if not path.is_file():
        raise DamagedCheckpointError([f"no trial checkpoint in {printable(directory)}"])
    try:
        progress = load_checkpoint_file(path)
        if progress["trial_ids"] != trial_ids:
            raise DamagedCheckpointError(
                [f"the checkpoint in {printable(directory)} belongs to other trials"]
            )
        step.restore(directory)
        restore_rng(progress)
        return [TrialState.from_dict(s) for s in progress["states"]], progress["position"]
    except ResultsError:
        raise  # refused or damaged: the file is named already
    except Exception as e:  # a torch file of other contents, a step file missing or foreign
        raise DamagedCheckpointError(
            [
                f"cannot restore the trial checkpoint in {printable(directory)} (damaged, "
                f"truncated or another program's files): {type(e).__name__}: "
                f"{printable(str(e))[:200]}"
            ]
        ) from None


class CheckpointDir:
    """Checkpoints of a command-line trial: ``step-N/`` directories and a ``latest`` pointer.

    The pointer is replaced atomically only after a checkpoint is complete, so a trial killed
    mid-save resumes from the previous one. The folder may be someone else's (a copied
    results folder): the pointer is only ever the name of a real ``step-N`` folder in it,
    anything else is refused in one line, so nothing outside is read or deleted."""

    POINTER = re.compile(r"step-[0-9]+")

    def __init__(self, directory: str):
        self.root = Path(directory)
        make_folders(self.root)

    def latest(self) -> str | None:
        pointer = self.root / "latest"
        if not os.path.lexists(pointer):
            return None
        name = read_text(pointer, limit=4096).strip()
        target = self.root / name
        if not self.POINTER.fullmatch(name) or os.path.islink(target) or not target.is_dir():
            raise ResultsError(
                [
                    f"{printable(str(pointer))} names {printable(name)!r}, not a step-N folder "
                    f"of {printable(str(self.root))}: refused (remove the pointer to start afresh)"
                ]
            )
        return str(target)

    def save(self, save: Callable[[str], None], step: int) -> None:
        """``save(directory)`` into ``step-N/``, then point ``latest`` at it."""
        previous = self.latest()
        name = f"step-{step}"
        target = self.root / name
        if os.path.islink(target):
            target.unlink()  # a planted link: removed, never followed
        shutil.rmtree(target, ignore_errors=True)
        save(str(target))
        write_text(self.root / "latest", name)
        if previous and Path(previous) != target:
            shutil.rmtree(previous, ignore_errors=True)
