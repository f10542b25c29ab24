"""Counter-based random numbers in torch ops: the same draws on every device, no generator.

A trial's per-step randomness (training batches, augmentation, dropout masks) is a pure
function of a *key* (derived from its seed, the step and a stream or site with ``mix64``)
and of the element's position: element i of a key's stream is SplitMix64's output for
state ``key`` at counter i + 1. Computed with int64 tensor arithmetic (which wraps like the
uint64 of the definition) on whatever device the tensor lives on, so

- a training batch is drawn where the model trains: no host-to-device copy per step, which
  on a GPU is a copy from pageable memory and waits for the stream (a host sync);
- the draws are the same on a CPU and a GPU, in any dtype (floats are built from the top
  24 bits, exact in float32): a trial's data does not depend on where it ran;
- the fused CPU dropout kernel (``models/csrc/fused_cpu.cpp``) draws element j of a chunk
  as ``splitmix64(seed, j)``: ``Draws(seed).bits`` are the same numbers, so the torch-op
  dropout masks (GPU, bf16) equal the fused kernel's.

SplitMix64 (Steele, Lea and Flood 2014) passes BigCrush; keys from ``mix64`` of distinct
inputs are unrelated, so streams of different seeds, steps and streams do not overlap in
any way that matters here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MASK64 = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def mix64(a: int, b: int) -> int:
    """A 63-bit key from two integers: SplitMix64's finaliser of ``a + (b + 1) * golden``
    (distinct inputs give unrelated keys; non-negative, so it is a valid torch seed)."""
    z = (a + (b + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return (z ^ (z >> 31)) >> 1


def stream_key(seed: int | torch.Tensor, step: int, stream: int) -> int | torch.Tensor:
    """The key of one step's draws of one stream of a seed (of each seed of an int64 tensor
    of seeds: the same keys, made on the tensor's device)."""
    if isinstance(seed, torch.Tensor):
        return mix64_tensor(mix64_tensor(seed, step), stream)
    return mix64(mix64(seed, step), stream)


def _signed(value: int) -> int:
    """The int64 with the bits of the uint64 ``value``."""
    value &= MASK64
    return value - 2**64 if value >= 2**63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch's ``>>`` is arithmetic on signed ints)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _finalise(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function, in place on int64 ``z``."""
    z = (z ^ _shift_right(z, 30)).mul_(_signed(MIX1))
    z = (z ^ _shift_right(z, 27)).mul_(_signed(MIX2))
    return z ^ _shift_right(z, 31)


def splitmix64(key: int | torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output for state ``key`` at ``counters + 1`` (int64 tensor of the uint64
    bits), element-wise, on ``counters``' device; a tensor ``key`` broadcasts against
    ``counters`` (e.g. keys (C, 1) and counters (n,) give C streams of n)."""
    z = counters.add(1).mul_(_signed(GOLDEN))
    return _finalise(z + (_signed(key) if isinstance(key, int) else key))


def opaque_counters(counters: torch.Tensor) -> torch.Tensor:
    """``counters`` itself (in place), made opaque to torch.compile's inductor: ``~(c ^ -1)``
    is c, but bitwise ops keep inductor from folding counters made of aranges into an index
    expression, whose constants (a position times ``GOLDEN``) overflow int64 there."""
    return counters.bitwise_xor_(-1).bitwise_not_()


def mix64_tensor(a: torch.Tensor, b: int | torch.Tensor) -> torch.Tensor:
    """``mix64`` element-wise on int64 tensors (or a tensor and an int): the same keys, made
    on the device (no host copy, and traceable by ``torch.compile``)."""
    step = _signed((b + 1) * GOLDEN) if isinstance(b, int) else (b + 1) * _signed(GOLDEN)
    return _shift_right(_finalise(a + step), 1)


class Draws:
    """The stream of one key, or of each of K keys (an int64 tensor (K,)), on one device.
    Each call takes the next block of counters, so successive calls are independent and a
    sequence of calls is reproducible. With K keys every draw has a leading axis of K (the
    members of a cohort): row i is exactly what ``Draws(int(keys[i]))`` draws."""

    def __init__(self, key: int | torch.Tensor, device: torch.device | str = "cpu"):
        self.key = key
        self.device = torch.device(device)
        self.offset = 0

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading shape of every draw: () for one key, (K,) for K keys."""
        return () if isinstance(self.key, int) else (len(self.key),)

    def bits(self, shape: Sequence[int] | int) -> torch.Tensor:
        """Uniform 64-bit integers (int64 holding the uint64 bits), shape lead + ``shape``."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = 1
        for size in shape:
            n *= size
        counters = opaque_counters(torch.arange(self.offset, self.offset + n, device=self.device))
        self.offset += n
        key = self.key if isinstance(self.key, int) else self.key.view(-1, 1)
        return splitmix64(key, counters).view(*self.lead, *shape)

    def high32(self, shape: Sequence[int] | int) -> torch.Tensor:
        """Uniform integers in [0, 2^32): the top 32 bits of ``bits`` (int64)."""
        return _shift_right(self.bits(shape), 32)

    def rand(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Uniform floats in [0, 1) on a 2^-24 grid (exact in float32, the same everywhere)."""
        return _shift_right(self.bits(shape), 40).to(dtype).mul_(2.0**-24)

    def randint(self, low: int, high: int, shape: Sequence[int] | int) -> torch.Tensor:
        """Uniform integers in [low, high) (int64): the top 32 bits scaled to the range
        (multiply-shift; bias below (high - low) / 2^32)."""
        if not 0 < high - low <= 2**31:
            raise ValueError(f"randint needs 0 < high - low <= 2^31, got [{low}, {high})")
        return (self.high32(shape) * (high - low) >> 32) + low

    def permutation(self, n: int) -> torch.Tensor:
        """A uniform random permutation of ``range(n)`` (int64; one per key): the order of n
        draws (ties, at odds of about n^2 / 2^65, broken by position)."""
        return torch.argsort(self.bits(n), dim=-1, stable=True)


DRAW_BLOCK = 2**24
"""Elements of a dropout mask drawn at once. A draw holds several int64 temporaries per
element (counters, SplitMix64's rounds and shifts: ``DRAW_BYTES_PER_ELEMENT``), ~25x a
bf16 mask: the attention probabilities of a long sequence (B*H*T^2 elements, 168M for
gpt2-large at T = 1024 and batch 8) drawn whole would need ~9 GB for the draw alone. Larger
masks are drawn in blocks of this many elements (~0.9 GB of temporaries at most); under
``torch.compile`` the draw is one fused kernel that materialises none of them."""
DRAW_BYTES_PER_ELEMENT = 56
"""Bytes per element a block's draw holds at its peak, the mask included: 50.5 measured on
the CPU for a bf16 mask (``tests/test_gpu_path.py``), rounded up; the planner counts
``DRAW_BLOCK`` of them (``planner.attention_bytes``)."""


def keep_mask(keys: torch.Tensor, chunk: int, p: float, dtype: torch.dtype) -> torch.Tensor:
    """A (len(keys) * chunk,) dropout mask of ``dtype`` on ``keys``' device, one chunk per
    key: ``scale`` where the draw's top 32 bits are at least round(p * 2^32), else 0, with
    ``scale = 1 / (1 - p_quantised)``: exactly the fused CPU kernel's mask for those keys."""
    rows = torch.arange(len(keys), device=keys.device)
    return keep_mask_rows(keys, rows, 1, chunk, p, dtype)


def keep_mask_rows(
    keys: torch.Tensor,
    rows: torch.Tensor,
    rows_per_key: int,
    width: int,
    p: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The mask (``keep_mask``'s values) of some rows of a logical (len(keys) *
    ``rows_per_key``, ``width``) tensor split into one chunk of rows per key: (len(rows) *
    ``width``,), row i of it being logical row ``rows[i]``. Element (r, c) of the logical
    tensor is draw ``(r mod rows_per_key) * width + c`` of key ``r div rows_per_key``: a
    computation over some rows (a model's read-out rows) draws exactly what the whole
    tensor draws there, and one chunk's draws are that key's stream from its start. More
    than ``DRAW_BLOCK`` elements are drawn in blocks of rows and columns (the same numbers)."""
    threshold = round(p * 2**32)
    scale = 2**32 / (2**32 - threshold)
    n_rows = rows.shape[0]
    if torch.compiler.is_compiling() or n_rows * width <= DRAW_BLOCK:
        keep = _keep_block(keys, rows, rows_per_key, width, 0, width, threshold, scale)
        return keep.view(-1).to(dtype)  # scale rounded to float32 as there
    out = torch.empty(n_rows, width, dtype=dtype, device=rows.device)
    row_step, column_step = max(1, DRAW_BLOCK // width), min(width, DRAW_BLOCK)
    for first_row in range(0, n_rows, row_step):
        block = slice(first_row, first_row + row_step)
        for first in range(0, width, column_step):
            stop = min(width, first + column_step)
            out[block, first:stop] = _keep_block(
                keys, rows[block], rows_per_key, width, first, stop, threshold, scale
            )
    return out.view(-1)


def _keep_block(
    keys: torch.Tensor,
    rows: torch.Tensor,
    rows_per_key: int,
    width: int,
    first: int,
    stop: int,
    threshold: int,
    scale: float,
) -> torch.Tensor:
    """(len(rows), stop - first) float32: columns ``first:stop`` of ``keep_mask_rows``."""
    columns = torch.arange(first, stop, device=rows.device)
    counters = opaque_counters((rows % rows_per_key).unsqueeze(1) * width + columns)
    row_keys = keys.index_select(0, rows // rows_per_key).unsqueeze(1)  # (R, 1)
    keep = _shift_right(splitmix64(row_keys, counters), 32) >= threshold
    return keep.to(torch.float32).mul_(scale)


__all__ = [
    "Draws",
    "keep_mask",
    "keep_mask_rows",
    "mix64",
    "mix64_tensor",
    "splitmix64",
    "stream_key",
]
