"""``scale-fpt train`` and ``scale-fpt plan``: one trial, trained (its rows and checkpoints
written as a sweep writes them) or planned (counts from the architecture alone). The command
line (``cli``) imports this module when one of them is dispatched: it loads torch."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tqdm import tqdm

from scale_fpt import planner
from scale_fpt.config import TrialConfig
from scale_fpt.loop import CheckpointDir
from scale_fpt.models import empty_groups, family_name
from scale_fpt.profile import TrialProfile, config_profile
from scale_fpt.results import ResultsError, ResultsWriter
from scale_fpt.steps.choice import planned_step
from scale_fpt.tasks.preprocessing import preprocessing
from scale_fpt.trial import TrialRun
from scale_fpt.vocabulary import Status, StepKind

SUMMARY_KEYS = (
    "trial_id",
    "status",
    "steps_done",
    "stop_reason",
    "selected_step",
    "val_accuracy",
    "test_accuracy",
    "final_test_accuracy",
    "best_test_accuracy",
    "final_test_loss",
    "steps_to_threshold",
    "trainable_params",
    "total_params",
    "wall_time_s",
)


def train(args: argparse.Namespace, config: TrialConfig) -> int:
    trial = TrialRun([config], sweep=args.sweep)
    (trial_id,) = trial.trial_ids
    writer = ResultsWriter(args.results, args.sweep)
    # One subdirectory per trial: a directory reused with other flags never resumes (and
    # reports) a different trial.
    checkpoints = (
        CheckpointDir(str(Path(args.checkpoint_dir) / trial_id)) if args.checkpoint_dir else None
    )
    if checkpoints and checkpoints.latest():
        trial.restore(checkpoints.latest())
    bar = progress_bar(config, trial.position, disable=args.no_progress)

    def on_eval(curve_rows: list[dict], trial_rows: list[dict]) -> None:
        for curve_row in curve_rows:
            writer.write_curve(trial_id, [curve_row])
            bar.set_postfix(
                val_acc=f"{curve_row['val_accuracy']:.3f}",
                train_loss=f"{curve_row['train_loss']:.4f}",
            )
        writer.write_trial(trial_rows[0])
        if checkpoints:
            checkpoints.save(trial.save, trial.position)

    try:
        (row,) = trial.run(on_eval=on_eval, progress=lambda position: bar.update(1))
        code = 0
    except KeyboardInterrupt:
        (row,) = trial.trial_rows()
        row = {**row, "status": Status.STOPPED.value}
        code = 130
    except ResultsError:
        # The results directory failed (full, unwritable), not the trial: say that, once
        # (exit code 2), instead of recording a "failed" trial on a disk that takes no rows.
        trial.close()
        raise
    except Exception as e:  # recorded as a failed trial, not re-raised: the row is the record
        (row,) = trial.failed_rows(e)
        print(f"scale-fpt: trial failed: {row['error']}", file=sys.stderr)
        code = 1
    finally:
        bar.close()
    if checkpoints and checkpoints.latest():
        row["checkpoint"] = checkpoints.latest()
    writer.write_trial(row)
    trial.close()
    print(json.dumps({k: row.get(k) for k in SUMMARY_KEYS}))
    return code


def process_memory(profile: TrialProfile, kind: StepKind) -> planner.TrialMemory:
    """One process of the trial's step of ``kind`` on a CPU (attention materialised): a
    cohort of one (``planner.cohort_memory``) or an engine (``planner.trial_memory``)."""
    train = profile.config.train
    if kind == StepKind.COHORT:
        return profile.cohort_memory(1)
    return planner.trial_memory(
        profile.shape, train.precision, train.batch_size, train.zero_stage, fused_attention=False
    )


def progress_bar(config: TrialConfig, start: int, disable: bool):
    return tqdm(
        total=config.train.max_steps,
        initial=start,
        desc=f"{config.task.task} {config.model.model} {config.model.init} {config.train.finetune}",
        disable=disable,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def plan(config: TrialConfig, placement) -> int:
    """Counts from the architecture alone (the trial's profile: built on the meta device, no
    weights loaded)."""
    profile = config_profile(config)
    built, spec, train = profile.built, profile.spec, config.train
    train_flops, eval_flops = profile.flops
    step = placement.plan
    # By the step's own memory model: as planned on its GPU, else one process on a CPU.
    one = step.memory or process_memory(profile, placement.kind)
    memory, activations = one.weights + one.gradients + one.optimizer, one.activations
    attention = one.attention
    print(f"{'group':<10}{'trainable':>16}{'frozen':>16}{'total':>16}")
    for group, count in built.counts.items():
        frozen = count["total"] - count["trainable"]
        print(f"{group:<10}{count['trainable']:>16,}{frozen:>16,}{count['total']:>16,}")
    total, trainable = built.total_params, built.trainable_params
    print(f"{'all':<10}{trainable:>16,}{total - trainable:>16,}{total:>16,}")
    print(f"trained groups: {'+'.join(built.trained_groups)} ({100 * trainable / total:.3f}%)")
    empty = empty_groups(built, config.model.init)
    print(f"family: {family_name(built, config.model.init)}")
    for group, why in empty.items():
        print(f"empty group {group}: {why}")
    print(f"sequence: {spec.n_tokens} tokens; batch {train.batch_size}")
    if "pos" in built.counts and built.d_model:
        rows = built.counts["pos"]["total"] // built.d_model
        print(f"positions: the task's {min(spec.n_tokens, rows)} of the table's {rows} rows train")
    print(
        f"FLOPs per training step: {train_flops:.3e}; per evaluation batch of the same size: {eval_flops:.3e}"
    )
    print(
        f"memory of one process ({placement.kind} step): weights+grads+optimizer "
        f"{memory / 2**20:,.1f} MiB, "
        f"activations ~{activations / 2**20:,.1f} MiB, attention with dropout "
        f"~{attention / 2**20:,.1f} MiB"
    )
    where = f"{step.gpu.name} ({step.gpu.memory_mib:,} MiB)" if step.gpus else "CPUs"
    print(f"on {where}: {placement.describe()}")
    if step.memory:
        m = step.memory
        print(
            f"  per GPU: weights {m.weights / 2**20:,.1f} MiB, gradients {m.gradients / 2**20:,.1f}"
            f" MiB, optimizer {m.optimizer / 2**20:,.1f} MiB, activations "
            f"{m.activations / 2**20:,.1f} MiB, attention {m.attention / 2**20:,.1f} MiB; "
            "with CUDA context and allocator slack "
            f"{m.device / 2**20:,.1f} MiB"
        )
    print(
        f"GPUs needed: {step.gpus}; ZeRO stage: {step.zero_stage}; "
        f"trials per GPU: {step.trials_per_gpu}"
    )
    choice = planned_step(placement.kind, train, step)
    print(f"step: {choice.describe()}")
    aspects = preprocessing(config)
    print(f"preprocessing of {config.task.task} (* = differs from what the paper's numbers used):")
    for a in aspects:
        mark = " " if a.as_published else "*"
        print(f"{mark} {a.name}: {a.here} | paper: {a.paper} | reference code: {a.reference}")
    summary = {
        "groups": built.counts,
        "family": family_name(built, config.model.init),
        "empty_groups": empty,
        "trainable_params": trainable,
        "total_params": total,
        "n_tokens": spec.n_tokens,
        "train_flops_per_step": train_flops,
        "state_bytes": memory,
        "activation_bytes": activations,
        "attention_bytes": attention,
        "preprocessing": [dataclasses.asdict(a) for a in aspects],
        "step_kind": str(choice.kind),
        "step_mode": choice.mode,
        "gpu": step.gpu.name if step.gpus else None,
        "gpus": step.gpus,
        "zero_stage": step.zero_stage,
        "trials_per_gpu": step.trials_per_gpu,
        "workers": step.workers,
        "gpu_bytes": placement.device_bytes or None,
        "fits": step.fits,
    }
    print(json.dumps(summary))
    return 0
