"""XLA:CPU's kernel schedule for one scenario and for batches: its default (independent kernels side by side
on its thread pool) against ``ukjax.sequential_cpu_kernels()``
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``: one after the other).

The flag is read when JAX starts its CPU backend, so every measurement is a fresh process; the contenders are
interleaved round by round. Workloads, each RK4 at a fixed 1 ms step, float64, the final state saved:

* ``ur5_one``: the UR5 of example-robot-data (``robot.system(loops=False)``), one scenario, 500 steps,
  ``ukjax.simulate`` inside the caller's ``jax.jit`` (a model-predictive-control loop's shape);
* ``ur5_one_eager``: the same ``ukjax.simulate`` called as it is (its own program, and its host-side checks
  on every call);
* ``scara_one``: the SCARA of Xu & Liu 2017 (``ukjax.models.scara``), one scenario, 500 steps, in a ``jit``;
* ``ur5_1024`` and ``scara_1024``: ``ukjax.simulate_batch`` of 1024 scenarios, 200 steps.

Per process: compile once, then the median of 5 calls; µs per step (per step per scenario for batches).
Medians over rounds per contender, their ratio, the largest difference of the final states between the
contenders (the states themselves are not written), and ``uptime`` before and after go to the JSON.

    python3 benchmarks/cpu_schedule.py                 # 3 rounds
    python3 benchmarks/cpu_schedule.py --rounds 2 --workloads ur5_one scara_one
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("ur5_one", "ur5_one_eager", "scara_one", "ur5_1024", "scara_1024")
CONTENDERS = {"default": "", "sequential": "--xla_cpu_enable_concurrency_optimized_scheduler=false"}


def measure(workload: str) -> dict:
    """One workload in this process: compile seconds, µs per step (per scenario), the final states."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import ukjax

    ukjax.enable_float64()
    sys.path.insert(0, str(HERE))
    from _common import HOMES, robot_states

    if workload.startswith("ur5"):
        from robot_step_cpu import ur5_path

        robot = ukjax.robots.load(ur5_path())
        system, params = robot.system(loops=False), robot.params
        q0s, qd0s = robot_states(robot, HOMES["ur5"], 1024, seed=0)
    else:
        from ukjax.models import scara

        system, params = scara.system(), scara.default_params()
        q0, qd0 = scara.initial_state(params)
        offsets = jnp.linspace(-0.01, 0.01, 1024)[:, None] * jnp.ones(q0.shape[0])
        q0s, qd0s = q0 + offsets, jnp.tile(qd0, (1024, 1))
    batch = workload.endswith("1024")
    steps, dt = (200 if batch else 500), 1e-3
    t1 = steps * dt
    options = dict(t1=t1, ts=jnp.asarray([t1]), dt=dt, solver=ukjax.RK4(), max_steps=steps + 1)
    if batch:
        run = jax.jit(lambda q, qd: ukjax.simulate_batch(system, q, qd, params, **options).q[:, -1])
        args = (q0s, qd0s)
    elif workload.endswith("eager"):
        run = lambda q, qd: ukjax.simulate(system, q, qd, params, **options).q[-1]  # noqa: E731
        args = (q0s[0], qd0s[0])
    else:
        run = jax.jit(lambda q, qd: ukjax.simulate(system, q, qd, params, **options).q[-1])
        args = (q0s[0], qd0s[0])
    tic = time.perf_counter()
    final = jax.block_until_ready(run(*args))
    compile_s = time.perf_counter() - tic
    walls = []
    for _ in range(5):
        tic = time.perf_counter()
        jax.block_until_ready(run(*args))
        walls.append(time.perf_counter() - tic)
    per = steps * (args[0].shape[0] if batch else 1)
    return {"us_per_step": 1e6 * statistics.median(walls) / per, "compile_s": compile_s,
            "final": np.asarray(final).tolist()}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--out", default=str(HERE / "results" / "cpu-schedule.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    sys.path.insert(0, str(HERE))
    from _common import child_json, write_results

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    before = uptime()
    runs = {w: {c: [] for c in CONTENDERS} for w in args.workloads}
    finals: dict[str, dict] = {}  # workload -> contender -> its first run's final states
    for r in range(args.rounds):
        for workload in args.workloads:
            order = list(CONTENDERS) if r % 2 == 0 else list(CONTENDERS)[::-1]
            for name in order:
                row = child_json([__file__, "--child", workload], CONTENDERS[name])
                row["load"] = os.getloadavg()[0]
                finals.setdefault(workload, {}).setdefault(name, row.pop("final"))  # compared, not written
                runs[workload][name].append(row)
                print(f"round {r + 1} {workload} {name}: {row['us_per_step']:.2f} µs/step, compile "
                      f"{row['compile_s']:.1f} s", flush=True)  # fmt: skip
    summary = {}
    for workload, by in runs.items():
        medians = {name: statistics.median(x["us_per_step"] for x in rows) for name, rows in by.items()}
        first, second = (_flat(finals[workload][name]) for name in CONTENDERS)
        difference = max(abs(a - b) for a, b in zip(first, second, strict=True))
        summary[workload] = {
            "us_per_step_median": medians,
            "default_over_sequential": medians["default"] / medians["sequential"],
            "compile_s_median": {
                name: statistics.median(x["compile_s"] for x in rows) for name, rows in by.items()
            },
            "max_final_state_difference": difference,
        }
        ratio = medians["default"] / medians["sequential"]
        print(f"{workload}: default {medians['default']:.2f}, sequential {medians['sequential']:.2f} µs/step "
              f"(default / sequential {ratio:.2f}); max |Δ| {difference:.1e}")  # fmt: skip
    write_results(
        args.out,
        {"description": __doc__.split("\n\n")[0], "config": vars(args), "uptime_before": before,
         "uptime_after": uptime(), "summary": summary, "runs": runs},
    )  # fmt: skip
    print(f"wrote {args.out}")


def _flat(x) -> list[float]:
    return [x] if isinstance(x, float) else [v for item in x for v in _flat(item)]


if __name__ == "__main__":
    main()
