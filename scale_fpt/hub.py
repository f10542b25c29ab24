"""The Hugging Face hub as the code meets it: can it be asked, and what its caches hold."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from huggingface_hub import constants


def hub_reachable() -> bool:
    """Whether the Hugging Face hub may be asked for files: not in offline mode, and its host
    answers (or a proxy is set, which we cannot probe). Without network, ``from_pretrained``
    retries for over a minute before failing; this answers in seconds."""
    flags = (os.environ.get(k, "").lower() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if constants.HF_HUB_OFFLINE or any(f in ("1", "true", "yes", "on") for f in flags):
        return False
    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(k) for k in proxies):
        return True
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError:
        return False
    return True


def hub_dataset_cached(hub_id: str) -> bool:
    """Whether ``datasets.load_dataset(hub_id)`` can run offline: its files in the hub cache
    or its prepared Arrow tables in the datasets cache."""
    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}" / "snapshots"
    datasets_cache = Path(
        os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets")
    ) / hub_id.replace("/", "___")
    return (hub.is_dir() and any(hub.iterdir())) or datasets_cache.is_dir()
