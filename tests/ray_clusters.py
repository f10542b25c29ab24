"""Ray clusters of separate `ray start --block` processes on this machine, for tests.

Every process of a node descends from its `ray start` process, so a node is killed, and the
cluster torn down, by those process ids alone: `ray stop` would stop every Ray on the
machine, other people's included.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from helpers import home_env


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


# Ports for the nodes' servers, a range per pytest-xdist worker, between Ray's worker ports
# (10002-19999) and Linux's ephemeral range (32768-60999: what a bind to port 0 and every
# outgoing connection take). A port handed out by bind(0) and closed can be taken by any
# process before the node binds it, and gRPC servers bind with SO_REUSEPORT: a Ray of
# another test worker could then share the GCS's port and answer its clients.
PORT_RANGE = 2_000
FIRST_PORT = 20_000 + PORT_RANGE * (int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]) % 6)
ports_handed_out = itertools.count()


def free_port() -> int:
    """A port no process listens on, from this test worker's own range, none handed out
    twice until the range wraps."""
    for _ in range(PORT_RANGE):
        port = FIRST_PORT + next(ports_handed_out) % PORT_RANGE
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every address: a listener on any one of them is busy
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {FIRST_PORT}-{FIRST_PORT + PORT_RANGE - 1}")


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
            **home_env(home),
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
        # Ray's client server listens on 10001 unless told: two heads of two test workers
        # (or the SSH test's `ray up` of local.yaml) beside each other would share it.
        client = f"--ray-client-server-port={free_port()}"
        head = self.start(["--head", f"--port={port}", client, "--include-dashboard=false", *head])
        address_file = Path(self.temp_dir) / "ray_current_cluster"  # written once it is up
        wait_until(lambda: address_file.exists() or head.poll() is not None, "the head", None, 90)
        assert head.poll() is None, self.log(head)
        self.address = address_file.read_text().strip()
        self.workers = [self.start([f"--address={self.address}"]) for _ in range(workers)]
        self.wait_for_nodes(1 + workers)

    def wait_for_nodes(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` nodes are alive, as a driver attached through RAY_ADDRESS sees
        them (a driver of its own process, as every test's driver is): a test then starts
        on the cluster it asked for, and a cluster a driver cannot reach fails here, with
        the nodes' logs."""
        wait = (
            "import sys, time, ray\n"
            "ray.init(log_to_driver=False)\n"
            "deadline = time.monotonic() + float(sys.argv[2])\n"
            "alive = lambda: sum(node['Alive'] for node in ray.nodes())\n"
            "while alive() < int(sys.argv[1]) and time.monotonic() < deadline:\n"
            "    time.sleep(0.2)\n"
            "print(alive())\n"
        )
        found = subprocess.run(
            [sys.executable, "-c", wait, str(count), str(timeout)],
            env={**self.env, "RAY_ADDRESS": self.address},
            capture_output=True,
            text=True,
            timeout=timeout + 120,  # the driver's own connect retries, then the wait
        )
        alive = found.stdout.strip().splitlines()[-1:] if found.returncode == 0 else []
        assert alive == [str(count)], (
            f"{count} nodes asked, a driver found {alive or 'none'}:\n"
            f"{found.stdout[-1500:]}{found.stderr[-3000:]}\n{self.logs()}"
        )

    def logs(self) -> str:
        """The tails of each node's `ray start` output and of the head's GCS log."""
        gcs = Path(self.temp_dir) / "session_latest" / "logs" / "gcs_server.out"
        tails = [f"node {k}:\n{self.log(node)}" for k, node in enumerate(self.nodes)]
        if gcs.exists():
            tails.append(f"GCS:\n{gcs.read_text()[-3000:]}")
        return "\n".join(tails)

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
