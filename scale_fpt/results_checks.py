"""What ``load_results`` does not take on trust in a results folder: rows that claim another
sweep than their folder or carry a trial id that is no plain name, and the same trial under
two sweeps (a copied folder, a trial run twice). Each finding is one line in the report's
notes (``Results.notes``) and one warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from scale_fpt.confined import printable
from scale_fpt.results_schema import config_columns

log = logging.getLogger(__name__)

SAFE_TRIAL_ID = r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$"
"""A trial id as scale_fpt makes them (a content hash, a member's tag): one plain file name."""


def sweep_rows(table_: pa.Table, sweep_dir: Path, notes: list[str]) -> pa.Table:
    """The rows of a sweep folder's table that are its own: rows naming another sweep than
    the folder (a copied or renamed folder, a planted row), or a trial id that is no plain
    name, are left out, with one line in ``notes`` (and a warning) naming the folder."""
    ids = table_.column("trial_id")
    distinct = pc.unique(ids)  # 10^5 trials' ids checked once each, not per curve row
    plain = pc.fill_null(pc.match_substring_regex(distinct, SAFE_TRIAL_ID), False)
    id_ok = pc.invert(pc.is_in(ids, distinct.filter(pc.invert(plain))))
    ok = pc.fill_null(pc.and_(pc.equal(table_.column("sweep"), sweep_dir.name), id_ok), False)
    dropped = len(table_) - pc.sum(ok).as_py() if len(table_) else 0
    if not dropped:
        return table_  # no copy of a sweep's rows that are all its own
    claimed = sorted({printable(str(s)) for s in table_.filter(pc.invert(ok))["sweep"].to_pylist()})
    note(
        notes,
        f"{printable(str(sweep_dir))}: {dropped} row(s) claiming sweep(s) "
        f"{', '.join(claimed[:5])}{' ...' * (len(claimed) > 5)} or a trial id that is no "
        "plain name, not this folder's "
        f"sweep {printable(sweep_dir.name)!r}: not used (a copied or renamed sweep folder?)",
    )
    return table_.filter(ok)


CONFIG_COLUMNS = [f.name for f in config_columns()]


def repeated(trials, key: list[str]):
    """(Rows whose ``key`` an earlier row of another sweep holds, that sweep per row): within
    a sweep the trial id is the config's hash, so only copies across sweeps count."""
    first = trials.groupby(key, dropna=False, sort=False)["sweep"].transform("first")
    return trials.duplicated(key) & (first != trials["sweep"]), first


def repeated_configs(trials):
    """Rows whose config and seed a row of an earlier sweep (by name) holds: the same trial
    run twice, which pooled sweeps (``--pool``) count once."""
    return repeated(trials, CONFIG_COLUMNS)[0]


def once_each(trials, curves, notes: list[str]):
    """Each trial counted once. The same trial id under two sweeps (rows copied and edited)
    keeps its first copy (sweeps in name order), its curves too; the same config and seed
    under two sweeps (the same trial run twice) stays in each sweep's own cells, once each,
    and is counted once where sweeps are pooled (``repeated_configs``). One line in
    ``notes`` per pair of sweeps names both and how many."""
    by_id, id_first = repeated(trials, ["trial_id"])
    by_config, config_first = repeated(trials, CONFIG_COLUMNS)
    twice = by_id | by_config
    if not twice.any():
        return trials, curves
    copies = trials.loc[twice, ["sweep", "trial_id"]].assign(
        first=id_first.where(by_id, config_first)[twice], same_id=by_id[twice]
    )
    for (sweep, first, same_id), group in copies.groupby(["sweep", "first", "same_id"]):
        how = (
            "the same trial ids: counted once, in the first"
            if same_id
            else "the same configs and seeds: the same trials run twice; each sweep's cells "
            "hold them once, pooled sweeps (--pool) count them once"
        )
        note(
            notes,
            f"{len(group)} trial(s) of sweep {printable(sweep)!r} (e.g. "
            f"{printable(group['trial_id'].iloc[0])}) and of sweep {printable(first)!r} have "
            f"{how}",
        )
    key = ["sweep", "trial_id"]
    dropped = curves.set_index(key).index.isin(copies[copies["same_id"]].set_index(key).index)
    return trials[~by_id].reset_index(drop=True), curves[~dropped]


def note(notes: list[str] | None, line: str) -> None:
    """A problem of a results folder: kept for the report (``notes``) and warned once."""
    if notes is not None:
        notes.append(line)
    log.warning(f"scale-fpt: warning: {line}")
