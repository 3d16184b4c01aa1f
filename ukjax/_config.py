"""Numerical defaults of ukjax.

ukjax turns on JAX's float64 mode when it is imported, because accuracy studies of constrained dynamics
need it (constraint residuals of 1e-10 are below float32 round-off). Set the environment variable
``UKJAX_FLOAT32=1`` before importing ukjax to keep JAX's float32 default, e.g. for throughput runs on a GPU;
the error that costs is measured by the benchmarks, not assumed.
"""

import os

import jax


def enable_float64_unless_opted_out() -> None:
    if os.environ.get("UKJAX_FLOAT32", "0") not in ("1", "true", "True"):
        jax.config.update("jax_enable_x64", True)
