"""`ray job submit` of a study script to a running Ray head (the recipe of cluster/README.md):
the job runs the sweep, `ray job logs` shows its progress lines and summary, `ray job status`
its end, `ray job stop` stops a running one; the rows land in the results directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
from ray_clusters import LocalCluster, free_port, wait_until

pytest.importorskip("aiohttp", reason="ray job submission needs ray[default] (aiohttp)")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray head with its dashboard (the job server), started with the results default
    that cluster/*.yaml export on every node (SCALE_FPT_RESULTS)."""
    results = tmp_path_factory.mktemp("shared") / "results"
    cluster = LocalCluster(SCALE_FPT_RESULTS=str(results))
    port = free_port()
    try:
        cluster.launch(
            workers=0,
            head=(
                "--num-cpus=2",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={port}",
            ),
        )
        yield cluster, f"http://127.0.0.1:{port}", results
    finally:
        cluster.shutdown()


def ray_job(cluster: LocalCluster, address: str, command: str, *args: str, timeout: float = 300):
    return subprocess.run(
        [cluster.ray, "job", command, "--address", address, *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_status(address, job) -> str:
    """The job server's status name of ``job`` (SUCCEEDED, RUNNING, STOPPED, ...)."""
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(address).get_job_status(job).value)


@pytest.mark.slow
def test_ray_job_submit_logs_status_and_stop(head):
    """The job inherits the node's environment: with no --results, its rows land in the
    head's SCALE_FPT_RESULTS."""
    cluster, address, results = head
    # The dashboard's job agent answers a little after the head is up.
    wait_until(lambda: ray_job(cluster, address, "list").returncode == 0, "the job server")
    script = ROOT / "sweeps" / "scale.py"
    flags = "--tasks bit-xor --inits random --seeds 0 --steps 4 --set eval_every=2"
    flags += " --set test_batches=1 --set val_batches=1 --name jobbed"
    flags = flags.split()
    submitted = ray_job(
        cluster,
        address,
        "submit",
        "--submission-id",
        "jobbed",
        "--no-wait",
        "--",
        "env",
        "SCALE_FPT_PROGRESS_EVERY=1",
        "python",
        str(script),
        *flags,
    )
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    logs = ray_job(cluster, address, "logs", "jobbed", "--follow", timeout=400).stdout
    status = ray_job(cluster, address, "status", "jobbed")
    assert "Job 'jobbed' succeeded" in status.stdout + status.stderr, logs[-3000:]
    assert "[scale-fpt] jobbed: trials 1 done, 0 running, 0 pending, 0 failed" in logs
    assert "[scale-fpt] done " in logs
    assert "jobbed: test accuracy at the step of best validation accuracy" in logs
    trials = pd.read_parquet(results / "jobbed" / "trials")
    assert trials["status"].tolist() == ["completed"] and trials["steps_done"].tolist() == [4]

    long_flags = [{"4": "1000000", "jobbed": "stopped"}.get(f, f) for f in flags]
    submitted = ray_job(
        cluster,
        address,
        "submit",
        "--submission-id",
        "stopme",
        "--no-wait",
        "--",
        "python",
        str(script),
        *long_flags,
    )
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    wait_until(lambda: job_status(address, "stopme") == "RUNNING", "the job to run")
    stopped = ray_job(cluster, address, "stop", "stopme")
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    wait_until(lambda: job_status(address, "stopme") == "STOPPED", "the stop", None, 60)
