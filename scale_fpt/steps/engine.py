"""EngineStep: one trial on one DeepSpeed engine.

For the trials a packed cohort cannot run: ZeRO (``zero_stage`` > 0), several
data-parallel workers, fine-tuning of the body (``ff``/``attn``/``full``), fp16 loss
scaling, the LSTM and non-GPT-2 backbones (``profile.step_kind``). The DeepSpeed config is
derived from ``TrainConfig`` (``deepspeed_config``). A trial of one process joins the
process group it finds (``runtime.init_distributed`` makes a world of one when there is
none); a trial of ``workers`` > 1 is a ``World`` of that many ranks (``scale_fpt.world``,
launched by ``scale_fpt.distributed``): each rank trains on its slice of every batch and
evaluates its slice of every evaluation batch, and the metrics are all-reduced, so every
rank holds the whole batch's numbers.

As ``CohortStep``: the step reads nothing on the host; its loss, accuracy and divergence
accumulate on the device (K = 1) and GPT-2 dropout masks are keyed on (dropout seed, step,
site). A non-finite loss is not skipped (that needs a host read): it is recorded as the
trial's divergence and the loop ends the trial at its next evaluation.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

from scale_fpt.checkpoints import load_checkpoint_file
from scale_fpt.config import ConfigError, TrainConfig
from scale_fpt.models import BuiltModel, ops
from scale_fpt.planner import ZERO_BUCKET_ELEMENTS
from scale_fpt.runtime import (
    DTYPES,
    flush_denormals,
    init_distributed,
    retain_freed_memory,
    trial_device,
)
from scale_fpt.seeding import seed_streams
from scale_fpt.steps import MemberMetrics, evaluation_sums, member_losses, model_inputs
from scale_fpt.steps.choice import GRAPH_FREE_FIELDS, Compilation, step_choice
from scale_fpt.tasks.base import Batch, Task
from scale_fpt.vocabulary import StepKind
from scale_fpt.world import SINGLE_PROCESS, World, init_world, leave_world, rank_seed, rows

CHECKPOINT_TAG = "trial"


def lean_engine(train: TrainConfig) -> bool:
    """Whether the trial's engine runs in DeepSpeed's fp32 mode around a client optimizer
    (``deepspeed_config``): every trial but ZeRO (stage >= 1) and fp16 ones.

    DeepSpeed earns its place in a trial where it does what plain torch would need a second
    implementation of: ZeRO's sharding and offload, several data-parallel workers (its
    allreduce), fp16 loss scaling (its scaler), and one checkpoint format for all of them.
    Its world-of-one bf16 mode adds nothing a GPU needs and costs the step most of its
    launches: bf16 at stage 0 wraps torch's Adam in ``FP16_UnfusedOptimizer``, whose overflow
    scan reads every trained tensor on the host (a device sync each) and whose fp32 masters
    are copied tensor by tensor, and no config switch removes it. So a bf16 (or fp32) trial
    at stage 0 keeps the engine (its forward and backward hooks, allreduce when there are
    several workers, checkpoints) in fp32 mode, with the trained tensors as fp32 masters and
    the frozen ones in bf16, the model computing under the engine's own ``torch_autocast``
    (bf16), and hands it a client ``torch.optim.Adam`` (fused on a GPU) that DeepSpeed steps
    with no wrapper; gradients are clipped by ``clip_grad_norm_`` (foreach) between backward
    and step, where DeepSpeed's ``gradient_clipping`` would add ~120 kernels and two blocking
    copies."""
    return train.zero_stage == 0 and train.precision != "fp16"


def deepspeed_config(train: TrainConfig) -> dict:
    """The DeepSpeed config of a trial, derived from its TrainConfig: ``batch_size`` is the
    global batch, split evenly over the trial's ``workers``. A lean engine
    (``lean_engine``) has no optimizer, clipping or bf16 section: its step brings them, and a
    bf16 one computes under the ``torch_autocast`` section. The engine's forward switches off
    an autocast its caller entered on a GPU (``deepspeed.runtime.torch_autocast``), so the
    section is how a bf16 forward gets one. ``lower_precision_safe_modules`` is empty: naming
    modules there would all-reduce their gradients in bf16 across workers; the fp32 masters'
    gradients are reduced in fp32."""
    lean = lean_engine(train)
    config = {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.batch_size // train.workers,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0 if lean else train.grad_clip,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero_optimization(train),
        "bf16": {"enabled": train.precision == "bf16" and not lean},
        "torch_autocast": {
            "enabled": train.precision == "bf16" and lean,
            "dtype": "bfloat16",
            "lower_precision_safe_modules": [],
        },
        "fp16": {"enabled": train.precision == "fp16", "initial_scale_power": 16},
        "steps_per_print": 1 << 62,
        "wall_clock_breakdown": False,
        # Its throughput timer synchronises the device twice per step otherwise.
        "timers": {"throughput": {"enabled": False}},
    }
    if not lean:
        config["optimizer"] = {
            "type": "Adam",
            # torch's Adam (no weight decay, as the paper) avoids building DeepSpeed's fused
            # op; with ZeRO-Offload it steps the optimizer state where it lives, on the CPU.
            "params": {
                "lr": train.lr,
                "weight_decay": 0.0,
                "torch_adam": True,
                "adam_w_mode": False,
            },
        }
    return config


def client_optimizer(train: TrainConfig, trainable: list[torch.nn.Parameter]):
    """A lean engine's Adam (torch's update rule, no weight decay, as DeepSpeed's): fused on a
    GPU (one launch per group of tensors, no host reads) and on a CPU (torch's fused CPU
    kernel)."""
    return torch.optim.Adam(trainable, lr=train.lr, weight_decay=0.0, fused=True)


def zero_optimization(train: TrainConfig) -> dict:
    """DeepSpeed's ``zero_optimization`` section: the stage, the gradient buckets the
    planner counts (``planner.ZERO_BUCKET_ELEMENTS``; DeepSpeed's own default is 10x that,
    1-2 GB per rank) and, when asked, the optimizer state offloaded to (pinned) CPU memory."""
    section: dict = {"stage": train.zero_stage}
    if train.zero_stage:
        section["reduce_bucket_size"] = ZERO_BUCKET_ELEMENTS
        section["allgather_bucket_size"] = ZERO_BUCKET_ELEMENTS
    if train.zero_offload:
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return section


def foreach(device: torch.device | str) -> bool | None:
    """``clip_grad_norm_``'s ``foreach``: its multi-tensor kernels where torch has them (a
    GPU: one norm launch for all gradients); None (per-tensor) elsewhere."""
    return True if torch.device(device).type in _get_foreach_kernels_supported_devices() else None


def enable_activation_checkpointing(module: torch.nn.Module, train: TrainConfig) -> None:
    """Recompute the backbone's transformer blocks in the backward pass
    (``TrainConfig.activation_checkpointing``), through the Hugging Face backbone's own
    gradient checkpointing, each block through ``ops.keyed_checkpoint``: non-reentrant (the
    blocks' inputs need no ``requires_grad``, a frozen body), and the recomputation draws the
    same dropout masks (the known families' keyed dropout replays its keys; torch's RNG
    state is restored for other backbones)."""
    if not train.activation_checkpointing:
        return
    backbone = module.backbone
    if not getattr(backbone, "supports_gradient_checkpointing", False):
        raise ConfigError(
            [f"--activation-checkpointing: {type(backbone).__name__} has no gradient checkpointing"]
        )
    backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for block in backbone.modules():
        if getattr(block, "gradient_checkpointing", False):
            block._gradient_checkpointing_func = ops.keyed_checkpoint


def world_problems(train: TrainConfig, world: World) -> list[str]:
    if world.size == train.workers:
        return []
    return [
        f"--workers {train.workers}: this process is one of {world.size}; a trial over several "
        "workers runs in a sweep (scale-fpt sweep, sweeps/*.py), which starts its workers"
    ]


def weights_only_checkpoint_engine(engine):
    """DeepSpeed's torch checkpoint engine for ``engine``, reading every checkpoint file with
    the weights-only loader (``checkpoints.load_checkpoint_file``; DeepSpeed's own loads with
    ``weights_only=False``, so a planted file would run its code on resume). Besides tensors
    and plain data, DeepSpeed's optimiser states hold a few of its own plain records, allowed
    by name: loss scalers, the ZeRO stage enum and fragment addresses (read from the files
    of ZeRO 0-3 in fp32, bf16 and fp16 checkpoints)."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    allowed = (LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address)

    class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            # Always onto the CPU: where every load of DeepSpeed's engine maps its tensors.
            return load_checkpoint_file(path, allowed)

    return WeightsOnlyCheckpointEngine(engine._config)


class EngineStep:
    """The step of one trial on a DeepSpeed engine (K = 1)."""

    size = 1

    def __init__(
        self, train: TrainConfig, task: Task, built: BuiltModel, world: World = SINGLE_PROCESS
    ):
        self.train_config, self.task, self.world = train, task, world
        self.rank = world.rank
        self.device = trial_device(train)
        problems = world_problems(train, world)
        if problems:
            raise ConfigError(problems)
        enable_activation_checkpointing(built.module, train)
        if world.size > 1:
            init_world(self.device, world)
        else:
            init_distributed(self.device)
        import deepspeed

        trainable = [p for p in built.module.parameters() if p.requires_grad]
        self.lean = lean_engine(train)
        self.dtype = DTYPES[train.precision]
        self.trainable = trainable
        optimizer = None
        if self.lean:
            # Frozen tensors in the compute dtype once (as DeepSpeed's bf16 mode holds them),
            # so autocast casts none of them per step; trained ones stay fp32 masters.
            for p in built.module.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(self.dtype)
            optimizer = client_optimizer(train, trainable)
        choice = step_choice(StepKind.ENGINE, train, torch.device(self.device).type)
        shapes = [tuple(p.shape) for p in built.module.parameters()]
        train_fields = {k: v for k, v in vars(train).items() if k not in GRAPH_FREE_FIELDS}
        self.compilation = Compilation(
            choice.mode, "engine step", f"{self.device} {task.spec} {shapes} {train_fields}"
        )
        # The module's forward alone: DeepSpeed's hooks around it and its backward and
        # optimizer step stay eager (``steps.choice``).
        # Compiled, the dropout keys are an argument of the forward (``ops.keyed_forward``).
        if choice.compiled:
            built.module.forward = self.compilation.wrap(ops.keyed_forward(built.module.forward))
        config = getattr(getattr(built.module, "backbone", None), "config", None)
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = False  # a KV cache is built per forward otherwise
        # A ZeRO-3 engine replaces torch.nn.functional.linear for the whole process, until
        # reset by hand (DeepSpeed's ``zero3_linear_wrap``); ``close`` puts this one back.
        self.functional_linear = torch.nn.functional.linear
        self.engine, *_ = deepspeed.initialize(
            model=built.module,
            model_parameters=trainable,
            optimizer=optimizer,
            config=deepspeed_config(train),
        )
        self.engine.checkpoint_engine = weights_only_checkpoint_engine(self.engine)
        if world.size == 1 and train.zero_stage == 0:
            # A world of one reduces nothing, yet the allreduce walks every parameter (ZeRO's
            # reduction also partitions the gradients: it stays).
            self.engine.enable_backward_allreduce = False
        task.to(self.engine.device)  # batches are made where the engine trains
        # Each rank draws its own dropout masks (rank 0 those of a world of one): equal masks
        # on every rank's slice would correlate the ranks.
        dropout_seed = rank_seed(seed_streams(train.seed).dropout, world.rank)
        self.step_keys = ops.StepKeys(torch.tensor([dropout_seed], device=self.engine.device))
        if world.size > 1:
            torch.manual_seed(dropout_seed)  # what draws from torch's global generator
        self.metrics = MemberMetrics(1, self.engine.device)
        # Compiled, the loss with the metrics and the gradient clipping are graphs too.
        self._loss = self.compilation.wrap(self._training_loss)
        self._clip = self.compilation.wrap(self._clip_gradients)
        self.engine.train()
        self.training = True  # evaluations switch the module to eval mode and back
        flush_denormals()
        retain_freed_memory()

    def set_active(self, members: list[int]) -> None:
        """Nothing to change: a trial that ended is not stepped again by the loop."""

    def train_step(self, step: int) -> None:
        """One step on this rank's slice of the step's batch; the metrics recorded are the
        whole batch's (all ranks agree on them, so all count or skip the update alike)."""
        batch = self.world.shard(self.task.train_batch(step, self.train_config.batch_size))
        x, lengths, y = model_inputs(batch, self.dtype)
        if not self.training:
            self.engine.train()
            self.training = True
        keys = self.step_keys.at(step)
        if self.compilation.mode != "off":  # a copy: the same input layout every step
            logits = self.engine(x, lengths, step_keys=keys.clone())  # (B/N, k, m, C)
        else:
            with ops.keyed_by(keys):
                logits = self.engine(x, lengths)
        # Compiled, the step is a device value: one graph for every step, not one per step.
        at = torch.full((), step, device=y.device) if self.compilation.compiled else step
        self.engine.backward(self._loss(logits, y, at))
        if self.lean and self.train_config.grad_clip > 0:
            self._clip()
        self.engine.step()

    def _clip_gradients(self) -> None:
        """DeepSpeed's rule (scale by min(1, clip / (norm + 1e-6))), without host reads."""
        torch.nn.utils.clip_grad_norm_(
            self.trainable, self.train_config.grad_clip, foreach=foreach(self.engine.device)
        )

    def _training_loss(
        self, logits: torch.Tensor, y: torch.Tensor, step: int | torch.Tensor
    ) -> torch.Tensor:
        """The loss to backpropagate (0 once the trial's loss is not finite), the whole
        batch's metrics recorded at ``step``."""
        loss, correct = member_losses(logits[None], y[None])  # (1,), (1,)
        # Every rank's slice has batch_size / workers examples: the mean of the ranks' means
        # is the whole batch's mean, and the correct counts add up.
        whole_loss = self.world.mean(loss.detach())  # (1,)
        whole_correct = self.world.sum(correct.double())  # (1,)
        counts = self.metrics.record(
            step, whole_loss, whole_correct, y.numel() * self.world.size, None
        )
        return torch.where(counts, loss, 0.0).sum()

    @torch.no_grad()
    def evaluate(self, split: str) -> torch.Tensor:
        """(1, 2) [loss, accuracy] on the fixed ``split``, each rank evaluating its slice of
        every batch (sums all-reduced). Every rank runs every forward pass, as ZeRO-3 gathers
        weights collectively: a rank whose slice is empty runs the batch's first row and
        counts none."""
        self.engine.eval()
        self.training = False

        def forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
            part = self.world.shard(batch)
            x, lengths, y = model_inputs(part if len(part) else rows(batch, 0, 1), self.dtype)
            logits = self.engine(x, lengths)[None]
            return (logits, y[None]) if len(part) else None

        batches = self.task.eval_batches(split, self.train_config.eval_batch_size)
        return evaluation_sums(batches, forward, 1, self.engine.device, self.world.sum)

    def save(self, directory: str) -> None:
        """Trainable weights and optimiser state (frozen weights are rebuilt from the config
        and seed, so they are not written) and the divergence record."""
        self.engine.save_checkpoint(
            directory,
            tag=CHECKPOINT_TAG,
            client_state={"metrics": self.metrics.state_dict()},
            exclude_frozen_parameters=True,
        )

    def member_weights(self, member: int) -> dict[str, torch.Tensor]:
        """The trained tensors of the module, whole (gathered under ZeRO-3), on the CPU."""
        import deepspeed

        trained = [(n, p) for n, p in self.engine.module.named_parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(
            [p for _, p in trained], enabled=self.train_config.zero_stage == 3
        ):
            return {n: p.detach().float().cpu().clone() for n, p in trained}

    def restore(self, directory: str) -> None:
        # DeepSpeed fails on a missing tag with a bare AssertionError (no file list): say what.
        if not any((Path(directory) / CHECKPOINT_TAG).glob("*.pt")):
            raise RuntimeError(f"no engine checkpoint in {directory}")
        path, client_state = self.engine.load_checkpoint(
            directory, tag=CHECKPOINT_TAG, load_module_strict=False
        )
        if path is None:
            raise RuntimeError(f"no engine checkpoint in {directory}")
        self.metrics.load_state_dict(client_state["metrics"])

    def close(self) -> None:
        """Free the engine's memory (a reused Ray actor runs the next trial in this process)."""
        flush_denormals(False)
        self.engine.destroy()
        del self.engine
        # The next trial of a reused actor computes as in a fresh process (a 2-worker ZeRO-2
        # trial after a ZeRO-3 one trained another curve with the ZeRO-3 linear left in).
        torch.nn.functional.linear = self.functional_linear
        leave_world(self.world)
        if self.compilation.mode != "off":  # its graphs and guards hold this trial's module
            torch._dynamo.reset()
