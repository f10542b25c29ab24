"""Our Chinchilla-form fit of the public Chinchilla data next to the published fits.

Fits ``E + A/N^alpha + B/D^beta`` with ``scale_fpt.analysis.fit_scaling_law`` to the 240
points of Besiroglu et al. 2024's extraction of Hoffmann et al. 2022's Figure 4 (the five
highest losses dropped, as they did; ``scale_fpt.analysis.chinchilla``) and prints, per
parameter, our estimate with its 95% bootstrap interval and standard error, Besiroglu et al.'s
published estimate, interval and standard error, their plain-Huber grid fit (our objective)
and Hoffmann et al.'s. No groups: each point is its own bootstrap unit (as theirs).

    SCALE_FPT_CHINCHILLA_CSV=.../svg_extracted_data.csv python benchmarks/chinchilla_replication.py
    python benchmarks/chinchilla_replication.py --data PATH --boot 4000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from scaling_fit import cpu_seconds, print_header

from scale_fpt.analysis import fit_scaling_law
from scale_fpt.analysis.chinchilla import (
    BESIROGLU_2024,
    BESIROGLU_2024_HUBER,
    BESIROGLU_2024_INTERVALS,
    BESIROGLU_2024_SE,
    DATA_ENV,
    HOFFMANN_2022,
    data_path,
    load_points,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help=f"svg_extracted_data.csv (default: ${DATA_ENV})")
    p.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--workers", type=int, default=2, help="processes for the resamples")
    args = p.parse_args(argv)
    path = args.data or data_path()
    if path is None or not os.path.isfile(path):
        print(
            f"no data at {path}: pass --data or set {DATA_ENV} to Besiroglu et al.'s "
            "svg_extracted_data.csv (scale_fpt/analysis/chinchilla.py)",
            file=sys.stderr,
        )
        return 2
    print_header()
    points = load_points(path)
    print(f"{path}: {len(points)} points; {args.boot} resamples, {args.workers} worker(s)\n")
    start, cpu = time.perf_counter(), cpu_seconds()
    fit = fit_scaling_law(
        points, "loss", ["N", "D"], "chinchilla", n_boot=args.boot, workers=args.workers
    )
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    se = fit.samples.std()
    print(
        "| param | ours | 95% interval | SE | Besiroglu et al. 2024 | their 95% interval | "
        "their SE | their Huber fit | Hoffmann et al. 2022 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("A", "B", "E", "alpha", "beta"):
        lo, hi = fit.intervals[name]
        theirs = BESIROGLU_2024_INTERVALS[name]
        print(
            f"| {name} | {fit.params[name]:.4g} | [{lo:.4g}, {hi:.4g}] | {se[name]:.3g} | "
            f"{BESIROGLU_2024[name]:.4g} | [{theirs[0]:.4g}, {theirs[1]:.4g}] | "
            f"{BESIROGLU_2024_SE[name]:.3g} | {BESIROGLU_2024_HUBER[name]:.4g} | "
            f"{HOFFMANN_2022[name]:.4g} |"
        )
    print(
        f"\nwall {wall:.1f} s, CPU {cpu:.1f} s; failed refits {fit.goodness['n_failed']}; "
        f"loss {fit.goodness['loss']:.6g}, rmse(log) {fit.goodness['rmse_log']:.4g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
