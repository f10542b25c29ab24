"""The layout of one results table directory (``<sweep>/trials``, ``<sweep>/curves``) and
how its files change without a reader ever seeing a trial twice or not at all.

A table directory holds two kinds of Parquet files, each trial's rows in exactly one:

- ``<trial_id>.parquet``: one trial's rows, written by the driver as they arrive and
  replaced whole (``results.write_atomic``: a hidden temporary file renamed over it);
- ``compacted-<token>.parquet``: the rows of up to ``PART_TRIALS`` finished trials.

Moving rows between files (compacting finished trials, or giving a compacted trial new rows
on a rerun) removes some files and adds others, which no single POSIX rename can do. Such a
change is made as a new *generation* of the whole directory (``Generation``):

1. ``mkdir <sweep>/.<table>.next-<token>``: hidden, so readers skip it (pyarrow's dataset
   discovery, hence ``pandas.read_parquet``, ignores names starting with '.' or '_');
2. write the new files into it, each fsynced;
3. hard-link into it every file of the live directory that stays (a second name of the same
   file; a copy where the file system has no hard links): nothing visible changes;
4. fsync it, then swap it with the live directory in one ``renameat2(RENAME_EXCHANGE)``;
5. remove the hidden directory, which now holds the previous generation.

Before step 4 every reader sees the old generation, after it the new one, each with every
trial once. A process killed at any step leaves at most a hidden ``.<table>.next-*``
directory; ``recover`` removes it (the driver and ``scale-fpt results compact`` call it
before compacting, holding the sweep's driver lock, so no live generation is removed). A
reader that lists the directory just before a swap and opens a file just after can get
FileNotFoundError, never a duplicate: it reads again.

``RENAME_EXCHANGE`` is Linux's (ext4, xfs, btrfs, tmpfs; not NFS/EFS, not other systems),
and a shared file system is where file opens cost most (each one a round trip). Where it is
refused, step 4 is two renames (``Generation.replace``): the live directory aside to
``.<table>.prev-<token>``, then the next generation into its place. Between them the table
directory is absent, so a reader gets FileNotFoundError (pandas too), never a trial twice
or missing: ``read_table`` then reads the complete generation waiting to be renamed in, and
``recover`` renames in a generation whose swap was killed between the two.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

PART_PREFIX = "compacted-"
PART_TRIALS = 2048
"""Trials per compacted file: a rerun trial's rows are taken out of one such file by
rewriting it, so its size bounds that cost; 10^5 trials make about 50 files per table."""

NEXT_MARK = ".next-"
PREV_MARK = ".prev-"
TABLES = ("trials", "curves")


def after_file_operation(operation: str) -> None:
    """Called after each file operation of a generation: a point where a process can die.
    The tests replace it to stop the protocol there and read the directory."""


class ExchangeUnsupported(OSError):
    """The file system (or the operating system) cannot swap two directories atomically."""


_REFUSED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _renameat2():
    with contextlib.suppress(OSError, AttributeError):
        call = ctypes.CDLL(None, use_errno=True).renameat2
        call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        call.argtypes += [ctypes.c_uint]
        return call
    return None


RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> None:
    """Swap the directories ``a`` and ``b`` in one step; ExchangeUnsupported where the
    system or file system cannot."""
    if RENAMEAT2 is None:
        raise ExchangeUnsupported(errno.ENOSYS, "renameat2 is not available here")
    if RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        if code in _REFUSED:
            raise ExchangeUnsupported(code, os.strerror(code))
        raise OSError(code, os.strerror(code), str(b))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Listing:
    """A table directory's files: small ones by trial id, compacted ones by name (regular
    files only: a symlink, a folder or a hidden name is never read)."""

    small: dict[str, Path]
    parts: dict[str, Path]


def listing(table_dir: Path) -> Listing:
    """The files of ``table_dir`` (none if it does not exist); FileNotFoundError if it is
    renamed away while listed (a swap by two renames)."""
    source = table_source(table_dir)
    if source is None:
        return Listing({}, {})
    small, parts = {}, {}
    with os.scandir(source) as entries:
        for entry in entries:
            name = entry.name
            if name[:1] in "._" or not name.endswith(".parquet"):
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            if name.startswith(PART_PREFIX):
                parts[name] = Path(entry.path)
            else:
                small[name.removesuffix(".parquet")] = Path(entry.path)
    return Listing(small, parts)


def table_source(table_dir: Path) -> Path | None:
    """The directory holding a table's live generation: ``table_dir`` itself or, while a swap
    by two renames has put it aside (or was killed between them; an empty directory made in
    its place since counts as none), the complete next generation waiting to take its place;
    None where the table has no directory. A swap finishing while this looks raises
    FileNotFoundError: read again."""
    exists = os.path.lexists(table_dir)
    if exists and not is_empty_dir(table_dir):
        return table_dir
    hidden, tokens = f".{table_dir.name}{PREV_MARK}", []
    with (
        contextlib.suppress(FileNotFoundError, NotADirectoryError),
        os.scandir(table_dir.parent) as entries,
    ):
        tokens = [e.name.removeprefix(hidden) for e in entries if e.name.startswith(hidden)]
    for token in tokens:
        waiting = table_dir.parent / f".{table_dir.name}{NEXT_MARK}{token}"
        if waiting.is_dir() and not waiting.is_symlink():
            return waiting
    if not exists:
        if tokens:
            raise FileNotFoundError(errno.ENOENT, "renamed in while looked at", str(table_dir))
        return None
    return table_dir


def is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except (FileNotFoundError, NotADirectoryError):
        return False


def warn_damaged(path: Path, error: Exception) -> None:
    detail = str(error).split(f"'{path}': ")[-1]  # pyarrow repeats the path first
    cause = " ".join(f"{type(error).__name__}: {detail}".split())[:160]
    log.warning(
        f"scale-fpt: warning: skipping damaged results file {path} ({cause}); "
        "--resume of its sweep re-derives its rows from Ray Tune's log"
    )


def read_parquet(path: Path, schema: pa.Schema) -> pa.Table | None:
    """The table in ``path``; None, with one warning line naming the file, when it is not a
    readable Parquet file of ``schema`` (truncated, garbage, another table's file)."""
    try:
        return pq.read_table(path, schema=schema)
    except (pa.ArrowException, OSError) as e:
        warn_damaged(path, e)
        return None


SCAN_FILES = 256
"""Files per pyarrow dataset scan of trials' own files. A scan keeps each file's parsed
metadata until it ends (about 0.4 MB a trials file: one scan of 2,500 took 1 GB), and its
table holds one chunk per file and column (10^6 small arrays at 10^4 trials of 93 columns).
Scans of this many files, each concatenated into one chunk per column, bound both."""


def scans(paths: list) -> list[list]:
    return [paths[i : i + SCAN_FILES] for i in range(0, len(paths), SCAN_FILES)]


def read_files(
    paths: list[Path], schema: pa.Schema, combine: bool = False, keep=None
) -> tuple[pa.Table, list[Path]]:
    """(the rows of ``paths`` in ``schema``, the files they came from), a scan per
    ``SCAN_FILES`` files (``by_file``), of the files whose rows ``keep(path, rows)`` accepts
    (every file without it). ``combine``: each scan's rows in one chunk per column (trials'
    own files: a chunk per file otherwise; compacted files' chunks are large already, and
    combining them would copy them)."""
    tables, read = [], []
    for scan in scans(paths):
        found = [(p, t) for p, t in by_file(scan, schema) if keep is None or keep(p, t)]
        if found:
            rows = pa.concat_tables([t for _, t in found])
            tables.append(rows.combine_chunks() if combine else rows)
            read += [p for p, _ in found]
    return (pa.concat_tables(tables) if tables else schema.empty_table()), read


def own_rows(files: dict[str, Path], schema: pa.Schema) -> pa.Table:
    """The rows of trials' own files (trial id -> file) whose rows are all their own
    trial's (``own_file``): compacting removes exactly the files whose rows it took (a file
    holding another trial's rows, put there by hand, stays; damaged ones too)."""
    paths = [files[i] for i in sorted(files)]
    return read_files(paths, schema, combine=True, keep=own_file)[0]


def by_file(paths: list[Path], schema: pa.Schema) -> list[tuple[Path, pa.Table]]:
    """(file, its rows in ``schema``) of each readable file of ``paths``, in their order:
    one pyarrow dataset scan, and only where it fails, each file alone, the damaged ones
    skipped and named."""
    batches: dict[str, list[pa.RecordBatch]] = {str(p): [] for p in paths}
    try:
        scan = ds.dataset(list(batches), schema=schema, format="parquet").scanner()
        for tagged in scan.scan_batches():
            batches[tagged.fragment.path].append(tagged.record_batch)
        return [(p, pa.Table.from_batches(batches[str(p)], schema)) for p in paths]
    except (pa.ArrowException, OSError):
        pass  # some file is damaged: find which, one at a time
    found = []
    for path in paths:
        if not os.path.lexists(path):  # listed before a generation was swapped in
            raise FileNotFoundError(errno.ENOENT, "listed, then gone", str(path))
        rows = read_parquet(path, schema)
        if rows is not None:
            found.append((path, rows))
    return found


def own_file(path: Path, rows: pa.Table) -> bool:
    stem = path.name.removesuffix(".parquet")
    return pc.all(pc.equal(rows["trial_id"], stem)).as_py()


def read_table(table_dir: Path, schema: pa.Schema, attempts: int = 3) -> pa.Table:
    """Every trial's rows in a table directory, each trial from one file: a compacted trial
    that also has its own small file (a folder put together by hand) is read from the
    small file, the one a writer replaces. A file listed just before a generation was
    swapped in is gone when opened: the directory is listed and read again."""
    for _ in range(attempts - 1):
        with contextlib.suppress(FileNotFoundError):
            return read_listed(listing(table_dir), schema)
    return read_listed(listing(table_dir), schema)


def read_listed(files: Listing, schema: pa.Schema) -> pa.Table:
    small, _ = read_files(list(files.small.values()), schema, combine=True)
    parts, _ = read_files(list(files.parts.values()), schema)
    if small.num_rows and parts.num_rows:
        shadowed = pc.is_in(parts.column("trial_id"), value_set=small.column("trial_id").unique())
        parts = parts.filter(pc.invert(shadowed))
    return pa.concat_tables([small, parts])


def part_index(table_dir: Path, column: str | None = None) -> dict[str, tuple]:
    """Compacted trials of a table directory: trial id -> (the compacted file holding it,
    its value of ``column``, or None); a damaged compacted file is named and left out."""
    index = {}
    for name, path in listing(table_dir).parts.items():
        try:
            found = pq.read_table(path, columns=["trial_id", column] if column else ["trial_id"])
        except (pa.ArrowException, OSError) as e:
            warn_damaged(path, e)
            continue
        values = found[column].to_pylist() if column else [None] * found.num_rows
        index.update(
            (i, (name, v)) for i, v in zip(found["trial_id"].to_pylist(), values, strict=True)
        )
    return index


def part_name() -> str:
    return f"{PART_PREFIX}{secrets.token_hex(8)}.parquet"


def write_fsynced(table: pa.Table, path: Path) -> None:
    with open(path, "xb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())


class Generation:
    """The next generation of one table directory, built hidden beside it (steps 1-5 of the
    module's protocol): ``write`` its new files, then ``publish`` it."""

    def __init__(self, table_dir: Path):
        self.live = table_dir
        token = secrets.token_hex(6)
        self.next = table_dir.parent / f".{table_dir.name}{NEXT_MARK}{token}"
        self.prev = table_dir.parent / f".{table_dir.name}{PREV_MARK}{token}"
        self.next.mkdir()
        after_file_operation("mkdir")

    def write(self, name: str, table: pa.Table) -> None:
        write_fsynced(table, self.next / name)
        after_file_operation("write")

    def publish(self, remove: set[str]) -> None:
        """Make this generation the live directory: the live files, less ``remove``, and the
        ones written."""
        written = set(os.listdir(self.next))
        for entry in os.scandir(self.live):
            if entry.name in remove or entry.name in written or entry.name[:1] in "._":
                continue
            if not entry.is_file(follow_symlinks=False):
                continue  # a symlink or a folder in the results is never carried along
            try:
                os.link(entry.path, self.next / entry.name, follow_symlinks=False)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                shutil.copyfile(entry.path, self.next / entry.name, follow_symlinks=False)
            after_file_operation("link")
        fsync_dir(self.next)
        try:
            exchange(self.next, self.live)
        except ExchangeUnsupported:
            self.replace()
            return
        after_file_operation("exchange")
        fsync_dir(self.live.parent)
        self.discard()  # now the previous generation

    def replace(self) -> None:
        """Step 4 where directories cannot be exchanged: the live directory aside, this one
        renamed into its place (the module's docstring says what readers see between)."""
        os.rename(self.live, self.prev)
        after_file_operation("rename aside")
        try:
            os.rename(self.next, self.live)  # also over an empty one a writer made meanwhile
        except FileNotFoundError:
            if not self.live.is_dir():  # else a writer starting beside it renamed it in
                raise
        after_file_operation("rename in")
        fsync_dir(self.live.parent)
        shutil.rmtree(self.prev)
        after_file_operation("rmtree")

    def discard(self) -> None:
        shutil.rmtree(self.next)
        after_file_operation("rmtree")


def finish_swap(table_dir: Path) -> None:
    """Rename in the complete generation that a swap by two renames, killed between them,
    left waiting (nothing where none waits), over the empty directory a writer may have made
    in its place since. Safe beside a swap under way: its own second rename is this one, and
    it takes this one's as its own."""
    with contextlib.suppress(FileNotFoundError):
        waiting = table_source(table_dir)
        if waiting is not None and waiting != table_dir:
            os.rename(waiting, table_dir)  # replaces an empty directory in one step


def recover(sweep_dir: Path) -> None:
    """Finish a swap by two renames killed between them (its next generation, complete,
    renamed in), then remove what a killed generation left (hidden ``.<table>.next-*`` and
    ``.prev-*`` directories: an unpublished generation, or a published one's predecessor).
    Only while holding the sweep's driver lock: another process's generation in progress
    looks the same."""
    for table in TABLES:
        finish_swap(sweep_dir / table)
    marks = tuple(f".{t}{mark}" for t in TABLES for mark in (NEXT_MARK, PREV_MARK))
    with contextlib.suppress(FileNotFoundError), os.scandir(sweep_dir) as entries:
        stale = [e for e in entries if e.name.startswith(marks)]
    for entry in stale:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)  # a symlink by that name is removed, never followed
