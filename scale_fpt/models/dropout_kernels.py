"""Keyed dropout (plus a residual add) in one Triton launch, forward and backward.

``ops.add_dropout(h, x)`` on a GPU with a keyed mask computed the mask from ~50 int64 torch
ops per site (counters, SplitMix64's rounds, casts): ~50 launches and ~360 bytes of memory
traffic per masked element. Here one kernel hashes each element's (key, counter), keeps or
drops it and adds ``h``, reading only x (and h) and writing the result; the backward launches
the same kernel on the output gradient, recomputing the mask from the keys (nothing is
stored). The mask is ``keyed_random.keep_mask_rows``'s, bit for bit:

    element (r, c) of a logical (len(keys) * rows_per_key, width) tensor is kept when the
    top 32 bits of SplitMix64(state keys[r div rows_per_key], counter
    (r mod rows_per_key) * width + c + 1) are >= round(p 2^32)

and a kept element is scaled by ``2^32 / (2^32 - round(p 2^32))`` rounded to float32 and
then to x's dtype, as the torch-op mask is, with ``h + x * scale`` rounded once (torch's
``addcmul``). The call's rows may be some rows of the logical tensor (``rows``: the read-out
rows of a model's last block).

The kernel is a ``torch.library`` custom op: ``torch.compile`` treats it as one opaque call
and CUDA graphs replay it. On CPU tensors it runs only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before Triton is imported): slow, for checking it on small shapes.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Elements per program."""


@triton.jit
def _dropout_add_kernel(
    X, H, OUT, KEYS, ROWS,
    n, width, rows_per_key, threshold, scale,
    HAS_H: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    row = offs // width
    column = offs - row * width
    if HAS_ROWS:
        row = tl.load(ROWS + row, mask=valid, other=0)
    key = tl.load(KEYS + row // rows_per_key, mask=valid, other=0).to(tl.uint64, bitcast=True)
    counter = ((row % rows_per_key) * width + column + 1).to(tl.uint64, bitcast=True)
    z = counter * 0x9E3779B97F4A7C15 + key
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    keep = (z >> 32).to(tl.int64) >= threshold
    x = tl.where(keep, tl.load(X + offs, mask=valid, other=0.0).to(tl.float32), 0.0)
    if HAS_H:  # one rounding, as torch's addcmul
        out = tl.fma(x, scale, tl.load(H + offs, mask=valid, other=0.0).to(tl.float32))
    else:
        out = x * scale
    if OUT.dtype.element_ty == tl.bfloat16:
        # Round to nearest even in integer ops (what torch and a GPU's conversion do; Triton's
        # interpreter truncates), so the cast below is exact everywhere.
        bits = out.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = bits.to(tl.float32, bitcast=True)
    tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=valid)


def keep_scale(p: float, dtype: torch.dtype) -> tuple[int, float]:
    """(threshold, scale) of the mask: the scale rounded as the torch-op mask rounds it
    (to float32, then to ``dtype``, to nearest even), in Python: no tensor, no host copy."""
    threshold = round(p * 2**32)
    scale = struct.unpack("f", struct.pack("f", 2**32 / (2**32 - threshold)))[0]
    if dtype == torch.float16:
        scale = struct.unpack("e", struct.pack("e", scale))[0]
    elif dtype == torch.bfloat16:
        bits = struct.unpack("I", struct.pack("f", scale))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        scale = struct.unpack("f", struct.pack("I", bits))[0]
    return threshold, scale


@torch.library.custom_op("scale_fpt::keyed_dropout_add", mutates_args=())
def keyed_dropout_add(
    x: torch.Tensor,
    h: torch.Tensor | None,
    keys: torch.Tensor,
    rows: torch.Tensor | None,
    total_rows: int,
    p: float,
) -> torch.Tensor:
    """``h + dropout(x)`` (``h`` None: ``dropout(x)``) with the keyed mask (module
    docstring): ``keys`` (C,) int64, one per chunk; ``rows`` (R,) int64: the logical rows
    of x viewed as (R, width) among ``total_rows`` (None: x is the whole logical tensor, one
    chunk per key)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if rows is None:
        width, rows_per_key = n // len(keys), 1
    else:
        width, rows_per_key = n // len(rows), total_rows // len(keys)
    threshold, scale = keep_scale(p, x.dtype)
    h_arg = x if h is None else h.contiguous()
    rows_arg = keys if rows is None else rows
    grid = (triton.cdiv(n, BLOCK),)
    _dropout_add_kernel[grid](
        x, h_arg, out, keys, rows_arg, n, width, rows_per_key, threshold, scale,
        HAS_H=h is not None, HAS_ROWS=rows is not None, BLOCK=BLOCK,
    )  # fmt: skip
    return out


@keyed_dropout_add.register_fake
def _(x, h, keys, rows, total_rows, p):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _, h, keys, rows, total_rows, p = inputs
    ctx.save_for_backward(keys, rows)
    ctx.total_rows, ctx.p, ctx.has_h = total_rows, p, h is not None


def _backward(ctx, grad):
    keys, rows = ctx.saved_tensors
    grad_x = keyed_dropout_add(grad, None, keys, rows, ctx.total_rows, ctx.p)
    return grad_x, (grad if ctx.has_h else None), None, None, None, None


keyed_dropout_add.register_autograd(_backward, setup_context=_setup_context)
