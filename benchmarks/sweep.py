"""What a sweep costs beyond the integration, and how its throughput changes with the number of devices.

The SCARA of Xu & Liu 2017 (seed 001, Baumgarte α = 0.5, β = 200), ``--scenarios`` scenarios with every mass,
length and inertia ±5 %, Tsit5 at a fixed step ``--dt`` to ``--t1``, in chunks of ``--chunk-size``. For each
device count D in ``--device-counts`` a fresh process is started with D simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=D``, fixed when JAX starts). In it, timed alternately,
``--repeats`` times each (compilation excluded: both are compiled before timing):

* **bare**: ``ukjax.simulate_batch`` of the same scenarios on one device, chunk by chunk, inputs drawn
  beforehand (not timed), the full ``Solution`` left on the device;
* **sweep**: ``ukjax.sweep.run`` of the same spec over all D devices, whose time includes drawing the inputs,
  the sharding, the on-device reduction to metrics, the transfer and the Parquet writes.

Recorded per D: the medians, the sweep's overhead over bare (target <= 10 % at D = 1), scenarios per second,
the process's CPU time during each timed run (CPU seconds / wall seconds = cores kept busy), the load average,
whether any sub-sweep fell back to one device (batched LAPACK on several CPU devices; the SCARA's program
calls none), and the largest difference of the sweep's final states from the bare batch's (the same work).

On a CPU the simulated devices share the machine's cores (XLA:CPU already spreads one device's work over
its intra-op thread pool), so this measures the sharding's cost and how the cores are used, not a GPU's
scaling: on a 2-core machine 4 devices cannot be faster than 2.

    python3 benchmarks/sweep.py     # writes benchmarks/results/sweep-<machine>.json and sweep-<machine>.png
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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


def _timed(function):
    """(wall seconds, CPU seconds of this process, result) of ``function()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(args) -> dict:
    """Bare simulate_batch on one device against the sweep on every local device, interleaved."""
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
    bare_compile_s, _, bare_compiled = _timed(lambda: bare.lower(q0, qd0, params).compile())

    def run_bare():
        for params, q0, qd0, _ in inputs:
            jax.block_until_ready(bare_compiled(q0, qd0, params))

    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        first = sweep.run(spec, out=tmp, fresh=True, progress=False)  # compiles
        bare_runs, sweep_runs = [], []
        for _ in range(args.repeats):
            wall, cpu, _ = _timed(run_bare)
            bare_runs.append({"wall_s": wall, "cpu_s": cpu})
            wall, cpu, summary = _timed(lambda: sweep.run(spec, out=tmp, fresh=True, progress=False))
            sweep_runs.append({"wall_s": summary.run_s, "cpu_s": cpu, "wall_with_setup_s": wall})
        table = sweep.load(tmp)
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())
    load_after = _load()
    final = np.concatenate(
        [np.asarray(bare_compiled(q0, qd0, params).q[:, -1, 0]) for params, q0, qd0, _ in inputs]
    )[: plan.total]
    same = float(np.max(np.abs(final - table.column("q_final[0]").to_numpy())))
    bare_med = float(np.median([r["wall_s"] for r in bare_runs]))
    sweep_med = float(np.median([r["wall_s"] for r in sweep_runs]))
    return {
        "devices": len(jax.local_devices()),
        "scenarios": plan.total,
        "chunk_size": spec.chunk_size,
        "steps_per_scenario": int(round(args.t1 / args.dt)),
        "bare_simulate_batch_runs": bare_runs,
        "sweep_runs": sweep_runs,
        "bare_median_s": bare_med,
        "sweep_median_s": sweep_med,
        "bare_scenarios_per_s": plan.total / bare_med,
        "sweep_scenarios_per_s": plan.total / sweep_med,
        "sweep_scenarios_per_s_range": [
            plan.total / max(r["wall_s"] for r in sweep_runs),
            plan.total / min(r["wall_s"] for r in sweep_runs),
        ],
        "sweep_over_bare_fraction": sweep_med / bare_med - 1.0,
        "sweep_cores_busy": float(np.median([r["cpu_s"] / r["wall_with_setup_s"] for r in sweep_runs])),
        "bare_cores_busy": float(np.median([r["cpu_s"] / r["wall_s"] for r in bare_runs])),
        "compile_s": {"sweep": first.compile_s, "bare": bare_compile_s},
        "one_device_subsweeps": manifest["runs"][-1]["one_device_subsweeps"],
        "max_final_state_difference_sweep_vs_bare": same,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_child(args, count: int) -> dict:
    """``measure`` in a fresh process with ``count`` simulated CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
    command = [sys.executable, __file__, "--child"]
    for name in ("scenarios", "chunk_size", "t1", "dt", "repeats"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    wall, cpu = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {
            "devices": count,
            "error": f"no result within {args.child_timeout} s ({_children_cpu() - cpu:.1f} CPU s used)",
        }
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"devices": count, "error": (done.stdout + done.stderr)[-2000:]}
    row = json.loads(line[len("RESULT ") :])
    row["process_wall_s"] = time.perf_counter() - wall
    row["process_cpu_s"] = _children_cpu() - cpu
    return row


def figure(result: dict, path: Path) -> None:
    from ukjax.studies._common import pyplot, save_figure

    plt = pyplot()

    rows = [r for r in result["devices"] if "error" not in r]
    d = np.array([r["devices"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    rate = np.array([r["sweep_scenarios_per_s"] for r in rows])
    low, high = np.array([r["sweep_scenarios_per_s_range"] for r in rows]).T
    ax.errorbar(
        d,
        rate,
        yerr=[rate - low, high - rate],
        marker="o",
        capsize=4,
        label="ukjax.sweep.run over D devices (median, min-max)",
    )
    ax.plot(
        d,
        [r["bare_scenarios_per_s"] for r in rows],
        "s--",
        color="gray",
        label="bare simulate_batch, one device, same process",
    )
    for r in rows:
        ax.annotate(
            f"{r['sweep_cores_busy']:.1f} cores busy",
            (r["devices"], r["sweep_scenarios_per_s"]),
            textcoords="offset points",
            xytext=(6, -14),
            fontsize=8,
        )
    for r in result["devices"]:
        if "error" in r:
            ax.axvline(r["devices"], color="red", alpha=0.3, label=f"{r['devices']} devices: no result")
    ax.set_xticks([r["devices"] for r in result["devices"]])
    ax.set_xlabel("simulated CPU devices (each run in its own process)")
    ax.set_ylabel("throughput (scenarios/s)")
    ax.set_ylim(bottom=0)
    o = rows[0] if rows else {}
    loads = [x for r in rows for x in (r["load_average_before"][0], r["load_average_after"][0])]
    ax.set_title(
        f"SCARA sweep (Xu & Liu 2017): {o.get('scenarios')} scenarios x {o.get('steps_per_scenario')} Tsit5 "
        f"steps,\n{result['environment_cores']}-core CPU, float64, load average "
        f"{min(loads, default=float('nan')):.1f}-{max(loads, default=float('nan')):.1f}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=4096)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--t1", type=float, default=1.0)
    parser.add_argument("--dt", type=float, default=5e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child-timeout", type=int, default=1800, help="seconds allowed per device count")
    parser.add_argument(
        "--device-counts", type=int, nargs="+", default=[1, 2, 4], help="simulated CPU devices"
    )
    parser.add_argument("--out", help="result file (default benchmarks/results/sweep-<machine>.json)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ukjax.enable_float64()
    if args.child:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    from _common import machine_info, write_results

    print(
        f"SCARA sweep: {args.scenarios} scenarios x {round(args.t1 / args.dt)} steps, chunks of "
        f"{args.chunk_size}, {args.repeats} repeats, on {args.device_counts} simulated CPU devices",
        flush=True,
    )
    load_before = _load()
    rows = []
    for count in args.device_counts:
        rows.append(run_child(args, count))
        r = rows[-1]
        if "error" in r:
            print(f"  {count} device(s): {r['error'][-300:]}", flush=True)
            continue
        print(
            f"  {count} device(s): sweep {r['sweep_scenarios_per_s']:.0f} scenarios/s "
            f"({r['sweep_cores_busy']:.2f} cores busy), bare simulate_batch on one device "
            f"{r['bare_scenarios_per_s']:.0f} scenarios/s: sweep/bare - 1 = "
            f"{100 * r['sweep_over_bare_fraction']:+.1f} %; load {r['load_average_before'][0]:.1f}"
            f"-{r['load_average_after'][0]:.1f}",
            flush=True,
        )
    result = {
        "description": __doc__,
        "devices": rows,
        "integrator": {"solver": "diffrax Tsit5", "step": "fixed", "dt": args.dt, "t1": args.t1},
        "load_average_before": load_before,
        "load_average_after": _load(),
        "gpu": "no GPU in this session: the SCARA sweep at 1,000,000 scenarios is still to be measured",
    }
    one = next((r for r in rows if r.get("devices") == 1 and "error" not in r), None)
    if one is not None:
        result["overhead_one_device"] = {
            "fraction": one["sweep_over_bare_fraction"],
            "target": 0.10,
            "bare_median_s": one["bare_median_s"],
            "sweep_median_s": one["sweep_median_s"],
        }
    machine = machine_info()["machine"]
    name = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-")
    path = Path(args.out or RESULTS / f"sweep-{name}-{os.cpu_count()}c.json")
    write_results(path, result)
    figure({**result, "environment_cores": machine["cores"]}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
