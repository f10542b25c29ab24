"""Cells: the trials of one arm (one setting, differing only in seed), their labels, the
statistics over seeds and the comparison with the published cell."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt import published
from scale_fpt.config import (
    FIELD_TYPES,
    FINETUNE_PRESETS,
    GROUPS,
    ConfigError,
    TrialConfig,
    parse_finetune,
)
from scale_fpt.published import TASK_COLUMNS, paper_lr
from scale_fpt.report.stats import summarize
from scale_fpt.tasks.preprocessing import deviations
from scale_fpt.vocabulary import Status

USED_STATUSES = (Status.COMPLETED, Status.DIVERGED)
METRICS = ("test_accuracy", "val_accuracy", "final_test_accuracy")
"""What a table cell averages (none of them selects on test)."""
DEFAULT_METRIC = "test_accuracy"
SELECTION = "best_val_accuracy"
"""What every choice between candidates (learning rates, batch sizes) maximises."""
EXECUTION_FIELDS = (
    "seed",
    "finetune",  # as ``finetune_label``: 'fpt' and 'input+output+ln+pos' are one setting
    "accelerator",
    "compile",
    "workers",
    "zero_stage",
    "zero_offload",
    "activation_checkpointing",
    "eval_batch_size",
)
"""Trial config fields that are not part of an arm's design: the seed (what a cell's
spread is over), and how a trial is executed, which leaves its numbers unchanged up to float
rounding (tested: a world of 2 trains as a world of 1, ZeRO 0-3 alike)."""
DESIGN_KEYS = (
    "sweep",
    "task",
    "model",
    "weights",
    "init",
    "finetune_label",
    "lstm_width",
    "lstm_layers",
    "lr",
    "batch_size",
    "max_steps",
)
ARM_KEYS = (
    *DESIGN_KEYS,
    *(f for f in FIELD_TYPES if f not in EXECUTION_FIELDS and f not in DESIGN_KEYS),
)
"""Trials that agree on these (and differ in seed) are one arm: one cell of a table. Every
config field that changes a trial (precision, sequence length, augmentation, patience,
evaluation settings, ...) is one, and so is the sweep: two sweeps' trials are never pooled
into one cell (``pool_sweeps`` does it on request)."""
POOLED = "pooled: "
"""Prefix of the ``sweep`` of rows that ``pool_sweeps`` merged."""
SEARCHED = ("lr", "batch_size")
"""What an LR search varies within one arm (Optuna searches may draw the batch size too)."""
SEARCH_ARM_KEYS = tuple(k for k in ARM_KEYS if k not in SEARCHED)
SETTING_KEYS = ("lr", "batch_size", "max_steps", "weights", *(k for k in ARM_KEYS if k != "task"))
"""Named in a row label when they vary inside one (row, task) cell of a table."""
INIT_ORDER = ("pretrained", "random", "stats", "bit-memory", "vit")
FINETUNE_ORDER = (
    "fpt",
    "fpt+ff",
    "fpt+attn",
    "full",
    "frozen",
    "output",
    "input+output",
    "output+pos",
    "output+ln",
)


def backbone_kind(model: str) -> str:
    return "lstm" if model == "lstm" else "transformer"


def init_label(init: str, model: str, weights: str) -> str:
    """``pretrained`` (language), ``random``, ``stats``, or the pretraining modality of a
    non-language backbone read from its name (``bit-memory``: ``scale-fpt pretrain --corpus
    bit-memory``; ``vit``)."""
    if init != "pretrained":
        return init
    name = Path(str(weights or model)).name.lower().replace("_", "-")
    if "bit-memory" in name or "bitmemory" in name:
        return "bit-memory"
    if "vit" in name:
        return "vit"
    return "pretrained"


def finetune_label(finetune: str, kind: str = "transformer") -> str:
    """Canonical name of a trained-groups spec: ``fpt``, ``fpt+ff``, ``fpt+attn``, ``full``,
    or the groups joined with '+'; for an LSTM ``full`` or ``frozen``."""
    parts = {p.strip() for p in str(finetune).split("+")}
    if kind == "lstm":
        return "full" if "full" in parts else "frozen"
    try:
        groups = set(parse_finetune(finetune))
    except ConfigError:
        return str(finetune)
    if groups == set(GROUPS):
        return "full"
    fpt = set(FINETUNE_PRESETS["fpt"])
    if fpt <= groups:
        return "+".join(["fpt", *(g for g in GROUPS if g in groups - fpt)])
    return "+".join(g for g in GROUPS if g in groups)


def model_label(model: str, lstm_width=None, lstm_layers=None) -> str:
    if model == "lstm":
        return f"lstm {int(lstm_width)}x{int(lstm_layers)}"
    return Path(str(model)).name if "/" in str(model) else str(model)


def pool_sweeps(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials of every sweep as one (``scale-fpt report --pool``): the ``sweep`` column of
    every row becomes 'pooled: a+b+...', so arms that differ only in their sweep share a
    cell. Seeds of the pooled sweeps may repeat (seed 0 in two sweeps shares every random
    stream): such a cell's n counts trials, not independent seeds."""
    names = "+".join(sorted(set(trials["sweep"].dropna()))) if len(trials) else ""
    return trials.assign(sweep=POOLED + names)


def prepare(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Trials with the columns every table uses: ``kind``, ``model_label``, ``init_label``,
    ``finetune_label``, ``value`` (metric in %), ``used`` and ``reason`` (why not used)."""
    if metric not in METRICS:
        raise ConfigError([f"--metric: unknown {metric!r}; choose from {', '.join(METRICS)}"])
    df = trials.copy()
    # Results written before the validation split, or before a config field existed.
    for column in (metric, SELECTION, *ARM_KEYS):
        if column not in df and column != "finetune_label":
            df[column] = math.nan
    df["weights"] = df["weights"].fillna("")
    transformer = df["model"] != "lstm"
    df["lstm_width"] = df["lstm_width"].fillna(0).astype(int).where(~transformer, 0)
    df["lstm_layers"] = df["lstm_layers"].fillna(0).astype(int).where(~transformer, 0)

    def column(values) -> pd.Series:  # str dtype even when there are no trials
        return pd.Series(list(values), index=df.index, dtype=str)

    df["kind"] = column(map(backbone_kind, df["model"]))
    df["model_label"] = column(map(model_label, df["model"], df["lstm_width"], df["lstm_layers"]))
    df["init_label"] = column(map(init_label, df["init"], df["model"], df["weights"]))
    df["finetune_label"] = column(map(finetune_label, df["finetune"], df["kind"]))
    df["value"] = df[metric].astype(float) * 100
    finite = np.isfinite(df["value"].to_numpy(dtype=float, na_value=np.nan))
    df["used"] = df["status"].isin(USED_STATUSES) & finite
    df["reason"] = np.where(
        df["used"],
        "",
        np.where(df["status"].isin(USED_STATUSES), "no evaluation", df["status"].fillna("unknown")),
    )
    return df


def fixed_lr(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept, dropped): one learning rate per arm, the paper's where an arm was run at
    several (an LR search, batch size searched or not)."""
    if df.empty:
        return df, df
    keys = list(SEARCH_ARM_KEYS)
    keep = pd.Series(True, index=df.index)
    for _, group in df.groupby(keys, dropna=False, sort=False):
        if group["lr"].nunique() > 1:
            target = paper_lr(group["task"].iloc[0])
            keep[group.index] = np.isclose(group["lr"], target, rtol=1e-6, atol=0)
    return df[keep], df[~keep]


def cell_summary(group: pd.DataFrame) -> dict:
    """Statistics, trials and compute of one arm (all its trials, used or not)."""
    used = group[group["used"]]
    stats = summarize(used["value"])
    reasons = group.loc[~group["used"], "reason"].value_counts()
    excluded = ", ".join(f"{n} {r}" for r, n in reasons.items())
    n_diverged = int((used["status"] == "diverged").sum())
    if stats["n"]:
        note = ""
    elif len(reasons) == 1 and reasons.index[0] == "failed":
        note = f"all {len(group)} failed"
    else:
        note = f"no usable trial ({excluded})"
    return {
        **stats,
        "n_trials": len(group),
        "n_diverged": n_diverged,
        "dagger": n_diverged > 0,
        "excluded": excluded,
        "note": note,
        "trial_ids": ",".join(used["trial_id"]),
        "sweeps": ",".join(sorted(set(group["sweep"]))),
        "wall_time_s": float(used["wall_time_s"].sum()),
        "samples_seen": float(used["samples_seen"].sum()),
        "total_flops": float(used["total_flops"].sum()),
        "total_params": first_int(group["total_params"]),
        "trainable_params": first_int(group["trainable_params"]),
        "n_layer": first_int(group["n_layer"]),
    }


def first_int(values: pd.Series):
    values = values.dropna()
    return int(values.iloc[0]) if len(values) else None


def trial_config(row) -> TrialConfig | None:
    """The trial config of a results row (fields it lacks keep their defaults; the LSTM
    sizes, which ``prepare`` zeroes for transformers, too); None when the row does not make a
    valid config."""
    flat = {
        k: row[k]
        for k in FIELD_TYPES
        if k in row
        and k not in ("lstm_width", "lstm_layers")
        and not (isinstance(row[k], float) and math.isnan(row[k]))
    }
    try:
        return TrialConfig.from_flat(flat, strict=False)
    except ConfigError:
        return None


def preprocessing_deviations(row) -> str:
    """'; '-joined ``deviations`` of the row's task preprocessing ('' when as published)."""
    config = trial_config(row)
    if config is None:
        return "preprocessing unknown (the row is not a valid config)"
    return "; ".join(deviations(config))


def distinct_configs(frame: pd.DataFrame) -> tuple[pd.Series, list[dict]]:
    """(each row's config number, the first row of each distinct config as a dict): a study's
    thousands of trials share a few configs, so what is read from a config (``trial_config``)
    is computed once per distinct one, never once per row. Configs that differ only in their
    seed count as one: nothing the report reads from a config depends on it."""
    columns = [k for k in FIELD_TYPES if k in frame and k != "seed"]
    if not columns or frame.empty:
        return pd.Series(0, index=frame.index), frame.head(1).to_dict("records")
    codes = frame.groupby(columns, dropna=False, sort=False).ngroup()
    first = ~codes.duplicated().to_numpy()
    return codes, frame.loc[first].to_dict("records")


def per_config(frame: pd.DataFrame, fn) -> pd.Series:
    """``fn(row)`` of every row of ``frame``, computed once per distinct config."""
    codes, rows = distinct_configs(frame)
    return codes.map(dict(enumerate(fn(row) for row in rows)))


REFERENCE_PRECISION = "fp32"
"""The reference code trains in fp32: a bf16 or fp16 cell is not the published setting."""
PAPER_BATCH = (2, 16)
"""The paper's batch sizes (2 to 16 by task; the reference code's default is 4)."""
PROTOCOL = (
    "here: test accuracy at the evaluation with the best validation accuracy; the reference "
    "code: test batches drawn during training, no validation split"
)
"""The one difference every like-for-like cell keeps, declared in its comparison."""


def compare(cell: dict, table: str, paper_row: str | None) -> dict:
    """Published value beside a cell; difference only when like-for-like (module docstring):
    model, weights, lr, LSTM size, budget, precision (fp32), batch size (2-16) and
    preprocessing as the paper's; the evaluation protocol always differs and is said."""
    found = published.lookup(table, paper_row, cell["task"]) if paper_row else None
    out = {
        "paper_row": paper_row,
        "published": math.nan,
        "published_diverged": False,
        "like_for_like": False,
        "published_diff": math.nan,
        "comparison": "",
    }
    if found is None:
        return out
    out["published"] = found["value"]
    out["published_diverged"] = bool(found["diverged"])
    mismatches = []
    if cell["kind"] == "lstm":
        for key, value in published.LSTM_SETTING.items():
            if int(cell[key]) != value:
                mismatches.append(f"{key} {int(cell[key])} (paper {value})")
    elif cell["model"] != found["model"]:
        mismatches.append(f"model {cell['model_label']} (paper {found['model']})")
    elif cell["init_label"] == "pretrained" and cell["weights"]:
        mismatches.append(f"weights {cell['weights']} (paper: OpenAI's)")
    if not np.isclose(cell["lr"], paper_lr(cell["task"])):
        mismatches.append(f"lr {cell['lr']:g} (paper {paper_lr(cell['task']):g})")
    needed = paper_steps(cell["task"], cell["init_label"])
    if table != "T4" and cell["max_steps"] < needed:
        mismatches.append(
            f"budget {int(cell['max_steps']):,} steps (paper converged in {needed:,.0f})"
        )
    precision = cell.get("precision")
    if isinstance(precision, str) and precision != REFERENCE_PRECISION:
        mismatches.append(f"precision {precision} (reference code {REFERENCE_PRECISION})")
    batch = cell.get("batch_size")
    if batch is not None and not pd.isna(batch) and not PAPER_BATCH[0] <= batch <= PAPER_BATCH[1]:
        mismatches.append(f"batch size {int(batch)} (paper {PAPER_BATCH[0]}-{PAPER_BATCH[1]})")
    if cell.get("preprocessing"):
        mismatches.append(cell["preprocessing"])
    if table == "T4":
        mismatches.append("the paper counts steps to convergence, not to a threshold")
    if mismatches:
        out["comparison"] = "reference only: " + "; ".join(mismatches)
    elif cell["n"]:
        out["like_for_like"] = True
        out["published_diff"] = cell["mean"] - found["value"]
        out["comparison"] = f"like-for-like except the evaluation protocol ({PROTOCOL})"
    return out


def cells(
    df: pd.DataFrame,
    table: str,
    rows: pd.Series,
    paper_rows: pd.Series,
    order: pd.Series,
    by: tuple[str, ...] = ("row", "task"),
    extra=None,
) -> pd.DataFrame:
    """One table's long form: ``df`` trials already filtered, ``rows`` their row labels,
    ``paper_rows`` the published row each stands for, ``order`` a sort key per trial; ``by``
    the columns of one displayed cell; ``extra(group)`` more statistics per arm."""
    records = []
    if df.empty:
        return empty_table(table)
    frame = df.assign(row=rows, paper_row=paper_rows, order=order)
    frame["preprocessing_verdict"] = per_config(frame, preprocessing_deviations)
    for _, group in frame.groupby([*ARM_KEYS, "row"], dropna=False, sort=False):
        first = group.iloc[0]
        cell = {"table": table, "row": first["row"], "order": first["order"]}
        cell.update({k: first[k] for k in ARM_KEYS})
        cell.update({k: first[k] for k in ("kind", "model_label", "init_label", "finetune")})
        cell.update(cell_summary(group))
        # Every row's verdict (one arm shares its config fields, so they agree; a row that
        # could not be read as a config says so).
        verdicts = group["preprocessing_verdict"]
        cell["preprocessing"] = "; ".join(dict.fromkeys(v for v in verdicts.unique() if v))
        if extra:
            cell.update(extra(group))
        cell.update(compare(cell, table, first["paper_row"]))
        records.append(cell)
    out = pd.DataFrame(records)
    return finish(disambiguate(out, by))


def disambiguate(
    out: pd.DataFrame, by: tuple[str, ...] = ("row", "task"), keys=SETTING_KEYS
) -> pd.DataFrame:
    """Name the settings that differ between arms sharing one displayed cell in their rows."""
    varying = [
        k
        for k in dict.fromkeys(keys)
        if k in out and (out.groupby(list(by), dropna=False)[k].nunique(dropna=False) > 1).any()
    ]
    for key in varying:
        short = {"batch_size": "bs", "max_steps": "steps", "finetune_label": "finetune"}
        out["row"] = out["row"] + [
            f" · {short.get(key, key)}={v:g}" if isinstance(v, int | float) else f" · {v}"
            for v in out[key]
        ]
    return out


def finish(out: pd.DataFrame) -> pd.DataFrame:
    task_rank = {t: i for i, t in enumerate(TASK_COLUMNS)}
    out = out.assign(task_rank=out["task"].map(lambda t: task_rank.get(t, len(task_rank))))
    out = out.sort_values(["order", "row", "task_rank"], kind="stable")
    return out.drop(columns=["task_rank"]).reset_index(drop=True)


def empty_table(table: str) -> pd.DataFrame:
    columns = ["table", "row", "order", *ARM_KEYS, "n", "mean", "std", "ci95", "note"]
    return pd.DataFrame(columns=columns).assign(table=table)


def rank(value, order: tuple) -> int:
    return order.index(value) if value in order else len(order)


def size_order(df: pd.DataFrame) -> pd.Series:
    return df["total_params"].fillna(0).astype(float)


def annotate(
    out: pd.DataFrame, title: str, selection: str, df: pd.DataFrame, dropped
) -> pd.DataFrame:
    """Attach the table's title and a description of the trials it used (``attrs``)."""
    out.attrs.update(
        title=title,
        selection=selection,
        used=int(df["used"].sum()) if len(df) else 0,
        matched=len(df),
        not_used=df.loc[~df["used"], "reason"].value_counts().to_dict() if len(df) else {},
        other_lr=len(dropped),
        sweeps=sorted(set(df["sweep"])) if len(df) else [],
        # one string, not a list: pandas deep-copies attrs on every column access
        trial_ids=",".join(df.loc[df["used"], "trial_id"]) if len(df) else "",
    )
    return out


def paper_steps(task: str, init_label: str) -> float:
    """The paper's steps to convergence (Table 4) of ``init_label`` on ``task``: the FPT row
    for language-pretrained backbones, the (slower) random row for every other init; NaN for
    a task the paper did not run."""
    row = "FPT" if init_label == "pretrained" else "random"
    found = published.lookup("T4", row, task)
    return found["value"] if found else math.nan
