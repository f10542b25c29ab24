"""One driver per sweep (docs/security.md): a second driver on the same results
directory and sweep name is refused at start-up naming the live one; a killed driver's
lock goes with its process, so ``--resume`` after ``kill -9`` runs. (Both through real
drivers, ``sweeps/scale.py``: tests/test_sweep.py's killed-driver test.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from scale_fpt.results import ResultsError
from scale_fpt.sweep.lock import LOCK_FILE, driver_lock


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
