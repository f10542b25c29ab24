"""Backbone families: Pythia (GPT-NeoX) and Llama-style bodies beside GPT-2, the pretraining-
amount axis (hub revisions) and the ablation arms (docs/backbones.md).

Launch:
    python sweeps/families.py                    # local preset: CPU, offline, a few minutes
    python sweeps/families.py --preset pythia-ladder --plan      # placements and GPU-hours
    ray submit cluster/gpu.yaml sweeps/families.py -- --preset pythia-ladder \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray

Presets:
    local             pythia-tiny and llama-tiny (random init) vs the no-body and one-attn
                      ablations, frozen (fpt), bit-xor, 2 seeds x 2 learning rates (packed).
    pythia-ladder     Pythia 70m, 160m, 410m, 1b, 1.4b, 2.8b, 6.9b, 12b, pretrained vs random
                      vs no-body, frozen, bit-xor, bit-memory, ListOps and CIFAR-10 at the
                      paper's budgets, 3 seeds, bf16, planned on H100 80GB (--gpu to change).
    pythia-revisions  Pythia 410m at 19 of its 154 pretraining checkpoints (step0, 1, 2, 4, ...,
                      512, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 143000), frozen, the
                      same tasks, 3 seeds: transfer against pretraining amount.
Narrow with --tasks/--models/--inits/--revisions/--seeds/--steps (see --help).
"""

import sys

from scale_fpt.scaling import PYTHIA_LADDER, pythia_revisions
from scale_fpt.study import PAPER_STEPS, paper_overrides, study_main
from scale_fpt.sweep import SweepConfig

LADDER_TASKS = ["bit-xor", "bit-memory", "listops", "cifar10"]
LADDER_GPU = "h100-80gb"
REVISION_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 143000)  # fmt: skip


def local() -> SweepConfig:
    return SweepConfig(
        name="families-local",
        base={"task": "bit-xor", "finetune": "fpt", "batch_size": 16, "max_steps": 300,
              "eval_every": 100, "test_batches": 4, "val_batches": 4},
        grid={"model": ["pythia-tiny", "llama-tiny"],
              "init": ["random", "no-body", "one-attn"], "lr": [1e-3, 3e-3]},
        seeds=(0, 1),
        max_concurrent=2,
    )  # fmt: skip


def pythia_ladder() -> SweepConfig:
    return SweepConfig(
        name="families-pythia-ladder",
        base={"finetune": "fpt", "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={"task": LADDER_TASKS, "model": list(PYTHIA_LADDER),
              "init": ["pretrained", "random", "no-body"]},
        seeds=(0, 1, 2),
        overrides=paper_overrides(),
        gpus_per_trial="auto",
        gpu=LADDER_GPU,
        max_failures=3,
    )  # fmt: skip


def pythia_revisions_preset() -> SweepConfig:
    return SweepConfig(
        name="families-pythia-revisions",
        base={"model": "EleutherAI/pythia-410m", "init": "pretrained", "finetune": "fpt",
              "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={"task": [t for t in LADDER_TASKS if t in PAPER_STEPS],
              "revision": pythia_revisions(REVISION_STEPS)},
        seeds=(0, 1, 2),
        overrides=paper_overrides(),
        gpus_per_trial="auto",
        gpu=LADDER_GPU,
        max_failures=3,
    )  # fmt: skip


PRESETS = {
    "local": local,
    "pythia-ladder": pythia_ladder,
    "pythia-revisions": pythia_revisions_preset,
}

if __name__ == "__main__":
    sys.exit(study_main(__doc__, PRESETS))
