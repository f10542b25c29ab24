"""Helpers of the tests (imported as ``from helpers import ...``; fixtures are in
``conftest.py``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

TINY_TRIAL = {
    "task": "bit-xor",
    "model": "gpt2-tiny",
    "init": "random",
    "test_batches": 2,
    "val_batches": 2,
}
"""The sweep tests' trial: gpt2-tiny, random init (no download), Bit XOR, two test and two
validation batches per evaluation."""


def torch_extensions_dir() -> str:
    """Where torch caches the C++ extensions it builds (the fused CPU kernels, DeepSpeed's
    ops) for this process: a Ray node or shell started with another HOME is pointed here
    (TORCH_EXTENSIONS_DIR) instead of rebuilding them for minutes."""
    import sys

    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    device = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return os.path.join(get_default_build_root(), f"{python}_{device}")


def home_env(home) -> dict[str, str]:
    """The environment entries of a process that runs with ``home`` as its HOME: torch's
    default build folder lies under HOME, so it keeps this machine's builds
    (``torch_extensions_dir``) instead of rebuilding them (25 s to minutes)."""
    return {"HOME": str(home), "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}


TINY_GPT2 = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 2,
    "n_positions": 1024,
    "vocab_size": 256,
    "bos_token_id": 255,
    "eos_token_id": 255,
}


def save_tiny_gpt2(directory, seed: int = 0, **overrides) -> str:
    """A small GPT-2 in ``save_pretrained`` format; every tensor (layer norms and biases too)
    is perturbed from the default init so that loaded weights are told apart from fresh ones."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    model = GPT2Model(GPT2Config(**{**TINY_GPT2, **overrides}))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    model.save_pretrained(directory)
    return str(directory)


def write_long_proteins(directory, length: int = 1024, n_train: int = 8) -> str:
    """TAPE remote-homology JSON files whose every sequence has ``length`` residues: a task of
    ``length`` tokens in every batch (homology cuts a batch to its longest sequence)."""
    import json

    residues = "ACDEFGHIKLMNPQRSTVWY"
    sequence = (residues * (length // len(residues) + 1))[:length]
    for split, n in (("train", n_train), ("valid", 2), ("test_fold_holdout", 2)):
        records = [{"primary": sequence, "fold_label": i % 3} for i in range(n)]
        Path(directory, f"remote_homology_{split}.json").write_text(json.dumps(records))
    return str(directory)


def run_pytest_child(path: str, env: dict, *args: str) -> str:
    """``pytest -q -x ARGS PATH`` in a fresh process with ``env`` added to this one's, for
    tests that must run where nothing of this process is (Triton decides at import whether it
    interprets; memory measurements need no foreign threads). Asserts it passed; returns
    its output."""
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args, path],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    return child.stdout


TRAIN = ["scale-fpt", "train", "--task", "bit-xor", "--model", "gpt2-tiny", "--init", "random"]
TRAIN += ["--test-batches", "2", "--no-progress"]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@contextlib.contextmanager
def own_ray(home=None, worker_setup=None, cpu_only: bool = False, **init_kwargs):
    """A local Ray of the test's own (``address="local"``: never a cluster already running
    on the machine), shut down afterwards. ``home``: the workers' SCALE_FPT_HOME;
    ``worker_setup``: run in every worker process as it starts; ``cpu_only``: workers see no
    GPU even on a GPU machine; ``init_kwargs``: ``ray.init``'s (CPUs, GPUs, memory)."""
    import ray

    from scale_fpt.sweep import connect_ray

    env = {"SCALE_FPT_HOME": str(home)} if home else {}
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    runtime_env = {"env_vars": env} if env else {}
    if worker_setup is not None:
        runtime_env["worker_process_setup_hook"] = worker_setup
    ray.shutdown()
    connect_ray(runtime_env=runtime_env or None, address="local", **init_kwargs)
    try:
        yield
    finally:
        ray.shutdown()
