"""Packed cohorts vs one trial per process: trial-steps per second for K = 1, 4, 16, against
two baselines measured in the same run: one DeepSpeed trial per process (the trial path)
and one K=1 cohort per process (the packed code with nothing packed).

    python benchmarks/packing.py                 # the README's table
    python benchmarks/packing.py --quick         # a short smoke run

For each model, task and K, the machine runs what a sweep runs on it: P processes side by
side (P = the core count on a CPU, each with cores / P threads, as Ray places trials of one
CPU each; one process on a GPU), and each process trains either

- packed: one ``scale_fpt.steps.cohort.CohortStep`` of K frozen-body trials (finetune fpt, batch 4
  each, learning rates spread over the cohort) over one shared frozen backbone, or
- unpacked: one trial, ``scale_fpt.steps.engine.EngineStep`` on DeepSpeed.

trial-steps/s = training steps per second summed over trials and processes, from each
process's median step time (the median resists bursts of other load on a shared machine):
sum of K / median over packed processes, sum of 1 / median over unpacked ones. The
processes build and warm up, then time their steps together (a barrier), and stay busy
until all have finished timing.

Data (``--data real``, the default): each task as a trial builds it, on the device (bit
tasks drawn per step, for all K members of a cohort at once; cifar10 from a dataset of
random images written to Parquet first, augmented), so both arms pay for their batches;
``--data synthetic`` cycles through batches made once.

Packed MFU counts model FLOPs, the same definition for every path: each trial's 4N +
attention (``profile.step_flops``), over the device's published dense peak on a GPU, the
measured matmul rate on a CPU (printed beside either way).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time

import _harness as h

h.quiet()

import torch  # noqa: E402

TARGET_TINY_SPEEDUP = 5.0
TARGET_MFU = 0.8
TARGET_PLANNED = {"trial-steps/s": 5000.0, "vs K=1 cohort": 100.0}
"""Issue 20, gpt2 on bit-xor and bit-memory with K from the memory plan (``--k plan``): the
packed cohort's trial-steps/s, and its ratio to one trial per GPU (the K = 1 cohort, what a
packable trial alone runs)."""
PLANNED_TASKS = ("bit-xor", "bit-memory")


def planned_k(model: str, task: str, batch: int, dropout: float, procs: int) -> int:
    """K of ``--k plan``: the members that fit beside one frozen body in this device's
    memory (a GPU's, or the host's RAM on a CPU) shared by ``procs`` processes, by the
    planner's count (``TrialProfile.cohort_memory_parts``, ``planner.members_that_fit``):
    what ``--pack auto`` would put in one cohort."""
    import psutil

    from scale_fpt import planner
    from scale_fpt.profile import profile_of

    member = member_configs(model, task, 1, batch, dropout)[0].to_flat()
    if h.CUDA:
        device = torch.cuda.get_device_properties(0).total_memory
    else:
        device = psutil.virtual_memory().total
    parts = profile_of(member).cohort_memory_parts(h.CUDA and planner.gpu_fuses_attention())
    return max(1, planner.members_that_fit(*parts, device // procs, gpu=h.CUDA))


def member_configs(
    model: str, task: str, k: int, batch: int, dropout: float, compile: str = "off"
) -> list:
    return [
        h.trial_config(
            model,
            task,
            "fpt",
            batch,
            lr=1e-3 * 10 ** (i / max(k, 1) - 0.5),
            dropout=dropout,
            compile=compile,
        )
        for i in range(k)
    ]


def worker(
    packed, model, task, k, batch, dropout, steps, warmup, threads, image_dir, barrier, results
):
    """One process: a cohort of K (``packed``) or one DeepSpeed trial; build, warm up, wait
    for the other processes, time, and stay busy until they have all finished timing."""
    h.quiet()
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (DeepSpeed prints op builds to stdout)
    torch.set_num_threads(threads)
    data = h.benchmark_task(task, image_dir)
    if packed:
        from scale_fpt.steps.cohort import CohortStep

        configs = member_configs(model, task, k, batch, dropout, h.PACKED_COMPILE)
        runner = CohortStep(configs, data)
    else:
        from scale_fpt.models import build_model
        from scale_fpt.steps.engine import EngineStep

        config = member_configs(model, task, 1, batch, dropout)[0]
        runner = EngineStep(config.train, data, build_model(config, data.spec))
    step = runner.train_step
    for i in range(warmup):
        step(i)
    h.sync()
    barrier.wait()
    times = []
    for i in range(warmup, warmup + steps):
        start = time.perf_counter()
        step(i)
        h.sync()
        times.append(time.perf_counter() - start)
    barrier.wait()
    results.put(statistics.median(times))
    runner.close()


def side_by_side(packed, model, task, k, batch, dropout, steps, warmup, procs, threads, image_dir):
    """Median seconds per step of each of ``procs`` processes running at once."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    args = (packed, model, task, k, batch, dropout, steps, warmup, threads, image_dir)
    args = (*args, barrier, results)
    workers = [ctx.Process(target=worker, args=args) for _ in range(procs)]
    for w in workers:
        w.start()
    medians = []
    while len(medians) < procs:
        try:
            medians.append(results.get(timeout=1.0))
        except queue.Empty:
            # A process that died (its traceback is above) leaves the others at the barrier.
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                for w in workers:
                    w.terminate()
                raise SystemExit(
                    f"a benchmark process exited with code {failed[0]} before timing"
                ) from None
    for w in workers:
        w.join()
    return medians


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2-tiny,gpt2")
    parser.add_argument("--tasks", default="bit-xor,cifar10")
    parser.add_argument(
        "--k", default="1,4,16", help="cohort sizes; 'plan': the memory plan's K on this device"
    )
    parser.add_argument("--max-k", type=int, default=0, help="cap on --k plan (0: none)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1, help="backbone dropout (paper 0.1)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--big-steps", type=int, default=4, help="timed steps for models other than gpt2-tiny"
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help="processes side by side in both arms (0: one per core on a CPU, 1 on a GPU)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="cores to use (0: all), split over the processes"
    )
    parser.add_argument("--peak-seconds", type=float, default=3.0)
    h.add_data_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run: few steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.big_steps, args.warmup = 5, 1, 1
        args.peak_seconds = min(args.peak_seconds, 1.0)
    cores = args.threads or os.cpu_count() or 1
    torch.set_num_threads(cores)
    procs = args.procs or (1 if h.CUDA else cores)
    threads = max(1, cores // procs)

    h.header()
    rounds_start, how = h.matmul_rounds(args.peak_seconds)
    image_dir = h.prepare_data(args, args.tasks.split(","))
    print(
        f"precision {h.PRECISION}; finetune fpt; batch {args.batch_size} per trial; "
        f"dropout {args.dropout}; {procs} processes x {threads} threads in both arms"
    )
    print()
    rows = []
    figures = []  # (model, task, K, speed-up, packed FLOP/s) for the targets
    planned = []  # (task, K, trial-steps/s, vs K=1 cohort) of gpt2 at the plan's K
    for model in args.models.split(","):
        steps = args.steps if model == "gpt2-tiny" else args.big_steps
        for task in args.tasks.split(","):
            common = (args.batch_size, args.dropout, steps, args.warmup, procs, threads, image_dir)
            solo = side_by_side(False, model, task, 1, *common)
            solo_rate = sum(1 / m for m in solo)
            k1 = side_by_side(True, model, task, 1, *common)  # the K=1 cohort baseline
            k1_rate = sum(1 / m for m in k1)
            one = member_configs(model, task, 1, args.batch_size, args.dropout)[0]
            flops = h.flops_per_step(one)
            for k_text in args.k.split(","):
                if k_text == "plan":
                    k = planned_k(model, task, args.batch_size, args.dropout, procs)
                    k = min(k, args.max_k) if args.max_k else k
                else:
                    k = int(k_text)
                medians = k1 if k == 1 else side_by_side(True, model, task, k, *common)
                rate = sum(k / m for m in medians)
                rows.append(
                    {
                        "model": model,
                        "task": task,
                        "K": f"{k} (plan)" if k_text == "plan" else k,
                        "packed ms/step": f"{statistics.median(medians) * 1e3:.1f}",
                        "packed trial-steps/s": f"{rate:.3g}",
                        "packed MFU": rate * flops,  # FLOP/s, divided by the peak below
                        "1/process ms/step": f"{statistics.median(solo) * 1e3:.1f}",
                        "1/process trial-steps/s": f"{solo_rate:.3g}",
                        "vs DeepSpeed trial": f"{rate / solo_rate:.2f}x",
                        "vs K=1 cohort": f"{rate / k1_rate:.2f}x",
                    }
                )
                figures.append((model, task, k, rate / solo_rate, rate * flops))
                if k_text == "plan" and model == "gpt2" and task in PLANNED_TASKS:
                    planned.append((task, k, rate, rate / k1_rate))
                print(f"  done {model} {task} K={k}: {rate / solo_rate:.2f}x", file=sys.stderr)
    rounds_end, _ = h.matmul_rounds(args.peak_seconds)
    peaks = h.Peaks(statistics.median(rounds_start + rounds_end), how + ", before and after")
    peak = peaks.mfu_peak
    print(peaks.describe())
    print()
    for r in rows:
        r["packed MFU"] = f"{r['packed MFU'] / peak:.1%}"
    h.print_table(rows, list(rows[0]))
    print()
    for model, task, k, speedup, flop_rate in figures:
        if k == 16 and model == "gpt2-tiny" and task == "bit-xor":
            h.print_target("gpt2-tiny bit-xor K=16 speed-up", speedup, TARGET_TINY_SPEEDUP, ".2f")
        if k == 16 and model == "gpt2":
            h.print_target(f"gpt2 {task} K=16 packed MFU", flop_rate / peak, TARGET_MFU, ".1%")
    for task, k, rate, ratio in planned:
        what = f"gpt2 {task} K={k} (memory plan)"
        h.print_target(f"{what} trial-steps/s", rate, TARGET_PLANNED["trial-steps/s"], ".0f")
        h.print_target(f"{what} vs one K=1 cohort", ratio, TARGET_PLANNED["vs K=1 cohort"], ".1f")
    return 0


if __name__ == "__main__":
    sys.exit(main())
