"""The study's budgets and preprocessing against the paper's (what a comparison rests on)."""

from __future__ import annotations

import pandas as pd

from scale_fpt.published import TASK_COLUMNS
from scale_fpt.report.tables.cells import (
    INIT_ORDER,
    distinct_configs,
    paper_steps,
    prepare,
    rank,
    trial_config,
)
from scale_fpt.tasks.preprocessing import preprocessing


def budget_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Per task and init: the paper's steps to convergence beside the step budgets
    (``max_steps``) the trials had, the steps they took and why they stopped
    (``stop_reason``: budget, patience, diverged, scheduler, failed)."""
    df = prepare(trials)
    records = []
    for (task, init), group in df.groupby(["task", "init_label"], sort=False):
        reasons = group.get("stop_reason", pd.Series(dtype=str)).fillna("—").value_counts()
        records.append(
            {
                "task": task,
                "init": init,
                "paper steps (Table 4)": paper_steps(task, init),
                "budgets": ", ".join(f"{int(b):,}" for b in sorted(group["max_steps"].unique())),
                "steps done": f"{int(group['steps_done'].min()):,}–{int(group['steps_done'].max()):,}",
                "stop reasons": ", ".join(f"{r} {n}" for r, n in reasons.items()),
                "trials": len(group),
            }
        )
    if not records:
        return pd.DataFrame()
    out = pd.DataFrame(records)
    out = out.assign(task_rank=out["task"].map(lambda t: rank(t, TASK_COLUMNS)))
    out = out.assign(init_rank=out["init"].map(lambda i: rank(i, INIT_ORDER)))
    return out.sort_values(["task_rank", "init_rank"]).drop(columns=["task_rank", "init_rank"])


def preprocessing_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Every distinct preprocessing the trials used, per task: each aspect as done here, as
    the paper states it and as the reference code does it, and whether it is as published."""
    seen, records = set(), []
    for row in distinct_configs(trials)[1]:
        config = trial_config(row)
        if config is None:
            continue
        aspects = tuple(preprocessing(config))
        if (config.task.task, aspects) in seen:
            continue
        seen.add((config.task.task, aspects))
        for a in aspects:
            records.append(
                {
                    "task": config.task.task,
                    "aspect": a.name,
                    "here": a.here,
                    "paper": a.paper,
                    "reference code": a.reference,
                    "as published": "yes" if a.as_published else "no",
                }
            )
    out = pd.DataFrame(records)
    if out.empty:
        return out
    ranks_ = out["task"].map(lambda t: rank(t, TASK_COLUMNS))
    return out.assign(r=ranks_).sort_values("r", kind="stable").drop(columns="r")
