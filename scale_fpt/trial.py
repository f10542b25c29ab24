"""One trial or one cohort, one plain path: configs in -> task, step, states -> ``loop.fit``
-> rows out.

``scale-fpt train``, every sweep trial and every packed cohort run exactly this
(``TrialRun``); only what happens at each evaluation differs (a progress line and Parquet
on the command line, a ``ray.tune.report`` with a checkpoint in a sweep). Each member keeps
its own id (``trial_id_for(sweep, config.to_flat())``, the same packed or alone), rows
(``TrialRecord``), status and evaluation history.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import socket
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata

import torch

from scale_fpt.checkpoints import load_weights, weights_file
from scale_fpt.config import ConfigError, TrialConfig, parse_trial
from scale_fpt.loop import Evaluation, TrialState, fit, restore_checkpoint, save_checkpoint
from scale_fpt.models import build_model
from scale_fpt.profile import TrialProfile, config_profile
from scale_fpt.provenance import git_sha
from scale_fpt.results_schema import SCHEMA_VERSION, recorded_config
from scale_fpt.seeding import seed_streams
from scale_fpt.steps.cohort import CohortStep
from scale_fpt.steps.engine import EngineStep
from scale_fpt.tasks import build_task, release_device_draws
from scale_fpt.tasks.base import Task
from scale_fpt.vocabulary import Status, StepKind, StopReason
from scale_fpt.world import SINGLE_PROCESS, World

STACK = ("scale-fpt", "torch", "transformers", "deepspeed", "ray", "optuna", "datasets", "pyarrow")


def trial_id_for(sweep: str, flat: dict) -> str:
    """Content address of a trial (``flat`` = ``TrialConfig.to_flat()``): the same sweep and
    config give the same id on every run, so a resumed or repeated sweep rewrites its rows
    instead of adding new ones."""
    blob = json.dumps({"sweep": sweep, **flat}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def config_trial_id(sweep: str, flat: dict) -> str:
    """The id of the trial a flat config makes (the raw flat's id for a config that does
    not build: its failed row still gets a stable id)."""
    try:
        return trial_id_for(sweep, parse_trial(flat).to_flat())
    except ConfigError:
        return trial_id_for(sweep, flat)


SEARCH_CONFIG = "search_config"
"""Key of a member's Optuna trial number in a search's Tune config, and the trials column
that records it (null for grid trials)."""


def split_search_config(flat: dict) -> tuple[dict, int | None]:
    """A member's flat trial config without its ``search_config`` tag, and the tag."""
    flat = dict(flat)
    return flat, flat.pop(SEARCH_CONFIG, None)


def member_search_configs(sweep: str, tune_config: dict) -> dict[str, int]:
    """``{trial_id: search_config}`` of the members of a search's Tune config ({} for grid
    trials), to tag their rows on the driver."""
    out = {}
    for member in tune_config.get("members", []):
        flat, number = split_search_config(member)
        if number is not None:
            out[config_trial_id(sweep, flat)] = number
    return out


def without_search_configs(tune_config: dict) -> dict:
    """A search's Tune config with its members untagged (what the trainables take)."""
    if "members" not in tune_config:
        return tune_config
    members = [split_search_config(m)[0] for m in tune_config["members"]]
    return {**tune_config, "members": members}


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
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "schema_version": SCHEMA_VERSION,
    }


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


@dataclass
class TrialRecord:
    """What is known about a trial before it trains; turns its progress into rows."""

    sweep: str
    trial_id: str
    profile: TrialProfile
    device: str

    @property
    def config(self) -> TrialConfig:
        return self.profile.config

    def curve_row(self, evaluation: Evaluation) -> dict:
        flat = recorded_config(self.config.to_flat())
        return {"sweep": self.sweep, "trial_id": self.trial_id, **asdict(evaluation), **flat}

    def trial_row(self, state: TrialState, error: str | None = None) -> dict:
        train = self.config.train
        last, selected = state.last, state.selected()
        flops, built = self.profile.flops[0], self.profile.built
        return {
            "sweep": self.sweep,
            "trial_id": self.trial_id,
            **recorded_config(self.config.to_flat()),
            "status": Status.FAILED.value if error else state.status,
            "stop_reason": StopReason.FAILED.value if error else state.stop_reason,
            "steps_done": state.step,
            "best_val_accuracy": selected.val_accuracy if selected else None,
            "selected_step": selected.step if selected else None,
            "val_accuracy": selected.val_accuracy if selected else None,
            "test_accuracy": selected.test_accuracy if selected else None,
            "final_test_accuracy": last.test_accuracy if last else None,
            "best_test_accuracy": state.best_test_accuracy() if last else None,
            "final_test_loss": last.test_loss if last else None,
            "final_train_loss": last.train_loss if last else None,
            "steps_to_threshold": state.steps_to_threshold(train.accuracy_threshold),
            "trainable_params": built.trainable_params,
            "total_params": built.total_params,
            "trained_groups": "+".join(built.trained_groups),
            "group_params": json.dumps(built.counts),
            "n_layer": built.n_layer,
            "d_model": built.d_model,
            "n_tokens": self.profile.spec.n_tokens,
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


class TrialRun:
    """K >= 1 trials built on one step: ``run`` trains them through ``loop.fit``.

    ``configs``: one trial, or the members of a cohort (``packing.cohorts``). ``kind``:
    ``cohort`` or ``engine`` (default the profile's ``kind``; a cohort of K > 1 is always
    ``cohort``). ``task``: a prebuilt task (benchmarks pass synthetic data); by default
    built from the first config.
    ``world``: this process's place in a trial of ``workers`` > 1 processes (an ``engine``
    trial; ``scale_fpt.distributed`` launches the ranks)."""

    def __init__(
        self,
        configs: list[TrialConfig],
        sweep: str = "train",
        kind: str | None = None,
        task: Task | None = None,
        world: World = SINGLE_PROCESS,
    ):
        first = configs[0]
        profiles = [config_profile(config) for config in configs]
        self.kind = kind or (StepKind.COHORT if len(configs) > 1 else profiles[0].kind)
        if self.kind not in tuple(StepKind) or (self.kind == StepKind.ENGINE and len(configs) > 1):
            raise ValueError(f"step kind {self.kind!r} for {len(configs)} trial(s)")
        task = task if task is not None else build_task(first.task, first.train.seed)
        # What draws from torch's global generator (non-GPT-2 and LSTM dropout) starts from
        # the trial's dropout stream; GPT-2 dropout is keyed and does not draw from it.
        torch.manual_seed(seed_streams(first.train.seed).dropout)
        if self.kind == StepKind.ENGINE:
            self.step = EngineStep(first.train, task, build_model(first, task.spec), world)
        else:
            self.step = CohortStep(configs, task)
        self.train = first.train
        self.records = [
            TrialRecord(
                sweep=sweep,
                trial_id=trial_id_for(sweep, config.to_flat()),
                profile=profile,
                device=self.step.device,
            )
            for config, profile in zip(configs, profiles, strict=True)
        ]
        ids = self.trial_ids
        if len(set(ids)) != len(ids):
            self.step.close()
            raise ConfigError(["a cohort holds the same trial twice (identical configs)"])
        self.states = [TrialState() for _ in configs]
        self.position = 0
        self.selected_weights: dict[int, dict[str, torch.Tensor]] = {}
        """Per member, its trained tensors at its selected evaluation (best validation
        accuracy so far): the weights file of each checkpoint, so attention maps and any
        rebuilt model are those of the step the row reports."""

    @property
    def trial_ids(self) -> list[str]:
        return [r.trial_id for r in self.records]

    @property
    def finished(self) -> bool:
        return not any(s.running for s in self.states)

    def run(
        self,
        on_eval: Callable[[list[dict], list[dict]], None] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[dict]:
        """Train every member to its end. ``on_eval(curve_rows, trial_rows)`` after each
        evaluation: the curve rows of the members evaluated, the trial rows of all (status
        ``running`` until their last). Returns the final trial rows. Exceptions propagate:
        the caller decides between retry and failed rows."""

        def report(position: int, evaluated: list[int]) -> None:
            self.position = position
            for i in evaluated:  # every rank runs this alike (member_weights may gather)
                if self.states[i].selected().step == position:
                    self.selected_weights[i] = self.step.member_weights(i)
            if on_eval:
                curves = [self.records[i].curve_row(self.states[i].history[-1]) for i in evaluated]
                on_eval(curves, self.trial_rows())

        self.position = fit(self.step, self.states, self.train, self.position, report, progress)
        return self.trial_rows()

    def trial_rows(self, error: str | None = None) -> list[dict]:
        rows = [r.trial_row(s, error) for r, s in zip(self.records, self.states, strict=True)]
        compilation = self.step.compilation
        ran = {
            "cohort_size": len(rows),
            "step_kind": str(self.kind),
            "step_mode": compilation.mode,
            "step_compiled": compilation.compiled,
        }
        return [{**row, **ran} for row in rows]

    def failed_rows(self, error: BaseException) -> list[dict]:
        return self.trial_rows(error=error_text(error))

    def save(self, directory: str) -> None:
        save_checkpoint(
            directory, self.step, self.states, self.trial_ids, self.position, self.selected_weights
        )

    def restore(self, directory: str) -> None:
        self.states, self.position = restore_checkpoint(directory, self.step, self.trial_ids)
        self.selected_weights = {}
        for i, trial_id in enumerate(self.trial_ids):
            path = os.path.join(directory, weights_file(trial_id))
            if self.states[i].history and os.path.exists(path):  # rank 0 wrote them
                self.selected_weights[i] = load_weights(path)

    def close(self) -> None:
        self.step.close()
        release_device_draws()


def error_text(error: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    tail = "".join(traceback.format_tb(error.__traceback__)[-3:])
    return (text + "\n" + tail)[:limit]
