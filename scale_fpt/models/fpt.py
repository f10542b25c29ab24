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
    reference's does. The state starts at zero (the reference draws it at random per batch)."""

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
        h = c = x.new_zeros(x.shape[0], x.shape[-1])  # (B, W)
        outputs = []
        for t in range(x.shape[1]):
            gates = from_input[:, t] + self.recurrent_norm(self.recurrent_weights(h))
            i, f, o, g = gates.chunk(4, dim=-1)
            c = self.cell_norm(torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g))
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


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
