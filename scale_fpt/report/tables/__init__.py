"""The paper's tables, computed from whatever a results directory holds.

Every table is first a long DataFrame, one row per cell (an *arm*: the trials of one setting
that differ only in ``seed``), with the cell's statistics, the trials behind it, its compute
and the published number beside it. ``wide`` turns one into the paper's shape (rows x tasks)
of display strings. Conventions, shared by every table:

- **Trials used**: status ``completed`` or ``diverged`` with a finite metric. Failed, stopped,
  still running, and diverged-before-the-first-evaluation trials are counted, never averaged.
- **Selection on validation, test reported**: a trial's number is ``test_accuracy``, the
  test accuracy at ``selected_step`` (its evaluation with the best validation accuracy),
  in percent; ``val_accuracy`` or ``final_test_accuracy`` (the last evaluation; for a
  diverged trial the last before divergence, as the paper's †) on request. Nothing is
  chosen on test: best steps, best learning rates and steps to a threshold read validation.
- **Spread**: mean, sample std (n-1) and the 95% Student-t interval half-width over seeds.
- **One learning rate per arm** (``fixed_lr``): where an arm was run at several learning
  rates (an LR search), the paper tables keep only the paper's rate (1e-3; 1e-4 homology)
  and drop the arm if that rate was not run; ``lr_fair`` compares arms at their best rates.
- **Like-for-like** (``compare``): a study cell is compared with the published one (with a
  difference) only when the task's preprocessing (``tasks.preprocessing.deviations``:
  sequence length, split, truncation, augmentation, input dropout), the budget (at least
  the paper's steps to convergence, Table 4), the model, the weights, the learning rate and,
  for LSTMs, width and depth are the paper's (init and trained groups match by construction
  of the row); otherwise the published number is shown as reference only, with every
  reason. Batch size is reported, not judged.
"""

from scale_fpt.analysis_plan import DEFAULT_THRESHOLDS, thresholds_for
from scale_fpt.report.stats import (
    ALPHA,
    EXACT_PATTERNS,
    KM_INTERVAL_MIN_SEEDS,
    LOGRANK_NORMAL_FROM,
    MONTE_CARLO_DRAWS,
    sd_interval,
    sd_upper,
    seeds_needed,
)
from scale_fpt.report.tables.budgets import (
    budget_table,
    preprocessing_table,
)
from scale_fpt.report.tables.cells import (
    ARM_KEYS,
    DEFAULT_METRIC,
    FINETUNE_ORDER,
    INIT_ORDER,
    METRICS,
    SEARCH_ARM_KEYS,
    SEARCHED,
    SELECTION,
    SETTING_KEYS,
    USED_STATUSES,
    annotate,
    backbone_kind,
    cell_summary,
    cells,
    compare,
    disambiguate,
    empty_table,
    finetune_label,
    finish,
    first_int,
    fixed_lr,
    init_label,
    model_label,
    paper_steps,
    pool_sweeps,
    prepare,
    preprocessing_deviations,
    rank,
    size_order,
    trial_config,
)
from scale_fpt.report.tables.differences import (
    PAIR_KEYS,
    accuracy_text,
    detectable_text,
    difference_text,
    init_difference,
    interval_text,
    monte_carlo_text,
    steps_bound,
)
from scale_fpt.report.tables.display import (
    baseline_text,
    baselines,
    cell_text,
    compute_text,
    count,
    human,
    published_text,
    reference_notes,
    steps_number,
    steps_text,
    table6_wide,
    wide,
)
from scale_fpt.report.tables.lr import (
    LR_SELECTION,
    lr_differences,
    lr_fair,
    lr_points,
    lr_text,
)
from scale_fpt.report.tables.matched import matched_differences, matched_text
from scale_fpt.report.tables.paper import (
    frozen_transformers,
    init_rank,
    pretrained_transformers,
    ranks,
    selected,
    settings_table,
    table1_full,
    table2_init,
    table3_lstm,
    table6_size,
    table8_finetune,
)
from scale_fpt.report.tables.steps import (
    speedup,
    speedups,
    steps_summary,
    steps_to_threshold,
    table4_steps,
)

__all__ = [
    "ALPHA",
    "ARM_KEYS",
    "DEFAULT_METRIC",
    "DEFAULT_THRESHOLDS",
    "EXACT_PATTERNS",
    "FINETUNE_ORDER",
    "INIT_ORDER",
    "KM_INTERVAL_MIN_SEEDS",
    "LOGRANK_NORMAL_FROM",
    "LR_SELECTION",
    "METRICS",
    "MONTE_CARLO_DRAWS",
    "PAIR_KEYS",
    "SEARCHED",
    "SEARCH_ARM_KEYS",
    "SELECTION",
    "SETTING_KEYS",
    "USED_STATUSES",
    "accuracy_text",
    "annotate",
    "backbone_kind",
    "baseline_text",
    "baselines",
    "budget_table",
    "cell_summary",
    "cell_text",
    "cells",
    "compare",
    "compute_text",
    "count",
    "detectable_text",
    "difference_text",
    "disambiguate",
    "empty_table",
    "finetune_label",
    "finish",
    "first_int",
    "fixed_lr",
    "frozen_transformers",
    "human",
    "init_difference",
    "init_label",
    "init_rank",
    "interval_text",
    "lr_differences",
    "lr_fair",
    "lr_points",
    "lr_text",
    "matched_differences",
    "matched_text",
    "model_label",
    "monte_carlo_text",
    "paper_steps",
    "pool_sweeps",
    "prepare",
    "preprocessing_deviations",
    "preprocessing_table",
    "pretrained_transformers",
    "published_text",
    "rank",
    "ranks",
    "reference_notes",
    "sd_interval",
    "sd_upper",
    "seeds_needed",
    "selected",
    "settings_table",
    "size_order",
    "speedup",
    "speedups",
    "steps_bound",
    "steps_number",
    "steps_summary",
    "steps_text",
    "steps_to_threshold",
    "table1_full",
    "table2_init",
    "table3_lstm",
    "table4_steps",
    "table6_size",
    "table6_wide",
    "table8_finetune",
    "thresholds_for",
    "trial_config",
    "wide",
]
