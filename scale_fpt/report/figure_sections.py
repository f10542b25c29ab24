"""The report's figure sections: the scaling curve, learning curves, accuracy vs learning rate,
steps to threshold and the attention maps of bit-task checkpoints, each saved as PNG with
the CSV of the data drawn."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scale_fpt.config import ConfigError
from scale_fpt.confined import write_file, write_text
from scale_fpt.published import TASK_TITLES
from scale_fpt.report import figures, tables
from scale_fpt.report.render import Document, escape_md
from scale_fpt.report.sections import first_line


def save_figure(doc: Document, out: Path, name: str, fig, data: pd.DataFrame, caption: str):
    write_file(out / "figures" / f"{name}.png", lambda f: fig.savefig(f, format="png", dpi=100))
    write_text(out / "figures" / f"{name}.csv", data.to_csv(index=False))
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
                f"Validation curves on {TASK_TITLES.get(task, task)}: each seed (thin; at most "
                f"{figures.MAX_SEED_LINES} an arm, the first by trial id, so that thousands of "
                "seeds stay legible: the legend says how many were drawn), mean and 95% "
                "interval over every seed (n per arm in the legend); a seed that ended early "
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
    # torch and the bit tasks load only for the maps: a report without them (--no-attention)
    # is spared their import, about 300 MB and seconds.
    from scale_fpt.report import attention

    doc.heading(2, "Attention maps (bit tasks)")
    chosen, arms = attention.attention_trials(trials)
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
        "uniform = the share uniform attention over the causal prefix would give. "
        f"{len(chosen)} trial(s) drawn, one per arm (its seed with the best validation "
        f"accuracy), of {arms} arm(s) with a checkpoint"
        + (
            f" (at most {attention.ATTENTION_LIMIT}: each costs a model build)."
            if arms > len(chosen)
            else "."
        )
    )
    for row in chosen.to_dict("records"):
        name = (
            f"{row['task']} · {tables.model_label(row['model'])} · {row['init']} · "
            f"{row['finetune']} · lr {row['lr']:g} · seed {row['seed']}"
        )
        doc.heading(3, escape_md(f"{name} (trial {row['trial_id']})"))
        try:
            result = attention.trial_attention(row, results_dir, examples)
        except ConfigError as e:  # e.g. pretrained weights not available here
            doc.para(f"Not analysed: {escape_md('; '.join(e.problems))}")
            continue
        except Exception as e:  # a damaged or foreign file: named, the report goes on
            doc.para(f"Not analysed: {escape_md(first_line(str(e), 300))}")
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
        write_text(out / "figures" / f"{key}_shares.csv", shares.to_csv(index=False))
        columns = [
            "output_position",
            "relevant_positions",
            "share_last_layer",
            "share_mean_layers",
            "uniform_share",
        ]
        doc.table(shares[columns].round(3))
