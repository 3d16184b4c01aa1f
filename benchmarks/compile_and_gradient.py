"""First-call time (cold and from the compilation cache), forward and gradient time and memory of a batch.

The workload is the demo's: the SCARA of Xu & Liu 2017 (eq. 34-36, trajectory constraint eq. 48, Baumgarte
φ̈ + αφ̇ + βφ = 0 eq. 52 with the paper's α = 0.5, β = 200), Monte-Carlo perturbed as in ``ukjax demo``,
fixed-step Tsit5. Every measurement runs in a fresh Python process, so "first call" includes tracing,
compiling and running, as a user meets it; contenders are interleaved round by round:

* ``first_call``: ``simulate_batch`` of N scenarios x STEPS steps (dt = 5 ms), first call in a new process,
  with the persistent compilation cache off ("cold") and from a cache a previous process filled ("cached");
  wall time and the process's CPU time (user + system: robust to the load of a shared machine).
* ``split``: the same program's trace, lower and XLA-compile times (``jax.jit(...).trace/lower/compile``),
  the StableHLO size and the number of host callbacks in it.
* ``gradient``: a batch loss, the mean over scenarios of Σ_t |φ(t)|² at 101 saved times over 1 s (1000
  steps of 1 ms), its value alone ("forward") and ``jax.value_and_grad`` with respect to the Baumgarte gains
  (α, β) (shared by the batch); median of 3 calls after compiling; the compiled programs' temporary memory
  (XLA's ``memory_analysis``) against the size of the trajectory's states (N x 1000 x 8 float64).
* ``rhs``: one right-hand-side evaluation of the batch: forward, JVP and VJP of q̈(q, q̇, p) with the eq. 35
  solve's custom derivative (ukjax) against autodiff through the factorizations (``_eq35_forward``).

``--baseline PATH`` also runs the ``first_call``, ``split`` and ``gradient`` measurements on the ukjax
source tree at PATH (e.g. a git worktree of an earlier commit), interleaved with the current one.

    python3 benchmarks/compile_and_gradient.py                         # N = 1024
    python3 benchmarks/compile_and_gradient.py --baseline ../ukjax-old --rounds 2
    python3 benchmarks/compile_and_gradient.py --baseline ../old --first-call-only --rounds 3 --out X.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

WORKER = HERE / "_compile_worker.py"


def run_worker(tree: Path, mode: str, n: int, steps: int, cache: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    env.pop("BENCH_CACHE", None)
    if cache:
        env["BENCH_CACHE"] = cache
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode, str(n), str(steps)],
        env=env,
        cwd=str(tree),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {mode} on {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def load() -> list[float]:
    return list(os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of the first-call measurement"
    )
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier ukjax source tree to compare")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "compile_and_gradient-cpu.json")
    parser.add_argument(
        "--first-call-only", action="store_true", help="the first-call measurement alone (no gradient)"
    )
    args = parser.parse_args()

    trees = {"ukjax": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    results = {name: {"first_call_cold": [], "first_call_cached": []} for name in trees}
    loads = [load()]
    for r in range(args.rounds):
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory() as cache:
                cold = run_worker(tree, "first_call", args.scenarios, args.steps)
                run_worker(tree, "first_call", args.scenarios, args.steps, cache=cache)  # fills the cache
                cached = run_worker(tree, "first_call", args.scenarios, args.steps, cache=cache)
            results[name]["first_call_cold"].append(cold)
            results[name]["first_call_cached"].append(cached)
            print(
                f"round {r}: {name}: first call cold {cold['wall_s']:.1f} s wall / "
                f"{cold['cpu_s']:.1f} s CPU, "
                f"cached {cached['wall_s']:.1f} s / {cached['cpu_s']:.1f} s (load {load()[0]:.1f})",
                flush=True,
            )
            loads.append(load())
    for name, tree in [] if args.first_call_only else trees.items():
        results[name]["split"] = run_worker(tree, "split", args.scenarios, args.steps)
        print(f"{name}: split {results[name]['split']}", flush=True)
        results[name]["gradient"] = run_worker(tree, "gradient", args.scenarios, 1000)
        g = results[name]["gradient"]
        print(
            f"{name}: forward {g['forward_s']:.2f} s, gradient {g['gradient_s']:.2f} s "
            f"(ratio {g['gradient_s'] / g['forward_s']:.1f}), temp memory forward "
            f"{g['forward_temp_bytes'] / 1e6:.1f} MB, "
            f"gradient {g['gradient_temp_bytes'] / 1e6:.1f} MB, states {g['states_bytes'] / 1e6:.1f} MB",
            flush=True,
        )
        loads.append(load())
    if not args.first_call_only:
        results["ukjax"]["rhs"] = run_worker(ROOT, "rhs", args.scenarios, args.steps)
        print(f"rhs per scenario: {results['ukjax']['rhs']}", flush=True)
        loads.append(load())

    summary = {}
    for name in trees:
        cold = sorted(x["wall_s"] for x in results[name]["first_call_cold"])
        cached = sorted(x["wall_s"] for x in results[name]["first_call_cached"])
        summary[name] = {
            "first_call_cold_wall_s_min": cold[0],
            "first_call_cold_wall_s_median": cold[len(cold) // 2],
            "first_call_cached_wall_s_min": cached[0],
            "first_call_cold_cpu_s_min": min(x["cpu_s"] for x in results[name]["first_call_cold"]),
            "first_call_cached_cpu_s_min": min(x["cpu_s"] for x in results[name]["first_call_cached"]),
        }
        if "gradient" in results[name]:
            g = results[name]["gradient"]
            summary[name] |= {
                "gradient_over_forward": g["gradient_s"] / g["forward_s"],
                "gradient_temp_over_states": g["gradient_temp_bytes"] / g["states_bytes"],
            }
    sys.path.insert(0, str(HERE))
    from _common import write_results

    payload = {
        "description": __doc__.split("\n\n")[0],
        "workload": {
            "model": "SCARA (Xu & Liu 2017), Baumgarte alpha=0.5 beta=200 (eq. 52)",
            "scenarios": args.scenarios,
            "steps_first_call": args.steps,
            "dt_first_call": 5e-3,
            "gradient": "1000 steps of 1 ms, loss mean_s sum_t |phi|^2 at 101 saves, grad wrt (alpha, beta)",
            "solver": "diffrax.Tsit5, fixed step",
        },
        "load_average_1_5_15": loads,
        "summary": summary,
        "results": results,
    }
    write_results(args.out, payload)
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
