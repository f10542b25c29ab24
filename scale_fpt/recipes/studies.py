"""The studies and their presets (a recipe of ``scale_fpt.recipes``: the library never
imports it).

``scale-fpt sweep STUDY --preset local|paper`` runs one; ``sweeps/STUDY.py`` is the same
study as a script for ``ray submit`` / ``ray job submit`` (which copy or run a file).
Each preset is a function returning a ``SweepConfig``: the narrowing flags of
``scale_fpt.study`` then cut it down (``--tasks``, ``--seeds``, ``--steps``, ``--set``...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from scale_fpt.recipes.paper import PAPER_GPU, PAPER_STEPS, paper_overrides
from scale_fpt.scaling import PYTHIA_LADDER, pythia_revisions
from scale_fpt.sweep import SweepConfig


@dataclass(frozen=True)
class Study:
    description: str
    """What the study measures, its presets and how to launch it (its ``--help`` text)."""
    presets: dict[str, Callable[[], SweepConfig]]
    """Preset name -> the SweepConfig it declares."""
    after: Callable[[SweepConfig], None] | None = None
    """What the study prints once a run of it has finished (the ladder: its scaling laws and
    held-out check); nothing after ``--plan`` or an interrupted run."""


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
    """The laptop study: each task's budget is one in which a 2-core CPU learns it within
    ``make local``'s ten minutes (measured in docs/local.md), so every task has a finding."""
    return SweepConfig(
        name="scale-local",
        base={"model": "gpt2-tiny", "finetune": "fpt", "batch_size": 16},
        grid={"task": ["bit-xor", "bit-memory", "listops"], "init": ["pretrained", "random"]},
        seeds=(0, 1, 2),
        overrides=(
            ({"task": "bit-xor"}, {"max_steps": 1000, "eval_every": 100}),
            (
                {"task": "bit-memory"},
                {
                    "bit_memory_bits": 20,
                    "bit_memory_patch": 20,
                    "batch_size": 64,
                    "lr": 1e-2,
                    "max_steps": 1000,
                    "eval_every": 100,
                    "test_batches": 8,
                    "val_batches": 8,
                },
            ),
            (
                {"task": "listops"},
                {
                    "max_length": 32,
                    "batch_size": 32,
                    "lr": 3e-3,
                    "max_steps": 1000,
                    "eval_every": 100,
                    "test_batches": 16,
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
           (fpt), 3 seeds, on budgets a 2-core CPU learns in (docs/local.md); prints
           pretrained - random on each task (accuracy and steps to the threshold) paired on
           the seeds (paired-t 95% interval, withheld where some seeds of an arm learned
           and others did not; exact log-rank p). Deviations from the paper,
           declared in the report too:
             bit-xor     1,000 steps (paper 10,000), Adam 1e-3, batch 16;
             bit-memory  a smaller variant: 5 strings of 20 bits, one 20-bit token each
                         (6 tokens; paper 1000 bits in 50-bit tokens, 120 tokens), batch 64,
                         Adam 1e-2, 1,000 steps;
             ListOps     generated with LRA's grammar, expressions of 8-32 tokens (paper 512),
                         batch 32, Adam 3e-3, 1,000 steps (paper 2,000 at 1e-3).
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
        # Seeds of their own: scale-paper's fpt arm is this sweep's fpt arm, and with the same
        # seeds the two would share every random stream (pseudo-replication if pooled).
        seeds=(10, 11, 12),
        overrides=paper_overrides(SUBSETS),
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
    paper  gpt2 pretrained, all seven tasks, every subset, 3 seeds (10-12: none shared with
           scale-paper), lr 1e-3 (so fpt+attn diverges on some tasks as in the paper;
           diverged trials keep their last accuracy). Frozen-body subsets train the task's
           budget (recipes.paper.PAPER_STEPS); fpt+ff, fpt+attn and full train to convergence
           (patience of 25% of that budget, in steps) within twice it.""",
    {"local": finetune_local, "paper": finetune_paper},
)


LR_SEEDS = (0, 1, 2)
"""Seeds every searched configuration trains for (its score is their mean)."""
CONFIRM_SEEDS = (3, 4, 5)
"""Fresh seeds each arm's chosen configuration is re-run on (the lr-fair table's headline)."""
LR_FINETUNES = ["fpt", "full"]


def lr_search_local() -> SweepConfig:
    return SweepConfig(
        name="lr-search-local",
        base={"task": "bit-xor", "model": "gpt2-tiny", "max_steps": 600, "eval_every": 200},
        grid={"finetune": LR_FINETUNES, "init": ["pretrained", "random"]},
        search={"lr": ("loguniform", 1e-5, 1e-2)},
        search_trials=4,
        seeds=LR_SEEDS,
        confirm_seeds=CONFIRM_SEEDS,
        max_concurrent=2,
    )


def lr_grid_local() -> SweepConfig:
    sweep = lr_search_local()
    return dataclasses.replace(
        sweep,
        name="lr-grid-local",
        grid={**sweep.grid, "lr": [1e-5, 1e-4, 1e-3, 1e-2]},
        search={},
    )


def lr_search_paper() -> SweepConfig:
    return paper_sweep(
        name="lr-search-paper",
        base={"model": "gpt2", "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": list(PAPER_STEPS),
            "finetune": LR_FINETUNES,
            "init": ["pretrained", "random"],
        },
        search={"lr": ("loguniform", 1e-6, 1e-2), "batch_size": ("choice", [4, 8, 16])},
        search_trials=12,
        seeds=LR_SEEDS,
        confirm_seeds=CONFIRM_SEEDS,
        overrides=paper_overrides(LR_FINETUNES),
        max_concurrent=8,
    )


def lr_grid_paper() -> SweepConfig:
    sweep = lr_search_paper()
    return dataclasses.replace(
        sweep,
        name="lr-grid-paper",
        base={**sweep.base, "batch_size": 8},
        grid={**sweep.grid, "lr": [1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2]},
        search={},
        # The grid sets every lr: the paper's per-task rate (homology 1e-4) is one of them.
        overrides=tuple((m, v) for m, v in sweep.overrides if "lr" not in v),
    )


LR_SEARCH = Study(
    """Learning-rate-fair comparison: each arm (frozen fpt vs full fine-tuning, pretrained vs
random) at its own best learning rate (Rothermel et al. 2021's critique of the paper's
single lr of 1e-3), chosen on validation over three seeds and then re-run on three fresh
confirmation seeds that took no part in the choice (the table's headline).

Launch:
    scale-fpt sweep lr-search                    # local preset: CPU, offline
    scale-fpt sweep lr-search --preset local-grid   # the same on a shared lr grid
    scale-fpt sweep lr-search --resume           # continue: the Optuna studies continue too
    ray submit cluster/gpu.yaml sweeps/lr_search.py -- --preset paper \
        --data-root /mnt/shared/data --optuna-storage postgresql://USER:PASS@HOST/optuna

Each searched arm gets its own Optuna study (``<sweep>-<arm>``), all arms side by side in
one Tune experiment, in the Optuna storage (under the results directory by default: SQLite,
or a journal file on a shared file system; docs/tracking.md), e.g.
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
                only). Frozen arms train the task's budget (recipes.paper.PAPER_STEPS); full arms to
                convergence (patience in steps) within twice it.
    paper-grid  the paper's arms on a shared grid: lr 1e-6, 3e-6, ..., 3e-3, 1e-2 (9 rates),
                batch size 8.""",
    {
        "local": lr_search_local,
        "local-grid": lr_grid_local,
        "paper": lr_search_paper,
        "paper-grid": lr_grid_paper,
    },
)

LADDER_TASKS = ["bit-xor", "bit-memory", "listops", "cifar10"]
LADDER_GPU = "h100-80gb"
REVISION_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 143000)  # fmt: skip


def families_local() -> SweepConfig:
    return SweepConfig(
        name="families-local",
        base={"task": "bit-xor", "finetune": "fpt", "batch_size": 16, "max_steps": 300,
              "eval_every": 100, "test_batches": 4, "val_batches": 4},
        grid={"model": ["pythia-tiny", "llama-tiny"],
              "init": ["random", "no-body", "one-attn"], "lr": [1e-3, 3e-3]},
        seeds=(0, 1),
        max_concurrent=2,
    )  # fmt: skip


def families_pythia_ladder() -> SweepConfig:
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


def families_pythia_revisions() -> SweepConfig:
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


FAMILIES = Study(
    """Backbone families: Pythia (GPT-NeoX) and Llama-style bodies beside GPT-2, the pretraining-
amount axis (hub revisions) and the ablation arms (docs/backbones.md).

Launch:
    scale-fpt sweep families                     # local preset: CPU, offline, a few minutes
    scale-fpt sweep families --preset pythia-ladder --plan       # placements and GPU-hours
    ray submit cluster/gpu.yaml sweeps/families.py -- --preset pythia-ladder \\
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
Narrow with --tasks/--models/--inits/--revisions/--seeds/--steps (see --help).""",
    {
        "local": families_local,
        "pythia-ladder": families_pythia_ladder,
        "pythia-revisions": families_pythia_revisions,
    },
)

LADDER_LOCAL_SIZES = ["gpt2-w32", "gpt2-w64", "gpt2-w96", "gpt2-tiny"]
LADDER_PAPER_SIZES = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
LADDER_PAPER_TASKS = ["bit-memory", "listops", "cifar10"]


def ladder_local() -> SweepConfig:
    return SweepConfig(
        name="ladder-local",
        base={
            "task": "bit-xor",
            "finetune": "fpt",
            "batch_size": 16,
            "max_steps": 200,  # short enough that no size reaches 100%: error stays fittable
            "eval_every": 50,
            "val_batches": 10,
            "test_batches": 10,
        },
        grid={"model": LADDER_LOCAL_SIZES, "init": ["pretrained", "random"]},
        seeds=(0, 1, 2),
        max_concurrent=2,
    )


def ladder_paper() -> SweepConfig:
    return paper_sweep(
        name="ladder-paper",
        base={"finetune": "fpt", "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={
            "task": LADDER_PAPER_TASKS,
            "model": LADDER_PAPER_SIZES,
            "init": ["pretrained", "random"],
        },
    )


def ladder_laws(sweep: SweepConfig) -> None:
    """Write the finished ladder's report (``scale-fpt report`` of this sweep alone) and print
    its laws on total parameters and its held-out check."""
    import pandas as pd

    from scale_fpt.report import build_report

    report = build_report(sweep.sweep_dir, attention_maps=False)
    tables = report.parent / "tables"
    for name, title in (("scaling_laws", "laws"), ("scaling_holdout", "held-out check")):
        path = tables / f"{name}.csv"
        if path.exists():
            frame = pd.read_csv(path)
            if name == "scaling_laws":
                frame = frame[frame["axis"] == "total parameters"]
            print(f"\n{sweep.name}: {title}\n{frame.to_string(index=False)}")
    print(f"\nreport: {report}")


LADDER = Study(
    """Scaling ladder: four model sizes x pretrained/random, frozen, then the scaling laws
(docs/scaling-laws.md).

Launch:
    scale-fpt sweep ladder                       # local preset: CPU, offline, minutes
    scale-fpt sweep ladder --preset paper --plan # where each trial runs, GPU-hours
    ray submit cluster/gpu.yaml sweeps/ladder.py -- --preset paper --data-root /mnt/shared/data

Presets:
    local  gpt2-w32, gpt2-w64, gpt2-w96 and gpt2-tiny (2 layers, 32..128 wide), each
           language-pretrained locally on first use (the w presets for 300 steps, gpt2-tiny
           for 800), vs random, frozen (fpt), on bit-xor for 200 steps, 3 seeds.
    paper  gpt2, gpt2-medium, gpt2-large, gpt2-xl, pretrained vs random, frozen, on
           bit-memory, ListOps and CIFAR-10 with the paper's optimiser and step budgets,
           3 seeds, planned on the paper presets' GPU (--gpu to change).

After a finished run it writes the sweep's report to RESULTS/<sweep>/report and prints the
laws error = E + A x^-alpha per arm on total parameters, fitted to each size's mean with
profile-likelihood intervals printed only where simulation at this design (4 sizes x 3
seeds) finds them calibrated: at 4 sizes alpha and E say "not identified" or "not
calibrated at this design", and the held-out check (fit on the three smaller sizes, predict
the largest) has no degree of freedom for a prediction interval (docs/statistics.md).""",
    {"local": ladder_local, "paper": ladder_paper},
    after=ladder_laws,
)

STUDIES = {
    "scale": SCALE,
    "finetune": FINETUNE,
    "lr-search": LR_SEARCH,
    "families": FAMILIES,
    "ladder": LADDER,
}
"""``scale-fpt sweep STUDY``: the studies by name (``sweeps/<name>.py`` with ``_`` for ``-``)."""
