"""What the project says about itself matches the code: the Python version it needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import vermin

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared_python() -> tuple[int, int]:
    """The lower bound of ``requires-python`` (``>=3.X``)."""
    spec = PYPROJECT["project"]["requires-python"]
    match = re.fullmatch(r">=\s*3\.(\d+)", spec)
    assert match, f"requires-python {spec!r}: expected '>=3.X'"
    return 3, int(match[1])


def needed_python() -> dict[Path, tuple[int, int]]:
    """The oldest Python 3 each module of the package runs on, found by vermin from the
    syntax, modules, members and keyword arguments it uses."""
    config = vermin.Config()
    config.add_exclusion("long")  # torch.long, a dtype, read as Python 2's long builtin
    config.set_eval_annotations(True)
    return {
        path: vermin.detect(path.read_text(), config, str(path))[1]
        for path in sorted((ROOT / "scale_fpt").rglob("*.py"))
    }


def test_requires_python_is_the_oldest_python_the_package_runs_on():
    needed = needed_python()
    oldest = max(needed.values())
    assert declared_python() == oldest, {
        str(p.relative_to(ROOT)): v for p, v in needed.items() if v == oldest
    }


def test_ruff_and_the_readmes_state_the_same_python():
    major, minor = declared_python()
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert f"# Python {major}.{minor}+;" in (ROOT / "README.md").read_text()
    assert f"(>= {major}.{minor})" in (ROOT / "cluster" / "README.md").read_text()
