"""Figures of the scaling-law section (``report.scaling_laws``), each returned with the
DataFrame drawn (saved beside the PNG as CSV), made without pyplot like ``report.figures``.

- ``law_figure``: error vs size on each fitted axis, per arm: every seed (dots), each size's
  mean with its 95% t interval over seeds (bars), the fitted law with its 95% band, and the
  held-out largest size (star) with the prediction interval of the law fitted without it
  (dashed);
- ``gap_figure``: random - pretrained error vs total parameters (measured, ± its standard
  error), with the difference of the two fitted laws;
- ``transfer_figure``: effective data transferred vs fine-tuning data, with intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from scale_fpt.published import TASK_TITLES
from scale_fpt.report.figures import panels
from scale_fpt.report.scaling_laws import AXES, curve_frame, grid, seed_spread

AXIS_UNITS = {
    "total_params": "total parameters (count, log)",
    "trainable_params": "trained parameters (count, log)",
    "total_flops": "training FLOPs (frozen 4N+attn / full 6N per token, log)",
}


SEED_BOUNDS = {"lo": "ci_low", "hi": "ci_high"}
"""A size's t interval over its seeds, and a held-out size's prediction interval."""
BAND_BOUNDS = {"band_lo": "ci_low", "band_hi": "ci_high"}
"""A fitted law's band."""


def as_drawn(frame: pd.DataFrame, bounds: dict) -> pd.DataFrame:
    """``frame``'s rows as a figure's data in the report's column vocabulary
    (``report.columns``): its ``mean`` with the interval drawn around it (``bounds``) as
    ``ci_low``/``ci_high``, the others left out (not drawn)."""
    others = [c for c in (*SEED_BOUNDS, *BAND_BOUNDS) if c in frame and c not in bounds]
    return frame.drop(columns=others).rename(columns={**bounds, "n_obs": "n"})


def law_figure(points: pd.DataFrame, fits: dict, checks: dict, task: str, title: str):
    """One panel per axis fitted for ``task``; see the module docstring."""
    fitted = [a for a in AXES if any(k[0] == task and k[2] == a for k in fits)]
    drawn_axes = fitted or list(AXES)[:2]
    fig, axes = panels(len(drawn_axes), width=4.6, height=3.8)
    data = []
    rows = points[points["task"] == task]
    for ax, axis in zip(axes, drawn_axes, strict=True):
        for colour, (arm, group) in enumerate(rows.groupby("arm", sort=True)):
            c = f"C{colour}"
            ax.scatter(group[axis], group["error"], s=10, alpha=0.35, color=c)
            spread = seed_spread(group, axis)
            ax.errorbar(
                spread[axis],
                spread["mean"],
                yerr=[
                    (spread["mean"] - spread["lo"]).fillna(0),
                    (spread["hi"] - spread["mean"]).fillna(0),
                ],
                fmt="o",
                color=c,
                capsize=3,
                label=f"{arm} (n={len(group)})",
            )
            data.append(as_drawn(spread, SEED_BOUNDS).assign(task=task, arm=arm, axis=axis,
                                                          kind="seeds"))  # fmt: skip
            fit, _ = fits.get((task, arm, axis), (None, None))
            if fit is not None:
                curve = curve_frame(fit, grid(group[axis]))
                ax.plot(curve[axis], curve["mean"], color=c, lw=1.2)
                ax.fill_between(
                    curve[axis], curve["band_lo"], curve["band_hi"], color=c, alpha=0.15
                )
                data.append(as_drawn(curve, BAND_BOUNDS).assign(task=task, arm=arm, axis=axis,
                                                             kind="fit"))  # fmt: skip
            check = checks.get((task, arm)) if axis == "total_params" else None
            if check is not None:
                held = check.rows.iloc[0]
                ax.plot(held[axis], held["observed"], marker="*", ms=13, color=c, mec="k")
                ax.errorbar(
                    held[axis] * 1.08,
                    held["mean"],
                    yerr=[[held["mean"] - held["lo"]], [held["hi"] - held["mean"]]],
                    fmt="x",
                    color=c,
                    capsize=4,
                    ls="none",
                )
                partial = curve_frame(check.fit, grid(group[axis]))
                ax.plot(partial[axis], partial["mean"], color=c, ls="--", lw=1)
                data.append(as_drawn(check.rows, SEED_BOUNDS).assign(task=task, arm=arm, axis=axis,
                                                                  kind="held-out"))  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide within a decade
        if len(rows):  # the data's range: a band far outside it would flatten the points
            ax.set_ylim(rows["error"].min() / 2, rows["error"].max() * 2)
        ax.set_xlabel(AXIS_UNITS[axis])
        ax.set_ylabel("test error (1 - accuracy, log)")
        ax.set_title(f"{TASK_TITLES.get(task, task)}: {title}", fontsize=9)
    axes[0].legend(fontsize=7)
    return fig, pd.concat(data, ignore_index=True) if data else pd.DataFrame()


def gap_figure(points: pd.DataFrame, fits: dict, task: str, pairs: list[tuple[str, str]]):
    """Random - pretrained error vs total parameters; bars: sqrt(s_r²/n_r + s_p²/n_p)."""
    fig, axes = panels(1, width=5.6, height=3.8)
    ax = axes[0]
    drawn = []
    rows = points[points["task"] == task]
    for colour, (pretrained, random) in enumerate(pairs):
        # Each arm's columns after its init (``report.columns``): pretrained_mean, random_n.
        a, b = (
            seed_spread(rows[rows["arm"] == arm], "total_params")[
                ["total_params", "n", "mean", "std"]
            ]
            .set_index("total_params")
            .add_prefix(f"{init}_")
            for arm, init in ((pretrained, "pretrained"), (random, "random"))
        )
        both = a.join(b, how="inner").reset_index()
        if both.empty:
            continue
        gap = both["random_mean"] - both["pretrained_mean"]
        se = np.sqrt(
            both["random_std"].fillna(0) ** 2 / both["random_n"]
            + both["pretrained_std"].fillna(0) ** 2 / both["pretrained_n"]
        )
        label = f"{random} - {pretrained}"
        ax.errorbar(
            both["total_params"], gap, yerr=se, fmt="o", capsize=3, color=f"C{colour}", label=label
        )
        drawn.append(both.assign(task=task, pair=label, gap=gap, se=se, kind="seeds"))
        fp, _ = fits.get((task, pretrained, "total_params"), (None, None))
        fr, _ = fits.get((task, random, "total_params"), (None, None))
        if fp is None or fr is None:
            continue
        frame = pd.DataFrame({"total_params": grid(both["total_params"])})
        fitted = fr.point(frame) - fp.point(frame)
        ax.plot(frame["total_params"], fitted, color=f"C{colour}")
        drawn.append(frame.assign(task=task, pair=label, gap=fitted, kind="fit"))
    if drawn:  # the measured gaps' range: the band can widen far beyond it
        seeds = pd.concat([d for d in drawn if d["kind"].iloc[0] == "seeds"])
        margin = float((seeds["gap"].abs() + 2 * seeds["se"]).max())
        ax.set_ylim(min(0.0, seeds["gap"].min()) - margin, seeds["gap"].max() + margin)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(AXIS_UNITS["total_params"])
    ax.set_ylabel("error gap: random - pretrained")
    ax.set_title(f"{TASK_TITLES.get(task, task)}: pretrained - random gap vs size", fontsize=9)
    if drawn:
        ax.legend(fontsize=7)
    return fig, pd.concat(drawn, ignore_index=True) if drawn else pd.DataFrame()


def transfer_figure(table: pd.DataFrame):
    """Effective data transferred D_T vs fine-tuning examples D_F, per task and model."""
    fig, axes = panels(1, width=5.6, height=3.8)
    ax = axes[0]
    for colour, (key, group) in enumerate(table.groupby(["task", "model", "finetune"])):
        finite = group[np.isfinite(group["D_T"]) & (group["D_T"] > 0)]
        # An interval the table withholds (``scaling_laws.TRANSFER_NOTE``) is not drawn.
        low = np.nan_to_num(np.clip(finite["D_T"] - finite["D_T_low"], 0, None))
        high = np.where(np.isfinite(finite["D_T_high"]), finite["D_T_high"] - finite["D_T"], 0)
        ax.errorbar(
            finite["D_F"],
            finite["D_T"],
            yerr=[low, high],
            fmt="o-",
            capsize=3,
            color=f"C{colour}",
            label=" · ".join(key) + f" (seeds {int(group['n'].min())}+)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("fine-tuning examples D_F (count, log)")
    ax.set_ylabel("effective data transferred D_T (examples, log)")
    drawn = np.isfinite(table["D_T_low"]).any() if len(table) else False
    ax.set_title("Effective data transferred from pretraining"
                 + (" (95% intervals)" if drawn else " (intervals not calibrated: not drawn)"),
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=7)
    return fig, table
