"""Ray Tune overhead per trial, with actor reuse on: what a sweep spends besides training.

    python benchmarks/ray_overhead.py              # the README's figures
    python benchmarks/ray_overhead.py --quick

Runs N tiny trials (gpt2-tiny, bit-xor, one evaluation each) the way a sweep does (local
``ray.init`` through ``scale_fpt.sweep.connect_ray``, ``tune_trial`` per arm, the Parquet
results callback, ``reuse_actors=True``), then the same N trials as one packed cohort
(the same ``tune_trial`` with every member in one config), and prints

- ray.init: seconds to start the local Ray instance;
- sweep start -> first result: from before ``ray.init`` to the first report of any trial
  (and from ``Tuner.fit()`` to it);
- per-trial start-up: from Tune starting a trial to its first report, minus the seconds the
  trial itself spent training and evaluating (``wall_time_s`` of its curve row): process
  start or actor reuse, model build, DeepSpeed engine, checkpoint and report. The first
  trial of each actor pays the process start and imports; later ones only rebuild.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import _harness as h

h.quiet()


def arms(n: int, steps: int) -> list[dict]:
    return [
        {
            "task": "bit-xor",
            "test_batches": 2,
            "model": "gpt2-tiny",
            "init": "random",
            "batch_size": 4,
            "lr": 1e-3 * (1 + i),
            "max_steps": steps,
            "eval_every": steps,
            "accelerator": "cpu",
        }
        for i in range(n)
    ]


def timing_callback_class():
    from ray import tune

    class Timing(tune.Callback):
        """Driver-side clock of each Tune trial's start and first report."""

        def __init__(self):
            self.started: dict[str, float] = {}
            self.first_result: dict[str, float] = {}
            self.work: dict[str, float] = {}

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started.setdefault(trial.trial_id, time.perf_counter())

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if trial.trial_id in self.first_result:
                return
            self.first_result[trial.trial_id] = time.perf_counter()
            rows = result.get("curve_rows") or [{}]
            self.work[trial.trial_id] = max(r.get("wall_time_s", 0.0) for r in rows)

        def startups(self) -> list[float]:
            """Start-up seconds per trial, in the order the trials started."""
            ids = sorted(self.started, key=self.started.get)
            return [
                self.first_result[i] - self.started[i] - self.work[i]
                for i in ids
                if i in self.first_result
            ]

    return Timing


def run(trainable, param_space: dict, name: str, storage: str, results: str, concurrent: int):
    from ray import tune

    from scale_fpt.results import ResultsWriter
    from scale_fpt.sweep import results_callback_class

    timing = timing_callback_class()()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=param_space,
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=concurrent),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            callbacks=[timing, results_callback_class()(ResultsWriter(results, name))],
            verbose=0,
        ),
    )
    start = time.perf_counter()
    grid = tuner.fit()
    end = time.perf_counter()
    if grid.num_errors:
        raise RuntimeError(f"{grid.num_errors} trial(s) failed; see {storage}/{name}")
    return timing, start, end


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--concurrent", type=int, default=0, help="trials at once (0: one per core)"
    )
    parser.add_argument("--quick", action="store_true", help="4 trials of 5 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.steps = 4, 5
    cores = os.cpu_count() or 1
    concurrent = args.concurrent or cores
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    h.header()
    print(
        f"{args.trials} trials of gpt2-tiny bit-xor, {args.steps} steps + 1 evaluation each, "
        f"{concurrent} at a time, reuse_actors=True, 1 CPU per trial"
    )
    from scale_fpt.prebuild import prebuild_ops
    from scale_fpt.sweep import connect_ray, tune_trial

    prebuild_ops()  # DeepSpeed's one-time op build is not a per-sweep cost
    work = tempfile.mkdtemp(prefix="scale_fpt_ray_bench_")
    sweep_start = time.perf_counter()
    connect_ray(num_cpus=cores)
    ray_init = time.perf_counter() - sweep_start
    import ray
    from ray import tune

    try:
        configs = arms(args.trials, args.steps)
        timing, fit_start, fit_end = run(
            tune_trial,
            {"sweep": "bench", "members": tune.grid_search([[c] for c in configs])},
            "unpacked",
            os.path.join(work, "ray"),
            os.path.join(work, "results"),
            concurrent,
        )
        first = min(timing.first_result.values())
        startups = timing.startups()
        packed_timing, packed_start, packed_end = run(
            tune_trial,
            {"sweep": "bench-packed", "members": configs},
            "packed",
            os.path.join(work, "ray"),
            os.path.join(work, "results"),
            1,
        )
    finally:
        ray.shutdown()
    later = startups[concurrent:] or startups[1:]
    rows = [
        {"measure": "ray.init (local)", "seconds": f"{ray_init:.1f}"},
        {"measure": "sweep start -> first result", "seconds": f"{first - sweep_start:.1f}"},
        {"measure": "Tuner.fit() -> first result", "seconds": f"{first - fit_start:.1f}"},
        {
            "measure": f"start-up, first {min(concurrent, len(startups))} trial(s) (new actors)",
            "seconds": ", ".join(f"{s:.1f}" for s in startups[:concurrent]),
        },
        {
            "measure": f"start-up per later trial (reused actors, n={len(later)}): median",
            "seconds": f"{statistics.median(later):.2f}" if later else "-",
        },
        {
            "measure": "start-up per later trial: mean",
            "seconds": f"{statistics.mean(later):.2f}" if later else "-",
        },
        {
            "measure": f"fit() total, {args.trials} trials unpacked",
            "seconds": f"{fit_end - fit_start:.1f}",
        },
        {
            "measure": f"packed: fit() -> first result ({args.trials} members, 1 Tune trial)",
            "seconds": f"{min(packed_timing.first_result.values()) - packed_start:.1f}",
        },
        {
            "measure": f"packed: fit() total, {args.trials} members",
            "seconds": f"{packed_end - packed_start:.1f}",
        },
    ]
    h.print_table(rows, ["measure", "seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
