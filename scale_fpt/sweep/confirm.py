"""Confirmation runs: each arm's chosen configuration trained again on fresh seeds.

A search (or a grid over lr / batch size) picks each arm's configuration on its seeds'
validation scores; the same seeds' test accuracy then flatters the winner (winner's curse).
``SweepConfig.confirm_seeds`` names fresh seeds: once the sweep is done, every arm's chosen
configuration runs on them as the grid sweep ``<name>-confirm`` (its own results directory
and Ray experiment), whose rows the LR-fair table reports as its headline. ``confirmation``
makes it in one pass: the sweep's rows read through the writer the driver hands it, each
arm's choice, and the confirmation sweep planned where the sweep ran, with its writer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import pandas as pd

from scale_fpt.results import ResultsWriter
from scale_fpt.sweep.config import SweepConfig, arm_label
from scale_fpt.sweep.plan import SweepPlan, plan_sweep
from scale_fpt.vocabulary import CONFIRM_SUFFIX, Status

PLACEMENT_FIELDS = ("workers", "zero_stage")
"""Fields the planner may set on a trial (``sweep.plan.planned_arms``): not matched."""


def confirmation_sweep(sweep: SweepConfig, choice: tuple[str, ...]) -> SweepConfig:
    """The grid sweep of the confirmation runs: the arms of ``sweep`` (without its
    ``choice`` fields, ``SweepConfig.choice_fields``) x ``confirm_seeds``; each arm's chosen
    values come from ``confirmation``."""
    return dataclasses.replace(
        sweep,
        name=sweep.name + CONFIRM_SUFFIX,
        grid={k: v for k, v in sweep.grid.items() if k not in choice},
        search={},
        seeds=sweep.confirm_seeds,
        confirm_seeds=(),
        asha=False,
    )


def chosen_configuration(
    trials: pd.DataFrame, fixed: dict, choice: tuple[str, ...], seeds, metric: str
) -> dict | None:
    """The values of ``choice`` whose trials (rows agreeing with ``fixed``) completed every
    one of ``seeds`` with the best mean ``metric`` (ties: the lowest values); None when no
    configuration completed every seed."""
    rows = trials
    for key, value in fixed.items():
        if key in rows:
            rows = rows[rows[key] == value]
    rows = rows[rows["seed"].isin(seeds)]
    best, best_score = None, -math.inf
    for values, group in rows.groupby(list(choice), sort=True):
        done = group[group["status"].eq(Status.COMPLETED) & group[metric].notna()]
        if set(done["seed"]) < set(seeds):
            continue  # a failed, diverged, stopped or missing seed disqualifies it
        score = float(done.drop_duplicates("seed")[metric].mean())
        if score > best_score:
            best, best_score = values, score
    if best is None:
        return None
    values = best if isinstance(best, tuple) else (best,)
    return {k: v.item() if hasattr(v, "item") else v for k, v in zip(choice, values, strict=True)}


def confirmation_arms(
    confirm: SweepConfig, choice: tuple[str, ...]
) -> list[tuple[dict, dict, str]]:
    """Each arm of the confirmation sweep ``confirm`` with the values its rows are matched on
    (all but its seed, the ``choice`` fields and what the planner sets) and their label."""
    out = []
    for arm in confirm.trials():
        fixed = {k: v for k, v in arm.items() if k not in ("seed", *choice, *PLACEMENT_FIELDS)}
        out.append((arm, fixed, arm_label(fixed)))
    return out


def chosen_arms(
    arms: list[tuple[dict, dict, str]],
    trials: pd.DataFrame,
    choice: tuple[str, ...],
    seeds,
    metric: str,
) -> tuple[list[dict], list[str]]:
    """(Each of ``confirmation_arms`` with its chosen values of ``choice`` from ``trials``
    (``chosen_configuration``), the labels of the arms with none)."""
    out, unchosen = [], []
    for arm, fixed, label in arms:
        chosen = chosen_configuration(trials, fixed, choice, seeds, metric)
        if chosen is None:
            unchosen.append(label)
        else:
            out.append({**arm, **chosen})
    return out, list(dict.fromkeys(unchosen))


class Confirmation(NamedTuple):
    """What a sweep confirms (``confirmation``)."""

    plan: SweepPlan | None
    """The confirmation sweep (``confirmation_sweep``), each arm with its chosen
    configuration, planned where the sweep ran; None: nothing to confirm."""
    writer: ResultsWriter | None
    """Its results' writer, beside the sweep's (None with nothing to confirm)."""
    unchosen: list[str]
    """Labels of the arms with nothing to confirm (no configuration completed every seed)."""


def confirmation(plan: SweepPlan, writer: ResultsWriter) -> Confirmation:
    """The confirmation of the sweep of ``plan``: every arm of ``confirmation_sweep`` with
    its chosen values of the plan's ``choice_fields`` from the sweep's rows, read by its
    ``writer`` (``chosen_arms``), planned where the sweep ran."""
    sweep, choice = plan.sweep, plan.choice_fields
    confirm = confirmation_sweep(sweep, choice)
    arms = confirmation_arms(confirm, choice)
    rows = writer.trial_rows().to_pandas()
    chosen, unchosen = chosen_arms(arms, rows, choice, sweep.seeds, sweep.metric)
    if not chosen:
        return Confirmation(None, None, unchosen)
    return Confirmation(
        plan_sweep(confirm, plan.placement, chosen),
        ResultsWriter(writer.root.parent, confirm.name),
        unchosen,
    )
