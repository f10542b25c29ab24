"""Learning-rate fairness: every arm at its own best learning rate (chosen on validation)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.report.published import paper_lr
from scale_fpt.report.tables.cells import (
    ARM_KEYS,
    DEFAULT_METRIC,
    FINETUNE_ORDER,
    INIT_ORDER,
    SEARCH_ARM_KEYS,
    SEARCHED,
    SELECTION,
    annotate,
    cell_summary,
    disambiguate,
    empty_table,
    finish,
    prepare,
    rank,
)
from scale_fpt.report.tables.display import cell_text, count


def lr_points(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Every candidate (lr, batch size) of every arm run at two or more learning rates: the
    selection ``score`` (mean ``best_val_accuracy`` over its seeds, %), ``score_std``,
    ``n_seeds``, and the metric's statistics over those seeds (``cell_summary``)."""
    df = prepare(trials, metric)
    keys = list(SEARCH_ARM_KEYS)
    n_lrs = df[df["used"]].groupby(keys, dropna=False)["lr"].nunique()
    searched = set(n_lrs[n_lrs > 1].index)
    df = df[[tuple(r) in searched for r in df[keys].itertuples(index=False)]]
    records = []
    for _, group in df.groupby([*keys, *SEARCHED], dropna=False, sort=False):
        first = group.iloc[0]
        used = group[group["used"]]
        record = {k: first[k] for k in (*ARM_KEYS, "kind", "model_label")}
        record.update({k: first[k] for k in ("init_label", "finetune")})
        record["arm"] = (
            f"{first['model_label']} · {first['init_label']} · {first['finetune_label']}"
        )
        record["score"] = float(used[SELECTION].mean() * 100)
        record["score_std"] = float(used[SELECTION].std() * 100)
        record["n_seeds"] = int(used["seed"].nunique())
        record.update(cell_summary(group))
        records.append(record)
    return pd.DataFrame(records)


LR_SELECTION = (
    "arms (task, model, init, finetune, steps) run at two or more learning rates (LR "
    "searches, whatever the sweep's name); each arm's candidates are its (lr, batch size) "
    "configurations, each trained for every seed; the best is the one with the highest mean "
    "best_val_accuracy over its seeds (ties: the lower rate), and the cell reports test "
    "accuracy at each seed's selected step there"
)


def lr_fair(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Each arm at its own best learning rate (Rothermel et al. 2021): for every arm run at
    several rates, the (lr, batch size) with the highest mean ``best_val_accuracy`` over
    seeds (ties: the lower rate) as ``best_lr``/``batch_size``; the metric's mean, std and
    95% interval over the seeds there (``n``); the best configuration at the paper's rate
    beside it (``paper_lr_mean``/``_std``/``_ci95``/``_n``, NaN when that rate was not run);
    and how many configurations were tried (``n_candidates``).

    Selection reads validation only; the reported test accuracies were never chosen on."""
    points = lr_points(trials, metric)
    df = prepare(trials, metric)
    title = "LR-fair comparison: every arm at its own best learning rate"
    if points.empty:
        return annotate(empty_table("LR"), title, LR_SELECTION, df.iloc[:0], df.iloc[:0])
    records = []
    for _, group in points.groupby(list(SEARCH_ARM_KEYS), dropna=False, sort=False):
        group = group.sort_values(["lr", "batch_size"]).reset_index(drop=True)
        best = group.loc[group["score"].idxmax()].to_dict()
        at_paper = group[np.isclose(group["lr"], paper_lr(best["task"]), rtol=1e-9, atol=0)]
        paper = at_paper.loc[at_paper["score"].idxmax()] if len(at_paper) else None
        search = points.loc[group_index(points, best)]
        best.update(
            wall_time_s=float(search["wall_time_s"].sum()),
            samples_seen=float(search["samples_seen"].sum()),
            total_flops=float(search["total_flops"].sum()),
            n_search_trials=int(search["n_trials"].sum()),
        )
        best.update(
            table="LR",
            row=best["arm"],
            order=(best["total_params"] or 0) * 1000
            + rank(best["init_label"], INIT_ORDER) * 10
            + rank(best["finetune_label"], FINETUNE_ORDER),
            best_lr=best["lr"],
            lrs=",".join(f"{v:.3g}" for v in group["lr"].unique()),
            n_lrs=group["lr"].nunique(),
            n_candidates=len(group),
            batch_sizes=",".join(str(int(b)) for b in sorted(group["batch_size"].unique())),
            **{
                f"paper_lr_{k}": math.nan if paper is None else paper[k]
                for k in ("mean", "std", "ci95", "n", "batch_size", "score")
            },
            gain_over_paper_lr=best["mean"] - (math.nan if paper is None else paper["mean"]),
        )
        records.append(best)
    out = pd.DataFrame(records)
    out = finish(disambiguate(out, keys=("max_steps", "weights")))
    out.attrs["compute_scope"] = "the whole search of each arm: every rate and seed"
    ids = set(",".join(points["trial_ids"]).split(","))
    used = df[df["trial_id"].isin(ids) & df["used"]]
    return annotate(out, title, LR_SELECTION, used, df.iloc[:0])


def group_index(points: pd.DataFrame, arm: dict) -> pd.Series:
    """Rows of ``points`` of the same search arm as ``arm``."""
    mask = pd.Series(True, index=points.index)
    for key in SEARCH_ARM_KEYS:
        mask &= points[key] == arm[key]
    return mask


def lr_text(cell) -> str:
    """'85.0 ± 7.1 (n=2, CI ±63.5) @ lr 0.001 (best of 3 configurations); lr 0.001:
    85.0 ± 7.1 (n=2, CI ±63.5)'."""
    if not cell["n"]:
        return f"— {cell['note']}"
    text = cell_text(cell) + f" @ lr {cell['best_lr']:.3g}"
    if "," in str(cell.get("batch_sizes", "")):
        text += f", bs {int(cell['batch_size'])}"
    text += f" (best of {int(cell['n_candidates'])} configurations)"
    paper = {
        "n": count({"n": cell.get("paper_lr_n")}),
        **{k: cell.get(f"paper_lr_{k}", math.nan) for k in ("mean", "std", "ci95")},
    }
    if paper["n"]:
        text += f"; lr {paper_lr(cell['task']):g}: {cell_text(paper)}"
    else:
        text += f"; lr {paper_lr(cell['task']):g} not run"
    return text
