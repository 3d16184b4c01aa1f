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
    "jansen": "ukjax.studies.jansen",
}


# name -> module path of the tuning studies that ``ukjax tune NAME`` runs and experiments/tune_NAME.py wraps
# (same interface; outputs go to ./ukjax-results/tune_NAME by default).
TUNE_STUDIES: dict[str, str] = {
    "scara": "ukjax.studies.tune_scara",
    "servo": "ukjax.studies.tune_servo",
    "flexible_joint": "ukjax.studies.tune_flexible_joint",
    "ur5": "ukjax.studies.tune_ur5",
}


def load_tune(name: str):
    """The tuning-study module registered under ``name``."""
    if name not in TUNE_STUDIES:
        raise KeyError(f"unknown tuning study {name!r}; known: {', '.join(sorted(TUNE_STUDIES))}")
    return importlib.import_module(TUNE_STUDIES[name])


def load(name: str):
    """The study module registered under ``name``."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; known studies: {', '.join(sorted(STUDIES)) or 'none'}")
    return importlib.import_module(STUDIES[name])
