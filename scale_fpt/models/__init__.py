"""Models: backbones (GPT-2 presets, GPT-NeoX, Llama-style and OPT families, any HF causal LM,
LSTM, ablation bodies), the FPT wrapper, fine-tuning groups, LoRA."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scale_fpt.config import ABLATIONS, GROUPS, ConfigError, TrialConfig, parse_finetune
from scale_fpt.models.ablations import build_ablation
from scale_fpt.models.adapters import add_lora
from scale_fpt.models.backbones import build_backbone, load_architecture
from scale_fpt.models.families import family_of, model_width
from scale_fpt.models.fpt import FPT, LSTMBackbone, input_dropout_p
from scale_fpt.models.groups import ORDER, freeze, group_counts
from scale_fpt.seeding import seed_streams
from scale_fpt.tasks.base import TaskSpec


@dataclass
class BuiltModel:
    """A model ready to train, and what the trial records about it."""

    module: FPT
    trained_groups: tuple[str, ...]
    counts: dict[str, dict[str, int]]
    n_layer: int
    d_model: int

    @property
    def total_params(self) -> int:
        return sum(c["total"] for c in self.counts.values())

    @property
    def trainable_params(self) -> int:
        return sum(c["trainable"] for c in self.counts.values())


def build_model(
    config: TrialConfig, spec: TaskSpec, attn_implementation: str = "sdpa"
) -> BuiltModel:
    """Backbone (by init) + input/output layers for ``spec``, frozen by ``config.train.finetune``.

    Everything random is drawn from ``config.train.seed``'s streams (``seed_streams``): the
    backbone from ``backbone``, the input/output layers from ``heads``.
    """
    model_config, seed = config.model, config.train.seed
    if model_config.model == "lstm":
        d_model = model_config.lstm_width
        backbone: nn.Module = LSTMBackbone(
            d_model, model_config.lstm_layers, model_config.dropout, model_config.lstm_layer_norm
        )
        n_layer, n_positions = model_config.lstm_layers, None
    elif model_config.init in ABLATIONS:
        arch = load_architecture(model_config, attn_implementation)
        backbone, n_layer = build_ablation(model_config, seed, arch)
        d_model, n_positions = model_width(arch), None
    else:
        backbone, d_model, n_positions = build_backbone(model_config, seed, attn_implementation)
        n_layer = backbone.config.num_hidden_layers
        if "lora" in parse_finetune(config.train.finetune):
            add_lora(backbone, model_config, seed)
    check_positions(config, spec, n_positions)
    module = build_heads(spec, d_model, seed, input_dropout_p(model_config, spec))
    module.backbone = backbone
    trained = freeze(module, config.train.finetune)
    if model_config.init == "one-attn":  # the ablation's one layer always trains
        backbone.requires_grad_(True)
        trained = tuple(g for g in ORDER if g in {*trained, "attn", "ln"})
    return BuiltModel(module, trained, group_counts(module, spec.n_tokens), n_layer, d_model)


def family_name(built: BuiltModel, init: str = "") -> str:
    """What ``scale-fpt plan`` and the docs call the backbone's family: a family of
    ``families.FAMILIES``, the transformers model type, ``ablation <init>`` or ``lstm``."""
    config = getattr(built.module.backbone, "config", None)
    if init in ABLATIONS:
        return f"ablation {init}"
    if config is None:
        return "lstm"
    family = family_of(config)
    return family.name if family else f"{config.model_type} (no explicit mapping: name heuristic)"


def empty_groups(built: BuiltModel, init: str) -> dict[str, str]:
    """{group: why it has no parameters} for the groups ``GROUPS`` names that ``built`` lacks."""
    config = getattr(built.module.backbone, "config", None)
    family = family_of(config)
    known = family.empty_groups() if family else {}
    if init == "no-body":
        reason = "the transformer is removed (--init no-body)"
    elif init == "one-attn":
        reason = "the body is one attention layer (--init one-attn)"
    else:
        reason = "the architecture has no such parameters"
    return {g: known.get(g, reason) for g in GROUPS if g not in built.counts}


def check_positions(config: TrialConfig, spec: TaskSpec, n_positions: int | None) -> None:
    """ConfigError when the task's sequences are longer than the backbone's positions."""
    if n_positions is not None and spec.n_tokens > n_positions:
        raise ConfigError(
            [
                f"--task {config.task.task}: sequences of {spec.n_tokens} tokens exceed the "
                f"{n_positions} positions of {config.model.model}; lower --max-length or pick "
                "a model with more positions"
            ]
        )


def build_heads(spec: TaskSpec, d_model: int, seed: int, input_dropout: float = 0.0) -> FPT:
    """The input and output layers of trial ``seed`` around an empty backbone (``build_model``
    and packed cohorts both initialise heads here, so a packed member starts as it would
    alone). The heads have their own seed stream, so changing only the backbone (pretrained
    vs random) leaves the heads identical."""
    torch.manual_seed(seed_streams(seed).heads)
    return FPT(spec, nn.Identity(), d_model, input_dropout)


__all__ = [
    "FPT",
    "BuiltModel",
    "build_heads",
    "build_model",
    "check_positions",
    "empty_groups",
    "family_name",
]
