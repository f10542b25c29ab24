"""Where a sweep keeps state besides its Parquet results: Ray Tune's storage (``--storage``)
and the Optuna storage (``--optuna-storage``), checked at start-up.

A bad one (a read-only path, a URI scheme nobody serves, an SQLite file in a directory that
does not exist) would otherwise fail tens of seconds in, after Ray started and the results
skeleton was written. The checks write nothing: a probe file is a nameless temporary in a
directory that already exists.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from scale_fpt.results import ResultsError

URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def tune_storage_problem(storage: str) -> str | None:
    """Why Ray Tune cannot keep its experiment state at ``storage`` (a local path or a
    ``scheme://`` URI that pyarrow serves), or None."""
    scheme = URI_SCHEME.match(storage)
    if scheme and scheme[1] != "file":
        import pyarrow.fs

        try:
            pyarrow.fs.FileSystem.from_uri(storage)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... per scheme
            return (
                f"--storage {storage!r}: not a storage Ray Tune can use ({one_line(e)}); give a "
                "directory or a URI such as s3://bucket/path or gs://bucket/path"
            )
        return None
    path = storage[len("file://") :] if scheme else storage
    problem = unwritable_directory(Path(path))
    return problem and f"--storage {storage}: {problem}"


JOURNAL_SUFFIX = ".journal"
"""An Optuna storage ending in this is a journal file (``optuna.storages.JournalStorage``),
not a database URL: safe on a shared file system (NFS, EFS), where SQLite's locks are not."""

SHARED_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "glusterfs")
"""File-system types (``/proc/mounts``) that several machines mount at once."""


def filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (its longest mount point in
    /proc/mounts; '' where that cannot be read)."""
    path = path.absolute()
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = path == Path(mount) or Path(mount) in path.parents
        if inside and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind


def default_optuna_storage(sweep_dir: Path) -> str:
    """The Optuna storage of a search given none: a journal file in the sweep's results
    directory when that is on a shared file system (where SQLite's locking is unsafe),
    else an SQLite database there."""
    kind = filesystem_type(sweep_dir)
    if kind in SHARED_FILESYSTEMS or kind.startswith("fuse."):
        return str(sweep_dir / f"optuna{JOURNAL_SUFFIX}")
    return f"sqlite:///{sweep_dir / 'optuna.db'}"


def open_optuna_storage(storage: str):
    """The Optuna storage object of ``storage``: a journal file (``*.journal``) or an RDB
    URL. What optuna.load_study and optuna-dashboard read too (docs/tracking.md)."""
    import optuna

    if storage.endswith(JOURNAL_SUFFIX):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(storage))
    return optuna.storages.RDBStorage(storage)


def optuna_storage_problem(url: str) -> str | None:
    """Why Optuna cannot keep a study at ``url``, or None: a journal file (``*.journal``)
    or an SQLite file needs an existing, writable directory; any other database must accept
    a connection now."""
    if url.endswith(JOURNAL_SUFFIX):
        directory = Path(url).absolute().parent
        if not directory.is_dir():
            return f"--optuna-storage {url}: directory {directory} does not exist"
        problem = unwritable_directory(directory)
        return problem and f"--optuna-storage {url}: {problem}"
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except Exception as e:  # ArgumentError (not a URL), NoSuchModuleError (no such database)
        return (
            f"--optuna-storage {url!r}: not a database URL Optuna can use ({one_line(e)}); "
            "e.g. sqlite:////abs/path/optuna.db, postgresql://user@host/db, or a journal "
            f"file /shared/path/optuna{JOURNAL_SUFFIX}"
        )
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            return f"--optuna-storage {url!r}: an in-memory database keeps no study; give a file"
        directory = Path(parsed.database).absolute().parent
        if not directory.is_dir():
            return f"--optuna-storage {url}: directory {directory} does not exist"
        problem = unwritable_directory(directory)
        return problem and f"--optuna-storage {url}: {problem}"
    try:
        with create_engine(parsed).connect():
            return None
    except Exception as e:  # driver missing, host unreachable, authentication refused
        return f"--optuna-storage {url}: cannot connect ({one_line(e)})"


def unwritable_directory(path: Path) -> str | None:
    """Why files cannot be created at or under ``path`` (its nearest existing ancestor is
    not a directory, or refuses a file), or None."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create a directory there ({existing} is a file)"
    try:
        with tempfile.TemporaryFile(dir=existing):
            return None
    except OSError as e:
        return f"cannot write to {existing}: {e.strerror or e}"


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def check_sweep_storage(sweep) -> str:
    """Every problem of the sweep's explicitly given storages, raised as one ResultsError:
    Tune's (the default, under the results directory, is checked with it by ResultsWriter)
    and Optuna's (a grid sweep's too: a bad URL is a mistake even where it is not used).
    Returns the Optuna storage a search keeps its studies in (``--optuna-storage``, else
    ``default_optuna_storage``; '' for a grid)."""
    problems = []
    if sweep.storage_path:
        problems.append(tune_storage_problem(sweep.storage_path))
    if sweep.optuna_storage:
        problems.append(optuna_storage_problem(sweep.optuna_storage))
    problems = [p for p in problems if p]
    if problems:
        raise ResultsError(problems)
    if not sweep.search:
        return ""
    return sweep.optuna_storage or default_optuna_storage(sweep.sweep_dir)
