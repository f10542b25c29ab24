"""ListOps (Long Range Arena): the value, 0-9, of a nested list expression such as
``[MAX 2 9 [MIN 4 7 ] 0 ]`` (= 9), read one token at a time.

Two sources:

* ``config.data_dir`` holding the LRA files ``basic_train.tsv``, ``basic_val.tsv`` and
  ``basic_test.tsv`` (also found in a ``listops-1000/`` subdirectory): train, validation
  and test. (The paper's reference code reports ``basic_val`` as its "test" accuracy; here
  ``basic_val`` selects and ``basic_test`` is the test split, so published ListOps numbers
  are validation numbers: see ``PREPROCESSING``.)
* otherwise a seeded generator with LRA's grammar (see :func:`sample_expression`): a
  training pool, and validation and test sets drawn from ``val_seed`` / ``test_seed``.

Sequences are right-padded (``PAD``) or cut to ``max_length`` tokens (default 512); x is
(B, max_length) long, ``lengths`` the real lengths, y (B, 1, 1) the value.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from scale_fpt.config import ConfigError, TaskConfig, TrialConfig
from scale_fpt.tasks.aspects import NO_NORMALISATION, Aspect, input_dropout
from scale_fpt.tasks.base import (
    Batch,
    DataUnavailable,
    Task,
    TaskSpec,
    check_split,
    epoch_indices,
    eval_limit,
    host_epoch_indices,
    split_batch,
    synthetic_eval_set,
)

DEFAULT_MAX_LENGTH = 512
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
CLOSE = "]"
VOCAB = ("<pad>", "<unk>", *map(str, range(10)), *OPERATORS, CLOSE)
"""The fixed vocabulary (17 tokens): pad=0, unk=1, the digits 0-9 (ids 2-11), the four
operators (ids 12-15) and the closing bracket (id 16)."""
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
PAD, UNK = TOKEN_ID["<pad>"], TOKEN_ID["<unk>"]
DIGIT0 = TOKEN_ID["0"]
OP0 = TOKEN_ID[OPERATORS[0]]
CLOSE_ID = TOKEN_ID[CLOSE]
BRANCH_PROB = 0.25
"""LRA: an argument is itself an operator with probability 0.25 (below the depth limit)."""
MIN_LENGTH_DIVISOR = 4
"""Generated expressions aim for at least max_length // 4 tokens (LRA keeps 500..2000)."""
ATTEMPTS = 64
"""Draws per generated expression before settling for the longest one that fit."""
TRAIN_POOL_SEED = 0
"""The generated training set is the same for every trial, like a real dataset."""
TEST_CHUNK = 32
"""Generated evaluation sets: ``config.val_batches`` / ``config.test_batches`` times this
many expressions."""
LRA_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
"""The LRA ListOps file of each split."""


def tokenize(source: str, max_length: int) -> list[int]:
    """Token ids of an LRA ``Source`` string, cut to ``max_length``. LRA writes the binary
    parse tree's parentheses as tokens, ``( ( [MAX 2 ) 9 ) ] )``; like the LRA pipeline we
    drop them. Unknown tokens map to ``UNK``."""
    tokens = [t for t in source.split() if t not in ("(", ")")]
    return [TOKEN_ID.get(t, UNK) for t in tokens[:max_length]]


def apply_operator(op: int, values: list[int]) -> int:
    """Value of operator ``op`` (index into OPERATORS) on digit arguments.

    MED is LRA's ``int(np.median(values))``: for an even count, the floor of the mean of the
    two middle values."""
    if op == 0:
        return max(values)
    if op == 1:
        return min(values)
    if op == 2:
        s = sorted(values)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    return sum(values) % 10


def evaluate(ids: list[int]) -> int:
    """Value of a complete expression given as token ids (no parentheses, no padding)."""
    stack: list[tuple[int, list[int]]] = []
    for t in ids:
        if t == CLOSE_ID:
            op, values = stack.pop()
            value = apply_operator(op, values)
            if not stack:
                return value
            stack[-1][1].append(value)
        elif t >= OP0:
            stack.append((t - OP0, []))
        elif stack:
            stack[-1][1].append(t - DIGIT0)
        else:
            return t - DIGIT0  # a bare digit
    raise ValueError("incomplete ListOps expression")


def sample_expression(
    rng: random.Random, max_depth: int, max_args: int, max_tokens: int
) -> list[int] | None:
    """One expression drawn with LRA's grammar, as token ids; None if it would exceed
    ``max_tokens``.

    The root is an operator (at depth 1). Each operator takes uniformly 2..max_args
    arguments (at least 2); each argument is an operator with probability ``BRANCH_PROB``
    while its depth stays below ``max_depth``, else a uniform digit. LRA's grammar grows
    most trees past any useful length, so the draw stops as soon as the tokens already
    committed (each pending argument needs at least one, each open operator its ``]``)
    exceed ``max_tokens``: a rejected tree costs at most ``max_tokens`` steps.
    """
    rand = rng.random
    span = max(max_args, 2) - 1
    n_args = 2 + int(rand() * span)
    ids = [OP0 + int(rand() * 4)]
    remaining = [n_args]  # arguments still to draw, per open operator (innermost last)
    committed = 1 + n_args + 1
    while remaining:
        if remaining[-1] == 0:
            ids.append(CLOSE_ID)
            remaining.pop()
            continue
        remaining[-1] -= 1
        # One uniform draw decides operator vs digit and, conditioned on that, which one.
        r = rand()
        if r < BRANCH_PROB and len(remaining) + 1 < max_depth:
            n_args = 2 + int(rand() * span)
            committed += n_args + 1  # replaces a one-token argument with op, args and ]
            if committed > max_tokens:
                return None
            ids.append(OP0 + int(r / BRANCH_PROB * 4))
            remaining.append(n_args)
        elif r < BRANCH_PROB:
            ids.append(DIGIT0 + int(r / BRANCH_PROB * 10))
        else:
            # min(): float rounding can carry r just below 1 up to exactly 10.
            ids.append(DIGIT0 + min(int((r - BRANCH_PROB) / (1 - BRANCH_PROB) * 10), 9))
    return ids


def generate_expression(
    rng: random.Random, max_depth: int, max_args: int, max_tokens: int
) -> list[int]:
    """The first draw of :func:`sample_expression` with at least ``max_tokens //
    MIN_LENGTH_DIVISOR`` tokens (short expressions are easy and repeat); after ``ATTEMPTS``
    draws, the longest that fit, so a grammar that rarely grows long still terminates."""
    min_tokens = max_tokens // MIN_LENGTH_DIVISOR
    best: list[int] | None = None
    attempt = 0
    while True:
        ids = sample_expression(rng, max_depth, max_args, max_tokens)
        if ids is not None:
            if len(ids) >= min_tokens:
                return ids
            if best is None or len(ids) > len(best):
                best = ids
        attempt += 1
        if attempt >= ATTEMPTS and best is not None:
            return best


# (split, seed, max_depth, max_args, max_length) -> {index: (ids (L,) uint8, value)}:
# generated expressions, shared by every task object in the process.
_GENERATED: dict[tuple, dict[int, tuple[np.ndarray, int]]] = {}


def generated_expression(
    split: str, seed: int, index: int, max_depth: int, max_args: int, max_length: int
) -> tuple[np.ndarray, int]:
    """Expression ``index`` of the generated ``split`` ('train', 'val' or 'test') drawn from
    ``seed``: (token ids (L,) uint8, value). Each expression has its own random stream, so
    any one is made on demand, in any order, and training generates only what it reads."""
    cache = _GENERATED.setdefault((split, seed, max_depth, max_args, max_length), {})
    if index not in cache:
        rng = random.Random(f"listops-{split}-{seed}-{index}")
        ids = generate_expression(rng, max_depth, max_args, max_length)
        cache[index] = (np.asarray(ids, dtype=np.uint8), evaluate(ids))
    return cache[index]


# (path, max_length) -> (x (N, max_length) uint8, lengths (N,), y (N,)): parsed LRA files.
_LRA: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def load_lra_split(path: Path, max_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An LRA ``basic_*.tsv`` file (header ``Source<TAB>Target``) as
    (x (N, max_length) uint8 padded ids, lengths (N,) long, y (N,) long); cached per process."""
    key = (str(path.resolve()), max_length)
    if key in _LRA:
        return _LRA[key]
    rows, targets = [], []
    with open(path, "rb") as f:  # decoded line by line, so a bad byte is reported by line
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataUnavailable(
                    f"listops: {path}:{line_no} is not UTF-8 text (a corrupt or binary file, "
                    "not an LRA basic_*.tsv); download LRA's listops-1000 data again"
                ) from None
            fields = line.rstrip("\r\n").split("\t")
            if line_no == 1 and fields[0] == "Source":
                continue
            if not line.strip():
                continue
            ids = tokenize(fields[0], max_length) if len(fields) == 2 else []
            if not ids or not fields[1].strip().isdigit() or int(fields[1]) > 9:
                raise DataUnavailable(
                    f"listops: {path}:{line_no} is not an LRA row "
                    "'Source<TAB>Target' with a non-empty expression and a target 0-9; "
                    "download LRA's listops-1000 data again"
                )
            rows.append(ids)
            targets.append(int(fields[1]))
    if not rows:
        raise DataUnavailable(
            f"listops: {path} holds no rows (an empty or truncated LRA basic_*.tsv); download "
            "LRA's listops-1000 data again"
        )
    x = np.full((len(rows), max_length), PAD, dtype=np.uint8)
    for i, ids in enumerate(rows):
        x[i, : len(ids)] = ids
    lengths = torch.tensor([len(ids) for ids in rows], dtype=torch.long)
    _LRA[key] = (torch.from_numpy(x), lengths, torch.tensor(targets, dtype=torch.long))
    return _LRA[key]


def find_lra_files(data_dir: str) -> dict[str, Path]:
    """``{split: path}`` of the LRA files (``LRA_FILES``) in ``data_dir`` or its
    ``listops-1000/``."""
    for folder in (Path(data_dir), Path(data_dir) / "listops-1000"):
        paths = {split: folder / name for split, name in LRA_FILES.items()}
        if all(path.is_file() for path in paths.values()):
            return paths
    raise DataUnavailable(
        f"listops: LRA ListOps files not found in {data_dir} (expected "
        f"{', '.join(LRA_FILES.values())}, or listops-1000/ with them); download LRA's "
        "lra_release listops-1000 data and pass --data-dir DIR, or pass no --data-dir to use "
        "the generator"
    )


class ListOps(Task):
    """ListOps from the LRA files in ``config.data_dir``, or generated (see module doc).

    Generated data: a fixed training set of ``listops_train_size`` expressions drawn from
    ``TRAIN_POOL_SEED`` (the same for every trial), read in a per-epoch permutation of the
    trial seed; validation and test sets of ``val_batches`` / ``test_batches`` times
    ``TEST_CHUNK`` expressions drawn from ``val_seed`` / ``test_seed`` (each split its own
    random streams). With expressions of at least max_length // 4 tokens the three sets
    share no expression except with negligible probability.
    """

    name = "listops"

    @classmethod
    def preprocessing(cls, config: TrialConfig) -> list[Aspect]:
        task = config.task
        length = task.max_length or 512
        files = bool(task.data_dir)
        split = (
            "train basic_train; validation basic_val; test basic_test"
            if files
            else "generated with LRA's grammar: a training pool and validation/test draws"
        )
        truncation = (
            f"expressions longer than {length} tokens cut"
            if files
            else f"generated expressions fit {length} tokens (at least {length // 4})"
        )
        return [
            Aspect(
                "sequence length", f"{length} tokens", "512 tokens", "512 tokens", length == 512
            ),
            Aspect(
                "split",
                split,
                "LRA ListOps",
                "train basic_train; reports basic_val as 'test'",
                False,  # the published number is a validation accuracy
            ),
            Aspect("truncation", truncation, "padded/cut to 512", "padded/cut to 512", files),
            Aspect("augmentation", "none", "none", "none", True),
            NO_NORMALISATION,
            input_dropout(config, continuous=False),
        ]

    @classmethod
    def data_problem(cls, config: TaskConfig) -> str:
        if config.data_dir:  # without files: the seeded generator
            find_lra_files(config.data_dir)
        return ""

    @classmethod
    def spec_for(cls, config: TaskConfig) -> TaskSpec:
        return TaskSpec(
            n_tokens=config.max_length or DEFAULT_MAX_LENGTH,
            token_width=0,
            vocab_size=len(VOCAB),
            n_predicting_tokens=1,
            outputs_per_token=1,
            n_classes=10,
        )

    def __init__(self, config: TaskConfig, seed: int):
        super().__init__(config, seed)
        self.spec = self.spec_for(config)
        self.max_length = self.spec.n_tokens
        self._eval: dict[str, Batch] = {}
        if config.data_dir:
            self._files = find_lra_files(config.data_dir)
            self._train = load_lra_split(self._files["train"], self.max_length)
            self.n_train = len(self._train[0])
        else:
            if self.max_length < 4:
                raise ConfigError(
                    ["--max-length: generated ListOps needs at least 4 tokens ([OP d d ])"]
                )
            self.n_train = config.listops_train_size

    def _generated_batch(self, split: str, seed: int, indices: list[int]) -> Batch:
        """The generated expressions ``indices`` of ``split`` on :attr:`device`: made on the
        host in one (N, max_length + 2) array of ids, length and value, copied over at once
        (from pinned memory without waiting, where ``draws_on_gpu``)."""
        c = self.config
        rows = np.full((len(indices), self.max_length + 2), PAD, dtype=np.int64)
        for row, index in enumerate(indices):
            ids, value = generated_expression(
                split, seed, index, c.listops_max_depth, c.listops_max_args, self.max_length
            )
            rows[row, : len(ids)] = ids
            rows[row, -2:] = len(ids), value
        host = torch.from_numpy(rows)
        if self.draws_on_gpu:
            host = host.pin_memory()
        on_device = host.to(self.device, non_blocking=True)
        return Batch(on_device[:, :-2], on_device[:, -1].view(-1, 1, 1), on_device[:, -2])

    def train_batch(self, step: int, batch_size: int) -> Batch:
        if not self.config.data_dir:
            # Generated expressions are made in Python on the host, then copied over.
            indices = host_epoch_indices(self.data_seed, step, batch_size, self.n_train)
            return self._generated_batch("train", TRAIN_POOL_SEED, indices)
        indices = epoch_indices(self.data_seed, step, batch_size, self.n_train, self.device)
        return Batch(*self.drawn(self._draw, indices))

    def _draw(
        self, step: None, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, lengths, y = self._train
        return x[indices].long(), y[indices].view(-1, 1, 1), lengths[indices]

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        if split not in self._eval:
            if self.config.data_dir:
                x, lengths, y = load_lra_split(self._files[check_split(split)], self.max_length)
                n = eval_limit(self.config, split) or len(x)
                batch = Batch(x[:n].long(), y[:n].view(-1, 1, 1), lengths[:n])
                self._eval[split] = batch.to(self.device)
            else:
                seed, n_chunks = synthetic_eval_set(self.config, split)
                indices = list(range(n_chunks * TEST_CHUNK))
                self._eval[split] = self._generated_batch(split, seed, indices)
        return split_batch(self._eval[split], batch_size)


def majority_rate(config: TaskConfig, split: str = "test") -> float:
    """The share of the most frequent value in ``config``'s ``split`` (generated or read from
    the LRA files): what a model that always answers it scores there, ListOps' trivial
    baseline measured on the data a trial used rather than assumed."""
    task = ListOps(config, seed=0)
    values = torch.cat([batch.y.flatten() for batch in task.eval_batches(split, 4096)])
    return float(torch.bincount(values, minlength=10).max()) / len(values)
