"""One trial, one plain path: config in -> build task and model -> fit -> rows out.

``scale-fpt train`` and every sweep trial run exactly this (``run_trial``); only what happens
at each evaluation differs (a progress line and Parquet on the command line, a
``ray.tune.report`` with a checkpoint in a sweep).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import socket
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata

import torch

from scale_fpt import scaling
from scale_fpt.config import TrialConfig
from scale_fpt.models import BuiltModel, build_model
from scale_fpt.provenance import git_sha
from scale_fpt.results import SCHEMA_VERSION
from scale_fpt.tasks import build_task
from scale_fpt.tasks.base import TaskSpec
from scale_fpt.trainer import Evaluation, Trainer, TrialState

STACK = ("scale-fpt", "torch", "transformers", "deepspeed", "ray", "optuna", "datasets", "pyarrow")


def trial_id_for(sweep: str, flat: dict) -> str:
    """Content address of a trial (``flat`` = ``TrialConfig.to_flat()``): the same sweep and
    config give the same id on every run, so a resumed or repeated sweep rewrites its rows
    instead of adding new ones."""
    blob = json.dumps({"sweep": sweep, **flat}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


@functools.cache
def versions() -> str:
    found = {}
    for package in STACK:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return json.dumps(found, sort_keys=True)


def provenance() -> dict:
    """Where and with what a row was written: every trials row carries these."""
    return {
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "versions": versions(),
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "schema_version": SCHEMA_VERSION,
    }


def step_flops(built: BuiltModel, spec: TaskSpec, batch_size: int) -> tuple[int, int]:
    """(training FLOPs, evaluation FLOPs) of one step of ``batch_size`` sequences."""
    module = built.module
    embedding_weights = {
        id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)
    }
    matmul = trained = 0
    for p in module.parameters():
        if p.dim() == 2 and id(p) not in embedding_weights:
            matmul += p.numel()
            trained += p.numel() if p.requires_grad else 0
    is_transformer = not hasattr(module.backbone, "lstm")
    attention = (
        scaling.attention_flops_per_sequence(built.n_layer, built.d_model, spec.n_tokens)
        if is_transformer
        else 0
    )
    backbone_backward = any(g != "output" for g in built.trained_groups)
    return (
        scaling.train_step_flops(
            matmul, trained, attention, spec.n_tokens, batch_size, backbone_backward
        ),
        scaling.eval_step_flops(matmul, attention, spec.n_tokens, batch_size),
    )


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


@dataclass
class TrialRecord:
    """What is known about a trial before it trains; turns its progress into rows."""

    sweep: str
    trial_id: str
    config: TrialConfig
    built: BuiltModel
    spec: TaskSpec
    device: str

    @functools.cached_property
    def flops_per_step(self) -> int:
        return step_flops(self.built, self.spec, self.config.train.batch_size)[0]

    def curve_row(self, evaluation: Evaluation) -> dict:
        flat = self.config.to_flat()
        return {"sweep": self.sweep, "trial_id": self.trial_id, **asdict(evaluation), **flat}

    def trial_row(self, state: TrialState, error: str | None = None) -> dict:
        train = self.config.train
        last = state.last
        flops = self.flops_per_step
        return {
            "sweep": self.sweep,
            "trial_id": self.trial_id,
            **self.config.to_flat(),
            "status": "failed" if error else state.status,
            "steps_done": state.step,
            "final_test_accuracy": last.test_accuracy if last else None,
            "best_test_accuracy": state.best_test_accuracy() if last else None,
            "final_test_loss": last.test_loss if last else None,
            "final_train_loss": last.train_loss if last else None,
            "steps_to_threshold": state.steps_to_threshold(train.accuracy_threshold),
            "trainable_params": self.built.trainable_params,
            "total_params": self.built.total_params,
            "trained_groups": "+".join(self.built.trained_groups),
            "group_params": json.dumps(self.built.counts),
            "n_layer": self.built.n_layer,
            "d_model": self.built.d_model,
            "n_tokens": self.spec.n_tokens,
            "flops_per_step": float(flops),
            "total_flops": float(flops) * state.step,
            "samples_seen": state.step * train.batch_size,
            "wall_time_s": state.wall_seconds,
            "train_time_s": state.train_seconds,
            "device": device_name(self.device),
            "error": error,
            "checkpoint": None,  # set by the caller that keeps checkpoints (CLI, sweep)
            **provenance(),
        }


class Trial:
    """A built trial: task, model, engine. ``run`` trains it and returns its final row."""

    def __init__(self, config: TrialConfig, sweep: str = "train", trial_id: str | None = None):
        self.config = config
        task = build_task(config.task, config.train.seed)
        built = build_model(config, task.spec)
        self.trainer = Trainer(config.train, task, built)
        self.record = TrialRecord(
            sweep=sweep,
            trial_id=trial_id or trial_id_for(sweep, config.to_flat()),
            config=config,
            built=built,
            spec=task.spec,
            device=self.trainer.device,
        )

    def run(
        self,
        on_eval: Callable[[dict, dict], None] | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> dict:
        """Train to the end (or divergence). ``on_eval(curve_row, trial_row)`` at each
        evaluation, where ``trial_row`` is the trial as it stands (status ``running`` until
        the last). Exceptions propagate: the caller decides between retry and a failed row."""
        record = self.record

        def report(evaluation: Evaluation) -> None:
            if on_eval:
                on_eval(record.curve_row(evaluation), record.trial_row(self.trainer.state))

        state = self.trainer.fit(on_eval=report, progress=progress)
        return record.trial_row(state)

    def failed_row(self, error: BaseException) -> dict:
        return self.record.trial_row(self.trainer.state, error=error_text(error))

    def close(self) -> None:
        self.trainer.close()


def error_text(error: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    tail = "".join(traceback.format_tb(error.__traceback__)[-3:])
    return (text + "\n" + tail)[:limit]
