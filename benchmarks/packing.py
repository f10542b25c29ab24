"""Packed cohorts vs one trial per process: trial-steps per second for K = 1, 4, 16.

    python benchmarks/packing.py                 # the README's table
    python benchmarks/packing.py --quick         # a short smoke run

For each model, task and K: K frozen-body trials (finetune fpt, batch 4 each, learning rates
spread over the cohort) trained

- packed: one process, one ``scale_fpt.packing.Cohort`` (shared frozen body, one GEMM per
  frozen matrix for all K members), all of the machine's threads;
- one trial per process: P = min(K, --max-procs) processes run side by side (P defaults to
  the core count on a CPU, 4 per GPU), each one ``scale_fpt.trainer.Trainer`` (DeepSpeed)
  with cores / P threads. More processes than that only time-share the same cores, so this
  is the best the unpacked path can do with K trials on this machine.

trial-steps/s = training steps per second summed over trials, from median step times (the
median resists bursts of other load on a shared machine): K / median packed step; for the
processes, which build, warm up and then time their steps side by side, the sum of
1 / median step over processes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import _harness as h

h.quiet()

import torch  # noqa: E402

from scale_fpt.config import TaskConfig  # noqa: E402

TARGET_TINY_SPEEDUP = 5.0
TARGET_MFU = 0.8


def member_configs(model: str, task: str, k: int, batch: int, dropout: float) -> list:
    return [
        h.trial_config(
            model, task, "fpt", batch, lr=1e-3 * 10 ** (i / max(k, 1) - 0.5), dropout=dropout
        )
        for i in range(k)
    ]


def solo_worker(model, task, batch, dropout, steps, warmup, threads, barrier, results) -> None:
    """One unpacked trial in its own process: build, warm up, wait for the others, time."""
    h.quiet()
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (DeepSpeed prints op builds to stdout)
    torch.set_num_threads(threads)
    from scale_fpt.models import build_model
    from scale_fpt.trainer import Trainer

    config = member_configs(model, task, 1, batch, dropout)[0]
    data = h.SyntheticTask(TaskConfig(task=task), seed=0)
    trainer = Trainer(config.train, data, build_model(config, data.spec))
    for i in range(warmup):
        trainer.train_step(i)
    h.sync()
    barrier.wait()
    times = []
    for i in range(warmup, warmup + steps):
        start = time.perf_counter()
        trainer.train_step(i)
        h.sync()
        times.append(time.perf_counter() - start)
    barrier.wait()  # every process stays busy until all have finished timing
    results.put(statistics.median(times))
    trainer.close()


def one_per_process(
    model, task, k, batch, dropout, steps, warmup, max_procs, cores
) -> tuple[float, int, int]:
    """(trial-steps/s, processes, threads each) of K trials, one per process."""
    procs = max(1, min(k, max_procs))
    threads = max(1, cores // procs)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(
            target=solo_worker,
            args=(model, task, batch, dropout, steps, warmup, threads, barrier, results),
        )
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    medians = [results.get() for _ in workers]
    for w in workers:
        w.join()
    return sum(1 / m for m in medians), procs, threads


def packed(model, task, k, batch, dropout, steps, warmup, compile_model) -> tuple[float, float]:
    """(trial-steps/s, seconds per packed step) of one cohort of K."""
    from scale_fpt.packing import Cohort

    data = h.SyntheticTask(TaskConfig(task=task), seed=0)
    configs = member_configs(model, task, k, batch, dropout)
    cohort = Cohort(configs, task=data, compile=compile_model)
    try:
        seconds = h.time_steps(cohort.train_step, steps, warmup)
    finally:
        cohort.close()
    return k / seconds, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2-tiny,gpt2")
    parser.add_argument("--tasks", default="bit-xor,cifar10")
    parser.add_argument("--k", default="1,4,16")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1, help="backbone dropout (paper 0.1)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--big-steps", type=int, default=5, help="timed steps for models other than gpt2-tiny"
    )
    parser.add_argument(
        "--max-procs",
        type=int,
        default=0,
        help="processes side by side for one-trial-per-process (0: cores on CPU, 4 on a GPU)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="cores to use (0: all): packed threads, "
        "and threads x processes of the one-per-process runs",
    )
    parser.add_argument("--peak-seconds", type=float, default=3.0)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: few steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.big_steps, args.warmup = 5, 1, 1
        args.peak_seconds = min(args.peak_seconds, 1.0)
    cores = args.threads or os.cpu_count() or 1
    torch.set_num_threads(cores)
    max_procs = args.max_procs or (4 if h.CUDA else cores)

    print(f"machine: {h.machine()}")
    peak_start, how = h.matmul_peak(args.peak_seconds)
    print(h.data_note())
    print(
        f"precision {h.PRECISION}; finetune fpt; batch {args.batch_size} per trial; "
        f"dropout {args.dropout}"
    )
    print()
    rows = []
    solo: dict[tuple, tuple[float, int, int]] = {}
    for model in args.models.split(","):
        steps = args.steps if model == "gpt2-tiny" else args.big_steps
        for task in args.tasks.split(","):
            for k in (int(v) for v in args.k.split(",")):
                rate, seconds = packed(
                    model,
                    task,
                    k,
                    args.batch_size,
                    args.dropout,
                    steps,
                    args.warmup,
                    h.CUDA and not args.no_compile,
                )
                one = member_configs(model, task, 1, args.batch_size, args.dropout)[0]
                flops = k * h.flops_per_step(one)
                procs = max(1, min(k, max_procs))
                if (model, task, procs) not in solo:  # K trials over P processes: the same run
                    solo[model, task, procs] = one_per_process(
                        model,
                        task,
                        k,
                        args.batch_size,
                        args.dropout,
                        steps,
                        args.warmup,
                        max_procs,
                        cores,
                    )
                solo_rate, procs, threads = solo[model, task, procs]
                rows.append(
                    {
                        "model": model,
                        "task": task,
                        "K": k,
                        "packed ms/step": f"{seconds * 1e3:.1f}",
                        "packed trial-steps/s": f"{rate:.3g}",
                        "packed MFU": flops / seconds,  # divided by the peak below
                        "1/process: procs x threads": f"{procs} x {threads}",
                        "1/process trial-steps/s": f"{solo_rate:.3g}",
                        "speed-up": f"{rate / solo_rate:.2f}x",
                    }
                )
                print(f"  done {model} {task} K={k}: {rows[-1]['speed-up']}", file=sys.stderr)
    peak_end, _ = h.matmul_peak(args.peak_seconds)
    peak = max(peak_start, peak_end)
    print(
        f"matmul peak: {h.si(peak, 'FLOP/s')} ({how}; the higher of before the rows "
        f"{h.si(peak_start, 'FLOP/s')} and after {h.si(peak_end, 'FLOP/s')})"
    )
    print()
    for r in rows:
        r["packed MFU"] = f"{r['packed MFU'] / peak:.1%}"
    h.print_table(rows, list(rows[0]))
    print()
    for r in rows:
        if r["K"] == 16 and r["model"] == "gpt2-tiny" and r["task"] == "bit-xor":
            value = float(r["speed-up"].rstrip("x"))
            verdict = "meets" if value >= TARGET_TINY_SPEEDUP else "misses"
            print(
                f"target: gpt2-tiny bit-xor K=16 speed-up {r['speed-up']} {verdict} >= {TARGET_TINY_SPEEDUP:g}x"
            )
        if r["model"] == "gpt2" and r["K"] == 16:
            mfu = float(r["packed MFU"].rstrip("%")) / 100
            verdict = "meets" if mfu >= TARGET_MFU else "misses"
            print(
                f"target: gpt2 {r['task']} K=16 packed MFU {r['packed MFU']} {verdict} >= {TARGET_MFU:.0%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
