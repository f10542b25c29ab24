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


class LSTMBackbone(nn.Module):
    """The paper's LSTM baseline body: ``n_layers`` stacked LSTMs of one width."""

    def __init__(self, width: int, n_layers: int, dropout: float):
        super().__init__()
        self.lstm = nn.LSTM(width, width, n_layers, batch_first=True, dropout=dropout)

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        return self.lstm(inputs_embeds)[0]


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
