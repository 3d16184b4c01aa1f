"""XLA:CPU's fusion emitters against its legacy elemental emitters: compile time and run time of the demo's
program, interleaved, each contender in a fresh process without the persistent compilation cache.

The ``ukjax`` command sets ``--xla_cpu_use_fusion_emitters=false`` (``ukjax.faster_cpu_compilation``); this
script measures what that changes. Each run is a fresh Python process that compiles and runs the demo's
batch (the SCARA of Xu & Liu 2017 following its helix, ``ukjax.simulate_batch`` with Tsit5 at a fixed 5 ms
step, 201 saves, float64, entrywise right-hand side on the CPU) at the given batch size, and reports JAX's
compile events (tracing, lowering, XLA backend compilation), the first call's wall time (compile + run) and
a second call's (run only). Contenders alternate in every round; medians over rounds; ``uptime`` before and
after; the largest difference of the final states between the two (the same arithmetic in another order).

    python3 benchmarks/cpu_compile_flags.py                 # batch 256 and 4096, 1000 steps, 2 rounds
    python3 benchmarks/cpu_compile_flags.py --quick         # batch 64, 100 steps, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAG = "--xla_cpu_use_fusion_emitters=false"
CONTENDERS = {"fusion_emitters": "", "elemental_emitters": FLAG}

WORKER = r"""
import collections, json, sys, time
import jax, jax.monitoring as monitoring, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
events = collections.defaultdict(float)
monitoring.register_event_duration_secs_listener(
    lambda e, d, **k: events.__setitem__(e.rsplit("/", 1)[-1], events[e.rsplit("/", 1)[-1]] + d))
import diffrax, ukjax
from ukjax.demo import sample_scenarios
from ukjax.models import scara
n, t1 = int(sys.argv[1]), float(sys.argv[2])
params = scara.default_params()
q0, qd0 = scara.initial_state(params)
batch, q0s, qd0s = sample_scenarios(jax.random.PRNGKey(0), params, q0, qd0, n, spread=0.05,
                                    angle_noise_deg=1.0)
ts = jnp.linspace(0.0, t1, 201)
system = scara.system()  # one System: a new one is a new static argument, compiled again
run = lambda: ukjax.simulate_batch(system, q0s, qd0s, batch, batch_params=True, t1=t1, ts=ts, dt=0.005,
                                   solver=diffrax.Tsit5())
jax.block_until_ready((q0s, qd0s, batch))
events.clear()
tic = time.perf_counter(); sol = jax.block_until_ready(run()); first = time.perf_counter() - tic
compile_events = dict(events)
tic = time.perf_counter(); sol = jax.block_until_ready(run()); second = time.perf_counter() - tic
print(json.dumps({"first_call_s": first, "second_call_s": second,
                  "trace_s": compile_events.get("jaxpr_trace_duration", 0.0),
                  "lower_s": compile_events.get("jaxpr_to_mlir_module_duration", 0.0),
                  "backend_compile_s": compile_events.get("backend_compile_duration", 0.0),
                  "q_final": np.asarray(sol.q[:, -1]).tolist()}))
"""


def measure(flags: str, batch: int, t1: float) -> dict:
    env = dict(
        os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(), JAX_PLATFORMS="cpu"
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", WORKER, str(batch), str(t1)], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="256,4096", help="comma list of batch sizes")
    parser.add_argument("--t1", type=float, default=5.0, help="simulated seconds (5 ms steps)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="batch 64, 0.5 s, one round")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu-compile-flags.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.t1, args.rounds = "64", 0.5, 1
    from ukjax._io import write_json

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()

    before = uptime()
    rows = []
    for batch in [int(b) for b in args.batch.split(",")]:
        runs = {name: [] for name in CONTENDERS}
        for _ in range(args.rounds):
            for name, flags in CONTENDERS.items():
                runs[name].append(measure(flags, batch, args.t1))
                r = runs[name][-1]
                print(f"batch {batch} {name:20s} trace {r['trace_s']:.2f} lower {r['lower_s']:.2f} backend "
                      f"{r['backend_compile_s']:.2f} first {r['first_call_s']:.2f} "
                      f"second {r['second_call_s']:.3f} s",
                      flush=True)  # fmt: skip
        finals = {name: runs[name][0].pop("q_final") for name in CONTENDERS}
        for name in CONTENDERS:
            for r in runs[name][1:]:
                r.pop("q_final")
        a, b = (finals[name] for name in CONTENDERS)
        difference = max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
        medians = {
            name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
            for name in CONTENDERS
        }
        rows.append({"batch": batch, "steps": round(args.t1 / 0.005), "medians": medians, "runs": runs,
                     "max_abs_q_final_difference": difference,
                     "backend_compile_ratio": medians["elemental_emitters"]["backend_compile_s"]
                     / medians["fusion_emitters"]["backend_compile_s"],
                     "run_ratio": medians["elemental_emitters"]["second_call_s"]
                     / medians["fusion_emitters"]["second_call_s"]})  # fmt: skip
        print(
            f"batch {batch}: backend compile x{rows[-1]['backend_compile_ratio']:.2f}, run x"
            f"{rows[-1]['run_ratio']:.2f} with {FLAG}; max |Δq| {difference:.1e}",
            flush=True,
        )
    write_json(args.out, {
        "description": "XLA:CPU fusion emitters (default) vs legacy elemental emitters (" + FLAG + ") on the "
        "demo's program: ukjax.simulate_batch of the SCARA (Xu & Liu 2017), Tsit5 fixed 5 ms step, 201 "
        "saves, float64; fresh process per run, no persistent cache; medians over interleaved rounds",
        "config": vars(args), "uptime_before": before, "uptime_after": uptime(), "rows": rows,
    })  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
