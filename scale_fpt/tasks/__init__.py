"""The seven tasks of the paper, built by name: ``build_task(config, seed)``.

Task modules are imported when a task is built, so importing ``scale_fpt.tasks`` stays
cheap (the image tasks pull in ``datasets`` only when they load data).
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch

from scale_fpt.config import TASKS, ConfigError, TaskConfig, choice_problem
from scale_fpt.tasks.base import Batch, DataUnavailable, Task, TaskSpec, step_draws

__all__ = [
    "Batch",
    "DataUnavailable",
    "Task",
    "TaskSpec",
    "build_task",
    "epoch_indices",
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
PERMUTATION_STREAM = 1


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
        from scale_fpt.tasks.pool import FixedPool

        return FixedPool(task, config.train_examples)
    return task


@lru_cache(maxsize=512)  # a packed cohort of K members reads K seeds' current epochs
def _permutation(seed: int, epoch: int, n: int, device: torch.device) -> torch.Tensor:
    return step_draws(seed, epoch, PERMUTATION_STREAM, device).permutation(n)


def release_device_draws() -> None:
    """Drop the cached epoch permutations: they live on the trial's device (a GPU's memory
    would otherwise stay held by a finished trial in a reused Ray actor)."""
    _permutation.cache_clear()


def epoch_indices(
    seed: int, step: int, batch_size: int, n: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Dataset indices of training batch ``step``: (batch_size,) long on ``device``.

    The examples are read in epochs, each a fresh permutation of ``range(n)`` drawn from
    (seed, epoch). Batch ``step`` takes positions ``step*B .. step*B+B-1`` of that endless
    stream, so every example is seen exactly once per epoch and a batch that straddles an
    epoch boundary ends one permutation and starts the next. The epochs are known on the
    host and each permutation is made once on the device: nothing is read back.
    """
    device = torch.device(device)
    start, end = step * batch_size, (step + 1) * batch_size
    parts = []
    for epoch in range(start // n, (end - 1) // n + 1):
        first, last = max(start, epoch * n), min(end, (epoch + 1) * n)
        parts.append(_permutation(seed, epoch, n, device)[first - epoch * n : last - epoch * n])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def split_batch(batch: Batch, batch_size: int):
    """Consecutive batches of at most ``batch_size`` examples of ``batch`` (views, in order)."""
    for start in range(0, len(batch), batch_size):
        rows = slice(start, start + batch_size)
        lengths = None if batch.lengths is None else batch.lengths[rows]
        yield Batch(batch.x[rows], batch.y[rows], lengths)
