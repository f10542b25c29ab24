"""Secrets in the environment never reach what scale_fpt writes.

Typical credentials (W&B, Hugging Face, MLflow, AWS, a Ray token) are set to marker values
in the environment of a searched sweep with every logger on (TensorBoard, W&B offline, an
MLflow file store; Optuna's storage; Ray Tune's storage), of ``scale-fpt report`` and of the
sweep's ``--plan``; then every byte of every file they wrote (results, Ray's session files,
the home and temporary folders they ran with) and everything they printed is searched for
each marker. What artefacts may record of a trial is an allow-list
(``scale_fpt.results_schema.recorded_config`` and the Parquet schemas): this shows that nothing
outside it slips through a logger, a tracker or a library's own files.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import home_env
from ray.tune.execution.class_cache import ENV_VARS_TO_PROPAGATE

from scale_fpt.results_schema import recorded_config

SECRET_VARIABLES = (
    "WANDB_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "RAY_AUTH_TOKEN",
)
SWEEP = "lr-search --preset local --tasks bit-xor --inits random --seeds 0 --confirm-seeds none"
SWEEP += " --steps 4 --set eval_every=2 --set test_batches=1 --set val_batches=1"
SWEEP += " --search-trials 2 --logger tensorboard,wandb,mlflow --name secrets"


def files_holding(marker: bytes, roots: list[Path]) -> list[Path]:
    return [
        path
        for root in roots
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and marker in path.read_bytes()
    ]


@pytest.mark.slow
def test_no_secret_of_the_environment_reaches_an_artefact(tmp_path):
    # Short: Ray's socket paths go under RAY_TMPDIR.
    scratch = Path(tempfile.mkdtemp(prefix="sfs", dir="/tmp"))
    try:
        home, temp, ray_temp = scratch / "home", scratch / "tmp", scratch / "ray"
        for folder in (home, temp, ray_temp):
            folder.mkdir()
        markers = {name: f"sfsecret{secrets.token_hex(16)}" for name in SECRET_VARIABLES}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SCALE_FPT_", "MLFLOW_"))}
        env.update(markers)
        env.update(home_env(home))
        env.update(
            TMPDIR=str(temp),
            RAY_TMPDIR=str(ray_temp),
            WANDB_MODE="offline",
            RAY_AUTH_MODE="token",  # the marker above is the token of this sweep's Ray
        )
        results = tmp_path / "results"
        command = [sys.executable, "-m", "scale_fpt.cli"]
        sweep = [*command, "sweep", *SWEEP.split(), "--results", str(results)]
        printed = []
        for args in ([*sweep, "--plan"], sweep, [*command, "report", str(results)]):
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, (args[3:5], done.stdout[-2000:], done.stderr[-3000:])
            printed.append(done.stdout + done.stderr)

        sweep_dir = results / "secrets"
        for written in ("trials", "curves", "tensorboard", "wandb", "mlruns", "report"):
            assert any((sweep_dir / written).rglob("*")) or any((results / written).rglob("*")), (
                written
            )
        assert list(results.rglob("*.db")) or list(results.rglob("*.journal")), "Optuna storage"
        assert any(ray_temp.rglob("*.log")), "Ray's session logs"
        # Ray Tune itself hands the driver's AWS credentials to every trial (runtime_env, for
        # S3 storage), and Ray's runtime env agent logs them in the node's session logs:
        # Ray's files, never the results; docs/security.md says how to keep them out.
        tune_propagates = set(ENV_VARS_TO_PROPAGATE)
        leaks = {
            name: files_holding(marker.encode(), [results, home, temp])
            + ([] if name in tune_propagates else files_holding(marker.encode(), [ray_temp]))
            + [f"output {i}" for i, text in enumerate(printed) if marker in text]
            for name, marker in markers.items()
        }
        assert not any(leaks.values()), {name: found for name, found in leaks.items() if found}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_recorded_config_keeps_declared_trial_fields_only():
    row = {
        "task": "bit-xor",
        "lr": 1e-3,
        "seed": 0,
        "trial_id": "abc",
        "WANDB_API_KEY": "sfsecret",
        "optuna_storage": "postgresql://user:sfsecret@host/db",
        "dropout": float("nan"),
    }
    assert recorded_config(row) == {"task": "bit-xor", "lr": 1e-3, "seed": 0}
