"""Fast CPU versions of the element-wise parts of a GPT-2 training step.

With the attention and feed-forward matrices frozen, a small-batch step's matrix products
run near the machine's peak and the rest of the step is element-wise work that torch's CPU
kernels do slowly (torch 2.13, AVX-512): dropout draws one Mersenne-Twister number per
element (~6 ns) and multiplies by a bool mask that is not vectorised; GPT-2's tanh-GELU is
bound by ``tanh`` (~2.5 ns per element); ``torch.softmax`` over rows of 10-64 keys is 5x
slower than its own composition. Here:

- float32 on a CPU: fused kernels (``csrc/fused_cpu.cpp``, built with torch's C++
  extension loader on first use, cached in ~/.cache/torch_extensions): GELU forward and
  backward in one vectorised pass each (sigmoid form, below); ``h + dropout(x)`` in one
  pass whose mask comes from a counter-based generator (SplitMix64 of (seed, element)), so
  the backward recomputes the mask instead of storing it. Dropout keeps with probability
  ``1 - p`` quantised to 2^-32.
- other CPU dtypes (bf16), or where the kernels cannot be built (no compiler; the loader
  warns once): compositions of torch ops. Dropout's mask is ``keyed_random.keep_mask``,
  the same SplitMix64 draws in int64 tensor arithmetic: the fused kernel's mask, bit for
  bit; GELU is ``x sigmoid(u)`` in in-place passes.
- on a GPU: torch's own kernels (``F.gelu``, SDPA; ``F.dropout`` when nothing keys the
  mask), and when something does, the Triton kernel of ``dropout_kernels`` (dropout and
  the residual add in one launch, the mask recomputed in the backward; the torch-op mask
  without Triton), so a trial draws the same masks on a GPU as on a CPU; attention with keyed dropout or read-out queries runs the Triton
  kernel of ``flash_attention``, which draws those masks inside (``attention_path``
  chooses; docs/attention.md).

Keyed masks: a step's keys are ``step_keys(member seeds, step)``, a (C,) int64 tensor made
on the device, and a ``DropoutSites`` over them numbers the dropout calls of one forward
pass. A model passes its sites to each call (``PackedFPT``: nothing but tensors and local
Python state, so ``torch.compile`` traces it into one graph and CUDA graphs can replay it),
or runs inside ``with dropout_keys(member_seeds, step)`` (the HF modules of a DeepSpeed
trial, which take no extra argument). Either way every dropout call is a *site* (numbered in call order within the forward pass: the embedding,
then per layer the attention probabilities and the two residual branches), and the mask of
member m at a site is a function of (member m's dropout seed, step, site) alone, drawn
element by element over the tensor a model computing every token holds there (``Rows``:
the last block's read-out rows draw what all rows draw for them). The leading
dimension of the tensor is split into one equal chunk per member (a packed cohort's (K, ...)
or (K*B, ...) layout, where a member's chunk is laid out as its tensor when it runs alone),
so a packed member draws exactly the masks it draws alone: the fused kernel and the torch-op
form (CPU bf16, GPU) both take one key per chunk and draw the same numbers from it.
Unkeyed calls (``pretrain``, other callers) take their seed from torch's default generator.

Kept elements are scaled by the exact ``1 / (1 - p_quantised)``, so the expected activation
is unchanged. GPT-2's ``0.5 x (1 + tanh(z))`` is exactly ``x sigmoid(2z)``: the sigmoid form
is the same function. ``SCALE_FPT_FUSED_CPU=0`` turns the fused kernels off.

Over 500 lines: each element-wise op's three forms (the fused CPU kernel, the torch-op
composition, the GPU's kernel) and the one dispatch that picks between them stay together,
so that a change to an op's semantics (its dropout keys, its mask) reaches every form at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.util
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from scale_fpt.keyed_random import keep_mask, keep_mask_rows, mix64_tensor
from scale_fpt.models.heads import unstack_heads

GELU_C = 2.0 * math.sqrt(2.0 / math.pi)  # tanh(z) = 2 sigmoid(2z) - 1, z = sqrt(2/pi)(x + a x^3)
GELU_A = 0.044715
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
"""transformers' names of the tanh approximation of GELU that ``gelu_tanh`` computes."""
KERNEL_SOURCE = Path(__file__).parent / "csrc" / "fused_cpu.cpp"

log = logging.getLogger(__name__)

TRITON = bool(importlib.util.find_spec("triton"))
"""Whether Triton is installed (a CUDA build of torch brings it): keyed dropout on a GPU then
runs ``dropout_kernels`` (one launch per call and per backward) instead of torch ops."""
FLASH = os.environ.get("SCALE_FPT_FLASH", "1") != "0" and TRITON
"""Whether the Triton attention kernel may run on a GPU: Triton is installed (a CUDA build of
torch brings it) and ``SCALE_FPT_FLASH=0`` did not turn it off when this module loaded. (A
constant: ``torch.compile`` reads it without tracing a call.)"""


@functools.cache
def fused_kernels():
    """The fused CPU kernels module, built on first use; None when turned off or when it
    cannot be built here (one warning names why; the torch-op forms are used instead)."""
    if os.environ.get("SCALE_FPT_FUSED_CPU", "1") == "0":
        return None
    from torch.utils.cpp_extension import load_inline

    try:
        source = KERNEL_SOURCE.read_text()
        # Built from the source's text, which torch writes into the build directory, and
        # named by its content: a build records no checkout path, so checkouts at other paths
        # (a node's synced tree, worktrees, other branches) sharing ~/.cache/torch_extensions
        # load one build instead of rebuilding over one another.
        return load_inline(
            name=f"scale_fpt_fused_cpu_{hashlib.sha1(source.encode()).hexdigest()[:10]}",
            cpp_sources=[source],
            no_implicit_headers=True,
            # -fno-trapping-math lets the compiler vectorise the branch-free selects;
            # -fopenmp makes at::parallel_for parallel. libgomp is not linked in: its symbols
            # resolve to the OpenMP runtime torch has loaded, so one thread pool serves both.
            extra_cflags=["-O3", "-fno-trapping-math", "-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # a missing compiler or headers: slower, never broken
        log.warning(
            "scale_fpt: fused CPU kernels unavailable (%s: %s); using torch ops (slower)",
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )
        return None


def on_gpu(x: torch.Tensor) -> bool:
    """Whether ``x``'s computation takes the GPU path: every GPU-or-CPU branch of this
    module reads this one predicate, so ``benchmarks/step_ops.py`` can replay the GPU path
    on a CPU (counting the kernels a CUDA run dispatches) by replacing it."""
    return x.is_cuda


def _fused(*tensors: torch.Tensor | None):
    """The fused kernels if every tensor is float32 on a CPU, else None (also while
    ``torch.compile`` traces: the torch-op forms, which it can fuse, draw the same masks)."""
    if torch.compiler.is_compiling():
        return None
    if any(t is not None and (on_gpu(t) or t.dtype != torch.float32) for t in tensors):
        return None
    return fused_kernels()


class DropoutSites:
    """The per-member keys of one forward pass: each dropout call (a *site*) takes the next
    site's keys, ``mix64(step key, site)`` per member, made on the device ``SITE_BLOCK``
    sites at a time (one short chain of element-wise ops for a whole forward pass, instead
    of one per site; each site's keys are then a row of the block, a view).

    A model passes it to its dropout calls explicitly (``PackedFPT``: traceable by
    ``torch.compile``, no context variable read in the graph), or ``dropout_keys`` makes it
    the keys of every call inside (models whose modules cannot take an argument)."""

    def __init__(self, step_keys: torch.Tensor, first_site: int = 0):
        self.step_keys = step_keys  # (C,) int64: one per member chunk
        self.site = first_site
        self._block_start, self._block = first_site, None

    def next(self) -> torch.Tensor:
        """(C,) keys of the next site (contiguous)."""
        _, site = self.next_site()
        if self._block is None or site >= self._block_start + SITE_BLOCK:
            self._block_start = site
            sites = torch.arange(site, site + SITE_BLOCK, device=self.step_keys.device)
            self._block = mix64_tensor(self.step_keys[None, :], sites[:, None])  # (S, C)
        return self._block[site - self._block_start]

    def next_site(self) -> tuple[torch.Tensor, int]:
        """The step's keys and the next site's number, for a kernel that makes the site's
        keys itself (``flash_attention``: compiled, a site's keys read by an opaque kernel
        would be a kernel launch of their own)."""
        site = self.site
        self.site += 1
        return self.step_keys, site


SITE_BLOCK = 128
"""Dropout sites whose keys are made at once: more than a 24-layer model's forward pass
(the embedding, then three per layer)."""


def step_keys(member_seeds: torch.Tensor | Sequence[int], step: int | torch.Tensor) -> torch.Tensor:
    """(C,) keys of one step: ``mix64(seed, step)`` of each member's dropout seed, on the
    seeds' device (a sequence of ints: on the CPU)."""
    return mix64_tensor(torch.as_tensor(member_seeds, dtype=torch.int64), step)


class StepKeys:
    """``step_keys(member_seeds, step)`` of successive steps, made ``STEP_BLOCK`` steps at a
    time on the seeds' device: a training step then takes its keys as a row of the block (a
    view, no kernel) instead of a chain of element-wise ops per step."""

    def __init__(self, member_seeds: torch.Tensor):
        self.member_seeds = member_seeds  # (C,) int64
        self._start, self._block = 0, None

    def at(self, step: int) -> torch.Tensor:
        """(C,) keys of ``step`` (contiguous)."""
        if self._block is None or not self._start <= step < self._start + STEP_BLOCK:
            self._start = step
            steps = torch.arange(step, step + STEP_BLOCK, device=self.member_seeds.device)
            self._block = mix64_tensor(self.member_seeds[None, :], steps[:, None])  # (S, C)
        return self._block[step - self._start]


STEP_BLOCK = 1024
"""Training steps whose dropout keys are made at once."""


_KEYS: contextvars.ContextVar[DropoutSites | None] = contextvars.ContextVar(
    "dropout_keys", default=None
)


@contextlib.contextmanager
def dropout_keys(
    member_seeds: torch.Tensor | Sequence[int], step: int | torch.Tensor
) -> Iterator[None]:
    """Key every dropout mask drawn inside on (member seed, ``step``, site): see the module
    docstring. ``member_seeds``: one per member chunk of the tensors, in order."""
    with keyed_by(step_keys(member_seeds, step)):
        yield


@contextlib.contextmanager
def keyed_by(keys: torch.Tensor) -> Iterator[None]:
    """``dropout_keys`` of the step whose keys (``step_keys``, ``StepKeys.at``) are ``keys``."""
    token = _KEYS.set(DropoutSites(keys))
    try:
        yield
    finally:
        _KEYS.reset(token)


_TRACED_SITES: list[DropoutSites | None] = [None]
"""The sites of a forward pass run by ``keyed_forward``: a module global, which torch.compile
traces into its graph (it cannot trace a ContextVar's read)."""


def keyed_forward(forward: Callable) -> Callable:
    """``forward(*args)`` taking ``step_keys`` (``StepKeys.at``) as a keyword: every dropout
    call inside is keyed as under ``keyed_by(step_keys)``, in a form torch.compile traces
    whole (a compiled engine's module; ``step_keys=None``: unkeyed, for evaluation)."""

    def call(*args, step_keys: torch.Tensor | None = None):
        _TRACED_SITES[0] = None if step_keys is None else DropoutSites(step_keys)
        try:
            return forward(*args)
        finally:
            _TRACED_SITES[0] = None

    return call


def _live_sites() -> DropoutSites | None:
    """The sites of the live ``keyed_forward`` or ``dropout_keys`` (None outside both)."""
    traced = _TRACED_SITES[0]
    if traced is not None or torch.compiler.is_compiling():
        return traced
    return _KEYS.get()


def keyed_checkpoint(function: Callable, *args):
    """torch's non-reentrant activation checkpoint of ``function(*args)`` whose recomputation
    in the backward pass draws the dropout masks its forward pass drew: the forward draws from
    the live ``dropout_keys`` (advancing its sites as without checkpointing); the
    recomputation, outside that context, replays the same keys from the same first site."""
    from torch.utils.checkpoint import checkpoint

    keys = _KEYS.get()
    first_site = None if keys is None else keys.site

    def run(*inputs):
        if keys is None or _KEYS.get() is keys:
            return function(*inputs)
        token = _KEYS.set(DropoutSites(keys.step_keys, first_site))
        try:
            return function(*inputs)
        finally:
            _KEYS.reset(token)

    return checkpoint(run, *args, use_reentrant=False)


def _site_keys(sites: DropoutSites | None) -> torch.Tensor | None:
    """The member keys of the next dropout site: of ``sites``, else of the live
    ``dropout_keys``; None outside both."""
    sites = sites if sites is not None else _live_sites()
    return None if sites is None else sites.next()


def _next_site(sites: DropoutSites | None) -> tuple[torch.Tensor | None, int]:
    """``DropoutSites.next_site`` of ``sites``, else of the live ``dropout_keys``; (None, 0)
    outside both."""
    sites = sites if sites is not None else _live_sites()
    return (None, 0) if sites is None else sites.next_site()


def _global_seed() -> list[int]:
    return [int(torch.empty((), dtype=torch.int64).random_())]


class Rows(NamedTuple):
    """Where a dropout call's rows sit in the tensor its mask is keyed on: the call's tensor,
    viewed as (len(index), width), is rows ``index`` of a logical (``total``, width) tensor,
    split into one chunk of rows per member. Each element's draw is keyed on its logical
    coordinates (``keyed_random.keep_mask_rows``), so a computation over some rows (the
    last block's read-out rows) draws the masks the full computation draws for them."""

    index: torch.Tensor  # (R,) int64 logical row of each row, in member order
    total: int  # rows of the logical tensor


class _FusedDropoutAdd(torch.autograd.Function):
    """``h + dropout(x)`` (``h`` may be None); the mask is recomputed from the seeds."""

    @staticmethod
    def forward(ctx, h, x, p, seeds, rows):
        ctx.p, ctx.seeds, ctx.rows, ctx.has_h = p, seeds, rows, h is not None
        h = None if h is None else h.contiguous()
        return fused_kernels().dropout_add(h, x.contiguous(), p, seeds, *_kernel_rows(rows))

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        grad_x = fused_kernels().dropout_add(None, grad, ctx.p, ctx.seeds, *_kernel_rows(ctx.rows))
        return (grad if ctx.has_h else None), grad_x, None, None, None


def _kernel_rows(rows: Rows | None) -> tuple[torch.Tensor | None, int]:
    """The fused kernel's ``rows, total_rows`` arguments."""
    return (None, 0) if rows is None else (rows.index.contiguous(), rows.total)


class _FusedGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.save_for_backward(x)
        return fused_kernels().gelu_forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return fused_kernels().gelu_backward(grad.contiguous(), x)


def dropout(
    x: torch.Tensor,
    p: float,
    training: bool = True,
    sites: DropoutSites | None = None,
    rows: Rows | None = None,
) -> torch.Tensor:
    """``F.dropout`` with the fast CPU mask; keyed by ``sites`` or the live ``dropout_keys``
    (``rows``: where x's rows sit in the tensor the mask is keyed on; None: x is all of it)."""
    return _dropout_then_add(None, x, p, training, sites, rows)


def add_dropout(
    h: torch.Tensor,
    x: torch.Tensor,
    p: float,
    training: bool = True,
    sites: DropoutSites | None = None,
    rows: Rows | None = None,
) -> torch.Tensor:
    """The residual update ``h + dropout(x)`` in one pass over the rows."""
    return _dropout_then_add(h, x, p, training, sites, rows)


def _dropout_then_add(
    h: torch.Tensor | None,
    x: torch.Tensor,
    p: float,
    training: bool,
    sites: DropoutSites | None,
    rows: Rows | None = None,
) -> torch.Tensor:
    """``dropout(x)``, plus ``h`` unless it is None: the fused kernel for float32 on a CPU,
    the torch-op keyed mask otherwise; torch's kernel on a GPU when nothing keys the mask."""
    if not training or p == 0.0:
        return x if h is None else h + x
    keys = _site_keys(sites)
    if keys is None and on_gpu(x):
        dropped = F.dropout(x, p, training=True)
        return dropped if h is None else h + dropped
    same = h is None or (h.shape == x.shape and h.dtype == x.dtype)
    if keys is not None and same and on_gpu(x) and TRITON and not torch.compiler.is_compiling():
        # Eager, one launch. Compiled, the torch-op mask below (the same bits): inductor fuses
        # it into the neighbouring kernels, where the custom op would stay an opaque launch.
        # Triton is optional on a CPU machine, so it is imported where it runs.
        from scale_fpt.models.dropout_kernels import keyed_dropout_add

        index, total = (None, 0) if rows is None else rows
        return keyed_dropout_add(x, h, keys, index, total, p)
    if (h is None or h.shape == x.shape) and _fused(h, x):
        seeds = _global_seed() if keys is None else keys.tolist()  # CPU keys: no sync
        return _FusedDropoutAdd.apply(h, x, p, seeds, rows)
    keep = keyed_keep(x, p, keys, rows).view(x.shape)
    return x * keep if h is None else torch.addcmul(h, x, keep)


def keyed_keep(
    x: torch.Tensor,
    p: float,
    keys: torch.Tensor | Sequence[int] | None,
    rows: Rows | None = None,
) -> torch.Tensor:
    """The torch-op mask of ``x`` (flat): one chunk per key, ``keyed_random.keep_mask`` (the
    fused kernel's mask for those keys; None: one key drawn from torch's default
    generator); with ``rows``, the mask of those rows of the logical tensor."""
    keys = torch.as_tensor(_global_seed() if keys is None else keys, dtype=torch.int64)
    keys = keys.to(x.device)
    if rows is None:
        return keep_mask(keys, x.numel() // len(keys), p, x.dtype)
    width = x.numel() // len(rows.index)
    return keep_mask_rows(keys, rows.index, rows.total // len(keys), width, p, x.dtype)


class _SigmoidGelu(torch.autograd.Function):
    """x sigmoid(u), u = C (x + A x^3): GPT-2's tanh-GELU; saves x and sigmoid(u)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        s = (x * x).mul_(GELU_C * GELU_A).add_(GELU_C).mul_(x).sigmoid_()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        # d/dx x s(u) = s + x s (1 - s) du/dx, du/dx = C (1 + 3 A x^2)
        slope = (x * x).mul_(3.0 * GELU_C * GELU_A).add_(GELU_C)
        slope.mul_(torch.addcmul(s, s, s, value=-1.0)).mul_(x).add_(s)
        return slope.mul_(grad)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's activation (``gelu_new``: the tanh approximation of GELU)."""
    if on_gpu(x):
        return F.gelu(x, approximate="tanh")
    if _fused(x):
        return _FusedGelu.apply(x)
    return _SigmoidGelu.apply(x)


def attention_path(q: torch.Tensor, dropout_p: float, keyed: bool, chosen_queries: bool) -> str:
    """Which kernel computes a causal attention: ``"sdpa"`` (torch's fused kernels: all
    queries and no dropout, or unkeyed dropout on a GPU), ``"flash"`` (the Triton kernel of
    ``flash_attention``, on a GPU where Triton is installed: keyed dropout or chosen
    queries, at fused-attention memory) or ``"materialised"`` (the (N, H, Tq, T)
    probabilities in torch ops: on a CPU, or without Triton)."""
    dropping = dropout_p > 0.0
    if not chosen_queries and (not dropping or (on_gpu(q) and not keyed)):
        return "sdpa"
    if on_gpu(q) and FLASH:
        return "flash"
    return "materialised"


def attention_rows(query_positions: torch.Tensor, n_head: int, T: int) -> Rows:
    """Where the attention probabilities of queries at ``query_positions`` (N, Tq) sit in the
    (N, H, T, T) probabilities of all queries: rows (n, h, position) of (N H T, T)."""
    N = query_positions.shape[0]
    heads = torch.arange(n_head, device=query_positions.device)
    batch = torch.arange(N, device=query_positions.device)
    index = (batch[:, None, None] * n_head + heads[None, :, None]) * T + query_positions[:, None]
    return Rows(index.reshape(-1), N * n_head * T)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    query_positions: torch.Tensor | None = None,
    sites: DropoutSites | None = None,
) -> torch.Tensor:
    """Causal softmax attention. q (N, H, Tq, hd), k and v (N, H, T, hd) (or stacked:
    ``unstack_heads``) -> (N, H, Tq, hd).

    ``query_positions`` (N, Tq): the positions of the queries among the T keys (a query
    attends to keys at or before its position); None: Tq == T and query i is at position i.
    Dropout on the attention probabilities as in GPT-2, keyed on each probability's place in
    the (N, H, T, T) probabilities of all queries: chosen queries draw the masks all
    queries draw for them. ``attention_path`` picks the kernel.
    """
    # (The live keys are read only when a mask is drawn.)
    keyed = dropout_p > 0.0 and (sites is not None or (on_gpu(q) and _live_sites() is not None))
    path = attention_path(q, dropout_p, keyed, query_positions is not None)
    if path != "flash":
        q, k, v = unstack_heads(q, k, v)
    if path == "sdpa":
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale
        )
    if path == "flash":
        from scale_fpt.models.flash_attention import flash_attention  # triton: GPU builds only

        keys, site = None, 0
        if dropout_p > 0.0:
            keys, site = _next_site(sites)
            if keys is None:  # unkeyed: one key from torch's generator, drawn on the device
                keys = torch.randint(0, 2**62, (1,), device=q.device)
        return flash_attention(q, k, v, scale, query_positions, keys, dropout_p, site=site)
    return materialised_attention(q, k, v, scale, dropout_p, query_positions, sites)


def materialised_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    dropout_p: float = 0.0,
    query_positions: torch.Tensor | None = None,
    sites: DropoutSites | None = None,
) -> torch.Tensor:
    """``causal_attention`` through the (N, H, Tq, T) probabilities in torch ops (the CPU's
    path; on a GPU, the reference the Triton kernel is measured against)."""
    H, T = k.shape[1], k.shape[-2]
    keys = torch.arange(T, device=q.device)
    if query_positions is None:
        hidden = keys[None, :] > keys[:, None]  # (T, T): keys after the query
    else:
        hidden = (keys > query_positions[..., None]).unsqueeze(1)  # (N, 1, Tq, T)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (N, H, Tq, T)
    scores = scores.masked_fill(hidden, float("-inf"))
    # The max is a constant shift (softmax is invariant to it): no gradient through it.
    probs = (scores - scores.detach().amax(-1, keepdim=True)).exp()
    probs = probs / probs.sum(-1, keepdim=True)
    if dropout_p > 0.0:
        rows = None if query_positions is None else attention_rows(query_positions, H, T)
        probs = dropout(probs, dropout_p, sites=sites, rows=rows)
    return torch.matmul(probs, v)


class Dropout(torch.nn.Module):
    """``nn.Dropout`` with the fast CPU mask (``dropout``)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GeluTanh(torch.nn.Module):
    """GPT-2's activation as a module (``gelu_tanh``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh(x)


def hf_causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``causal_attention`` behind transformers' attention interface (registered as
    ``HF_ATTENTION``): (B, H, T, hd) in, (B, T, H, hd) out. Anything but plain causal
    self-attention (a padding mask, cross-attention) goes to transformers' SDPA."""
    if attention_mask is not None or not getattr(module, "is_causal", False):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: heads per key/value head
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = causal_attention(query, key, value, scale, dropout)
    return out.transpose(1, 2).contiguous(), None


HF_ATTENTION = "scale_fpt_causal"
"""The name ``hf_causal_attention`` is registered under with transformers."""
