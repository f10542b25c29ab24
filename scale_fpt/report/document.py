"""The report document: every table and figure of a results directory in one Markdown file
(``report.md``) and a self-contained HTML copy (``report.html``, images embedded), with the
figures (PNG + CSV of the data drawn) under ``figures/`` and each table's long form (one row
per cell: statistics, trial ids, compute, published number) under ``tables/``.

    report.md
      Trials             status per sweep, every trial not used and why
      Conventions        metric, spread, learning rates, like-for-like rule, thresholds
      Table 1..8, LR     per table: which trials it used; the table in the paper's shape;
                         the published numbers beside it; compute per cell
      Figures            scaling curve, learning curves, accuracy vs lr, steps to threshold
      Attention maps     per bit-task checkpoint: maps and the share on the relevant inputs
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt import analysis_plan
from scale_fpt.config import ConfigError
from scale_fpt.published import TASK_TITLES
from scale_fpt.report import attention, figures, scaling_section, tables
from scale_fpt.report.tables.families import EXPLORATORY, adjust_in_families
from scale_fpt.results import ResultsError, load_results

MAX_LISTED_IDS = 30


@dataclass
class Document:
    """Blocks rendered to Markdown and HTML alike: (kind, payload)."""

    root: Path
    blocks: list = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("bullets", items))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(("table", frame))

    def image(self, relative: str, caption: str) -> None:
        self.blocks.append(("image", (relative, caption)))

    def markdown(self) -> str:
        out = []
        for kind, payload in self.blocks:
            if kind == "heading":
                out.append("#" * payload[0] + " " + payload[1])
            elif kind == "para":
                out.append(payload)
            elif kind == "bullets":
                out.append("\n".join(f"- {item}" for item in payload))
            elif kind == "table":
                out.append(markdown_table(payload))
            elif kind == "image":
                relative, caption = payload
                csv = Path(relative).with_suffix(".csv")
                data = f" ([data]({csv}))" if (self.root / csv).exists() else ""
                out.append(f"![{caption}]({relative})\n\n*{caption}*{data}")
        return "\n\n".join(out) + "\n"

    def html(self) -> str:
        out = [
            "<!doctype html><html><head><meta charset='utf-8'><title>scale_fpt report</title>",
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
            "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
            "padding:3px 6px}img{max-width:100%}</style></head><body>",
        ]
        for kind, payload in self.blocks:
            if kind == "heading":
                out.append(f"<h{payload[0]}>{html.escape(payload[1])}</h{payload[0]}>")
            elif kind == "para":
                out.append(f"<p>{inline_html(payload)}</p>")
            elif kind == "bullets":
                items = "".join(f"<li>{inline_html(i)}</li>" for i in payload)
                out.append(f"<ul>{items}</ul>")
            elif kind == "table":
                out.append(html_table(payload))
            elif kind == "image":
                relative, caption = payload
                data = base64.b64encode((self.root / relative).read_bytes()).decode()
                out.append(
                    f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(caption)}'>"
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
        return "\n".join(out) + "</body></html>\n"


LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
BOLD = re.compile(r"\*\*(.+?)\*\*")
CODE = re.compile(r"`([^`]+)`")


def inline_html(text: str) -> str:
    """A paragraph's Markdown links, **bold** and `code` as HTML, everything else escaped."""
    out = html.escape(text, quote=False)
    out = LINK.sub(lambda m: f'<a href="{html.escape(m[2])}">{m[1]}</a>', out)
    out = BOLD.sub(r"<strong>\1</strong>", out)
    return CODE.sub(r"<code>\1</code>", out)


def rows_of(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    show_index = frame.index.name is not None or not isinstance(frame.index, pd.RangeIndex)
    names = [str(n or "") for n in frame.index.names] if show_index else []
    header = names + [str(c) for c in frame.columns]
    body = []
    for index, row in zip(frame.index, frame.itertuples(index=False), strict=True):
        keys = (list(index) if isinstance(index, tuple) else [index]) if show_index else []
        body.append([display(v) for v in (*keys, *row)])
    return header, body


def display(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{value:.4g}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "*(empty)*"
    header, body = rows_of(frame)

    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)])


def html_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p><em>(empty)</em></p>"
    header, body = rows_of(frame)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


# --------------------------------------------------------------------------- sections


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
            "exact sign-flip p only where its n can reach 0.05, and the smallest difference "
            "the n detects at 80% power; Welch where no seed is shared. Each table's p-values "
            "are one family, Benjamini-Hochberg adjusted. Steps to threshold are censored "
            "data: a seed that ran its budget without reaching it is censored at its last "
            "step, one that diverged or stopped on patience never reaches it; Kaplan-Meier "
            "medians (with a 95% interval from "
            f"{tables.KM_INTERVAL_MIN_SEEDS} seeds an arm, where it is calibrated) and the "
            "log-rank test with its exact permutation p (at 3 + 3 seeds it cannot go below "
            "0.1).",
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
        f"Selection: {a.get('selection', '')}",
        f"trials used: {a.get('used', 0)} of {a.get('matched', 0)} matching ({diverged} of "
        "them diverged)",
        f"sweeps: {', '.join(a.get('sweeps', [])) or 'none'}",
    ]
    if a.get("not_used"):
        parts.append("not used: " + ", ".join(f"{n} {r}" for r, n in a["not_used"].items()))
    if a.get("other_lr"):
        parts.append(
            f"{a['other_lr']} trials at other learning rates of an LR search left out "
            "(see the LR-fair table)"
        )
    ids = a.get("trial_ids", [])
    if ids and len(ids) <= MAX_LISTED_IDS:
        parts.append("trial ids: " + ", ".join(ids))
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
        doc.bullets(tables.reference_notes(table))
    doc.para(compute_line(table))
    doc.table(wide_fn(table, tables.compute_text))
    path = out / "tables" / f"{key}.csv"
    table.to_csv(path, index=False)
    doc.para(f"Cells in long form: [tables/{key}.csv](tables/{key}.csv).")


def baselines_line(tasks, baselines: dict) -> str:
    """'Baselines (...): bit-xor chance 50% ...' of the tasks shown (``tables.baselines``)."""
    known = [t for t in dict.fromkeys(tasks) if baselines.get(t)]
    return (
        "Baselines (an accuracy at one of these means the arm did not learn): "
        + "; ".join(f"{t} {baselines[t]}" for t in known)
        + "."
        if known
        else ""
    )


def save_figure(doc: Document, out: Path, name: str, fig, data: pd.DataFrame, caption: str):
    fig.savefig(out / "figures" / f"{name}.png", dpi=100)
    data.to_csv(out / "figures" / f"{name}.csv", index=False)
    doc.image(f"figures/{name}.png", caption)


def figures_section(doc, out, trials, curves, t4, metric) -> None:
    doc.heading(2, "Figures")
    fig, data = figures.scaling_figure(trials, metric)
    if len(data):
        save_figure(
            doc, out, "scaling", fig, data, "Accuracy vs total parameters (frozen, fpt), per init"
        )
    used = tables.prepare(trials, metric)
    for task in figures.task_order(used.loc[used["used"], "task"]):
        fig, data = figures.learning_curves_figure(trials, curves, task)
        if len(data):
            save_figure(
                doc,
                out,
                f"curves_{task}",
                fig,
                data,
                f"Validation curves on {TASK_TITLES.get(task, task)}: every seed (thin), mean "
                "and 95% interval over seeds (n per arm in the legend); a seed that ended early "
                "(diverged, patience) is carried at its last value (dotted), so the mean never "
                "drops it (n_carried per step in the CSV)",
            )
    fig, data = figures.lr_figure(trials, metric)
    if len(data):
        save_figure(
            doc,
            out,
            "lr",
            fig,
            data,
            "Validation selection score (mean best validation accuracy over the selection "
            "seeds) vs learning rate (LR searches); star: each arm's chosen rate",
        )
    if len(t4):
        fig, data = figures.steps_figure(t4)
        if len(data):
            save_figure(
                doc,
                out,
                "steps",
                fig,
                data,
                "Steps to the threshold accuracy: bars the mean over seeds (± SD; hatched: a "
                "lower bound, some seed never reached it), every seed a point (open triangle: "
                "never reached, drawn at its last evaluated step); n per bar under its label",
            )


def attention_section(doc, out, trials, results_dir, examples: int) -> None:
    doc.heading(2, "Attention maps (bit tasks)")
    chosen = attention.attention_trials(trials)
    if chosen.empty:
        doc.para(
            "No bit-xor / bit-memory transformer trial with a saved checkpoint in these results."
        )
        return
    doc.para(
        "Attention of the trained model on the first "
        f"{examples} examples of the fixed test set, averaged over heads and examples. Share = "
        "attention mass an output token puts on the inputs its answer depends on (bit-xor: "
        "output 5+i on inputs i and 5+i; bit-memory: query 100+j on j, 20+j, 40+j, 60+j, 80+j); "
        "uniform = the share uniform attention over the causal prefix would give. One trial "
        "per arm (its seed with the best validation accuracy)."
    )
    for row in chosen.to_dict("records"):
        name = (
            f"{row['task']} · {tables.model_label(row['model'])} · {row['init']} · "
            f"{row['finetune']} · lr {row['lr']:g} · seed {row['seed']}"
        )
        doc.heading(3, f"{name} (trial {row['trial_id']})")
        try:
            result = attention.trial_attention(row, results_dir, examples)
        except ConfigError as e:  # e.g. pretrained weights not available here
            doc.para(f"Not analysed: {'; '.join(e.problems)}")
            continue
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            doc.para(f"Not analysed: {first_line(str(e), 300)}")
            continue
        shares = result["shares"]
        doc.para(
            f"Mean share on the relevant inputs over the {len(shares)} output tokens: last "
            f"layer {shares['share_last_layer'].mean():.3f}, mean over layers "
            f"{shares['share_mean_layers'].mean():.3f} (uniform attention: "
            f"{shares['uniform_share'].mean():.3f})."
        )
        fig, data = figures.attention_figure(result["maps"], result["relevant"], row["task"])
        key = f"attention_{row['sweep']}_{row['trial_id']}"
        save_figure(doc, out, key, fig, data, f"Attention maps, {name}")
        shares.to_csv(out / "figures" / f"{key}_shares.csv", index=False)
        columns = [
            "output_position",
            "relevant_positions",
            "share_last_layer",
            "share_mean_layers",
            "uniform_share",
        ]
        doc.table(shares[columns].round(3))


# --------------------------------------------------------------------------- entry points


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
    results = load_results(results_dir)
    if results.trials.empty:  # e.g. every trials file damaged (each named by load_results)
        raise ResultsError([f"no readable trial rows under {results_dir}: nothing to report"])
    sweeps = sorted(set(results.trials["sweep"].dropna()))
    by_sweep = results.trials  # what each sweep ran, and where its checkpoints are
    if pool:
        results = dataclasses.replace(results, trials=tables.pool_sweeps(results.trials))
    out = Path(out) if out else Path(results_dir) / "report"
    for sub in ("figures", "tables"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    trials, curves = results.trials, results.curves
    doc = Document(out)
    doc.heading(1, "Frozen Pretrained Transformers: study report")
    shas = sorted(set(trials["git_sha"].dropna())) if len(trials) else []
    doc.para(
        f"Results: {Path(results_dir).absolute()} · generated "
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} · "
        f"code: {', '.join(shas) or 'unknown'}. Published numbers: Lu et al. 2021, "
        "'Pretrained Transformers as Universal Computation Engines'."
    )
    if pool and len(sweeps) > 1:
        doc.para(
            f"**Pooled (--pool):** the trials of {len(sweeps)} sweeps ({', '.join(sweeps)}) "
            "share cells wherever their settings agree. Seeds may repeat across sweeps (the "
            "same seed shares every random stream), so a pooled cell's n counts trials, not "
            "independent seeds, and its interval is too narrow by an unknown amount."
        )
    plans = analysis_plan.plans(results_dir, sweeps)
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
            "paired t p-value Benjamini-Hochberg adjusted over the rows of this table, d_z "
            "(mean difference / SD of the differences) with its exact noncentral-t interval, "
            "the exact sign-flip p where its n can reach 0.05 (6 pairs or more), and the "
            "smallest difference the n pairs detect at 80% power from their observed SD.",
            contrasts_display(contrasts),
            ["task", "contrast"],
        )
    differences = comparisons.init
    if not differences.empty:
        frame_section(
            doc,
            out,
            "Pretrained - random",
            "Each setting run with both inits: the accuracy difference paired on shared "
            "seeds (Welch where none is shared), p-values Benjamini-Hochberg adjusted over "
            "this table, and steps to each task's threshold as censored data (Kaplan-Meier "
            "medians, exact log-rank test).",
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
    (out / "report.md").write_text(doc.markdown())
    (out / "report.html").write_text(doc.html())
    return out / "report.md"


def frame_section(doc, out: Path, title: str, text: str, frame: pd.DataFrame, index) -> None:
    """A titled table of the report (and ``tables/<title>.csv``); nothing when empty."""
    if frame.empty:
        return
    doc.heading(2, title)
    doc.para(text)
    doc.table(frame.set_index(index))
    frame.to_csv(out / "tables" / f"{title.lower()}.csv", index=False)


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
    )


def sign_flip_text(p: float, least: float, n: int) -> str:
    """The exact sign-flip p, or why it is not shown (its least value is above 0.05)."""
    if not np.isfinite(least) or not n:
        return ""
    if least >= tables.ALPHA:
        return f"— (least possible {least:.2g} at {n} pairs)"
    return f"{p:.3g}"


@dataclass
class Comparisons:
    """Every comparison the report prints, with p-values adjusted in the families the
    analysis plans declared (``tables.families``)."""

    init: pd.DataFrame
    lr: pd.DataFrame
    matched: pd.DataFrame

    @classmethod
    def compute(cls, trials, curves, metric, thresholds, plans) -> Comparisons:
        init = tables.init_difference(trials, metric, curves, thresholds)
        contrast = "pretrained - random"
        init = adjust_in_families(init, plans, "accuracy", "accuracy_p", contrast,
                                  "accuracy_family")  # fmt: skip
        init = adjust_in_families(init, plans, "steps to threshold", "steps_logrank_p",
                                  contrast, "steps_family")  # fmt: skip
        lr = adjust_in_families(tables.lr_differences(trials, metric), plans, "accuracy",
                                "p_t", "contrast", "family")  # fmt: skip
        frames = [tables.matched_differences(trials, curves, m) for m in ("flops", "examples")]
        frames = [f for f in frames if not f.empty]
        matched = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        matched = adjust_in_families(matched, plans, "matched budgets", "p", "contrast", "family")
        return cls(init, lr, matched)

    def findings(self, baselines: dict) -> pd.DataFrame:
        """One row per accuracy comparison: what, difference [95% CI], each arm's accuracy, n,
        p (BH within its family), the difference its n detects at 80% power, the task's
        baselines (``tables.baselines``), planned or exploratory."""
        rows, by_numbers, repeated = [], {}, {}
        for r in self.init.to_dict("records"):
            means = {"pretrained": r["accuracy_pretrained"], "random": r["accuracy_random"]}
            rows.append(finding(r, INIT_KEYS, "pretrained - random", r["accuracy_family"],
                                f"{r['model']} · {r['finetune_label']} · lr {r['lr']:g}",
                                means=means))  # fmt: skip
            by_numbers[same_numbers(r, rows[-1])] = rows[-1]
        for r in self.lr.to_dict("records"):
            rows.append(finding(r, LR_KEYS, f"{r['contrast']} (each at its best lr)", r["family"],
                                f"{r['model']} · {r['headline']}", r.get("note", "")))  # fmt: skip
        for r in self.matched.to_dict("records"):
            means = dict(zip(r["contrast"].split(" - "), (r["mean_a"], r["mean_b"]), strict=True))
            row = finding(r, MATCHED_KEYS, f"{r['contrast']} at equal {r['match']}", r["family"],
                          f"{r['model']} · lr {r['lr']:g}", means=means)  # fmt: skip
            # Arms that ran the same steps at the same cost compare the same at equal FLOPs or
            # examples: one row, with a note, instead of the same numbers three times.
            same = by_numbers.get(same_numbers(r, row))
            if same is not None and same["status"] == row["status"]:
                repeated.setdefault(id(same), (same, []))[1].append(r["match"])
                continue
            rows.append(row)
        for same, matches in repeated.values():
            said = f"the same at equal {' and at equal '.join(matches)} (Matched budgets)"
            same["note"] = "; ".join(filter(None, (same["note"], said)))
        table = pd.DataFrame(rows)
        if not table.empty:
            table.insert(table.columns.get_loc("status"), "baselines", table["task"].map(baselines))
        return table


def same_numbers(row: dict, shown: dict) -> tuple:
    """What makes two findings one: the sweep, task, model and lr of the comparison's ``row``
    and the difference, accuracies and n it ``shown``."""
    return (row["sweep"], row["task"], row["model"], row["lr"],
            *(shown[k] for k in ("difference (pp) [95% CI]", "accuracies (%)", "n")))  # fmt: skip


def finding(
    row: dict, keys: dict, contrast: str, family: str, setting: str, note="", means=None
) -> dict:
    """A row of the findings: ``keys`` maps diff, ci_low, ci_high, n, p, p_adjusted and
    detectable to ``row``'s columns; ``means``: each arm's mean accuracy (%), shown beside
    the task's baselines."""

    def get(key):
        value = row.get(keys.get(key, key), math.nan)
        return math.nan if value is None else float(value)

    p, n = get("p"), get("n")
    return {
        "task": row["task"],
        "comparison": contrast,
        "setting": f"{setting} · {row['sweep']}",
        "difference (pp) [95% CI]": pp_interval_text(get("diff"), get("ci_low"), get("ci_high")),
        "accuracies (%)": " · ".join(f"{arm} {value:.1f}" for arm, value in (means or {}).items()),
        "n": int(n) if math.isfinite(n) else "",
        "p (BH)": f"{p:.2g} ({get('p_adjusted'):.2g})" if math.isfinite(p) else "—",
        "detectable at 80% power (pp)": (
            f"{get('detectable'):.2g}" if math.isfinite(get("detectable")) else "—"
        ),
        "status": "exploratory" if family == EXPLORATORY else "planned",
        "note": note,
    }


def pp_interval_text(diff: float, low: float, high: float) -> str:
    """A difference in pp with its interval, '+1.8 [+0.9, +2.7]'; '+1.8 (no interval)' where the
    seeds give none (one pair)."""
    if not math.isfinite(diff):
        return "—"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{diff:+.1f} (no interval)"
    return f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]"


INIT_KEYS = {k: f"accuracy_{k}" for k in ("diff", "ci_low", "ci_high", "p", "p_adjusted",
                                           "detectable")} | {"n": "accuracy_n_pairs"}  # fmt: skip
LR_KEYS = {"p": "p_t", "p_adjusted": "p_t_adjusted"}
MATCHED_KEYS = {"n": "n_pairs"}


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
        "analysis plan declared, and the smallest difference its n detects with 80% power "
        "at the observed spread of the paired differences: a difference below it is not "
        "evidence of no effect. 'exploratory': outside the sweep's analysis plan. A task's "
        "accuracy at one of its baselines means the arm did not learn."
    )
    doc.table(table.set_index(["task", "comparison"]))
    table.to_csv(out / "tables" / "findings.csv", index=False)


def power_section(doc: Document, out: Path, comparisons: Comparisons, seeds_for) -> None:
    """Per paired comparison: the observed SD of its paired differences, its n, the
    difference it detects at 80% power and, with ``seeds_for``, the seeds that detect that
    many pp (``stats.seeds_needed``). Always written to tables/power.csv."""
    rows = []
    sources = (
        (comparisons.init, "accuracy_", "pretrained - random"),
        (comparisons.lr, "", None),
        (comparisons.matched, "", None),
    )
    for frame, prefix, contrast in sources:
        for r in frame.to_dict("records"):
            sd = r.get(f"{prefix}sd_diff", math.nan)
            n = r.get(f"{prefix}n_pairs", r.get("n_pairs", r.get("n")))
            if not (isinstance(sd, float) and sd > 0):
                continue
            row = {
                "task": r["task"],
                "comparison": contrast
                or r["contrast"] + (f" at equal {r['match']}" if "match" in r else ""),
                "sweep": r["sweep"],
                "n pairs": int(n),
                "SD of differences (pp)": round(sd, 3),
                "detectable at 80% power (pp)": round(r[f"{prefix}detectable"], 3),
            }
            if seeds_for is not None:
                needed = tables.seeds_needed(sd, seeds_for)
                row[f"seeds to detect {seeds_for:g} pp"] = needed or "more than 10,000"
            rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return
    doc.heading(2, "Power")
    doc.para(
        "For each paired comparison: the spread of its paired differences, the smallest true "
        "difference its n pairs detect with 80% power (two-sided paired t, level 0.05) at "
        "that spread"
        + (f", and the seeds that detect {seeds_for:g} pp" if seeds_for is not None else "")
        + ". `scale-fpt report RESULTS --seeds-for PP` answers for a difference of PP pp."
    )
    doc.table(table.set_index(["task", "comparison"]))
    table.to_csv(out / "tables" / "power.csv", index=False)


def plan_section(doc: Document, sweeps: list[str], plans: dict) -> None:
    doc.heading(2, "Analysis plan")
    lines = []
    for sweep in sweeps:
        plan = plans.get(sweep)
        if plan is None:
            lines.append(f"{sweep}: no analysis plan (written before plans existed, or not by "
                         "a sweep): every comparison is exploratory.")  # fmt: skip
            continue
        lines.append(
            f"{sweep} (plan of {plan.sweep}, written {plan.written}, schema "
            f"{plan.schema_version}): primary metric `{plan.primary_metric}`, selection on "
            f"`{plan.selection_metric}`; thresholds "
            + ", ".join(f"{t} {v:.3g}" for t, v in plan.thresholds.items())
            + f"; families: {', '.join(plan.families) or 'none'}; scaling law "
            f"`{plan.law_form}`; seeds: selection {plan.seeds.get('selection')}, "
            f"confirmation {plan.seeds.get('confirmation') or 'none'}."
        )
    doc.bullets(lines)


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
            "n pairs": contrasts["n"],
            "difference [95% CI]": [
                f"{r['diff']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]" for r in rows
            ],
            "d_z [95% CI]": [
                f"{r['d_z']:.2f} [{r['d_z_low']:.2f}, {r['d_z_high']:.2f}]" for r in rows
            ],
            "p (t, BH)": contrasts["p_t_adjusted"].map(lambda p: f"{p:.3g}"),
            "p (sign-flip, exact)": [
                sign_flip_text(r["p_sign_flip"], r["p_sign_flip_min"], r["n"]) for r in rows
            ],
            "detectable at 80% power (pp)": contrasts["detectable"].map(lambda d: f"{d:.2g}"),
            "seeds": contrasts["headline"],
            "family": contrasts["family"],
            "note": contrasts["note"],
        }
    )
    return shown


def t6_wide(table: pd.DataFrame, text) -> pd.DataFrame:
    return tables.table6_wide(table, text)


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
