"""Recipes: the studies this project runs and their presets (``studies.py``), with the
paper's settings they share (``paper.py``).

Recipes use the library; the library never imports them. Only the command line's entry
point (``scale_fpt.cli``) and the scripts in ``sweeps/`` do, so a change of a preset never
touches the code that trains, places or records a trial. The package ships inside
``scale_fpt`` because ``scale-fpt sweep STUDY`` runs from an installed package, where
``sweeps/`` is not.

This module itself names the studies without importing them: listing them
(``scale-fpt --help``, ``scale-fpt sweep --help``) loads neither torch nor Ray.
"""

from __future__ import annotations

STUDY_NAMES = ("scale", "finetune", "lr-search", "families", "ladder")
"""``scale-fpt sweep STUDY``: the studies by name (``sweeps/<name>.py`` with ``_`` for ``-``);
the same keys as ``studies.STUDIES``."""


def load_study(name: str):
    """The ``studies.Study`` called ``name`` (one of ``STUDY_NAMES``): imports the presets,
    and with them the sweep stack."""
    # Imported here, not at the top: the presets load the sweep stack (start-up time).
    from scale_fpt.recipes.studies import STUDIES

    return STUDIES[name]
