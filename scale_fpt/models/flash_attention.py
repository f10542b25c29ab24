"""Fused causal attention with keyed dropout: a flash-style Triton kernel, forward and backward.

The materialised attention (``ops.causal_attention`` on a CPU) holds the (N, H, Tq, T)
probabilities to drop them with a keyed mask; torch's fused kernels (SDPA) cannot take that
mask. Here each program walks blocks of keys with an online softmax and never stores the
probabilities: memory is O(N H T hd), and the dropout mask is drawn inside the kernel from
the same counter-based generator as ``keyed_random.keep_mask_rows``:

    element (n, h, query position i, key j) of a (N, H, T, T) logical probability tensor
    split into one chunk of N / C batch rows per key: draw ((n mod N/C) H + h) T + i) T + j
    of SplitMix64 with state keys[n div N/C], kept when its top 32 bits >= round(p 2^32),
    scaled by 2^32 / (2^32 - round(p 2^32))

(uint64 arithmetic, which wraps as the int64 torch ops do), so a packed member draws its solo
masks, and computing only some queries (``positions``: the read-out rows) draws what the full
computation draws for them. The backward pass recomputes the probabilities from the saved
log-sum-exp and the mask from the keys (FlashAttention-2's scheme: one kernel for dK and dV
over query blocks, one for dQ over key blocks, no atomics).

The kernels are ``torch.library`` custom ops, so ``torch.compile`` treats them as opaque
calls and CUDA graphs replay them (no host reads). On CPU tensors they run only under
Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported): numpy,
slow, for checking them on small shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 64
"""Query and key block size on a GPU (tests pass smaller ones to cross block edges)."""


def _interpreter_loop_bounds() -> None:
    """Let Triton's interpreter take a tensor as a loop bound under numpy >= 2.3: it calls
    ``int()`` on the scalar's (1,) array, which those numpy versions refuse; ``.item()``
    is the same number. (Triton 3.6; the compiled kernels are not affected.)"""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "scale_fpt_loop_bounds", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.scale_fpt_loop_bounds = True
    interpreter._patch_lang_tensor = patched


if triton.knobs.runtime.interpret:
    _interpreter_loop_bounds()


@triton.jit
def _keep(key, row, offs_n, threshold):
    """Whether the draws at counters ``row[:, None] + offs_n[None, :]`` (int64) of the
    uint64 ``key`` are kept: SplitMix64's output at counter + 1, top 32 bits >= threshold."""
    counter = (row[:, None] + offs_n[None, :] + 1).to(tl.uint64, bitcast=True)
    z = key + counter * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 32).to(tl.int64) >= threshold


@triton.jit
def _query_rows(POS, KEYS, n, h, offs_m, m_valid, Tq, H, T, ROWS_PER_KEY, FULL: tl.constexpr):
    """Positions of a block of queries, the uint64 key of their batch row and the first
    counter of each query's row of the logical (T, T) probabilities."""
    if FULL:
        pos = offs_m
    else:
        pos = tl.load(POS + n * Tq + offs_m, mask=m_valid, other=0)
    key = tl.load(KEYS + n // ROWS_PER_KEY).to(tl.uint64, bitcast=True)
    row = (((n % ROWS_PER_KEY) * H + h) * T + pos).to(tl.int64) * T
    return pos, key, row


@triton.jit
def _keys_end(pid_m, T, BLOCK_M: tl.constexpr, FULL: tl.constexpr):
    """The end of the keys a block of queries sees: its last position + 1 when the queries
    are all T positions, else T (a block of chosen positions sees at most that)."""
    if FULL:
        end = tl.minimum((pid_m + 1) * BLOCK_M, T)
    else:
        end = T
    return end


@triton.jit
def _forward_kernel(
    Q, K, V, O, LSE, POS, KEYS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, so_n, so_h, so_t,
    H, Tq, T, ROWS_PER_KEY, sm_scale, threshold, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    nh = tl.program_id(1).to(tl.int64)
    n, h = nh // H, nh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid, d_valid = offs_m < Tq, offs_d < HEAD_DIM
    pos, key, row = _query_rows(POS, KEYS, n, h, offs_m, m_valid, Tq, H, T, ROWS_PER_KEY, FULL)
    q_mask = m_valid[:, None] & d_valid[None, :]
    q = tl.load(Q + n * sq_n + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_mask)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = _keys_end(pid_m, T, BLOCK_M, FULL)
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
        k = tl.load(K + n * sk_n + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_mask)
        v = tl.load(V + n * sv_n + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        s = tl.where(offs_n[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the normaliser counts dropped elements
        if DROPOUT:
            p = tl.where(_keep(key, row, offs_n, threshold), p * keep_scale, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + n * so_n + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], acc, mask=q_mask)
    tl.store(LSE + nh * Tq + offs_m, m_i + tl.log(l_i), mask=m_valid)


@triton.jit
def _key_grads_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, POS, KEYS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, sd_n, sd_h, sd_t,
    H, Tq, T, ROWS_PER_KEY, sm_scale, threshold, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of one block of keys, over every query block that can see it (dK and dV
    are written contiguous (N, H, T, hd))."""
    pid_n = tl.program_id(0)
    nh = tl.program_id(1).to(tl.int64)
    n, h = nh // H, nh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
    k = tl.load(K + n * sk_n + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_mask)
    v = tl.load(V + n * sv_n + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_mask)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if FULL else 0  # earlier queries see none
    for start_m in range(lo, Tq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < Tq
        pos, key, row = _query_rows(POS, KEYS, n, h, offs_m, m_valid, Tq, H, T, ROWS_PER_KEY, FULL)
        q_mask = m_valid[:, None] & d_valid[None, :]
        q = tl.load(Q + n * sq_n + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_mask)
        do = tl.load(DO + n * sd_n + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :], mask=q_mask)
        lse = tl.load(LSE + nh * Tq + offs_m, mask=m_valid, other=0.0)
        delta = tl.load(DELTA + nh * Tq + offs_m, mask=m_valid, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        visible = (offs_n[None, :] <= pos[:, None]) & m_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            kept = _keep(key, row, offs_n, threshold)
            dropped = tl.where(kept, p * keep_scale, 0.0)
            dp = tl.where(kept, dp * keep_scale, 0.0)
        else:
            dropped = p
        dv += tl.dot(tl.trans(dropped.to(do.dtype)), do, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    out = nh * T * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk * sm_scale, mask=kv_mask)
    tl.store(DV + out, dv, mask=kv_mask)


@triton.jit
def _query_grads_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, POS, KEYS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, sd_n, sd_h, sd_t,
    H, Tq, T, ROWS_PER_KEY, sm_scale, threshold, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of one block of queries, over the keys they see (dQ written contiguous)."""
    pid_m = tl.program_id(0)
    nh = tl.program_id(1).to(tl.int64)
    n, h = nh // H, nh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid, d_valid = offs_m < Tq, offs_d < HEAD_DIM
    pos, key, row = _query_rows(POS, KEYS, n, h, offs_m, m_valid, Tq, H, T, ROWS_PER_KEY, FULL)
    q_mask = m_valid[:, None] & d_valid[None, :]
    q = tl.load(Q + n * sq_n + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_mask)
    do = tl.load(DO + n * sd_n + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :], mask=q_mask)
    lse = tl.load(LSE + nh * Tq + offs_m, mask=m_valid, other=0.0)
    delta = tl.load(DELTA + nh * Tq + offs_m, mask=m_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = _keys_end(pid_m, T, BLOCK_M, FULL)
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
        k = tl.load(K + n * sk_n + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_mask)
        v = tl.load(V + n * sv_n + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        visible = (offs_n[None, :] <= pos[:, None]) & m_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            dp = tl.where(_keep(key, row, offs_n, threshold), dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    out = nh * Tq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq * sm_scale, mask=q_mask)


def _launch_args(q, k, v, positions, keys, scale, p, block):
    """The arguments every kernel shares after its tensors, and the dropout switches."""
    N, H, Tq, hd = q.shape
    T = k.shape[-2]
    threshold = round(p * 2**32)
    keep_scale = 2**32 / (2**32 - threshold)
    dropout = keys is not None and p > 0.0
    rows_per_key = N // len(keys) if dropout else 1
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    scalars = (H, Tq, T, rows_per_key, scale, threshold, keep_scale)
    meta = {
        "HEAD_DIM": hd,
        "BLOCK_D": max(16, triton.next_power_of_2(hd)),
        "BLOCK_M": block,
        "BLOCK_N": block,
        "FULL": positions is None,
        "DROPOUT": dropout,
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }
    return strides, scalars, meta


def _pointers(q, positions, keys):
    """Stand-ins for absent positions and keys (the kernels do not read them then)."""
    empty = torch.zeros(1, dtype=torch.int64, device=q.device)
    return (empty if positions is None else positions.contiguous()), (
        empty if keys is None else keys
    )


def _check(q, k, v, positions, keys):
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("flash attention needs q, k, v with a contiguous last dimension")
    if keys is not None and q.shape[0] % len(keys):
        raise ValueError(f"{q.shape[0]} batch rows do not split into {len(keys)} key chunks")
    if positions is None and q.shape[-2] != k.shape[-2]:
        raise ValueError("without positions the queries must be all T positions")


@torch.library.custom_op("scale_fpt::flash_attention_forward", mutates_args=())
def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor | None,
    keys: torch.Tensor | None,
    scale: float,
    p: float,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (N, H, Tq, hd), log-sum-exp (N, H, Tq) float32) of causal attention with keyed
    dropout (see the module docstring)."""
    _check(q, k, v, positions, keys)
    N, H, Tq, hd = q.shape
    out = torch.empty(N, H, Tq, hd, dtype=q.dtype, device=q.device)
    lse = torch.empty(N, H, Tq, dtype=torch.float32, device=q.device)
    strides, scalars, meta = _launch_args(q, k, v, positions, keys, scale, p, block)
    pos, key_tensor = _pointers(q, positions, keys)
    grid = (triton.cdiv(Tq, block), N * H)
    _forward_kernel[grid](
        q, k, v, out, lse, pos, key_tensor, *strides, *out.stride()[:3], *scalars, **meta
    )
    return out, lse


@flash_forward.register_fake
def _(q, k, v, positions, keys, scale, p, block):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("scale_fpt::flash_attention_backward", mutates_args=())
def flash_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    positions: torch.Tensor | None,
    keys: torch.Tensor | None,
    scale: float,
    p: float,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``flash_forward`` for the output gradient ``grad``."""
    N, H, Tq, hd = q.shape
    T = k.shape[-2]
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    delta = (grad.float() * out.float()).sum(-1)  # (N, H, Tq): rowsum(dO * O)
    dq = torch.empty(N, H, Tq, hd, dtype=torch.float32, device=q.device)
    dk = torch.empty(N, H, T, hd, dtype=torch.float32, device=q.device)
    dv = torch.empty_like(dk)
    strides, scalars, meta = _launch_args(q, k, v, positions, keys, scale, p, block)
    pos, key_tensor = _pointers(q, positions, keys)
    tensors = (q, k, v, grad, lse, delta)
    _key_grads_kernel[(triton.cdiv(T, block), N * H)](
        *tensors, dk, dv, pos, key_tensor, *strides, *grad.stride()[:3], *scalars, **meta
    )
    _query_grads_kernel[(triton.cdiv(Tq, block), N * H)](
        *tensors, dq, pos, key_tensor, *strides, *grad.stride()[:3], *scalars, **meta
    )
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@flash_backward.register_fake
def _(grad, q, k, v, out, lse, positions, keys, scale, p, block):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, positions, keys, scale, p, block = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, positions, keys)
    ctx.scale, ctx.p, ctx.block = scale, p, block


def _backward(ctx, grad, grad_lse):
    q, k, v, out, lse, positions, keys = ctx.saved_tensors
    dq, dk, dv = flash_backward(grad, q, k, v, out, lse, positions, keys, ctx.scale, ctx.p, ctx.block)
    return dq, dk, dv, None, None, None, None, None


flash_forward.register_autograd(_backward, setup_context=_setup_context)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    positions: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    p: float = 0.0,
    block: int = BLOCK,
) -> torch.Tensor:
    """Causal attention, q (N, H, Tq, hd), k and v (N, H, T, hd) -> (N, H, Tq, hd), with
    dropout ``p`` on the probabilities keyed on ``keys`` ((C,) int64, one per chunk of N / C
    batch rows; None: no dropout). ``positions`` (N, Tq) int64: the queries' positions among
    the keys; None: Tq == T, query i at position i."""
    out, _ = flash_forward(q, k, v, positions, keys, scale, p, block)
    return out
