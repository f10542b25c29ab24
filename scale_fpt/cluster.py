"""Ray cluster launcher configs (``cluster/*.yaml``): loading, offline validation, tokens.

:func:`validate_cluster_config` runs the checks ``ray up`` runs before it talks to a cloud
provider: Ray's own JSON schema (``ray/autoscaler/ray-schema.json``), then Ray's
``prepare_config`` (merges the provider's ``defaults.yaml`` shipped with Ray, reads no
credentials, opens no connection) and ``validate_config`` on the merged result. A few
mistakes that ``prepare_config`` would otherwise hide or turn into a confusing message are
reported first. Every problem becomes one line of a :class:`~scale_fpt.config.ConfigError`.

Every shipped config runs its nodes with Ray's token authentication: the laptop keeps one
token per cluster (:func:`ensure_cluster_token`, ``python -m scale_fpt.cluster token
CONFIG``) and the config's ``file_mounts`` carry it to ``NODE_TOKEN`` on every node.

Ray is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import sys
from dataclasses import dataclass, replace
from typing import Any

from scale_fpt.config import ConfigError
from scale_fpt.gpus import DEFAULT_GPU, GPU, GPUS, gpu_in_name

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
"""Where ``ray up`` leaves the cluster config on the head (its autoscaler reads it)."""

NODE_TOKEN = "~/.ray/auth_token"
"""Where every node of a shipped config holds the cluster's token: Ray's default token file,
which `ray start`, a driver's ``ray.init``, `ray job submit` and the dashboard read without
further settings (the nodes set ``RAY_AUTH_MODE=token``)."""


def load_cluster_config(path: str | os.PathLike) -> dict:
    """Parse a cluster YAML file into a dict.

    Raises ConfigError naming the file (and the line and column of a YAML syntax error) when
    the file cannot be read, is not valid YAML, or is not a mapping at the top level.
    """
    import yaml

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError([f"{path}: cannot read cluster config: {e.strerror or e}"]) from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        what = ": ".join(
            str(part) for part in (getattr(e, "context", None), getattr(e, "problem", None)) if part
        )
        raise ConfigError([f"{where}: YAML syntax error: {what or e}"]) from None
    if not isinstance(config, dict):
        kind = "empty" if config is None else f"a {type(config).__name__}"
        raise ConfigError([f"{path}: a cluster config must be a YAML mapping, got {kind}"])
    return config


def validate_cluster_config(path: str | os.PathLike) -> None:
    """Validate a Ray cluster launcher YAML offline, as ``ray up`` would before launching.

    Raises ConfigError with one message per problem, each naming the file and the offending
    key, e.g. ``available_node_types.a10g_24gb_x1.resources.GPU`` (a key that is not a Python
    identifier is quoted: ``available_node_types["ray.worker.gpu"].resources.GPU``). Needs no
    network and no cloud credentials.
    """
    path = os.fspath(path)
    config = load_cluster_config(path)
    problems = [f"{path}: {p}" for p in _precheck(config)]
    problems += [f"{path}: {p}" for p in _schema_problems(config)]
    if problems:
        raise ConfigError(problems)

    from ray.autoscaler._private.util import prepare_config, validate_config

    # prepare_config() logs an INFO line per filled-in default; keep validation quiet.
    util_logger = logging.getLogger("ray.autoscaler._private.util")
    level = util_logger.level
    util_logger.setLevel(max(level, logging.WARNING))
    try:
        validate_config(prepare_config(config))
    except Exception as e:
        raise ConfigError([f"{path}: {_describe_ray_error(e)}"]) from None
    finally:
        util_logger.setLevel(level)


def cluster_token_file(config: dict, path: str | os.PathLike) -> str:
    """The laptop's file that ``config`` (read from ``path``) carries to every node as its
    token: the local side of ``file_mounts[NODE_TOKEN]``, ``~`` expanded."""
    local = (config.get("file_mounts") or {}).get(NODE_TOKEN)
    if not isinstance(local, str) or not local:
        raise ConfigError(
            [
                f"{os.fspath(path)}: file_mounts: no {NODE_TOKEN!r} entry; add "
                f'"{NODE_TOKEN}": "~/.ray/clusters/<cluster_name>.token" so that every '
                "node gets the cluster's token"
            ]
        )
    return os.path.expanduser(local)


def ensure_cluster_token(path: str | os.PathLike) -> bool:
    """Make the cluster token file ``path`` unless it exists: 256 random bits in hex (the
    form of Ray's own ``ray get-auth-token --generate``), readable by its owner only (0600,
    in a folder made 0700). An existing token is kept, as the nodes of a running cluster hold
    it; its mode is narrowed to 0600. Returns whether a token was made."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    try:
        # O_EXCL: two launchers racing on one laptop still end with a single token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return True


@dataclass(frozen=True)
class GPUOffer:
    """The GPUs a sweep's trials are planned for."""

    gpu: GPU | None
    """The GPU model (None: no GPU anywhere, trials run on CPUs)."""
    max_gpus_per_node: int
    """Most GPUs one node has or can have: the widest data-parallel trial (0: unknown)."""
    source: str
    """Where this was read: ``declared``, a config path, ``autoscaler``, ``nodes``, ``none``."""


def node_types_offer(config: dict, source: str) -> GPUOffer | None:
    """GPUs of a cluster config's node types (min 0 counts: the autoscaler can launch
    them). The GPU is the one named in the GPU node types' names (``a10g-24gb-x1``), the
    smallest of them when several; a GPU type whose name names none is planned as
    ``gpus.DEFAULT_GPU``."""
    gpu_types = {
        name: int((spec or {}).get("resources", {}).get("GPU", 0))
        for name, spec in (config.get("available_node_types") or {}).items()
    }
    gpu_types = {name: n for name, n in gpu_types.items() if n > 0}
    if not gpu_types:
        return None
    named = [gpu_in_name(name) or GPUS[DEFAULT_GPU] for name in gpu_types]
    return GPUOffer(min(named, key=lambda g: g.memory_mib), max(gpu_types.values()), source)


def running_nodes_offer() -> GPUOffer | None:
    """GPUs of the nodes up now; the model from Ray's ``accelerator_type:X`` resource."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) > 0]
    if not nodes:
        return None
    types = [
        k.split(":", 1)[1]
        for n in nodes
        for k in n["Resources"]
        if k.startswith("accelerator_type:")
    ]
    known = [g for t in types for g in GPUS.values() if t.lower() in g.model.lower()]
    gpu = min(known, key=lambda g: g.memory_mib) if known else GPUS[DEFAULT_GPU]
    return GPUOffer(gpu, int(max(n["Resources"]["GPU"] for n in nodes)), "nodes")


def autoscaler_offer() -> GPUOffer | None:
    """GPUs of the node groups the autoscaler reported to Ray's GCS (autoscaler v2, KubeRay)."""
    from ray._private.state import state

    config = state.get_cluster_config()
    if config is None:
        return None
    node_types = {
        group.name: {"resources": dict(group.resources)}
        for group in config.node_group_configs
        if group.max_count != 0
    }
    return node_types_offer({"available_node_types": node_types}, "autoscaler")


def config_file_offer(cluster_config: str = "") -> GPUOffer | None:
    """GPUs of the node types in ``cluster_config`` (default: ``BOOTSTRAP_CONFIG`` when
    present); None without a file or without GPU node types."""
    path = os.path.expanduser(cluster_config or BOOTSTRAP_CONFIG)
    if not cluster_config and not os.path.exists(path):
        return None
    return node_types_offer(load_cluster_config(path), path)


def gpu_offer(cluster_config: str = "") -> GPUOffer:
    """What GPUs the connected Ray cluster has or can launch: the node types of the cluster
    config (``config_file_offer``), else the autoscaler's node groups in the GCS, else the
    GPUs of the running nodes; none of these: no GPU."""
    return (
        config_file_offer(cluster_config)
        or autoscaler_offer()
        or running_nodes_offer()
        or GPUOffer(None, 0, "none")
    )


def planned_offer(
    cpu_only: bool, declared: GPU | None, cluster_config: str, connected: bool
) -> GPUOffer:
    """What GPUs a sweep's trials are planned for: none when ``cpu_only``
    (``--gpus-per-trial 0``); a ``declared`` GPU (``--gpu``, ``--gpu-memory``) is taken as
    said, with the widest node of ``cluster_config`` if one is found; else what the
    ``connected`` cluster has or can launch (``gpu_offer``), or, without a cluster,
    ``gpus.DEFAULT_GPU``. A connected cluster tells the widest node no config said
    (``with_node_width``)."""
    if cpu_only:
        return GPUOffer(None, 0, "--gpus-per-trial 0")
    if declared is not None:
        found = config_file_offer(cluster_config)
        offer = GPUOffer(declared, found.max_gpus_per_node if found else 0, "declared")
    elif connected:
        offer = gpu_offer(cluster_config)
    else:
        offer = GPUOffer(GPUS[DEFAULT_GPU], 0, "default")
    return with_node_width(offer) if connected else offer


def with_node_width(offer: GPUOffer) -> GPUOffer:
    """A declared GPU's offer with the widest node of the connected cluster (its
    autoscaler's node groups, else its running nodes) where no cluster config said it, so
    that ``planner.plan_problem`` can refuse what no node holds; unchanged when nothing says."""
    if offer.gpu is None or offer.max_gpus_per_node:
        return offer
    found = autoscaler_offer() or running_nodes_offer()
    if found is None:
        return offer
    return replace(offer, max_gpus_per_node=found.max_gpus_per_node, source=found.source)


def _precheck(config: dict) -> list[str]:
    """Mistakes Ray's own preparation would silently paper over or report confusingly."""
    problems = []
    provider = config.get("provider")
    provider_type = provider.get("type") if isinstance(provider, dict) else None
    if provider_type == "local":
        # prepare_config() aborts (click exception) on these for on-premise clusters.
        for key in ("available_node_types", "head_node_type", "head_node", "worker_nodes"):
            if key in config:
                problems.append(
                    f"{key}: not supported for provider type 'local' "
                    "(Ray detects each machine's resources; list machines in provider.worker_ips)"
                )
    elif provider_type is not None:
        node_types = config.get("available_node_types")
        if "head_node_type" not in config:
            # Otherwise the provider defaults' head type (e.g. 'ray.head.default') is filled in.
            problems.append(
                "head_node_type: missing; name the entry of available_node_types "
                "that runs the Ray head"
            )
        elif isinstance(node_types, dict) and config["head_node_type"] not in node_types:
            problems.append(
                f"head_node_type: {config['head_node_type']!r} is not one of "
                f"available_node_types ({', '.join(map(str, node_types)) or 'none defined'})"
            )
        if node_types is None:
            problems.append("available_node_types: missing; define the head and worker types")
    return problems


def _schema_problems(config: dict) -> list[str]:
    """Every violation of Ray's cluster YAML schema, with the path of the offending key."""
    import jsonschema
    import ray.autoscaler

    schema_path = os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    validator_cls = jsonschema.validators.validator_for(schema)
    errors = sorted(
        validator_cls(schema).iter_errors(config), key=lambda e: [str(p) for p in e.path]
    )
    problems = []
    for error in errors:
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            problems += [
                _unknown_key_problem([*error.absolute_path, key])
                for key in _unknown_keys(error.instance, error.schema)
            ]
        else:
            problems.append(_describe_schema_error(error))
    return problems


def _unknown_keys(instance: dict, schema: dict) -> list[str]:
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [
        key
        for key in instance
        if key not in known and not any(re.search(p, str(key)) for p in patterns)
    ]


def _unknown_key_problem(parts: list) -> str:
    where = _key_path(parts)
    if parts == ["min_workers"]:
        return (
            f"{where}: unknown top-level key; Ray's launcher drops a top-level min_workers, "
            "set min_workers on each entry of available_node_types instead"
        )
    scope = "top-level key" if len(parts) == 1 else "key"
    return f"{where}: unknown {scope} (not in Ray's cluster config schema)"


def _key_path(parts) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(str(part))}]"
    return out or "(top level)"


def _describe_schema_error(error: Any) -> str:
    where = _key_path(error.absolute_path)
    message = error.message
    parts = list(error.absolute_path)
    if (
        error.validator == "type"
        and len(parts) >= 3
        and parts[0] == "available_node_types"
        and parts[-2] == "resources"
    ):
        message += " (Ray's launcher accepts only whole-number resources; no fractions)"
    return f"{where}: {message}"


def _describe_ray_error(error: BaseException) -> str:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema ships with ray[default]
        jsonschema = None
    if jsonschema is not None and isinstance(error, jsonschema.ValidationError):
        return _describe_schema_error(error)
    text = str(error).strip() or type(error).__name__
    return f"rejected by Ray's cluster launcher: {text}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scale_fpt.cluster",
        description="make a cluster's Ray token once, before its first `ray up`",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    token = commands.add_parser(
        "token", help="make the token file CONFIG's file_mounts carry to every node"
    )
    token.add_argument("config", help="the cluster config, e.g. cluster/gpu.yaml")
    args = parser.parse_args(argv)
    try:
        path = cluster_token_file(load_cluster_config(args.config), args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    made = ensure_cluster_token(path)
    print(f"{'made' if made else 'kept'} the cluster token {path} (mode 0600)")
    print(f"for `ray job submit` from here: export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
