"""Tasks: shapes, the paper's semantics, determinism, and the real loaders on tiny data that
the tests write in each loader's real format (HF Parquet / save_to_disk, LRA tsv, TAPE JSON).
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from scale_fpt.config import ConfigError, TaskConfig, TrialConfig
from scale_fpt.keyed_random import Draws
from scale_fpt.task_registry import TASKS
from scale_fpt.tasks import Batch, build_task, epoch_indices, task_spec
from scale_fpt.tasks.base import EVAL_SPLITS, DataUnavailable
from scale_fpt.tasks.homology import AMINO_ACIDS, UNK
from scale_fpt.tasks.listops import VOCAB, evaluate, tokenize

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- data written by the tests


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """Keep datasets' Parquet conversion cache out of the user's home."""
    datasets = pytest.importorskip("datasets")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


def write_images(root: Path, splits: dict, column: str, layout: str) -> Path:
    """Write {split: (images uint8, labels)} as HF would: an Image and a ClassLabel column."""
    import datasets

    features = datasets.Features(
        {column: datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    dd = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {column: [Image.fromarray(a) for a in images], "label": labels.tolist()},
                features=features,
            )
            for split, (images, labels) in splits.items()
        }
    )
    root.mkdir(parents=True)
    for split, ds in dd.items():
        if layout == "hf":  # the hub repos' own layout
            ds.to_parquet(str(root / "plain_text" / f"{split}-00000-of-00001.parquet"))
        elif layout == "flat":
            ds.to_parquet(str(root / f"{split}-0.parquet"))
        elif layout == "folders":
            ds.to_parquet(str(root / split / "part-0.parquet"))
    if layout == "disk":
        dd.save_to_disk(str(root))
    return root


@pytest.fixture(scope="module")
def mnist_data(tmp_path_factory, hf_cache):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)
    train[0] = 0
    train[0, 0, 0], train[0, 27, 27] = 255, 51
    test = rng.integers(0, 256, (4, 28, 28), dtype=np.uint8)
    splits = {"train": (train, np.arange(10)), "test": (test, np.array([3, 1, 4, 1]))}
    root = tmp_path_factory.mktemp("mnist")
    return splits, write_images(root / "parquet", splits, "image", "flat")


@pytest.fixture(scope="module")
def cifar_data(tmp_path_factory, hf_cache):
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    test = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    test[0] = 0
    test[0, 5, 9, 2] = 255
    splits = {"train": (train, np.arange(12) % 10), "test": (test, np.array([9, 8, 7, 6, 5]))}
    root = tmp_path_factory.mktemp("cifar")
    return splits, write_images(root / "parquet", splits, "img", "hf")


LRA_TRAIN = [  # LRA's Source strings write the binary parse tree's parentheses
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),
    ("( ( ( [SM 5 ) 6 ) ] )", 1),
    ("( ( ( ( [MED 1 ) 2 ) 3 ) ] )", 2),
    ("( ( ( ( [MIN 4 ) 7 ) ( ( ( [MAX 0 ) 8 ) ] ) ) ] )", 4),
    ("( ( ( [MAX 2 ) ?? ) ] )", 2),
]
LRA_VAL = [("( ( ( [MIN 3 ) 8 ) ] )", 3), ("( ( ( [SM 9 ) 9 ) ] )", 8)]
LRA_TEST = [("( ( ( [MED 4 ) 6 ) ] )", 5), ("( ( ( [MAX 1 ) 7 ) ] )", 7), ("( ( [MIN 0 ) ] )", 0)]


@pytest.fixture(scope="module")
def lra_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lra")
    for name, rows in (("train", LRA_TRAIN), ("val", LRA_VAL), ("test", LRA_TEST)):
        lines = ["Source\tTarget"] + [f"{s}\t{t}" for s, t in rows]
        (root / f"basic_{name}.tsv").write_text("\n".join(lines) + "\n")
    return root


PROTEINS = {
    "train": [("MKTAYIAK", 3), ("GAV", 0), ("LLKJX", 1194), ("ACDEFGHIKLMNPQRSTVWY", 7)]
    + [("WY" * k, k) for k in range(1, 9)],
    "valid": [("MMM", 2)],
    "test_fold_holdout": [("PEPTIDE", 5), ("KK", 6), ("ACDC", 0)],
}


@pytest.fixture(scope="module")
def tape_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tape")
    (root / "remote_homology").mkdir()
    for split, rows in PROTEINS.items():
        records = [
            {"id": str(i), "primary": p, "fold_label": f, "protein_length": len(p)}
            for i, (p, f) in enumerate(rows)
        ]
        (root / "remote_homology" / f"remote_homology_{split}.json").write_text(json.dumps(records))
    return root


@pytest.fixture(scope="module")
def configs(mnist_data, cifar_data, lra_dir, tape_dir):
    """One small configuration per task, on the data above."""
    return {
        "bit-xor": TaskConfig(task="bit-xor", test_batches=2, val_batches=3),
        "bit-memory": TaskConfig(task="bit-memory", test_batches=2, val_batches=3),
        "listops": TaskConfig(
            task="listops", max_length=64, listops_train_size=50, test_batches=2, val_batches=3
        ),
        "mnist": TaskConfig(task="mnist", data_dir=str(mnist_data[1])),
        "cifar10": TaskConfig(task="cifar10", data_dir=str(cifar_data[1])),
        "cifar10-lra": TaskConfig(task="cifar10-lra", data_dir=str(cifar_data[1])),
        "homology": TaskConfig(task="homology", data_dir=str(tape_dir)),
    }


ALL_TASKS = tuple(TASKS)
GENERATED = ("bit-xor", "bit-memory", "listops")  # listops as configured here: no data_dir

# ---------------------------------------------------------------- every task


@pytest.mark.parametrize("name", ALL_TASKS)
def test_batches_match_spec(configs, name):
    task = build_task(configs[name], seed=0)
    spec = task.spec
    assert spec == task_spec(configs[name])
    batches = [task.train_batch(step, 3) for step in range(2)] + list(task.test_batches(2))
    for b in batches:
        B = len(b)
        if spec.discrete:
            assert b.x.dtype == torch.int64 and b.x.dim() == 2
            assert b.x.shape[1] <= spec.n_tokens and int(b.x.max()) < spec.vocab_size
        else:
            assert b.x.dtype == torch.float32
            assert b.x.shape == (B, spec.n_tokens, spec.token_width)
        assert b.y.dtype == torch.int64
        assert b.y.shape == (B, spec.n_predicting_tokens, spec.outputs_per_token)
        assert int(b.y.min()) >= 0 and int(b.y.max()) < spec.n_classes
        if name in ("listops", "homology"):
            assert b.lengths.dtype == torch.int64 and b.lengths.shape == (B,)
            assert int(b.lengths.min()) >= 1 and int(b.lengths.max()) <= b.x.shape[1]
            padding = torch.arange(b.x.shape[1]) >= b.lengths[:, None]
            assert (b.x[padding] == 0).all() and (b.x[~padding] != 0).all()
        else:
            assert b.lengths is None


@pytest.mark.parametrize("name", ALL_TASKS)
def test_train_batches_are_a_function_of_seed_and_step(configs, name):
    task, same, other = (build_task(configs[name], seed=s) for s in (0, 0, 1))
    a = task.train_batch(5, 4)
    b = same.train_batch(5, 4)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert torch.equal(a.x, task.train_batch(5, 4).x)  # asking again changes nothing
    assert not torch.equal(a.x, task.train_batch(6, 4).x)
    assert not torch.equal(a.x, other.train_batch(5, 4).x)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_a_cohort_batch_holds_each_members_own_batch(configs, name):
    """``cohort_batch`` (all members' batches at once, vectorised for bits and images) gives
    member i exactly the batch of the task built for its seed; variable-length members are
    right-padded to the longest."""
    seeds = [3, 0, 11]
    task = build_task(configs[name], seed=seeds[0])
    for step in (0, 5):
        cohort = task.cohort_batch(step, 4, seeds)
        assert cohort.x.shape[:2] == (3, 4) and cohort.y.shape[:2] == (3, 4)
        for i, seed in enumerate(seeds):
            alone = build_task(configs[name], seed=seed).train_batch(step, 4)
            member = cohort.member(i)
            T = alone.x.shape[1]
            assert torch.equal(member.x[:, :T], alone.x) and torch.equal(member.y, alone.y)
            assert (member.x[:, T:] == 0).all()  # padding, if any
            if alone.lengths is not None:
                assert torch.equal(member.lengths, alone.lengths)
    assert not torch.equal(cohort.member(0).x, cohort.member(1).x[:, : cohort.member(0).x.shape[1]])


def tensors_of(value) -> list[torch.Tensor]:
    """Every tensor held in ``value`` (a task's attribute)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Batch):
        return [t for t in (value.x, value.y, value.lengths) if t is not None]
    if isinstance(value, tuple | list):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    return []


@pytest.mark.parametrize("name", ALL_TASKS)
def test_tasks_hold_their_data_and_draw_batches_on_their_device(configs, name):
    """After ``to(device)`` a task holds its data there and makes every batch there: on the
    meta device any tensor made on the host (a draw, an index, a constant) would fail to mix
    with the task's own, so this checks the GPU path's logic without a GPU."""
    host = build_task(configs[name], seed=0)
    host_eval = {split: next(iter(host.eval_batches(split, 4))) for split in EVAL_SPLITS}
    task = build_task(configs[name], seed=0).to("meta")
    held = [t for name_, v in vars(task).items() if name_ != "_host_lengths" for t in tensors_of(v)]
    assert all(t.is_meta for t in held)
    assert bool(held) == (name not in GENERATED)  # generated tasks hold no dataset
    for step in (0, 7):
        batch, expected = task.train_batch(step, 3), host.train_batch(step, 3)
        for ours, theirs in zip(tensors_of(batch), tensors_of(expected), strict=True):
            assert ours.is_meta and ours.shape == theirs.shape and ours.dtype == theirs.dtype
    for split in EVAL_SPLITS:
        batch = next(iter(task.eval_batches(split, 4)))
        for ours, theirs in zip(tensors_of(batch), tensors_of(host_eval[split]), strict=True):
            assert ours.is_meta and ours.shape == theirs.shape


@pytest.mark.parametrize("split", EVAL_SPLITS)
@pytest.mark.parametrize("name", ALL_TASKS)
def test_eval_sets_are_fixed_and_independent_of_trial_seed(configs, name, split):
    a, b = build_task(configs[name], seed=0), build_task(configs[name], seed=7)
    first = list(a.eval_batches(split, 3))
    for batches in (list(a.eval_batches(split, 3)), list(b.eval_batches(split, 3))):
        assert len(batches) == len(first)
        for x, y in zip(first, batches, strict=True):
            assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y)
    # The batch size only slices the same examples.
    whole = list(a.eval_batches(split, 1000))
    assert len(whole) == 1 and torch.equal(whole[0].y, torch.cat([t.y for t in first]))
    if split == "test":
        for t, u in zip(a.test_batches(3), first, strict=True):
            assert torch.equal(t.x, u.x)


def example_keys(batches) -> list[bytes]:
    """One hashable key per example: its real tokens (or features) and its targets."""
    keys = []
    for b in batches:
        for i in range(len(b)):
            x = b.x[i] if b.lengths is None else b.x[i, : b.lengths[i]]
            keys.append(x.numpy().tobytes() + b"|" + b.y[i].numpy().tobytes())
    return keys


# (validation, test) sizes of the configs above: synthetic sets are chunks of 32; mnist
# and cifar hold out round(0.1 * n) of their 10 / 12 training images; LRA and TAPE files.
EVAL_SIZES = {
    "bit-xor": (96, 64),
    "bit-memory": (96, 64),
    "listops": (96, 64),
    "mnist": (1, 4),
    "cifar10": (1, 5),
    "cifar10-lra": (1, 5),
    "homology": (1, 3),
}


@pytest.mark.parametrize("name", ALL_TASKS)
def test_validation_is_disjoint_from_test_and_training(configs, name):
    task = build_task(configs[name], seed=0)
    assert (task.eval_size("val"), task.eval_size("test")) == EVAL_SIZES[name]
    val, test = example_keys(task.eval_batches("val", 7)), example_keys(task.test_batches(7))
    if name == "bit-xor":  # 1024 possible inputs: independent draws, not distinct examples
        assert val[: len(test)] != test
        return
    assert not set(val) & set(test)
    if name in ("bit-memory", "listops"):
        return  # training draws fresh examples / a separate generated pool
    # Real datasets: two epochs of training never read a validation example.
    n_train = {"homology": len(PROTEINS["train"])}.get(name) or len(task.train_images)
    if name == "cifar10" or name == "cifar10-lra":  # compare the stored images
        task = build_task(replace(configs[name], augment=False), seed=0)
    trained = example_keys(task.train_batch(step, n_train) for step in range(2))
    assert len(set(trained)) == n_train and not set(val) & set(trained)


def test_images_hold_out_a_fixed_slice_of_train(mnist_data):
    _, path = mnist_data
    task = build_task(TaskConfig(task="mnist", data_dir=str(path), val_fraction=0.3), 0)
    other = build_task(TaskConfig(task="mnist", data_dir=str(path), val_fraction=0.3), 5)
    assert torch.equal(task.train_index, other.train_index)  # the same for every trial seed
    (val,) = task.eval_batches("val", 100)
    held_out = sorted(val.y.view(-1).tolist())  # mnist_data labels are the image indices
    assert len(held_out) == 3 and len(task.train_index) == 7
    assert sorted(held_out + task.train_index.tolist()) == list(range(10))
    labels = torch.cat([task.train_batch(s, 7).y.view(-1) for s in range(4)]).tolist()
    assert set(labels) == set(task.train_index.tolist())
    limited = TaskConfig(task="mnist", data_dir=str(path), val_fraction=0.3, val_limit=2)
    assert build_task(limited, 0).eval_size("val") == 2


def test_unknown_eval_split_is_named(configs):
    for name in ("bit-xor", "listops", "mnist", "homology"):
        with pytest.raises(ValueError, match="unknown evaluation split 'train'; choose from val"):
            list(build_task(configs[name], 0).eval_batches("train", 4))


def test_validation_settings_are_checked():
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_flat({"val_batches": 0, "val_limit": -1, "val_fraction": 1.0})
    assert all(f in str(e.value) for f in ("--val-batches", "--val-limit", "--val-fraction"))


def test_unknown_task_is_a_config_error():
    with pytest.raises(ConfigError, match="--task"):
        build_task(TaskConfig(task="sudoku"), 0)


def test_importing_tasks_does_not_import_datasets():
    code = (
        "import sys; import scale_fpt.tasks.bits, scale_fpt.tasks.listops, "
        "scale_fpt.tasks.images, scale_fpt.tasks.homology; from scale_fpt.tasks import "
        "build_task; from scale_fpt.config import TaskConfig; "
        "build_task(TaskConfig(task='bit-xor'), 0).train_batch(0, 2); "
        "assert 'datasets' not in sys.modules, 'datasets imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(1, 40), batch_size=st.integers(1, 17), seed=st.integers(0, 3))
def test_each_epoch_reads_every_example_once(n, batch_size, seed):
    steps = (3 * n) // batch_size + 2
    stream = torch.cat([epoch_indices(seed, s, batch_size, n) for s in range(steps)])
    for epoch in range(len(stream) // n):
        assert sorted(stream[epoch * n : (epoch + 1) * n].tolist()) == list(range(n))


# ---------------------------------------------------------------- bits


def test_bit_xor_targets_are_the_xor_of_the_inputs(configs):
    b = build_task(configs["bit-xor"], 0).train_batch(0, 64)
    bits = b.x.squeeze(-1)
    assert set(bits.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(b.y.squeeze(-1), bits[:, :5].long() ^ bits[:, 5:].long())


def test_bit_memory_query_is_a_masked_copy_and_targets_its_string(configs):
    b = build_task(configs["bit-memory"], 0).train_batch(3, 16)
    flat = b.x.reshape(16, 6000)
    strings, query = flat[:, :5000].view(16, 5, 1000), flat[:, 5000:]
    target = b.y.reshape(16, 1000)
    assert set(strings.unique().tolist()) == {-1.0, 1.0}
    for i in range(16):
        shown = query[i] != 0
        assert 0.35 < shown.float().mean() < 0.65  # each bit masked with prob 0.5
        copies = [k for k in range(5) if torch.equal(strings[i, k][shown], query[i][shown])]
        assert len(copies) == 1  # the query is one of the five strings
        assert torch.equal(target[i], (strings[i, copies[0]] > 0).long())


def test_bit_memory_size_follows_the_config():
    config = TaskConfig(task="bit-memory", bit_memory_bits=20, bit_memory_patch=10)
    task = build_task(config, 0)
    assert (task.spec.n_tokens, task.spec.token_width, task.spec.n_predicting_tokens) == (12, 10, 2)
    b = task.train_batch(0, 8)
    assert b.x.shape == (8, 12, 10) and b.y.shape == (8, 2, 10)
    strings, query = b.x[:, :10].reshape(8, 5, 20), b.x[:, 10:].reshape(8, 20)
    target = b.y.reshape(8, 20)
    for i in range(8):
        shown = query[i] != 0
        assert any((strings[i, k] > 0).long().equal(target[i]) for k in range(5))
        assert torch.equal(query[i][shown], (target[i][shown] * 2 - 1).float())
    with pytest.raises(ConfigError, match="--bit-memory-patch: must divide"):
        TrialConfig.from_flat({"task": "bit-memory", "bit_memory_bits": 20, "bit_memory_patch": 3})


def test_bit_test_set_size(configs):
    assert build_task(configs["bit-xor"], 0).test_size() == 2 * 32


# ---------------------------------------------------------------- listops


def reference_value(source: str) -> int:
    """An independent evaluator: recursive descent over the LRA token strings."""
    tokens = [t for t in source.split() if t not in "()"]

    def parse(i: int) -> tuple[int, int]:
        if not tokens[i].startswith("["):
            return int(tokens[i]), i + 1
        op, i, args = tokens[i], i + 1, []
        while tokens[i] != "]":
            value, i = parse(i)
            args.append(value)
        result = {
            "[MAX": max,
            "[MIN": min,
            "[MED": lambda a: int(statistics.median(a)),
            "[SM": lambda a: sum(a) % 10,
        }[op](args)
        return result, i + 1

    value, end = parse(0)
    assert end == len(tokens)
    return value


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[SM 5 6 ]", 1),
        ("[MED 1 2 3 ]", 2),
        ("[MED 1 2 ]", 1),  # LRA's int(np.median): 1.5 -> 1
        ("[MED 4 [SM 9 9 ] 1 7 ]", 5),
        ("[MIN [MAX 1 2 ] [SM 3 4 5 ] ]", 2),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),
    ],
)
def test_listops_evaluator(expression, value):
    assert reference_value(expression) == value
    assert evaluate(tokenize(expression, 1000)) == value


def test_listops_generated_values_are_exact(configs):
    task = build_task(configs["listops"], 0)
    batches = [task.train_batch(s, 8) for s in range(6)] + list(task.test_batches(16))
    for b in batches:
        for ids, n, y in zip(b.x, b.lengths, b.y.view(-1), strict=True):
            source = " ".join(VOCAB[t] for t in ids[:n].tolist())
            assert reference_value(source) == int(y), source


def test_listops_generator_respects_its_limits():
    config = TaskConfig(
        task="listops", max_length=128, listops_max_depth=3, listops_max_args=4, test_batches=2
    )
    b = next(build_task(config, 0).test_batches(64))
    assert int(b.lengths.max()) <= 128
    for ids, n in zip(b.x, b.lengths, strict=True):
        depth = max_args = 0
        open_args: list[int] = []
        for t in (VOCAB[i] for i in ids[:n].tolist()):
            if t.startswith("["):
                if open_args:
                    open_args[-1] += 1
                open_args.append(0)
                depth = max(depth, len(open_args))
            elif t == "]":
                assert open_args.pop() >= 2
            else:
                open_args[-1] += 1
            max_args = max(max_args, open_args[-1] if open_args else 0)
        assert depth <= 3 - 1 and max_args <= 4  # digits sit at depth 3


def test_listops_generated_training_set_is_shared_and_epoch_permuted(configs):
    config = configs["listops"]  # 50 training expressions
    seen = [set(), set()]
    for seed in (0, 1):
        task = build_task(config, seed)
        for step in range(5):  # 5 * 10 = one epoch
            b = task.train_batch(step, 10)
            seen[seed].update(
                tuple(row[:n].tolist()) for row, n in zip(b.x, b.lengths, strict=True)
            )
    # Both trials read the same 50 expressions, each once (distinct up to chance repeats).
    assert seen[0] == seen[1] and len(seen[0]) >= 45


def test_listops_generation_is_fast():
    config = TaskConfig(task="listops", listops_train_size=20000, test_batches=1)
    task = build_task(config, 0)
    # CPU time, not wall time: on a shared or busy machine the wall clock measures the others.
    start = time.process_time()
    for step in range(100):
        task.train_batch(step, 8)
    assert time.process_time() - start < 2.0  # 800 expressions of up to 512 tokens


def test_listops_lra_files(lra_dir):
    config = TaskConfig(task="listops", data_dir=str(lra_dir), max_length=7)
    task = build_task(config, 0)
    # Training reads basic_train (each row once per epoch), tokens without the parentheses.
    b = task.train_batch(0, len(LRA_TRAIN))
    rows = {}
    for ids, n, y in zip(b.x, b.lengths, b.y.view(-1), strict=True):
        rows[tuple(VOCAB[t] for t in ids[:n].tolist())] = int(y)
    expected = {}
    for source, target in LRA_TRAIN:
        tokens = [t if t in VOCAB else "<unk>" for t in source.split() if t not in "()"]
        expected[tuple(tokens[:7])] = target
    assert rows == expected
    assert max(len(t) for t in expected) == 7  # the MIN/MAX row was cut to max_length
    # Validation is LRA's basic_val, test its basic_test, each in order.
    (val,) = task.eval_batches("val", 10)
    assert val.y.view(-1).tolist() == [3, 8]
    assert [VOCAB[t] for t in val.x[0, : val.lengths[0]].tolist()] == ["[MIN", "3", "8", "]"]
    assert val.x.shape == (2, 7)
    (test,) = task.test_batches(10)
    assert test.y.view(-1).tolist() == [5, 7, 0]
    limited = TaskConfig(
        task="listops", data_dir=str(lra_dir), max_length=7, test_limit=1, val_limit=1
    )
    assert build_task(limited, 0).test_size() == 1
    assert build_task(limited, 0).eval_size("val") == 1


# ---------------------------------------------------------------- images


def expected_tokens(image: np.ndarray, patch: int) -> np.ndarray:
    """Tokens of one (H, W, C) image, by the documented layout, with explicit loops."""
    H, W, C = image.shape
    tokens = np.zeros(((H // patch) * (W // patch), patch * patch * C), np.float32)
    for r in range(H):
        for c in range(W):
            for ch in range(C):
                token = (r // patch) * (W // patch) + c // patch
                feature = ((r % patch) * patch + c % patch) * C + ch
                tokens[token, feature] = image[r, c, ch] / 255
    return tokens


def test_mnist_tokens_as_stored(mnist_data):
    (splits, path) = mnist_data
    task = build_task(TaskConfig(task="mnist", data_dir=str(path)), 0)  # 49: the reference
    b = task.train_batch(0, 9)
    assert b.x.shape == (9, 49, 16) and task.spec.n_tokens == 49
    for x, y in zip(b.x, b.y.view(-1), strict=True):
        image = splits["train"][0][int(y)][:, :, None]
        assert torch.allclose(x, torch.from_numpy(expected_tokens(image, 4)))


def test_mnist_tokens_padded(mnist_data):
    (splits, path) = mnist_data
    task = build_task(TaskConfig(task="mnist", data_dir=str(path), mnist_tokens=64), 0)
    b = task.train_batch(0, 9)  # one epoch: the 9 images not held out (image 4 is)
    for x, y in zip(b.x, b.y.view(-1), strict=True):
        image = splits["train"][0][int(y)]  # labels are the indices
        padded = np.pad(image, 2)[:, :, None]  # 28x28 -> 32x32, zeros around
        assert torch.allclose(x, torch.from_numpy(expected_tokens(padded, 4)))
    # Image 0 is black but for pixel (0, 0) = 255 and (27, 27) = 51: after the 2-pixel pad
    # they sit at (2, 2) in token 0 and (29, 29) in token 63.
    (x0,) = [x for x, y in zip(b.x, b.y.view(-1), strict=True) if int(y) == 0]
    assert x0.nonzero().tolist() == [[0, 2 * 4 + 2], [63, 1 * 4 + 1]]
    assert x0[0, 10] == 1.0 and x0[63, 5] == pytest.approx(0.2)
    # No augmentation for MNIST: the same image always gives the same tokens.
    assert not task.augment


def test_cifar_tokens_and_test_split(cifar_data):
    splits, path = cifar_data
    task = build_task(TaskConfig(task="cifar10", data_dir=str(path), normalize=False), 0)
    test = next(task.test_batches(100))
    images, labels = splits["test"]
    assert test.y.view(-1).tolist() == labels.tolist()
    for x, image in zip(test.x, images, strict=True):
        assert torch.allclose(x, torch.from_numpy(expected_tokens(image, 4)))
    # Test image 0 is black but for pixel (row 5, col 9), blue: token 1*8 + 2, feature
    # (row 1, col 1 within the patch) -> (1*4 + 1)*3 + 2.
    assert test.x[0].nonzero().tolist() == [[10, 17]]
    limited = TaskConfig(task="cifar10", data_dir=str(path), test_limit=2)
    assert build_task(limited, 0).test_size() == 2


def test_cifar_lra_is_greyscale_pixels(cifar_data):
    splits, path = cifar_data
    task = build_task(TaskConfig(task="cifar10-lra", data_dir=str(path), normalize=False), 0)
    test = next(task.test_batches(100))
    rgb = splits["test"][0].astype(np.float64) / 255
    grey = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    expected = torch.from_numpy(grey.reshape(5, 1024, 1)).float()
    assert torch.allclose(test.x, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "mean", "std"),
    [
        ("cifar10", [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
        ("cifar10-lra", [0.5], [0.5]),
    ],
)
def test_images_are_normalised_as_the_reference_by_default(cifar_data, name, mean, std):
    """Each channel: (pixel / 255 - mean) / std, the reference code's values; training
    batches are normalised after the augmentation (the augmented [0, 1] batch, normalised)."""
    _, path = cifar_data
    plain = build_task(TaskConfig(task=name, data_dir=str(path), normalize=False), 0)
    task = build_task(TaskConfig(task=name, data_dir=str(path)), 0)
    mean, std = torch.tensor(mean), torch.tensor(std)

    def normalised(x: torch.Tensor) -> torch.Tensor:  # features: (pixel, channel innermost)
        return ((x.unflatten(-1, (-1, len(mean))) - mean) / std).flatten(-2)

    for raw, x in zip(plain.test_batches(100), task.test_batches(100), strict=True):
        assert torch.allclose(x.x, normalised(raw.x), atol=1e-6)
    raw, x = plain.train_batch(2, 6), task.train_batch(2, 6)
    assert torch.allclose(x.x, normalised(raw.x), atol=1e-6)
    assert float(x.x.min()) < 0  # black pixels sit below the mean


def test_mnist_is_left_unscaled_as_the_reference(mnist_data):
    _, path = mnist_data
    on = build_task(TaskConfig(task="mnist", data_dir=str(path)), 0)
    off = build_task(TaskConfig(task="mnist", data_dir=str(path), normalize=False), 0)
    assert torch.equal(on.train_batch(0, 9).x, off.train_batch(0, 9).x)


@pytest.mark.parametrize("name", ["cifar10", "cifar10-lra"])
def test_augmentation(cifar_data, name):
    _, path = cifar_data
    on = build_task(TaskConfig(task=name, data_dir=str(path), normalize=False), 0)
    off = build_task(TaskConfig(task=name, data_dir=str(path), augment=False, normalize=False), 0)
    a, plain = on.train_batch(3, 12), off.train_batch(3, 12)
    assert torch.equal(a.y, plain.y)  # augmentation leaves the data order alone
    assert torch.equal(a.x, on.train_batch(3, 12).x)  # deterministic per step
    assert not torch.equal(a.x, on.train_batch(4, 12).x)
    assert not torch.equal(a.x, plain.x)
    assert float(a.x.min()) >= 0 and float(a.x.max()) <= 1 + 1e-5
    # augment=False gives the stored images themselves.
    indices = epoch_indices(off.data_seed, 3, 12, len(off.train_images))
    assert torch.equal(plain.x, off.tokens(off.train_images[indices]))
    for t, u in zip(on.test_batches(4), off.test_batches(4), strict=True):
        assert torch.equal(t.x, u.x)


def test_augmentation_is_a_shift_flip_and_rotation():
    from scale_fpt.tasks import images

    x = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    # Without rotation every output is the input shifted by whole pixels (the crop, zeros
    # coming in), maybe mirrored: check it exactly against all 9 * 9 * 2 candidates.
    out = images.augment(x, Draws(1), degrees=0.0)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    seen = set()
    for i in range(len(x)):
        matches = [
            (dy, dx, flip)
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
            if torch.allclose(
                out[i],
                padded[i, :, dy : dy + 32, dx : dx + 32].flip(-1)
                if flip
                else padded[i, :, dy : dy + 32, dx : dx + 32],
                atol=1e-5,
            )
        ]
        assert matches, i
        seen.update(matches)
    assert {m[2] for m in seen} == {False, True} and len(seen) > 20
    # With rotation the image is resampled: no longer an exact crop.
    rotated = images.augment(x[:1], Draws(1), degrees=20.0)
    assert not any(
        torch.allclose(rotated[0], padded[0, :, dy : dy + 32, dx : dx + 32], atol=1e-3)
        for dy in range(9)
        for dx in range(9)
    )


@pytest.mark.parametrize("layout", ["disk", "folders", "hf"])
def test_image_layouts_load_the_same_data(tmp_path, mnist_data, layout):
    splits, _ = mnist_data
    path = write_images(tmp_path / layout, splits, "image", layout)
    task = build_task(TaskConfig(task="mnist", data_dir=str(path)), 0)
    stored = torch.from_numpy(splits["train"][0])
    assert torch.equal(task.train_images[..., 0], stored[task.train_index])
    assert task.eval_sets["test"][1].tolist() == splits["test"][1].tolist()


# ---------------------------------------------------------------- homology


def test_homology_drops_sequences_longer_than_max_length(tape_dir):
    config = TaskConfig(task="homology", data_dir=str(tape_dir), max_length=6)  # the reference
    task = build_task(config, 0)
    kept = [(p, f) for p, f in PROTEINS["train"] if len(p) <= 6]
    b = task.train_batch(0, len(kept))
    assert sorted(b.y.view(-1).tolist()) == sorted(f for _, f in kept) and len(kept) == 5
    (test,) = task.test_batches(10)
    assert test.y.view(-1).tolist() == [6, 0]  # PEPTIDE (7 letters) is dropped


def test_homology_json(tape_dir):
    config = TaskConfig(
        task="homology", data_dir=str(tape_dir), max_length=6, homology_long="truncate"
    )
    task = build_task(config, 0)
    assert task.spec.vocab_size == 2 + 25 and task.spec.n_classes == 1195
    letter = {a: i + 2 for i, a in enumerate(AMINO_ACIDS)}
    n = len(PROTEINS["train"])
    b = task.train_batch(0, n)  # one epoch: every training protein once
    assert b.x.shape == (n, 6)  # padded to the longest in the batch, which was cut to 6
    got = sorted(
        (x[:n].tolist(), int(y)) for x, n, y in zip(b.x, b.lengths, b.y.view(-1), strict=True)
    )
    want = sorted(
        ([letter.get(a, UNK) for a in p[:6]], f) for p, f in PROTEINS["train"]
    )  # "J" is not a TAPE letter
    assert got == want
    # The test set is test_fold_holdout in order, each batch padded to its own longest.
    first, second = task.test_batches(2)
    assert first.x.shape == (2, 6) and second.x.shape == (1, 4)
    assert first.y.view(-1).tolist() == [5, 6] and first.lengths.tolist() == [6, 2]
    limited = TaskConfig(task="homology", data_dir=str(tape_dir), test_limit=2)
    assert build_task(limited, 0).test_size() == 2


def test_homology_lmdb(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    for split, rows in PROTEINS.items():
        env = lmdb.open(str(tmp_path / f"remote_homology_{split}.lmdb"), map_size=1 << 20)
        with env.begin(write=True) as txn:
            for i, (p, f) in enumerate(rows):
                txn.put(str(i).encode(), pickle.dumps({"primary": p, "fold_label": f}))
            txn.put(b"num_examples", pickle.dumps(len(rows)))
        env.close()
    task = build_task(TaskConfig(task="homology", data_dir=str(tmp_path)), 0)
    assert next(task.test_batches(10)).y.view(-1).tolist() == [5, 6, 0]


# ---------------------------------------------------------------- missing data


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("listops", "basic_train.tsv"),
        ("homology", "remote_homology_train.json"),
        ("mnist", "train-*.parquet"),
        ("cifar10-lra", "save_to_disk"),
    ],
)
def test_missing_data_is_one_line(tmp_path, hf_cache, task, expected):
    with pytest.raises(DataUnavailable) as info:
        build_task(TaskConfig(task=task, data_dir=str(tmp_path)), 0)
    message = str(info.value)
    assert "\n" not in message and expected in message and "--data-dir" in message
    assert message.startswith(task.split("-")[0])
    assert info.value.problems == [message]


def test_homology_without_data_dir():
    with pytest.raises(DataUnavailable, match="--data-dir"):
        build_task(TaskConfig(task="homology"), 0)


def test_hub_offline_is_data_unavailable(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    # An empty cache: a copy cached on this machine must not make the load succeed.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    start = time.monotonic()
    with pytest.raises(DataUnavailable) as info:
        build_task(TaskConfig(task="mnist"), 0)
    assert time.monotonic() - start < 10
    assert str(info.value) == (
        "mnist: could not load 'ylecun/mnist' from the Hugging Face hub (offline?); pass "
        "--data-dir with a saved copy (datasets save_to_disk directory or Parquet files)"
    )


# ---------------------------------------------------------------- preprocessing declared


def test_preprocessing_is_declared_beside_paper_and_reference():
    from scale_fpt.tasks.preprocessing import deviations, preprocessing

    names = [
        "sequence length", "split", "truncation", "augmentation", "normalisation", "input dropout"
    ]  # fmt: skip
    for task in ALL_TASKS:
        aspects = preprocessing(TrialConfig.from_flat({"task": task}))
        assert [a.name for a in aspects] == names, task
        assert all(a.here and a.paper and a.reference for a in aspects)

    def deviating(**flat) -> list[str]:
        return [d.split(":")[0] for d in deviations(TrialConfig.from_flat(flat))]

    # Defaults follow the reference where the paper is silent; what still differs is declared.
    assert deviating(task="bit-xor") == []
    assert deviating(task="mnist") == ["split"]  # the held-out validation slice
    assert deviating(task="cifar10") == ["split"]
    assert deviating(task="listops") == ["split", "truncation"]  # generated, not LRA files
    assert deviating(task="homology") == ["split"]  # TAPE valid is the paper's "test"
    # The other choice of each flag is a declared deviation.
    assert deviating(task="mnist", mnist_tokens=64) == ["sequence length", "split"]
    assert deviating(task="cifar10", rotation_degrees=10.0) == ["split", "augmentation"]
    assert deviating(task="cifar10", augment=False) == ["split", "augmentation"]
    assert deviating(task="cifar10", normalize=False) == ["split", "normalisation"]
    assert deviating(task="mnist", normalize=False) == ["split"]  # the reference's is none
    assert deviating(task="homology", homology_long="truncate") == ["split", "truncation"]
    assert deviating(task="bit-memory", input_dropout=False) == ["input dropout"]
    small = {"task": "bit-memory", "bit_memory_bits": 20, "bit_memory_patch": 20}
    assert deviating(**small) == ["sequence length"]  # the laptop study's smaller variant
    assert deviating(task="bit-xor", dropout=0.2) == ["input dropout"]
    assert deviating(task="listops", input_dropout=False) == ["split", "truncation"]
    (text,) = deviations(TrialConfig.from_flat({"task": "mnist", "mnist_tokens": 64}))[:1]
    assert text == (
        "sequence length: 64 tokens x 16 (4x4 patches, padded to 32x32) "
        "(published: 49 tokens x 16 (28x28 in 4x4 patches))"
    )
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_flat({"mnist_tokens": 50, "homology_long": "cut", "rotation_degrees": -1})
    assert all(f in str(e.value) for f in ("--mnist-tokens", "--homology-long", "--rotation"))


# ---------------------------------------------------------------- a task added from outside

TOY_TASK = '''
"""Bit AND: two random bits, the second token predicts their AND."""

import torch

from scale_fpt.tasks.base import Batch, Task, TaskSpec, split_batch, step_draws, synthetic_eval_set
from scale_fpt.tasks.aspects import NO_NORMALISATION, Aspect, input_dropout


class BitAnd(Task):
    name = "bit-and"

    @classmethod
    def spec_for(cls, config):
        return TaskSpec(2, 1, 0, 1, 1, 2)

    @classmethod
    def preprocessing(cls, config):
        same = [Aspect(a, "none", "none", "none", True) for a in ("split", "truncation")]
        length = Aspect("sequence length", "2 tokens x 1 bit", "none", "none", True)
        augmentation = Aspect("augmentation", "none", "none", "none", True)
        return [length, *same, augmentation, NO_NORMALISATION, input_dropout(config, True)]

    def __init__(self, config, seed):
        super().__init__(config, seed)
        self.spec = self.spec_for(config)

    def sample(self, n, draws):
        bits = draws.randint(0, 2, (n, 2))
        return Batch(bits.float().unsqueeze(-1), (bits[:, :1] & bits[:, 1:]).unsqueeze(-1))

    def train_batch(self, step, batch_size):
        return self.sample(batch_size, step_draws(self.data_seed, step, 0, self.device))

    def eval_batches(self, split, batch_size):
        seed, n = synthetic_eval_set(self.config, split)
        return split_batch(self.sample(8 * n, step_draws(seed, 0, 1, self.device)), batch_size)
'''


def test_a_task_added_as_its_module_and_one_registry_line_plans_trains_and_reports(
    tmp_path, monkeypatch, capsys, scale_fpt_home
):
    from scale_fpt import cli
    from scale_fpt.preflight import preflight_problems
    from scale_fpt.task_registry import Baseline, TaskEntry

    (tmp_path / "toy_bit_and.py").write_text(TOY_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        TASKS, "bit-and", TaskEntry("toy_bit_and:BitAnd", Baseline(75.0, "75% answering 0"))
    )
    arm = ["--task", "bit-and", "--model", "gpt2-tiny", "--init", "random", "--accelerator", "cpu"]

    assert cli.main(["plan", *arm]) == 0
    out = capsys.readouterr().out
    assert "preprocessing of bit-and" in out and "2 tokens x 1 bit" in out

    assert preflight_problems([{"task": "bit-and", "model": "gpt2-tiny", "init": "random"}]) == []

    results = tmp_path / "results"
    steps = ["--steps", "20", "--eval-every", "10", "--val-batches", "2", "--test-batches", "2"]
    assert cli.main(["train", *arm, *steps, "--no-progress", "--results", str(results)]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["status"] == "completed" and row["steps_done"] == 20

    assert cli.main(["report", str(results), "--no-attention"]) == 0
    report = (results / "report" / "report.md").read_text()
    assert "bit-and" in report and "bit-and 75% answering 0" in report
