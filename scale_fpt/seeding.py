"""Independent random streams of one trial seed.

A trial draws randomness for five separate purposes. Seeding them with ``seed``,
``seed + 1``, ``seed + 2`` would make seed 0's heads share seed 1's backbone stream, so
seeds would not be independent and intervals over seeds would be too narrow. Instead each
purpose gets its own child of ``numpy.random.SeedSequence(seed)`` (``spawn(5)``): children
of one seed are independent of each other and of every other seed's children, and the same
seed always gives the same integers, so seeded results stay reproducible.

Who uses which stream:

- ``backbone``: random and statistics-only backbone weights (``models.backbones``);
- ``heads``: the input and output layers (``models.build_model`` and packed cohorts);
- ``data``: training data order, fresh synthetic batches and augmentation (``tasks``);
- ``dropout``: the dropout masks while training (the trainer / the packed step);
- ``adapters``: LoRA's matrices (``models.adapters``).

The fixed validation and test sets do not depend on the trial seed (``TaskConfig.val_seed``
and ``test_seed``), so every trial is scored on the same examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

STREAMS = ("backbone", "heads", "data", "dropout", "adapters")
"""The purposes, in the order of ``SeedSequence(seed).spawn(5)``: appending a purpose keeps
the existing ones' values (spawning more children leaves the first ones unchanged)."""


@dataclass(frozen=True)
class SeedStreams:
    """The seeds (63-bit non-negative ints, valid for ``torch.manual_seed``) of one trial."""

    backbone: int
    """Random / statistics-only backbone weights."""
    heads: int
    """Initialisation of the trained input and output layers."""
    data: int
    """Training data: example order, fresh synthetic batches, augmentation."""
    dropout: int
    """Dropout masks during training."""
    adapters: int
    """Initialisation of adapters added to the body (LoRA's A matrices)."""


@lru_cache(maxsize=1024)
def seed_streams(seed: int) -> SeedStreams:
    """The independent streams of trial ``seed`` (a non-negative int)."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    # generate_state gives uint64 words; the top bit is dropped so each value fits the
    # signed 64-bit seeds torch and Python's arithmetic on them handle without overflow.
    values = [int(child.generate_state(1, dtype=np.uint64)[0]) >> 1 for child in children]
    return SeedStreams(**dict(zip(STREAMS, values, strict=True)))


__all__ = ["STREAMS", "SeedStreams", "seed_streams"]
