"""The sweep driver at 10^2 to 10^4 trials: what `scale-fpt sweep` spends per trial besides
the trials' own training, and whether that grows with the sweep.

    python benchmarks/driver_scale.py                          # 10^2, 10^3, 10^4 trials
    python benchmarks/driver_scale.py --sizes 100,1000 --json  # figures as JSON too
    python benchmarks/driver_scale.py --quick                  # 4 and 8 trials (the test)

For each size N it writes a sweep file of N short trials (gpt2-tiny, random init, Bit XOR,
``--steps`` steps and one evaluation of one validation and one test batch; 10 learning
rates x N/10 seeds), runs the user's command, ``python -m scale_fpt.cli sweep FILE
--results DIR``, on a fresh local Ray instance (``end_to_end.py``'s launch, watcher and
kernels built before the clock), and prints per size:

- wall seconds from the command to the last trials row with a final status;
- the trials' own training and evaluation seconds, summed from their rows (``wall_time_s``);
- the driver's overhead per trial: (wall to the last row - training summed / slots) / N,
  where slots is the number of trials Ray runs at once (one per core here);
- the driver process's CPU seconds per trial and its peak RSS, and the same for Ray's
  processes (every descendant of the driver: GCS, raylet, workers), sampled every second;
- the progress lines the command printed (one per ``SCALE_FPT_PROGRESS_EVERY`` seconds,
  plus one per finished trial), and Ray Tune's experiment state: its size at the end and how
  often it was saved (the driver's last progress line says);
- the growth of the overhead per trial (and of the driver's CPU per trial) from one size
  to the next: 1.00 is linear, the issue's bound is 1.10.

``--pack 1`` (the default) runs one Ray Tune trial per trial: the driver's worst case, what
a grid that cannot pack (or a search, or ASHA) gives. ``--pack auto`` is what users run;
with random initialisation each seed's learning rates share a cohort (10 trials per Tune
trial).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import _harness as h
import end_to_end as e2e
import psutil
import yaml

LRS = 10
STATUS_LINE = re.compile(r"^\[scale-fpt\] \S+: trials \d+ done")
STATE_SAVES = re.compile(r"experiment state saved (\d+) times")


def sweep_yaml(name: str, n_trials: int, steps: int, pack: str) -> str:
    """``n_trials`` = learning rates x seeds of the shortest trial that trains and evaluates."""
    lrs = min(LRS, n_trials)
    if n_trials % lrs:
        raise SystemExit(f"--sizes: {n_trials} is not a multiple of {lrs} learning rates")
    sweep = {
        "name": name,
        "base": {
            "task": "bit-xor",
            "model": "gpt2-tiny",
            "init": "random",
            "max_steps": steps,
            "eval_every": steps,
            "log_evals": False,
            "batch_size": 4,
            "val_batches": 1,
            "test_batches": 1,
            "precision": h.PRECISION,
        },
        "grid": {"lr": [float(f"{1e-4 * (1 + i):.3g}") for i in range(lrs)]},
        "seeds": list(range(n_trials // lrs)),
        "pack": pack if pack == "auto" else int(pack),
    }
    return yaml.safe_dump(sweep, sort_keys=False)


class Sampler(threading.Thread):
    """Every second: the driver process's RSS and CPU seconds, and those of its descendants
    (Ray's processes) summed; peaks of RSS, last CPU seconds seen per process."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.driver = psutil.Process(pid)
        self.driver_rss = self.ray_rss = 0
        self.driver_cpu = 0.0
        self.ray_cpu: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                times = self.driver.cpu_times()
                self.driver_cpu = times.user + times.system
                self.driver_rss = max(self.driver_rss, self.driver.memory_info().rss)
                children = self.driver.children(recursive=True)
            except psutil.Error:  # the driver exited
                return
            rss = 0
            for child in children:
                try:
                    times = child.cpu_times()
                    self.ray_cpu[child.pid] = times.user + times.system
                    rss += child.memory_info().rss
                except psutil.Error:
                    continue
            self.ray_rss = max(self.ray_rss, rss)


@dataclass
class Size:
    trials: int
    tune_trials: int
    wall_to_last_row_s: float
    exit_s: float
    training_summed_s: float
    slots: int
    overhead_per_trial_s: float
    driver_cpu_s: float
    driver_cpu_per_trial_ms: float
    driver_peak_rss_mb: float
    ray_cpu_s: float
    ray_peak_rss_mb: float
    progress_lines: int
    status_lines: int
    experiment_state_mb: float
    experiment_state_saves: int | None
    load_average: tuple[float, float]
    """1-minute load average at the start and at the end of the run."""


def run_size(args, n_trials: int, work: Path) -> Size:
    name = f"drive-{n_trials}"
    sweep_file = work / "sweep.yaml"
    sweep_file.write_text(sweep_yaml(name, n_trials, args.steps, args.pack))
    results = work / "results"
    log_path = work / "sweep.log"
    env = e2e.sweep_env()
    command = [sys.executable, "-m", "scale_fpt.cli", "sweep", str(sweep_file)]
    command += ["--results", str(results)]
    watcher = e2e.TrialsWatcher(results / name / "trials")
    load_start = os.getloadavg()[0]
    with open(log_path, "w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=e2e.REPO, env=env, stdout=log, stderr=log)
        sampler = Sampler(process.pid)
        sampler.start()
        try:
            _, last_row = e2e.wait_for_rows(process, watcher, n_trials, start)
            process.wait()
        finally:
            e2e.stop(process)
            sampler.done.set()
        exit_s = time.perf_counter() - start
    if process.returncode != 0 or last_row is None:
        raise RuntimeError(
            f"the sweep command exited {process.returncode} ({' '.join(command)}); its output "
            f"ends:\n{log_path.read_text()[-4000:]}"
        )
    import pandas as pd

    trials = pd.read_parquet(results / name / "trials")
    problems = e2e.row_problems(trials, n_trials)
    if problems:
        raise RuntimeError(f"{n_trials} trials: " + "; ".join(problems))
    lines = log_path.read_text().splitlines()
    saves = [int(m.group(1)) for line in lines if (m := STATE_SAVES.search(line))]
    state = list((results / "_ray" / name).glob("experiment_state-*.json"))
    training = e2e.cohort_work_seconds(trials)
    slots = os.cpu_count() or 1
    return Size(
        trials=n_trials,
        tune_trials=len(e2e.cohort_sizes(trials)),
        wall_to_last_row_s=last_row,
        exit_s=exit_s,
        training_summed_s=training,
        slots=slots,
        overhead_per_trial_s=(last_row - training / slots) / n_trials,
        driver_cpu_s=sampler.driver_cpu,
        driver_cpu_per_trial_ms=1000 * sampler.driver_cpu / n_trials,
        driver_peak_rss_mb=sampler.driver_rss / 2**20,
        ray_cpu_s=sum(sampler.ray_cpu.values()),
        ray_peak_rss_mb=sampler.ray_rss / 2**20,
        progress_lines=sum(line.startswith("[scale-fpt]") for line in lines),
        status_lines=sum(bool(STATUS_LINE.match(line)) for line in lines),
        experiment_state_mb=sum(p.stat().st_size for p in state) / 2**20,
        experiment_state_saves=saves[-1] if saves else None,
        load_average=(load_start, os.getloadavg()[0]),
    )


def growth(sizes: list[Size], figure: str) -> list[str]:
    """Each size's ``figure`` over the previous size's: 1.00 is linear in the trials."""
    ratios = [""]
    for before, after in itertools.pairwise(sizes):
        ratios.append(f"{getattr(after, figure) / getattr(before, figure):.2f}")
    return ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma list of trial counts")
    parser.add_argument("--steps", type=int, default=2, help="training steps per trial")
    parser.add_argument("--pack", default="1", help="the sweep's pack: 1 (default), auto or K")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep each size's folder")
    parser.add_argument("--quick", action="store_true", help="4 and 8 trials (the test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = "4,8"
    sizes = [int(s) for s in args.sizes.split(",")]
    h.header()
    print(
        f"sweeps of {', '.join(f'{n:,}' for n in sizes)} trials: gpt2-tiny bit-xor, random "
        f"init, {args.steps} steps, one evaluation (1 val + 1 test batch), "
        f"{min(LRS, sizes[0])} lrs x N/{min(LRS, sizes[0])} seeds, pack {args.pack}, "
        f"{h.PRECISION}; python -m scale_fpt.cli sweep FILE --results DIR on a fresh local Ray"
    )
    e2e.prebuild(e2e.sweep_env())
    measured: list[Size] = []
    for n_trials in sizes:
        with e2e.scratch(f"scale_fpt_driver_{n_trials}_", args.keep) as work:
            measured.append(run_size(args, n_trials, work))
        # Each size's figures as soon as measured: a long run stopped later keeps them.
        print(f"done: {json.dumps(asdict(measured[-1]))}", flush=True)
    overhead_growth = growth(measured, "overhead_per_trial_s")
    cpu_growth = growth(measured, "driver_cpu_per_trial_ms")
    rows = [
        {
            "trials": f"{s.trials:,} ({s.tune_trials:,} Tune)",
            "to last row s": f"{s.wall_to_last_row_s:.1f}",
            "training summed s": f"{s.training_summed_s:.1f}",
            "overhead / trial s": f"{s.overhead_per_trial_s:.3f}",
            "growth": overhead_growth[k],
            "driver CPU / trial ms": f"{s.driver_cpu_per_trial_ms:.1f}",
            "CPU growth": cpu_growth[k],
            "driver peak MB": f"{s.driver_peak_rss_mb:.0f}",
            "Ray CPU s / peak MB": f"{s.ray_cpu_s:.0f} / {s.ray_peak_rss_mb:.0f}",
            "progress lines (status)": f"{s.progress_lines} ({s.status_lines})",
            "state MB / saves": f"{s.experiment_state_mb:.1f} / {s.experiment_state_saves}",
            "load avg": f"{s.load_average[0]:.1f}-{s.load_average[1]:.1f}",
        }
        for k, s in enumerate(measured)
    ]
    h.print_table(rows, list(rows[0]))
    worst = max((float(g) for g in overhead_growth[1:]), default=None)
    if worst is not None:
        verdict = "meets" if worst <= 1.10 else "misses"
        print(f"target: overhead per trial grows at most 10% per size: worst {worst:.2f} {verdict}")
    if args.json:
        print(json.dumps([asdict(s) for s in measured]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
