"""Packages whose public names load their modules on first use (PEP 562), so that importing
one light module of the package does not import the heavy ones beside it (start-up time)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``package.NAME`` imports the module of the
    package that ``exports`` names for NAME, and returns its NAME."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
