"""Scaling laws on any DataFrame: fit, intervals, prediction, held-out checks.

    from scale_fpt.analysis import fit_scaling_law
    fit = fit_scaling_law(df, y="loss", x=["N", "D"], form="chinchilla")
    fit.params, fit.intervals, fit.predict(new_df)

- ``laws``: the forms (``power``, ``power_floor``, ``chinchilla``, ``sigmoid``);
- ``fit``: Huber loss on log residuals, L-BFGS-B from a screened grid, grouped stratified
  bootstrap (``fit_scaling_law``, ``ScalingFit``); ``fit_floor_or_power``: the floored law
  where the data show a floor, else the plain power law;
- ``predict``: held-out check, exponent differences, size -> loss -> accuracy, effective
  data transferred.
"""

from scale_fpt.analysis.fit import ScalingFit, fit_floor_or_power, fit_scaling_law
from scale_fpt.analysis.laws import LAWS
from scale_fpt.analysis.predict import (
    HoldoutCheck,
    TwoStepFit,
    compare_exponents,
    effective_data,
    holdout_check,
    two_step_fit,
)

__all__ = [
    "LAWS",
    "HoldoutCheck",
    "ScalingFit",
    "TwoStepFit",
    "compare_exponents",
    "effective_data",
    "fit_floor_or_power",
    "fit_scaling_law",
    "holdout_check",
    "two_step_fit",
]
