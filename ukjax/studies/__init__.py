"""Registry of the studies that ``ukjax run NAME`` runs and ``experiments/NAME.py`` wraps.

A study module offers ``DESCRIPTION`` (one line), ``add_arguments(parser)`` (its options, with the paper's
values as defaults) and ``run(args) -> dict`` (writes figures and ``metrics.json`` into ``args.out`` and
returns the metrics).
"""

from __future__ import annotations

import importlib

# name -> module path; each study adds its own line.
STUDIES: dict[str, str] = {
    "flexible_joint": "ukjax.studies.flexible_joint",
    "swarm": "ukjax.studies.swarm",
    "two_mass_spring": "ukjax.studies.two_mass_spring",
    "coordinated_robots": "ukjax.studies.coordinated_robots",
    "scara": "ukjax.studies.scara",
    "spiral": "ukjax.studies.spiral",
    "five_bar": "ukjax.studies.five_bar",
    "three_rrr": "ukjax.studies.three_rrr",
}


def load(name: str):
    """The study module registered under ``name``."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; known studies: {', '.join(sorted(STUDIES)) or 'none'}")
    return importlib.import_module(STUDIES[name])
