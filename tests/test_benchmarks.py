"""The benchmark harnesses run against today's command line (they call it as users do)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_end_to_end_benchmark_times_a_packed_grid_to_its_last_row():
    # 2 lrs x 1 seed packed as one cohort (--pack 2): the benchmark runs `scale-fpt sweep`,
    # waits for both final rows, checks them and reads the packing off their rows.
    command = [sys.executable, "benchmarks/end_to_end.py", "--model", "gpt2-tiny"]
    command += ["--lrs", "2", "--seeds", "1", "--steps", "20", "--batch-size", "4"]
    command += ["--pack", "2", "--base", "dropout=0"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        cells[0]: cells[1]
        for line in done.stdout.splitlines()
        if line.startswith("| ")
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 2
    }
    first = float(rows["command -> first trials row (s)"])
    last = float(rows["command -> last trials row (s): the figure"].strip("*"))
    end = float(rows["command -> exit (s)"])
    work = float(rows["cohorts' own training + evaluation, summed (s)"])
    assert 0 < first <= last <= end and 0 < work < last
    assert rows["trials (rows, one per trial, final status)"] == "2 {'completed': 2}"
    assert rows["trial-steps done"] == "40"
    assert rows["packing (--pack 2, from the rows)"] == "1 cohort(s): 1 x K=2"
    assert rows["device of the trials"] == "cpu"
    assert "pack 2, dropout=0;" in done.stdout
    assert "applies to issue 11's grid" in done.stdout and "no verdict" in done.stdout


@pytest.mark.slow
def test_attention_benchmark_runs_its_arms_in_tritons_interpreter():
    """The plumbing of benchmarks/attention.py on a CPU (``--interpret``: the Triton kernel in
    Triton's interpreter, tiny shapes): three arms timed, the kernel's output equal to the
    materialised attention's. Its figures are GPU figures (docs/attention.md)."""
    pytest.importorskip("triton")
    command = [sys.executable, "benchmarks/attention.py", "--interpret"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        cells[0]: cells[1:]
        for line in done.stdout.splitlines()
        if line.startswith("| ")
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 5
    }
    assert list(rows) == ["path", "triton (keyed)", "materialised (keyed)", "sdpa (unkeyed)"]
    assert float(rows["triton (keyed)"][3]) < 1e-5
    assert rows["materialised (keyed)"][1] == "1x"
    assert "T 32, head size 16, float32, dropout 0.1, 2 member keys, device cpu" in done.stdout


@pytest.mark.slow
def test_lstm_benchmark_times_both_backbones_side_by_side():
    """The plumbing of benchmarks/lstm.py at a tiny size: both arms timed in one run, their
    ratios and the target lines printed (its figures: docs/statistics.md)."""
    command = [sys.executable, "benchmarks/lstm.py", "--seq", "4", "--width", "8", "--steps", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line[:2] == "| "]
    assert rows == ["backbone", "nn.LSTM", "layernorm"]
    assert "3 layers x 8, T 4, batch 4, fp32, device cpu" in done.stdout
    assert done.stdout.count("target: layernorm / nn.LSTM") == 2


@pytest.mark.slow
def test_study_scale_benchmark_times_each_size_and_its_growth(tmp_path):
    """benchmarks/study_scale.py --quick: one real trial trained, its rows copied into
    folders of 100 and 200 trials, each loaded, read and reported (a subprocess), with the
    growth exponent between them and ten sweeps reported apart against the largest alone."""
    command = [sys.executable, "benchmarks/study_scale.py", "--quick", "--json"]
    command += ["--sweeps-apart", "100", "--work", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    small, large = out["sizes"]
    assert (small["trials"], large["trials"]) == (100, 200)
    for size in (small, large):
        assert size["load_results_s"] > 0 and size["report_s"] > 0
        assert size["report_cpu_s"] > 0 and 50 < size["report_peak_mb"] < 4_000
    assert math.isfinite(large["exponent_report"]) and "exponent_report" not in small
    apart = out["many_sweeps"]
    assert apart["largest_trials"] == 100 and apart["other_trials"] == 180
    assert apart["ten_sweeps_s"] > 0 < apart["ratio"]
    assert not list(tmp_path.iterdir())  # the folders went with their temporary directory
