"""The report's figures, each returned with the DataFrame drawn from it (saved beside the
PNG as CSV). Figures are ``matplotlib.figure.Figure`` objects made without pyplot, so
building a report never touches a notebook's backend or global figure state.

- ``scaling_figure``: accuracy vs total parameters (log x), one line per init, per task.
- ``learning_curves_figure``: validation accuracy over steps per arm: every seed's curve,
  and the mean with its 95% t band over seeds (a seed that ended early carried at its last
  value, so the mean is never of survivors only).
- ``lr_figure``: the validation selection score (mean best validation accuracy over the
  selection seeds) vs learning rate per arm of the LR searches, every seed's score drawn.
- ``steps_figure``: steps to the threshold per init (Table 4), every seed a point over its
  bar, unreached cells hatched at their lower bound.
- ``attention_figure``: attention maps (last layer, mean over layers) with the positions
  each output token depends on marked.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from scale_fpt.published import TASK_COLUMNS, TASK_TITLES
from scale_fpt.report import tables
from scale_fpt.report.stats import summarize


def task_order(tasks) -> list[str]:
    tasks = set(tasks)
    return [t for t in TASK_COLUMNS if t in tasks] + sorted(tasks - set(TASK_COLUMNS))


def panels(n: int, width: float = 4.2, height: float = 3.4):
    fig = Figure(figsize=(width * n, height), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, axes


def scaling_figure(trials: pd.DataFrame, metric: str = tables.DEFAULT_METRIC):
    """Accuracy vs total parameters for frozen (fpt) transformers, one line per init."""
    cells = tables.table6_size(trials, metric)
    cells = cells[cells["n"] > 0] if not cells.empty else cells
    # A cell without a recorded size (a row from an older or foreign writer) has no place on
    # the size axis: it is left out and the panel says how many were.
    unsized = int(cells["total_params"].isna().sum()) if not cells.empty else 0
    if len(cells) == unsized:
        fig, axes = panels(1)
        axes[0].set_title(
            f"no frozen transformer trials with a recorded size ({unsized} cell(s) without)"
            if unsized
            else "no frozen transformer trials"
        )
        return fig, pd.DataFrame()
    data = cells = cells[cells["total_params"].notna()]
    # One line per init and per setting that differs between cells (e.g. '· steps=500').
    data = data.assign(
        line=[
            i + r[len(m) :]
            for i, r, m in zip(data["init_label"], data["row"], data["model_label"], strict=True)
        ]
    )
    columns = ["task", "line", "init_label", "model_label", "total_params", "trainable_params"]
    data = data[[*columns, "n", "mean", "std"]].sort_values(["task", "line", "total_params"])
    seeds = seed_values(trials, cells, metric)
    tasks = task_order(data["task"])
    fig, axes = panels(max(len(tasks), 1))
    for ax, task in zip(axes, tasks, strict=False):
        for init, line in data[data["task"] == task].groupby("line", sort=False):
            drawn = ax.errorbar(
                line["total_params"],
                line["mean"],
                yerr=line["std"].fillna(0),
                marker="o",
                capsize=3,
                label=init,
            )
            ids = set(",".join(cells.loc[line.index, "trial_ids"]).split(","))
            dots = seeds[seeds["trial_id"].isin(ids)]
            ax.plot(dots["total_params"], dots["value"], ".", alpha=0.5,
                    color=drawn[0].get_color())  # fmt: skip
            for row in line.itertuples():
                ax.annotate(row.model_label, (row.total_params, row.mean), fontsize=7)
        ax.set_xscale("log")
        ax.set_title(TASK_TITLES.get(task, task))
        if unsized:
            ax.set_title(f"{unsized} cell(s) without a recorded size left out", loc="right",
                         fontsize=7)  # fmt: skip
        ax.set_xlabel("total parameters")
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=8)
    return fig, data.reset_index(drop=True)


def seed_values(trials: pd.DataFrame, cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every used trial of ``cells`` (its ``trial_ids``) with its value (%) and size."""
    df = tables.prepare(trials, metric)
    ids = set(",".join(cells["trial_ids"].fillna("")).split(","))
    return df[df["used"] & df["trial_id"].isin(ids)][["trial_id", "total_params", "value"]]


def curve_arms(trials: pd.DataFrame) -> pd.DataFrame:
    """Used trials with an ``arm`` label (model · init · finetune, plus what varies among
    ``trials``: one task's, so that a figure's labels are its own and no figure labels
    the whole study's trials again)."""
    df, _ = tables.fixed_lr(tables.prepare(trials))
    df = df[df["used"]].copy()
    df["arm"] = df["model_label"] + " · " + df["init_label"] + " · " + df["finetune_label"]
    for key in ("lr", "batch_size", "max_steps"):
        if (df.groupby(["task", "arm"])[key].nunique() > 1).any():
            df["arm"] = df["arm"] + [f" · {key}={v:g}" for v in df[key]]
    return df


def carried_curves(data: pd.DataFrame) -> pd.DataFrame:
    """Per (arm, trial, step) on the arm's evaluation steps: the trial's validation accuracy
    there, or, after it ended (diverged, stopped on patience), its last value carried
    (``carried`` True), so that later means keep every seed instead of the survivors."""
    frames = []
    for arm, group in data.groupby("arm", sort=False):
        wide = group.pivot_table(index="step", columns="trial_id", values="acc", aggfunc="last")
        last = {t: wide[t].last_valid_index() for t in wide}
        carried = wide.ffill()
        long = carried.stack().rename("acc").reset_index()
        long["carried"] = long["step"].to_numpy() > long["trial_id"].map(last).to_numpy()
        frames.append(long.assign(arm=arm))
    columns = ["arm", "trial_id", "step", "acc", "carried"]
    return (
        pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    )


MAX_SEED_LINES = 20
"""Seeds' own curves drawn per arm at most (the first by trial id); the mean and its band
are over every seed, and the legend says how many were drawn."""


def seed_lines(ax, data: pd.DataFrame, color) -> int:
    """The thin per-seed curves of one arm (``carried_curves`` rows), at most
    ``MAX_SEED_LINES`` of them, as two line collections (ran: solid, carried: dotted);
    returns how many seeds were drawn."""
    drawn = sorted(data["trial_id"].unique())[:MAX_SEED_LINES]
    ran, kept = [], []
    for _, seed in data[data["trial_id"].isin(drawn)].groupby("trial_id"):
        points = seed[["step", "acc"]].to_numpy()
        carried = seed["carried"].to_numpy()
        ran.append(points[~carried])
        if carried.any():  # from its last evaluation on, dotted
            kept.append(points[max(int(np.argmax(carried)) - 1, 0) :])
    ax.add_collection(LineCollection(ran, lw=0.6, alpha=0.6, colors=color))
    if kept:
        ax.add_collection(LineCollection(kept, lw=0.6, linestyles=":", colors=color))
    return len(drawn)


def learning_curves_figure(trials: pd.DataFrame, curves: pd.DataFrame, task: str):
    """Validation accuracy (%) over steps per arm of ``task`` (what selection reads): the
    seeds' curves (thin; ``MAX_SEED_LINES`` an arm at most, the legend says how many), and
    the mean across every seed with the 95% t-interval band (``stats.summarize``; no band
    for one seed). A seed that ended early is carried at its last value (dotted) and counted
    in ``n_carried``, so no mean is of survivors only."""
    arms = curve_arms(trials[trials["task"] == task])[["sweep", "trial_id", "arm"]]
    data = curves.merge(arms, on=["sweep", "trial_id"]) if len(arms) else curves.iloc[:0]
    accuracy = data["val_accuracy"] if "val_accuracy" in data else pd.Series(dtype=float)
    data = carried_curves(data.assign(acc=accuracy * 100))
    rows = [
        {"arm": arm, "step": step, **summarize(group["acc"]),
         "n_carried": int(group["carried"].sum())}
        for (arm, step), group in data.groupby(["arm", "step"], sort=False)
    ]  # fmt: skip
    columns = ["arm", "step", "n", "n_carried", "mean", "std", "ci_low", "ci_high"]
    summary = pd.DataFrame(rows, columns=columns).sort_values(["arm", "step"]).assign(task=task)
    fig, axes = panels(1, width=6.4, height=4.0)
    ax = axes[0]
    by_arm = dict(tuple(data.groupby("arm", sort=False)))
    for arm, line in summary.groupby("arm", sort=False):
        (drawn,) = ax.plot(line["step"], line["mean"], lw=2)
        ax.fill_between(line["step"], line["ci_low"], line["ci_high"], alpha=0.2)
        n = int(line["n"].max())
        lines = seed_lines(ax, by_arm[arm], drawn.get_color())
        shown = f"n={n}" if lines == n else f"n={n}; {lines} seeds' curves drawn"
        drawn.set_label(f"{arm} ({shown})")
    ax.autoscale_view()  # the collections' extent too
    ax.set_title(f"{TASK_TITLES.get(task, task)}: validation curves (seeds, mean, 95% CI)")
    ax.set_xlabel("gradient step")
    ax.set_ylabel("validation accuracy (%)")
    if len(summary):
        ax.legend(fontsize=7)
    return fig, summary[["task", *columns]]


def lr_figure(trials: pd.DataFrame, metric: str = tables.DEFAULT_METRIC):
    """Selection score (mean best_val_accuracy over seeds, %) vs learning rate, per arm of
    the LR searches; the selected rate is starred."""
    points = tables.lr_points(trials, metric)
    if points.empty:
        fig, axes = panels(1)
        axes[0].set_title("no learning-rate search in these results")
        return fig, points
    points = points.sort_values(["task", "arm", "lr"])
    seeds = tables.prepare(trials, metric).set_index("trial_id")[tables.SELECTION] * 100
    tasks = task_order(points["task"])
    fig, axes = panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        for arm, line in points[points["task"] == task].groupby("arm", sort=False):
            drawn = ax.errorbar(
                line["lr"], line["score"], yerr=line["score_std"].fillna(0), marker="o", label=arm
            )
            for lr, ids in zip(line["lr"], line["trial_ids"], strict=True):
                values = seeds.reindex([t for t in str(ids).split(",") if t])
                ax.plot([lr] * len(values), values, ".", alpha=0.5, color=drawn[0].get_color())
            best = line.loc[line["score"].idxmax()]
            ax.plot(best["lr"], best["score"], "*", ms=14, color=drawn[0].get_color())
        ax.set_xscale("log")
        ax.set_title(TASK_TITLES.get(task, task))
        ax.set_xlabel("learning rate")
        ax.set_ylabel("selection score: mean best val. accuracy (%)")
        ax.legend(fontsize=7)
    columns = ["task", "arm", "lr", "batch_size", "n", "score", "score_std", "mean", "std"]
    return fig, points[columns].reset_index(drop=True)


def steps_figure(t4: pd.DataFrame):
    """Bars of Table 4: mean steps to the threshold (± std) per (model · init), every seed a
    point over its bar (a seed that never reached the threshold an open triangle at its last
    evaluated step); a hatched bar marks a cell where some seed never reached it (height: the
    lower bound). The data: one row per seed."""
    if t4.empty:
        fig, axes = panels(1)
        axes[0].set_title("no steps-to-threshold data")
        return fig, t4
    cells = t4[~t4["row"].str.startswith("speed-up") & (t4["n"] > 0)].reset_index(drop=True)
    columns = ["task", "row", "threshold", "n", "n_reached", "all_reached", "mean", "std"]
    data = (
        cells[[*columns, "lower_bound", "seed_steps", "seed_reached"]]
        .explode(["seed_steps", "seed_reached"])
        .rename(columns={"seed_steps": "seed_value"})
        .reset_index(drop=True)
    )
    data["seed_value"] = data["seed_value"].astype(float)
    data["seed_reached"] = data["seed_reached"].astype(bool)
    tasks = task_order(cells["task"])
    fig, axes = panels(max(len(tasks), 1))
    for ax, task in zip(axes, tasks, strict=False):
        shown = cells[cells["task"] == task]
        x = np.arange(len(shown))
        heights = np.where(shown["all_reached"], shown["mean"], shown["lower_bound"])
        bars = ax.bar(x, heights, yerr=shown["std"].fillna(0), capsize=3, color="#9ecae1")
        for i, (bar, cell) in enumerate(zip(bars, shown.itertuples(), strict=True)):
            if not cell.all_reached:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
                ax.annotate(">", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center")
            values = np.asarray(cell.seed_steps, dtype=float)
            reached = np.asarray(cell.seed_reached, dtype=bool)
            spread = 0.2 if len(values) > 1 else 0.0
            offsets = i + np.linspace(-spread, spread, len(values))
            if reached.any():
                ax.plot(offsets[reached], values[reached], "o", color="black", ms=4,
                        label="a seed")  # fmt: skip
            if not reached.all():
                ax.plot(offsets[~reached], values[~reached], "^", mfc="none", color="black",
                        ms=6, label="a seed not reached (at its last step)")  # fmt: skip
        labels = [f"{row}\n(n={n:.0f})" for row, n in zip(shown["row"], shown["n"], strict=True)]
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        threshold = shown["threshold"].iloc[0] if len(shown) else math.nan
        ax.set_title(f"{TASK_TITLES.get(task, task)}: steps to {threshold:.3g} accuracy")
        ax.set_ylabel("gradient steps")
        handles, names = ax.get_legend_handles_labels()
        unique = dict(zip(names, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7)
    return fig, data


def attention_figure(maps: np.ndarray, relevant: dict[int, list[int]], title: str = ""):
    """Heatmaps of the last layer's and the layer-averaged attention (rows: output
    positions attending, columns: input positions), dependencies marked with dots."""
    shown = {"last layer": maps[-1], "mean over layers": maps.mean(axis=0)}
    fig, axes = panels(2, width=4.6, height=4.2)
    for ax, (name, grid) in zip(axes, shown.items(), strict=True):
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(float(grid.max()), 1e-9))
        xs = [s for t, ps in relevant.items() for s in ps]
        ys = [t for t, ps in relevant.items() for _ in ps]
        ax.scatter(xs, ys, s=6, c="red", marker="o", label="dependency")
        ax.set_title(f"{title} {name}".strip(), fontsize=9)
        ax.set_xlabel("input position (attended to)")
        ax.set_ylabel("position attending")
        fig.colorbar(image, ax=ax, shrink=0.8)
    layers, n, _ = maps.shape
    data = pd.DataFrame(
        [
            {
                "layer": layer,
                "output_position": t,
                "input_position": s,
                "attention": maps[layer, t, s],
            }
            for layer in range(layers)
            for t in relevant
            for s in range(n)
        ]
    )
    return fig, data
