"""Preflight: a sweep refuses, before Ray starts, every arm whose data or weights cannot be
reached, in one message (exit 2, nothing written); ``--data-root DIR`` and per-task
``--set TASK.FIELD=VALUE`` point the tasks at their data."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from scale_fpt.config import ConfigError
from scale_fpt.preflight import preflight_problems
from scale_fpt.study import parse_assignments
from scale_fpt.sweep import SweepConfig

SCALE = Path(__file__).resolve().parents[1] / "sweeps" / "scale.py"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, scale_fpt_home, tmp_path):
    """No hub, an empty Hugging Face cache: only what the test puts on disk is reachable."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


def write_tape(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test_fold_holdout"):
        records = [{"primary": "MKV", "fold_label": 1}]
        (folder / f"remote_homology_{split}.json").write_text(json.dumps(records))
    return folder


def plan(capsys, monkeypatch, *flags: str) -> tuple[int, str, str]:
    """``python sweeps/scale.py --preset paper --plan FLAGS``, run in this process."""
    argv = [str(SCALE), "--preset", "paper", "--plan", "--models", "gpt2-tiny", *flags]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(SCALE), run_name="__main__")
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_paper_preset_planned_with_homology_data_missing(capsys, monkeypatch, tmp_path):
    results = tmp_path / "results"
    code, out, err = plan(
        capsys, monkeypatch, "--tasks", "bit-xor,homology", "--results", str(results)
    )
    assert code == 2
    assert "12 arms" in out  # the plan is still printed
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2, err
    assert lines[0].startswith("  - homology: no --data-dir given")
    assert "[2 arm(s): homology/gpt2-tiny/pretrained, homology/gpt2-tiny/random]" in lines[0]
    assert "--data-root DIR" in lines[1] and "docs/data.md" in lines[1]
    assert "bit-xor" not in err
    assert not results.exists()


def test_data_root_and_per_task_set_make_the_preset_runnable(capsys, monkeypatch, tmp_path):
    write_tape(tmp_path / "data" / "homology")
    code, _, err = plan(
        capsys, monkeypatch, "--tasks", "bit-xor,homology", "--data-root", str(tmp_path / "data")
    )
    assert (code, err) == (0, "")
    tape = write_tape(tmp_path / "tape")
    code, _, err = plan(
        capsys, monkeypatch, "--tasks", "homology", "--set", f"homology.data_dir={tape}"
    )
    assert (code, err) == (0, "")


def test_data_root_applies_only_where_the_task_folder_exists(tmp_path):
    write_tape(tmp_path / "homology")
    sweep = SweepConfig(
        name="s",
        grid={"task": ["homology", "listops", "bit-xor"]},
        overrides=(({"task": "listops"}, {"data_dir": "/elsewhere"}),),
        data_root=str(tmp_path),
    )
    data_dirs = {arm["task"]: arm.get("data_dir") for arm in sweep.trials()}
    assert data_dirs == {
        "homology": str(tmp_path / "homology"),
        "listops": "/elsewhere",  # an arm's own data_dir wins
        "bit-xor": None,  # generated: no folder
    }


def test_missing_weights_and_image_data_are_named(tmp_path):
    arms = [
        {"task": "mnist", "model": "gpt2", "init": "random"},
        {"task": "bit-xor", "model": "gpt2", "init": "pretrained"},
        {"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained", "weights": str(tmp_path)},
        {"task": "bit-xor", "model": "gpt2-tiny", "init": "pretrained"},  # built by the sweep
        {"task": "listops", "model": "lstm", "init": "random"},
    ]
    problems = preflight_problems(arms)
    assert problems[:3] == [
        "mnist: ylecun/mnist is not in the Hugging Face cache and the hub cannot be reached "
        "[1 arm(s): mnist/gpt2/random]",
        "gpt2: 'gpt2' is not in the Hugging Face cache and the hub cannot be reached "
        "[1 arm(s): bit-xor/gpt2/pretrained]",
        f"gpt2-tiny: {tmp_path} has no config.json (not a save_pretrained directory) "
        "[1 arm(s): bit-xor/gpt2-tiny/pretrained]",
    ]
    assert len(problems) == 4


def test_local_weights_and_image_folders_pass(tmp_path, tiny_gpt2_dir):
    images = tmp_path / "mnist"
    images.mkdir()
    for split in ("train", "test"):
        (images / f"{split}-00000-of-00001.parquet").write_bytes(b"")
    arms = [{"task": "mnist", "model": tiny_gpt2_dir, "init": "stats", "data_dir": str(images)}]
    assert preflight_problems(arms) == []


def test_per_task_assignments_are_checked():
    everywhere, per_task = parse_assignments(["eval_every=100", "cifar10-lra.lr=0.01"])
    assert everywhere == {"eval_every": 100}
    assert per_task == {"cifar10-lra": {"lr": 0.01}}
    with pytest.raises(ConfigError) as error:
        parse_assignments(["imagenet.lr=1", "homology.colour=red"])
    assert len(error.value.problems) == 2
    assert "TASK one of bit-memory, bit-xor" in error.value.problems[0]


def test_data_root_default_is_the_environment(monkeypatch, tmp_path):
    from scale_fpt.study import parser

    monkeypatch.setenv("SCALE_FPT_DATA", str(tmp_path))
    assert parser("", {"local": None}).parse_args([]).data_root == str(tmp_path)


def test_scale_fpt_sweep_runs_the_shipped_study_with_the_scripts_flags(capsys, tmp_path):
    """`scale-fpt sweep scale --preset paper --plan ...` is `sweeps/scale.py` with the same
    flags: the same plan, the same refusal."""
    from scale_fpt import cli

    flags = ["--preset", "paper", "--plan", "--models", "gpt2-tiny", "--tasks", "homology"]
    assert cli.main(["sweep", "scale", *flags]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("scale-paper: 6 arms x 1 trial(s) on a10g-24gb")
    assert err.startswith("scale-fpt: error: invalid configuration:\n  - homology: no --data-dir")
    write_tape(tmp_path / "homology")
    assert cli.main(["sweep", "scale", *flags, "--data-root", str(tmp_path)]) == 0


def test_scale_fpt_sweep_refuses_an_unknown_target_and_a_preset_for_a_file(capsys, tmp_path):
    from scale_fpt import cli

    assert cli.main(["sweep", "scaling"]) == 2
    assert (
        "'scaling': neither a study (scale, finetune, lr-search, families, ladder) nor a YAML"
        in (capsys.readouterr().err)
    )
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text("name: s\nbase: {task: bit-xor}\n")
    assert cli.main(["sweep", str(sweep_file), "--preset", "paper", "--plan"]) == 2
    assert "--preset paper: " in capsys.readouterr().err
    assert cli.main(["sweep", "scale", "--preset", "pythia-ladder", "--plan"]) == 2
    assert "--preset pythia-ladder: scale has the presets local, paper" in capsys.readouterr().err
    assert cli.main(["sweep", str(sweep_file), "--plan"]) == 0
    assert capsys.readouterr().out.startswith("s: 1 arms x 1 trial(s)")
