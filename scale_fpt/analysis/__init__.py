"""Scaling laws on any DataFrame: fit, intervals, prediction, held-out checks.

    from scale_fpt.analysis import fit_scaling_law
    fit = fit_scaling_law(df, y="loss", x=["N", "D"], form="chinchilla")
    fit.params, fit.intervals, fit.predict(new_df)

- ``laws``: the forms (``power``, ``power_floor``, ``chinchilla``, ``sigmoid``);
- ``fit``: Huber loss on log residuals, L-BFGS-B from a screened grid, grouped stratified
  bootstrap (``fit_scaling_law``, ``ScalingFit``);
- ``means``: a law fitted to each size's mean with a deviation per size, profile intervals,
  "not identified" where the sizes cannot bound a parameter (``fit_size_means``,
  ``exponent_difference``): the report's fits;
- ``coverage``: calibration of those intervals at the presets' designs (``law_checks``);
- ``power``: which next run narrows an exponent's interval most per FLOP (``next_runs``);
- ``predict``: held-out check, exponent differences, size -> loss -> accuracy, effective
  data transferred.

The form of a law is the analysis plan's, fixed before the data are seen: no function here
chooses it from the data (a choice made on the data and then reported as if fixed gives
intervals that do not cover).
"""

from scale_fpt.analysis.fit import ScalingFit, fit_scaling_law
from scale_fpt.analysis.laws import LAWS
from scale_fpt.analysis.means import MeansFit, exponent_difference, fit_size_means
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
    "MeansFit",
    "ScalingFit",
    "TwoStepFit",
    "compare_exponents",
    "effective_data",
    "exponent_difference",
    "fit_scaling_law",
    "fit_size_means",
    "holdout_check",
    "two_step_fit",
]
