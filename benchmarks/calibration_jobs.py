"""The calibration benchmark as a job that fits: its work cut into tasks of at most
``CHUNK_STUDIES`` studies, each with its own random stream (so a task's rows are the same
whichever shard or order runs it), shards of tasks balanced by projected time, each shard's
rows written as JSON, and the shards' files merged into the one table a single run prints.

    python benchmarks/calibration.py --plan 40              # 40 shards' projected hours
    python benchmarks/calibration.py --shard 3/40 --out s3.json
    python benchmarks/calibration.py --merge s*.json        # the table and the verdict

A shard is one process on one core: run them side by side on a machine's cores, or one per
node of a CPU cluster (any scheduler; a shard reads nothing but the code), then merge.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK_STUDIES = 100
"""Studies per task where a check's studies are independent: a design's 1,100 are 11 tasks
that shards share out."""
FORMAT = 1
"""Version of a shard's JSON."""
FIXED_KINDS = ("never", "always", "within 20%")
"""Row kinds whose value is no binomial rate: no Monte Carlo error is derived for them."""


@dataclass(frozen=True)
class Task:
    """One unit of work: ``check`` at the run's unit number ``unit`` (a check at one
    design), studies ``chunk`` x ``CHUNK_STUDIES`` onwards (``studies`` of them)."""

    check: str
    unit: int
    chunk: int
    studies: int
    seconds: float
    """Projected seconds on one core."""

    @property
    def key(self) -> str:
        return f"{self.check}/{self.unit}/{self.chunk}"

    @property
    def whole(self) -> str:
        """The key of the task its chunks merge into."""
        return f"{self.check}/{self.unit}"

    def rng_key(self, seed: int) -> list[int]:
        """The seed of this task's own random stream."""
        return [seed, self.unit, self.chunk]


def chunks(check: str, unit: int, n_studies: int, per_study: float, whole: bool) -> list[Task]:
    """``n_studies`` of ``check`` at ``unit`` as tasks (one if ``whole``: its rows are not
    rates over independent studies)."""
    size = max(n_studies if whole else CHUNK_STUDIES, 1)
    sizes = [min(size, n_studies - start) for start in range(0, n_studies, size)]
    return [Task(check, unit, i, n, per_study * n) for i, n in enumerate(sizes)]


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), 1 <= K <= N; ValueError naming the form otherwise."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected K/N, e.g. 3/40") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be within 1..N")
    return k, n


def shards(tasks: list[Task], n: int) -> list[list[Task]]:
    """``tasks`` into ``n`` shards of about equal projected time: longest first, each to
    the shard with the least so far (ties to the lowest number), so every shard of a run
    computes the same split."""
    out: list[list[Task]] = [[] for _ in range(n)]
    load = [(0.0, i) for i in range(n)]  # a heap: (projected seconds, shard)
    for task in sorted(tasks, key=lambda t: (-t.seconds, t.key)):
        seconds, i = heapq.heappop(load)
        out[i].append(task)
        heapq.heappush(load, (seconds + task.seconds, i))
    return out


def plan_text(parts: list[list[Task]]) -> str:
    hours = [sum(t.seconds for t in part) / 3600 for part in parts]
    lines = [f"{len(parts)} shards, {sum(hours):.1f} core-hours projected; the longest shard "
             f"{max(hours):.2f} h"]  # fmt: skip
    lines += [f"- shard {i}/{len(parts)}: {len(p)} tasks, {h:.2f} h"
              for i, (p, h) in enumerate(zip(parts, hours, strict=True), 1)]  # fmt: skip
    return "\n".join(lines)


def run_tasks(tasks: list[Task], work: Callable[[Task], list], log=print) -> dict[str, list]:
    """{task key: its rows} of ``work`` over ``tasks``, each task's time logged."""
    out = {}
    for task in tasks:
        start = time.perf_counter()
        out[task.key] = work(task)
        log(f"# {task.key}: {task.studies} studies, {time.perf_counter() - start:.0f} s "
            f"(projected {task.seconds:.0f} s)")  # fmt: skip
    return out


def write_shard(path: Path, header: dict, rows: dict[str, list]) -> None:
    body = {"format": FORMAT, **header,
            "rows": {key: [dataclasses.asdict(r) for r in part] for key, part in rows.items()}}  # fmt: skip
    path.write_text(json.dumps(body))


def read_shards(paths: list[Path], row_type) -> tuple[dict, list[Task], dict[str, list]]:
    """(header, the run's tasks, {task key: rows}) of shard files of one run. ValueError
    naming the problem: a file of another format or run (studies, seed, task list), or
    tasks no file holds."""
    header, rows = None, {}
    for path in paths:
        try:
            body = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a calibration shard ({e})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"{path}: not a calibration shard of format {FORMAT}")
        mine = {k: v for k, v in body.items() if k != "rows"}
        if header is None:
            header = mine
        elif mine != header:
            raise ValueError(f"{path}: from another run (its studies, seed or tasks differ)")
        rows |= {key: [row_type(**r) for r in part] for key, part in body["rows"].items()}
    if header is None:
        raise ValueError("--merge: no shard files given")
    tasks = [Task(**t) for t in header["tasks"]]
    missing = [t.key for t in tasks if t.key not in rows]
    if missing:
        raise ValueError(f"--merge: {len(missing)} tasks missing (no shard ran them), e.g. "
                         f"{', '.join(missing[:3])}")  # fmt: skip
    return header, tasks, rows


def merge(tasks: list[Task], rows: dict[str, list]) -> list:
    """One list of rows from the tasks' rows: a check's chunks merged position by position
    (their studies summed, rates weighted by studies), in ``tasks``' order."""
    groups: dict[str, list[list]] = {}
    for task in tasks:
        groups.setdefault(task.whole, []).append(rows[task.key])
    out = []
    for parts in groups.values():
        for same in zip(*parts, strict=True):
            out.append(merge_rows(same))
    return out


def merge_rows(same) -> object:
    """Rows of one statistic over disjoint studies as one."""
    first = same[0]
    if len(same) == 1:
        return first
    seen = [r for r in same if r.n_studies and math.isfinite(r.coverage)]
    n = sum(r.n_studies for r in seen)
    if not n:
        return dataclasses.replace(first, n_studies=0, printed=any(r.printed for r in same))
    p = sum(r.coverage * r.n_studies for r in seen) / n
    # A share that must be 0 (1) stays 0 (1) exactly only if every part's is.
    error = 0.0 if first.kind in FIXED_KINDS else math.sqrt(max(p * (1 - p), 1 / n) / n)
    return dataclasses.replace(first, coverage=p, mc_error=error, n_studies=n,
                               printed=any(r.printed for r in same))  # fmt: skip
