"""What every benchmark script records: the machine, the versions, the device, and its results as JSON.

A thin layer over :mod:`ukjax.studies._common` (which the studies use), so that benchmarks and studies
describe the machine the same way; it adds the exact jaxlib version and the device a result was measured on.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jaxlib

from ukjax.studies._common import environment, write_json


def machine_info() -> dict:
    """CPU model, cores, platform, JAX backend and devices, versions (python, jax, jaxlib, numpy, ...)."""
    info = environment()
    info["versions"]["jaxlib"] = jaxlib.__version__
    info["device"] = str(jax.devices()[0])
    return info


def write_results(path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON to ``path``, adding :func:`machine_info` as ``"environment"``."""
    return write_json(path, {**payload, "environment": machine_info()})
