"""What a trial is before it runs, computed once per configuration: its task's shape, the
model's parameter counts per group, trained groups and FLOPs per step (the model built on
PyTorch's meta device: no weights read, nothing allocated), the step it takes and why
(``pack_problem``), and the memory of that step under the planner's one memory policy
(``planner.device_bytes``).

``profile_of(flat)`` parses a flat config once (``config.parse_trial``) and keeps the
profile, so the driver's readers (packing, placement, Ray resources, GPU-hour estimates,
``scale-fpt plan``) and the rows a trial writes share one parse, and every trial of one
shape (any seed, learning rate or init) one meta build. Each part is computed on first
read: packing needs no model, placement no FLOPs.

Which step a trial takes:

- ``cohort`` (``steps.cohort.CohortStep``, plain torch): every packable trial
  (``pack_problem`` is None), packed with others or alone (K = 1: 2-3x faster than a
  DeepSpeed engine on a GPU, with no per-step host sync);
- ``engine`` (``steps.engine.EngineStep``, one DeepSpeed engine): trials that train the
  body (``ff``/``attn``/``full``), ZeRO (``zero_stage`` > 0), fp16 loss scaling, the LSTM
  and backbones outside the packed families (OPT, unknown architectures), the ablation
  arms.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from scale_fpt import planner, scaling
from scale_fpt.config import (
    ABLATIONS,
    ConfigError,
    ModelConfig,
    TaskConfig,
    TrainConfig,
    TrialConfig,
    parse_finetune,
    parse_trial,
    shape_init,
)
from scale_fpt.gpus import GPU
from scale_fpt.models import BuiltModel, LSTMBackbone, build_model
from scale_fpt.models.backbones import load_architecture
from scale_fpt.models.families import PACKED_FAMILIES, block_shape, family_of
from scale_fpt.tasks import task_spec
from scale_fpt.tasks.base import TaskSpec
from scale_fpt.vocabulary import StepKind

PACKABLE_GROUPS = ("input", "output", "ln", "pos")
"""Groups a packed member may train; ``ff`` and ``attn`` belong to the shared frozen body."""
PACKED_PRECISIONS = ("fp32", "bf16")
FROZEN_BODY = ("attn", "ff", "backbone")
"""Groups a cohort holds once, in the training precision."""


def counting_model(task: TaskConfig, model: ModelConfig, finetune: str) -> BuiltModel:
    """The model of a trial of this shape, built on the meta device (no memory, no weights
    read): its parameter counts, trained groups and FLOPs, the same whichever step trains
    it, and the same for every seed, learning rate and init (built once per shape)."""
    return meta_model(task, replace(model, init=shape_init(model.init), weights=""), finetune)


@functools.lru_cache(maxsize=256)
def meta_model(task: TaskConfig, model: ModelConfig, finetune: str) -> BuiltModel:
    with torch.device("meta"):
        return build_model(
            TrialConfig(task, model, TrainConfig(finetune=finetune)), task_spec(task)
        )


def step_flops(built: BuiltModel, spec: TaskSpec, batch_size: int) -> tuple[int, int]:
    """(training FLOPs, evaluation FLOPs) of one step of ``batch_size`` sequences."""
    module = built.module
    embedding_weights = {
        id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)
    }
    matmul = trained = 0
    for p in module.parameters():
        if p.dim() == 2 and id(p) not in embedding_weights:
            matmul += p.numel()
            trained += p.numel() if p.requires_grad else 0
    is_transformer = not isinstance(module.backbone, LSTMBackbone)
    attention = (
        scaling.attention_flops_per_sequence(built.n_layer, built.d_model, spec.n_tokens)
        if is_transformer
        else 0
    )
    backbone_backward = any(g != "output" for g in built.trained_groups)
    return (
        scaling.train_step_flops(
            matmul, trained, attention, spec.n_tokens, batch_size, backbone_backward
        ),
        scaling.eval_step_flops(matmul, attention, spec.n_tokens, batch_size),
    )


def config_pack_problem(config: TrialConfig) -> str | None:
    """Why the trial ``config`` cannot be packed (None: it can)."""
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
    if family is None or not family.packed:
        return (
            f"--model {config.model.model}: packing supports the {', '.join(PACKED_FAMILIES)} "
            f"families (this is {family.name if family else arch.model_type})"
        )
    return None


@dataclass(frozen=True)
class TrialProfile:
    """A trial's static profile (see the module docstring): what placement, packing, Ray's
    resources, ``scale-fpt plan`` and the trial's rows read, computed once."""

    config: TrialConfig

    @functools.cached_property
    def spec(self) -> TaskSpec:
        """The task's shapes (no data loaded)."""
        return task_spec(self.config.task)

    @functools.cached_property
    def pack_problem(self) -> str | None:
        """Why the trial cannot share a cohort (None: it can)."""
        return config_pack_problem(self.config)

    @property
    def kind(self) -> StepKind:
        """The step the trial takes alone: ``cohort`` when packable, else ``engine``."""
        return StepKind.ENGINE if self.pack_problem else StepKind.COHORT

    @functools.cached_property
    def built(self) -> BuiltModel:
        """The model on the meta device (``counting_model``)."""
        c = self.config
        return counting_model(c.task, c.model, c.train.finetune)

    @functools.cached_property
    def flops(self) -> tuple[int, int]:
        """(training, evaluation) FLOPs of one step of the trial's batch size."""
        return step_flops(self.built, self.spec, self.config.train.batch_size)

    @functools.cached_property
    def shape(self) -> planner.ModelShape:
        """What the memory of an engine step depends on."""
        built, arch = self.built, getattr(self.built.module.backbone, "config", None)
        family = family_of(arch)
        blocks = family.blocks(built.module.backbone) if family is not None else None
        block = sum(p.numel() for p in blocks[0].parameters()) if blocks is not None else 0
        counts = built.counts
        trained = sum(counts[g]["total"] for g in ("input", "output", "ln") if g in counts)
        if "pos" in counts:  # only the rows of the task's positions train
            trained += self.spec.n_tokens * built.d_model
        return planner.ModelShape(
            total_params=built.total_params,
            trained_params=built.trainable_params,
            n_layer=built.n_layer,
            d_model=built.d_model,
            n_tokens=self.spec.n_tokens,
            block_params=block,
            backbone_backward=any(g != "output" for g in built.trained_groups),
            train_flops_per_example=step_flops(built, self.spec, 1)[0],
            block=block_shape(arch) if family is not None else None,
            n_head=getattr(arch, "num_attention_heads", 0),
            dropout=self.config.model.dropout,
            body_params=sum(counts[g]["total"] for g in FROZEN_BODY if g in counts),
            member_params=trained,
        )

    def cohort_memory(self, members: int, fused_attention: bool = False) -> planner.TrialMemory:
        """The memory of a cohort of ``members`` trials of this kind, as allocated
        (``planner.cohort_memory``)."""
        train = self.config.train
        return planner.cohort_memory(
            self.shape, train.precision, train.batch_size, members, fused_attention
        )

    def cohort_memory_parts(self, fused_attention: bool = False) -> tuple[int, int]:
        """(Bytes of the frozen body, bytes per member) of a cohort of this kind
        (``cohort_memory``)."""
        train = self.config.train
        return planner.cohort_memory_parts(
            self.shape, train.precision, train.batch_size, fused_attention
        )

    def cohort_bytes(self, members: int, fused_attention: bool = False) -> int:
        """Allocated bytes of a cohort of ``members`` trials of this kind."""
        return self.cohort_memory(members, fused_attention).allocated


@functools.lru_cache(maxsize=4096)
def config_profile(config: TrialConfig) -> TrialProfile:
    """The profile of a parsed config (cached: every reader shares one)."""
    return TrialProfile(config)


def profile_of(flat: dict) -> TrialProfile:
    """The profile of a flat trial config (ConfigError for one that does not validate)."""
    return config_profile(parse_trial(flat))


def pack_problem(flat: dict) -> str | None:
    """Why the trial ``flat`` cannot be packed (None: it can; a config that does not
    validate names its problems)."""
    try:
        return profile_of(flat).pack_problem
    except ConfigError as e:
        return "; ".join(e.problems)


def plan_trial(
    config: TrialConfig, gpus_per_trial: str, gpu: GPU | None, max_gpus: int = 8
) -> planner.TrialPlan:
    """``planner.step_plan`` of one trial config alone, its attention as a GPU of this
    machine's software runs it (``planner.gpu_fuses_attention``)."""
    request = planner.parse_gpus_per_trial(gpus_per_trial)
    fused = planner.gpu_fuses_attention()
    profile = config_profile(config)
    return planner.step_plan(
        profile.kind, profile.shape, config.train, request, gpu, max_gpus, 1, fused
    )


def model_shape(config: TrialConfig) -> planner.ModelShape:
    """The numbers memory depends on, for any model and fine-tuning subset."""
    return config_profile(config).shape


def step_kind(config: TrialConfig) -> StepKind:
    """``cohort`` for a packable trial, ``engine`` for one that needs DeepSpeed."""
    return config_profile(config).kind
