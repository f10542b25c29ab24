"""One driver per sweep: an exclusive lock on ``<results>/<sweep>/driver.lock``.

A driver holds an ``fcntl.flock`` on the file for as long as it runs the sweep and writes
its identity (host, pid, start time) into it. The operating system releases the lock when
the process ends, however it ends (``kill -9``, a lost node's processes included), so a
killed driver never leaves the sweep locked: its stale identity stays in the file until
the next driver overwrites it. A second driver that finds the lock held stops at start-up
with one line naming the live one.

The lock is as good as the file system's ``flock``: local disks and NFSv4 (Linux emulates
``flock`` with NFS byte-range locks) honour it across processes and hosts; a file system
that ignores locks (some FUSE mounts, Lustre without ``-o flock``) lets two drivers through.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from scale_fpt.confined import ResultsError, printable, refuse_links

LOCK_FILE = "driver.lock"


def holder_identity() -> dict:
    """What the lock file says about the driver holding it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def describe_holder(text: str) -> str:
    """The lock file's identity in words (or what is known when it is unreadable)."""
    try:
        holder = json.loads(text)
        return printable(f"host {holder['host']}, pid {holder['pid']}, started {holder['started']}")
    except (ValueError, KeyError, TypeError):
        return "identity not recorded yet"


@contextlib.contextmanager
def driver_lock(sweep_dir: str | Path) -> Iterator[None]:
    """Hold the sweep's driver lock for the ``with`` block; ``ResultsError`` (one line
    naming the live driver) when another process holds it."""
    path = Path(sweep_dir) / LOCK_FILE
    refuse_links(path)
    # Opened without truncating: the holder's identity must survive a refused open; never
    # through a link planted in the folder (O_NOFOLLOW: ELOOP, refused below).
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        refuse_links(path)  # planted meanwhile
        raise ResultsError([f"cannot open the driver lock {path}: {e.strerror or e}"]) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            raise ResultsError(
                [
                    f"another driver is running sweep {Path(sweep_dir).name!r} in "
                    f"{Path(sweep_dir).parent} ({holder}; lock {path}): wait for it to end "
                    "or stop it, then rerun (with --resume to continue its trials)"
                ]
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder_identity()).encode(), 0)
            os.fsync(fd)
        except OSError as e:
            raise ResultsError(
                [f"cannot write the driver lock {path}: {e.strerror or e}"]
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
