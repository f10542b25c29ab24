"""Checkpoint files read without running code: every file a results folder holds is read
with torch's weights-only loader, because results folders travel between people and machines
and unpickling an arbitrary object can run code (``docs/security.md``)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from scale_fpt.results import ResultsError


class UnsafeCheckpointError(ResultsError):
    """A checkpoint file that holds more than tensors and plain data: it is not read. (A
    ResultsError: a trial resumed from it fails once instead of retrying, and the command
    line says it in one line, exit code 2.)"""


UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


def load_checkpoint_file(path: str | Path, allowed: Sequence[type] = ()) -> Any:
    """A checkpoint file read with torch's weights-only loader (tensors on the CPU, plain
    data, and instances of the ``allowed`` classes, which must be plain records whose
    construction runs no code of the file's choosing); a file holding any other pickled
    object raises ``UnsafeCheckpointError`` naming the file and the object, and nothing of
    it runs; bytes that are no pickle at all raise ValueError (a damaged file)."""
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = UNSAFE_GLOBAL.search(str(e))
        if found is None:  # bytes the loader cannot parse, nothing it refused: damaged
            raise ValueError(f"cannot read {path}: not a torch checkpoint (damaged?)") from None
        raise UnsafeCheckpointError(
            [
                f"refused to load {path}: it holds a pickled {found.group(1)}, not only "
                "tensors and plain data (unpickling it could run code)"
            ]
        ) from None


def weights_file(trial_id: str) -> str:
    """The file of one member's trained weights in a checkpoint directory."""
    return f"weights-{trial_id}.pt"
