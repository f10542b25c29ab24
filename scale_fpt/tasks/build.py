"""Tasks built by name: ``build_task(config, seed)``, the class of a name and its shapes."""

from __future__ import annotations

from scale_fpt.config import ConfigError, TaskConfig, choice_problem
from scale_fpt.task_registry import TASKS
from scale_fpt.tasks.base import Task, TaskSpec
from scale_fpt.tasks.pool import FixedPool


def task_class(name: str) -> type[Task]:
    """The Task subclass that implements ``name``; ConfigError for an unknown name."""
    if name not in TASKS:
        raise ConfigError([choice_problem("task", name, TASKS)])
    return TASKS[name].task_class()


def task_spec(config: TaskConfig) -> TaskSpec:
    """The shapes of ``config.task`` without loading any data (for planning and model setup)."""
    return task_class(config.task).spec_for(config)


def build_task(config: TaskConfig, seed: int) -> Task:
    """The task of ``config`` for trial ``seed``; its data is loaded (or generated) now, so a
    missing dataset fails here with :class:`DataUnavailable` rather than mid-training.
    ``config.train_examples`` > 0 limits training to that many examples (``tasks.pool``)."""
    task = task_class(config.task)(config, seed)
    if config.train_examples:
        return FixedPool(task, config.train_examples)
    return task
