"""Every plan the documentation shows is the code's. A fenced block that opens with a
``$ scale-fpt plan ...`` or ``$ scale-fpt sweep ... --plan`` line is that command's output:
the test runs the command and finds each line the block shows among the lines it prints, in
order (``...`` stands for anything: alone on a line, for lines left out). A plan's figures
anywhere else in the documentation (a table of GPU-hours, a count of trials) fail the test:
they would drift from the code unseen."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from scale_fpt import cli

ROOT = Path(__file__).resolve().parent.parent
READMES = ("README.md", "cluster/README.md", "benchmarks/README.md")
DOCS = sorted([*(ROOT / r for r in READMES), *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"^```[a-z]*\n\$ (scale-fpt [^\n]+)\n(.*?)^```", re.M | re.S)
PLAN_FIGURES = re.compile(
    r"arms x \d|trial\(s\) on |GPUs needed: \d|GPU-hours[^|\n]*\d|\| GPU-hours|per GPU: weights"
)
"""What only a plan prints: its header, its GPU-hours, a trial's GPUs, a memory breakdown."""


def is_plan(command: str) -> bool:
    words = shlex.split(command)
    return words[1] == "plan" or (words[1] == "sweep" and "--plan" in words)


def plan_blocks() -> list[tuple[str, str, list[str]]]:
    """(document, command, the lines it shows) of every plan block of the documentation."""
    return [
        (str(doc.relative_to(ROOT)), match[1], match[2].splitlines())
        for doc in DOCS
        for match in BLOCK.finditer(doc.read_text())
        if is_plan(match[1])
    ]


def shown_in_order(shown: list[str], printed: list[str]) -> list[str]:
    """The lines of ``shown`` not found in ``printed`` in order (``...`` a wildcard)."""
    missing, position = [], 0
    for line in shown:
        if line.strip() == "...":
            continue
        pattern = re.compile(".*".join(map(re.escape, line.split("..."))))
        found = next(
            (i for i in range(position, len(printed)) if pattern.fullmatch(printed[i])), None
        )
        if found is None:
            missing.append(line)
        else:
            position = found + 1
    return missing


BLOCKS = plan_blocks()


def test_the_documentation_shows_the_plans_of_the_shipped_studies():
    commands = {command for _, command, _ in BLOCKS}
    for study in ("scale", "finetune", "lr-search", "ladder"):
        assert any(c.startswith(f"scale-fpt sweep {study} --preset paper ") for c in commands)
    assert any(c.startswith("scale-fpt plan ") for c in commands)


@pytest.mark.parametrize(
    ("doc", "command", "shown"), BLOCKS, ids=[f"{d}: {c}" for d, c, _ in BLOCKS]
)
def test_a_documented_plan_is_what_the_command_prints(doc, command, shown, capsys, monkeypatch):
    # The plan prints before the preflight, whose hub look-ups need no network to fail here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the commands name the repository's files (cluster/gpu.yaml)
    code = cli.main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    assert code in (0, 2), err  # 2: the plan, then the arms whose data is missing here
    missing = shown_in_order(shown, (out + err).splitlines())
    assert not missing, f"{doc}: `{command}` no longer prints:\n" + "\n".join(missing)


def test_plan_figures_appear_only_in_checked_blocks():
    outside = []
    for doc in DOCS:
        text = BLOCK.sub(lambda m: "" if is_plan(m[1]) else m[0], doc.read_text())
        outside += [
            f"{doc.relative_to(ROOT)}: {line.strip()[:120]}"
            for line in text.splitlines()
            if PLAN_FIGURES.search(line)
        ]
    assert not outside, "plan figures outside a checked block:\n" + "\n".join(outside)
