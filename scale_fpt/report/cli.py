"""``scale-fpt report``: its arguments checked and turned into ``build.build_report``'s."""

from __future__ import annotations

import math

from scale_fpt.config import ConfigError
from scale_fpt.report import tables
from scale_fpt.report.build import build_report


def parse_thresholds(values: list[str]):
    """``--threshold 0.8`` (every task) and/or ``--threshold bit-xor=0.95`` (one task)."""
    out: dict[str, float] = {}
    problems = []
    for value in values or []:
        task, _, number = value.rpartition("=")
        try:
            threshold = float(number)
        except ValueError:
            problems.append(f"--threshold: {value!r} is not NUMBER or TASK=NUMBER")
            continue
        if not 0 <= threshold <= 1:
            problems.append(f"--threshold: {value!r} must be within [0, 1] (an accuracy)")
        out[task or "*"] = threshold
    if problems:
        raise ConfigError(problems)
    if not out:
        return None
    every = out.pop("*", None)
    if every is None:
        return out
    return {**dict.fromkeys(tables.DEFAULT_THRESHOLDS, every), **out}


def main(args) -> int:
    """``scale-fpt report``: args.results_dir, args.out, and optionally args.metric,
    args.threshold (list), args.no_attention, args.pool, args.seeds_for (pp: prints the
    power table)."""
    seeds_for = getattr(args, "seeds_for", None)
    if seeds_for is not None and not (seeds_for > 0 and math.isfinite(seeds_for)):
        raise ConfigError([f"--seeds-for: {seeds_for} must be a positive difference in pp"])
    path = build_report(
        args.results_dir,
        args.out or None,
        metric=getattr(args, "metric", None) or tables.DEFAULT_METRIC,
        thresholds=parse_thresholds(getattr(args, "threshold", None) or []),
        attention_maps=not getattr(args, "no_attention", False),
        pool=getattr(args, "pool", False),
        seeds_for=seeds_for,
    )
    power = path.parent / "tables" / "power.csv"
    if seeds_for is not None:
        print(power.read_text() if power.exists() else "no paired comparison: no power table\n",
              end="")  # fmt: skip
    print(path)
    return 0
