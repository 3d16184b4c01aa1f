"""A/B of engine changes of issue 23 on the shipped and the user-written SCARA, interleaved in one run.

Contenders are the same ukjax with parts of the engine switched back to their former code while the program
is traced (jax caches cleared between contenders): ``plain`` (model functions called one by one, Gram by
``cho_solve``: the engine of 000c23f), ``shared`` (one shared evaluation of M, Q, A, b:
:mod:`ukjax._shared`), ``shared+fwd`` (and G = WᵀW from W = L⁻¹[F, Aᵀ], one back substitution:
``dynamics._eq35_factored``). Timed: ``simulate_batch`` (fixed step, RK4 and Tsit5, final state saved),
CPU ns per scenario-step, medians over interleaved rounds (order alternating), and the end-state difference
to the first contender.

    python3 benchmarks/engine_ab.py --batch 1024 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import dynamics
from ukjax import system as system_module

sys.path.insert(0, str(Path(__file__).parent))
import throughput  # noqa: E402
import user_scara  # noqa: E402
from _common import write_results  # noqa: E402

ukjax.enable_float64()


def _former_eq35_forward(method, M, Q, A, b, c, rtol):
    L = dynamics.cholesky(M)
    terms, parts = dynamics._eq35_given_solve(method, lambda B: dynamics.cho_solve(L, B), Q, A, b, c, rtol)
    return terms, dynamics._Eq35Factors(L, *parts)


@contextlib.contextmanager
def _patched(shared: bool, forward_gram: bool):
    saved = system_module.evaluate_shared, dynamics._eq35_forward
    if not shared:
        system_module.evaluate_shared = lambda f, *args: f(*args)
    if not forward_gram:
        dynamics._eq35_forward = _former_eq35_forward
    try:
        yield
    finally:
        system_module.evaluate_shared, dynamics._eq35_forward = saved


VARIANTS = {"plain": (False, False), "shared": (True, False), "shared+fwd": (True, True)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dt", type=float, default=5e-3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--solvers", nargs="+", default=["RK4", "Tsit5"], choices=["RK4", "Tsit5"])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine-ab-cpu.json"))
    args = parser.parse_args(argv)
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    uptime_before = uptime()
    from ukjax.models import scara

    base = scara.initial_state(scara.default_params())
    q0, qd0 = (jnp.asarray(x) for x in throughput.scenarios(base, args.batch, 0, np.float64))
    models = {
        "shipped": (scara.system(), throughput.scara_model_params(np.float64)),
        "user": (user_scara.system(), user_scara.params()),
    }
    compiled, finals = {}, {}
    for variant in args.variants:
        jax.clear_caches()
        with _patched(*VARIANTS[variant]):
            for model, (system, params) in models.items():
                for solver in args.solvers:
                    run = lambda q, qd, p, s=system, solver=solver: throughput.ukjax_batch(
                        s, q, qd, p, args.dt, steps=args.steps, solver=solver
                    )[0]
                    program = jax.jit(run).lower(q0, qd0, params).compile()
                    finals[(variant, model, solver)] = np.asarray(program(q0, qd0, params))
                    compiled[(variant, model, solver)] = (program, params)
    keys = list(compiled)
    times = {key: [] for key in keys}
    for r in range(args.rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            program, params = compiled[key]
            start = time.process_time()
            jax.block_until_ready(program(q0, qd0, params))
            times[key].append((time.process_time() - start) / (args.batch * args.steps) * 1e9)
    rows = []
    first = args.variants[0]
    for variant, model, solver in keys:
        ns = float(np.median(times[(variant, model, solver)]))
        ref = float(np.median(times[(first, model, solver)]))
        diff = np.max(np.abs(finals[(variant, model, solver)] - finals[(first, model, solver)]))
        rows.append({
            "variant": variant, "model": model, "solver": solver, "cpu_ns_per_scenario_step": ns,
            "rounds": times[(variant, model, solver)], f"over_{first}": ns / ref,
            f"max_end_state_difference_vs_{first}": float(diff),
        })  # fmt: skip
        print(f"{variant:<11} {model:<8} {solver:<6} {ns:7.0f} CPU ns/scenario-step  {ns / ref:5.2f}x {first}"
              f"  |Δq| {diff:.1e}", flush=True)
    payload = {
        "description": __doc__.split("\n\n")[0], "config": vars(args), "batch": args.batch,
        "uptime_before": uptime_before, "uptime_after": uptime(), "rows": rows,
        "source": throughput.source_state(),
    }  # fmt: skip
    write_results(args.out, payload)
    print(f"wrote {args.out}\n  before: {payload['uptime_before']}\n  after:  {payload['uptime_after']}")


if __name__ == "__main__":
    main()
