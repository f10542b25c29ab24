"""``steps.choice.first_compile``: the first process of a node to compile a graph holds the
node's lock for it; later ones (and those that waited) go on without it."""

from __future__ import annotations

import threading
import time

from scale_fpt.steps.choice import compile_cache, first_compile


def test_the_first_compile_of_a_signature_is_alone_and_later_ones_run_side_by_side(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert compile_cache() == tmp_path
    log = []

    def compile_(name: str, seconds: float) -> None:
        with first_compile("gpt2 cohort step"):
            log.append(("start", name))
            time.sleep(seconds)
            log.append(("end", name))

    first = threading.Thread(target=compile_, args=("cold", 0.5))
    first.start()
    time.sleep(0.1)  # the cold one holds the lock: these two wait, then run together
    waiting = [threading.Thread(target=compile_, args=(n, 0.3)) for n in ("a", "b")]
    for t in waiting:
        t.start()
    for t in (first, *waiting):
        t.join()
    assert log[:2] == [("start", "cold"), ("end", "cold")]
    assert {e for e, _ in log[2:4]} == {"start"}  # side by side once the cache is warm
    assert len(list((tmp_path / "scale_fpt_first").glob("*.done"))) == 1
    with first_compile("another graph"):  # another signature: its own lock and marker
        pass
    assert len(list((tmp_path / "scale_fpt_first").glob("*.done"))) == 2
