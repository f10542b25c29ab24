"""Every comparison of arms the report prints (pretrained - random, the LR-fair contrasts, matched
budgets), computed once with p-values adjusted in the families the analysis plans declared,
and the findings: one row per accuracy comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from scale_fpt.report import tables
from scale_fpt.report.stats import power_statement
from scale_fpt.report.tables.differences import (
    DETECTABLE,
    detectable_text,
    interval_text,
    p_bh_text,
)
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
        init = adjust_in_families(init, plans, "steps to threshold", "steps_p", contrast,
                                  "steps_family")  # fmt: skip
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
                                                           "accuracy_n")),
            Shown(lr, "family", "p", ("diff", "p", "n")),
        ])  # fmt: skip
        init = with_family_power(init, "accuracy_")
        lr = with_family_power(lr)
        frames = [tables.matched_differences(trials, curves, m) for m in ("flops", "examples")]
        frames = [f for f in frames if not f.empty]
        matched = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        matched = adjust_in_families(matched, plans, "matched budgets", "p", "contrast", "family")
        matched = with_family_power(matched)
        return cls(init, lr, matched)

    def findings(self, baselines: dict) -> pd.DataFrame:
        """One row per accuracy comparison, in the report's column vocabulary
        (``report.columns``): what (``comparison``, ``setting``), ``diff`` with its
        interval, each arm's accuracy (``accuracies (%)``), ``n``, ``p`` and ``p_adjusted``
        (BH within its ``family``), ``test``, the difference its n detects at 80% power
        (``detectable``...), the task's baselines (``tables.baselines``), ``status``
        (planned or exploratory) and ``note``. ``findings_display`` shows it."""
        rows, by_numbers, repeated = [], {}, {}
        for r in self.init.to_dict("records"):
            means = {"pretrained": r["accuracy_pretrained"], "random": r["accuracy_random"]}
            rows.append(finding(r, "accuracy_", "pretrained - random",
                                f"{r['model']} · {r['finetune_label']} · lr {r['lr']:g}",
                                means=means))  # fmt: skip
            by_numbers[same_numbers(r, rows[-1])] = rows[-1]
        for r in self.lr.to_dict("records"):
            rows.append(finding(r, "", f"{r['contrast']} (each at its best lr)",
                                f"{r['model']} · {r['headline']}", r.get("note", "")))  # fmt: skip
        for r in self.matched.to_dict("records"):
            means = dict(zip(r["contrast"].split(" - "), (r["mean_a"], r["mean_b"]), strict=True))
            row = finding(r, "", f"{r['contrast']} at equal {r['match']}",
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
            table["n"] = table["n"].astype("Int64")
            table.insert(table.columns.get_loc("status"), "baselines", table["task"].map(baselines))
        return table


def findings_display(findings: pd.DataFrame) -> pd.DataFrame:
    """The findings (``Comparisons.findings``) as the report shows them: the difference
    with its interval, 'p (BH)' and the detectable difference as text."""
    rows = findings.to_dict("records")
    texts = {
        "difference (pp) [95% CI]": [interval_text(r, label="") for r in rows],
        "p (BH)": [p_bh_text(r["p"], r["p_adjusted"]) for r in rows],
        "detectable at 80% power (pp)": [
            detectable_text(r) if math.isfinite(r["detectable"]) else "—" for r in rows
        ],
        "n": findings["n"].astype(object).where(findings["n"].notna(), ""),
    }
    shown = ("task", "comparison", "setting", "difference (pp) [95% CI]", "accuracies (%)",
             "n", "p (BH)", "detectable at 80% power (pp)", "baselines", "status", "note")  # fmt: skip
    return findings.assign(**texts).loc[:, list(shown)]


def with_family_power(frame: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """``frame`` with ``<prefix>detectable_family`` at the level of its family's size
    (``<prefix>p_family_size``, ``stats.power_statement``)."""
    if frame.empty:
        return frame
    columns = zip(frame[f"{prefix}sd_diff"], frame[f"{prefix}n"],
                  frame[f"{prefix}p_family_size"], strict=True)  # fmt: skip
    family = [power_statement(sd, int(k), int(m))["detectable_family"] for sd, k, m in columns]
    return frame.assign(**{f"{prefix}detectable_family": family})


def same_numbers(row: dict, found: dict) -> tuple:
    """What makes two findings one: the sweep, task, model and lr of the comparison's ``row``
    and the difference, interval, accuracies and n of its finding ``found``, as shown."""
    return (row["sweep"], row["task"], row["model"], row["lr"],
            interval_text(found, label=""), found["accuracies (%)"], found["n"])  # fmt: skip


def finding(row: dict, prefix: str, contrast: str, setting: str, note="", means=None) -> dict:
    """A row of the findings from a comparison's ``row`` (its columns after ``prefix``:
    ``report.columns``); ``means``: each arm's mean accuracy (%), shown beside the task's
    baselines."""

    def get(key):
        value = row.get(prefix + key, math.nan)
        return math.nan if value is None else value

    n = float(get("n"))
    return {
        "task": row["task"],
        "comparison": contrast,
        "setting": f"{setting} · {row['sweep']}",
        **{k: float(get(k)) for k in ("diff", "ci_low", "ci_high")},
        "interval_note": get("interval_note") if isinstance(get("interval_note"), str) else "",
        "accuracies (%)": " · ".join(f"{arm} {value:.1f}" for arm, value in (means or {}).items()),
        "n": int(n) if math.isfinite(n) else None,
        **{k: float(get(k)) for k in ("p", "p_adjusted")},
        "test": get("test") if isinstance(get("test"), str) else "",
        **{k: float(get(k)) for k in DETECTABLE},
        "family": get("family"),
        "status": get("status"),
        "note": note,
    }
