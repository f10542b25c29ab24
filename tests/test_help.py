"""Every command's ``--help`` prints its usage and exits 0: each ``scale-fpt`` subcommand
and each runnable script in ``sweeps/``. Run in this process (argparse's help is the code
under test, a subprocess would add only start-up time)."""

from __future__ import annotations

import argparse
import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from scale_fpt import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "sweeps").glob("*.py"))


def subcommands() -> list[str]:
    (action,) = [
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return sorted(action.choices)


def test_the_subcommands_are_the_documented_ones():
    assert {"train", "plan", "pretrain", "sweep", "report"} <= set(subcommands())


@pytest.mark.parametrize("command", [None, *subcommands()])
def test_scale_fpt_help(command, capsys):
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: scale-fpt{'' if command is None else ' ' + command}")


def test_there_are_study_scripts():
    assert {p.name for p in SCRIPTS} >= {"scale.py", "finetune.py", "lr_search.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sweep_script_help(script, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert "--preset" in out and "--plan" in out


def test_print_config_and_config_read_each_other(capsys, tmp_path):
    """``train --print-config`` writes every field; ``--config`` of that file gives the same
    config, and a flag beside it wins."""
    import yaml

    from scale_fpt.config import FIELD_TYPES

    assert cli.main(["train", "--task", "listops", "--lr", "0.01", "--print-config"]) == 0
    written = capsys.readouterr().out
    values = yaml.safe_load(written)
    assert set(values) == set(FIELD_TYPES)
    assert (values["task"], values["lr"]) == ("listops", 0.01)
    path = tmp_path / "trial.yaml"
    path.write_text(written)
    assert cli.main(["train", "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == written
    assert cli.main(["plan", "--config", str(path), "--seed", "7", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {**values, "seed": 7}


def test_bad_config_file_is_one_error(capsys, tmp_path):
    path = tmp_path / "trial.yaml"
    path.write_text("task: listops\nlearning_rate: 0.1\nbatch_size: many\n")
    assert cli.main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'learning_rate'" in err
    assert "--batch-size: expected int, got 'many'" in err
    assert cli.main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "--config " in capsys.readouterr().err


LIGHT_HELP = """
import contextlib, io, sys
from scale_fpt import cli

for argv in (["--help"], ["report", "--help"], ["sweep", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(argv)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "ray"})))
"""


def test_help_and_the_list_of_studies_load_neither_torch_nor_ray():
    """``scale-fpt --help``, ``report --help`` and ``sweep --help`` (which lists the studies)
    build the whole parser: in a fresh interpreter, nothing of torch or Ray is imported."""
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_HELP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


def test_the_sweep_help_lists_every_study():
    from scale_fpt.recipes import STUDY_NAMES
    from scale_fpt.recipes.studies import STUDIES

    assert tuple(STUDIES) == STUDY_NAMES
    sweep = cli.build_parser()._subparsers._group_actions[0].choices["sweep"]
    assert all(name in sweep.format_help() for name in STUDY_NAMES)


def test_only_the_entry_point_imports_the_recipes():
    """The library never imports the recipes (presets and paper constants): of the package's
    modules, only ``scale_fpt.cli`` and the recipes themselves do."""
    package = ROOT / "scale_fpt"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n == "scale_fpt.recipes" or n.startswith("scale_fpt.recipes.") for n in names):
                importers.add(path.relative_to(package).as_posix())
    assert {p for p in importers if not p.startswith("recipes/")} == {"cli.py"}
