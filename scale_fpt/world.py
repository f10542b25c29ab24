"""The processes that train one trial together: its data-parallel world.

A trial is a world of ``TrainConfig.workers`` ranks, each one process with one DeepSpeed
engine on one ``torch.distributed`` process group. Every rank draws the same seeded batch
(``Task.train_batch(step, batch_size)``) and trains on its own contiguous slice of it
(``World.shard``); DeepSpeed averages the gradients, so a world of N takes the steps a world
of one takes, up to float rounding. Losses, accuracies and evaluation sums are all-reduced,
so every rank sees the numbers of the whole batch. Launching the ranks is
``scale_fpt.distributed``'s concern; this module is what each rank does with its world.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from scale_fpt.runtime import WORLD_TIMEOUT, backend, use_accelerator
from scale_fpt.tasks.base import Batch


@dataclass(frozen=True)
class World:
    """This process's place in its trial's process group."""

    rank: int = 0
    """Rank of this process: 0 reports to Tune and owns the trial's rows."""
    size: int = 1
    """Processes in the trial (``TrainConfig.workers``)."""
    master_addr: str = "127.0.0.1"
    """Address of rank 0, where the process group meets."""
    master_port: int = 0
    """Port of the rendezvous on rank 0 (unused by a world of one, which
    ``runtime.init_distributed`` gives a free port of its own)."""

    def shard(self, batch: Batch) -> Batch:
        """This rank's rows of ``batch``: rows split into ``size`` contiguous parts of
        near-equal length (``shard_bounds``), part ``rank``. Empty when the batch has fewer
        rows than ranks."""
        if self.size == 1:
            return batch
        return rows(batch, *shard_bounds(len(batch), self.size)[self.rank])

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks, elementwise (itself in a world of one); stays on
        its device, so reading it waits for nothing until the loop reads it."""
        if self.size == 1:
            return values
        import torch.distributed as dist

        total = values.detach().clone()
        dist.all_reduce(total)
        return total

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` averaged over the ranks, elementwise."""
        return values if self.size == 1 else self.sum(values) / self.size


SINGLE_PROCESS = World()
"""A trial that is one process."""


def rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of a batch."""
    return Batch(
        batch.x[start:stop],
        batch.y[start:stop],
        None if batch.lengths is None else batch.lengths[start:stop],
    )


def shard_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of ``rows`` split into ``parts`` contiguous, near-equal parts
    (the first ``rows % parts`` one row longer), as ``torch.tensor_split`` splits."""
    small, extra = divmod(rows, parts)
    bounds, start = [], 0
    for part in range(parts):
        stop = start + small + (part < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def rank_seed(seed: int, rank: int) -> int:
    """Seed of a rank's own random draws (dropout masks): ``seed`` itself on rank 0, so a
    world of one draws exactly what it drew before worlds existed; an independent stream
    per other rank (equal masks on every rank's slice would correlate the ranks)."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0] >> 1)


def init_world(device: str, world: World) -> None:
    """Join this process to its trial's process group of ``world.size`` > 1 ranks (gloo on
    CPU, NCCL on CUDA), replacing any group the process had (a reused Ray actor's world of
    one). Each rank sees only its own GPU (Ray gives each its device), hence LOCAL_RANK 0.
    A world of one is ``runtime.init_distributed``'s."""
    import deepspeed
    import torch.distributed as dist

    use_accelerator(device)
    deepspeed.utils.logger.setLevel(logging.WARNING)  # one line per checkpoint otherwise
    if dist.is_initialized():
        destroy_group()
    os.environ.update(
        RANK=str(world.rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world.size),
        MASTER_ADDR=world.master_addr,
        MASTER_PORT=str(world.master_port),
    )
    deepspeed.init_distributed(
        dist_backend=backend(device),
        verbose=False,
        dist_init_required=True,
        timeout=WORLD_TIMEOUT,
    )


def leave_world(world: World) -> None:
    """Tear down a world of several ranks (a reused Ray actor must not keep a group whose
    peers are gone); a world of one stays for the next trial."""
    import torch.distributed as dist

    if world.size > 1 and dist.is_initialized():
        destroy_group()


def destroy_group() -> None:
    """Destroy the process group through DeepSpeed, which also drops the groups it derived
    from it (a stale clone of the world group would break the next engine)."""
    import deepspeed.comm

    deepspeed.comm.destroy_process_group()
