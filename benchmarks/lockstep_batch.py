"""A fixed-step batch as one solve of the whole batch ("lockstep", the engine) against diffrax's solve under
``jax.vmap`` (the engine before it), on the programs users compile most.

``ukjax.simulate_batch`` with a fixed step integrates the batch in one diffrax solve whose state is the whole
batch (``ukjax.simulation._solve_lockstep``); before, it was ``jax.vmap`` of the one-scenario solve, whose
``while_loop`` JAX batches several times while tracing (a fixpoint over which carried values are batched,
then once more with all of them batched) and guards with a per-scenario select at every step. The former
path is restored in a contender by replacing ``_solve_lockstep`` with that ``vmap`` while the program is
traced. Workloads, each in a fresh Python process per contender and round (so trace, lower and compile are
cold, as a user meets them; no persistent compilation cache), contenders interleaved round by round:

* ``demo``: ``ukjax demo``'s program: the SCARA of Xu & Liu 2017 (eq. 34-36, helix eq. 40, Baumgarte eq.
  52-54), 256 perturbed scenarios, Bosh3 at 5 ms for 5 s (1000 steps), 201 saves;
* ``user_scara``: the user-written SCARA of ``benchmarks/user_scara.py``, 1024 scenarios, Tsit5 at 5 ms,
  1000 steps, the final state saved (``benchmarks/throughput.py``'s configuration);
* ``tuner_gradient``: the reverse-mode gradient of the tuner's SCARA objective (``ukjax tune scara``'s
  batch loss, 64 scenarios x 200 steps of 1 ms, 201 saves; ``tune_gradient._objective``) with respect to the
  Baumgarte gains;
* ``ur5``: the UR5 of example-robot-data (``benchmarks/robots_speed.py``: ``robot.system(loops=False)``),
  1024 scenarios, RK4 at 1 ms, 500 steps (needs example-robot-data or ``UKJAX_ROBOT_DATA``).

Per workload and contender: trace, lower and XLA compile seconds (``jax.jit(...).trace/lower/compile``),
the run time (best of 3 calls after compiling), the largest difference of the final states between the
contenders (the same computation, XLA free to order sums differently) and equality of the statuses.
``uptime`` before and after and the XLA flags go to the JSON.

    python3 benchmarks/lockstep_batch.py                      # every workload, 2 rounds, JAX's XLA flags
    python3 benchmarks/lockstep_batch.py --workloads demo,user_scara --xla-flags \
        --xla_cpu_use_fusion_emitters=false --out benchmarks/results/lockstep-batch-cpu-suite-flags.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("demo", "user_scara", "tuner_gradient", "ur5")
CONTENDERS = ("lockstep", "vmap")


def _former_path():
    """Restore diffrax's solve under ``jax.vmap`` for fixed-step batches (the engine before lockstep)."""
    import jax

    from ukjax import simulation

    def solve_under_vmap(system, config, numbers, q0, qd0, params):
        one = lambda a, b, c: simulation._solve(system, config, numbers, a, b, c)
        return jax.vmap(one)(q0, qd0, params)

    simulation._solve_lockstep = solve_under_vmap


def _workload(name: str):
    """(function to jit, its arguments) of one workload; the function returns (final states, statuses)."""
    import diffrax
    import jax
    import jax.numpy as jnp

    import ukjax

    if name == "demo":
        from ukjax.demo import sample_scenarios
        from ukjax.models import scara

        p = scara.default_params()
        q0, qd0 = scara.initial_state(p)
        batch, q0s, qd0s = sample_scenarios(jax.random.PRNGKey(0), p, q0, qd0, 256, spread=0.05,
                                            angle_noise_deg=1.0)  # fmt: skip
        system, ts = scara.system(), jnp.linspace(0.0, 5.0, 201)

        def demo(q0s, qd0s, batch):
            sol = ukjax.simulate_batch(system, q0s, qd0s, batch, batch_params=True, t1=5.0, ts=ts, dt=5e-3,
                                       solver=diffrax.Bosh3())  # fmt: skip
            return sol.q[:, -1], sol.status

        return demo, (q0s, qd0s, batch)
    if name == "user_scara":
        sys.path.insert(0, str(HERE))
        import user_scara

        from ukjax.models import scara

        system, p = user_scara.system(), user_scara.params()
        q0, qd0 = scara.initial_state(scara.default_params())
        offsets = jnp.linspace(-0.01, 0.01, 1024)[:, None] * jnp.array([1.0, -1.0, 0.5, 0.0])
        q0s, qd0s = q0 + offsets, jnp.tile(qd0, (1024, 1))

        def user(q0s, qd0s, p):
            sol = ukjax.simulate_batch(system, q0s, qd0s, p, t1=5.0, ts=jnp.array([5.0]), dt=5e-3)
            return sol.q[:, -1], sol.status

        return user, (q0s, qd0s, p)
    if name == "tuner_gradient":
        from tune_gradient import _objective

        from ukjax.studies import tune_scara

        batch, box, _, gradient_of = _objective(64, 200, 1e-3)
        space = tune_scara.space_for(box, 0.5, 200.0)
        value_and_grad = gradient_of(space, "reverse")

        def gradient(theta, batch):
            loss, grad = value_and_grad(theta, batch)
            return grad, loss

        return gradient, (space.init(), batch)
    if name == "ur5":
        from _common import HOMES, robot_states
        from validate_robots import ROBOTS

        from ukjax import robots
        from ukjax.studies._common import example_robot_file

        robot = robots.load(example_robot_file(ROBOTS["ur5"]))
        system, params = robot.system(loops=False), robot.params
        q0s, qd0s = robot_states(robot, HOMES["ur5"], 1024, 0)

        def ur5(q0s, qd0s, params):
            sol = ukjax.simulate_batch(system, q0s, qd0s, params, t1=0.5, ts=jnp.array([0.5]), dt=1e-3,
                                       solver=ukjax.RK4())  # fmt: skip
            return sol.q[:, -1], sol.status

        return ur5, (q0s, qd0s, params)
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def worker(contender: str, workload: str, out: str) -> None:
    """One measurement in this (fresh) process; writes the timings and the final states to ``out``."""
    import jax
    import numpy as np

    import ukjax

    sys.path.insert(0, str(HERE))
    from _compile_worker import staged_compile

    ukjax.enable_float64()
    if contender == "vmap":
        _former_path()
    fn, args = _workload(workload)
    compiled, times, _ = staged_compile(fn, *args)
    result = jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(3):
        tic = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - tic)
    times["run_s"] = min(runs)
    times["first_result_s"] = times["trace_s"] + times["lower_s"] + times["compile_s"] + runs[0]
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(result)]
    np.savez(out + ".npz", *leaves)
    Path(out).write_text(json.dumps(times))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS)
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--xla-flags",
        default="",
        help="XLA_FLAGS of the workers (default: JAX's, as the ukjax command runs; the test suite adds "
        "--xla_cpu_use_fusion_emitters=false)",
    )
    parser.add_argument("--out", default=str(HERE / "results" / "lockstep-batch-cpu.json"))
    parser.add_argument("--worker", nargs=3, metavar=("CONTENDER", "WORKLOAD", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return
    import numpy as np

    sys.path.insert(0, str(HERE))
    from _common import write_results

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    before = uptime()
    scratch = Path(tempfile.mkdtemp(prefix="ukjax-lockstep-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["XLA_FLAGS"] = args.xla_flags
    rows = {}
    for workload in args.workloads.split(","):
        runs = {c: [] for c in CONTENDERS}
        for r in range(args.rounds):
            order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
            for contender in order:
                out = scratch / f"{workload}-{contender}-{r}.json"
                done = subprocess.run(
                    [sys.executable, __file__, "--worker", contender, workload, str(out)],
                    capture_output=True, text=True, env=env,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"{workload} {contender}: {done.stderr[-3000:]}")
                runs[contender].append(json.loads(out.read_text()) | {"load": os.getloadavg()[0]})
                print(f"{workload} {contender} round {r}: {runs[contender][-1]}", flush=True)
        finals = {c: np.load(scratch / f"{workload}-{c}-0.json.npz") for c in CONTENDERS}
        a, b = (finals[c] for c in CONTENDERS)
        floats = [k for k in a.files if a[k].dtype.kind == "f"]
        medians = {
            c: {k: float(np.median([run[k] for run in runs[c]])) for k in runs[c][0] if k != "load"}
            for c in CONTENDERS
        }
        rows[workload] = {
            "medians": medians,
            "runs": runs,
            "lockstep_over_vmap": {
                k: medians["lockstep"][k] / medians["vmap"][k]
                for k in ("trace_s", "lower_s", "compile_s", "run_s", "first_result_s")
            },  # fmt: skip
            "max_abs_difference": max(float(np.max(np.abs(a[k] - b[k]))) for k in floats),
            "same_statuses": all(np.array_equal(a[k], b[k]) for k in a.files if a[k].dtype.kind in "iu"),
        }
        print(f"{workload}: lockstep/vmap {rows[workload]['lockstep_over_vmap']}", flush=True)
    write_results(
        args.out,
        {
            "description": "simulate_batch with a fixed step: one solve of the whole batch (lockstep) vs "
            "diffrax's solve under jax.vmap (the engine before); fresh process per contender and round, no "
            "persistent cache; float64; medians over interleaved rounds",
            "config": vars(args) | {"worker": None},
            "uptime_before": before,
            "uptime_after": uptime(),
            "rows": rows,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
