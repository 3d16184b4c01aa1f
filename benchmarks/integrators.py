"""Throughput and accuracy of diffrax's explicit solvers at a fixed step, on the demo's SCARA batch and a
four-bar linkage: which solver the demo and the benchmarks should use.

Workloads, both through :func:`ukjax.simulate_batch` at a fixed step, float64, default UK method:

* ``scara``: the demo's batch (``ukjax demo``): the SCARA of Xu & Liu 2017 (eq. 34-36, trajectory constraint
  eq. 48, Baumgarte φ̈ + αφ̇ + βφ = 0 with α = 0.5, β = 200, eq. 52-54), 1024 scenarios perturbed as the demo
  does (masses, lengths, inertias ±5 %, joint angles 1°, velocities 1 %), 5 s at the demo's step 5 ms;
* ``four_bar``: ``ukjax.models.chain`` with k = 3 links pinned at the tip (a four-bar linkage with the ground
  as fourth bar, n = 3, m = 2, Baumgarte α = β = 10 1/s), 1024 consistent scenarios, 5 s at 5 ms.

Solvers (evaluations of the right-hand side per step): Tsit5 (5th order, 6 with first-same-as-last), Dopri5
(5th, 6), Bosh3 (3rd, 3), Heun (2nd, 2), Euler (1st, 1). Interleaved rounds (every solver once per round),
medians. Reported: scenario-steps per second, the rate relative to Tsit5, compile time, the constraint
residual |φ| (largest over the batch at t1 and its peak over 21 saved times), the final-state error against
Tsit5 at a quarter of the step (the integration error, which Baumgarte terms do not show), and the scenarios
whose status is not success.

    python3 benchmarks/integrators.py                   # both workloads, 1024 scenarios, 3 rounds
    python3 benchmarks/integrators.py --quick           # 64 scenarios, 1 s, 1 round
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax.models import chain, scara

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RunMeter, cpu_seconds, write_results  # noqa: E402
from throughput import machine_tag, source_state  # noqa: E402

SOLVERS = {
    "Tsit5": (diffrax.Tsit5, 5, 6),
    "Dopri5": (diffrax.Dopri5, 5, 6),
    "Bosh3": (diffrax.Bosh3, 3, 3),
    "Heun": (diffrax.Heun, 2, 2),
    "Euler": (diffrax.Euler, 1, 1),
}


def workload(name, scenarios, seed):
    """(system, q0s, qd0s, params, batch_params)."""
    if name == "scara":
        params = scara.default_params()
        q0, qd0 = scara.initial_state(params)
        batch, q0s, qd0s = scara.sample_scenarios(
            jax.random.PRNGKey(seed), params, q0, qd0, scenarios, spread=0.05, angle_noise_deg=1.0
        )
        return scara.system(), q0s, qd0s, batch, True
    params = chain.default_params(3)
    q0s, qd0s = chain.scenarios(params, scenarios, speed=0.5, seed=seed)
    return chain.system(3), q0s, qd0s, params, False


def measure(name, args, progress):
    system, q0s, qd0s, params, batch_params = workload(name, args.scenarios, args.seed)
    steps = int(round(args.span / args.dt))
    t1 = steps * args.dt
    ts = jnp.linspace(0.0, t1, 21)

    def integrate(solver, dt):
        def run(q0s, qd0s, params):
            sol = ukjax.simulate_batch(
                system, q0s, qd0s, params, batch_params=batch_params, t1=t1, ts=ts, dt=dt, solver=solver()
            )
            return sol.q, sol.qd, sol.status

        return run

    def residual_norms(q, qd, params):
        """|φ| at every saved time (batch, times), from System.residuals."""
        one = lambda q, qd, t, p: jnp.linalg.norm(system.residuals(q, qd, t, p)[0])
        over_time = jax.vmap(one, in_axes=(0, 0, 0, None))
        return jax.vmap(over_time, in_axes=(0, 0, None, 0 if batch_params else None))(q, qd, ts, params)

    residual_norms = jax.jit(residual_norms)
    compiled, compile_s = {}, {}
    for solver in args.solvers:
        start = time.perf_counter()
        compiled[solver] = jax.jit(integrate(SOLVERS[solver][0], args.dt)).lower(q0s, qd0s, params).compile()
        compile_s[solver] = time.perf_counter() - start
        progress(f"{name}: compiled {solver} in {compile_s[solver]:.1f} s")
    reference = jax.jit(integrate(diffrax.Tsit5, args.dt / 4))(q0s, qd0s, params)
    for fn in compiled.values():  # one untimed call each: the first call of a program is slower
        jax.block_until_ready(fn(q0s, qd0s, params))
    walls = {s: [] for s in args.solvers}
    cpus = {s: [] for s in args.solvers}
    finals = {}
    for r in range(args.rounds):
        for solver, fn in compiled.items():
            wall, cpu = time.perf_counter(), cpu_seconds()
            finals[solver] = jax.block_until_ready(fn(q0s, qd0s, params))
            walls[solver].append(time.perf_counter() - wall)
            cpus[solver].append(cpu_seconds() - cpu)
            progress(f"{name} round {r + 1}/{args.rounds}: {solver} {walls[solver][-1]:.2f} s")
    rows = {}
    for solver in args.solvers:
        q, qd, status = finals[solver]
        phi = np.asarray(residual_norms(q, qd, params))
        wall = statistics.median(walls[solver])
        rows[solver] = {
            "order": SOLVERS[solver][1],
            "evaluations_per_step": SOLVERS[solver][2],
            "scenario_steps_per_s": args.scenarios * steps / wall,
            "median_wall_s": wall,
            "walls_s": walls[solver],
            "cpu_per_wall": sum(cpus[solver]) / sum(walls[solver]),
            "compile_s": compile_s[solver],
            "max_residual_at_t1": float(np.nanmax(phi[:, -1])),
            "max_residual_peak": float(np.nanmax(phi)),
            "max_state_error_vs_tsit5_quarter_step": float(
                np.nanmax(np.abs(np.asarray(q[:, -1] - reference[0][:, -1])))
            ),
            "not_success": int(np.sum(np.asarray(status) != int(ukjax.RESULTS.success))),
        }
    base = rows.get("Tsit5", {}).get("scenario_steps_per_s")
    for row in rows.values():
        row["rate_vs_tsit5"] = row["scenario_steps_per_s"] / base if base else None
    return {"workload": name, "steps": steps, "load_average": os.getloadavg(), "solvers": rows}


def markdown(results, args) -> str:
    lines = []
    for result in results:
        lines += [
            f"\n**{result['workload']}** ({args.scenarios} scenarios, {args.span:g} s at a fixed "
            f"{args.dt:g} s step, float64; ‖φ‖: largest over the batch, in the units of the constraint)\n",
            "| solver | order | evaluations/step | scenario-steps/s | rate vs Tsit5 | compile s | ‖φ‖ at t1 "
            "| peak ‖φ‖ | state error vs Tsit5 at dt/4 | not success |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for solver, r in result["solvers"].items():
            lines.append(
                f"| {solver} | {r['order']} | {r['evaluations_per_step']} | "
                f"{r['scenario_steps_per_s']:.3g} | "
                f"{r['rate_vs_tsit5']:.2f} | {r['compile_s']:.1f} | {r['max_residual_at_t1']:.1e} | "
                f"{r['max_residual_peak']:.1e} | {r['max_state_error_vs_tsit5_quarter_step']:.1e} | "
                f"{r['not_success']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads", nargs="+", default=["scara", "four_bar"], choices=["scara", "four_bar"]
    )
    parser.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=list(SOLVERS))
    parser.add_argument("--scenarios", type=int, default=1024, help="batch size (default %(default)s)")
    parser.add_argument("--span", type=float, default=5.0, help="simulated seconds (default %(default)s)")
    parser.add_argument(
        "--dt", type=float, default=5e-3, help="fixed step, s (the demo's, default %(default)s)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds; medians (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="64 scenarios, 1 s, 1 round")
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/integrators-<machine>.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.scenarios, args.span, args.rounds = 64, 1.0, 1
    if args.scenarios < 1 or args.span <= 0 or args.dt <= 0 or args.rounds < 1:
        raise ValueError("--scenarios, --span, --dt and --rounds must be positive")
    from tqdm import tqdm

    from ukjax.studies._common import environment

    out = Path(
        args.out or Path(__file__).parent / "results" / f"integrators-{machine_tag(environment())}.json"
    )
    meter = RunMeter()
    results = []
    for name in tqdm(args.workloads, unit="workload"):
        results.append(measure(name, args, tqdm.write))
    table = markdown(results, args)
    print(table)
    payload = {
        "description": "diffrax solvers at a fixed step through ukjax.simulate_batch (float64, default UK "
        "method), interleaved rounds, medians; residual |phi| = norm of the position residuals of "
        "System.residuals",
        "config": vars(args) | {"out": str(out)},
        "source": source_state(),
        **meter.record(),
        "results": results,
        "table_markdown": table,
    }
    write_results(out, payload)
    out.with_suffix(".md").write_text(table)
    print(f"wrote {out} (load average before {meter.load_before[0]:.2f}, after {os.getloadavg()[0]:.2f})")
    return payload


if __name__ == "__main__":
    main()
