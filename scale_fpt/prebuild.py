"""JIT-built ops, built once per node before that node's first trial.

DeepSpeed builds its CPU communication op on first use, and scale_fpt its fused CPU kernels
(``models.ops``), both into the node's torch extensions directory. Trials that start side by
side on a fresh node would all build at once (concurrent first builds can hang or queue
behind torch's own build baton). Every trial therefore calls ``prebuild_ops`` before it
builds anything: the first process on a node builds under a node-wide file lock, the others
wait for it and then load the cached builds. ``python -m scale_fpt.prebuild`` does it ahead
of time: ``make`` runs it after installing, and ``cluster/local.yaml`` in a node's set-up.
"""

from __future__ import annotations

import functools
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from filelock import FileLock

BUILD_LOCK = "scale_fpt_build.lock"
"""File in the torch extensions directory that serialises builds on one node."""


def extensions_dir() -> Path:
    """Where torch caches JIT builds on this node (``TORCH_EXTENSIONS_DIR`` or its default)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    # Imported only for the default: torch's import (~1.5 s of CPU) is not needed to take
    # the node's build lock in a process that builds nothing.
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def node_build_lock() -> FileLock:
    """The node's build lock: an OS file lock, released if the process dies, so a killed
    build never blocks the node."""
    directory = extensions_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return FileLock(directory / BUILD_LOCK)


# The extensions scale_fpt builds on a node: the fused kernels (named by their source's hash)
# and DeepSpeed's CPU communication op.
OWN_EXTENSIONS = ("scale_fpt_fused_cpu_*", "deepspeed_shm_comm")


def held_open(paths: list[Path]) -> set[Path] | None:
    """Those of ``paths`` that a live process holds open, read from /proc (torch's baton
    keeps its file open until the build ends); None where there is no /proc to read."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    wanted = {str(path.resolve()): path for path in paths}
    held = set()
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            links = [os.readlink(entry) for entry in os.scandir(fd_dir)]
        except OSError:  # a process that ended, or one this user may not read
            continue
        held.update(wanted[link] for link in links if link in wanted)
    return held


def clear_stale_batons(directory: Path) -> list[Path]:
    """Remove torch's build batons (``<extension>/lock``) of this node's own extensions that no
    live process holds open, and return them. Torch waits forever on a baton whose build was
    killed (Ctrl-C in a first run), and its baton is a plain file that outlives the process.
    A build that did not take the node's build lock (DeepSpeed building its op on first use,
    a test importing the kernels) still holds its baton open, and keeps it. Where /proc
    cannot tell, the node's build lock, held by every build that goes through
    ``prebuild_ops``, is what says a baton found is stale."""
    # Torch adds a "py311_cpu"-like folder under its default root, none under
    # TORCH_EXTENSIONS_DIR.
    places = [f"{depth}{pattern}/lock" for depth in ("", "*/") for pattern in OWN_EXTENSIONS]
    batons = [baton for place in places for baton in directory.glob(place)]
    held = held_open(batons) or set()
    stale = [baton for baton in batons if baton not in held]
    for baton in stale:
        baton.unlink(missing_ok=True)
    return stale


@functools.cache
def prebuild_ops(deepspeed: bool = True) -> None:
    """Build (or load) the fused CPU kernels, and DeepSpeed's CPU op unless ``deepspeed`` is
    False, under the node's build lock; once per process. A process that trains no DeepSpeed
    engine (a cohort) never imports DeepSpeed, whose import alone takes seconds of each
    trial process's start-up. A process that sees CUDA needs neither."""
    import torch

    if torch.cuda.is_available():
        return
    from scale_fpt.models.ops import fused_kernels  # torch: only a CPU trial builds them

    with node_build_lock():
        for baton in clear_stale_batons(extensions_dir()):
            print(f"scale-fpt: removed the stale build lock {baton} (a build was killed)",
                  file=sys.stderr)  # fmt: skip
        if not deepspeed:
            fused_kernels()
            return
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.ops.op_builder import ShareMemCommBuilder

        # The two builds side by side: DeepSpeed's op compiles two files, the kernels one, so
        # on a 2-core node the three compilers share the cores instead of the kernels' waiting
        # (each build runs in its own ninja process and folder; the GIL is free meanwhile).
        with ThreadPoolExecutor(max_workers=1) as pool:
            kernels = pool.submit(fused_kernels)
            ShareMemCommBuilder().load(verbose=False)
            kernels.result()


if __name__ == "__main__":  # `python -m scale_fpt.prebuild`: at install or node set-up
    prebuild_ops()
