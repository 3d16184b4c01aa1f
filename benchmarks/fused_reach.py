"""Which models the fused kernel runs on a GPU, at what rate, compiled in how long, equal to the XLA engine
to what: the loaded UR5 and Panda, the 8-link chain through the kinematic tree, the five-bar.

Each model is integrated by RK4 with a fixed step (``--steps`` steps of ``--dt``, the final state saved)
through ``simulate_batch(..., engine="fused")`` (ukjax.fused: one Pallas kernel per save interval) and, as the
baseline in the same run, ``engine="xla"``. Rows (one JSON object per line, appended to ``rows.jsonl`` as
each is measured, so that a run killed at its limit keeps what it measured):

* ``rate``: compile seconds (lowering and compilation, ahead of time), run seconds (best of ``--repeats``),
  scenario-steps per second, the fraction of finite final states;
* ``equality`` (float64): the largest difference of q at t1 between the fused and the XLA engine over the
  first ``--check`` scenarios, beside the largest |q| change over the run (the motion).

``--max-entry-operations N`` raises :data:`ukjax.fused.MAX_ENTRY_OPERATIONS` for this run: the limit keeps
interpret mode's XLA:CPU compile time bounded; this measures what the Triton compile of a larger right-hand
side costs on the GPU. Without a GPU the kernel runs in Pallas's interpret mode (``--smoke``: the arm2 of
tests/data at 64 scenarios, to check the script).

    python3 benchmarks/fused_reach.py --out results/fused-reach --models ur5,panda,chain8 --batch 1000000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _model(name: str, dtype):
    """(system, params, states(count) -> (q0, qd0)) of a model, cast to ``dtype``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _common import HOMES, robot_states

    from ukjax import robots
    from ukjax.models import chain, five_bar

    cast = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), tree)
    if name.startswith("chain"):
        links = int(name[len("chain") :])
        params = chain.default_params(links)

        def states(count):
            q0, qd0 = chain.scenarios(params, count, seed=0)
            return jnp.asarray(q0, dtype), jnp.asarray(qd0, dtype)

        return chain.multibody_system(links), cast(params), states
    if name == "five_bar":
        params = five_bar.default_params()
        q, qd = five_bar.initial_state(params)

        def states(count):  # the consistent initial state of every scenario, crank rates spread ±10 %
            scale = 1.0 + 0.1 * np.random.default_rng(0).uniform(-1.0, 1.0, (count, 1))
            q0 = jnp.broadcast_to(jnp.asarray(q, dtype), (count, q.shape[0]))
            return q0, jnp.asarray(scale * qd, dtype)

        return five_bar.system(), cast(params), states
    from gpu_suite import robot_file

    robot = robots.load(robot_file(name))
    home = HOMES.get(name, (0.0,) * robot.n)
    states = lambda count: robot_states(robot, home, count, 0, dtype)
    return robot.system(loops=False), cast(robot.params), states


def _timed(compiled, q0, qd0, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = compiled(q0, qd0).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return out, best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="ur5,panda,chain8")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--check", type=int, default=4096, help="scenarios compared with the XLA engine")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dt", type=float, default=0.005)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--xla-rates", action="store_true", help="also the XLA engine's rate at --batch")
    parser.add_argument("--max-entry-operations", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no model after this")
    parser.add_argument("--smoke", action="store_true", help="arm2 at 64 scenarios, 4 steps (no GPU needed)")
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from _common import final_states, machine_info
    from scaling import compile_jit

    from ukjax import fused

    if args.smoke:
        args.models, args.batch, args.check, args.steps, args.repeats = "arm2", 64, 64, 4, 1
    if args.max_entry_operations is not None:
        fused.MAX_ENTRY_OPERATIONS = args.max_entry_operations
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "rows.jsonl"
    start = time.perf_counter()
    t1 = args.steps * args.dt
    header = {"kind": "run", "machine": machine_info(), "argv": sys.argv[1:], "t1": t1,
              "max_entry_operations": fused.MAX_ENTRY_OPERATIONS}  # fmt: skip

    def record(row):
        row = {**row, "elapsed_s": round(time.perf_counter() - start, 2)}
        print(json.dumps(row), flush=True)
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    record(header)
    for name in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            if time.perf_counter() - start > args.budget_s:
                record({"kind": "skipped", "model": name, "dtype": dtype_name, "why": "budget"})
                continue
            dtype = np.dtype(dtype_name)
            base = {"model": name, "dtype": dtype_name, "steps": args.steps, "dt": args.dt, "solver": "RK4"}
            try:
                system, params, states = _model(name, dtype)
                q0, qd0 = states(args.batch)
                engines = ["fused"] + (["xla"] if args.xla_rates else [])
                fused_final = None
                for engine in engines:
                    program = final_states(system, params, t1, args.dt, engine=engine)
                    compiled, compile_s = compile_jit(program, q0, qd0)
                    final, run_s = _timed(compiled, q0, qd0, args.repeats)
                    final = np.asarray(final)
                    fused_final = final if engine == "fused" else fused_final
                    record({**base, "kind": "rate", "engine": engine, "batch": args.batch,
                            "compile_s": round(compile_s, 3), "run_s": run_s,
                            "scenario_steps_per_s": args.batch * args.steps / run_s,
                            "finite_fraction": float(np.mean(np.isfinite(final).all(axis=1)))})  # fmt: skip
                if dtype_name == "float64":
                    count = min(args.check, args.batch)
                    xla_final = final_states(system, params, t1, args.dt, engine="xla")
                    xla, compile_s = compile_jit(xla_final, q0[:count], qd0[:count])
                    reference = np.asarray(xla(q0[:count], qd0[:count]))
                    record({**base, "kind": "equality", "scenarios": count,
                            "xla_compile_s": round(compile_s, 3),
                            "max_abs_q_fused_vs_xla": float(np.max(np.abs(fused_final[:count] - reference))),
                            "motion": float(np.max(np.abs(reference - np.asarray(q0[:count]))))})  # fmt: skip
            except Exception as error:  # a refusal (the kernel's limit, a missing robot file) is a result
                record({**base, "kind": "error", "error": f"{type(error).__name__}: {str(error)[:600]}"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
