"""Searched arms side by side: the wall time of an N-arm Optuna search run as one sweep
(every arm's configurations interleaved in one Tune experiment, ``search.ArmSearchers``)
against the sum of the same arms run one sweep at a time (how a search ran before: the
cluster drained at the end of each arm).

    python benchmarks/search_arms.py                  # 4 arms x 4 configurations, CPU-sized
    python benchmarks/search_arms.py --arms 2 --configs 2 --steps 40

Each arm is one fine-tuned subset (fpt, input+output, output+ln, output+pos) of a random-init
gpt2-tiny on bit-xor, searched over the learning rate with ``--configs`` configurations and
one seed, ``--max-concurrent`` trials at once (default: the machine's cores). Both runs use
one local Ray instance started before the clock (its start-up is the same for both and is
measured by ``ray_overhead.py``); every sweep writes to its own fresh results directory.
Prints the machine, both wall times and their ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import _harness as h

SUBSETS = ("fpt", "input+output", "output+ln", "output+pos")


def sweep(name: str, subsets: list[str], args: argparse.Namespace, results: str):
    from scale_fpt.sweep import SweepConfig

    return SweepConfig(
        name=name,
        base={
            "task": "bit-xor",
            "model": "gpt2-tiny",
            "init": "random",
            "max_steps": args.steps,
            "eval_every": args.steps,
            "test_batches": 2,
            "val_batches": 2,
        },
        grid={"finetune": subsets},
        search={"lr": ("loguniform", 1e-4, 1e-2)},
        search_trials=args.configs,
        seeds=(0,),
        results_dir=results,
        max_concurrent=args.max_concurrent,
        loggers=("none",),
        pack=1,
    )


def timed(config) -> float:
    from scale_fpt.sweep import run_sweep

    start = time.perf_counter()
    outcome = run_sweep(config)
    assert outcome.finished, "the sweep did not finish"
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", type=int, default=4, choices=range(1, len(SUBSETS) + 1))
    parser.add_argument("--configs", type=int, default=4, help="Optuna configurations per arm")
    parser.add_argument("--steps", type=int, default=100, help="steps per trial")
    parser.add_argument("--max-concurrent", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    h.header()
    h.quiet()
    import ray

    from scale_fpt.prebuild import prebuild_ops
    from scale_fpt.sweep.driver import connect_ray

    prebuild_ops()
    os.environ["RAY_ADDRESS"] = "local"
    connect_ray(num_cpus=args.max_concurrent)
    subsets = list(SUBSETS[: args.arms])
    with tempfile.TemporaryDirectory(prefix="search-arms-") as root:
        together = timed(sweep("together", subsets, args, os.path.join(root, "together")))
        alone = [
            timed(sweep(f"alone-{i}", [subset], args, os.path.join(root, f"alone-{i}")))
            for i, subset in enumerate(subsets)
        ]
    ray.shutdown()
    print(
        f"{args.arms} arms x {args.configs} configurations x {args.steps} steps, "
        f"{args.max_concurrent} trials at once"
    )
    print(f"  one sweep, arms side by side: {together:.1f} s")
    print(
        f"  arm by arm (sum of {args.arms} sweeps): {sum(alone):.1f} s  ({', '.join(f'{a:.1f}' for a in alone)})"
    )
    print(f"  side by side / arm by arm: {together / sum(alone):.2f}")


if __name__ == "__main__":
    main()
