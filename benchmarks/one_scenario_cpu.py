"""One scenario's step on the CPU: XLA:CPU's loops compiled into one function (what ``import ukjax`` asks
for, ``ukjax.whole_cpu_loops``) against its loops run kernel by kernel (issue 41).

XLA:CPU runs a ``while`` loop's body as a chain of kernels, each dispatched on its own, unless the loop's one
iteration touches fewer bytes than its small-loop threshold (1 KiB by default); below it, the loop is one
function. ``import ukjax`` raises the threshold (to 4 MiB; 1 MiB when ``results/one-scenario-cpu.json`` was
measured, which one scenario of every model here falls under either way) in a CPU-only process that has not
started JAX (``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=...``). The option is read
when JAX starts its CPU backend, so each contender runs in its own fresh process, compiled first and then
timed (``--calls`` calls, median); the contenders alternate round by round (``--rounds``, medians over
rounds; µs per RK4 step of 1 ms, ``--steps`` steps, float64):

* ``whole_loops``: ``ukjax.simulate(..., solver=ukjax.RK4(), ts=[t1])`` in a ``jax.jit``, as shipped;
* ``kernel_by_kernel``: the same with XLA's default threshold (``..._byte_threshold=1024`` in
  ``XLA_FLAGS``, which ukjax leaves as it is), where ``ukjax.simulate`` keeps its workarounds for a loop
  run kernel by kernel (parameters split into rows, a tree's per-body values apart, an unconstrained
  chain's recursions unrolled: ``ukjax.simulation._small_state``), the engine before;
* ``mujoco_rk4`` (the UR5 and the Panda, where MuJoCo is installed): ``mujoco.rollout`` of the same URDF
  and state, RK4, one thread, timed in the ``whole_loops`` process.

Models: the UR5 and the Panda of example-robot-data (no constraints), the unconstrained and the pinned
8-link chain and the pinned 4-link chain of ``ukjax.models.chain`` written as trees, and Jansen's leg
(three exact loops). The final states of the two engines are compared (the same arithmetic, compiled
differently). Records the load average and the CPU seconds per wall second of each contender.

    python3 benchmarks/one_scenario_cpu.py                       # all models, 300 steps, 3 rounds
    python3 benchmarks/one_scenario_cpu.py --models ur5 panda
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("ur5", "panda", "free8", "pinned8", "pinned4", "jansen")
KERNEL_BY_KERNEL = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1024"
CONTENDERS = {"whole_loops": "", "kernel_by_kernel": KERNEL_BY_KERNEL}


def model(name: str):
    """(system, params, q0, q̇0, URDF path or None) of a model of :data:`MODELS`."""
    import jax.numpy as jnp
    import numpy as np

    from ukjax import robots
    from ukjax.models import chain

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


def measure(name: str, steps: int, dt: float, calls: int, mujoco: bool) -> dict:
    """One model in this process: compile seconds, µs per step (median of ``calls``), CPU seconds per wall
    second, whether XLA compiled the loops whole, the final state; MuJoCo's time where ``mujoco``."""
    import jax
    import numpy as np

    import ukjax
    from ukjax._config import cpu_loops_compiled_whole

    ukjax.enable_float64()
    sys.path.insert(0, str(HERE))
    from _common import cpu_seconds

    system, params, q0, qd0, path = model(name)
    t1 = steps * dt
    run = lambda q0, qd0, p: ukjax.simulate(system, q0, qd0, p, t1=t1, ts=[t1], dt=dt,
                                            solver=ukjax.RK4()).q[-1]  # fmt: skip
    start = time.perf_counter()
    program = jax.jit(run).lower(q0, qd0, params).compile()
    compile_s = time.perf_counter() - start
    contenders = {"ukjax": lambda: jax.block_until_ready(program(q0, qd0, params))}
    if mujoco and path is not None:
        try:
            from robots_speed import mujoco_model
            from scaling import MujocoRollout

            mj_model, mj_compile_s = mujoco_model(Path(path), dt)
            rollout = MujocoRollout(mj_model, np.asarray(q0)[None], np.asarray(qd0)[None], steps, 1,
                                    mj_compile_s)  # fmt: skip
            contenders["mujoco_rk4"] = lambda: rollout.run(steps)
        except ImportError:
            pass
    result = {}
    for key, call in contenders.items():
        call()
        walls, cpu = [], 0.0
        for _ in range(calls):
            start, start_cpu = time.perf_counter(), cpu_seconds()
            call()
            walls.append(time.perf_counter() - start)
            cpu += cpu_seconds() - start_cpu
        result[key] = {"us_per_step": float(np.median(walls)) / steps * 1e6, "cpu_per_wall": cpu / sum(walls)}
    result["ukjax"]["compile_s"] = compile_s
    result["loops_compiled_whole"] = cpu_loops_compiled_whole()
    result["final_q"] = np.asarray(program(q0, qd0, params)).tolist()
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=7, help="timed calls per process; their median")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/one-scenario-cpu.json")
    args = parser.parse_args(argv)
    if args.child:
        name, mujoco = args.child.split(":")
        print(json.dumps(measure(name, args.steps, args.dt, args.calls, mujoco == "1")))
        return {}
    import numpy as np

    sys.path.insert(0, str(HERE))
    from _common import alternating_children, write_results

    load_before = os.getloadavg()
    rows = []
    for name in args.models:
        options = ["--steps", str(args.steps), "--dt", str(args.dt), "--calls", str(args.calls)]
        children = {k: ([__file__, "--child", f"{name}:{int(k == 'whole_loops')}", *options], flag)
                    for k, flag in CONTENDERS.items()}  # fmt: skip
        runs = alternating_children(children, args.rounds)
        final = {k: np.asarray(v[0]["final_q"]) for k, v in runs.items()}
        median = lambda rs, key, field: float(np.median([r[key][field] for r in rs]))  # noqa: E731
        contenders = {
            k: {
                "us_per_step": median(rs, "ukjax", "us_per_step"),
                "us_per_step_rounds": [r["ukjax"]["us_per_step"] for r in rs],
                "cpu_per_wall": median(rs, "ukjax", "cpu_per_wall"),
                "compile_s": median(rs, "ukjax", "compile_s"),
                "loops_compiled_whole": [r["loops_compiled_whole"] for r in rs],
            }
            for k, rs in runs.items()
        }
        if "mujoco_rk4" in runs["whole_loops"][0]:
            contenders["mujoco_rk4"] = {
                "us_per_step": median(runs["whole_loops"], "mujoco_rk4", "us_per_step"),
                "cpu_per_wall": median(runs["whole_loops"], "mujoco_rk4", "cpu_per_wall"),
            }
        times = {k: v["us_per_step"] for k, v in contenders.items()}
        row = {
            "model": name,
            "contenders": contenders,
            "max_final_dq_whole_vs_kernel_by_kernel": float(np.max(np.abs(final["whole_loops"]
                                                                          - final["kernel_by_kernel"]))),
            "kernel_by_kernel_over_whole_loops": times["kernel_by_kernel"] / times["whole_loops"],
            "load_average": [r["load"] for rs in runs.values() for r in rs],
        }
        if "mujoco_rk4" in times:
            row["whole_loops_over_mujoco"] = times["whole_loops"] / times["mujoco_rk4"]
        rows.append(row)
        cells = ", ".join(f"{k} {v:.1f} µs" for k, v in times.items())
        print(f"{name}: {cells}; kernel by kernel / whole {row['kernel_by_kernel_over_whole_loops']:.2f}",
              flush=True)
    payload = {
        "description": "One scenario, RK4 at a fixed step, float64: ukjax.simulate in a jit with XLA:CPU's "
        "loops compiled into one function (import ukjax's default, ukjax.whole_cpu_loops) against its loops "
        "run kernel by kernel (XLA's default threshold; ukjax's small-state workarounds on), a fresh process "
        "per contender and round, alternating; medians over rounds; MuJoCo's rollout of the same URDF where "
        "it applies",
        "config": vars(args),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    path = write_results(args.out, payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
