"""The FPT model: input layer -> (frozen) backbone -> linear output head, as in Lu et al. 2021.

x (B, T, W) or token ids (B, T)
  -> input: Linear(W, d) (orthogonal, gain 1.41, zero bias) then dropout (the reference
     code's; ``input_dropout``), or Embedding(V, d)
  -> backbone(inputs_embeds) -> hidden (B, T, d)
  -> the last k real tokens (B, k, d)
  -> output: Linear(d, m * C) -> logits (B, k, m, C)
"""

from __future__ import annotations

import torch
from torch import nn

from scale_fpt.config import ModelConfig
from scale_fpt.models import ops
from scale_fpt.tasks.base import TaskSpec


class LayerNormLSTMLayer(nn.Module):
    """One LSTM layer with layer normalisation (Ba et al. 2016), as the reference code's
    baseline: the input and the recurrent pre-activations are each normalised before they
    are summed, and the cell state after its update. The norms' gains and biases are ``ln``
    parameters (``groups.module_groups``), so the frozen-LSTM arm trains them as the
    reference's does. The state starts at zero (the reference draws it at random per batch).

    The input projection and its norm run for all steps at once; the recurrence is
    ``LayerNormRecurrence``, whose backward is written out (see there)."""

    def __init__(self, width: int):
        super().__init__()
        # No linear biases: each feeds a LayerNorm, whose bias takes their place.
        self.input_weights = nn.Linear(width, 4 * width, bias=False)
        self.recurrent_weights = nn.Linear(width, 4 * width, bias=False)
        self.input_norm = nn.LayerNorm(4 * width)
        self.recurrent_norm = nn.LayerNorm(4 * width)
        self.cell_norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, W) -> (B, T, W) hidden states."""
        from_input = self.input_norm(self.input_weights(x))  # (B, T, 4W): all steps at once
        recurrent, cell = self.recurrent_norm, self.cell_norm
        return LayerNormRecurrence.apply(
            from_input, self.recurrent_weights.weight, recurrent.weight, recurrent.bias,
            cell.weight, cell.bias, recurrent.eps,
        )  # fmt: skip


_layer_norm_backward = torch.ops.aten.native_layer_norm_backward


class LayerNormRecurrence(torch.autograd.Function):
    """The recurrence of ``LayerNormLSTMLayer`` over T steps, from the normalised input
    pre-activations (B, T, 4W), to the hidden states (B, T, W); gates i, f, o, g:

        gates = from_input[:, t] + LN_r(h W_r^T);  c = LN_c(f * c + i * g);  h = o * tanh(c)

    The forward runs the same torch ops per step as the module-by-module formulation (same
    values). The backward walks the steps back by hand instead of through T autograd
    graphs: per step a handful of fused ops and one (B, 4W) x (4W, W) product; the weight
    and the norms' gains and biases get their gradients once, from all steps stacked
    (one (4W, T B) x (T B, W) product instead of T small ones)."""

    @staticmethod
    def forward(ctx, from_input, weight, r_gain, r_bias, c_gain, c_bias, eps):
        B, T, W4 = from_input.shape
        W = W4 // 4
        new = from_input.new_empty
        h_states, c_prev = new(T + 1, B, W), new(T, B, W)  # h_states[t]: step t's incoming h
        r, c_pre = new(T, B, W4), new(T, B, W)  # what each norm normalises
        sig, tanh_g, tanh_c = new(T, B, 3 * W), new(T, B, W), new(T, B, W)
        stats = []  # each step's means and reciprocal deviations (their dtype is the norm's)
        h_states[0] = 0.0
        c = from_input.new_zeros(B, W)
        for t in range(T):
            c_prev[t] = c
            torch.mm(h_states[t], weight.t(), out=r[t])
            normed, *r_stats = torch.native_layer_norm(r[t], (W4,), r_gain, r_bias, eps)
            gates = from_input[:, t] + normed
            *ifo, g = gates.chunk(4, dim=-1)
            i, f, o = sig[t].chunk(3, dim=-1)
            # Per gate, as the stepwise formulation: a CPU's vector lanes round by place,
            # so one call over the three would change the bits.
            for gate, out in zip(ifo, (i, f, o), strict=True):
                torch.sigmoid(gate, out=out)
            torch.tanh(g, out=tanh_g[t])
            c_pre[t] = f * c + i * tanh_g[t]
            c, *c_stats = torch.native_layer_norm(c_pre[t], (W,), c_gain, c_bias, eps)
            stats.append((*r_stats, *c_stats))
            torch.tanh(c, out=tanh_c[t])
            torch.mul(o, tanh_c[t], out=h_states[t + 1])
        r_mean, r_rstd, c_mean, c_rstd = (torch.stack(each) for each in zip(*stats, strict=True))
        ctx.save_for_backward(
            weight, r_gain, r_bias, c_gain, c_bias, h_states, c_prev, r, r_mean, r_rstd,
            c_pre, c_mean, c_rstd, sig, tanh_g, tanh_c,
        )  # fmt: skip
        # (B, T, W) as a copy: the caller may change it, the saved states must stay
        return h_states[1:].transpose(0, 1).contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_hs):
        (weight, r_gain, r_bias, c_gain, c_bias, h_states, c_prev, r, r_mean, r_rstd,
         c_pre, c_mean, c_rstd, sig, tanh_g, tanh_c) = ctx.saved_tensors  # fmt: skip
        T, B, W = c_prev.shape
        input_only = [True, False, False]
        d_gates = grad_hs.new_empty(T, B, 4 * W)  # the gradient of from_input, step-major
        d_r = torch.empty_like(d_gates)
        d_c = grad_hs.new_empty(T, B, W)  # of each step's normalised cell state
        dh = dc = grad_hs.new_zeros(B, W)
        for t in reversed(range(T)):
            dh = dh + grad_hs[:, t]
            i, f, o = sig[t].chunk(3, dim=-1)
            d_c[t] = dc + dh * o * (1 - tanh_c[t] * tanh_c[t])
            dcp = _layer_norm_backward(
                d_c[t], c_pre[t], (W,), c_mean[t], c_rstd[t], c_gain, None, input_only
            )[0]
            d_sig = torch.cat((dcp * tanh_g[t], dcp * c_prev[t], dh * tanh_c[t]), dim=-1)
            torch.mul(d_sig, sig[t] * (1 - sig[t]), out=d_gates[t, :, : 3 * W])
            torch.mul(dcp * i, 1 - tanh_g[t] * tanh_g[t], out=d_gates[t, :, 3 * W :])
            d_r[t] = _layer_norm_backward(
                d_gates[t], r[t], (4 * W,), r_mean[t], r_rstd[t], r_gain, None, input_only
            )[0]
            dh = d_r[t] @ weight
            dc = dcp * f
        grads = ctx.needs_input_grad
        h_prev = h_states[:-1].view(T * B, W)
        d_weight = d_r.view(T * B, 4 * W).t() @ h_prev if grads[1] else None
        norms = [False, grads[2] or grads[3], grads[2] or grads[3]]
        _, d_r_gain, d_r_bias = _layer_norm_backward(
            d_gates, r, (4 * W,), r_mean, r_rstd, r_gain, r_bias, norms
        )
        norms = [False, grads[4] or grads[5], grads[4] or grads[5]]
        _, d_c_gain, d_c_bias = _layer_norm_backward(
            d_c, c_pre, (W,), c_mean, c_rstd, c_gain, c_bias, norms
        )
        return d_gates.transpose(0, 1), d_weight, d_r_gain, d_r_bias, d_c_gain, d_c_bias, None


class LSTMBackbone(nn.Module):
    """The paper's LSTM baseline body: ``n_layers`` stacked LSTMs of one width, layer-normed
    as the reference code's (``layer_norm``) or a plain ``nn.LSTM``; dropout between
    layers as ``nn.LSTM`` applies it."""

    def __init__(self, width: int, n_layers: int, dropout: float, layer_norm: bool = True):
        super().__init__()
        self.dropout = dropout
        if layer_norm:
            self.layers = nn.ModuleList(LayerNormLSTMLayer(width) for _ in range(n_layers))
        else:
            self.lstm = nn.LSTM(width, width, n_layers, batch_first=True, dropout=dropout)

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "layers"):
            return self.lstm(inputs_embeds)[0]
        x = inputs_embeds
        for n, layer in enumerate(self.layers):
            if n:
                x = nn.functional.dropout(x, self.dropout, self.training)
            x = layer(x)
        return x


def input_dropout_p(config: ModelConfig, spec: TaskSpec) -> float:
    """Dropout after the input layer: ``dropout`` after a linear input when
    ``input_dropout`` is on (the reference code), none after an embedding or when off."""
    return config.dropout if config.input_dropout and not spec.discrete else 0.0


class FPT(nn.Module):
    def __init__(
        self, spec: TaskSpec, backbone: nn.Module, d_model: int, input_dropout: float = 0.0
    ):
        super().__init__()
        self.spec = spec
        self.input_p = input_dropout
        """Dropout probability right after the input layer (see ``input_dropout_p``)."""
        if spec.discrete:
            self.input = nn.Embedding(spec.vocab_size, d_model)
        else:
            self.input = nn.Linear(spec.token_width, d_model)
            nn.init.orthogonal_(self.input.weight, gain=1.41)
            nn.init.zeros_(self.input.bias)
        self.backbone = backbone
        self.output = nn.Linear(d_model, spec.outputs_per_token * spec.n_classes)

    def hidden(self, x: torch.Tensor, output_attentions: bool = False):
        embeds = ops.dropout(self.input(x), self.input_p, self.training)  # (B, T, d)
        if isinstance(self.backbone, LSTMBackbone):
            return self.backbone(embeds), None
        out = self.backbone(inputs_embeds=embeds, output_attentions=output_attentions)
        return out.last_hidden_state, out.attentions  # (B, T, d), per layer (B, H, T, T)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        hidden, _ = self.hidden(x)
        hidden = last_tokens(hidden, self.spec.n_predicting_tokens, lengths)  # (B, k, d)
        logits = self.output(hidden)  # (B, k, m * C)
        return logits.view(*hidden.shape[:2], self.spec.outputs_per_token, self.spec.n_classes)


def last_tokens(hidden: torch.Tensor, k: int, lengths: torch.Tensor | None) -> torch.Tensor:
    """(B, T, d) -> (B, k, d): the last k tokens, or the last k real ones before padding."""
    if lengths is None:
        return hidden[:, -k:]
    offsets = torch.arange(-k, 0, device=hidden.device)  # (k,)
    index = (lengths[:, None] + offsets).clamp(min=0)  # (B, k)
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
