"""One driver per sweep (docs/security.md): a second driver on the same results
directory and sweep name is refused at start-up naming the live one; a killed driver's
lock goes with its process, so ``--resume`` after ``kill -9`` runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scale_fpt.results import ResultsError, load_results
from scale_fpt.sweep.lock import LOCK_FILE, driver_lock

ROOT = Path(__file__).resolve().parent.parent


def test_a_held_lock_refuses_the_next_driver_naming_the_holder(tmp_path):
    with driver_lock(tmp_path):
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
        with pytest.raises(ResultsError) as e, driver_lock(tmp_path):
            pass
        (line,) = str(e.value).splitlines()
        assert f"another driver is running sweep {tmp_path.name!r}" in line
        assert f"pid {os.getpid()}, started {holder['started']}" in line
    with driver_lock(tmp_path):  # released at the end of the block
        pass


def test_a_killed_holder_leaves_the_lock_free(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from scale_fpt.sweep.lock import driver_lock
                with driver_lock({str(tmp_path)!r}):
                    print("held", flush=True)
                    time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ResultsError, match=f"pid {holder.pid}, started"), driver_lock(tmp_path):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with driver_lock(tmp_path):  # the kernel released the dead process's lock
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.slow
def test_second_driver_is_refused_and_resume_after_kill_9_finishes(tmp_path):
    """Two real drivers (``sweeps/scale.py``) on one results directory and sweep name: the
    second exits 2 at start-up with one line naming the first, which runs on; after
    ``kill -9`` of the first, ``--resume`` takes the lock and finishes the sweep."""
    results = tmp_path / "results"
    flags = ["--results", str(results), "--name", "locked", "--tasks", "bit-xor"]
    flags += ["--inits", "random", "--seeds", "0", "--steps", "40", "--set", "eval_every=20"]
    flags += ["--set", "test_batches=2", "--set", "val_batches=2", "--set", "log_evals=false"]
    command = [sys.executable, str(ROOT / "sweeps" / "scale.py"), *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: its local Ray dies with it
    )
    try:
        lock = results / "locked" / LOCK_FILE
        deadline = time.time() + 120
        while not (lock.exists() and lock.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        holder = json.loads(lock.read_text())
        assert holder["pid"] == first.pid

        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first driver ended before the second one started"
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = second.stderr.strip().splitlines()
        assert ": error: another driver is running sweep 'locked' in " in line
        assert f"host {holder['host']}, pid {first.pid}, started {holder['started']}" in line
        assert json.loads(lock.read_text()) == holder  # the refused driver changed nothing
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()

    resumed = subprocess.run(
        [*command, "--resume"], env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trials = load_results(results, "locked").trials
    assert trials["status"].tolist() == ["completed"] and trials["steps_done"].tolist() == [40]
