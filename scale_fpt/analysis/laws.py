"""The functional forms a scaling law can take, each in the coordinates its fit optimises.

Every form predicts ``log y`` from a parameter vector ``theta`` and the design matrix ``X``
(rows = observations, columns = the law's variables) and gives the Jacobian of ``log y``
with respect to ``theta``: the fit minimises a Huber loss on log residuals, so both are all it
needs. Positive amplitudes are optimised as logarithms (``A = exp(a)``) and sums of power
terms as a log-sum-exp, which keeps them positive and the optimisation well scaled over many
decades of N, D or FLOPs.

The floor E is optimised as itself and may be negative. A floor kept positive (as exp(e),
as before 2026-11-24) piles its estimates on the boundary E = 0 whenever the data show no
floor, and the bootstrap of an estimate on a boundary is inconsistent (Andrews 2000): E's
interval missed the truth in 11 of 13 such fits among 100 studies (docs/scaling-laws.md,
"Why the floor is free"). Left free, E's estimate and its resamples spread on both sides of 0 and the percentile intervals
cover; E <= 0 reads "no floor detected" (``fit.goodness["at_bound"]``). Where E + the power
terms is not positive (a negative floor far beyond the data), log y continues linearly below
``RATIO_FLOOR`` of the power terms, so the loss stays finite and pushes back.

    power        y = A x^-alpha                      theta = (a, alpha)
    power_floor  y = E + A x^-alpha                  theta = (a, alpha, E)
    chinchilla   y = E + A N^-alpha + B D^-beta      theta = (a, alpha, b, beta, E)
    sigmoid      y = b + a / (1 + exp(-k (x - L0)))  theta = (log a, k, L0, log b)

``sigmoid`` maps a loss (x, not logged) to an accuracy (y); with accuracy falling as the loss
rises, k < 0. Each form also proposes a grid of starting points scaled to the data, so the
same grid serves parameters counted in thousands or in billions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

EXPONENTS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5)
"""Starting exponents (alpha, beta): the published laws lie between 0.05 and 1."""
TERM_SHARES = (0.03, 0.1, 0.3, 1.0, 3.0)
"""Starting size of a power term at the data's central x, as a share of the median y."""
FLOOR_SHARES = (0.01, 0.3, 0.6, 0.9)
"""Starting floor E as a share of the smallest y."""
MAX_EXPONENT = 10.0
RATIO_FLOOR = 1e-3
"""Below this share of the power terms, (E + terms) / terms continues linearly in log y."""


def log_sum_exp(terms: np.ndarray) -> np.ndarray:
    """log(sum(exp(terms), axis=0)), stable; scipy's logsumexp costs ~15x more per call on
    the small arrays a fit evaluates thousands of times."""
    top = terms.max(axis=0)
    return top + np.log(np.exp(terms - top).sum(axis=0))


@dataclass(frozen=True)
class Law:
    """One functional form: its parameters (as reported), variables and coordinates."""

    name: str
    """``power``, ``power_floor``, ``chinchilla`` or ``sigmoid``."""
    params: tuple[str, ...]
    """Names of the reported parameters, in the order of ``theta``."""
    n_vars: int
    """How many x columns the law takes (1, or 2 for chinchilla)."""
    log_x: bool = True
    """Whether x enters through its logarithm (x must then be positive)."""
    formula: str = ""
    """The law written out, for reports."""

    # ------------------------------------------------------------------ coordinates
    def natural(self, theta: np.ndarray) -> np.ndarray:
        """Reported parameters from ``theta`` (last axis): exponentials of the logged ones."""
        out = np.array(theta, dtype=float, copy=True)
        for i in self.logged:
            out[..., i] = np.exp(out[..., i])
        return out

    @property
    def logged(self) -> tuple[int, ...]:
        """Positions of ``theta`` that hold logarithms of the reported parameter."""
        return {
            "power": (0,),
            "power_floor": (0,),
            "chinchilla": (0, 2),
            "sigmoid": (0, 3),
        }[self.name]

    def bounds(self) -> list[tuple[float | None, float | None]]:
        """L-BFGS-B box: exponents in [0, MAX_EXPONENT] (the laws decay); the floor is free
        (module docstring)."""
        exponent, floor = (0.0, MAX_EXPONENT), (None, None)
        return {
            "power": [(None, None), exponent],
            "power_floor": [(None, None), exponent, floor],
            "chinchilla": [(None, None), exponent, (None, None), exponent, floor],
            "sigmoid": [(-30.0, 5.0), (None, None), (None, None), (-30.0, 5.0)],
        }[self.name]

    @property
    def floor(self) -> int | None:
        """Position of the floor E in ``theta`` (None: the law has none)."""
        return {"power_floor": 2, "chinchilla": 4}.get(self.name)

    # ------------------------------------------------------------------ prediction
    def transform(self, X: np.ndarray) -> np.ndarray:
        return np.log(X) if self.log_x else np.asarray(X, dtype=float)

    def log_predict(self, theta: np.ndarray, Z: np.ndarray) -> np.ndarray:
        """log y for ``theta`` (..., p) at transformed inputs ``Z`` ((..., n, d), batches
        broadcast): (..., n)."""
        return self.evaluate(theta, Z, jacobian=False)[0]

    def jacobian(self, theta: np.ndarray, Z: np.ndarray) -> np.ndarray:
        """d log y / d theta: (..., n, p), batched as ``log_predict``."""
        return self.evaluate(theta, Z, jacobian=True)[1]

    def evaluate(self, theta: np.ndarray, Z: np.ndarray, jacobian: bool = True):
        """(log y, its Jacobian or None) in one pass: a fit needs both at every step."""
        t = [np.asarray(theta, dtype=float)[..., i, None] for i in range(len(self.params))]
        z = [Z[..., j] for j in range(Z.shape[-1])]
        if self.name == "power":
            log_y = t[0] - t[1] * z[0]
            if not jacobian:
                return log_y, None
            return log_y, np.stack([np.ones_like(log_y), -z[0] * np.ones_like(log_y)], axis=-1)
        if self.name in ("power_floor", "chinchilla"):
            # (amplitude, exponent, x column) of each power term; the floor is theta's last.
            pairs = [(0, 1, 0)] if self.name == "power_floor" else [(0, 1, 0), (2, 3, 1)]
            terms = np.stack(np.broadcast_arrays(*[t[a] - t[e] * z[c] for a, e, c in pairs]))
            log_s = log_sum_exp(terms)  # log of the power terms' sum S
            floor = np.broadcast_to(t[-1], log_s.shape)
            positive = floor > 0
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                # E > 0: log(S + E) as a log-sum-exp, exact at any scale; E <= 0: log S +
                # log(y / S), continued linearly below RATIO_FLOOR (non-finite only where the
                # power terms underflow, which the objective scores as an infinite loss).
                ratio = 1 + floor * np.exp(-log_s)
                below = np.log(np.maximum(ratio, RATIO_FLOOR))
                below = below + np.minimum(ratio - RATIO_FLOOR, 0) / RATIO_FLOOR
                log_y = np.where(
                    positive, np.logaddexp(log_s, np.log(np.abs(floor))), log_s + below
                )
                if not jacobian:
                    return log_y, None
                slope = 1 / np.maximum(ratio, RATIO_FLOOR)  # d log(y/S) / d ratio, E <= 0
                # d log y / d log S and d log y / d E
                through_s = np.where(positive, np.exp(log_s - log_y), 1 - (ratio - 1) * slope)
                d_floor = np.where(positive, np.exp(-log_y), slope * np.exp(-log_s))
            weights = np.exp(terms - log_s)  # each power term's share of S
            columns = []
            for (_, _, c), w in zip(pairs, weights, strict=True):
                columns += [through_s * w, -through_s * w * z[c]]
            columns.append(d_floor)
            return log_y, np.stack(columns, axis=-1)
        la, k, x0, lb = t
        s = expit(k * (z[0] - x0))
        amp, floor = np.exp(la), np.exp(lb)
        y = floor + amp * s
        if not jacobian:
            return np.log(y), None
        slope = amp * s * (1 - s)
        columns = [amp * s / y, slope * (z[0] - x0) / y, -slope * k / y, floor / y]
        return np.log(y), np.stack(np.broadcast_arrays(*columns), axis=-1)

    # ------------------------------------------------------------------ starting points
    def start_grid(self, Z: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Starting values (G, p) scaled to the data (see the module's docstring)."""
        log_med = float(np.log(np.median(y)))
        if self.name == "sigmoid":
            x = Z[:, 0]
            spread = float(np.ptp(x)) or 1.0
            span = float(np.ptp(y)) or float(np.max(y))
            grid = itertools.product(
                np.log(span * np.array([0.5, 1.0, 2.0])),
                np.array([-30.0, -10.0, -3.0, -1.0, 1.0, 3.0]) / spread,
                np.quantile(x, [0.1, 0.5, 0.9]),
                np.log(float(np.min(y)) * np.array([0.1, 0.5, 0.9])),
            )
            return np.array(list(grid))
        centre = Z.mean(axis=0)
        term = [log_med + np.log(TERM_SHARES)]
        floors = float(np.min(y)) * np.array(FLOOR_SHARES)
        rows = []
        if self.name == "power":
            for c, alpha in itertools.product(term[0], EXPONENTS):
                rows.append((c + alpha * centre[0], alpha))
        elif self.name == "power_floor":
            for c, alpha, e in itertools.product(term[0], EXPONENTS, floors):
                rows.append((c + alpha * centre[0], alpha, e))
        else:
            for c1, alpha, c2, beta, e in itertools.product(
                term[0], EXPONENTS, term[0], EXPONENTS, floors
            ):
                rows.append((c1 + alpha * centre[0], alpha, c2 + beta * centre[1], beta, e))
        return np.array(rows, dtype=float)


LAWS = {
    "power": Law("power", ("A", "alpha"), 1, formula="y = A·x^(-alpha)"),
    "power_floor": Law("power_floor", ("A", "alpha", "E"), 1, formula="y = E + A·x^(-alpha)"),
    "chinchilla": Law(
        "chinchilla",
        ("A", "alpha", "B", "beta", "E"),
        2,
        formula="y = E + A·N^(-alpha) + B·D^(-beta)",
    ),
    "sigmoid": Law(
        "sigmoid",
        ("a", "k", "L0", "b"),
        1,
        log_x=False,
        formula="y = b + a / (1 + exp(-k·(x - L0)))",
    ),
}
"""Every form ``fit_scaling_law`` accepts, by name."""
