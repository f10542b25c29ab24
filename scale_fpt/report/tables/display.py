"""Display: cells as text, long tables in the paper's wide shape (rows x tasks)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.published import TASK_COLUMNS
from scale_fpt.report.stats import no_spread_note
from scale_fpt.report.tables.cells import INIT_ORDER, trial_config
from scale_fpt.task_registry import TASKS


def cell_text(cell) -> str:
    """'60.0 ± 10.0 (n=3, CI ±24.8)', '†' when a seed diverged, or '— reason'."""
    if cell.get("table") == "T4":
        return steps_text(cell)
    if not cell["n"]:
        return f"— {cell['note']}"
    text = f"{cell['mean']:.1f}"
    if cell["n"] > 1:
        text += f" ± {cell['std']:.1f} (n={cell['n']}, {spread_text(cell, '.1f')})"
    else:
        text += " (n=1)"
    if cell.get("dagger"):
        text += f" † {cell['n_diverged']}/{cell['n']} diverged"
    return text + not_used(cell)


def not_used(cell) -> str:
    """' [not used: 1 stopped]': trials of the cell left out of its numbers (stopped by a
    scheduler, failed, ...), so that no table drops one silently."""
    excluded = cell.get("excluded")
    return f" [not used: {excluded}]" if isinstance(excluded, str) and excluded else ""


def steps_text(cell) -> str:
    """'200 ± 100 (n=3, CI ±248)', '>1000 (0/3 reached)', or a speed-up ('3x', '>2x')."""
    if isinstance(cell.get("speedup_text"), str) and cell["speedup_text"]:
        return cell["speedup_text"]
    if not cell["n"]:
        return f"— {cell['note']}"
    if not cell["all_reached"]:
        reached = f"{int(cell['n_reached'])}/{int(cell['n'])} reached"
        return f">{steps_number(cell['lower_bound'])} ({reached})" + not_used(cell)
    if cell["n"] == 1:
        return f"{steps_number(cell['mean'])} (n=1)" + not_used(cell)
    return (
        f"{steps_number(cell['mean'])} ± {steps_number(cell['std'])} "
        f"(n={int(cell['n'])}, {spread_text(cell, '.0f')})"
    ) + not_used(cell)


def spread_text(cell, digits: str) -> str:
    """'CI ±24.8', or 'no spread (all 3 seeds equal)' where the seeds tie (a ceiling, steps
    on an evaluation grid): never a zero-wide 95% interval."""
    if cell["ci95"] == 0:
        return no_spread_note(int(cell["n"]))
    return f"CI ±{format(cell['ci95'], digits)}"


def steps_number(value: float) -> str:
    return f"{value:.0f}" if abs(value) < 1e5 else f"{value:.3g}"


def published_text(cell) -> str:
    value = cell.get("published")
    if value is None or not np.isfinite(value):
        return ""
    dagger = cell.get("published_diverged")
    text = f"{value:g}" + ("†" if isinstance(dagger, bool | np.bool_) and dagger else "")
    if cell.get("table") == "T4" and str(cell.get("row", "")).startswith("speed-up"):
        text += "x"
    if cell.get("like_for_like"):
        return f"{text} (Δ {cell['published_diff']:+.1f})"
    return f"{text} (ref.)"


def count(cell) -> int:
    n = cell.get("n")
    return 0 if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)


def compute_text(cell) -> str:
    """Wall time, samples and FLOPs summed over a cell's trials ('—' for an empty cell)."""
    if not count(cell):
        return (
            "—" if "speedup_text" not in cell or not isinstance(cell["speedup_text"], str) else ""
        )
    return (
        f"{cell['wall_time_s'] / 3600:.3g} h · {cell['samples_seen']:.3g} samples · "
        f"{cell['total_flops']:.3g} FLOP"
    )


def wide(table: pd.DataFrame, text=cell_text, columns: str = "task") -> pd.DataFrame:
    """The paper's shape: one row per row label, one column per task, display strings.
    A (row, task) pair without any trial reads '— no trials'."""
    if table.empty:
        return pd.DataFrame()
    order = list(dict.fromkeys(table["row"]))
    tasks = [t for t in TASK_COLUMNS if t in set(table[columns])] + sorted(
        set(table[columns]) - set(TASK_COLUMNS)
    )
    out = pd.DataFrame("— no trials", index=order, columns=tasks)
    for cell in table.to_dict("records"):
        out.loc[cell["row"], cell[columns]] = text(cell)
    out.index.name = table.attrs.get("row_name", "")
    return out


def reference_notes(table: pd.DataFrame) -> list[str]:
    """Why published numbers beside this table are reference only (one line per reason)."""
    if table.empty or "comparison" not in table:
        return []
    notes = table.loc[table["comparison"].fillna("").str.startswith("reference"), "comparison"]
    return sorted(set(notes))


def table6_wide(table: pd.DataFrame, text=cell_text) -> pd.DataFrame:
    """Table 6 as published: rows (task, model); columns layers, total and trained
    parameters, and one accuracy column per init."""
    if table.empty:
        return pd.DataFrame()
    inits = [i for i in INIT_ORDER if i in set(table["init_label"])]
    rows = []
    for (task, row), group in table.groupby(["task", "row"], sort=False):
        record = {
            "task": task,
            "model": row,
            "layers": group["n_layer"].iloc[0],
            "total params": human(group["total_params"].iloc[0]),
            "trained params": human(group["trainable_params"].iloc[0]),
        }
        by_init = {c["init_label"]: c for c in group.to_dict("records")}
        for init in inits:
            record[init] = text(by_init[init]) if init in by_init else "— no trials"
        rows.append(record)
    return pd.DataFrame(rows).set_index(["task", "model"])


def human(n) -> str:
    if n is None or (isinstance(n, float) and not np.isfinite(n)):
        return ""
    n = float(n)
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def baseline_text(task: str) -> str:
    """What a task's accuracy is without learning it (its registry entry's baseline)."""
    entry = TASKS.get(task)
    return entry.baseline.how if entry is not None else ""


LISTOPS_TEST_SET = ("data_dir", "max_length", "listops_max_depth", "listops_max_args",
                    "test_batches", "test_seed", "test_limit")  # fmt: skip
"""The config fields that decide which ListOps test set a trial scored on."""


def baselines(trials: pd.DataFrame) -> dict[str, str]:
    """Per task of ``trials``: what its accuracy is without learning it. ListOps: the
    majority-class share measured on each test set its trials used (``majority_rate``; a
    test set that cannot be read here, e.g. LRA files elsewhere, keeps the table's text);
    every other task: ``baseline_text``."""
    out = {task: baseline_text(task) for task in dict.fromkeys(trials.get("task", []))}
    if "listops" not in out:
        return out
    # The ListOps reader loads torch: imported only when a report holds ListOps trials.
    from scale_fpt.tasks.base import DataUnavailable
    from scale_fpt.tasks.listops import majority_rate

    rows = trials[trials["task"] == "listops"]
    measured = []
    for _, row in rows.drop_duplicates([c for c in LISTOPS_TEST_SET if c in rows]).iterrows():
        config = trial_config(row)
        if config is None:
            continue
        try:
            rate = majority_rate(config.task)
        except (DataUnavailable, OSError):
            continue
        source = "LRA basic_test" if config.task.data_dir else "generated"
        measured.append(
            f"majority class {rate:.1%} (measured on the {config.task.max_length or 512}-token "
            f"{source} test set)"
        )
    if measured:
        out["listops"] = "; ".join(measured) + "; chance 10%"
    return out
