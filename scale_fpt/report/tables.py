"""The paper's tables, computed from whatever a results directory holds.

Every table is first a long DataFrame, one row per cell (an *arm*: the trials of one setting
that differ only in ``seed``), with the cell's statistics, the trials behind it, its compute
and the published number beside it. ``wide`` turns one into the paper's shape (rows x tasks)
of display strings. Conventions, shared by every table:

- **Trials used**: status ``completed`` or ``diverged`` with a finite metric. Failed, stopped,
  still running, and diverged-before-the-first-evaluation trials are counted, never averaged.
- **Selection on validation, test reported**: a trial's number is ``test_accuracy``, the
  test accuracy at ``selected_step`` (its evaluation with the best validation accuracy),
  in percent; ``val_accuracy`` or ``final_test_accuracy`` (the last evaluation; for a
  diverged trial the last before divergence, as the paper's †) on request. Nothing is
  chosen on test: best steps, best learning rates and steps to a threshold read validation.
- **Spread**: mean, sample std (n-1) and the 95% Student-t interval half-width over seeds.
- **One learning rate per arm** (``fixed_lr``): where an arm was run at several learning
  rates (an LR search), the paper tables keep only the paper's rate (1e-3; 1e-4 homology)
  and drop the arm if that rate was not run; ``lr_fair`` compares arms at their best rates.
- **Like-for-like** (``compare``): a study cell is compared with the published one (with a
  difference) only when the task's preprocessing (``tasks.preprocessing.deviations``:
  sequence length, split, truncation, augmentation, input dropout), the budget (at least
  the paper's steps to convergence, Table 4), the model, the weights, the learning rate and,
  for LSTMs, width and depth are the paper's (init and trained groups match by construction
  of the row); otherwise the published number is shown as reference only, with every
  reason. Batch size is reported, not judged.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt.config import (
    FIELD_TYPES,
    FINETUNE_PRESETS,
    GROUPS,
    ConfigError,
    TrialConfig,
    parse_finetune,
)
from scale_fpt.report import published
from scale_fpt.report.published import TASK_COLUMNS, paper_lr
from scale_fpt.report.stats import summarize, welch_difference
from scale_fpt.tasks.preprocessing import deviations, preprocessing

USED_STATUSES = ("completed", "diverged")
METRICS = ("test_accuracy", "val_accuracy", "final_test_accuracy")
"""What a table cell averages (none of them selects on test)."""
DEFAULT_METRIC = "test_accuracy"
SELECTION = "best_val_accuracy"
"""What every choice between candidates (learning rates, batch sizes) maximises."""
ARM_KEYS = (
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
"""Trials that agree on these (and differ in seed) are one arm: one cell of a table
(``finetune_label``: 'fpt' and 'input+output+ln+pos' are one setting)."""
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

DEFAULT_THRESHOLDS = {
    task: round(0.9 * value / 100, 4)
    for task, value in zip(TASK_COLUMNS, published.ACCURACY["T2"]["language (FPT)"], strict=True)
}
"""Steps-to-threshold default per task: 90% of the paper's FPT accuracy (Table 2)."""


# --------------------------------------------------------------------------- trial labels


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


def prepare(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Trials with the columns every table uses: ``kind``, ``model_label``, ``init_label``,
    ``finetune_label``, ``value`` (metric in %), ``used`` and ``reason`` (why not used)."""
    if metric not in METRICS:
        raise ConfigError([f"--metric: unknown {metric!r}; choose from {', '.join(METRICS)}"])
    df = trials.copy()
    for column in (metric, SELECTION):  # results written before the validation split
        if column not in df:
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


# --------------------------------------------------------------------------- cells


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


def compare(cell: dict, table: str, paper_row: str | None) -> dict:
    """Published value beside a cell; difference only when like-for-like (module docstring)."""
    found = published.lookup(table, paper_row, cell["task"]) if paper_row else None
    out = {
        "paper_row": paper_row,
        "published": math.nan,
        "published_diverged": False,
        "like_for_like": False,
        "diff": math.nan,
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
    if cell.get("preprocessing"):
        mismatches.append(cell["preprocessing"])
    if table == "T4":
        mismatches.append("the paper counts steps to convergence, not to a threshold")
    if mismatches:
        out["comparison"] = "reference only: " + "; ".join(mismatches)
    elif cell["n"]:
        out["like_for_like"] = True
        out["diff"] = cell["mean"] - found["value"]
        out["comparison"] = "like-for-like"
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
    for _, group in frame.groupby([*ARM_KEYS, "row"], dropna=False, sort=False):
        first = group.iloc[0]
        cell = {"table": table, "row": first["row"], "order": first["order"]}
        cell.update({k: first[k] for k in ARM_KEYS})
        cell.update({k: first[k] for k in ("kind", "model_label", "init_label", "finetune")})
        cell.update(cell_summary(group))
        cell["preprocessing"] = preprocessing_deviations(first)
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
        trial_ids=list(df.loc[df["used"], "trial_id"]) if len(df) else [],
    )
    return out


# --------------------------------------------------------------------------- paper tables


def frozen_transformers(df: pd.DataFrame) -> pd.Series:
    return (df["kind"] == "transformer") & (df["finetune_label"] == "fpt")


def pretrained_transformers(df: pd.DataFrame) -> pd.Series:
    return (df["kind"] == "transformer") & (df["init_label"] == "pretrained")


def selected(trials: pd.DataFrame, metric: str, mask) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trials of a table, trials of it left out as other rates of an LR search)."""
    kept, dropped = fixed_lr(prepare(trials, metric))
    return kept[mask(kept)], dropped[mask(dropped)]


def ranks(values: pd.Series, order) -> pd.Series:
    """Position of each value in ``order`` (unknown values last), as floats."""
    return pd.Series([rank(v, tuple(order)) for v in values], index=values.index, dtype=float)


def init_rank(df: pd.DataFrame) -> pd.Series:
    return ranks(df["init_label"], INIT_ORDER)


def table1_full(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 1: FPT vs fully trained transformer vs fully trained LSTM."""
    return settings_table(
        trials,
        "T1",
        metric,
        "Table 1: FPT vs fully trained transformer and LSTM",
        "FPT (language-pretrained, finetune fpt), transformers trained fully from random "
        "init (finetune full), LSTMs trained fully",
    )


def table2_init(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 2: frozen transformers (finetune fpt) by initialisation, per task."""
    df, dropped = selected(trials, metric, frozen_transformers)
    paper = {s[0]: row for row, s in published.ROW_SETTINGS["T2"].items()}
    out = cells(
        df,
        "T2",
        df["model_label"] + " · " + df["init_label"],
        df["init_label"].map(paper),
        size_order(df) * 10 + init_rank(df),
    )
    return annotate(
        out,
        "Table 2: frozen transformer by initialisation",
        "transformers with finetune fpt (input, output, layer norms, positions), every init",
        df,
        dropped,
    )


def table3_lstm(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 3: random frozen transformer vs random frozen LSTM."""
    return settings_table(
        trials,
        "T3",
        metric,
        "Table 3: random frozen transformer vs random frozen LSTM",
        "random-init transformers with finetune fpt; LSTMs with the LSTM frozen",
    )


def settings_table(trials, table: str, metric: str, title: str, selection: str):
    """A table whose rows are the paper's rows (``published.ROW_SETTINGS[table]``)."""
    settings = published.ROW_SETTINGS[table]
    lookup = {s: row for row, s in settings.items()}

    def paper_rows(d: pd.DataFrame) -> pd.Series:
        keys = zip(d["init_label"], d["finetune_label"], d["kind"], strict=True)
        return pd.Series([lookup.get(k) for k in keys], index=d.index, dtype=object)

    df, dropped = selected(trials, metric, lambda d: paper_rows(d).notna())
    rows = paper_rows(df)
    out = cells(
        df,
        table,
        rows + " · " + df["model_label"],
        rows,
        ranks(rows, list(settings)) * 1e13 + size_order(df),
    )
    return annotate(out, title, selection, df, dropped)


def table6_size(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 6: frozen (fpt) transformers by model size, with total and trained parameter
    counts; one cell per (task, model, init)."""
    df, dropped = selected(trials, metric, frozen_transformers)
    sizes = published.SIZES.set_index("model")["size"]
    names = {"pretrained": "FPT", "random": "random"}
    paper_rows = pd.Series(
        [
            f"{sizes[m]} {names[i]}" if m in sizes.index and i in names else None
            for m, i in zip(df["model"], df["init_label"], strict=True)
        ],
        index=df.index,
        dtype=object,
    )
    out = cells(
        df,
        "T6",
        df["model_label"],
        paper_rows,
        size_order(df) * 10 + init_rank(df),
        by=("row", "task", "init_label"),
    )
    return annotate(
        out,
        "Table 6: accuracy by model size (frozen, finetune fpt)",
        "transformers with finetune fpt, every model and init",
        df,
        dropped,
    )


def table8_finetune(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 8: fine-tuning more (or less) of a language-pretrained transformer; † marks
    cells where a seed diverged (its value is the accuracy before divergence)."""
    df, dropped = selected(trials, metric, pretrained_transformers)
    paper = {s[1]: row for row, s in published.ROW_SETTINGS["T8"].items()}
    out = cells(
        df,
        "T8",
        df["model_label"] + " · " + df["finetune_label"],
        df["finetune_label"].map(paper),
        size_order(df) * 100 + ranks(df["finetune_label"], FINETUNE_ORDER),
    )
    return annotate(
        out,
        "Table 8: fine-tuning subsets (language-pretrained transformer)",
        "language-pretrained transformers, every finetune subset",
        df,
        dropped,
    )


# --------------------------------------------------------------------------- Table 4


def thresholds_for(tasks, thresholds=None) -> dict[str, float]:
    """Per-task accuracy threshold (a fraction): a number for every task, a {task: value}
    dict (others keep the default), or None for ``DEFAULT_THRESHOLDS``."""
    if isinstance(thresholds, int | float):
        return dict.fromkeys(tasks, float(thresholds))
    given = thresholds or {}
    return {t: float(given.get(t, DEFAULT_THRESHOLDS.get(t, 0.9))) for t in tasks}


def steps_to_threshold(curve: pd.DataFrame, threshold: float) -> tuple[float, float]:
    """(first evaluated step with val_accuracy >= threshold or NaN, last evaluated step)."""
    curve = curve.sort_values("step")
    accuracy = curve["val_accuracy"] if "val_accuracy" in curve else pd.Series(dtype=float)
    hit = curve.loc[accuracy >= threshold, "step"]
    last = float(curve["step"].max()) if len(curve) else math.nan
    return (float(hit.iloc[0]) if len(hit) else math.nan), last


def steps_summary(group: pd.DataFrame) -> dict:
    """T4 cell: seeds that reached the threshold, and a lower bound on the mean steps where
    some did not (each unreached seed counted at its last evaluated step)."""
    used = group[group["used"]]
    reached = used["steps"].notna()
    out = {
        "n": len(used),
        "n_reached": int(reached.sum()),
        "all_reached": bool(len(used)) and bool(reached.all()),
        "lower_bound": float(used["steps"].where(reached, used["last_step"]).mean())
        if len(used)
        else math.nan,
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
    by_trial = dict(iter(curves.groupby(["sweep", "trial_id"]))) if len(curves) else {}
    found = [
        steps_to_threshold(by_trial[key], limits[task]) if key in by_trial else (math.nan, math.nan)
        for key, task in zip(zip(df["sweep"], df["trial_id"], strict=True), df["task"], strict=True)
    ]
    df["steps"] = [s for s, _ in found]
    df["last_step"] = [last for _, last in found]
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


# --------------------------------------------------------------------------- budgets


def paper_steps(task: str, init_label: str) -> float:
    """The paper's steps to convergence (Table 4) of ``init_label`` on ``task``: the FPT row
    for language-pretrained backbones, the (slower) random row for every other init; NaN for
    a task the paper did not run."""
    row = "FPT" if init_label == "pretrained" else "random"
    found = published.lookup("T4", row, task)
    return found["value"] if found else math.nan


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
    for row in trials.to_dict("records"):
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


# --------------------------------------------------------------------------- init difference

PAIR_KEYS = tuple(k for k in ARM_KEYS if k not in ("init", "weights"))
"""Arms that agree on these and differ only in init are compared by ``init_difference``."""


def init_difference(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Language-pretrained minus random init, per task and setting (same model, trained
    groups, lr, batch size, budget): the difference of mean accuracy (percentage points) and
    of mean steps to the accuracy threshold (``steps_to_threshold``), each with Welch's 95%
    interval over the seeds of the two arms. Steps get an interval only when every seed of both
    arms reached the threshold; otherwise ``steps_note`` says how many did and bounds the
    difference, counting each unreached seed at its last step (``steps_done``)."""
    df = prepare(trials, metric)
    df = df[df["used"] & df["init_label"].isin(("pretrained", "random"))]
    records = []
    for key, group in df.groupby(list(PAIR_KEYS), dropna=False, sort=False):
        arms = {init: g for init, g in group.groupby("init_label")}
        if set(arms) != {"pretrained", "random"}:
            continue
        pre, rnd = arms["pretrained"], arms["random"]
        accuracy = welch_difference(pre["value"], rnd["value"])
        steps = {s: arms[s]["steps_to_threshold"].astype(float) for s in arms}
        reached = {s: int(v.notna().sum()) for s, v in steps.items()}
        all_reached = all(reached[s] == len(arms[s]) for s in arms)
        step_diff = welch_difference(steps["pretrained"], steps["random"]) if all_reached else {}
        records.append(
            {
                **dict(zip(PAIR_KEYS, key, strict=True)),
                "n_pretrained": len(pre),
                "n_random": len(rnd),
                "accuracy_pretrained": float(pre["value"].mean()),
                "accuracy_random": float(rnd["value"].mean()),
                **{f"accuracy_{k}": accuracy[k] for k in ("diff", "ci95", "ci_low", "ci_high")},
                **{
                    f"steps_{k}": step_diff.get(k, math.nan)
                    for k in ("diff", "ci95", "ci_low", "ci_high")
                },
                "steps_pretrained": float(steps["pretrained"].mean()),
                "steps_random": float(steps["random"].mean()),
                "steps_note": "" if all_reached else steps_bound(arms, steps, reached),
            }
        )
    return pd.DataFrame(records)


def steps_bound(arms: dict, steps: dict, reached: dict) -> str:
    """What can be said of steps to threshold when some seed never reached it: how many did,
    and, when every pretrained seed did, an upper bound on pretrained - random (unreached
    random seeds counted at their last step, which they needed more than)."""
    counts = (
        f"threshold reached by {reached['pretrained']}/{len(arms['pretrained'])} pretrained "
        f"and {reached['random']}/{len(arms['random'])} random seeds"
    )
    if reached["pretrained"] < len(arms["pretrained"]) or not reached["random"] < len(
        arms["random"]
    ):
        return counts + ": no difference computed"
    random_bound = steps["random"].fillna(arms["random"]["steps_done"].astype(float)).mean()
    bound = steps["pretrained"].mean() - random_bound
    return (
        counts + f": pretrained - random < {bound:+.0f} steps (unreached seeds at their last step)"
    )


def difference_text(row) -> str:
    """'pretrained - random: accuracy +14.3 pp [95% CI +10.1, +18.5] (n=3 vs 3); steps to
    threshold -1200 [95% CI -1500, -900]'."""
    text = (
        f"pretrained - random: accuracy {row['accuracy_diff']:+.1f} pp "
        f"[95% CI {row['accuracy_ci_low']:+.1f}, {row['accuracy_ci_high']:+.1f}] "
        f"(n={int(row['n_pretrained'])} vs {int(row['n_random'])})"
    )
    if np.isfinite(row["steps_diff"]):
        low, high = row["steps_ci_low"], row["steps_ci_high"]
        return text + (
            f"; steps to threshold {row['steps_diff']:+.0f} [95% CI {low:+.0f}, {high:+.0f}]"
        )
    return text + f"; steps to threshold: {row['steps_note']}"


# --------------------------------------------------------------------------- LR-fair


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


# --------------------------------------------------------------------------- display


def cell_text(cell) -> str:
    """'60.0 ± 10.0 (n=3, CI ±24.8)', '†' when a seed diverged, or '— reason'."""
    if cell.get("table") == "T4":
        return steps_text(cell)
    if not cell["n"]:
        return f"— {cell['note']}"
    text = f"{cell['mean']:.1f}"
    if cell["n"] > 1:
        text += f" ± {cell['std']:.1f} (n={cell['n']}, CI ±{cell['ci95']:.1f})"
    else:
        text += " (n=1)"
    if cell.get("dagger"):
        text += f" † {cell['n_diverged']}/{cell['n']} diverged"
    return text


def steps_text(cell) -> str:
    """'200 ± 100 (n=3, CI ±248)', '>1000 (0/3 reached)', or a speed-up ('3x', '>2x')."""
    if isinstance(cell.get("speedup_text"), str) and cell["speedup_text"]:
        return cell["speedup_text"]
    if not cell["n"]:
        return f"— {cell['note']}"
    if not cell["all_reached"]:
        reached = f"{int(cell['n_reached'])}/{int(cell['n'])} reached"
        return f">{steps_number(cell['lower_bound'])} ({reached})"
    if cell["n"] == 1:
        return f"{steps_number(cell['mean'])} (n=1)"
    return (
        f"{steps_number(cell['mean'])} ± {steps_number(cell['std'])} "
        f"(n={int(cell['n'])}, CI ±{steps_number(cell['ci95'])})"
    )


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
        return f"{text} (Δ {cell['diff']:+.1f})"
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
