"""The "Scaling laws" section of the report: tables from ``report.scaling_laws``, figures
from ``report.scaling_figures``, in the order of the study's questions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scale_fpt.analysis.laws import LAWS
from scale_fpt.analysis.means import ALPHA_MAX
from scale_fpt.confined import write_text
from scale_fpt.report import scaling_figures as figs
from scale_fpt.report import scaling_laws as laws
from scale_fpt.report.figures import task_order


def intro(form: str) -> str:
    return (
        f"Each arm (task · init · trained groups, transformers, one learning rate per arm) with "
        f"{laws.MIN_SIZES}+ model sizes is fitted with the analysis plan's law, "
        f"{LAWS[form].formula} ({form}; fixed before the data, never chosen from them), on "
        "total and trained parameters: weighted least squares on each size's mean error, whose "
        "spread around the law includes each size's own deviation from it as well as its seeds' "
        "noise (scale_fpt.analysis.means). Intervals (95%) are profile-likelihood (F) "
        "intervals with sizes - parameters degrees of freedom (alpha's and E's: the hull of "
        "those under noise relative to the error and constant in accuracy points, which the "
        "seeds cannot tell apart): with as many sizes as "
        "parameters nothing is left to estimate that spread and the table says "
        f'"not identified"; an exponent not bounded within [0, {ALPHA_MAX:g}] by the data is '
        '"not identified" too, with the bound the data do give. Every interval printed was '
        "checked at the arm's own design (its sizes and seeds) on "
        f"{laws.CHECK_STUDIES} synthetic studies per scenario "
        "(scale_fpt.analysis.coverage.law_checks; docs/scaling-laws.md): one whose covering "
        "count does not rule out a coverage of 0.92 (one-sided binomial test, level 0.05) is "
        'printed as "not calibrated". A larger alpha '
        "means the error falls faster with scale. Bars on the figures: 95% t intervals of each "
        "size's mean over its seeds."
    )


FLOPS_NOTE = (
    "Training FLOPs are not a separate axis here: where an arm trains every size for the "
    "same steps at the same batch size, its FLOPs are N times a constant (4N + attention per "
    "token frozen, 6N full), so a law on FLOPs repeats the law on total parameters. An arm "
    "whose steps vary with size is fitted on FLOPs too."
)


def section(
    doc, out: Path, trials: pd.DataFrame, metric: str, save_figure, law_form: str | None = None
) -> None:
    """Append the section to ``doc``; ``save_figure`` is ``figure_sections.save_figure``;
    ``law_form`` is the analysis plan's law (``power_floor`` when the plan names none)."""
    form = laws.check_form(law_form or laws.DEFAULT_FORM)
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
    doc.para(intro(form))
    doc.para(FLOPS_NOTE)
    fits = laws.fit_all(points, form)
    frame(doc, out, "scaling_laws", "Fitted laws per arm and axis", laws.law_table(points, fits))
    frame(
        doc,
        out,
        "scaling_calibration",
        f"Calibration at the designs fitted above ({laws.CHECK_STUDIES} synthetic studies per "
        "scenario: seed noise 0.03 in log error, without and with a deviation per size of "
        "0.03; nominal 0.95): an interval is printed only where every scenario's covering "
        "count rules out a coverage of 0.92 (one-sided binomial test, level 0.05).",
        laws.calibration_rows(fits),
    )
    held, checks = laws.holdout_rows(points, form)
    for task in task_order(points["task"].unique()):
        fig, data = figs.law_figure(points, fits, checks, task, "error vs size")
        save_figure(
            doc,
            out,
            f"law_{task}",
            fig,
            data,
            f"{task}: test error vs size per arm, seeds (dots), each size's mean with its 95% t "
            "interval, fitted law and its 95% band; star: held-out largest size",
        )
    doc.heading(3, "Which next run narrows the exponent most")
    frame(
        doc,
        out,
        "scaling_next_run",
        "Per arm (total parameters): alpha's 95% half-width now and after each option, with the "
        "option's cost in FLOPs (the trials' total_flops; a new size costs in proportion to its "
        "parameters at fixed steps; GPU-hours scale with FLOPs on one GPU type). Ranked by the "
        "precision added per FLOP (scale_fpt.analysis.power).",
        laws.next_run_rows(points, fits),
    )
    gaps = laws.arm_pairs(points, "init", "pretrained", "random")
    doc.heading(3, "Does the pretrained - random gap grow or shrink with scale?")
    doc.para(
        f"alpha(pretrained) - alpha(random), both of the one law ({form}): with a floor, alpha "
        "is the rate at which each arm approaches its own floor, so the difference alone does "
        "not say whether the gap grows. The gap's change says that, from the measured errors: "
        "(random - pretrained) at the largest size minus at the smallest, with a Welch "
        "interval over the four cells' seeds; it grows when it moves away from 0. The same "
        "columns below read full - frozen."
    )
    frame(doc, out, "scaling_gap", "", laws.exponent_table(points, fits, gaps))
    for task in task_order(points["task"].unique()):
        fig, data = figs.gap_figure(points, fits, task, gaps)
        if len(data):
            save_figure(
                doc,
                out,
                f"gap_{task}",
                fig,
                data,
                f"{task}: random - pretrained error vs total parameters (measured, ± standard "
                "error) and the difference of the fitted laws",
            )
    tuning = laws.arm_pairs(points, "finetune", "fpt", "full")
    doc.heading(3, "Frozen vs full fine-tuning against size")
    frame(
        doc,
        out,
        "scaling_frozen_full",
        f"alpha(frozen) - alpha(full), both {form}.",
        laws.exponent_table(points, fits, tuning),
    )
    doc.heading(3, "Held-out prediction of the largest size")
    doc.para(
        f"Arms with {laws.MIN_SIZES + 1}+ sizes: the law fitted without the largest size "
        "predicts it; the interval is the 95% prediction interval of that size's mean over its "
        "seeds, the size's own deviation from the law included."
    )
    frame(doc, out, "scaling_holdout", "", held)
    best_lr(doc, out, trials, metric, save_figure, form)
    transfer(doc, out, trials, metric, save_figure)


def best_lr(doc, out, trials, metric, save_figure, form) -> None:
    best = laws.scaling_points(trials, metric, best_lr=True)
    doc.heading(3, "At each arm's own best learning rate")
    unconfirmed = best.attrs.get("unconfirmed", [])
    if unconfirmed:
        doc.para(
            "Not available without confirmation seeds (a law on the seeds that chose the rate "
            "would carry the winner's curse): " + "; ".join(unconfirmed) + "."
        )
    if best.empty:
        if not unconfirmed:
            doc.para("No learning-rate search in these results.")
        return
    best_fits = laws.fit_all(best, form)
    frame(
        doc,
        out,
        "scaling_laws_best_lr",
        "Each search arm at its best rate (chosen on validation over the selection seeds), "
        "fitted on its confirmation seeds only.",
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
            f"{task}: error vs size at each arm's best learning rate (confirmation seeds)",
        )


def transfer(doc, out, trials, metric, save_figure) -> None:
    doc.heading(3, "Effective data transferred (Hernandez et al. 2021)")
    table = laws.transfer_rows(trials, metric)
    if table.empty:
        doc.para(f"No task ran both inits at {laws.MIN_SIZES}+ train_examples sizes.")
        return
    doc.para(
        "D_E: the examples the randomly initialised arm needs (its fitted error law in "
        "train_examples) to match the pretrained model's error at D_F; D_T = D_E - D_F. The "
        "'scratch' arm here is the random-init arm of the same design (frozen where the "
        "pretrained arm is frozen), not a model trained from scratch in full, so D_T measures "
        "what pretraining adds to that arm. No intervals: the random law's bootstrap paired "
        "with resampled pretrained seeds sees seed noise only and under-covers "
        f"({laws.TRANSFER_NOTE}); 'extrapolated': D_E lies beyond the largest "
        "train_examples the random arm ran."
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
    write_text(out / "tables" / f"{key}.csv", table.to_csv(index=False))
    doc.para(f"As CSV: [tables/{key}.csv](tables/{key}.csv).")
