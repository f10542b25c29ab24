"""The Triton kernels of ``flash_attention``: causal attention with keyed dropout. The
forward (online softmax over key blocks) draws the dropout mask, the only place it is drawn,
and writes it bit-packed; the backward reads those bits: one kernel for dQ over key blocks
(it computes ``delta = rowsum(dO * O)`` first, for its own rows), then one for dK and dV
over query blocks (see ``flash_attention``'s docstring).

Compiled for a GPU, or run by Triton's interpreter on CPU tensors when
``TRITON_INTERPRET=1`` was set before Triton was imported (Triton's own rule).
"""

from __future__ import annotations

import triton
import triton.language as tl


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
def _site_key(step_key, site):
    """``keyed_random.mix64_tensor(step_key, site)``: the key of dropout site ``site`` of a
    step, in uint64 arithmetic (``ops.DropoutSites.next``'s keys, made here instead of by a
    kernel of their own before each launch)."""
    z = step_key + tl.cast(site + 1, tl.uint64) * 0x9E3779B97F4A7C15  # site: a runtime int
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return (z ^ (z >> 31)) >> 1


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
def _store_mask(MASK, offs_m, m_valid, start_n, kept, T, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):  # fmt: skip
    """Write a (BLOCK_M, BLOCK_N) tile of kept flags into the bit-packed mask of one (batch
    row, head): query row i's keys j at byte j // 8, bit j % 8, rows of cdiv(T, 8) bytes."""
    bits = kept.to(tl.int32) << (tl.arange(0, BLOCK_N) % 8)[None, :]
    packed = tl.sum(tl.reshape(bits, (BLOCK_M, BLOCK_N // 8, 8)), axis=2)  # distinct bits
    row_bytes = tl.cdiv(T, 8)
    cols = start_n // 8 + tl.arange(0, BLOCK_N // 8)
    valid = m_valid[:, None] & (cols < row_bytes)[None, :]
    tl.store(MASK + offs_m[:, None] * row_bytes + cols[None, :], packed.to(tl.uint8), mask=valid)


@triton.jit
def _kept(MASK, offs_m, m_valid, offs_n, T):
    """The kept flags of a (queries, keys) tile, read back from ``_store_mask``'s bits."""
    row_bytes = tl.cdiv(T, 8)
    valid = m_valid[:, None] & (offs_n < T)[None, :]
    at = MASK + offs_m[:, None] * row_bytes + (offs_n // 8)[None, :]
    byte = tl.load(at, mask=valid, other=0).to(tl.int32)
    return ((byte >> (offs_n % 8)[None, :]) & 1) != 0


@triton.jit
def _tile(BASE, offs, stride, offs_d, mask):
    """A (rows, BLOCK_D) tile of a (T, hd) matrix with row ``stride``: zeros outside ``mask``
    (padded rows and head columns must add nothing to the products)."""
    return tl.load(BASE + offs[:, None] * stride + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _positions(POS, n, offs_m, m_valid, Tq, FULL: tl.constexpr):
    """The positions among the keys of a block of queries."""
    return offs_m if FULL else tl.load(POS + n * Tq + offs_m, mask=m_valid, other=0)


@triton.jit
def _keys_end(pid_m, T, BLOCK_M: tl.constexpr, FULL: tl.constexpr):
    """The end of the keys a block of queries sees: its last position + 1 when the queries
    are all T positions, else T (a block of chosen positions sees at most that)."""
    return tl.minimum((pid_m + 1) * BLOCK_M, T) if FULL else T


@triton.jit(do_not_specialize=["SITE"])  # one compilation for every site (1 included)
def forward_kernel(
    Q, K, V, OUT, LSE, MASK, POS, KEYS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, so_n, so_h, so_t,
    H, Tq, T, ROWS_PER_KEY, SITE, sm_scale, threshold, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The output and log-sum-exp of one block of queries; with dropout, the kept flags of
    every (query, key) tile it visits, into MASK (N H, Tq, cdiv(T, 8)) bytes. KEYS: the
    step's keys, one per chunk of batch rows; the mask's are those of dropout site SITE."""
    nh = tl.program_id(0).to(tl.int64)  # batch row x head: the large grid axis
    pid_m = tl.program_id(1)
    n, h = nh // H, nh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid, d_valid = offs_m < Tq, offs_d < HEAD_DIM
    pos = _positions(POS, n, offs_m, m_valid, Tq, FULL)
    # The first counter of each query's row of the logical (T, T) probabilities, and the
    # site's key of its chunk of batch rows.
    row = (((n % ROWS_PER_KEY) * H + h) * T + pos).to(tl.int64) * T
    key = _site_key(tl.load(KEYS + n // ROWS_PER_KEY).to(tl.uint64, bitcast=True), SITE)
    mask_rows = MASK + nh * Tq * tl.cdiv(T, 8)
    q_mask = m_valid[:, None] & d_valid[None, :]
    q = _tile(Q + n * sq_n + h * sq_h, offs_m, sq_t, offs_d, q_mask)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = _keys_end(pid_m, T, BLOCK_M, FULL)
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
        k = _tile(K + n * sk_n + h * sk_h, offs_n, sk_t, offs_d, kv_mask)
        v = _tile(V + n * sv_n + h * sv_h, offs_n, sv_t, offs_d, kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        s = tl.where(offs_n[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the normaliser counts dropped elements
        if DROPOUT:
            kept = _keep(key, row, offs_n, threshold)
            _store_mask(mask_rows, offs_m, m_valid, start_n, kept, T, BLOCK_M, BLOCK_N)
            p = tl.where(kept, p * keep_scale, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(OUT + n * so_n + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], acc, mask=q_mask)
    tl.store(LSE + nh * Tq + offs_m, m_i + tl.log(l_i), mask=m_valid)


@triton.jit
def query_grads_kernel(
    Q, K, V, OUT, DO, LSE, MASK, DELTA, DQ, POS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, so_n, so_h, so_t,
    sd_n, sd_h, sd_t, sdq_n, sdq_h, sdq_t, H, Tq, T, sm_scale, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of one block of queries, over the keys they see (dQ written with its strides), and
    the block's ``delta = rowsum(dO * O)`` into DELTA (N H, Tq) for ``key_grads_kernel``."""
    nh = tl.program_id(0).to(tl.int64)  # batch row x head: the large grid axis
    pid_m = tl.program_id(1)
    n, h = nh // H, nh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid, d_valid = offs_m < Tq, offs_d < HEAD_DIM
    pos = _positions(POS, n, offs_m, m_valid, Tq, FULL)
    mask_rows = MASK + nh * Tq * tl.cdiv(T, 8)
    q_mask = m_valid[:, None] & d_valid[None, :]
    q = _tile(Q + n * sq_n + h * sq_h, offs_m, sq_t, offs_d, q_mask)
    do = _tile(DO + n * sd_n + h * sd_h, offs_m, sd_t, offs_d, q_mask)
    o = _tile(OUT + n * so_n + h * so_h, offs_m, so_t, offs_d, q_mask)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)
    tl.store(DELTA + nh * Tq + offs_m, delta, mask=m_valid)
    lse = tl.load(LSE + nh * Tq + offs_m, mask=m_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = _keys_end(pid_m, T, BLOCK_M, FULL)
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
        k = _tile(K + n * sk_n + h * sk_h, offs_n, sk_t, offs_d, kv_mask)
        v = _tile(V + n * sv_n + h * sv_h, offs_n, sv_t, offs_d, kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        visible = (offs_n[None, :] <= pos[:, None]) & m_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            dp = tl.where(_kept(mask_rows, offs_m, m_valid, offs_n, T), dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    out = n * sdq_n + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :]
    tl.store(DQ + out, (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def key_grads_kernel(
    Q, K, V, DO, LSE, MASK, DELTA, DK, DV, POS,
    sq_n, sq_h, sq_t, sk_n, sk_h, sk_t, sv_n, sv_h, sv_t, sd_n, sd_h, sd_t,
    sdk_n, sdk_h, sdk_t, sdv_n, sdv_h, sdv_t, H, Tq, T, sm_scale, keep_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FULL: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of one block of keys, over every query block that can see it (written with
    their strides)."""
    nh = tl.program_id(0).to(tl.int64)  # batch row x head: the large grid axis
    pid_n = tl.program_id(1)
    n, h = nh // H, nh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    mask_rows = MASK + nh * Tq * tl.cdiv(T, 8)
    kv_mask = (offs_n < T)[:, None] & d_valid[None, :]
    k = _tile(K + n * sk_n + h * sk_h, offs_n, sk_t, offs_d, kv_mask)
    v = _tile(V + n * sv_n + h * sv_h, offs_n, sv_t, offs_d, kv_mask)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if FULL else 0  # earlier queries see none
    for start_m in range(lo, Tq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < Tq
        pos = _positions(POS, n, offs_m, m_valid, Tq, FULL)
        q_mask = m_valid[:, None] & d_valid[None, :]
        q = _tile(Q + n * sq_n + h * sq_h, offs_m, sq_t, offs_d, q_mask)
        do = _tile(DO + n * sd_n + h * sd_h, offs_m, sd_t, offs_d, q_mask)
        lse = tl.load(LSE + nh * Tq + offs_m, mask=m_valid, other=0.0)
        delta = tl.load(DELTA + nh * Tq + offs_m, mask=m_valid, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        visible = (offs_n[None, :] <= pos[:, None]) & m_valid[:, None]
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            kept = _kept(mask_rows, offs_m, m_valid, offs_n, T)
            dropped = tl.where(kept, p * keep_scale, 0.0)
            dp = tl.where(kept, dp * keep_scale, 0.0)
        else:
            dropped = p
        dv += tl.dot(tl.trans(dropped.to(do.dtype)), do, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    dk_at = DK + n * sdk_n + h * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :]
    tl.store(dk_at, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    dv_at = DV + n * sdv_n + h * sdv_h + offs_n[:, None] * sdv_t + offs_d[None, :]
    tl.store(dv_at, dv.to(DV.dtype.element_ty), mask=kv_mask)
