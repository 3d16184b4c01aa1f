"""What every benchmark script records: the machine, the versions, the device, and its results as JSON.

A thin layer over :mod:`ukjax.studies._common` (which the studies use), so that benchmarks and studies
describe the machine the same way; it adds the exact jaxlib version and the device a result was measured on.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import jaxlib

from ukjax.studies._common import environment, write_json
from ukjax.studies.tune_ur5 import HOME as UR5_HOME

# Home poses of the robots of the speed benchmarks (rad; m for slides): the UR5's of ``ukjax tune ur5``, and
# the Panda's "ready" pose of franka_ros (joints 1-7) with its fingers half open
HOMES = {"ur5": UR5_HOME, "panda": (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02, 0.02)}


def final_states(system, params, t1: float, dt: float, **options):
    """``(q0, qd0) -> q(t1)`` of a batch by :func:`ukjax.simulate_batch` with RK4 fixed steps of ``dt`` and
    the final state saved alone (``ts=[t1]``: times known on the host, so the fused engine may take it);
    ``options`` go to ``simulate_batch`` (``engine``, ``bucket``)."""
    import ukjax

    def final(q0, qd0):
        options_ = dict(t1=t1, ts=[t1], dt=dt, solver=ukjax.RK4(), **options)
        return ukjax.simulate_batch(system, q0, qd0, params, **options_).q[:, -1]

    return final


def robot_states(robot, home, count: int, seed: int, dtype=None):
    """``count`` initial states of a loaded robot about ``home`` (NumPy's generator ``seed``): each hinge
    uniform in ±1 rad and its rate in ±1 rad/s, each slide (the Panda's fingers) in ±1 cm and ±1 cm/s."""
    import jax.numpy as jnp
    import numpy as np

    joints = robot.tree.joints
    spread = np.concatenate([np.full(j.nq, 0.01 if j.kind == "prismatic" else 1.0) for j in joints])
    if len(home) != robot.n or spread.shape != (robot.n,):
        raise ValueError(f"a home pose of {len(home)} coordinates for a robot of {robot.n}")
    rng = np.random.default_rng(seed)
    q0 = np.asarray(home) + spread * rng.uniform(-1.0, 1.0, (count, robot.n))
    qd0 = spread * rng.uniform(-1.0, 1.0, (count, robot.n))
    return jnp.asarray(q0, dtype), jnp.asarray(qd0, dtype)


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


def hlo_computations(hlo: str) -> tuple[str, dict[str, list[str]]]:
    """(entry, computations) of a compiled HLO module's text (``compiled.as_text()``): the entry
    computation's name and every computation's instruction lines by name."""
    computations, current, entry = {}, None, None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.-]+) .*\{$", line)
        if head and ("->" in line or line.startswith("ENTRY")):
            current = head.group(2)
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current:
            computations[current].append(line)
    return entry, computations


def child_json(command: list[str], xla_flags: str) -> dict:
    """The JSON a benchmark's child process prints last: ``command`` run in a fresh CPU-only process
    (``JAX_PLATFORMS=cpu``) with ``XLA_FLAGS=xla_flags``, for options XLA reads only when JAX starts."""
    env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternating_children(contenders: dict[str, tuple[list[str], str]], rounds: int) -> dict[str, list[dict]]:
    """``{name: [its child's JSON with "load", one per round]}``: each contender's ``(command, flags)`` run
    in a fresh process (:func:`child_json`, ``flags`` added to this process's ``XLA_FLAGS``), the contenders
    one after the other in every round."""
    runs = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (command, flags) in contenders.items():
            xla_flags = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
            runs[name].append({**child_json(command, xla_flags), "load": os.getloadavg()})
    return runs


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


def add_cpu_devices_argument(parser) -> None:
    """``--cpu-devices D``: the process gets D CPU devices (:func:`use_cpu_devices`), and a benchmark adds
    its contender ``ukjax_rk4_<D>devices`` (``scaling.split_contenders``: the batch split over them)."""
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="give the process this many CPU devices (ukjax.use_cpu_cores) and add the "
                        "contender ukjax_rk4_<D>devices: simulate_batch splitting the batch over them",
                        )  # fmt: skip


def use_cpu_devices(args) -> None:
    """``ukjax.use_cpu_cores(args.cpu_devices)`` where ``--cpu-devices`` was given (before any JAX work)."""
    if args.cpu_devices is not None:
        import ukjax

        ukjax.use_cpu_cores(args.cpu_devices)


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
