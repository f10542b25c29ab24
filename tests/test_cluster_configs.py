"""The Ray cluster launcher configs in cluster/*.yaml pass Ray's own validation, offline.

Validation is ``scale_fpt.cluster.validate_cluster_config``: Ray's JSON schema, then Ray's
``prepare_config`` + ``validate_config`` (the steps of ``ray up`` before any cloud call).
The remaining tests check what Ray cannot know: the package reaches every node, resources
match the instance types, the image's Ray matches the installed one.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shlex
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers import home_env, torch_extensions_dir
from ray_clusters import free_port, wait_until

from scale_fpt.cluster import (
    NODE_TOKEN,
    cluster_token_file,
    load_cluster_config,
    validate_cluster_config,
)
from scale_fpt.cluster import main as cluster_main
from scale_fpt.config import ConfigError
from scale_fpt.prebuild import prebuild_ops

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


# --- Token authentication ------------------------------------------------------------------


def node_environment(config: dict) -> str:
    """What every process of a node gets in its environment from ``config``: the container's
    ``--env`` options (gpu.yaml) and the setup commands (local.yaml's ~/.scale_fpt_env)."""
    docker = config.get("docker") or {}
    return " ".join([*docker.get("run_options", []), *config.get("setup_commands", [])])


def test_every_node_runs_ray_with_the_clusters_token(cluster_file):
    """Token authentication on, on every node, with a token from outside the repository; no
    opt-out anywhere; the dashboard (and its job API) on 127.0.0.1 only."""
    config = load_cluster_config(cluster_file)
    assert "RAY_AUTH_MODE=token" in node_environment(config)
    assert "RAY_AUTH_MODE=disabled" not in cluster_file.read_text()
    token = Path(cluster_token_file(config, cluster_file))
    assert not token.resolve().is_relative_to(REPO), "the token must stay out of the repository"
    assert config["cluster_name"] in token.name, "one token per cluster"
    prepared = _prepare(cluster_file)
    head_start = " ".join(prepared["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    assert "0.0.0.0" not in cluster_file.read_text()


def test_cluster_token_is_made_once_and_only_its_owner_reads_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = CLUSTER_DIR / "gpu.yaml"
    assert cluster_main(["token", str(config)]) == 0
    token = Path(cluster_token_file(load_cluster_config(config), config))
    assert token.is_relative_to(tmp_path)
    assert f"made the cluster token {token}" in capsys.readouterr().out
    first = token.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    token.chmod(0o644)
    assert cluster_main(["token", str(config)]) == 0  # a running cluster's nodes hold the first one
    assert f"kept the cluster token {token}" in capsys.readouterr().out
    assert token.read_text() == first
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    other = CLUSTER_DIR / "local.yaml"
    assert cluster_token_file(load_cluster_config(other), other) != str(token)


def test_token_command_names_a_config_without_the_token_mount(tmp_path, capsys):
    config = load_cluster_config(CLUSTER_DIR / "local.yaml")
    del config["file_mounts"][NODE_TOKEN]
    assert cluster_main(["token", str(_write(tmp_path, config))]) == 2
    err = capsys.readouterr().err
    assert f"file_mounts: no '{NODE_TOKEN}' entry" in err and "Traceback" not in err


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


@pytest.fixture(scope="module")
def laptop_checkout(tmp_path_factory) -> tuple[Path, str]:
    """The repository as `ray up` sees it on a laptop: a git clone overlaid with this working
    tree's files (tracked and untracked-not-ignored) plus one local edit, made once for the
    module (the tests only read it). Returns (its path, the git_sha its rows must carry)."""
    laptop = tmp_path_factory.mktemp("checkout") / "laptop"
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
    env.update(home_env(home))
    return subprocess.run(
        " ".join(_with_interactive(command)),
        shell=True,
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def set_up_by_hand(config_path: Path, laptop: Path, home: Path, shared: Path) -> dict:
    """The files and setup of `ray up` of ``config_path`` onto a node simulated here, in
    seconds: its home ``home``, its /mnt/shared at ``shared``. The file mounts are copied as
    the launcher syncs them (.git left out of the trees) and the head's setup commands run
    through ``ray_shell``, except the pip and torch ones (the synced tree goes on PYTHONPATH
    instead) and the kernels' prebuild (seconds of torch and DeepSpeed imports that record
    nothing). (``test_ray_up_submit_job_submit_down_over_ssh`` runs the real thing.)"""
    config = _prepare(config_path)
    home.mkdir()
    for remote, local in config["file_mounts"].items():
        if remote == NODE_TOKEN:  # no Ray runs here (the SSH test carries the token)
            continue
        target = home / remote.removeprefix("~/")
        shutil.copytree(laptop / local, target, ignore=shutil.ignore_patterns(".git"))
    (home / ".bashrc").write_text(
        f"export PATH={Path(sys.executable).parent}:$PATH\n"
        f"export PYTHONPATH={home / SYNCED.removeprefix('~/')}\n"
    )
    shared.mkdir()
    for command in config["head_setup_commands"]:
        if any(skip in command for skip in ("pip install", "import torch", "scale_fpt.prebuild")):
            continue
        done = ray_shell(command.replace(SHARED, str(shared)), home)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    return config


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpu.yaml", "local.yaml"])
def test_synced_nodes_record_the_commit_rows_carry(tmp_path, laptop_checkout, name):
    """After `ray up`, code on a node that has no .git still knows its commit: the setup
    records the synced tree's SHA and dirty flag, which scale_fpt.trial.git_sha returns."""
    laptop, expected = laptop_checkout
    home = tmp_path / "node"
    set_up_by_hand(CLUSTER_DIR / name, laptop, home, tmp_path / "shared")
    assert not (home / SYNCED.removeprefix("~/") / ".git").exists()
    done = ray_shell("python -c 'from scale_fpt.trial import git_sha; print(git_sha())'", home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == expected


# --- `ray up`, `ray submit`, `ray job submit`, `ray down` of each config, over SSH -----------

SSHD = shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{os.environ.get('PATH', '')}")
RAY = shutil.which("ray", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
DASHBOARD = "http://127.0.0.1:8265"  # the head's job server: Ray's default dashboard port
SWEEP = "--tasks bit-xor --inits random --seeds 0 --steps 4 --set eval_every=2"
SWEEP += " --set test_batches=1 --set val_batches=1"


@dataclass
class SshNode:
    """A machine that Ray's local node provider reaches over SSH: this one, logged into as a
    user of its own (so the node's `ray stop` can only stop the node's Ray, and its `pip
    install` can only write to the node's home), through an sshd started per connection."""

    user: str
    """The node's login user (`auth.ssh_user`)."""
    uid: int
    """Its user id: the node's processes are the processes of this user."""
    home: Path
    """Its home directory (in a temporary directory)."""
    shared: Path
    """What the configs' /mnt/shared is on this node: a directory the user owns."""
    key: Path
    """The private key the launcher logs in with (`auth.ssh_private_key`)."""
    sshd: Path
    """`auth.ssh_proxy_command`: a script that runs this node's sshd in inetd mode on the
    connection's stdin and stdout."""
    builds: Path | None
    """The node's copy of this machine's torch extension cache (the kernels' builds), shown
    at this machine's path; None without mount namespaces (the node builds in its home)."""


def hidden_python_trees() -> dict[Path, set[Path]]:
    """The folders this test's Python lives in (its environment, ``sys.prefix``, and the
    interpreter a venv links to, ``sys.base_prefix``) that lie under a directory other users
    cannot enter, by that directory: e.g. {/root: {/root/.pyenv, /root/ci}} for a venv in a
    checkout under a 0700 /root over pyenv's Python."""
    hidden: dict[Path, set[Path]] = {}
    for prefix in {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}:
        closed = [d for d in prefix.parents if not d.stat().st_mode & stat.S_IXOTH]
        if len(closed) > 1:
            pytest.skip(f"{prefix} lies under several directories other users cannot enter")
        if closed:
            top = closed[0]
            hidden.setdefault(top, set()).add(top / prefix.relative_to(top).parts[0])
    return hidden


def sshd_command(base: Path, sshd_config: Path, binds: dict[Path, Path]) -> tuple[str, bool]:
    """The shell command that serves one SSH connection on stdin/stdout (``sshd -i``), in a
    mount namespace of its own (nothing changes for the rest of the machine) in which each
    ``binds`` target path shows its source folder; and whether the binds are made.

    When this machine's Python lies under a directory other users cannot enter (pyenv, or a
    venv, in a 0700 /root), the node's user could not run it; each such directory is then an
    empty tmpfs there holding only the Python trees (bound in place). Without mount
    namespaces the binds are left out, and Python must be readable as it is."""
    serve = f"exec {shlex.quote(SSHD)} -i -f {shlex.quote(str(sshd_config))}"
    hidden = hidden_python_trees()
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        if hidden:
            pytest.skip(f"no mount namespace for the node's view of Python: {probe.stderr.strip()}")
        return serve, False
    steps = []
    for n, (top, trees) in enumerate(hidden.items()):
        staged = [(tree, base / f"python{n}-{i}") for i, tree in enumerate(sorted(trees))]
        for tree, stage in staged:
            stage.mkdir()
            steps.append(["mount", "--bind", str(tree), str(stage)])
        steps.append(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(top)])
        for tree, stage in staged:
            steps += [["mkdir", str(tree)], ["mount", "--move", str(stage), str(tree)]]
    for target, source in binds.items():
        steps += [["mkdir", "-p", str(target)], ["mount", "--bind", str(source), str(target)]]
    inner = " && ".join(shlex.join(step) for step in [*steps, ["true"]]) + f" && {serve}"
    return f"exec unshare --mount --propagation private sh -c {shlex.quote(inner)}", True


def layered_venv(target: Path) -> Path:
    """A virtual environment at ``target`` for the node's user, over this test's packages: a
    ``.pth`` file puts this interpreter's site-packages after the venv's own, the console
    scripts beside ``sys.executable`` (``ray`` ...) are copied to run the venv's Python, and
    its other programs (``ninja`` ...) are linked. So the node has this machine's torch, Ray
    and ninja without reinstalling them, its `pip install` writes to a folder the node's user
    owns, and what it installs (the synced package) comes first. (Another ninja, e.g. the
    system's older one, cannot read the build log of this machine's and rebuilds the kernels
    the node was given: two minutes of the SSH test.) Returns the venv's ``bin``."""
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    bin_dir = target / "bin"
    python = bin_dir / "python"
    own = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(own) / "_layered_on.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    ours = Path(sys.executable).resolve()
    for script in Path(sys.executable).parent.iterdir():
        copy = bin_dir / script.name
        if copy.exists() or not script.is_file():
            continue
        head, _, rest = script.read_bytes().partition(b"\n")
        if not head.startswith(b"#!"):
            if os.access(script, os.X_OK):  # a program, not a script
                copy.symlink_to(script)
            continue
        shebang = Path(head[2:].decode(errors="replace").strip())
        if shebang.exists() and shebang.resolve() == ours:
            copy.write_bytes(b"#!" + str(python).encode() + b"\n" + rest)
            copy.chmod(0o755)
    return bin_dir


def end_processes(matches) -> None:
    """Kill this machine's processes for which ``matches(process)`` holds, and wait for them."""
    import psutil

    killed = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if matches(process):
                process.kill()
                killed.append(process)
    psutil.wait_procs(killed, timeout=30)


@pytest.fixture
def ssh_node():
    """A node for the launcher: a login user made for the test, its home and shared directory
    under one temporary directory, a key pair, and its own sshd config and host key. The
    node's Python, first on its PATH from ~/.bashrc as local.yaml asks of every machine, is a
    venv of its own layered on this test's environment (``layered_venv``); the node's Ray keeps its files (and its `ray_current_cluster`) in its own
    temporary directory, apart from any other Ray here. The node starts with the fused
    kernels and DeepSpeed op this machine has built (a copy of its torch extension cache, at
    the same path: the setup's `scale_fpt.prebuild` then loads them instead of compiling). At the end every
    process of the user is ended and the user and the directory removed."""
    if SSHD is None:
        pytest.skip("sshd is not installed (Debian: apt-get install openssh-server)")
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed: Ray's launcher syncs file mounts with it")
    if os.geteuid() != 0:
        pytest.skip("the node's login user can only be added as root")
    base = Path(tempfile.mkdtemp(prefix="sfn", dir="/tmp"))  # short: Ray's sockets go in it
    base.chmod(0o755)
    user = f"sfn{secrets.token_hex(4)}"
    home = base / "home"
    privsep = Path("/run/sshd")  # sshd's privilege separation directory, made by its service
    made_privsep = not privsep.exists()
    uid = None
    try:
        # No password, but not a locked account either (sshd refuses those without PAM).
        useradd = ["useradd", "--create-home", "--home-dir", str(home), "--password", "*"]
        subprocess.run([*useradd, "--shell", "/bin/bash", user], check=True)
        uid = pwd.getpwnam(user).pw_uid
        privsep.mkdir(mode=0o755, exist_ok=True)
        key = base / "key"
        for path in (key, base / "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)])
        (home / ".ssh").mkdir(mode=0o700)
        shutil.copy(f"{key}.pub", home / ".ssh" / "authorized_keys")
        # Torch rebuilds a JIT extension whose build commands name another folder, and the
        # fused kernels' commands name their build folder: the node's copy of this machine's
        # builds is shown at this machine's path (when mount namespaces allow; elsewhere the
        # node's folder is not its own and it builds into its home).
        prebuild_ops()
        extensions = Path(torch_extensions_dir())
        node_extensions = home / ".cache" / "torch_extensions" / extensions.name
        shutil.copytree(extensions, node_extensions)
        venv_bin = layered_venv(home / "venv")
        with open(home / ".bashrc", "a") as bashrc:
            bashrc.write(f"export PATH={venv_bin}:$PATH TMPDIR={base}/tmp\n")
            shown = shlex.quote(str(extensions))
            bashrc.write(f"if [ -w {shown} ]; then export TORCH_EXTENSIONS_DIR={shown}; fi\n")
        (base / "tmp").mkdir()
        (base / "shared").mkdir()
        for path in (home, base / "tmp", base / "shared"):
            shutil.chown(path, user, user)
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    shutil.chown(Path(root) / name, user, user)
        sshd_config = base / "sshd_config"
        sshd_config.write_text(
            f"HostKey {base}/host_key\nAllowUsers {user}\nAuthorizedKeysFile .ssh/authorized_keys\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "LogLevel ERROR\n"
        )
        proxy = base / "sshd"
        command, bound = sshd_command(base, sshd_config, {extensions: node_extensions})
        proxy.write_text(f"#!/bin/sh\n{command}\n")
        proxy.chmod(0o755)
        builds = node_extensions if bound else None
        yield SshNode(user, uid, home, base / "shared", key, proxy, builds)
    finally:
        if uid is not None:
            end_processes(lambda p: p.info["uids"].real == uid)
        # The launcher's SSH connections (their ssh client and sshd run as root).
        end_processes(lambda p: any(str(base) in arg for arg in p.info["cmdline"] or ()))
        shutil.rmtree(base, ignore_errors=True)
        if made_privsep:
            shutil.rmtree(privsep, ignore_errors=True)
        if uid is not None:  # userdel refuses while a process of the user runs
            subprocess.run(["userdel", user], check=True)


def launch_config(name: str, node: SshNode) -> dict:
    """cluster/``name`` as shipped except what ties it to its machines: the provider (Ray's
    local one: this machine as the head, no workers), `auth` (the node's user, key and sshd),
    /mnt/shared (the node's shared directory), the head's dashboard agent port and, for gpu.yaml, its AWS and docker parts
    (the EC2 node types, the EFS mount on the instance's host, the container)."""
    text = (CLUSTER_DIR / name).read_text().replace(SHARED, str(node.shared))
    config = yaml.safe_load(text)
    config["provider"] = {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    config["auth"] = {
        "ssh_user": node.user,
        "ssh_private_key": str(node.key),
        "ssh_proxy_command": str(node.sshd),
    }
    for aws_or_docker in ("available_node_types", "head_node_type", "initialization_commands"):
        config.pop(aws_or_docker, None)
    config.pop("docker", None)
    # Every local ray.init() of this machine (other tests' too) takes the dashboard agent's
    # default port, 52365: the head's agent gets a free one instead.
    head_start = config["head_start_ray_commands"]
    head_start[-1] += f" --dashboard-agent-listen-port={free_port()}"
    return config


def node_processes(node: SshNode) -> set[str]:
    """Names of the node's processes, but for the sshd of the launcher's open connections."""
    import psutil

    names = set()
    for process in psutil.process_iter(["uids", "name"]):
        if process.info["uids"].real == node.uid and process.info["name"] != "sshd":
            names.add(process.info["name"])
    return names


def busy_ports(ports) -> list[int]:
    """Those of ``ports`` that a process of this machine listens on."""
    import psutil

    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
    return sorted(set(ports) & listening)


def container_environment(name: str, node: SshNode) -> list[str]:
    """``K=V`` of each ``--env`` option of cluster/``name``'s container (none for local.yaml),
    /mnt/shared as on ``node``: what the swapped-out container gives every process."""
    docker = load_cluster_config(CLUSTER_DIR / name).get("docker") or {}
    options = [o.split(None, 1) for o in docker.get("run_options", [])]
    return [
        option[1].replace(SHARED, str(node.shared))
        for option in options
        if option[0] == "--env" and len(option) == 2
    ]


def unauthenticated_probes(token: str, env: dict) -> dict[str, subprocess.Popen]:
    """Started at once, in the background: a job submission without a token and with another
    cluster's, and a driver's ``ray.init`` on the head's address without a token."""
    other = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    assert other["RAY_AUTH_TOKEN"] != token
    job = [RAY, "job", "submit", "--address", DASHBOARD, "--submission-id"]
    attach = "import ray; ray.init(address='127.0.0.1:6379'); print('attached')"
    commands = {
        "job without token": ([*job, "intruder", "--", "touch", "/tmp/sfn-intruder"], env),
        "job with another token": ([*job, "impostor", "--", "touch", "/tmp/sfn-impostor"], other),
        "ray.init without token": ([sys.executable, "-c", attach], env),
    }
    return {
        what: subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for what, (command, environment) in commands.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["local.yaml", "gpu.yaml"])
def test_ray_up_submit_job_submit_down_over_ssh(tmp_path, laptop_checkout, ssh_node, name):
    """The README's commands, for real, with this machine as the config's head: the laptop
    makes the cluster's token (`python -m scale_fpt.cluster token`), `ray up` syncs a laptop's
    checkout and the token and runs the config's setup (its real `pip install -e`) and start
    commands over SSH; a sweep by `ray submit` and one of the synced copy by `ray job submit`
    with the token (at once, on the node's two CPUs) write rows that carry the laptop's commit
    to the shared path; `ray down` stops the node's Ray. Every Ray process of the node runs
    with token authentication, and a job submitted without the token or with another one,
    and a driver's `ray.init` without it, are refused; the token is in no file of the results.
    local.yaml's node defaults send a bare sweep's results and Tune state to shared storage.
    gpu.yaml's container is swapped out (its ``--env`` options go to the node's ~/.bashrc),
    and its node runs the same code as local.yaml's, so there both commands run the sweep's
    ``--plan`` (the script's imports, the planner and the preflight on the node: no
    training, ~2 minutes less) and `ray exec` reads the commit rows would carry. On
    local.yaml, the job's logs show the sweep's progress, `ray job status` its end, and `ray
    job stop` stops a second, endless one."""
    import psutil
    from ray.job_submission import JobSubmissionClient

    from scale_fpt.results import load_results

    # The head takes Ray's default ports (GCS 6379, dashboard 8265) and gpu.yaml's object
    # manager port; another Ray on this machine may hold any of them.
    ray.shutdown()
    ports = [6379, 8265, 8076]
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not busy_ports(ports), "Ray's default ports", timeout=15)
    if busy := busy_ports(ports):
        pytest.skip(f"port(s) {busy} of the config's head are taken on this machine")
    laptop, expected = laptop_checkout
    launched = launch_config(name, ssh_node)
    config = _write(tmp_path, launched, name)
    validate_cluster_config(config)
    if exports := container_environment(name, ssh_node):
        with open(ssh_node.home / ".bashrc", "a") as bashrc:
            bashrc.write(f"export {shlex.join(exports)}\n")
    shared = ssh_node.shared / "scale_fpt"
    sweep = SWEEP.split()
    planned = name == "gpu.yaml"
    if planned:
        sweep += ["--plan"]
    (tmp_path / "launcher").mkdir()
    laptop_home = tmp_path / "laptop-home"  # where the laptop keeps the cluster's token
    laptop_home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SCALE_FPT_", "RAY_ADDRESS", "RAY_AUTH_")) and k != "PYTHONPATH"
    }
    env["HOME"] = str(laptop_home)
    env["TMPDIR"] = str(tmp_path / "launcher")  # the launcher's cluster state and config cache
    made = subprocess.run(
        [sys.executable, "-m", "scale_fpt.cluster", "token", str(config)],
        cwd=laptop,
        env=env,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    token_file = laptop_home / launched["file_mounts"][NODE_TOKEN].removeprefix("~/")
    token = token_file.read_text()
    # What the README's recipe exports for `ray job submit` from the laptop.
    authenticated = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}

    def ray_cli(*args: str, environment: dict = authenticated) -> subprocess.CompletedProcess:
        return subprocess.run(
            [RAY, *args], cwd=laptop, env=environment, capture_output=True, text=True, timeout=600
        )

    def succeeds(*args: str) -> str:
        done = ray_cli(*args)
        assert done.returncode == 0, (args[:2], done.stdout[-4000:], done.stderr[-4000:])
        return done.stdout

    def job_status(job: str) -> str:
        """The job server's status name of ``job`` (RUNNING, STOPPED, ...)."""
        return str(jobs.get_job_status(job).value)

    up_started = time.time_ns()
    succeeds("up", "-y", str(config))
    assert {"gcs_server", "raylet"} <= node_processes(ssh_node)
    if ssh_node.builds:  # the node's set-up loaded the builds it was given (a rebuild: minutes)
        libraries = list(ssh_node.builds.glob("*/*.so"))
        assert libraries, ssh_node.builds
        assert [p for p in libraries if p.stat().st_mtime_ns >= up_started] == []
    node_token = ssh_node.home / NODE_TOKEN.removeprefix("~/")
    assert node_token.read_text() == token
    assert stat.S_IMODE(node_token.stat().st_mode) == 0o600
    # Every process of the node whose environment can be read (a process that retitles
    # itself, e.g. a dashboard module, overwrites it) runs with token authentication, the
    # GCS and the raylet among them.
    modes = {}
    for process in psutil.process_iter(["uids", "name"]):
        if process.info["uids"].real == ssh_node.uid and process.info["name"] != "sshd":
            with contextlib.suppress(psutil.NoSuchProcess):
                if environ := process.environ():
                    modes[process.info["name"]] = environ.get("RAY_AUTH_MODE")
    assert {"gcs_server", "raylet"} <= set(modes), modes
    assert set(modes.values()) == {"token"}, modes
    synced_script = ssh_node.home / SYNCED.removeprefix("~/") / "sweeps" / "scale.py"
    job = ["job", "submit", "--address", DASHBOARD, "--submission-id", "jobbed", "--no-wait"]
    job += ["--", "env", "SCALE_FPT_PROGRESS_EVERY=1", "python", str(synced_script)]
    job += [*sweep, "--name", "jobbed"]
    # The dashboard's job agent answers a little after `ray start` returns.
    wait_until(lambda: ray_cli(*job).returncode == 0, "the job server", timeout=60)
    jobs = JobSubmissionClient(DASHBOARD, headers={"Authorization": f"Bearer {token}"})
    probes = unauthenticated_probes(token, env)
    submitted = succeeds(
        "submit", str(config), "sweeps/scale.py", "--", *sweep, "--name", "submitted"
    )
    logs = succeeds("job", "logs", "--address", DASHBOARD, "--follow", "jobbed")
    refused = {what: probe.communicate(timeout=300)[0] for what, probe in probes.items()}
    assert all(probe.returncode != 0 for probe in probes.values()), refused
    assert "Unauthorized: Missing authentication token" in refused["job without token"]
    assert "Forbidden: Invalid authentication token" in refused["job with another token"]
    assert "InvalidAuthToken" in refused["ray.init without token"]
    assert "attached" not in refused["ray.init without token"]
    # Submitted jobs (the list also holds `ray submit`'s driver, without a submission id).
    assert {j.submission_id for j in jobs.list_jobs() if j.submission_id} == {"jobbed"}
    if planned:
        for study, output in (("submitted", submitted), ("jobbed", logs)):
            assert f"{study}: 1 arms x 1 trial(s)" in output, output[-3000:]
        read_commit = "python -c 'from scale_fpt.trial import git_sha; print(git_sha())'"
        assert succeeds("exec", str(config), read_commit).splitlines()[-1] == expected
        assert not shared.exists()  # a plan writes nothing
    else:
        for study in ("submitted", "jobbed"):
            trials = load_results(shared / "results", study).trials
            assert trials["status"].tolist() == ["completed"], study
            assert trials["git_sha"].tolist() == [expected], study
            assert (shared / "ray" / study).is_dir(), study
        # The job's logs carry the sweep's progress lines and summary; status and stop work.
        assert "[scale-fpt] jobbed: trials 1 done, 0 running, 0 pending, 0 failed" in logs
        assert "jobbed: test accuracy at the step of best validation accuracy" in logs
        assert "succeeded" in succeeds("job", "status", "--address", DASHBOARD, "jobbed")
        endless = [{"4": "1000000"}.get(flag, flag) for flag in sweep]
        long_job = ["job", "submit", "--address", DASHBOARD, "--submission-id", "stopme"]
        succeeds(*long_job, "--no-wait", "--", "python", str(synced_script), *endless)
        wait_until(lambda: job_status("stopme") == "RUNNING", "the job to run", timeout=60)
        succeeds("job", "stop", "--address", DASHBOARD, "stopme")
        wait_until(lambda: job_status("stopme") == "STOPPED", "the stop", timeout=60)
    assert not (ssh_node.home / "results").exists()
    for path in [
        *ssh_node.shared.rglob("*"),
        *(ssh_node.home / SYNCED.removeprefix("~/")).rglob("*"),
    ]:
        if path.is_file() and not path.is_symlink():
            assert token.encode() not in path.read_bytes(), path

    succeeds("down", "-y", str(config))
    wait_until(lambda: not node_processes(ssh_node), "the node's Ray to stop", timeout=30)
