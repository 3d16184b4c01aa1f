"""Cost of a loaded robot's rollout gradient with respect to its masses and inertias (issue 41).

The UR5 of example-robot-data (``ukjax.robots.load``; the file from the installed package, else from the
folder ``UKJAX_ROBOT_DATA`` names), ``--scenarios`` scenarios (q, q̇ uniform in ±1), RK4 at a fixed step
``--dt`` for ``--steps`` steps (``simulate_batch``), float64. Timed interleaved (forward, gradient, forward,
gradient, ...; medians of ``--repeats``), compilation excluded and reported:

* **forward**: the loss L = mean over scenarios of |q(t1)|², from one ``simulate_batch``;
* **reverse**: L and its gradient with respect to the 6 link masses and 6 inertia tensors
  (``jax.value_and_grad`` through diffrax's default ``RecursiveCheckpointAdjoint``);
* **forward mode** (``--forward-mode``): the same gradient by ``jax.jacfwd`` with ``adjoint=ForwardMode()``:
  60 tangent directions (6 masses + 54 inertia entries), for comparison (slow: it had not finished after 23
  CPU-minutes at 1024 x 200).

Reports the gradient/forward wall-time ratios (target ≤ 3), compile times, the load average, and a central
difference of L along one mass as a check of the gradient.

    python3 benchmarks/robot_gradient.py                     # 1024 scenarios x 200 steps of 1 ms
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import robots

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402
from gpu_suite import robot_file  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--forward-mode", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/robot-gradient-cpu.json")
    args = parser.parse_args(argv)

    robot = robots.load(robot_file("ur5"))
    system, params = robot.system(), robot.params
    rng = np.random.default_rng(0)
    q0 = jnp.asarray(rng.uniform(-1.0, 1.0, (args.scenarios, robot.n)))
    qd0 = jnp.asarray(rng.uniform(-1.0, 1.0, (args.scenarios, robot.n)))
    t1 = args.steps * args.dt

    def loss(tuned, adjoint=None):
        p = dict(params, mass=tuned["mass"], inertia=tuned["inertia"])
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=args.dt, solver=ukjax.RK4(),
                                   adjoint=adjoint)  # fmt: skip
        return jnp.mean(jnp.sum(sol.q[:, -1] ** 2, axis=-1))

    tuned = {"mass": params["mass"], "inertia": params["inertia"]}
    programs = {"forward": jax.jit(loss), "reverse": jax.jit(jax.value_and_grad(loss))}
    if args.forward_mode:
        programs["forward_mode"] = jax.jit(lambda x: jax.jacfwd(lambda y: loss(y, diffrax.ForwardMode()))(x))
    compiled, compile_s = {}, {}
    for name, fn in programs.items():
        tic = time.perf_counter()
        compiled[name] = fn.lower(tuned).compile()
        compile_s[name] = time.perf_counter() - tic
        print(f"{name}: compiled in {compile_s[name]:.1f} s", flush=True)
    load_before = os.getloadavg()
    times = {name: [] for name in compiled}
    for _ in range(args.repeats):
        for name, fn in compiled.items():
            tic = time.perf_counter()
            jax.block_until_ready(fn(tuned))
            times[name].append(time.perf_counter() - tic)
    median = {name: float(np.median(t)) for name, t in times.items()}
    value, grad = compiled["reverse"](tuned)
    h = 1e-6 * float(params["mass"][1])
    bumped = lambda s: dict(tuned, mass=tuned["mass"].at[1].add(s * h))
    central = (float(compiled["forward"](bumped(1))) - float(compiled["forward"](bumped(-1)))) / (2 * h)
    result = {
        "robot": {"name": robot.name, "n": robot.n},
        "scenarios": args.scenarios,
        "steps": args.steps,
        "dt": args.dt,
        "solver": "RK4 (fixed step)",
        "compile_s": compile_s,
        "median_s": median,
        "all_s": times,
        "grad_over_forward": {k: v / median["forward"] for k, v in median.items() if k != "forward"},
        "target_ratio": 3.0,
        "dL_dmass1": {"reverse": float(grad["mass"][1]), "central_difference": central},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    for name, ratio in result["grad_over_forward"].items():
        print(f"{name}: {median[name]:.3f} s, {ratio:.2f}x the forward pass ({median['forward']:.3f} s)")
    print(f"dL/dm1: reverse {result['dL_dmass1']['reverse']:.6e}, central difference {central:.6e}")
    write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
