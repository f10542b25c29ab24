"""The process a trial runs in: its device, numerics settings and (for DeepSpeed) its
process group. Process-wide settings that every step kind shares."""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import socket
import sys

import torch

from scale_fpt.config import ConfigError, TrainConfig

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


WORLD_TIMEOUT = datetime.timedelta(minutes=5)
"""How long a rank of a multi-process trial waits in a collective for a peer (torch's and
DeepSpeed's default is 30 minutes): a rank that died is noticed within this, and the trial
is retried, instead of every live rank blocking. Longer than any step, evaluation or
checkpoint shard write of a trial."""


def ray_gpu_ids() -> list[str]:
    """The GPUs Ray assigned to this process (empty outside a Ray worker, or none given)."""
    ray = sys.modules.get("ray")  # a process Ray started has imported it; never import it here
    if ray is None or not ray.is_initialized():
        return []
    return [str(i) for i in ray.get_gpu_ids()]


def unusable_gpu_problem(assigned: list[str]) -> str | None:
    """Why a trial given GPUs ``assigned`` by Ray cannot use them (None: CUDA works, or the
    GPUs are a fake cluster's: ``RAY_FAKE_CLUSTER=1``, Ray's autoscaler test mode, declares
    GPUs that no node has)."""
    if not assigned or torch.cuda.is_available() or os.environ.get("RAY_FAKE_CLUSTER") == "1":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"Ray assigned GPU(s) {', '.join(assigned)} to this trial but CUDA is unusable here "
        f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, "
        f"CUDA_VISIBLE_DEVICES={visible!r}); refusing to train on the CPU instead"
    )


def resolve_device(train: TrainConfig, assigned_gpus: list[str] | None = None) -> str:
    """The trial's device; ``assigned_gpus`` (default: Ray's for this process) that CUDA
    cannot use fail the trial (RuntimeError) instead of sending it to the CPU."""
    assigned = ray_gpu_ids() if assigned_gpus is None else assigned_gpus
    if train.accelerator != "cpu" and (problem := unusable_gpu_problem(assigned)):
        raise RuntimeError(problem)
    if train.accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if train.accelerator == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["--accelerator cuda: no CUDA GPU is visible; use cpu or auto"])
    return train.accelerator


def precision_problems(train: TrainConfig, device: str) -> list[str]:
    if train.precision == "fp16" and device != "cuda":
        return ["--precision fp16: needs a CUDA GPU (DeepSpeed's loss scaling); use bf16 or fp32"]
    return []


def trial_device(train: TrainConfig) -> str:
    """The device a trial runs on; ConfigError when its precision cannot run there."""
    device = resolve_device(train)
    problems = precision_problems(train, device)
    if problems:
        raise ConfigError(problems)
    return device


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def use_accelerator(device: str) -> None:
    """Make DeepSpeed's accelerator the trial's device. DeepSpeed picks one per process (from
    ``DS_ACCELERATOR`` or by probing) and keeps it, so a process that runs a CPU trial and
    then a GPU trial (a reused Ray actor, a test session) must set it per trial; and setting
    ``DS_ACCELERATOR`` instead would leak into every process this one starts."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() == device:
        return
    if device == "cuda":
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator as Accelerator
    else:
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as Accelerator
    set_accelerator(Accelerator())


def init_distributed(device: str) -> None:
    """A world of one for this process on a free port (trials on one node never collide),
    unless this process's group of one exists already (a reused Ray actor keeps it for the
    next trial). A group on the other device's backend, or the environment a multi-process
    world left behind (RANK, WORLD_SIZE of a reused actor's earlier trial), never carry
    over: a world of one rendezvouses with nobody, so its variables are set, not defaulted."""
    import deepspeed
    import torch.distributed as dist

    use_accelerator(device)
    deepspeed.utils.logger.setLevel(logging.WARNING)  # one line per checkpoint otherwise
    if dist.is_initialized():
        if dist.get_world_size() == 1 and dist.get_backend() == backend(device):
            return
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    deepspeed.init_distributed(dist_backend=backend(device), verbose=False, dist_init_required=True)


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


def rng_state() -> dict:
    """torch's global RNG state (what draws from it: dropout of non-GPT-2 backbones and the
    LSTM; GPT-2 dropout is keyed and needs none)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch_rng": torch.get_rng_state(), "cuda_rng": cuda}


def restore_rng(saved: dict) -> None:
    """Restore ``rng_state``; CUDA states for the devices visible now (a trial saved on a
    node with more visible GPUs resumes on one with fewer: the rest have no device)."""
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] is not None and torch.cuda.is_available():
        for index, state in enumerate(saved["cuda_rng"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
