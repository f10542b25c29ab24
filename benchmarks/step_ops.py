"""Kernel ops and device syncs per training step, counted on a CPU as a CUDA run dispatches
them (``_launches``: a TorchDispatchMode along the GPU's code path), for each step path:

- ``engine`` / ``engine-compiled``: the DeepSpeed engine step (``steps.engine.EngineStep``,
  ``--compile off`` / ``default``: its module compiled, what ``--compile auto`` runs on a GPU
  for a world-of-one lean engine);
- ``cohort-eager`` / ``cohort-compiled``: the cohort step with one member
  (``steps.cohort.CohortStep``, ``--compile off`` / ``default``; ``auto`` on a GPU is
  ``reduce-overhead``: the same graphs, replayed as CUDA graphs);
- ``baseline``: a plain PyTorch loop written here: Hugging Face's GPT2Model between a linear
  (or embedding) input and a linear output, the same trained groups, autocast, fused Adam,
  ``clip_grad_norm_(foreach=True)``, torch's own dropout and SDPA, counted as CUDA
  dispatches them (``_launches.cuda_kernels``: one ``native_dropout`` per site, one fused
  attention kernel each way).

Compiled, ``kernel_ops_per_step`` counts what runs eagerly around the graphs (with graphs,
graph breaks and recompiles beside) and ``launch_sites_in_graphs_per_step`` the kernel
calls inside the graphs that ran: read from the code inductor generates for each graph, for
the CPU (``cpp_fused_*`` kernels, library calls such as ``mm``, fallback ops): a named
proxy of the GPU's Triton launch sites (inductor emits CUDA code only in a CUDA build of
torch; the CPU backend fuses at least as much as Triton does, so the proxy may count
fewer); ``launch_sites_uncounted_graphs`` names graphs inductor's CPU backend failed on.

    python benchmarks/step_ops.py --path engine --model gpt2 --task bit-xor --batch 4
    python benchmarks/step_ops.py --path all --json      # every path, one JSON object each

At small batch a GPU step is bound by launches and syncs, and these counts are the same on
any machine: tests pin them (``tests/test_step_ops.py``). ``--width W`` builds the model's
depth and heads at width W (the same counts, much faster). Also printed: the non-matmul
bytes per layer of one 1024-token sequence (a batch-1 step of a 1024-token task divided by
the layers; ``--no-bytes`` skips it) and, with ``--time N``, the CPU time per step of the
CPU's own path (median of N steps) against the baseline's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import replace

import _harness as h
import _launches

h.quiet()

import torch  # noqa: E402
from torch import nn  # noqa: E402

from scale_fpt.config import TASKS, TaskConfig, TrialConfig, parse_finetune  # noqa: E402
from scale_fpt.models import build_heads  # noqa: E402
from scale_fpt.models.backbones import load_architecture  # noqa: E402
from scale_fpt.models.groups import freeze  # noqa: E402
from scale_fpt.runtime import DTYPES  # noqa: E402
from scale_fpt.scaling import GPT2_SIZES  # noqa: E402
from scale_fpt.steps import member_losses, model_inputs  # noqa: E402
from scale_fpt.tasks import build_task  # noqa: E402
from scale_fpt.tasks.base import Task  # noqa: E402

PATHS = ("engine", "engine-compiled", "cohort-eager", "cohort-compiled", "baseline")
COMPILED = ("engine-compiled", "cohort-compiled")
GENERATED_TASKS = ("bit-memory", "bit-xor", "listops")
"""Tasks a trial generates itself (drawn on the device); the others read datasets, so the
benchmark trains on ``_harness.SyntheticTask`` data of their shapes."""
WARMUP = {"cohort-compiled": 3, "engine-compiled": 3}
"""Steps before counting (the first steps build optimiser state and compile); default 2."""
COUNTED = 2
BYTES_TASK = "cifar10-lra"  # 1024 tokens per sequence
REGIONS = {
    **{(f, "*"): "data" for f in ("bits.py", "images.py", "listops.py", "homology.py", "pool.py")},
    **{("base.py", f): "data" for f in ("cohort_batch", "epoch_indices", "_permutation")},
    ("__init__.py", "model_inputs"): "data",
    ("_harness.py", "*"): "data",
    ("ops.py", "at"): "keys",
    ("ops.py", "step_keys"): "keys",
    **{(f, "*"): "forward" for f in ("packed.py", "packed_families.py", "fpt.py", "ops.py")},
    ("module.py", "_call_impl"): "forward",
    ("__init__.py", "member_losses"): "loss",
    ("__init__.py", "record"): "metrics",
    ("__init__.py", "grad"): "backward",
    ("_tensor.py", "backward"): "backward",
    ("clip_grad.py", "*"): "optimizer",
    ("adam.py", "*"): "optimizer",
    ("optimizer.py", "*"): "optimizer",
}
"""``--attribute``: the region of a kernel op is that of its innermost caller named here,
``(file name, function name or "*")``."""
TARGETS = {
    ("engine", "fpt"): 700,
    ("engine", "full"): 900,
    ("cohort-compiled", "fpt"): 15,  # eager ops around the graphs
    ("engine-compiled", "fpt"): 15,
}
"""Issues 25 and 35: kernel ops per step of gpt2 bit-xor batch 4 bf16 (0 syncs on every
path)."""
SITE_TARGETS = {("cohort-compiled", "fpt"): 200}
"""Issue 35: kernel launch sites inside the graphs per step, gpt2 bit-xor batch 4 bf16."""
DRAW_TARGET = 5
"""Issue 25: kernel launches per training batch of every task."""


class BaselineStep:
    """A plain PyTorch training loop over the trial's model shape: what the paths are
    compared with."""

    def __init__(self, config: TrialConfig, task: Task):
        from transformers import AutoModel

        self.task, self.batch_size = task, config.train.batch_size
        self.dtype = DTYPES[config.train.precision]
        arch = load_architecture(config.model, "sdpa")
        arch.use_cache = False
        torch.manual_seed(0)
        module = build_heads(task.spec, arch.hidden_size, config.train.seed)
        module.backbone = AutoModel.from_config(arch)
        module.backbone.set_input_embeddings(None)
        freeze(module, config.train.finetune)
        self.module = module.train()
        self.trained = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.trained, lr=config.train.lr, fused=True)
        self.clip = config.train.grad_clip

    def train_step(self, step: int) -> None:
        x, lengths, y = model_inputs(self.task.train_batch(step, self.batch_size), torch.float32)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self.module(x, lengths)
        loss, _ = member_losses(logits[None], y[None])
        loss.sum().backward()
        if self.clip:
            nn.utils.clip_grad_norm_(self.trained, self.clip, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        pass


def narrow_model(model: str, width: int) -> str:
    """A preset with ``model``'s depth and heads at ``width`` (the same kernel counts)."""
    size = GPT2_SIZES[model]
    name = f"{model}-w{width}-narrow"
    GPT2_SIZES[name] = replace(size, n_embd=width, vocab_size=256)
    return name


def make_task(name: str, seed: int, data_dir: str = "") -> Task:
    """The task ``name`` (a dataset's from ``data_dir``; without one, ``SyntheticTask`` data
    of its shapes). Each count makes its own: a task keeps its compiled draws."""
    if name in GENERATED_TASKS or data_dir:
        return build_task(TaskConfig(task=name, data_dir=data_dir), seed).to("cpu")
    return h.SyntheticTask(TaskConfig(task=name), seed)


def make_step(path: str, config: TrialConfig, task: Task):
    from scale_fpt.models import build_model
    from scale_fpt.steps.cohort import CohortStep
    from scale_fpt.steps.engine import EngineStep

    mode = "default" if path in COMPILED else "off"
    config = replace(config, train=replace(config.train, compile=mode))
    if path.startswith("engine"):
        return EngineStep(config.train, task, build_model(config, task.spec))
    if path == "baseline":
        return BaselineStep(config, task)
    return CohortStep([config], task)


def count_path(path: str, config: TrialConfig, task: Task, attribute: bool = False) -> dict:
    """One path's counts per step: ``COUNTED`` steps after the warm-up, each counted alone
    (they must agree: the counts are deterministic); ``attribute``: with the ops of the last
    step by region (``REGIONS``)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    regions = REGIONS if attribute else None
    counter = _launches.LaunchCounter()
    compiled = path in COMPILED
    baseline = _launches.cuda_kernels(counter) if path == "baseline" else contextlib.nullcontext()
    with _launches.gpu_path(counter, sites=compiled) as graphs, baseline:
        step = make_step(path, config, task)
        try:
            warmup = WARMUP.get(path, 2)
            for i in range(warmup):
                step.train_step(i)
            compiled_in_warmup = graphs.compiled
            per_step = []
            for i in range(warmup, warmup + COUNTED):
                counter.__init__(regions)
                with counter:
                    step.train_step(i)
                per_step.append(
                    (
                        counter.kernel_ops,
                        counter.device_syncs,
                        counter.nonmatmul_bytes,
                        counter.graph_calls,
                        sum(counter.launch_sites.values()),
                    )
                )
        finally:
            step.close()
    ops_counts = [p[0] for p in per_step]
    row = {
        "path": path,
        "model": config.model.model,
        "task": config.task.task,
        "batch": config.train.batch_size,
        "precision": config.train.precision,
        "finetune": config.train.finetune,
        "kernel_ops_per_step": per_step[-1][0],
        "device_syncs_per_step": per_step[-1][1],
        "nonmatmul_bytes_per_step": per_step[-1][2],
        "graph_calls_per_step": per_step[-1][3],
        "deterministic": len(set(per_step)) == 1,
        "syncs": dict(counter.syncs),
        "top_ops": dict(counter.ops.most_common(12)),
    }
    if attribute:
        row["ops_by_region"] = dict(counter.regions.most_common())
    if compiled:
        row["launch_sites_in_graphs_per_step"] = per_step[-1][4]
        row["launch_sites_by_kind"] = dict(counter.launch_sites)
        row["launch_sites_of"] = "inductor's CPU code (proxy of the GPU's Triton launches)"
        row["launch_sites_uncounted_graphs"] = graphs.uncounted_graphs
        row["graphs_compiled"] = compiled_in_warmup
        row["recompiles_after_warmup"] = graphs.compiled - compiled_in_warmup
        row["graph_breaks"] = graphs.graph_breaks()
        row["aten_ops_inside_graphs"] = graphs.ops_inside
    if not row["deterministic"]:
        row["kernel_ops_each_step"] = ops_counts
    return row


def count_draw(task: Task, batch_size: int, step: int = 1) -> dict[str, dict]:
    """Kernel launches (eager ops, and one per compiled graph run) and device syncs of one
    training batch of ``task`` along the GPU's path: its ``train_batch`` (a trial alone; the
    engine's) and its ``cohort_batch`` of one member (the cohort's), at ``step``, after the
    batch of ``step - 1`` (which drew the epoch's permutation and compiled the draw)."""
    torch._dynamo.reset()
    counter = _launches.LaunchCounter()
    draws = {
        "train_batch": lambda s: task.train_batch(s, batch_size),
        "cohort_batch": lambda s: task.cohort_batch(s, batch_size, [task.seed]),
    }
    counts = {}
    with _launches.gpu_path(counter):
        for kind, draw in draws.items():
            draw(step - 1)
            counter.__init__()
            with counter:
                draw(step)
            counts[kind] = {
                "launches": counter.kernel_ops + counter.graph_calls,
                "eager_ops": counter.kernel_ops,
                "graph_calls": counter.graph_calls,
                "device_syncs": counter.device_syncs,
                "ops": dict(counter.ops),
                "syncs": dict(counter.syncs),
            }
    return counts


def bytes_per_layer(path: str, config: TrialConfig) -> float:
    """Non-matmul bytes per layer of one 1024-token sequence: a batch-1 step of the
    1024-token task, counted as ``count_path`` counts, divided by the model's layers."""
    config = replace(
        config,
        task=replace(config.task, task=BYTES_TASK),
        train=replace(config.train, batch_size=1),
    )
    row = count_path(path, config, make_task(BYTES_TASK, config.train.seed))
    return row["nonmatmul_bytes_per_step"] / GPT2_SIZES[config.model.model].n_layer


def cpu_seconds_per_step(path: str, config: TrialConfig, task: Task, steps: int) -> float:
    """Median CPU seconds (user + system) per step of the CPU's own path (fused CPU kernels,
    no counting)."""
    step = make_step(path, config, task)
    try:
        return h.time_steps(
            step.train_step, steps, warmup=WARMUP.get(path, 2), clock=time.process_time
        )
    finally:
        step.close()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", default="all", choices=(*PATHS, "all"))
    parser.add_argument("--model", default="gpt2", choices=sorted(GPT2_SIZES))
    parser.add_argument("--task", default="bit-xor", choices=TASKS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--finetune", default="fpt")
    parser.add_argument("--width", type=int, default=0, help="the model's depth at this width")
    parser.add_argument("--no-bytes", action="store_true", help="skip the 1024-token bytes")
    parser.add_argument("--time", type=int, default=0, help="also time N steps per path")
    parser.add_argument("--no-count", action="store_true", help="--time only: no counts")
    parser.add_argument("--json", action="store_true", help="one JSON object per path")
    parser.add_argument(
        "--attribute", action="store_true", help="kernel ops by region of the step (slower)"
    )
    parser.add_argument(
        "--draw", action="store_true", help="count one training batch of --task instead"
    )
    parser.add_argument("--data-dir", default="", help="--draw: the dataset task's data")
    args = parser.parse_args(argv)
    problems = []
    if args.no_count and not args.time:
        problems.append("--no-count: needs --time N (nothing to measure otherwise)")
    if args.draw and args.task not in GENERATED_TASKS and not args.data_dir:
        problems.append(f"--draw --task {args.task}: needs --data-dir (its dataset)")
    if args.batch < 1:
        problems.append(f"--batch: must be >= 1, got {args.batch}")
    try:
        parse_finetune(args.finetune)
    except ValueError as e:
        problems.extend(getattr(e, "problems", [str(e)]))
    if args.width and args.width % GPT2_SIZES[args.model].n_head:
        problems.append(f"--width: must be a multiple of {args.model}'s heads")
    if problems:
        parser.exit(2, "step_ops.py: " + "; ".join(problems) + "\n")
    return args


def print_draw(task: str, batch: int, data_dir: str, as_json: bool) -> None:
    counts = count_draw(make_task(task, 0, data_dir), batch)
    if as_json:
        print(json.dumps({"task": task, "batch": batch, **counts}))
        return
    h.header()
    print(f"\n{task}, batch {batch}: one training batch, counted along the GPU's code path\n")
    h.print_table(
        [{"draw": kind, **row} for kind, row in counts.items()],
        ["draw", "launches", "eager_ops", "graph_calls", "device_syncs"],
    )
    for kind, row in counts.items():
        h.print_target(f"{kind} launches", row["launches"], DRAW_TARGET, "d", True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.draw:
        print_draw(args.task, args.batch, args.data_dir, args.json)
        return 0
    model = narrow_model(args.model, args.width) if args.width else args.model
    config = h.trial_config(
        model, args.task, args.finetune, args.batch, precision=args.precision, accelerator="cpu"
    )
    paths = PATHS if args.path == "all" else (args.path,)
    seed = config.train.seed
    if args.no_count:
        rows = [{"path": path} for path in paths]
    else:
        rows = [
            count_path(path, config, make_task(args.task, seed), args.attribute) for path in paths
        ]
    for row in rows:
        if not args.no_bytes and not args.no_count:
            row["nonmatmul_bytes_per_layer_T1024"] = bytes_per_layer(row["path"], config)
    if args.time:
        task = make_task(args.task, seed)
        baseline = cpu_seconds_per_step("baseline", config, task, args.time)
        for row in rows:
            seconds = (
                baseline
                if row["path"] == "baseline"
                else cpu_seconds_per_step(row["path"], config, task, args.time)
            )
            row["cpu_ms_per_step"] = round(seconds * 1e3, 2)
            row["cpu_time_over_baseline"] = round(seconds / baseline, 2)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    h.header()
    print(
        f"\n{model}, {args.task}, batch {args.batch}, {args.precision}, {args.finetune}: "
        "counted on the CPU along the GPU's code path\n"
    )
    if args.no_count:
        h.print_table(rows, ["path", "cpu_ms_per_step", "cpu_time_over_baseline"])
        return 0
    columns = ["path", "kernel_ops_per_step", "device_syncs_per_step", "deterministic"]
    if not args.no_bytes:
        columns.append("nonmatmul_bytes_per_layer_T1024")
    if args.time:
        columns += ["cpu_ms_per_step", "cpu_time_over_baseline"]
    h.print_table(rows, columns)
    for row in rows:
        print(f"\n{row['path']}: syncs {row['syncs'] or 'none'}; top ops {row['top_ops']}")
        if "ops_by_region" in row:
            print(f"  kernel ops by region {row['ops_by_region']}")
        if "graphs_compiled" in row:
            print(
                f"  graphs {row['graphs_compiled']}, recompiles after warm-up "
                f"{row['recompiles_after_warmup']}, graph breaks {row['graph_breaks']}, "
                f"aten ops inside the graphs before fusion {row['aten_ops_inside_graphs']}; "
                f"launch sites inside the graphs {row['launch_sites_in_graphs_per_step']} "
                f"{row['launch_sites_by_kind']} ({row['launch_sites_of']}; graphs uncounted "
                f"{row['launch_sites_uncounted_graphs']})"
            )
        if args.model != "gpt2" or args.task != "bit-xor" or args.batch != 4:
            continue
        target = TARGETS.get((row["path"], args.finetune))
        if target:
            h.print_target(
                f"{row['path']} kernel ops", row["kernel_ops_per_step"], target, "d", True
            )
        target = SITE_TARGETS.get((row["path"], args.finetune))
        if target:
            h.print_target(
                f"{row['path']} launch sites in graphs",
                row["launch_sites_in_graphs_per_step"],
                target,
                "d",
                True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
