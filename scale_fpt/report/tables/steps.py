"""Table 4: steps to a threshold accuracy (read on validation), and speed-ups."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt import published
from scale_fpt.analysis_plan import thresholds_for
from scale_fpt.report.tables.cells import (
    ARM_KEYS,
    DEFAULT_METRIC,
    annotate,
    cells,
    finish,
    size_order,
)
from scale_fpt.report.tables.paper import frozen_transformers, init_rank, selected


def steps_to_threshold(
    trials: pd.DataFrame, curves: pd.DataFrame, limits: dict
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``trials``: (first evaluated step whose val_accuracy reaches its task's
    threshold in ``limits``, else NaN; last evaluated step, NaN without a curve). One pass
    over the curves, grouped by (sweep, trial_id), whatever the number of trials."""
    keys = ["sweep", "trial_id"]
    if curves.empty:
        nan = np.full(len(trials), math.nan)
        return nan, nan.copy()
    task = trials.drop_duplicates(keys).set_index(keys)["task"]
    data = curves[[*keys, "step"]].join(task.map(limits).rename("limit"), on=keys)
    accuracy = curves.get("val_accuracy", math.nan)
    data["hit"] = data["step"].where(accuracy >= data["limit"])
    found = data.groupby(keys)[["hit", "step"]].agg({"hit": "min", "step": "max"})
    found = found.reindex(pd.MultiIndex.from_frame(trials[keys]))
    return found["hit"].to_numpy(float), found["step"].to_numpy(float)


def steps_summary(group: pd.DataFrame) -> dict:
    """T4 cell: seeds that reached the threshold, and a lower bound on the mean steps where
    some did not (each unreached seed counted at its last evaluated step); each seed's steps
    (``seed_steps``, an unreached one at its last evaluated step) and whether it reached the
    threshold (``seed_reached``), in trial order."""
    used = group[group["used"]]
    reached = used["steps"].notna()
    bounded = used["steps"].where(reached, used["last_step"])
    out = {
        "n": len(used),
        "n_reached": int(reached.sum()),
        "all_reached": bool(len(used)) and bool(reached.all()),
        "lower_bound": float(bounded.mean()) if len(used) else math.nan,
        "seed_steps": tuple(float(v) for v in bounded),
        "seed_reached": tuple(bool(v) for v in reached),
    }
    if len(used):
        out["note"] = ""
    if not out["all_reached"]:
        out.update(dict.fromkeys(("mean", "std", "ci95", "ci_low", "ci_high"), math.nan))
    return out


def table4_steps(trials: pd.DataFrame, curves: pd.DataFrame, thresholds=None) -> pd.DataFrame:
    """Table 4: gradient steps until the validation accuracy first reaches a threshold, per init of
    frozen (fpt) transformers, and the speed-up of each init over random (same model, lr,
    batch size). Computed from the learning curves (first evaluated step at or above the
    threshold); a seed that never reaches it is never given a number: its cell reads
    ``>bound`` (mean steps with unreached seeds counted at their last evaluated step)."""
    df, dropped = selected(trials, DEFAULT_METRIC, frozen_transformers)
    df = df.copy()
    limits = thresholds_for(sorted(set(df["task"])), thresholds)
    df["steps"], df["last_step"] = steps_to_threshold(df, curves, limits)
    no_curve = df["used"] & df["last_step"].isna()
    df.loc[no_curve, "used"] = False
    df.loc[no_curve, "reason"] = "no learning curve"
    df["value"] = df["steps"]
    paper = {"pretrained": "FPT", "random": "random"}
    out = cells(
        df,
        "T4",
        df["model_label"] + " · " + df["init_label"],
        df["init_label"].map(paper),
        size_order(df) * 10 + init_rank(df),
        extra=steps_summary,
    )
    if len(out):
        out["threshold"] = out["task"].map(limits)
        out = finish(pd.concat([out, speedups(out)], ignore_index=True))
    return annotate(
        out,
        "Table 4: gradient steps to reach the threshold accuracy",
        "transformers with finetune fpt, every init; threshold (validation accuracy) "
        + ", ".join(f"{t} {v:.3g}" for t, v in limits.items()),
        df,
        dropped,
    )


def speedups(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows ``speed-up · <row>``: mean steps of random / mean steps of the row's init, within
    the same task, model, trained groups, lr, batch size and length."""
    keys = [k for k in ARM_KEYS if k not in ("init", "weights")]
    records = []
    for _, group in steps.groupby(keys, dropna=False, sort=False):
        base = group[group["init_label"] == "random"]
        if base.empty:
            continue
        base = base.iloc[0]
        for cell in group[group["init_label"] != "random"].to_dict("records"):
            value, text = speedup(base, cell)
            paper_row = "speed-up" if cell["init_label"] == "pretrained" else None
            found = published.lookup("T4", paper_row, cell["task"]) if paper_row else None
            record = {k: cell[k] for k in (*ARM_KEYS, "kind", "model_label", "init_label")}
            record.update(
                table="T4",
                row=f"speed-up · {cell['row']}",
                order=cell["order"] + 0.5,
                finetune=cell["finetune"],
                threshold=cell["threshold"],
                speedup=value,
                speedup_text=text,
                paper_row=paper_row,
                published=found["value"] if found else math.nan,
                published_diverged=False,
                like_for_like=False,
                comparison="reference only: the paper counts steps to convergence, not to a "
                "threshold"
                if found
                else "",
            )
            records.append(record)
    return pd.DataFrame(records)


def speedup(base: pd.Series, cell: dict) -> tuple[float, str]:
    """(steps(random) / steps(init), display): a lower bound '>' when random did not reach
    the threshold in every seed; none when the init itself did not."""
    if not cell["n"] or not base["n"]:
        return math.nan, "— no usable trials"
    if not cell["all_reached"]:
        return math.nan, f"— {cell['init_label']} not reached"
    if base["all_reached"]:
        value = base["mean"] / cell["mean"]
        return value, f"{value:.3g}x"
    value = base["lower_bound"] / cell["mean"]
    return value, f">{value:.3g}x (random not reached)"
