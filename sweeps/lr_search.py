"""Learning-rate-fair comparison: each arm (frozen fpt vs full fine-tuning, pretrained vs
random) at its own best learning rate (Rothermel et al. 2021's critique of the paper's
single lr of 1e-3), chosen on validation over three seeds and then re-run on three fresh
confirmation seeds that took no part in the choice (the table's headline).

Launch:
    python sweeps/lr_search.py                   # local preset: CPU, offline
    python sweeps/lr_search.py --preset local-grid   # the same on a shared lr grid
    python sweeps/lr_search.py --resume          # continue: the Optuna studies continue too
    ray submit cluster/gpu.yaml sweeps/lr_search.py -- --preset paper \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray \
        --optuna-storage postgresql://USER:PASS@HOST/optuna

Each searched arm gets its own Optuna study (``<sweep>-<arm>``) in the Optuna storage (an
SQLite file under the results directory by default): inspect it with Optuna's own tools, e.g.
``optuna-dashboard sqlite:///results/lr-search-local/optuna.db``. Every configuration is
trained for seeds 0-2 and scored on its seed mean of best_val_accuracy (a failed or
diverged seed fails it); once every arm is done, each arm's best configuration trains on
seeds 3-5 as the sweep ``<name>-confirm``.

Presets:
    local       gpt2-tiny on bit-xor: fpt vs full x pretrained vs random; Optuna (TPE) over
                lr in [1e-5, 1e-2], 4 configurations per arm; seeds 0-2, confirmation 3-5.
    local-grid  the same arms on one shared log-spaced grid: lr 1e-5, 1e-4, 1e-3, 1e-2.
    paper       gpt2 on all seven tasks: fpt vs full x pretrained vs random; lr in
                [1e-6, 1e-2] and batch size in {4, 8, 16}, 12 configurations per arm,
                seeds 0-2, confirmation 3-5, ASHA off (the searcher sees full-length runs
                only). Frozen arms train the task's budget (study.PAPER_STEPS); full arms to
                convergence (patience in steps) within twice it.
    paper-grid  the paper's arms on a shared grid: lr 1e-6, 3e-6, ..., 3e-3, 1e-2 (9 rates),
                batch size 8.
"""

import dataclasses
import sys

from scale_fpt.study import PAPER_GPU, PAPER_STEPS, paper_overrides, study_main
from scale_fpt.sweep import SweepConfig

SEEDS = (0, 1, 2)
CONFIRM_SEEDS = (3, 4, 5)
FINETUNES = ["fpt", "full"]


def local() -> SweepConfig:
    return SweepConfig(
        name="lr-search-local",
        base={"task": "bit-xor", "model": "gpt2-tiny", "max_steps": 600, "eval_every": 200},
        grid={"finetune": FINETUNES, "init": ["pretrained", "random"]},
        search={"lr": ("loguniform", 1e-5, 1e-2)},
        search_trials=4,
        seeds=SEEDS,
        confirm_seeds=CONFIRM_SEEDS,
        max_concurrent=2,
    )


def local_grid() -> SweepConfig:
    sweep = local()
    return dataclasses.replace(
        sweep,
        name="lr-grid-local",
        grid={**sweep.grid, "lr": [1e-5, 1e-4, 1e-3, 1e-2]},
        search={},
    )


def paper() -> SweepConfig:
    return SweepConfig(
        name="lr-search-paper",
        base={"model": "gpt2", "eval_every": 1000, "precision": "bf16"},
        grid={"task": list(PAPER_STEPS), "finetune": FINETUNES, "init": ["pretrained", "random"]},
        search={"lr": ("loguniform", 1e-6, 1e-2), "batch_size": ("choice", [4, 8, 16])},
        search_trials=12,
        seeds=SEEDS,
        confirm_seeds=CONFIRM_SEEDS,
        overrides=paper_overrides(FINETUNES),
        max_concurrent=8,
        gpus_per_trial="auto",
        gpu=PAPER_GPU,
        max_failures=3,
    )


def paper_grid() -> SweepConfig:
    sweep = paper()
    return dataclasses.replace(
        sweep,
        name="lr-grid-paper",
        base={**sweep.base, "batch_size": 8},
        grid={**sweep.grid, "lr": [1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2]},
        search={},
        # The grid sets every lr: the paper's per-task rate (homology 1e-4) is one of them.
        overrides=tuple((m, v) for m, v in sweep.overrides if "lr" not in v),
    )


if __name__ == "__main__":
    sys.exit(
        study_main(
            __doc__,
            {"local": local, "local-grid": local_grid, "paper": paper, "paper-grid": paper_grid},
        )
    )
