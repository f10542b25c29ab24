"""K FPT models over one frozen GPT-2 body (a packed cohort's model).

    x (K, B, T, W) -> input (per member) + wpe (per member) -> for each block:
        LN (per member gains) -> one GEMM on the (K*B*T, d) stacked rows (frozen)
        -> causal attention on (K*B, H, T, T) -> one GEMM -> LN -> two GEMMs (frozen)
        (the last block: queries, keys and values for all T tokens, everything else
        only for the k read-out tokens, whose outputs are all the head reads)
    -> ln_f (per member) -> output head (per member) -> (K, B, k, m, C)

A member's rows are one contiguous chunk of every activation (the member axis leads), laid
out as its tensors are when it runs alone (K = 1): keyed dropout (``step_keys``: the
members' keys of the step, passed to every dropout call through ``ops.DropoutSites``) then
draws each member the masks it draws alone. The last block's masks are keyed on the
read-out rows' places among all T tokens (``ops.Rows``), so they are the masks a model
computing every token (a DeepSpeed engine's GPT-2) draws for those rows. The forward pass holds nothing but tensors and
local Python state, so ``torch.compile`` traces it whole.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from scale_fpt.models import ops
from scale_fpt.models.fpt import FPT
from scale_fpt.tasks.base import TaskSpec

# Trained tensors of PackedFPT and the fine-tuning group each belongs to.
PARAM_GROUPS = {
    "input_weight": "input",
    "input_bias": "input",
    "input_embedding": "input",
    "wpe": "pos",
    "ln_1_weight": "ln",
    "ln_1_bias": "ln",
    "ln_2_weight": "ln",
    "ln_2_bias": "ln",
    "ln_f_weight": "ln",
    "ln_f_bias": "ln",
    "output_weight": "output",
    "output_bias": "output",
}


FPT_NAMES = {
    "input_weight": "input.weight",
    "input_bias": "input.bias",
    "input_embedding": "input.weight",
    "wpe": "backbone.wpe.weight",
    "ln_f_weight": "backbone.ln_f.weight",
    "ln_f_bias": "backbone.ln_f.bias",
    "output_weight": "output.weight",
    "output_bias": "output.bias",
}
"""PackedFPT tensor -> the name of the same tensor in a member's FPT module (the per-layer
``ln_1``/``ln_2`` stacks map to ``backbone.h.<layer>.ln_<n>.<part>``)."""


SUMMED_OUTPUTS = 8
"""Read-out heads of at most this many outputs compile as sums over the width, not a
matmul (``PackedMembers.read_out``): inductor unrolls reductions this short."""


class PackedMembers(nn.Module):
    """What every packed model shares: the K members' trained tensors stacked on a leading
    member axis (parameters named as in ``PARAM_GROUPS``), their input layer and their
    read-out head. Subclasses set ``spec``, ``d``, ``dtype`` and ``input_p`` and run a body."""

    @staticmethod
    def member_stack(device, tensors) -> nn.Parameter:
        """The members' values of one trained tensor, stacked on the member axis, in fp32."""
        stacked = torch.stack([t.detach().float() for t in tensors])
        return nn.Parameter(stacked.to(device).contiguous())

    def member_params(self, members: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Trained tensors of the members ``members`` (indices into K; None: all K), in the
        step's dtype."""
        out = {}
        for name, p in self.named_parameters():
            t = p if members is None else p.index_select(0, members)
            out[name] = t.to(self.dtype) if self.dtype != torch.float32 else t
        return out

    def embed_inputs(
        self, p: dict[str, torch.Tensor], x: torch.Tensor, sites: ops.DropoutSites | None
    ) -> torch.Tensor:
        """x (Ka, B, T, W) float or (Ka, B, T) long -> (Ka, B, T, d): each member's input
        layer (a token embedding, or a linear layer followed by input dropout)."""
        Ka, B, T = x.shape[:3]
        d = self.d
        if self.spec.discrete:
            vocab = p["input_embedding"].shape[1]
            offsets = torch.arange(Ka, device=x.device).view(Ka, 1, 1) * vocab
            return F.embedding(x + offsets, p["input_embedding"].reshape(Ka * vocab, d))
        x = x.reshape(Ka, B * T, x.shape[-1]).to(self.dtype)
        bias, weight = p["input_bias"].unsqueeze(1), p["input_weight"].transpose(1, 2)
        if x.shape[-1] == 1 and torch.compiler.is_compiling():
            # One input per token: an outer product, which a compiled step fuses into the
            # next kernel (a matmul of inner size 1 is a launch, and its inputs' casts one
            # more). Eager, the matmul is one op fewer in the backward.
            h = torch.addcmul(bias, x, weight)
        else:
            h = torch.baddbmm(bias, x, weight)
        h = h.view(Ka, B, T, d)
        return ops.dropout(h, self.input_p, self.training, sites)

    def read_out(self, p: dict[str, torch.Tensor], h: torch.Tensor, B: int) -> torch.Tensor:
        """(Ka, B*k, d) final-norm read-out rows -> logits (Ka, B, k, m, C)."""
        spec = self.spec
        weight, bias = p["output_weight"], p["output_bias"].unsqueeze(1)
        if weight.shape[1] <= SUMMED_OUTPUTS and torch.compiler.is_compiling():
            # A few outputs: each a sum over the width, which inductor fuses with the final
            # norm and, unrolled, the loss's backward into the norm's backward (a matmul is
            # a launch of its own each way, and two in the backward).
            logits = torch.add(bias, (h.unsqueeze(2) * weight.unsqueeze(1)).sum(-1))
        else:
            logits = torch.baddbmm(bias, h, weight.transpose(1, 2))
        return logits.view(
            h.shape[0], B, spec.n_predicting_tokens, spec.outputs_per_token, spec.n_classes
        )


class PackedFPT(PackedMembers):
    """K FPT models over one frozen GPT-2 body.

    The frozen block weights (attention and MLP matrices) are held once, in the compute
    dtype; every trained tensor has a leading member axis and is kept in fp32 (the master
    copy; cast to the compute dtype in ``forward`` for bf16).
    """

    param_groups = PARAM_GROUPS

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
        self.spec, self.K, self.dtype = spec, len(heads), dtype
        self.d, self.n_layer, self.n_head = config.n_embd, config.n_layer, config.n_head
        self.eps = config.layer_norm_epsilon
        self.input_p = heads[0].input_p  # dropout after a linear input layer (one per cohort)
        self.embd_p, self.resid_p, self.attn_p = (
            config.embd_pdrop,
            config.resid_pdrop,
            config.attn_pdrop,
        )
        blocks = list(backbone.h)
        self.scales = [float(block.attn.scaling) for block in blocks]
        self.act = blocks[0].mlp.act  # ops.GeluTanh for GPT-2 (backbones.fast_ops)

        def shared(tensor: torch.Tensor) -> nn.Parameter:  # the backbone's value, per member
            return self.member_stack(device, [tensor] * self.K)

        if spec.discrete:
            self.input_embedding = self.member_stack(
                device, [h.input.weight for h in heads]
            )  # (K, V, d)
        else:
            self.input_weight = self.member_stack(
                device, [h.input.weight for h in heads]
            )  # (K, d, W)
            self.input_bias = self.member_stack(device, [h.input.bias for h in heads])  # (K, d)
        self.wpe = shared(backbone.wpe.weight[:n_tokens])  # (K, T, d): rows past T never train
        for name in ("ln_1", "ln_2"):
            for part in ("weight", "bias"):
                layers = torch.stack([getattr(getattr(b, name), part) for b in blocks])
                setattr(self, f"{name}_{part}", shared(layers))  # (K, L, d)
        self.ln_f_weight = shared(backbone.ln_f.weight)  # (K, d)
        self.ln_f_bias = shared(backbone.ln_f.bias)
        self.output_weight = self.member_stack(
            device, [h.output.weight for h in heads]
        )  # (K, O, d)
        self.output_bias = self.member_stack(device, [h.output.bias for h in heads])  # (K, O)

        # Frozen body: plain tensors (not parameters, never in the optimiser or checkpoints).
        def frozen(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device=device, dtype=dtype)

        self.frozen = [
            (
                frozen(b.attn.c_attn.weight),  # Conv1D: (d, 3d), y = x @ W + b
                frozen(b.attn.c_attn.bias),
                frozen(b.attn.c_proj.weight),
                frozen(b.attn.c_proj.bias),
                frozen(b.mlp.c_fc.weight),
                frozen(b.mlp.c_fc.bias),
                frozen(b.mlp.c_proj.weight),
                frozen(b.mlp.c_proj.bias),
            )
            for b in blocks
        ]

    def trained_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters()]

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s trained tensors under the names of its own FPT module
        (``build_model``), on the CPU. ``backbone.wpe.weight`` holds the task's T rows only
        (the rows past T never train)."""
        out = {}
        for name, p in self.named_parameters():
            value = p.detach()[member].cpu().clone()
            if name.startswith(("ln_1", "ln_2")):
                layer_norm, part = name.rsplit("_", 1)
                for layer in range(self.n_layer):
                    out[f"backbone.h.{layer}.{layer_norm}.{part}"] = value[layer]
            else:
                out[FPT_NAMES.get(name, name)] = value
        return out

    def _ln(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Layer norm of (Ka, N, d) rows with each member's gain and bias (Ka, d)."""
        normed = F.layer_norm(h, (self.d,), eps=self.eps)
        return torch.addcmul(bias.unsqueeze(1), normed, weight.unsqueeze(1))

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor | None = None,
        members: torch.Tensor | None = None,
        step_keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (Ka, B, T, W) float or (Ka, B, T) long for the members ``members`` (indices into
        K; None: all K) -> logits (Ka, B, k, m, C). ``step_keys`` (Ka,): the members' dropout
        keys of this step (``ops.step_keys``); None: dropout unkeyed."""
        p = self.member_params(members)
        sites = None if step_keys is None else ops.DropoutSites(step_keys)
        spec, d = self.spec, self.d
        Ka, B, T = x.shape[:3]
        h = self.embed_inputs(p, x, sites)
        h = ops.dropout(h + p["wpe"][:, None, :T], self.embd_p, self.training, sites)
        h = h.reshape(Ka, B * T, d)
        k = spec.n_predicting_tokens
        # Only the last k (real) tokens are read out: the last block computes its attention
        # and MLP for those rows alone (queries, keys and values in one GEMM for all T).
        read_out = ReadOut.of(T, k, lengths, Ka * B, x.device)
        for layer in range(self.n_layer):
            last = layer == self.n_layer - 1
            h = self._block(h, layer, p, T, read_out if last else None, sites)  # (Ka, B*T|B*k, d)
        h = self._ln(h, p["ln_f_weight"], p["ln_f_bias"])  # (Ka, B*k, d)
        return self.read_out(p, h, B)

    def _block(
        self,
        h: torch.Tensor,
        layer: int,
        p: dict[str, torch.Tensor],
        T: int,
        read_out: ReadOut | None,
        sites: ops.DropoutSites | None = None,
    ) -> torch.Tensor:
        """One GPT-2 block over (Ka, N = B*T, d) rows -> (Ka, N, d); with ``read_out`` only
        those tokens' outputs -> (Ka, B*k, d)."""
        w_qkv, b_qkv, w_o, b_o, w_fc, b_fc, w_p, b_p = self.frozen[layer]
        Ka, d, H = h.shape[0], self.d, self.n_head
        hd = d // H
        train = self.training
        a = self._ln(h, p["ln_1_weight"][:, layer], p["ln_1_bias"][:, layer]).reshape(-1, d)
        residual_rows = None  # where h's rows sit among all B*T rows (keys its dropout masks)
        positions = None
        # Queries, keys and values stacked as their projection writes them (its gradient
        # then comes back as one tensor: heads.unstack_heads), all K in one GEMM.
        qkv = torch.addmm(b_qkv, a, w_qkv)  # (Ka*B*T, 3d)
        if read_out is None:
            q, k, v = qkv.view(-1, T, 3, H, hd).permute(2, 0, 3, 1, 4), None, None
        else:
            # Every token's query is projected in the same GEMM (one launch each way, where
            # projecting the read-out rows apart took three) and the read-out rows' queries
            # are read from it: a strided view without padding.
            k = qkv.view(-1, T, 3, H, hd)[:, :, 1:].permute(2, 0, 3, 1, 4)  # (2, Ka*B, H, T, hd)
            v, positions, residual_rows = None, read_out.positions, read_out.rows
            h = read_out.take(h.reshape(-1, d)).reshape(Ka, -1, d)
            q = read_out.take(qkv[:, :d]).view(len(positions), -1, H, hd).transpose(1, 2)
        o = ops.causal_attention(
            q, k, v, self.scales[layer], self.attn_p if train else 0.0, positions, sites
        )
        o = torch.addmm(b_o, o.transpose(1, 2).reshape(-1, d), w_o)
        h = ops.add_dropout(h, o.view_as(h), self.resid_p, train, sites, residual_rows)
        a = self._ln(h, p["ln_2_weight"][:, layer], p["ln_2_bias"][:, layer]).reshape(-1, d)
        f = torch.addmm(b_p, self.act(torch.addmm(b_fc, a, w_fc)), w_p)
        return ops.add_dropout(h, f.view_as(h), self.resid_p, train, sites, residual_rows)


class ReadOut(NamedTuple):
    """The tokens a model reads out, as the last block computes them alone."""

    positions: torch.Tensor
    """(N, k) their positions among the T tokens of each of N sequences."""
    rows: ops.Rows
    """Their rows among all N*T rows (where their dropout masks are keyed)."""
    tail: int | None
    """k where they are the last k tokens of every sequence (no padding), else None."""

    @classmethod
    def of(
        cls, T: int, k: int, lengths: torch.Tensor | None, n: int, device: torch.device
    ) -> ReadOut:
        """The last k (real) tokens of ``n`` sequences of T (``predicting_positions``)."""
        positions = predicting_positions(T, k, lengths, n, device)
        rows = positions + torch.arange(0, n * T, T, device=device)[:, None]
        return cls(positions, ops.Rows(rows.reshape(-1), n * T), k if lengths is None else None)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """Their rows (N, k, d) of ``x`` (N*T, d): without padding a strided view, which a
        compiled step's kernels read in place (and whose backward fuses into its
        neighbours; a gather's is a scatter of its own kernels), else a gather."""
        N, d = self.positions.shape[0], x.shape[-1]
        if self.tail is None:
            return x.index_select(0, self.rows.index).view(N, -1, d)
        return x.view(N, -1, d)[:, -self.tail :]


def predicting_positions(
    T: int, k: int, lengths: torch.Tensor | None, n: int, device: torch.device
) -> torch.Tensor:
    """(n, k) positions of the tokens read out: the last k, or the last k real ones before
    padding (as ``fpt.last_tokens``)."""
    offsets = torch.arange(-k, 0, device=device)
    if lengths is None:
        return (offsets + T).expand(n, k)
    return (lengths.reshape(-1, 1) + offsets).clamp(min=0)
