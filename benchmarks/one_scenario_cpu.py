"""One scenario's step on the CPU with its loop running in order, against the engine before (issue 41).

XLA:CPU runs a compiled loop body's kernels one after the other in the calling thread only when every buffer
in the body is at most 512 bytes (``ukjax._settings.SMALL_BUFFER_BYTES``); otherwise it hands them to its
thread pool. Where the integrated state is that small, ``ukjax.simulate`` now passes the parameters into
diffrax's loop row by row, keeps a tree's per-body values apart where their stacks would exceed the limit
(``multibody.per_body_values``) and unrolls an unconstrained chain's recursions. Contenders, one process per
model, compiled first, then timed interleaved (``--rounds`` rounds, medians; µs per RK4 step of 1 ms,
``--steps`` steps, float64):

* ``shipped``: ``ukjax.simulate(..., solver=ukjax.RK4(), ts=[t1])`` in a ``jax.jit``, as shipped;
* ``before``: the same with the small-state path off (``ukjax.simulation._small_state`` forced False: the
  parameters whole, the bodies' values together, a chain's loops), the engine before;
* ``mujoco_rk4`` (the UR5 and the Panda, where MuJoCo is installed): ``mujoco.rollout`` of the same URDF
  and state, RK4, one thread.

Models: the UR5 and the Panda of example-robot-data (no constraints), the unconstrained and the pinned
8-link chain and the pinned 4-link chain of ``ukjax.models.chain`` written as trees, and Jansen's leg
(three exact loops). The final states of the two engines are compared (the same arithmetic in another
order). Records the load average and the CPU seconds per wall second of each contender.

    python3 benchmarks/one_scenario_cpu.py                       # all models, 300 steps, 9 rounds
    python3 benchmarks/one_scenario_cpu.py --models ur5 panda
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import robots, simulation
from ukjax.models import chain

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, write_results  # noqa: E402

MODELS = ("ur5", "panda", "free8", "pinned8", "pinned4", "jansen")


def model(name: str):
    """(system, params, q0, q̇0, URDF path or None) of a model of :data:`MODELS`."""
    if name in ("ur5", "panda"):
        from gpu_suite import robot_file

        path = robot_file(name)
        robot = robots.load(path)
        return robot.system(loops=False), robot.params, jnp.full(robot.n, 0.1), jnp.zeros(robot.n), path
    if name == "jansen":
        from ukjax.studies import jansen

        robot = jansen.load_leg()
        system = jansen.leg_system(robot)
        params = jansen.leg_params(robot, omega=2 * np.pi, alpha=20.0, beta=20.0)
        return (system, params, *jansen.initial_state(system, params), None)
    links = int(name[-1])
    params = chain.default_params(links)
    q0, qd0 = chain.initial_state(params)
    if name.startswith("free"):
        system = chain.tree(links).system(chain.bodies, chain._gravity, applied_force=chain.joint_damping)
    else:
        system = chain.multibody_system(links)
    return system, params, q0, qd0 + 0.3, None


def measure(name: str, args) -> dict:
    system, params, q0, qd0, path = model(name)
    t1 = args.steps * args.dt
    run = lambda q0, qd0, p: ukjax.simulate(system, q0, qd0, p, t1=t1, ts=[t1], dt=args.dt,
                                            solver=ukjax.RK4()).q[-1]  # fmt: skip
    programs, compile_s = {}, {}
    shipped_small_state = simulation._small_state
    for contender in ("shipped", "before"):
        simulation._small_state = shipped_small_state if contender == "shipped" else (lambda y0: False)
        start = time.perf_counter()
        programs[contender] = jax.jit(run).lower(q0, qd0, params).compile()
        compile_s[contender] = time.perf_counter() - start
        jax.clear_caches()  # the next contender traces its own programs
    simulation._small_state = shipped_small_state
    calls = {k: (lambda c=c: jax.block_until_ready(c(q0, qd0, params))) for k, c in programs.items()}
    if path is not None:
        try:
            from robots_speed import mujoco_model
            from scaling import MujocoRollout

            mj_model, mj_compile_s = mujoco_model(Path(path), args.dt)
            rollout = MujocoRollout(mj_model, np.asarray(q0)[None], np.asarray(qd0)[None], args.steps, 1,
                                    mj_compile_s)  # fmt: skip
            calls["mujoco_rk4"] = lambda: rollout.run(args.steps)
        except ImportError:
            pass
    walls = {k: [] for k in calls}
    cpu = {k: 0.0 for k in calls}
    loads = []
    for _ in range(args.rounds):
        for k, call in calls.items():
            call()
            start, start_cpu = time.perf_counter(), cpu_seconds()
            call()
            walls[k].append(time.perf_counter() - start)
            cpu[k] += cpu_seconds() - start_cpu
        loads.append(os.getloadavg())
    final = {k: np.asarray(programs[k](q0, qd0, params)) for k in programs}
    row = {
        "model": name,
        "contenders": {
            k: {
                "us_per_step": float(np.median(w)) / args.steps * 1e6,
                "walls_s": w,
                "cpu_per_wall": cpu[k] / sum(w),
                **({"compile_s": compile_s[k]} if k in compile_s else {}),
            }
            for k, w in walls.items()
        },
        "max_final_dq_shipped_vs_before": float(np.max(np.abs(final["shipped"] - final["before"]))),
        "load_average": loads,
    }
    times = {k: v["us_per_step"] for k, v in row["contenders"].items()}
    row["before_over_shipped"] = times["before"] / times["shipped"]
    if "mujoco_rk4" in times:
        row["shipped_over_mujoco"] = times["shipped"] / times["mujoco_rk4"]
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default="benchmarks/results/one-scenario-cpu.json")
    args = parser.parse_args(argv)
    before = os.uname().nodename, os.getloadavg()
    rows = []
    for name in args.models:
        row = measure(name, args)
        rows.append(row)
        cells = ", ".join(f"{k} {v['us_per_step']:.1f} µs" for k, v in row["contenders"].items())
        print(f"{name}: {cells}; before/shipped {row['before_over_shipped']:.2f}", flush=True)
    payload = {
        "description": "One scenario, RK4 at a fixed step, float64: ukjax.simulate as shipped (the loop over "
        "small buffers) against the engine before (ukjax.simulation._small_state forced False), interleaved "
        "in one process per model, medians; MuJoCo's rollout of the same URDF where it applies",
        "config": vars(args),
        "load_average_before": before[1],
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    path = write_results(args.out, payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
