"""Training one trial on one DeepSpeed engine: steps, evaluations, divergence, checkpoints.

The DeepSpeed config is derived from ``TrainConfig`` (``deepspeed_config``). A trial is one
process-local engine (world size 1); several trials share a node by each getting its own
rendezvous port. Resume restores trainable weights, optimiser state, step, RNG state and the
evaluation history, so a resumed trial reports exactly what an uninterrupted one does.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from scale_fpt.config import ConfigError, TrainConfig
from scale_fpt.models import BuiltModel
from scale_fpt.seeding import seed_streams
from scale_fpt.tasks.base import Batch, Task

CHECKPOINT_TAG = "trial"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@dataclass
class Evaluation:
    """One row of a trial's learning curve."""

    step: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    samples_per_s: float
    wall_time_s: float


@dataclass
class TrialState:
    """Everything about a trial in progress that a checkpoint must carry besides weights."""

    step: int = 0
    status: str = "running"
    history: list[Evaluation] = field(default_factory=list)
    train_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def last(self) -> Evaluation | None:
        return self.history[-1] if self.history else None

    def best_test_accuracy(self) -> float:
        return max((e.test_accuracy for e in self.history), default=float("nan"))

    def steps_to_threshold(self, threshold: float) -> int | None:
        return next((e.step for e in self.history if e.test_accuracy >= threshold), None)

    def to_dict(self) -> dict:
        return asdict(self)  # nested Evaluations become dicts too

    @classmethod
    def from_dict(cls, saved: dict) -> TrialState:
        return cls(**{**saved, "history": [Evaluation(**e) for e in saved["history"]]})


def rng_state() -> dict:
    """The global RNG state a resumed trial needs (dropout draws from it)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch_rng": torch.get_rng_state(), "cuda_rng": cuda}


def restore_rng(saved: dict) -> None:
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_device(train: TrainConfig) -> str:
    if train.accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if train.accelerator == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["--accelerator cuda: no CUDA GPU is visible; use cpu or auto"])
    return train.accelerator


def precision_problems(train: TrainConfig, device: str) -> list[str]:
    if train.precision == "fp16" and device != "cuda":
        return ["--precision fp16: needs a CUDA GPU (DeepSpeed's loss scaling); use bf16 or fp32"]
    return []


def init_distributed(device: str) -> None:
    """A world of one for this process, on a free port (trials on one node never collide).

    Called once per process; a reused Ray actor keeps its process group for the next trial.
    """
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    deepspeed.utils.logger.setLevel(logging.WARNING)  # one line per checkpoint otherwise
    if dist.is_initialized():
        return
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.environ["MASTER_PORT"] = str(free_port())
    deepspeed.init_distributed(
        dist_backend="nccl" if device == "cuda" else "gloo", verbose=False, dist_init_required=True
    )


def flush_denormals(enabled: bool = True) -> None:
    """Treat denormal floats as zero while training. Adam's second moments of barely-trained
    weights decay into the denormal range, where CPU float arithmetic is ~10x slower (a tiny
    model's step went from 0.1 s to 0.7 s within a few hundred steps); zeros change no result
    that matters. The setting is process-wide, so a trial turns it off again when it closes."""
    torch.set_flush_denormal(enabled)


def retain_freed_memory() -> None:
    """Keep freed memory in the process heap instead of handing it back to the OS (glibc
    malloc). A training step frees and re-allocates the same activation sizes every
    iteration; glibc returned those blocks (munmap, heap trimming), so every step refaulted
    them: 500-700 page faults and ~10% of a packed gpt2-tiny step on CPU. Blocks up to 32 MB
    now come from the heap, and the heap keeps up to 1 GB it no longer uses. Process-wide,
    idempotent, and a no-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
    libc.mallopt(M_TRIM_THRESHOLD, 2**30)


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


def compute_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and number correct over every prediction (every bit, for bit tasks).

    logits (B, k, m, C), targets (B, k, m).
    """
    flat = logits.float().reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat, targets.reshape(-1))
    correct = (flat.argmax(-1) == targets.reshape(-1)).sum()
    return loss, correct


class Trainer:
    """Owns the engine of one trial and its progress."""

    def __init__(self, train: TrainConfig, task: Task, built: BuiltModel):
        self.train, self.task, self.built = train, task, built
        self.device = resolve_device(train)
        problems = precision_problems(train, self.device)
        if problems:
            raise ConfigError(problems)
        init_distributed(self.device)
        import deepspeed

        trainable = [p for p in built.module.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(
            model=built.module, model_parameters=trainable, config=deepspeed_config(train)
        )
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
            train.precision
        ]
        self.state = TrialState()
        flush_denormals()
        retain_freed_memory()
        # Dropout draws from torch's global generator: seed it for the trial.
        torch.manual_seed(seed_streams(train.seed).dropout)

    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        batch = batch.to(self.engine.device)
        x = batch.x if batch.x.dtype == torch.long else batch.x.to(self.dtype)
        return x, batch.lengths, batch.y

    def train_step(self, step: int) -> tuple[float, float]:
        x, lengths, y = self.inputs(self.task.train_batch(step, self.train.batch_size))
        self.engine.train()
        loss, correct = compute_loss(self.engine(x, lengths), y)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            return loss_value, float("nan")
        self.engine.backward(loss)
        self.engine.step()
        return loss_value, correct.item() / y.numel()

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        self.engine.eval()
        loss_sum, correct, count = 0.0, 0, 0
        for batch in self.task.test_batches(self.train.eval_batch_size):
            x, lengths, y = self.inputs(batch)
            loss, n_correct = compute_loss(self.engine(x, lengths), y)
            loss_sum += loss.item() * y.numel()
            correct += n_correct.item()
            count += y.numel()
        return loss_sum / count, correct / count

    def fit(
        self,
        on_eval: Callable[[Evaluation], None] | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> TrialState:
        """Train from ``state.step`` to ``max_steps``; ``on_eval`` sees every evaluation
        (it may checkpoint with ``save``); returns the final state."""
        state, train = self.state, self.train
        losses, accuracies = [], []
        segment_start = time.perf_counter()
        train_start = time.perf_counter()
        while state.step < train.max_steps:
            loss, accuracy = self.train_step(state.step)
            if not math.isfinite(loss):
                state.status = "diverged"
                break
            state.step += 1
            losses.append(loss)
            accuracies.append(accuracy)
            if progress:
                progress(state.step, loss)
            if state.step % train.eval_every == 0 or state.step == train.max_steps:
                train_seconds = time.perf_counter() - train_start
                state.train_seconds += train_seconds
                test_loss, test_accuracy = self.evaluate()
                if not math.isfinite(test_loss):
                    # The last update left the model with non-finite outputs: this evaluation
                    # means nothing, so the curve (and final_test_accuracy) end at the one before.
                    state.status = "diverged"
                    break
                now = time.perf_counter()
                state.wall_seconds += now - segment_start
                segment_start = now
                evaluation = Evaluation(
                    step=state.step,
                    train_loss=sum(losses) / len(losses),
                    train_accuracy=sum(accuracies) / len(accuracies),
                    test_loss=test_loss,
                    test_accuracy=test_accuracy,
                    samples_per_s=len(losses) * train.batch_size / max(train_seconds, 1e-9),
                    wall_time_s=state.wall_seconds,
                )
                state.history.append(evaluation)
                losses, accuracies = [], []
                if state.step == train.max_steps:
                    state.status = "completed"
                if on_eval:
                    on_eval(evaluation)
                train_start = time.perf_counter()
        state.wall_seconds += time.perf_counter() - segment_start
        return state

    def save(self, directory: str) -> None:
        """Trainable weights, optimiser state, progress and RNG state (frozen weights are
        rebuilt from the config and seed, so they are not written)."""
        client_state = {"state": self.state.to_dict(), **rng_state()}
        self.engine.save_checkpoint(
            directory, tag=CHECKPOINT_TAG, client_state=client_state, exclude_frozen_parameters=True
        )

    def restore(self, directory: str) -> None:
        # DeepSpeed fails on a missing tag with a bare AssertionError (no file list): say what.
        if not any((Path(directory) / CHECKPOINT_TAG).glob("*.pt")):
            raise RuntimeError(f"no trial checkpoint in {directory}")
        try:
            path, client_state = self.engine.load_checkpoint(
                directory, tag=CHECKPOINT_TAG, load_module_strict=False
            )
        except Exception as e:  # torch.load's unpickling/zip errors do not name the directory
            raise RuntimeError(
                f"cannot restore the trial checkpoint in {directory} (corrupt or truncated "
                f"file?): {type(e).__name__}: {e}"
            ) from e
        if path is None:
            raise RuntimeError(f"no trial checkpoint in {directory}")
        self.state = TrialState.from_dict(client_state["state"])
        restore_rng(client_state)

    def close(self) -> None:
        """Free the engine's memory (a reused Ray actor runs the next trial in this process)."""
        flush_denormals(False)
        self.engine.destroy()
        del self.engine


class CheckpointDir:
    """Checkpoints of a command-line trial: ``step-N/`` directories and a ``latest`` pointer.

    The pointer is replaced atomically only after a checkpoint is complete, so a trial killed
    mid-save resumes from the previous one."""

    def __init__(self, directory: str):
        self.root = Path(directory)
        self.root.mkdir(parents=True, exist_ok=True)

    def latest(self) -> str | None:
        pointer = self.root / "latest"
        if not pointer.exists():
            return None
        return str(self.root / pointer.read_text().strip())

    def save(self, trainer: Trainer, step: int) -> None:
        previous = self.latest()
        name = f"step-{step}"
        target = self.root / name
        shutil.rmtree(target, ignore_errors=True)
        trainer.save(str(target))
        tmp = self.root / ".latest.tmp"
        tmp.write_text(name)
        os.replace(tmp, self.root / "latest")
        if previous and Path(previous) != target:
            shutil.rmtree(previous, ignore_errors=True)
