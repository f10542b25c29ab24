"""What the report treats as one arm, and pooling across sweeps only on request."""

from __future__ import annotations

import pytest
from test_report import write

from scale_fpt import cli, report
from scale_fpt.report import tables
from scale_fpt.results import ResultsWriter, load_results


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    """The same setting in two sweeps (seeds 0-1 each), and a bf16 arm in the first."""
    root = tmp_path_factory.mktemp("arms")
    scale, finetune = ResultsWriter(root, "scale"), ResultsWriter(root, "finetune")
    for seed, acc in enumerate([0.5, 0.7]):
        write(scale, f"s-{seed}", acc, seed=seed)
        write(finetune, f"f-{seed}", acc + 0.1, seed=seed)
        write(scale, f"bf16-{seed}", 0.9, seed=seed, precision="bf16")
    return root


def test_every_field_that_changes_a_trial_is_part_of_its_arm(two_sweeps):
    t2 = report.table2_init(load_results(two_sweeps).trials)
    xor = t2[t2["task"] == "bit-xor"].set_index("row")
    # Three cells: two sweeps are never pooled; bf16 is not the fp32 arm.
    assert sorted(xor["n"]) == [2, 2, 2]
    assert set(xor["sweep"]) == {"scale", "finetune"}
    assert {"precision", "patience", "augment", "eval_every", "max_length"} <= set(tables.ARM_KEYS)
    assert "seed" not in tables.ARM_KEYS and "zero_stage" not in tables.ARM_KEYS
    # Row labels name what differs between cells shown in one place.
    assert any("bf16" in row for row in xor.index) and any("finetune" in r for r in xor.index)


def test_pool_merges_sweeps_and_the_report_says_so(two_sweeps, tmp_path):
    pooled = tables.pool_sweeps(load_results(two_sweeps).trials)
    assert set(pooled["sweep"]) == {"pooled: finetune+scale"}
    t2 = report.table2_init(pooled)
    fp32 = t2[(t2["task"] == "bit-xor") & (t2["precision"] == "fp32")]
    assert len(fp32) == 1 and fp32.iloc[0]["n"] == 4
    assert fp32.iloc[0]["mean"] == pytest.approx(65.0)
    out = tmp_path / "r"
    args = ["report", str(two_sweeps), "--out", str(out), "--no-attention"]
    assert cli.main([*args, "--pool"]) == 0
    assert (
        "**Pooled (--pool):** the trials of 2 sweeps (finetune, scale)"
        in (out / "report.md").read_text()
    )
