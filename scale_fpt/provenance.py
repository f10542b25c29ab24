"""Which commit of scale_fpt made a row (``git_sha``), also where the code has no ``.git``.

On a laptop the SHA comes from git. A cluster node gets the code through the launcher's
file mounts without ``.git``, so cluster/*.yaml also mount the repository's ``.git`` to
``~/scale_fpt_git`` and, at every ``ray up``, run

    python -m scale_fpt.provenance --git-dir ~/scale_fpt_git --work-tree ~/scale-fpt

which records the synced tree's commit (and whether it differs from it: "-dirty") in
``scale_fpt/_provenance.json`` beside this module (git-ignored). ``git_sha`` reads that
record when git cannot answer.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROVENANCE_FILE = PACKAGE_DIR / "_provenance.json"
UNKNOWN = "unknown"


@functools.cache
def git_sha() -> str:
    """Commit of the scale_fpt source that runs ("-dirty" when it has local changes): the
    driver's (a sweep passes its own to the workers via SCALE_FPT_GIT_SHA), else git's, else
    the one recorded when the code was synced to this node, else "unknown"."""
    return (
        os.environ.get("SCALE_FPT_GIT_SHA")
        or describe_commit(PACKAGE_DIR.parent)
        or recorded_commit()
        or UNKNOWN
    )


def describe_commit(work_tree: Path, git_dir: Path | None = None) -> str | None:
    """HEAD of the repository (``git_dir``, or the one ``work_tree`` is in) plus "-dirty" when
    the tracked files of ``work_tree`` differ from it; None without git or a repository."""
    git = ["git", "-c", "safe.directory=*", "-C", str(work_tree)]
    if git_dir is not None:
        git += ["--git-dir", str(git_dir), "--work-tree", str(work_tree)]
    elif not (work_tree / ".git").exists():  # never the commit of a repository around it
        return None
    try:
        sha = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty else "")


def recorded_commit() -> str | None:
    """The commit recorded by ``record_commit`` on this node, or None."""
    try:
        return json.loads(PROVENANCE_FILE.read_text()).get("git_sha")
    except (OSError, ValueError, AttributeError):
        return None


def record_commit(git_dir: Path, work_tree: Path) -> str:
    """Record the commit of ``work_tree`` (checked against ``git_dir``) for ``git_sha``;
    returns it ("unknown" where git or the repository is missing: rows then say so)."""
    sha = describe_commit(work_tree, git_dir) or UNKNOWN
    tmp = PROVENANCE_FILE.with_name(f".{PROVENANCE_FILE.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"git_sha": sha}))
    os.replace(tmp, PROVENANCE_FILE)
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scale_fpt.provenance",
        description="record the commit of a synced scale_fpt tree (cluster setup)",
    )
    parser.add_argument("--git-dir", required=True, type=Path, help="the repository's .git")
    parser.add_argument("--work-tree", required=True, type=Path, help="the synced tree")
    args = parser.parse_args(argv)
    sha = record_commit(args.git_dir.expanduser(), args.work_tree.expanduser())
    print(f"scale_fpt: code at commit {sha} (recorded in {PROVENANCE_FILE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
