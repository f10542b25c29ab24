"""The report's sections of text and tables: trials, conventions, the paper's tables, budgets,
findings, power, the analysis plan, matched budgets and LR-fair differences. Each appends
blocks to a ``render.Document`` and writes its long form under ``tables/``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt.confined import write_text
from scale_fpt.report import tables
from scale_fpt.report.comparisons import Comparisons, findings_display
from scale_fpt.report.render import Document, escape_md
from scale_fpt.report.tables.differences import DETECTABLE, p_bh_text

MAX_LISTED_IDS = 30


def trials_section(doc: Document, trials: pd.DataFrame, metric: str) -> None:
    doc.heading(2, "Trials")
    if trials.empty:
        doc.para("No trials in these results.")
        return
    counts = pd.crosstab(trials["sweep"], trials["status"]).rename_axis(index="sweep", columns=None)
    sums = trials.groupby("sweep")[["wall_time_s", "samples_seen", "total_flops"]].sum()
    counts["wall time (h)"] = (sums["wall_time_s"] / 3600).map(lambda v: f"{v:.3g}")
    counts["samples"] = sums["samples_seen"].map(lambda v: f"{v:.3g}")
    counts["FLOPs"] = sums["total_flops"].map(lambda v: f"{v:.3g}")
    doc.table(counts)
    prepared = tables.prepare(trials, metric)
    excluded = prepared[~prepared["used"]]
    doc.para(
        f"{int(prepared['used'].sum())} of {len(prepared)} trials can be used (status completed "
        f"or diverged, with at least one evaluation). Not used: {len(excluded)}."
    )
    if len(excluded):
        listed = excluded.head(MAX_LISTED_IDS)
        doc.table(
            pd.DataFrame(
                {
                    "sweep": listed["sweep"],
                    "trial": listed["trial_id"],
                    "setting": listed["task"]
                    + " · "
                    + listed["model_label"]
                    + " · "
                    + listed["init_label"]
                    + " · "
                    + listed["finetune_label"]
                    + " · seed "
                    + listed["seed"].astype(str),
                    "why not used": listed["reason"],
                    "error": listed["error"].fillna("").map(first_line),
                }
            ).reset_index(drop=True)
        )
        if len(excluded) > MAX_LISTED_IDS:
            doc.para(f"... and {len(excluded) - MAX_LISTED_IDS} more.")


def first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


def conventions(doc: Document, metric: str, thresholds: dict) -> None:
    doc.heading(2, "Conventions")
    doc.bullets(
        [
            f"Accuracy: `{metric}` in percent; a diverged trial counts with its value before "
            "divergence and its cell is marked † (as in the paper). Every choice reads the "
            "validation split: a trial's step is its evaluation with the best validation "
            "accuracy (`selected_step`), test accuracy is measured there and never selected on.",
            "Each cell: mean ± sample std over seeds (n-1), n, and the 95% Student-t interval "
            "half-width (CI ±, t(0.975, n-1)·std/√n; scipy.stats); n=1 shows no spread.",
            "An arm (cell) is one design: its sweep and every config field that changes a "
            "trial (task, model, weights, init, finetune, LSTM size, lr, batch size, steps, "
            "precision, sequence length, augmentation, normalisation, patience, evaluation "
            "settings, ...); what differs between cells shown together is named in the row. "
            "Trials of different sweeps are never pooled unless the report is built with "
            "--pool (and then it says so at the top).",
            "Differences between arms (pretrained - random; full - fpt in the LR-fair "
            "differences) are paired on the seeds both arms ran (a seed gives both the same "
            "heads, data and dropout streams): paired-t 95% interval and p, d_z (mean "
            "difference / SD of the differences) with its exact noncentral-t interval, the "
            "sign-flip p only where its n can reach 0.05 (exact to 16 pairs, beyond from "
            f"{tables.MONTE_CARLO_DRAWS:,} seeded random sign patterns, its Monte Carlo SE "
            "beside it), and the smallest difference "
            "the n detects at 80% power; Welch where no seed is shared. Each table's p-values "
            "are one family, Benjamini-Hochberg adjusted. Steps to threshold are censored "
            "data: a seed that ran its budget without reaching it is censored at its last "
            "step, one that diverged or stopped on patience never reaches it; Kaplan-Meier "
            "medians (with a 95% interval from "
            f"{tables.KM_INTERVAL_MIN_SEEDS} seeds an arm, where it is calibrated) and the "
            "log-rank test with its permutation p (exact to "
            f"{tables.EXACT_PATTERNS:,} relabellings, at 3 + 3 seeds it cannot go below "
            f"0.1; beyond, {tables.MONTE_CARLO_DRAWS:,} random ones with the Monte Carlo SE; "
            f"from {tables.LOGRANK_NORMAL_FROM} seeds its normal approximation).",
            "Paper tables use one learning rate per arm: where an arm was run at several (an "
            "LR search), only the paper's rate (1e-3; 1e-4 homology) is used there; the "
            "LR-fair table compares every searched arm at its own best rate.",
            "Published numbers (Lu et al. 2021) stand beside a cell with a difference Δ "
            "(study - paper) only like-for-like: same model (gpt2 small unless the paper's "
            "cell says otherwise), weights, learning rate, for LSTMs 3 x 768, a budget of at "
            "least the paper's steps to convergence, fp32 (the reference code's precision), a "
            "batch size within the paper's 2-16, and the task's preprocessing as published. "
            "Otherwise they are reference only (ref.), with every reason listed. The "
            "evaluation protocol always differs (test at the validation-selected step here; "
            "test batches during training, no validation split, in the reference code) and "
            "every like-for-like comparison says so.",
            "Steps to threshold: the first evaluated step whose validation accuracy reaches the "
            "threshold ("
            + ", ".join(f"{t} {v:.3g}" for t, v in thresholds.items())
            + "; default: 90% of the paper's FPT accuracy). A seed that never reaches it gives "
            "'>bound' (mean with unreached seeds at their last evaluated step), never a number.",
            "Empty cells say why: no trials, all failed, no usable trial, not reached.",
        ]
    )


def used_line(table: pd.DataFrame) -> str:
    a = table.attrs
    used_cells = table[table["n"].fillna(0) > 0] if len(table) and "n" in table else table
    diverged = int(used_cells["n_diverged"].fillna(0).sum()) if "n_diverged" in table else 0
    parts = [
        f"Selection: {escape_md(a.get('selection', ''))}",
        f"trials used: {a.get('used', 0)} of {a.get('matched', 0)} matching ({diverged} of "
        "them diverged)",
        f"sweeps: {escape_md(', '.join(a.get('sweeps', []))) or 'none'}",
    ]
    if a.get("not_used"):
        parts.append(
            "not used: " + escape_md(", ".join(f"{n} {r}" for r, n in a["not_used"].items()))
        )
    if a.get("other_lr"):
        parts.append(
            f"{a['other_lr']} trials at other learning rates of an LR search left out "
            "(see the LR-fair table)"
        )
    ids = a.get("trial_ids", "").split(",") if a.get("trial_ids") else []
    if ids and len(ids) <= MAX_LISTED_IDS:
        parts.append("trial ids: " + escape_md(", ".join(ids)))
    elif ids:
        parts.append("trial ids: the trial_ids column of the CSV")
    return "; ".join(parts) + "."


def compute_line(table: pd.DataFrame) -> str:
    cells = table[table["n"].fillna(0) > 0]
    n = int(cells["n_search_trials" if "n_search_trials" in cells else "n"].sum())
    wall, samples, flops = (cells[c].sum() for c in ("wall_time_s", "samples_seen", "total_flops"))
    per = f" (per trial: {wall / n / 3600:.3g} h, {flops / n:.3g} FLOP)" if n else ""
    scope = table.attrs.get("compute_scope", "its seeds")
    return (
        f"Compute of the trials used: {wall / 3600:.3g} h wall time, {samples:.3g} samples, "
        f"{flops:.3g} FLOPs in all{per}. Per cell (sums over {scope}):"
    )


def table_section(
    doc: Document, key: str, table: pd.DataFrame, out: Path, wide_fn, text_fn, baselines: dict
):
    doc.heading(2, table.attrs["title"])
    doc.para(used_line(table))
    doc.table(wide_fn(table, text_fn))
    shown = baselines_line(table["task"], baselines) if key != "T4" else ""
    if shown:
        doc.para(shown)
    if "published" in table and table["published"].notna().any():
        doc.para(
            "Published (Lu et al. 2021) beside each cell: value (Δ study - paper) where "
            "like-for-like, (ref.) where the setting differs:"
        )
        doc.table(wide_fn(table, tables.published_text))
        doc.bullets([escape_md(note) for note in tables.reference_notes(table)])
    doc.para(compute_line(table))
    doc.table(wide_fn(table, tables.compute_text))
    write_text(out / "tables" / f"{key}.csv", table.to_csv(index=False))
    doc.para(f"Cells in long form: [tables/{key}.csv](tables/{key}.csv).")


def baselines_line(tasks, baselines: dict) -> str:
    """'Baselines (...): bit-xor chance 50% ...' of the tasks shown (``tables.baselines``)."""
    known = [t for t in dict.fromkeys(tasks) if baselines.get(t)]
    return (
        "Baselines (an accuracy at one of these means the arm did not learn): "
        + escape_md("; ".join(f"{t} {baselines[t]}" for t in known))
        + "."
        if known
        else ""
    )


def frame_section(
    doc, out: Path, title: str, text: str, frame: pd.DataFrame, index, long=None
) -> None:
    """A titled table of the report and ``tables/<title>.csv``: ``long``, the table's
    statistics in the column vocabulary (``report.columns``), where ``frame`` shows them as
    text; nothing when empty."""
    if frame.empty:
        return
    doc.heading(2, title)
    doc.para(text)
    doc.table(frame.set_index(index))
    csv = frame if long is None else long
    write_text(out / "tables" / f"{title.lower()}.csv", csv.to_csv(index=False))


def findings_section(doc: Document, out: Path, comparisons: Comparisons, baselines: dict) -> None:
    doc.heading(2, "Findings")
    table = comparisons.findings(baselines)
    if table.empty:
        doc.para("No two arms of these results can be compared (no setting ran both inits, "
                 "or full and fpt, on shared seeds).")  # fmt: skip
        return
    doc.para(
        "Each comparison of arms: the accuracy difference (percentage points, test accuracy "
        "at each seed's best-validation step) with its 95% interval, the seeds it rests on, "
        "the paired t p-value with its Benjamini-Hochberg adjustment within the family the "
        "analysis plan declared (over every table that shows the family), and the smallest "
        "difference its n detects with 80% power at the upper 80% bound of the paired "
        "differences' SD, with its range over the SD's 95% interval (Power): a difference "
        "below it is not evidence of no effect. 'exploratory': outside the sweep's analysis "
        "plan, or an LR-fair row on its selection seeds. A task's accuracy at one of its "
        "baselines means the arm did not learn; where some seeds of an arm did and others "
        "did not, no interval is printed below 10 seeds (not calibrated there). Below 10 "
        "seeds an interval is of the outcome every seed of each arm had (all learned, or all "
        "at the baseline), not of an arm's chance to learn: 3 seeds of a task that half of "
        "all seeds learn agree 1 time in 4."
    )
    doc.table(findings_display(table).set_index(["task", "comparison"]))
    write_text(out / "tables" / "findings.csv", table.to_csv(index=False))


def power_section(doc: Document, out: Path, comparisons: Comparisons, seeds_for) -> None:
    """Per paired comparison: the SD of its paired differences with its 95% interval, its
    n, the difference it detects at 80% power (``stats.power_statement``: at the SD's upper
    80% bound, its range over the SD's interval, at the family's BH level) and, with
    ``seeds_for``, the seeds that detect that many pp in 80% of pilots (``seeds_needed`` at
    the SD's upper bound). Always written to tables/power.csv, in the column vocabulary
    (``report.columns``)."""
    rows = []
    sources = (
        (comparisons.init, "accuracy_", "pretrained - random"),
        (comparisons.lr, "", None),
        (comparisons.matched, "", None),
    )
    for frame, prefix, contrast in sources:
        for r in frame.to_dict("records"):
            sd = r.get(f"{prefix}sd_diff", math.nan)
            n = int(r[f"{prefix}n"])
            if not (isinstance(sd, float) and sd > 0):
                continue
            low, high = tables.sd_interval(sd, n)
            family = int(r.get(f"{prefix}p_family_size", 1))
            row = {
                "task": r["task"],
                "comparison": contrast
                or r["contrast"] + (f" at equal {r['match']}" if "match" in r else ""),
                "sweep": r["sweep"],
                "n": n,
                "sd_diff": sd,
                "sd_diff_low": low,
                "sd_diff_high": high,
                **{k: r[f"{prefix}{k}"] for k in DETECTABLE},
                "p_family_size": family,
            }
            if seeds_for is not None:
                upper = tables.sd_upper(sd, n)
                needed = [tables.seeds_needed(upper, seeds_for, alpha=tables.ALPHA / m)
                          for m in (1, family)]  # fmt: skip
                row.update(seeds_for_pp=seeds_for, seeds_needed=needed[0],
                           seeds_needed_family=needed[1])  # fmt: skip
            rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return
    if seeds_for is not None:  # None: more than 10,000
        needed = ["seeds_needed", "seeds_needed_family"]
        table[needed] = table[needed].astype("Int64")
    doc.heading(2, "Power")
    doc.para(
        "For each paired comparison: the spread of its paired differences with its 95% "
        "interval (chi-square: from 3 pairs it spans 0.5x-6.3x the observed SD), and the "
        "smallest true difference its n pairs detect with 80% power (two-sided paired t, "
        "level 0.05) at the SD's upper 80% confidence bound, so that the statement holds in "
        "at least 80% of pilots; in brackets, the same over the SD's 95% interval; and at "
        "level 0.05 / (tests in its family), below which Benjamini-Hochberg rejects it "
        "whatever the family's other p-values"
        + (
            f"; the seeds that detect {seeds_for:g} pp with 80% power in at least 80% of "
            "pilots (planned from the SD's upper bound)"
            if seeds_for is not None
            else ""
        )
        + ". `scale-fpt report RESULTS --seeds-for PP` answers for a difference of PP pp."
    )
    doc.table(power_display(table, seeds_for).set_index(["task", "comparison"]))
    write_text(out / "tables" / "power.csv", table.to_csv(index=False))


def power_display(table: pd.DataFrame, seeds_for) -> pd.DataFrame:
    """The power table (``power_section``'s long form) as the report shows it."""
    rows = table.to_dict("records")
    shown = pd.DataFrame(
        {
            "task": table["task"],
            "comparison": table["comparison"],
            "sweep": table["sweep"],
            "n": table["n"],
            "SD of differences (pp) [95% CI]": [
                f"{r['sd_diff']:.3g} [{r['sd_diff_low']:.3g}, {r['sd_diff_high']:.3g}]"
                for r in rows
            ],
            "detectable at 80% power (pp)": [tables.detectable_text(r) for r in rows],
            "tests in its family": table["p_family_size"],
        }
    )
    if seeds_for is not None:
        shown[f"seeds to detect {seeds_for:g} pp"] = [
            "; ".join(
                ("more than 10,000" if pd.isna(k) else f"{int(k)}")
                + (" at the family BH level" if i else "")
                for i, k in enumerate(
                    (r["seeds_needed"], r["seeds_needed_family"])[: 1 + (r["p_family_size"] > 1)]
                )
            )
            for r in rows
        ]
    return shown


def plan_section(doc: Document, sweeps: list[str], plans: dict) -> None:
    doc.heading(2, "Analysis plan")
    lines = []
    for sweep in sweeps:
        plan = plans.get(sweep)
        if plan is None:
            lines.append(f"{escape_md(sweep)}: no analysis plan (written before plans existed, "
                         "or not by a sweep): every comparison is exploratory.")  # fmt: skip
            continue
        thresholds = ", ".join(f"{t} {v:.3g}" for t, v in plan.thresholds.items())
        lines.append(escape_md(
            f"{sweep} (plan of {plan.sweep}, written {plan.written}, schema "
            f"{plan.schema_version}): primary metric {plan.primary_metric}, selection on "
            f"{plan.selection_metric}; thresholds {thresholds}; families: "
            f"{', '.join(plan.families) or 'none'}; scaling law {plan.law_form}; seeds: "
            f"selection {plan.seeds.get('selection')}, confirmation "
            f"{plan.seeds.get('confirmation') or 'none'}."
        ))  # fmt: skip
    doc.bullets(lines)


def matched_section(doc: Document, out: Path, matched: pd.DataFrame) -> None:
    """full - fpt and pretrained - random at equal FLOPs and at equal examples seen."""
    if matched.empty:
        return
    shown = pd.DataFrame(
        {
            "task": matched["task"],
            "model": matched["model"],
            "sweep": matched["sweep"],
            "lr": matched["lr"].map(lambda v: f"{v:g}"),
            "comparison": [tables.matched_text(row) for row in matched.to_dict("records")],
            "family": matched["family"],
            "means (a / b)": [
                f"{a:.1f} / {b:.1f}"
                for a, b in zip(matched["mean_a"], matched["mean_b"], strict=True)
            ],
        }
    )
    frame_section(
        doc,
        out,
        "Matched budgets",
        "Arm pairs at equal compute (FLOPs: the project's accounting, 6N per step when the "
        "body trains, 4N plus attention when it is frozen) and at equal examples seen: every "
        "trial of the pair is cut at the least any of them reached, scored at its best "
        "validation evaluation within the cut, and the difference is paired on shared seeds "
        "(Benjamini-Hochberg over each match's rows).",
        shown,
        ["task", "model"],
        long=matched,
    )


def contrasts_display(contrasts: pd.DataFrame) -> pd.DataFrame:
    """The LR-fair differences as the report shows them: one row per contrast."""
    rows = contrasts.to_dict("records")
    shown = pd.DataFrame(
        {
            "task": contrasts["task"],
            "contrast": contrasts["contrast"],
            "setting": [
                f"{r['model']} · {r['init'] if r['contrast'].startswith('full') else r['finetune_label']}"
                for r in rows
            ],
            "lr (a / b)": [f"{r['lr_a']:.3g} / {r['lr_b']:.3g}" for r in rows],
            "n": contrasts["n"],
            "difference [95% CI]": [tables.interval_text(r, label="") for r in rows],
            "d_z [95% CI]": [
                f"{r['d_z']:.2f} [{r['d_z_low']:.2f}, {r['d_z_high']:.2f}]" for r in rows
            ],
            "p (BH)": [p_bh_text(r["p"], r["p_adjusted"]) for r in rows],
            "p (sign-flip; exact to 16 pairs)": [
                sign_flip_text(r["p_sign_flip"], r["p_sign_flip_min"], r["n"], r["p_sign_flip_se"])
                for r in rows
            ],
            "detectable at 80% power (pp)": [
                tables.detectable_text(r) if np.isfinite(r["detectable"]) else "—" for r in rows
            ],
            "seeds": contrasts["headline"],
            "family": contrasts["family"],
            "note": contrasts["note"],
        }
    )
    return shown


def sign_flip_text(p: float, least: float, n: int, se: float) -> str:
    """The sign-flip p (a Monte Carlo one with its SE), or why it is not shown (its least
    value is above 0.05)."""
    if not np.isfinite(least) or not n:
        return ""
    if least >= tables.ALPHA:
        return f"— (least possible {least:.2g} at {n} pairs)"
    return tables.monte_carlo_text(p, se)


def t6_wide(table: pd.DataFrame, text) -> pd.DataFrame:
    return tables.table6_wide(table, text)
