"""Training-step throughput at the hardware limit: tokens/s, FLOP/s and model FLOP
utilisation (MFU) of one training step, side by side: on a GPU against the device's
published dense peak (``gpus.CHIPS``), with the matmul rate measured in the same
run beside it; on a CPU against that measured rate.

    python benchmarks/step_throughput.py                      # the README's table
    python benchmarks/step_throughput.py --quick              # a short smoke run

Rows: GPT-2 presets (random init) x tasks (bit-xor 10 tokens, cifar10 64, cifar10-lra 1024)
x fine-tuning (fpt: frozen body, 4N + attention FLOPs; full: 6N + attention) x path:
``trial`` is the DeepSpeed step (``scale_fpt.steps.engine.EngineStep``: what trials that
need an engine run), ``packed`` is the cohort step (``scale_fpt.steps.cohort.CohortStep``)
with one member: what an unpacked packable trial runs.
On a GPU: bf16, SDPA attention, the packed path compiled (``--compile reduce-overhead``:
CUDA graphs); on a CPU: fp32, eager.

Data (``--data real``, the default): each task as a trial builds it, held and drawn on the
device (``Task.to``): bit tasks drawn per step, image tasks from a CIFAR-10-shaped dataset of
random images written to Parquet first (``--images``) and read by the real loader, CIFAR's
augmentation included. The ``data`` column is the median time of making one training batch
alone over the median step time: the share of the step spent on data. ``--data synthetic``
cycles through batches made once (no per-step data work).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import traceback

import _harness as h

h.quiet()

import torch  # noqa: E402

from scale_fpt.config import COMPILE_MODES  # noqa: E402

TARGET_MFU = 0.8
TARGET_DATA_SHARE = 0.05
TARGET_STEPS_PER_S = {("gpt2", "bit-xor", "fpt", 4): 300.0}
"""Issue 20: steps/s of one unpacked trial (the K = 1 cohort, ``packed`` path, what a
packable trial alone runs), keyed (model, task, finetune, batch)."""
TARGET_PATH_MFU = {
    ("gpt2-medium", "cifar10-lra", "fpt", 16): 0.5,
    ("gpt2-medium", "cifar10-lra", "full", 16): 0.4,
}
"""Issue 20: MFU of every path of a row keyed (model, task, finetune, batch), bf16 on the
lent H100 (published dense peak as the denominator)."""


def run_trial_path(config, task, steps: int, warmup: int) -> tuple[float, int]:
    from scale_fpt.models import build_model
    from scale_fpt.steps.engine import EngineStep

    with h.PeakMemory() as mem:
        built = build_model(config, task.spec)
        trainer = EngineStep(config.train, task, built)
        try:
            seconds = h.time_steps(trainer.train_step, steps, warmup)
        finally:
            trainer.close()
    del trainer, built
    return seconds, mem.peak_bytes


def run_packed_path(config, task, steps: int, warmup: int, compile_mode: str):
    from dataclasses import replace

    from scale_fpt.steps.cohort import CohortStep

    config = replace(config, train=replace(config.train, compile=compile_mode))
    with h.PeakMemory() as mem:
        cohort = CohortStep([config], task)
        try:
            seconds = h.time_steps(cohort.train_step, steps, warmup)
        finally:
            cohort.close()
    del cohort
    return seconds, mem.peak_bytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2-tiny,gpt2")
    parser.add_argument("--tasks", default="bit-xor,cifar10,cifar10-lra")
    parser.add_argument("--finetune", default="fpt,full")
    parser.add_argument("--paths", default="trial,packed", help="trial, packed (fpt only)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.1, help="backbone dropout (paper 0.1)")
    parser.add_argument(
        "--lra-batch-size",
        type=int,
        default=0 if h.CUDA else 2,
        help="batch for cifar10-lra (0: --batch-size; default 2 on a CPU, where 16 x 1024 "
        "tokens of gpt2 activations exceed 24 GiB)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default=h.PACKED_COMPILE,
        help=f"--compile of the packed path (default here: {h.PACKED_COMPILE}; "
        "reduce-overhead on a GPU, off on a CPU)",
    )
    h.add_data_arguments(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: batch 4 (2 on cifar10-lra), 2+1 steps, 200 images",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.lra_batch_size, args.steps, args.warmup = 4, 2, 2, 1
        args.peak_seconds = min(args.peak_seconds, 1.0)
    if args.threads:
        torch.set_num_threads(args.threads)

    h.header()
    # Imports, the process group and DeepSpeed's first engine are one-time costs: pay them
    # before the first row so that its time and memory are the step's alone.
    warm = h.trial_config("gpt2-tiny", "bit-xor", "fpt", 2)
    if args.paths.split(",")[0] == "trial":
        run_trial_path(warm, h.SyntheticTask(warm.task, seed=0), 1, 1)
    else:
        run_packed_path(warm, h.SyntheticTask(warm.task, seed=0), 1, 1, args.compile)
    image_dir = h.prepare_data(args, args.tasks.split(","))
    print(
        f"precision {h.PRECISION}; dropout {args.dropout}; memory: {h.memory_kind()}; "
        f"step time: median of {args.steps} after {args.warmup} warm-up"
    )
    print()
    rows = []
    data_shares = {}  # (model, task) -> largest share of a step spent making its batch
    frozen_mfu = []  # (path, MFU) of frozen gpt2 on 64 tokens, for the target
    targets = []  # (what, value, target) of issue 20's rows
    failed = []  # the rows whose path raised
    for model in args.models.split(","):
        for task_name in args.tasks.split(","):
            batch = (
                args.lra_batch_size
                if task_name == "cifar10-lra" and args.lra_batch_size
                else args.batch_size
            )
            task = h.benchmark_task(task_name, image_dir)
            if args.data == "real":
                data_seconds = h.time_steps(
                    lambda step, task=task, batch=batch: task.train_batch(step, batch),
                    args.steps,
                    args.warmup,
                )
            for finetune in args.finetune.split(","):
                for path in args.paths.split(","):
                    if path == "packed" and finetune != "fpt":
                        continue
                    config = h.trial_config(model, task_name, finetune, batch, dropout=args.dropout)
                    # The peak is timed right before and after each row: on a shared machine
                    # the reachable rate drifts (115 vs 201 GFLOP/s within one run here), so
                    # each row's MFU divides by the peak of its own minutes (the higher one).
                    rounds_before, how = h.matmul_rounds(args.peak_seconds)
                    label = f"{model} {task_name} {finetune} batch {batch}, {path} path"
                    try:
                        if path == "trial":
                            seconds, memory = run_trial_path(config, task, args.steps, args.warmup)
                        else:
                            seconds, memory = run_packed_path(
                                config, task, args.steps, args.warmup, args.compile
                            )
                    except Exception as error:  # one path's failure leaves the other rows
                        traceback.print_exc()
                        failed.append(f"{label}: {type(error).__name__}: {error}")
                        continue
                    gc.collect()
                    rounds_after, _ = h.matmul_rounds(args.peak_seconds)
                    peaks = h.Peaks(statistics.median(rounds_before + rounds_after), how)
                    flops = h.flops_per_step(config)  # model FLOPs: one definition, both paths
                    mfu = flops / seconds / peaks.mfu_peak
                    tokens = batch * task.spec.n_tokens
                    if args.data == "real":
                        key = (model, task_name)
                        data_shares[key] = max(data_shares.get(key, 0), data_seconds / seconds)
                    if model == "gpt2" and task.spec.n_tokens == 64 and finetune == "fpt":
                        frozen_mfu.append((path, mfu))
                    key = (model, task_name, finetune, batch)
                    if key in TARGET_STEPS_PER_S and path == "packed":
                        targets.append((f"{label}: steps/s", 1 / seconds, TARGET_STEPS_PER_S[key]))
                    if key in TARGET_PATH_MFU:
                        targets.append((f"{label}: MFU", mfu, TARGET_PATH_MFU[key]))
                    of_matmul = {"of matmul": f"{flops / seconds / peaks.measured:.1%}"}
                    rows.append(
                        {
                            "model": model,
                            "task": task_name,
                            "tokens": task.spec.n_tokens,
                            "finetune": finetune,
                            "path": path,
                            "batch": batch,
                            "ms/step": f"{seconds * 1e3:.1f}",
                            "steps/s": f"{1 / seconds:.3g}",
                            "tokens/s": h.si(tokens / seconds),
                            "FLOP/step": h.si(flops),
                            "FLOP/s": h.si(flops / seconds),
                            "matmul rate": h.si(peaks.measured),
                            "MFU": f"{mfu:.1%}",
                            **(of_matmul if peaks.published else {}),
                            **(
                                {"data": f"{data_seconds / seconds:.1%}"}
                                if args.data == "real"
                                else {}
                            ),
                            "peak mem": h.si(memory, "B"),
                        }
                    )
                    # Each row as it completes, so a run cut short (e.g. out of memory) keeps them.
                    print(
                        f"  done {model} {task_name} {finetune} {path}: {seconds * 1e3:.1f} ms/step,"
                        f" {h.si(flops / seconds)}FLOP/s",
                        file=sys.stderr,
                        flush=True,
                    )
    for line in failed:
        print(f"FAILED row: {line}")
    if not rows:
        return 1
    print(
        f"matmul rate per row: {how} over {args.peak_seconds} s before and after the row; "
        f"MFU denominator: {peaks.denominator()}"
    )
    print()
    h.print_table(rows, list(rows[0]))
    print()
    print("MFU = (model FLOPs of the step / median step time) / MFU denominator; model FLOPs")
    print("from scale_fpt.scaling for both paths (4N + attention with the body frozen, 6N +")
    print("attention full; checked against torch's FlopCounterMode in tests/test_flops.py).")
    for path, mfu in frozen_mfu:
        h.print_target(f"frozen gpt2, 64 tokens, {path} path: MFU", mfu, TARGET_MFU, ".1%")
    for what, value, target in targets:
        h.print_target(what, value, target, ".1%" if "MFU" in what else ".1f")
    for (model, task_name), share in data_shares.items():
        what = f"{model} {task_name}: share of the step making data"
        h.print_target(what, share, TARGET_DATA_SHARE, ".1%", at_most=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
