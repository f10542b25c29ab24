"""Ablation bodies that any transfer claim needs beside random init (``--init no-body`` and
``--init one-attn``): what the task reaches without the pretrained transformer at all.

- ``no-body``: the transformer removed, input layer -> output layer (the read-out tokens'
  input vectors go straight to the head);
- ``one-attn``: the body replaced by one trained causal self-attention layer of the model's
  width and heads, pre-norm with a residual and a final norm (no positional parameters;
  the causal mask tells positions apart), always trained whatever ``--finetune`` says.

Both keep the named model's width, so their input and output layers have the shapes (and,
from the trial's heads stream, the values) of the full model's.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from scale_fpt.config import ModelConfig
from scale_fpt.models import ops
from scale_fpt.models.families import model_width
from scale_fpt.seeding import seed_streams


class NoBody(nn.Module):
    """Returns its input: the FPT's input layer feeds its output head directly."""

    def forward(self, inputs_embeds: torch.Tensor, output_attentions: bool = False):
        return BaseModelOutput(last_hidden_state=inputs_embeds)


class OneAttention(nn.Module):
    """h + proj(causal_attention(ln_1(h))) then ln_f: one trained attention layer."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = nn.ModuleDict(
            {"qkv": nn.Linear(d_model, 3 * d_model), "proj": nn.Linear(d_model, d_model)}
        )
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, inputs_embeds: torch.Tensor, output_attentions: bool = False):
        B, T, d = inputs_embeds.shape
        H = self.n_head
        qkv = self.attn["qkv"](self.ln_1(inputs_embeds)).view(B, T, 3, H, d // H)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        o = ops.causal_attention(q, k, v, (d // H) ** -0.5, p)  # (B, H, T, hd)
        o = self.attn["proj"](o.transpose(1, 2).reshape(B, T, d))
        h = ops.add_dropout(inputs_embeds, o, p, self.training)
        return BaseModelOutput(last_hidden_state=self.ln_f(h))


def build_ablation(config: ModelConfig, seed: int, arch) -> tuple[nn.Module, int]:
    """The ablation body of ``config.init`` for the architecture ``arch`` (its width and
    heads), drawn from trial ``seed``'s backbone stream; returns (body, layers)."""
    d_model = model_width(arch)
    if config.init == "no-body":
        return NoBody(), 0
    torch.manual_seed(seed_streams(seed).backbone)
    return OneAttention(d_model, arch.num_attention_heads, config.dropout), 1
