"""Compilations of a sequence of batch sizes, with and without batch-size buckets (``simulate_batch``).

A study or a sweep that runs several batch sizes compiles the whole simulation once per size unless sizes
share a bucket (``ukjax.options.bucket_size``: two buckets per octave up to one chunk, a bucketed number of
whole chunks above it). Workload: the demo's SCARA (Xu & Liu 2017, Bosh3 fixed step 5 ms, 20 steps: the
compile does not depend on the step count), the batch sizes of ``--sizes`` (default 100, 120, 200, 250, 1000,
1020) run one after the other in ONE fresh process per contender (no persistent compilation cache), so the
second size of a bucket finds its program in memory. Per contender: the number of simulation programs traced,
every backend compilation (count and seconds, the simulation's and the small pad/slice programs' apart), wall
and CPU seconds of the whole sequence, and the load average. Contenders alternate round by round
(``--rounds``), so both see the same load. (``succeeded`` counts status success: none over 0.1 s, where the
SCARA's start off its constraints has not settled with the paper's gains; the same with and without buckets.)

    python3 benchmarks/compile_buckets.py                 # writes benchmarks/results/compile-buckets-cpu.json
    python3 benchmarks/compile_buckets.py --rounds 2 --sizes 100,120,200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

WORKER = """
import json, os, resource, sys, time
import jax, jax.monitoring
jax.config.update("jax_enable_x64", True)
events = []
def listen(event, duration, **kw):
    events.append((event.rsplit("/", 1)[-1], str(kw.get("fun_name", "")), duration))
jax.monitoring.register_event_duration_secs_listener(listen)
import diffrax, jax.numpy as jnp, ukjax
from ukjax.models import scara
from ukjax.models.scara import sample_scenarios

bucket, sizes = sys.argv[1] == "on", [int(n) for n in sys.argv[2].split(",")]
params = scara.default_params()
q0, qd0 = scara.initial_state(params)
batch, q0s, qd0s = sample_scenarios(jax.random.PRNGKey(0), params, q0, qd0, max(sizes), spread=0.05,
                                    angle_noise_deg=1.0)
system, ts = scara.system(), jnp.linspace(0.0, 0.1, 11)
jax.block_until_ready((batch, q0s, qd0s))
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
start, wall, rows = cpu(), time.perf_counter(), []
del events[:]
for n in sizes:
    tic, mark = time.perf_counter(), len(events)
    pick = lambda x: x[:n]
    sol = ukjax.simulate_batch(system, pick(q0s), pick(qd0s), jax.tree_util.tree_map(pick, batch),
                               batch_params=True, t1=0.1, ts=ts, dt=5e-3, solver=diffrax.Bosh3(),
                               bucket=bucket)
    jax.block_until_ready(sol)
    new = events[mark:]
    traced = sum(e == "jaxpr_trace_duration" and f == "_simulate_many" for e, f, _ in new)
    rows.append({"batch": n, "wall_s": time.perf_counter() - tic, "simulation_traced": traced,
                 "succeeded": int((sol.status == 0).sum())})
compiles = [(f, d) for e, f, d in events if e == "backend_compile_duration"]
simulation = [d for f, d in compiles if "simulate_many" in f]
print(json.dumps({
    "bucket": bucket, "sizes": rows, "wall_s": time.perf_counter() - wall, "cpu_s": cpu() - start,
    "simulation_programs": len(simulation), "simulation_compile_s": sum(simulation),
    "other_programs": len(compiles) - len(simulation),
    "other_compile_s": sum(d for _, d in compiles) - sum(simulation),
    "trace_s": sum(d for e, _, d in events if e == "jaxpr_trace_duration"),
    "load_average_after": os.getloadavg(),
}))
"""


def run_contender(bucket: bool, sizes: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-c", WORKER, "on" if bucket else "off", sizes], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-3000:]}")
    return {"load_average_before": load, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,120,200,250,1000,1020", help="batch sizes, in order")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of (unbucketed, bucketed)")
    parser.add_argument("--out", default=str(HERE / "results" / "compile-buckets-cpu.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from _common import RunMeter, write_results

    meter, rounds = RunMeter(), []
    for k in range(args.rounds):
        row = {}
        for bucket in (False, True) if k % 2 == 0 else (True, False):
            row["bucketed" if bucket else "unbucketed"] = result = run_contender(bucket, args.sizes)
            print(
                f"round {k} bucket={bucket}: {result['simulation_programs']} simulation programs, "
                f"{result['simulation_compile_s']:.1f} s compile + {result['other_programs']} small "
                f"({result['other_compile_s']:.1f} s), trace {result['trace_s']:.1f} s, cpu "
                f"{result['cpu_s']:.1f} s, load {result['load_average_after'][0]:.1f}",
                flush=True,
            )
        rounds.append(row)
    payload = {
        "description": __doc__.split("\n\n")[0],
        "workload": {"model": "SCARA (ukjax.models.scara, demo's perturbations)", "sizes": args.sizes,
                     "solver": "diffrax.Bosh3, fixed step 5 ms, 20 steps, 11 saves", "chunk_size": "auto"},
        "rounds": rounds,
        **meter.record(),
    }  # fmt: skip
    print(f"wrote {write_results(args.out, payload)}")


if __name__ == "__main__":
    main()
