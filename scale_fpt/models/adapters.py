"""LoRA through PEFT as the fine-tuning group ``lora``: a rank-r update B A (scaled by
alpha / r) beside every attention projection of the body (``families.Family.lora_targets``).

PEFT adapts what its target pattern matches and skips the rest without a word, so the
trainable count is asserted against the count from the shapes of the attention projections
that the family's group rules name: r x (fan-in + fan-out) each.
"""

from __future__ import annotations

import torch
from torch import nn

from scale_fpt.config import ConfigError, ModelConfig
from scale_fpt.models.families import Family, family_of
from scale_fpt.seeding import seed_streams


def projection_shape(module: nn.Module) -> tuple[int, int] | None:
    """(fan-in, fan-out) of a linear layer (``nn.Linear``, or GPT-2's transposed ``Conv1D``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":
        return tuple(module.weight.shape)  # (in, out): y = x @ W + b
    return None


def lora_params(backbone: nn.Module, family: Family, rank: int) -> int:
    """Parameters LoRA of ``rank`` should add: r x (fan-in + fan-out) of every linear layer
    the family's own group rules put in ``attn``, found without ``lora_targets``, so a
    target pattern that misses a projection (or one PEFT skips) is caught."""
    total = 0
    for name, module in backbone.named_modules():
        shape = projection_shape(module)
        if shape and family.group_of(f"{name}.weight") == "attn":
            total += rank * sum(shape)
    return total


def add_lora(backbone: nn.Module, config: ModelConfig, seed: int) -> int:
    """Inject LoRA (``config.lora_rank``, ``config.lora_alpha``) into ``backbone``'s attention
    projections, its A matrices drawn from trial ``seed``'s adapters stream; returns the
    parameters added. ConfigError for a backbone outside the known families."""
    from peft import LoraConfig, inject_adapter_in_model

    family = family_of(getattr(backbone, "config", None))
    if family is None:
        raise ConfigError(
            [
                f"--finetune lora: --model {config.model} is of no known family (gpt2, "
                "gpt-neox, llama, opt): its attention projections are not named"
            ]
        )
    expected = lora_params(backbone, family, config.lora_rank)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=family.lora_targets,
        fan_in_fan_out=family.name == "gpt2",  # Conv1D stores (in, out)
    )
    torch.manual_seed(seed_streams(seed).adapters)
    inject_adapter_in_model(lora, backbone)
    added = sum(p.numel() for name, p in backbone.named_parameters() if ".lora_" in name)
    if added != expected or not expected:
        raise RuntimeError(
            f"LoRA on {family.name}: PEFT added {added} parameters, the attention projections "
            f"({family.lora_targets}) call for {expected}"
        )
    return added
