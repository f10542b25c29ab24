"""Trial configuration: one dataclass per concern (task, model, training).

Every field name is unique across the three dataclasses, so a trial's configuration is also a
flat ``{name: value}`` dict. The command-line flags (``--batch-size`` for ``batch_size``), the
Ray Tune param space and the Parquet columns all use these same names; DeepSpeed's config and
Ray's resource requests are derived from them (``steps.engine.deepspeed_config``,
``sweep.plan``), never restated.

Validation collects every problem and raises one :class:`ConfigError` naming each flag.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, fields

from scale_fpt.task_registry import TASKS

ABLATIONS = ("no-body", "one-attn")
"""Arms that replace the body: ``no-body`` (input layer -> output layer), ``one-attn`` (one
trained attention layer); ``models.ablations``."""
INITS = ("pretrained", "random", "stats", *ABLATIONS)
GROUPS = ("input", "output", "ln", "pos", "ff", "attn")
ADAPTER_GROUPS = ("lora",)
"""Groups that add parameters instead of naming existing ones (LoRA through PEFT on every
attention projection; ``lora_rank``, ``lora_alpha``)."""
FINETUNE_PRESETS = {"fpt": ("input", "output", "ln", "pos"), "full": GROUPS}
PRECISIONS = ("fp32", "bf16", "fp16")
ZERO_STAGES = (0, 1, 2, 3)
ACCELERATORS = ("auto", "cpu", "cuda")
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead")
MNIST_TOKENS = (49, 64)
HOMOLOGY_LONG = ("drop", "truncate")


def shape_init(init: str) -> str:
    """The init that builds a model of ``init``'s shapes without reading weights: ``random``,
    or the ablation arm itself (its body is not the named model's)."""
    return init if init in ABLATIONS else "random"


class ConfigError(ValueError):
    """Every problem found in a configuration, reported at once."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


def flag(name: str) -> str:
    """The command-line flag of a config field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def choice_problem(name: str, value, choices) -> str | None:
    if value in choices:
        return None
    return f"{flag(name)}: unknown value {value!r}; choose from {', '.join(map(str, choices))}"


def parse_finetune(spec: str) -> tuple[str, ...]:
    """``'fpt+ff'`` -> ``('input', 'output', 'ln', 'pos', 'ff')`` (canonical group order).

    Raises ConfigError naming unknown groups and the valid choices.
    """
    names: set[str] = set()
    unknown = []
    for part in str(spec).split("+"):
        part = part.strip()
        if part in FINETUNE_PRESETS:
            names.update(FINETUNE_PRESETS[part])
        elif part in GROUPS or part in ADAPTER_GROUPS:
            names.add(part)
        else:
            unknown.append(part)
    if unknown or not names:
        valid = ", ".join((*GROUPS, *ADAPTER_GROUPS, *FINETUNE_PRESETS))
        raise ConfigError(
            [
                f"--finetune: unknown group(s) {unknown or [spec]!r} in {spec!r}; join with '+' from {valid}"
            ]
        )
    return tuple(g for g in (*GROUPS, *ADAPTER_GROUPS) if g in names)


@dataclass(frozen=True)
class TaskConfig:
    """What the model is asked to do, and where its data comes from."""

    task: str = "bit-xor"
    """One of ``TASKS``."""
    data_dir: str = ""
    """Local copy of the data: a ``datasets`` directory / Parquet files (mnist, cifar10,
    cifar10-lra), the LRA ListOps ``basic_*.tsv`` files, or the TAPE remote-homology files.
    Empty: the Hugging Face hub id for image tasks, the seeded generator for ListOps."""
    max_length: int = 0
    """ListOps and homology: sequences are cut to this many tokens (0 = the paper's 512 for
    ListOps, 1024 for homology)."""
    listops_max_depth: int = 10
    """Generated ListOps: maximum nesting depth of operators (LRA uses 10)."""
    listops_max_args: int = 10
    """Generated ListOps: maximum number of arguments of one operator (LRA uses 10)."""
    listops_train_size: int = 20000
    """Generated ListOps: number of distinct training expressions (LRA has 96k)."""
    bit_memory_bits: int = 1000
    """Bit Memory: bits per string (the paper's 1000); fewer is a smaller variant of the task,
    a deviation to declare."""
    bit_memory_patch: int = 50
    """Bit Memory: bits per token (the paper's 50); must divide ``bit_memory_bits``."""
    augment: bool = True
    """CIFAR-10: random crop (pad 4), horizontal flip and rotation while training."""
    rotation_degrees: float = 20.0
    """CIFAR-10 augmentation: rotations drawn uniformly within ±this many degrees (the
    reference code's RandomRotation(20); the paper says "small rotations")."""
    normalize: bool = True
    """Image tasks: normalise pixels per channel as the reference code does (CIFAR-10's
    channel means/stds, CIFAR-10 LRA to [-1, 1], MNIST unchanged); false: pixels in [0, 1]."""
    mnist_tokens: int = 49
    """MNIST: 49 = the 28x28 image as stored, in 4x4 patches (the reference code); 64 = the
    image zero-padded to 32x32 first (the paper's table counts 64 tokens)."""
    homology_long: str = "drop"
    """Homology sequences longer than ``max_length``: ``drop`` them from every split (the
    reference code; the paper scales its accuracy by the 97.39% kept) or ``truncate`` them."""
    test_batches: int = 25
    """Synthetic tasks (bits, generated ListOps): batches (of 32) in the fixed test set."""
    test_limit: int = 0
    """Real datasets: evaluate on the first N test examples only (0 = the full test split)."""
    test_seed: int = 12345
    """Seed of the fixed synthetic test set; shared by all trials so accuracies compare."""
    val_batches: int = 25
    """Synthetic tasks (bits, generated ListOps): batches (of 32) in the fixed validation set."""
    val_limit: int = 0
    """Real datasets: validate on the first N validation examples only (0 = all of them)."""
    val_seed: int = 54321
    """Seed of the fixed synthetic validation set, an independent draw beside the test set."""
    val_fraction: float = 0.1
    """mnist, cifar10, cifar10-lra: the share of the train split held out as the validation
    set (a fixed slice, the same for every trial; training never reads it)."""
    train_examples: int = 0
    """Train on this many examples of the training data, reused in epochs (the data-size
    axis of a scaling study; ``tasks.pool``). 0: all of it (bit tasks: a fresh draw every
    batch)."""

    def problems(self) -> list[str]:
        out = [choice_problem("task", self.task, TASKS)]
        for name in ("max_length", "test_limit", "val_limit", "train_examples"):
            if getattr(self, name) < 0:
                out.append(f"{flag(name)}: must be >= 0, got {getattr(self, name)}")
        for name in (
            "listops_max_depth",
            "listops_max_args",
            "listops_train_size",
            "bit_memory_bits",
            "bit_memory_patch",
            "test_batches",
            "val_batches",
        ):
            if getattr(self, name) < 1:
                out.append(f"{flag(name)}: must be >= 1, got {getattr(self, name)}")
        if self.bit_memory_patch >= 1 and self.bit_memory_bits % self.bit_memory_patch:
            out.append(
                f"--bit-memory-patch: must divide --bit-memory-bits ({self.bit_memory_bits}), "
                f"got {self.bit_memory_patch}"
            )
        out.append(choice_problem("mnist_tokens", self.mnist_tokens, MNIST_TOKENS))
        out.append(choice_problem("homology_long", self.homology_long, HOMOLOGY_LONG))
        if not 0.0 <= self.rotation_degrees <= 180.0:
            out.append(f"--rotation-degrees: must be in [0, 180], got {self.rotation_degrees}")
        if not 0.0 < self.val_fraction < 1.0:
            out.append(f"--val-fraction: must be in (0, 1), got {self.val_fraction}")
        return [p for p in out if p]


@dataclass(frozen=True)
class ModelConfig:
    """The network: backbone architecture, where its weights come from, how it is built."""

    model: str = "gpt2-tiny"
    """A preset (``models.backbones.PRESETS``: gpt2, gpt2-medium, gpt2-large, gpt2-xl,
    gpt2-tiny, ..., EleutherAI/pythia-70m ... EleutherAI/pythia-12b, pythia-tiny,
    llama-tiny), any Hugging Face causal-LM id (families: docs/backbones.md), a local
    ``save_pretrained`` directory, or ``lstm``."""
    init: str = "pretrained"
    """``pretrained`` (the weights), ``random`` (the architecture's default init, built from
    the config alone), ``stats`` (random tensors with each pretrained tensor's mean/std), or an
    ablation arm: ``no-body`` (the transformer removed: input layer -> output layer) or
    ``one-attn`` (the body replaced by one trained causal attention layer)."""
    weights: str = ""
    """Where ``pretrained``/``stats`` read weights: a hub id or ``save_pretrained``
    directory. Empty: the model itself. For a CPU preset: the backbone that
    ``scale-fpt pretrain`` cached for it, ``language`` (the default) or ``bit-memory``."""
    dropout: float = 0.1
    """Dropout in the backbone (the paper's 0.1)."""
    input_dropout: bool = True
    """Dropout (rate ``dropout``) right after a linear input layer, as the reference code's
    FPT does (an embedding input has none there either); off: the backbone's own only."""
    lstm_width: int = 768
    """``lstm`` only: hidden width of the 3-layer LSTM (the paper's 768)."""
    lstm_layers: int = 3
    """``lstm`` only: number of LSTM layers (the paper's 3)."""
    lstm_layer_norm: bool = True
    """``lstm`` only: layer-normalised LSTM layers, as the reference code's baseline (its
    norms are the ``ln`` group, trained in the frozen ``fpt`` arm); false: a plain
    ``nn.LSTM``."""
    revision: str = ""
    """Hub revision of the weights (a branch, tag or commit: Pythia's pretraining checkpoints
    are branches ``step0`` ... ``step143000``); empty: the default branch. A pretraining-amount
    axis in a sweep's grid."""
    lora_rank: int = 8
    """``--finetune ...+lora``: rank r of the LoRA update B A added to every attention
    projection (PEFT)."""
    lora_alpha: float = 16.0
    """``--finetune ...+lora``: LoRA's scale numerator (the update is scaled by alpha / r)."""

    def problems(self) -> list[str]:
        out = [choice_problem("init", self.init, INITS)]
        if not self.model:
            out.append("--model: must name a preset, a Hugging Face id or a directory")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"--dropout: must be in [0, 1), got {self.dropout}")
        if self.lstm_width < 1 or self.lstm_layers < 1:
            out.append("--lstm-width/--lstm-layers: must be >= 1")
        if self.lora_rank < 1 or self.lora_alpha <= 0:
            out.append("--lora-rank/--lora-alpha: must be >= 1 and > 0")
        if self.model == "lstm" and self.init != "random":
            out.append("--init: the lstm baseline has no pretrained weights; use --init random")
        return [p for p in out if p]


@dataclass(frozen=True)
class TrainConfig:
    """How one trial trains: what is trained, optimiser, length, evaluation, numerics."""

    finetune: str = "fpt"
    """Trained parameter groups joined with '+' (input, output, ln, pos, ff, attn; ``lora``
    adds LoRA beside the attention projections) or a preset: ``fpt`` = input+output+ln+pos,
    ``full`` = everything."""
    lr: float = 1e-3
    """Adam learning rate (paper: 1e-3; 1e-4 for homology)."""
    batch_size: int = 16
    """Examples per step (paper: 2..16; the reference code's default is 4)."""
    max_steps: int = 3000
    """Gradient steps to train (``--steps``)."""
    eval_every: int = 500
    """Evaluate on the fixed validation and test sets every this many steps (and after the
    last)."""
    log_evals: bool = True
    """Also evaluate at log-spaced steps (100, 150, 200, 300, 500, 700, 1000, 1500, ...;
    ``loop.evaluation_steps``), so steps-to-threshold resolves early differences."""
    patience: int = 0
    """Stop once this many steps have passed since the evaluation with the best validation
    accuracy (checked at each evaluation; 0 = off: train the whole budget). Counted in
    steps, not evaluations, so the log-spaced schedule's sparse late evaluations do not
    stop a slow starter early. The trials row records why a trial ended (``stop_reason``)."""
    eval_batch_size: int = 32
    """Examples per evaluation batch."""
    seed: int = 0
    """Seeds model init, data order, dropout and synthetic data, each from its own
    independent stream (``scale_fpt.seeding.seed_streams``); must be >= 0."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (fp16 needs a CUDA GPU)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage: 0 none; 1 shards the optimizer state, 2 also the gradients, 3
    also the weights, over the trial's ``workers`` (one process shards nothing)."""
    zero_offload: bool = False
    """ZeRO stage 2 or 3: keep the optimizer state (fp32 master weights, Adam moments) in CPU
    memory and step it there (DeepSpeed's ``offload_optimizer``): less GPU memory for a
    slower step."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of keeping
    them (the backbone's gradient checkpointing): activation memory of one block instead of
    all, for about a third more compute. Same results."""
    workers: int = 1
    """Data-parallel processes of one trial (one DeepSpeed engine each; a whole GPU each on a
    GPU cluster, all on one node): each takes ``batch_size / workers`` examples of every
    batch, so the trial trains as one process would. 1: the trial is one process."""
    grad_clip: float = 1.0
    """Gradient-norm clipping (paper: 1.0; 0 disables)."""
    accuracy_threshold: float = 0.9
    """``steps_to_threshold`` is the first evaluated step with validation accuracy >= this."""
    accelerator: str = "auto"
    """Where the trial runs: auto (CUDA if present), cpu or cuda. (The trials column
    ``device`` records the device that actually ran it.)"""
    compile: str = "auto"
    """``torch.compile`` the trial's step: auto (the fast step where it pays: CUDA graphs for
    a cohort on a GPU, inductor's kernels for a world-of-one lean engine on a GPU, eager on a
    CPU; ``steps.choice``), off, default (fused kernels) or reduce-overhead (also CUDA graphs
    on a GPU: a small trial's step becomes a few graph launches instead of hundreds of kernel
    launches; cohort steps only). The first steps pay the compilation (cached per node:
    ``runtime.compile_cache``); a trial whose compilation fails runs eagerly after one warning
    (its row's ``step_compiled`` says which ran)."""

    def problems(self) -> list[str]:
        out = [
            choice_problem("precision", self.precision, PRECISIONS),
            choice_problem("zero_stage", self.zero_stage, ZERO_STAGES),
            choice_problem("accelerator", self.accelerator, ACCELERATORS),
            choice_problem("compile", self.compile, COMPILE_MODES),
        ]
        try:
            parse_finetune(self.finetune)
        except ConfigError as e:
            out.extend(e.problems)
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            out.append(f"--lr: must be a positive number, got {self.lr}")
        for name in ("batch_size", "max_steps", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                out.append(f"{flag(name)}: must be >= 1, got {getattr(self, name)}")
        if self.patience < 0:
            out.append(f"--patience: must be >= 0 (0 = off), got {self.patience}")
        if self.seed < 0:
            out.append(f"--seed: must be >= 0, got {self.seed}")
        if self.grad_clip < 0:
            out.append(f"--grad-clip: must be >= 0, got {self.grad_clip}")
        if not 0.0 <= self.accuracy_threshold <= 1.0:
            out.append(f"--accuracy-threshold: must be in [0, 1], got {self.accuracy_threshold}")
        return [p for p in out if p] + self.parallel_problems()

    def parallel_problems(self) -> list[str]:
        """How the trial is split over processes and what ZeRO does with it."""
        out = []
        if self.workers < 1:
            out.append(f"--workers: must be >= 1, got {self.workers}")
        elif self.batch_size >= 1 and self.batch_size % self.workers:
            out.append(
                f"--workers {self.workers} must divide --batch-size {self.batch_size} (each "
                f"worker takes an equal part of every batch); e.g. --batch-size "
                f"{-(-self.batch_size // self.workers) * self.workers}"
            )
        if self.zero_offload and self.zero_stage not in (2, 3):
            out.append(
                f"--zero-offload: needs --zero-stage 2 or 3 (got {self.zero_stage}); the "
                "optimizer state moves to the CPU in ZeRO's partitioned form"
            )
        return out


CONCERNS = (TaskConfig, ModelConfig, TrainConfig)
FIELD_TYPES: dict[str, type] = {
    f.name: type(getattr(concern(), f.name)) for concern in CONCERNS for f in fields(concern)
}
"""Every trial config field (flat name) and its type: the CLI flags, sweep keys, columns."""


@dataclass(frozen=True)
class TrialConfig:
    """One trial: the three concerns together. ``to_flat``/``from_flat`` give the flat dict."""

    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_flat(self) -> dict:
        return {
            **dataclasses.asdict(self.task),
            **dataclasses.asdict(self.model),
            **dataclasses.asdict(self.train),
        }

    @classmethod
    def from_flat(cls, flat: dict, *, strict: bool = True) -> TrialConfig:
        """Build and validate from ``{field: value}``; unknown keys are problems when strict."""
        problems = []
        if strict:
            problems += [
                f"unknown config key {k!r}; known keys: {', '.join(sorted(FIELD_TYPES))}"
                for k in flat
                if k not in FIELD_TYPES
            ]
        parts = []
        for concern in CONCERNS:
            kwargs = {}
            for f in fields(concern):
                if f.name not in flat:
                    continue
                value, problem = coerce(f.name, flat[f.name], FIELD_TYPES[f.name])
                if problem:
                    problems.append(problem)
                else:
                    kwargs[f.name] = value
            parts.append(concern(**kwargs))
        config = cls(*parts)
        problems += config.problems()
        if problems:
            raise ConfigError(problems)
        return config

    def problems(self) -> list[str]:
        out = self.task.problems() + self.model.problems() + self.train.problems()
        if self.train.activation_checkpointing and self.model.model == "lstm":
            out.append(
                "--activation-checkpointing: recomputes transformer blocks; the lstm baseline "
                "has none (drop the flag or pick a GPT-2 model)"
            )
        if "lora" in self.train.finetune.split("+") and (
            self.model.model == "lstm" or self.model.init in ABLATIONS
        ):
            out.append(
                f"--finetune lora: adapts a transformer body's attention; --model "
                f"{self.model.model} --init {self.model.init} has none"
            )
        return out

    def validate(self) -> TrialConfig:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def replace(self, **flat) -> TrialConfig:
        return TrialConfig.from_flat({**self.to_flat(), **flat})


def parse_trial(flat: dict) -> TrialConfig:
    """``TrialConfig.from_flat(flat)``, parsed once per distinct flat config in a process:
    every reader of one trial (packing, placement, resources, rows) shares its parse."""
    items = tuple(sorted(flat.items()))
    try:
        return _parse_items(items)
    except TypeError:  # an unhashable value: parsed, and refused, without the cache
        return TrialConfig.from_flat(flat)


@functools.lru_cache(maxsize=8192)
def _parse_items(items: tuple) -> TrialConfig:
    return TrialConfig.from_flat(dict(items))


def coerce(name: str, value, kind: type):
    """Coerce a flat value to its field's type; returns (value, problem)."""
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError
                return value.lower() in ("1", "true", "yes"), None
            return bool(value), None
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value), None
        if kind is float:
            return float(value), None
        return str(value), None
    except (TypeError, ValueError):
        return None, f"{flag(name)}: expected {kind.__name__}, got {value!r}"
