"""The fast CPU building blocks (scale_fpt.models.ops) compute what torch's own kernels
compute, and the packed model's read-out-only last block skips exactly the FLOPs that
``scaling.readout_flops_skipped`` says."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from scale_fpt import scaling
from scale_fpt.models import ops


@pytest.fixture(params=["fused", "torch-ops"])
def cpu_backend(request, monkeypatch):
    """Each CPU form: the fused kernels (built on first use) and the torch-op compositions."""
    if request.param == "fused":
        assert ops.fused_kernels() is not None, "the fused CPU kernels failed to build"
    else:
        monkeypatch.setattr(ops, "_fused", lambda *tensors: None)
    return request.param


def test_gelu_tanh_equals_torch_forward_and_backward(cpu_backend):
    x64 = (torch.randn(100_000, dtype=torch.float64) * 4).requires_grad_()
    theirs = F.gelu(x64, approximate="tanh")
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), x64)
    if cpu_backend == "fused":  # float32 kernels: float32 rounding of torch's own
        x = x64.detach().float().requires_grad_()
        tolerance = {"rtol": 0, "atol": 1e-5}
    else:
        x, tolerance = x64, {"rtol": 0, "atol": 1e-13}
    ours = ops.gelu_tanh(x)
    (grad_ours,) = torch.autograd.grad(ours.sum(), x)
    torch.testing.assert_close(ours.double(), theirs, **tolerance)
    torch.testing.assert_close(grad_ours.double(), grad_theirs, **tolerance)


def test_torch_op_dropout_mask_is_the_fused_kernels_mask():
    """The torch-op mask (CPU bf16, GPU) and the fused kernel draw the same numbers from a key:
    a trial's masks do not depend on the device or dtype that ran it."""
    ones = torch.ones(3 * 100_003)
    for p in (0.1, 0.5):
        for seeds in ([5], [5, 6, 7]):
            fused = ops.fused_kernels().dropout_add(None, ones, p, seeds)
            assert torch.equal(ops.keyed_keep(ones, p, seeds), fused)
    scale = 2**32 / (2**32 - round(0.1 * 2**32))
    assert ops.keyed_keep(ones, 0.1, [5]).unique().tolist() == [0.0, pytest.approx(scale)]
    bf16 = ops.keyed_keep(ones.bfloat16(), 0.1, [5])
    assert torch.equal(bf16 > 0, ops.keyed_keep(ones, 0.1, [5]) > 0)
    # some rows of a logical (6, 50_001) tensor, two rows per seed, in member order
    rows = ops.Rows(torch.tensor([0, 1, 3, 4, 5, 5]), 6)
    fused = ops.fused_kernels().dropout_add(None, ones[: 6 * 50_001], 0.1, [5, 6, 7], *rows)
    assert torch.equal(ops.keyed_keep(ones[: 6 * 50_001], 0.1, [5, 6, 7], rows), fused)


def test_chosen_rows_draw_the_whole_tensors_mask(cpu_backend):
    """Dropout over some rows of a tensor (``ops.Rows``) draws what dropout over the whole
    tensor draws for those rows: the read-out rows of the last block get the masks of a
    model computing every token."""
    h, x = torch.randn(2, 2, 8, 32), torch.randn(2, 2, 8, 32)  # (members, B, T, d)
    with ops.dropout_keys([11, 22], step=4):
        whole = ops.add_dropout(h, x, 0.3)
    positions = torch.tensor([[6, 7], [2, 3], [7, 7], [0, 5]])  # (K*B, k)
    index = (positions + torch.arange(4)[:, None] * 8).view(-1)
    pick = lambda t: t.reshape(-1, 32)[index]  # noqa: E731
    with ops.dropout_keys([11, 22], step=4):
        some = ops.add_dropout(pick(h), pick(x), 0.3, rows=ops.Rows(index, 32))
    assert torch.equal(some, pick(whole))
    assert (some == pick(h)).any() and (some != pick(h)).any()  # some elements dropped


def test_chosen_queries_draw_the_attention_masks_of_all_queries(cpu_backend):
    q, k, v = (torch.randn(4, 2, 12, 8) for _ in "qkv")
    sites = lambda: ops.DropoutSites(ops.step_keys([3, 4], 9))  # noqa: E731
    every = ops.causal_attention(q, k, v, 0.3, 0.2, sites=sites())
    positions = torch.tensor([[10, 11], [3, 4], [0, 0], [7, 11]])
    index = positions[:, None, :, None].expand(-1, 2, -1, 8)
    some = ops.causal_attention(q.gather(2, index), k, v, 0.3, 0.2, positions, sites())
    torch.testing.assert_close(some, every.gather(2, index), rtol=0, atol=1e-6)
    undropped = ops.causal_attention(q.gather(2, index), k, v, 0.3, 0.0, positions)
    assert not torch.allclose(some, undropped)


def test_attention_path_on_a_cpu():
    q = torch.zeros(1, 1, 4, 8)
    assert ops.attention_path(q, 0.0, keyed=False, chosen_queries=False) == "sdpa"
    assert ops.attention_path(q, 0.1, keyed=True, chosen_queries=False) == "materialised"
    assert ops.attention_path(q, 0.1, keyed=False, chosen_queries=False) == "materialised"
    assert ops.attention_path(q, 0.0, keyed=False, chosen_queries=True) == "materialised"


def test_fused_dropout_mask_rate_independence_seed_and_threads():
    assert ops.fused_kernels() is not None
    ones = torch.ones(1_000_000)
    torch.manual_seed(0)
    y = ops.dropout(ones, 0.1)
    assert y.unique().tolist() == [0.0, pytest.approx(1 / 0.9)]
    kept = (y > 0).double()
    sigma = (0.9 * 0.1 / kept.numel()) ** 0.5
    assert abs(kept.mean().item() - 0.9) < 5 * sigma
    pairs = kept.view(-1, 2)  # neighbouring elements are independent
    assert abs((pairs[:, 0] * pairs[:, 1]).mean().item() - 0.81) < 10 * sigma
    torch.manual_seed(0)
    assert torch.equal(ops.dropout(ones, 0.1), y)
    assert not torch.equal(ops.dropout(ones, 0.1), y)  # the next call draws a new seed
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        assert torch.equal(ops.dropout(ones, 0.1), y)  # the mask does not depend on threads
    finally:
        torch.set_num_threads(threads)


def test_dropout_is_identity_when_off_and_scales_when_on(cpu_backend):
    x = torch.randn(64, 32, requires_grad=True)
    assert ops.dropout(x, 0.0) is x and ops.dropout(x, 0.5, training=False) is x
    torch.manual_seed(1)
    y = ops.dropout(x, 0.5)
    kept = y != 0
    assert 0.3 < kept.double().mean().item() < 0.7
    torch.testing.assert_close(y[kept], x[kept] * 2, rtol=1e-4, atol=0)
    # the backward pass uses the forward's mask
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, kept * 2.0, rtol=1e-4, atol=0)
    h = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(1)
    z = ops.add_dropout(h, x, 0.5)
    torch.testing.assert_close(z, h + y)
    grad_h, grad_x = torch.autograd.grad(z.square().sum(), (h, x))
    torch.testing.assert_close(grad_h, 2 * z)
    torch.testing.assert_close(grad_x, 2 * z * kept * 2.0, rtol=1e-4, atol=1e-6)
    assert torch.equal(ops.add_dropout(h, x, 0.0), h + x)


def test_keyed_dropout_gives_each_member_its_solo_mask(cpu_backend):
    """Inside ``dropout_keys`` a member's chunk of a packed tensor gets the mask it gets
    alone: a function of (its seed, step, site), not of the other members, the call's
    position among members or torch's generator; sites and steps draw new masks."""
    x = torch.randn(3, 40, 16, requires_grad=True)  # (K, rows, d): member chunks lead
    seeds = [11, 22, 33]

    def forward(chunk, member_seeds, step, generator_seed=0):
        torch.manual_seed(generator_seed)  # must not matter
        with ops.dropout_keys(member_seeds, step):
            first = ops.dropout(chunk, 0.3)
            second = ops.add_dropout(chunk, chunk, 0.3)  # the next site
        return first, second

    packed_first, packed_second = forward(x, seeds, step=5)
    for m in range(3):
        alone_first, alone_second = forward(x[m : m + 1], [seeds[m]], 5, generator_seed=m + 1)
        assert torch.equal(packed_first[m : m + 1], alone_first)
        assert torch.equal(packed_second[m : m + 1], alone_second)
    kept_first, kept_second = packed_first != 0, (packed_second - x) != 0
    assert not torch.equal(kept_first, kept_second)  # another site, another mask
    assert not torch.equal(kept_first[0], kept_first[1])  # another member, another mask
    assert not torch.equal(forward(x, seeds, step=6)[0] != 0, kept_first)  # another step
    # the backward pass uses the forward's keyed mask
    (grad,) = torch.autograd.grad(packed_first.sum(), x)
    torch.testing.assert_close(grad, kept_first / 0.7, rtol=1e-4, atol=0)


@pytest.mark.parametrize("T", [10, 64])
def test_causal_attention_equals_sdpa(T):
    q, k, v = (torch.randn(3, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    ours = ops.causal_attention(q, k, v, scale=0.3)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(ours, theirs)
    grads_ours = torch.autograd.grad(ours.square().sum(), (q, k, v))
    grads_theirs = torch.autograd.grad(theirs.square().sum(), (q, k, v))
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b)
    # queries at chosen positions (padding after a short sequence) are those rows
    positions = torch.tensor([[T - 2, T - 1], [3, 4], [0, 5]])
    picked = q.gather(2, positions[:, None, :, None].expand(-1, 2, -1, 8))
    some = ops.causal_attention(picked, k, v, scale=0.3, query_positions=positions)
    expected = theirs.gather(2, positions[:, None, :, None].expand(-1, 2, -1, 8))
    torch.testing.assert_close(some, expected)


def test_last_block_skips_exactly_the_readout_flops(tiny_gpt2_dir):
    """FLOPs counted by torch (FlopCounterMode, forward + backward) of the last block over
    all tokens minus the same block computing only the read-out tokens."""
    from scale_fpt.config import TrialConfig
    from scale_fpt.models.packed import ReadOut
    from scale_fpt.steps.cohort import CohortStep
    from scale_fpt.tasks import build_task

    # The count is of operators, the same on any device: pin the cohort to the CPU (with a
    # GPU visible it would land on CUDA) and make every input where the model is.
    config = TrialConfig.from_flat(
        {
            "task": "bit-xor",
            "model": tiny_gpt2_dir,
            "init": "pretrained",
            "dropout": 0.1,
            "accelerator": "cpu",
        }
    )
    step = CohortStep([config], build_task(config.task, config.train.seed))
    model = step.model
    T, B, d = 16, 3, model.d
    params = model.member_params(None)
    device = next(iter(params.values())).device
    k = 2

    def counted(read_out) -> int:
        h = torch.randn(1, B * T, d, device=device, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            out = model._block(h, model.n_layer - 1, params, T, read_out)
            torch.autograd.grad(out.sum(), h)
        return counter.get_total_flops()

    full = counted(None)
    readout = counted(ReadOut.of(T, k, None, B, device))
    n_inner = model.frozen[0][4].shape[1]
    step.close()
    assert full - readout == scaling.readout_flops_skipped(d, n_inner, T, k, B)


def test_gpt2_backbones_get_the_fast_ops_and_compute_the_same_function():
    from transformers import AutoModel

    from scale_fpt.config import ModelConfig
    from scale_fpt.models.backbones import build_backbone, load_architecture

    config = ModelConfig(model="gpt2-tiny", init="random", dropout=0.1)
    fast, _, _ = build_backbone(config, seed=0)
    assert not [m for m in fast.modules() if isinstance(m, torch.nn.Dropout)]
    assert all(isinstance(block.mlp.act, ops.GeluTanh) for block in fast.h)
    assert fast.config._attn_implementation == ops.HF_ATTENTION

    plain = AutoModel.from_config(load_architecture(config)).float()  # torch's own kernels
    plain.set_input_embeddings(None)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(3, 12, fast.config.n_embd)
    fast.eval(), plain.eval()
    torch.testing.assert_close(
        fast(inputs_embeds=x).last_hidden_state, plain(inputs_embeds=x).last_hidden_state
    )
    fast.train()
    torch.manual_seed(5)
    first = fast(inputs_embeds=x).last_hidden_state
    torch.manual_seed(5)
    assert torch.equal(fast(inputs_embeds=x).last_hidden_state, first)
    assert not torch.allclose(first, fast(inputs_embeds=x).last_hidden_state)  # new masks


def test_kernels_that_cannot_build_warn_once_and_torch_ops_take_over(tmp_path, monkeypatch, caplog):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(ops, "KERNEL_SOURCE", broken)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "build"))
    ops.fused_kernels.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=ops.__name__):
            assert ops.fused_kernels() is None
            assert ops.fused_kernels() is None
        warnings = [r for r in caplog.records if "fused CPU kernels unavailable" in r.message]
        assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
        x = torch.randn(8, 16, requires_grad=True)
        torch.testing.assert_close(ops.gelu_tanh(x), F.gelu(x, approximate="tanh"))
        assert ops.dropout(x, 0.5).shape == x.shape
    finally:
        ops.fused_kernels.cache_clear()  # the next caller loads the real kernels again
