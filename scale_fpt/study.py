"""What every way to launch a study shares (``scale-fpt sweep``, ``sweeps/*.py``): flags,
narrowing a declared sweep, run, summary.

A script hands ``study_main`` its presets (functions returning a ``SweepConfig``, from
``scale_fpt.recipes``); everything else (flags, local backbones, Ray, resume, the summary
table) is here, so the scripts stay declarations. This module is handed the presets: it
never imports the recipes or the scripts. Its flags build every parser, ``--help``
included, so what a run needs is imported when it runs (start-up time).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections import Counter
from collections.abc import Callable

from scale_fpt import planner
from scale_fpt.cluster import planned_offer
from scale_fpt.config import FIELD_TYPES, TASKS, ConfigError, TrialConfig, coerce, parse_trial
from scale_fpt.flags import add_field_flags, load_mapping
from scale_fpt.gpus import GPUS
from scale_fpt.preflight import preflight_problems
from scale_fpt.sweep.config import SweepConfig
from scale_fpt.vocabulary import ARM_LABEL_FIELDS

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


SWEEP_ALIASES = {
    "results_dir": ["--results"],
    "storage_path": ["--storage"],
    "gpu_memory_gb": ["--gpu-memory"],
    "loggers": ["--logger"],
}
"""Earlier spellings of sweep flags, still accepted beside the field names."""
SWEEP_ENV = {
    "results_dir": "SCALE_FPT_RESULTS",
    "storage_path": "SCALE_FPT_STORAGE",
    "data_root": "SCALE_FPT_DATA",
}
"""Sweep fields read from the environment when their flag is not given: cluster/*.yaml
export the shared storage, so a bare ``ray submit cluster/gpu.yaml sweeps/X.py`` writes
where every node can reach."""
SWEEP_FIELD_KINDS = {
    name: kind
    for name, kind in typing.get_type_hints(SweepConfig).items()
    if kind is not dict and name != "overrides"
}
"""The SweepConfig fields set by a flag of their own (the grid, base, search and overrides
are set by the narrowing flags, ``--set`` and sweep files), and their types."""


def add_study_flags(
    p: argparse.ArgumentParser, presets: list[str] | None, default_preset: str | None = "local"
) -> None:
    """The flags of every way to launch a sweep: ``sweeps/*.py`` and ``scale-fpt sweep``
    (``presets``: the study's preset names, or None where the study is not known yet): the
    narrowing flags, then a flag per SweepConfig field (``flags.add_field_flags``)."""
    p.add_argument(
        "--preset",
        choices=presets,
        default=default_preset,
        help="the study's preset (default: local)"
        + ("" if presets else "; a wrong name lists the study's presets"),
    )
    p.add_argument(
        "--config",
        default="",
        metavar="FILE.yaml",
        help="SweepConfig fields from a YAML mapping, over the preset's or the sweep file's; "
        "flags given beside it win",
    )
    for name, field in LIST_FLAGS.items():
        p.add_argument(
            f"--{name.replace('_', '-')}", default="", help=f"comma list: only these {field} values"
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
        "--plan",
        action="store_true",
        help="print where each trial runs (GPUs, ZeRO stage, trials per GPU) and the "
        "study's estimated GPU-hours; runs nothing",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    add_field_flags(
        p.add_argument_group("SweepConfig (default: the preset's or the sweep file's)"),
        SweepConfig,
        SWEEP_FIELD_KINDS,
        SWEEP_ALIASES,
        default_text=lambda name: (
            f"${SWEEP_ENV[name]}, else the preset's" if name in SWEEP_ENV else "the preset's"
        ),
    )
    p.set_defaults(
        **{name: os.environ[env] for name, env in SWEEP_ENV.items() if os.environ.get(env)}
    )


def sweep_flag_values(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """(The SweepConfig fields given as flags (or by ``SWEEP_ENV``), typed; a problem per
    value of the wrong type, which is left out). Their ranges: ``SweepConfig.problems``."""
    values, problems = {}, []
    for name, kind in SWEEP_FIELD_KINDS.items():
        text = getattr(args, name)
        if text is None:
            continue
        if kind in (tuple[int, ...], tuple[str, ...]):
            item = kind.__args__[0]
            typed = [coerce(name, v.strip(), item) for v in text.split(",") if v.strip()]
            if name == "confirm_seeds" and text == "none":
                typed = []
            value = tuple(v for v, _ in typed)
            problem = next((p for _, p in typed if p), None)
        elif kind in (bool, int, float, str):
            value, problem = coerce(name, text, kind)
        else:  # pack: a number of trials, or auto
            value, problem = (text, None) if text == "auto" else coerce(name, text, int)
        if problem:
            problems.append(problem)
        else:
            values[name] = value
    return values, problems


def split(text: str, kind=str) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def narrow(sweep: SweepConfig, args: argparse.Namespace) -> SweepConfig:
    """Apply the command line to a declared (a preset's or a file's) SweepConfig: the fields
    of ``--config`` FILE, then the narrowing flags and the SweepConfig flags."""
    if args.config:
        sweep = sweep.updated(
            load_mapping(args.config, "sweep config file", "SweepConfig fields"), args.config
        )
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
    # Last overrides win over the preset's per-task settings.
    forced = {"max_steps": args.steps} if args.steps else {}
    everywhere, per_task = parse_assignments(args.set)
    forced.update(everywhere)
    added = ((({}, forced),) if forced else ()) + tuple(
        ({"task": task}, values) for task, values in per_task.items()
    )
    if added:
        changes["overrides"] = (*sweep.overrides, *added)
    values, problems = sweep_flag_values(args)
    sweep = dataclasses.replace(sweep, **changes, **values)
    if problems:  # with the rest of the sweep's, in one message
        raise ConfigError(list(dict.fromkeys(problems + sweep.problems() + sweep.arm_problems())))
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
    from scale_fpt.models.backbones import CPU_PRESETS, LOCAL_CORPORA  # torch: start-up time

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
    # What a run needs (torch, pyarrow, Ray) is imported when a sweep runs: the flags of this
    # module build every parser, --help included (start-up time).
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
    problems = preflight_problems(sweep.trials())
    if problems:
        raise ConfigError(problems)


def sweep_plan(sweep):
    """The plan ``--plan`` prints (``sweep.plan.SweepPlan``: the value the driver looks each
    Tune trial's resources up in), made without Ray: the GPU is the declared one
    (``--gpu``), else ``gpus.DEFAULT_GPU``; the slots one node of it
    (``sweep.plan.assumed_resources``)."""
    # The profile loads torch: imported for --plan (start-up time).
    from scale_fpt.sweep.plan import plan_sweep, sweep_placement

    cpu_only = sweep.gpu_request.kind == "cpu"
    offer = planned_offer(cpu_only, sweep.declared_gpu, sweep.cluster_config, connected=False)
    return plan_sweep(sweep, sweep_placement(sweep, offer))


def placement_table(sweep) -> str:
    """What runs where: the sweep's plan (``sweep_plan``), each distinct Ray trial with its
    count, and the study's GPU-hours per model (``sweep.plan.study_gpu_hours``) on the GPU
    the sweep plans for."""
    # The plan loads torch: imported for --plan (start-up time).
    from scale_fpt.steps.choice import planned_step
    from scale_fpt.sweep.plan import search_cohorts, study_gpu_hours

    plan = sweep_plan(sweep)
    offer, devices, arms = plan.offer, plan.devices, plan.arms
    counts: Counter = Counter()
    for cohort in search_cohorts(plan) if sweep.search else plan.cohorts:
        config = cohort.profile.config  # --plan validated every arm
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
                f"{cohort.describe()}; "
                + planned_step(cohort.kind, config.train, cohort.plan).how(),
            )
        ] += 1
    per_arm = sweep.search_trials if sweep.search else 1  # an Optuna search runs each arm N times
    where = offer.gpu.name if offer.gpu else "CPUs"
    slots = f"{devices.slots} {'GPU' if devices.gpus else 'CPU'} slot(s)"
    lines = [f"{sweep.name}: {len(arms)} arms x {per_arm} trial(s) on {where}"]
    lines.append(f"  seeds {', '.join(map(str, sweep.seeds))}" + confirmation_line(sweep))
    lines.append(
        f"  Ray trials ({'per searched arm' if sweep.search else 'of the grid'}; --pack "
        f"{sweep.pack} for {slots}):"
    )
    lines += [
        f"  {n:>3} x {model} {finetune} {task}, {budget}, {batch}: {where}"
        for (model, finetune, task, budget, batch, where), n in sorted(counts.items())
    ]
    if offer.gpu is not None:
        hours = study_gpu_hours(plan)
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
    from scale_fpt.sweep.confirm import confirmation_sweep  # pandas: start-up time

    choice = sweep.choice_fields()
    confirm = confirmation_sweep(sweep, choice)
    return (
        f"; then each arm's chosen {' and '.join(choice)} on fresh seeds "
        f"{', '.join(map(str, sweep.confirm_seeds))} (sweep {confirm.name}, "
        f"{len(confirm.trials())} trials)"
    )


def summary_table(sweep) -> str:
    """The sweep's closing summary: ``arm_summary`` of its trials, its statuses, and the
    pretrained-minus-random findings; nothing in it is chosen on test."""
    from scale_fpt.results import load_results  # pyarrow and pandas: start-up time

    results = load_results(sweep.results_dir, sweep.name)
    trials = results.trials
    if trials.empty:
        return "(no trials)"
    status = trials["status"].value_counts().to_dict()
    return (
        f"\n{sweep.name}: test accuracy at the step of best validation accuracy within each "
        f"trial's budget, over seeds: mean, Student-t 95% interval, n seeds (results in "
        f"{sweep.sweep_dir}; statuses {status})\n{arm_summary(trials).to_string(index=False)}\n"
        f"{findings(trials, results.curves)}"
        f"tables, figures and attention maps: scale-fpt report {sweep.results_dir}\n"
    )


def arm_summary(trials):
    """One row per arm: ``ARM_LABEL_FIELDS``, then each other config field that tells apart
    arms sharing those (a grid's or search's learning rates, batch sizes, ...; a value that
    only follows the task, as the presets' per-task lr, is no column), so configurations are
    never pooled into one mean; ``test_accuracy`` over the arm's seeds: its mean with the
    Student-t 95% interval of ``report.stats`` (``-`` for a single seed) and n."""
    from scale_fpt.report.stats import no_spread_note, t_half_width  # scipy: start-up time

    label = list(ARM_LABEL_FIELDS)
    others = [f for f in FIELD_TYPES if f in trials and f not in (*label, "seed")]
    spread = trials.groupby(label, dropna=False)[others].nunique().max()
    keys = [*label, *(f for f in others if spread[f] > 1)]
    # A trial that never built has a row of the fields its sweep set; it ran (or would have)
    # on the defaults of the others.
    defaults = TrialConfig().to_flat()
    design = trials[keys].fillna({k: defaults[k] for k in keys if defaults[k] is not None})
    by = [design[k] for k in keys]
    cells = trials.groupby(by, dropna=False)["test_accuracy"].agg(["mean", "std", "count"])
    half = t_half_width(cells["std"].to_numpy(), cells["count"].to_numpy())
    shown = cells.reset_index()[keys]
    for key in keys[len(label) :]:  # as the sweep states them
        shown[key] = shown[key].map(lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    low = (cells["mean"] - half).map("{:.3f}".format)
    high = (cells["mean"] + half).map("{:.3f}".format)
    shown["test acc"] = cells["mean"].map("{:.3f}".format).to_numpy()
    interval = ("[" + low + ", " + high + "]").where(cells["count"] > 1, "-")
    # Seeds that all tie (a ceiling) get no zero-wide "95% interval": it would claim a
    # certainty that n seeds cannot give (report.stats.no_spread_note).
    tied = (cells["count"] > 1) & (cells["std"] == 0)
    notes = cells["count"].map(no_spread_note)
    shown["95% interval"] = interval.where(~tied, notes).to_numpy()
    shown["n"] = cells["count"].to_numpy()
    return shown


def findings(trials, curves=None) -> str:
    """One line per setting where both inits ran: pretrained minus random, paired on the
    seeds they share (``report.tables.init_difference``): test accuracy at the selected step
    within the budget (not a converged accuracy), and steps to the threshold as censored
    data (Kaplan-Meier medians, log-rank) at each task's threshold (90% of the paper's FPT
    accuracy, as Table 4; read from ``curves``)."""
    from scale_fpt.report.tables import difference_text, init_difference  # start-up time

    lines = [
        f"{row['task']} ({row['model']}, {row['finetune_label']}, lr {row['lr']:g}, "
        f"{int(row['max_steps']):,}-step budget, threshold {row['accuracy_threshold']:g}): "
        + difference_text(row)
        for row in init_difference(trials, curves=curves).to_dict("records")
    ]
    return "".join(line + "\n" for line in lines)
