"""One column vocabulary across the report's tables (scale_fpt.report.columns): every long
table the report computes, and every CSV it writes, names its p-values, intervals and n the
same way, so that a new table with ``p_t`` or ``lo``/``hi`` fails here."""

from __future__ import annotations

import pandas as pd
import pytest
from test_report import build_results, confirmed_search

from scale_fpt.analysis_plan import AnalysisPlan
from scale_fpt.report import columns
from scale_fpt.report import scaling_figures as figs
from scale_fpt.report.build import all_tables
from scale_fpt.report.comparisons import Comparisons
from scale_fpt.report.render import Document
from scale_fpt.report.sections import power_section
from scale_fpt.results import load_results

FAMILY = {"accuracy: pretrained - random": ["pretrained - random"]}


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    """{name: long DataFrame} of every table the report computes, from the report tests'
    results folder and a confirmed search with a declared family; the power table as
    written to tables/power.csv."""
    root = tmp_path_factory.mktemp("results")
    build_results(root)
    confirmed_search(root, hit=200)
    results = load_results(root)
    plan = AnalysisPlan(sweep="s", families=FAMILY)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None,
                                {"s": plan, "s-confirm": plan})  # fmt: skip
    out = root / "report"
    (out / "tables").mkdir(parents=True)
    power_section(Document(out), out, found, 5.0)
    frames = {
        **all_tables(results),
        "pretrained - random": found.init,
        "LR-fair differences": found.lr,
        "matched budgets": found.matched,
        "findings": found.findings({}),
        "power": pd.read_csv(out / "tables" / "power.csv"),
    }
    return frames


def test_every_table_follows_the_vocabulary(computed):
    for name, frame in computed.items():
        assert len(frame), f"{name}: empty, so this test reads nothing of it"
        assert columns.problems(frame.columns) == [], name


def test_the_same_statistic_has_the_same_name_in_every_table(computed):
    """A pandas reader finds 'the p', its adjustment, the interval and n under one name: bare
    where a table has one test, after the outcome where it has two."""
    init = computed["pretrained - random"]
    for name in ("LR-fair differences", "matched budgets", "findings"):
        frame = computed[name]
        assert {"diff", "ci_low", "ci_high", "n", "p", "p_adjusted", "status"} <= set(frame), name
        assert set(frame["status"]) <= set(columns.STATUSES)
    for outcome in columns.OUTCOMES:
        assert {f"{outcome}_{k}" for k in ("diff", "ci_low", "ci_high", "p", "p_adjusted",
                                            "test", "status")} <= set(init)  # fmt: skip
    assert set(computed["findings"]["status"]) == set(columns.STATUSES)
    assert "paired t" in set(init["accuracy_test"]) <= {"paired t", "Welch t", ""}
    assert set(init["steps_test"]) <= {"exact log-rank", "Monte Carlo log-rank",
                                       "normal log-rank", ""}  # fmt: skip
    assert set(computed["LR-fair differences"]["test"]) == {"paired t"}
    # The confirmed search's test shows in both tables with the same p under the same name.
    lr = computed["LR-fair differences"].set_index("contrast").loc["pretrained - random"]
    same = init[(init["sweep"] == "s-confirm")].iloc[0]
    assert lr["p"] == pytest.approx(same["accuracy_p"])
    assert lr["p_adjusted"] == pytest.approx(same["accuracy_p_adjusted"])
    assert lr["status"] == same["accuracy_status"] == "planned"
    for cells in ("T1", "T2", "LR"):
        assert {"mean", "ci_low", "ci_high", "n"} <= set(computed[cells]), cells


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["diff", "p_t"], "retired name: now p (with test 'paired t')"),
        (["accuracy_diff", "accuracy_n_pairs"], "retired name: now n"),
        (["steps_logrank_p"], "retired name: now steps_p"),
        (["diff", "p (BH)"], "one word"),
        (["difference [95% CI]"], "one word"),
        (["n pairs"], "one word"),
        (["diff", "p_two_sided"], "a p column is one of"),
        (["D_E", "D_E_lo", "D_E_hi"], "end in _low and _high"),
        (["ci_low", "ci_high"], "no mean or diff"),
        (["accuracy_mean", "steps_ci_low"], "no steps_mean or steps_diff"),
        (["d_z_low"], "no 'd_z'"),
        (["mean", "ci"], "an estimate's interval is one of"),
    ],
)
def test_a_column_outside_the_vocabulary_is_named_with_the_right_one(names, problem):
    found = columns.problems(names)
    assert len(found) >= 1 and problem in " ".join(found), found


def test_the_vocabulary_accepts_its_own_names():
    names = [
        "mean", "ci_low", "ci_high", "ci95", "n", "n_a", "n_trials", "paper_lr_mean",
        "paper_lr_ci95", "paper_lr_n", "selection_n", "diff", "interval_note", "p",
        "p_adjusted", "p_family_size", "p_sign_flip", "p_sign_flip_min", "test", "status",
        "accuracy_diff", "accuracy_ci_low", "accuracy_p", "accuracy_n", "steps_diff",
        "steps_p", "steps_p_min", "steps_p_se", "d_z", "d_z_low", "d_z_high",
        "lower_bound", "published_diff", "score", "lr_at_edge",
    ]  # fmt: skip
    assert columns.problems(names) == []


def test_a_figures_data_names_the_interval_it_draws():
    """A held-out size is drawn with its prediction interval, a fitted law with its band:
    each is the row's ci_low/ci_high in the figure's CSV, the other interval left out."""
    row = pd.DataFrame([{"N": 1e9, "n_obs": 3, "mean": 0.2, "lo": 0.1, "hi": 0.3,
                         "band_lo": 0.15, "band_hi": 0.25}])  # fmt: skip
    held = figs.as_drawn(row, figs.SEED_BOUNDS)
    assert list(held.columns) == ["N", "n", "mean", "ci_low", "ci_high"]
    assert (held["ci_low"].iloc[0], held["ci_high"].iloc[0]) == (0.1, 0.3)
    curve = figs.as_drawn(row.drop(columns="n_obs"), figs.BAND_BOUNDS)
    assert (curve["ci_low"].iloc[0], curve["ci_high"].iloc[0]) == (0.15, 0.25)
    assert columns.problems(held.columns) == columns.problems(curve.columns) == []
