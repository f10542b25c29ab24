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
    tables/       Tables 1, 2, 3, 4, 6, 8 and the LR-fair comparison (DataFrames)
    figures.py    scaling curve, learning curves, accuracy vs lr, steps bars, attention maps
    attention.py  attention maps of trained bit-task checkpoints
    columns.py    the one column vocabulary of every table and CSV (docs/report.md)
    comparisons.py  every comparison of arms, adjusted in its declared family; the findings
    render.py     the document's blocks as Markdown and HTML
    sections.py, figure_sections.py  the report's sections
    build.py      report.md / report.html with figures/ and tables/
    cli.py        `scale-fpt report`
"""

from scale_fpt.lazy import lazy_exports

EXPORTS = {
    "DEFAULT_METRIC": "tables",
    "DEFAULT_THRESHOLDS": "tables",
    "all_tables": "build",
    "attention_figure": "figures",
    "attention_maps": "attention",
    "attention_shares": "attention",
    "budget_table": "tables",
    "build_report": "build",
    "learning_curves_figure": "figures",
    "load_trial_model": "attention",
    "lr_differences": "tables",
    "lr_fair": "tables",
    "lr_figure": "figures",
    "lr_points": "tables",
    "main": "cli",
    "parse_thresholds": "cli",
    "relevant_positions": "attention",
    "scaling_figure": "figures",
    "steps_figure": "figures",
    "summarize": "stats",
    "t_quantile": "stats",
    "table1_full": "tables",
    "table2_init": "tables",
    "table3_lstm": "tables",
    "table4_steps": "tables",
    "table6_size": "tables",
    "table6_wide": "tables",
    "table8_finetune": "tables",
    "trial_attention": "attention",
    "welch_difference": "stats",
    "wide": "tables",
}
"""Each public name and the module of this package that defines it."""
__all__ = sorted(EXPORTS)
# The report's names load on first use, so that importing the package loads no torch.
__getattr__ = lazy_exports(__name__, EXPORTS)
