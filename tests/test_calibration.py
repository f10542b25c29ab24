"""The fast tier of benchmarks/calibration.py: its designs are the shipped presets', every
check yields rows, and the report prints nothing the simulations show off nominal (few
studies here; the benchmark runs >= 200 per design)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from scale_fpt.presets import STUDIES

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "calibration.py"


@pytest.fixture(scope="module")
def calibration():
    spec = importlib.util.spec_from_file_location("calibration", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibration"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_shipped_preset_has_a_design(calibration):
    designs = calibration.preset_designs()
    named = {name for d in designs for name in d.presets.split(", ")}
    assert named == {f"{s}/{p}" for s, study in STUDIES.items() for p in study.presets}
    lr = next(d for d in designs if "lr-search/local" in d.presets.split(", "))
    assert (lr.seeds, lr.confirm_seeds, lr.candidates) == (3, 3, 4)


def test_checks_at_three_seeds(calibration):
    design = calibration.Design("test", 3, 3, 4, 1, 600, 100)
    rows = {r.name: r for r in calibration.run(60, seed=1, designs=[design])}
    # Exact tests never exceed their level; the asymptotic log-rank is not printed.
    assert rows["log-rank, exact permutation (level 0.05)"].coverage == 0  # least p is 0.1
    assert not rows["log-rank, asymptotic (level 0.05)"].printed
    assert not rows["sign-flip test, exact (level 0.05)"].printed  # least p is 0.25
    assert not rows["Kaplan-Meier median: log-log 95% interval"].printed
    assert rows["paired difference: paired-t 95% interval"].calibrated
    assert rows["chosen lr's mean on confirmation seeds: t interval (headline)"].printed
    assert "| statistic |" in calibration.table(list(rows.values()))


def test_law_checks_hook_runs_or_says_it_is_skipped(calibration, capsys):
    rows = calibration.law_rows([calibration.Design("test", 3, 0, 1, 4, 200, 50)], 5)
    if not rows:
        assert "scaling-law checks skipped" in capsys.readouterr().out
    assert all(r.n_studies > 0 for r in rows)
