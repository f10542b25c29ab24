"""Every comparison of arms the report prints (pretrained - random, the LR-fair contrasts, matched
budgets), computed once with p-values adjusted in the families the analysis plans declared,
and the findings: one row per accuracy comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from scale_fpt.report import tables
from scale_fpt.report.stats import power_statement
from scale_fpt.report.tables.differences import DETECTABLE, detectable_text, interval_text
from scale_fpt.report.tables.families import (
    EXPLORATORY,
    Shown,
    adjust_in_families,
    adjust_together,
    family_labels,
)


@dataclass
class Comparisons:
    """Every comparison the report prints, with p-values adjusted in the families the
    analysis plans declared (``tables.families``)."""

    init: pd.DataFrame
    lr: pd.DataFrame
    matched: pd.DataFrame

    @classmethod
    def compute(cls, trials, curves, metric, thresholds, plans) -> Comparisons:
        init = tables.init_difference(trials, metric, curves, thresholds)
        contrast = "pretrained - random"
        init = adjust_in_families(init, plans, "steps to threshold", "steps_logrank_p",
                                  contrast, "steps_family")  # fmt: skip
        lr = tables.lr_differences(trials, metric)
        if not init.empty:
            init = init.assign(accuracy_family=family_labels(init, plans, "accuracy", contrast))
        if not lr.empty:
            # On selection seeds (no confirmation run) a contrast is exploratory, as its
            # note says, whatever the plan declared.
            family = family_labels(lr, plans, "accuracy", "contrast")
            lr = lr.assign(family=family.where(~lr["note"].str.startswith("exploratory"),
                                               EXPLORATORY))  # fmt: skip
        # The family "accuracy: pretrained - random" has rows in both tables: one
        # adjustment over the family, a test in both tables (same seeds, same rates)
        # counted once.
        init, lr = adjust_together([
            Shown(init, "accuracy_family", "accuracy_p", ("accuracy_diff", "accuracy_p",
                                                           "accuracy_n_pairs")),
            Shown(lr, "family", "p_t", ("diff", "p_t", "n")),
        ])  # fmt: skip
        init = with_family_power(init, "accuracy_", "accuracy_n_pairs", "accuracy_p")
        lr = with_family_power(lr, "", "n", "p_t")
        frames = [tables.matched_differences(trials, curves, m) for m in ("flops", "examples")]
        frames = [f for f in frames if not f.empty]
        matched = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        matched = adjust_in_families(matched, plans, "matched budgets", "p", "contrast", "family")
        matched = with_family_power(matched, "", "n_pairs", "p")
        return cls(init, lr, matched)

    def findings(self, baselines: dict) -> pd.DataFrame:
        """One row per accuracy comparison: what, difference [95% CI], each arm's accuracy, n,
        p (BH within its family), the difference its n detects at 80% power, the task's
        baselines (``tables.baselines``), planned or exploratory."""
        rows, by_numbers, repeated = [], {}, {}
        for r in self.init.to_dict("records"):
            means = {"pretrained": r["accuracy_pretrained"], "random": r["accuracy_random"]}
            rows.append(finding(r, INIT_KEYS, "pretrained - random", r["accuracy_family"],
                                f"{r['model']} · {r['finetune_label']} · lr {r['lr']:g}",
                                means=means))  # fmt: skip
            by_numbers[same_numbers(r, rows[-1])] = rows[-1]
        for r in self.lr.to_dict("records"):
            rows.append(finding(r, LR_KEYS, f"{r['contrast']} (each at its best lr)", r["family"],
                                f"{r['model']} · {r['headline']}", r.get("note", "")))  # fmt: skip
        for r in self.matched.to_dict("records"):
            means = dict(zip(r["contrast"].split(" - "), (r["mean_a"], r["mean_b"]), strict=True))
            row = finding(r, MATCHED_KEYS, f"{r['contrast']} at equal {r['match']}", r["family"],
                          f"{r['model']} · lr {r['lr']:g}", means=means)  # fmt: skip
            # Arms that ran the same steps at the same cost compare the same at equal FLOPs or
            # examples: one row, with a note, instead of the same numbers three times.
            same = by_numbers.get(same_numbers(r, row))
            if same is not None and same["status"] == row["status"]:
                repeated.setdefault(id(same), (same, []))[1].append(r["match"])
                continue
            rows.append(row)
        for same, matches in repeated.values():
            said = f"the same at equal {' and at equal '.join(matches)} (Matched budgets)"
            same["note"] = "; ".join(filter(None, (same["note"], said)))
        table = pd.DataFrame(rows)
        if not table.empty:
            table.insert(table.columns.get_loc("status"), "baselines", table["task"].map(baselines))
        return table


def with_family_power(frame: pd.DataFrame, prefix: str, n: str, p: str) -> pd.DataFrame:
    """``frame`` with ``<prefix>detectable_family`` at the level of its family's size
    (``<p>_family_size``, ``stats.power_statement``)."""
    if frame.empty:
        return frame
    columns = zip(frame[f"{prefix}sd_diff"], frame[n], frame[f"{p}_family_size"], strict=True)
    family = [power_statement(sd, int(k), int(m))["detectable_family"] for sd, k, m in columns]
    return frame.assign(**{f"{prefix}detectable_family": family})


def same_numbers(row: dict, shown: dict) -> tuple:
    """What makes two findings one: the sweep, task, model and lr of the comparison's ``row``
    and the difference, accuracies and n it ``shown``."""
    return (row["sweep"], row["task"], row["model"], row["lr"],
            *(shown[k] for k in ("difference (pp) [95% CI]", "accuracies (%)", "n")))  # fmt: skip


def finding(
    row: dict, keys: dict, contrast: str, family: str, setting: str, note="", means=None
) -> dict:
    """A row of the findings: ``keys`` maps diff, ci_low, ci_high, n, p, p_adjusted and
    detectable to ``row``'s columns; ``means``: each arm's mean accuracy (%), shown beside
    the task's baselines."""

    def get(key):
        value = row.get(keys.get(key, key), math.nan)
        return math.nan if value is None else float(value)

    p, n = get("p"), get("n")
    return {
        "task": row["task"],
        "comparison": contrast,
        "setting": f"{setting} · {row['sweep']}",
        "difference (pp) [95% CI]": interval_text(
            {k: row.get(keys.get(k, k)) for k in ("diff", "ci_low", "ci_high", "interval_note")},
            label="",
        ),
        "accuracies (%)": " · ".join(f"{arm} {value:.1f}" for arm, value in (means or {}).items()),
        "n": int(n) if math.isfinite(n) else "",
        "p (BH)": f"{p:.2g} ({get('p_adjusted'):.2g})" if math.isfinite(p) else "—",
        "detectable at 80% power (pp)": (
            detectable_text({k: row.get(keys.get(k, k)) for k in DETECTABLE})
            if math.isfinite(get("detectable"))
            else "—"
        ),
        "status": "exploratory" if family == EXPLORATORY else "planned",
        "note": note,
    }


def pp_interval_text(diff: float, low: float, high: float) -> str:
    """A difference in pp with its interval, '+1.8 [+0.9, +2.7]'; '+1.8 (no interval)' where the
    seeds give none (one pair)."""
    if not math.isfinite(diff):
        return "—"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{diff:+.1f} (no interval)"
    return f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]"


INIT_KEYS = {k: f"accuracy_{k}" for k in ("diff", "ci_low", "ci_high", "interval_note", "p",
                                           "p_adjusted", *DETECTABLE)} | {
    "n": "accuracy_n_pairs"}  # fmt: skip


LR_KEYS = {"p": "p_t", "p_adjusted": "p_t_adjusted"}


MATCHED_KEYS = {"n": "n_pairs"}
