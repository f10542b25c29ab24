"""The report at study sizes the presets' advice leads to: 1,000 seeds an arm (every
statistic bounded, figures drawing a sample of seeds and saying so)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa

from scale_fpt.config import TrialConfig
from scale_fpt.report.build import build_report
from scale_fpt.report.figures import MAX_SEED_LINES
from scale_fpt.results import ResultsWriter, write_atomic
from scale_fpt.results_schema import CURVE_SCHEMA, TRIAL_SCHEMA

SEEDS = 1_000
STEPS = np.arange(100, 2_001, 100)  # 20 evaluations a curve


def write_arms(root, sweep: str = "big") -> None:
    """Pretrained and random gpt2-tiny fpt on Bit XOR, ``SEEDS`` seeds each, their rows in one
    file per table (the project's schema and atomic writer): pretrained 3 pp better on
    average, a spread shared by the seed, validation curves rising to each seed's accuracy."""
    ResultsWriter(root, sweep)  # the sweep's folders and _schema.json
    rng = np.random.default_rng(0)
    seed = np.tile(np.arange(SEEDS), 2)
    init = np.repeat(["pretrained", "random"], SEEDS)
    accuracy = 0.85 + 0.03 * (init == "pretrained") + rng.normal(0, 0.03, SEEDS)[seed]
    accuracy = np.clip(accuracy + rng.normal(0, 0.01, 2 * SEEDS), 0, 1)
    flat = {**TrialConfig().to_flat(), "max_steps": int(STEPS[-1]), "eval_every": 100}
    trials = pd.DataFrame({k: [v] * 2 * SEEDS for k, v in flat.items()})
    trials = trials.assign(
        sweep=sweep, trial_id=[f"{i}-{s}" for i, s in zip(init, seed, strict=True)], seed=seed,
        init=init, status="completed", stop_reason="budget", steps_done=int(STEPS[-1]),
        selected_step=int(STEPS[-1]), val_accuracy=accuracy, test_accuracy=accuracy,
        best_val_accuracy=accuracy, final_test_accuracy=accuracy, best_test_accuracy=accuracy,
        total_params=400_000, trainable_params=20_000, n_layer=2, total_flops=1e12,
        samples_seen=32_000, wall_time_s=10.0, flops_per_step=5e8,
    )  # fmt: skip
    shape = 1 - np.exp(-3 * STEPS / STEPS[-1])
    values = (0.5 + (accuracy[:, None] - 0.5) * shape).ravel()
    arm = ("sweep", "trial_id", "task", "model", "init", "finetune", "lr", "batch_size", "seed")
    curves = pd.DataFrame({k: np.repeat(trials[k].to_numpy(), len(STEPS)) for k in arm})
    curves = curves.assign(
        step=np.tile(STEPS, 2 * SEEDS), val_accuracy=values, test_accuracy=values
    )
    for frame, schema in ((trials, TRIAL_SCHEMA), (curves, CURVE_SCHEMA)):
        for name in schema.names:
            if name not in frame:
                frame[name] = None  # a column the loop writes that this study leaves empty
    write_atomic(pa.Table.from_pandas(trials, TRIAL_SCHEMA, preserve_index=False),
                 root / sweep / "trials" / "all.parquet")  # fmt: skip
    write_atomic(pa.Table.from_pandas(curves, CURVE_SCHEMA, preserve_index=False),
                 root / sweep / "curves" / "all.parquet")  # fmt: skip


def test_report_at_a_thousand_seeds_an_arm(tmp_path):
    write_arms(tmp_path)
    start = time.perf_counter()
    report = build_report(tmp_path, tmp_path / "report", attention_maps=False)
    seconds = time.perf_counter() - start
    text = report.read_text()
    # the paired difference over 1,000 pairs: a Monte Carlo sign-flip p with its SE
    assert "paired over 1000 shared seeds" in text
    assert "sign-flip p 5e-05 ± 5e-05 (Monte Carlo, 20,000 draws)" in text
    # steps to threshold over 2,000 seeds: the log-rank test's normal approximation
    assert "normal log-rank p" in text
    curves = pd.read_csv(tmp_path / "report" / "figures" / "curves_bit-xor.csv")
    assert set(curves["n"]) == {SEEDS}  # the mean and band are over every seed
    assert f"at most {MAX_SEED_LINES} an arm" in text  # the seeds' own curves: a sample
    assert seconds < 300
