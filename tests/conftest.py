"""Shared fixtures: a tiny local GPT-2 and an isolated scale_fpt cache directory."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile

import pytest

TINY_TRIAL = {
    "task": "bit-xor",
    "model": "gpt2-tiny",
    "init": "random",
    "test_batches": 2,
    "val_batches": 2,
}
"""The sweep tests' trial: gpt2-tiny, random init (no download), Bit XOR, two test and two
validation batches per evaluation."""


def pytest_configure(config):
    # Test machines are small and shared: torch's default of one intra-op thread per core
    # oversubscribes them (training steps ran 20x slower under load). One thread, in this
    # process and in the subprocesses the tests start.
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # Every Ray the tests start (in-process, in subprocesses, `ray start` nodes) runs with
    # token authentication, as a laptop's ray.init() does by default, but with a token of
    # this session's own instead of ~/.ray/auth_token (which the tests neither read nor
    # leave behind): set explicitly, so that workers join a head whatever files exist.
    descriptor, token = tempfile.mkstemp(prefix="sf-ray-token-")  # mode 0600
    with os.fdopen(descriptor, "w") as f:
        f.write(secrets.token_hex(32))
    config.add_cleanup(lambda: os.unlink(token))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)


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


@pytest.fixture(autouse=True)
def default_float_mode():
    """Trainers flush denormals to zero (process-wide, no getter); a test that leaves a trainer
    unclosed must not change float arithmetic for the next test (hypothesis checks for it)."""
    yield
    import torch

    torch.set_flush_denormal(False)


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


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> str:
    """A local ``save_pretrained`` GPT-2 (2 layers, width 32, 1024 positions, 256 tokens)."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture
def scale_fpt_home(tmp_path, monkeypatch):
    """An empty SCALE_FPT_HOME (no locally pretrained backbones), also for subprocesses."""
    home = tmp_path / "scale_fpt_home"
    home.mkdir()
    monkeypatch.setenv("SCALE_FPT_HOME", str(home))
    return home


@pytest.fixture
def no_network(monkeypatch):
    """Refuse (and record) every attempt to open a network connection in this process."""
    import socket

    attempts = []

    def refuse(sock, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def write_long_proteins(directory, length: int = 1024, n_train: int = 8) -> str:
    """TAPE remote-homology JSON files whose every sequence has ``length`` residues: a task of
    ``length`` tokens in every batch (homology cuts a batch to its longest sequence)."""
    import json
    from pathlib import Path

    residues = "ACDEFGHIKLMNPQRSTVWY"
    sequence = (residues * (length // len(residues) + 1))[:length]
    for split, n in (("train", n_train), ("valid", 2), ("test_fold_holdout", 2)):
        records = [{"primary": sequence, "fold_label": i % 3} for i in range(n)]
        Path(directory, f"remote_homology_{split}.json").write_text(json.dumps(records))
    return str(directory)


@pytest.fixture(scope="session")
def long_proteins_dir(tmp_path_factory) -> str:
    """A homology ``--data-dir`` of 1024-residue sequences (``write_long_proteins``)."""
    return write_long_proteins(tmp_path_factory.mktemp("long-proteins"))


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
