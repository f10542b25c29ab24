"""Results folders that cannot run code and can move (docs/security.md): every
checkpoint file is read with torch's weights-only loader, so a planted pickle is refused
and runs nothing; checkpoint paths are recorded relative to the results directory, so a
moved or copied folder reads its own files and never its original's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import TINY_TRIAL
from test_report import write

from scale_fpt import cli
from scale_fpt.checkpoints import UnsafeCheckpointError, load_checkpoint_file, weights_file
from scale_fpt.config import TrialConfig
from scale_fpt.loop import PROGRESS_FILE
from scale_fpt.models import build_model
from scale_fpt.report.render import escape_md
from scale_fpt.results import (
    ResultsError,
    ResultsWriter,
    checkpoint_dir,
    recorded_checkpoint,
)
from scale_fpt.tasks import build_task

ROOT = Path(__file__).resolve().parent.parent


class Payload:
    """Unpickled with the unsafe loader, this creates ``path``: what a planted pickle in a
    results folder would do (any code could stand there)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant(path: Path, marker: Path, key: str = "module") -> None:
    """A checkpoint file of the expected shape whose content runs ``Payload`` on loading."""
    torch.save({key: Payload(marker), "format": 1}, path)


def test_a_planted_pickle_is_refused_naming_the_file_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    plant(tmp_path / "weights-x.pt", marker)
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint_file(tmp_path / "weights-x.pt")
    assert not marker.exists()
    (line,) = str(e.value).splitlines()
    assert line.startswith(f"refused to load {tmp_path / 'weights-x.pt'}: it holds a pickled")
    assert "io.open" in line and "could run code" in line
    # A damaged file is named as such, not as unsafe (a retry may find a good one).
    (tmp_path / "damaged.pt").write_bytes(b"garbage, not a pickle")
    with pytest.raises(ValueError, match="not a torch checkpoint") as e:
        load_checkpoint_file(tmp_path / "damaged.pt")
    assert not isinstance(e.value, UnsafeCheckpointError)
    # Tensors and plain data, what every checkpoint of this project holds, load.
    saved = {"module": {"w": torch.ones(2)}, "states": [{"step": 3, "stop_reason": None}]}
    torch.save(saved, tmp_path / "plain.pt")
    loaded = load_checkpoint_file(tmp_path / "plain.pt")
    assert torch.equal(loaded["module"]["w"], torch.ones(2)) and loaded["states"] == saved["states"]


def test_checkpoint_paths_are_recorded_relative_to_the_results_directory(tmp_path):
    results = tmp_path / "results"
    inside = results / "_ray" / "s" / "trial_0" / "checkpoint_000001"
    assert recorded_checkpoint(str(inside), results) == "_ray/s/trial_0/checkpoint_000001"
    outside = tmp_path / "shared" / "ray" / "checkpoint_000001"
    assert recorded_checkpoint(str(outside), results) == str(outside)
    assert recorded_checkpoint(None, results) is None
    (tmp_path / "link").symlink_to(results)  # results reached through a symlink
    assert recorded_checkpoint(str(tmp_path / "link" / "_ray" / "c"), results) == "_ray/c"
    assert checkpoint_dir("_ray/c", tmp_path / "moved") == tmp_path / "moved" / "_ray" / "c"
    with pytest.raises(ResultsError, match="outside"):
        checkpoint_dir(str(outside), tmp_path / "moved")  # never read outside the results


def trained_results(results: Path, trial_id: str = "t") -> Path:
    """A results directory with one completed gpt2-tiny bit-xor trial whose checkpoint (the
    default storage's layout, inside the results) holds valid trained weights."""
    flat = {**TrialConfig().to_flat(), **TINY_TRIAL, "max_steps": 4, "eval_every": 4}
    config = TrialConfig.from_flat(flat)
    built = build_model(config, build_task(config.task, config.train.seed).spec)
    trained = {n: p.detach() for n, p in built.module.named_parameters() if p.requires_grad}
    checkpoint = results / "_ray" / "s" / "trial_0" / "checkpoint_000000"
    checkpoint.mkdir(parents=True)
    torch.save({"module": trained}, checkpoint / weights_file(trial_id))
    write(ResultsWriter(results, "s"), trial_id, 0.5, **flat, checkpoint=str(checkpoint))
    return checkpoint


def report_text(results: Path, out: Path, capsys) -> str:
    assert cli.main(["report", str(results), "--out", str(out)]) == 0
    capsys.readouterr()
    return (out / "report.md").read_text()


@pytest.mark.slow
def test_report_refuses_a_planted_weights_file_and_a_copy_reads_its_own(tmp_path, capsys):
    original = tmp_path / "original"
    trained_results(original)
    recorded = pd.read_parquet(original / "s" / "trials")["checkpoint"].tolist()
    assert recorded == ["_ray/s/trial_0/checkpoint_000000"]

    # A copy next to the original, its weights replaced by a planted pickle: the report
    # reads the copy's file (not the original's valid one), refuses it, names the trial.
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    marker = tmp_path / "pwned"
    planted = copy / recorded[0] / weights_file("t")
    plant(planted, marker)
    text = report_text(copy, tmp_path / "copy-report", capsys)
    assert not marker.exists()
    section = text[text.index("## Attention maps") :]
    assert "(trial t)" in section
    refused = escape_md(f"refused to load {planted}: it holds a pickled io.open")
    assert f"Not analysed: {refused}" in section
    assert "Mean share on the relevant inputs" not in section

    # The original, moved elsewhere, still reports from its own checkpoint.
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(original, moved)
    text = report_text(moved, tmp_path / "moved-report", capsys)
    section = text[text.index("## Attention maps") :]
    assert "(trial t)" in section and "Mean share on the relevant inputs" in section


def test_train_resume_from_a_planted_progress_file_is_refused_in_one_line(tmp_path, capsys):
    args = ["train", "--task", "bit-xor", "--model", "gpt2-tiny", "--init", "random"]
    args += ["--test-batches", "2", "--val-batches", "2", "--steps", "4", "--eval-every", "2"]
    args += ["--checkpoint-dir", str(tmp_path / "ck"), "--results", str(tmp_path / "r")]
    assert cli.main(args) == 0
    capsys.readouterr()
    (trial_dir,) = (tmp_path / "ck").iterdir()
    latest = trial_dir / (trial_dir / "latest").read_text().strip()
    # The old progress file loads with the safe loader as it is (plain data and tensors).
    assert load_checkpoint_file(latest / PROGRESS_FILE)["position"] == 4
    marker = tmp_path / "pwned"
    plant(latest / PROGRESS_FILE, marker, key="states")

    assert cli.main(args) == 2
    _, err = capsys.readouterr()
    assert not marker.exists()
    (line,) = err.strip().splitlines()
    assert line == (
        f"scale-fpt: error: refused to load {latest / PROGRESS_FILE}: it holds a pickled "
        "io.open, not only tensors and plain data (unpickling it could run code)"
    )


@pytest.mark.parametrize("planted", ["model_states", "optim_states"])
def test_engine_resume_reads_deepspeed_files_weights_only(tmp_path, planted):
    """A ZeRO-2 engine checkpoint (its optimiser state holds DeepSpeed's loss scaler, stage
    enum and fragment addresses) restores through the weights-only loader; the same
    checkpoint with one of DeepSpeed's files replaced by a planted pickle is refused, in
    one line naming the file, and runs nothing."""
    from scale_fpt.steps.engine import CHECKPOINT_TAG
    from scale_fpt.trial import TrialRun

    flat = {**TrialConfig().to_flat(), **TINY_TRIAL, "max_steps": 2, "eval_every": 2}
    config = TrialConfig.from_flat({**flat, "zero_stage": 2})
    first = TrialRun([config], kind="engine")
    try:
        first.run()
        first.save(str(tmp_path / "ckpt"))
    finally:
        first.close()
    second = TrialRun([config], kind="engine")
    try:
        second.restore(str(tmp_path / "ckpt"))
        assert second.states[0].step == 2
        (target,) = (tmp_path / "ckpt" / CHECKPOINT_TAG).glob(f"*{planted}.pt")
        marker = tmp_path / "pwned"
        plant(target, marker, key="optimizer_state_dict")
        with pytest.raises(UnsafeCheckpointError) as e:
            second.restore(str(tmp_path / "ckpt"))
    finally:
        second.close()
    assert not marker.exists()
    assert str(e.value).startswith(f"refused to load {target}: it holds a pickled io.open")
