"""Shared fixtures (the helpers they use are in ``helpers.py``): a tiny local GPT-2, an
isolated scale_fpt cache directory, no network, one local Ray."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections import Counter

import pytest
from helpers import save_tiny_gpt2, write_long_proteins


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


def pytest_collection_modifyitems(config, items):
    """For `pytest -n N --dist loadfile --no-loadscope-reorder` (``make test``), which hands
    each worker whole test files in collection order: the files with the most ``slow`` tests
    go first and the files without one last, so the run ends on short files instead of one
    worker finishing a long one while the other idles. (Whole files move, so a module's
    fixtures are still built once. Without ``--no-loadscope-reorder`` xdist hands out the
    files with the most tests first, which put minute-long files of few tests at the end.)"""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out in this order
        slow = Counter(item.module.__name__ for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.module.__name__])  # stable: files stay whole


@pytest.fixture(autouse=True)
def default_float_mode():
    """Trainers flush denormals to zero (process-wide, no getter); a test that leaves a trainer
    unclosed must not change float arithmetic for the next test (hypothesis checks for it)."""
    yield
    import torch

    torch.set_flush_denormal(False)


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


@pytest.fixture(scope="session")
def long_proteins_dir(tmp_path_factory) -> str:
    """A homology ``--data-dir`` of 1024-residue sequences (``write_long_proteins``)."""
    return write_long_proteins(tmp_path_factory.mktemp("long-proteins"))
