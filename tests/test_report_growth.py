"""The report at study sizes the presets' advice leads to: 1,000 seeds an arm (every
statistic bounded, figures drawing a sample of seeds and saying so), and ten sweeps in one
results folder (reported apart, with at most twice the Python calls of the largest alone; the
README's pandas recipes still read them)."""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scale_fpt.compaction import Generation, part_name
from scale_fpt.config import TrialConfig
from scale_fpt.report.build import build_report
from scale_fpt.report.figures import MAX_SEED_LINES, scaling_figure
from scale_fpt.results import ResultsWriter, load_results
from scale_fpt.results_schema import CURVE_SCHEMA, TRIAL_SCHEMA

REPO = Path(__file__).resolve().parent.parent
SEEDS = 1_000
STEPS = np.arange(100, 2_001, 100)  # 20 evaluations a curve


def write_arms(root, sweep: str = "big", seeds: int = SEEDS, lrs=(1e-3,)) -> None:
    """Pretrained and random gpt2-tiny fpt on Bit XOR at each of ``lrs``, ``seeds`` seeds each,
    their rows compacted as the driver leaves them (the project's schema and generation
    swap): pretrained 3 pp better on average, a spread shared by the seed, validation
    curves rising to each seed's accuracy. Trial ids carry the sweep: each sweep its own."""
    ResultsWriter(root, sweep)  # the sweep's folders and _schema.json
    rng = np.random.default_rng(0)
    arms = pd.MultiIndex.from_product([lrs, ["pretrained", "random"]]).to_frame(index=False)
    seed = np.tile(np.arange(seeds), len(arms))
    lr = np.repeat(arms[0].to_numpy(), seeds)
    init = np.repeat(arms[1].to_numpy(), seeds)
    accuracy = 0.85 + 0.03 * (init == "pretrained") + rng.normal(0, 0.03, seeds)[seed]
    accuracy = np.clip(accuracy + rng.normal(0, 0.01, len(seed)), 0, 1)
    flat = {**TrialConfig().to_flat(), "max_steps": int(STEPS[-1]), "eval_every": 100}
    trials = pd.DataFrame({k: [v] * len(seed) for k, v in flat.items()})
    trials = trials.assign(
        sweep=sweep, seed=seed, lr=lr, init=init, status="completed", stop_reason="budget",
        trial_id=[f"{sweep}-{i}-{r:g}-{s}" for i, r, s in zip(init, lr, seed, strict=True)],
        steps_done=int(STEPS[-1]), selected_step=int(STEPS[-1]), val_accuracy=accuracy,
        test_accuracy=accuracy, best_val_accuracy=accuracy, final_test_accuracy=accuracy,
        best_test_accuracy=accuracy, total_params=400_000, trainable_params=20_000, n_layer=2,
        total_flops=1e12, samples_seen=32_000, wall_time_s=10.0, flops_per_step=5e8,
    )  # fmt: skip
    shape = 1 - np.exp(-3 * STEPS / STEPS[-1])
    values = (0.5 + (accuracy[:, None] - 0.5) * shape).ravel()
    arm = ("sweep", "trial_id", "task", "model", "init", "finetune", "lr", "batch_size", "seed")
    curves = pd.DataFrame({k: np.repeat(trials[k].to_numpy(), len(STEPS)) for k in arm})
    curves = curves.assign(
        step=np.tile(STEPS, len(seed)), val_accuracy=values, test_accuracy=values
    )
    for name, frame, schema in (("trials", trials, TRIAL_SCHEMA), ("curves", curves, CURVE_SCHEMA)):
        for column in schema.names:
            if column not in frame:
                frame[column] = None  # a column the loop writes that this study leaves empty
        generation = Generation(Path(root) / sweep / name)
        generation.write(part_name(), pa.Table.from_pandas(frame, schema, preserve_index=False))
        generation.publish(set())


def test_report_at_a_thousand_seeds_an_arm(tmp_path):
    write_arms(tmp_path)
    report = build_report(tmp_path, tmp_path / "report", attention_maps=False)
    text = report.read_text()
    # the paired difference over 1,000 pairs (n printed), its interval finite and around the
    # 3 pp the rows were drawn with, a Monte Carlo sign-flip p with its SE
    found = re.search(
        r"paired over 1000 shared seeds: accuracy ([+-][\d.]+) pp \\?\[95% CI ([+-][\d.]+), "
        r"([+-][\d.]+)\\?\]",  # Markdown escapes the brackets
        text,
    )
    assert found, text[:2000]
    point, low, high = map(float, found.groups())
    assert low <= 3 <= high and low <= point <= high and high - low < 0.5  # 0.1 pp printed
    assert not re.search(r"\bnan\b|\binf\b", text, re.IGNORECASE)  # no interval left open
    assert "sign-flip p 5e-05 ± 5e-05 (Monte Carlo, 20,000 draws)" in text
    # steps to threshold over 2,000 seeds: the log-rank test's normal approximation
    assert "normal log-rank p" in text
    # a t-test p that underflows at 1,000 pairs reads as below the least float shown, not 0
    assert re.search(r"t-test p \\?< 1e-300", text)  # Markdown escapes the '<'
    assert not re.search(r"\| 0 \(0\) \|", text)
    curves = pd.read_csv(tmp_path / "report" / "figures" / "curves_bit-xor.csv")
    assert set(curves["n"]) == {SEEDS}  # the mean and band are over every seed
    assert f"at most {MAX_SEED_LINES} an arm" in text  # the seeds' own curves: a sample


def python_calls(fn) -> int:
    """The Python function calls ``fn()`` makes (cProfile's count): the report's work,
    counted, as the same code on the same rows makes the same calls whatever else the
    machine runs (time is measured in benchmarks/study_scale.py --sweeps-apart)."""
    profile = cProfile.Profile()
    profile.runcall(fn)
    return pstats.Stats(profile).total_calls


@pytest.mark.slow  # about 25 s of CPU: the largest sweep reported twice, then all ten
def test_ten_sweeps_are_reported_apart_in_at_most_twice_the_largest_alone(tmp_path, monkeypatch):
    """One sweep of 40 arms and nine of 2 (5 seeds an arm, the benchmark's proportions):
    reported apart with at most twice the Python calls of the largest alone (a count, the
    same on any machine under any load; 1.61x when written); the README's and
    docs/usage.md's pandas recipes read the folder as written there."""
    lrs = tuple(1e-4 * (1 + k) for k in range(20))
    results = tmp_path / "results"
    write_arms(results, "scale-local", seeds=5, lrs=lrs)
    for k in range(1, 10):
        write_arms(results, f"sweep{k}", seeds=5, lrs=(1e-2 * k,))
    alone = tmp_path / "alone"
    write_arms(alone, "scale-local", seeds=5, lrs=lrs)
    build_report(tmp_path / "alone", tmp_path / "warm", attention_maps=False)  # first imports
    one = python_calls(lambda: build_report(alone, tmp_path / "one", attention_maps=False))
    ten = python_calls(lambda: build_report(results, tmp_path / "ten", attention_maps=False))
    assert ten <= 2 * one, f"ten sweeps {ten:,} Python calls, the largest alone {one:,}"
    text = (tmp_path / "ten" / "report.md").read_text()
    for k in range(1, 10):
        assert f"sweep{k}" in text  # each sweep's own cells, apart (no --pool)
    assert "Pooled" not in text

    monkeypatch.chdir(tmp_path)
    for page in ("README.md", "docs/usage.md"):
        block = (REPO / page).read_text().split("## Results in pandas", 1)[1]
        code = re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)
        out = io.StringIO()
        scope: dict = {}
        with contextlib.redirect_stdout(out):
            exec(code, scope)  # the recipe as a reader copies it
        if "done" in scope:  # the README's: completed trials by task and init
            assert re.search(r"bit-xor\s+pretrained\s.*\s100\n", out.getvalue()), out.getvalue()
        trials, curves = scope["trials"], scope["curves"]
        assert len(trials) == 200 and trials["trial_id"].is_unique  # each trial once
        assert len(curves) == 200 * len(STEPS)
        assert not curves.duplicated(["trial_id", "step"]).any()
        if "r" in scope:  # docs/usage.md: every sweep, typed
            assert len(scope["r"].trials) == 200 + 9 * 10
            assert scope["r"].trials["sweep"].nunique() == 10
    assert len(load_results(results, "sweep3").trials) == 10


def test_load_reads_only_the_curves_columns_asked_for(tmp_path):
    write_arms(tmp_path, "s", seeds=3)
    full = load_results(tmp_path)
    few = load_results(tmp_path, curve_columns=("val_accuracy",))
    assert list(few.curves.columns) == ["sweep", "trial_id", "step", "val_accuracy"]
    pd.testing.assert_frame_equal(few.curves, full.curves[list(few.curves.columns)])
    pd.testing.assert_frame_equal(few.trials, full.trials)  # trials whole, always
    with pytest.raises(ValueError, match="no curves column val_acc "):
        load_results(tmp_path, curve_columns=("val_acc",))


def test_rows_without_a_recorded_size_are_left_off_the_size_figure(tmp_path):
    """Trial rows whose total_params is empty (an older or foreign writer) still report: the
    size figure leaves their cells out and says how many, where it used to raise."""
    write_arms(tmp_path, seeds=5)
    for part in (tmp_path / "big" / "trials").glob("*.parquet"):
        table_ = pq.read_table(part)
        column = table_.schema.get_field_index("total_params")
        table_ = table_.set_column(column, "total_params", pa.nulls(len(table_), pa.int64()))
        pq.write_table(table_, part)
    trials = load_results(tmp_path).trials
    fig, data = scaling_figure(trials)
    assert data.empty
    assert "2 cell(s) without" in fig.axes[0].get_title()
    assert build_report(tmp_path, tmp_path / "report", attention_maps=False).exists()
