"""The layer-normalised LSTM baseline (``models.fpt.LayerNormLSTMLayer``): its recurrence with
the written-out backward computes what the module-by-module formulation (autograd through
every step, the layer's previous implementation, kept here as the reference) computes: the
same hidden states bit for bit, and the same gradients (float64, to rounding), with the
weights trained (full LSTM) or frozen (the frozen-LSTM arm trains the norms). Its FLOPs
have no attention term."""

from __future__ import annotations

import pytest
import torch

from scale_fpt import scaling
from scale_fpt.config import TrialConfig
from scale_fpt.models import build_model
from scale_fpt.models.fpt import LayerNormLSTMLayer, LSTMBackbone
from scale_fpt.profile import step_flops
from scale_fpt.tasks import task_spec


def stepwise(layer: LayerNormLSTMLayer, x: torch.Tensor) -> torch.Tensor:
    """The reference: each step through the layer's modules, autograd through all."""
    from_input = layer.input_norm(layer.input_weights(x))
    h = c = x.new_zeros(x.shape[0], x.shape[-1])
    outputs = []
    for t in range(x.shape[1]):
        gates = from_input[:, t] + layer.recurrent_norm(layer.recurrent_weights(h))
        i, f, o, g = gates.chunk(4, dim=-1)
        c = layer.cell_norm(torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g))
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, dim=1)


def seeded_layer(width: int, dtype: torch.dtype) -> LayerNormLSTMLayer:
    """A layer with norms away from their (1, 0) init, so their gradients are exercised."""
    torch.manual_seed(0)
    layer = LayerNormLSTMLayer(width).to(dtype)
    with torch.no_grad():
        for norm in (layer.input_norm, layer.recurrent_norm, layer.cell_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer


def gradients(forward, layer, x, weights):
    leaves = [x, *(p for p in layer.parameters() if p.requires_grad)]
    return torch.autograd.grad((forward(layer, x) * weights).sum(), leaves)


def test_hidden_states_equal_the_stepwise_formulation_bit_for_bit():
    layer = seeded_layer(8, torch.float32)
    x = torch.randn(3, 9, 8)
    with torch.no_grad():
        assert torch.equal(layer(x), stepwise(layer, x))


@pytest.mark.parametrize("frozen", [False, True], ids=["full", "frozen-weights"])
def test_gradients_equal_the_stepwise_formulation(frozen):
    layer = seeded_layer(8, torch.float64)
    if frozen:  # the frozen-LSTM arm: only the norms (and what feeds the LSTM) train
        layer.input_weights.weight.requires_grad_(False)
        layer.recurrent_weights.weight.requires_grad_(False)
    x = torch.randn(3, 9, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 9, 8, dtype=torch.float64)
    ours = gradients(LayerNormLSTMLayer.__call__, layer, x, weights)
    theirs = gradients(stepwise, layer, x, weights)
    assert len(ours) == (7 if frozen else 9)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_stacked_layers_train_as_the_stepwise_stack():
    """Three layers (dropout 0 between them): the backbone's loss and every gradient."""
    torch.manual_seed(1)
    backbone = LSTMBackbone(6, 3, dropout=0.0).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)

    def stack(_, x):
        for layer in backbone.layers:
            x = stepwise(layer, x)
        return x

    weights = torch.randn(2, 5, 6, dtype=torch.float64)
    leaves = list(backbone.parameters())
    ours = torch.autograd.grad((backbone(x) * weights).sum(), leaves)
    theirs = torch.autograd.grad((stack(None, x) * weights).sum(), leaves)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer_norm", [True, False], ids=["layernorm", "nn.LSTM"])
def test_lstm_step_flops_count_no_attention(layer_norm, monkeypatch):
    def attention(*args):
        raise AssertionError("an LSTM has no attention")

    monkeypatch.setattr(scaling, "attention_flops_per_sequence", attention)
    config = TrialConfig.from_flat(
        {"accelerator": "cpu", "task": "bit-xor", "model": "lstm", "init": "random",
         "lstm_width": 16, "lstm_layer_norm": layer_norm}
    )  # fmt: skip
    spec = task_spec(config.task)
    assert step_flops(build_model(config, spec), spec, 4)[0] > 0
