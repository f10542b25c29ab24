"""The seven tasks of the paper, built by name: ``build_task(config, seed)``.

Task modules are imported when a task is built, so importing ``scale_fpt.tasks`` stays
cheap (the image tasks pull in ``datasets`` only when they load data).
"""

from __future__ import annotations

import importlib

from scale_fpt.config import TASKS, ConfigError, TaskConfig, choice_problem
from scale_fpt.tasks.base import (
    Batch,
    DataUnavailable,
    Task,
    TaskSpec,
    epoch_indices,
    release_device_draws,
    split_batch,
    step_draws,
)
from scale_fpt.tasks.pool import FixedPool

__all__ = [
    "Batch",
    "DataUnavailable",
    "Task",
    "TaskSpec",
    "build_task",
    "epoch_indices",
    "release_device_draws",
    "split_batch",
    "step_draws",
    "task_class",
    "task_spec",
]

# task name -> (module, class); the module is imported on first use.
_REGISTRY = {
    "bit-memory": ("scale_fpt.tasks.bits", "BitMemory"),
    "bit-xor": ("scale_fpt.tasks.bits", "BitXor"),
    "listops": ("scale_fpt.tasks.listops", "ListOps"),
    "mnist": ("scale_fpt.tasks.images", "ImageClassification"),
    "cifar10": ("scale_fpt.tasks.images", "ImageClassification"),
    "cifar10-lra": ("scale_fpt.tasks.images", "ImageClassification"),
    "homology": ("scale_fpt.tasks.homology", "RemoteHomology"),
}
assert set(_REGISTRY) == set(TASKS)

# step_draws stream of the per-epoch data order (other streams: see each task module).


def task_class(name: str) -> type[Task]:
    """The Task subclass that implements ``name``; ConfigError for an unknown name."""
    if name not in _REGISTRY:
        raise ConfigError([choice_problem("task", name, TASKS)])
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


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
