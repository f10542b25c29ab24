"""``train_examples``: a fixed training set per seed (the data-size axis)."""

import pytest
import torch

from scale_fpt.config import ConfigError, TaskConfig, TrialConfig
from scale_fpt.tasks import build_task


def rows(batch):
    return {tuple(r.tolist()) for r in batch.x.reshape(len(batch), -1)}


def test_pool_is_the_first_examples_reused_in_epochs():
    config = TaskConfig(task="bit-xor", train_examples=48, val_batches=1, test_batches=1)
    task, full = build_task(config, seed=3), build_task(TaskConfig(task="bit-xor"), seed=3)
    pooled = rows(task.pool())
    assert len(task.pool()) == 48
    first_epoch = [task.train_batch(step, 16) for step in range(3)]  # 3 x 16 = one epoch
    assert set().union(*map(rows, first_epoch)) == pooled  # each example once per epoch
    assert rows(task.train_batch(7, 16)) <= pooled  # later epochs reuse the same examples
    assert pooled <= rows(full.train_batch(0, 64))  # the first examples unlimited training sees
    other = build_task(config, seed=4)
    assert rows(other.pool()) != pooled  # each seed draws its own examples
    torch.testing.assert_close(
        next(task.eval_batches("val", 32)).x,
        next(build_task(config, seed=4).eval_batches("val", 32)).x,
    )
    cohort = task.cohort_batch(2, 16, [3, 4])
    torch.testing.assert_close(cohort.member(0).x, task.train_batch(2, 16).x)
    torch.testing.assert_close(cohort.member(1).x, other.train_batch(2, 16).x)


def test_listops_pool_keeps_lengths():
    config = TaskConfig(task="listops", train_examples=70, max_length=64, listops_train_size=200)
    batch = build_task(config, seed=0).train_batch(1, 8)
    assert batch.lengths is not None and batch.lengths.max() <= batch.x.shape[1] <= 64


def test_negative_train_examples_is_a_config_error():
    with pytest.raises(ConfigError, match="--train-examples: must be >= 0"):
        TrialConfig.from_flat({"train_examples": -1})
