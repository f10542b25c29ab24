"""Each task's preprocessing, declared beside the paper's and the reference code's.

For every task, ``preprocessing(config)`` lists the aspects that decide what a model sees and
is scored on (sequence length, split, truncation/filtering, augmentation, normalisation,
input dropout):
what this trial does, what the paper says, what the reference code (kzl/universal-computation)
does, and whether this trial does what produced the published numbers. Defaults follow the
paper where it is explicit and the reference code where the paper is silent; every other
choice is a flag (``mnist_tokens``, ``rotation_degrees``, ``homology_long``, ``normalize``,
``input_dropout``, ``bit_memory_bits``). Each task class declares its own list
(``Task.preprocessing``: sequence length, split, truncation, augmentation, normalisation,
input dropout, in this order); ``scale-fpt plan`` prints it; the report marks a published
number comparable only when no aspect differs (``deviations``).
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


def input_dropout(config: TrialConfig, continuous: bool) -> Aspect:
    """The input dropout aspect: after a linear input layer (``continuous``) or none."""
    if not continuous:
        return Aspect("input dropout", "none (embedding input)", "not stated", "none", True)
    p = config.model.dropout if config.model.input_dropout else 0.0
    here = f"{p:g} after the linear input layer" if p else "none after the input layer"
    reference = f"{REFERENCE_DROPOUT:g} after the linear input layer"
    return Aspect("input dropout", here, "not stated", reference, p == REFERENCE_DROPOUT)


NO_NORMALISATION = Aspect("normalisation", "none", "none", "none", True)
"""Tokens or bits fed as they are, in every source."""


def preprocessing(config: TrialConfig) -> list[Aspect]:
    """The preprocessing aspects of ``config``'s task (module docstring), as its class
    declares them (``Task.preprocessing``)."""
    # The task classes load torch: imported when a trial's preprocessing is asked for.
    from scale_fpt.tasks.build import task_class

    return task_class(config.task.task).preprocessing(config)


def deviations(config: TrialConfig) -> list[str]:
    """'aspect: here (published: reference)' for every aspect that differs from what
    produced the published numbers; empty when the trial preprocesses like the paper."""
    return [
        f"{a.name}: {a.here} (published: {a.reference})"
        for a in preprocessing(config)
        if not a.as_published
    ]


__all__ = ["NO_NORMALISATION", "Aspect", "deviations", "input_dropout", "preprocessing"]
