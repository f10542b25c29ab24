"""What every task provides: a shape spec, seeded train batches and a fixed test set.

Training data is a pure function of ``(seed, step)``: ``train_batch(step)`` returns the same
batch whenever it is asked, so a trial resumed from a checkpoint at step s sees exactly the
batches an uninterrupted run sees, with no data-loader state to save.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from scale_fpt.config import ConfigError, TaskConfig
from scale_fpt.seeding import seed_streams


class DataUnavailable(ConfigError):
    """A task's data cannot be found or read. The message is one line: what is missing, and
    what to do about it (which files to fetch, which flag to pass)."""

    def __init__(self, message: str):
        # ConfigError's multi-line "invalid configuration" framing is for lists of flag
        # problems; a missing dataset is one problem, reported as its own single line.
        ValueError.__init__(self, message)
        self.problems = [message]


@dataclass(frozen=True)
class TaskSpec:
    """Shapes the model is built from."""

    n_tokens: int
    """Sequence length fed to the model (the longest, for variable-length tasks)."""
    token_width: int
    """Features per token for continuous inputs; 0 for discrete tokens."""
    vocab_size: int
    """Size of the token vocabulary for discrete inputs (embedding table); 0 if continuous."""
    n_predicting_tokens: int
    """The last k (real) tokens of the sequence make the predictions."""
    outputs_per_token: int
    """Predictions each predicting token makes (50 bits per patch for Bit Memory; 1 else)."""
    n_classes: int
    """Classes per prediction (2 for a bit)."""

    @property
    def discrete(self) -> bool:
        return self.vocab_size > 0


@dataclass
class Batch:
    """x: (B, T, W) float for continuous tasks or (B, T) long token ids for discrete ones.
    y: (B, k, m) long targets, k = n_predicting_tokens, m = outputs_per_token.
    lengths: (B,) long real lengths for right-padded variable-length tasks, else None."""

    x: torch.Tensor
    y: torch.Tensor
    lengths: torch.Tensor | None = None

    def to(self, device) -> Batch:
        return Batch(
            self.x.to(device, non_blocking=True),
            self.y.to(device, non_blocking=True),
            None if self.lengths is None else self.lengths.to(device, non_blocking=True),
        )

    def __len__(self) -> int:
        return self.x.shape[0]


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A torch generator determined by (seed, step, stream): the randomness of one batch."""
    g = torch.Generator()
    # Distinct large odd multipliers keep (seed, step, stream) triples from colliding.
    g.manual_seed((seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**63 - 1))
    return g


class Task(ABC):
    """A task built for one trial seed (``build_task(config, seed)``)."""

    name: str
    spec: TaskSpec

    def __init__(self, config: TaskConfig, seed: int):
        self.config = config
        self.seed = seed
        """The trial seed; training data reads its ``data`` stream (:attr:`data_seed`)."""

    @property
    def data_seed(self) -> int:
        """Seed of the training data (order, fresh draws, augmentation): the trial seed's
        ``data`` stream, so it is independent of the model's streams and of other seeds."""
        return seed_streams(self.seed).data

    @abstractmethod
    def train_batch(self, step: int, batch_size: int) -> Batch:
        """The training batch of ``step``; a pure function of (data_seed, step, batch_size)."""

    @abstractmethod
    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        """The fixed test set (same for every trial and every call), in batches."""

    def test_size(self) -> int:
        """Number of examples in the test set."""
        return sum(len(b) for b in self.test_batches(256))
