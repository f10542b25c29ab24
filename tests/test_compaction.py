"""Compaction of a sweep's results: every trial exactly once in pandas at every step of it.

A hook after each file operation of the protocol stops it there (as a killed process would:
the protocol has no clean-up handlers, so an exception leaves what a kill leaves); the
folder is then read with pandas, recovered, and compacted again to the end.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scale_fpt import compaction
from scale_fpt.cli import main
from scale_fpt.results import ResultsWriter, load_results
from scale_fpt.sweep.lock import driver_lock
from tests.test_results import SWEEP, curve_row, trial_row

ENDED = {"a": 0.1, "b": 0.2, "c": 0.3}
STEPS = [10, 20, 30]


class Killed(BaseException):
    """The process died here (a BaseException: nothing on the way catches it)."""


def make_sweep(root: Path) -> dict[str, float]:
    """Three ended trials and one running, each with a curve; their test accuracies by id."""
    writer = ResultsWriter(root, SWEEP)
    for trial_id, accuracy in ENDED.items():
        writer.write_trial(trial_row(trial_id, test_accuracy=accuracy))
        writer.write_curve(trial_id, [curve_row(s, accuracy) for s in STEPS])
    writer.write_trial(trial_row("d", status="running", test_accuracy=0.4))
    writer.write_curve("d", [curve_row(10, 0.4)])
    return {**ENDED, "d": 0.4}


def assert_each_trial_once(root: Path, accuracies: dict[str, float]) -> None:
    """What pandas reads of the trials and curves directories: each trial once, its rows."""
    trials = pd.read_parquet(root / SWEEP / "trials")
    assert sorted(trials["trial_id"]) == sorted(accuracies)
    assert dict(zip(trials["trial_id"], trials["test_accuracy"], strict=True)) == accuracies
    curves = pd.read_parquet(root / SWEEP / "curves")
    assert not curves.duplicated(["trial_id", "step"]).any()
    steps = curves.groupby("trial_id")["step"].apply(sorted).to_dict()
    assert steps == {t: STEPS if t in ENDED else [10] for t in accuracies}
    by_trial = curves.groupby("trial_id")["test_accuracy"].first().to_dict()
    assert by_trial == accuracies


def table_files(root: Path, table: str) -> list[str]:
    return sorted(p.name for p in (root / SWEEP / table).iterdir())


def recover_and_compact(root: Path, accuracies: dict[str, float]) -> None:
    """What the next run does after a killed compaction: recover, then compact to the end."""
    compaction.recover(root / SWEEP)
    hidden = (compaction.NEXT_MARK, compaction.PREV_MARK)
    assert not [p for p in (root / SWEEP).iterdir() if any(m in p.name for m in hidden)]
    ResultsWriter(root, SWEEP).compact()
    assert_each_trial_once(root, accuracies)
    for table in ("trials", "curves"):
        part, running = table_files(root, table)
        assert part.startswith(compaction.PART_PREFIX) and running == "d.parquet"


def kill_at(monkeypatch, k: int | None) -> list[str]:
    """Stop the protocol after its k-th file operation (None: count them, stop nowhere)."""
    done = []

    def hook(operation):
        done.append(operation)
        if k is not None and len(done) == k:
            raise Killed(operation)

    monkeypatch.setattr(compaction, "after_file_operation", hook)
    return done


def test_compaction_leaves_few_files_and_the_same_rows(tmp_path):
    accuracies = make_sweep(tmp_path)
    done = ResultsWriter(tmp_path, SWEEP).compact()
    assert (done.trials, done.curves) == (3, 3)
    assert_each_trial_once(tmp_path, accuracies)
    for table in ("trials", "curves"):
        files = table_files(tmp_path, table)
        assert len(files) == 2 and "d.parquet" in files, files  # one compacted, d running
        assert files[0].startswith(compaction.PART_PREFIX)
    assert not [p for p in (tmp_path / SWEEP).iterdir() if ".next-" in p.name]
    results = load_results(tmp_path)
    assert sorted(results.trials["trial_id"]) == sorted(accuracies)
    assert len(results.curves) == 3 * len(STEPS) + 1
    # Nothing left to compact: a second call changes nothing.
    assert ResultsWriter(tmp_path, SWEEP).compact().trials == 0


def compaction_operations(template: Path, tmp_path: Path, monkeypatch) -> list[str]:
    """The file operations of a whole compaction of a copy of ``template``."""
    operations = kill_at(monkeypatch, None)
    shutil.copytree(template, tmp_path / "counted")
    ResultsWriter(tmp_path / "counted", SWEEP).compact()
    return list(operations)


def killed_after_each(template: Path, operations: list[str], tmp_path: Path, monkeypatch):
    """(the operation, the folder) of a compaction of a copy of ``template`` killed after
    each of its ``operations`` in turn."""
    for k, operation in enumerate(operations, start=1):
        root = tmp_path / f"killed-{k}"
        shutil.copytree(template, root)
        kill_at(monkeypatch, k)
        with pytest.raises(Killed):
            ResultsWriter(root, SWEEP).compact()
        kill_at(monkeypatch, None)
        yield operation, root


def test_killed_after_every_file_operation_each_trial_stays_once(tmp_path, monkeypatch):
    template = tmp_path / "template"
    accuracies = make_sweep(template)
    operations = compaction_operations(template, tmp_path, monkeypatch)
    assert operations.count("exchange") == 2 and len(operations) > 8, operations
    for _, root in killed_after_each(template, operations, tmp_path, monkeypatch):
        assert_each_trial_once(root, accuracies)
        recover_and_compact(root, accuracies)


def test_rerun_of_a_compacted_trial_replaces_its_rows_at_every_step(tmp_path, monkeypatch):
    template = tmp_path / "template"
    accuracies = make_sweep(template)
    ResultsWriter(template, SWEEP).compact()
    rerun = {**accuracies, "a": 0.9}

    def rewrite(root):
        writer = ResultsWriter(root, SWEEP)
        writer.write_trial(trial_row("a", test_accuracy=0.9))

    operations = kill_at(monkeypatch, None)
    shutil.copytree(template, tmp_path / "counted")
    rewrite(tmp_path / "counted")
    trials = pd.read_parquet(tmp_path / "counted" / SWEEP / "trials")
    assert dict(zip(trials["trial_id"], trials["test_accuracy"], strict=True)) == rerun
    assert operations.count("exchange") == 1, operations
    for k in range(1, len(operations) + 1):
        root = tmp_path / f"killed-{k}"
        shutil.copytree(template, root)
        kill_at(monkeypatch, k)
        with pytest.raises(Killed):
            rewrite(root)
        trials = pd.read_parquet(root / SWEEP / "trials")
        assert sorted(trials["trial_id"]) == sorted(accuracies)  # a once: old row or new
        assert trials.set_index("trial_id")["test_accuracy"]["a"] in (0.1, 0.9)
        kill_at(monkeypatch, None)
        compaction.recover(root / SWEEP)
        rewrite(root)
        trials = pd.read_parquet(root / SWEEP / "trials")
        assert dict(zip(trials["trial_id"], trials["test_accuracy"], strict=True)) == rerun


def test_resumed_writer_reads_and_extends_compacted_rows(tmp_path):
    accuracies = make_sweep(tmp_path)
    ResultsWriter(tmp_path, SWEEP).compact()
    writer = ResultsWriter(tmp_path, SWEEP)  # as a resumed driver makes it
    assert writer.status("a") == "completed" and writer.status("d") == "running"
    assert sorted(writer.curve("b")) == STEPS
    writer.write_curve("b", [curve_row(40, 0.2)])
    curves = pd.read_parquet(tmp_path / SWEEP / "curves")
    assert not curves.duplicated(["trial_id", "step"]).any()
    assert sorted(curves[curves["trial_id"] == "b"]["step"]) == [*STEPS, 40]
    assert sorted(curves["trial_id"].unique()) == sorted(accuracies)
    # b's curve is its own file again; a later compaction takes it back.
    assert "b.parquet" in table_files(tmp_path, "curves")
    writer.compact()
    assert "b.parquet" not in table_files(tmp_path, "curves")


def test_a_trial_written_while_compacting_waits_for_the_next_compaction(tmp_path, monkeypatch):
    accuracies = make_sweep(tmp_path)
    writer = ResultsWriter(tmp_path, SWEEP)

    def hook(operation):  # the driver writes a's new row while the compactor reads
        if operation == "mkdir" and not writes:
            writes.append(operation)
            writer.write_trial(trial_row("a", test_accuracy=0.7))
            writer.write_curve("a", [curve_row(s, 0.7) for s in STEPS])

    writes: list[str] = []
    monkeypatch.setattr(compaction, "after_file_operation", hook)
    assert writer.compact().trials == 0
    assert_each_trial_once(tmp_path, {**accuracies, "a": 0.7})
    assert writer.compact().trials == 3
    assert_each_trial_once(tmp_path, {**accuracies, "a": 0.7})


def assert_each_trial_once_loaded(root: Path, accuracies: dict[str, float]) -> None:
    results = load_results(root)
    trials = results.trials
    assert dict(zip(trials["trial_id"], trials["test_accuracy"], strict=True)) == accuracies
    assert not results.curves.duplicated(["trial_id", "step"]).any()
    assert len(results.curves) == len(ENDED) * len(STEPS) + 1


def test_without_atomic_exchange_two_renames_compact_and_no_reader_sees_a_trial_twice(
    tmp_path, monkeypatch
):
    """NFS/EFS (or not Linux): no RENAME_EXCHANGE. The swap is two renames; killed after
    each file operation, pandas reads every trial once, or (between the two renames: the
    table directory renamed aside) FileNotFoundError, never a wrong table; load_results
    always reads every trial once; the next writer or recover finishes the swap."""
    monkeypatch.setattr(compaction, "RENAMEAT2", None)
    template = tmp_path / "template"
    accuracies = make_sweep(template)
    operations = compaction_operations(template, tmp_path, monkeypatch)
    assert operations.count("rename aside") == operations.count("rename in") == 2, operations
    assert "exchange" not in operations
    assert_each_trial_once(tmp_path / "counted", accuracies)
    for table in ("trials", "curves"):
        assert len(table_files(tmp_path / "counted", table)) == 2  # compacted, d running
    aside = 0
    for operation, root in killed_after_each(template, operations, tmp_path, monkeypatch):
        if operation == "rename aside":  # a table directory is aside until the next run
            with pytest.raises(FileNotFoundError):
                assert_each_trial_once(root, accuracies)
            aside += 1
            if aside % 2:  # the next run a resumed driver (its writer); else `results compact`
                assert ResultsWriter(root, SWEEP).status("a") == "completed"  # its first look
                assert_each_trial_once(root, accuracies)
            else:  # an empty table directory made in its place hides nothing from the loader
                for table in ("trials", "curves"):
                    (root / SWEEP / table).mkdir(exist_ok=True)
        else:
            assert_each_trial_once(root, accuracies)
        assert_each_trial_once_loaded(root, accuracies)
        recover_and_compact(root, accuracies)
    assert aside == 2


def test_symlinks_and_damaged_files_are_never_compacted_or_followed(tmp_path, caplog):
    accuracies = make_sweep(tmp_path)
    outside = tmp_path / "outside.parquet"
    shutil.copy(tmp_path / SWEEP / "trials" / "a.parquet", outside)
    (tmp_path / SWEEP / "trials" / "e.parquet").symlink_to(outside)
    (tmp_path / SWEEP / "trials" / "f.parquet").write_bytes(b"not parquet")
    with caplog.at_level(logging.WARNING):
        done = ResultsWriter(tmp_path, SWEEP).compact()
    assert done.trials == 3
    assert "skipping damaged results file" in caplog.text and "f.parquet" in caplog.text
    files = table_files(tmp_path, "trials")
    assert "f.parquet" in files and "e.parquet" not in files  # the link is not carried
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        results = load_results(tmp_path)
    assert sorted(results.trials["trial_id"]) == sorted(accuracies)
    assert caplog.text.count("skipping damaged results file") == 1


def test_results_compact_command(tmp_path, capsys):
    accuracies = make_sweep(tmp_path)
    ResultsWriter(tmp_path, "other")  # an empty second sweep
    (tmp_path / SWEEP / ".trials.next-0123").mkdir()  # what a killed compaction left
    assert main(["results", "compact", str(tmp_path), "--sweep", "nope"]) == 2
    assert "no such sweep" in capsys.readouterr().err
    with driver_lock(tmp_path / SWEEP):  # a driver runs the sweep: refused, nothing moved
        assert main(["results", "compact", str(tmp_path), "--sweep", SWEEP]) == 2
    assert "another driver is running" in capsys.readouterr().err
    assert "a.parquet" in table_files(tmp_path, "trials")
    assert main(["results", "compact", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "other: 0 trials and 0 curves compacted; trials/ holds 0 files, curves/ 0",
        f"{SWEEP}: 3 trials and 3 curves compacted; trials/ holds 2 files, curves/ 2",
    ]
    assert not (tmp_path / SWEEP / ".trials.next-0123").exists()
    assert_each_trial_once(tmp_path, accuracies)


def test_the_driver_compacts_in_the_background_as_trials_end_and_at_the_end(tmp_path, monkeypatch):
    from scale_fpt.sweep import callbacks

    accuracies = make_sweep(tmp_path)
    monkeypatch.setattr(callbacks, "COMPACT_EVERY_TRIALS", 2)
    writer = ResultsWriter(tmp_path, SWEEP)
    compactor = callbacks.Compactor(writer)
    writer.curve("a")  # the driver's cache of a running trial's curve
    compactor.ended(["a"])  # one ended: not due yet
    assert compactor.thread is None and "a" not in writer.curves
    compactor.ended(["b"])
    compactor.thread.join()
    assert {n for n in table_files(tmp_path, "trials") if not n.startswith("compacted-")} == {
        "c.parquet",
        "d.parquet",
    }
    assert_each_trial_once(tmp_path, accuracies)
    compactor.finish()  # every ended trial: c too, not the running d
    for table in ("trials", "curves"):
        assert [n for n in table_files(tmp_path, table) if n.endswith(".parquet")][
            -1
        ] == "d.parquet"
        assert len(table_files(tmp_path, table)) == 2
    assert_each_trial_once(tmp_path, accuracies)


def test_a_reader_that_listed_before_a_swap_reads_again(tmp_path, monkeypatch):
    accuracies = make_sweep(tmp_path)
    tables = {t: compaction.listing(tmp_path / SWEEP / t) for t in ("trials", "curves")}
    ResultsWriter(tmp_path, SWEEP).compact()
    stale = dict(tables)
    fresh = compaction.listing

    def listed(table_dir):  # the first listing of each table is from before the swap
        return stale.pop(table_dir.name, None) or fresh(table_dir)

    monkeypatch.setattr(compaction, "listing", listed)
    results = load_results(tmp_path)
    assert not stale  # each table was listed stale once, then again
    assert sorted(results.trials["trial_id"]) == sorted(accuracies)
    assert not results.curves.duplicated(["trial_id", "step"]).any()
    assert len(results.curves) == 3 * len(STEPS) + 1
