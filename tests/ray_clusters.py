"""Ray clusters of separate `ray start --block` processes on this machine, for tests.

Every process of a node descends from its `ray start` process, so a node is killed, and the
cluster torn down, by those process ids alone: `ray stop` would stop every Ray on the
machine, other people's included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from helpers import torch_extensions_dir


def wait_until(condition, what: str, done: threading.Event | None = None, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if done is not None and done.is_set():
            raise AssertionError(f"the sweep ended before {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """A Ray cluster of separate `ray start --block` processes on this machine: a head and
    worker nodes of one CPU each, in a private temp dir. Each node's processes (raylet,
    agents, and the workers its raylet starts) descend from its `ray start` process, so a
    node is killed, and the cluster torn down, by those process ids alone. (`ray stop` would
    stop every Ray on the machine, other people's included.)"""

    def __init__(self, **env: str):
        self.temp_dir = tempfile.mkdtemp(prefix="sfray", dir="/tmp")  # short: socket paths
        # Its own HOME holding a ~/.ray/auth_token, as a machine that once ran a plain local
        # ray.init() has: the nodes must form with the session's token whatever that file
        # holds, because the auth mode and the token's path are set explicitly (conftest).
        # (Kernels stay in this machine's build cache.)
        home = Path(self.temp_dir) / "home"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("a-token-left-by-an-earlier-ray-init")
        self.env = {
            **os.environ,
            "HOME": str(home),
            "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.env.update(env)
        self.ray = str(Path(sys.executable).with_name("ray"))
        if not os.path.exists(self.ray):
            self.ray = shutil.which("ray") or "ray"
        self.nodes: list[subprocess.Popen] = []
        self.seen: set[int] = set()
        self.address = ""
        self.workers: list[subprocess.Popen] = []

    def launch(self, workers: int, port: int = 0, head: tuple[str, ...] = ()) -> None:
        """A head (on ``port``, else a free one; ``head``: more `ray start` flags, e.g.
        ``--num-cpus=4`` or ``--autoscaling-config=FILE``) and ``workers`` worker nodes."""
        port = port or free_port()
        head = self.start(["--head", f"--port={port}", "--include-dashboard=false", *head])
        address_file = Path(self.temp_dir) / "ray_current_cluster"  # written once it is up
        wait_until(lambda: address_file.exists() or head.poll() is not None, "the head", None, 90)
        assert head.poll() is None, self.log(head)
        self.address = address_file.read_text().strip()
        self.workers = [self.start([f"--address={self.address}"]) for _ in range(workers)]

    def start(self, args: list[str]) -> subprocess.Popen:
        ports = (
            "node-manager-port",
            "object-manager-port",
            "metrics-export-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
        )
        log = open(Path(self.temp_dir) / f"node{len(self.nodes)}.log", "w")  # noqa: SIM115
        defaults = ["--num-cpus=1", "--num-gpus=0"]  # unless args say otherwise
        defaults = [d for d in defaults if not any(a.startswith(d.split("=")[0]) for a in args)]
        node = subprocess.Popen(
            [self.ray, "start", "--block", *args, *defaults, f"--temp-dir={self.temp_dir}"]
            + [f"--{p}={free_port()}" for p in ports]
            + ["--object-store-memory=150000000", "--disable-usage-stats"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node.log_file = log
        self.nodes.append(node)
        return node

    def log(self, node) -> str:
        return Path(node.log_file.name).read_text()[-3000:]

    def processes(self, node):
        import psutil

        try:
            root = psutil.Process(node.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.seen.update(p.pid for p in found)
        return found

    def kill(self, node) -> list[int]:
        """SIGKILL a node's processes by pid; returns the pids."""
        import psutil

        found = self.processes(node)
        for process in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(found, timeout=30)
        node.wait(timeout=30)
        return [p.pid for p in found]

    def shutdown(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL), and any process of ours that outlived
        its node; the temp dir goes too."""
        import psutil

        found = [p for node in self.nodes for p in self.processes(node)]
        for process in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        _, alive = psutil.wait_procs(found, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        for pid in self.seen:  # orphans, e.g. workers of a raylet that died first
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).is_running():
                    psutil.Process(pid).kill()
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=10)
            node.log_file.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
