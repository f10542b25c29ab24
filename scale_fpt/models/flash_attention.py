"""Fused causal attention with keyed dropout: a flash-style Triton kernel, forward and backward.

The materialised attention (``ops.causal_attention`` on a CPU) holds the (N, H, Tq, T)
probabilities to drop them with a keyed mask; torch's fused kernels (SDPA) cannot take that
mask. Here each program walks blocks of keys with an online softmax and never stores the
probabilities: memory is O(N H T hd), and the dropout mask is drawn inside the kernel from
the same counter-based generator as ``keyed_random.keep_mask_rows``:

    element (n, h, query position i, key j) of a (N, H, T, T) logical probability tensor
    split into one chunk of N / C batch rows per key: draw ((n mod N/C) H + h) T + i) T + j
    of SplitMix64 with state mix64(keys[n div N/C], site) (the site's key of that chunk,
    made in the kernel from the step's keys), kept when its top 32 bits >= round(p 2^32),
    scaled by 2^32 / (2^32 - round(p 2^32))

(uint64 arithmetic, which wraps as the int64 torch ops do), so a packed member draws its solo
masks, and computing only some queries (``positions``: the read-out rows) draws what the full
computation draws for them. The forward is the only place the mask is drawn (one hash per
attention element): it writes the kept flags bit-packed, one bit per (query, key) it visits,
and the backward reads them. The backward recomputes the probabilities from the saved
log-sum-exp (FlashAttention-2's scheme, no atomics) in two launches: one kernel for dQ over
key blocks, which first computes ``delta = rowsum(dO * O)`` of its rows, then one for dK
and dV over query blocks; the gradients are written in the inputs' dtype.

The kernels are ``torch.library`` custom ops, so ``torch.compile`` treats them as opaque
calls and CUDA graphs replay them (no host reads). On CPU tensors they run only under
Triton's interpreter (``TRITON_INTERPRET=1`` set when ``flash_kernels`` is imported):
numpy, slow, for checking them on small shapes.
"""

from __future__ import annotations

import torch
import triton

from scale_fpt.models import flash_kernels
from scale_fpt.models.heads import unstack_heads

BLOCK = 64
"""Query and key block size on a GPU (tests pass smaller ones to cross block edges)."""


def _launch_args(q, positions, dropout, p, block):
    """The threshold and scale of kept draws, and the kernels' shared compile-time
    arguments."""
    hd = q.shape[-1]
    threshold = round(p * 2**32)
    keep_scale = 2**32 / (2**32 - threshold)
    meta = {
        "HEAD_DIM": hd,
        "BLOCK_D": max(16, triton.next_power_of_2(hd)),
        "BLOCK_M": block,
        "BLOCK_N": block,
        "FULL": positions is None,
        "DROPOUT": dropout,
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }
    return threshold, keep_scale, meta


def _dropout(keys, p) -> bool:
    return keys is not None and p > 0.0


def _mask_shape(q, k, keys, p) -> tuple[int, ...]:
    """The bit-packed dropout mask's shape: (N, H, Tq, cdiv(T, 8)) bytes, one bit per
    (query, key); one unread byte without dropout."""
    return (*q.shape[:3], triton.cdiv(k.shape[-2], 8)) if _dropout(keys, p) else (1,)


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor of ``x``'s shape, (N, H, T, hd) or (S, N, H, T, hd) for S stacked,
    over (N, T, [S,] H, hd) memory: the heads of a token side by side, as a projection
    writes and reads them, so that the output's projection reads it and a stacked input's
    gradient goes back through its projection as views, not copies."""
    if x.dim() == 4:
        N, H, T, hd = x.shape
        return x.new_empty(N, T, H, hd).transpose(1, 2)
    S, N, H, T, hd = x.shape
    return x.new_empty(N, T, S, H, hd).permute(2, 0, 3, 1, 4)


def _stand_in(q, tensor):
    """An absent positions or keys tensor: one unread element (the kernels read no
    positions then, and load the keys' first element without using it). ``empty``: no
    kernel launch."""
    if tensor is None:
        return torch.empty(1, dtype=torch.int64, device=q.device)
    return tensor.contiguous()


def _check(q, k, v, positions, keys, block):
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("flash attention needs q, k, v with a contiguous last dimension")
    if keys is not None and q.shape[0] % len(keys):
        raise ValueError(f"{q.shape[0]} batch rows do not split into {len(keys)} key chunks")
    if positions is None and q.shape[-2] != k.shape[-2]:
        raise ValueError("without positions the queries must be all T positions")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block {block} is not a power of 2 >= 16")


@torch.library.custom_op("scale_fpt::flash_attention_forward", mutates_args=())
def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    positions: torch.Tensor | None,
    keys: torch.Tensor | None,
    site: int,
    scale: float,
    p: float,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (N, H, Tq, hd), log-sum-exp (N, H, Tq) float32, the bit-packed dropout mask
    (``_mask_shape``) uint8) of causal attention with keyed dropout (see the module
    docstring) of ``unstack_heads(q, k, v)``: one kernel launch. ``out`` is laid out
    token-major (``_token_major``)."""
    q, k, v = unstack_heads(q, k, v)
    _check(q, k, v, positions, keys, block)
    N, H, Tq, _ = q.shape
    T = k.shape[-2]
    out = _token_major(q)
    lse = torch.empty(N, H, Tq, dtype=torch.float32, device=q.device)
    mask = torch.empty(_mask_shape(q, k, keys, p), dtype=torch.uint8, device=q.device)
    dropout = _dropout(keys, p)
    threshold, keep_scale, meta = _launch_args(q, positions, dropout, p, block)
    rows_per_key = N // len(keys) if dropout else N  # no keys: the stand-in's row
    flash_kernels.forward_kernel[(N * H, triton.cdiv(Tq, block))](
        q, k, v, out, lse, mask, _stand_in(q, positions), _stand_in(q, keys),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        H, Tq, T, rows_per_key, site, scale, threshold, keep_scale, **meta,
    )  # fmt: skip
    return out, lse, mask


@flash_forward.register_fake
def _(q, k, v, positions, keys, site, scale, p, block):
    q, k, v = unstack_heads(q, k, v)
    mask = q.new_empty(_mask_shape(q, k, keys, p), dtype=torch.uint8)
    return _token_major(q), q.new_empty(q.shape[:3], dtype=torch.float32), mask


@torch.library.custom_op("scale_fpt::flash_attention_backward", mutates_args=())
def flash_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor | None,
    scale: float,
    p: float,
    dropout: bool,
    block: int,
) -> list[torch.Tensor]:
    """The gradients of ``flash_forward``'s tensors among q, k, v (in that order, stacked
    as they were given) for the output gradient ``grad``, laid out token-major
    (``_token_major``): two kernel launches, no torch kernels (written in q's dtype)."""
    grads = [_token_major(t) for t in (q, k, v) if t is not None]
    dq, dk, dv = unstack_heads(*grads, *[None] * (3 - len(grads)))
    q, k, v = unstack_heads(q, k, v)
    N, H, Tq, _ = q.shape
    T = k.shape[-2]
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    delta = torch.empty(N, H, Tq, dtype=torch.float32, device=q.device)
    _, keep_scale, meta = _launch_args(q, positions, dropout, p, block)
    pos = _stand_in(q, positions)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    scalars = (H, Tq, T, scale, keep_scale)
    flash_kernels.query_grads_kernel[(N * H, triton.cdiv(Tq, block))](
        q, k, v, out, grad, lse, mask, delta, dq, pos,
        *strides, *out.stride()[:3], *grad.stride()[:3], *dq.stride()[:3], *scalars, **meta,
    )  # fmt: skip
    flash_kernels.key_grads_kernel[(N * H, triton.cdiv(T, block))](
        q, k, v, grad, lse, mask, delta, dk, dv, pos,
        *strides, *grad.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], *scalars, **meta,
    )  # fmt: skip
    return grads


@flash_backward.register_fake
def _(grad, q, k, v, out, lse, mask, positions, scale, p, dropout, block):
    return [_token_major(t) for t in (q, k, v) if t is not None]


def _setup_context(ctx, inputs, output):
    q, k, v, positions, keys, _, scale, p, block = inputs
    out, lse, mask = output
    ctx.save_for_backward(q, k, v, out, lse, mask, positions)
    ctx.set_materialize_grads(False)  # the unused lse and mask gradients: no zeros to fill
    ctx.scale, ctx.p, ctx.dropout, ctx.block = scale, p, _dropout(keys, p), block


def _backward(ctx, grad, grad_lse, grad_mask):
    q, k, v, out, lse, mask, positions = ctx.saved_tensors
    grads = flash_backward(
        grad, q, k, v, out, lse, mask, positions, ctx.scale, ctx.p, ctx.dropout, ctx.block
    )
    return *grads, *[None] * (3 - len(grads)), None, None, None, None, None, None


flash_forward.register_autograd(_backward, setup_context=_setup_context)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    scale: float,
    positions: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    p: float = 0.0,
    block: int = BLOCK,
    site: int = 0,
) -> torch.Tensor:
    """Causal attention, q (N, H, Tq, hd), k and v (N, H, T, hd), or stacked as
    ``ops.unstack_heads`` takes them -> (N, H, Tq, hd) (laid out token-major:
    ``_token_major``; so are the inputs' gradients, one per tensor given), with dropout ``p`` on the probabilities keyed on the keys
    of dropout site ``site`` of a step whose keys are ``keys`` ((C,) int64, one per chunk of
    N / C batch rows, ``ops.step_keys``; None: no dropout): the kernel derives the site's
    keys itself (``ops.DropoutSites.next``'s). ``positions`` (N, Tq) int64: the queries'
    positions among the keys; None: Tq == T, query i at position i."""
    out, _, _ = flash_forward(q, k, v, positions, keys, site, scale, p, block)
    return out
