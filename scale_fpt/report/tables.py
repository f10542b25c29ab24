"""The paper's tables, computed from whatever a results directory holds.

Every table is first a long DataFrame, one row per cell (an *arm*: the trials of one setting
that differ only in ``seed``), with the cell's statistics, the trials behind it, its compute
and the published number beside it. ``wide`` turns one into the paper's shape (rows x tasks)
of display strings. Conventions, shared by every table:

- **Trials used**: status ``completed`` or ``diverged`` with a finite metric. Failed, stopped,
  still running, and diverged-before-the-first-evaluation trials are counted, never averaged.
- **Metric**: ``final_test_accuracy`` (the last evaluation; for a diverged trial the last
  one before divergence, as the paper's †) in percent; ``best_test_accuracy`` on request.
- **Spread**: mean, sample std (n-1) and the 95% Student-t interval half-width over seeds.
- **One learning rate per arm** (``fixed_lr``): where an arm was run at several learning
  rates (an LR search), the paper tables keep only the paper's rate (1e-3; 1e-4 homology)
  and drop the arm if that rate was not run; ``lr_fair`` compares arms at their best rates.
- **Like-for-like** (``compare``): a study cell is compared with the published one (with a
  difference) only when model, learning rate and, for LSTMs, width and depth are the
  paper's (init and trained groups match by construction of the row); otherwise the
  published number is shown as reference only, with the reason. Training length and batch
  size are never matched (the paper trained to convergence) and are reported, not judged.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from scale_fpt.config import FINETUNE_PRESETS, GROUPS, ConfigError, parse_finetune
from scale_fpt.report import published
from scale_fpt.report.published import TASK_COLUMNS, paper_lr
from scale_fpt.report.stats import summarize

USED_STATUSES = ("completed", "diverged")
METRICS = ("final_test_accuracy", "best_test_accuracy")
ARM_KEYS = (
    "task",
    "model",
    "weights",
    "init",
    "finetune",
    "lstm_width",
    "lstm_layers",
    "lr",
    "batch_size",
    "max_steps",
)
"""Trials that agree on these (and differ in seed) are one arm: one cell of a table."""
SETTING_KEYS = ("lr", "batch_size", "max_steps", "weights")
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


def prepare(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Trials with the columns every table uses: ``kind``, ``model_label``, ``init_label``,
    ``finetune_label``, ``value`` (metric in %), ``used`` and ``reason`` (why not used)."""
    if metric not in METRICS:
        raise ConfigError([f"--metric: unknown {metric!r}; choose from {', '.join(METRICS)}"])
    df = trials.copy()
    if df.empty:
        for column in ("kind", "model_label", "init_label", "finetune_label", "reason"):
            df[column] = pd.Series(dtype=object)
        df["value"] = pd.Series(dtype=float)
        df["used"] = pd.Series(dtype=bool)
        return df
    df["weights"] = df["weights"].fillna("")
    df["kind"] = df["model"].map(backbone_kind)
    transformer = df["kind"] == "transformer"
    df["lstm_width"] = df["lstm_width"].fillna(0).astype(int).where(~transformer, 0)
    df["lstm_layers"] = df["lstm_layers"].fillna(0).astype(int).where(~transformer, 0)
    df["model_label"] = [
        model_label(m, w, n)
        for m, w, n in zip(df["model"], df["lstm_width"], df["lstm_layers"], strict=True)
    ]
    df["init_label"] = [
        init_label(i, m, w) for i, m, w in zip(df["init"], df["model"], df["weights"], strict=True)
    ]
    df["finetune_label"] = [
        finetune_label(f, k) for f, k in zip(df["finetune"], df["kind"], strict=True)
    ]
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
    """(kept, dropped): one learning rate per arm, the paper's where an arm has several."""
    if df.empty:
        return df, df
    keys = [k for k in ARM_KEYS if k != "lr"]
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
        cell.update({k: first[k] for k in ("kind", "model_label", "init_label", "finetune_label")})
        cell.update(cell_summary(group))
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
        for k in keys
        if (out.groupby(list(by), dropna=False)[k].nunique(dropna=False) > 1).any()
    ]
    for key in varying:
        short = {"batch_size": "bs", "max_steps": "steps"}.get(key, key)
        out["row"] = out["row"] + [
            f" · {short}={v:g}" if key != "weights" else f" · {v}" for v in out[key]
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


def table1_full(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Table 1: FPT vs fully trained transformer vs fully trained LSTM."""
    return settings_table(
        trials,
        "T1",
        metric,
        "Table 1: FPT vs fully trained transformer and LSTM",
        "FPT (pretrained, fpt), transformer trained fully from random init (full), "
        "LSTM trained fully (full)",
    )


def table2_init(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Table 2: frozen transformers (finetune fpt) by initialisation, per task."""
    df, dropped = fixed_lr(prepare(trials, metric))
    df = df[(df["kind"] == "transformer") & (df["finetune_label"] == "fpt")]
    paper = {s[0]: row for row, s in published.ROW_SETTINGS["T2"].items()}
    out = cells(
        df,
        "T2",
        df["model_label"] + " · " + df["init_label"],
        df["init_label"].map(paper),
        size_order(df) * 10 + df["init_label"].map(lambda i: rank(i, INIT_ORDER)),
    )
    return annotate(
        out,
        "Table 2: frozen transformer by initialisation",
        "transformers with finetune fpt (input, output, layer norms, positions), every init",
        df,
        dropped[(dropped["kind"] == "transformer") & (dropped["finetune_label"] == "fpt")]
        if len(dropped)
        else dropped,
    )


def table3_lstm(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Table 3: random frozen transformer vs random frozen LSTM."""
    return settings_table(
        trials,
        "T3",
        metric,
        "Table 3: random frozen transformer vs random frozen LSTM",
        "random-init transformers with finetune fpt; LSTMs (random) with the LSTM frozen",
    )


def settings_table(trials, table, metric, title, selection) -> pd.DataFrame:
    """A table whose rows are the paper's rows (``published.ROW_SETTINGS[table]``)."""
    df, dropped = fixed_lr(prepare(trials, metric))
    settings = published.ROW_SETTINGS[table]
    lookup = {s: row for row, s in settings.items()}
    key = list(zip(df["init_label"], df["finetune_label"], df["kind"], strict=True))
    paper_rows = pd.Series([lookup.get(k) for k in key], index=df.index, dtype=object)
    keep = paper_rows.notna()
    df, paper_rows = df[keep], paper_rows[keep]
    names = list(settings)
    out = cells(
        df,
        table,
        paper_rows + " · " + df["model_label"],
        paper_rows,
        paper_rows.map(names.index) * 1e13 + size_order(df),
    )
    if len(dropped):
        dkey = zip(dropped["init_label"], dropped["finetune_label"], dropped["kind"], strict=True)
        dropped = dropped[[k in lookup for k in dkey]]
    return annotate(out, title, selection, df, dropped)


def table8_finetune(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Table 8: fine-tuning more (or less) of a language-pretrained transformer; † marks
    cells where a seed diverged (its value is the accuracy before divergence)."""
    df, dropped = fixed_lr(prepare(trials, metric))
    df = df[(df["kind"] == "transformer") & (df["init_label"] == "pretrained")]
    paper = {s[1]: row for row, s in published.ROW_SETTINGS["T8"].items()}
    out = cells(
        df,
        "T8",
        df["model_label"] + " · " + df["finetune_label"],
        df["finetune_label"].map(paper),
        size_order(df) * 100 + df["finetune_label"].map(lambda f: rank(f, FINETUNE_ORDER)),
    )
    if len(dropped):
        dropped = dropped[
            (dropped["kind"] == "transformer") & (dropped["init_label"] == "pretrained")
        ]
    return annotate(
        out,
        "Table 8: fine-tuning subsets (language-pretrained transformer)",
        "language-pretrained transformers, every finetune subset",
        df,
        dropped,
    )


def table6_size(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Table 6: frozen (fpt) transformers by model size, with total and trained parameter
    counts, one row per (task, model, init)."""
    df, dropped = fixed_lr(prepare(trials, metric))
    df = df[(df["kind"] == "transformer") & (df["finetune_label"] == "fpt")]
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
        size_order(df) * 10 + df["init_label"].map(lambda i: rank(i, INIT_ORDER)),
    )
    if len(out) and "init_label" in out:
        out = disambiguate(out, by=("row", "task", "init_label"))
    if len(dropped):
        dropped = dropped[(dropped["kind"] == "transformer") & (dropped["finetune_label"] == "fpt")]
    return annotate(
        out,
        "Table 6: accuracy by model size (frozen, finetune fpt)",
        "transformers with finetune fpt, every model and init",
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


def steps_to_threshold(curve: pd.DataFrame, threshold: float) -> tuple[float, float, bool]:
    """(first evaluated step with test_accuracy >= threshold, last evaluated step, reached)."""
    curve = curve.sort_values("step")
    hit = curve.loc[curve["test_accuracy"] >= threshold, "step"]
    last = float(curve["step"].max()) if len(curve) else math.nan
    return (float(hit.iloc[0]), last, True) if len(hit) else (math.nan, last, False)


def table4_steps(trials: pd.DataFrame, curves: pd.DataFrame, thresholds=None) -> pd.DataFrame:
    """Table 4: gradient steps until the test accuracy first reaches a threshold, per init of
    frozen (fpt) transformers, and the speed-up of each init over random (same model, lr,
    batch size). Computed from the learning curves; a seed that never reaches it counts with
    its last evaluated step as a lower bound, and the cell reads ``>bound``."""
    df, dropped = fixed_lr(prepare(trials))
    df = df[(df["kind"] == "transformer") & (df["finetune_label"] == "fpt")].copy()
    limits = thresholds_for(sorted(set(df["task"])), thresholds)
    by_trial = {k: g for k, g in curves.groupby(["sweep", "trial_id"])} if len(curves) else {}
    step, last, reached = [], [], []
    for row in df.itertuples():
        curve = by_trial.get((row.sweep, row.trial_id))
        if curve is None or curve.empty:
            step.append(math.nan), last.append(math.nan), reached.append(False)
            continue
        s, lst, r = steps_to_threshold(curve, limits[row.task])
        step.append(s), last.append(lst), reached.append(r)
    df["steps"], df["last_step"], df["reached"] = step, last, reached
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
        size_order(df) * 10 + df["init_label"].map(lambda i: rank(i, INIT_ORDER)),
    )
    if len(out):
        extra = []
        for cell in out.itertuples():
            used = df[df["trial_id"].isin(cell.trial_ids.split(",")) & df["used"]]
            used = used[used["sweep"].isin(cell.sweeps.split(","))]
            bound = used["steps"].where(used["reached"], used["last_step"])
            extra.append(
                {
                    "threshold": limits.get(cell.task),
                    "n_reached": int(used["reached"].sum()),
                    "all_reached": bool(len(used)) and bool(used["reached"].all()),
                    "lower_bound": float(bound.mean()) if len(used) else math.nan,
                }
            )
        out = pd.concat([out, pd.DataFrame(extra)], axis=1)
        out.loc[~out["all_reached"], ["mean", "std", "ci95", "ci_low", "ci_high"]] = math.nan
        out = pd.concat([out, speedups(out)], ignore_index=True)
        out = finish(out)
    if len(dropped):
        dropped = dropped[(dropped["kind"] == "transformer") & (dropped["finetune_label"] == "fpt")]
    return annotate(
        out,
        "Table 4: gradient steps to reach the threshold accuracy",
        "transformers with finetune fpt, every init; thresholds "
        + ", ".join(f"{t} {v:.3g}" for t, v in limits.items()),
        df,
        dropped,
    )


def speedups(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows ``speed-up · <model> · <init>``: mean steps of random / mean steps of the init."""
    keys = [k for k in ARM_KEYS if k not in ("init", "weights")]
    records = []
    for _, group in steps.groupby(keys, dropna=False, sort=False):
        base = group[group["init_label"] == "random"]
        if base.empty:
            continue
        base = base.iloc[0]
        for cell in group[group["init_label"] != "random"].itertuples():
            value, text = speedup(base, cell)
            paper_row = "speed-up" if cell.init_label == "pretrained" else None
            record = {k: getattr(cell, k) for k in keys}
            record.update(
                table="T4",
                row=f"speed-up · {cell.row}",
                order=cell.order + 0.5,
                kind=cell.kind,
                model_label=cell.model_label,
                init_label=cell.init_label,
                finetune_label=cell.finetune_label,
                init=cell.init,
                weights=cell.weights,
                speedup=value,
                speedup_text=text,
            )
            found = published.lookup("T4", paper_row, cell.task) if paper_row else None
            record.update(
                paper_row=paper_row,
                published=found["value"] if found else math.nan,
                like_for_like=False,
                comparison="reference only: the paper counts steps to convergence" if found else "",
            )
            records.append(record)
    return pd.DataFrame(records)


def speedup(base, cell) -> tuple[float, str]:
    if not cell.n or not base["n"]:
        return math.nan, "no usable trials"
    if not cell.all_reached:
        return math.nan, "not reached by " + cell.init_label
    if base["all_reached"]:
        value = base["mean"] / cell.mean
        return value, f"{value:.2g}x"
    value = base["lower_bound"] / cell.mean
    return value, f">{value:.2g}x (random not reached)"


# --------------------------------------------------------------------------- LR-fair


def lr_points(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Every (arm, lr) of arms run at several learning rates: the selection score (mean
    ``best_test_accuracy`` over seeds, %) and the metric's statistics."""
    df = prepare(trials, metric)
    keys = [k for k in ARM_KEYS if k != "lr"]
    if df.empty:
        return pd.DataFrame()
    lrs = df[df["used"]].groupby(keys, dropna=False)["lr"].transform("nunique")
    df = df.loc[lrs.index][lrs > 1]
    records = []
    for _, group in df.groupby([*keys, "lr"], dropna=False, sort=False):
        first = group.iloc[0]
        used = group[group["used"]]
        record = {k: first[k] for k in ARM_KEYS}
        record.update(
            {k: first[k] for k in ("kind", "model_label", "init_label", "finetune_label")}
        )
        record["arm"] = arm_name(first)
        record["score"] = float(used["best_test_accuracy"].mean() * 100)
        record["score_std"] = float(used["best_test_accuracy"].std() * 100)
        record.update(cell_summary(group))
        records.append(record)
    return pd.DataFrame(records)


def arm_name(row) -> str:
    return f"{row['model_label']} · {row['init_label']} · {row['finetune_label']}"


def lr_fair(trials: pd.DataFrame, metric: str = "final_test_accuracy") -> pd.DataFrame:
    """Each arm at its own best learning rate (Rothermel et al. 2021): for every arm run at
    several rates, the rate with the highest mean ``best_test_accuracy`` over seeds (ties:
    the lower rate), the metric's statistics there, and the same at the paper's rate."""
    points = lr_points(trials, metric)
    df = prepare(trials, metric)
    if points.empty:
        return annotate(
            empty_table("LR"), "LR-fair comparison", LR_SELECTION, df.iloc[:0], df.iloc[:0]
        )
    keys = [k for k in ARM_KEYS if k != "lr"]
    records = []
    for _, group in points.groupby(keys, dropna=False, sort=False):
        group = group.sort_values("lr")
        best = group.loc[group["score"].idxmax()].to_dict()
        at_paper = group[np.isclose(group["lr"], paper_lr(best["task"]))]
        best.update(
            table="LR",
            row=best["arm"],
            order=(best["total_params"] or 0) * 1000
            + rank(best["init_label"], INIT_ORDER) * 10
            + rank(best["finetune_label"], FINETUNE_ORDER),
            lrs=",".join(f"{v:g}" for v in group["lr"]),
            n_lrs=len(group),
            paper_lr_mean=at_paper["mean"].iloc[0] if len(at_paper) else math.nan,
            gain_over_paper_lr=best["mean"] - at_paper["mean"].iloc[0]
            if len(at_paper)
            else math.nan,
        )
        records.append(best)
    out = finish(disambiguate(pd.DataFrame(records).assign(lr=math.nan), by=("row", "task")))
    used = df[df["trial_id"].isin(",".join(points["trial_ids"]).split(","))]
    return annotate(
        out,
        "LR-fair comparison: every arm at its own best learning rate",
        LR_SELECTION,
        used,
        used.iloc[:0],
    )


LR_SELECTION = (
    "arms (task, model, init, finetune, batch size, steps) run at two or more learning rates "
    "(LR searches); best rate by mean best_test_accuracy over seeds"
)


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
    if isinstance(cell.get("speedup_text"), str) and cell["speedup_text"]:
        return cell["speedup_text"]
    if not cell["n"]:
        return f"— {cell['note']}"
    if not cell["all_reached"]:
        return f">{cell['lower_bound']:.3g} ({cell['n_reached']}/{cell['n']} reached)"
    text = f"{cell['mean']:.3g}"
    if cell["n"] > 1:
        text += f" ± {cell['std']:.2g} (n={cell['n']})"
    return text + " (n=1)" if cell["n"] == 1 else text


def published_text(cell) -> str:
    value = cell.get("published")
    if value is None or not np.isfinite(value):
        return ""
    text = f"{value:g}" + ("†" if cell.get("published_diverged") else "")
    if cell.get("table") == "T4" and str(cell.get("row", "")).startswith("speed-up"):
        text += "x"
    if cell.get("like_for_like"):
        return f"{text} (Δ {cell['diff']:+.1f})"
    return f"{text} (ref.)"


def compute_text(cell) -> str:
    if not cell.get("n"):
        return ""
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
