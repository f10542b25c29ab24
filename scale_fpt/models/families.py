"""Backbone families: which parameter of each architecture belongs to which fine-tuning group,
what its positions are, where its blocks live, what LoRA adapts, and the block shape that its
FLOPs and activation memory follow.

Every family maps its parameters by explicit patterns over the backbone's parameter names
(``rules``); a parameter of a known family that no pattern names is an error, so a new
release of transformers that renames a tensor fails loudly instead of freezing it silently.
Architectures outside these families fall back to ``groups.module_groups``' name heuristic.

Families (transformers ``model_type`` in brackets):

- ``gpt2`` [gpt2]: learned absolute positions (``wpe``), LayerNorm, GELU MLP, fused QKV;
- ``gpt-neox`` [gpt_neox] (Pythia 14m-12b): rotary positions on part of each head
  (``rotary_pct``), LayerNorm, parallel residual (attention and MLP read the same input),
  GELU MLP, fused QKV;
- ``llama`` [llama, qwen2, mistral] (Llama, Qwen2, SmolLM): rotary positions, RMSNorm, gated
  SiLU MLP, grouped-query attention (fewer key/value heads than query heads);
- ``opt`` [opt]: learned positions (offset 2), LayerNorm, ReLU MLP. Its residual dropout is
  functional inside transformers' layer and so not keyed (and LayerDrop draws from torch's
  generator): OPT trials run alone on a DeepSpeed engine, never packed.

A family also declares whether and how it packs (``packed``: the model of K members over its
frozen body, with the norms that model names) and its block shape (``gated_mlp``,
``rms_norm``); nothing else recognises a family by name. Adding a packable family is its
entry here and, unless an existing packed model fits its block, its packed model.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from scale_fpt.config import GROUPS
from scale_fpt.scaling import BlockShape, FamilySize


@dataclass(frozen=True)
class Family:
    """How scale_fpt reads one family of transformers architectures."""

    name: str
    """What docs, ``scale-fpt plan`` and errors call it."""
    model_types: tuple[str, ...]
    """transformers ``config.model_type`` values of this family."""
    rules: tuple[tuple[str, str], ...]
    """(regular expression over a backbone parameter name, group), first match wins."""
    positions: str
    """``learned`` (a table: group ``pos``) or ``rotary`` (no parameters: ``pos`` is empty)."""
    layers: str
    """Dotted attribute of the backbone that holds its blocks."""
    lora_targets: str
    """Regular expression (full match) over module names: the modules LoRA adapts, every
    attention projection."""
    keyed_dropout: bool = True
    """Every dropout of the family's forward pass is a module or the attention interface's,
    so ``fast_ops`` keys them all (a packed or resumed run reproduces its solo run)."""
    gated_mlp: bool = False
    """Its MLP is gated (SiLU(x W_gate) * x W_up): the block shape FLOPs and activation
    memory follow (``block_shape``)."""
    rms_norm: bool = False
    """RMSNorm (no bias) rather than LayerNorm."""
    packed: str = ""
    """``"module:Class"`` of the model that runs K members over one frozen body of this
    family (a cohort step's), imported on first use; empty: its trials are never packed."""
    packed_norms: tuple[str, ...] = ()
    """The packed model's (block norm 1, block norm 2, final norm) attributes, where the
    packed block needs them named (the rotary families)."""
    preset_config: Callable[[FamilySize, float], object] | None = None
    """The transformers config of a size of this family from its numbers
    (``scaling.FamilySize``: Pythia and the CPU presets, built offline) at a dropout."""

    def packed_class(self):
        """The packed model class (``packed``)."""
        module, name = self.packed.split(":")
        return getattr(importlib.import_module(module), name)

    def group_of(self, name: str) -> str | None:
        """The group of backbone parameter ``name`` (LoRA's ``base_layer.`` wrapper ignored;
        LoRA's own tensors are ``lora``); None when no rule names it."""
        if ".lora_" in name:
            return "lora"
        plain = name.replace(".base_layer.", ".")
        return next((group for pattern, group in self.rules if re.search(pattern, plain)), None)

    def blocks(self, backbone):
        """The backbone's block list."""
        for attribute in self.layers.split("."):
            backbone = getattr(backbone, attribute)
        return backbone

    def empty_groups(self) -> dict[str, str]:
        """{group: why it has no parameters} for this family."""
        if self.positions == "rotary":
            return {
                "pos": "rotary positions (a fixed rotation of queries and keys, no parameters); "
                "'pos' trains nothing here"
            }
        return {}


def neox_config(size: FamilySize, dropout: float):
    """A GPT-NeoX size with Pythia's settings."""
    # transformers takes seconds to import: only when a preset's config is built
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.d_model,
        num_hidden_layers=size.n_layer,
        num_attention_heads=size.n_head,
        intermediate_size=size.mlp_width,
        hidden_act="gelu",
        rotary_pct=0.25,
        max_position_embeddings=2048,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_dropout=dropout,
        attention_dropout=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )


def llama_config(size: FamilySize, dropout: float):
    """A Llama-style size (grouped-query attention where ``n_kv_head`` says)."""
    # transformers takes seconds to import: only when a preset's config is built
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.d_model,
        num_hidden_layers=size.n_layer,
        num_attention_heads=size.n_head,
        num_key_value_heads=size.n_kv_head or size.n_head,
        intermediate_size=size.mlp_width,
        max_position_embeddings=2048,
        attention_dropout=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )


PACKED_ROTARY = "scale_fpt.models.packed_families:PackedRotaryFPT"
NEOX_LLAMA_NORMS = r"^layers\.\d+\.(input_layernorm|post_attention_layernorm)\."

FAMILIES = (
    Family(
        "gpt2",
        ("gpt2",),
        (
            (r"^wpe\.", "pos"),
            (r"^h\.\d+\.ln_[12]\.|^ln_f\.", "ln"),
            (r"^h\.\d+\.attn\.", "attn"),
            (r"^h\.\d+\.mlp\.", "ff"),
        ),
        "learned",
        "h",
        r".*\.attn\.(c_attn|c_proj)",
        packed="scale_fpt.models.packed:PackedFPT",
    ),
    Family(
        "gpt-neox",
        ("gpt_neox",),
        (
            (NEOX_LLAMA_NORMS + r"|^final_layer_norm\.", "ln"),
            (r"^layers\.\d+\.attention\.", "attn"),
            (r"^layers\.\d+\.mlp\.", "ff"),
        ),
        "rotary",
        "layers",
        r".*\.attention\.(query_key_value|dense)",
        packed=PACKED_ROTARY,
        packed_norms=("input_layernorm", "post_attention_layernorm", "final_layer_norm"),
        preset_config=neox_config,
    ),
    Family(
        "llama",
        ("llama", "qwen2", "mistral"),
        (
            (NEOX_LLAMA_NORMS + r"|^norm\.", "ln"),
            (r"^layers\.\d+\.self_attn\.", "attn"),
            (r"^layers\.\d+\.mlp\.", "ff"),
        ),
        "rotary",
        "layers",
        r".*\.self_attn\.(q_proj|k_proj|v_proj|o_proj)",
        gated_mlp=True,
        rms_norm=True,
        packed=PACKED_ROTARY,
        packed_norms=("input_layernorm", "post_attention_layernorm", "norm"),
        preset_config=llama_config,
    ),
    Family(
        "opt",
        ("opt",),
        (
            (r"^decoder\.embed_positions\.", "pos"),
            (
                r"^decoder\.final_layer_norm\.|"
                r"^decoder\.layers\.\d+\.(self_attn_layer_norm|final_layer_norm)\.",
                "ln",
            ),
            (r"^decoder\.layers\.\d+\.self_attn\.", "attn"),
            (r"^decoder\.layers\.\d+\.fc[12]\.", "ff"),
            # opt-350m's projections between its 512-wide embeddings and 1024-wide blocks.
            (r"^decoder\.project_(in|out)\.", "backbone"),
        ),
        "learned",
        "decoder.layers",
        r".*\.self_attn\.(q_proj|k_proj|v_proj|out_proj)",
        keyed_dropout=False,
    ),
)
BY_MODEL_TYPE = {t: family for family in FAMILIES for t in family.model_types}
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
PACKED_FAMILIES = tuple(f.name for f in FAMILIES if f.packed)
"""The families whose trials may share one frozen body in a cohort."""


def family_named(name: str) -> Family:
    """The family called ``name`` (``FAMILY_NAMES``)."""
    return next(family for family in FAMILIES if family.name == name)


def family_of(config) -> Family | None:
    """The family of a transformers config (None: not one of ``FAMILIES``)."""
    return BY_MODEL_TYPE.get(getattr(config, "model_type", None))


def backbone_groups(family: Family, names) -> dict[str, str]:
    """{backbone parameter name: group} by ``family``'s rules; RuntimeError naming every
    parameter no rule covers (a renamed tensor must not be frozen silently)."""
    out, unmatched = {}, []
    for name in names:
        group = family.group_of(name)
        if group is None:
            unmatched.append(name)
        else:
            out[name] = group
    if unmatched:
        raise RuntimeError(
            f"family {family.name}: no group for backbone parameter(s) {', '.join(unmatched)} "
            f"(models/families.py maps each of {', '.join(GROUPS)} explicitly)"
        )
    return out


def model_width(arch) -> int:
    """Width of the vectors the backbone takes and returns (OPT-350m's word-embedding
    projection width, else the hidden size)."""
    return int(getattr(arch, "word_embed_proj_dim", None) or arch.hidden_size)


def block_shape(arch) -> BlockShape:
    """The block shape (``scaling.BlockShape``) of a transformers config of any family."""
    d = int(arch.hidden_size)
    inner = (
        getattr(arch, "intermediate_size", None)
        or getattr(arch, "ffn_dim", None)
        or getattr(arch, "n_inner", None)
        or 4 * d
    )
    family = family_of(arch)
    if family is None:
        return BlockShape(d, int(inner))
    return BlockShape(d, int(inner), gated=family.gated_mlp, rms_norm=family.rms_norm)
