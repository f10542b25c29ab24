"""What a running sweep shows and leaves for trackers, through a real local Ray: progress
lines on the driver (state, rate, ETA, best validation accuracy per arm), each failure in
one line as it happens, and the trackers' runs per member trial read back: TensorBoard's
event files with TensorBoard's own reader, W&B's offline run files record by record, MLflow's
file store with MlflowClient."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import struct
from pathlib import Path

import pandas as pd
import pytest
from helpers import TINY_TRIAL as TINY

from scale_fpt.sweep import SweepConfig
from scale_fpt.sweep.progress import SweepProgress


@pytest.mark.slow
def test_sweep_progress_errors_and_trackers(tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scale_fpt.sweep import run_sweep

    monkeypatch.setenv("SCALE_FPT_PROGRESS_EVERY", "0.2")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: W&B writes its files only
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sweep = SweepConfig(
        name="watched",
        base={**TINY, "max_steps": 40, "eval_every": 20},
        grid={"task": ["bit-xor", "homology"]},  # homology has no data: it fails
        results_dir=str(tmp_path),
        max_concurrent=2,
        max_failures=0,
        pack=1,
        loggers=("tensorboard", "wandb", "mlflow"),
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

    # Runs are named by what varies in the sweep (here the task alone), the id kept beside.
    assert sorted(p.name for p in (tmp_path / "watched" / "tensorboard").iterdir()) == [
        "bit-xor",
        "homology",
    ]
    events = EventAccumulator(str(tmp_path / "watched" / "tensorboard" / "bit-xor"))
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
    assert hparams["trial_id"].string_value == xor
    assert hparams["arm"].string_value == "bit-xor/gpt2-tiny/random/fpt"

    best = trials.loc["bit-xor", "best_val_accuracy"]
    wandb_flushed()
    runs = {run["id"]: run for run in wandb_runs(tmp_path / "watched" / "wandb")}
    assert sorted(runs) == sorted([xor, homology])
    assert runs[homology]["summary"]["status"] == "failed" and runs[homology]["exit_code"] == 1
    run = runs[xor]
    assert (run["name"], run["group"]) == ("bit-xor", "watched")
    assert run["config"]["trial_id"] == xor
    assert run["config"]["task"] == "bit-xor"
    assert run["config"]["lr"] == pytest.approx(1e-3)
    history = [h for h in run["history"] if "val/accuracy" in h]
    assert [h["_step"] for h in history] == [20, 40]
    assert [h["val/accuracy"] for h in history] == pytest.approx(expected["val_accuracy"].tolist())
    assert run["summary"]["status"] == "completed" and run["exit_code"] == 0
    assert run["summary"]["test_accuracy"] == pytest.approx(trials.loc["bit-xor", "test_accuracy"])

    from mlflow import MlflowClient

    client = MlflowClient((tmp_path / "watched" / "mlruns").as_uri())
    ml_runs = client.search_runs([client.get_experiment_by_name("watched").experiment_id])
    ml_runs = {r.data.tags["trial_id"]: r for r in ml_runs}
    assert sorted(ml_runs) == sorted([xor, homology])
    assert ml_runs[homology].info.status == "FAILED"
    ml_run = ml_runs[xor]
    assert ml_run.info.run_name == "bit-xor"
    assert ml_run.info.status == "FINISHED"
    assert ml_run.data.params["task"] == "bit-xor" and ml_run.data.params["max_steps"] == "40"
    val = sorted(
        (m.step, m.value) for m in client.get_metric_history(ml_run.info.run_id, "val/accuracy")
    )
    assert [step for step, _ in val] == [20, 40]
    assert [value for _, value in val] == pytest.approx(expected["val_accuracy"].tolist())
    assert ml_run.data.metrics["best_val_accuracy"] == pytest.approx(best)
    assert ml_run.data.tags["status"] == "completed"


def wandb_flushed() -> None:
    """Stop this process's W&B service, so that every offline run file is complete before
    it is read (once, under load, a run file read right after ``finish`` lacked its run
    record); the driver's own exit does the same."""
    import wandb

    wandb.teardown()


def wandb_records(path: Path):
    """The protobuf records of a W&B run file (``run-<id>.wandb``): after a 7-byte header
    (``:W&B``, magic, version), LevelDB log blocks of 32 KiB, each record cut into chunks
    with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header: padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_runs(root: Path) -> list[dict]:
    """Each offline run under ``root``: id, name, group, config, history rows, final summary,
    exit code."""
    runs = []
    for path in sorted(root.glob("offline-run-*/run-*.wandb")):
        run = {"config": {}, "history": [], "summary": {}, "exit_code": None}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
                run["name"], run["group"] = record.run.display_name, record.run.run_group
                run["project"] = record.run.project
                run["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
            elif kind == "history":
                row = {
                    "/".join(i.nested_key) or i.key: json.loads(i.value_json)
                    for i in record.history.item
                }
                run["history"].append(row)
            elif kind == "summary":
                for u in record.summary.update:
                    run["summary"]["/".join(u.nested_key) or u.key] = json.loads(u.value_json)
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
        runs.append(run)
    return runs


def test_a_failing_logger_is_dropped_with_one_warning_and_the_others_go_on(tmp_path, monkeypatch):
    """A packed cohort's result (two member trials): each member gets its own TensorBoard run;
    an MLflow tracking URI that no store serves fails the MLflow logger once, in one line."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scale_fpt.sweep.tracking import Trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchstore://tracking")
    warnings = []
    trackers = Trackers(
        tmp_path, ("mlflow", "tensorboard"), "cohort", ("lr",), warn=warnings.append
    )
    rows = [{"trial_id": t, "task": "bit-xor", "lr": lr} for t, lr in (("a", 1e-3), ("b", 1e-2))]
    curves = [
        {"trial_id": r["trial_id"], "step": 10, "val_accuracy": v}
        for r, v in zip(rows, (0.5, 0.75), strict=True)
    ]
    trackers.write(
        curves,
        [{**r, "status": "running", "steps_done": 10, "best_val_accuracy": 0.5} for r in rows],
    )
    trackers.write([], [{**rows[0], "status": "completed", "steps_done": 10}])
    assert trackers.open == {"b"}
    trackers.close()
    assert trackers.open == set()
    (warning,) = warnings
    assert warning.startswith(
        "[scale-fpt] warning: the mlflow logger failed and is off for the rest of cohort ("
    )
    assert list(trackers.loggers) == ["tensorboard"]
    for name, value in (("lr=0.001", 0.5), ("lr=0.01", 0.75)):
        events = EventAccumulator(str(tmp_path / "tensorboard" / name))
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("val/accuracy")] == [(10, value)]


@pytest.mark.slow
def test_runs_are_named_by_what_varies_and_grouped_by_sweep(tmp_path, monkeypatch):
    """Two sweeps' member trials fed to the three trackers as the driver feeds them, read back
    with each tool's reader: a run is named by the fields that vary in its sweep
    (``SweepConfig.varying_fields``; the arm's when none does), keeps its trial id, and sits
    in its sweep's group (a W&B group in one project, an MLflow experiment in one store, a
    TensorBoard folder in the sweep's); a name already taken gets the trial id."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    from scale_fpt.config import parse_trial
    from scale_fpt.sweep.tracking import Trackers
    from scale_fpt.trial import trial_id_for

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "studies")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    grid = SweepConfig(
        name="grid",
        base=TINY,
        grid={"task": ["bit-xor"], "init": ["pretrained", "random"], "lr": [1e-3, 1e-2]},
        seeds=(0, 1),
    )
    single = SweepConfig(name="single", base=TINY)
    assert grid.varying_fields() == ("init", "lr", "seed") and single.varying_fields() == ()

    def feed(sweep, flats, trial_ids=None) -> dict[str, str]:
        rows = [parse_trial(flat).to_flat() for flat in flats]
        ids = trial_ids or [trial_id_for(sweep.name, row) for row in rows]
        rows = [{**row, "trial_id": i} for row, i in zip(rows, ids, strict=True)]
        trackers = Trackers(
            tmp_path / sweep.name, ("tensorboard", "wandb", "mlflow"), sweep.name,
            sweep.varying_fields(), warn=pytest.fail,
        )  # fmt: skip
        trackers.write(
            [{"trial_id": i, "step": 10, "val_accuracy": 0.5} for i in ids],
            [{**row, "status": "completed", "steps_done": 10} for row in rows],
        )
        trackers.close()
        return dict(zip(ids, [row["seed"] for row in rows], strict=True))

    trials = grid.trials()
    grid_ids = feed(grid, [trials[0], trials[-1]])
    single_ids = feed(single, single.trials() * 2, ["a" * 12, "b" * 12])
    wandb_flushed()
    names = {
        "grid": ["pretrained lr=0.001 seed=0", "random lr=0.01 seed=1"],
        "single": ["bit-xor gpt2-tiny random fpt", f"bit-xor gpt2-tiny random fpt {'b' * 12}"],
    }

    for sweep, ids in (("grid", grid_ids), ("single", single_ids)):
        folders = sorted((tmp_path / sweep / "tensorboard").iterdir())
        assert [f.name for f in folders] == names[sweep]
        runs = wandb_runs(tmp_path / sweep / "wandb")
        assert sorted(r["name"] for r in runs) == names[sweep]
        assert {(r["group"], r["project"]) for r in runs} == {(sweep, "studies")}
        by_id = {r["id"]: r["name"] for r in runs}
        assert sorted(by_id) == sorted(ids)
        assert all(r["config"]["trial_id"] == r["id"] for r in runs)
        for folder in folders:
            events = EventAccumulator(str(folder))
            events.Reload()
            start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
            hparams = HParamsPluginData.FromString(start).session_start_info.hparams
            assert by_id[hparams["trial_id"].string_value] == folder.name
            assert events.Scalars("val/accuracy")[0].value == 0.5

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    for sweep, ids in (("grid", grid_ids), ("single", single_ids)):
        runs = client.search_runs([client.get_experiment_by_name(sweep).experiment_id])
        assert sorted(r.info.run_name for r in runs) == names[sweep]
        assert sorted(r.data.tags["trial_id"] for r in runs) == sorted(ids)


def test_logger_names_and_missing_packages_stop_the_command_before_ray(
    capsys, monkeypatch, tmp_path
):
    """Exit 2 and nothing written: ``run_sweep`` (which writes the results directory before
    it starts Ray) was never reached."""
    from scale_fpt import cli
    from scale_fpt.sweep import config as sweep_config

    results = tmp_path / "results"
    narrow = ["--tasks", "bit-xor", "--inits", "random", "--seeds", "0", "--steps", "4"]
    narrow += ["--results", str(results)]
    assert cli.main(["sweep", "scale", "--logger", "wandb,tensorbored", *narrow]) == 2
    err = capsys.readouterr().err
    assert (
        "--logger: unknown logger(s) tensorbored; expected a comma list of tensorboard, wandb, mlflow, or none"
        in err
    )
    monkeypatch.setitem(sweep_config.PACKAGES, "wandb", "wandb_is_not_installed")
    assert cli.main(["sweep", "scale", "--logger", "tensorboard,wandb", *narrow]) == 2
    err = capsys.readouterr().err
    assert (
        "--logger wandb: the wandb_is_not_installed package is not installed; pip install wandb"
        in err
    )
    assert not results.exists()


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


@pytest.mark.slow
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


def test_the_start_up_check_resolves_the_optuna_storage_a_search_uses(tmp_path):
    """What ``run_sweep`` hands its searchers: the given storage, else the default in the
    sweep's folder; a grid uses none."""
    from scale_fpt.storage import check_sweep_storage
    from scale_fpt.sweep import SweepConfig

    space = {"lr": ("loguniform", 1e-4, 1e-2)}
    search = SweepConfig(name="s", results_dir=str(tmp_path), search=space)
    assert check_sweep_storage(search) == f"sqlite:///{tmp_path / 's' / 'optuna.db'}"
    given = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    assert check_sweep_storage(dataclasses.replace(search, optuna_storage=given)) == given
    assert check_sweep_storage(dataclasses.replace(search, search={})) == ""


def test_filesystem_type_reads_the_longest_mount_point():
    from scale_fpt.storage import filesystem_type

    assert filesystem_type(Path("/proc/self")) == "proc"
