"""How long a Chinchilla-form fit with 1,000 bootstrap resamples takes, and whether it
recovers the published laws from data drawn from them.

For each published fit (Hoffmann et al. 2022, Approach 3; Besiroglu et al. 2024's
replication) it draws ``--points`` (N, D, loss) rows from that law over Hoffmann et al.'s
ranges (N 7e7..1.6e10 parameters, D 5e9..5e11 tokens, log-uniform) with log-normal noise
(``--noise``, sd of log loss), fits ``E + A/N^alpha + B/D^beta`` with
``scale_fpt.analysis.fit_scaling_law`` and prints, per parameter, the truth, the estimate
and the 95% bootstrap interval, and the wall time of the point estimate and of the whole
fit (grid screening + L-BFGS-B starts + resamples over ``--workers`` processes).

Target (issue 21): about 250 points with 1,000 resamples in under a minute on 2 cores.

    python benchmarks/scaling_fit.py                 # 250 points, 1,000 resamples, 2 workers
    python benchmarks/scaling_fit.py --quick         # 100 resamples
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import sys
import time

import numpy as np
import pandas as pd

from scale_fpt.analysis import fit_scaling_law
from scale_fpt.analysis.chinchilla import BESIROGLU_2024, HOFFMANN_2022

PUBLISHED = {"Hoffmann et al. 2022": HOFFMANN_2022, "Besiroglu et al. 2024": BESIROGLU_2024}


def draw(law: dict, n: int, noise: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    N = np.exp(rng.uniform(np.log(7e7), np.log(1.6e10), n))
    D = np.exp(rng.uniform(np.log(5e9), np.log(5e11), n))
    loss = law["E"] + law["A"] * N ** -law["alpha"] + law["B"] * D ** -law["beta"]
    return pd.DataFrame({"N": N, "D": D, "loss": loss * np.exp(rng.normal(0, noise, n))})


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished worker processes."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def print_header() -> None:
    """The command, the date (UTC) and the machine with its load: the first lines of every
    scaling benchmark's output."""
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical "
        f"cores, load average {load:.1f} at start"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", type=int, default=250)
    p.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--workers", type=int, default=2, help="processes for the resamples")
    p.add_argument("--noise", type=float, default=0.02, help="sd of log loss")
    p.add_argument("--quick", action="store_true", help="100 resamples")
    args = p.parse_args(argv)
    boot = 100 if args.quick else args.boot
    print_header()
    print(f"{args.points} points, {boot} resamples, {args.workers} worker(s), noise {args.noise}")
    print()
    print("| law | param | truth | estimate | 95% interval | covered |")
    print("|---|---|---|---|---|---|")
    timings = []
    for seed, (name, law) in enumerate(PUBLISHED.items()):
        rows = draw(law, args.points, args.noise, seed)
        start = time.perf_counter()
        fit_scaling_law(rows, "loss", ["N", "D"], "chinchilla", n_boot=0)
        point_s = time.perf_counter() - start
        start, cpu = time.perf_counter(), cpu_seconds()
        fit = fit_scaling_law(
            rows, "loss", ["N", "D"], "chinchilla", n_boot=boot, workers=args.workers
        )
        total_s = time.perf_counter() - start
        timings.append((name, point_s, total_s, cpu_seconds() - cpu, fit.goodness["n_failed"]))
        for param, truth in law.items():
            lo, hi = fit.intervals[param]
            print(
                f"| {name} | {param} | {truth:.4g} | {fit.params[param]:.4g} | "
                f"[{lo:.4g}, {hi:.4g}] | {'yes' if lo <= truth <= hi else 'NO'} |"
            )
    print()
    print("| law | point estimate, wall (s) | with resamples, wall (s) | CPU (s) | failed refits |")
    print("|---|---|---|---|---|")
    for name, point_s, total_s, cpu_s, failed in timings:
        print(f"| {name} | {point_s:.2f} | {total_s:.1f} | {cpu_s:.1f} | {failed} |")
    worst = max(t[2] for t in timings)
    idle = max(t[3] for t in timings) / max(args.workers, 1)
    verdict = "met" if worst < 60 else "NOT met"
    print(
        f"\ntarget: {boot} resamples in < 60 s: slowest {worst:.1f} s wall ({verdict}); CPU "
        f"time / workers = {idle:.1f} s, the wall time on {args.workers} otherwise idle cores"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.1f} (other processes sharing the cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
