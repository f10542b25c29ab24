"""How reading a results folder grows with its trials, per file layout.

    python benchmarks/results_scale.py                    # 10^2 .. 10^5 trials
    python benchmarks/results_scale.py --quick            # 10^2 and 10^3
    python benchmarks/results_scale.py --baseline-code /path/to/other/checkout

For each size, folders built by ``_study_folders.build_results_folder`` (the local preset's
arms as more seeds, up to 1,000 per arm, ``--evals`` evaluations per curve) in both layouts:
``per-trial`` (one file per trial and table, as a running sweep writes) up to
``--per-trial-max`` trials, and ``compacted`` (as the driver or ``scale-fpt results
compact`` leaves it). Printed per folder: files, ``load_results`` seconds and the peak
memory of the process that ran it (a fresh one per measurement: ``ru_maxrss``; the median
wall and CPU seconds of ``--repeats`` loads, and the loading thread's wall split by the
kernel's schedstat into its time on a CPU, ``load_waiting_s`` (runnable, waiting for a CPU
that other work held: the machine's load) and ``load_blocked_s`` (neither: file reads, other
threads); on a shared machine CPU seconds are the steadier, and on an idle one the wall is
about the CPU seconds plus the blocked ones),
``pd.read_parquet`` of each table directory, and, for per-trial folders, the seconds of
``scale-fpt results compact`` on it. ``--baseline-code DIR`` also times ``load_results``
of the checkout at DIR on the same folders (the code before a change). Targets on a
2-core machine: 10^4 trials <= 2 s, 10^5 <= 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _study_folders import build_results_folder

ROOT = Path(__file__).resolve().parents[1]
ARMS = 5  # the local scale preset's arms

MEASURE = """
import json, pathlib, resource, statistics, sys, time
import pandas as pd
from scale_fpt.results import load_results
folder, repeats = pathlib.Path(sys.argv[1]), int(sys.argv[2])

def main_thread():
    # (seconds on a CPU, seconds runnable but waiting for a CPU) of this thread (the kernel's
    # schedstat: the run-queue delay is the time others' work held the CPUs).
    running, waiting = pathlib.Path("/proc/thread-self/schedstat").read_text().split()[:2]
    return int(running) / 1e9, int(waiting) / 1e9

walls, cpus, waits, blocked = [], [], [], []
for _ in range(repeats):
    results = None  # the peak is one load's, not two side by side
    wall, cpu, (ran, wait) = time.perf_counter(), time.process_time(), main_thread()
    results = load_results(folder)
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
    ran, wait = (b - a for a, b in zip((ran, wait), main_thread()))
    waits.append(wait)
    blocked.append(walls[-1] - ran - wait)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.perf_counter()
for sweep in sorted(p for p in folder.iterdir() if not p.name.startswith("_")):
    pd.read_parquet(sweep / "trials"), pd.read_parquet(sweep / "curves")
print(json.dumps({"load_s": statistics.median(walls), "load_cpu_s": statistics.median(cpus),
    "load_waiting_s": statistics.median(waits), "load_blocked_s": statistics.median(blocked),
    "pandas_s": time.perf_counter() - start, "trials_read": len(results.trials),
    "curves_read": len(results.curves), "peak_mb": peak}))
"""


def measure(folder: Path, code: Path, repeats: int) -> dict:
    """``load_results`` (median wall and CPU seconds of ``repeats``, the peak memory) and
    pandas on ``folder``, in a fresh process running the checkout ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", MEASURE, str(folder), str(repeats)]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def files(folder: Path) -> int:
    return sum(len(os.listdir(t)) for t in folder.glob("*/trials")) + sum(
        len(os.listdir(t)) for t in folder.glob("*/curves")
    )


def compact_seconds(folder: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "scale_fpt.cli", "results", "compact", str(folder)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--quick", action="store_true", help="sizes 100 and 1000")
    parser.add_argument("--per-trial-max", type=int, default=10_000)
    parser.add_argument("--sweeps", type=int, default=1)
    parser.add_argument("--evals", type=int, default=20)
    parser.add_argument("--baseline-code", default="", help="another checkout to time too")
    parser.add_argument("--repeats", type=int, default=3, help="loads timed per folder")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [100, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            seeds = max(1, min(1000, size // ARMS))
            for layout in ("per-trial", "compacted"):
                if layout == "per-trial" and size > args.per_trial_max:
                    continue
                folder = Path(tmp) / f"{layout}-{size}"
                start = time.perf_counter()
                build_results_folder(
                    folder, size, seeds, args.sweeps, args.evals, compacted=layout == "compacted"
                )
                row = {"trials": size, "seeds_per_arm": seeds, "layout": layout}
                row["build_s"] = time.perf_counter() - start
                row["files"] = files(folder)
                row.update(measure(folder, ROOT, args.repeats))
                if args.baseline_code:
                    baseline = measure(folder, Path(args.baseline_code), args.repeats)
                    row["baseline_load_s"] = baseline["load_s"]
                    row["baseline_load_cpu_s"] = baseline["load_cpu_s"]
                if layout == "per-trial":
                    row["compact_s"] = compact_seconds(folder)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"python benchmarks/results_scale.py {' '.join(sys.argv[1:])}")
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
    columns = ["trials", "layout", "files", "load_s", "load_cpu_s", "load_waiting_s"]
    columns += ["load_blocked_s", "peak_mb", "pandas_s"]
    columns.append("compact_s")
    if args.baseline_code:
        columns[7:7] = ["baseline_load_s", "baseline_load_cpu_s"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [
            f"{row[c]:.2f}" if isinstance(row.get(c), float) else str(row.get(c, ""))
            for c in columns
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
