"""K FPT models over one frozen GPT-NeoX (Pythia) or Llama-style body: a packed cohort's model
for the rotary families (``packed.PackedFPT`` is GPT-2's).

    x (K, B, T, W) -> input (per member) -> dropout (GPT-NeoX: embedding dropout) -> per block:
        norm (per member gains) -> frozen projections as one GEMM over the (K*B*T, d) rows
        -> rotary positions on queries and keys (GPT-NeoX: the first ``rotary_pct`` of each
        head) -> causal attention on (K*B, H, T, T) (Llama: key/value heads repeated to their
        query heads) -> frozen output projection
        GPT-NeoX: dropout, then the MLP (GELU) on the block's input (parallel residual) or on
        the attention's output, dropout, both added to the residual
        Llama: residual, norm, gated MLP (SiLU(x W_gate) * x W_up) W_down, residual
    -> final norm (per member) at the k read-out tokens -> output head (per member)

Trained tensors (per member: a leading member axis, fp32 master copies) are the input layer,
the norms and the output head; rotary positions have no parameters, so ``pos`` is empty.
Dropout sites come in the order transformers' modules call them under ``ops.dropout_keys``
(input, embedding, then per block attention probabilities and the two residual branches),
so a member draws the masks it draws alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scale_fpt.models import ops
from scale_fpt.models.families import family_of
from scale_fpt.models.fpt import FPT
from scale_fpt.models.packed import PackedMembers, ReadOut
from scale_fpt.tasks.base import TaskSpec


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of each head of x (N, H, T, hd)."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turned, kept = x[..., :rd], x[..., rd:]
    return torch.cat((turned * cos + rotate_half(turned) * sin, kept), dim=-1)


class PackedRotaryFPT(PackedMembers):
    """K FPT models over one frozen GPT-NeoX or Llama-style body (``PackedFPT``'s interface:
    ``param_groups``, ``member_state``, ``forward(x, lengths, members, step_keys)``)."""

    def __init__(
        self,
        backbone: nn.Module,
        spec: TaskSpec,
        heads: list[FPT],
        n_tokens: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        super().__init__()
        config = backbone.config
        family = family_of(config)
        self.family = family.name
        self.spec, self.K, self.dtype = spec, len(heads), dtype
        self.d, self.n_layer = config.hidden_size, config.num_hidden_layers
        self.n_head = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_head
        self.hd = getattr(config, "head_dim", None) or self.d // self.n_head
        self.neox = not family.rms_norm  # GPT-NeoX's block: LayerNorm, fused QKV, GELU MLP
        self.parallel = bool(getattr(config, "use_parallel_residual", False))
        self.eps = config.layer_norm_eps if self.neox else config.rms_norm_eps
        self.input_p = heads[0].input_p
        self.attn_p = config.attention_dropout
        self.hidden_p = config.hidden_dropout if self.neox else 0.0
        blocks = list(family.blocks(backbone))
        self.act = blocks[0].mlp.act if self.neox else blocks[0].mlp.act_fn
        norm_1, norm_2, norm_f = family.packed_norms
        self.norm_names = (norm_1, norm_2, norm_f)
        self.parts = ("weight", "bias") if self.neox else ("weight",)

        if spec.discrete:
            self.input_embedding = self.member_stack(
                device, [h.input.weight for h in heads]
            )  # (K, V, d)
        else:
            self.input_weight = self.member_stack(
                device, [h.input.weight for h in heads]
            )  # (K, d, W)
            self.input_bias = self.member_stack(device, [h.input.bias for h in heads])  # (K, d)
        for index, name in enumerate((norm_1, norm_2)):
            for part in self.parts:
                layers = torch.stack([getattr(getattr(b, name), part) for b in blocks])
                setattr(
                    self, f"norm_{index + 1}_{part}", self.member_stack(device, [layers] * self.K)
                )
        for part in self.parts:
            final = getattr(getattr(backbone, norm_f), part)
            setattr(self, f"norm_f_{part}", self.member_stack(device, [final] * self.K))  # (K, d)
        self.output_weight = self.member_stack(device, [h.output.weight for h in heads])
        self.output_bias = self.member_stack(device, [h.output.bias for h in heads])
        self.param_groups = {  # trained tensor -> its fine-tuning group
            name: "ln" if name.startswith("norm") else name.split("_")[0]
            for name, _ in self.named_parameters()
        }

        def frozen(module: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = module.weight.detach().to(device=device, dtype=dtype).t().contiguous()
            bias = module.bias
            return weight, None if bias is None else bias.detach().to(device=device, dtype=dtype)

        self.frozen = []
        for b in blocks:
            if self.neox:
                a, m = b.attention, b.mlp
                self.frozen.append(
                    (frozen(a.query_key_value), frozen(a.dense),
                     frozen(m.dense_h_to_4h), frozen(m.dense_4h_to_h))
                )  # fmt: skip
            else:
                a, m = b.self_attn, b.mlp
                self.frozen.append(
                    (frozen(a.q_proj), frozen(a.k_proj), frozen(a.v_proj), frozen(a.o_proj),
                     frozen(m.gate_proj), frozen(m.up_proj), frozen(m.down_proj))
                )  # fmt: skip
        # Rotary angles of the task's T positions, computed once by the backbone's own module.
        positions = torch.arange(n_tokens)[None]
        cos, sin = backbone.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
        self.cos = cos[0].to(device=device, dtype=dtype)  # (T, rotary dims)
        self.sin = sin[0].to(device=device, dtype=dtype)

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s trained tensors under the names of its own FPT module."""
        norm_1, norm_2, norm_f = self.norm_names
        out = {}
        for name, p in self.named_parameters():
            value = p.detach()[member].cpu().clone()
            kind, _, part = name.rpartition("_")
            if kind in ("norm_1", "norm_2"):
                block_norm = norm_1 if kind == "norm_1" else norm_2
                for layer in range(self.n_layer):
                    out[f"backbone.layers.{layer}.{block_norm}.{part}"] = value[layer]
            elif kind == "norm_f":
                out[f"backbone.{norm_f}.{part}"] = value
            elif kind == "input_embedding":
                out["input.weight"] = value
            else:
                out[f"{kind}.{part}"] = value  # input_weight -> input.weight, ...
        return out

    def _norm(self, h: torch.Tensor, p: dict, which: str, layer: int | None) -> torch.Tensor:
        """LayerNorm (GPT-NeoX) or RMSNorm (Llama) of (Ka, N, d) rows, each member's gains."""
        pick = (lambda t: t) if layer is None else (lambda t: t[:, layer])
        weight = pick(p[f"{which}_weight"]).unsqueeze(1)
        if self.neox:
            normed = F.layer_norm(h, (self.d,), eps=self.eps)
            return torch.addcmul(pick(p[f"{which}_bias"]).unsqueeze(1), normed, weight)
        return F.rms_norm(h, (self.d,), eps=self.eps) * weight

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor | None = None,
        members: torch.Tensor | None = None,
        step_keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (Ka, B, T, W) float or (Ka, B, T) long -> logits (Ka, B, k, m, C)."""
        p = self.member_params(members)
        sites = None if step_keys is None else ops.DropoutSites(step_keys)
        spec, d = self.spec, self.d
        Ka, B, T = x.shape[:3]
        h = self.embed_inputs(p, x, sites)
        if self.neox:
            h = ops.dropout(h, self.hidden_p, self.training, sites)  # emb_dropout
        h = h.reshape(Ka, B * T, d)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in range(self.n_layer):
            block = self._neox_block if self.neox else self._llama_block
            h = block(h, layer, p, T, cos, sin, sites)
        k = spec.n_predicting_tokens
        read_out = ReadOut.of(T, k, lengths, Ka * B, x.device)
        h = read_out.take(h.reshape(-1, d)).reshape(Ka, B * k, d)
        h = self._norm(h, p, "norm_f", None)
        return self.read_out(p, h, B)

    def _attention(self, q, k, v, T, cos, sin, sites) -> torch.Tensor:
        """(rows, d) queries and (rows, d_kv) keys/values -> (rows, d) attention output."""
        H, Hkv, hd = self.n_head, self.n_kv, self.hd
        q = rotary(q.view(-1, T, H, hd).transpose(1, 2), cos, sin)  # (Ka*B, H, T, hd)
        k = rotary(k.view(-1, T, Hkv, hd).transpose(1, 2), cos, sin)
        v = v.view(-1, T, Hkv, hd).transpose(1, 2)
        if Hkv != H:
            k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        p = self.attn_p if self.training else 0.0
        o = ops.causal_attention(q, k, v, hd**-0.5, p, None, sites)
        return o.transpose(1, 2).reshape(-1, H * hd)

    def _neox_block(self, h, layer, p, T, cos, sin, sites) -> torch.Tensor:
        (w_qkv, b_qkv), (w_o, b_o), (w_fc, b_fc), (w_p, b_p) = self.frozen[layer]
        d, H, hd = self.d, self.n_head, self.hd
        a = self._norm(h, p, "norm_1", layer).reshape(-1, d)
        qkv = torch.addmm(b_qkv, a, w_qkv).view(-1, H, 3 * hd)  # per head: q, k, v
        q, k, v = (t.reshape(-1, d) for t in qkv.split(hd, dim=-1))
        o = torch.addmm(b_o, self._attention(q, k, v, T, cos, sin, sites), w_o).view_as(h)
        o = ops.dropout(o, self.hidden_p, self.training, sites)
        mlp_input = h if self.parallel else h + o
        a = self._norm(mlp_input, p, "norm_2", layer).reshape(-1, d)
        f = torch.addmm(b_p, self.act(torch.addmm(b_fc, a, w_fc)), w_p).view_as(h)
        return ops.add_dropout(mlp_input + o if self.parallel else mlp_input, f, self.hidden_p,
                               self.training, sites)  # fmt: skip

    def _llama_block(self, h, layer, p, T, cos, sin, sites) -> torch.Tensor:
        q_, k_, v_, o_, gate, up, down = self.frozen[layer]
        d = self.d

        def linear(a, wb):
            weight, bias = wb
            return a @ weight if bias is None else torch.addmm(bias, a, weight)

        a = self._norm(h, p, "norm_1", layer).reshape(-1, d)
        o = linear(self._attention(linear(a, q_), linear(a, k_), linear(a, v_), T, cos, sin,
                                   sites), o_)  # fmt: skip
        h = h + o.view_as(h)
        a = self._norm(h, p, "norm_2", layer).reshape(-1, d)
        f = linear(self.act(linear(a, gate)) * linear(a, up), down)
        return h + f.view_as(h)


def packed_model(
    backbone: nn.Module,
    spec: TaskSpec,
    heads: list[FPT],
    n_tokens: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """The packed model of ``backbone``'s family (``Family.packed``): ``PackedFPT`` for
    GPT-2, ``PackedRotaryFPT`` for GPT-NeoX and Llama-style bodies."""
    family = family_of(backbone.config)
    if family is None or not family.packed:
        kind = getattr(backbone.config, "model_type", type(backbone).__name__)
        raise ValueError(f"{kind}: not a family that packs (models/families.py: packed)")
    return family.packed_class()(backbone, spec, heads, n_tokens, dtype=dtype, device=device)
