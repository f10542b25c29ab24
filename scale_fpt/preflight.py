"""Can every arm of a sweep reach its data and weights? Checked before Ray starts.

A paper sweep on rented GPUs must not launch nodes for trials that fail at their first
batch because a dataset is missing. ``sweep_problems`` looks, per arm, where the trial
itself will look (``tasks/*``, ``models/backbones``): a local directory, the local Hugging
Face cache, or the hub when it answers; it opens no dataset and loads no weights, so it
takes well under a second for the paper presets.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from scale_fpt.config import ABLATIONS, TrialConfig, parse_trial
from scale_fpt.scaling import GPT2_SIZES

DATA_FOLDERS = {
    "listops": "listops",
    "homology": "homology",
    "mnist": "mnist",
    "cifar10": "cifar10",
    "cifar10-lra": "cifar10",
}
"""The folder under ``--data-root DIR`` that each data-reading task reads (``DIR/<folder>``):
CIFAR-10 LRA reads the same CIFAR-10 files as cifar10. The bit tasks generate their data."""

DATA_DOC = "docs/data.md"


def data_problem(config: TrialConfig) -> str:
    """Why the trial cannot reach its data ('' when it can)."""
    from scale_fpt.tasks.base import DataUnavailable  # torch: only when checked

    task = config.task
    try:
        if task.task == "homology":
            from scale_fpt.tasks.homology import TAPE_SPLITS, find_split  # torch: only when checked

            for tape in TAPE_SPLITS.values():
                find_split(task.data_dir, tape)
        elif task.task == "listops" and task.data_dir:
            from scale_fpt.tasks.listops import find_lra_files  # torch: only when checked

            find_lra_files(task.data_dir)
        elif task.task in ("mnist", "cifar10", "cifar10-lra"):
            return image_data_problem(task.task, task.data_dir)
    except DataUnavailable as e:
        return str(e)
    return ""


def image_data_problem(task: str, data_dir: str) -> str:
    from scale_fpt.tasks.images import HUB_IDS, _parquet_files  # torch: only when checked

    hub_id = HUB_IDS[task]
    if data_dir:
        folder = Path(data_dir)
        if not folder.is_dir():
            return f"{task}: --data-dir {data_dir} is not a directory"
        if (folder / "dataset_dict.json").is_file() or all(_parquet_files(folder).values()):
            return ""
        return (
            f"{task}: no {hub_id} data in {data_dir} (expected a datasets save_to_disk "
            "directory, or train-*.parquet and test-*.parquet files)"
        )
    if hub_dataset_cached(hub_id):
        return ""
    from scale_fpt.models.backbones import hub_reachable  # torch: only when checked

    if hub_reachable():
        return ""
    return f"{task}: {hub_id} is not in the Hugging Face cache and the hub cannot be reached"


def hub_dataset_cached(hub_id: str) -> bool:
    """Whether ``datasets.load_dataset(hub_id)`` can run offline: its files in the hub cache
    or its prepared Arrow tables in the datasets cache."""
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}" / "snapshots"
    datasets_cache = Path(
        os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets")
    ) / hub_id.replace("/", "___")
    return (hub.is_dir() and any(hub.iterdir())) or datasets_cache.is_dir()


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
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json"), str):
        return ""
    from scale_fpt.models.backbones import hub_reachable  # torch: only when checked

    if hub_reachable():
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
    folders = ", ".join(sorted(set(DATA_FOLDERS.values())))
    return [
        *problems,
        "nothing was started; `scale-fpt fetch` with this command's arguments downloads what "
        "is missing (data into --data-root DIR, weights into the Hugging Face cache); data "
        f"already on disk: --data-root DIR (DIR/<folder> for {folders}) or per task --set "
        f"TASK.data_dir=DIR ({DATA_DOC}); "
        "or leave those arms out (--tasks, --models, --inits)",
    ]
