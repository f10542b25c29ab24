"""The node's JIT builds: a build killed midway (Ctrl-C in a first run) leaves torch's baton
file behind, on which every later load would wait forever; the prebuild, under the node's
build lock, removes the batons of scale_fpt's own extensions that no live process holds
open, and no other."""

from __future__ import annotations

import os

from scale_fpt.prebuild import clear_stale_batons


def test_stale_batons_of_our_extensions_are_removed_and_no_others(tmp_path):
    ours = [
        tmp_path / "py311_cpu" / "scale_fpt_fused_cpu_0123456789" / "lock",  # default root
        tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock",
        tmp_path / "scale_fpt_fused_cpu_abcdef0123" / "lock",  # under TORCH_EXTENSIONS_DIR
    ]
    foreign = tmp_path / "py311_cpu" / "someone_elses_op" / "lock"
    built = tmp_path / "py311_cpu" / "scale_fpt_fused_cpu_0123456789" / "main.o"
    for path in (*ours, foreign, built):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert sorted(clear_stale_batons(tmp_path)) == sorted(ours)
    assert not any(path.exists() for path in ours)
    assert foreign.exists() and built.exists()  # another build's baton, our build's files
    assert clear_stale_batons(tmp_path) == []


def test_a_baton_a_live_build_holds_open_is_kept(tmp_path):
    """A build running outside the node's lock (DeepSpeed building its op on first use)
    holds its baton open, as torch's FileBaton does until the build ends: it is kept."""
    held = tmp_path / "deepspeed_shm_comm" / "lock"
    left = tmp_path / "scale_fpt_fused_cpu_0123456789" / "lock"
    for path in (held, left):
        path.parent.mkdir(parents=True)
    fd = os.open(held, os.O_CREAT | os.O_EXCL)  # torch's FileBaton.try_acquire
    left.touch()
    try:
        assert clear_stale_batons(tmp_path) == [left]
        assert held.exists() and not left.exists()
    finally:
        os.close(fd)
    assert clear_stale_batons(tmp_path) == [held]  # its build ended without removing it
