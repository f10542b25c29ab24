"""Trial packing: which trials may share one cohort (``steps.cohort.CohortStep``: K trials
over one shared frozen backbone in one process), how to group a grid into cohorts, what a
cohort needs in memory, and which step kind a trial takes (``step_kind``).

A frozen body of the gpt2, gpt-neox or llama family (FPT: ``input+output+ln+pos`` trained,
attention and feed-forward frozen) is the same for every trial of a grid that differs only in learning rate, seed (pretrained
weights), the trained subset of input/output/ln/pos, clipping, threshold or patience.
Running those trials one per process repeats the frozen weights K times in memory and runs
K small matrix products where one K-times-taller product would do.

Which step a trial takes:

- ``cohort`` (``CohortStep``, plain torch): every packable trial (``pack_problem`` is None),
  packed with others or alone (K = 1: 2-3x faster than a DeepSpeed engine on a GPU, with
  no per-step host sync);
- ``engine`` (``EngineStep``, one DeepSpeed engine): trials that train the body
  (``ff``/``attn``/``full``), ZeRO (``zero_stage`` > 0), fp16 loss scaling, the LSTM and
  backbones outside the packed families (OPT, unknown architectures), the ablation arms.

The packed path is plain torch, not a DeepSpeed engine: the trained tensors are a few MB,
so ZeRO has nothing to shard, and DeepSpeed's clipping is global over the engine's
parameters, which would couple the members; per-member clipping, learning rates and
divergence need an optimiser that knows the member axis (``steps.adam.PackedAdam``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scale_fpt.config import ABLATIONS, ConfigError, TrialConfig, parse_finetune
from scale_fpt.models.backbones import load_architecture
from scale_fpt.models.families import family_of

PACKED_FAMILIES = ("gpt2", "gpt-neox", "llama")
"""Families with a packed model (``models.packed``, ``models.packed_families``); OPT's dropout
is not keyed, so its trials run alone."""

PACKABLE_GROUPS = ("input", "output", "ln", "pos")
"""Groups a packed member may train; ``ff`` and ``attn`` belong to the shared frozen body."""
MEMBER_FIELDS = ("lr", "seed", "finetune", "grad_clip", "accuracy_threshold", "patience")
"""Config fields that may differ inside a cohort (``seed`` only when the backbone does not
depend on it, i.e. ``init=pretrained``). Every other field (task and its data, model, init,
weights, dropout, precision, batch size, steps, evaluation schedule, device) is shared."""
PACKED_PRECISIONS = ("fp32", "bf16")
STEP_KINDS = ("cohort", "engine")


# --------------------------------------------------------------------------- grouping


def pack_problem(flat: dict) -> str | None:
    """Why the trial ``flat`` cannot be packed (None: it can)."""
    try:
        config = TrialConfig.from_flat(flat)
    except ConfigError as e:
        return "; ".join(e.problems)
    if config.model.model == "lstm":
        return "the lstm baseline has no transformer body to share"
    if config.model.init in ABLATIONS:
        return f"--init {config.model.init}: an ablation arm has no frozen body to share"
    if config.train.workers > 1:
        return f"--workers {config.train.workers}: a trial over several processes runs alone"
    if config.train.zero_offload or config.train.activation_checkpointing:
        return "--zero-offload/--activation-checkpointing: DeepSpeed engine features, not packed"
    extra = set(parse_finetune(config.train.finetune)) - set(PACKABLE_GROUPS)
    if extra:
        return f"--finetune trains {'+'.join(sorted(extra))}: the body is not frozen"
    if config.train.zero_stage > 0:
        return f"--zero-stage {config.train.zero_stage}: ZeRO shards a DeepSpeed engine's state"
    if config.train.precision not in PACKED_PRECISIONS:
        return f"--precision {config.train.precision}: packing supports fp32 and bf16"
    try:
        arch = load_architecture(config.model)
    except ConfigError as e:
        return "; ".join(e.problems)
    family = family_of(arch)
    if family is None or family.name not in PACKED_FAMILIES:
        return (
            f"--model {config.model.model}: packing supports the gpt2, gpt-neox and llama "
            f"families (this is {family.name if family else arch.model_type})"
        )
    return None


def step_kind(config: TrialConfig) -> str:
    """``cohort`` for a packable trial, ``engine`` for one that needs DeepSpeed."""
    return "engine" if pack_problem(config.to_flat()) else "cohort"


def cohort_problems(configs: list[TrialConfig]) -> list[str]:
    """Why ``configs`` cannot train as one cohort (empty: they can)."""
    problems = [p for c in configs if (p := pack_problem(c.to_flat()))]
    if len({cohort_key(c) for c in configs}) > 1:
        problems.append(
            "cohort members differ in fields they must share (only "
            f"{', '.join(MEMBER_FIELDS)} may differ; seed only with --init pretrained)"
        )
    return list(dict.fromkeys(problems))


def cohort_key(config: TrialConfig) -> tuple:
    """Members with equal keys can share one frozen backbone and one step loop."""
    varying = set(MEMBER_FIELDS)
    if config.model.init != "pretrained":  # random/stats backbones are drawn from the seed
        varying.discard("seed")
    return tuple(sorted((k, v) for k, v in config.to_flat().items() if k not in varying))


def cohorts(arms: list[dict], k: int | Callable[[list[dict]], int]) -> list[list[dict]]:
    """Group flat trial configs into cohorts of at most ``k`` compatible members (``k`` may
    be a function of each compatible group: ``--pack auto`` sizes cohorts per group).

    Compatible: the same task config, model, init, weights, dropout, precision, batch size,
    max/eval steps, evaluation batch size and device, a frozen body (finetune within
    input/output/ln/pos), and the same backbone weights (any seeds when pretrained, the same
    seed for random or stats inits). Members may differ in lr, seed, finetune subset,
    grad_clip and accuracy_threshold. A group larger than ``k`` is split into
    ceil(n / k) cohorts of near-equal size. Arms that cannot be packed come back alone
    (``[[arm]]``), in order. Every arm appears in exactly one cohort.
    """
    if not callable(k) and k < 1:
        raise ValueError(f"cohort size must be >= 1, got {k}")
    size = k if callable(k) else lambda group: k
    order: list[tuple] = []  # ("one", arm) or ("group", key), in order of first appearance
    groups: dict[tuple, list[dict]] = {}
    for arm in arms:
        if k == 1 or pack_problem(arm):
            order.append(("one", arm))
            continue
        key = cohort_key(TrialConfig.from_flat(arm))
        if key not in groups:
            groups[key] = []
            order.append(("group", key))
        groups[key].append(arm)
    out: list[list[dict]] = []
    for kind, item in order:
        if kind == "one":
            out.append([item])
            continue
        members = groups[item]
        group_k = size(members)
        if group_k < 1:
            raise ValueError(f"cohort size must be >= 1, got {group_k}")
        n_cohorts = math.ceil(len(members) / group_k)
        out.extend(
            members[i * len(members) // n_cohorts : (i + 1) * len(members) // n_cohorts]
            for i in range(n_cohorts)
        )
    return out


def cohort_memory_bytes(members: list[dict]) -> int:
    """Memory a cohort needs on its device (to size a Ray resource request): the frozen body
    once, plus each member's share (``cohort_memory_parts``)."""
    body, per_member = cohort_memory_parts(members[0])
    return body + len(members) * per_member


def cohort_memory_parts(member: dict, fused_attention: bool = False) -> tuple[int, int]:
    """(bytes of the frozen body, bytes per member) of a cohort of ``member``'s kind: the
    body once, in the training precision; per member its trained tensors (fp32 weights,
    gradients and two Adam moments; ``wpe`` only for the task's positions), its
    activations and, unless the device runs ``fused_attention`` (a GPU with the Triton
    kernel), its materialised attention (``scaling.attention_bytes``; each member counts a
    whole mask draw's temporaries, an upper bound: a cohort draws its members' masks
    together)."""
    from scale_fpt import scaling
    from scale_fpt.models.families import block_shape
    from scale_fpt.tasks import task_spec
    from scale_fpt.trial import counting_model

    first = TrialConfig.from_flat(member)
    spec = task_spec(first.task)
    built = counting_model(first, spec)
    counts = built.counts
    weight_bytes = 4 if first.train.precision == "fp32" else 2
    frozen = ("attn", "ff", "backbone")
    body = sum(counts[g]["total"] for g in frozen if g in counts) * weight_bytes
    # Every tensor a member may train (fp32 weights, gradients, two Adam moments): wpe only
    # for the task's positions.
    trainable = ("input", "output", "ln")
    trained = sum(counts[g]["total"] for g in trainable if g in counts)
    if "pos" in counts:
        trained += spec.n_tokens * built.d_model
    arch = load_architecture(first.model)
    activations = scaling.activation_bytes(
        built.n_layer,
        built.d_model,
        spec.n_tokens,
        first.train.batch_size,
        first.train.precision,
        block_shape(arch),
    )
    attention = scaling.attention_bytes(
        built.n_layer,
        getattr(arch, "num_attention_heads", 0),
        spec.n_tokens,
        first.train.batch_size,
        first.train.precision,
        first.model.dropout,
        fused=fused_attention,
    )
    return body, trained * 16 + activations + attention
