"""Cost of a loaded robot's rollout gradient with respect to its masses and inertias (issue 41).

The UR5 of example-robot-data (``ukjax.robots.load``; the file from the installed package, else from the
folder ``UKJAX_ROBOT_DATA`` names), ``--scenarios`` scenarios (q, q̇ uniform in ±1), RK4 at a fixed step
``--dt`` for ``--steps`` steps (``simulate_batch``), float64. Timed interleaved (forward, gradient, forward,
gradient, ...; medians of ``--repeats``), compilation excluded and reported:

* **forward**: the loss L = mean over scenarios of |q(t1)|², from one ``simulate_batch``;
* **reverse**: L and its gradient with respect to the 6 link masses and 6 inertia tensors
  (``jax.value_and_grad`` through diffrax's default ``RecursiveCheckpointAdjoint``);
* **reverse, autodiff** (``--baseline autodiff``): the same gradient with automatic differentiation through
  the articulated-body pass (``ukjax.multibody._CLOSED_FORM_DERIVATIVES = False`` while the system is built),
  the engine before its derivatives in closed form (Carpentier & Mansard 2018);
* **breakdown** (``--breakdown``, its own ``--out``): where the gradient's time goes, per right-hand-side
  evaluation of the batch (``System.motion`` under ``jax.vmap``, the recursions unrolled as
  ``simulate_batch`` traces them): its forward time and its pullback with respect to (q, q̇, masses,
  inertias) with the closed-form and the autodiff derivatives; the recursive Newton-Euler algorithm
  (``Tree.inverse_dynamics``) and its pullback, which the closed form transposes; and the same rollout as a
  plain RK4
  ``lax.scan`` with every step rematerialized (``jax.checkpoint``), forward and gradient, the floor without
  diffrax's loop;
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
from ukjax import multibody, robots

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
    parser.add_argument("--baseline", choices=["autodiff"], default=None,
                        help="also time the gradient by automatic differentiation through the "
                        "articulated-body pass")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the right-hand side's forward and pullbacks and a plain RK4 scan instead")
    parser.add_argument("--out", default="benchmarks/results/robot-gradient-cpu.json")
    args = parser.parse_args(argv)

    robot = robots.load(robot_file("ur5"))
    system, params = robot.system(), robot.params
    multibody._CLOSED_FORM_DERIVATIVES = False  # read by Tree.system: the baseline's articulated-body solve
    autodiff_system = robot.system()
    multibody._CLOSED_FORM_DERIVATIVES = True
    rng = np.random.default_rng(0)
    q0 = jnp.asarray(rng.uniform(-1.0, 1.0, (args.scenarios, robot.n)))
    qd0 = jnp.asarray(rng.uniform(-1.0, 1.0, (args.scenarios, robot.n)))
    t1 = args.steps * args.dt

    def loss(tuned, adjoint=None, system=system):
        p = dict(params, mass=tuned["mass"], inertia=tuned["inertia"])
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=args.dt, solver=ukjax.RK4(),
                                   adjoint=adjoint)  # fmt: skip
        return jnp.mean(jnp.sum(sol.q[:, -1] ** 2, axis=-1))

    tuned = {"mass": params["mass"], "inertia": params["inertia"]}
    if args.breakdown:
        return breakdown(args, robot, {"closed form": system, "autodiff": autodiff_system}, tuned, q0, qd0)
    programs = {"forward": jax.jit(loss), "reverse": jax.jit(jax.value_and_grad(loss))}
    if args.baseline == "autodiff":
        programs["reverse_autodiff"] = jax.jit(jax.value_and_grad(lambda x: loss(x, system=autodiff_system)))
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
    if "reverse_autodiff" in compiled:
        _, reference = compiled["reverse_autodiff"](tuned)
        scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(reference))
        pairs = zip(jax.tree.leaves(grad), jax.tree.leaves(reference), strict=True)
        gradient_difference = max(float(jnp.max(jnp.abs(a - b))) / scale for a, b in pairs)
        print(f"closed-form against autodiff gradient: {gradient_difference:.1e} (of the largest entry)")
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
        **({"closed_form_against_autodiff_gradient": gradient_difference} if "reverse_autodiff" in compiled
           else {}),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    for name, ratio in result["grad_over_forward"].items():
        print(f"{name}: {median[name]:.3f} s, {ratio:.2f}x the forward pass ({median['forward']:.3f} s)")
    print(f"dL/dm1: reverse {result['dL_dmass1']['reverse']:.6e}, central difference {central:.6e}")
    write_results(args.out, result)
    return result


def breakdown(args, robot, systems, tuned, q0, qd0) -> dict:
    """Per right-hand-side evaluation: forward, and pullbacks by either derivative; and a plain RK4 scan."""
    params = robot.params

    def right_hand_side(system):
        def f(q, qd, tuned):
            p = dict(params, **tuned)
            with multibody.unrolled_recursions():  # as simulate_batch traces an unconstrained batch
                return jax.vmap(lambda q, qd: system.motion(q, qd, 0.0, p).qdd)(q, qd)

        return f

    cotangent = jnp.ones_like(q0)
    f = right_hand_side(systems["closed form"])
    programs = {"right-hand side": (jax.jit(f), (q0, qd0, tuned))}
    def pullback(g):
        return lambda q, qd, t: jax.vjp(g, q, qd, t)[1](cotangent)

    for name, system in systems.items():
        programs[f"pullback, {name}"] = (jax.jit(pullback(right_hand_side(system))), (q0, qd0, tuned))

    def newton_euler(q, qd, tuned):  # M q̈ + C at q̈ = cotangent: the RNEA the closed-form rule differentiates
        bodies, gravity = robot.bodies(dict(params, **tuned)), robot.gravity(params)
        one = lambda q, qd, a: robot.tree.inverse_dynamics(q, qd, a, bodies, gravity)  # noqa: E731
        with multibody.unrolled_recursions():
            return jax.vmap(one)(q, qd, cotangent)

    programs["Newton-Euler"] = (jax.jit(newton_euler), (q0, qd0, tuned))
    programs["Newton-Euler pullback"] = (jax.jit(pullback(newton_euler)), (q0, qd0, tuned))

    def scan_loss(tuned):
        def step(y, _):
            def rate(y):
                return (y[1], f(y[0], y[1], tuned))

            k1 = rate(y)
            k2 = rate(jax.tree.map(lambda a, b: a + args.dt / 2 * b, y, k1))
            k3 = rate(jax.tree.map(lambda a, b: a + args.dt / 2 * b, y, k2))
            k4 = rate(jax.tree.map(lambda a, b: a + args.dt * b, y, k3))
            rk4 = lambda a, b1, b2, b3, b4: a + args.dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4)  # noqa: E731
            return jax.tree.map(rk4, y, k1, k2, k3, k4), None

        y, _ = jax.lax.scan(jax.checkpoint(step), (q0, qd0), None, length=args.steps)
        return jnp.mean(jnp.sum(y[0] ** 2, axis=-1))

    programs["RK4 scan, forward"] = (jax.jit(scan_loss), (tuned,))
    programs["RK4 scan, gradient"] = (jax.jit(jax.value_and_grad(scan_loss)), (tuned,))
    compiled = {name: (fn.lower(*a).compile(), a) for name, (fn, a) in programs.items()}
    load_before = os.getloadavg()
    times = {name: [] for name in compiled}
    for _ in range(args.repeats):
        for name, (fn, a) in compiled.items():
            calls = 1 if name.startswith("RK4") else 20
            jax.block_until_ready(fn(*a))
            tic = time.perf_counter()
            for _ in range(calls):
                out = fn(*a)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - tic) / calls)
    median = {name: float(np.median(t)) for name, t in times.items()}
    forward = median["right-hand side"]
    result = {
        "robot": {"name": robot.name, "n": robot.n},
        "scenarios": args.scenarios,
        "steps": args.steps,
        "dt": args.dt,
        "median_s": median,
        "all_s": times,
        "over_right_hand_side": {k: v / forward for k, v in median.items() if not k.startswith("RK4")},
        "scan_gradient_over_forward": median["RK4 scan, gradient"] / median["RK4 scan, forward"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    for name, seconds in median.items():
        print(f"{name}: {seconds * 1e3:.3f} ms" + (f" ({seconds / forward:.2f}x the right-hand side)"
                                                   if not name.startswith("RK4") else ""))  # fmt: skip
    print(f"RK4 scan: gradient {result['scan_gradient_over_forward']:.2f}x the forward")
    write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
