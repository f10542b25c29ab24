"""The column vocabulary of the report's tables: one name per statistic in every long
DataFrame the report computes and every CSV it writes under ``tables/`` and ``figures/``,
so that a reader (and pandas code) finds "the p" under one name in every table
(docs/report.md).

A row's statistics:

- ``mean``: a cell's estimate (the mean over its seeds); ``diff``: a comparison's estimate
  (arm a minus arm b, ``contrast`` says which);
- ``ci_low``, ``ci_high``: the 95% interval of the row's estimate; ``ci95`` its half-width;
  ``interval_note``: why there is no interval (the same after a prefix bound that prefix's
  ``mean`` or ``diff``: ``paper_lr_ci95``, ``accuracy_ci_low``);
- ``n``: the seeds the estimate rests on (pairs, for a paired comparison); ``n_<thing>``
  counts something else (``n_a``, ``n_b``: each arm's seeds; ``n_trials``, ...);
- ``p``: the test's raw p; ``p_adjusted``: Benjamini-Hochberg adjusted within its family;
  ``p_family_size``: the tests of that family; ``p_min``: the least p the test can give at
  its n; ``p_se``: a Monte Carlo p's standard error; ``p_sign_flip`` (with ``_se``,
  ``_min``): the sign-flip test beside the paired t;
- ``test``: the test ``p`` is from ('paired t', 'Welch t', 'exact log-rank', ...);
- ``family``: the multiplicity family the analysis plan declared; ``status``: 'planned'
  (in it) or 'exploratory';
- ``note``: what else a reader must know about the row;
- ``<x>_low``, ``<x>_high``: the 95% bounds of the row's column ``x`` (``d_z_low``).

A table with a test per outcome puts the outcome first: ``accuracy_diff``, ``accuracy_p``,
``accuracy_p_adjusted``, ``steps_p``, ``steps_test`` ... (``OUTCOMES``); a table with one
test uses the bare names. ``problems`` finds the columns that break the vocabulary.
"""

from __future__ import annotations

import re

OUTCOMES = ("accuracy", "steps")
"""The prefixes of a table that tests more than one outcome of the same comparison."""
STATUSES = ("planned", "exploratory")
"""The ``status`` of a tested row."""

P_NAMES = (
    "p",
    "p_adjusted",
    "p_family_size",
    "p_min",
    "p_se",
    "p_sign_flip",
    "p_sign_flip_se",
    "p_sign_flip_min",
)
"""Every name a p-value column may take after its outcome prefix."""
INTERVAL_NAMES = ("ci_low", "ci_high", "ci95", "interval_note")
"""The interval of a row's estimate (``mean`` or ``diff``)."""
RETIRED = {
    "p_t": "p (with test 'paired t')",
    "n_pairs": "n",
    "n_obs": "n",
    "steps_logrank_p": "steps_p (with steps_test '... log-rank')",
    "steps_logrank_method": "steps_test",
}
"""Former names, each with the one that replaced it (docs/usage.md lists the renames)."""

WORDS = re.compile(r"[A-Za-z0-9]+")
SPECIAL = {"p", "n", "ci", "ci95", "lo", "hi", "low", "high"}
"""Words that make a column a p, n or interval column, whatever else its name says."""


def problems(columns) -> list[str]:
    """One line per column of ``columns`` (a table's, all of them) that names a p, an n or
    an interval outside the vocabulary, saying what the vocabulary calls it."""
    names = [str(c) for c in columns]
    present = set(names)
    return [f"{c!r}: {why}" for c in names if (why := problem(c, present))]


def problem(column: str, present: set[str]) -> str:
    """Why ``column`` breaks the vocabulary among the columns ``present``; '' if it does
    not."""
    stem = column
    for outcome in OUTCOMES:
        stem = stem.removeprefix(f"{outcome}_")
    if column in RETIRED or stem in RETIRED:
        return f"a retired name: now {RETIRED.get(column) or RETIRED[stem]}"
    words = [w.lower() for w in WORDS.findall(column)]
    if not SPECIAL.intersection(words):
        return ""
    if not re.fullmatch(r"\w+", column):
        return (
            "a p, n or interval column is one word (p, p_adjusted, n, ci_low, ci_high, "
            "interval_note, ...), not display text"
        )
    if "p" in words and stem not in P_NAMES:
        return f"a p column is one of {', '.join(P_NAMES)}, after an outcome prefix"
    if words[0] == "n" or words[-1] == "n":
        return ""  # n, n_<thing>, <outcome>_n, selection_n: counts
    for name in INTERVAL_NAMES:
        owner = column.removesuffix(name)
        if owner != column and (owner.endswith("_") or not owner):
            if {f"{owner}mean", f"{owner}diff"} & present:
                return ""
            return f"the interval of an estimate, and there is no {owner}mean or {owner}diff"
    if words[-1] in ("lo", "hi"):
        return "an interval's bounds end in _low and _high"
    owner = column.rsplit("_", 1)[0]
    if words[-1] in ("low", "high") and owner not in present:
        return (
            f"<x>_low and <x>_high bound the column x, and there is no {owner!r} (an "
            "estimate's own interval is ci_low, ci_high)"
        )
    if words[-1] not in ("low", "high") and SPECIAL.intersection(words) - {"p", "n"}:
        return f"an estimate's interval is one of {', '.join(INTERVAL_NAMES)}"
    return ""
