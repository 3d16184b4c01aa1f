"""What every benchmark script records: the machine, the versions, the device, and its results as JSON.

A thin layer over :mod:`ukjax.studies._common` (which the studies use), so that benchmarks and studies
describe the machine the same way; it adds the exact jaxlib version and the device a result was measured on.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import jax
import jaxlib

from ukjax.studies._common import environment, write_json


def machine_info() -> dict:
    """CPU model, cores, platform, JAX backend and devices, versions (python, jax, jaxlib, numpy, ...) and
    the XLA flags the run compiled with (``$XLA_FLAGS``; empty: JAX's defaults)."""
    info = environment()
    info["versions"]["jaxlib"] = jaxlib.__version__
    info["device"] = str(jax.devices()[0])
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return info


def write_results(path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON to ``path``, adding :func:`machine_info` as ``"environment"``."""
    return write_json(path, {**payload, "environment": machine_info()})


def cpu_seconds() -> float:
    """User plus system CPU time of this process so far (s)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RunMeter:
    """The load average, CPU time and wall time of a whole benchmark run, from when the meter is made."""

    def __init__(self):
        self.load_before = os.getloadavg()
        self.cpu_start = cpu_seconds()
        self.wall_start = time.perf_counter()

    def record(self) -> dict:
        """The payload entries ``load_average_before``, ``load_average_after`` (now), ``cpu_s`` and ``wall_s``
        (both since the meter was made)."""
        return {
            "load_average_before": self.load_before,
            "load_average_after": os.getloadavg(),
            "cpu_s": cpu_seconds() - self.cpu_start,
            "wall_s": time.perf_counter() - self.wall_start,
        }


def add_rollout_arguments(parser, *, span: float, rounds: int, budget_s: float, probe_steps: int, quick: str,
                          out: str) -> None:
    """The flags of a benchmark that rolls a robot out with ukjax and MuJoCo at a fixed RK4 step: batch
    sizes, simulated span, step, interleaved rounds, the per-run wall budget and its probe, ``--quick`` and
    ``--out``."""
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64, 1024], help="batch sizes N")
    parser.add_argument("--span", type=float, default=span, help="simulated seconds (default %(default)s)")
    parser.add_argument("--dt", type=float, default=1e-3, help="fixed RK4 step, s (default %(default)s)")
    parser.add_argument(
        "--rounds", type=int, default=rounds, help="interleaved rounds; medians (default %(default)s)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=budget_s, help="wall seconds per run; above it, fewer steps"
    )
    parser.add_argument(
        "--probe-steps", type=int, default=probe_steps, help="steps timed to estimate a run's cost"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", default=None, help=f"JSON path (default {out})")
