"""What a first GPU run would hit, shown on the CPU: environment that test modules leak into
a GPU session, a trial leaving its GPU silently, a reused process's stale world, training
time read before the device finished, device caches outliving a trial, the mask draw's
temporaries. (The GPU halves are in ``test_gpu.py`` and ``test_planner.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_TRIAL

from scale_fpt.config import TrainConfig, TrialConfig
from scale_fpt.keyed_random import keep_mask
from scale_fpt.runtime import resolve_device, unusable_gpu_problem

TESTS = Path(__file__).resolve().parent
DEVICE_ENVIRONMENT = ("DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES")


def run_python(code: str, env: dict | None = None, timeout: int = 120):
    base = {k: v for k, v in os.environ.items() if k not in DEVICE_ENVIRONMENT}
    environment = {**base, "PYTHONPATH": str(TESTS.parent), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=TESTS,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def environment_writes_at_import(source: str) -> list[int]:
    """Lines of module-level statements (outside functions and classes) that write the
    process environment: ``os.environ[...] =``, ``os.environ.setdefault/update/pop``,
    ``os.putenv``, ``del os.environ[...]``."""
    import ast

    writes = []

    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def visit(node) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            return  # runs when called (fixtures, tests), not at import
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if call and (
            (is_environ(node.func.value) and node.func.attr in ("setdefault", "update", "pop"))
            or node.func.attr == "putenv"
        ):
            writes.append(node.lineno)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if hasattr(node, "targets") else [node.target]
            if any(isinstance(t, ast.Subscript) and is_environ(t.value) for t in targets):
                writes.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return writes


def test_no_test_module_writes_the_environment_when_imported():
    """pytest imports every module before ``-m gpu`` deselects: a module that sets
    DS_ACCELERATOR or CUDA_VISIBLE_DEVICES at import puts a GPU session's DeepSpeed engines
    (and every Ray worker the session starts) on the CPU. Environment belongs in fixtures
    (monkeypatch) or in a subprocess's env."""
    found = {
        path.name: lines
        for path in sorted(TESTS.glob("*.py"))
        if (lines := environment_writes_at_import(path.read_text()))
    }
    assert found == {}
    leak = "import os\nos.environ.setdefault('DS_ACCELERATOR', 'cpu')\n"
    assert environment_writes_at_import(leak) == [2]  # what the three modules did
    assert environment_writes_at_import("def f():\n    os.environ['X'] = '1'\n") == []


def test_a_trial_given_gpus_it_cannot_use_fails_with_one_line():
    train = TrainConfig()  # accelerator auto: would quietly pick the CPU
    problem = unusable_gpu_problem(["0"])
    if torch.cuda.is_available():
        assert problem is None and resolve_device(train, ["0"]) == "cuda"
        return
    with pytest.raises(RuntimeError) as error:
        resolve_device(train, ["0"])
    message = str(error.value)
    assert "\n" not in message and message == problem
    assert message.startswith("Ray assigned GPU(s) 0 to this trial but CUDA is unusable here")
    assert "refusing to train on the CPU" in message
    assert resolve_device(train, []) == "cpu"  # no GPU assigned: the CPU is the plan
    assert resolve_device(TrainConfig(accelerator="cpu"), ["0"]) == "cpu"  # asked for


@pytest.mark.slow
def test_a_world_of_one_ignores_what_a_larger_world_left_in_the_environment():
    """A reused Ray actor that ran rank 1 of a 2-process trial keeps RANK=1, WORLD_SIZE=2 in
    its environment; its next one-process trial must not wait for a rank 0 that is gone.
    DeepSpeed's accelerator follows the trial's device, with DS_ACCELERATOR unset."""
    code = (
        "import torch.distributed as dist\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "from scale_fpt.runtime import init_distributed\n"
        "init_distributed('cpu')\n"
        "print(dist.get_world_size(), dist.get_rank(), dist.get_backend(),"
        " get_accelerator().device_name())\n"
    )
    stale = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = run_python(code, env=stale, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "1 0 gloo cpu"


def test_training_time_includes_the_work_the_device_had_queued(monkeypatch):
    """On a GPU a step returns once its work is queued: the clock must be read after the
    evaluation's read of the device, which waits for that work. Here the wait is made
    visible: reading the step's sums takes 0.2 s longer (the queued work finishing)."""
    from scale_fpt.trial import TrialRun

    flat = {**TINY_TRIAL, "max_steps": 4, "eval_every": 2, "log_evals": False}
    run = TrialRun([TrialConfig.from_flat({**flat, "accelerator": "cpu"})])
    take = run.step.metrics.take

    def take_after_queued_work():
        time.sleep(0.2)
        return take()

    monkeypatch.setattr(run.step.metrics, "take", take_after_queued_work)
    try:
        (row,) = run.run()
    finally:
        run.close()
    batch = run.train.batch_size
    assert row["train_time_s"] >= 2 * 0.2  # two evaluations, each waited for
    for evaluation in run.states[0].history:
        assert evaluation.samples_per_s <= 2 * batch / 0.2  # two steps in >= 0.2 s


def test_a_closed_trial_leaves_no_epoch_permutations_cached(long_proteins_dir):
    """The cached epoch permutations live on the trial's device: a reused actor's GPU would
    keep them after the trial."""
    from scale_fpt.tasks.base import _permutation
    from scale_fpt.trial import TrialRun

    flat = {"task": "homology", "data_dir": long_proteins_dir, "model": "gpt2-tiny"}
    flat.update(init="random", max_length=32, homology_long="truncate", batch_size=2)
    run = TrialRun([TrialConfig.from_flat({**flat, "accelerator": "cpu", "test_batches": 1})])
    try:
        run.step.train_step(0)
        assert _permutation.cache_info().currsize > 0
    finally:
        run.close()
    assert _permutation.cache_info().currsize == 0


def test_a_long_mask_drawn_in_blocks_is_the_one_draw_and_holds_a_block_of_temporaries(
    monkeypatch,
):
    from test_planner import HostAllocated

    from scale_fpt import keyed_random

    keys = torch.tensor([3, 2**62 + 1], dtype=torch.int64)
    chunk = 2**21  # per key: 4M elements in all
    whole_block = 2 * chunk
    with HostAllocated() as whole:
        one_draw = keep_mask(keys, chunk, 0.1, torch.bfloat16)
    monkeypatch.setattr(keyed_random, "DRAW_BLOCK", whole_block // 8)
    with HostAllocated() as blocks:
        drawn_in_blocks = keep_mask(keys, chunk, 0.1, torch.bfloat16)
    assert torch.equal(drawn_in_blocks, one_draw)
    mask_bytes = whole_block * 2
    assert whole.peak <= keyed_random.DRAW_BYTES_PER_ELEMENT * whole_block
    assert whole.peak > 10 * mask_bytes  # int64 temporaries over every element at once
    # mallinfo2 counts the whole heap: Python's own allocations meanwhile (a few KB in a long
    # session of tests, another test's thread) ride on the bound, 256 KiB at most.
    slack = 2**18
    assert (
        blocks.peak <= mask_bytes + keyed_random.DRAW_BYTES_PER_ELEMENT * whole_block // 8 + slack
    )
