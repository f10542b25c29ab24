"""The keyed dropout kernel (scale_fpt.models.dropout_kernels) in Triton's interpreter on the
CPU: its output, residual add and gradient equal the torch-op keyed mask's
(``ops.keyed_keep``, the CPU and reference path) bit for bit, in float32 and bfloat16, for
whole tensors and for some rows of a logical tensor.
Skipped where Triton is not installed.

Triton decides at its own import whether kernels are interpreted, so these tests run in a
child pytest with ``TRITON_INTERPRET=1``; in any other process they are skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from helpers import run_pytest_child

from scale_fpt.models import ops

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(
    not INTERPRETING, reason="runs in the TRITON_INTERPRET=1 child of the next test"
)
KEYS = torch.tensor([123456789, -987654321987], dtype=torch.int64)  # two member chunks


@pytest.mark.slow
@pytest.mark.skipif(INTERPRETING, reason="the child itself")
def test_kernel_in_tritons_interpreter():
    output = run_pytest_child(__file__, {"TRITON_INTERPRET": "1"})
    assert "\n4 passed, 3 skipped in" in output  # every check ran


@pytest.fixture
def kernel():
    from scale_fpt.models.dropout_kernels import keyed_dropout_add

    return keyed_dropout_add


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_add_and_its_gradient_equal_the_torch_op_mask_bit_for_bit(kernel, dtype):
    generator = torch.Generator().manual_seed(0)
    for p in (0.1, 0.5):
        x = torch.randn(2, 3, 700, generator=generator).to(dtype).requires_grad_()
        h = torch.randn(2, 3, 700, generator=generator).to(dtype).requires_grad_()
        keep = ops.keyed_keep(x, p, KEYS).view(x.shape)
        assert torch.equal(kernel(x, None, KEYS, None, 0, p), x * keep)
        out = kernel(x, h, KEYS, None, 0, p)
        assert torch.equal(out, torch.addcmul(h, x, keep))
        grad = torch.randn(out.shape, generator=generator).to(dtype)
        grad_x, grad_h = torch.autograd.grad(out, (x, h), grad)
        assert torch.equal(grad_x, grad * keep) and torch.equal(grad_h, grad)


@interpreted
def test_some_rows_draw_what_the_whole_tensor_draws_there(kernel):
    rows = ops.Rows(torch.tensor([1, 4, 5, 9]), 10)  # 5 rows per key
    x = torch.randn(4, 37, generator=torch.Generator().manual_seed(1))
    expected = x * ops.keyed_keep(x, 0.3, KEYS, rows).view(x.shape)
    assert torch.equal(kernel(x, None, KEYS, rows.index, rows.total, 0.3), expected)


@interpreted
def test_compiled_dropout_is_torch_ops_inductor_fuses_with_the_eager_kernels_mask(monkeypatch):
    """On the GPU's path, eager keyed dropout is the Triton kernel's one launch; compiled, it
    is the torch-op mask (no opaque custom op in the graph) drawing the same bits."""
    monkeypatch.setattr(ops, "on_gpu", lambda x: True)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 300, generator=generator)
    h = torch.randn(2, 5, 300, generator=generator)

    def step(h, x, keys):
        return ops.add_dropout(h, x, 0.25, sites=ops.DropoutSites(keys))

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    eager = step(h, x, KEYS)
    torch.compile(step, backend=capture, fullgraph=True)(h, x, KEYS)
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert not any("keyed_dropout_add" in t for t in targets) and len(graphs) == 1
    compiled = torch.compile(step, fullgraph=True)(h, x, KEYS)  # inductor
    assert torch.equal(compiled == h, eager == h)  # the same elements dropped
    torch.testing.assert_close(compiled, eager)
    assert (eager == h).float().mean().item() == pytest.approx(0.25, abs=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETING, reason="the compiled kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_equals_the_torch_op_mask_on_the_gpu(dtype):
    from scale_fpt.models.dropout_kernels import keyed_dropout_add

    generator = torch.Generator().manual_seed(2)
    keys = KEYS.cuda()
    x = torch.randn(2, 64, 3000, generator=generator).to(dtype).cuda()
    h = torch.randn(2, 64, 3000, generator=generator).to(dtype).cuda()
    keep = ops.keyed_keep(x, 0.1, keys).view(x.shape)
    assert torch.equal(keyed_dropout_add(x, None, keys, None, 0, 0.1), x * keep)
    assert torch.equal(keyed_dropout_add(x, h, keys, None, 0, 0.1), torch.addcmul(h, x, keep))
