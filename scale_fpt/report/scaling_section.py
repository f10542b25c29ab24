"""The "Scaling laws" section of the report: tables from ``report.scaling_laws``, figures
from ``report.scaling_figures``, in the order of the study's questions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scale_fpt.report import scaling_figures as figs
from scale_fpt.report import scaling_laws as laws
from scale_fpt.report.figures import task_order

INTRO = (
    "Each arm (task · init · trained groups, transformers, one learning rate per arm) with "
    f"{laws.MIN_SIZES}+ model sizes is fitted as error = E + A·x^(-alpha), or as the plain "
    "power law A·x^(-alpha) where the data show no floor (E = 0; the table's note says why), "
    "on total parameters, trained parameters and training FLOPs (frozen body: 4N + attention per "
    "token; full: 6N), by Huber loss on log residuals with L-BFGS-B from a grid of starts "
    "(scale_fpt.analysis). Intervals (95%): percentile bootstrap over "
    f"{laws.REPORT_BOOT} resamples of the seeds within each size. A larger alpha means the "
    "error falls faster with scale."
)


def section(doc, out: Path, trials: pd.DataFrame, metric: str, save_figure) -> None:
    """Append the section to ``doc``; ``save_figure`` is ``document.save_figure``."""
    doc.heading(2, "Scaling laws")
    points = laws.scaling_points(trials, metric)
    if (
        points.empty
        or points.groupby(["task", "arm"])["total_params"].nunique().max() < laws.MIN_SIZES
    ):
        doc.para(
            f"No arm was run at {laws.MIN_SIZES} or more model sizes: nothing to fit "
            "(the ladder preset, sweeps/ladder.py, runs four)."
        )
        transfer(doc, out, trials, metric, save_figure)
        return
    doc.para(INTRO)
    fits = laws.fit_all(points)
    frame(doc, out, "scaling_laws", "Fitted laws per arm and axis", laws.law_table(points, fits))
    held, checks = laws.holdout_rows(points)
    for task in task_order(points["task"].unique()):
        fig, data = figs.law_figure(points, fits, checks, task, "error vs size")
        save_figure(
            doc,
            out,
            f"law_{task}",
            fig,
            data,
            f"{task}: test error vs size per arm, seeds (dots), mean ± std, fitted law "
            "and 95% band; star: held-out largest size",
        )
    gaps = laws.arm_pairs(points, "init", "pretrained", "random")
    doc.heading(3, "Does the pretrained - random gap grow or shrink with scale?")
    doc.para(
        "alpha(pretrained) - alpha(random): positive = the pretrained error falls faster "
        "towards its floor. The gap itself (random - pretrained error) also depends on the "
        "floors: its fitted change from the smallest to the largest size, with a paired "
        "bootstrap interval, says whether it grows."
    )
    frame(doc, out, "scaling_gap", "", laws.exponent_table(fits, gaps, laws.GAP_READINGS))
    for task in task_order(points["task"].unique()):
        fig, data = figs.gap_figure(points, fits, task, gaps)
        if len(data):
            save_figure(
                doc,
                out,
                f"gap_{task}",
                fig,
                data,
                f"{task}: random - pretrained error vs total parameters, fitted difference with 95% band",
            )
    tuning = laws.arm_pairs(points, "finetune", "fpt", "full")
    doc.heading(3, "Frozen vs full fine-tuning against size")
    frame(
        doc,
        out,
        "scaling_frozen_full",
        "alpha(frozen) - alpha(full).",
        laws.exponent_table(fits, tuning, laws.TUNING_READINGS),
    )
    doc.heading(3, "Held-out prediction of the largest size")
    doc.para(
        f"Arms with {laws.MIN_HOLDOUT_SIZES}+ sizes: the law fitted without the largest size "
        "predicts it; the interval is the 95% prediction interval of the seeds' mean there."
    )
    frame(doc, out, "scaling_holdout", "", held)
    best = laws.scaling_points(trials, metric, best_lr=True)
    doc.heading(3, "At each arm's own best learning rate")
    if best.empty:
        doc.para("No learning-rate search in these results.")
    else:
        best_fits = laws.fit_all(best)
        frame(
            doc,
            out,
            "scaling_laws_best_lr",
            "Each search arm at its best rate (validation).",
            laws.law_table(best, best_fits),
        )
        for task in task_order(best["task"].unique()):
            fig, data = figs.law_figure(best, best_fits, {}, task, "best lr per arm")
            save_figure(
                doc,
                out,
                f"law_best_lr_{task}",
                fig,
                data,
                f"{task}: error vs size at each arm's best learning rate",
            )
    transfer(doc, out, trials, metric, save_figure)


def transfer(doc, out, trials, metric, save_figure) -> None:
    doc.heading(3, "Effective data transferred (Hernandez et al. 2021)")
    table = laws.transfer_rows(trials, metric)
    if table.empty:
        doc.para(f"No task ran both inits at {laws.MIN_SIZES}+ train_examples sizes.")
        return
    doc.para(
        "D_E: the examples a randomly initialised model needs (its fitted error law in "
        "train_examples) to match the pretrained model's error at D_F; D_T = D_E - D_F; "
        "intervals from the random law's bootstrap paired with resampled pretrained seeds."
    )
    frame(doc, out, "effective_data", "", table)
    if "D_T" in table:
        fig, data = figs.transfer_figure(table.dropna(subset=["D_T"]))
        save_figure(
            doc, out, "effective_data", fig, data, "Effective data transferred vs fine-tuning data"
        )


def frame(doc, out: Path, key: str, text: str, table: pd.DataFrame) -> None:
    if text:
        doc.para(text)
    if table.empty:
        doc.para("*(nothing to show)*")
        return
    doc.table(laws.readable(table))
    table.to_csv(out / "tables" / f"{key}.csv", index=False)
    doc.para(f"As CSV: [tables/{key}.csv](tables/{key}.csv).")
