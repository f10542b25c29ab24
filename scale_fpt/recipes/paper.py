"""The paper's settings that its presets share: step budgets per task, the GPU they plan for,
and the per-task overrides (homology's learning rate, convergence budgets of the arms that
train the body)."""

from __future__ import annotations

from scale_fpt.published import STEPS, TASK_COLUMNS

PAPER_STEPS = {
    task: int(steps) for task, steps in zip(TASK_COLUMNS, STEPS["T4"]["random"], strict=True)
}
"""Gradient steps per task for every arm of the paper presets: the paper's steps to
convergence of the slower, random-init frozen transformer (Table 4, row "random"), so no arm
is stopped before the paper's slowest arm converged. (The paper trained each run until
convergence; a fixed budget equal for every arm is the like-for-like reading.)"""


PAPER_GPU = "a10g-24gb"
"""The GPU the paper presets plan for: cluster/gpu.yaml's worker types (``--gpu`` to change)."""


BODY_TRAINED = ("fpt+ff", "fpt+attn", "full")
"""Finetune specs of the presets that train the transformer body (and so converge on their
own schedule, not the frozen random arm's)."""
CONVERGENCE_BUDGET_FACTOR = 2
"""Arms that train the body, and the LSTM: a cap of this many times the task's budget ..."""
CONVERGENCE_PATIENCE_FRACTION = 0.25
"""... and patience (in steps) of this fraction of the task's budget: they train to
convergence (no better validation accuracy for that many steps) within the cap, rather than
to a budget borrowed from the frozen random arm."""


def paper_overrides(finetunes=(), lstm: bool = False) -> tuple:
    """Per-task settings of the paper presets: step budgets (``PAPER_STEPS``), lr 1e-4 for
    homology, and, for the arms of ``finetunes`` that train the body (``BODY_TRAINED``) and
    the LSTM (``lstm``), a budget of their own: trained to convergence (patience in steps)
    within ``CONVERGENCE_BUDGET_FACTOR`` x the task's budget."""
    steps = tuple(({"task": task}, {"max_steps": n}) for task, n in PAPER_STEPS.items())
    own = [({"finetune": f}) for f in finetunes if f in BODY_TRAINED]
    if lstm:
        own.append({"model": "lstm"})
    converged = tuple(
        (
            {"task": task, **match},
            {
                "max_steps": CONVERGENCE_BUDGET_FACTOR * n,
                "patience": int(CONVERGENCE_PATIENCE_FRACTION * n),
            },
        )
        for match in own
        for task, n in PAPER_STEPS.items()
    )
    return (*steps, *converged, ({"task": "homology"}, {"lr": 1e-4}))
