"""What every study script in ``sweeps/`` shares: presets, narrowing flags, run, summary.

A script declares its presets (functions returning a ``SweepConfig``) and calls
``study_main``; everything else (flags, local backbones, Ray, resume, the summary table) is
here, so the scripts stay declarations. The library never imports the scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

from scale_fpt.config import FIELD_TYPES, TASKS, ConfigError, coerce, parse_trial
from scale_fpt.report.published import STEPS, TASK_COLUMNS

PAPER_STEPS = {
    task: int(steps) for task, steps in zip(TASK_COLUMNS, STEPS["T4"]["random"], strict=True)
}
"""Gradient steps per task for every arm of the paper presets: the paper's steps to
convergence of the slower, random-init frozen transformer (Table 4, row "random"), so no arm
is stopped before the paper's slowest arm converged. (The paper trained each run until
convergence; a fixed budget equal for every arm is the like-for-like reading.)"""


PAPER_GPU = "a10g-24gb"
"""The GPU the paper presets plan for: cluster/gpu.yaml's worker types (``--gpu`` to change)."""


BODY_TRAINED = ("fpt+ff", "fpt+attn", "full")
"""Finetune specs of the presets that train the transformer body (and so converge on their
own schedule, not the frozen random arm's)."""
CONVERGENCE_BUDGET_FACTOR = 2
"""Arms that train the body, and the LSTM: a cap of this many times the task's budget ..."""
CONVERGENCE_PATIENCE_FRACTION = 0.25
"""... and patience (in steps) of this fraction of the task's budget: they train to
convergence (no better validation accuracy for that many steps) within the cap, rather than
to a budget borrowed from the frozen random arm."""


def paper_overrides(finetunes=(), lstm: bool = False) -> tuple:
    """Per-task settings of the paper presets: step budgets (``PAPER_STEPS``), lr 1e-4 for
    homology, and, for the arms of ``finetunes`` that train the body (``BODY_TRAINED``) and
    the LSTM (``lstm``), a budget of their own: trained to convergence (patience in steps)
    within ``CONVERGENCE_BUDGET_FACTOR`` x the task's budget."""
    steps = tuple(({"task": task}, {"max_steps": n}) for task, n in PAPER_STEPS.items())
    own = [({"finetune": f}) for f in finetunes if f in BODY_TRAINED]
    if lstm:
        own.append({"model": "lstm"})
    converged = tuple(
        (
            {"task": task, **match},
            {
                "max_steps": CONVERGENCE_BUDGET_FACTOR * n,
                "patience": int(CONVERGENCE_PATIENCE_FRACTION * n),
            },
        )
        for match in own
        for task, n in PAPER_STEPS.items()
    )
    return (*steps, *converged, ({"task": "homology"}, {"lr": 1e-4}))


LIST_FLAGS = {
    "tasks": "task",
    "models": "model",
    "inits": "init",
    "finetunes": "finetune",
    "lrs": "lr",
    "batch_sizes": "batch_size",
    "revisions": "revision",
}


def parser(description: str, presets: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_study_flags(p, sorted(presets))
    return p


def add_study_flags(
    p: argparse.ArgumentParser, presets: list[str], default_preset: str | None = "local"
) -> None:
    """The flags of every way to launch a sweep: ``sweeps/*.py`` and ``scale-fpt sweep``."""
    p.add_argument("--preset", choices=presets, default=default_preset, help="default: local")
    for name, field in LIST_FLAGS.items():
        p.add_argument(
            f"--{name.replace('_', '-')}", default="", help=f"comma list: only these {field} values"
        )
    p.add_argument("--seeds", default="", help="comma list of seeds (default: the preset's)")
    p.add_argument(
        "--confirm-seeds",
        default="",
        help="comma list of fresh seeds each arm's chosen lr is re-run on after a search or "
        "lr grid, or 'none' (default: the preset's)",
    )
    p.add_argument("--steps", type=int, default=0, help="max_steps of every trial")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="set a trial config field in every trial (eval_every=100), or in one task's "
        "trials (homology.data_dir=/data/tape); repeatable",
    )
    p.add_argument(
        "--data-root",
        default=os.environ.get("SCALE_FPT_DATA", ""),
        metavar="DIR",
        help="the tasks' data, one folder per dataset: DIR/listops, DIR/homology, DIR/mnist, "
        "DIR/cifar10 (docs/data.md); a task whose folder is missing keeps its default source "
        "(default: $SCALE_FPT_DATA)",
    )
    p.add_argument("--name", default="", help="sweep name (default: the preset's)")
    # cluster/*.yaml export SCALE_FPT_RESULTS and SCALE_FPT_STORAGE (shared storage), so a
    # bare `ray submit cluster/gpu.yaml sweeps/X.py` writes where every node can reach.
    p.add_argument(
        "--results",
        default=os.environ.get("SCALE_FPT_RESULTS", ""),
        help="Parquet results directory (default: $SCALE_FPT_RESULTS, else the preset's or "
        "file's results_dir: results)",
    )
    p.add_argument(
        "--storage",
        default=os.environ.get("SCALE_FPT_STORAGE", ""),
        help="Ray Tune storage, shared on a cluster (default: $SCALE_FPT_STORAGE, else RESULTS/_ray)",
    )
    p.add_argument(
        "--optuna-storage",
        default="",
        help="Optuna storage: an RDB URL, or a journal file PATH.journal (safe on NFS) "
        "(default: in the sweep's results, a journal file on a shared file system, else SQLite)",
    )
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="trials at once; 0 = unlimited, as many as resources allow (default: the preset's)",
    )
    p.add_argument(
        "--max-failures",
        type=int,
        default=None,
        help="retries per crashed trial; 0 = none (default: the preset's)",
    )
    p.add_argument(
        "--logger",
        "--loggers",
        dest="loggers",
        default="",
        metavar="LIST",
        help="comma list of trackers fed with every evaluation, one run per trial: "
        "tensorboard (RESULTS/<sweep>/tensorboard), wandb (RESULTS/<sweep>/wandb; "
        "WANDB_MODE=offline works without network), mlflow ($MLFLOW_TRACKING_URI, else "
        "RESULTS/<sweep>/mlruns); or none (default: tensorboard)",
    )
    p.add_argument("--search-trials", type=int, default=0, help="Optuna trials per arm")
    p.add_argument("--asha", action="store_true", help="stop weak trials early (ASHA)")
    p.add_argument(
        "--pack",
        type=pack_value,
        default=None,
        metavar="K|auto",
        help="train up to K compatible trials per process on one backbone; auto (the "
        "default): K from the devices and their memory, 1: one trial per process",
    )
    add_gpu_flags(p)
    p.add_argument(
        "--plan",
        action="store_true",
        help="print where each trial runs (GPUs, ZeRO stage, trials per GPU) and the "
        "study's estimated GPU-hours; runs nothing",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")


def add_gpu_flags(p: argparse.ArgumentParser) -> None:
    """What each trial asks Ray for (``SweepConfig.gpus_per_trial``, ``gpu``, ...)."""
    from scale_fpt.gpus import GPUS

    p.add_argument(
        "--gpus-per-trial",
        default="",
        metavar="auto|0|N|FRACTION",
        help="GPUs per trial: auto (sized by the memory planner; CPU where the cluster has "
        "and can launch no GPU), 0 (CPU only), N, or a fraction such as 0.25 (default: the "
        "preset's)",
    )
    p.add_argument(
        "--gpu",
        default="",
        choices=["", *GPUS],
        metavar="NAME",
        help=f"the GPU trials run on, for the planner: {', '.join(GPUS)} (default: the "
        "preset's, else the cluster's GPU node types)",
    )
    p.add_argument(
        "--gpu-memory", type=float, default=0.0, help="GiB of one GPU, for a GPU not in --gpu"
    )
    p.add_argument(
        "--cluster-config",
        default="",
        help="cluster YAML whose node types auto plans for (default: ~/ray_bootstrap_config.yaml "
        "when present)",
    )


def pack_value(text: str) -> int | str:
    """``--pack``: ``auto`` or a positive number of trials per cohort."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}")
    return value


def split(text: str, kind=str) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def narrow(sweep, args: argparse.Namespace):
    """Apply the command-line narrowing flags to a preset's SweepConfig."""
    from scale_fpt.sweep import SweepConfig

    grid, base = dict(sweep.grid), dict(sweep.base)
    kinds = {"lr": float, "batch_size": int}
    for flag_name, field in LIST_FLAGS.items():
        values = split(getattr(args, flag_name), kinds.get(field, str))
        if not values:
            continue
        if field in grid:
            grid[field] = values
        elif len(values) == 1:
            base[field] = values[0]
        else:
            grid[field] = values
    changes = {"grid": grid, "base": base}
    if args.seeds:
        changes["seeds"] = tuple(split(args.seeds, int))
    if args.confirm_seeds:
        none = args.confirm_seeds == "none"
        changes["confirm_seeds"] = () if none else tuple(split(args.confirm_seeds, int))
    # Last overrides win over the preset's per-task settings.
    forced = {"max_steps": args.steps} if args.steps else {}
    everywhere, per_task = parse_assignments(args.set)
    forced.update(everywhere)
    added = ((({}, forced),) if forced else ()) + tuple(
        ({"task": task}, values) for task, values in per_task.items()
    )
    if added:
        changes["overrides"] = (*sweep.overrides, *added)
    optional = {
        "name": args.name,
        "results_dir": args.results,
        "storage_path": args.storage,
        "optuna_storage": args.optuna_storage,
        "search_trials": args.search_trials,
        "gpus_per_trial": args.gpus_per_trial,
        "gpu": args.gpu,
        "gpu_memory_gb": args.gpu_memory,
        "cluster_config": args.cluster_config,
        "data_root": args.data_root,
    }
    changes.update({k: v for k, v in optional.items() if v})
    if args.loggers:
        changes["loggers"] = tuple(split(args.loggers))
    # Given values pass unchecked: SweepConfig.validate names a negative one.
    for name in ("max_concurrent", "max_failures"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.asha:
        changes["asha"] = True
    if args.pack is not None:
        changes["pack"] = args.pack
    sweep = dataclasses.replace(sweep, **changes)
    assert isinstance(sweep, SweepConfig)
    return sweep


def parse_assignments(assignments: list[str]) -> tuple[dict, dict[str, dict]]:
    """``["eval_every=100", "homology.data_dir=/d"]`` -> (typed values for every trial,
    {task: typed values for that task's trials})."""
    kinds = FIELD_TYPES
    everywhere, per_task, problems = {}, {}, []
    for assignment in assignments:
        target, sep, text = assignment.partition("=")
        task, dot, key = target.rpartition(".")
        if not sep or key not in kinds or (dot and task not in TASKS):
            problems.append(
                f"--set {assignment!r}: expected FIELD=VALUE or TASK.FIELD=VALUE with TASK one "
                f"of {', '.join(TASKS)} and FIELD one of {', '.join(kinds)}"
            )
            continue
        value, problem = coerce(key, text, kinds[key])
        if problem:
            problems.append(problem)
        (per_task.setdefault(task, {}) if dot else everywhere)[key] = value
    if problems:
        raise ConfigError(problems)
    return everywhere, per_task


def local_backbones(sweep) -> list[tuple[str, str]]:
    """(CPU preset, corpus) pairs that arms of this sweep load as pretrained weights."""
    from scale_fpt.models.backbones import CPU_PRESETS, LOCAL_CORPORA

    needed = set()
    for arm in sweep.trials():
        model = parse_trial(arm).model
        local = model.model in CPU_PRESETS and model.weights in ("", *LOCAL_CORPORA)
        if local and model.init != "random":
            needed.add((model.model, model.weights or "language"))
    return sorted(needed)


def study_main(
    description: str,
    presets: dict[str, Callable],
    argv: list[str] | None = None,
    after: Callable | None = None,
) -> int:
    """Parse flags, build the preset, pretrain local backbones, run (or resume), summarise
    (and ``after(sweep)`` once the run has finished)."""
    args = parser(description, presets).parse_args(argv)
    try:
        return run_study(presets[args.preset](), args, after)
    except ConfigError as e:
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        return 2


def run_study(declared, args: argparse.Namespace, after: Callable | None = None) -> int:
    """``declared`` (a preset's or a YAML file's SweepConfig) narrowed by the flags of
    ``add_study_flags``: checked (ConfigError: nothing started), then planned (``--plan``)
    or run (or resumed) and summarised. Returns the exit code."""
    sweep = narrow(declared, args).validate()
    if args.plan:  # the plan, then whatever stops its arms from running
        print(placement_table(sweep))
    check_data_and_weights(sweep)
    if args.plan:
        return 0
    from scale_fpt.pretrain import ensure_backbone
    from scale_fpt.storage import check_sweep_storage

    check_sweep_storage(sweep)  # before a backbone is pretrained for it
    from scale_fpt.models.backbones import local_backbone_dir
    from scale_fpt.sweep import run_sweep

    for preset, corpus in local_backbones(sweep):
        if not (local_backbone_dir(preset, corpus) / "pretrain.json").exists():
            print(
                f"[scale-fpt] pretraining the local {corpus} backbone for {preset} first (once, "
                "then cached; minutes on a CPU)",
                flush=True,
            )
        where = ensure_backbone(preset, corpus)
        print(f"[scale-fpt] local {corpus} backbone for {preset}: {where}", flush=True)
    outcome = run_sweep(sweep, resume=args.resume)
    print(summary_table(sweep))
    if not outcome.finished:
        print(
            f"[scale-fpt] sweep interrupted: {outcome.unfinished} trial(s) unfinished; "
            "rerun with --resume to continue",
            file=sys.stderr,
        )
        return 130
    if after is not None:
        after(sweep)
    return 0


def check_data_and_weights(sweep) -> None:
    """ConfigError naming every arm whose data or weights cannot be reached
    (``scale_fpt.preflight``): before Ray starts and before any GPU node is asked for."""
    from scale_fpt.preflight import preflight_problems

    problems = preflight_problems(sweep.trials())
    if problems:
        raise ConfigError(problems)


def placement_table(sweep) -> str:
    """What runs where: each distinct plan with its trials, and the study's GPU-hours per
    model (``placement.study_gpu_hours``) on the GPU the sweep plans for. Needs no Ray: the
    GPU is the declared one (``--gpu``), else ``gpus.DEFAULT_GPU``."""
    from collections import Counter

    from scale_fpt import planner
    from scale_fpt.cluster import GPUOffer
    from scale_fpt.gpus import DEFAULT_GPU, GPUS
    from scale_fpt.profile import plan_trial
    from scale_fpt.sweep.placement import study_gpu_hours, sweep_gpus

    if sweep.gpu or sweep.gpu_memory_gb or sweep.gpus_per_trial == "0":
        offer = sweep_gpus(sweep)
    else:
        offer = GPUOffer(GPUS[DEFAULT_GPU], 0, "default")
    max_gpus = offer.max_gpus_per_node or 8
    arms = sweep.trials()
    counts: Counter = Counter()
    for arm in arms:
        config = parse_trial(arm)
        plan = plan_trial(config, sweep.gpus_per_trial, offer.gpu, max_gpus)
        budget = f"{config.train.max_steps:,} steps" + (
            f" (patience {config.train.patience:,})" if config.train.patience else ""
        )
        batch = "bs searched" if "batch_size" in sweep.search else f"bs {config.train.batch_size}"
        counts[
            (
                config.model.model,
                config.train.finetune,
                config.task.task,
                budget,
                batch,
                plan.describe(),
            )
        ] += 1
    per_arm = sweep.search_trials if sweep.search else 1  # an Optuna search runs each arm N times
    where = offer.gpu.name if offer.gpu else "CPUs"
    lines = [f"{sweep.name}: {len(arms)} arms x {per_arm} trial(s) on {where}"]
    lines.append(f"  seeds {', '.join(map(str, sweep.seeds))}" + confirmation_line(sweep))
    lines += [
        f"  {n:>3} x {model} {finetune} {task}, {budget}, {batch}: {where}"
        for (model, finetune, task, budget, batch, where), n in sorted(counts.items())
    ]
    if offer.gpu is not None:
        hours = study_gpu_hours(arms, sweep.gpus_per_trial, offer.gpu, max_gpus)
        hours = {model: h * per_arm for model, h in hours.items()}
        estimate = (
            "GPU-hours (estimate: planned GPU share x max_steps x step time, "
            f"{planner.ASSUMED_MFU:.0%} of the bf16 peak or "
            f"{planner.STEP_LATENCY_PER_LAYER_S * 1000:.1f} ms per block per step): "
        )
        if offer.gpu.bf16_flops:
            lines.append(estimate + ", ".join(f"{m} {h:,.1f}" for m, h in hours.items()))
        else:
            lines.append(
                f"{estimate}unknown: {offer.gpu.name} has no published bf16 peak "
                f"(gpus.CHIPS); name the GPU with --gpu ({', '.join(GPUS)})"
            )
    return "\n".join(lines)


def confirmation_line(sweep) -> str:
    """'; then each arm's chosen ... on seeds 3, 4, 5 (sweep X-confirm, N trials)' or ''."""
    if not sweep.confirm_seeds:
        return ""
    from scale_fpt.sweep.confirm import confirmation_sweep

    confirm = confirmation_sweep(sweep)
    return (
        f"; then each arm's chosen {' and '.join(sweep.choice_fields())} on fresh seeds "
        f"{', '.join(map(str, sweep.confirm_seeds))} (sweep {confirm.name}, "
        f"{len(confirm.trials())} trials)"
    )


def summary_table(sweep) -> str:
    """Test accuracy at each trial's validation-selected step (``test_accuracy``), mean ±
    std over seeds, per task (rows) and arm (columns); nothing in it is chosen on test."""
    from scale_fpt.results import load_results

    results = load_results(sweep.results_dir, sweep.name)
    trials = results.trials
    if trials.empty:
        return "(no trials)"
    # One column per design: a search's or grid's learning rates are never pooled into one mean.
    lr = trials["lr"].map(lambda v: f" lr {v:.3g}")
    bs = trials["batch_size"].map(lambda v: f" bs {int(v)}")
    trials = trials.assign(
        arm=trials["model"] + " " + trials["init"] + " " + trials["finetune"] + lr + bs
    )
    stats = trials.groupby(["task", "arm"])["test_accuracy"].agg(["mean", "std", "count"])
    cells = stats.apply(
        lambda r: (
            f"{r['mean']:.3f} ± {0 if r['count'] < 2 else r['std']:.3f} (n={int(r['count'])})"
        ),
        axis=1,
    )
    table = cells.unstack("arm").fillna("")
    status = trials["status"].value_counts().to_dict()
    return (
        f"\n{sweep.name}: test accuracy at the step of best validation accuracy within each "
        f"trial's budget, mean ± std over seeds, one column per (arm, lr, batch size) "
        f"(results in {sweep.sweep_dir}; statuses {status})\n{table.to_string()}\n"
        f"{findings(trials, results.curves)}"
        f"tables, figures and attention maps: scale-fpt report {sweep.results_dir}\n"
    )


def findings(trials, curves=None) -> str:
    """One line per setting where both inits ran: pretrained minus random, paired on the
    seeds they share (``report.tables.init_difference``): test accuracy at the selected step
    within the budget (not a converged accuracy), and steps to the threshold as censored
    data (Kaplan-Meier medians, log-rank) at each task's threshold (90% of the paper's FPT
    accuracy, as Table 4; read from ``curves``)."""
    from scale_fpt.report.tables import difference_text, init_difference

    lines = [
        f"{row['task']} ({row['model']}, {row['finetune_label']}, lr {row['lr']:g}, "
        f"{int(row['max_steps']):,}-step budget, threshold {row['accuracy_threshold']:g}): "
        + difference_text(row)
        for row in init_difference(trials, curves=curves).to_dict("records")
    ]
    return "".join(line + "\n" for line in lines)
