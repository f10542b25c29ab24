"""Trials over several processes: launching the ranks of one Ray Tune trial.

A trial with ``TrainConfig.workers = N > 1`` asks Tune for a placement group of N equal
bundles on one node (its ``sweep.plan.PlannedCohort``: one per GPU the planner gives it, or N CPU
bundles, STRICT_PACK). The Tune function (``sweep.tune_trial``) itself is rank 0, in bundle 0:
it is the process that reports to Tune, writes the trial's rows and names its checkpoints,
exactly as a one-process trial. Ranks 1..N-1 are ``RankWorker`` actors in bundles 1..N-1,
started by rank 0 (``rank_workers``). All N run the same ``train_rank``: a ``TrialRun`` in
the world restores the Tune checkpoint and trains (``loop.fit``); at every evaluation every
rank writes its
part of the DeepSpeed checkpoint (ZeRO shards per rank) into one directory on the node,
which rank 0 then hands to Tune. A retried trial restores that checkpoint on every rank.

Why not Ray Train's ``TorchTrainer`` inside the Tune function: its workers report to Train's
own controller and storage, and Tune would receive only a checkpoint path in the metrics
(``ray.tune.integration.ray_train.TuneReportCallback``), so a multi-worker trial would have
other checkpoints and another resume than a one-process trial; here both are the same code.

A rank that dies (SIGKILL, out of memory) breaks the process group: the other ranks' next
collective fails at once (gloo and NCCL see the closed connection), rank 0's error fails
the Tune trial, and Tune retries it from its last checkpoint. A rank that raises while its
process lives is caught by rank 0's watchdog, which ends the other workers so that rank 0
does not wait in a collective, and rank 0 then raises that rank's error.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from scale_fpt.config import ConfigError, TrialConfig, parse_trial
from scale_fpt.runtime import free_port
from scale_fpt.trial import TrialRun, trial_id_for
from scale_fpt.world import World

Report = Callable[[list[dict], list[dict], str], None]
"""``report(curve_rows, trial_rows, checkpoint_dir)``: rank 0's hand-off of one evaluation."""


def train_rank(run: TrialRun, checkpoint, staging: str, report: Report | None = None) -> list[dict]:
    """Restore ``checkpoint`` (a ``ray.tune.Checkpoint`` or None) and train to the end;
    returns the final trial rows. At every evaluation every rank saves its part into
    ``staging/step-N``; then ``report`` (rank 0's) sees the evaluation and the complete
    directory, which is removed after it. A trial of one process is the same with one rank."""
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            run.restore(directory)

    def on_eval(curve_rows: list[dict], trial_rows: list[dict]) -> None:
        directory = str(Path(staging) / f"step-{run.position}")
        run.save(directory)  # collective: ends when every rank has written its part
        if report is not None:
            report(curve_rows, trial_rows, directory)
            shutil.rmtree(directory, ignore_errors=True)

    return run.run(on_eval=on_eval)


class RankWorker:
    """One rank > 0 of a trial; runs as a Ray actor (``ray.remote(RankWorker)``, made where
    it is started: the library imports Ray only where it runs it), named
    ``TRIAL_ID/rankR/...`` for ``ray list actors``."""

    def run(self, flat: dict, sweep: str, world: World, checkpoint, staging: str) -> None:
        run = TrialRun([parse_trial(flat)], sweep=sweep, world=world)
        try:
            train_rank(run, checkpoint, staging)
        finally:
            run.close()


@contextlib.contextmanager
def rank_workers(config: TrialConfig | None, sweep: str, checkpoint) -> Iterator[tuple[World, str]]:
    """Rank 0's side of a trial: yields (rank 0's world, the checkpoint staging directory).
    A world of one (``config`` None: a packed cohort, one process) starts nothing. A larger one starts ranks 1..N-1 in the other bundles of
    this Tune trial's placement group, running ``train_rank`` from ``checkpoint``; on leaving,
    waits for them (raising a rank's error) and ends them, whatever happened."""
    workers = config.train.workers if config is not None else 1
    staging = tempfile.mkdtemp(prefix="scale_fpt_ckpt_")
    try:
        if workers == 1:
            yield World(), staging
            return
        import ray
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = get_current_placement_group()
        if group is None or len(group.bundle_specs) < workers:
            raise RuntimeError(
                f"--workers {workers}: the trial needs a placement group of {workers} bundles "
                "(run it with scale_fpt.sweep.run_sweep, which asks for them; with "
                "--gpus-per-trial N, N must be at least --workers)"
            )
        trial_id = trial_id_for(sweep, config.to_flat())
        port = free_port()
        address = ray.util.get_node_ip_address()
        worker_class = ray.remote(max_restarts=0)(RankWorker)
        actors, runs = [], []
        try:
            for rank in range(1, workers):
                bundle = group.bundle_specs[rank]
                actor = worker_class.options(
                    name=f"{trial_id}/rank{rank}/{uuid.uuid4().hex[:8]}",  # `ray list actors`
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        group, placement_group_bundle_index=rank
                    ),
                ).remote()
                actors.append(actor)
                world = World(rank=rank, size=workers, master_addr=address, master_port=port)
                runs.append(actor.run.remote(config.to_flat(), sweep, world, checkpoint, staging))
            watchdog = Watchdog(runs, actors)
            try:
                yield World(0, workers, address, port), staging
            except ConfigError:
                raise  # the trial cannot be built: every rank says so, rank 0's message will do
            except BaseException:
                watchdog.raise_failure()  # a worker's own error explains rank 0's best
                raise
            finally:
                watchdog.stop()
            ray.get(runs)
        finally:
            for actor in actors:
                ray.kill(actor)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class Watchdog:
    """Watches the ranks > 0 of a trial from a thread of rank 0. When one fails while its
    process lives (an exception), its peers would wait in their next collective until the
    process group times out: the watchdog ends every worker, which makes that collective
    fail on rank 0 at once, and keeps the error for rank 0 to raise."""

    def __init__(self, runs: list, actors: list):
        self.runs, self.actors = runs, actors
        self.failure: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="rank-watchdog", daemon=True)
        self.thread.start()

    def watch(self) -> None:
        import ray

        pending = list(self.runs)
        while pending and not self.stopping.is_set():
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for run in done:
                try:
                    ray.get(run)
                except BaseException as e:
                    self.failure = e
                    for actor in self.actors:
                        ray.kill(actor)
                    return

    def raise_failure(self) -> None:
        """Raise the first worker's error, if any worker failed (waiting a little for news
        of a worker that died as rank 0 noticed)."""
        self.thread.join(timeout=5.0)
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5.0)
