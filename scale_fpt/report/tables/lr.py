"""Learning-rate fairness: every arm at its own best learning rate (chosen on validation)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scale_fpt.published import paper_lr
from scale_fpt.report.stats import adjust_p, paired_difference
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
from scale_fpt.report.tables.differences import (
    mixed_settings,
    setting_mixed,
    task_baseline,
    withheld,
)
from scale_fpt.report.tables.display import cell_text, count
from scale_fpt.vocabulary import CONFIRM_SUFFIX


def lr_points(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Every candidate (lr, batch size) of every arm run at two or more learning rates: the
    selection ``score`` (mean ``best_val_accuracy`` over its seeds, %), ``score_std``,
    ``n_seeds``, ``failed_seeds``, and the metric's statistics over those seeds
    (``cell_summary``). A candidate's score needs every seed: one that failed, diverged, was
    stopped or is missing (fewer seeds than the arm's other candidates) makes it NaN, so a
    rate that diverged in 2 of 3 seeds cannot win on its survivor. A confirmation sweep
    (``<sweep>-confirm``) is no search, whatever rates it re-ran."""
    df = prepare(trials, metric)
    df = df[~df["sweep"].astype(str).str.endswith(CONFIRM_SUFFIX)]
    keys = list(SEARCH_ARM_KEYS)
    used_lrs = df["lr"].where(df["used"])  # rates of used trials only (NaN is not counted)
    n_lrs = used_lrs.groupby([df[k] for k in keys], dropna=False).transform("nunique")
    df = df[n_lrs > 1]
    seeds_per_arm = df.groupby(keys, dropna=False)["seed"].nunique()
    records = []
    for _, group in df.groupby([*keys, *SEARCHED], dropna=False, sort=False):
        first = group.iloc[0]
        used = group[group["used"]]
        record = {k: first[k] for k in (*ARM_KEYS, "kind", "model_label")}
        record.update({k: first[k] for k in ("init_label", "finetune")})
        record["arm"] = (
            f"{first['model_label']} · {first['init_label']} · {first['finetune_label']}"
        )
        complete = group["status"].eq("completed") & np.isfinite(
            group[SELECTION].to_numpy(dtype=float, na_value=np.nan)
        )
        expected = int(seeds_per_arm.loc[tuple(first[k] for k in keys)])
        record["failed_seeds"] = expected - int(group.loc[complete, "seed"].nunique())
        every_seed = record["failed_seeds"] == 0
        record["score"] = float(used[SELECTION].mean() * 100) if every_seed else math.nan
        record["score_std"] = float(used[SELECTION].std() * 100) if every_seed else math.nan
        record["n_seeds"] = int(used["seed"].nunique())
        record.update(cell_summary(group))
        records.append(record)
    return pd.DataFrame(records)


LR_SELECTION = (
    "arms (every setting but lr and batch size, within one sweep) run at two or more "
    "learning rates; each arm's candidates are its (lr, batch size) configurations, each "
    "trained for every seed; a candidate with a failed, diverged, stopped or missing seed "
    "scores nothing; the best is the one with the highest mean best_val_accuracy over its "
    "seeds (ties: the lower rate). The headline is test accuracy at each seed's selected step "
    "on the confirmation seeds (the sweep's -confirm runs: fresh seeds that took no part in "
    "the choice); without them, on the selection seeds, which flatter the winner"
)


def lr_fair(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Each arm at its own best learning rate (Rothermel et al. 2021): for every arm run at
    several rates, the (lr, batch size) with the highest mean ``best_val_accuracy`` over
    every one of its seeds (ties: the lower rate) as ``best_lr``/``batch_size``. The headline
    (``mean``, ``std``, ``ci95``, ``n``, ``trial_ids``) is the metric on the confirmation
    seeds (``headline`` = 'confirmation'), else on the selection seeds (``headline`` =
    'selection seeds'), whose numbers also stay as ``selection_mean``/``_n``; the best
    configuration at the paper's rate beside it (``paper_lr_mean``/``_std``/``_ci95``/``_n``,
    NaN when that rate was not run or lost a seed); and how many configurations were tried
    (``n_candidates``). Selection reads validation only."""
    points = lr_points(trials, metric)
    df = prepare(trials, metric)
    title = "LR-fair comparison: every arm at its own best learning rate"
    if points.empty:
        return annotate(empty_table("LR"), title, LR_SELECTION, df.iloc[:0], df.iloc[:0])
    records = []
    for _, group in points.groupby(list(SEARCH_ARM_KEYS), dropna=False, sort=False):
        group = group.sort_values(["lr", "batch_size"]).reset_index(drop=True)
        if group["score"].notna().any():
            best = group.loc[group["score"].idxmax()].to_dict()
        else:
            best = {**group.iloc[0].to_dict(), "n": 0, "mean": math.nan, "best_lr": math.nan}
            best["note"] = "no configuration completed every seed"
        scored = group[group["score"].notna()]
        at_paper = scored[np.isclose(scored["lr"], paper_lr(best["task"]), rtol=1e-9, atol=0)]
        paper = at_paper.loc[at_paper["score"].idxmax()] if len(at_paper) else None
        search = group  # the search arm's every candidate
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
            best_lr=best["lr"] if group["score"].notna().any() else math.nan,
            lrs=",".join(f"{v:.3g}" for v in group["lr"].unique()),
            lr_at_edge=edge(best["lr"], group["lr"]) if group["score"].notna().any() else "",
            n_lrs=group["lr"].nunique(),
            n_candidates=len(group),
            n_failed_candidates=int(group["score"].isna().sum()),
            batch_sizes=",".join(str(int(b)) for b in sorted(group["batch_size"].unique())),
            **{
                f"paper_lr_{k}": math.nan if paper is None else paper[k]
                for k in ("mean", "std", "ci95", "n", "batch_size", "score")
            },
        )
        best.update(headline_stats(df, best))
        best.update(gain_over_paper_lr(df, best, paper))
        records.append(best)
    out = pd.DataFrame(records)
    out = finish(disambiguate(out, keys=("max_steps", "weights")))
    out.attrs["compute_scope"] = "the whole search of each arm: every rate and seed"
    ids = set(",".join(points["trial_ids"]).split(",")) | set(",".join(out["trial_ids"]).split(","))
    used = df[df["trial_id"].isin(ids) & df["used"]]
    return annotate(out, title, LR_SELECTION, used, df.iloc[:0])


def edge(lr: float, tried: pd.Series) -> str:
    """'lowest' or 'highest' when ``lr`` is at that end of the rates tried (the best rate may
    lie beyond the grid or search box), else ''."""
    if tried.nunique() < 2:
        return ""
    if np.isclose(lr, tried.min(), rtol=1e-9, atol=0):
        return "lowest"
    if np.isclose(lr, tried.max(), rtol=1e-9, atol=0):
        return "highest"
    return ""


def headline_stats(df: pd.DataFrame, best: dict) -> dict:
    """The chosen configuration's numbers on its confirmation seeds where they were run (the
    rows of sweep ``<sweep>-confirm`` with the same setting, lr and batch size), keeping the
    selection seeds' as ``selection_*``."""
    selection = {f"selection_{k}": best.get(k, math.nan) for k in ("mean", "std", "ci95", "n")}
    selection["selection_trial_ids"] = best.get("trial_ids", "")
    confirmation = confirmation_rows(df, best)
    if confirmation.empty:
        return {**selection, "headline": "selection seeds"}
    stats = cell_summary(confirmation)
    keep = ("n", "mean", "std", "ci95", "ci_low", "ci_high", "trial_ids", "note", "excluded")
    return {**selection, **{k: stats[k] for k in keep}, "headline": "confirmation"}


def gain_over_paper_lr(df: pd.DataFrame, best: dict, paper) -> dict:
    """{gain_over_paper_lr, gain_note}: the chosen configuration's mean minus the paper-rate
    configuration's, both on the confirmation seeds (the selection seeds chose the winner, so
    its lead there is biased upwards even when every rate is equally good). 0 when the
    paper's rate won; NaN, with the reason, when the paper's rate has no confirmation rows."""
    if paper is None:
        return {"gain_over_paper_lr": math.nan, "gain_note": "the paper's lr was not run"}
    if np.isclose(paper["lr"], best["lr"], rtol=1e-9, atol=0) and (
        paper["batch_size"] == best["batch_size"]
    ):
        return {"gain_over_paper_lr": 0.0, "gain_note": "the paper's lr was chosen"}
    if best["headline"] != "confirmation":
        return {"gain_over_paper_lr": math.nan,
                "gain_note": "no confirmation seeds (the selection seeds flatter the winner)"}  # fmt: skip
    at_paper = confirmation_rows(df, {**best, "lr": paper["lr"], "batch_size": paper["batch_size"]})
    if at_paper.empty:
        return {"gain_over_paper_lr": math.nan,
                "gain_note": "the paper's lr was not re-run on the confirmation seeds"}  # fmt: skip
    return {
        "gain_over_paper_lr": best["mean"] - cell_summary(at_paper)["mean"],
        "gain_note": "on the confirmation seeds",
    }


def confirmation_rows(df: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Rows of the ``<sweep>-confirm`` sweep with ``config``'s setting, lr and batch size."""
    rows = df[df["sweep"] == f"{config['sweep']}{CONFIRM_SUFFIX}"]
    keys = [k for k in (*SEARCH_ARM_KEYS, *SEARCHED) if k != "sweep"]
    if rows.empty:
        return rows
    target = pd.Series({k: config[k] for k in keys}, dtype=object)
    values = rows[keys].astype(object)
    same = values.eq(target) | (values.isna() & target.isna())
    return rows[same.all(axis=1)]


ARM_CONTRASTS = (
    ("finetune_label", "full", "fpt"),
    ("init_label", "pretrained", "random"),
)
"""The LR-fair table's comparisons: (what differs, arm a, arm b) for a - b, every other
setting equal, each arm at its own best learning rate."""


def lr_differences(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """full - fpt and pretrained - random, each arm at its own best learning rate, on the
    confirmation seeds: the mean paired difference over the seeds both arms ran (the same
    seed gives both the same heads, data and dropout streams) with its paired-t 95%
    interval and p, d_z with its exact interval, the exact sign-flip p, the smallest
    difference detectable at 80% power (``stats.paired_difference``; its paired t p as
    ``p``, ``test`` 'paired t'), and Benjamini-Hochberg adjusted p-values over the table's
    family (``p_adjusted``; column names: ``report.columns``). ``note`` says why a
    contrast has no numbers (an arm without confirmation rows: its selection seeds chose
    its rate, so they would flatter it) or why they are exploratory (neither arm was
    confirmed: both on their selection seeds)."""
    fair = lr_fair(trials, metric)
    df = prepare(trials, metric)
    values = df[df["used"]].set_index("trial_id")
    mixed = mixed_settings(df[df["used"]])
    records = []
    for column, a, b in ARM_CONTRASTS:
        keys = [k for k in SEARCH_ARM_KEYS if k != column and k in fair]
        if column == "init_label":
            keys = [k for k in keys if k not in ("init", "weights")]
        if column == "finetune_label":
            keys = [k for k in keys if k != "finetune"]
        for _, group in fair.groupby(keys, dropna=False, sort=False):
            arms = {row[column]: row for _, row in group.iterrows()}
            if a not in arms or b not in arms:
                continue
            confirmed = {arm: arms[arm]["headline"] == "confirmation" for arm in (a, b)}
            seeds = {arm: per_seed(values, arms[arm]["trial_ids"]) for arm in (a, b)}
            if all(confirmed.values()) or not any(confirmed.values()):
                diff = paired_difference(seeds[a], seeds[b])
                elsewhere = next(filter(None, (setting_mixed(mixed, arms[arm],
                                                             (arms[arm]["init_label"],))
                                                for arm in (a, b))), "")  # fmt: skip
                baseline = task_baseline(arms[a]["task"])
                diff.update(withheld(pd.Series(seeds[a]), pd.Series(seeds[b]), baseline,
                                     diff["n"], elsewhere))  # fmt: skip
            else:
                diff = paired_difference({}, {})
            records.append(
                {
                    **{k: arms[a][k] for k in keys},
                    "contrast": f"{a} - {b}",
                    "lr_a": arms[a]["best_lr"],
                    "lr_b": arms[b]["best_lr"],
                    "headline": f"{arms[a]['headline']} / {arms[b]['headline']}",
                    **{k: v for k, v in diff.items() if k not in ("seeds", "p_t")},
                    "p": diff["p_t"],
                    "test": "paired t",
                    "seeds": ",".join(map(str, diff["seeds"])),
                    "note": contrast_note(confirmed, diff["n"]),
                }
            )
    out = pd.DataFrame(records)
    if not out.empty:
        out["p_adjusted"] = adjust_p(out["p"])
    return out


def contrast_note(confirmed: dict, n: int) -> str:
    """Why an LR-fair contrast has no numbers, or why they are exploratory."""
    unconfirmed = [arm for arm, done in confirmed.items() if not done]
    if len(unconfirmed) == 1:
        return (
            f"not compared: {unconfirmed[0]} has no confirmation rows (its chosen rate was not "
            "re-run on fresh seeds), and its selection seeds would flatter it"
        )
    if unconfirmed:
        return "exploratory: neither arm was confirmed; selection seeds flatter both winners"
    if n < 2:
        return f"{n} confirmation seed(s) shared by both arms: no interval"
    return ""


def per_seed(values: pd.DataFrame, trial_ids: str) -> dict:
    """{seed: value} of the trials ``trial_ids`` (comma list)."""
    rows = values.loc[[t for t in str(trial_ids).split(",") if t in values.index]]
    return dict(zip(rows["seed"].astype(int), rows["value"].astype(float), strict=True))


def lr_text(cell) -> str:
    """'85.0 ± 7.1 (n=2, CI ±63.5) @ lr 0.001 (best of 3 configurations); lr 0.001:
    85.0 ± 7.1 (n=2, CI ±63.5)'."""
    if not cell["n"]:
        return f"— {cell['note']}"
    text = cell_text(cell) + f" @ lr {cell['best_lr']:.3g}"
    if cell.get("lr_at_edge"):
        text += f" (the {cell['lr_at_edge']} rate tried: the best may lie beyond)"
    if cell.get("headline") == "selection seeds":
        text += " (selection seeds: no confirmation run)"
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
