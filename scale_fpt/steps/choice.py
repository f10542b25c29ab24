"""Which step a trial takes on a device and whether it runs compiled (``StepChoice``), and
the compiled functions of a step that fall back to eager when compilation fails
(``Compilation``).

``--compile auto`` (the default) picks per step kind and device:

- a cohort step (every packable trial, alone or packed) on a CUDA device: ``reduce-overhead``
  (inductor's fused kernels replayed as CUDA graphs). At small batch a GPU step is bound by
  kernel launches (docs/performance.md): the eager cohort launches ~700 kernels per gpt2
  step, the graphs replay them with a handful of launches from the host;
- an engine step (one DeepSpeed engine) on a CUDA device: ``default`` (inductor's fused
  kernels, no CUDA graphs: DeepSpeed's hooks and optimizer step run between the module's
  calls, outside any graph, and CUDA graphs would overwrite the module's outputs before the
  engine's backward reads them) where DeepSpeed leaves the module alone at a world of one:
  the lean engine (``engine.lean_engine``: ZeRO stage 0, fp32 or bf16) with one worker.
  ZeRO >= 1 hooks every parameter's gradient into its partitioning, fp16 wraps the step in
  DeepSpeed's loss scaler, several workers allreduce inside the backward: those stay eager;
- on a CPU: ``off``. The compiled cohort's step takes 0.40x the plain baseline's CPU time
  against the eager step's 0.68x (docs/performance.md), but its compilation costs more than
  a CPU trial's steps save (``tests/test_step_choice.py`` times both).

An explicit mode (``off``, ``default``, ``reduce-overhead``) is taken as asked where the
step supports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from filelock import FileLock

from scale_fpt.config import ConfigError, TrainConfig
from scale_fpt.prebuild import extensions_dir
from scale_fpt.vocabulary import StepKind

log = logging.getLogger(__name__)

AUTO = "auto"
GPU_MODES = {StepKind.COHORT: "reduce-overhead", StepKind.ENGINE: "default"}
"""What ``--compile auto`` runs on a CUDA device, per step kind."""


@dataclass(frozen=True)
class StepChoice:
    """The step a trial takes: its kind and its ``torch.compile`` mode (``off``: eager)."""

    kind: StepKind
    mode: str
    why: str = ""
    """Why ``auto`` left the step eager (empty when compiled or asked for)."""

    @property
    def compiled(self) -> bool:
        return self.mode != "off"

    def how(self) -> str:
        """e.g. ``compiled (reduce-overhead)`` or ``eager: <why>``."""
        how = f"compiled ({self.mode})" if self.compiled else "eager"
        return how + (f": {self.why}" if self.why else "")

    def describe(self) -> str:
        """e.g. ``cohort step, compiled (reduce-overhead)`` or ``engine step, eager: ...``."""
        return f"{self.kind} step, {self.how()}"


def engine_compile_problem(train: TrainConfig) -> str | None:
    """Why an engine step of ``train`` does not compile (None: it does)."""
    if train.workers > 1:
        return f"--workers {train.workers}: DeepSpeed allreduces inside the backward"
    if train.zero_stage > 0:
        return f"--zero-stage {train.zero_stage}: ZeRO hooks every gradient into its partitions"
    if train.precision == "fp16":
        return "--precision fp16: DeepSpeed's loss scaler wraps the step"
    if train.activation_checkpointing:
        return "--activation-checkpointing: its recomputation replays keys outside the graph"
    return None


def step_choice(kind: StepKind, train: TrainConfig, device_type: str) -> StepChoice:
    """The step a trial of step ``kind`` takes on a device of ``device_type`` (``cuda`` or
    ``cpu``); ConfigError for a compile mode the step cannot take."""
    asked = train.compile
    engine_problem = engine_compile_problem(train) if kind == StepKind.ENGINE else None
    if asked == AUTO:
        if device_type != "cuda":
            return StepChoice(kind, "off", "on a CPU compilation costs more than it saves")
        if engine_problem:
            return StepChoice(kind, "off", engine_problem)
        return StepChoice(kind, GPU_MODES[kind])
    if kind == StepKind.ENGINE and asked != "off" and (engine_problem or asked != "default"):
        why = engine_problem or "CUDA graphs would overwrite the outputs DeepSpeed reads"
        raise ConfigError(
            [f"--compile {asked}: this trial trains on a DeepSpeed engine ({why}); use off or auto"]
        )
    return StepChoice(kind, asked)


def planned_step(kind: StepKind, train: TrainConfig, plan) -> StepChoice:
    """The step a trial of step ``kind`` takes under ``plan`` (a ``planner.TrialPlan``: on a
    GPU when it has GPUs, at its ZeRO stage and workers, which the sweep applies)."""
    train = replace(train, zero_stage=plan.zero_stage, workers=plan.workers)
    if train.zero_stage > 0 or train.workers > 1:
        kind = StepKind.ENGINE
    return step_choice(kind, train, "cuda" if plan.gpus else "cpu")


GRAPH_FREE_FIELDS = ("seed", "lr", "max_steps", "eval_every", "log_evals", "patience")
"""Config fields a step's graphs do not depend on (values held in tensors, or the loop's)."""


def graph_signature(configs: list, device: str) -> str:
    """What the compiled graphs of a step of ``configs`` on ``device`` depend on: the first
    config's fields but ``GRAPH_FREE_FIELDS``, every member's trained groups, and K."""
    flat = {k: v for k, v in configs[0].to_flat().items() if k not in GRAPH_FREE_FIELDS}
    groups = sorted({c.train.finetune for c in configs})
    return f"{device} K={len(configs)} {groups} {sorted(flat.items())}"


def compile_errors() -> tuple[type[BaseException], ...]:
    """What compilation raises (dynamo's and inductor's errors: ``InductorError``,
    ``BackendCompilerFailed``, ``Unsupported`` under ``fullgraph``); any other error of a
    compiled call is the step's own and propagates. Looked up when a function is compiled:
    ``torch._dynamo`` is imported on first use, and a process that compiles nothing (a sweep
    driver) is spared its import, about 1.7 s of CPU."""
    return (torch._dynamo.exc.TorchDynamoException,)


def compile_cache() -> Path:
    """The node's compile cache: ``TORCHINDUCTOR_CACHE_DIR`` when set, else ``inductor/`` in
    the node's torch extensions directory (``prebuild.extensions_dir``, where the fused CPU
    kernels are built), set for this process and what it starts. Inductor keeps there its
    FX graph cache (generated code and compiled kernels per graph, keyed on the graph, its
    shapes, the device and the versions) and AOTAutograd's cache: a trial compiling a graph
    that another process of the node compiled loads it instead (both caches are on)."""
    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(extensions_dir() / "inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return Path(directory)


@contextlib.contextmanager
def first_compile(signature: str) -> Iterator[None]:
    """Around the first call of a compiled function of ``signature`` (its step's shapes and
    mode, and the function): the first process of the node to reach it compiles it while
    holding the node's lock for it and leaves a marker; processes that reach it meanwhile
    wait, then compile from the warm cache side by side, so trials started together on a
    fresh node pay one cold compilation, not one each."""
    directory = compile_cache() / "scale_fpt_first"
    directory.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(signature.encode()).hexdigest()[:16]
    marker = directory / f"{name}.done"
    if marker.exists():
        yield
        return
    with FileLock(directory / f"{name}.lock"):
        cold = not marker.exists()
        if cold:
            yield
            marker.touch()
    if not cold:
        yield


class Compilation:
    """The compiled functions of one step (``wrap``). If compiling any of them fails, every
    one runs eagerly from then on, after one warning line; ``compiled`` then says False, and
    the trial's row records it (``step_compiled``). The first call of each pays its
    compilation once per node (``compile_cache``, ``first_compile``); ``signature`` names
    what the graphs depend on (shapes, dtypes, mode).

    A compiled call fails while dynamo compiles a graph, before that graph runs; each of the
    step's functions traces to one graph (no graph breaks: ``tests/test_compile.py``), so
    the eager retry of the call repeats nothing that ran."""

    def __init__(self, mode: str, what: str, signature: str = ""):
        self.mode = mode
        self.what = what
        self.signature = f"{torch.__version__} {what} {mode} {signature}"
        self.failure: str | None = None
        if mode != "off":
            compile_cache()

    @property
    def compiled(self) -> bool:
        """Whether the step's functions run compiled (asked for, and none has failed)."""
        return self.mode != "off" and self.failure is None

    def wrap(self, function: Callable, mode: str | None = None) -> Callable:
        """``function`` compiled in ``mode`` (default: the step's), falling back to itself."""
        mode = self.mode if mode is None else mode
        if mode == "off":
            return function
        compiled = torch.compile(function, mode=mode)
        errors = compile_errors()
        name = getattr(function, "__qualname__", type(function).__name__)
        first = [True]

        def call(*args, **kwargs):
            if self.failure is None:
                try:
                    if first[0]:
                        with first_compile(f"{self.signature} {name} {mode}"):
                            out = compiled(*args, **kwargs)
                        first[0] = False
                        return out
                    return compiled(*args, **kwargs)
                except errors as e:
                    self.fail(e)
            return function(*args, **kwargs)

        return call

    def fail(self, error: BaseException) -> None:
        cause = error  # dynamo wraps the compiler's own error: name that one
        while getattr(cause, "inner_exception", None) or cause.__cause__:
            cause = getattr(cause, "inner_exception", None) or cause.__cause__
        first = str(cause).strip().splitlines()
        self.failure = f"{type(cause).__name__}: {first[0] if first else ''}"[:300]
        log.warning(
            "scale_fpt: compiling the %s (--compile %s) failed (%s); it runs eagerly",
            self.what,
            self.mode,
            self.failure,
        )


__all__ = [
    "Compilation",
    "StepChoice",
    "compile_cache",
    "compile_errors",
    "engine_compile_problem",
    "first_compile",
    "graph_signature",
    "planned_step",
    "step_choice",
]
