"""EngineStep: one trial on one DeepSpeed engine.

For the trials a packed cohort cannot run: ZeRO (``zero_stage`` > 0), several
data-parallel workers, fine-tuning of the body (``ff``/``attn``/``full``), fp16 loss
scaling, the LSTM and non-GPT-2 backbones (``packing.step_kind``). The DeepSpeed config is
derived from ``TrainConfig`` (``deepspeed_config``). The step joins the process group it
finds (``runtime.init_distributed`` makes a world of one when there is none), so it makes
no assumption about the world size.

As ``CohortStep``: the step reads nothing on the host; its loss, accuracy and divergence
accumulate on the device (K = 1) and GPT-2 dropout masks are keyed on (dropout seed, step,
site). A non-finite loss is not skipped (that needs a host read): it is recorded as the
trial's divergence and the loop ends the trial at its next evaluation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scale_fpt.config import TrainConfig
from scale_fpt.models import BuiltModel, ops
from scale_fpt.runtime import (
    DTYPES,
    flush_denormals,
    init_distributed,
    retain_freed_memory,
    trial_device,
)
from scale_fpt.seeding import seed_streams
from scale_fpt.steps import MemberMetrics, evaluation_sums, member_losses
from scale_fpt.tasks.base import Batch, Task

CHECKPOINT_TAG = "trial"


def deepspeed_config(train: TrainConfig) -> dict:
    """The DeepSpeed config of a trial, derived from its TrainConfig."""
    return {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": train.grad_clip,
        "optimizer": {
            "type": "Adam",
            # torch's Adam (no weight decay, as the paper) avoids building DeepSpeed's fused op.
            "params": {
                "lr": train.lr,
                "weight_decay": 0.0,
                "torch_adam": True,
                "adam_w_mode": False,
            },
        },
        "zero_optimization": {"stage": train.zero_stage},
        "bf16": {"enabled": train.precision == "bf16"},
        "fp16": {"enabled": train.precision == "fp16", "initial_scale_power": 16},
        "steps_per_print": 1 << 62,
        "wall_clock_breakdown": False,
    }


class EngineStep:
    """The step of one trial on a DeepSpeed engine (K = 1)."""

    size = 1

    def __init__(self, train: TrainConfig, task: Task, built: BuiltModel):
        self.train_config, self.task = train, task
        self.device = trial_device(train)
        init_distributed(self.device)
        import deepspeed

        trainable = [p for p in built.module.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(
            model=built.module, model_parameters=trainable, config=deepspeed_config(train)
        )
        self.dtype = DTYPES[train.precision]
        self.keys = [seed_streams(train.seed).dropout]
        self.metrics = MemberMetrics(1, self.engine.device)
        flush_denormals()
        retain_freed_memory()

    def set_active(self, members: list[int]) -> None:
        """Nothing to change: a trial that ended is not stepped again by the loop."""

    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        batch = batch.to(self.engine.device)
        x = batch.x if batch.x.dtype == torch.long else batch.x.to(self.dtype)
        return x, batch.lengths, batch.y

    def train_step(self, step: int) -> None:
        x, lengths, y = self.inputs(self.task.train_batch(step, self.train_config.batch_size))
        self.engine.train()
        with ops.dropout_keys(self.keys, step):
            logits = self.engine(x, lengths)  # (B, k, m, C)
        loss, correct = member_losses(logits[None], y[None])  # (1,), (1,)
        counts = self.metrics.record(step, loss, correct, y.numel(), None)
        self.engine.backward(torch.where(counts, loss, 0.0).sum())
        self.engine.step()

    @torch.no_grad()
    def evaluate(self, split: str) -> torch.Tensor:
        """(1, 2) [loss, accuracy] on the fixed ``split``."""
        self.engine.eval()

        def forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
            x, lengths, y = self.inputs(batch)
            return self.engine(x, lengths)[None], y[None]

        batches = self.task.eval_batches(split, self.train_config.eval_batch_size)
        return evaluation_sums(batches, forward, 1, self.engine.device)

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
