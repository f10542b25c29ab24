"""Checkpoint files read without running code: every file a results folder holds is read
with torch's weights-only loader, because results folders travel between people and machines
and unpickling an arbitrary object can run code (``docs/security.md``)."""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from scale_fpt.confined import ResultsError, printable


class UnsafeCheckpointError(ResultsError):
    """A checkpoint file that holds more than tensors and plain data: it is not read. (A
    ResultsError: a trial resumed from it fails once instead of retrying, and the command
    line says it in one line, exit code 2.)"""


class DamagedCheckpointError(ResultsError):
    """A checkpoint file that is no torch checkpoint of the expected contents (empty,
    truncated, text, another program's file): named in one line, never retried (its bytes
    stay what they are), exit code 2 on the command line."""


REFUSED_GLOBAL = re.compile(
    r"GLOBAL (\S+) was not an allowed global|unsupported GLOBAL (\S+) whose module"
)
"""torch's weights-only loader naming the object it refused: a global outside its allow-list,
or one of a module it blocks outright (``os``, ``posix``, ``subprocess``, ...)."""


def load_checkpoint_file(path: str | Path, allowed: Sequence[type] = ()) -> Any:
    """A checkpoint file read with torch's weights-only loader (tensors on the CPU, plain
    data, and instances of the ``allowed`` classes, which must be plain records whose
    construction runs no code of the file's choosing). A pickle the loader will not read
    (another object, a blocked module, an instruction it does not run) raises
    ``UnsafeCheckpointError`` naming the file and the object, and nothing of it runs; any
    other unreadable file (empty, truncated, text, a link to another file) raises
    ``DamagedCheckpointError`` naming it."""
    shown = printable(str(path))
    try:
        with torch.serialization.safe_globals(list(allowed)), warnings.catch_warnings():
            # A foreign pickle's protocol is the file's choice, not a problem of the reader.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = REFUSED_GLOBAL.search(str(e))
        if not found and not (
            "Weights only load failed" in str(e) and is_pickle(path)
        ):  # bytes no unpickler would parse: damaged, not refused
            raise DamagedCheckpointError(
                [f"cannot read {shown}: not a torch checkpoint (damaged or truncated)"]
            ) from None
        what = (
            f"a pickled {printable(found.group(1) or found.group(2))}"
            if found
            else "pickle instructions the weights-only loader does not run"
        )
        raise UnsafeCheckpointError(
            [
                f"refused to load {shown}: it holds {what}, not only tensors and plain data "
                "(unpickling it could run code)"
            ]
        ) from None
    except FileNotFoundError:
        raise  # missing, not damaged: the caller names what is missing
    except Exception as e:  # every parse failure of foreign bytes is "damaged"
        raise DamagedCheckpointError(
            [
                f"cannot read {shown}: not a torch checkpoint (damaged or truncated: "
                f"{type(e).__name__}: {printable(str(e).splitlines()[0] if str(e) else '')[:120]})"
            ]
        ) from None


def is_pickle(path: str | Path) -> bool:
    """Whether a file starts as a pickle of protocol 2 or later does (its PROTO opcode)."""
    with open(path, "rb") as f:
        return f.read(1) == pickle.PROTO


def load_weights(path: str | Path) -> dict:
    """A member's trained tensors from its ``weights_file`` (``{"module": {name: tensor}}``
    on disk); ``DamagedCheckpointError`` naming the file when it holds anything else."""
    state = load_checkpoint_file(path)
    module = state.get("module") if isinstance(state, dict) else None
    if not isinstance(module, dict) or not all(
        isinstance(t, torch.Tensor) for t in module.values()
    ):
        raise DamagedCheckpointError(
            [f"cannot read {printable(str(path))}: not a weights file (no tensors under 'module')"]
        )
    return module


def weights_file(trial_id: str) -> str:
    """The file of one member's trained weights in a checkpoint directory."""
    return f"weights-{trial_id}.pt"
