"""Which next run of a ladder most narrows a law's exponent interval per unit of compute.

From a size-mean fit (``analysis.means``): alpha's interval half-width is about
t(df) · sqrt(v · [(JᵀWJ)⁻¹]_alpha,alpha), J the law's gradient at the fitted sizes, W the
relative weights 1/f², v = τ² + σ²/m the variance of a size's mean (τ: a size's own
deviation, σ: the seeds', m seeds per size) and df = sizes - parameters. The options:

- one more seed at every size: v falls to τ² + σ²/(m + 1); df and J stay;
- a new size (twice the largest, or half the smallest) with m seeds: J gains a row and df
  one degree of freedom (which matters most at the few sizes a ladder has: t(1) = 12.7,
  t(2) = 4.3).

Each option's cost is the FLOPs of its trials: ``cost`` per trial at each fitted size
(the trials' ``total_flops``), proportional to the size for a new one (fixed steps). The
options are ranked by the precision they add, 1/w_after² - 1/w_now², per FLOP.
τ² is estimated as v̂ - σ̂²/m (v̂ the size means' residual variance, σ̂² the seeds' pooled
one), floored at 0; "now" and every option then use the one v = τ² + σ²/m (a floored τ
raises v to σ̂²/m for all of them alike), so that one more seed can only narrow the
interval, by sqrt((τ² + σ²/(m+1)) / (τ² + σ²/m)) as the simulated ladders do. With no
degree of freedom left, v̂ is σ̂²/m (τ taken as 0: a lower bound on the width).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import t as t_dist


def gradient(fit, z: np.ndarray) -> np.ndarray:
    """d f / d (E, A_z, alpha) (power: (A_z, alpha)) at z = x / x_ref: (len(z), p)."""
    alpha = fit.params["alpha"]
    amp = fit.params["A"] * fit.z_ref**-alpha
    u = z**-alpha
    columns = [u, -amp * u * np.log(z)]
    if "E" in fit.params:
        columns.insert(0, np.ones_like(z))
    return np.stack(columns, axis=1)


def half_width(fit, z: np.ndarray, v: float, level: float = 0.95) -> np.float64:
    """alpha's interval half-width at sizes z with size-mean variance v (relative)."""
    J = gradient(fit, z)
    df = len(z) - J.shape[1]
    if df < 1:
        return np.float64(np.inf)
    f = fit.params.get("E", 0.0) + fit.params["A"] * (z * fit.z_ref) ** -fit.params["alpha"]
    info = J.T @ (J / f[:, None] ** 2)
    var = v * np.linalg.pinv(info)[-1, -1]
    return np.float64(t_dist.ppf((1 + level) / 2, df) * np.sqrt(var))


def next_runs(fit, cost: pd.Series) -> pd.DataFrame:
    """The options (module docstring), best first: option, half_width_now,
    half_width_after, flops, gain_per_flop. ``cost``: FLOPs of one trial, indexed by the
    fitted sizes."""
    x = fit.means[fit.x[0]].to_numpy(dtype=float)
    z = x / fit.z_ref
    m = fit.goodness["seeds"][0]
    seed_var = fit.goodness["seed_sd"] ** 2
    residual = fit.goodness["rel_sd"] ** 2 if fit.goodness["df"] >= 1 else seed_var / m
    size_var = max(residual - seed_var / m, 0.0) if np.isfinite(seed_var) else residual
    v = size_var + seed_var / m if np.isfinite(seed_var) else residual
    per_trial = cost.reindex(x).to_numpy(dtype=float)
    now = half_width(fit, z, v)
    options = [
        (
            f"a new size at {2 * x.max():.3g} (twice the largest), {m} seeds",
            half_width(fit, np.append(z, 2 * z.max()), v),
            float(m * per_trial[-1] * 2),
        ),
        (
            f"a new size at {x.min() / 2:.3g} (half the smallest), {m} seeds",
            half_width(fit, np.append(z, z.min() / 2), v),
            float(m * per_trial[0] / 2),
        ),
    ]
    if np.isfinite(seed_var):  # with one seed per size the seeds' share of v is unknown
        options.insert(
            0,
            (
                f"one more seed at each of the {len(x)} sizes",
                half_width(fit, z, size_var + seed_var / (m + 1)),
                float(per_trial.sum()),
            ),
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = [
            {
                "option": option,
                "half_width_now": now,
                "half_width_after": after,
                "flops": flops,
                "gain_per_flop": (np.float64(1) / after**2 - np.float64(1) / now**2) / flops,
            }
            for option, after, flops in options
        ]
    return pd.DataFrame(rows).sort_values("gain_per_flop", ascending=False, ignore_index=True)
