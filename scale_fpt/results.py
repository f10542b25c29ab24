"""Results on disk: typed Parquet tables of trials and learning curves.

Layout (``pandas.read_parquet`` reads each table directory whole)::

    RESULTS_DIR/<sweep>/_schema.json                   schema version of this sweep's files
    RESULTS_DIR/<sweep>/trials/<trial_id>.parquet      one row: a trial's config and outcome
    RESULTS_DIR/<sweep>/trials/compacted-<token>.parquet   ended trials' rows (compaction)
    RESULTS_DIR/<sweep>/curves/<trial_id>.parquet      one row per evaluation, sorted by step
    RESULTS_DIR/<sweep>/curves/compacted-<token>.parquet   ended trials' curves

Each trial's rows are in exactly one file per table. A trial's own file is replaced whole
and atomically (written to a hidden temporary file, fsynced, then renamed; readers skip names
starting with '.'/'_'), so a retried, restored or resumed trial overwrites its own rows
instead of adding copies, a curve keeps one row per step (the last reported wins), and no
reader ever sees half a file. Ended trials' rows move into compacted files
(``ResultsWriter.compact``) and a compacted trial written again moves back into its own file,
each move a new generation of the directory swapped in at once (``compaction``).

Columns: ``results_schema.TRIAL_SCHEMA`` and ``CURVE_SCHEMA`` (every config field of
``scale_fpt.config`` is a trials column of the same name).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scale_fpt.compaction import (
    PART_TRIALS,
    TABLES,
    Generation,
    finish_swap,
    listing,
    own_rows,
    part_index,
    part_name,
    read_files,
    read_parquet,
    read_table,
)
from scale_fpt.confined import (
    ResultsError,
    inside,
    linked,
    make_folders,
    printable,
    read_text,
    write_file,
    write_text,
)
from scale_fpt.results_checks import note, once_each, sweep_rows
from scale_fpt.results_schema import (
    CURVE_SCHEMA,
    SCHEMA_VERSION,
    SCHEMAS,
    TRIAL_SCHEMA,
    table,
)
from scale_fpt.vocabulary import ENDED

log = logging.getLogger(__name__)


def write_atomic(table_: pa.Table, path: Path) -> None:
    """Write ``path`` so that it is either the old file or the complete new one, never
    through a link (``confined.write_file``)."""
    try:
        write_file(path, lambda f: pq.write_table(table_, f))
    except OSError as e:
        raise ResultsError(
            [
                f"cannot write results file {path}: {e.strerror or e} (the rows written "
                "before are intact; free space or fix the directory, then rerun, with "
                "--resume for a sweep)"
            ]
        ) from None


class ResultsWriter:
    """Writes one sweep's rows; safe to re-create on resume (rows are keyed, not appended).
    Thread-safe: the driver compacts (``compact``) in a thread beside its writes."""

    def __init__(self, results_dir: str | os.PathLike, sweep: str):
        self.root = Path(results_dir).absolute() / sweep
        self.sweep = sweep
        self.curves: dict[str, dict[int, dict]] = {}
        self.prepare()
        self.lock = threading.RLock()
        self.versions: Counter[str] = Counter()
        """Writes per trial id, trials and curves alike: a compaction that read a trial's
        files before a write publishes nothing (its rows would be the old ones)."""
        self.epoch = 0
        """Changes of the compacted files; a compaction that read them before one retries."""
        self.part_steps: dict[str, dict[str, set[int]]] = {}
        """Curve steps by trial of each compacted file read (names are never reused)."""

    @functools.cached_property
    def compacted(self) -> dict[str, dict[str, tuple]]:
        """Per table, compacted trials: trial id -> (compacted file, its status or None); read
        on first use (a driver's: once it holds the sweep's driver lock), which every read or
        change of a trial's rows by this writer makes, after a swap killed between its two
        renames is finished (``compaction.finish_swap``)."""
        for name in TABLES:  # a compaction killed mid-swap left the table renamed aside
            finish_swap(self.root / name)
        return {n: part_index(self.root / n, "status" if n == "trials" else None) for n in TABLES}

    def prepare(self) -> None:
        """Fail at start-up, not mid-sweep, if the directory is unusable. A directory that
        fails here is left as it was: no probe file, no empty folders made by this call."""
        marker = self.root / "_schema.json"
        folders = (
            *reversed(self.root.parents),
            self.root,
            self.root / "trials",
            self.root / "curves",
        )
        made = [p for p in folders if not p.exists()]
        existing = marker.exists()
        if existing:  # another version's folder is refused before anything is made in it
            version = read_schema_version(self.root)
            if version != SCHEMA_VERSION:
                raise ResultsError(
                    [
                        f"--results: {self.root} holds results of schema version {version}, "
                        f"this scale_fpt writes version {SCHEMA_VERSION}; use a new results "
                        "directory (or another --sweep name)"
                    ]
                )
        try:
            make_folders(self.root, "trials", "curves")  # real folders: no link out
            # Probe even an existing sweep (a resumed one may now be read-only or full); the
            # name is per process, so writers starting side by side never remove each other's.
            probe = self.root / f"_write-probe.{os.getpid()}"
            try:
                write_file(probe, lambda f: f.write(b"x" * 4096))
            finally:
                with contextlib.suppress(OSError):
                    probe.unlink()
            if not existing:
                write_text(marker, json.dumps({"schema_version": SCHEMA_VERSION}))
        except (OSError, ResultsError) as e:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()  # only ever empty folders: what this call made
            if isinstance(e, ResultsError):
                raise
            raise ResultsError(
                [f"--results: cannot write to {self.root}: {e.strerror or e}"]
            ) from None

    def write_trial(self, row: dict) -> None:
        checkpoint = recorded_checkpoint(row.get("checkpoint"), self.root.parent)
        rows = table([{**row, "sweep": self.sweep, "checkpoint": checkpoint}], TRIAL_SCHEMA)
        self.write("trials", row["trial_id"], rows)

    def curve(self, trial_id: str) -> dict[int, dict]:
        """A trial's curve rows on disk by step (read once, then kept current). A damaged
        file counts as empty (with one warning): the rows written from now on replace it,
        and ``--resume`` puts back the earlier ones from Ray Tune's log (``recovery``)."""
        if trial_id not in self.curves:
            found = self.read_rows("curves", trial_id)
            self.curves[trial_id] = (
                {r["step"]: r for r in found.to_pylist()} if found is not None else {}
            )
        return self.curves[trial_id]

    def write_curve(self, trial_id: str, rows: list[dict]) -> None:
        """Add evaluation rows to a trial's curve; a step seen before is replaced."""
        with self.lock:  # its compacted file, if any, stays as read until it is replaced
            curve = self.curve(trial_id)
            for row in rows:
                curve[row["step"]] = {**row, "sweep": self.sweep, "trial_id": trial_id}
            ordered = table([curve[s] for s in sorted(curve)], CURVE_SCHEMA)
            self.write("curves", trial_id, ordered)

    def curve_steps(self, trial_id: str) -> set[int]:
        """The steps of a trial's curve on disk, without keeping its rows in memory (what a
        resumed driver checks of every trial): a compacted file's steps are read once."""
        if trial_id in self.curves:
            return set(self.curves[trial_id])
        part = self.compacted["curves"].get(trial_id, (None,))[0]
        if part is None:
            found = self.read_rows("curves", trial_id)
            return set() if found is None else set(found["step"].to_pylist())
        if part not in self.part_steps:
            found = read_parquet(self.root / "curves" / part, SCHEMAS["curves"])
            steps: dict[str, set[int]] = {}
            if found is not None:
                ids, numbers = found["trial_id"].to_pylist(), found["step"].to_pylist()
                for key, step in zip(ids, numbers, strict=True):
                    steps.setdefault(key, set()).add(step)
            self.part_steps[part] = steps
        return self.part_steps[part].get(trial_id, set())

    def forget(self, trial_id: str) -> None:
        """Drop a finished trial's curve from memory (a driver of 10^5 trials keeps none)."""
        self.curves.pop(trial_id, None)

    def status(self, trial_id: str) -> str | None:
        """The status in the trial's row on disk; None without a readable row (a damaged
        file warns once)."""
        if trial_id in self.compacted["trials"]:
            return self.compacted["trials"][trial_id][1]
        found = self.read_rows("trials", trial_id)
        return found.column("status")[0].as_py() if found is not None and found.num_rows else None

    def trial_rows(self) -> pa.Table:
        """This sweep's trial rows on disk by trial id (what its confirmation chooses from)."""
        found = read_table(self.root / "trials", TRIAL_SCHEMA)  # safe beside a compaction
        return found.filter(pc.equal(found["sweep"], self.sweep)).sort_by("trial_id")

    def read_rows(self, name: str, trial_id: str) -> pa.Table | None:
        """A trial's rows of table ``name`` as on disk (None: no file, or a damaged one)."""
        schema = SCHEMAS[name]
        with self.lock:  # a compaction beside it may replace the compacted file
            part = self.compacted[name].get(trial_id)
            if part is None:
                path = self.root / name / f"{trial_id}.parquet"
                return read_parquet(path, schema) if path.exists() else None
            found = read_parquet(self.root / name / part[0], schema)
        return None if found is None else found.filter(pc.equal(found["trial_id"], trial_id))

    def write(self, name: str, trial_id: str, rows: pa.Table) -> None:
        """Replace a trial's rows of table ``name``: its own file, or, for a compacted trial
        (a rerun), a new generation without it in the compacted file and with its own file."""
        with self.lock:
            self.versions[trial_id] += 1
            if trial_id not in self.compacted[name]:
                write_atomic(rows, self.root / name / f"{trial_id}.parquet")
                return
            part = self.compacted[name][trial_id][0]
            found = read_parquet(self.root / name / part, SCHEMAS[name])
            if found is None:
                raise ResultsError(
                    [
                        f"cannot replace the rows of trial {trial_id}: their compacted file "
                        f"{self.root / name / part} is damaged (move it away, then rerun)"
                    ]
                )
            generation = Generation(self.root / name)
            rest = found.filter(pc.not_equal(found["trial_id"], trial_id))
            renamed = part_name()
            if rest.num_rows:
                generation.write(renamed, rest)
            generation.write(f"{trial_id}.parquet", rows)
            generation.publish({part})
            index = self.compacted[name]
            del index[trial_id]
            for key, (held, status) in list(index.items()):
                if held == part:
                    index[key] = (renamed, status)
            self.epoch += 1

    def compact(self, finished: set[str] | None = None) -> Compacted:
        """Move the rows of ended trials (of ``finished`` only, when given) from their own
        files into compacted ones (``compaction``): trials rows whose status has ended,
        with their curves. Safe beside this writer's writes (a trial written meanwhile
        waits for the next call); only one process may compact a sweep (the driver lock)."""
        with self.lock:
            compacted = {name: dict(self.compacted[name]) for name in TABLES}
            small = listing(self.root / "trials").small
            small_curves = listing(self.root / "curves").small
            if finished is not None:
                small = {i: small[i] for i in finished.intersection(small)}
            seen = {i: self.versions[i] for i in {*small, *small_curves}}
            epoch = self.epoch
        trials = own_rows(small, TRIAL_SCHEMA)
        trials = trials.filter(pc.is_in(trials["status"], pa.array([s.value for s in ENDED])))
        moved = set(trials.column("trial_id").to_pylist())
        # Curves follow their trials rows (those compacted before included: a compaction
        # killed between its two tables left their curves in their own files).
        with_curves = (moved | set(compacted["trials"])).intersection(small_curves)
        if not moved and not with_curves:
            return Compacted(0, 0)
        curves = own_rows({i: small_curves[i] for i in with_curves}, CURVE_SCHEMA)
        plans = [
            self.next_generation(name, rows, compacted[name])
            for name, rows in (("trials", trials), ("curves", curves))
            if rows.num_rows
        ]
        with self.lock:
            current = all(self.versions[i] == n for i, n in seen.items())
            if not current or self.epoch != epoch:
                for generation, *_ in plans:
                    generation.discard()
                return Compacted(0, 0)
            for generation, name, remove, index in plans:
                generation.publish(remove)
                kept = {i: v for i, v in self.compacted[name].items() if v[0] not in remove}
                self.compacted[name] = kept | index
            self.epoch += 1
        return Compacted(len(moved), len(curves.column("trial_id").unique()))

    def next_generation(self, name: str, rows: pa.Table, compacted: dict):
        """A table's next generation, built hidden: ``rows`` and the trials of its compacted
        files not yet full, in compacted files of ``PART_TRIALS`` trials. (generation,
        table name, the files it replaces, its compacted trials by id)."""
        open_parts = {
            p for p, n in Counter(v[0] for v in compacted.values()).items() if n < PART_TRIALS
        }
        merged, read = read_files([self.root / name / p for p in sorted(open_parts)], SCHEMAS[name])
        merged = pa.concat_tables([merged, rows]).sort_by("trial_id")
        open_parts = {p.name for p in read}  # a damaged one stays as it is
        ids = merged.column("trial_id").unique().to_pylist()
        status = (
            dict(zip(merged["trial_id"].to_pylist(), merged["status"].to_pylist(), strict=True))
            if name == "trials"
            else {}
        )
        generation = Generation(self.root / name)
        index = {}
        for start in range(0, len(ids), PART_TRIALS):
            chunk = ids[start : start + PART_TRIALS]
            rows_of = merged.filter(pc.is_in(merged["trial_id"], pa.array(chunk)))
            part = part_name()
            generation.write(part, rows_of)
            index.update({i: (part, status.get(i)) for i in chunk})
        moved = set(rows.column("trial_id").to_pylist())
        return generation, name, {f"{i}.parquet" for i in moved} | open_parts, index


@dataclass(frozen=True)
class Compacted:
    """What one compaction moved: trials whose rows, and whose curves, left their own files."""

    trials: int
    curves: int


def recorded_checkpoint(path: str | os.PathLike | None, results_dir: Path) -> str | None:
    """A checkpoint directory as a trials row records it: relative to ``results_dir`` when
    it lies under it (the default storage ``RESULTS/_ray``, a ``--checkpoint-dir`` inside
    the results), so a moved or copied results directory finds its own checkpoints and
    never its original's; otherwise absolute (storage elsewhere: there is only that one)."""
    if path is None or str(path) == "":
        return None
    if not os.path.isabs(path):
        path = os.path.abspath(path)  # a --checkpoint-dir given relative to the cwd
    for base, target in (
        (os.path.abspath(results_dir), path),
        (os.path.realpath(results_dir), os.path.realpath(path)),  # through symlinks
    ):
        if Path(target).is_relative_to(base):
            return Path(target).relative_to(base).as_posix()
    return str(path)


def checkpoint_dir(recorded: str, results_dir: str | os.PathLike) -> Path:
    """Where a trials row's ``checkpoint`` is: a relative one under the results directory
    the rows were read from (``results_root``: a sweep folder given itself reads its
    parent's ``_ray``), resolved with its links; ResultsError (one line) when it resolves
    outside that directory: a results folder's rows never make a reader open files
    elsewhere (``confined.inside``)."""
    return inside(results_root(results_dir), recorded)


def results_root(results_dir: str | os.PathLike) -> Path:
    """The results directory of ``results_dir``: itself, or the parent of a sweep folder
    (one holding ``_schema.json``), which its rows' relative checkpoints are under."""
    root = Path(results_dir)
    return root.parent if (root / "_schema.json").exists() else root


def read_schema_version(sweep_dir: Path):
    """The schema version in ``sweep_dir/_schema.json``; ResultsError if it is unreadable."""
    marker = sweep_dir / "_schema.json"
    try:
        return json.loads(read_text(marker)).get("schema_version")  # no link, bounded
    except (OSError, ValueError, AttributeError) as e:
        raise ResultsError(
            [
                f"{marker} is not a readable scale_fpt schema file ({e}); this is not a "
                "scale_fpt results directory, or it was damaged: use a new results directory"
            ]
        ) from None


@dataclass
class Results:
    """A results directory in pandas: ``trials`` (one row per trial), ``curves`` (one row per
    evaluation). Columns and types: ``TRIAL_SCHEMA`` and ``CURVE_SCHEMA``."""

    trials: object  # pandas.DataFrame
    curves: object  # pandas.DataFrame
    notes: list[str] = field(default_factory=list)
    """What the loader did not use, one line each naming the file or the copies: damaged
    files, rows claiming another sweep than their folder, the same trial twice."""


def sweep_dirs(results_dir: str | os.PathLike) -> list[Path]:
    root = Path(results_dir)
    if (root / "_schema.json").exists():
        return [root]
    return sorted(p.parent for p in root.glob("*/_schema.json"))


CURVE_KEYS = ("sweep", "trial_id", "step")
"""The curves columns every load reads: whose row it is (what ``load_results`` checks)."""


def load_results(
    results_dir: str | os.PathLike,
    sweep: str | None = None,
    curve_columns: tuple[str, ...] | None = None,
) -> Results:
    """Load every sweep under ``results_dir`` (or one ``sweep``, or a sweep directory itself).
    ``curve_columns``: the curves columns to read besides ``CURVE_KEYS`` (None: all; a
    Parquet file's other columns are never read, which at 10^5 trials is most of the
    memory and time: the report reads the few it shows)."""
    curve_schema = CURVE_SCHEMA
    if curve_columns is not None:
        unknown = sorted(set(curve_columns) - set(CURVE_SCHEMA.names))
        if unknown:
            raise ValueError(
                f"curve_columns: no curves column {', '.join(unknown)} (the columns: "
                f"{', '.join(CURVE_SCHEMA.names)})"
            )
        wanted = {*CURVE_KEYS, *curve_columns}
        curve_schema = pa.schema([f for f in CURVE_SCHEMA if f.name in wanted])

    dirs = sweep_dirs(results_dir)
    if sweep is not None:
        dirs = [d for d in dirs if d.name == sweep]
    if not dirs:
        raise ResultsError([f"no scale_fpt results under {results_dir} (no */_schema.json)"])
    trials, curves, notes = [], [], []
    for d in dirs:
        if d != Path(results_dir) and d.is_symlink():  # a sweep folder is one of the folder's
            note(notes, f"{linked(d)}: not read (a sweep folder is a folder of its results)")
            continue
        try:
            version = read_schema_version(d)
            if version != SCHEMA_VERSION:
                raise ResultsError(
                    [
                        f"{printable(str(d))}: schema version {printable(repr(version))}, this "
                        f"scale_fpt reads {SCHEMA_VERSION}"
                    ]
                )
        except ResultsError as e:
            if len(dirs) == 1:
                raise
            note(notes, f"{e}: not read (the other sweeps are)")
            continue
        trials.append(sweep_rows(sweep_table(d / "trials", TRIAL_SCHEMA, notes), d, notes))
        curves.append(sweep_rows(sweep_table(d / "curves", curve_schema, notes), d, notes))
    if not trials:
        raise ResultsError([f"no readable sweep under {printable(str(results_dir))}"])
    trial_df, curve_df = pandas_of(trials), pandas_of(curves)
    trial_df = trial_df.sort_values(["sweep", "trial_id"], ignore_index=True)
    trial_df, curve_df = once_each(trial_df, curve_df, notes)
    curve_df = curve_df.sort_values(["sweep", "trial_id", "step"], ignore_index=True)
    # The Arrow pool keeps what the read and the sorts freed; pandas and numpy allocate
    # elsewhere, so it goes back to the system (a 10^5-trial load: about 200 MB).
    pa.default_memory_pool().release_unused()
    return Results(trials=trial_df, curves=curve_df, notes=notes)


def pandas_of(tables: list[pa.Table]):
    """One DataFrame of ``tables``, emptying the list: each Arrow buffer is freed as its
    column is converted (``self_destruct``), so the rows are never held twice whole."""
    rows = pa.concat_tables(tables)
    tables.clear()
    return rows.to_pandas(self_destruct=True, split_blocks=True)


def sweep_table(path: Path, schema: pa.Schema, notes: list[str]) -> pa.Table:
    """A sweep's table directory (``compaction.read_table``); a linked one is not read, with
    a line in ``notes``."""
    if path.is_symlink():
        note(notes, f"{linked(path)}: not read")
        return schema.empty_table()
    return read_table(path, schema)
