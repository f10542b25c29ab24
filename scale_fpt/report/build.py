"""The report of a results directory, assembled: every table and figure in one Markdown file
(``report.md``) and a self-contained HTML copy (``report.html``), with the figures (PNG +
CSV of the data drawn) under ``figures/`` and each table's long form (one row per cell:
statistics, trial ids, compute, published number) under ``tables/``.

    report.md
      Files and rows not used   what the loader left out of the results folder, named
      Findings, Power, Analysis plan
      Trials             status per sweep, every trial not used and why
      Conventions        metric, spread, learning rates, like-for-like rule, thresholds
      Table 1..8, LR     per table: which trials it used; the table in the paper's shape;
                         the published numbers beside it; compute per cell
      Figures            scaling curve, learning curves, accuracy vs lr, steps to threshold
      Scaling laws
      Attention maps     per bit-task checkpoint: maps and the share on the relevant inputs
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pandas as pd

from scale_fpt import analysis_plan
from scale_fpt.confined import make_folders, write_text
from scale_fpt.report import scaling_section, tables
from scale_fpt.report.comparisons import Comparisons
from scale_fpt.report.figure_sections import attention_section, figures_section, save_figure
from scale_fpt.report.render import Document, escape_md
from scale_fpt.report.sections import (
    contrasts_display,
    conventions,
    findings_section,
    frame_section,
    matched_section,
    plan_section,
    power_section,
    t6_wide,
    table_section,
    trials_section,
)
from scale_fpt.results import ResultsError, load_results, results_root
from scale_fpt.results_checks import repeated_configs


def all_tables(results, metric: str = tables.DEFAULT_METRIC, thresholds=None) -> dict:
    """{key: long DataFrame} of every table, computed from ``results`` (``load_results``)."""
    trials, curves = results.trials, results.curves
    return {
        "T1": tables.table1_full(trials, metric),
        "T2": tables.table2_init(trials, metric),
        "T3": tables.table3_lstm(trials, metric),
        "T4": tables.table4_steps(trials, curves, thresholds),
        "T6": tables.table6_size(trials, metric),
        "T8": tables.table8_finetune(trials, metric),
        "LR": tables.lr_fair(trials, metric),
    }


CURVE_COLUMNS = ("val_accuracy", "test_accuracy")
"""The curves columns the report reads besides whose row it is (``results.CURVE_KEYS``): steps
to threshold and the learning curves read validation accuracy, matched horizons both."""

MISSING = {
    "T1": "no FPT, fully trained transformer or fully trained LSTM trials",
    "T2": "no frozen (finetune fpt) transformer trials",
    "T3": "no random frozen transformer or frozen LSTM trials",
    "T4": "no frozen transformer trials",
    "T6": "no frozen transformer trials",
    "T8": "no language-pretrained transformer trials",
    "LR": "no arm was run at two or more learning rates",
}


def build_report(
    results_dir: str | Path,
    out: str | Path | None = None,
    *,
    metric: str = tables.DEFAULT_METRIC,
    thresholds=None,
    attention_maps: bool = True,
    attention_examples: int = 32,
    pool: bool = False,
    seeds_for: float | None = None,
) -> Path:
    """Write report.md, report.html, figures/ and tables/ to ``out`` (default
    RESULTS_DIR/report); returns the path of report.md. ``pool``: every sweep's trials share
    cells (``tables.pool_sweeps``), and the report says so at the top. ``seeds_for`` (pp):
    the power section also says how many seeds detect that difference."""
    results = load_results(results_dir, curve_columns=CURVE_COLUMNS)
    if results.trials.empty:  # e.g. every trials file damaged (each named by load_results)
        raise ResultsError([f"no readable trial rows under {results_dir}: nothing to report"])
    sweeps = sorted(set(results.trials["sweep"].dropna()))
    by_sweep = results.trials  # what each sweep ran, and where its checkpoints are
    if pool:  # the same trial run by two sweeps counts once in a pooled cell
        once = results.trials[~repeated_configs(results.trials)]
        results = dataclasses.replace(results, trials=tables.pool_sweeps(once))
    out = Path(out) if out else Path(results_dir) / "report"
    make_folders(out, "figures", "tables")  # real folders: a link planted there is refused
    trials, curves = results.trials, results.curves
    doc = Document(out)
    doc.heading(1, "Frozen Pretrained Transformers: study report")
    shas = sorted(set(trials["git_sha"].dropna())) if len(trials) else []
    doc.para(
        f"Results: {escape_md(Path(results_dir).absolute())} · generated "
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} · "
        f"code: {escape_md(', '.join(shas)) or 'unknown'}. Published numbers: Lu et al. 2021, "
        "'Pretrained Transformers as Universal Computation Engines'."
    )
    if pool and len(sweeps) > 1:
        doc.para(
            f"**Pooled (--pool):** the trials of {len(sweeps)} sweeps ({escape_md(', '.join(sweeps))}) "
            "share cells wherever their settings agree. Seeds may repeat across sweeps (the "
            "same seed shares every random stream), so a pooled cell's n counts trials, not "
            "independent seeds, and its interval is too narrow by an unknown amount."
        )
    if results.notes:
        doc.heading(2, "Files and rows not used")
        doc.para(
            "The results folder holds these; the report leaves them out (a results folder "
            "is read as untrusted input: docs/security.md)."
        )
        doc.bullets([escape_md(line) for line in results.notes])
    plans = analysis_plan.plans(results_root(results_dir), sweeps)
    comparisons = Comparisons.compute(trials, curves, metric, thresholds, plans)
    baselines = tables.baselines(trials)
    findings_section(doc, out, comparisons, baselines)
    power_section(doc, out, comparisons, seeds_for)
    plan_section(doc, sweeps, plans)
    trials_section(doc, by_sweep, metric)
    limits = tables.thresholds_for(sorted(set(trials["task"])), thresholds)
    conventions(doc, metric, limits)
    frame_section(
        doc,
        out,
        "Budgets",
        "Step budgets (max_steps) and steps taken beside the paper's steps to convergence "
        "(Table 4: the FPT row for language-pretrained backbones, the random row otherwise). "
        "A budget below the paper's makes its cells reference only.",
        tables.budget_table(trials),
        ["task", "init"],
    )
    frame_section(
        doc,
        out,
        "Preprocessing",
        "Each task's preprocessing beside the paper's and the reference code's "
        "(kzl/universal-computation). A published number is compared (Δ) only where every "
        "aspect is as published and the budget, model, weights and lr match.",
        tables.preprocessing_table(trials),
        ["task", "aspect"],
    )
    computed = all_tables(results, metric, thresholds)
    absent = []
    for key, table in computed.items():
        if table.empty:
            absent.append(f"{table.attrs.get('title', key)}: {MISSING[key]}.")
            continue
        if key == "T6":
            table_section(doc, key, table, out, t6_wide, tables.cell_text, baselines)
        elif key == "LR":
            table_section(doc, key, table, out, tables.wide, tables.lr_text, baselines)
        else:
            table_section(doc, key, table, out, tables.wide, tables.cell_text, baselines)
    contrasts = comparisons.lr
    if not contrasts.empty:
        frame_section(
            doc,
            out,
            "LR-fair differences",
            "full - fpt and pretrained - random, each arm at its own best learning rate, on "
            "the headline seeds (confirmation seeds where run), paired on the seeds both arms "
            "ran: mean difference (percentage points) with its paired-t 95% interval, the "
            "paired t p-value and, in brackets, its Benjamini-Hochberg adjustment within its "
            "declared family (with "
            "the family's rows of the pretrained - random table; a test both show counted "
            "once; rows on selection seeds are exploratory), d_z "
            "(mean difference / SD of the differences) with its exact noncentral-t interval, "
            "the sign-flip p where its n can reach 0.05 (6 pairs or more; exact to 16 pairs, "
            "beyond Monte Carlo with its SE), and the "
            "smallest difference the n pairs detect at 80% power from their observed SD.",
            contrasts_display(contrasts),
            ["task", "contrast"],
            long=contrasts,
        )
    differences = comparisons.init
    if not differences.empty:
        frame_section(
            doc,
            out,
            "Pretrained - random",
            "Each setting run with both inits: the accuracy difference paired on shared "
            "seeds (Welch where none is shared), p-values Benjamini-Hochberg adjusted within "
            "each declared family (with its rows of the LR-fair table), and steps to each "
            "task's threshold as censored data (Kaplan-Meier medians, log-rank test: exact, "
            "Monte Carlo or normal as each row says).",
            pd.DataFrame(
                {
                    "task": differences["task"],
                    "setting": differences["model"].astype(str)
                    + " · "
                    + differences["finetune_label"].astype(str)
                    + " · lr "
                    + differences["lr"].map(lambda v: f"{v:g}")
                    + " · "
                    + differences["sweep"].astype(str),
                    "pretrained - random": [
                        tables.difference_text(r) for r in differences.to_dict("records")
                    ],
                    "family (accuracy; steps)": differences["accuracy_family"]
                    + "; "
                    + differences["steps_family"],
                }
            ),
            ["task", "setting"],
            long=differences,
        )
    matched_section(doc, out, comparisons.matched)
    if absent:
        doc.heading(2, "Tables these results cannot fill")
        doc.bullets(absent)
    figures_section(doc, out, trials, curves, computed["T4"], metric)
    # The law's form is the analysis plans'; where they declare different forms (or none),
    # the section's default, which it names.
    law_forms = {plan.law_form for plan in plans.values()}
    law_form = law_forms.pop() if len(law_forms) == 1 else None
    scaling_section.section(doc, out, trials, metric, save_figure, law_form=law_form)
    if attention_maps:
        attention_section(doc, out, by_sweep, results_dir, attention_examples)
    write_text(out / "report.md", doc.markdown())
    write_text(out / "report.html", doc.html())
    return out / "report.md"
