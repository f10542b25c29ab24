"""Sizes and scaling rules as small pure functions: parameter counts, FLOPs, a block's
shape (what its activations are; the planner counts their bytes per step).

Nothing here builds a model; tests check every formula against the modules ``models`` builds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPT2Size:
    """A GPT-2 architecture: enough to count its parameters and FLOPs without building it."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int = 1024
    vocab_size: int = 50257
    pretrain_steps: int = 800
    """Language-pretraining steps ``scale-fpt pretrain`` (and a sweep's first use) gives this
    CPU preset unless told otherwise."""

    @property
    def n_inner(self) -> int:
        return 4 * self.n_embd


# Hub GPT-2 sizes (Radford et al. 2019) and CPU-sized presets for tests and laptops. The CPU
# presets keep GPT-2's 1024 positions so every task (CIFAR-10 LRA: 1024 tokens) fits, and a
# byte-level vocabulary, which is what `scale-fpt pretrain` trains them with.
GPT2_SIZES = {
    "gpt2": GPT2Size(12, 768, 12),
    "gpt2-medium": GPT2Size(24, 1024, 16),
    "gpt2-large": GPT2Size(36, 1280, 20),
    "gpt2-xl": GPT2Size(48, 1600, 25),
    "gpt2-tiny": GPT2Size(2, 128, 4, vocab_size=256),
    "gpt2-mini": GPT2Size(4, 256, 4, vocab_size=256),
    "gpt2-small-cpu": GPT2Size(6, 384, 6, vocab_size=256),
    # The CPU ladder (`scale-fpt sweep ladder`): gpt2-tiny's depth at widths 32..96, cheap
    # enough to pretrain all four on a laptop; the small widths stop improving by 300 steps,
    # and the four pretrainings are most of a CPU ladder's time.
    "gpt2-w32": GPT2Size(2, 32, 4, vocab_size=256, pretrain_steps=300),
    "gpt2-w64": GPT2Size(2, 64, 4, vocab_size=256, pretrain_steps=300),
    "gpt2-w96": GPT2Size(2, 96, 4, vocab_size=256, pretrain_steps=300),
}
HUB_SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


@dataclass(frozen=True)
class FamilySize:
    """A GPT-NeoX or Llama-style architecture, enough to build its config offline."""

    family: str
    """``gpt-neox`` or ``llama`` (``models.families``)."""
    n_layer: int
    d_model: int
    n_head: int
    vocab_size: int
    inner: int = 0
    """MLP width (0: 4 d)."""
    n_kv_head: int = 0
    """Key/value heads (0: one per query head)."""
    published_params: int = 0
    """The parameter count its publisher gives (Pythia: Biderman et al. 2023, Table 1,
    embeddings in and out included); 0 for CPU presets."""

    @property
    def mlp_width(self) -> int:
        return self.inner or 4 * self.d_model


PYTHIA_SIZES = {
    f"EleutherAI/pythia-{name}": FamilySize("gpt-neox", *shape, published_params=published)
    for name, shape, published in (
        ("14m", (6, 128, 4, 50304), 14_067_712),
        ("31m", (6, 256, 8, 50304), 30_494_720),
        ("70m", (6, 512, 8, 50304), 70_426_624),
        ("160m", (12, 768, 12, 50304), 162_322_944),
        ("410m", (24, 1024, 16, 50304), 405_334_016),
        ("1b", (16, 2048, 8, 50304), 1_011_781_632),
        ("1.4b", (24, 2048, 16, 50304), 1_414_647_808),
        ("2.8b", (32, 2560, 32, 50304), 2_775_208_960),
        ("6.9b", (32, 4096, 32, 50432), 6_857_302_016),
        ("12b", (36, 5120, 40, 50688), 11_846_072_320),
    )
}
"""Pythia (EleutherAI; GPT-NeoX blocks, rotary on a quarter of each head, parallel residual,
2048 positions, untied embeddings in and out). Built offline from this table, so planning
and random-init trials need no download; ``pretrained`` reads the hub (or its cache)."""
PYTHIA_LADDER = tuple(f"EleutherAI/pythia-{n}" for n in ("70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b"))  # fmt: skip
FAMILY_CPU_PRESETS = {
    "pythia-tiny": FamilySize("gpt-neox", 2, 128, 4, 256),
    "llama-tiny": FamilySize("llama", 2, 128, 4, 256, inner=256, n_kv_head=2),
}
"""Random-init CPU presets of the other families (no pretrained weights: tests, laptops)."""
PYTHIA_CHECKPOINTS = (0, *(2**i for i in range(10)), *range(1000, 143001, 1000))
"""Pythia's 154 published pretraining checkpoints (hub revisions ``step<N>``): step 0, the
log-spaced steps 1-512, then every 1000 steps to 143000 (the final weights)."""


def pythia_revisions(steps=PYTHIA_CHECKPOINTS) -> list[str]:
    """Hub revision names of Pythia checkpoints (``step143000``)."""
    return [f"step{s}" for s in steps]


def neox_group_params(size: FamilySize) -> dict[str, int]:
    """GPT-NeoX backbone parameters per group (no embeddings; rotary: no ``pos``)."""
    d, n, inner = size.d_model, size.n_layer, size.mlp_width
    return {
        "ln": n * 2 * (2 * d) + 2 * d,
        "ff": n * (d * inner + inner + inner * d + d),
        "attn": n * (d * 3 * d + 3 * d + d * d + d),
    }


def gpt2_group_params(size: GPT2Size) -> dict[str, int]:
    """Backbone parameters per fine-tuning group (the word embedding ``wte`` is never used)."""
    d, n, inner = size.n_embd, size.n_layer, size.n_inner
    return {
        "ln": n * 2 * (2 * d) + 2 * d,  # ln_1 and ln_2 per block (weight + bias), then ln_f
        "pos": size.n_positions * d,  # wpe
        "attn": n * ((d * 3 * d + 3 * d) + (d * d + d)),  # c_attn (q, k, v) and c_proj
        "ff": n * ((d * inner + inner) + (inner * d + d)),  # c_fc and c_proj
    }


def head_params(d_model: int, token_width: int, vocab_size: int, n_outputs: int) -> dict[str, int]:
    """Input layer (linear from the token width, or an embedding table) and output head."""
    n_input = vocab_size * d_model if vocab_size else token_width * d_model + d_model
    return {"input": n_input, "output": d_model * n_outputs + n_outputs}


def lstm_params(width: int, n_layers: int) -> int:
    """nn.LSTM(width, width, n_layers): 4 gates x (input + hidden weights + 2 biases) per layer."""
    return n_layers * 4 * (2 * width * width + 2 * width)


def lstm_norm_params(width: int, n_layers: int) -> int:
    """A layer-normalised LSTM (``models.fpt.LayerNormLSTMLayer``) per layer: gain and bias
    of the input and recurrent pre-activation norms (4 x width each) and of the cell norm."""
    return n_layers * 2 * (4 * width + 4 * width + width)


def ln_lstm_weight_params(width: int, n_layers: int) -> int:
    """The weights of a layer-normalised LSTM besides its norms: two bias-free 4-gate
    projections per layer."""
    return n_layers * 2 * width * 4 * width


def attention_flops_per_sequence(n_layer: int, d_model: int, n_tokens: int) -> int:
    """Forward FLOPs of the attention products QK^T and AV (no weights: same frozen or not)."""
    return n_layer * 2 * 2 * n_tokens * n_tokens * d_model


def train_step_flops(
    matmul_params: int,
    trained_matmul_params: int,
    attention_fwd: int,
    n_tokens: int,
    batch: int,
    backbone_backward: bool = True,
) -> int:
    """FLOPs of one training step (forward + backward) for ``batch`` sequences.

    Forward costs 2 FLOPs per weight per token. Backward needs the activation gradients
    (2 per weight per token) through every layer above a trained parameter, plus weight
    gradients (2 more) only for trained weights: 6N per token when everything trains, ~4N
    when the big matrices are frozen. Attention products cost twice their forward in backward.
    With nothing trained below the output head (``backbone_backward=False``) the backward
    stops at the head.
    """
    if not backbone_backward:
        return batch * (n_tokens * (2 * matmul_params + 2 * trained_matmul_params) + attention_fwd)
    per_token = 2 * matmul_params + 2 * matmul_params + 2 * trained_matmul_params
    return batch * (n_tokens * per_token + 3 * attention_fwd)


def readout_flops_skipped(
    d_model: int, n_inner: int, n_tokens: int, n_read: int, batch: int, training: bool = True
) -> int:
    """FLOPs a step skips by running the last block only for the ``n_read`` tokens that
    are read out (what ``packing.PackedFPT`` does): for the other tokens that block's
    attention products, attention output projection and MLP (queries, keys and values are
    projected for every token, in one GEMM). Forward 2 FLOPs per weight per token; training
    adds the activation gradients (frozen weights: 2 more) and twice the attention forward."""
    skipped_tokens = n_tokens - n_read
    weights = d_model * d_model + 2 * d_model * n_inner
    attention = 2 * 2 * skipped_tokens * n_tokens * d_model
    if training:
        return batch * (skipped_tokens * 4 * weights + 3 * attention)
    return batch * (skipped_tokens * 2 * weights + attention)


def eval_step_flops(matmul_params: int, attention_fwd: int, n_tokens: int, batch: int) -> int:
    return batch * (n_tokens * 2 * matmul_params + attention_fwd)


@dataclass(frozen=True)
class BlockShape:
    """What one transformer block's saved activations depend on, for any family."""

    d_model: int
    inner: int
    """Width of the MLP's hidden layer (GPT-2: 4 d; Llama: ``intermediate_size``)."""
    gated: bool = False
    """Gated MLP (Llama's SiLU(x W_gate) * x W_up): two inner-wide products and their
    product are kept, not one pre- and one post-activation."""
    rms_norm: bool = False
    """RMSNorm as transformers composes it (the input and the normalised input kept, vs
    LayerNorm's fused kernel keeping its input)."""

    @property
    def activation_units(self) -> int:
        """Bytes per token that one block keeps for backward at 16 bits (Korthikanti et al.
        2022's 34 d for GPT-2, without the attention-score term that SDPA does not store):
        attention 11 d (the norm's output, Q, K and V as attended (grouped-query keys and
        values are repeated to every query head first, so GQA keeps what MHA keeps), the
        projection's input, a dropout mask); MLP 2 d input + 4 inner (activation in and out;
        gated: 8 inner, gate and up in, the activation out and the product) + d mask; two
        norms 4 d (RMSNorm composed: 8 d). Checked against the bytes autograd keeps on tiny
        models of each family (tests/test_families.py)."""
        d = self.d_model
        mlp = 2 * d + (8 if self.gated else 4) * self.inner + d
        norms = (8 if self.rms_norm else 4) * d
        return 11 * d + mlp + norms
