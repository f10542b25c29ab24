"""Image classification as a sequence of patches: MNIST, CIFAR-10 and CIFAR-10 LRA.

| task | stored | fed as | tokens x width |
|---|---|---|---|
| mnist | 28x28 grey | 4x4 patches (``mnist_tokens=64``: zero-padded by 2 to 32x32 first) | 49 x 16 (64 x 16) |
| cifar10 | 32x32 RGB | 4x4 patches | 64 x 48 |
| cifar10-lra | 32x32 RGB | greyscale, 1x1 patches (pixels) | 1024 x 1 |

Patches are read in raster order (left to right, top to bottom); each patch is flattened
row by row, pixel by pixel, with the channels innermost: feature ``(i * p + j) * C + c`` of a
token is channel c of pixel (i, j) inside its p x p patch. Pixels are scaled to [0, 1], then
(``normalize``, the default) normalised per channel as the reference code does after its
augmentation: CIFAR-10 with its channel means and stds, CIFAR-10 LRA's grey pixels to
[-1, 1], MNIST unchanged (the reference's mean 0, std 1). ``normalize=False`` feeds [0, 1].

Data comes from ``datasets``: the hub ids ``ylecun/mnist`` / ``uoft-cs/cifar10`` when
``config.data_dir`` is empty, else a local copy in ``data_dir``: a ``save_to_disk``
DatasetDict (train, test) or Parquet files whose name starts with, or whose folder is,
``train`` / ``test`` (HF's own ``plain_text/train-00000-of-00001.parquet`` layout included).
Images are decoded once per process into a uint8 tensor (N, H, W, C) per split, held on the
trial's device (``Task.to``: CIFAR-10 is 150 MB); batches are cut, converted and augmented
there.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from PIL import Image

from scale_fpt.config import TaskConfig, TrialConfig
from scale_fpt.hub import hub_dataset_cached, hub_reachable
from scale_fpt.keyed_random import Draws
from scale_fpt.seeding import seed_streams
from scale_fpt.tasks.aspects import Aspect, input_dropout
from scale_fpt.tasks.base import (
    Batch,
    DataUnavailable,
    Task,
    TaskSpec,
    check_split,
    epoch_indices,
    eval_limit,
    step_draws,
)

HUB_IDS = {"mnist": "ylecun/mnist", "cifar10": "uoft-cs/cifar10", "cifar10-lra": "uoft-cs/cifar10"}
STORED_SIZE = {"mnist": 28, "cifar10": 32, "cifar10-lra": 32}
PIL_MODE = {"mnist": "L", "cifar10": "RGB", "cifar10-lra": "RGB"}
PATCH = {"mnist": 4, "cifar10": 4, "cifar10-lra": 1}
SIZE = 32
"""Side of the image the model sees (MNIST only with ``mnist_tokens=64``: padded up to it, as
the paper's 64 tokens imply; with the default 49 it sees its stored 28x28)."""
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMN = "label"
SPLITS = ("train", "test")
LUMA = (0.299, 0.587, 0.114)
"""ITU-R 601 luma weights (PIL's ``convert('L')``) for CIFAR-10 LRA's greyscale."""
NORMALIZATION = {
    "mnist": ((0.0,), (1.0,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar10-lra": ((0.5,), (0.5,)),
}
"""(mean, std) per channel that the reference code (kzl/universal-computation) normalises
each task's [0, 1] pixels with, after augmentation."""
NORMALIZATION_TEXT = {
    "mnist": "none (mean 0, std 1)",
    "cifar10": "per channel: mean (0.4914, 0.4822, 0.4465), std (0.2023, 0.1994, 0.2010)",
    "cifar10-lra": "mean 0.5, std 0.5",
}
"""``NORMALIZATION`` as the preprocessing table says it."""
CROP_PADDING = 4
AUGMENT_STREAM = 3
"""step_draws stream of the augmentation randomness (1 is the epoch permutation)."""
HOLDOUT_SEED = 0
"""Seed of the permutation that picks the validation slice of the train split: fixed, so
every trial holds out the same images (and trains on the same rest)."""


def holdout_split(n: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, validation indices) of a train split of ``n`` examples: a fixed random
    ``fraction`` of them (at least one; at least one left to train on) is held out. Both
    index tensors are sorted, disjoint and together cover ``range(n)``."""
    if n < 2:
        raise DataUnavailable(f"a train split of {n} example(s) cannot spare a validation slice")
    n_val = min(max(1, round(n * fraction)), n - 1)
    order = Draws(HOLDOUT_SEED).permutation(n)
    return order[n_val:].sort().values, order[:n_val].sort().values


# (source, split, PIL mode) -> (images (N, H, W, C) uint8, labels (N,) long)
_DECODED: dict[tuple[str, str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _parquet_files(folder: Path) -> dict[str, list[str]]:
    """Parquet files under ``folder`` by split: a file belongs to a split when its name starts
    with the split's name or one of its folders (below ``folder``) is named after it."""
    files: dict[str, list[str]] = {split: [] for split in SPLITS}
    for path in sorted(folder.rglob("*.parquet")):
        parts = path.relative_to(folder).parts
        for split in SPLITS:
            if path.name.startswith(split) or split in parts[:-1]:
                files[split].append(str(path))
                break
    return files


def _open_splits(task: str, data_dir: str):
    """The train and test ``datasets.Dataset`` of ``task``; DataUnavailable if not there."""
    import datasets  # heavy: imported only when image data is needed

    remedy = "pass --data-dir with a saved copy (datasets save_to_disk directory or Parquet files)"
    if not data_dir:
        hub_id = HUB_IDS[task]
        try:
            dataset = datasets.load_dataset(hub_id)
        except Exception as e:  # network, auth or hub errors all have the same remedy
            raise DataUnavailable(
                f"{task}: could not load {hub_id!r} from the Hugging Face hub (offline?); {remedy}"
            ) from e
        source = hub_id
    else:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise DataUnavailable(f"{task}: --data-dir {data_dir} is not a directory; {remedy}")
        try:
            if (folder / "dataset_dict.json").is_file():
                dataset = datasets.load_from_disk(str(folder))
            else:
                files = _parquet_files(folder)
                if not all(files.values()):
                    raise DataUnavailable(
                        f"{task}: no {HUB_IDS[task]} data found in {data_dir} (expected a "
                        "datasets save_to_disk directory, or Parquet files named train-*.parquet "
                        "and test-*.parquet or inside train/ and test/ folders); download "
                        f"{HUB_IDS[task]} and pass --data-dir DIR"
                    )
                dataset = datasets.load_dataset("parquet", data_files=files)
        except DataUnavailable:
            raise
        except Exception as e:
            raise DataUnavailable(
                f"{task}: could not read the dataset in {data_dir} (corrupt or truncated "
                f"files?): {_one_line(e)}; download {HUB_IDS[task]} again and pass --data-dir DIR"
            ) from e
        source = str(folder.resolve())
    missing = [split for split in SPLITS if split not in dataset]
    if missing:
        raise DataUnavailable(
            f"{task}: the dataset from {source} has no {' or '.join(missing)} split "
            f"(found: {', '.join(dataset)}); {remedy}"
        )
    return source, {split: dataset[split] for split in SPLITS}


def _decode(task: str, source: str, split: str, dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode the images of one split: (images (N, H, W, C) uint8, labels (N,) long)."""
    columns = dataset.column_names
    image_column = next((c for c in IMAGE_COLUMNS if c in columns), None)
    if image_column is None or LABEL_COLUMN not in columns:
        raise DataUnavailable(
            f"{task}: the {split} split of {source} needs an image column "
            f"({' or '.join(IMAGE_COLUMNS)}) and a {LABEL_COLUMN!r} column; "
            f"found {', '.join(columns)}"
        )
    # Arrow view: an HF Image column is a struct {bytes, path}; decoding it ourselves avoids
    # a round trip through datasets' per-row PIL objects.
    table = dataset.with_format("arrow")[:]
    records = table.column(image_column)
    if not pa.types.is_struct(records.type) or records.type.get_field_index("bytes") < 0:
        raise DataUnavailable(
            f"{task}: column {image_column!r} of {source} ({split}) holds {records.type}, "
            "not encoded images (a datasets Image feature)"
        )
    if len(records) == 0:
        raise DataUnavailable(f"{task}: the {split} split of {source} is empty")
    mode, size = PIL_MODE[task], STORED_SIZE[task]
    images = []
    for row, record in enumerate(records.to_pylist()):
        data, path = record["bytes"], record.get("path")
        try:
            with Image.open(io.BytesIO(data) if data is not None else path) as image:
                pixels = np.asarray(image.convert(mode))
        except (OSError, ValueError) as e:
            what = type(e).__name__ if data is not None else f"{path}: {e}"
            raise DataUnavailable(
                f"{task}: row {row} of the {split} split of {source} is not a readable image "
                f"({what}); download {HUB_IDS[task]} again and pass --data-dir DIR"
            ) from e
        if pixels.shape[:2] != (size, size):
            raise DataUnavailable(
                f"{task}: the {split} split of {source} holds a "
                f"{pixels.shape[1]}x{pixels.shape[0]} image; expected {size}x{size}"
            )
        images.append(pixels.reshape(size, size, -1))
    labels = torch.tensor(table.column(LABEL_COLUMN).to_pylist(), dtype=torch.long)
    if not 0 <= int(labels.min()) <= int(labels.max()) <= 9:
        raise DataUnavailable(f"{task}: labels of {source} ({split}) must be in 0..9")
    return torch.from_numpy(np.stack(images)), labels


def load_images(task: str, data_dir: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{split: (images (N, H, W, C) uint8, labels (N,) long)}`` for train and test,
    decoded once per process (cifar10 and cifar10-lra share one decode)."""
    source = HUB_IDS[task] if not data_dir else str(Path(data_dir).resolve())
    keys = {split: (source, split, PIL_MODE[task]) for split in SPLITS}
    if not all(key in _DECODED for key in keys.values()):
        source, datasets_by_split = _open_splits(task, data_dir)
        for split, dataset in datasets_by_split.items():
            _DECODED[keys[split]] = _decode(task, source, split, dataset)
    return {split: _DECODED[key] for split, key in keys.items()}


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, (H/p)(W/p), p*p*C): raster-ordered patches, channels innermost."""
    B, C, H, W = x.shape
    x = x.view(B, C, H // patch, patch, W // patch, patch)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, H/p, W/p, p, p, C)
    return x.reshape(B, (H // patch) * (W // patch), patch * patch * C)


def greyscale(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) RGB -> (B, 1, H, W) luma."""
    weights = torch.tensor(LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)


def augment(x: torch.Tensor, draws: Draws, degrees: float) -> torch.Tensor:
    """Random crop (zero padding ``CROP_PADDING``), horizontal flip (p=0.5) and rotation
    (uniform within ±``degrees``) of (N, C, H, W) images, per example; with K keys
    (``Draws.lead``) the N images are K members' batches in turn, each augmented from its
    own key.

    The three are one affine map, so the image is resampled (bilinearly, zeros outside)
    once. A crop of the padded image is a whole-pixel shift, which with
    ``align_corners=False`` lands exactly on pixel centres."""
    N, _, H, W = x.shape
    B = N // math.prod(draws.lead)  # examples per key
    shift = draws.randint(-CROP_PADDING, CROP_PADDING + 1, (B, 2)).reshape(N, 2).float()
    flip = torch.where(draws.rand(B).reshape(N) < 0.5, -1.0, 1.0)
    angle = (draws.rand(B).reshape(N) * 2 - 1) * math.radians(degrees)
    cos, sin = angle.cos(), angle.sin()
    # The output pixel at normalised position o samples the input at R(angle) @ F @ o + t.
    theta = torch.stack(
        [
            torch.stack([cos * flip, -sin, 2 * shift[:, 0] / W], dim=1),
            torch.stack([sin * flip, cos, 2 * shift[:, 1] / H], dim=1),
        ],
        dim=1,
    )  # (B, 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class ImageClassification(Task):
    """mnist, cifar10 or cifar10-lra (``config.task``). x: (B, T, W) float (in [0, 1] before
    ``normalize``), y: (B, 1, 1) class.

    The validation set is a fixed slice of the train split (``holdout_split``,
    ``config.val_fraction`` of it, in train order; its first ``config.val_limit`` when
    set); training reads a per-epoch permutation of the rest (``epoch_indices``) and never
    a validation image. CIFAR training images are augmented (``augment``) when
    ``config.augment``, with randomness from (seed, step). The test set is the test split
    in order (its first ``config.test_limit`` images when set). Neither evaluation set is
    augmented.
    """

    @staticmethod
    def side(config: TaskConfig) -> int:
        """Side of the (square) image the model sees."""
        if config.task == "mnist" and config.mnist_tokens == 49:
            return STORED_SIZE["mnist"]
        return SIZE

    @classmethod
    def preprocessing(cls, config: TrialConfig) -> list[Aspect]:
        task = config.task
        name = task.task
        out = []
        if name == "mnist":
            here = f"{task.mnist_tokens} tokens x 16 (4x4 patches" + (
                ", 28x28 as stored)" if task.mnist_tokens == 49 else ", padded to 32x32)"
            )
            out.append(
                Aspect(
                    "sequence length",
                    here,
                    "64 tokens x 16",
                    "49 tokens x 16 (28x28 in 4x4 patches)",
                    task.mnist_tokens == 49,
                )
            )
        else:
            shape = "64 tokens x 48" if name == "cifar10" else "1024 tokens x 1 (greyscale pixels)"
            out.append(Aspect("sequence length", shape, shape, shape, True))
        out.append(
            Aspect(
                "split",
                f"train minus a fixed {task.val_fraction:.0%} validation slice; test split",
                "train and test",
                "full train split; test split",
                False,  # the held-out slice is not trained on
            )
        )
        out.append(Aspect("truncation", "none", "none", "none", True))
        if name == "mnist":
            out.append(Aspect("augmentation", "none", "none", "none", True))
        else:
            here = (
                f"crop (pad 4), flip, rotation ±{task.rotation_degrees:g}°"
                if task.augment
                else "none"
            )
            reference = "crop (pad 4), flip, rotation ±20°"
            if name == "cifar10-lra":
                reference = "not verified for the greyscale variant; cifar10's: " + reference
            published = task.augment and task.rotation_degrees == 20.0
            out.append(
                Aspect(
                    "augmentation",
                    here,
                    "random crop, flip, small rotations",
                    reference,
                    published,
                )
            )
        out.append(cls.normalisation(config))
        out.append(input_dropout(config, continuous=True))
        return out

    @classmethod
    def normalisation(cls, config: TrialConfig) -> Aspect:
        """Pixels normalised per channel as the reference code (``normalize``)."""
        task = config.task
        reference = NORMALIZATION_TEXT[task.task]
        return Aspect(
            "normalisation",
            reference if task.normalize else "none (pixels in [0, 1])",
            "not stated",
            reference,
            task.normalize or task.task == "mnist",
        )

    @classmethod
    def data_problem(cls, config: TaskConfig) -> str:
        hub_id = HUB_IDS[config.task]
        if config.data_dir:
            folder = Path(config.data_dir)
            if not folder.is_dir():
                return f"{config.task}: --data-dir {config.data_dir} is not a directory"
            if (folder / "dataset_dict.json").is_file() or all(_parquet_files(folder).values()):
                return ""
            return (
                f"{config.task}: no {hub_id} data in {config.data_dir} (expected a datasets "
                "save_to_disk directory, or train-*.parquet and test-*.parquet files)"
            )
        if hub_dataset_cached(hub_id) or hub_reachable():
            return ""
        return f"{config.task}: {hub_id} is not in the Hugging Face cache and the hub cannot be reached"

    @classmethod
    def spec_for(cls, config: TaskConfig) -> TaskSpec:
        patch = PATCH[config.task]
        channels = 1 if config.task in ("mnist", "cifar10-lra") else 3
        return TaskSpec(
            n_tokens=(cls.side(config) // patch) ** 2,
            token_width=patch * patch * channels,
            vocab_size=0,
            n_predicting_tokens=1,
            outputs_per_token=1,
            n_classes=10,
        )

    def __init__(self, config: TaskConfig, seed: int):
        super().__init__(config, seed)
        self.name = config.task
        self.spec = self.spec_for(config)
        self.augment = config.augment and config.task != "mnist"
        splits = load_images(config.task, config.data_dir)
        images, labels = splits["train"]
        train_index, val_index = holdout_split(len(images), config.val_fraction)
        self.train_images, self.train_labels = images[train_index], labels[train_index]
        self.train_index = train_index
        """Positions in the stored train split of the images training reads."""
        self.eval_sets = {
            "val": (images[val_index], labels[val_index]),
            "test": splits["test"],
        }
        """Per evaluation split: (images (N, H, W, C) uint8, labels (N,) long)."""

    def tokens(self, images: torch.Tensor, draws: Draws | None = None) -> torch.Tensor:
        """(B, H, W, C) uint8 images -> (B, T, W) float tokens, on the images' device;
        augmented when ``draws`` are given."""
        x = images.permute(0, 3, 1, 2).float() / 255  # (B, C, H, W)
        pad = (self.side(self.config) - x.shape[-1]) // 2
        if pad:
            x = F.pad(x, (pad, pad, pad, pad))
        if self.name == "cifar10-lra":
            x = greyscale(x)  # commutes with the (spatial, linear) augmentation: do it first
        if draws is not None:
            x = augment(x, draws, self.config.rotation_degrees)
        if self.config.normalize:
            mean, std = (torch.tensor(v, device=x.device) for v in NORMALIZATION[self.name])
            x = (x - mean[:, None, None]) / std[:, None, None]  # per channel, after augmenting
        return patchify(x, PATCH[self.name])

    def train_batch(self, step: int, batch_size: int) -> Batch:
        return self.cohort_batch(step, batch_size, [self.seed]).member(0)

    def cohort_batch(self, step: int, batch_size: int, seeds: Sequence[int]) -> Batch:
        n = len(self.train_images)
        indices = [
            epoch_indices(seed_streams(seed).data, step, batch_size, n, self.device)
            for seed in seeds
        ]  # K of (B,)
        step = step if self.augment else None  # only augmentation draws from the step
        return Batch(*self.drawn(self._draw, indices, self.data_seeds(seeds), step=step))

    def _draw(
        self, step: int | torch.Tensor | None, indices: list[torch.Tensor], data_seeds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x (K, B, T, W), labels (K, B, 1, 1)) of the members' examples ``indices``,
        augmented from (data seed, ``step``) unless ``step`` is None."""
        K, B = len(indices), len(indices[0])
        rows = torch.stack(indices)  # (K, B)
        images = self.train_images[rows.view(-1)]  # (K*B, H, W, C) uint8
        draws = None if step is None else step_draws(data_seeds, step, AUGMENT_STREAM, self.device)
        x = self.tokens(images, draws)  # (K*B, T, W)
        return x.unflatten(0, (K, B)), self.train_labels[rows].view(K, B, 1, 1)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        images, labels = self.eval_sets[check_split(split)]
        n = eval_limit(self.config, split) or len(images)
        for start in range(0, n, batch_size):
            rows = slice(start, min(start + batch_size, n))
            yield Batch(self.tokens(images[rows]), labels[rows].view(-1, 1, 1))
