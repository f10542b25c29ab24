"""The GPU cluster path on CPUs: Ray's fake autoscaler launches "GPU" nodes for trials that
ask for GPUs; CPU workers see no GPU; kernels build once per node; cluster GPU offers."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import own_ray
from ray_clusters import LocalCluster, free_port

from scale_fpt.cluster import gpu_offer, node_types_offer
from scale_fpt.gpus import GPUS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_concurrent_first_builds_on_a_node_serialise(tmp_path):
    """Three processes enter the node's build lock at once: their build sections (each
    0.5 s) never overlap, and the lock file sits in the torch extensions directory."""
    log = tmp_path / "builds.log"
    script = (
        "import os, sys, time\n"
        "from scale_fpt.prebuild import node_build_lock\n"
        "with node_build_lock():\n"
        "    start = time.monotonic()\n"
        "    time.sleep(0.5)\n"
        "    with open(sys.argv[1], 'a') as f:\n"
        "        f.write(f'{start} {time.monotonic()}\\n')\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(log)], env=env) for _ in range(3)
    ]
    assert [p.wait(timeout=120) for p in processes] == [0, 0, 0]
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 3
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # one build at a time
    assert (tmp_path / "ext" / "scale_fpt_build.lock").exists()


def fake_cluster_config(port: int, worker_type: str = "l4_24gb_x1") -> dict:
    """examples/fake_gpu_cluster.yaml (Ray's fake multi-node provider: a head of 4 CPUs and
    0 GPUs, one worker type with 1 GPU and min 0) with its head on ``port``."""
    import ray._private.services as services

    config = yaml.safe_load((ROOT / "examples" / "fake_gpu_cluster.yaml").read_text())
    config["provider"]["gcs_address"] = f"{services.get_node_ip_address()}:{port}"
    types = config["available_node_types"]
    types[worker_type] = types.pop("l4_24gb_x1")
    return config


def test_gpu_offers_come_from_node_types_named_by_their_gpu(tmp_path):
    offer = node_types_offer(fake_cluster_config(1234), "fake")
    assert (offer.gpu, offer.max_gpus_per_node) == (GPUS["l4-24gb"], 1)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(fake_cluster_config(1234, "worker_gpu")))
    unnamed = gpu_offer(str(path))  # a GPU type that names no GPU: the default GPU
    assert unnamed.gpu == GPUS["a10g-24gb"] and unnamed.source == str(path)
    gpu_yaml = gpu_offer(str(ROOT / "cluster" / "gpu.yaml"))
    assert (gpu_yaml.gpu, gpu_yaml.max_gpus_per_node) == (GPUS["a10g-24gb"], 4)
    cpu_only = {"available_node_types": {"head": {"resources": {"CPU": 8}}}}
    assert node_types_offer(cpu_only, "x") is None


@pytest.mark.slow
def test_cpu_workers_see_no_gpu_and_gpu_workers_see_theirs():
    """Ray's workers on a node with one (declared) L4: a task given no GPU sees
    CUDA_VISIBLE_DEVICES="" (so torch never makes a CUDA context there), one given the GPU
    sees its id; with no cluster config, auto plans for the running node's GPU."""
    import ray

    with own_ray(
        num_cpus=2,
        num_gpus=1,
        resources={"accelerator_type:L4": 1},
        object_store_memory=100 * 2**20,
    ):
        offer = gpu_offer()  # no ~/ray_bootstrap_config.yaml here: the running nodes
        assert (offer.gpu, offer.max_gpus_per_node, offer.source) == (GPUS["l4-24gb"], 1, "nodes")

        @ray.remote
        def visible():
            return os.environ.get("CUDA_VISIBLE_DEVICES")

        assert ray.get(visible.options(num_gpus=0).remote()) == ""
        assert ray.get(visible.options(num_gpus=1).remote()) == "0"


@pytest.mark.slow
def test_local_preset_on_a_fake_autoscaling_gpu_cluster_launches_gpu_nodes(tmp_path):
    """`sweeps/scale.py --preset local` (shortened) attached to a head with no GPU whose
    autoscaler can launch 1-GPU nodes: the trials ask for a share of a GPU (the planner: 4
    gpt2-tiny trials per L4), the autoscaler launches a GPU node, the trials run there (on
    its CPU: a fake GPU has no CUDA) and complete; each row says where it ran."""
    import torch

    port = free_port()
    config = tmp_path / "autoscaling.yaml"
    config.write_text(yaml.safe_dump(fake_cluster_config(port)))
    cluster = LocalCluster(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
    try:
        cluster.launch(
            workers=0,
            port=port,
            head=("--num-cpus=4", "--num-gpus=0", f"--autoscaling-config={config}"),
        )
        results = tmp_path / "results"
        flags = ["--preset", "local", "--tasks", "bit-xor", "--inits", "random", "--seeds", "0,1"]
        flags += ["--steps", "20", "--set", "eval_every=10", "--set", "test_batches=2"]
        flags += ["--results", str(results), "--cluster-config", str(config)]
        driver = subprocess.run(
            [sys.executable, str(ROOT / "sweeps" / "scale.py"), *flags],
            env={**cluster.env, "RAY_ADDRESS": cluster.address, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        trials = pd.read_parquet(results / "scale-local" / "trials")
        assert len(trials) == 2 and (trials["status"] == "completed").all()
        assert (trials["steps_done"] == 20).all()
        requested = [json.loads(r) for r in trials["resources_requested"]]
        assert requested == [[{"CPU": 1, "GPU": 0.25}]] * 2
        assert [json.loads(g) for g in trials["gpu_ids"]] == [["0"], ["0"]]
        head_id = "f" * 51 + "00000"  # the fake provider's ids: the head, then 00001, ...
        assert trials["node_id"].str.startswith("f" * 51).all()
        assert (trials["node_id"] != head_id).all()  # launched for them, not the head
        expected_device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        assert (trials["device"] == expected_device).all()
        if not torch.cuda.is_available():
            assert trials["gpu_model"].isna().all()  # Ray's GPU, but no CUDA behind it
    finally:
        cluster.shutdown()
