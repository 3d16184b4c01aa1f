"""Numerical precision: ukjax never changes JAX's global configuration on import.

Accuracy work on constrained dynamics needs float64 (constraint residuals of 1e-10 lie below float32
round-off), and JAX computes in float32 unless ``jax_enable_x64`` is on. ukjax leaves that choice to the
program that imports it:

* in a script, call :func:`enable_float64` (or ``jax.config.update("jax_enable_x64", True)``) once, before
  creating arrays;
* the ``ukjax`` command does it for you (``ukjax --float32 ...`` keeps float32 for throughput runs).

Every entry point integrates in the dtype of the state it is given and says so (``Solution.q.dtype``; the
command line prints it). :func:`simulate <ukjax.simulation.simulate>` warns once when float64 was not
enabled, since a float64 NumPy array then becomes float32 silently.
"""

import jax


def enable_float64() -> None:
    """Turn on JAX's float64 mode (``jax_enable_x64``) for this process: one line, explicit, opt-in."""
    jax.config.update("jax_enable_x64", True)


def float64_enabled() -> bool:
    """Whether JAX computes in float64 by default in this process."""
    return bool(jax.config.jax_enable_x64)
