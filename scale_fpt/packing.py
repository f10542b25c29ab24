"""Trial packing: K compatible trials trained in one process over one shared frozen backbone.

A frozen GPT-2 (FPT: ``input+output+ln+pos`` trained, attention and feed-forward frozen) is
the same for every trial of a grid that differs only in learning rate, seed (pretrained
weights) or the trained subset of input/output/ln/pos. Running those trials one per process
repeats the frozen weights K times in memory and runs K small matrix products where one
K-times-taller product would do. A *cohort* runs them together:

    members' flat configs --cohorts()--> [[m1, m2, ...], [m5], ...]   (compatible groups)
    one cohort --Cohort--> PackedFPT: frozen block weights once, trained tensors (K, ...)
        x (K, B, T, W) -> input (per member) + wpe (per member) -> for each block:
            LN (per member gains) -> one GEMM on the (K*B*T, d) stacked rows (frozen)
            -> causal attention on (K*B, H, T, T) -> one GEMM -> LN -> two GEMMs (frozen)
            (the last block: keys and values for all T tokens, everything else only for
            the k read-out tokens, whose outputs are all the head reads)
        -> ln_f (per member) -> output head (per member) -> (K, B, k, m, C)
    PackedAdam: Adam over one (K, P) tensor of every trained parameter (the parameters
        are views of it) with each member's own learning rate,
        its own gradient-norm clipping (norm over its own slice, like DeepSpeed's clip of a
        solo trial) and its own trained groups (a member that does not train ``pos`` gets
        zero gradient there, hence exactly zero Adam updates)

Each member is still its own trial: its id is ``trial_id_for(sweep, config.to_flat())`` (the
same id it has unpacked), it draws its own training batches from its own seed, its heads are
initialised exactly as ``build_model`` does for its seed, and it gets its own Parquet rows
(``TrialRecord``), status and evaluation history. A member whose loss is not finite ends
``diverged`` alone: from then on it is left out of the forward pass, its loss and gradients
are dropped and its slice is frozen, while the rest of the cohort continues.

Equivalence with a solo run (tests/test_packing.py): at dropout 0 a packed member's loss
curve and evaluations equal the same trial run alone on DeepSpeed to floating-point
tolerance. With dropout > 0 packed members draw their dropout masks from one cohort
generator (seeded from the members' seeds), so they are statistically, not draw-for-draw,
the runs they would be alone; reproducible for the same cohort.

The packed path trains with plain torch, not a DeepSpeed engine: the trained tensors are a
few MB, so ZeRO has nothing to shard, and DeepSpeed's clipping is global over the engine's
parameters, which would couple the members; per-member clipping, learning rates and
divergence need an optimiser that knows the member axis. Unpacked trials stay on DeepSpeed.

Wiring into a sweep: ``cohorts(arms, k)`` groups flat configs; ``tune_cohort`` is the Ray
Tune function trainable of one cohort (config ``{"sweep": name, "members": [flat, ...]}``);
it reports every member's rows in each ``tune.report`` and resumes from Tune's checkpoint.
A cohort of one unpackable arm runs the ordinary ``tune_trial``.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from scale_fpt.config import ConfigError, TrialConfig, parse_finetune
from scale_fpt.models import BuiltModel, build_model, ops
from scale_fpt.models.backbones import build_backbone, load_architecture
from scale_fpt.models.fpt import FPT
from scale_fpt.tasks import build_task
from scale_fpt.tasks.base import Batch, Task, TaskSpec
from scale_fpt.trainer import (
    Evaluation,
    TrialState,
    flush_denormals,
    precision_problems,
    resolve_device,
    restore_rng,
    retain_freed_memory,
    rng_state,
)
from scale_fpt.trial import TrialRecord, error_text, trial_id_for

PACKABLE_GROUPS = ("input", "output", "ln", "pos")
"""Groups a packed member may train; ``ff`` and ``attn`` belong to the shared frozen body."""
MEMBER_FIELDS = ("lr", "seed", "finetune", "grad_clip", "accuracy_threshold", "zero_stage")
"""Config fields that may differ inside a cohort (``seed`` only when the backbone does not
depend on it, i.e. ``init=pretrained``; ``zero_stage`` is moot for the packed optimiser).
Every other field (task and its data, model, init, weights, dropout, precision, batch size,
steps, evaluation, device) is shared."""
PACKED_PRECISIONS = ("fp32", "bf16")
CHECKPOINT_FILE = "cohort.pt"

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


# --------------------------------------------------------------------------- grouping


def pack_problem(flat: dict) -> str | None:
    """Why the trial ``flat`` cannot be packed (None: it can)."""
    try:
        config = TrialConfig.from_flat(flat)
    except ConfigError as e:
        return "; ".join(e.problems)
    if config.model.model == "lstm":
        return "the lstm baseline has no transformer body to share"
    extra = set(parse_finetune(config.train.finetune)) - set(PACKABLE_GROUPS)
    if extra:
        return f"--finetune trains {'+'.join(sorted(extra))}: the body is not frozen"
    if config.train.precision not in PACKED_PRECISIONS:
        return f"--precision {config.train.precision}: packing supports fp32 and bf16"
    try:
        arch = load_architecture(config.model)
    except ConfigError as e:
        return "; ".join(e.problems)
    if getattr(arch, "model_type", None) != "gpt2":
        return f"--model {config.model.model}: packing supports GPT-2 architectures only"
    return None


def cohort_key(config: TrialConfig) -> tuple:
    """Members with equal keys can share one frozen backbone and one step loop."""
    varying = set(MEMBER_FIELDS)
    if config.model.init != "pretrained":  # random/stats backbones are drawn from the seed
        varying.discard("seed")
    return tuple(sorted((k, v) for k, v in config.to_flat().items() if k not in varying))


def cohorts(arms: list[dict], k: int) -> list[list[dict]]:
    """Group flat trial configs into cohorts of at most ``k`` compatible members.

    Compatible: the same task config, model, init, weights, dropout, precision, batch size,
    max/eval steps, evaluation batch size and device, a frozen body (finetune within
    input/output/ln/pos), and the same backbone weights (any seeds when pretrained, the same
    seed for random or stats inits). Members may differ in lr, seed, finetune subset,
    grad_clip and accuracy_threshold. A group larger than ``k`` is split into
    ceil(n / k) cohorts of near-equal size. Arms that cannot be packed come back alone
    (``[[arm]]``), in order. Every arm appears in exactly one cohort.
    """
    if k < 1:
        raise ValueError(f"cohort size must be >= 1, got {k}")
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
        n_cohorts = math.ceil(len(members) / k)
        out.extend(
            members[i * len(members) // n_cohorts : (i + 1) * len(members) // n_cohorts]
            for i in range(n_cohorts)
        )
    return out


def cohort_memory_bytes(members: list[dict]) -> int:
    """Memory a cohort needs on its device (to size a Ray resource request): the frozen body
    once, in the training precision; per member its trained tensors (fp32 weights, gradients
    and two Adam moments; ``wpe`` only for the task's positions) and its activations."""
    from scale_fpt import scaling
    from scale_fpt.tasks import task_spec

    configs = [TrialConfig.from_flat(m) for m in members]
    first = configs[0]
    arch = load_architecture(first.model)
    size = scaling.GPT2Size(arch.n_layer, arch.n_embd, arch.n_head, arch.n_positions)
    spec = task_spec(first.task)
    groups = scaling.gpt2_group_params(size)
    heads = scaling.head_params(
        size.n_embd,
        spec.token_width,
        spec.vocab_size,
        spec.n_predicting_tokens * spec.outputs_per_token * spec.n_classes,
    )
    weight_bytes = 4 if first.train.precision == "fp32" else 2
    body = (groups["attn"] + groups["ff"]) * weight_bytes
    trained = groups["ln"] + spec.n_tokens * size.n_embd + heads["input"] + heads["output"]
    activations = scaling.activation_bytes(
        size.n_layer, size.n_embd, spec.n_tokens, first.train.batch_size, first.train.precision
    )
    return body + len(configs) * (trained * 16 + activations)


# --------------------------------------------------------------------------- the model


class PackedFPT(nn.Module):
    """K FPT models over one frozen GPT-2 body.

    The frozen block weights (attention and MLP matrices) are held once, in the compute
    dtype; every trained tensor has a leading member axis and is kept in fp32 (the master
    copy; cast to the compute dtype in ``forward`` for bf16).
    """

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
        self.embd_p, self.resid_p, self.attn_p = (
            config.embd_pdrop,
            config.resid_pdrop,
            config.attn_pdrop,
        )
        blocks = list(backbone.h)
        self.scales = [float(block.attn.scaling) for block in blocks]
        self.act = blocks[0].mlp.act  # ops.GeluTanh for GPT-2 (backbones.fast_ops)

        def member_stack(tensors) -> nn.Parameter:
            stacked = torch.stack([t.detach().float() for t in tensors])
            return nn.Parameter(stacked.to(device).contiguous())

        def shared(tensor: torch.Tensor) -> nn.Parameter:  # the backbone's value, per member
            return member_stack([tensor] * self.K)

        if spec.discrete:
            self.input_embedding = member_stack([h.input.weight for h in heads])  # (K, V, d)
        else:
            self.input_weight = member_stack([h.input.weight for h in heads])  # (K, d, W)
            self.input_bias = member_stack([h.input.bias for h in heads])  # (K, d)
        self.wpe = shared(backbone.wpe.weight[:n_tokens])  # (K, T, d): rows past T never train
        for name in ("ln_1", "ln_2"):
            for part in ("weight", "bias"):
                layers = torch.stack([getattr(getattr(b, name), part) for b in blocks])
                setattr(self, f"{name}_{part}", shared(layers))  # (K, L, d)
        self.ln_f_weight = shared(backbone.ln_f.weight)  # (K, d)
        self.ln_f_bias = shared(backbone.ln_f.bias)
        self.output_weight = member_stack([h.output.weight for h in heads])  # (K, O, d)
        self.output_bias = member_stack([h.output.bias for h in heads])  # (K, O)

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

    def member_params(self, members: torch.Tensor | None) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.named_parameters():
            t = p if members is None else p.index_select(0, members)
            out[name] = t.to(self.dtype) if self.dtype != torch.float32 else t
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
    ) -> torch.Tensor:
        """x (Ka, B, T, W) float or (Ka, B, T) long for the members ``members`` (indices into
        K; None: all K) -> logits (Ka, B, k, m, C)."""
        p = self.member_params(members)
        spec, d = self.spec, self.d
        Ka, B, T = x.shape[:3]
        if spec.discrete:
            vocab = p["input_embedding"].shape[1]
            offsets = torch.arange(Ka, device=x.device).view(Ka, 1, 1) * vocab
            h = F.embedding(x + offsets, p["input_embedding"].reshape(Ka * vocab, d))
        else:
            h = torch.baddbmm(
                p["input_bias"].unsqueeze(1),
                x.reshape(Ka, B * T, x.shape[-1]).to(self.dtype),
                p["input_weight"].transpose(1, 2),
            ).view(Ka, B, T, d)
        h = ops.dropout(h + p["wpe"][:, None, :T], self.embd_p, self.training)
        h = h.reshape(Ka, B * T, d)
        k = spec.n_predicting_tokens
        # Only the last k (real) tokens are read out: the last block computes its queries,
        # attention output and MLP for those rows alone (keys and values for all T).
        positions = predicting_positions(T, k, lengths, Ka * B, x.device)  # (Ka*B, k)
        for layer in range(self.n_layer):
            last = layer == self.n_layer - 1
            h = self._block(h, layer, p, T, positions if last else None)  # (Ka, B*T or B*k, d)
        h = self._ln(h, p["ln_f_weight"], p["ln_f_bias"])  # (Ka, B*k, d)
        logits = torch.baddbmm(p["output_bias"].unsqueeze(1), h, p["output_weight"].transpose(1, 2))
        return logits.view(Ka, B, k, spec.outputs_per_token, spec.n_classes)

    def _block(
        self,
        h: torch.Tensor,
        layer: int,
        p: dict[str, torch.Tensor],
        T: int,
        positions: torch.Tensor | None,
    ) -> torch.Tensor:
        """One GPT-2 block over (Ka, N = B*T, d) rows -> (Ka, N, d); with ``positions``
        (Ka*B, k) only those tokens' outputs -> (Ka, B*k, d)."""
        w_qkv, b_qkv, w_o, b_o, w_fc, b_fc, w_p, b_p = self.frozen[layer]
        Ka, d, H = h.shape[0], self.d, self.n_head
        hd = d // H
        train = self.training
        a = self._ln(h, p["ln_1_weight"][:, layer], p["ln_1_bias"][:, layer]).reshape(-1, d)
        if positions is None:
            qkv = torch.addmm(b_qkv, a, w_qkv).view(-1, T, 3, H, hd)  # one GEMM, all K
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (Ka*B, H, T, hd)
        else:
            kv = torch.addmm(b_qkv[d:], a, w_qkv[:, d:]).view(-1, T, 2, H, hd)
            k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
            rows = positions + torch.arange(0, len(positions) * T, T, device=h.device)[:, None]
            rows = rows.reshape(-1)  # (Ka*B*k,) rows of the read-out tokens
            h = h.reshape(-1, d).index_select(0, rows).view(Ka, -1, d)
            q = torch.addmm(b_qkv[:d], a.index_select(0, rows), w_qkv[:, :d])
            q = q.view(len(positions), -1, H, hd).transpose(1, 2)  # (Ka*B, H, k, hd)
        o = ops.causal_attention(
            q, k, v, self.scales[layer], self.attn_p if train else 0.0, positions
        )
        o = torch.addmm(b_o, o.transpose(1, 2).reshape(-1, d), w_o)
        h = ops.add_dropout(h, o.view_as(h), self.resid_p, train)
        a = self._ln(h, p["ln_2_weight"][:, layer], p["ln_2_bias"][:, layer]).reshape(-1, d)
        f = torch.addmm(b_p, self.act(torch.addmm(b_fc, a, w_fc)), w_p)
        return ops.add_dropout(h, f.view_as(h), self.resid_p, train)


def predicting_positions(
    T: int, k: int, lengths: torch.Tensor | None, n: int, device: torch.device
) -> torch.Tensor:
    """(n, k) positions of the tokens read out: the last k, or the last k real ones before
    padding (as ``fpt.last_tokens``)."""
    offsets = torch.arange(-k, 0, device=device)
    if lengths is None:
        return (offsets + T).expand(n, k)
    return (lengths.reshape(-1, 1) + offsets).clamp(min=0)


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per member: mean cross-entropy over all its predictions and the number correct, as
    ``trainer.compute_loss`` computes for one trial. logits (Ka, B, k, m, C), targets
    (Ka, B, k, m) -> (Ka,), (Ka,)."""
    Ka, C = logits.shape[0], logits.shape[-1]
    flat = logits.float().reshape(Ka, -1, C)
    targets = targets.reshape(Ka, -1)
    ce = F.cross_entropy(flat.reshape(-1, C), targets.reshape(-1), reduction="none")
    correct = (flat.argmax(-1) == targets).sum(1)
    return ce.view(Ka, -1).mean(1), correct


# --------------------------------------------------------------------------- the optimiser


class PackedAdam:
    """K independent Adams (torch's update rule, no weight decay) over stacked tensors.

    Per member: learning rate, gradient-norm clipping over the member's own trained slice
    (DeepSpeed's rule: scale by min(1, clip / (norm + 1e-6))), trained groups (a group the
    member does not train gets zero gradient: Adam then moves it by exactly 0), and a mask
    of members that step (diverged members are frozen; their NaNs never leak).

    The trained tensors live in one (K, P) master tensor (each parameter's data becomes a
    view of its columns), so an update is a dozen operations on that tensor however many
    parameters the model has: a small cohort's step is otherwise dominated by per-tensor
    operation overhead.
    """

    def __init__(
        self,
        params: dict[str, nn.Parameter],
        trains: dict[str, torch.Tensor],
        lr: list[float],
        clip: list[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.names = [n for n, p in params.items() if p.requires_grad]
        self.params = [params[n] for n in self.names]
        K = len(lr)
        self.flat = torch.cat([p.detach().reshape(K, -1) for p in self.params], 1)  # (K, P)
        offset = 0
        for p in self.params:
            width = p[0].numel()
            p.data = self.flat[:, offset : offset + width].view(p.shape)
            offset += width
        # trains[name]: (K,) bool -> (K, P): which member trains which column
        self.trains = torch.cat(
            [
                trains[n].view(K, 1).expand(K, p[0].numel())
                for n, p in zip(self.names, self.params, strict=True)
            ],
            1,
        )
        device = self.flat.device
        self.lr = torch.tensor(lr, dtype=torch.float32, device=device)
        self.clip = torch.tensor(clip, dtype=torch.float32, device=device)
        self.betas, self.eps = betas, eps
        self.step_count = 0
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], stepping: torch.Tensor) -> None:
        """Update the members where ``stepping`` (K,) bool is set, with the gradients of
        ``self.params`` (in order)."""
        K = self.flat.shape[0]
        g = torch.cat([grad.reshape(K, -1) for grad in grads], 1).float()
        mask = self.trains & stepping[:, None]
        g = torch.where(mask, g, 0.0)  # not a product: a diverged member's NaNs stay out
        norm = torch.linalg.vector_norm(g, dim=1)  # (K,): each member's own gradient norm
        coef = torch.where(self.clip > 0, (self.clip / (norm + 1e-6)).clamp(max=1.0), 1.0)
        g.mul_(coef[:, None])
        self.step_count += 1
        beta1, beta2 = self.betas
        bias1 = 1 - beta1**self.step_count
        bias2_sqrt = (1 - beta2**self.step_count) ** 0.5
        self.exp_avg.lerp_(g, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        update = (self.exp_avg / denom).mul_((self.lr / bias1)[:, None])
        self.flat.sub_(torch.where(mask, update, 0.0))

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count,
            "exp_avg": self.exp_avg.cpu(),
            "exp_avg_sq": self.exp_avg_sq.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count = state["step_count"]
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])


# --------------------------------------------------------------------------- the cohort


@functools.lru_cache(maxsize=64)
def counting_model(config: TrialConfig, spec: TaskSpec) -> BuiltModel:
    """The member's model built on the meta device (no memory, no weights read): its
    parameter counts, trained groups and FLOPs are those of the trial run alone."""
    shape_only = config.replace(init="random", weights="")
    with torch.device("meta"):
        return build_model(shape_only, spec)


@dataclass
class Member:
    """One trial of a cohort: its config, rows, progress and data stream."""

    config: TrialConfig
    record: TrialRecord
    state: TrialState
    task: Task
    groups: tuple[str, ...]

    @property
    def running(self) -> bool:
        return self.state.status == "running"


class Cohort:
    """K compatible trials trained together on one PackedFPT (see the module docstring).

    ``task``: a prebuilt task to share (benchmarks pass synthetic data); by default the
    task is built once from the first member's config and each member reads its own
    training stream from its own seed (tasks keep the seed only for ``train_batch``).
    """

    def __init__(
        self,
        configs: list[TrialConfig],
        sweep: str = "train",
        task: Task | None = None,
        compile: bool = False,
    ):
        if not configs:
            raise ValueError("a cohort needs at least one member")
        problems = [p for c in configs if (p := pack_problem(c.to_flat()))]
        keys = {cohort_key(c) for c in configs}
        if len(keys) > 1:
            problems.append(
                "cohort members differ in fields they must share (only "
                f"{', '.join(MEMBER_FIELDS)} may differ; seed only with --init pretrained)"
            )
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)))
        first = configs[0]
        self.train_config = first.train
        self.device = resolve_device(first.train)
        problems = precision_problems(first.train, self.device)
        if problems:
            raise ConfigError(problems)
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[first.train.precision]
        base_task = task if task is not None else build_task(first.task, first.train.seed)
        spec = base_task.spec

        backbone, d_model, n_positions = build_backbone(first.model, first.train.seed)
        if spec.n_tokens > n_positions:
            raise ConfigError(
                [
                    f"--task {first.task.task}: sequences of {spec.n_tokens} tokens exceed the "
                    f"{n_positions} positions of {first.model.model}"
                ]
            )
        heads = []
        for config in configs:
            torch.manual_seed(config.train.seed + 1)  # exactly build_model's head init
            heads.append(FPT(spec, nn.Identity(), d_model))
        self.model = PackedFPT(
            backbone, spec, heads, spec.n_tokens, dtype=self.dtype, device=self.device
        )
        del backbone, heads
        self.forward = torch.compile(self.model) if compile else self.model

        self.members: list[Member] = []
        for config in configs:
            member_task = copy.copy(base_task)
            member_task.seed = config.train.seed
            built = counting_model(config, spec)
            record = TrialRecord(
                sweep=sweep,
                trial_id=trial_id_for(sweep, config.to_flat()),
                config=config,
                built=built,
                spec=spec,
                device=self.device,
            )
            self.members.append(
                Member(config, record, TrialState(), member_task, built.trained_groups)
            )
        ids = [m.record.trial_id for m in self.members]
        if len(set(ids)) != len(ids):
            raise ConfigError(["a cohort holds the same trial twice (identical configs)"])

        params = dict(self.model.named_parameters())
        trains = {}
        for name, p in params.items():
            group = PARAM_GROUPS[name]
            mask = [group in m.groups for m in self.members]
            trains[name] = torch.tensor(mask, device=self.device)
            p.requires_grad_(any(mask))  # no member trains it: no backward through it
        self.optimizer = PackedAdam(
            params,
            trains,
            lr=[c.train.lr for c in configs],
            clip=[c.train.grad_clip for c in configs],
        )
        self.step = 0
        flush_denormals()  # as a lone trial: Adam's moments decay into slow denormals
        retain_freed_memory()
        # Dropout draws from torch's global generator: seed it from the members' seeds.
        torch.manual_seed(sum(c.train.seed * 1_000_003 for c in configs) % (2**63 - 1) + 2)

    @property
    def size(self) -> int:
        return len(self.members)

    def running(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m.running]

    # ----------------------------------------------------------------- data

    def _stack(
        self, batches: list[Batch]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Stack members' batches: x (Ka, B, T, ...), lengths (Ka, B) or None, y (Ka, B, k, m).
        Variable-length batches are right-padded to the longest (causal attention: padding
        after a sequence never changes its real tokens)."""
        T = max(b.x.shape[1] for b in batches)
        xs = []
        for b in batches:
            x = b.x
            if x.shape[1] < T:
                pad = [0, 0] * (x.dim() - 2) + [0, T - x.shape[1]]
                x = F.pad(x, pad)
            xs.append(x)
        x = torch.stack(xs).to(self.device, non_blocking=True)
        y = torch.stack([b.y for b in batches]).to(self.device, non_blocking=True)
        lengths = None
        if any(b.lengths is not None for b in batches):
            lengths = torch.stack(
                [
                    b.lengths if b.lengths is not None else torch.full((len(b),), b.x.shape[1])
                    for b in batches
                ]
            ).to(self.device, non_blocking=True)
        if x.dtype != torch.long:
            x = x.to(self.dtype)
        return x, lengths, y

    def _index(self, active: list[int]) -> torch.Tensor | None:
        if len(active) == self.size:
            return None
        return torch.tensor(active, device=self.device)

    # ----------------------------------------------------------------- steps

    def train_step(self, step: int) -> dict[int, tuple[float, float]]:
        """One step of every running member: {member: (loss, accuracy)}; a non-finite loss
        means that member took no step (it diverged), as in ``Trainer.train_step``."""
        active = self.running()
        batches = [
            self.members[i].task.train_batch(step, self.train_config.batch_size) for i in active
        ]
        x, lengths, y = self._stack(batches)
        self.model.train()
        logits = self.forward(x, lengths, self._index(active))
        loss, correct = member_losses(logits, y)
        values = loss.detach().tolist()
        finite = [math.isfinite(v) for v in values]
        if any(finite):
            keep = torch.tensor(finite, device=loss.device)
            total = torch.where(keep, loss, torch.zeros_like(loss)).sum()
            grads = torch.autograd.grad(total, self.optimizer.params)
            stepping = torch.zeros(self.size, dtype=torch.bool, device=self.device)
            stepping[[i for i, ok in zip(active, finite, strict=True) if ok]] = True
            self.optimizer.step(grads, stepping)
        n = y[0].numel()
        correct_values = correct.tolist()
        return {
            i: (values[j], correct_values[j] / n if finite[j] else float("nan"))
            for j, i in enumerate(active)
        }

    @torch.no_grad()
    def evaluate(self, members: list[int]) -> dict[int, tuple[float, float]]:
        """Test loss and accuracy of ``members`` on the shared fixed test set."""
        self.model.eval()
        Ka = len(members)
        index = self._index(members)
        loss_sum = torch.zeros(Ka, dtype=torch.float64, device=self.device)
        correct = torch.zeros(Ka, dtype=torch.long, device=self.device)
        count = 0
        for batch in self.members[members[0]].task.test_batches(self.train_config.eval_batch_size):
            x, lengths, y = self._stack([batch])
            expand = (Ka, *x.shape[1:])
            x = x.expand(*expand)
            y = y.expand(Ka, *y.shape[1:])
            lengths = None if lengths is None else lengths.expand(Ka, -1)
            loss, n_correct = member_losses(self.forward(x, lengths, index), y)
            loss_sum += loss.double() * y[0].numel()
            correct += n_correct
            count += y[0].numel()
        return {
            i: (loss_value / count, n / count)
            for i, loss_value, n in zip(members, loss_sum.tolist(), correct.tolist(), strict=True)
        }

    def fit(self, on_eval: Callable[[int, list[int]], None] | None = None) -> None:
        """Train every running member to ``max_steps`` (or its divergence).
        ``on_eval(step, evaluated_members)`` after each evaluation."""
        train = self.train_config
        losses: dict[int, list[float]] = {i: [] for i in range(self.size)}
        accuracies: dict[int, list[float]] = {i: [] for i in range(self.size)}
        segment_start = train_start = time.perf_counter()
        while self.step < train.max_steps and self.running():
            results = self.train_step(self.step)
            for i, (loss, accuracy) in results.items():
                state = self.members[i].state
                if not math.isfinite(loss):
                    state.status = "diverged"
                    state.wall_seconds += time.perf_counter() - segment_start
                    continue
                state.step += 1
                losses[i].append(loss)
                accuracies[i].append(accuracy)
            self.step += 1
            if self.step % train.eval_every and self.step != train.max_steps:
                continue
            evaluated = self.running()
            if not evaluated:
                break
            train_seconds = time.perf_counter() - train_start
            metrics = self.evaluate(evaluated)
            now = time.perf_counter()
            for i in list(evaluated):
                state = self.members[i].state
                state.train_seconds += train_seconds
                state.wall_seconds += now - segment_start
                test_loss, test_accuracy = metrics[i]
                if not math.isfinite(test_loss):
                    # As Trainer.fit: the last update left non-finite outputs; the curve ends
                    # at the evaluation before.
                    state.status = "diverged"
                    evaluated.remove(i)
                    continue
                state.history.append(
                    Evaluation(
                        step=state.step,
                        train_loss=sum(losses[i]) / len(losses[i]),
                        train_accuracy=sum(accuracies[i]) / len(accuracies[i]),
                        test_loss=test_loss,
                        test_accuracy=test_accuracy,
                        samples_per_s=len(losses[i]) * train.batch_size / max(train_seconds, 1e-9),
                        wall_time_s=state.wall_seconds,
                    )
                )
                losses[i], accuracies[i] = [], []
                if state.step == train.max_steps:
                    state.status = "completed"
            segment_start = now
            if on_eval and evaluated:
                on_eval(self.step, evaluated)
            train_start = time.perf_counter()

    # ----------------------------------------------------------------- rows

    def curve_row(self, i: int) -> dict:
        member = self.members[i]
        return member.record.curve_row(member.state.history[-1])

    def trial_rows(self) -> list[dict]:
        return [{**m.record.trial_row(m.state), "cohort_size": self.size} for m in self.members]

    @property
    def finished(self) -> bool:
        return not self.running()

    # ----------------------------------------------------------------- checkpoints

    def save(self, directory: str) -> None:
        """Trained tensors, optimiser state, every member's progress and the RNG state (the
        frozen body is rebuilt from the config)."""
        os.makedirs(directory, exist_ok=True)
        payload = {
            "trial_ids": [m.record.trial_id for m in self.members],
            "step": self.step,
            "params": {n: p.detach().cpu() for n, p in self.model.named_parameters()},
            "optimizer": self.optimizer.state_dict(),
            "states": [m.state.to_dict() for m in self.members],
            **rng_state(),
        }
        torch.save(payload, os.path.join(directory, CHECKPOINT_FILE))

    def restore(self, directory: str) -> None:
        payload = torch.load(os.path.join(directory, CHECKPOINT_FILE), weights_only=False)
        ids = [m.record.trial_id for m in self.members]
        if payload["trial_ids"] != ids:
            raise RuntimeError(f"checkpoint in {directory} belongs to another cohort")
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(payload["params"][n])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.step = payload["step"]
        for member, saved in zip(self.members, payload["states"], strict=True):
            member.state = TrialState.from_dict(saved)
        restore_rng(payload)

    def close(self) -> None:
        """Free the cohort's memory (a reused Ray actor runs the next cohort here)."""
        flush_denormals(False)
        del self.model, self.forward, self.optimizer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_cohort(
    configs: list[TrialConfig],
    sweep: str = "train",
    on_eval: Callable[[list[dict], list[dict]], None] | None = None,
) -> list[dict]:
    """Train a cohort outside Ray; ``on_eval(curve_rows, trial_rows)`` at each evaluation.
    Returns every member's final trial row."""
    cohort = Cohort(configs, sweep=sweep)
    try:

        def report(step: int, evaluated: list[int]) -> None:
            if on_eval:
                on_eval([cohort.curve_row(i) for i in evaluated], cohort.trial_rows())

        cohort.fit(report)
        return cohort.trial_rows()
    finally:
        cohort.close()


# --------------------------------------------------------------------------- Ray Tune


def cohort_metrics(cohort: Cohort) -> dict:
    """Scheduler-facing metrics of a cohort: the best member (ASHA stops whole cohorts)."""
    last = [m.state.last for m in cohort.members if m.state.last is not None]
    if not last:  # Tune rejects a result without the sweep's metric: report NaN
        return {"test_accuracy": float("nan"), "best_test_accuracy": float("nan")}
    return {
        "test_accuracy": max(e.test_accuracy for e in last),
        "best_test_accuracy": max(
            m.state.best_test_accuracy() for m in cohort.members if m.state.last
        ),
    }


def tune_cohort(flat: dict) -> None:
    """Ray Tune function trainable of one cohort: config ``{"sweep": name, "members":
    [flat trial config, ...]}`` (other keys apply to every member). Every report carries
    ``curve_rows`` of the members evaluated at this step and ``trial_rows`` of all members;
    a retried cohort resumes from Tune's checkpoint. One unpackable member runs unpacked
    (``sweep.tune_trial``), so a sweep can send every arm through this trainable."""
    from ray import tune

    from scale_fpt.prebuild import prebuild_ops
    from scale_fpt.sweep import config_only_row, report_placed, tune_trial

    flat = dict(flat)
    sweep = flat.pop("sweep")
    compile_model = bool(flat.pop("compile", False))
    members = [{**flat, **m} for m in flat.pop("members")]  # pops "members" first
    prebuild_ops()  # the first cohort on a node builds its kernels; the others wait for it
    if len(members) == 1 and pack_problem(members[0]):
        tune_trial({**members[0], "sweep": sweep})
        return
    failed: list[dict] = []
    configs: list[tuple[dict, TrialConfig]] = []
    for member in members:
        try:
            configs.append((member, TrialConfig.from_flat(member)))
        except ConfigError as e:
            failed.append(config_only_row(sweep, member, "failed", error_text(e)))
    try:
        cohort = (
            Cohort([c for _, c in configs], sweep=sweep, compile=compile_model) if configs else None
        )
    except ConfigError as e:
        # A bad cohort fails the same way on every retry: record it, do not retry.
        failed += [config_only_row(sweep, m, "failed", error_text(e)) for m, _ in configs]
        cohort = None
    if cohort is None:
        nan = float("nan")
        report_placed(
            {
                "step": 0,
                "test_accuracy": nan,
                "best_test_accuracy": nan,
                "trial_rows": failed,
                "final": True,
            }
        )
        return
    try:
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as directory:
                cohort.restore(directory)
        reported_final = False

        def on_eval(step: int, evaluated: list[int]) -> None:
            nonlocal reported_final
            reported_final = cohort.finished
            with tempfile.TemporaryDirectory(prefix="scale_fpt_cohort_") as directory:
                cohort.save(directory)
                report_placed(
                    {
                        "step": step,
                        **cohort_metrics(cohort),
                        "curve_rows": [cohort.curve_row(i) for i in evaluated],
                        "trial_rows": failed + cohort.trial_rows(),
                        "final": reported_final,
                    },
                    checkpoint=tune.Checkpoint.from_directory(directory),
                )

        cohort.fit(on_eval)
        if not reported_final:  # every member diverged between evaluations (or restored done)
            report_placed(
                {
                    "step": cohort.step,
                    **cohort_metrics(cohort),
                    "trial_rows": failed + cohort.trial_rows(),
                    "final": True,
                }
            )
    finally:
        cohort.close()


def cohort_failed_rows(config: dict, error: str) -> list[dict]:
    """Failed rows of every member of a Tune cohort config that never reported (for the
    driver's ``on_trial_error``)."""
    from scale_fpt.sweep import config_only_row

    config = dict(config)
    sweep = config.pop("sweep")
    config.pop("compile", None)
    members = config.pop("members", None) or [{}]
    return [config_only_row(sweep, {**config, **m}, "failed", error) for m in members]


__all__ = [
    "Cohort",
    "PackedAdam",
    "PackedFPT",
    "cohort_failed_rows",
    "cohort_key",
    "cohort_memory_bytes",
    "cohorts",
    "pack_problem",
    "run_cohort",
    "tune_cohort",
]
