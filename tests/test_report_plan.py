"""The analysis plan written when a sweep starts, and the report following it: declared
families are adjusted alone, everything else is marked exploratory."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
from test_report import confirmed_search, write

from scale_fpt import analysis_plan
from scale_fpt.recipes.studies import STUDIES
from scale_fpt.report import tables
from scale_fpt.report.comparisons import Comparisons, findings_display
from scale_fpt.report.stats import adjust_p
from scale_fpt.report.tables.families import EXPLORATORY
from scale_fpt.results import ResultsWriter, load_results


def test_a_sweeps_plan_is_written_once_and_read_back(tmp_path):
    sweep = dataclasses.replace(STUDIES["lr-search"].presets["local"](), results_dir=str(tmp_path))
    path = analysis_plan.write_plan(sweep, sweep.trials())
    assert path == tmp_path / "lr-search-local" / "analysis_plan.json"
    plan = analysis_plan.read_plan(path.parent)
    assert plan.law_form == "power_floor" and plan.schema_version == 1
    assert plan.seeds == {"selection": [0, 1, 2], "confirmation": [3, 4, 5]}
    assert plan.thresholds == {"bit-xor": pytest.approx(0.9)}
    assert plan.family_of("full - fpt", "accuracy") == "accuracy: full - fpt"
    assert plan.family_of("full - fpt", "elsewhere") is None
    first = path.read_text()
    analysis_plan.write_plan(sweep, sweep.trials())  # a resumed sweep keeps its plan
    assert path.read_text() == first
    assert analysis_plan.plans(tmp_path, ["lr-search-local-confirm"])["lr-search-local-confirm"]
    path.write_text(json.dumps({**json.loads(first), "schema_version": 99}))
    with pytest.raises(ValueError, match="schema version 99"):
        analysis_plan.read_plan(path.parent)


def test_comparisons_outside_the_plan_are_exploratory(tmp_path):
    """Two sweeps compare pretrained - random; only one declared it: its p is adjusted
    alone (a family of one), the other's marked exploratory."""
    for name in ("planned", "unplanned"):
        writer = ResultsWriter(tmp_path, name)
        for seed, (pre, rnd) in enumerate([(0.9, 0.6), (0.95, 0.7), (0.85, 0.5)]):
            write(writer, f"{name}-p{seed}", pre, seed=seed, init="pretrained", hit=200)
            write(writer, f"{name}-r{seed}", rnd, seed=seed, init="random", hit=0)
    sweep = analysis_plan.AnalysisPlan(
        sweep="planned", families={"accuracy: pretrained - random": ["pretrained - random"]}
    )
    results = load_results(tmp_path)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None,
                                {"planned": sweep})  # fmt: skip
    init = found.init.set_index("sweep")
    assert init.loc["planned", "accuracy_family"] == "planned: accuracy: pretrained - random"
    assert init.loc["unplanned", "accuracy_family"] == EXPLORATORY
    assert init.loc["planned", "accuracy_p_adjusted"] == pytest.approx(
        init.loc["planned", "accuracy_p"]
    )
    findings = found.findings(tables.baselines(results.trials))
    init_rows = findings[findings["comparison"] == "pretrained - random"]
    assert list(init_rows["status"]) == ["planned", "exploratory"]
    # The plan declared no matched-budget family: those rows are exploratory.
    assert set(findings.loc[findings["comparison"].str.contains("equal"), "status"]) == {
        "exploratory"
    }
    assert findings["baselines"].iloc[0].startswith("chance 50%")
    # Each arm's mean accuracy beside the baselines: a difference between two arms at the
    # baseline reads as "neither learned".
    assert init_rows["accuracies (%)"].iloc[0] == "pretrained 90.0 · random 60.0"


def test_a_matched_comparison_that_repeats_the_plain_one_is_a_note(tmp_path):
    """Both arms ran the same steps at the same cost, so at equal examples they compare
    exactly as they do plainly: the findings say it once, with a note."""
    writer = ResultsWriter(tmp_path, "s")
    for seed in range(3):
        write(writer, f"p{seed}", 0.95, seed=seed, init="pretrained", hit=200)
        write(writer, f"r{seed}", 0.5, seed=seed, init="random", hit=0)
    results = load_results(tmp_path)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None, {})
    assert len(found.matched) == 1  # the matched comparison is still computed and shown
    findings = found.findings({})
    assert list(findings["comparison"]) == ["pretrained - random"]
    # Every pair differs by 45 points: no spread, and no zero-wide 95% interval.
    assert findings["diff"].iloc[0] == 45 and math.isnan(findings["ci_low"].iloc[0])
    shown = findings_display(findings)
    assert shown["difference (pp) [95% CI]"].iloc[0] == "+45.0 (no spread (all 3 seeds equal))"
    assert findings["note"].iloc[0] == "the same at equal examples (Matched budgets)"


def test_listops_baseline_is_the_measured_majority_class_of_its_test_set(tmp_path):
    """ListOps' trivial baseline is measured on the test set the trials used (here the
    generator's, at 32 tokens), not assumed from LRA; the other tasks keep their text."""
    from collections import Counter

    from scale_fpt.tasks.listops import generated_expression

    writer = ResultsWriter(tmp_path, "s")
    listops = {"task": "listops", "max_length": 32, "test_batches": 4}
    for seed in range(2):
        write(writer, f"l{seed}", 0.4, seed=seed, **listops)
    write(writer, "x", 0.9, task="bit-xor")
    found = tables.baselines(load_results(tmp_path).trials)
    values = Counter(generated_expression("test", 12345, i, 10, 10, 32)[1] for i in range(128))
    rate = max(values.values()) / 128
    assert found["listops"] == (
        f"majority class {rate:.1%} (measured on the 32-token generated test set); chance 10%"
    )
    assert found["bit-xor"].startswith("chance 50%")


def test_power_section_says_how_many_seeds_detect_a_difference(tmp_path):
    from scale_fpt.report import stats
    from scale_fpt.report.render import Document
    from scale_fpt.report.sections import power_display, power_section

    writer = ResultsWriter(tmp_path, "s")
    for seed, (pre, rnd) in enumerate([(0.9, 0.6), (0.95, 0.7), (0.85, 0.5)]):
        write(writer, f"p{seed}", pre, seed=seed, init="pretrained")
        write(writer, f"r{seed}", rnd, seed=seed, init="random")
    results = load_results(tmp_path)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None, {})
    (tmp_path / "tables").mkdir()
    power_section(Document(tmp_path), tmp_path, found, 5.0)
    (row,) = pd.read_csv(tmp_path / "tables" / "power.csv").to_dict("records")
    sd = np.std([30.0, 25.0, 35.0], ddof=1)
    low, high = stats.sd_interval(sd, 3)
    assert row["n"] == 3 and row["p_family_size"] == 1
    assert (row["sd_diff"], row["sd_diff_low"], row["sd_diff_high"]) == pytest.approx(
        (sd, low, high)
    )
    # Stated at the SD's upper 80% bound, with its range over the SD's 95% interval.
    upper = stats.sd_upper(sd, 3)
    assert (row["detectable"], row["detectable_low"], row["detectable_high"]) == pytest.approx(
        [stats.detectable_difference(s, 3) for s in (upper, low, high)]
    )
    assert row["seeds_for_pp"] == 5 and row["seeds_needed"] == stats.seeds_needed(upper, 5.0)
    shown = power_display(pd.DataFrame([row]), 5.0).iloc[0]
    assert shown["SD of differences (pp) [95% CI]"] == f"{sd:.3g} [{low:.3g}, {high:.3g}]"
    assert shown["detectable at 80% power (pp)"].startswith(
        f"{tables.differences.two_digits(stats.detectable_difference(upper, 3))} pp at 80% power "
        f"[{tables.differences.two_digits(stats.detectable_difference(low, 3))}, "
        f"{tables.differences.two_digits(stats.detectable_difference(high, 3))}]"
    )
    assert shown["seeds to detect 5 pp"] == str(stats.seeds_needed(upper, 5.0))
    assert stats.seeds_needed(upper, 5.0) > stats.seeds_needed(sd, 5.0)


def test_bad_seeds_for_is_one_error_before_any_work(tmp_path, capsys):
    from scale_fpt import cli

    assert cli.main(["report", str(tmp_path), "--seeds-for", "-1"]) == 2
    assert "--seeds-for: -1.0 must be a positive difference in pp" in capsys.readouterr().err


def test_a_declared_family_is_adjusted_whole_across_tables(tmp_path):
    """The family "accuracy: pretrained - random" of sweep s has rows in the pretrained -
    random table (at each lr of the search, and on the confirmation seeds) and in the LR-fair
    table; the confirmation sweep follows s's plan. One BH adjustment over the family, the
    test that both tables show (confirmation seeds, both arms at the same rate) counted
    once."""
    confirmed_search(tmp_path)
    plan = analysis_plan.AnalysisPlan(
        sweep="s", families={"accuracy: pretrained - random": ["pretrained - random"]}
    )
    results = load_results(tmp_path)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None,
                                {"s": plan, "s-confirm": plan})  # fmt: skip
    family = "s: accuracy: pretrained - random"
    assert set(found.init["accuracy_family"]) == {family} and len(found.init) == 3
    lr = found.lr.set_index("contrast").loc["pretrained - random"]
    assert lr["family"] == family and lr["headline"] == "confirmation / confirmation"
    confirmed = found.init.set_index("sweep").loc["s-confirm"]
    assert lr["p"] == pytest.approx(confirmed["accuracy_p"])  # one test, two tables
    adjusted = adjust_p(found.init["accuracy_p"])  # the family: 3 tests, not 4, not 3 + 1
    assert found.init["accuracy_p_adjusted"].to_numpy() == pytest.approx(adjusted)
    assert lr["p_adjusted"] == pytest.approx(confirmed["accuracy_p_adjusted"])
    rows = found.findings({})
    assert set(rows["status"]) == {"planned"}


def test_lr_fair_rows_on_selection_seeds_are_exploratory(tmp_path):
    """Without confirmation seeds an LR-fair contrast is exploratory, in its note and in its
    status, whatever the plan declared."""
    writer = ResultsWriter(tmp_path, "s")
    rng = np.random.default_rng(1)
    for lr in (1e-3, 1e-4):
        for seed in range(3):
            for init in ("pretrained", "random"):
                write(writer, f"{init}-{lr}-{seed}", 0.8 + rng.normal(0, 0.05), seed=seed,
                      init=init, lr=lr)  # fmt: skip
    plan = analysis_plan.AnalysisPlan(
        sweep="s", families={"accuracy: pretrained - random": ["pretrained - random"]}
    )
    results = load_results(tmp_path)
    found = Comparisons.compute(results.trials, results.curves, "test_accuracy", None,
                                {"s": plan})  # fmt: skip
    assert list(found.lr["family"]) == [EXPLORATORY]
    assert found.lr["note"].iloc[0].startswith("exploratory")
    rows = found.findings({})
    lr_rows = rows[rows["comparison"].str.contains("best lr")]
    assert list(lr_rows["status"]) == ["exploratory"]
    assert set(rows.loc[~rows.index.isin(lr_rows.index), "status"]) == {"planned"}
