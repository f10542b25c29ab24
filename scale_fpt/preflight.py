"""Can every arm of a sweep reach its data and weights? Checked before Ray starts.

A paper sweep on rented GPUs must not launch nodes for trials that fail at their first
batch because a dataset is missing. ``sweep_problems`` looks, per arm, where the trial
itself will look (``tasks/*``, ``models/backbones``): a local directory, the local Hugging
Face cache, or the hub when it answers; it opens no dataset and loads no weights, so it
takes well under a second for the paper presets.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from scale_fpt.config import ABLATIONS, TrialConfig, parse_trial
from scale_fpt.hub import hub_reachable
from scale_fpt.scaling import GPT2_SIZES
from scale_fpt.task_registry import data_folders

DATA_DOC = "docs/data.md"


def data_problem(config: TrialConfig) -> str:
    """Why the trial cannot reach its data ('' when it can), as its task class says
    (``Task.data_problem``)."""
    # The task classes load torch: imported only when data is checked.
    from scale_fpt.tasks.base import DataUnavailable
    from scale_fpt.tasks.build import task_class

    try:
        return task_class(config.task.task).data_problem(config.task)
    except DataUnavailable as e:
        return str(e)


def weights_needed(config: TrialConfig) -> tuple[str, bool]:
    """(The hub id or directory whose files the trial reads, whether it reads only its
    ``config.json``); ``("", False)`` when it reads none: the LSTM, a body drawn at random
    (``random`` and the ablation arms) on an architecture built from a preset's numbers
    (GPT-2, Pythia and the family CPU presets: ``load_architecture``), a CPU preset's local
    backbone (made by the sweep itself)."""
    from scale_fpt.models.backbones import (  # torch: only when checked
        CPU_PRESETS,
        LOCAL_CORPORA,
        family_size,
        weights_source,
    )

    model = config.model
    if model.model == "lstm":
        return "", False
    if model.init in ("random", *ABLATIONS):
        preset = model.model in GPT2_SIZES or family_size(model.model) is not None
        return ("", False) if preset else (model.model, True)
    if model.model in CPU_PRESETS and model.weights in ("", *LOCAL_CORPORA):
        return "", False
    return weights_source(model), False


def weights_problem(config: TrialConfig) -> str:
    """Why the trial cannot reach its weights, or (for a hub id) its architecture ('' when
    it can). CPU presets' local backbones are made by the sweep itself before it starts."""
    model = config.model
    source, _ = weights_needed(config)
    if not source:
        return ""
    if Path(source).is_dir():
        if (Path(source) / "config.json").is_file():
            return ""
        return f"{model.model}: {source} has no config.json (not a save_pretrained directory)"
    if source.startswith(("/", ".", "~")):
        return f"{model.model}: weights directory {source} does not exist"
    # The hub's client (httpx) takes a quarter second to import: only when weights are checked.
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json"), str) or hub_reachable():
        return ""
    return (
        f"{model.model}: {source!r} is not in the Hugging Face cache and the hub cannot be reached"
    )


def sweep_problems(arms: list[dict]) -> list[str]:
    """One line per distinct problem, naming the arms it stops (``SweepConfig.trials()``)."""
    stopped: dict[str, list[str]] = defaultdict(list)
    checked: dict[tuple, list[str]] = {}
    for arm in arms:
        config = parse_trial(arm)
        key = (config.task, config.model.model, config.model.init, config.model.weights)
        if key not in checked:
            checked[key] = [p for p in (data_problem(config), weights_problem(config)) if p]
        label = f"{config.task.task}/{config.model.model}/{config.model.init}"
        for problem in checked[key]:
            if label not in stopped[problem]:
                stopped[problem].append(label)
    return [f"{problem} [{arms_text(labels)}]" for problem, labels in stopped.items()]


def arms_text(labels: list[str], shown: int = 3) -> str:
    more = f", and {len(labels) - shown} more" if len(labels) > shown else ""
    return f"{len(labels)} arm(s): {', '.join(labels[:shown])}{more}"


def preflight_problems(arms: list[dict]) -> list[str]:
    """[] when every arm can run; else every problem with the arms it stops, then what to do
    about them, as one ConfigError's lines."""
    problems = sweep_problems(arms)
    if not problems:
        return []
    folders = ", ".join(sorted(data_folders()))
    return [
        *problems,
        "nothing was started; `scale-fpt fetch` with this command's arguments downloads what "
        "is missing (data into --data-root DIR, weights into the Hugging Face cache); data "
        f"already on disk: --data-root DIR (DIR/<folder> for {folders}) or per task --set "
        f"TASK.data_dir=DIR ({DATA_DOC}); "
        "or leave those arms out (--tasks, --models, --inits)",
    ]
