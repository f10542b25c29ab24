"""The Chinchilla scaling data and its published fits, to check ``fit_scaling_law`` against.

Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models") fitted
``L = E + A/N^alpha + B/D^beta`` to their training runs (Approach 3). Besiroglu et al. 2024
("Chinchilla Scaling: A replication attempt", Epoch AI) extracted 245 of those runs from the
paper's Figure 4 (repository epoch-research/analyzing-chinchilla, ``data/svg_extracted_data.csv``:
model size N, training FLOP C, final loss) and refitted the law: D = C / (6 N), the five
highest losses dropped (240 points left), Huber loss with delta 1e-3 on log loss, L-BFGS from
a grid of starts, then a maximum-likelihood refinement under a Huber density with a fitted
scale (the published point estimate), and standard errors and 95% percentile intervals from
4,000 bootstrap resamples of the points.

That repository carries no licence, so its data are not redistributed here: point
``SCALE_FPT_CHINCHILLA_CSV`` at a copy of the file (``git clone
https://github.com/epoch-research/analyzing-chinchilla``); the test and the benchmark that use
it skip without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

DATA_ENV = "SCALE_FPT_CHINCHILLA_CSV"
"""Environment variable naming the path of Besiroglu et al.'s ``svg_extracted_data.csv``."""
DATA_SHA256 = "193478df4e90f040016431996c45682659306840ecdadf83cfb9cd5ca0aa1b30"
"""SHA-256 of that file at epoch-research/analyzing-chinchilla commit 9225883 (2024-05-14),
the version the published figures below came from (245 rows)."""
DROPPED_HIGHEST = 5
"""Besiroglu et al. leave out the five runs of highest loss (outliers of the extraction)."""

HOFFMANN_2022 = {"A": 406.4, "alpha": 0.34, "B": 410.7, "beta": 0.28, "E": 1.69}
"""Hoffmann et al. 2022, Approach 3 (as printed, rounded)."""
BESIROGLU_2024 = {"A": 482.01, "alpha": 0.3478, "B": 2085.43, "beta": 0.3658, "E": 1.82}
"""Besiroglu et al. 2024's published estimates (Huber-likelihood fit with a fitted scale)."""
BESIROGLU_2024_SE = {"A": 124.52, "alpha": 0.0154, "B": 1293.28, "beta": 0.0206, "E": 0.0257}
"""Their bootstrap standard errors (4,000 point resamples; the notebook's printed output)."""
BESIROGLU_2024_INTERVALS = {
    "A": (285.214, 743.626),
    "alpha": (0.317, 0.373),
    "B": (1042.357, 5810.344),
    "beta": (0.331, 0.415),
    "E": (1.769, 1.871),
}
"""Their 95% bootstrap percentile intervals (same resamples)."""
BESIROGLU_2024_HUBER = {
    "A": 477.84,
    "alpha": 0.34731,
    "B": 2143.86,
    "beta": 0.36718,
    "E": 1.81724,
}
"""Their grid + L-BFGS fit of the plain Huber loss (delta 1e-3 on log loss), before the
likelihood refinement: the objective ``fit_scaling_law`` minimises."""


def data_path() -> Path | None:
    """The file ``SCALE_FPT_CHINCHILLA_CSV`` names, or None when unset or absent."""
    value = os.environ.get(DATA_ENV)
    return Path(value) if value and Path(value).is_file() else None


def load_points(path: str | Path, drop_highest: int = DROPPED_HIGHEST) -> pd.DataFrame:
    """Columns N (parameters), D (tokens, C / (6 N)) and loss from Besiroglu et al.'s CSV,
    without the ``drop_highest`` rows of highest loss. ValueError when a column is missing."""
    raw = pd.read_csv(path)
    needed = ["Model Size", "Training FLOP", "loss"]
    missing = [c for c in needed if c not in raw]
    if missing:
        raise ValueError(
            f"{path}: columns {missing} missing; expected Besiroglu et al.'s "
            f"svg_extracted_data.csv with {needed}"
        )
    points = pd.DataFrame(
        {
            "N": raw["Model Size"],
            "D": raw["Training FLOP"] / (6.0 * raw["Model Size"]),
            "loss": raw["loss"],
        }
    ).dropna()
    return points.drop(points["loss"].nlargest(drop_highest).index).reset_index(drop=True)
