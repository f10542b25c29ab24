"""The paper's studies and their presets, shipped with the package.

``scale-fpt sweep STUDY --preset local|paper`` runs one; ``sweeps/STUDY.py`` is the same
study as a script for ``ray submit`` / ``ray job submit`` (which copy or run a file).
Each preset is a function returning a ``SweepConfig``: the narrowing flags of
``scale_fpt.study`` then cut it down (``--tasks``, ``--seeds``, ``--steps``, ``--set``...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scale_fpt.study import PAPER_GPU, PAPER_STEPS, paper_overrides
from scale_fpt.sweep import SweepConfig


@dataclass(frozen=True)
class Study:
    description: str
    """What the study measures, its presets and how to launch it (its ``--help`` text)."""
    presets: dict[str, Callable[[], SweepConfig]]
    """Preset name -> the SweepConfig it declares."""


def paper_sweep(**fields) -> SweepConfig:
    """A paper preset: 3 seeds, the paper's per-task settings, GPUs sized by the planner on
    the paper presets' GPU, 3 retries; ``fields`` add to or replace these."""
    paper = {
        "seeds": (0, 1, 2),
        "overrides": paper_overrides(),
        "gpus_per_trial": "auto",
        "gpu": PAPER_GPU,
        "max_failures": 3,
    }
    return SweepConfig(**{**paper, **fields})


def scale_local() -> SweepConfig:
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


def scale_paper() -> SweepConfig:
    return paper_sweep(
        name="scale-paper",
        base={"finetune": "fpt", "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": list(PAPER_STEPS),
            "model": ["gpt2", "gpt2-medium", "gpt2-large"],
            "init": ["pretrained", "random"],
        },
    )


SCALE = Study(
    """Scaling study: model size x initialisation x task, frozen (paper Tables 1, 2 and 6).

Launch:
    scale-fpt sweep scale                        # local preset: CPU, offline, ~10 min on 2 cores
    scale-fpt sweep scale --resume               # continue an interrupted run
    scale-fpt sweep scale --preset paper --plan --data-root /data   # what runs where; checks data
    ray submit cluster/gpu.yaml sweeps/scale.py -- --preset paper --data-root /mnt/shared/data

Presets:
    local  gpt2-tiny, language-pretrained (built locally on first use) vs random, frozen
           (fpt), on bit-xor, bit-memory and ListOps (expressions cut to 128 tokens), 3 seeds;
           prints pretrained - random on each task (accuracy and steps to the threshold)
           with a 95% Welch interval over the seeds.
    paper  gpt2, gpt2-medium, gpt2-large, pretrained vs random, frozen, all seven tasks,
           3 seeds, the paper's optimiser settings (Adam 1e-3, 1e-4 for homology).
Narrow either with --tasks/--models/--inits/--seeds/--steps (see --help).""",
    {"local": scale_local, "paper": scale_paper},
)

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
"""The fine-tuned parameter subsets of the finetune study (paper Table 8 and its ablation)."""


def finetune_local() -> SweepConfig:
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


def finetune_paper() -> SweepConfig:
    return paper_sweep(
        name="finetune-paper",
        base={"model": "gpt2", "init": "pretrained", "batch_size": 8, "eval_every": 1000},
        grid={"task": list(PAPER_STEPS), "finetune": SUBSETS},
    )


FINETUNE = Study(
    """Fine-tuning subsets: which parameter groups must train (paper Table 8 and the layer-norm
ablation: output only, +input, +positions, +layer norms, fpt, fpt+ff, fpt+attn, full).

Launch:
    scale-fpt sweep finetune                     # local preset: CPU, offline, a few minutes
    ray submit cluster/gpu.yaml sweeps/finetune.py -- --preset paper --data-root /mnt/shared/data

Presets:
    local  gpt2-tiny language-pretrained (built locally on first use), bit-xor and
           bit-memory, every subset, 2 seeds.
    paper  gpt2 pretrained, all seven tasks, every subset, 3 seeds, lr 1e-3 (so fpt+attn
           diverges on some tasks as in the paper; diverged trials keep their last accuracy).""",
    {"local": finetune_local, "paper": finetune_paper},
)


def lr_search_local() -> SweepConfig:
    return SweepConfig(
        name="lr-search-local",
        base={"task": "bit-xor", "model": "gpt2-tiny", "max_steps": 600, "eval_every": 200},
        grid={"finetune": ["fpt", "full"], "init": ["pretrained", "random"]},
        search={"lr": ("loguniform", 1e-5, 1e-2)},
        search_trials=4,
        max_concurrent=2,
    )


def lr_search_paper() -> SweepConfig:
    return paper_sweep(
        name="lr-search-paper",
        base={"model": "gpt2", "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": list(PAPER_STEPS),
            "finetune": ["fpt", "full"],
            "init": ["pretrained", "random"],
        },
        search={"lr": ("loguniform", 1e-6, 1e-2), "batch_size": ("choice", [4, 8, 16])},
        search_trials=12,
        seeds=(0,),
        max_concurrent=8,
    )


LR_SEARCH = Study(
    """Learning-rate-fair comparison: an Optuna search of learning rate (and batch size) per arm,
so each arm (frozen fpt vs full fine-tuning, pretrained vs random) is compared at its own
best learning rate (Rothermel et al. 2021's critique of the paper's single lr of 1e-3).

Launch:
    scale-fpt sweep lr-search                    # local preset: CPU, offline, ~10 min
    scale-fpt sweep lr-search --resume           # continue: the Optuna studies continue too
    ray submit cluster/gpu.yaml sweeps/lr_search.py -- --preset paper \\
        --data-root /mnt/shared/data --optuna-storage postgresql://USER:PASS@HOST/optuna

Each arm gets its own Optuna study (``<sweep>-<arm>``) in the Optuna storage (an SQLite file
under the results directory by default): inspect it with Optuna's own tools, e.g.
``optuna-dashboard sqlite:///results/lr-search-local/optuna.db``.

Presets:
    local  gpt2-tiny on bit-xor: fpt vs full x pretrained vs random; lr in [1e-5, 1e-2].
    paper  gpt2 on all seven tasks: fpt vs full x pretrained vs random; lr in [1e-6, 1e-2]
           and batch size in {4, 8, 16}, 12 trials per arm, ASHA off (the searcher sees
           full-length runs only).""",
    {"local": lr_search_local, "paper": lr_search_paper},
)

STUDIES = {"scale": SCALE, "finetune": FINETUNE, "lr-search": LR_SEARCH}
"""``scale-fpt sweep STUDY``: the studies by name (``sweeps/<name>.py`` with ``_`` for ``-``)."""
