"""The words a task's preprocessing is declared in (``Task.preprocessing``): one ``Aspect``
per choice that decides what a model sees and is scored on, beside the paper's and the
reference code's (``tasks.preprocessing`` reads them)."""

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
