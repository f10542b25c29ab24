"""Confirmation runs: which configuration each arm confirms, on which seeds, under which
sweep name (scale_fpt.sweep.confirm), and the sweep fields that declare them."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from test_report import write

from scale_fpt.cluster import GPUOffer
from scale_fpt.config import ConfigError
from scale_fpt.packing import Devices
from scale_fpt.results import ResultsWriter
from scale_fpt.sweep import SweepConfig, placement_on, plan_sweep
from scale_fpt.sweep.confirm import (
    chosen_arms,
    confirmation,
    confirmation_arms,
    confirmation_sweep,
)

SWEEP = SweepConfig(
    name="lr",
    base={"task": "bit-xor", "model": "gpt2-tiny"},
    grid={"init": ["pretrained", "random"], "lr": [1e-3, 1e-2]},
    seeds=(0, 1, 2),
    confirm_seeds=(10, 11),
)


def choose(trials: pd.DataFrame) -> tuple[SweepConfig, list[dict], list[str]]:
    """(The confirmation sweep of ``SWEEP``, its arms with their chosen lr, the arms with
    none) from the sweep's rows ``trials``."""
    choice = SWEEP.choice_fields()
    confirm = confirmation_sweep(SWEEP, choice)
    arms = confirmation_arms(confirm, choice)
    return confirm, *chosen_arms(arms, trials, choice, SWEEP.seeds, SWEEP.metric)


def rows(init: str, lr: float, scores, statuses=("completed",) * 3) -> list[dict]:
    return [
        {"task": "bit-xor", "model": "gpt2-tiny", "init": init, "lr": lr, "seed": seed,
         "status": status, "best_val_accuracy": score}
        for seed, (score, status) in enumerate(zip(scores, statuses, strict=True))
    ]  # fmt: skip


def test_each_arm_confirms_its_best_configuration_that_completed_every_seed():
    trials = pd.DataFrame(
        rows("pretrained", 1e-3, [0.8, 0.8, 0.8])
        + rows("pretrained", 1e-2, [0.99, 0.5, 0.5], ("completed", "diverged", "diverged"))
        + rows("random", 1e-3, [0.6, 0.6, 0.6])
        + rows("random", 1e-2, [0.7, 0.7, 0.7])
    )
    confirm, arms, unchosen = choose(trials)
    assert unchosen == []
    chosen = {(a["init"], a["seed"]): a["lr"] for a in arms}
    assert chosen == {
        ("pretrained", 10): 1e-3,  # 1e-2 lost two seeds: its survivor's 0.99 does not count
        ("pretrained", 11): 1e-3,
        ("random", 10): 1e-2,
        ("random", 11): 1e-2,
    }
    assert confirm.name == "lr-confirm" and confirm.seeds == (10, 11)
    assert confirm.grid == {"init": ["pretrained", "random"]} and not confirm.confirm_seeds


def test_an_arm_whose_every_configuration_lost_a_seed_is_named_not_confirmed():
    trials = pd.DataFrame(
        rows("pretrained", 1e-3, [0.8, 0.8, 0.8])
        + rows("random", 1e-3, [0.6, 0.6, 0.6], ("completed", "failed", "completed"))
        + rows("random", 1e-2, [0.7, 0.7], ("completed", "completed"))  # seed 2 never ran
    )
    _, arms, unchosen = choose(trials)
    assert {a["init"] for a in arms} == {"pretrained"}
    assert unchosen == ["bit-xor/gpt2-tiny/random"]


def test_the_confirmation_chooses_from_the_trial_rows_its_sweeps_writer_reads(tmp_path):
    """The driver's writer reads its sweep's trial rows back, compacted or not, each trial
    once: the confirmation chooses from them. A row claiming another sweep is left out,
    though it would complete the random arm's lr 1e-2 with the best mean."""
    writer = ResultsWriter(tmp_path, SWEEP.name)
    runs = [("pretrained", 1e-3, 0.8), ("pretrained", 1e-2, 0.9), ("random", 1e-3, 0.6)]
    for init, lr, score in runs:
        for seed in SWEEP.seeds:
            write(writer, f"{init}-{lr}-{seed}", score, init=init, lr=lr, seed=seed,
                  model="gpt2-tiny", task="bit-xor")  # fmt: skip
    writer.compact()
    for seed in (0, 1):  # seed 2 never ran: lr 1e-2 completed no configuration of random
        write(writer, f"random-0.01-{seed}", 0.7, init="random", lr=1e-2, seed=seed,
              model="gpt2-tiny", task="bit-xor")  # fmt: skip
    other = ResultsWriter(tmp_path, "other")
    write(other, "planted", 0.99, init="random", lr=1e-2, seed=2, model="gpt2-tiny", task="bit-xor")
    os.replace(
        other.root / "trials" / "planted.parquet", writer.root / "trials" / "planted.parquet"
    )
    rows = writer.trial_rows()
    assert rows["trial_id"].to_pylist() == sorted(rows["trial_id"].to_pylist())
    assert len(rows) == 11 and set(rows["sweep"].to_pylist()) == {SWEEP.name}
    # The driver's confirmation: chosen from what the writer reads, planned where the sweep
    # ran, written beside it.
    placement = placement_on(SWEEP, GPUOffer(None, 0, "none"), Devices(0, 1, 0))
    confirm = confirmation(plan_sweep(SWEEP, placement), writer)
    assert confirm.unchosen == [] and confirm.plan.sweep.name == "lr-confirm"
    assert confirm.plan.placement == placement
    assert len(confirm.plan.cohorts) == 4  # one slot without memory: nothing packs
    assert confirm.writer.root == tmp_path / "lr-confirm"
    chosen = {(a["init"], a["seed"]): a["lr"] for a in confirm.plan.arms}
    assert chosen == {
        ("pretrained", 10): 1e-2,
        ("pretrained", 11): 1e-2,
        ("random", 10): 1e-3,
        ("random", 11): 1e-3,
    }


def test_confirmation_seeds_are_fresh_and_confirm_a_choice():
    with pytest.raises(ConfigError) as e:
        SweepConfig(
            name="s", grid={"init": ["random"]}, seeds=(0, 1), confirm_seeds=(1, 2)
        ).validate()
    assert e.value.problems == [
        "confirm_seeds: [1] also choose the configuration (seeds); confirmation seeds must be "
        "fresh",
        "confirm_seeds: nothing is chosen to confirm; search a space or grid over lr, batch_size",
    ]
    SWEEP.validate()


@pytest.mark.slow
def test_a_sweep_confirms_its_choice_on_fresh_seeds_planned_where_it_ran(tmp_path):
    """Through a local Ray: the grid's choice of lr trains again on the confirmation seed,
    planned where the sweep ran (its placement), as the sweep ``<name>-confirm``."""
    from helpers import TINY_TRIAL

    from scale_fpt.results import load_results
    from scale_fpt.sweep import run_sweep

    sweep = SweepConfig(
        name="c",
        base={**TINY_TRIAL, "max_steps": 4, "eval_every": 2},
        grid={"lr": [1e-3, 1e-2]},
        seeds=(0,),
        confirm_seeds=(5,),
        results_dir=str(tmp_path),
        max_concurrent=2,
        gpus_per_trial="0",
        loggers=("none",),
    )
    outcome = run_sweep(sweep)
    assert outcome.finished and outcome.experiments == ["c", "c-confirm"]
    assert outcome.trials == 3  # two lrs on seed 0, the chosen one on seed 5
    chosen = load_results(str(tmp_path), "c").trials
    best = chosen.sort_values(["best_val_accuracy", "lr"], ascending=[False, True]).iloc[0]
    confirmed = load_results(str(tmp_path), "c-confirm").trials
    assert confirmed[["seed", "lr", "status"]].values.tolist() == [[5, best.lr, "completed"]]
