"""A results folder is untrusted input: files written inside a folder without following a link
out of it, paths it records resolved inside it, and its text made safe for a terminal.

Results folders travel (tarballs, ``rsync -a``, ``cp -a``, git all keep symbolic links), so
every byte of one may have been written by someone else. A write here opens each folder with
``O_NOFOLLOW`` and creates its file beside the target (``O_EXCL | O_NOFOLLOW``, relative to
the folder's descriptor), then ``os.replace``s it in: a planted link at the target is
replaced, never written through; a linked folder is refused in one line
(``docs/security.md``)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from scale_fpt.config import ConfigError


class ResultsError(ConfigError):
    """The results directory, or a storage of the sweep, cannot be used (unwritable, full,
    other schema, a bad URL, a link out of it). Its message is the problem itself, without
    ConfigError's "invalid configuration" framing: a full disk is not a bad flag."""

    def __init__(self, problems: list[str]):
        ValueError.__init__(self, "\n".join(problems))
        self.problems = list(problems)


SAFE_NAME = re.compile(r"[A-Za-z0-9_][^/\x00]*")
"""A file name a write may make from a results folder's text (a trial id, a sweep name):
one path component, not hidden, not ``..``."""


def linked(path: Path) -> str:
    """'<path> is a symbolic link (to <target>)', printable."""
    return f"{printable(str(path))} is a symbolic link (to {printable(os.readlink(path))})"


def refuse_links(*paths: Path) -> None:
    """ResultsError (one line) when any of ``paths`` is a symbolic link: an output folder
    (or file) inside a results folder must be a real one, or a write would leave the
    folder."""
    for path in paths:
        if os.path.islink(path):
            raise ResultsError(
                [f"{linked(path)}: refused, scale_fpt never writes through a link in a results "
                 "folder; remove the link (or choose another output folder)"]
            )  # fmt: skip


def make_folders(root: Path, *relative: str) -> None:
    """``root`` and each ``root/<relative>`` as real folders (made where missing); a
    symbolic link among them is refused (``refuse_links``)."""
    for path in (root, *(root / r for r in relative)):
        refuse_links(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file of that name, no permission, a full disk
            raise ResultsError(
                [f"cannot write to {printable(str(path))}: {e.strerror or e} (making the folder)"]
            ) from None
        refuse_links(path)  # made meanwhile by someone else


def open_folder(folder: Path) -> int:
    """A descriptor of ``folder`` opened without following a link at its last component."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            refuse_links(folder)
        raise


def write_file(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` (its folder: a real folder) so that it is the old file or the complete
    new one, never written through a link: ``write(f)`` fills a fresh hidden file beside it
    (created with ``O_EXCL | O_NOFOLLOW``), which is fsynced and renamed over ``path``. A
    link at ``path`` is replaced by the file, its target untouched. OSError when the disk
    refuses (no temporary left behind), ResultsError when the folder is a link."""
    path = Path(path)
    if not SAFE_NAME.fullmatch(path.name):
        raise ResultsError([f"refused to write {printable(str(path))}: not a plain file name"])
    folder = open_folder(path.parent)
    tmp = f".{path.name}.{os.getpid()}.tmp"
    try:
        fd = create(tmp, folder)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            # Whatever stopped the write (a full disk, an interrupt), leave no temporary.
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def create(name: str, folder: int) -> int:
    """A new file ``name`` in the folder of descriptor ``folder`` (``O_EXCL | O_NOFOLLOW``);
    a leftover of that name (a killed writer of the same pid, a planted link) is unlinked
    first, never followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        return os.open(name, flags, 0o644, dir_fd=folder)
    except FileExistsError:
        os.unlink(name, dir_fd=folder)
        return os.open(name, flags, 0o644, dir_fd=folder)


def write_text(path: Path, text: str) -> None:
    """``write_file`` of ``text`` as UTF-8."""
    write_file(path, lambda f: f.write(text.encode()))


def read_text(path: Path, limit: int = 1 << 20) -> str:
    """A small text file of a results folder (a pointer, a plan), not followed through a
    link and at most ``limit`` bytes: ResultsError naming it otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if os.path.islink(path):
            raise ResultsError([f"{linked(path)}: refused, not read"]) from None
        raise ResultsError([f"cannot read {printable(str(path))}: {e.strerror or e}"]) from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ResultsError([f"{printable(str(path))}: larger than {limit} bytes, not read"])
    return data.decode(errors="replace")


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` (relative ones under ``root``) when it resolves, links followed, inside
    ``root``; ResultsError (one line, naming both) otherwise: a pointer or a recorded path
    of a results folder never reaches outside it."""
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(Path(root) / path))
    if target != base and not target.is_relative_to(base):
        raise ResultsError(
            [f"{printable(str(path))} resolves to {printable(str(target))}, outside "
             f"{printable(str(root))}: refused"]
        )  # fmt: skip
    return target


UNPRINTABLE = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    # Bidirectional overrides and isolates reorder what a terminal shows (Trojan Source).
    **{c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F)},
}


def printable(text: str) -> str:
    """``text`` as one line a terminal shows as it is: control characters (newlines, escape
    sequences) and bidirectional controls written as ``\\xNN`` / ``\\uNNNN``."""
    return str(text).translate(UNPRINTABLE)
