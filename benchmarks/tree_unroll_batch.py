"""A batch's kinematic-tree recursions on the CPU as loops or unrolled, per model (issue 41).

``simulate_batch`` traces the right-hand side of an unconstrained system with the recursions of a serial
one-DoF chain unrolled (``ukjax.multibody.unrolled_recursions``) and keeps them as ``lax.scan`` loops where
the system has constraints; this measures both ways on the same models, interleaved in every round, so that
the rule stays what the measurements say:

* ``ur5``: the UR5 of example-robot-data (``robot.system(loops=False)``: no constraints);
* ``ur5_constrained``: the same with one joint-space constraint q₂ + q₃ = const (Baumgarte 10, 25), its
  initial states on it;
* ``chainN``: ``ukjax.models.chain.multibody_system(N)``, the planar N-link chain with its tip pinned (two
  constraint rows).

RK4, ``--steps`` fixed steps of 1 ms, ``simulate_batch(..., ts=[t1], bucket=False)`` under ``jax.jit``,
float64; µs per step per scenario (best and median of ``--rounds``), compile seconds, the largest
difference of the final q between the two, the load average before and after.

    python3 benchmarks/tree_unroll_batch.py                     # 1024 scenarios, all models
    python3 benchmarks/tree_unroll_batch.py --models ur5 --batch 64
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import multibody

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import HOMES, RunMeter, final_states, robot_states, write_results  # noqa: E402
from robot_step_cpu import ur5_path  # noqa: E402
from scaling import compile_jit  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "tree-unroll-batch-cpu.json"
_SHIPPED_SCAN, _SHIPPED_CONTEXT = multibody._scan_per_platform, multibody.unrolled_recursions


def _unrolled_scan(step, init, xs, reverse):
    return multibody._scanned(step, init, xs, reverse, unroll=True)


@contextlib.contextmanager
def _recursions(how: str):
    """Every serial chain's recursions as loops (``loop``: as on the CPU before, whatever the system) or
    unrolled (``unrolled``), for the programs traced inside."""
    if how == "loop":
        multibody.unrolled_recursions = contextlib.nullcontext
    else:
        multibody._scan_per_platform = _unrolled_scan
    try:
        yield
    finally:
        multibody._scan_per_platform, multibody.unrolled_recursions = _SHIPPED_SCAN, _SHIPPED_CONTEXT


def _model(name: str, batch: int):
    from ukjax.constraints import Baumgarte, Holonomic
    from ukjax.models import chain

    if name.startswith("chain"):
        links = int(name[len("chain") :])
        params = chain.default_params(links)
        q0, qd0 = chain.scenarios(params, batch, seed=0)
        return chain.multibody_system(links), params, jnp.asarray(q0), jnp.asarray(qd0)
    robot = ukjax.robots.load(ur5_path())
    home = HOMES["ur5"]
    q0, qd0 = robot_states(robot, home, batch, 0, np.float64)
    system = robot.system(loops=False)
    if name == "ur5_constrained":
        total = home[1] + home[2]
        phi = lambda q, t, p: jnp.stack([q[1] + q[2] - total])
        system = system.with_constraints(Holonomic(phi=phi, baumgarte=Baumgarte(lambda p: (10.0, 25.0))))
        q0 = q0.at[:, 2].set(total - q0[:, 1])
        qd0 = qd0.at[:, 2].set(-qd0[:, 1])
    return system, robot.params, q0, qd0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="ur5,ur5_constrained,chain4,chain8")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    meter, dt, rows = RunMeter(), 1e-3, []
    for name in args.models.split(","):
        system, params, q0, qd0 = _model(name, args.batch)
        t1 = args.steps * dt
        programs = {}
        for how in ("loop", "unrolled"):
            jax.clear_caches()
            with _recursions(how):
                programs[how] = compile_jit(final_states(system, params, t1, dt, bucket=False), q0, qd0)
        times, finals = {how: [] for how in programs}, {}
        for _ in range(args.rounds):
            for how, (compiled, _) in programs.items():
                compiled(q0, qd0).block_until_ready()
                start = time.perf_counter()
                finals[how] = np.asarray(compiled(q0, qd0).block_until_ready())
                times[how].append(time.perf_counter() - start)
        per_step = lambda s: 1e6 * s / args.steps / args.batch
        row = {"model": name, "batch": args.batch, "steps": args.steps,
               "constraints": len(system.constraints),
               "max_abs_dq_final": float(np.max(np.abs(finals["loop"] - finals["unrolled"]))),
               "load_average": os.getloadavg()}  # fmt: skip
        for how, (_, compile_s) in programs.items():
            row[how] = {"us_per_step_best": per_step(min(times[how])),
                        "us_per_step_median": per_step(statistics.median(times[how])),
                        "compile_s": round(compile_s, 2)}  # fmt: skip
        row["loop_over_unrolled"] = row["loop"]["us_per_step_median"] / row["unrolled"]["us_per_step_median"]
        print(name, {k: row[k] for k in ("loop", "unrolled", "loop_over_unrolled")}, flush=True)
        rows.append(row)
    write_results(args.out, {"what": __doc__.split("\n\n")[0], "solver": "RK4", "dt": dt, "dtype": "float64",
                             "rows": rows, **meter.record()})  # fmt: skip
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
