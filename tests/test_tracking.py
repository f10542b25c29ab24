"""What a running sweep shows and leaves for trackers, through a real local Ray: progress
lines on the driver (state, rate, ETA, best validation accuracy per arm), each failure in
one line as it happens, and TensorBoard event files per member trial read back with
TensorBoard's own reader."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_TRIAL as TINY

from scale_fpt.sweep import SweepConfig
from scale_fpt.sweep.progress import SweepProgress


def test_sweep_progress_errors_and_tensorboard(tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scale_fpt.sweep import run_sweep

    monkeypatch.setenv("SCALE_FPT_PROGRESS_EVERY", "0.2")
    sweep = SweepConfig(
        name="watched",
        base={**TINY, "max_steps": 40, "eval_every": 20},
        grid={"task": ["bit-xor", "homology"]},  # homology has no data: it fails
        results_dir=str(tmp_path),
        max_concurrent=2,
        max_failures=0,
        pack=1,
    )
    assert run_sweep(sweep).finished
    err = capsys.readouterr().err
    trials = pd.read_parquet(tmp_path / "watched" / "trials").set_index("task")
    curves = pd.read_parquet(tmp_path / "watched" / "curves")
    xor, homology = trials.loc["bit-xor", "trial_id"], trials.loc["homology", "trial_id"]

    status = [line for line in err.splitlines() if line.startswith("[scale-fpt] watched: ")]
    assert status, err
    assert re.match(
        r"\[scale-fpt\] watched: trials 1 done, 0 running, 0 pending, 1 failed; [\d.,]+ "
        r"trial-steps/s.*; best val acc: bit-xor/gpt2-tiny/random/fpt \d\.\d{3}$",
        status[-1],
    ), status[-1]
    (failed,) = [line for line in err.splitlines() if "FAILED" in line]
    assert failed.startswith(f"[scale-fpt] FAILED {homology} (homology/gpt2-tiny/random, seed 0) ")
    assert "DataUnavailable: homology: no --data-dir given" in failed
    (done,) = [line for line in err.splitlines() if line.startswith("[scale-fpt] done ")]
    assert done.startswith(f"[scale-fpt] done {xor} (bit-xor/gpt2-tiny/random/fpt, seed 0")

    events = EventAccumulator(str(tmp_path / "watched" / "tensorboard" / xor))
    events.Reload()
    val = [(e.step, e.value) for e in events.Scalars("val/accuracy")]
    expected = curves[curves["trial_id"] == xor].sort_values("step")
    assert [s for s, _ in val] == expected["step"].tolist() == [20, 40]
    assert [v for _, v in val] == pytest.approx(expected["val_accuracy"].tolist())
    assert events.Scalars("val/best_accuracy")[-1].value == pytest.approx(
        trials.loc["bit-xor", "best_val_accuracy"]
    )
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["task"].string_value == "bit-xor"
    assert hparams["lr"].number_value == pytest.approx(1e-3)
    assert hparams["max_steps"].number_value == 40


def test_plain_progress_lines_and_eta():
    stream = io.StringIO()
    progress = SweepProgress("s", planned_steps=400, stream=stream, every_s=0.0)
    row = {
        "trial_id": "t1", "task": "bit-xor", "model": "gpt2", "init": "random",
        "finetune": "fpt", "seed": 0, "lr": 1e-3, "steps_done": 100,
        "best_val_accuracy": 0.75, "status": "running",
    }  # fmt: skip
    progress.add_rows([row])
    progress.add_rows([{**row, "trial_id": "t2", "status": "diverged", "error": "loss nan\n"}])
    progress.started -= 10  # 200 trial-steps in 10 s
    progress.tick()
    lines = stream.getvalue().splitlines()
    assert lines[0] == (
        "[scale-fpt] DIVERGED t2 (bit-xor/gpt2/random/fpt, seed 0, lr 0.001) at step 100: loss nan"
    )
    assert re.fullmatch(
        r"\[scale-fpt\] s: trials 0 done, 0 running, 0 pending, 0 failed; 20\.\d trial-steps/s, "
        r"ETA 0m(09|10)s; elapsed 0m10s; best val acc: bit-xor/gpt2/random/fpt 0\.750",
        lines[1],
    ), lines[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_block_is_redrawn_in_place_and_lines_stay_above_it():
    stream = Terminal()
    progress = SweepProgress("s", planned_steps=0, stream=stream, every_s=0.0)
    row = {"trial_id": "t1", "task": "bit-xor", "steps_done": 5, "best_val_accuracy": 0.5}
    progress.add_rows([{**row, "status": "running"}])
    progress.tick()
    progress.tick()
    progress.add_rows([{**row, "status": "failed", "error": "ValueError: bad\n  where"}])
    up = "\x1b[1A\x1b[2K"
    block = "[scale-fpt] s: trials 0 done, 0 running, 0 pending, 0 failed; "
    text = stream.getvalue()
    assert text.count(block) == 2 and text.count(up) == 4  # redrawn once, erased before a line
    assert text.endswith(
        f"{up}{up}[scale-fpt] FAILED t1 (bit-xor, seed None) at step 5: ValueError: bad\n"
    )


def test_search_on_a_journal_file_is_read_by_optuna_load_study(tmp_path):
    """``--optuna-storage PATH.journal`` (what a shared file system needs): the study is in
    the journal, and optuna.load_study (what optuna-dashboard PATH.journal does) reads it
    with every trial's value and user attributes."""
    import optuna

    from scale_fpt.storage import open_optuna_storage
    from scale_fpt.sweep import run_sweep

    journal = str(tmp_path / "optuna.journal")
    sweep = SweepConfig(
        name="journal",
        base={**TINY, "max_steps": 20, "eval_every": 20},
        search={"lr": ("loguniform", 1e-4, 1e-2)},
        search_trials=1,
        seeds=(0, 1),
        results_dir=str(tmp_path),
        optuna_storage=journal,
        loggers=("none",),
    )
    assert run_sweep(sweep).finished
    assert not (tmp_path / "journal" / "optuna.db").exists()
    (summary,) = optuna.get_all_study_summaries(open_optuna_storage(journal))
    study = optuna.load_study(study_name=summary.study_name, storage=open_optuna_storage(journal))
    (trial,) = study.trials
    trials = pd.read_parquet(tmp_path / "journal" / "trials")
    assert trial.value == pytest.approx(trials[sweep.metric].mean())
    assert sorted(trial.user_attrs["trial_ids"].values()) == sorted(trials["trial_id"])
    assert not (tmp_path / "journal" / "tensorboard").exists()  # loggers: none


def test_default_optuna_storage_is_a_journal_on_shared_file_systems(tmp_path, monkeypatch):
    from scale_fpt import storage

    assert storage.default_optuna_storage(tmp_path) == f"sqlite:///{tmp_path / 'optuna.db'}"
    monkeypatch.setattr(storage, "filesystem_type", lambda path: "nfs4")
    assert storage.default_optuna_storage(tmp_path) == str(tmp_path / "optuna.journal")


def test_filesystem_type_reads_the_longest_mount_point():
    from scale_fpt.storage import filesystem_type

    assert filesystem_type(Path("/proc/self")) == "proc"
