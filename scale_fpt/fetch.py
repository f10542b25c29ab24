"""``scale-fpt fetch``: put a sweep's data and weights where the preflight looks.

It takes the sweep's own arguments (``scale-fpt fetch scale --preset paper --data-root DIR``
fetches what ``scale-fpt sweep scale --preset paper --data-root DIR`` reads), or a list of
``--tasks`` and ``--models``. Data goes to ``DATA_ROOT/<folder>`` (``preflight.DATA_FOLDERS``)
in the layout the task loaders read, from the publishers' files (``SOURCES``); weights go to
the Hugging Face cache (``snapshot_download``: ``HF_HOME`` / ``HF_HUB_CACHE``), where
``from_pretrained`` and the preflight look. What the preflight already finds is skipped, so
a second run fetches nothing.

``--mirror URL`` (or ``SCALE_FPT_MIRROR``) reads each data file from ``URL/<folder>/<file
name>`` instead of its publisher (a local directory works too): for machines behind a mirror
or with the archives copied onto a disk. Weights follow ``HF_ENDPOINT`` (the hub's own mirror
setting).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from scale_fpt.config import ConfigError, parse_trial
from scale_fpt.preflight import DATA_FOLDERS, data_problem, weights_needed
from scale_fpt.study import split

MIRROR_ENV = "SCALE_FPT_MIRROR"

HF_DATASETS = "https://huggingface.co/datasets"


@dataclass(frozen=True)
class Source:
    """One published file of a dataset."""

    url: str
    """Where the publisher serves it."""
    keep: tuple[str, ...] = ()
    """For an archive (a tar file, compressed or not): the member paths kept, by their
    trailing components (``listops-1000/basic_train.tsv``), each written to the data folder
    under its file name; the rest is never written. Empty: the file is kept as it is."""
    size: str = ""
    """Its size as the publisher states it, for the message before a long download."""

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


SOURCES: dict[str, tuple[Source, ...]] = {
    "listops": (
        Source(
            "https://storage.googleapis.com/long-range-arena/lra_release.gz",
            keep=tuple(f"listops-1000/basic_{s}.tsv" for s in ("train", "val", "test")),
            size="7.7 GB, of which ListOps is read",
        ),
    ),
    "homology": (
        Source(
            "http://s3.amazonaws.com/songlabdata/proteindata/data_raw_pytorch/remote_homology.tar.gz",
            keep=tuple(
                f"remote_homology_{s}.json" for s in ("train", "valid", "test_fold_holdout")
            ),
        ),
    ),
    "mnist": tuple(
        Source(f"{HF_DATASETS}/ylecun/mnist/resolve/main/mnist/{s}-00000-of-00001.parquet")
        for s in ("train", "test")
    ),
    "cifar10": tuple(
        Source(f"{HF_DATASETS}/uoft-cs/cifar10/resolve/main/plain_text/{s}-00000-of-00001.parquet")
        for s in ("train", "test")
    ),
}
"""The published files of each data folder (``preflight.DATA_FOLDERS``): LRA's release
(ListOps), TAPE's JSON release (remote homology), and the Parquet files of the Hugging Face
datasets the image loaders read (``tasks.images.HUB_IDS``). LRA and TAPE publish no
checksums; the hub's files are checked against the SHA-256 the hub states for them."""

WEIGHT_FILES = ("*.json", "*.safetensors")
"""What ``from_pretrained`` reads of a hub model (config and safetensors weights); the other
formats a repository holds (TensorFlow, Flax, ONNX) are not downloaded."""

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fetch's own flags, on a parser that has the sweep's (``scale_fpt.cli``), whose flags
    that change nothing fetch reads it hides."""
    parser.add_argument(
        "--mirror",
        default="",
        metavar="URL|DIR",
        help=f"read each data file from URL/<folder>/<file name> (or a local directory so laid "
        f"out) instead of its publisher (default: ${MIRROR_ENV})",
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
        arms = [{"task": task} for task in split(args.tasks) if task in DATA_FOLDERS] + [
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
        folder, own = DATA_FOLDERS.get(config.task.task), config.task.data_dir
        if folder and (not own or Path(own) == root / folder):  # not a data_dir of its own
            folders.add(folder)
        source, config_only = weights_needed(config)
        if source and not Path(source).expanduser().exists():
            weights.add((source, config.model.revision, config_only))
    # Where a model needs its weights, its config alone is not a separate download.
    full = {(s, r) for s, r, only in weights if not only}
    weights = {(s, r, only) for s, r, only in weights if not (only and (s, r) in full)}
    return sorted(folders), sorted(weights)


def mirror_url(mirror: str, folder: str, source: Source) -> str:
    if not mirror:
        return source.url
    base = mirror if "://" in mirror else Path(mirror).absolute().as_uri()
    return f"{base.rstrip('/')}/{folder}/{source.name}"


def data_problem_in(folder: str, path: Path) -> str:
    """Why the task of ``folder`` cannot read its data in ``path`` ('' when it can: the
    preflight's check)."""

    task = next(t for t, f in DATA_FOLDERS.items() if f == folder)
    return data_problem(parse_trial({"task": task, "data_dir": str(path)}))


class HubChecksum(urllib.request.HTTPRedirectHandler):
    """Keeps the SHA-256 the Hugging Face hub states for a file (``X-Linked-Etag``), which it
    sends with the redirect to its storage and not with the file itself."""

    def __init__(self):
        self.sha256 = ""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.sha256 = stated_sha256(headers) or self.sha256
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def stated_sha256(headers) -> str:
    for key in ("X-Linked-Etag", "ETag"):
        value = (headers.get(key) or "").strip('"').removeprefix("W/").strip('"')
        if SHA256.match(value):
            return value
    return ""


def open_url(url: str):
    """(The response, a callable giving the SHA-256 its publisher stated, or '')."""
    checksum = HubChecksum()
    response = urllib.request.build_opener(checksum).open(url, timeout=60)
    return response, lambda: stated_sha256(response.headers) or checksum.sha256


def fetch_file(url: str, target: Path) -> None:
    """``url`` to ``target`` through ``target.part``, checked against a stated SHA-256."""
    response, sha256 = open_url(url)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    with response, open(part, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if sha256() and digest.hexdigest() != sha256():
        part.unlink()
        raise OSError(
            f"{url}: SHA-256 {digest.hexdigest()} differs from the stated {sha256()} (a "
            "corrupt or truncated download); run fetch again"
        )
    part.replace(target)


def fetch_archive(url: str, keep: tuple[str, ...], folder: Path) -> None:
    """The members of the tar archive at ``url`` that ``keep`` names, into ``folder``; read as
    a stream, so the archive itself is never stored (LRA's is 7.7 GB)."""
    wanted = {path: path.rsplit("/", 1)[-1] for path in keep}
    response, _ = open_url(url)
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


def fetch_data(folder: str, data_root: Path, mirror: str, say) -> str:
    """Fetch one data folder; '' or the problem."""
    path = data_root / folder
    if path.is_dir() and not data_problem_in(folder, path):
        say(f"{folder}: already in {path}")
        return ""
    path.mkdir(parents=True, exist_ok=True)
    try:
        for source in SOURCES[folder]:
            url = mirror_url(mirror, folder, source)
            size = f" ({source.size})" if source.size else ""
            say(f"{folder}: downloading {url}{size}")
            if source.keep:
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
    from huggingface_hub import constants, snapshot_download, try_to_load_from_cache

    from scale_fpt.models.backbones import hub_reachable  # torch: not for --help

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
        return f"{what}: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return ""


def main(args: argparse.Namespace, sweep, data_root: str) -> int:
    """Fetch everything ``needs`` names into ``data_root`` (``--data-root``) and the Hugging
    Face cache; 0 when all is in place, 1 when something could not be fetched."""
    import os

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
    problems = [fetch_data(f, Path(data_root).absolute(), mirror, say) for f in folders]
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
