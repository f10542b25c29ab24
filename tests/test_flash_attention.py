"""The Triton attention kernel (scale_fpt.models.flash_attention) in Triton's interpreter on
the CPU: its in-kernel dropout mask is keyed_random's, bit for bit; forward and backward
equal the materialised attention (fp32 to 1e-5); the backward is two Triton launches and no
torch kernels, and the mask is drawn once per element (the forward), read from its bits;
chosen queries (the read-out rows) draw
the masks all queries draw; torch.compile traces it whole. Skipped where Triton is not
installed. GPU runs of the compiled kernel, bf16 included (Triton 3.6's interpreter
multiplies bf16 tiles wrongly in ``tl.dot``), are in test_gpu.py.

Triton decides at its own import whether kernels are interpreted, so these tests run in a
child pytest with ``TRITON_INTERPRET=1`` (``test_kernels_in_tritons_interpreter``); in
any other process they are skipped.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from helpers import run_pytest_child

from scale_fpt.keyed_random import keep_mask_rows
from scale_fpt.models import ops

BLOCK = 16  # small blocks: 40 positions cross block edges, a head size of 8 pads to 16
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(
    not INTERPRETING, reason="runs in the TRITON_INTERPRET=1 child of the next test"
)


@pytest.mark.slow
@pytest.mark.skipif(INTERPRETING, reason="the child itself")
def test_kernels_in_tritons_interpreter():
    output = run_pytest_child(__file__, {"TRITON_INTERPRET": "1"})
    assert "\n9 passed, 1 skipped in" in output  # every check ran


@pytest.fixture
def flash():
    from scale_fpt.models.flash_attention import flash_attention

    return flash_attention


def qkv(N=4, H=2, T=40, hd=8, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(N, H, T, hd, generator=generator).to(dtype).requires_grad_() for _ in range(3)
    ]


def materialised(q, k, v, p, keys, positions=None):
    """``ops.causal_attention``'s materialised path with dropout keyed on ``keys``."""
    sites = ops.DropoutSites(keys)
    site = sites.site
    out = ops.causal_attention(q, k, v, 0.3, p, positions, sites)
    assert sites.site == site + 1
    return out


def step_keys(member_seeds, step=3):
    """The keys of a step (what the kernel is given: it makes a site's keys itself)."""
    return ops.step_keys(member_seeds, step)


def site_keys(member_seeds, site=0, step=3):
    """The keys of dropout site ``site`` of a step (what the kernel's mask is drawn from)."""
    sites = ops.DropoutSites(step_keys(member_seeds, step), first_site=site)
    return sites.next()


def grads(out, inputs, seed=1):
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out.float() * weights).sum(), inputs)


@interpreted
def test_no_dropout_equals_sdpa_forward_and_backward(flash):
    q, k, v = qkv(N=2)
    ours = flash(q, k, v, 0.3, block=BLOCK)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    for a, b in zip(grads(ours, (q, k, v)), grads(theirs, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@interpreted
def test_in_kernel_mask_is_keyed_randoms_mask_bit_for_bit(flash):
    """With v the identity, the output is the dropped probabilities: its zeros among the
    visible keys are exactly the dropped elements of keep_mask_rows over (N, H, T, T),
    one chunk of batch rows per member key: the keys of the site (made in the kernel from
    the step's keys and the site's number)."""
    N, H, T = 4, 2, 24
    q, k, _ = qkv(N=N, H=H, T=T, hd=T)  # head size T (padded to 32 in the kernel)
    v = torch.eye(T).expand(N, H, T, T).contiguous()
    seeds = [11, 22]  # two members, two batch rows each
    for p, site in ((0.1, 0), (0.6, 1), (0.3, 7)):  # 1: an int Triton would specialise
        out = flash(q, k, v, 0.3, keys=step_keys(seeds), p=p, block=BLOCK, site=site).detach()
        keys = site_keys(seeds, site)
        rows = torch.arange(N * H * T)
        keep = keep_mask_rows(keys, rows, N * H * T // 2, T, p, torch.float32).view(N, H, T, T)
        visible = torch.ones(T, T, dtype=torch.bool).tril()
        assert torch.equal((out != 0)[..., visible], (keep != 0)[..., visible])
        assert (out[..., ~visible] == 0).all()
        assert 0.0 < (keep[..., visible] == 0).double().mean() < 1.0


@interpreted
def test_keyed_dropout_equals_the_materialised_attention(flash):
    q, k, v = qkv(T=17)  # two blocks, the second partial
    ours = flash(q, k, v, 0.3, keys=step_keys([5, 6]), p=0.1, block=BLOCK)
    theirs = materialised(q, k, v, 0.1, ops.step_keys([5, 6], 3))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    for a, b in zip(grads(ours, (q, k, v)), grads(theirs, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@interpreted
def test_read_out_queries_draw_the_full_computations_masks(flash):
    """Queries at chosen positions (the last block's read-out rows, padding included) equal
    those rows of all queries, in the kernel and in the materialised path alike."""
    q, k, v = qkv()
    keys = step_keys([5, 6])
    positions = torch.tensor([[38, 39], [3, 4], [0, 0], [20, 39]])
    index = positions[:, None, :, None].expand(-1, 2, -1, 8)
    picked = q.detach().gather(2, index).requires_grad_()
    full = flash(q, k, v, 0.3, keys=keys, p=0.1, block=BLOCK)
    some = flash(picked, k, v, 0.3, positions, keys, p=0.1, block=BLOCK)
    torch.testing.assert_close(some, full.gather(2, index), rtol=0, atol=1e-6)
    theirs = materialised(picked, k, v, 0.1, ops.step_keys([5, 6], 3), positions)
    torch.testing.assert_close(some, theirs, rtol=0, atol=1e-5)
    for a, b in zip(grads(some, (picked, k, v)), grads(theirs, (picked, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@interpreted
def test_stacked_inputs_equal_separate_ones_with_token_major_output(flash):
    """Queries, keys and values stacked as their projection writes them, (N, T, 3, H, hd),
    or the keys and values alone, (N, T, 2, H, hd) beside read-out queries: the output and
    the gradients of the separate tensors, the output laid out token-major (the next
    projection reads it as a view), the fake layouts those of the kernels."""
    N, H, T, hd = 4, 2, 17, 8
    generator = torch.Generator().manual_seed(2)
    projection = torch.randn(N, T, 3, H, hd, generator=generator).requires_grad_()
    keys = step_keys([5, 6])
    positions = torch.tensor([[15, 16], [3, 4], [0, 0], [9, 16]])
    index = positions[:, None, :, None].expand(-1, H, -1, hd)

    def attention(stacked: bool, read_out: bool):
        qkv = projection.permute(2, 0, 3, 1, 4)  # (3, N, H, T, hd)
        q, k, v = qkv.unbind(0)
        if read_out:
            q, chosen = q.gather(2, index), positions
            args = (q, qkv[1:], None) if stacked else (q, k, v)
        else:
            chosen = None
            args = (qkv, None, None) if stacked else (q, k, v)
        out = flash(*args, 0.3, chosen, keys, p=0.1, block=BLOCK)
        return out, grads(out, (projection,))[0], args

    for read_out in (False, True):
        out, grad, args = attention(True, read_out)
        expected, expected_grad, _ = attention(False, read_out)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)
        assert out.transpose(1, 2).is_contiguous()
        forward = torch.ops.scale_fpt.flash_attention_forward.default
        args = (*(t if t is None else t.detach() for t in args), positions if read_out else None)
        args = (*args, keys, 0, 0.3, 0.1, BLOCK)
        torch.library.opcheck(forward, args, test_utils=("test_schema", "test_faketensor"))


@interpreted
def test_read_out_queries_viewed_in_their_projection_equal_gathered_ones(flash):
    """The last block's read-out queries without padding (the last k tokens), read in place
    from the stacked projection as a strided view (what ``PackedFPT`` passes: every token's
    query projected in one GEMM), give the output and the projection's gradient of the
    same queries copied into a tensor of their own, exactly."""
    N, H, T, hd, k = 4, 2, 17, 8, 2
    generator = torch.Generator().manual_seed(3)
    projection = torch.randn(N, T, 3, H, hd, generator=generator).requires_grad_()
    positions = torch.arange(T - k, T).expand(N, k)
    keys = step_keys([5, 6])

    def attention(in_place: bool):
        qkv = projection.permute(2, 0, 3, 1, 4)  # (3, N, H, T, hd)
        q = qkv[0][:, :, -k:]
        assert not q.is_contiguous()
        q = q if in_place else q.contiguous()
        out = flash(q, qkv[1:], None, 0.3, positions, keys, p=0.1, block=BLOCK)
        return out, grads(out, (projection,))[0]

    (out, grad), (expected, expected_grad) = attention(True), attention(False)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)
    assert grad[:, : T - k, 0].abs().sum() == 0 < grad[:, T - k :, 0].abs().sum()


@interpreted
def test_compiles_whole_as_an_opaque_op(flash, monkeypatch):
    """``torch.compile`` traces ``ops.causal_attention`` on the kernel's path into one graph
    (the kernels are custom ops with fake implementations), forward and backward."""
    monkeypatch.setattr(ops, "attention_path", lambda *args: "flash")
    q, k, v = qkv(N=2, H=1, T=16, hd=16)
    keys = ops.step_keys([1, 2], 3)

    def attention(q, k, v, keys):
        return ops.causal_attention(q, k, v, 0.3, 0.1, None, ops.DropoutSites(keys))

    compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)(q, k, v, keys)
    eager = attention(q, k, v, keys)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for a, b in zip(grads(compiled, (q, k, v)), grads(eager, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    forward = torch.ops.scale_fpt.flash_attention_forward.default
    args = (q.detach(), k.detach(), v.detach(), None, keys, 0, 0.3, 0.1, 16)
    torch.library.opcheck(forward, args, test_utils=("test_schema", "test_faketensor"))


@interpreted
def test_bad_input_is_refused(flash):
    q, k, v = qkv(N=3)
    with pytest.raises(ValueError, match="do not split into 2 key chunks"):
        flash(q, k, v, 0.3, keys=step_keys([1, 2]), p=0.1, block=BLOCK)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        flash(q.transpose(-1, -2), k, v, 0.3, block=BLOCK)


class Launches(TorchDispatchMode):
    """What a GPU would run: every torch op dispatched (the ops inside this project's custom
    ops included, run through their kernels) and every Triton kernel launched, by name."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.ops, self.kernels = Counter(), Counter()
        self.launching = False
        from triton.runtime.interpreter import InterpretedFunction

        launch = InterpretedFunction.run

        def counted(kernel, *args, **kwargs):
            self.kernels[kernel.__name__] += 1
            self.launching = True  # the interpreter's own copies are no GPU work
            try:
                return launch(kernel, *args, **kwargs)
            finally:
                self.launching = False

        monkeypatch.setattr(InterpretedFunction, "run", counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.launching:
            self.ops[str(func)] += 1
        if func.namespace == "scale_fpt":  # count its body's ops too
            kernel = torch.library.get_kernel(func, "CPU")
            with self:
                return kernel.call_boxed(torch._C._dispatch_keyset_full(), *args, **kwargs or {})
        return func(*args, **kwargs or {})


@interpreted
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # counts only: see below
def test_backward_is_two_launches_and_draws_no_mask(flash, monkeypatch):
    """Per layer (one attention call), pinned so that a change adding launches fails: the
    forward is one launch that hashes each element of the (query, key) tiles it visits once
    and writes the kept flags as bits; the backward is two Triton launches and no torch
    kernels (allocations only; gradients written in bf16, no casts), and hashes nothing.
    (The interpreter's bf16 products are wrong, see above: only counts are checked.)"""
    from scale_fpt.models import flash_kernels

    N, H, T = 2, 2, 40  # query blocks of 16, 16, 8: 1 + 2 + 3 causal tiles per (row, head)
    q, k, v = qkv(N=N, H=H, T=T, dtype=torch.bfloat16)
    weights = torch.randn(N, H, T, 8).to(torch.bfloat16)
    hashed = []
    keep = flash_kernels._keep

    def counted_keep(key, row, offs_n, threshold):
        hashed.append(row.shape[0] * offs_n.shape[0])
        return keep(key, row, offs_n, threshold)

    monkeypatch.setattr(flash_kernels, "_keep", counted_keep)
    launches = Launches(monkeypatch)
    with launches:
        out = flash(q, k, v, 0.3, keys=step_keys([5, 6]), p=0.1, block=BLOCK)
    tiles = N * H * (1 + 2 + 3)
    assert launches.kernels == {"forward_kernel": 1}
    assert sum(hashed) == tiles * BLOCK * BLOCK  # each visited element once
    (mask,) = [t for t in out.grad_fn.saved_tensors if t is not None and t.dtype == torch.uint8]
    assert mask.shape == (N, H, T, 5)  # one bit per (query, key)

    launches, hashed[:] = Launches(monkeypatch), []
    with launches:
        torch.autograd.grad(out, (q, k, v), weights)
    assert launches.kernels == {"query_grads_kernel": 1, "key_grads_kernel": 1}
    # allocations, the token-major gradients' view, the saved tensors' detach
    no_kernel = {"aten.empty.memory_format", "aten.new_empty.default", "aten.transpose.int"}
    no_kernel.add("aten.detach.default")
    assert set(launches.ops) - no_kernel == {"scale_fpt.flash_attention_backward.default"}
    assert hashed == []
