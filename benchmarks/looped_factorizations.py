"""One scenario and small batches on the CPU: the small factorizations of the UK solve as loops
(``ukjax.linalg.looped_factorizations``, what ``simulate`` and a ``vmap`` below the entrywise threshold trace
on the CPU) against unrolled scalar code (the engine before, and what a GPU and the entrywise batch trace).

Contenders, per model and batch size, compiled once each (AOT) and timed interleaved in one process (each
round runs both; medians over rounds), RK4 at a fixed 1 ms step, float64:

* ``looped``: the engine as users run it on the CPU;
* ``unrolled``: the same program traced with ``ukjax.options._loops_pay`` returning False (the GPU's choice).

Models: Jansen's Strandbeest leg from its MJCF file (7 hinges, 3 connect loops and the crank drive: 10
constraint rows of rank 7, ``ukjax.studies.jansen.leg_system``) and the SCARA of Xu & Liu 2017 (4
coordinates, 2 constraint rows). Sizes: ``ukjax.step`` of one scenario in a ``lax.scan`` (``N = step``),
``simulate`` of one scenario (``N = single``) and ``simulate_batch``
of N = 1 and 16, below the entrywise threshold of 64 scenarios (from there on both contenders are the same
unrolled program). Reported: µs per step per scenario, compile seconds, the largest difference of the final
states between the contenders (round-off: same algorithm, other order of operations), ``uptime`` before and
after.

    python3 benchmarks/looped_factorizations.py            # 7 rounds
    python3 benchmarks/looped_factorizations.py --quick    # 3 rounds, Jansen only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import simulation, stepping
from ukjax.models import scara
from ukjax.studies import jansen

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

DT = 1e-3
STEPS = 300
OUT = Path(__file__).resolve().parent / "results" / "looped-factorizations-cpu.json"


def models(names):
    out = {}
    if "jansen" in names:
        robot = jansen.load_leg()
        system = jansen.leg_system(robot)
        p = jansen.leg_params(robot, omega=2 * np.pi, alpha=20.0, beta=20.0)
        out["jansen"] = (system, p, *jansen.initial_state(system, p))
    if "scara" in names:
        p = scara.default_params()
        out["scara"] = (scara.system(), p, *scara.initial_state(p))
    return out


def program(system, p, q0, qd0, size):
    """(function, arguments): the final states after STEPS fixed RK4 steps of one scenario or a batch."""
    run = dict(t1=STEPS * DT, ts=jnp.array([STEPS * DT]), dt=DT, solver=ukjax.RK4(), max_steps=STEPS + 1)
    if size == "step":  # ukjax.step in a lax.scan, as a user's model-predictive loop advances one scenario

        def steps(q, qd):
            advance = lambda state, _: (ukjax.step(system, state, p, DT, solver=ukjax.RK4()), None)  # noqa: E731
            return jax.lax.scan(advance, ukjax.State(q, qd), None, length=STEPS)[0].q

        return steps, (q0, qd0)
    if size == "single":
        return (lambda q, qd: ukjax.simulate(system, q, qd, p, **run).q[-1]), (q0, qd0)
    Q0, QD0 = jnp.tile(q0, (size, 1)), jnp.tile(qd0, (size, 1))
    return (lambda q, qd: ukjax.simulate_batch(system, q, qd, p, **run).q[:, -1]), (Q0, QD0)


def compiled(fn, args, looped: bool):
    """(executable, compile seconds) with the engine's choice, or with loops refused (``looped=False``)."""
    chosen = simulation._loops_pay
    jax.clear_caches()
    if not looped:
        simulation._loops_pay = stepping._loops_pay = lambda: False
    try:
        tic = time.perf_counter()
        executable = jax.jit(fn).lower(*args).compile()
        return executable, time.perf_counter() - tic
    finally:
        simulation._loops_pay = stepping._loops_pay = chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, Jansen's leg only")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    names = ("jansen",) if args.quick else ("jansen", "scara")
    before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []
    for name, (system, p, q0, qd0) in models(names).items():
        for size in ("step", "single", 1, 16):
            fn, fargs = program(system, p, q0, qd0, size)
            contenders = {c: compiled(fn, fargs, c == "looped") for c in ("looped", "unrolled")}
            finals = {c: np.asarray(exe(*fargs)) for c, (exe, _) in contenders.items()}
            walls = {c: [] for c in contenders}
            for _ in range(rounds):
                for c, (exe, _) in contenders.items():
                    tic = time.perf_counter()
                    jax.block_until_ready(exe(*fargs))
                    walls[c].append(time.perf_counter() - tic)
            scenarios = size if isinstance(size, int) else 1
            row = {"model": name, "N": size, "steps": STEPS, "dt": DT, "solver": "RK4", "rounds": rounds}
            for c in contenders:
                row[c] = {
                    "us_per_step_per_scenario": float(np.median(walls[c])) / (STEPS * scenarios) * 1e6,
                    "walls_s": walls[c],
                    "compile_s": contenders[c][1],
                }
            row["unrolled_over_looped"] = (
                row["unrolled"]["us_per_step_per_scenario"] / row["looped"]["us_per_step_per_scenario"]
            )
            row["max_abs_final_q_difference"] = float(np.max(np.abs(finals["looped"] - finals["unrolled"])))
            rows.append(row)
            print(
                f"{name:7s} N={size!s:7s} looped {row['looped']['us_per_step_per_scenario']:7.1f} µs "
                f"(compile {row['looped']['compile_s']:.1f} s)  unrolled "
                f"{row['unrolled']['us_per_step_per_scenario']:7.1f} µs (compile "
                f"{row['unrolled']['compile_s']:.1f} s)  x{row['unrolled_over_looped']:.2f}  "
                f"|Δq| {row['max_abs_final_q_difference']:.1e}",
                flush=True,
            )
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = write_results(args.out, {"description": __doc__, "uptime_before": before, "uptime_after": after,
                                    "rows": rows})  # fmt: skip
    print(f"wrote {path}\n  before: {before}\n  after:  {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
