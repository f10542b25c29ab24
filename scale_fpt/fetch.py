"""``scale-fpt fetch``: put a sweep's data and weights where the preflight looks.

It takes the sweep's own arguments (``scale-fpt fetch scale --preset paper --data-root DIR``
fetches what ``scale-fpt sweep scale --preset paper --data-root DIR`` reads), or a list of
``--tasks`` and ``--models``. Data goes to ``DATA_ROOT/<folder>`` in the layout the task
loaders read, from the published files each task's registry entry names
(``task_registry``); weights go to the Hugging Face cache (``snapshot_download``:
``HF_HOME`` / ``HF_HUB_CACHE``), where ``from_pretrained`` and the preflight look. What the
preflight already finds is skipped, so a second run fetches nothing.

Files of the Hugging Face hub (datasets and weights) come through ``huggingface_hub``, so
they follow ``HF_ENDPOINT`` (the hub's own mirror setting); a dataset file is checked against
the SHA-256 the hub states for it. ``--mirror URL`` (or ``SCALE_FPT_MIRROR``) reads each
other publisher's file (LRA, TAPE) from ``URL/<folder>/<file name>`` instead (a local
directory works too): for machines behind a mirror or with the archives copied onto a disk.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

from huggingface_hub import constants

from scale_fpt.config import ConfigError, parse_trial
from scale_fpt.hub import hub_reachable
from scale_fpt.preflight import data_problem, weights_needed
from scale_fpt.study import split
from scale_fpt.task_registry import TASKS, DataFolder, Source, data_folder, data_folders

MIRROR_ENV = "SCALE_FPT_MIRROR"

WEIGHT_FILES = ("*.json", "*.safetensors")
"""What ``from_pretrained`` reads of a hub model (config and safetensors weights); the other
formats a repository holds (TensorFlow, Flax, ONNX) are not downloaded."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fetch's own flags, on a parser that has the sweep's (``scale_fpt.cli``), whose flags
    that change nothing fetch reads it hides."""
    parser.add_argument(
        "--mirror",
        default="",
        metavar="URL|DIR",
        help=f"read each data file not on the Hugging Face hub from URL/<folder>/<file name> "
        f"(or a local directory so laid out) instead of its publisher (default: ${MIRROR_ENV}; "
        "the hub's files follow HF_ENDPOINT)",
    )
    for action in parser._actions:  # accepted (a sweep's command line works), not shown
        if action.dest in NOT_READ:
            action.help = argparse.SUPPRESS


NOT_READ = {
    *("plan", "resume", "name", "results_dir", "storage_path", "optuna_storage", "loggers"),
    *("max_concurrent", "max_failures", "search_trials", "asha", "pack", "gpus_per_trial"),
    *("metric", "asha_grace_evals", "cpus_per_trial", "reuse_actors"),
    *("gpu", "gpu_memory_gb", "cluster_config", "seeds", "confirm_seeds", "steps"),
}
"""Sweep flags that change nothing a sweep reads: fetch takes them and ignores them."""


def needs(
    args: argparse.Namespace, sweep, data_root: str
) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """(The data folders, the (hub id, revision, config only) weights) that ``sweep`` (the
    one ``scale-fpt sweep`` would run with these arguments), else the arguments' ``--tasks``
    and ``--models``, read."""
    if sweep is not None:
        arms = sweep.trials()
    else:
        arms = [{"task": task} for task in split(args.tasks) if data_folder(task)] + [
            {"model": model, "init": init}
            for model in split(args.models)
            for init in split(args.inits) or ["pretrained"]
        ]
        if not arms:
            raise ConfigError(["fetch: name a study or a YAML sweep file, or --tasks / --models"])
    folders, weights = set(), set()
    root = Path(data_root).absolute()
    for arm in arms:
        config = parse_trial(arm)
        folder, own = data_folder(config.task.task), config.task.data_dir
        if folder and (not own or Path(own) == root / folder):  # not a data_dir of its own
            folders.add(folder)
        source, config_only = weights_needed(config)
        if source and not Path(source).expanduser().exists():
            weights.add((source, config.model.revision, config_only))
    # Where a model needs its weights, its config alone is not a separate download.
    full = {(s, r) for s, r, only in weights if not only}
    weights = {(s, r, only) for s, r, only in weights if not (only and (s, r) in full)}
    return sorted(folders), sorted(weights)


def source_url(mirror: str, folder: str, source: Source) -> str:
    if source.hub[0]:
        return hub_url(*source.hub)
    if not mirror:
        return source.url
    base = mirror if "://" in mirror else Path(mirror).absolute().as_uri()
    return f"{base.rstrip('/')}/{folder}/{source.name}"


def data_problem_in(folder: str, path: Path) -> str:
    """Why the tasks of ``folder`` cannot read their data in ``path`` ('' when they can: the
    preflight's check)."""
    task = next(name for name in TASKS if data_folder(name) == folder)
    return data_problem(parse_trial({"task": task, "data_dir": str(path)}))


def fetch_file(url: str, target: Path) -> None:
    """``url`` to ``target`` through ``target.part``: a complete file or none."""
    part = target.with_name(target.name + ".part")
    with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    part.replace(target)


def fetch_hub_file(repo: str, path: str, folder: Path) -> None:
    """One file of a hub dataset into ``folder`` under its file name, through the hub's
    client, checked against the SHA-256 the hub states for it (a large file's ETag)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download  # HUB_CLIENT

    url = hub_url(repo, path)
    staging = folder / ".fetching"
    try:
        stated = get_hf_file_metadata(url).etag or ""
        got = Path(hf_hub_download(repo, path, repo_type="dataset", local_dir=staging))
    except Exception as e:  # the hub client's errors (HTTP, offline, network): one line
        raise OSError(f"{url}: {type(e).__name__}: {one_line(e)}") from e
    try:
        with open(got, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if len(stated) == 64 and digest != stated:
            raise OSError(
                f"{url}: SHA-256 {digest} differs from the stated {stated} (a corrupt or "
                "truncated download); run fetch again"
            )
        got.replace(folder / got.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


HUB_CLIENT = "the hub's download client (httpx) takes a quarter second to import: not for --help"


def hub_url(repo: str, path: str) -> str:
    """The URL of a hub dataset's file, at ``HF_ENDPOINT``."""
    from huggingface_hub import hf_hub_url  # HUB_CLIENT

    return hf_hub_url(repo, path, repo_type="dataset")


def one_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def fetch_archive(url: str, keep: tuple[str, ...], folder: Path) -> None:
    """The members of the tar archive at ``url`` that ``keep`` names, into ``folder``; read as
    a stream, so the archive itself is never stored (LRA's is 7.7 GB)."""
    wanted = {path: path.rsplit("/", 1)[-1] for path in keep}
    response = urllib.request.urlopen(url, timeout=60)
    staging = folder / ".fetching"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        found = set()
        with response, tarfile.open(fileobj=response, mode="r|*") as archive:
            for member in archive:
                name = "/" + member.name.lstrip("./")
                match = next((p for p in wanted if name.endswith("/" + p)), None)
                if match is None or not member.isfile() or match in found:
                    continue
                with (
                    archive.extractfile(member) as data,
                    open(staging / wanted[match], "wb") as out,
                ):
                    shutil.copyfileobj(data, out, 1 << 20)
                found.add(match)
        missing = sorted(set(wanted) - found)
        if missing:
            raise OSError(f"{url}: the archive holds no {', '.join(missing)}")
        for path in staging.iterdir():  # only complete files reach the folder the tasks read
            path.replace(folder / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_data(data: DataFolder, data_root: Path, mirror: str, say) -> str:
    """Fetch one data folder; '' or the problem."""
    folder = data.name
    path = data_root / folder
    if path.is_dir() and not data_problem_in(folder, path):
        say(f"{folder}: already in {path}")
        return ""
    path.mkdir(parents=True, exist_ok=True)
    try:
        for source in data.sources:
            url = source_url(mirror, folder, source)
            size = f" ({source.size})" if source.size else ""
            say(f"{folder}: downloading {url}{size}")
            if source.hub[0]:
                fetch_hub_file(*source.hub, path)
            elif source.keep:
                fetch_archive(url, source.keep, path)
            else:
                fetch_file(url, path / source.name)
    except (OSError, tarfile.TarError) as e:  # URLError and HTTPError are OSErrors
        if not any(path.iterdir()):  # an empty folder would stand for the task's data
            path.rmdir()
        return f"{folder}: {getattr(e, 'reason', None) or e}; run fetch again (complete files are kept)"
    problem = data_problem_in(folder, path)
    if problem:
        return problem
    say(f"{folder}: in {path}")
    return ""


def fetch_weights(source: str, revision: str, config_only: bool, say) -> str:
    """Fetch one hub model into the Hugging Face cache; '' or the problem."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache  # HUB_CLIENT

    patterns = ["config.json"] if config_only else list(WEIGHT_FILES)
    what = f"{source}{'@' + revision if revision else ''}{' (config)' if config_only else ''}"
    cached = try_to_load_from_cache(source, "config.json", revision=revision or None)
    if isinstance(cached, str) and (config_only or any(Path(cached).parent.glob("*.safetensors"))):
        say(f"{what}: already in the Hugging Face cache ({constants.HF_HUB_CACHE})")
        return ""
    if not hub_reachable():
        return (
            f"{what}: the Hugging Face hub cannot be reached (no network, or HF_HUB_OFFLINE is "
            f"set) and it is not in the cache {constants.HF_HUB_CACHE}; run scale-fpt fetch "
            "where the hub answers, with HF_HOME on storage this machine shares"
        )
    say(f"{what}: downloading into {constants.HF_HUB_CACHE}")
    try:
        where = snapshot_download(source, revision=revision or None, allow_patterns=patterns)
        if not config_only and not any(Path(where).glob("*.safetensors")):
            # An older repository without safetensors: its PyTorch weights.
            snapshot_download(
                source, revision=revision or None, allow_patterns=["pytorch_model*.bin"]
            )
    except Exception as e:  # hub errors (missing repo, gated, network): one line each
        return f"{what}: {type(e).__name__}: {one_line(e)}"
    return ""


def main(args: argparse.Namespace, sweep, data_root: str) -> int:
    """Fetch everything ``needs`` names into ``data_root`` (``--data-root``) and the Hugging
    Face cache; 0 when all is in place, 1 when something could not be fetched."""
    folders, weights = needs(args, sweep, data_root)
    if folders and not data_root:
        raise ConfigError(
            [
                f"fetch: {', '.join(folders)} need(s) --data-root DIR (or SCALE_FPT_DATA): "
                "the data goes to DIR/<folder>; pass the same --data-root to scale-fpt sweep"
            ]
        )

    def say(line: str) -> None:
        print(f"[scale-fpt] fetch {line}", flush=True)

    mirror = args.mirror or os.environ.get(MIRROR_ENV, "")
    known = data_folders()
    problems = [fetch_data(known[f], Path(data_root).absolute(), mirror, say) for f in folders]
    problems += [fetch_weights(*w, say) for w in weights]
    problems = [p for p in problems if p]
    for problem in problems:
        print(f"scale-fpt: fetch failed: {problem}", file=sys.stderr)
    if not folders and not weights:
        say("nothing to fetch: every task of this sweep generates its data, every model is local")
    elif not problems:
        root = f" --data-root {data_root}" if folders else ""
        say(f"done; check with: scale-fpt sweep ... --plan{root}")
    return 1 if problems else 0
