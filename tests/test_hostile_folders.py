"""Hostile results folders (docs/security.md, "A results folder is untrusted input"): one test
per attack. Each builds the folder in tmp_path from hand-made rows (the project's writer),
opens it the way a user would (the report, train, a fresh sweep), and asserts that no marker
file appears, that nothing outside the folder changes (a decoy home, checksummed) and that
the message is the documented one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import ray.cloudpickle as cloudpickle
import torch
from helpers import TINY_TRIAL, home_env
from test_report import write
from test_safe_results import ROOT, plant, trained_results

from scale_fpt import cli
from scale_fpt.checkpoints import DamagedCheckpointError, UnsafeCheckpointError, weights_file
from scale_fpt.config import ConfigError, TrialConfig
from scale_fpt.confined import ResultsError
from scale_fpt.loop import PROGRESS_FILE
from scale_fpt.models import build_model
from scale_fpt.report.render import escape_md
from scale_fpt.results import ResultsWriter, load_results
from scale_fpt.sweep.lock import driver_lock
from scale_fpt.sweep.tracking import MlflowLogger, TensorBoardLogger, WandbLogger
from scale_fpt.tasks import build_task

COMMAND = "touch /tmp/scale-fpt-pwned"


class Payload:
    """Unpickled, this runs ``os.system``: the obvious payload (torch blocks its module)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content's hash (or its link target); the caches
    the tools make in a home (``~/.cache``, ``~/.config``: hidden folders) left out."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if key.split(os.sep)[0].startswith(".") and key.split(os.sep)[0] != ".bashrc":
            continue
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


def decoy_home(decoy: Path) -> Path:
    """A home holding a .bashrc and a project, for an attack to aim at."""
    (decoy / "project").mkdir(parents=True)
    (decoy / ".bashrc").write_text("alias ll='ls -l'\n")
    (decoy / "project" / "notes.txt").write_text("keep me\n")
    return decoy


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A decoy home (HOME points at it); the test asserts, after the attack, that it is byte
    for byte as before."""
    decoy = decoy_home(tmp_path / "home")
    monkeypatch.setenv("HOME", str(decoy))
    before = snapshot(decoy)
    yield decoy
    assert snapshot(decoy) == before, "the attack changed a file outside the results folder"


def one_row_results(results: Path, sweep: str = "s", **row) -> Path:
    write(ResultsWriter(results, sweep), "t0", 0.9, task="bit-xor", model="gpt2-tiny", **row)
    return results


def report(results: Path, capsys, *flags: str) -> tuple[int, str]:
    code = cli.main(["report", str(results), "--no-attention", *flags])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------ 1. writes through links
def test_a_tracker_folder_linked_out_is_refused_not_written_through(tmp_path, home):
    """A trial's TensorBoard folder (tensorboard/<run name>), the W&B folder or an MLflow
    experiment planted as links to the decoy home: each logger refuses in one line (the
    tracking callback drops it with a warning) and writes nothing there."""
    sweep_dir = tmp_path / "results" / "s"
    (sweep_dir / "tensorboard").mkdir(parents=True)
    (sweep_dir / "tensorboard" / "bit-xor seed=0").symlink_to(home / "project")
    with pytest.raises(ResultsError, match="never writes through a link"):
        TensorBoardLogger(sweep_dir, "s").start("t0", "bit-xor seed=0", {"lr": 0.1}, "arm")
    (sweep_dir / "wandb").symlink_to(home / "project")
    with pytest.raises(ResultsError, match="never writes through a link"):
        WandbLogger(sweep_dir, "s")
    (sweep_dir / "mlruns").mkdir()
    (sweep_dir / "mlruns" / "1").symlink_to(home / "project")
    with pytest.raises(ResultsError, match="never writes through a link"):
        MlflowLogger(sweep_dir, "s")
    assert sorted(p.name for p in (home / "project").iterdir()) == ["notes.txt"]


def test_a_report_file_linked_to_bashrc_is_replaced_not_written_through(tmp_path, home, capsys):
    """report.md a link to ~/.bashrc, a row's git_sha a newline and a command: the report
    replaces the link with its file (the .bashrc is untouched) and the command never starts
    a line of report.md or report.html."""
    results = one_row_results(tmp_path / "results", git_sha=f"abc\n{COMMAND}\n<script>x</script>")
    (results / "report").mkdir()
    (results / "report" / "report.md").symlink_to(home / ".bashrc")
    code, _ = report(results, capsys)
    assert code == 0
    text = (results / "report" / "report.md").read_text()
    assert not (results / "report" / "report.md").is_symlink()
    assert "Frozen Pretrained Transformers" in text
    assert not any(line.startswith(COMMAND) for line in text.splitlines())
    assert f"abc\\\\x0a{COMMAND}" in text  # shown, escaped, on the header's line
    page = (results / "report" / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page


@pytest.mark.parametrize("linked", ["report", "report/figures", "report/tables"])
def test_a_linked_output_folder_is_refused_in_one_line(tmp_path, home, capsys, linked):
    results = one_row_results(tmp_path / "results")
    (results / linked).parent.mkdir(parents=True, exist_ok=True)
    (results / linked).symlink_to(home / "project")
    code, err = report(results, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line == (
        f"scale-fpt: error: {results / linked} is a symbolic link (to {home / 'project'}): "
        "refused, scale_fpt never writes through a link in a results folder; remove the link "
        "(or choose another output folder)"
    )


def test_a_planted_driver_lock_link_is_refused_and_its_target_kept(tmp_path, home):
    sweep_dir = tmp_path / "results" / "s"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "driver.lock").symlink_to(home / ".bashrc")
    with pytest.raises(ConfigError) as e, driver_lock(sweep_dir):
        pass
    assert str(e.value).startswith(f"{sweep_dir / 'driver.lock'} is a symbolic link")


@pytest.mark.parametrize("linked", ["s", "s/trials", "s/curves", "s/trials/t0.parquet"])
def test_parquet_writes_never_leave_the_results_folder(tmp_path, home, linked):
    """A linked sweep, trials or curves folder is refused at start-up; a linked results file
    is replaced by the file, its target untouched."""
    results = tmp_path / "results"
    (results / linked).parent.mkdir(parents=True, exist_ok=True)
    target = home / ("project" if not linked.endswith(".parquet") else ".bashrc")
    (results / linked).symlink_to(target)
    if linked.endswith(".parquet"):
        (results / "s" / "curves").mkdir()
        one_row_results(results)
        assert not (results / linked).is_symlink()
        assert load_results(results).trials["trial_id"].tolist() == ["t0"]
        return
    with pytest.raises(ConfigError, match=f"{results / linked} is a symbolic link"):
        ResultsWriter(results, "s")


# ------------------------------------------------------------------ 2. Tune state


@dataclass
class Interrupted:
    """A sweep started fresh by its driver and interrupted (Ctrl-C) mid-trial."""

    results: Path
    command: list[str]
    env: dict[str, str]
    home: Path
    home_before: dict[str, str]
    planted_state: Path
    marker: Path
    """The file the planted Tune state's payload would create."""
    returncode: int
    output: str


@pytest.fixture(scope="module")
def interrupted_sweep(tmp_path_factory) -> Interrupted:
    """One tiny real sweep (the driver a process of its own, HOME a decoy) started fresh on a
    folder holding a planted Tune experiment state (the greatest name, a cloudpickle blob
    that creates a marker), interrupted (Ctrl-C) once its trial evaluated twice: Tune's saved
    state names a checkpoint from the second report on. Its tests read it in turn: the fresh
    start, then a ``--resume`` over planted checkpoint files."""
    root = tmp_path_factory.mktemp("interrupted")
    home = decoy_home(root / "home")
    results, marker = root / "results", root / "pwned-by-tune-state"
    blob = cloudpickle.dumps(Payload(marker)).hex()
    trial = json.dumps(
        {"trainable_name": "x", "c": {"_type": "CLOUDPICKLE_FALLBACK", "value": blob}}
    )
    experiment = results / "_ray" / "planted"
    experiment.mkdir(parents=True)
    planted_state = experiment / "experiment_state-9999-12-31_23-59-59.json"
    planted_state.write_text(json.dumps({"trial_data": [[trial, "{}"]], "runner_data": {}}))
    flags = ["--results", str(results), "--name", "planted", "--tasks", "bit-xor"]
    flags += ["--inits", "random", "--seeds", "0", "--steps", "400", "--set", "eval_every=20"]
    flags += ["--set", "test_batches=2", "--set", "val_batches=2", "--set", "log_evals=false"]
    command = [sys.executable, str(ROOT / "sweeps" / "scale.py"), *flags]
    env = {**os.environ, **home_env(home), "PYTHONUNBUFFERED": "1"}
    home_before = snapshot(home)
    driver = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    curves = results / "planted" / "curves"

    def evaluations() -> int:
        written = list(curves.glob("[!.]*.parquet"))
        return pq.read_table(written[0]).num_rows if written else 0

    deadline = time.time() + 300
    while evaluations() < 2 and time.time() < deadline:
        time.sleep(0.2)
    driver.send_signal(signal.SIGINT)  # Tune saves its state and returns
    output = driver.communicate(timeout=300)[0].decode()
    return Interrupted(
        results, command, env, home, home_before, planted_state, marker, driver.returncode, output
    )


@pytest.mark.slow
def test_a_fresh_sweep_never_reads_planted_tune_state(interrupted_sweep):
    """The fresh sweep ran its trial (two evaluations, then Ctrl-C as planned) and nothing of
    the planted state ran (only --resume reads Tune's state); the home is as it was."""
    sweep = interrupted_sweep
    assert sweep.returncode == 130, sweep.output[-3000:]
    assert "sweep interrupted: 1 trial(s) unfinished" in sweep.output
    curves = load_results(sweep.results, "planted").curves
    assert sorted(curves["step"])[:2] == [20, 40]
    assert not sweep.marker.exists()
    assert snapshot(sweep.home) == sweep.home_before


@pytest.mark.slow
def test_resumed_sweep_refuses_planted_checkpoint_files_and_records_the_trial_failed(
    interrupted_sweep,
):
    """The interrupted sweep's trial's last Tune checkpoint (``progress.pt`` and the weights
    file) replaced by planted pickles; ``--resume``: nothing runs, the trial ends ``failed``
    (not retried: the file stays refused) with the one-line refusal naming the file.
    ``--resume`` trusts Tune's own state (docs/security.md): the planted one is removed."""
    sweep = interrupted_sweep
    assert sweep.returncode == 130, sweep.output[-3000:]
    sweep.planted_state.unlink()
    marker = sweep.results.parent / "pwned-by-checkpoint"
    checkpoints = sorted((sweep.results / "_ray" / "planted").glob("*/checkpoint_*"))
    for checkpoint in checkpoints:  # whichever the saved state names
        plant(checkpoint / PROGRESS_FILE, marker, key="states")
        (weights,) = checkpoint.glob("weights-*.pt")
        plant(weights, marker)

    resumed = subprocess.run(
        [*sweep.command, "--resume"], env=sweep.env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not marker.exists() and not sweep.marker.exists()
    (row,) = load_results(sweep.results, "planted").trials.to_dict("records")
    assert row["status"] == "failed"
    first_line = row["error"].splitlines()[0]
    refused = [
        f"refused to load {c / PROGRESS_FILE}: it holds a pickled io.open" for c in checkpoints
    ]
    assert any(f"UnsafeCheckpointError: {line}" in first_line for line in refused), first_line
    assert snapshot(sweep.home) == sweep.home_before


# ------------------------------------------------------------------ 3. pointers


TRAIN = ["train", "--task", "bit-xor", "--model", "gpt2-tiny", "--init", "random"]
TRAIN += ["--test-batches", "2", "--val-batches", "2", "--steps", "4", "--eval-every", "2"]


@pytest.fixture(scope="module")
def finished_trial(tmp_path_factory) -> Path:
    """One finished command-line trial with --checkpoint-dir (trained once per module)."""
    root = tmp_path_factory.mktemp("trained")
    args = [*TRAIN, "--checkpoint-dir", str(root / "ck"), "--results", str(root / "r")]
    assert cli.main(args) == 0
    return root


def trained_checkpoint(tmp_path, finished_trial) -> tuple[list[str], Path]:
    """A copy of ``finished_trial`` under ``tmp_path``: (train args resuming it, trial dir)."""
    shutil.copytree(finished_trial / "ck", tmp_path / "ck", symlinks=True)
    args = [*TRAIN, "--checkpoint-dir", str(tmp_path / "ck"), "--results", str(tmp_path / "r")]
    (trial_dir,) = (tmp_path / "ck").iterdir()
    return args, trial_dir


def test_a_latest_pointer_outside_the_checkpoint_dir_is_refused(
    tmp_path, home, capsys, finished_trial
):
    """``latest`` naming a folder outside (a relative escape, an absolute path, a link to
    one): train exits 2 in one line, and the folder it named is neither read nor deleted."""
    args, trial_dir = trained_checkpoint(tmp_path, finished_trial)
    capsys.readouterr()
    for pointer in ("../../../home/project", str(home / "project")):
        (trial_dir / "latest").write_text(pointer)
        assert cli.main(args) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"scale-fpt: error: {trial_dir / 'latest'} names {pointer!r}, not a step-N folder "
            f"of {trial_dir}: refused (remove the pointer to start afresh)"
        )
    shutil.rmtree(trial_dir / "step-4")
    (trial_dir / "step-4").symlink_to(home / "project")
    (trial_dir / "latest").write_text("step-4")
    assert cli.main(args) == 2
    assert "not a step-N folder" in capsys.readouterr().err


# ------------------------------------------------------------------ 4. bad files


@pytest.mark.parametrize(
    "content, message",
    [
        ("payload", "refused to load {path}: it holds a pickled posix.system, not only tensors"),
        ("empty", "cannot read {path}: not a torch checkpoint (damaged or truncated"),
        ("truncated", "cannot read {path}: not a torch checkpoint (damaged or truncated"),
        ("text", "cannot read {path}: not a torch checkpoint (damaged or truncated"),
    ],
)
@pytest.mark.parametrize("name", [PROGRESS_FILE, "weights"])
def test_train_resume_from_a_bad_file_exits_2_in_one_line(
    tmp_path, home, capsys, finished_trial, content, message, name
):
    args, trial_dir = trained_checkpoint(tmp_path, finished_trial)
    capsys.readouterr()
    step = trial_dir / "step-4"
    path = step / (name if name == PROGRESS_FILE else next(step.glob("weights-*.pt")).name)
    marker = tmp_path / "pwned"
    spoil(path, content, marker)
    assert cli.main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("scale-fpt: error: " + message.format(path=path))
    assert not marker.exists()


def spoil(path: Path, content: str, marker: Path) -> None:
    if content == "payload":
        torch.save({"module": Payload(marker)}, path)
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_text("hello, not a checkpoint\n")


def test_blocked_and_damaged_files_are_resultserrors_a_sweep_does_not_retry(tmp_path):
    """The sweep's trainable fails a trial without retry on a ConfigError
    (``sweep/trainable.py``): both kinds of bad checkpoint are one."""
    assert issubclass(UnsafeCheckpointError, ConfigError)
    assert issubclass(DamagedCheckpointError, ConfigError)


@pytest.mark.slow
def test_report_skips_bad_weights_files_naming_each_and_reports_the_rest(tmp_path, home, capsys):
    """One arm per kind of bad weights file (a blocked pickle, empty, truncated, text, a link
    to a file outside) beside a good one: one report, each bad trial named with its file
    under its attention map, the good one analysed, the rest of the report produced."""
    results = tmp_path / "results"
    flat = {**TrialConfig().to_flat(), **TINY_TRIAL, "max_steps": 4, "eval_every": 4}
    config = TrialConfig.from_flat(flat)
    built = build_model(config, build_task(config.task, config.train.seed).spec)
    trained = {n: p.detach() for n, p in built.module.named_parameters() if p.requires_grad}
    writer, paths, marker = ResultsWriter(results, "s"), {}, tmp_path / "pwned"
    kinds = ["good", "payload", "empty", "truncated", "text", "outside"]
    for i, kind in enumerate(kinds):
        checkpoint = results / "_ray" / "s" / f"trial_{i}" / "checkpoint_000000"
        checkpoint.mkdir(parents=True)
        paths[kind] = checkpoint / weights_file(kind)
        torch.save({"module": trained}, paths[kind])
        if kind == "outside":
            paths[kind].unlink()
            paths[kind].symlink_to(home / ".bashrc")
        elif kind != "good":
            spoil(paths[kind], kind, marker)
        lr = 10.0 ** -(i + 1)  # one arm each: the report analyses one trial per arm
        write(writer, kind, 0.5, **{**flat, "lr": lr}, checkpoint=str(checkpoint))
    assert cli.main(["report", str(results)]) == 0
    text = (results / "report" / "report.md").read_text()
    assert "## Trials" in text and not marker.exists()
    sections = {
        kind: next(part for part in text.split("### ") if f"(trial {kind})" in part)
        for kind in kinds
    }
    assert "Mean share on the relevant inputs" in sections["good"]
    damaged = "cannot read {}: not a torch checkpoint (damaged or truncated"
    expected = {
        "payload": f"refused to load {paths['payload']}: it holds a pickled posix.system",
        "empty": damaged.format(paths["empty"]),
        "truncated": damaged.format(paths["truncated"]),
        "text": damaged.format(paths["text"]),
        "outside": f"resolves to {home / '.bashrc'}, outside {results}: refused",
    }
    for kind, message in expected.items():
        assert "Not analysed: " in sections[kind] and escape_md(message) in sections[kind], kind


@pytest.mark.parametrize(
    "plan, problem",
    [
        ("{not json", "not an analysis plan (not JSON: "),
        ("", "not an analysis plan (not JSON: "),
        ("[1, 2]", "not an analysis plan (holds a JSON list, not an object)"),
        (
            '{"thresholds": "high", "seeds": {"selection": ["a"]}}',
            "not an analysis plan (field 'thresholds' must be an object {task: accuracy}; field 'seeds' must map",
        ),
    ],
)
def test_a_malformed_analysis_plan_is_one_line_and_exit_2(tmp_path, home, capsys, plan, problem):
    results = one_row_results(tmp_path / "results")
    (results / "s" / "analysis_plan.json").write_text(plan)
    code, err = report(results, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(f"scale-fpt: error: {results / 's' / 'analysis_plan.json'}: {problem}")


# ------------------------------------------------------------------ 5. duplicates


def test_a_copied_sweep_counts_each_trial_once_and_says_so(tmp_path, home, capsys):
    """``cp -a RESULTS/s RESULTS/other``: its rows claim sweep s, not their folder: not
    used, named; a second sweep that ran the same config and seed: counted once, named."""
    results = tmp_path / "results"
    for seed in (0, 1):
        write(ResultsWriter(results, "s"), f"t{seed}", 0.9, task="bit-xor", seed=seed)
    shutil.copytree(results / "s", results / "other", symlinks=True)
    (results / "linked").symlink_to(results / "s")  # a sweep folder linked in: not read
    write(ResultsWriter(results, "twin"), "u0", 0.9, task="bit-xor", seed=0)
    loaded = load_results(results)
    assert sorted(loaded.trials["trial_id"]) == ["t0", "t1", "u0"]
    assert any("2 row(s) claiming sweep(s) s" in n for n in loaded.notes)
    assert f"{results / 'linked'} is a symbolic link (to {results / 's'}): not read" in "".join(
        loaded.notes
    )
    assert any(
        n.startswith("1 trial(s) of sweep 'twin' (e.g. u0) and of sweep 's' have the same "
                     "configs and seeds") for n in loaded.notes
    )  # fmt: skip
    code, _ = report(results, capsys, "--pool")
    text = (results / "report" / "report.md").read_text()
    assert code == 0 and "## Files and rows not used" in text
    assert "claiming sweep(s) s" in text and "of sweep 'twin'" in text
    # Pooled, seed 0 counts once: the cell holds seeds 0 and 1, n = 2.
    pooled = pd.read_csv(results / "report" / "tables" / "T2.csv")
    assert pooled["n"].tolist() == [2] and pooled["n_trials"].tolist() == [2]


def test_the_same_trial_id_under_two_sweeps_is_counted_once(tmp_path, home):
    """Rows copied and edited to claim their new folder keep their trial id (a hash of the
    original sweep and config): the second copy is left out, named."""
    results = tmp_path / "results"
    write(ResultsWriter(results, "a"), "t0", 0.9, task="bit-xor", seed=0, hit=200)
    write(ResultsWriter(results, "b"), "t0", 0.7, task="bit-xor", seed=3, hit=200)
    loaded = load_results(results)
    assert loaded.trials[["sweep", "trial_id"]].values.tolist() == [["a", "t0"]]
    assert set(loaded.curves["sweep"]) == {"a"}
    (line,) = loaded.notes
    assert line == (
        "1 trial(s) of sweep 'b' (e.g. t0) and of sweep 'a' have the same trial ids: counted "
        "once, in the first"
    )


# ------------------------------------------------------------------ 6. a sweep folder itself


@pytest.mark.slow
def test_a_sweep_folder_reports_the_checkpoints_its_results_folder_does(tmp_path, home, capsys):
    results = tmp_path / "results"
    trained_results(results)
    out = tmp_path / "out"
    assert cli.main(["report", str(results / "s"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    section = text[text.index("## Attention maps") :]
    assert "Mean share on the relevant inputs" in section


def test_names_from_a_results_folder_reach_the_terminal_escaped(tmp_path, home, capsys, caplog):
    """A sweep folder named with an escape sequence and a newline: every warning and the
    report show it as ``\\x1b`` / ``\\x0a``, never as the characters themselves."""
    results = one_row_results(tmp_path / "results")
    shutil.copytree(results / "s", results / "x\x1b[2Jy\nz")
    code, err = report(results, capsys)
    shown = err + "".join(r.getMessage() for r in caplog.records)
    assert code == 0 and "x\\x1b[2Jy\\x0az" in shown and "\x1b" not in shown
    text = (results / "report" / "report.md").read_text()
    assert "\x1b" not in text and "x\\\\x1b\\[2Jy\\\\x0az" in text


def test_a_sweep_with_a_damaged_schema_file_is_skipped_and_named(tmp_path, home, capsys):
    """Beside a good sweep, one whose ``_schema.json`` is garbage and one whose schema file is
    a link to ``/dev/zero`` (read, it would never end): both named, the report produced."""
    results = one_row_results(tmp_path / "results")
    one_row_results(results, "b")
    (results / "b" / "_schema.json").write_text('{"schema_vers')
    (results / "c").mkdir()
    (results / "c" / "_schema.json").symlink_to("/dev/zero")
    code, _ = report(results, capsys)
    text = (results / "report" / "report.md").read_text()
    assert code == 0 and "## Files and rows not used" in text
    for name in ("b", "c"):
        shown = escape_md(f"{results / name / '_schema.json'} is not a readable scale_fpt schema")
        assert shown in text
