"""Fine-tuning groups: which parameter belongs to input, output, ln, pos, ff, attn.

Parameters of the backbone that fit none of these (an LSTM's weights, a model's extra
projections) form the group ``backbone``, trained only under ``full``. Frozen parameters get
``requires_grad=False`` and are never handed to the optimiser.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from scale_fpt.config import ADAPTER_GROUPS, FINETUNE_PRESETS, GROUPS, ConfigError, parse_finetune
from scale_fpt.models.families import backbone_groups, family_of

OTHER = "backbone"
ORDER = (*GROUPS, *ADAPTER_GROUPS, OTHER)
"""Every group, in the order counts and plans list them."""
ATTN_WORDS = ("attn", "attention")
FF_WORDS = ("mlp", "feed_forward", "ffn")
POS_WORDS = ("wpe", "position")


def module_groups(model: nn.Module) -> dict[str, str]:
    """Parameter name -> group, for an ``FPT`` (input / backbone / output) model: by the
    backbone family's explicit rules (``families.FAMILIES``), else by the name heuristic."""
    family = family_of(getattr(getattr(model, "backbone", None), "config", None))
    if family is not None:
        names = [name for name, _ in model.named_parameters()]
        body = [n.partition(".")[2] for n in names if n.startswith("backbone.")]
        mapped = backbone_groups(family, body)
        return {
            n: mapped[n.partition(".")[2]] if n.startswith("backbone.") else n.partition(".")[0]
            for n in names
        }
    return heuristic_groups(model)


def heuristic_groups(model: nn.Module) -> dict[str, str]:
    """Parameter name -> group by module types and names (architectures outside
    ``families.FAMILIES``, the LSTM, the ablation bodies)."""
    norm_modules = {name for name, m in model.named_modules() if "norm" in type(m).__name__.lower()}
    groups = {}
    for name, _ in model.named_parameters():
        top, _, rest = name.partition(".")
        if top in ("input", "output"):
            groups[name] = top
            continue
        owner = name.rsplit(".", 1)[0]
        words = rest.lower()
        if owner in norm_modules:
            groups[name] = "ln"
        elif any(w in words for w in POS_WORDS):
            groups[name] = "pos"
        elif any(w in words for w in ATTN_WORDS):
            groups[name] = "attn"
        elif any(w in words for w in FF_WORDS):
            groups[name] = "ff"
        else:
            groups[name] = OTHER
    return groups


def trained_groups(model: nn.Module, finetune: str) -> tuple[str, ...]:
    """Resolve a ``--finetune`` spec against the architecture.

    Presets keep the groups this architecture has (``fpt`` on an LSTM trains input and
    output); a group named explicitly that the architecture lacks is an error.
    """
    present = set(module_groups(model).values())
    requested = parse_finetune(finetune)
    parts = {p.strip() for p in finetune.split("+")}
    explicit = {g for g in requested if g in parts}
    missing = sorted(explicit - present)
    if missing:
        raise ConfigError(
            [
                f"--finetune: group(s) {', '.join(missing)} do not exist in this architecture "
                f"(it has: {', '.join(g for g in ORDER if g in present)})"
            ]
        )
    chosen = set(requested) & present
    if "full" in parts:
        chosen |= present
    return tuple(g for g in ORDER if g in chosen)


def freeze(model: nn.Module, finetune: str) -> tuple[str, ...]:
    """Set ``requires_grad`` by group; returns the trained groups."""
    trained = trained_groups(model, finetune)
    groups = module_groups(model)
    for name, param in model.named_parameters():
        param.requires_grad_(groups[name] in trained)
    return trained


def group_counts(model: nn.Module, n_tokens: int | None = None) -> dict[str, dict[str, int]]:
    """{group: {"total": n, "trainable": n}} in canonical order.

    ``trainable`` counts parameters that get a gradient. For the positional table (``pos``)
    that is the first ``n_tokens`` rows only, the task's sequence length: the other rows are
    never looked up, so they never change, and ``total`` keeps the whole table beside it
    (e.g. CIFAR-10 on gpt2: 64 x 768 trained of 1024 x 768). ``n_tokens=None`` counts
    every row of a trained table."""
    groups = module_groups(model)
    total, trainable = Counter(), Counter()
    for name, param in model.named_parameters():
        group = groups[name]
        total[group] += param.numel()
        if not param.requires_grad:
            continue
        if group == "pos" and n_tokens is not None and param.dim() == 2:
            trainable[group] += min(n_tokens, param.shape[0]) * param.shape[1]  # rows x width
        else:
            trainable[group] += param.numel()
    order = [g for g in ORDER if g in total]
    return {g: {"total": total[g], "trainable": trainable[g]} for g in order}


__all__ = ["FINETUNE_PRESETS", "freeze", "group_counts", "module_groups", "trained_groups"]
