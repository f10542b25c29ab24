"""Results on disk (Parquet tables keyed by trial) and the config layer they are built from.

Everything here is pure file I/O and dataclasses: no model is built, no engine started.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import pickle
import select
import shutil
import signal
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scale_fpt import compaction
from scale_fpt import config as cfgmod
from scale_fpt.config import CONCERNS, ConfigError, TrialConfig, flag
from scale_fpt.results import ResultsError, ResultsWriter, load_results
from scale_fpt.results_schema import CURVE_SCHEMA, SCHEMA_VERSION, TRIAL_SCHEMA

SWEEP = "s"

# ------------------------------------------------------------------------------ row builders


def trial_row(trial_id: str, **outcome) -> dict:
    """A complete trials row: the default config plus an outcome (overridable)."""
    return {
        "sweep": SWEEP,
        "trial_id": trial_id,
        **TrialConfig().to_flat(),
        "status": "completed",
        "steps_done": 30,
        "final_test_accuracy": 0.75,
        "best_test_accuracy": 0.8,
        "final_test_loss": 0.5,
        "final_train_loss": 0.4,
        "steps_to_threshold": None,
        "trainable_params": 1000,
        "total_params": 5000,
        "trained_groups": "input+output+ln+pos",
        "group_params": "{}",
        "n_layer": 2,
        "d_model": 128,
        "n_tokens": 10,
        "flops_per_step": 1.5e8,
        "total_flops": 4.5e9,
        "samples_seen": 240,
        "wall_time_s": 1.25,
        "train_time_s": 1.0,
        "device": "cpu",
        "hostname": "host",
        "git_sha": "abc",
        "versions": "{}",
        "error": None,
        "finished_at": "2026-01-01T00:00:00+00:00",
        "schema_version": SCHEMA_VERSION,
        **outcome,
    }


def curve_row(step: int, test_accuracy: float = 0.5, **extra) -> dict:
    return {
        "step": step,
        "train_loss": 0.7,
        "train_accuracy": 0.5,
        "test_loss": 0.69,
        "test_accuracy": test_accuracy,
        "samples_per_s": 100.0,
        "wall_time_s": float(step),
        **{k: v for k, v in TrialConfig().to_flat().items() if k in CURVE_SCHEMA.names},
        **extra,
    }


def read_trials(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / SWEEP / "trials")


def read_curves(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / SWEEP / "curves")


def leftovers(root: Path) -> list[str]:
    """Temporary files anywhere under ``root``."""
    return sorted(str(p) for p in root.rglob("*") if p.name.endswith(".tmp"))


# ------------------------------------------------------------------------- round trip, dtypes


def test_round_trip_with_documented_dtypes_and_sorted_load(tmp_path):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("b", final_test_accuracy=0.25, steps_to_threshold=20))
    writer.write_trial(trial_row("a", status="diverged", steps_done=7, error=None))
    writer.write_curve("b", [curve_row(20, 0.2), curve_row(10, 0.1)])
    writer.write_curve("a", [curve_row(10, 0.3)])

    trials, curves = read_trials(tmp_path), read_curves(tmp_path)
    assert list(trials.columns) == TRIAL_SCHEMA.names
    assert list(curves.columns) == CURVE_SCHEMA.names
    assert len(trials) == 2 and len(curves) == 3
    for column in ("steps_done", "trainable_params", "total_params", "batch_size", "seed"):
        assert trials[column].dtype == "int64", column
    for column in ("final_test_accuracy", "best_test_accuracy", "final_test_loss", "lr"):
        assert trials[column].dtype == "float64", column
    for column in ("sweep", "trial_id", "status", "task", "model", "finetune", "git_sha"):
        assert pd.api.types.is_string_dtype(trials[column]), column
    assert curves["step"].dtype == "int64"
    for column in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "samples_per_s"):
        assert curves[column].dtype == "float64", column
    assert pd.api.types.is_string_dtype(curves["trial_id"])

    # Each trial's curve file is written sorted by step.
    b = pq.read_table(tmp_path / SWEEP / "curves" / "b.parquet").to_pandas()
    assert list(b["step"]) == [10, 20] and list(b["test_accuracy"]) == [0.1, 0.2]

    results = load_results(tmp_path)
    assert list(results.trials["trial_id"]) == ["a", "b"]
    assert list(results.trials["status"]) == ["diverged", "completed"]
    assert results.trials.set_index("trial_id").loc["b", "steps_to_threshold"] == 20
    assert list(zip(results.curves["trial_id"], results.curves["step"], strict=True)) == [
        ("a", 10),
        ("b", 10),
        ("b", 20),
    ]
    assert list(results.curves["test_accuracy"]) == [0.3, 0.1, 0.2]
    # One sweep by name, or the sweep directory itself, load the same.
    assert load_results(tmp_path, sweep=SWEEP).trials.equals(results.trials)
    assert load_results(tmp_path / SWEEP).curves.equals(results.curves)


def test_cohort_size_is_kept_and_reads_as_null_in_files_written_without_it(tmp_path):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a", cohort_size=4))
    writer.write_trial(trial_row("b"))
    older = writer.root / "trials" / "b.parquet"  # as a writer without the column left it
    pq.write_table(pq.read_table(older).drop_columns(["cohort_size"]), older)
    sizes = load_results(tmp_path).trials.set_index("trial_id")["cohort_size"]
    assert sizes["a"] == 4 and pd.isna(sizes["b"])


def test_hidden_temporary_files_are_ignored_by_readers(tmp_path):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a"))
    writer.write_curve("a", [curve_row(10)])
    for table in ("trials", "curves"):
        # What a writer killed mid-write leaves behind: garbage under hidden names.
        (tmp_path / SWEEP / table / ".x.parquet.123.tmp").write_bytes(b"\x00garbage" * 100)
        (tmp_path / SWEEP / table / ".y.parquet").write_bytes(b"not parquet at all")
    assert len(read_trials(tmp_path)) == 1
    assert len(read_curves(tmp_path)) == 1
    results = load_results(tmp_path)
    assert len(results.trials) == 1 and len(results.curves) == 1


def test_empty_sweep_loads_as_empty_tables(tmp_path):
    ResultsWriter(tmp_path, SWEEP)
    results = load_results(tmp_path)
    assert len(results.trials) == 0 and list(results.trials.columns) == TRIAL_SCHEMA.names
    assert len(results.curves) == 0


def test_no_results_at_all_is_a_clear_error(tmp_path):
    with pytest.raises(ResultsError, match="no scale_fpt results"):
        load_results(tmp_path)


# ---------------------------------------------------------------------------- de-duplication


def test_damaged_files_are_skipped_and_named_and_a_damaged_curve_is_rewritten(tmp_path, caplog):
    """A truncated trials file and a garbage curves file: load_results reads the rest and
    logs one warning line per damaged file, naming it; a resumed writer takes the damaged
    curve as empty (one warning) and replaces it with the rows written from then on; a
    damaged trial row reads as no status."""
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a"))
    writer.write_trial(trial_row("b"))
    writer.write_curve("a", [curve_row(10)])
    writer.write_curve("b", [curve_row(10)])
    trials_a = tmp_path / SWEEP / "trials" / "a.parquet"
    trials_a.write_bytes(trials_a.read_bytes()[:100])
    curve_b = tmp_path / SWEEP / "curves" / "b.parquet"
    curve_b.write_bytes(b"not parquet at all")

    caplog.clear()
    results = load_results(tmp_path)
    assert results.trials["trial_id"].tolist() == ["b"]
    assert results.curves["trial_id"].tolist() == ["a"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert all("\n" not in w and "skipping damaged results file" in w for w in warnings)
    assert {w.split(" file ")[1].split(" (")[0] for w in warnings} == {str(trials_a), str(curve_b)}

    caplog.clear()
    resumed = ResultsWriter(tmp_path, SWEEP)
    assert resumed.status("a") is None and resumed.status("b") == "completed"
    resumed.write_curve("b", [curve_row(20)])
    assert pq.read_table(curve_b).column("step").to_pylist() == [20]
    assert sum(str(curve_b) in r.getMessage() for r in caplog.records) == 1


def test_many_trials_files_are_read_in_bounded_scans_naming_each_damaged_file_once(
    tmp_path, caplog, monkeypatch
):
    """Trials' own files are read a scan of ``SCAN_FILES`` files at a time, each scan's rows
    one chunk per column (not one per file); a damaged file fails only its own scan, whose
    other files are read alone, and is named once; compaction reads the same way."""
    monkeypatch.setattr(compaction, "SCAN_FILES", 3)
    writer = ResultsWriter(tmp_path, SWEEP)
    ids = [f"t{i}" for i in range(8)]
    for trial_id in ids:
        writer.write_trial(trial_row(trial_id))
        writer.write_curve(trial_id, [curve_row(10), curve_row(20)])
    bad_trial = tmp_path / SWEEP / "trials" / "t4.parquet"
    bad_trial.write_bytes(bad_trial.read_bytes()[:100])
    bad_curve = tmp_path / SWEEP / "curves" / "t7.parquet"
    bad_curve.write_bytes(b"not parquet at all")

    caplog.clear()
    trials = compaction.read_table(tmp_path / SWEEP / "trials", TRIAL_SCHEMA)
    assert sorted(trials["trial_id"].to_pylist()) == [i for i in ids if i != "t4"]
    # 8 files in scans of 3, 3 and 2 files: a chunk per scan, t4's scan one row short.
    assert sorted(len(c) for c in trials["trial_id"].chunks if len(c)) == [2, 2, 3]
    results = load_results(tmp_path)
    assert results.trials["trial_id"].tolist() == [i for i in ids if i != "t4"]
    assert results.curves.groupby("trial_id").size().to_dict() == {i: 2 for i in ids[:7]}
    named = [r.getMessage() for r in caplog.records]
    assert sum(str(bad_trial) in m for m in named) == 2  # once per read, two reads
    assert sum(str(bad_curve) in m for m in named) == 1
    assert len(named) == 3

    caplog.clear()
    moved = writer.compact()
    assert (moved.trials, moved.curves) == (7, 6)  # t4's and t7's damaged files stay
    left = {t: compaction.listing(tmp_path / SWEEP / t).small for t in ("trials", "curves")}
    assert (sorted(left["trials"]), sorted(left["curves"])) == (["t4"], ["t4", "t7"])
    assert load_results(tmp_path).trials["trial_id"].tolist() == results.trials["trial_id"].tolist()


def test_same_trial_twice_replaces_its_row(tmp_path):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a", status="running", steps_done=10))
    writer.write_trial(trial_row("a", status="completed", steps_done=30))
    trials = read_trials(tmp_path)
    assert len(trials) == 1
    assert trials.loc[0, "status"] == "completed" and trials.loc[0, "steps_done"] == 30


def test_curve_steps_replace_and_a_resumed_writer_merges(tmp_path):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_curve("a", [curve_row(10, 0.1)])
    writer.write_curve("a", [curve_row(10, 0.11), curve_row(20, 0.2)])  # step 10 reported again
    curves = read_curves(tmp_path)
    assert list(curves["step"]) == [10, 20] and list(curves["test_accuracy"]) == [0.11, 0.2]

    # A resumed driver: a new writer on the same directory.
    resumed = ResultsWriter(tmp_path, SWEEP)
    resumed.write_curve("a", [curve_row(20, 0.21), curve_row(30, 0.3)])
    resumed.write_curve("b", [curve_row(10, 0.9)])
    curves = read_curves(tmp_path).sort_values(["trial_id", "step"], ignore_index=True)
    assert list(zip(curves["trial_id"], curves["step"], strict=True)) == [
        ("a", 10),
        ("a", 20),
        ("a", 30),
        ("b", 10),
    ]
    assert list(curves["test_accuracy"]) == [0.11, 0.21, 0.3, 0.9]


TRIAL_IDS = st.sampled_from(["t0", "t1", "t2"])
VALUES = st.floats(allow_nan=False, allow_infinity=False, width=64)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("curve"),
            TRIAL_IDS,
            st.lists(st.tuples(st.integers(0, 5), VALUES), min_size=1, max_size=3),
        ),
        st.tuples(st.just("trial"), TRIAL_IDS, VALUES),
        st.tuples(st.just("restart")),
    ),
    max_size=12,
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_any_history_of_writes_keeps_one_row_per_key_last_wins(operations):
    root = Path(tempfile.mkdtemp(prefix="results-prop-"))
    try:
        writer = ResultsWriter(root, SWEEP)
        trials: dict[str, float] = {}
        curves: dict[tuple[str, int], float] = {}
        for op in operations:
            if op[0] == "restart":  # the driver restarts: a fresh writer, nothing in memory
                writer = ResultsWriter(root, SWEEP)
            elif op[0] == "trial":
                _, trial_id, value = op
                writer.write_trial(trial_row(trial_id, final_test_accuracy=value))
                trials[trial_id] = value
            else:
                _, trial_id, points = op
                writer.write_curve(trial_id, [curve_row(s, v) for s, v in points])
                for step, value in points:
                    curves[trial_id, step] = value

        loaded = load_results(root)
        if trials:  # pandas reads an empty directory as a frame without columns
            assert len(read_trials(root)) == len(trials)
        if curves:
            assert len(read_curves(root)) == len(curves)
        got_trials = loaded.trials
        assert sorted(got_trials["trial_id"]) == sorted(trials)
        assert dict(
            zip(got_trials["trial_id"], got_trials["final_test_accuracy"], strict=True)
        ) == pytest.approx(trials, rel=0, abs=0)
        got_curves = loaded.curves
        keys = list(zip(got_curves["trial_id"], got_curves["step"], strict=True))
        assert len(keys) == len(set(keys))
        assert dict(zip(keys, got_curves["test_accuracy"], strict=True)) == curves
        assert leftovers(root) == []
    finally:
        shutil.rmtree(root)


# -------------------------------------------------------------------------------- atomicity


def partial_then_fail(error: BaseException):
    """A pq.write_table that writes half a file, then fails the way a full disk does."""

    def write_table(table, where, *args, **kwargs):
        where.write(b"PAR1" + b"\x00" * 512)  # the start of a Parquet file, never finished
        raise error

    return write_table


def test_full_disk_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a", steps_done=10))
    writer.write_curve("a", [curve_row(10, 0.1)])
    trial_file = tmp_path / SWEEP / "trials" / "a.parquet"
    curve_file = tmp_path / SWEEP / "curves" / "a.parquet"
    before = trial_file.read_bytes(), curve_file.read_bytes()

    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pq, "write_table", partial_then_fail(enospc))
    with pytest.raises(ResultsError) as info:
        writer.write_trial(trial_row("a", steps_done=20))
    assert "No space left on device" in str(info.value) and str(trial_file) in str(info.value)
    with pytest.raises(ResultsError, match="No space left on device"):
        writer.write_curve("a", [curve_row(20, 0.2)])
    monkeypatch.undo()

    assert (trial_file.read_bytes(), curve_file.read_bytes()) == before
    assert read_trials(tmp_path).loc[0, "steps_done"] == 10
    assert list(read_curves(tmp_path)["step"]) == [10]
    assert leftovers(tmp_path) == []
    # Once there is space again, the rows the failed write held are written too.
    writer.write_curve("a", [curve_row(30, 0.3)])
    assert list(read_curves(tmp_path)["step"]) == [10, 20, 30]


def test_interrupted_write_leaves_no_temporary_and_propagates(tmp_path, monkeypatch):
    writer = ResultsWriter(tmp_path, SWEEP)
    writer.write_trial(trial_row("a", steps_done=10))
    monkeypatch.setattr(pq, "write_table", partial_then_fail(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        writer.write_trial(trial_row("a", steps_done=20))
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    assert read_trials(tmp_path).loc[0, "steps_done"] == 10


def test_results_dir_under_a_regular_file_fails_at_creation(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(ResultsError) as info:
        ResultsWriter(blocker / "results", SWEEP)
    assert str(blocker / "results" / SWEEP) in str(info.value)
    assert "cannot write" in str(info.value)


def without_privileges(fn):
    """Run ``fn()`` where directory permissions are enforced and return what it returns.

    As an ordinary user that is here. As root (whom permissions do not stop) it is a forked
    child that drops to the ``nobody`` user first; the result comes back through a pipe."""
    if os.geteuid() != 0:
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            payload = ("ok", fn())
        except BaseException as e:
            payload = ("raised", repr(e))
        try:
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(payload, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as source:
        if not select.select([source], [], [], 60)[0]:  # a child wedged by the fork itself
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the unprivileged child process did not answer within 60 s")
        data = source.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        pytest.skip(f"could not drop root privileges to test permissions (status {status})")
    kind, value = pickle.loads(data)
    if kind == "raised":
        if "PermissionError" in value or "Operation not permitted" in value:
            pytest.skip(f"could not drop root privileges to test permissions: {value}")
        raise AssertionError(f"child raised {value}")
    return value


def error_of(fn):
    def attempt():
        try:
            fn()
        except ResultsError as e:
            return str(e)
        return None

    return attempt


@pytest.fixture
def world_readable_dir():
    """A directory that an unprivileged user can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="results-ro-"))
    root.chmod(0o755)
    yield root
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(root)


def test_read_only_results_dir_fails_at_creation_naming_the_path(world_readable_dir):
    results = world_readable_dir / "results"
    results.mkdir()
    results.chmod(0o555)
    message = without_privileges(error_of(lambda: ResultsWriter(results, SWEEP)))
    assert message is not None, "ResultsWriter accepted a read-only directory"
    assert str(results / SWEEP) in message and "Permission denied" in message


def test_read_only_existing_sweep_fails_at_creation_not_mid_sweep(world_readable_dir):
    """A resumed sweep whose directory became read-only fails when the writer is created."""
    results = world_readable_dir / "results"
    ResultsWriter(results, SWEEP).write_trial(trial_row("a"))
    for path in [results, *results.rglob("*")]:
        if path.is_dir():
            path.chmod(0o555)
    message = without_privileges(error_of(lambda: ResultsWriter(results, SWEEP)))
    assert message is not None, "ResultsWriter accepted a read-only existing sweep"
    assert str(results / SWEEP) in message


def test_writer_on_an_existing_sweep_leaves_no_probe(tmp_path):
    ResultsWriter(tmp_path, SWEEP).write_trial(trial_row("a"))
    ResultsWriter(tmp_path, SWEEP)
    hidden = [p.name for p in (tmp_path / SWEEP).iterdir() if p.name.startswith(".")]
    assert hidden == []


# --------------------------------------------------------------------------- schema version


def test_other_schema_version_is_refused_by_writer_and_loader(tmp_path):
    sweep = tmp_path / SWEEP
    (sweep / "trials").mkdir(parents=True)
    (sweep / "_schema.json").write_text(json.dumps({"schema_version": 999}))
    for attempt in (lambda: ResultsWriter(tmp_path, SWEEP), lambda: load_results(tmp_path)):
        with pytest.raises(ResultsError) as info:
            attempt()
        message = str(info.value)
        assert "version 999" in message, message
        assert f"version {SCHEMA_VERSION}" in message or f"reads {SCHEMA_VERSION}" in message
        assert str(sweep) in message
    # Nothing was written into the other version's directory.
    assert json.loads((sweep / "_schema.json").read_text()) == {"schema_version": 999}


# ------------------------------------------------------------------------ config: round trip

DEFAULTS = TrialConfig().to_flat()
ALL_FIELDS = {f.name: concern for concern in CONCERNS for f in dataclasses.fields(concern)}
POSITIVE = st.integers(1, 10**6)
TEXT = st.text(max_size=20)
FINETUNE = st.lists(
    st.sampled_from((*cfgmod.GROUPS, *cfgmod.FINETUNE_PRESETS)), min_size=1, max_size=4
).map("+".join)

# Valid values of every field; a field added later falls back to its default.
VALID = {
    "task": st.sampled_from(tuple(cfgmod.TASKS)),
    "data_dir": TEXT,
    "max_length": st.integers(0, 10**5),
    "listops_max_depth": POSITIVE,
    "listops_max_args": POSITIVE,
    "listops_train_size": POSITIVE,
    "augment": st.booleans(),
    "test_batches": POSITIVE,
    "test_limit": st.integers(0, 10**6),
    "test_seed": st.integers(0, 2**62),
    "model": st.one_of(st.sampled_from(["gpt2-tiny", "gpt2", "lstm"]), TEXT.filter(bool)),
    "init": st.sampled_from(cfgmod.INITS),
    "weights": TEXT,
    "dropout": st.floats(0.0, 1.0, exclude_max=True),
    "lstm_width": POSITIVE,
    "lstm_layers": st.integers(1, 12),
    "finetune": FINETUNE,
    "lr": st.floats(1e-12, 1e3),
    "batch_size": POSITIVE,
    "max_steps": POSITIVE,
    "eval_every": POSITIVE,
    "eval_batch_size": POSITIVE,
    "seed": st.integers(0, 2**62),
    "precision": st.sampled_from(cfgmod.PRECISIONS),
    "zero_stage": st.sampled_from(cfgmod.ZERO_STAGES),
    "grad_clip": st.floats(0.0, 100.0),
    "accuracy_threshold": st.floats(0.0, 1.0),
    "device": st.sampled_from(("auto", "cpu", "cuda")),
    "accelerator": st.sampled_from(("auto", "cpu", "cuda")),
}


@st.composite
def valid_flat(draw) -> dict:
    flat = {name: draw(VALID[name]) if name in VALID else DEFAULTS[name] for name in ALL_FIELDS}
    if flat["model"] == "lstm":
        flat["init"] = "random"  # the only init the LSTM baseline has
    return flat


@settings(max_examples=150, deadline=None)
@given(flat=valid_flat())
def test_any_valid_config_round_trips_through_the_flat_dict(flat):
    config = TrialConfig.from_flat(flat)
    assert config.to_flat() == flat
    assert TrialConfig.from_flat(config.to_flat()) == config
    assert config.validate() is config
    # What a command line or a Parquet row gives back (strings, numpy-free) also round-trips.
    as_strings = {k: str(v) for k, v in flat.items() if not isinstance(v, bool | float)}
    assert TrialConfig.from_flat({**flat, **as_strings}) == config


# Invalid values, one generator per field; each gives exactly one problem naming its flag.
INVALID = {
    "task": TEXT.filter(lambda s: s not in cfgmod.TASKS),
    "init": TEXT.filter(lambda s: s not in cfgmod.INITS),
    "precision": TEXT.filter(lambda s: s not in cfgmod.PRECISIONS),
    "zero_stage": st.integers().filter(lambda n: n not in cfgmod.ZERO_STAGES),
    "finetune": st.sampled_from(["bogus", "fpt+bogus", "", "+", "attention"]),
    "lr": st.one_of(st.floats(max_value=0.0), st.sampled_from([math.nan, math.inf, -math.inf])),
    "batch_size": st.integers(max_value=0),
    "max_steps": st.integers(max_value=0),
    "eval_every": st.integers(max_value=0),
    "eval_batch_size": st.integers(max_value=0),
    "test_batches": st.integers(max_value=0),
    "max_length": st.integers(max_value=-1),
    "dropout": st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0)),
    "grad_clip": st.floats(max_value=0.0, exclude_max=True),
    "accuracy_threshold": st.one_of(
        st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0, exclude_min=True)
    ),
    "lstm_width": st.integers(max_value=0),
    # Wrong types: the value cannot even be coerced.
    "seed": st.sampled_from(["abc", "1.5", 2.5, None]),
    "augment": st.sampled_from(["maybe", "2", "on"]),
}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_invalid_fields_are_each_reported_once(data):
    names = data.draw(
        st.lists(
            st.sampled_from(sorted(set(INVALID) & set(ALL_FIELDS))),
            min_size=1,
            max_size=3,
            unique=True,
        ),
        label="bad fields",
    )
    bad = {name: data.draw(INVALID[name], label=name) for name in names}
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_flat({**DEFAULTS, **bad})
    problems = info.value.problems
    assert len(problems) == len(bad), problems
    for name in bad:
        assert sum(flag(name) in p for p in problems) == 1, (name, problems)
    assert all(p in str(info.value) for p in problems)


def test_two_bad_fields_two_problems_with_the_valid_choices():
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_flat({"task": "bit-and", "batch_size": 0})
    problems = info.value.problems
    assert len(problems) == 2
    task_problem = next(p for p in problems if p.startswith("--task"))
    assert all(t in task_problem for t in cfgmod.TASKS)
    assert any(p.startswith("--batch-size") for p in problems)


def test_unknown_keys_are_problems_too():
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_flat({"batch-size": 4, "lr": -1.0})
    assert len(info.value.problems) == 2
    assert any("'batch-size'" in p for p in info.value.problems)
