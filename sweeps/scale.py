"""Scaling study: model size x initialisation x task, frozen (paper Tables 1, 2 and 6).

Launch:
    python sweeps/scale.py                       # local preset: CPU, offline, ~10 min on 2 cores
    python sweeps/scale.py --resume              # continue an interrupted run
    ray submit cluster/gpu.yaml sweeps/scale.py -- --preset paper \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray

Presets:
    local  gpt2-tiny, language-pretrained (built locally on first use) vs random, frozen
           (fpt), on bit-xor, bit-memory and ListOps (expressions cut to 128 tokens), 3 seeds;
           prints pretrained - random on each task (accuracy and steps to the threshold)
           with a 95% Welch interval over the seeds.
    paper  gpt2, gpt2-medium, gpt2-large, pretrained vs random, frozen, all seven tasks,
           3 seeds, the paper's optimiser settings (Adam 1e-3, 1e-4 for homology).
Narrow either with --tasks/--models/--inits/--seeds/--steps (see --help).
"""

import sys

from scale_fpt.study import PAPER_GPU, PAPER_STEPS, paper_overrides, study_main
from scale_fpt.sweep import SweepConfig


def local() -> SweepConfig:
    return SweepConfig(
        name="scale-local",
        base={"model": "gpt2-tiny", "finetune": "fpt", "batch_size": 16},
        grid={"task": ["bit-xor", "bit-memory", "listops"], "init": ["pretrained", "random"]},
        seeds=(0, 1, 2),
        overrides=(
            ({"task": "bit-xor"}, {"max_steps": 2000, "eval_every": 100}),
            (
                {"task": "bit-memory"},
                {"max_steps": 300, "eval_every": 100, "test_batches": 8, "val_batches": 8},
            ),
            (
                {"task": "listops"},
                {
                    "max_steps": 400,
                    "eval_every": 100,
                    "max_length": 128,
                    "test_batches": 8,
                    "val_batches": 8,
                },
            ),
        ),
        max_concurrent=2,
    )


def paper() -> SweepConfig:
    return SweepConfig(
        name="scale-paper",
        base={"finetune": "fpt", "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": list(PAPER_STEPS),
            "model": ["gpt2", "gpt2-medium", "gpt2-large"],
            "init": ["pretrained", "random"],
        },
        seeds=(0, 1, 2),
        overrides=paper_overrides(),
        gpus_per_trial="auto",
        gpu=PAPER_GPU,
        max_failures=3,
    )


if __name__ == "__main__":
    sys.exit(study_main(__doc__, {"local": local, "paper": paper}))
