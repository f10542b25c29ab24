"""Fine-tuning subsets: which parameter groups must train (paper Table 8 and the layer-norm
ablation: output only, +input, +positions, +layer norms, fpt, fpt+ff, fpt+attn, full).

Launch:
    python sweeps/finetune.py                    # local preset: CPU, offline, a few minutes
    ray submit cluster/gpu.yaml sweeps/finetune.py -- --preset paper \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray

Presets:
    local  gpt2-tiny language-pretrained (built locally on first use), bit-xor and
           bit-memory, every subset, 2 seeds.
    paper  gpt2 pretrained, all seven tasks, every subset, 3 seeds (10-12: none shared with
           scale-paper), lr 1e-3 (so fpt+attn diverges on some tasks as in the paper;
           diverged trials keep their last accuracy). Frozen-body subsets train the task's
           budget (study.PAPER_STEPS); fpt+ff, fpt+attn and full train to convergence
           (patience of 25% of that budget, in steps) within twice it.
"""

import sys

from scale_fpt.study import PAPER_GPU, PAPER_STEPS, paper_overrides, study_main
from scale_fpt.sweep import SweepConfig

SUBSETS = [
    "output",
    "input+output",
    "output+pos",
    "output+ln",
    "fpt",
    "fpt+ff",
    "fpt+attn",
    "full",
]


def local() -> SweepConfig:
    return SweepConfig(
        name="finetune-local",
        base={"model": "gpt2-tiny", "init": "pretrained", "batch_size": 16},
        grid={"task": ["bit-xor", "bit-memory"], "finetune": SUBSETS},
        seeds=(0, 1),
        overrides=(
            ({"task": "bit-xor"}, {"max_steps": 1000, "eval_every": 250}),
            (
                {"task": "bit-memory"},
                {"max_steps": 200, "eval_every": 100, "test_batches": 8, "val_batches": 8},
            ),
        ),
        max_concurrent=2,
    )


def paper() -> SweepConfig:
    return SweepConfig(
        name="finetune-paper",
        base={"model": "gpt2", "init": "pretrained", "batch_size": 8, "eval_every": 1000},
        grid={"task": list(PAPER_STEPS), "finetune": SUBSETS},
        # Seeds of their own: scale-paper's fpt arm is this sweep's fpt arm, and with the same
        # seeds the two would share every random stream (pseudo-replication if pooled).
        seeds=(10, 11, 12),
        overrides=paper_overrides(SUBSETS),
        gpus_per_trial="auto",
        gpu=PAPER_GPU,
        max_failures=3,
    )


if __name__ == "__main__":
    sys.exit(study_main(__doc__, {"local": local, "paper": paper}))
