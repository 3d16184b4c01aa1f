"""What a sweep costs beyond the integration, and how it scales over devices.

1. **Overhead** (one process, one device): the SCARA of Xu & Liu 2017 (seed 001, Baumgarte α = 0.5, β = 200),
   ``--scenarios`` scenarios with every mass, length and inertia ±5 %, Tsit5 at a fixed step, in chunks of
   ``--chunk-size``. Baseline: a bare ``ukjax.simulate_batch`` of the same scenarios, chunk by chunk, inputs
   drawn beforehand (not timed), the full ``Solution`` left on the device. Sweep: ``ukjax.sweep.run`` of the
   same spec, whose time includes drawing the inputs, the sharding, the on-device reduction to metrics, the
   transfer and the Parquet writes. Compilation is excluded from both (compiled once before timing); the
   two are timed alternately, ``--repeats`` times each, and the medians compared (target: <= 10 %).
2. **Devices**: the same sweep in a subprocess with 1, 2 and 4 simulated CPU devices
   (``XLA_FLAGS=--xla_force_host_platform_device_count=D``); scenarios per second after compilation. On a
   CPU the simulated devices share the machine's cores, so this measures the sharding's cost and the use of
   the cores, not a GPU's scaling.

    python3 benchmarks/sweep.py                   # writes benchmarks/results/sweep-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import sweep

RESULTS = Path(__file__).resolve().parent / "results"
PERTURBED = ("m1", "m2", "m3", "m4", "l1", "l2", "r1", "r2", "Iz1", "Iz2", "Iz3", "Iz4")


def make_spec(scenarios: int, chunk_size: int, t1: float, dt: float) -> dict:
    steps = int(round(t1 / dt))
    return {
        "name": "benchmark_scara",
        "model": "scara",
        "scenarios": scenarios,
        "chunk_size": chunk_size,
        "seed": 0,
        "integrator": {"t1": t1, "dt": dt, "solver": "Tsit5", "max_steps": steps + 1, "num_saves": 51},
        "vary": {f"params.{name}": {"dist": "relative", "spread": 0.05} for name in PERTURBED},
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def overhead(args) -> dict:
    from ukjax.sweep import _scenarios

    spec = sweep.load_spec(make_spec(args.scenarios, args.chunk_size, args.t1, args.dt))
    model = sweep.load_model(spec.model)
    plan = _scenarios.Plan.from_spec(spec, spec.chunk_size)
    static, _ = _scenarios.integrator_options(spec, plan, 0)
    build = jax.jit(jax.vmap(_scenarios.scenario_builder(spec, plan, model, 0)))
    chunks = [plan.chunk(c) for c in range(plan.num_chunks)]
    inputs = [build(jnp.arange(start, start + spec.chunk_size)) for _, start, _ in chunks]  # not timed
    ts = jnp.linspace(0.0, args.t1, static["num_saves"])
    bare = jax.jit(
        lambda q0, qd0, p: ukjax.simulate_batch(
            model.system,
            q0,
            qd0,
            p,
            batch_params=True,
            t1=args.t1,
            ts=ts,
            dt=args.dt,
            max_steps=static["max_steps"],
        )
    )
    params, q0, qd0, _ = inputs[0]
    tic = time.perf_counter()
    bare_compiled = bare.lower(q0, qd0, params).compile()
    bare_compile_s = time.perf_counter() - tic

    def run_bare() -> float:
        tic = time.perf_counter()
        for params, q0, qd0, _ in inputs:
            jax.block_until_ready(bare_compiled(q0, qd0, params))
        return time.perf_counter() - tic

    with tempfile.TemporaryDirectory() as tmp:
        first = sweep.run(spec, out=tmp, fresh=True, progress=False)  # compiles
        bare_s, sweep_s = [], []
        for _ in range(args.repeats):
            bare_s.append(run_bare())
            sweep_s.append(sweep.run(spec, out=tmp, fresh=True, progress=False).run_s)
        table = sweep.load(tmp)
    # the same work: the sweep's final states equal the bare batch's
    params, q0, qd0, _ = inputs[0]
    sol = bare_compiled(q0, qd0, params)
    final = np.asarray(sol.q[:, -1, 0])
    same = float(np.max(np.abs(final - table.column("q_final[0]").to_numpy()[: spec.chunk_size])))
    bare_med, sweep_med = float(np.median(bare_s)), float(np.median(sweep_s))
    return {
        "scenarios": args.scenarios,
        "chunk_size": args.chunk_size,
        "steps_per_scenario": int(round(args.t1 / args.dt)),
        "bare_simulate_batch_s": bare_s,
        "sweep_s": sweep_s,
        "bare_median_s": bare_med,
        "sweep_median_s": sweep_med,
        "overhead_fraction": sweep_med / bare_med - 1.0,
        "target_overhead_fraction": 0.10,
        "compile_s": {"sweep": first.compile_s, "bare": bare_compile_s},
        "max_final_state_difference_sweep_vs_bare": same,
        "sweep_scenarios_per_s": args.scenarios / sweep_med,
    }


def devices_child(args) -> None:
    """Run in a subprocess with D simulated devices: print one JSON line."""
    spec = make_spec(args.scenarios, args.chunk_size, args.t1, args.dt)
    with tempfile.TemporaryDirectory() as tmp:
        sweep.run(spec, out=tmp, fresh=True, progress=False)  # compiles
        runs = [sweep.run(spec, out=tmp, fresh=True, progress=False) for _ in range(args.repeats)]
    run_s = float(np.median([r.run_s for r in runs]))
    print(
        "RESULT "
        + json.dumps(
            {
                "devices": len(jax.local_devices()),
                "run_s": run_s,
                "scenarios_per_s": args.scenarios / run_s,
                "compile_s": runs[0].compile_s,
            }
        )
    )


def devices(args) -> list[dict]:
    rows = []
    for count in args.device_counts:
        env = dict(
            os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu"
        )
        command = [
            sys.executable,
            __file__,
            "--child",
            "--scenarios",
            str(args.scenarios),
            "--chunk-size",
            str(args.chunk_size),
            "--t1",
            str(args.t1),
            "--dt",
            str(args.dt),
            "--repeats",
            str(args.repeats),
        ]
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=args.child_timeout
            )
        except subprocess.TimeoutExpired:
            rows.append({"devices": count, "error": f"no result within {args.child_timeout} s"})
            print(f"  {count} device(s): no result within {args.child_timeout} s", flush=True)
            continue
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            rows.append({"devices": count, "error": done.stderr[-2000:]})
            continue
        rows.append(json.loads(line[len("RESULT ") :]))
        print(f"  {count} device(s): {rows[-1]['scenarios_per_s']:.0f} scenarios/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=4096)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--t1", type=float, default=1.0)
    parser.add_argument("--dt", type=float, default=5e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child-timeout", type=int, default=1800, help="seconds allowed per device count")
    parser.add_argument(
        "--device-counts", type=int, nargs="*", default=[1, 2, 4], help="simulated CPU devices"
    )
    parser.add_argument("--out", help="result file (default benchmarks/results/sweep-<machine>.json)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ukjax.enable_float64()
    if args.child:
        devices_child(args)
        return
    from _common import machine_info, write_results

    load_before = _load()
    print(
        f"overhead: {args.scenarios} SCARA scenarios, chunks of {args.chunk_size}, {args.repeats} repeats",
        flush=True,
    )
    result = {"overhead": overhead(args)}
    o = result["overhead"]
    print(
        f"  bare simulate_batch {o['bare_median_s']:.2f} s, sweep {o['sweep_median_s']:.2f} s: overhead "
        f"{100 * o['overhead_fraction']:.1f} % (target <= 10 %)",
        flush=True,
    )
    print("devices:", flush=True)
    result["devices"] = devices(args) if args.device_counts else []
    result.update(
        description=__doc__,
        integrator={"solver": "diffrax Tsit5", "step": "fixed", "dt": args.dt, "t1": args.t1},
        load_average_before=load_before,
        load_average_after=_load(),
        gpu="no GPU in this session: the SCARA sweep at 1,000,000 scenarios was not run here",
    )
    machine = re.sub(r"[^a-z0-9]+", "-", machine_info()["machine"]["cpu"].lower()).strip("-")
    path = write_results(args.out or RESULTS / f"sweep-{machine}-{os.cpu_count()}c.json", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
