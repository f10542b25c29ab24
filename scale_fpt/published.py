"""The published numbers of Lu et al. 2021 (study summary: shared/spec/paper.md), as data.

Accuracies are test accuracy in percent. Each cell records the model the paper used for it,
which is what the like-for-like rule of the report compares against (``tables.compare``).
Rows are named as in the paper; ``ROW_SETTINGS`` says which study trials a row stands for.
"""

from __future__ import annotations

import pandas as pd

TASK_COLUMNS = ("bit-memory", "bit-xor", "listops", "mnist", "cifar10", "cifar10-lra", "homology")
TASK_TITLES = {
    "bit-memory": "Bit Memory",
    "bit-xor": "XOR",
    "listops": "ListOps",
    "mnist": "MNIST",
    "cifar10": "CIFAR-10",
    "cifar10-lra": "C10 LRA",
    "homology": "Homology",
}

PAPER_LR = {"homology": 1e-4}
"""The paper's fixed learning rate per task (1e-3 elsewhere)."""


def paper_lr(task: str) -> float:
    return PAPER_LR.get(task, 1e-3)


# table -> row -> one value per task in TASK_COLUMNS order ('+' marks a diverged value: †).
ACCURACY = {
    "T1": {
        "FPT": (100, 100, 38.4, 98.0, 72.1, 38.6, 12.7),
        "Full transformer": (100, 100, 38, 99.1, 70.3, 42, 9),
        "Full LSTM": (60.9, 50.1, 17.1, 99.5, 73.6, 11.7, 12),
    },
    "T2": {
        "language (FPT)": (100, 100, 38.4, 98.0, 68.2, 38.6, 12.7),
        "random": (75.8, 100, 34.3, 91.7, 61.7, 36.1, 9.3),
        "bit memory": (100, 100, 35.4, 97.8, 62.6, 36.7, 7.8),
        "ViT": (100, 100, 37.4, 97.8, 72.5, 43.0, 7.5),
    },
    "T3": {
        "transformer": (75.8, 100, 34.3, 91.7, 61.7, 36.1, 9.3),
        "LSTM": (50.9, 50.0, 16.8, 70.9, 34.4, 10.4, 6.6),
    },
    "T8": {
        "FPT": (100, 100, 38.4, 98.0, 68.2, 38.6, 12.7),
        "+ feedforward": (100, 100, 36.0, 98.3, 76.6, 38.2, 13.1),
        "+ attention": (100, 100, 36.8, "89.0+", "47.7+", 23.0, 10.9),
        "+ both": (100, 100, 35.8, "93.1+", 32.9, 21.0, 10.5),
    },
}

STEPS = {
    "T4": {
        "FPT": (1e4, 5e2, 2e3, 5e3, 4e5, 3e5, 1e5),
        "random": (4e4, 2e4, 6e3, 2e4, 4e5, 6e5, 1e5),
        "speed-up": (4, 40, 3, 4, 1, 2, 1),
    }
}
"""Table 4: gradient steps to convergence (the paper's criterion, not a threshold)."""

SIZES = pd.DataFrame(
    [
        ("gpt2", "small", 12, "117M", "106K", 68.2, 61.7),
        ("gpt2-medium", "medium", 24, "345M", "190K", 69.8, 64.0),
        ("gpt2-large", "large", 36, "774M", "300K", 72.1, 65.7),
    ],
    columns=["model", "size", "layers", "total params", "trained params", "FPT", "random"],
)
"""Table 6: model size on CIFAR-10 (frozen)."""

SIZE_TASK = "cifar10"

# Which study trials a paper row stands for: (init label, finetune label, backbone kind).
ROW_SETTINGS = {
    "T1": {
        "FPT": ("pretrained", "fpt", "transformer"),
        "Full transformer": ("random", "full", "transformer"),
        "Full LSTM": ("random", "full", "lstm"),
    },
    "T2": {
        "language (FPT)": ("pretrained", "fpt", "transformer"),
        "random": ("random", "fpt", "transformer"),
        "bit memory": ("bit-memory", "fpt", "transformer"),
        "ViT": ("vit", "fpt", "transformer"),
    },
    "T3": {
        "transformer": ("random", "fpt", "transformer"),
        "LSTM": ("random", "frozen", "lstm"),
    },
    "T8": {
        "FPT": ("pretrained", "fpt", "transformer"),
        "+ feedforward": ("pretrained", "fpt+ff", "transformer"),
        "+ attention": ("pretrained", "fpt+attn", "transformer"),
        "+ both": ("pretrained", "full", "transformer"),
    },
}

LSTM_SETTING = {"lstm_width": 768, "lstm_layers": 3}
"""The paper's LSTM baseline: 3 layers, 768 wide."""


def paper_model(table: str, row: str, task: str) -> str:
    """The model the paper used for one cell (a name that never matches when it is not a
    study model, e.g. the 3-layer transformers of Table 1)."""
    if table == "T1" and row == "FPT" and task == "cifar10":
        return "gpt2-large"
    if (
        table == "T1"
        and row == "Full transformer"
        and task in ("cifar10", "listops", "cifar10-lra")
    ):
        return "3-layer gpt2"
    if row in ("Full LSTM", "LSTM"):
        return "lstm"
    return "gpt2"


def accuracy_records() -> pd.DataFrame:
    """Every published accuracy: table, row, task, value (%), diverged (†), model."""
    records = []
    for table, rows in ACCURACY.items():
        for row, values in rows.items():
            for task, value in zip(TASK_COLUMNS, values, strict=True):
                diverged = isinstance(value, str)
                records.append(
                    {
                        "table": table,
                        "row": row,
                        "task": task,
                        "value": float(str(value).rstrip("+")),
                        "diverged": diverged,
                        "model": paper_model(table, row, task),
                    }
                )
    for row in SIZES.itertuples():
        for column in ("FPT", "random"):
            records.append(
                {
                    "table": "T6",
                    "row": f"{row.size} {column}",
                    "task": SIZE_TASK,
                    "value": float(getattr(row, column)),
                    "diverged": False,
                    "model": row.model,
                }
            )
    return pd.DataFrame(records)


def lookup(table: str, row: str, task: str) -> dict | None:
    """The published cell of (table, paper row, task), or None."""
    if table == "T4":
        values = STEPS["T4"].get(row)
        if values is None or task not in TASK_COLUMNS:
            return None
        return {
            "value": float(values[TASK_COLUMNS.index(task)]),
            "diverged": False,
            "model": "gpt2",
        }
    found = RECORDS[(RECORDS.table == table) & (RECORDS.row == row) & (RECORDS.task == task)]
    return None if found.empty else found.iloc[0].to_dict()


RECORDS = accuracy_records()
