"""Scaling ladder: four model sizes x pretrained/random, frozen, then the scaling laws.

Launch:
    python sweeps/ladder.py                      # local preset: CPU, offline, <= 15 min on 2 cores
    python sweeps/ladder.py --plan --preset paper   # where each trial runs, GPU-hours
    ray submit cluster/gpu.yaml sweeps/ladder.py -- --preset paper \
        --results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray

Presets:
    local  gpt2-w32, gpt2-w64, gpt2-w96 and gpt2-tiny (2 layers, 32..128 wide), each
           language-pretrained locally on first use (as the scale preset's backbone is;
           the three w presets for 300 steps, gpt2-tiny for the usual 800), vs
           random, frozen (fpt), on bit-xor for 200 steps (short enough that no size reaches
           100%: error must stay positive to be fitted), 3 seeds.
    paper  gpt2, gpt2-medium, gpt2-large, gpt2-xl, pretrained vs random, frozen, on
           bit-memory, ListOps and CIFAR-10 with the paper's optimiser and step budgets,
           3 seeds; planned on the GPU named by --gpu (default a10g-24gb).

After the sweep, the report of this sweep alone is written to RESULTS/<sweep>/report
(``scale-fpt report`` on that directory gives the same): the laws error = E + A x^-alpha per
arm on total parameters, trained parameters and FLOPs with 95% bootstrap intervals, the
pretrained - random exponent difference, and the held-out check (fit on the three smaller
sizes, predict the largest). Their tables are printed here too.
"""

import os
import sys

# Spinning OpenMP threads lose their time slices to any other work on the machine: on a
# shared 2-core box a gpt2-tiny pretraining step took 2.4 s instead of 0.11 s. Passive
# waiting costs little on a dedicated machine; set before torch loads (here and in the Ray
# workers, which inherit it). OMP_WAIT_POLICY=ACTIVE overrides.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pandas as pd

from scale_fpt.report import build_report
from scale_fpt.study import PAPER_GPU, PAPER_STEPS, narrow, paper_overrides, parser, study_main
from scale_fpt.sweep import SweepConfig

LOCAL_SIZES = ["gpt2-w32", "gpt2-w64", "gpt2-w96", "gpt2-tiny"]
LADDER_PRESETS = ("gpt2-w32", "gpt2-w64", "gpt2-w96")
LADDER_PRETRAIN_STEPS = 300
"""Language-pretraining steps of the ladder's own presets: the four pretrainings are most
of a CPU ladder's time, and the small widths stop improving early."""
PAPER_SIZES = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
PAPER_TASKS = ["bit-memory", "listops", "cifar10"]


def local() -> SweepConfig:
    return SweepConfig(
        name="ladder-local",
        base={
            "task": "bit-xor",
            "finetune": "fpt",
            "batch_size": 16,
            "max_steps": 200,
            "eval_every": 50,
            "val_batches": 10,
            "test_batches": 10,
        },
        grid={"model": LOCAL_SIZES, "init": ["pretrained", "random"]},
        seeds=(0, 1, 2),
        max_concurrent=2,
    )


def paper() -> SweepConfig:
    return SweepConfig(
        name="ladder-paper",
        base={"finetune": "fpt", "batch_size": 8, "eval_every": 1000, "precision": "bf16"},
        grid={"task": PAPER_TASKS, "model": PAPER_SIZES, "init": ["pretrained", "random"]},
        seeds=(0, 1, 2),
        overrides=paper_overrides(),
        gpus_per_trial="auto",
        gpu=PAPER_GPU,
        max_failures=3,
    )


PRESETS = {"local": local, "paper": paper}
assert set(PAPER_TASKS) <= set(PAPER_STEPS)


def pretrain_ladder(models) -> None:
    """The ladder's own presets, pretrained for ``LADDER_PRETRAIN_STEPS`` before the sweep
    would pretrain them for ``scale-fpt pretrain``'s default 800 (gpt2-tiny, shared with
    the scale preset, keeps its 800)."""
    from scale_fpt.pretrain import ensure_backbone

    for model in models:
        if model in LADDER_PRESETS:
            ensure_backbone(model, "language", steps=LADDER_PRETRAIN_STEPS)


def main(argv=None) -> int:
    args = parser(__doc__, PRESETS).parse_args(argv)
    if not args.plan:
        pretrain_ladder(narrow(PRESETS[args.preset](), args).grid.get("model", []))
    code = study_main(__doc__, PRESETS, argv)
    if code or args.plan:
        return code
    sweep = narrow(PRESETS[args.preset](), args)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
