"""The Ray cluster launcher configs in cluster/*.yaml pass Ray's own validation, offline.

Validation is ``scale_fpt.cluster.validate_cluster_config``: Ray's JSON schema, then Ray's
``prepare_config`` + ``validate_config`` (the steps of ``ray up`` before any cloud call).
The remaining tests check what Ray cannot know: the package reaches every node, resources
match the instance types, the image's Ray matches the installed one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import torch_extensions_dir

from scale_fpt.cluster import load_cluster_config, validate_cluster_config
from scale_fpt.config import ConfigError

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
CLUSTER_DIR = REPO / "cluster"
CLUSTER_FILES = sorted(CLUSTER_DIR.glob("*.yaml"))
SYNCED = "~/scale-fpt"  # where the configs copy the repository on every node
INSTALL_PACKAGE = f"pip install -e {SYNCED}"
SHARED_ARGS = "--results /mnt/shared/scale_fpt/results --storage /mnt/shared/scale_fpt/ray"

# GPUs / vCPUs of the instance types these configs may use.
AWS_INSTANCES = {
    "m5.2xlarge": (0, 8),
    "m5.4xlarge": (0, 16),
    "g5.xlarge": (1, 4),
    "g5.2xlarge": (1, 8),
    "g5.12xlarge": (4, 48),
    "g5.48xlarge": (8, 192),
    "p4d.24xlarge": (8, 96),
}


def _ids(paths):
    return [p.name for p in paths]


def _prepare(path: Path) -> dict:
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(load_cluster_config(path))


@pytest.fixture(params=CLUSTER_FILES, ids=_ids(CLUSTER_FILES))
def cluster_file(request) -> Path:
    return request.param


def test_expected_configs_exist():
    assert {"gpu.yaml", "local.yaml"} <= {p.name for p in CLUSTER_FILES}


# --- Ray's own validation ------------------------------------------------------------------


def test_validates_with_ray(cluster_file):
    validate_cluster_config(cluster_file)


def test_ray_prepare_and_validate_directly(cluster_file):
    """The same two calls `ray up` makes, without the library wrapper."""
    from ray.autoscaler._private.util import validate_config

    prepared = _prepare(cluster_file)
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_no_top_level_min_workers(cluster_file):
    assert "min_workers" not in load_cluster_config(cluster_file)


# --- Resources -----------------------------------------------------------------------------


def test_resources_are_integers(cluster_file):
    for name, node_type in _prepare(cluster_file)["available_node_types"].items():
        for resource, amount in node_type["resources"].items():
            assert type(amount) is int, f"{name}.resources.{resource} = {amount!r}"
            assert amount >= 0


def test_aws_resources_match_instance_types():
    config = load_cluster_config(CLUSTER_DIR / "gpu.yaml")
    head = config["head_node_type"]
    for name, node_type in config["available_node_types"].items():
        instance = node_type["node_config"]["InstanceType"]
        assert instance in AWS_INSTANCES, f"{name}: add {instance} to AWS_INSTANCES"
        gpus, vcpus = AWS_INSTANCES[instance]
        resources = node_type["resources"]
        assert resources.get("GPU", 0) == gpus, f"{name} ({instance}) has {gpus} GPU(s)"
        assert 0 < resources["CPU"] <= vcpus, f"{name} ({instance}) has {vcpus} vCPUs"
        if name == head:
            assert resources["GPU"] == 0
        else:
            assert resources["GPU"] >= 1, f"worker type {name} must declare its GPUs"
            assert node_type["min_workers"] == 0, f"{name}: GPU workers only on demand"
            assert 1 <= node_type["max_workers"] <= config["max_workers"]


def test_gpu_cluster_has_single_and_multi_gpu_workers():
    config = load_cluster_config(CLUSTER_DIR / "gpu.yaml")
    head = config["head_node_type"]
    worker_gpus = sorted(
        t["resources"]["GPU"] for n, t in config["available_node_types"].items() if n != head
    )
    assert worker_gpus[0] == 1
    assert worker_gpus[-1] >= 4


# --- The package reaches every node --------------------------------------------------------


def test_project_is_mounted_on_every_node(cluster_file):
    file_mounts = load_cluster_config(cluster_file)["file_mounts"]
    assert SYNCED in file_mounts
    local = Path(file_mounts[SYNCED])
    assert not local.is_absolute(), "the mount must be the repo `ray up` is run from"
    assert (REPO / local / "pyproject.toml").is_file()
    assert (REPO / local / "scale_fpt" / "__init__.py").is_file()


def test_synced_copy_cannot_shadow_the_installed_package(cluster_file):
    """`ray submit` runs ~/script.py, so ~ is first on sys.path: a mount named like an
    importable module there (~/scale_fpt) becomes a namespace package `scale_fpt` that wins
    over the editable install. Every mount in ~ must have a name Python cannot import."""
    for remote in load_cluster_config(cluster_file)["file_mounts"]:
        name = remote.removeprefix("~/").split("/")[0]
        assert name.startswith("scale_fpt_") or not name.isidentifier(), remote


def test_package_is_installed_on_head_and_workers(cluster_file):
    prepared = _prepare(cluster_file)
    # prepare_config merges setup_commands into both lists.
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert any(INSTALL_PACKAGE in c for c in prepared[key]), key
    for name, node_type in prepared["available_node_types"].items():
        # A node type's own worker_setup_commands replace the global ones.
        override = node_type.get("worker_setup_commands")
        if override is not None:
            assert any(INSTALL_PACKAGE in c for c in override), name


def test_ray_pins_match_installed_ray(cluster_file):
    text = cluster_file.read_text()
    pins = re.findall(r"\bray(?:\[[^\]]*\])?==([0-9][0-9a-z.]*)", text)
    images = re.findall(r"rayproject/ray:([0-9][0-9.]*[0-9])", text)
    for version in pins + images:
        assert version == ray.__version__


def test_start_commands(cluster_file):
    prepared = _prepare(cluster_file)
    head = prepared["head_start_ray_commands"]
    worker = prepared["worker_start_ray_commands"]
    assert head[0].strip() == "ray stop"
    assert worker[0].strip() == "ray stop"
    head_start = " ".join(head[1:])
    assert "ray start --head --port=6379" in head_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "ray start --address=$RAY_HEAD_IP:6379" in " ".join(worker[1:])


def test_header_documents_launch_commands(cluster_file):
    header = "\n".join(
        line for line in cluster_file.read_text().splitlines() if line.startswith("#")
    )
    # Joined across the "\" continuation lines of the comment.
    flat = re.sub(r"\\\n#\s*", "", header)
    rel = f"cluster/{cluster_file.name}"
    for command in (f"ray up {rel}", f"ray submit {rel} sweeps/", f"ray down {rel}"):
        assert command in flat
    assert f"ray rsync-down {rel} /mnt/shared/scale_fpt/results" in flat
    assert SHARED_ARGS in flat


# --- gpu.yaml specifics --------------------------------------------------------------------


def test_gpu_image_matches_installed_ray():
    docker = load_cluster_config(CLUSTER_DIR / "gpu.yaml")["docker"]
    images = [docker[k] for k in ("image", "head_image", "worker_image") if k in docker]
    assert images
    for image in images:
        m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)-(gpu|cu\d+)", image)
        assert m, f"{image}: expected rayproject/ray:<version>-py<XY>-gpu"
        assert m[1] == ray.__version__
        assert (int(m[2]), int(m[3])) >= (3, 10)  # requires-python


def test_gpu_docker_run_options():
    config = load_cluster_config(CLUSTER_DIR / "gpu.yaml")
    options = " ".join(config["docker"]["run_options"])
    assert "--ulimit nofile=" in options
    assert "--shm-size=" in options
    assert "-v /mnt/shared:/mnt/shared" in options
    assert config["docker"]["container_name"]


def test_gpu_shared_filesystem_is_mounted_on_hosts():
    config = load_cluster_config(CLUSTER_DIR / "gpu.yaml")
    # Host commands (outside docker) mount EFS before the container bind-mounts it.
    init = " ".join(config["initialization_commands"])
    assert "mount -t nfs4" in init
    assert re.search(r"EFS_FS_ID=fs-\w+", init)
    assert "/mnt/shared" in init
    assert config["provider"]["type"] == "aws"
    assert config["provider"]["region"]
    assert config["auth"]["ssh_user"] == "ubuntu"


# --- local.yaml specifics ------------------------------------------------------------------


def test_local_provider_shape():
    config = load_cluster_config(CLUSTER_DIR / "local.yaml")
    provider = config["provider"]
    assert provider["type"] == "local"
    assert isinstance(provider["head_ip"], str)
    assert provider["worker_ips"] and all(isinstance(ip, str) for ip in provider["worker_ips"])
    assert config["auth"]["ssh_user"] and config["auth"]["ssh_private_key"]
    # Ray rejects node types for on-premise clusters; resources are detected per machine.
    assert "available_node_types" not in config
    assert "head_node_type" not in config


# --- Malformed configs are rejected by the same function -----------------------------------


def _write(tmp_path: Path, config: dict, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_cluster_config(path)
    assert info.value.problems
    assert all(str(path) in p for p in info.value.problems)
    return info.value.problems


@pytest.fixture
def gpu_config() -> dict:
    return load_cluster_config(CLUSTER_DIR / "gpu.yaml")


def test_rejects_fractional_resource(tmp_path, gpu_config):
    gpu_config["available_node_types"]["a10g_24gb_x1"]["resources"]["GPU"] = 0.5
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert "available_node_types.a10g_24gb_x1.resources.GPU" in problem
    assert "0.5" in problem and "integer" in problem


def test_rejects_fractional_resource_in_dotted_node_type(tmp_path, gpu_config):
    types = gpu_config["available_node_types"]
    types["ray.worker.gpu"] = types.pop("a10g_24gb_x1")
    types["ray.worker.gpu"]["resources"]["CPU"] = 3.5
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert 'available_node_types["ray.worker.gpu"].resources.CPU' in problem


def test_ray_itself_rejects_fractional_resource(gpu_config):
    """The helper's verdict is Ray's: the launcher's own validate_config refuses it too."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    gpu_config["available_node_types"]["a10g_24gb_x1"]["resources"]["GPU"] = 0.5
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(gpu_config))


def test_rejects_unknown_top_level_key(tmp_path, gpu_config):
    gpu_config["worker_count"] = 3
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert problem.endswith(
        "worker_count: unknown top-level key (not in Ray's cluster config schema)"
    )


def test_rejects_unknown_node_type_key(tmp_path, gpu_config):
    gpu_config["available_node_types"]["a10g_24gb_x4"]["instance_type"] = "g5.12xlarge"
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert "available_node_types.a10g_24gb_x4.instance_type: unknown key" in problem


def test_rejects_missing_head_node_type(tmp_path, gpu_config):
    del gpu_config["head_node_type"]
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert "head_node_type: missing" in problem


def test_rejects_unknown_head_node_type(tmp_path, gpu_config):
    gpu_config["head_node_type"] = "head"
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert "'head' is not one of available_node_types" in problem


def test_rejects_top_level_min_workers(tmp_path, gpu_config):
    gpu_config["min_workers"] = 2
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert problem.split(": ", 1)[1].startswith("min_workers: unknown top-level key")
    assert "set min_workers on each entry of available_node_types" in problem


def test_reports_every_problem_at_once(tmp_path, gpu_config):
    gpu_config["available_node_types"]["a10g_24gb_x1"]["resources"]["GPU"] = 0.5
    gpu_config["available_node_types"]["a10g_24gb_x4"]["max_workers"] = "two"
    gpu_config["worker_count"] = 3
    del gpu_config["head_node_type"]
    assert len(_problems(_write(tmp_path, gpu_config))) == 4


def test_rejects_min_workers_above_max_workers(tmp_path, gpu_config):
    """A check only Ray's validate_config (after prepare_config) makes."""
    gpu_config["available_node_types"]["a10g_24gb_x1"]["min_workers"] = 20
    (problem,) = _problems(_write(tmp_path, gpu_config))
    assert "rejected by Ray's cluster launcher" in problem and "max_workers" in problem


def test_rejects_node_types_on_local_provider(tmp_path):
    config = load_cluster_config(CLUSTER_DIR / "local.yaml")
    config["available_node_types"] = {"n": {"resources": {"CPU": 1}, "node_config": {}}}
    config["head_node_type"] = "n"
    problems = _problems(_write(tmp_path, config))
    assert len(problems) == 2
    assert all("not supported for provider type 'local'" in p for p in problems)


def test_rejects_missing_provider(tmp_path, gpu_config):
    del gpu_config["provider"]
    problems = _problems(_write(tmp_path, gpu_config))
    assert any("'provider' is a required property" in p for p in problems)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("cluster_name: x\nprovider:\n  type: aws\n  region: [us-west-2\nauth: {}\n")
    (problem,) = _problems(path)
    assert re.search(rf"{re.escape(str(path))}:\d+:\d+: YAML syntax error", problem)
    line = int(problem.split(":")[1])
    assert 4 <= line <= 6


def test_non_mapping_and_missing_file(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    (problem,) = _problems(path)
    assert "must be a YAML mapping" in problem
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read"):
        validate_cluster_config(missing)


def test_importing_the_module_does_not_import_ray():
    code = "import sys, scale_fpt.cluster; sys.exit('ray' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --- A node set up by a config, and `ray submit` on it ---------------------------------------

SHARED = "/mnt/shared"


def laptop_checkout(tmp_path: Path) -> tuple[Path, str]:
    """The repository as `ray up` sees it on a laptop: a git clone overlaid with this working
    tree's files (tracked and untracked-not-ignored) plus one local edit. Returns (its path,
    the git_sha its rows must carry)."""
    laptop = tmp_path / "laptop"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(laptop)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (laptop / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, laptop / name)
    with open(laptop / "README.md", "a") as f:
        f.write("\nan edit not committed\n")
    head = subprocess.run(
        ["git", "-C", str(laptop), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return laptop, f"{head}-dirty"


def ray_shell(command: str, home: Path) -> subprocess.CompletedProcess:
    """``command`` on a node the way the cluster launcher runs it over SSH (setup and start
    commands, `ray exec`, `ray submit`): Ray's own ``bash --login -i`` wrapper, which sources
    ~/.bashrc first, here with HOME=``home``."""
    from ray.autoscaler._private.command_runner import _with_interactive

    # Nothing of this process's environment decides what the node imports (PYTHONPATH
    # would hide how the installed package resolves).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SCALE_FPT_", "RAY_")) and k != "PYTHONPATH"
    }
    # The node keeps the fused kernels built on this machine (no 2-minute rebuild per test).
    env.update(HOME=str(home), TORCH_EXTENSIONS_DIR=torch_extensions_dir())
    return subprocess.run(
        " ".join(_with_interactive(command)),
        shell=True,
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ray_up(config_path: Path, laptop: Path, home: Path, shared: Path, install: bool) -> dict:
    """`ray up` of ``config_path`` onto one node simulated here: its home ``home``, its
    /mnt/shared at ``shared``. The file mounts are copied as the launcher syncs them (.git
    left out of the trees), and the head's setup commands run through ``ray_shell``.

    ``install=True`` runs every setup command as shipped, its `pip install -e` included,
    with this machine's Python first on PATH (what local.yaml asks of every machine) and pip
    installing into the node's home (PIP_USER=1: ~/.local, the user site that Python puts
    ahead of the system site-packages), so nothing of this machine's install changes.
    ``install=False`` skips the pip and torch commands and puts the synced tree on PYTHONPATH
    instead, for the tests that need only the synced files."""
    config = _prepare(config_path)
    home.mkdir()
    for remote, local in config["file_mounts"].items():
        target = home / remote.removeprefix("~/")
        shutil.copytree(laptop / local, target, ignore=shutil.ignore_patterns(".git"))
    bashrc = f"export PATH={Path(sys.executable).parent}:$PATH\n"
    if install:
        bashrc += "export PIP_USER=1\n"
    else:
        bashrc += f"export PYTHONPATH={home / SYNCED.removeprefix('~/')}\n"
    (home / ".bashrc").write_text(bashrc)
    shared.mkdir()
    for command in config["head_setup_commands"]:
        if not install and ("pip install" in command or "import torch" in command):
            continue
        done = ray_shell(command.replace(SHARED, str(shared)), home)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    return config


@pytest.mark.parametrize("name", ["gpu.yaml", "local.yaml"])
def test_synced_nodes_record_the_commit_rows_carry(tmp_path, name):
    """After `ray up`, code on a node that has no .git still knows its commit: the setup
    records the synced tree's SHA and dirty flag, which scale_fpt.trial.git_sha returns."""
    laptop, expected = laptop_checkout(tmp_path)
    home = tmp_path / "node"
    ray_up(CLUSTER_DIR / name, laptop, home, tmp_path / "shared", install=False)
    assert not (home / SYNCED.removeprefix("~/") / ".git").exists()
    done = ray_shell("python -c 'from scale_fpt.trial import git_sha; print(git_sha())'", home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == expected


@pytest.mark.slow
def test_bare_ray_submit_writes_to_shared_storage_with_the_synced_commit(tmp_path):
    """`ray submit cluster/local.yaml sweeps/scale.py` with no --results or --storage, on a
    node set up by `ray up` with the config's real `pip install -e`: the script, run as
    ~/scale.py, imports the installed package (not the synced folder beside it), the
    sweep's rows and Ray Tune's state land on the shared path (not the node's ~/results),
    and every row carries the laptop's commit."""
    laptop, expected = laptop_checkout(tmp_path)
    home, shared = tmp_path / "node", tmp_path / "shared"
    ray_up(CLUSTER_DIR / "local.yaml", laptop, home, shared, install=True)
    shutil.copy2(REPO / "sweeps" / "scale.py", home / "scale.py")  # what `ray submit` copies
    flags = "--tasks bit-xor --inits random --seeds 0 --steps 4 --set eval_every=2"
    flags += " --set test_batches=1 --name submitted"
    done = ray_shell(f"python ~/scale.py {flags}", home)
    assert done.returncode == 0, done.stderr[-3000:]

    from scale_fpt.results import load_results

    trials = load_results(shared / "scale_fpt" / "results", "submitted").trials
    assert trials["status"].tolist() == ["completed"]
    assert trials["git_sha"].tolist() == [expected]
    assert (shared / "scale_fpt" / "ray" / "submitted").is_dir()
    assert not (home / "results").exists()
    assert not (home / ".ray" / "auth_token").exists()  # RAY_AUTH_MODE set for every shell
