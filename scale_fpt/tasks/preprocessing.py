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

from scale_fpt.config import TrialConfig
from scale_fpt.tasks.aspects import Aspect


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


__all__ = ["deviations", "preprocessing"]
