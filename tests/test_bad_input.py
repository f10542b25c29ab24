"""Bad input through the command line: corrupt data files, malformed sweep YAML, unknown
names and impossible combinations not covered elsewhere (see test_cli.py, test_models.py,
test_results.py, test_tasks.py, test_cluster_configs.py for the rest). Each is one line
naming the problem, exit code 2, no traceback, nothing written; none starts Ray.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from helpers import TINY_TRIAL, TRAIN, files_under, truncate

from scale_fpt import cli
from scale_fpt.sweep import SweepConfig

TINY = {**TINY_TRIAL, "accelerator": "cpu"}


def run_cli(capfd, *argv) -> tuple[int, str]:
    """``scale-fpt ARGV`` in this process: (exit code, the one error line); asserts that
    there is exactly one error message and no traceback."""
    code = cli.main([str(a) for a in argv])
    _, err = capfd.readouterr()
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("scale-fpt: error:")]
    assert len(errors) == 1, err
    return code, err[err.index("scale-fpt: error:") :]


def image_dataset(columns: dict):
    import datasets

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    return datasets.Dataset.from_dict(columns, features=features)


def mnist_parquet(root: Path, image_bytes: bytes | None = None) -> Path:
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    for split in ("train", "test"):
        images = [Image.fromarray(p) for p in pixels]
        if image_bytes is not None:
            images = [{"bytes": image_bytes, "path": None}] * len(pixels)
        image_dataset({"image": images, "label": [1, 2, 3, 4]}).to_parquet(
            str(root / f"{split}-0.parquet")
        )
    return root


def tape_json(root: Path) -> Path:
    root.mkdir(parents=True)
    for split in ("train", "valid", "test_fold_holdout"):
        records = [{"primary": "MKTAYIAK", "fold_label": 3}] * 4
        (root / f"remote_homology_{split}.json").write_text(json.dumps(records))
    return root


def tape_lmdb(root: Path) -> Path:
    lmdb = pytest.importorskip("lmdb")
    root.mkdir(parents=True)
    for split in ("train", "valid", "test_fold_holdout"):
        env = lmdb.open(str(root / f"remote_homology_{split}.lmdb"), map_size=1 << 20)
        with env.begin(write=True) as txn:
            for i in range(3):
                txn.put(str(i).encode(), pickle.dumps({"primary": "MKT", "fold_label": 1}))
            txn.put(b"num_examples", pickle.dumps(3))
        env.close()
    return root


def lra_tsv(root: Path, train: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "basic_train.tsv").write_bytes(train)
    for split in ("val", "test"):
        (root / f"basic_{split}.tsv").write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n")
    return root


def corrupt_data(kind: str, root: Path) -> tuple[str, Path]:
    """(task, --data-dir) of a data directory damaged the way ``kind`` says."""
    if kind == "truncated image parquet":
        path = mnist_parquet(root)
        truncate(path / "train-0.parquet")
        return "mnist", path
    if kind == "undecodable image":
        return "mnist", mnist_parquet(root, image_bytes=b"\x89PNG\r\n this is no image")
    if kind == "TAPE JSON cut in the middle":
        path = tape_json(root)
        truncate(path / "remote_homology_train.json")
        return "homology", path
    if kind == "TAPE LMDB overwritten":
        path = tape_lmdb(root)
        data = path / "remote_homology_train.lmdb" / "data.mdb"
        data.write_bytes(b"\0" * len(data.read_bytes()))
        return "homology", path
    good = b"Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n"
    rows = {
        "LRA tsv with a bad row": good + b"( ( ( [MAX 2 ) 9\n",
        "LRA tsv that is binary": good + b"\xff\xfe\x00\x01\t3\n",
        "LRA tsv without rows": b"Source\tTarget\n",
    }
    return "listops", lra_tsv(root, rows[kind])


CORRUPT_DATA = {
    "truncated image parquet": ["could not read the dataset", "download ylecun/mnist again"],
    "undecodable image": ["row 0 of the train split", "not a readable image", "download"],
    "TAPE JSON cut in the middle": ["remote_homology_train.json", "JSONDecodeError", "again"],
    "TAPE LMDB overwritten": ["not a readable LMDB database", "download TAPE"],
    "LRA tsv with a bad row": ["basic_train.tsv:3 is not an LRA row", "download LRA"],
    "LRA tsv that is binary": ["basic_train.tsv:3 is not UTF-8 text", "download LRA"],
    "LRA tsv without rows": ["basic_train.tsv holds no rows", "download LRA"],
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_DATA))
def test_corrupt_data_files_are_one_line_exit_2_and_nothing_written(
    kind, tmp_path, capfd, monkeypatch
):
    if "image" in kind:  # datasets' Parquet conversion cache: keep it out of the user's home
        datasets = pytest.importorskip("datasets")
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    task, data_dir = corrupt_data(kind, tmp_path / "data")
    results = tmp_path / "results"
    code, message = run_cli(
        capfd, "train", "--task", task, "--data-dir", data_dir, "--model", "gpt2-tiny",
        "--init", "random", "--results", results, "--no-progress",
    )  # fmt: skip
    assert code == 2
    (line,) = message.strip().splitlines()  # one line: what is wrong, and what to do
    assert line.startswith(f"scale-fpt: error: {task.split('-')[0]}: ")
    for expected in CORRUPT_DATA[kind]:
        assert expected in line, (expected, line)
    assert not results.exists()


def test_impossible_configs_exit_2_naming_the_problem_and_write_nothing(
    tmp_path, capfd, no_network
):
    """Unknown names and impossible combinations that test_cli.py does not already run
    through the command line (bad task/init/finetune/batch/lr: see
    test_cli.py::test_every_bad_argument_is_reported_at_once)."""
    results = tmp_path / "results"
    cases = {
        ("--model", "no-such-model"): ["'no-such-model' is not a preset", "gpt2-tiny"],
        ("--model", "lstm", "--finetune", "fpt+attn"): ["attn do not exist", "input, output"],
        ("--task", "listops", "--max-length", "2048"): ["2048 tokens exceed the 1024", "lower"],
    }
    for flags, expected in cases.items():
        code, message = run_cli(
            capfd, "train", "--init", "random", *flags, "--results", results, "--no-progress"
        )
        assert code == 2
        for text in expected:
            assert text in message, (text, message)
    assert not results.exists()


def test_results_of_another_schema_version_exit_2_and_stay_untouched(tmp_path, capfd):
    results = tmp_path / "results"
    (results / "train").mkdir(parents=True)
    (results / "train" / "_schema.json").write_text(json.dumps({"schema_version": 999}))
    code, message = run_cli(capfd, *TRAIN[1:], "--steps", "2", "--results", results)
    assert code == 2 and "schema version 999" in message and "new results directory" in message
    code, message = run_cli(capfd, "report", results)
    assert code == 2 and "schema version 999" in message
    (results / "train" / "_schema.json").write_text('{"schema_vers')  # cut mid-write
    code, message = run_cli(capfd, "report", results)
    assert code == 2 and "not a readable scale_fpt schema file" in message
    assert files_under(results) == ["train/_schema.json"]


MALFORMED_SWEEPS = {
    "name: a\nbase: {task: bit-xor\n": ["YAML syntax error", "line 3"],
    "- name: a\n": ["a sweep file is a mapping"],
    "grids: {lr: [0.1]}\n": ["unknown key 'grids'", "'name' is required"],
    "name: 12\nmax_failures: two\nasha: 'yes'\nsearch: {lr: 5}\n": [
        "'name' must be a str, got 12",
        "'max_failures' must be an int, got 'two'",
        "'asha' must be a bool",
        "search 'lr' must be a list",
    ],
    "name: b\nbase: {task: nope, lr: -1}\ngrid: {batch_size: []}\n": [
        "grid 'batch_size': needs a non-empty list",
    ],
    "name: b\nbase: {task: nope, lr: -1, batch_size: 0}\n": [
        "--task: unknown value 'nope'",
        "--lr: must be a positive number",
        "--batch-size: must be >= 1",
    ],
    "name: c\noverrides: [[{task: bit-xor}, 5]]\n": ["pairs of mappings"],
}


@pytest.mark.parametrize("text", list(MALFORMED_SWEEPS), ids=range(len(MALFORMED_SWEEPS)))
def test_malformed_sweep_yaml_exits_2_naming_every_problem(text, tmp_path, capfd):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    results = tmp_path / "results"
    code, message = run_cli(capfd, "sweep", path, "--results", results)
    assert code == 2 and str(path) in message
    for expected in MALFORMED_SWEEPS[text]:
        assert expected in message, (expected, message)
    assert not results.exists()


EVERY_KIND_OF_SWEEP_PROBLEM = """\
name: 12
max_failures: two
seeds: [zero, 1]
base: {task: nope, model: gpt2-tiny}
grid: {batch_size: [], seed: [3, 4], init: [random, bogus]}
search: {lr: 5}
"""


def test_sweep_yaml_problems_of_every_kind_arrive_in_one_message(tmp_path, capfd):
    """Top-level types, grid shapes, seeds and every arm's trial-config values: one run of
    `scale-fpt sweep` names all of them (not one kind per attempt), exit code 2."""
    path = tmp_path / "sweep.yaml"
    path.write_text(EVERY_KIND_OF_SWEEP_PROBLEM)
    results = tmp_path / "results"
    code, message = run_cli(capfd, "sweep", path, "--results", results)
    assert code == 2
    for expected in (
        "'name' must be a str, got 12",  # top-level types
        "'max_failures' must be an int, got 'two'",
        "search 'lr' must be a list",
        "grid 'batch_size': needs a non-empty list",  # grid shapes
        "seeds: 'zero' is not an integer seed",  # seeds
        "grid 'seed': seeds are set by 'seeds'",
        "nope/gpt2-tiny/random/1: --task: unknown value 'nope'",  # per-arm values
        "nope/gpt2-tiny/bogus/1: --init: unknown value 'bogus'",
    ):
        assert expected in message, (expected, message)
    assert not results.exists()


def test_negative_sweep_limits_exit_2_and_help_says_zero_is_unlimited(tmp_path, capsys):
    """--max-concurrent -1 and --max-failures -3 are refused in one message (not replaced
    by the preset's values); --help explains 0."""
    from scale_fpt.study import parser, study_main

    presets = {"local": lambda: SweepConfig(name="limits", base={**TINY, "max_steps": 2})}
    results = tmp_path / "results"
    argv = ["--results", str(results), "--max-concurrent", "-1", "--max-failures", "-3"]
    assert study_main("limits", presets, argv) == 2
    err = capsys.readouterr().err
    assert "--max-concurrent: must be >= 0 (0 = unlimited), got -1" in err
    assert "--max-failures: must be >= 0 (0 = no retries), got -3" in err
    assert "Traceback" not in err and not results.exists()
    help_text = " ".join(parser("limits", presets).format_help().split())
    assert "--max_concurrent INT At most this many trials at once; 0 = unlimited" in help_text


def test_missing_sweep_file_exits_2(tmp_path, capfd):
    code, message = run_cli(capfd, "sweep", tmp_path / "nope.yaml")
    assert code == 2 and "cannot read sweep file" in message and "nope.yaml" in message
