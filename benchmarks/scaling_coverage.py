"""How often the scaling-law intervals cover the truth, at the design of every shipped preset.

Default: ``scale_fpt.analysis.coverage.law_checks`` at every preset that runs three or more
model sizes (``preset_designs``: its sizes and seeds), for each law form the analysis plan
may name; per interval the report prints (a size's mean, alpha, E, alpha differences, the
curve's band, the held-out prediction) and per scenario (seed noise; a deviation per size):
coverage, its Monte Carlo error, whether it is calibrated (the covering count rules out a
coverage of 0.92: ``coverage.shows_calibrated``) and the share of studies whose interval was bounded.

``--bootstrap``: the bootstrap intervals of ``fit_scaling_law`` (seeds resampled within
sizes) on one design, as before (``coverage_study``).

    python benchmarks/scaling_coverage.py                       # every preset, 400 studies each
    python benchmarks/scaling_coverage.py --studies 200 --forms power_floor
    python benchmarks/scaling_coverage.py --bootstrap --draws 100
"""

from __future__ import annotations

import argparse
import sys
import time

from scaling_fit import print_header

from scale_fpt.analysis.coverage import (
    coverage_study,
    coverage_table,
    law_checks,
    preset_designs,
)
from scale_fpt.analysis.means import MEANS_FORMS
from scale_fpt.recipes.studies import STUDIES

TRUTHS = {
    "power_floor": {"A": 40.0, "alpha": 0.3, "E": 0.05},
    "power": {"A": 30.0, "alpha": 0.25},
}
"""``--bootstrap``: the laws drawn from (the floor a tenth of the smallest mean error)."""


def print_law_checks(studies: int, seed: int, forms: list[str]) -> None:
    designs = preset_designs(STUDIES)
    print("| preset | sizes x seeds | form | interval, scenario | coverage ± MC error | "
          "calibrated | bounded |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for design in designs.values():
        for form in forms:
            for row in law_checks(design, studies, seed, form):
                coverage = (
                    "no degree of freedom"
                    if row["n_studies"] == 0
                    else f"{row['coverage']:.3f} ± {row['mc_error']:.3f}"
                )
                print(
                    f"| {design.name} | {len(design.sizes)} x {design.seeds} | {form} | "
                    f"{row['name']} | {coverage} | {'yes' if row['calibrated'] else 'NO'} | "
                    f"{row['identified']:.2f} |"
                )


def print_bootstrap(args) -> None:
    sizes = [float(s) for s in args.sizes.split(",")]
    truth = TRUTHS[args.form]
    print(
        f"{args.form} {truth}; {len(sizes)} sizes x {args.seeds} seeds, noise {args.noise}; "
        f"{args.draws} studies x {args.boot} resamples, seed {args.seed}\n"
    )
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=400, help="synthetic studies per check")
    p.add_argument("--forms", default=",".join(MEANS_FORMS), help="law forms to check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", action="store_true", help="fit_scaling_law's bootstrap instead")
    p.add_argument("--form", choices=sorted(TRUTHS), default="power_floor", help="--bootstrap")
    p.add_argument("--draws", type=int, default=200, help="--bootstrap: synthetic studies")
    p.add_argument("--boot", type=int, default=200, help="--bootstrap: resamples per study")
    p.add_argument("--sizes", default="1e4,3e4,1e5,3e5,1e6,3e6", help="--bootstrap: sizes")
    p.add_argument("--seeds", type=int, default=4, help="--bootstrap: rows (seeds) per size")
    p.add_argument("--noise", type=float, default=0.05, help="--bootstrap: sd of log y")
    args = p.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in MEANS_FORMS]
    if unknown:
        p.error(f"--forms: unknown {unknown}; choose from {', '.join(MEANS_FORMS)}")
    print_header()
    start = time.perf_counter()
    if args.bootstrap:
        print_bootstrap(args)
    else:
        print_law_checks(args.studies, args.seed, forms)
    print(f"wall {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
