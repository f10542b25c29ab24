"""Each task's preprocessing, declared beside the paper's and the reference code's.

For every task, ``preprocessing(config)`` lists the aspects that decide what a model sees and
is scored on (sequence length, split, truncation/filtering, augmentation, normalisation,
input dropout):
what this trial does, what the paper says, what the reference code (kzl/universal-computation)
does, and whether this trial does what produced the published numbers. Defaults follow the
paper where it is explicit and the reference code where the paper is silent; every other
choice is a flag (``mnist_tokens``, ``rotation_degrees``, ``homology_long``, ``normalize``,
``input_dropout``, ``bit_memory_bits``). ``scale-fpt plan`` prints the list; the report marks a published number
comparable only when no aspect differs (``deviations``).
"""

from __future__ import annotations

from dataclasses import dataclass

from scale_fpt.config import TrialConfig

REFERENCE_DROPOUT = 0.1
"""The reference FPT's dropout after its linear input layer."""


@dataclass(frozen=True)
class Aspect:
    """One preprocessing choice of a task."""

    name: str
    """sequence length, split, truncation, augmentation, normalisation or input dropout."""
    here: str
    """What this trial does."""
    paper: str
    """What the paper states ('not stated' where it is silent)."""
    reference: str
    """What the reference code does."""
    as_published: bool
    """True when this trial does what produced the published numbers."""


def _input_dropout(config: TrialConfig, continuous: bool) -> Aspect:
    if not continuous:
        return Aspect("input dropout", "none (embedding input)", "not stated", "none", True)
    p = config.model.dropout if config.model.input_dropout else 0.0
    here = f"{p:g} after the linear input layer" if p else "none after the input layer"
    reference = f"{REFERENCE_DROPOUT:g} after the linear input layer"
    return Aspect("input dropout", here, "not stated", reference, p == REFERENCE_DROPOUT)


def _bits(config: TrialConfig) -> list[Aspect]:
    if config.task.task == "bit-memory":
        bits, patch = config.task.bit_memory_bits, config.task.bit_memory_patch
        shape = f"{6 * bits // patch} tokens x {patch} bits (5 strings of {bits} bits, a query)"
        published = "120 tokens x 50 bits (5 strings of 1000 bits, a query)"
    else:
        shape = published = "10 tokens x 1 bit"
    return [
        Aspect("sequence length", shape, published, published, shape == published),
        Aspect(
            "split",
            "fresh random training batches; fixed validation and test draws (val_seed, test_seed)",
            "fresh random data for every batch",
            "fresh random batches, train and evaluation alike",
            True,
        ),
        Aspect("truncation", "none", "none", "none", True),
        Aspect("augmentation", "none", "none", "none", True),
        _input_dropout(config, continuous=True),
    ]


def _listops(config: TrialConfig) -> list[Aspect]:
    task = config.task
    length = task.max_length or 512
    files = bool(task.data_dir)
    split = (
        "train basic_train; validation basic_val; test basic_test"
        if files
        else "generated with LRA's grammar: a training pool and validation/test draws"
    )
    truncation = (
        f"expressions longer than {length} tokens cut"
        if files
        else f"generated expressions fit {length} tokens (at least {length // 4})"
    )
    return [
        Aspect("sequence length", f"{length} tokens", "512 tokens", "512 tokens", length == 512),
        Aspect(
            "split",
            split,
            "LRA ListOps",
            "train basic_train; reports basic_val as 'test'",
            False,  # the published number is a validation accuracy
        ),
        Aspect("truncation", truncation, "padded/cut to 512", "padded/cut to 512", files),
        Aspect("augmentation", "none", "none", "none", True),
        _input_dropout(config, continuous=False),
    ]


def _images(config: TrialConfig) -> list[Aspect]:
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
            f"crop (pad 4), flip, rotation ±{task.rotation_degrees:g}°" if task.augment else "none"
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
    out.append(_input_dropout(config, continuous=True))
    return out


def _homology(config: TrialConfig) -> list[Aspect]:
    task = config.task
    length = task.max_length or 1024
    long = "dropped" if task.homology_long == "drop" else "cut"
    return [
        Aspect(
            "sequence length",
            f"up to {length} tokens",
            "up to 1024",
            "up to 1024",
            length == 1024,
        ),
        Aspect(
            "split",
            "train; validation TAPE valid; test TAPE test_fold_holdout",
            "TAPE remote homology",
            "train; reports TAPE valid as 'test'",
            False,  # the published number is a validation accuracy
        ),
        Aspect(
            "truncation",
            f"sequences over {length} {long} (train and evaluation)",
            "not stated (accuracy scaled by the 97.39% kept)",
            "sequences over 1024 dropped (train and evaluation)",
            task.homology_long == "drop",
        ),
        Aspect("augmentation", "none", "none", "none", True),
        _input_dropout(config, continuous=False),
    ]


def _normalisation(config: TrialConfig) -> Aspect:
    """Image pixels: normalised per channel as the reference code (``normalize``); the other
    tasks feed tokens or bits as they are, in every source."""
    task = config.task
    reference = {
        "mnist": "none (mean 0, std 1)",
        "cifar10": "per channel: mean (0.4914, 0.4822, 0.4465), std (0.2023, 0.1994, 0.2010)",
        "cifar10-lra": "mean 0.5, std 0.5",
    }.get(task.task)
    if reference is None:
        return Aspect("normalisation", "none", "none", "none", True)
    return Aspect(
        "normalisation",
        reference if task.normalize else "none (pixels in [0, 1])",
        "not stated",
        reference,
        task.normalize or task.task == "mnist",
    )


_BY_TASK = {
    "bit-memory": _bits,
    "bit-xor": _bits,
    "listops": _listops,
    "mnist": _images,
    "cifar10": _images,
    "cifar10-lra": _images,
    "homology": _homology,
}


def preprocessing(config: TrialConfig) -> list[Aspect]:
    """The preprocessing aspects of ``config``'s task (module docstring)."""
    *aspects, input_dropout = _BY_TASK[config.task.task](config)
    return [*aspects, _normalisation(config), input_dropout]


def deviations(config: TrialConfig) -> list[str]:
    """'aspect: here (published: reference)' for every aspect that differs from what
    produced the published numbers; empty when the trial preprocesses like the paper."""
    return [
        f"{a.name}: {a.here} (published: {a.reference})"
        for a in preprocessing(config)
        if not a.as_published
    ]


__all__ = ["Aspect", "deviations", "preprocessing"]
