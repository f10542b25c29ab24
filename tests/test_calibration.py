"""The fast tier of benchmarks/calibration.py: its designs are the shipped presets', every
check yields rows, and the report prints nothing the simulations show off nominal (few
studies here; the benchmark runs >= 200 per design)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from scale_fpt.analysis.coverage import Design as LawDesign
from scale_fpt.recipes.studies import STUDIES

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
    rows = {r.name: r for r in calibration.run(60, seed=1, designs=[design], law_designs=[])}
    # Exact tests never exceed their level; the asymptotic log-rank is not printed.
    assert rows["log-rank, exact permutation (level 0.05)"].coverage == 0  # least p is 0.1
    assert not rows["log-rank, asymptotic (level 0.05)"].printed
    assert not rows["sign-flip test, exact (level 0.05)"].printed  # least p is 0.25
    assert not rows["Kaplan-Meier median: log-log 95% interval"].printed
    assert rows["paired difference: paired-t 95% interval"].calibrated
    assert rows["chosen lr's mean on confirmation seeds: t interval (headline)"].printed
    assert "| statistic |" in calibration.table(list(rows.values()))


def test_law_rows_at_a_ladder_design(calibration):
    design = LawDesign("ladder", (1.2e8, 3.5e8, 7.7e8, 1.5e9), 3)
    rows = calibration.law_rows([design], 40, seed=0)
    names = {r.name for r in rows}
    assert any(n.startswith("alpha") and n.endswith("(power)") for n in names)
    assert any(n.endswith("(power_floor)") for n in names)
    assert all(r.design for r in rows)
    assert all(r.n_studies == 40 for r in rows if r.printed)
    # Four sizes leave a floored law (three parameters) one degree of freedom and its
    # held-out prediction none: that interval is never printed.
    held_out = [r for r in rows if r.name.startswith("held-out") and "power_floor" in r.name]
    assert held_out and not any(r.printed for r in held_out)
    # What the report prints is what passed its check.
    assert all(r.calibrated for r in rows if r.printed)
