"""How often the 95% bootstrap intervals of ``fit_scaling_law`` cover the truth.

Draws ``--draws`` synthetic studies from a known law (``scale_fpt.analysis.coverage``:
``--seeds`` rows per size at ``--sizes``, log-normal seed noise ``--noise``), fits each with
``groups="seed"`` and ``--boot`` resamples, and prints per parameter the count of covering
intervals, the coverage with its exact (Clopper-Pearson) 95% interval, the binomial test's
p-value against 95%, and the median interval width.

    python benchmarks/scaling_coverage.py                    # power_floor, 200 studies x 200 resamples
    python benchmarks/scaling_coverage.py --form power --draws 100
"""

from __future__ import annotations

import argparse
import sys
import time

from scaling_fit import print_header

from scale_fpt.analysis.coverage import coverage_study, coverage_table

TRUTHS = {
    "power_floor": {"A": 40.0, "alpha": 0.3, "E": 0.05},
    "power": {"A": 30.0, "alpha": 0.25},
}
"""The laws drawn from: the floor is a tenth of the smallest mean error at 6 sizes."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--form", choices=sorted(TRUTHS), default="power_floor")
    p.add_argument("--draws", type=int, default=200, help="synthetic studies")
    p.add_argument("--boot", type=int, default=200, help="bootstrap resamples per study")
    p.add_argument("--sizes", default="1e4,3e4,1e5,3e5,1e6,3e6", help="model sizes")
    p.add_argument("--seeds", type=int, default=4, help="rows (seeds) per size")
    p.add_argument("--noise", type=float, default=0.05, help="sd of log y between seeds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    print_header()
    truth = TRUTHS[args.form]
    print(
        f"{args.form} {truth}; {len(sizes)} sizes x {args.seeds} seeds, noise {args.noise}; "
        f"{args.draws} studies x {args.boot} resamples, seed {args.seed}\n"
    )
    start = time.perf_counter()
    study = coverage_study(
        args.form, truth, sizes, args.seeds, args.noise, args.draws, args.boot, seed=args.seed
    )
    table = coverage_table(study)
    widths = study.assign(width=study["hi"] - study["lo"]).groupby("param")["width"].median()
    print("| param | covered / n | coverage | 95% interval | p (vs 0.95) | median width |")
    print("|---|---|---|---|---|---|")
    for row in table.itertuples():
        print(
            f"| {row.param} | {row.covered} / {row.n} | {row.coverage:.3f} | "
            f"[{row.lo:.3f}, {row.hi:.3f}] | {row.p_value:.3g} | {widths[row.param]:.3g} |"
        )
    if "E" in truth:
        print(f"\nstudies with no floor detected (E <= 0): {study['no_floor'].sum()}")
    print(f"wall {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
