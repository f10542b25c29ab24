"""Command-line flags generated from config dataclasses, and the YAML files beside them.

One mechanism for the trial flags (``TaskConfig``, ``ModelConfig``, ``TrainConfig``:
``scale-fpt train`` / ``plan``) and the sweep flags (``SweepConfig``: ``scale-fpt sweep``,
``sweeps/*.py``): a flag per field, named as the field (``--batch-size`` and
``--batch_size`` for ``batch_size``), its help the docstring written under the field
(read by ``docstring_parser``), its value the text as given. Values are typed and checked
by the config layer (``TrialConfig.from_flat``, ``SweepConfig.problems``), which names every
problem in one message: a parser that types values as it reads them (argparse's ``type``,
jsonargparse) stops at the first bad one.

``--config FILE`` reads a YAML mapping of the same fields (``load_mapping``); flags given
beside it win.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import docstring_parser
import yaml

from scale_fpt.config import ConfigError, flag


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls``, on one line each."""
    return {
        p.arg_name: " ".join((p.description or "").split())
        for p in docstring_parser.parse_from_object(cls).params
    }


METAVARS = {tuple[int, ...]: "N,N,...", tuple[str, ...]: "NAME,NAME,...", int | str: "K|auto"}
"""How a flag's value is written, for the types whose name does not say it; comma lists for
tuples."""


def add_field_flags(
    group: argparse._ActionsContainer,
    cls: type,
    kinds: dict[str, type],
    aliases: dict[str, list[str]],
    default_text,
) -> None:
    """A flag for each field of ``kinds`` (fields of ``cls`` and their types):
    ``--field-name`` and ``--field_name`` (and ``aliases``), storing the given text under the
    field's name (None when not given; a bool flag alone means true). ``default_text(name)``
    ends each help line."""
    docs = field_docs(cls)
    for name, kind in kinds.items():
        spellings = dict.fromkeys([flag(name), f"--{name}", *aliases.get(name, [])])
        group.add_argument(
            *spellings,
            dest=name,
            default=None,
            nargs="?" if kind is bool else None,
            const="true" if kind is bool else None,
            metavar=METAVARS.get(kind, getattr(kind, "__name__", "").upper()),
            # argparse formats % in help text
            help=f"{docs.get(name, '')} (default: {default_text(name)})".replace("%", "%%"),
        )


def load_mapping(path: str, what: str, fields: str) -> dict:
    """The mapping of a YAML file; ConfigError naming the file for an unreadable file, bad
    YAML or a document that is not a mapping (``what``: the kind of file; ``fields``: what it
    maps)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError([f"{path}: cannot read {what} ({e.strerror})"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            [f"{path}:{where} YAML syntax error: {getattr(e, 'problem', e)}"]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: a {what} is a mapping of {fields}"])
    return data
