"""Reports: the paper's tables and figures, regenerated from any results directory.

    scale-fpt report RESULTS_DIR [--out DIR] [--metric M] [--threshold [TASK=]X]

or, in a notebook::

    from scale_fpt.results import load_results
    from scale_fpt import report
    r = load_results("results")
    t2 = report.table2_init(r.trials)          # long form: one row per cell
    report.wide(t2)                            # the paper's shape (display strings)
    fig, data = report.scaling_figure(r.trials)

Files:
    stats.py      mean, std and the Student-t 95% interval of a cell
    published.py  the paper's published numbers, as data
    tables.py     Tables 1, 2, 3, 4, 6, 8 and the LR-fair comparison (DataFrames)
    figures.py    scaling curve, learning curves, accuracy vs lr, steps bars, attention maps
    attention.py  attention maps of trained bit-task checkpoints
    document.py   report.md / report.html with figures/ and tables/
"""

from __future__ import annotations

import math

from scale_fpt.config import ConfigError
from scale_fpt.report.attention import (
    attention_maps,
    attention_shares,
    load_trial_model,
    relevant_positions,
    trial_attention,
)
from scale_fpt.report.document import all_tables, build_report, parse_thresholds
from scale_fpt.report.figures import (
    attention_figure,
    learning_curves_figure,
    lr_figure,
    scaling_figure,
    steps_figure,
)
from scale_fpt.report.stats import summarize, t_quantile, welch_difference
from scale_fpt.report.tables import (
    DEFAULT_METRIC,
    DEFAULT_THRESHOLDS,
    budget_table,
    lr_differences,
    lr_fair,
    lr_points,
    table1_full,
    table2_init,
    table3_lstm,
    table4_steps,
    table6_size,
    table6_wide,
    table8_finetune,
    wide,
)

__all__ = [
    "DEFAULT_METRIC",
    "DEFAULT_THRESHOLDS",
    "all_tables",
    "attention_figure",
    "attention_maps",
    "attention_shares",
    "budget_table",
    "build_report",
    "learning_curves_figure",
    "load_trial_model",
    "lr_differences",
    "lr_fair",
    "lr_figure",
    "lr_points",
    "main",
    "parse_thresholds",
    "relevant_positions",
    "scaling_figure",
    "steps_figure",
    "summarize",
    "t_quantile",
    "table1_full",
    "table2_init",
    "table3_lstm",
    "table4_steps",
    "table6_size",
    "table6_wide",
    "table8_finetune",
    "trial_attention",
    "welch_difference",
    "wide",
]


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
        metric=getattr(args, "metric", None) or DEFAULT_METRIC,
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
