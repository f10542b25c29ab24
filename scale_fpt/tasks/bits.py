"""The two synthetic bit tasks: Bit Memory and Bit XOR.

As in the paper, every training batch is fresh random data drawn from (seed, step). The
validation and test sets are drawn the same way but once, each from its own seed and stream:
``val_batches`` chunks of ``TEST_CHUNK`` examples from ``config.val_seed`` and
``test_batches`` chunks from ``config.test_seed``, the same for every trial and every
evaluation batch size. The draws are independent; Bit XOR has only 1024 distinct inputs, so
its two sets (and training) hold the same inputs by construction, as in the paper.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from scale_fpt.config import TaskConfig, TrialConfig
from scale_fpt.keyed_random import Draws
from scale_fpt.tasks import split_batch
from scale_fpt.tasks.aspects import NO_NORMALISATION, Aspect, input_dropout
from scale_fpt.tasks.base import Batch, Task, TaskSpec, step_draws, synthetic_eval_set

# step_draws streams (PERMUTATION_STREAM = 1 in scale_fpt.tasks.base is not used here).
DATA_STREAM = 0
EVAL_STREAMS = {"test": 2, "val": 4}
"""step_draws stream of each evaluation split (independent draws even for equal seeds)."""
TEST_CHUNK = 32
"""Examples per evaluation chunk: the test set holds ``config.test_batches * TEST_CHUNK``,
the validation set ``config.val_batches * TEST_CHUNK``."""


class _FreshRandomTask(Task):
    """A task whose examples are i.i.d. draws: ``_sample(n, draws)`` makes n of them on the
    draws' device, for each of the draws' keys at once (``Draws.lead``): a cohort's members'
    batches are one set of operations, however many members there are."""

    @classmethod
    def preprocessing(cls, config: TrialConfig) -> list[Aspect]:
        if config.task.task == "bit-memory":
            bits, patch = config.task.bit_memory_bits, config.task.bit_memory_patch
            shape = f"{6 * bits // patch} tokens x {patch} bits (5 strings of {bits} bits, a query)"
            published = "120 tokens x 50 bits (5 strings of 1000 bits, a query)"
        else:
            shape = published = "10 tokens x 1 bit"
        return [
            Aspect("sequence length", shape, published, published, shape == published),
            Aspect(
                "split",
                "fresh random training batches; fixed validation and test draws (val_seed, test_seed)",
                "fresh random data for every batch",
                "fresh random batches, train and evaluation alike",
                True,
            ),
            Aspect("truncation", "none", "none", "none", True),
            Aspect("augmentation", "none", "none", "none", True),
            NO_NORMALISATION,
            input_dropout(config, continuous=True),
        ]

    def __init__(self, config: TaskConfig, seed: int):
        super().__init__(config, seed)
        self.spec = self.spec_for(config)
        self._eval: dict[str, Batch] = {}

    def _sample(self, n: int, draws: Draws) -> Batch:
        raise NotImplementedError

    def train_batch(self, step: int, batch_size: int) -> Batch:
        return self.cohort_batch(step, batch_size, [self.seed]).member(0)

    def cohort_batch(self, step: int, batch_size: int, seeds: Sequence[int]) -> Batch:
        x, y = self.drawn(self._draw, self.data_seeds(seeds), batch_size, step=step)
        return Batch(x, y)

    def _draw(
        self, step: int | torch.Tensor, data_seeds: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._sample(n, step_draws(data_seeds, step, DATA_STREAM, self.device))
        return batch.x, batch.y

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        if split not in self._eval:
            seed, n_chunks = synthetic_eval_set(self.config, split)
            chunks = [
                self._sample(TEST_CHUNK, step_draws(seed, i, EVAL_STREAMS[split], self.device))
                for i in range(n_chunks)
            ]
            self._eval[split] = Batch(
                torch.cat([c.x for c in chunks]), torch.cat([c.y for c in chunks])
            )
        return split_batch(self._eval[split], batch_size)


class BitXor(_FreshRandomTask):
    """Two random 5-bit strings, one bit (0. or 1.) per token; the last 5 tokens each predict
    one bit of their element-wise XOR. x: (B, 10, 1) float, y: (B, 5, 1) long."""

    name = "bit-xor"
    n_bits = 5

    @classmethod
    def spec_for(cls, config: TaskConfig) -> TaskSpec:
        return TaskSpec(
            n_tokens=2 * cls.n_bits,
            token_width=1,
            vocab_size=0,
            n_predicting_tokens=cls.n_bits,
            outputs_per_token=1,
            n_classes=2,
        )

    def _sample(self, n: int, draws: Draws) -> Batch:
        a, b = draws.randint(0, 2, (2, n, self.n_bits)).unbind(-3)  # lead + (n, 5) each
        x = torch.cat([a, b], dim=-1).float().unsqueeze(-1)  # lead + (n, 10, 1)
        y = (a ^ b).unsqueeze(-1)  # lead + (n, 5, 1)
        return Batch(x, y)


class BitMemory(_FreshRandomTask):
    """Five random ±1 strings of ``config.bit_memory_bits`` bits (the paper's 1000), then a
    query: one of them, chosen at random, with each bit masked to 0 with probability 0.5.
    Everything is cut into patches of ``config.bit_memory_patch`` bits (the paper's 50), so
    the paper's sequence is 6 * 1000 / 50 = 120 tokens of width 50; the last 1000 / 50 = 20
    tokens (the query) each predict their 50 bits of the unmasked string (class 1 for +1, 0
    for -1). x: (B, 6 * bits / patch, patch) float, y: (B, bits / patch, patch) long."""

    name = "bit-memory"
    n_strings = 5
    mask_prob = 0.5

    def __init__(self, config: TaskConfig, seed: int):
        super().__init__(config, seed)
        self.n_bits = config.bit_memory_bits
        self.patch = config.bit_memory_patch

    @classmethod
    def spec_for(cls, config: TaskConfig) -> TaskSpec:
        query_tokens = config.bit_memory_bits // config.bit_memory_patch
        return TaskSpec(
            n_tokens=(cls.n_strings + 1) * query_tokens,
            token_width=config.bit_memory_patch,
            vocab_size=0,
            n_predicting_tokens=query_tokens,
            outputs_per_token=config.bit_memory_patch,
            n_classes=2,
        )

    def _sample(self, n: int, draws: Draws) -> Batch:
        bits = draws.randint(0, 2, (n, self.n_strings, self.n_bits))
        strings = bits.float() * 2 - 1  # lead + (n, 5, bits) in {-1, +1}
        which = draws.randint(0, self.n_strings, n)  # lead + (n,)
        chosen = which[..., None, None].expand(*which.shape, 1, self.n_bits)
        target = strings.gather(-2, chosen).squeeze(-2)  # lead + (n, bits)
        keep = draws.rand((n, self.n_bits)) >= self.mask_prob
        query = target * keep  # masked bits read 0
        x = torch.cat([strings.flatten(-2), query], dim=-1)  # lead + (n, 6 * bits)
        x = x.unflatten(-1, (-1, self.patch))  # lead + (n, 6 * bits / patch, patch)
        y = (target > 0).long().unflatten(-1, (-1, self.patch))  # lead + (n, bits / patch, patch)
        return Batch(x, y)
