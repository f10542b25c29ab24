"""What every task provides: a shape spec, seeded train batches and fixed evaluation sets.

Every task has two evaluation splits (``EVAL_SPLITS``): ``val``, which every selection reads
(best step, learning rate, early stopping), and ``test``, which is reported at the selected
point and never selected on. They are disjoint from each other and, for real datasets, from
the examples training reads; both are the same for every trial seed.

Training data is a pure function of ``(seed, step)``: ``train_batch(step)`` returns the same
batch whenever it is asked, so a trial resumed from a checkpoint at step s sees exactly the
batches an uninterrupted run sees, with no data-loader state to save.

Data lives where the model trains (``Task.to(device)``): datasets are held on the device as
compact tensors (images as uint8), and each step's randomness (example order, fresh
synthetic draws, augmentation) is drawn there with ``keyed_random`` (``step_draws``), so a
training step copies nothing from the host and the draws are the same on a CPU and a GPU.
On a GPU a training batch's device work (keyed draws, gathers, augmentation: dozens of small
element-wise ops) is compiled (``Task.drawn``): one graph of fused kernels per batch.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from scale_fpt.config import ConfigError, TaskConfig, TrialConfig
from scale_fpt.keyed_random import Draws, stream_key
from scale_fpt.seeding import seed_streams
from scale_fpt.tasks.aspects import Aspect

PERMUTATION_STREAM = 1

EVAL_SPLITS = ("val", "test")
"""Evaluation splits: ``val`` selects, ``test`` is reported at the selected point."""


def check_split(split: str) -> str:
    """``split`` if it is one of EVAL_SPLITS; ValueError naming the choices otherwise."""
    if split not in EVAL_SPLITS:
        raise ValueError(
            f"unknown evaluation split {split!r}; choose from {', '.join(EVAL_SPLITS)}"
        )
    return split


def synthetic_eval_set(config: TaskConfig, split: str) -> tuple[int, int]:
    """(seed, number of chunks) of the fixed generated ``split`` of a synthetic task."""
    if check_split(split) == "val":
        return config.val_seed, config.val_batches
    return config.test_seed, config.test_batches


def eval_limit(config: TaskConfig, split: str) -> int:
    """Real datasets: evaluate on the first this many examples of ``split`` (0 = all)."""
    return config.val_limit if check_split(split) == "val" else config.test_limit


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

    def member(self, i: int) -> Batch:
        """Member ``i``'s batch of a stacked cohort batch (``Task.cohort_batch``)."""
        return Batch(self.x[i], self.y[i], None if self.lengths is None else self.lengths[i])


def draws_on_gpu(device: torch.device) -> bool:
    """Whether training batches made on ``device`` take the GPU's path: their device work
    compiled, host data copied from pinned memory without waiting. On a CPU the ops run as
    they are (no compile time). ``benchmarks/_launches.py`` replaces it to count the GPU's
    path on a CPU."""
    return device.type == "cuda"


def step_draws(
    seed: int | torch.Tensor, step: int, stream: int, device: torch.device | str = "cpu"
) -> Draws:
    """The random draws of one batch: determined by (seed, step, stream), made on ``device``
    (a tensor of K seeds: the K members' draws at once, each the one of its own seed)."""
    return Draws(stream_key(seed, step, stream), device)


def stack_batches(batches: list[Batch], join=torch.stack) -> Batch:
    """Members' batches stacked: x (K, B, T, ...), y (K, B, k, m), lengths (K, B) or None.
    Variable-length batches are right-padded to the longest (causal attention: padding after
    a sequence never changes its real tokens). ``join=torch.cat``: the batches joined along
    the example axis instead (one batch of all their examples)."""
    T = max(b.x.shape[1] for b in batches)
    xs = []
    for b in batches:
        x = b.x
        if x.shape[1] < T:
            x = F.pad(x, [0, 0] * (x.dim() - 2) + [0, T - x.shape[1]])
        xs.append(x)
    lengths = None
    if any(b.lengths is not None for b in batches):
        lengths = join(
            [
                b.lengths
                if b.lengths is not None
                else torch.full((len(b),), b.x.shape[1], device=b.x.device)
                for b in batches
            ]
        )
    return Batch(join(xs), join([b.y for b in batches]), lengths)


def to_device(value, device: torch.device):
    """``value`` with every tensor in it (tensors, Batches, tuples, lists, dicts) on
    ``device``."""
    if isinstance(value, torch.Tensor | Batch):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


class Task(ABC):
    """A task built for one trial seed (``build_task(config, seed)``). Its class declares
    what planning, the preflight and the report read without building it: its shapes
    (``spec_for``), its preprocessing (``preprocessing``) and why its data cannot be reached
    (``data_problem``); its registry entry (``task_registry``) the rest."""

    name: str
    spec: TaskSpec

    @classmethod
    def spec_for(cls, config: TaskConfig) -> TaskSpec:
        """The shapes of a trial of ``config``, without loading any data."""
        raise NotImplementedError(f"{cls.__name__} declares no spec_for")

    @classmethod
    def preprocessing(cls, config: TrialConfig) -> list[Aspect]:
        """Its preprocessing aspects (``tasks.preprocessing``), in their order."""
        raise NotImplementedError(f"{cls.__name__} declares no preprocessing")

    @classmethod
    def data_problem(cls, config: TaskConfig) -> str:
        """Why a trial of ``config`` cannot reach its data ('' when it can; a
        ``DataUnavailable`` raised says it too): where the task itself will look, opening no
        dataset. A task that generates its data: ''."""
        return ""

    def __init__(self, config: TaskConfig, seed: int):
        self.config = config
        self.seed = seed
        """The trial seed; training data reads its ``data`` stream (:attr:`data_seed`)."""
        self.device = torch.device("cpu")
        """Where the task holds its data and makes its batches (``to``)."""
        self._data_seeds: dict[tuple[int, ...], torch.Tensor] = {}
        self._compiled: dict[str, Callable] = {}  # draw name -> compiled draw (``drawn``)

    def to(self, device: torch.device | str) -> Task:
        """Hold every tensor of the task on ``device`` and make batches there from now on
        (in place; returns the task). Copies of the task made afterwards share the tensors."""
        self.device = torch.device(device)
        for name, value in list(vars(self).items()):
            setattr(self, name, to_device(value, self.device))
        return self

    @property
    def data_seed(self) -> int:
        """Seed of the training data (order, fresh draws, augmentation): the trial seed's
        ``data`` stream, so it is independent of the model's streams and of other seeds."""
        return seed_streams(self.seed).data

    @abstractmethod
    def train_batch(self, step: int, batch_size: int) -> Batch:
        """The training batch of ``step`` on :attr:`device`; a pure function of (data_seed,
        step, batch_size), whatever the device."""

    def cohort_batch(self, step: int, batch_size: int, seeds: Sequence[int]) -> Batch:
        """The training batches of ``step`` of the trials with seeds ``seeds`` (one per member
        of a cohort), stacked (``stack_batches``): member i's rows are exactly
        ``train_batch`` of the task built for seeds[i]. This default makes each member's
        batch in turn; tasks whose draws vectorise over seeds make them all at once."""
        if list(seeds) == [self.seed]:  # a trial alone: its batch, viewed as one member's
            batch = self.train_batch(step, batch_size)
            lengths = None if batch.lengths is None else batch.lengths[None]
            return Batch(batch.x[None], batch.y[None], lengths)
        batches = []
        for seed in seeds:
            member = copy.copy(self)
            member.seed = seed
            batches.append(member.train_batch(step, batch_size))
        return stack_batches(batches)

    def data_seeds(self, seeds: Sequence[int]) -> torch.Tensor:
        """(K,) int64 on :attr:`device`: the data streams of trial seeds ``seeds``, made once
        per set of members (a host-to-device copy), then reused every step."""
        key = tuple(seeds)
        if key not in self._data_seeds:
            streams = [seed_streams(seed).data for seed in seeds]
            self._data_seeds[key] = torch.tensor(streams, device=self.device)
        return self._data_seeds[key]

    @property
    def draws_on_gpu(self) -> bool:
        """Whether this task's training batches take the GPU's path (``draws_on_gpu``)."""
        return draws_on_gpu(self.device)

    def drawn(self, draw: Callable, *args, step: int | None = None):
        """``draw(step, *args)``: a training batch's device work, compiled where
        ``draws_on_gpu`` (one graph per batch; the step is then passed as a device value, so
        one graph serves every step). ``step`` None: the draw reads no step. ``draw`` takes
        whatever differs between members (indices, data seeds) as arguments: copies of the
        task share its compiled draws."""
        if not self.draws_on_gpu:
            return draw(step, *args)
        if draw.__name__ not in self._compiled:
            self._compiled[draw.__name__] = torch.compile(draw)
        if step is not None:
            step = torch.full((), step, device=self.device)
        return self._compiled[draw.__name__](step, *args)

    @abstractmethod
    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """The fixed evaluation set ``split`` (one of EVAL_SPLITS; the same for every trial
        and every call), in batches of at most ``batch_size``."""

    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        """The fixed test set, in batches (``eval_batches("test", batch_size)``)."""
        return self.eval_batches("test", batch_size)

    def eval_size(self, split: str) -> int:
        """Number of examples in the evaluation set ``split``."""
        return sum(len(b) for b in self.eval_batches(split, 256))

    def test_size(self) -> int:
        """Number of examples in the test set."""
        return self.eval_size("test")


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
    parts = [
        _permutation(seed, epoch, n, device)[first:last]
        for epoch, first, last in _epoch_spans(step, batch_size, n)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def host_epoch_indices(seed: int, step: int, batch_size: int, n: int) -> list[int]:
    """``epoch_indices`` as a list on the host, for work done there (generating examples, a
    batch's longest sequence): each epoch's permutation is read into a list once."""
    return [
        index
        for epoch, first, last in _epoch_spans(step, batch_size, n)
        for index in _host_permutation(seed, epoch, n)[first:last]
    ]


def _epoch_spans(step: int, batch_size: int, n: int) -> Iterator[tuple[int, int, int]]:
    """(epoch, first, last): batch ``step`` holds positions first..last-1 of each epoch's
    permutation it reaches (one epoch, or the end of one and the start of the next)."""
    start, end = step * batch_size, (step + 1) * batch_size
    for epoch in range(start // n, (end - 1) // n + 1):
        yield epoch, max(start, epoch * n) - epoch * n, min(end, (epoch + 1) * n) - epoch * n


def split_batch(batch: Batch, batch_size: int):
    """Consecutive batches of at most ``batch_size`` examples of ``batch`` (views, in order)."""
    for start in range(0, len(batch), batch_size):
        rows = slice(start, start + batch_size)
        lengths = None if batch.lengths is None else batch.lengths[rows]
        yield Batch(batch.x[rows], batch.y[rows], lengths)


@lru_cache(maxsize=512)  # a packed cohort of K members reads K seeds' current epochs
def _permutation(seed: int, epoch: int, n: int, device: torch.device) -> torch.Tensor:
    return step_draws(seed, epoch, PERMUTATION_STREAM, device).permutation(n)


@lru_cache(maxsize=128)  # host lists of the current epochs of a cohort's members
def _host_permutation(seed: int, epoch: int, n: int) -> list[int]:
    return _permutation(seed, epoch, n, torch.device("cpu")).tolist()


def release_device_draws() -> None:
    """Drop the cached epoch permutations: they live on the trial's device (a GPU's memory
    would otherwise stay held by a finished trial in a reused Ray actor)."""
    _permutation.cache_clear()
