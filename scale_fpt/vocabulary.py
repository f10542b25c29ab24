"""The words a trial's rows and a sweep's code share, one meaning each.

- a **trial**: one configuration trained for one seed (one row of ``trials``);
- an **arm**: one configuration over its seeds (the report's unit: its statistics are over
  the seeds of an arm);
- a **cohort**: trials trained together on one step (``packing``);
- a **step kind**: the step object a trial trains on (``StepKind``).

The enums are ``str``-valued and compare equal to their values; rows, checkpoints and
trackers get the plain value (``Status.COMPLETED.value``: ``"completed"``), so Parquet, W&B
and MLflow see the same strings as before the words were named.
"""

from __future__ import annotations

from enum import StrEnum

CONFIRM_SUFFIX = "-confirm"
"""The confirmation runs of sweep NAME are the sweep NAME-confirm."""

ARM_LABEL_FIELDS = ("task", "model", "init", "finetune")
"""The fields an arm goes by where a person reads it: the driver's progress and closing
summary, the trackers' run names and groups (its whole design, for the report:
``report.tables.cells.ARM_KEYS``)."""


class Status(StrEnum):
    """A trial's ``status`` column."""

    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"
    STOPPED = "stopped"
    """Stopped early by a scheduler (ASHA) or by the user."""
    RUNNING = "running"
    """Not ended yet: the rows written while a trial trains."""


ENDED = (Status.COMPLETED, Status.DIVERGED, Status.FAILED, Status.STOPPED)
"""The statuses of a trial that has ended (``running`` is the only other)."""


class StopReason(StrEnum):
    """Why a trial ended (its ``stop_reason`` column)."""

    BUDGET = "budget"
    """It ran its ``max_steps``."""
    PATIENCE = "patience"
    """No better validation accuracy for ``patience`` evaluations."""
    DIVERGED = "diverged"
    """Its loss was not finite."""
    SCHEDULER = "scheduler"
    """Ray Tune's scheduler stopped it."""
    FAILED = "failed"
    """An error ended it."""


class StepKind(StrEnum):
    """The step a trial trains on."""

    COHORT = "cohort"
    """``steps.cohort.CohortStep``: K >= 1 trials over one frozen body, plain torch."""
    ENGINE = "engine"
    """``steps.engine.EngineStep``: one DeepSpeed engine."""
