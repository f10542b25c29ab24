"""A training set of a fixed size: the data-size axis of a scaling study.

``train_examples = n`` (``TaskConfig``) trains on the first n examples the task would have
trained on (its batches 0, 1, ... at ``POOL_BATCH`` examples each, cut at n), read in epochs
of fresh seeded permutations (``epoch_indices``). For the bit tasks, whose every batch is a
fresh draw, this turns "infinite data" into n examples; for ListOps and the datasets, it keeps
n of the training split. Each trial seed has its own n examples (drawn from its own data
stream), so seeds vary the sample as well as the order. Augmentation (CIFAR-10) is drawn once
per pooled example, not per epoch: the pool is a fixed set. Evaluation sets are unchanged.
"""

from __future__ import annotations

import copy
import math

import torch

from scale_fpt.tasks.base import Batch, Task, epoch_indices, stack_batches

POOL_BATCH = 64
"""Examples per underlying batch drawn while building the pool."""


class FixedPool(Task):
    """``inner``'s task trained on ``examples`` examples per seed (module docstring)."""

    def __init__(self, inner: Task, examples: int):
        super().__init__(inner.config, inner.seed)
        self.inner = inner
        self.examples = examples
        self.name, self.spec = inner.name, inner.spec
        self._pools: dict[int, Batch] = {}  # trial seed -> its examples, shared by copies

    def to(self, device: torch.device | str) -> FixedPool:
        self.inner.to(device)
        self.device = torch.device(device)
        self._pools = {seed: pool.to(self.device) for seed, pool in self._pools.items()}
        return self

    def pool(self) -> Batch:
        if self.seed not in self._pools:
            source = copy.copy(self.inner)
            source.seed = self.seed
            batches = [
                source.train_batch(k, POOL_BATCH)
                for k in range(math.ceil(self.examples / POOL_BATCH))
            ]
            whole = stack_batches(batches, join=torch.cat)
            rows = slice(0, self.examples)
            lengths = None if whole.lengths is None else whole.lengths[rows]
            self._pools[self.seed] = Batch(whole.x[rows], whole.y[rows], lengths)
        return self._pools[self.seed]

    def train_batch(self, step: int, batch_size: int) -> Batch:
        pool = self.pool()
        idx = epoch_indices(self.data_seed, step, batch_size, self.examples, self.device)
        return Batch(pool.x[idx], pool.y[idx], None if pool.lengths is None else pool.lengths[idx])

    def eval_batches(self, split: str, batch_size: int):
        return self.inner.eval_batches(split, batch_size)
