"""Learning-rate-fair comparison: an Optuna search of learning rate (and batch size) per arm,
so each arm (frozen fpt vs full fine-tuning, pretrained vs random) is compared at its own
best learning rate (Rothermel et al. 2021's critique of the paper's single lr of 1e-3).

Launch:
    python sweeps/lr_search.py                   # local preset: CPU, offline, ~10 min
    python sweeps/lr_search.py --resume          # continue: the Optuna studies continue too
    ray submit cluster/gpu.yaml sweeps/lr_search.py -- --preset paper \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray \
        --optuna-storage postgresql://USER:PASS@HOST/optuna

Each arm gets its own Optuna study (``<sweep>-<arm>``) in the Optuna storage (an SQLite file
under the results directory by default): inspect it with Optuna's own tools, e.g.
``optuna-dashboard sqlite:///results/lr-search-local/optuna.db``.

Presets:
    local  gpt2-tiny on bit-xor: fpt vs full x pretrained vs random; lr in [1e-5, 1e-2].
    paper  gpt2 on all seven tasks: fpt vs full x pretrained vs random; lr in [1e-6, 1e-2]
           and batch size in {4, 8, 16}, 12 trials per arm, ASHA off (the searcher sees
           full-length runs only).
"""

import sys

from scale_fpt.study import PAPER_GPU, paper_overrides, study_main
from scale_fpt.sweep import SweepConfig


def local() -> SweepConfig:
    return SweepConfig(
        name="lr-search-local",
        base={"task": "bit-xor", "model": "gpt2-tiny", "max_steps": 600, "eval_every": 200},
        grid={"finetune": ["fpt", "full"], "init": ["pretrained", "random"]},
        search={"lr": ("loguniform", 1e-5, 1e-2)},
        search_trials=4,
        max_concurrent=2,
    )


def paper() -> SweepConfig:
    from scale_fpt.study import PAPER_STEPS

    return SweepConfig(
        name="lr-search-paper",
        base={"model": "gpt2", "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": list(PAPER_STEPS),
            "finetune": ["fpt", "full"],
            "init": ["pretrained", "random"],
        },
        search={"lr": ("loguniform", 1e-6, 1e-2), "batch_size": ("choice", [4, 8, 16])},
        search_trials=12,
        overrides=paper_overrides(),
        max_concurrent=8,
        gpus_per_trial="auto",
        gpu=PAPER_GPU,
        max_failures=3,
    )


if __name__ == "__main__":
    sys.exit(study_main(__doc__, {"local": local, "paper": paper}))
