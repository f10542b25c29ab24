"""The process a trial runs in: its device, numerics settings and (for DeepSpeed) its
process group. Process-wide settings that every step kind shares."""

from __future__ import annotations

import ctypes
import logging
import os
import socket

import torch

from scale_fpt.config import ConfigError, TrainConfig

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


def init_distributed(device: str) -> None:
    """A world of one for this process, on a free port (trials on one node never collide),
    unless a process group exists already (a launcher's, or this process's earlier trial:
    a reused Ray actor keeps its process group for the next trial)."""
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


def rng_state() -> dict:
    """torch's global RNG state (what draws from it: dropout of non-GPT-2 backbones and the
    LSTM; GPT-2 dropout is keyed and needs none)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch_rng": torch.get_rng_state(), "cuda_rng": cuda}


def restore_rng(saved: dict) -> None:
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
