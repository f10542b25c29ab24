"""The house rules a reviewer would check by hand: rooms of a readable size, and the report
reading results without the sweep machinery."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scale_fpt"
MAX_LINES = 500
REASON = "Over 500 lines:"
"""How a module longer than ``MAX_LINES`` says, in its docstring, why it stays one room."""


def modules():
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_long_module_states_why_at_its_top(path):
    lines = path.read_text().count("\n")
    if lines <= MAX_LINES:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert REASON in docstring, (
        f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it at a seam, or say "
        f"'{REASON} <why>' in its docstring"
    )


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_report_never_imports_the_sweep_package():
    report = sorted((PACKAGE / "report").rglob("*.py"))
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in imported(path) if n.startswith("scale_fpt.sweep")
        )
        for path in report
    }
    assert {k: v for k, v in offenders.items() if v} == {}
