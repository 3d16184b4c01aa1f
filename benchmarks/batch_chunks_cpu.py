"""A CPU batch integrated in chunks whose loops XLA:CPU compiles whole, against the chunks of 256 run kernel
by kernel that ukjax used before (issue 41).

``simulate_batch(..., chunk_size="auto")`` on a CPU splits the batch into chunks integrated one after
another. Where XLA:CPU compiles small loops into one function (``ukjax.whole_cpu_loops``, set by
``import ukjax``: loops of less than 4 MiB per iteration), "auto" takes chunks small enough for that
(``ukjax.options.whole_loop_chunk``: the step's bytes counted on the right-hand side's jaxpr, within
``WHOLE_LOOP_STEP_BYTES``), so a chunk's step runs as one function on arrays that stay in the caches. Each
contender runs in its own fresh process (XLA reads the threshold when JAX starts), compiled first, then
timed (``--calls`` calls, median); the contenders alternate round by round (``--rounds``; medians over
rounds). Reported: µs per step per scenario (wall) and CPU seconds per wall second, on one CPU device:

* ``whole_loop_chunks``: ``ukjax.simulate_batch`` in a ``jax.jit``, as shipped (``chunk_size="auto"``);
* ``chunks_of_256``: the engine before: ``chunk_size=256`` with the former threshold of 1 MiB
  (``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1048576``), under which a chunk
  of 256 of these models runs kernel by kernel.

Models: the user-written SCARA of the throughput benchmark (Tsit5 at 5 ms, evaluated entry by entry), the
UR5 and the Panda of example-robot-data (RK4 at 1 ms, no constraints, the states of
``benchmarks/robots_speed.py``) and Jansen's leg (RK4 at 1 ms, three exact loops, the crank speeds of
``benchmarks/jansen_speed.py``). The final states of the two contenders are compared (the same
arithmetic per scenario, compiled differently).

    python3 benchmarks/batch_chunks_cpu.py                         # all models, 1024 scenarios, 100 steps
    python3 benchmarks/batch_chunks_cpu.py --models ur5 --batch 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("user_scara", "ur5", "panda", "jansen")
CONTENDERS = {
    "whole_loop_chunks": ("auto", ""),
    "chunks_of_256": (256, "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1048576"),
}


def model(name: str, batch: int):
    """(system, solver, dt, q0s, qd0s, params, batch_params) of a model's batch."""
    sys.path.insert(0, str(HERE))
    import jax.numpy as jnp
    import numpy as np

    import ukjax

    if name == "user_scara":
        import diffrax
        import user_scara
        from throughput import scenarios

        from ukjax.models import scara

        base = scara.initial_state(scara.default_params())
        q0, qd0 = (jnp.asarray(x) for x in scenarios(base, batch, 0, np.float64))
        return user_scara.system(), diffrax.Tsit5(), 5e-3, q0, qd0, user_scara.params(), False
    if name == "jansen":
        import jansen_speed

        from ukjax.studies import jansen

        robot = jansen.load_leg()
        system = jansen.leg_system(robot)
        _, params, q0, qd0 = jansen_speed.scenarios(robot, system, batch)
        return system, ukjax.RK4(), 1e-3, q0, qd0, params, {key: key == "omega" for key in params}
    from _common import HOMES, robot_states
    from validate_robots import ROBOTS

    from ukjax import robots
    from ukjax.studies._common import example_robot_file

    robot = robots.load(example_robot_file(ROBOTS[name]))
    q0, qd0 = robot_states(robot, HOMES[name], batch, 0)
    return robot.system(loops=False), ukjax.RK4(), 1e-3, q0, qd0, robot.params, False


def measure(name: str, chunk, batch: int, steps: int, calls: int) -> dict:
    import jax
    import numpy as np

    import ukjax
    from ukjax._config import cpu_loops_compiled_whole

    ukjax.enable_float64()
    system, solver, dt, q0, qd0, params, spec = model(name, batch)
    t1 = steps * dt

    def run(q0, qd0, p):
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=dt, solver=solver,
                                   max_steps=steps + 1, batch_params=spec, chunk_size=chunk)  # fmt: skip
        return sol.q[:, -1], sol.status

    start = time.perf_counter()
    compiled = jax.jit(run).lower(q0, qd0, params).compile()
    compile_s = time.perf_counter() - start
    from _common import cpu_seconds

    walls, cpus = [], []
    for _ in range(calls):
        wall, cpu = time.perf_counter(), cpu_seconds()
        q, status = jax.block_until_ready(compiled(q0, qd0, params))
        walls.append(time.perf_counter() - wall)
        cpus.append(cpu_seconds() - cpu)
    wall = float(np.median(walls))
    return {
        "us_per_step_per_scenario": wall / (steps * batch) * 1e6,
        "cpu_per_wall": float(np.median(np.asarray(cpus) / np.asarray(walls))),
        "compile_s": compile_s,
        "loops_compiled_whole": cpu_loops_compiled_whole(),
        "loop_functions": compiled.as_text().count("xla_cpu_small_call"),
        "not_success": int(np.sum(np.asarray(status) != int(ukjax.RESULTS.success))),
        "final_q": np.asarray(q).tolist(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per process; their median")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/batch-chunks-cpu.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.child:
        name, chunk = args.child.split(":")
        chunk = chunk if chunk == "auto" else int(chunk)
        print(json.dumps(measure(name, chunk, args.batch, args.steps, args.calls)))
        return {}
    import numpy as np
    from _common import RunMeter, alternating_children, write_results

    meter = RunMeter()
    rows = []
    for name in args.models:
        options = ["--batch", str(args.batch), "--steps", str(args.steps), "--calls", str(args.calls)]
        children = {k: ([__file__, "--child", f"{name}:{chunk}", *options], flag)
                    for k, (chunk, flag) in CONTENDERS.items()}  # fmt: skip
        runs = alternating_children(children, args.rounds)
        final = {k: np.asarray(v[0].pop("final_q")) for k, v in runs.items()}
        for rs in runs.values():
            for r in rs[1:]:
                r.pop("final_q")
        median = lambda rs, field: float(np.median([r[field] for r in rs]))  # noqa: E731
        contenders = {
            k: {
                "us_per_step_per_scenario": median(rs, "us_per_step_per_scenario"),
                "rounds": rs,
                "cpu_per_wall": median(rs, "cpu_per_wall"),
                "compile_s": median(rs, "compile_s"),
            }
            for k, rs in runs.items()
        }
        times = {k: v["us_per_step_per_scenario"] for k, v in contenders.items()}
        row = {
            "model": name,
            "contenders": contenders,
            "max_final_dq": float(np.max(np.abs(final["whole_loop_chunks"] - final["chunks_of_256"]))),
            "speedup": times["chunks_of_256"] / times["whole_loop_chunks"],
        }
        rows.append(row)
        cells = ", ".join(f"{k} {v:.2f} µs" for k, v in times.items())
        print(f"{name}: {cells}; speed-up {row['speedup']:.2f}x, max |Δq| {row['max_final_dq']:.1e}",
              flush=True)
    payload = {
        "description": f"{args.batch} scenarios on one CPU device, float64, simulate_batch in a jit: chunks "
        "whose loops XLA:CPU compiles whole (chunk_size='auto', as shipped) against chunks of 256 run "
        "kernel by kernel (the former threshold of 1 MiB); a fresh process per contender and round, "
        "alternating; medians over rounds of the medians of the timed calls",
        "config": vars(args),
        **meter.record(),
        "rows": rows,
    }
    path = write_results(args.out, payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
