"""How the cost of a study grows with it: results folders of 10^2 to 10^5 trials (arms x seeds,
up to 1,000 seeds an arm, 20 evaluations a curve, several sweeps), and for each size the
seconds of ``load_results``, of ``pd.read_parquet`` of each table directory, and of
``scale-fpt report --no-attention`` (a subprocess) with its peak memory, then the growth
exponent between sizes (log time ratio / log trials ratio: 1 is linear). ``--sweeps-apart``
adds the many-sweeps check: ten sweeps in one folder (one large, nine of a twentieth its size
each) reported apart against the largest alone.

The rows are real: one gpt2-tiny Bit XOR trial trained here first (``scale-fpt train``, 20
evaluations), or the rows of ``--template RESULTS``, copied as more seeds of more arms
(task, init, finetune, lr), each copy's accuracies drawn around its arm's mean so that every
comparison has a spread. The files are written with the project's own schema and atomic
writer (``scale_fpt.results``), ``--layout per-trial`` as a sweep writes them today (one file
per trial and table) or ``chunks`` (one file per 1,000 trials and table).

    python benchmarks/study_scale.py                    # 10^2, 10^3, 10^4 (add --sizes 100000)
    python benchmarks/study_scale.py --quick --json     # 100 and 200 trials: the test tier
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from scale_fpt.results import ResultsWriter, load_results, write_atomic
from scale_fpt.results_schema import CURVE_SCHEMA, TRIAL_SCHEMA

TASKS = ("bit-xor", "bit-memory", "listops")
LRS = (1e-3, 3e-4, 1e-4, 3e-3)
FINETUNES = ("fpt", "full")
INITS = ("pretrained", "random")
"""Arms are drawn from these, init fastest: every arm has its pretrained/random partner."""
CHUNK = 1_000
"""Trials per file in ``--layout chunks``."""


DESIGNS = {
    100: (2, 5, 10),
    1_000: (2, 10, 50),
    10_000: (4, 25, 100),
    100_000: (10, 10, 1_000),
}
"""(sweeps, arms a sweep, seeds an arm) of each size in ``--sizes``: seeds grow with the size,
to 1,000 an arm at 10^5 trials."""


def designs(sizes: list[int], most_seeds: int) -> list[dict]:
    """Each size's design: ``DESIGNS``, else 2 sweeps of arms of ``min(most_seeds, 20)``
    seeds; seeds capped at ``most_seeds`` (arms take the rest)."""
    out = []
    for trials in sizes:
        sweeps, arms, seeds = DESIGNS.get(trials, (2, 0, min(most_seeds, 20)))
        if seeds > most_seeds:
            arms, seeds = arms * -(-seeds // most_seeds), most_seeds
        arms = arms or max(2, round(trials / (sweeps * seeds)))
        out.append({"trials": sweeps * arms * seeds, "sweeps": sweeps, "arms": arms,
                    "seeds": seeds})  # fmt: skip
    return out


def template(work: Path, given: str | None, steps: int) -> tuple[dict, pd.DataFrame]:
    """(one trials row as a dict, its curve): from ``given`` (a results folder) or from one
    real trial trained here."""
    if given is None:
        given = str(work / "template")
        subprocess.run(
            [sys.executable, "-m", "scale_fpt.cli", "train", "--task", "bit-xor", "--model",
             "gpt2-tiny", "--init", "random", "--steps", str(steps), "--eval-every",
             str(max(1, steps // 20)), "--test-batches", "2", "--val-batches", "2",
             "--results", given],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    results = load_results(given)
    row = results.trials.iloc[0].to_dict()
    return row, results.curves[results.curves["trial_id"] == row["trial_id"]]


def arms_of(n: int) -> pd.DataFrame:
    """The first ``n`` arms (task, lr, finetune, init; init fastest) with a mean accuracy each."""
    grid = pd.MultiIndex.from_product([TASKS, LRS, FINETUNES, INITS]).to_frame(index=False)
    grid.columns = ["task", "lr", "finetune", "init"]
    grid = pd.concat([grid] * -(-n // len(grid)), ignore_index=True).iloc[:n]
    grid["lr"] = grid["lr"] * (1 + np.arange(n) // (len(TASKS) * len(LRS) * 4) * 0.5)
    grid["mean"] = 0.7 + 0.1 * (grid["init"] == "pretrained") + 0.05 * (grid["finetune"] == "full")
    return grid


def sweep_rows(row: dict, curve: pd.DataFrame, sweep: str, arms: int, seeds: int, rng):
    """(trials, curves) DataFrames of one sweep: every arm x seed a copy of the template,
    accuracies drawn around the arm's mean (seed effect shared by the arm's partner)."""
    grid = arms_of(arms)
    n = arms * seeds
    arm = np.repeat(np.arange(arms), seeds)
    seed = np.tile(np.arange(seeds), arms)
    shared = rng.normal(0, 0.03, seeds)[seed]  # a seed's streams: shared by paired arms
    accuracy = np.clip(grid["mean"].to_numpy()[arm] + shared + rng.normal(0, 0.02, n), 0, 1)
    trials = pd.DataFrame({k: [v] * n for k, v in row.items()})
    for column in ("task", "lr", "finetune", "init"):
        trials[column] = grid[column].to_numpy()[arm]
    trials["sweep"] = sweep
    trials["seed"] = seed
    trials["trial_id"] = [f"{sweep}-{a:04d}-{s:04d}" for a, s in zip(arm, seed, strict=True)]
    for column in ("val_accuracy", "test_accuracy", "best_val_accuracy", "final_test_accuracy",
                   "best_test_accuracy"):  # fmt: skip
        trials[column] = accuracy
    steps = curve["step"].to_numpy()
    shape = 1 - np.exp(-3 * steps / steps.max())  # a saturating learning curve
    values = 0.5 + (accuracy[:, None] - 0.5) * shape[None, :]
    reached = values >= row["accuracy_threshold"]
    trials["steps_to_threshold"] = np.where(reached.any(1), steps[reached.argmax(1)], np.nan)
    curves = pd.DataFrame({k: np.tile(curve[k].to_numpy(), n) for k in curve.columns})
    for column in ("val_accuracy", "test_accuracy", "train_accuracy"):
        curves[column] = values.ravel()
    for column in ("sweep", "trial_id", "task", "lr", "init", "seed"):
        curves[column] = np.repeat(trials[column].to_numpy(), len(steps))
    curves["finetune"] = np.repeat(trials["finetune"].to_numpy(), len(steps))
    return trials, curves


def write_sweep(root: Path, sweep: str, trials: pd.DataFrame, curves: pd.DataFrame,
                layout: str) -> None:  # fmt: skip
    """The sweep's rows under ``root/sweep`` in the project's schema and atomic writes."""
    ResultsWriter(root, sweep)  # the sweep's folders and _schema.json, as a sweep makes them
    base = root / sweep
    per = 1 if layout == "per-trial" else CHUNK
    ids = trials["trial_id"].to_numpy()
    curve_rows = len(curves) // len(trials)
    for start in range(0, len(trials), per):
        name = ids[start] if per == 1 else f"chunk-{start // per:05d}"
        part = trials.iloc[start : start + per]
        write_atomic(pa.Table.from_pandas(part, TRIAL_SCHEMA, preserve_index=False),
                     base / "trials" / f"{name}.parquet")  # fmt: skip
        part = curves.iloc[start * curve_rows : (start + per) * curve_rows]
        write_atomic(pa.Table.from_pandas(part, CURVE_SCHEMA, preserve_index=False),
                     base / "curves" / f"{name}.parquet")  # fmt: skip


def build_folder(root: Path, design: dict, row: dict, curve: pd.DataFrame, layout: str,
                 sizes: list[int] | None = None) -> None:  # fmt: skip
    """A results folder of ``design``'s sweeps (``sizes``: trials a sweep, overriding)."""
    rng = np.random.default_rng(0)
    counts = sizes or [design["arms"]] * design["sweeps"]
    for i, arms in enumerate(counts):
        trials, curves = sweep_rows(row, curve, f"sweep{i:02d}", arms, design["seeds"], rng)
        write_sweep(root, f"sweep{i:02d}", trials, curves, layout)


def report(folder: Path, out: Path, attention: bool = False) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of ``scale-fpt report --no-attention``
    (with ``attention``: the attention maps too) as a subprocess (a watcher process reads
    its child's rusage: only the report's)."""
    script = (
        "import resource, subprocess, sys, time; start = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "use = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(time.perf_counter() - start, use.ru_utime + use.ru_stime, use.ru_maxrss / 1024)"
    )
    command = [sys.executable, "-m", "scale_fpt.cli", "report", str(folder), "--out", str(out)]
    command += [] if attention else ["--no-attention"]
    done = subprocess.run([sys.executable, "-c", script, *command], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    seconds, cpu, peak = done.stdout.split()
    return float(seconds), float(cpu), float(peak)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(folder: Path, work: Path, trials: int) -> dict:
    load = timed(lambda: load_results(folder))
    reads = {}
    for table in ("trials", "curves"):
        reads[table] = sum(timed(lambda d=d: pd.read_parquet(d)) for d in folder.glob(f"*/{table}"))
    seconds, cpu, peak = report(folder, work / f"report-{trials}")
    return {"load_results_s": load, "read_trials_s": reads["trials"],
            "read_curves_s": reads["curves"], "report_s": seconds, "report_cpu_s": cpu,
            "report_peak_mb": peak}  # fmt: skip


def exponent(a: dict, b: dict, key: str) -> float:
    return math.log(b[key] / a[key]) / math.log(b["trials"] / a["trials"])


def many_sweeps(work: Path, largest: int, seeds: int, row, curve, layout: str) -> dict:
    """Ten sweeps (one of ``largest`` trials, nine of a twentieth of it) reported apart, and
    the largest alone: seconds of each report and their ratio."""
    arms = max(2, largest // seeds)
    small = max(2, arms // 20)
    both = work / "ten-sweeps"
    design = {"seeds": seeds}
    build_folder(both, design, row, curve, layout, sizes=[arms] + [small] * 9)
    alone = work / "largest-alone"
    alone.mkdir()
    # A copy, not a link: the loader never follows a link in a results folder.
    shutil.copytree(both / "sweep00", alone / "sweep00")
    ten, ten_cpu, _ = report(both, work / "report-ten")
    one, one_cpu, _ = report(alone, work / "report-one")
    return {"largest_trials": arms * seeds, "other_trials": 9 * small * seeds,
            "ten_sweeps_s": ten, "largest_alone_s": one, "ratio": ten / one,
            "ten_sweeps_cpu_s": ten_cpu, "largest_alone_cpu_s": one_cpu,
            "ratio_cpu": ten_cpu / one_cpu}  # fmt: skip


def attention_cost(work: Path, n: int) -> dict:
    """Seconds of the attention section per trial: ``n`` real gpt2-tiny Bit XOR trials (one
    per learning rate, so ``n`` arms, each checkpointed) reported with and without it."""
    folder = work / "attention"
    for i in range(n):
        subprocess.run(
            [sys.executable, "-m", "scale_fpt.cli", "train", "--task", "bit-xor", "--model",
             "gpt2-tiny", "--init", "random", "--lr", f"{1e-3 * (i + 1):g}", "--steps", "20",
             "--eval-every", "10", "--test-batches", "1", "--val-batches", "1",
             "--results", str(folder), "--checkpoint-dir", str(folder / "checkpoints"),
             "--no-progress"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    without, without_cpu, _ = report(folder, work / "report-no-attention")
    with_, with_cpu, _ = report(folder, work / "report-attention", attention=True)
    return {"trials": n, "with_s": with_, "without_s": without,
            "per_trial_s": (with_ - without) / n, "per_trial_cpu_s": (with_cpu - without_cpu) / n}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000",
                        help="trials per folder, comma-separated (default 100,1000,10000)")  # fmt: skip
    parser.add_argument("--most-seeds", type=int, default=1_000, help="seeds an arm at most")
    parser.add_argument("--layout", choices=("per-trial", "chunks"), default="per-trial")
    parser.add_argument("--template", help="a results folder whose first trial's rows are copied")
    parser.add_argument("--sweeps-apart", type=int, default=0, metavar="TRIALS",
                        help="also time ten sweeps (the largest of TRIALS) against it alone")  # fmt: skip
    parser.add_argument("--attention", type=int, default=0, metavar="N",
                        help="also time the attention maps of N checkpointed real trials")  # fmt: skip
    parser.add_argument("--work", help="where the folders go (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="sizes 100 and 200, 10 seeds")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    sizes = [100, 200] if args.quick else [int(s) for s in args.sizes.split(",")]
    most = 10 if args.quick else args.most_seeds
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        row, curve = template(work, args.template, 40 if args.quick else 200)
        rows = []
        for design in designs(sizes, most):
            folder = work / f"study-{design['trials']}"
            built = timed(lambda f=folder, d=design: build_folder(f, d, row, curve, args.layout))
            rows.append({**design, "build_s": built, **measure(folder, work, design["trials"])})
        for a, b in itertools.pairwise(rows):
            b["exponent_load"] = exponent(a, b, "load_results_s")
            b["exponent_report"] = exponent(a, b, "report_s")
            b["exponent_report_cpu"] = exponent(a, b, "report_cpu_s")
        apart = (many_sweeps(work, args.sweeps_apart, min(most, 100), row, curve, args.layout)
                 if args.sweeps_apart else None)  # fmt: skip
        maps = attention_cost(work, args.attention) if args.attention else None
    context = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} (1 min) at the end",
        "layout": args.layout,
    }
    if args.json:
        print(json.dumps({**context, "sizes": rows, "many_sweeps": apart, "attention": maps}))
        return 0
    print("\n".join(f"{k}: {v}" for k, v in context.items()))
    columns = ["trials", "sweeps", "arms", "seeds", "build_s", "load_results_s", "read_trials_s",
               "read_curves_s", "report_s", "report_cpu_s", "report_peak_mb", "exponent_load",
               "exponent_report", "exponent_report_cpu"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        cells = [r.get(c, math.nan) for c in columns]
        print("| " + " | ".join(f"{c:,.3g}" if isinstance(c, float) else f"{c:,}" for c in cells)
              + " |")  # fmt: skip
    if apart:
        print(f"ten sweeps ({apart['largest_trials']:,} + {apart['other_trials']:,} trials) "
              f"reported apart: {apart['ten_sweeps_s']:.1f} s; the largest alone: "
              f"{apart['largest_alone_s']:.1f} s; ratio {apart['ratio']:.2f} (CPU "
              f"{apart['ten_sweeps_cpu_s']:.1f} / {apart['largest_alone_cpu_s']:.1f} s: "
              f"{apart['ratio_cpu']:.2f}; target <= 2)")  # fmt: skip
    if maps:
        print(f"attention maps of {maps['trials']} trials: report {maps['with_s']:.1f} s with, "
              f"{maps['without_s']:.1f} s without: {maps['per_trial_s']:.2f} s a trial "
              f"({maps['per_trial_cpu_s']:.2f} CPU s; target <= 2)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
