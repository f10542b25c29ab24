"""Backbones: resolve a model name to an architecture, and build it with an initialisation.

``pretrained`` loads weights with ``from_pretrained`` (hub id or local directory), ``random``
builds from the architecture's config alone (no network), ``stats`` draws every tensor from a
normal with the pretrained tensor's mean and std. The word embedding is never used (inputs
arrive as ``inputs_embeds``), so it is dropped: never held in memory, trained or counted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch import nn

from scale_fpt.config import ConfigError, ModelConfig
from scale_fpt.hub import hub_reachable
from scale_fpt.models import ops
from scale_fpt.models.families import family_named, family_of, model_width
from scale_fpt.scaling import (
    FAMILY_CPU_PRESETS,
    GPT2_SIZES,
    HUB_SIZES,
    PYTHIA_SIZES,
    FamilySize,
    GPT2Size,
)
from scale_fpt.seeding import seed_streams

CPU_PRESETS = tuple(name for name in GPT2_SIZES if name not in HUB_SIZES)
PRESETS = (*GPT2_SIZES, *PYTHIA_SIZES, *FAMILY_CPU_PRESETS)
"""Names whose architecture is built offline (Pythia's ``-deduped`` twins too)."""
DROPOUT_KEYS = (
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout",
    "attention_dropout",
    "dropout",  # OPT
)


def scale_fpt_home() -> Path:
    """Where scale_fpt caches what it builds (locally pretrained backbones)."""
    return Path(os.environ.get("SCALE_FPT_HOME", Path.home() / ".cache" / "scale_fpt"))


def local_backbone_dir(preset: str, corpus: str = "language") -> Path:
    """Cache directory of a CPU preset pretrained by ``scale-fpt pretrain``."""
    return scale_fpt_home() / "backbones" / f"{preset}-{corpus}"


def gpt2_config(size: GPT2Size, dropout: float):
    # transformers takes seconds to import: only when a preset's config is built
    from transformers import GPT2Config

    return GPT2Config(
        n_layer=size.n_layer,
        n_embd=size.n_embd,
        n_head=size.n_head,
        n_positions=size.n_positions,
        vocab_size=size.vocab_size,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=size.vocab_size - 1,
        eos_token_id=size.vocab_size - 1,
    )


def family_size(model: str) -> FamilySize | None:
    """The table entry of a Pythia size (``-deduped`` included) or a family CPU preset."""
    return FAMILY_CPU_PRESETS.get(model) or PYTHIA_SIZES.get(model.removesuffix("-deduped"))


LOCAL_CORPORA = ("language", "bit-memory")


def weights_source(config: ModelConfig) -> str:
    """The hub id or directory that ``pretrained``/``stats`` read. For a CPU preset,
    ``weights`` may also name the corpus of a locally pretrained backbone (``language``,
    the default, or ``bit-memory``)."""
    if config.model in CPU_PRESETS and config.weights in ("", *LOCAL_CORPORA):
        return str(local_backbone_dir(config.model, config.weights or "language"))
    return config.weights or config.model


def revision(config: ModelConfig) -> str | None:
    """The hub revision ``from_pretrained`` reads (None: the default branch)."""
    return config.revision or None


def missing_weights_problem(config: ModelConfig, source: str) -> str:
    if config.model in FAMILY_CPU_PRESETS and not config.weights:
        return (
            f"--init {config.init}: {config.model} is a random-init CPU preset with no "
            "pretrained weights; use --init random (or no-body, one-attn), or pass --weights DIR"
        )
    if config.model in CPU_PRESETS and config.weights in ("", *LOCAL_CORPORA):
        corpus = config.weights or "language"
        return (
            f"--init {config.init}: no pretrained weights for {config.model} at {source}; "
            f"make them with `scale-fpt pretrain --model {config.model} --corpus {corpus}` "
            "or pass --weights DIR"
        )
    return (
        f"--init {config.init}: weights {source!r}"
        + (f" at revision {config.revision!r}" if config.revision else "")
        + " are not available offline (no such directory, "
        "not in the Hugging Face cache); download them once with network access (or set HF_HOME "
        "to a cache that has them), or pass --weights DIR"
    )


def load_architecture(config: ModelConfig, attn_implementation: str = "sdpa"):
    """The transformers config of the backbone (no weights), with dropout applied."""
    if config.model in GPT2_SIZES:
        arch = gpt2_config(GPT2_SIZES[config.model], config.dropout)
    elif family_size(config.model) is not None:
        size = family_size(config.model)
        arch = family_named(size.family).preset_config(size, config.dropout)
    else:
        from transformers import AutoConfig

        source = config.model
        try:
            arch = from_disk_or_hub(
                lambda **kw: AutoConfig.from_pretrained(source, revision=revision(config), **kw),
                source,
            )
        except (OSError, ValueError) as e:
            raise ConfigError(
                [
                    f"--model: {source!r}"
                    + (f" at --revision {config.revision!r}" if config.revision else "")
                    + f" is not a preset ({', '.join(PRESETS)}, lstm), a local "
                    f"save_pretrained directory, or a Hugging Face id available offline "
                    f"({type(e).__name__})"
                ]
            ) from None
        for key in DROPOUT_KEYS:
            if hasattr(arch, key):
                setattr(arch, key, config.dropout)
    arch._attn_implementation = attn_implementation
    if getattr(arch, "activation_function", None) == "gelu_new":
        # The same tanh-approximated GELU as one fused kernel instead of five element-wise
        # ops (equal to ~1e-7); GPT-2 blocks then swap it for ops.GeluTanh (fast_ops).
        arch.activation_function = "gelu_pytorch_tanh"
    return arch


def fast_ops(backbone: nn.Module, attn_implementation: str) -> None:
    """Give a backbone of a known family (``families.FAMILIES``) the fast CPU dropout and
    (for ``sdpa``) attention of ``models.ops``, and GPT-2 its fused GELU: the same functions,
    ~20x cheaper dropout masks and 2x cheaper GELU on a CPU, torch's own kernels on a GPU.
    Every dropout mask is then keyed (``ops.dropout_keys``), so a resumed or packed run draws
    its solo run's masks. Other architectures are left as they are."""
    family = family_of(backbone.config)
    if family is None:
        return
    from transformers import AttentionInterface

    for parent in backbone.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Dropout):
                setattr(parent, name, ops.Dropout(child.p))
    if getattr(backbone.config, "activation_function", None) in ops.TANH_GELUS:
        for block in family.blocks(backbone):
            block.mlp.act = ops.GeluTanh()
    if attn_implementation == "sdpa":
        AttentionInterface.register(ops.HF_ATTENTION, ops.hf_causal_attention)
        backbone.config._attn_implementation = ops.HF_ATTENTION


def build_backbone(
    config: ModelConfig, seed: int, attn_implementation: str = "sdpa"
) -> tuple[nn.Module, int, int]:
    """The backbone module, its width and its maximum number of positions.

    Random tensors come from the backbone stream of trial ``seed`` (``seed_streams``): the
    same config and seed give the same weights.
    """
    from transformers import AutoModel

    arch = load_architecture(config, attn_implementation)
    seed = seed_streams(seed).backbone
    torch.manual_seed(seed)
    # Built in fp32 whatever dtype the checkpoint was saved in (transformers keeps a bf16
    # checkpoint in bf16, next to fp32 input/output layers); the step casts for --precision.
    if config.init == "random":
        backbone = AutoModel.from_config(arch).float()
    else:
        pretrained = load_pretrained(config, arch).float()
        if config.init == "pretrained":
            backbone = pretrained
        else:
            backbone = AutoModel.from_config(arch).float()
            match_statistics(backbone, pretrained, seed)
    backbone.set_input_embeddings(None)
    backbone.requires_grad_(False)
    fast_ops(backbone, attn_implementation)
    return backbone, model_width(arch), max_positions(arch)


def load_pretrained(config: ModelConfig, arch) -> nn.Module:
    """The pretrained backbone; ConfigError when the weights are unavailable or do not fit
    ``arch`` (transformers would otherwise re-initialise missing tensors at random)."""
    from transformers import AutoModel

    source = weights_source(config)
    local = Path(source).is_dir()
    if (config.model in CPU_PRESETS or config.model in FAMILY_CPU_PRESETS) and not local:
        raise ConfigError([missing_weights_problem(config, source)])
    try:
        with quiet_transformers():  # its load report would bury the one-line problem below
            model, info = from_disk_or_hub(
                lambda **kw: AutoModel.from_pretrained(
                    source,
                    config=arch,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                    revision=revision(config),
                    **kw,
                ),
                source,
            )
    except OSError:
        raise ConfigError([missing_weights_problem(config, source)]) from None
    embedding = model.get_input_embeddings()
    unused = {
        n for n, p in model.named_parameters() if embedding is not None and p is embedding.weight
    }
    missing = sorted(set(info["missing_keys"]) - unused)
    mismatched = sorted(k[0] for k in info["mismatched_keys"] if k[0] not in unused)
    if missing or mismatched:
        raise ConfigError(
            [
                f"--init {config.init}: the weights at {source} do not fit the architecture of "
                f"--model {config.model}: {len(missing)} tensor(s) missing, {len(mismatched)} of "
                f"another shape (e.g. {(missing + mismatched)[0]}); pass weights saved from the "
                "same architecture"
            ]
        )
    return model


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings and progress bars off (errors still shown)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def from_disk_or_hub(load, source: str):
    """``load(local_files_only=...)`` from a directory or the local Hugging Face cache first;
    from the hub only when that fails and the hub is reachable."""
    try:
        return load(local_files_only=True)
    except OSError:
        if Path(source).is_dir() or not hub_reachable():
            raise
    return load(local_files_only=False)


@torch.no_grad()
def match_statistics(target: nn.Module, pretrained: nn.Module, seed: int) -> None:
    """Fill every tensor of ``target`` with N(mean, std) of the same pretrained tensor."""
    generator = torch.Generator().manual_seed(seed)
    reference = dict(pretrained.named_parameters())
    for name, param in target.named_parameters():
        ref = reference[name].float()
        std = ref.std().item() if ref.numel() > 1 else 0.0
        noise = torch.randn(param.shape, generator=generator)
        param.copy_(noise * std + ref.mean().item())


def max_positions(arch) -> int:
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(arch, key, None):
            return int(getattr(arch, key))
    return 1 << 30  # rotary or relative positions: no fixed table
