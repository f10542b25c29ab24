"""Where a trial runs: GPUs per trial, ZeRO stage, trials per GPU, from its memory.

Small pure functions (``trial_memory``, ``plan_memory``, ``gpu_share``, ``gpu_hours``) do
the arithmetic on plain numbers; ``profile.TrialProfile`` reads those numbers off a
``TrialConfig`` (the model built on PyTorch's meta device: no weights, no data).

Memory of one training process on one GPU (bytes):

- weights: every parameter in the training precision (DeepSpeed casts the whole module to
  bf16/fp16), trained or frozen;
- gradients: one per trained parameter in the training precision, and for bf16/fp16 the fp32
  gradients DeepSpeed's mixed-precision optimisers accumulate beside them;
- optimiser: Adam's two fp32 moments per trained parameter, the fp32 master copy that the
  bf16/fp16 optimisers keep, and the fp32 temporary of Adam's step (``sqrt(v)``);
- activations: what the backward pass keeps, per block ~34 values per token and width unit
  (Korthikanti et al. 2022), only when a trained parameter lies below the output head;
- attention: with dropout on and no fused kernel (``gpu_fuses_attention``), the (B, H, T,
  T) scores, probabilities and keyed masks of the materialised attention path, per block
  kept for backward, plus the mask draw's temporaries (``attention_bytes``);
  SDPA's and the Triton kernel's fused attention hold none;
- on top: the one memory policy of every step kind (``device_bytes``): the caching
  allocator's slack (fragmentation) in proportion to what is allocated, and the CUDA
  context (never in ``torch.cuda.max_memory_allocated``).

ZeRO stage 1 shards the optimiser state over the data-parallel workers, stage 2 also the
gradients, stage 3 also the weights (keeping the two blocks being gathered whole).

Over 500 lines: both step kinds' memory models, the per-step tensors they share
(``activation_bytes``, ``attention_bytes``) and the plans made from them are one model of
a step's memory; apart, each part would call back into the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError, TrainConfig
from scale_fpt.gpus import DEFAULT_GPU, GPU, GPUS, MIB
from scale_fpt.scaling import BlockShape
from scale_fpt.vocabulary import StepKind

CUDA_CONTEXT_BYTES = 640 * MIB
"""CUDA context, cuBLAS/cuDNN handles and kernels of one process (~0.5 GB measured on
CUDA 12 with lazy loading; outside the caching allocator)."""
CUDA_WORKSPACE_BYTES = 64 * MIB
"""Workspaces torch's CUDA math libraries take from its caching allocator (so
``max_memory_allocated`` counts them): cuBLAS's is 32 MiB on Hopper, and a gpt2 bf16
fine-tuning step on an H100 held 56 MiB beyond every other term (2026-11-24)."""
ALLOCATOR_SLACK = 0.15
"""Fraction on top of the allocated bytes: fragmentation of the caching allocator. One
policy for both step kinds (``device_bytes``): the slack grows with what a process
allocates, where a fixed share of the device would leave most of a large GPU idle and
count no CUDA context."""
ZERO_BUCKET_ELEMENTS = 50_000_000
"""Elements of ZeRO's gradient buckets (``reduce_bucket_size``, ``allgather_bucket_size``),
set in every ZeRO engine's config (``steps.engine.zero_optimization``; DeepSpeed's default
is 5e8). DeepSpeed 0.19.8 allocates the reduce bucket whole at stages 1 and 2 (fp32 where
it accumulates gradients in fp32, as it does for bf16), two of them at stage 3
(``overlap_comm``'s double buffer)."""
MAX_TRIALS_PER_GPU = 4
"""Trials that share one GPU at most (beyond that they compete for its compute)."""


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read off a trial config."""

    total_params: int
    """Every parameter of the model (frozen ones too)."""
    trained_params: int
    """Parameters the optimiser updates."""
    n_layer: int
    d_model: int
    n_tokens: int
    """The task's sequence length."""
    block_params: int
    """Parameters of one backbone block (what ZeRO-3 gathers at a time)."""
    backbone_backward: bool
    """A trained parameter lies below the output head, so backward runs through the body."""
    train_flops_per_example: int = 0
    """Training FLOPs of one example (``profile.step_flops``), for time estimates."""
    block: BlockShape | None = None
    """The family's block (``families.block_shape``: gated MLP, RMSNorm) whose saved
    activations ``activation_bytes`` counts; None: a GPT-2 block of ``d_model``."""
    n_head: int = 0
    """Attention heads per block (0: no attention, e.g. the LSTM)."""
    dropout: float = 0.0
    """The trial's dropout rate: above 0, attention is materialised (``attention_bytes``)."""
    body_params: int = 0
    """Parameters of the frozen body a cohort holds once (attention, feed-forward)."""
    member_params: int = 0
    """Parameters each cohort member trains: input, output, ln, and the positions the task
    reads."""


@dataclass(frozen=True)
class TrialMemory:
    """Bytes one training process holds on its GPU."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    attention: int = 0
    """The materialised attention of a step with dropout (``attention_bytes``)."""
    workspace: int = CUDA_WORKSPACE_BYTES
    """The CUDA libraries' workspaces (``CUDA_WORKSPACE_BYTES``; a CPU step has none)."""

    @property
    def allocated(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` of a training step should show."""
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.attention
            + self.workspace
        )

    @property
    def device(self) -> int:
        """What the process needs of the device (``device_bytes``)."""
        return device_bytes(self.allocated)


def device_bytes(allocated: int, gpu: bool = True) -> int:
    """What a process whose tensors take ``allocated`` bytes needs of its device, whichever
    step it runs: the allocator's slack on top and, on a GPU, the CUDA context."""
    return math.ceil(allocated * (1 + ALLOCATOR_SLACK)) + (CUDA_CONTEXT_BYTES if gpu else 0)


def members_that_fit(body: int, member: int, capacity: int, gpu: bool = True) -> int:
    """How many cohort members (``member`` bytes each: trained state, activations) fit beside
    one frozen ``body`` on a device of ``capacity`` bytes (``device_bytes``). 0 when not
    even one fits."""
    free = (capacity - (CUDA_CONTEXT_BYTES if gpu else 0)) / (1 + ALLOCATOR_SLACK) - body
    return max(0, int(free // max(1, member)))


def precision_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def gpu_fuses_attention() -> bool:
    """Whether a GPU trial's keyed-dropout attention runs fused (``models.ops.FLASH``: Triton
    is installed, as with every CUDA build of torch, and ``SCALE_FPT_FLASH`` is not 0), so
    the planner counts no (B, H, T, T) tensors."""
    from scale_fpt.models import ops  # torch and the kernels: not for a plan on a laptop

    return ops.FLASH


def trial_memory(
    shape: ModelShape,
    precision: str,
    batch_size: int,
    zero_stage: int = 0,
    workers: int = 1,
    fused_attention: bool | None = None,
) -> TrialMemory:
    """Memory of one of ``workers`` data-parallel processes (each with ``batch_size /
    workers`` examples) at ``zero_stage`` on a GPU; ``fused_attention`` None: whether GPUs
    run the fused attention kernel here (``gpu_fuses_attention``)."""
    if fused_attention is None:
        fused_attention = gpu_fuses_attention()
    width = precision_bytes(precision)
    mixed = precision != "fp32"
    trained = shape.trained_params
    weights = shape.total_params * width
    if zero_stage >= 3:
        weights = math.ceil(weights / workers) + 2 * shape.block_params * width
    # 16-bit gradients of the module, plus the fp32 gradients mixed precision accumulates.
    fp32_grads = trained * 4 if mixed else 0
    module_grads = trained * width if mixed else trained * 4
    if zero_stage >= 2:
        module_grads = math.ceil(module_grads / workers)
    if zero_stage >= 1:
        module_grads += ZERO_BUCKET_ELEMENTS * 4 * (2 if zero_stage >= 3 else 1)
    # Adam's moments, the fp32 master copy (mixed precision) and the step's temporary:
    # torch's foreach Adam materialises sqrt(v), one fp32 tensor of the trained parameters.
    optimizer = trained * (8 + (4 if mixed else 0) + 4)
    if zero_stage >= 1:
        optimizer = math.ceil(optimizer / workers)
        fp32_grads = math.ceil(fp32_grads / workers)
    micro_batch = math.ceil(batch_size / workers)
    activations, attention = step_tensors(
        shape, precision, micro_batch, shape.backbone_backward, fused_attention
    )
    return TrialMemory(weights, module_grads + fp32_grads, optimizer, activations, attention)


def activation_bytes(
    n_layer: int,
    d_model: int,
    n_tokens: int,
    batch: int,
    precision: str,
    block: BlockShape | None = None,
) -> int:
    """Activations kept for backward: ``block.activation_units`` per token and block
    (default: a GPT-2 block of width ``d_model``, 34 d), in the training precision."""
    width = 4 if precision == "fp32" else 2
    units = (block or BlockShape(d_model, 4 * d_model)).activation_units
    return n_layer * batch * n_tokens * units * width // 2


ATTENTION_KEPT_WITH_DROPOUT = 3
"""(B, H, T, T) tensors one block keeps for backward when its attention probabilities take
keyed dropout (``models.ops.causal_attention``'s materialised path): exp(scores), the
dropout mask and the dropped probabilities (the softmax division saves its inputs, the
product with the values saves the dropped probabilities)."""
ATTENTION_WORKING = 4
"""(B, H, T, T) tensors beyond those kept, live at once in the block being computed: the
scores, exp(scores) and probabilities when its mask is drawn in the forward pass; the
gradients of the dropped probabilities, the probabilities and exp(scores) in backward."""


def attention_bytes(
    n_layer: int,
    n_head: int,
    n_tokens: int,
    batch: int,
    precision: str,
    dropout: float,
    backward: bool = True,
    fused: bool = False,
) -> int:
    """Peak bytes of materialised attention in a training step. With ``fused`` (the
    Triton kernel ``models.flash_attention``, which a GPU with Triton runs for keyed
    dropout: O(T) per query row, as SDPA) only its bit-packed dropout mask, T ceil(T / 8)
    bytes per (row, head), kept by every block for the backward. Otherwise (a CPU, or a GPU without Triton or
    with ``SCALE_FPT_FLASH=0``) keyed dropout on the attention probabilities materialises
    them (torch's fused SDPA kernels draw their own masks). The peak is the larger of: the forward pass at the last block (the
    blocks below keep ``ATTENTION_KEPT_WITH_DROPOUT`` (B, H, T, T) tensors each, the last
    holds ``ATTENTION_WORKING`` while its mask is drawn in blocks of at most
    ``keyed_random.DRAW_BLOCK`` elements with ``DRAW_BYTES_PER_ELEMENT`` each) and the start
    of the backward pass (every block's kept tensors and the working gradients). With
    ``backward`` False (nothing trained below the output head) nothing is kept. Without
    dropout SDPA's fused kernels keep O(T) per query row: 0 here."""
    from scale_fpt.keyed_random import DRAW_BLOCK, DRAW_BYTES_PER_ELEMENT  # imports torch

    if dropout == 0.0 or not n_head:
        return 0
    if fused:
        mask = batch * n_head * n_tokens * math.ceil(n_tokens / 8)
        return mask * (n_layer if backward else 1)
    width = 4 if precision == "fp32" else 2
    elements = batch * n_head * n_tokens * n_tokens  # one (B, H, T, T) tensor
    kept = ATTENTION_KEPT_WITH_DROPOUT * (n_layer if backward else 0)
    forward = (max(0, kept - ATTENTION_KEPT_WITH_DROPOUT) + ATTENTION_WORKING) * elements * width
    forward += min(elements, DRAW_BLOCK) * DRAW_BYTES_PER_ELEMENT
    backward_start = (kept + ATTENTION_WORKING) * elements * width if backward else 0
    return max(forward, backward_start)


def step_tensors(
    shape: ModelShape, precision: str, batch: int, backward: bool, fused_attention: bool
) -> tuple[int, int]:
    """(Activations, attention) a training step of ``batch`` examples keeps, in bytes: every
    block's when ``backward`` runs through the body (else one block live), and the
    materialised attention unless it runs ``fused_attention`` (``attention_bytes``)."""
    layers = shape.n_layer if backward else 1
    activations = activation_bytes(
        layers, shape.d_model, shape.n_tokens, batch, precision, shape.block
    )
    attention = attention_bytes(
        shape.n_layer,
        shape.n_head,
        shape.n_tokens,
        batch,
        precision,
        shape.dropout,
        backward,
        fused_attention,
    )
    return activations, attention


def cohort_memory(
    shape: ModelShape, precision: str, batch_size: int, members: int, fused_attention: bool
) -> TrialMemory:
    """The memory of a cohort of ``members`` trials of ``shape``, as allocated: the frozen
    body once, in the training precision (``weights``); per member its trained tensors (fp32
    weights, gradients and two Adam moments), its activations and, unless the device runs
    ``fused_attention`` (a GPU with the Triton kernel), its materialised attention
    (``attention_bytes``; each member counts a whole mask draw's temporaries, an
    upper bound: a cohort draws its members' masks together)."""
    trained = shape.member_params
    activations, attention = step_tensors(shape, precision, batch_size, True, fused_attention)
    return TrialMemory(
        weights=shape.body_params * precision_bytes(precision) + members * trained * 4,
        gradients=members * trained * 4,
        optimizer=members * trained * 8,
        activations=members * activations,
        attention=members * attention,
        workspace=0,
    )


def cohort_memory_parts(
    shape: ModelShape, precision: str, batch_size: int, fused_attention: bool
) -> tuple[int, int]:
    """(Allocated bytes of the frozen body, allocated bytes per member) of a cohort of
    trials of ``shape`` (``cohort_memory``)."""
    body = cohort_memory(shape, precision, batch_size, 0, fused_attention).allocated
    one = cohort_memory(shape, precision, batch_size, 1, fused_attention).allocated
    return body, one - body


def cohort_size(
    shape: ModelShape,
    precision: str,
    batch_size: int,
    n_members: int,
    slots: int,
    slot_bytes: int,
    gpu: bool,
    fused_attention: bool,
) -> int:
    """``--pack auto``'s cohort size for ``n_members`` compatible trials of ``shape``:
    spread over the ``slots`` (each of ``slot_bytes``, a GPU's or a CPU slot's) that run
    cohorts side by side, as many per cohort as fit beside one frozen body
    (``members_that_fit``; ``auto_cohort_size``)."""
    parts = cohort_memory_parts(shape, precision, batch_size, fused_attention)
    return auto_cohort_size(n_members, slots, members_that_fit(*parts, slot_bytes, gpu=gpu))


def auto_cohort_size(n_members: int, slots: int, fits: int) -> int:
    """``--pack auto``'s K for a group of ``n_members`` compatible trials: spread over the
    ``slots`` that run cohorts side by side (GPUs; CPU cores / CPUs per trial: one cohort
    per core, the fastest placement measured on a CPU, benchmarks/packing.py), at most
    ``fits`` per cohort (``members_that_fit``), and at least 1."""
    return max(1, min(fits, math.ceil(n_members / max(1, slots))))


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class TrialPlan:
    """Where one trial runs and what it asks Ray for."""

    gpus: int
    """Whole GPUs of the trial: 0 on CPUs, 1 for a trial on one GPU or a share of one, N for
    a data-parallel trial over N GPUs."""
    gpu_share: float
    """Ray's ``GPU`` request of a one-GPU trial (1/trials_per_gpu); N for N GPUs; 0 on CPU."""
    trials_per_gpu: int
    """Trials that share one GPU (1 for a trial of one or more whole GPUs)."""
    zero_stage: int
    """DeepSpeed ZeRO stage the trial runs at."""
    workers: int
    """Data-parallel training processes (``TrainConfig.workers``): one per GPU."""
    memory: TrialMemory | None
    """Per process, at this plan (None on CPU)."""
    gpu: GPU | None
    """The GPU planned for (None on CPU)."""
    fits: bool = True
    """False: not even ``max_gpus`` GPUs at ZeRO-3 hold the trial."""

    def bundles(self, cpus: int, workers: int = 1) -> list[dict]:
        """Ray placement-group bundles of this plan, ``cpus`` CPUs each: one bundle on CPU
        or on (a share of) one GPU; one bundle per GPU for a data-parallel trial (packed on
        one node, the multi-GPU node type; the trial's process runs in the first); one CPU
        bundle per worker for a trial of ``workers`` processes on CPUs."""
        if not self.gpus:
            return [{"CPU": cpus} for _ in range(workers)]
        if self.gpus == 1:
            return [{"CPU": cpus, "GPU": self.gpu_share}]
        return [{"CPU": cpus, "GPU": 1} for _ in range(self.gpus)]

    def describe(self) -> str:
        if not self.gpus:
            return "CPU"
        where = f"{self.gpus} x {self.gpu.name}" if self.gpus > 1 else self.gpu.name
        need = f"{self.memory.device / 2**30:.1f} GiB per GPU" if self.memory else "as declared"
        share = f", {self.trials_per_gpu} trials per GPU" if self.trials_per_gpu > 1 else ""
        fits = "" if self.fits else " (DOES NOT FIT)"
        return f"{where}, ZeRO {self.zero_stage}{share}; {need}{fits}"


CPU_PLAN = TrialPlan(0, 0.0, 1, 0, 1, None, None)


def plan_problem(plan: TrialPlan, offer: GPUOffer) -> str | None:
    """Why the trial of ``plan`` can never run on ``offer`` (None: it can, or the widest node
    is unknown): it fits no GPU, or no node holds it. A trial's GPUs are one placement group
    packed on one node (STRICT_PACK), which Ray would wait for forever."""
    if not plan.fits:
        return (
            f"does not fit: {plan.describe()}; use a larger --gpu, a smaller batch or fewer "
            "trained groups"
        )
    if not plan.gpus:
        return None
    if offer.gpu is None or offer.source == "none":
        return (
            f"asks for {plan.gpu_share:g} GPU(s), but the cluster has and can launch no GPU; "
            "use --gpus-per-trial 0 or auto, or a cluster with GPU nodes"
        )
    widest = offer.max_gpus_per_node
    if widest and plan.gpus > widest:
        return (
            f"asks for {plan.gpus} GPUs on one node, but the widest node has {widest} "
            f"({offer.source}); use --gpus-per-trial {widest} or less, fewer workers, or "
            "larger nodes"
        )
    return None


def trials_per_gpu(device_bytes: int, gpu_bytes: int, limit: int = MAX_TRIALS_PER_GPU) -> int:
    """How many processes of ``device_bytes`` share a GPU: a power of two (so Ray's
    fractions 1/2, 1/4 pack a device exactly), at most ``limit``, at least 1."""
    n = 1
    while n * 2 <= limit and n * 2 * device_bytes <= gpu_bytes:
        n *= 2
    return n


def plan_memory(
    shape: ModelShape,
    precision: str,
    batch_size: int,
    gpu: GPU,
    gpus: int = 0,
    zero_stage: int = 0,
    max_gpus: int = 8,
    fused_attention: bool = False,
) -> TrialPlan:
    """The plan of a trial of ``shape`` on ``gpu`` (its attention counted unless the GPU
    runs it ``fused_attention``).

    ``gpus`` 0 (auto): one process if it fits one GPU (sharing that GPU with as many trials
    as fit, up to ``MAX_TRIALS_PER_GPU``), else the fewest data-parallel workers (2, 4, 8,
    ... up to ``max_gpus``) at the lowest ZeRO stage (2, then 3) that fit. ``gpus`` N:
    exactly N GPUs. A ``zero_stage`` above 0 (the config asks for one) is kept."""
    capacity = gpu.memory_bytes
    if gpus <= 1:
        memory = trial_memory(shape, precision, batch_size, zero_stage, 1, fused_attention)
        single = one_gpu_plan(memory, gpu, shared=gpus == 0, zero_stage=zero_stage)
        if single.fits or gpus == 1 or max_gpus < 2:
            return single
    counts = [gpus] if gpus else [n for n in (2, 4, 8, 16) if n <= max_gpus]
    stages = [zero_stage] if zero_stage else [2, 3]
    for n in counts:
        for stage in stages:
            memory = trial_memory(shape, precision, batch_size, stage, n, fused_attention)
            plan = TrialPlan(n, float(n), 1, stage, n, memory, gpu, memory.device <= capacity)
            if plan.fits:
                return plan
    return plan


def one_gpu_plan(
    memory: TrialMemory, gpu: GPU, shared: bool = True, zero_stage: int = 0
) -> TrialPlan:
    """One process of ``memory`` on one ``gpu``: sharing it with as many as fit (a power of
    two up to ``MAX_TRIALS_PER_GPU``) when ``shared``, else the whole GPU."""
    share = trials_per_gpu(memory.device, gpu.memory_bytes) if shared else 1
    fits = memory.device <= gpu.memory_bytes
    return TrialPlan(1, 1 / share, share, zero_stage, 1, memory, gpu, fits)


def gpu_share(fraction: float, gpu: GPU | None) -> TrialPlan:
    """The plan of a trial declared to take ``fraction`` (0 < f < 1) of one GPU."""
    share = max(1, round(1 / fraction))
    return TrialPlan(1, fraction, share, 0, 1, None, gpu)


class GPURequest(NamedTuple):
    """A sweep's ``--gpus-per-trial``, parsed (``parse_gpus_per_trial``)."""

    kind: str
    """``auto`` (the planner decides), ``cpu``, ``gpus`` (whole GPUs) or ``share`` (of one)."""
    value: float
    """The number of GPUs (``gpus``) or the share of one (``share``); 0 otherwise."""


def parse_gpus_per_trial(text: str) -> GPURequest:
    """``auto`` -> ("auto", 0); ``0`` -> ("cpu", 0); ``N`` -> ("gpus", N); ``0.25`` ->
    ("share", 0.25). ConfigError for anything else."""
    text = str(text).strip()
    if text == "auto":
        return GPURequest("auto", 0.0)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value == 0:
        return GPURequest("cpu", 0.0)
    if 0 < value < 1:
        return GPURequest("share", value)
    if value >= 1 and value.is_integer():
        return GPURequest("gpus", value)
    raise ConfigError(
        [
            f"--gpus-per-trial: {text!r} is not auto, 0 (CPU only), a whole number of GPUs "
            "or a fraction of one GPU (0 < f < 1)"
        ]
    )


def step_plan(
    kind: StepKind,
    shape: ModelShape,
    train: TrainConfig,
    request: GPURequest,
    gpu: GPU | None,
    max_gpus: int,
    members: int,
    fused_attention: bool,
) -> TrialPlan:
    """The plan of a trial of step ``kind`` (with ``members`` - 1 others of its kind in one
    cohort) under a sweep's GPU ``request`` on ``gpu`` (None: no GPU anywhere, so ``auto``
    plans CPU), each step by its own memory model: a cohort (one packable trial alone
    included) on one GPU or a share of it (``cohort_memory``), an engine by
    ``plan_memory``; attention counted unless the GPU runs it ``fused_attention``. A
    packable trial that fits no GPU alone is planned as an engine over several (the sweep's
    plan then runs it so: ``sweep.plan.planned_arms``)."""
    how, value = request
    if how == "cpu" or (how == "auto" and gpu is None):
        return CPU_PLAN
    gpu = gpu or GPUS[DEFAULT_GPU]
    if how == "share":
        return gpu_share(value, gpu)
    if kind == StepKind.COHORT and (how == "auto" or value == 1):
        memory = cohort_memory(shape, train.precision, train.batch_size, members, fused_attention)
        plan = one_gpu_plan(memory, gpu, shared=how == "auto")
        if plan.fits or members > 1:
            return plan
    if how == "auto" and train.workers > 1:  # the config asks for N workers
        how, value = "gpus", float(train.workers)
    return plan_memory(
        shape,
        train.precision,
        train.batch_size,
        gpu,
        gpus=int(value),
        zero_stage=train.zero_stage,
        max_gpus=max_gpus,
        fused_attention=fused_attention,
    )


# --------------------------------------------------------------------------- GPU-hours

ASSUMED_MFU = 0.4
"""Fraction of the bf16 peak a compute-bound step reaches (an assumption, not measured)."""
STEP_LATENCY_PER_LAYER_S = 0.0036
"""Floor of a step's time per backbone block: small GPT-2 steps are bound by kernel launches
and DeepSpeed's bookkeeping, not FLOPs (gpt2, bit-xor, bf16 on one H100: 22.8 steps/s =
44 ms for 12 blocks, issue 10)."""


def step_seconds(shape: ModelShape, batch_size: int, plan: TrialPlan) -> float:
    """Estimated seconds of one training step under ``plan`` (workers split the batch);
    NaN on a GPU without a published peak (one named only by its memory): unknown, not 0."""
    if not plan.gpu.bf16_flops:
        return math.nan
    flops = shape.train_flops_per_example * math.ceil(batch_size / plan.workers)
    compute = flops / (plan.gpu.bf16_flops * ASSUMED_MFU)
    return max(compute, shape.n_layer * STEP_LATENCY_PER_LAYER_S)


def gpu_hours(plan: TrialPlan, steps: int, seconds_per_step: float) -> float:
    """GPU-hours a trial holds: its share of GPUs (``gpu_share``) for its steps."""
    return plan.gpu_share * steps * seconds_per_step / 3600
