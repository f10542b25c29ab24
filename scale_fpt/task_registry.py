"""The task registry: one entry per task, light enough for the config layer (no torch).

An entry declares what the code around a task reads without running it: the class that
implements it (``"module:Class"``, imported when a task is built), the data folder it reads
under ``--data-root`` and the published files ``scale-fpt fetch`` puts there, and its
baseline (what its accuracy is without learning it). What needs the task's code (its shapes,
preprocessing aspects and data problems) the class itself declares (``tasks.base.Task``).

Adding a task is its module and one entry in ``TASKS``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One published file of a dataset."""

    url: str = ""
    """Where the publisher serves it (empty for a file of the Hugging Face hub)."""
    hub: tuple[str, str] = ("", "")
    """(Dataset repository, file path in it) of a file on the Hugging Face hub, downloaded by
    ``huggingface_hub`` (its mirror: ``HF_ENDPOINT``) and checked against the hub's
    SHA-256."""
    keep: tuple[str, ...] = ()
    """For an archive (a tar file, compressed or not): the member paths kept, by their
    trailing components (``listops-1000/basic_train.tsv``), each written to the data folder
    under its file name; the rest is never written. Empty: the file is kept as it is."""
    size: str = ""
    """Its size as the publisher states it, for the message before a long download."""

    @property
    def name(self) -> str:
        return (self.hub[1] or self.url).rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DataFolder:
    """A folder of published data under ``--data-root`` (``DIR/<name>``) and its files."""

    name: str
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class Baseline:
    """A task's accuracy without learning it: an arm at its baseline did not learn."""

    accuracy: float
    """In %."""
    how: str
    """How a model reaches it (chance, the majority class, copying)."""


@dataclass(frozen=True)
class TaskEntry:
    """One task of the registry (module docstring)."""

    implementation: str
    """``"module:Class"``: the ``tasks.base.Task`` subclass, imported on first use."""
    baseline: Baseline
    data: DataFolder | None = None
    """The published data it reads, None for a task that generates its data."""

    def task_class(self):
        module, name = self.implementation.split(":")
        return getattr(importlib.import_module(module), name)


def hub_parquet(repo: str, folder: str) -> tuple[Source, ...]:
    """The train and test Parquet files of a Hugging Face dataset repository's ``folder``."""
    return tuple(
        Source(hub=(repo, f"{folder}/{split}-00000-of-00001.parquet"))
        for split in ("train", "test")
    )


LISTOPS = DataFolder(
    "listops",
    (
        Source(
            "https://storage.googleapis.com/long-range-arena/lra_release.gz",
            keep=tuple(f"listops-1000/basic_{s}.tsv" for s in ("train", "val", "test")),
            size="7.7 GB, of which ListOps is read",
        ),
    ),
)
HOMOLOGY = DataFolder(
    "homology",
    (
        Source(
            "http://s3.amazonaws.com/songlabdata/proteindata/data_raw_pytorch/remote_homology.tar.gz",
            keep=tuple(
                f"remote_homology_{s}.json" for s in ("train", "valid", "test_fold_holdout")
            ),
        ),
    ),
)
MNIST = DataFolder("mnist", hub_parquet("ylecun/mnist", "mnist"))
CIFAR10 = DataFolder("cifar10", hub_parquet("uoft-cs/cifar10", "plain_text"))
"""LRA's release (ListOps), TAPE's JSON release (remote homology), the Parquet files of the
Hugging Face datasets the image loaders read (``tasks.images.HUB_IDS``). LRA and TAPE publish
no checksums; the hub's files are checked against the SHA-256 the hub states for them."""

CHANCE_10 = Baseline(10.0, "chance and majority class 10%")

TASKS: dict[str, TaskEntry] = {
    "bit-memory": TaskEntry(
        "scale_fpt.tasks.bits:BitMemory",
        Baseline(75.0, "75% copying the unmasked bits (chance 50%)"),
    ),
    "bit-xor": TaskEntry(
        "scale_fpt.tasks.bits:BitXor", Baseline(50.0, "chance 50% (each output bit a coin flip)")
    ),
    "listops": TaskEntry(
        "scale_fpt.tasks.listops:ListOps",
        Baseline(10.0, "chance 10% (10 classes; the majority class is near 17% in LRA)"),
        LISTOPS,
    ),
    "mnist": TaskEntry(
        "scale_fpt.tasks.images:ImageClassification",
        Baseline(11.4, "majority class 11.4% (chance 10%)"),
        MNIST,
    ),
    "cifar10": TaskEntry("scale_fpt.tasks.images:ImageClassification", CHANCE_10, CIFAR10),
    "cifar10-lra": TaskEntry("scale_fpt.tasks.images:ImageClassification", CHANCE_10, CIFAR10),
    "homology": TaskEntry(
        "scale_fpt.tasks.homology:RemoteHomology",
        Baseline(0.1, "chance 0.1% (1,195 folds)"),
        HOMOLOGY,
    ),
}
"""Every task by name, in the order the CLI lists them (``config.TASKS`` is this)."""


def data_folders() -> dict[str, DataFolder]:
    """Every data folder a task reads, by folder name (tasks may share one: cifar10-lra reads
    cifar10's files)."""
    return {e.data.name: e.data for e in TASKS.values() if e.data is not None}


def data_folder(task: str) -> str:
    """The folder under ``--data-root`` that ``task`` reads ('' for a generated task or an
    unknown name)."""
    entry = TASKS.get(task)
    return entry.data.name if entry is not None and entry.data is not None else ""
