"""Where one scenario's time per step goes on the CPU: the UR5 of example-robot-data, RK4 at 1 ms, float64,
against MuJoCo's ``rollout`` on the same file (issue 41).

Contenders, interleaved in every round (medians over rounds; µs per RK4 step, 4 right-hand sides):

* ``rhs_*``: the right-hand side alone, q̈ = ``system.acceleration`` (RNEA bias force, ABA M⁻¹), evaluated
  ``--evals`` times in one compiled ``lax.fori_loop`` (no dispatch; the state nudged by 1e-9 q̈ so nothing
  is hoisted), reported per evaluation and x4 per step;
* ``bare_rk4_*``: a ``lax.fori_loop`` of classical RK4 steps of the same right-hand side, nothing else;
* ``diffrax_bare_*``: ``diffrax.diffeqsolve`` with ``ukjax.RK4()`` and ``ConstantStepSize``,
  ``SaveAt(t1=True)``, no event, no diagnostics;
* ``simulate_*``: ``ukjax.simulate(..., dt=, solver=ukjax.RK4(), ts=[t1])`` inside one ``jax.jit``
  (``_solve_traced``: SaveAt(ts), the non-finite Event, the diagnostics at the save);
* ``mujoco_rk4``: ``mujoco.rollout`` of one scenario with ``mjINT_RK4``, one thread, constraints off.

Suffixes: ``scan`` = the engine as shipped (q̈ and M⁻¹Aᵀ from one articulated-body pass with velocities,
Featherstone 2008 Table 7.1, a ``lax.scan`` over the joints on the CPU), ``rnea_aba`` = the engine before it
(Q = τ - C by RNEA, then M⁻¹ by the articulated-body algorithm: ``ukjax.multibody._ONE_PASS = False``),
``unrolled`` = the shipped engine with the joint loops unrolled (``unroll=True``, what the GPU gets). Each
variant is traced after ``jax.clear_caches()`` with its setting, then all are timed in the same rounds.
``uptime`` before and after and the load average per round go to the JSON with the machine and versions.

    python3 benchmarks/robot_step_cpu.py            # 500 steps, 5 rounds
    python3 benchmarks/robot_step_cpu.py --quick    # 100 steps, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
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
from _common import HOMES, hlo_computations, machine_info, robot_states, write_results  # noqa: E402
from robots_speed import mujoco_model  # noqa: E402
from scaling import MujocoRollout  # noqa: E402

UR5 = "ur_description/urdf/ur5_robot.urdf"


def ur5_path() -> Path:
    """The UR5 URDF: from ``$UKJAX_ROBOT_DATA`` or the installed example-robot-data
    (:func:`ukjax.studies._common.example_robot_file`), else the repository's ``.robots`` copy of its
    wheel."""
    from ukjax.studies._common import example_robot_file

    try:
        return example_robot_file(UR5)
    except FileNotFoundError:
        copy = Path(__file__).resolve().parent.parent / ".robots/cmeel.prefix/share/example-robot-data/robots"
        if (copy / UR5).is_file():
            return copy / UR5
        raise


def variant(name: str):
    """Set the engine's switches for variant ``name`` and drop JAX's caches (the inner jits of
    ``System.motion`` are cached per system, not per switch)."""
    multibody._ONE_PASS = name != "rnea_aba"
    if name == "unrolled":
        multibody._scan_per_platform = lambda step, init, xs, reverse: multibody._scanned(
            step, init, xs, reverse, unroll=True
        )
    else:
        multibody._scan_per_platform = _LOOPED
    jax.clear_caches()


_LOOPED = multibody._scan_per_platform


_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
_INSTRUCTION = re.compile(r"\s([a-z][\w-]*)\((?:%|\)|\d)")
_WHILE = re.compile(r"condition=%?([\w.-]+), body=%?([\w.-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def kernels_per_call(hlo: str) -> int:
    """How many kernels (XLA:CPU thunks: every instruction but parameters, constants, tuples and bitcasts)
    one call of a compiled program runs: its entry computation's, plus each ``while`` loop's body and
    condition times the loop's trip count (known to XLA for ``lax.scan``), nested loops included. A small
    loop that XLA:CPU compiles into one function (a ``call`` marked ``xla_cpu_small_call``) is one kernel."""
    entry, computations = hlo_computations(hlo)

    def count(name: str) -> int:
        total = 0
        for line in computations[name]:
            kind = _INSTRUCTION.search(line.split(" = ", 1)[-1]) if " = " in line else None
            if kind is None or kind.group(1) in _FREE:
                continue
            total += 1
            if kind.group(1) == "while":
                condition, body = _WHILE.search(line).groups()
                trips = _TRIPS.search(line)
                if trips is None:
                    raise ValueError(f"a while loop of unknown trip count: {line.strip()[:120]}")
                total += int(trips.group(1)) * (count(body) + count(condition))
        return total

    return count(entry)


def programs(system, params, q0, qd0, dt, steps, evals):
    """name -> (compiled thunk, compile seconds, steps it stands for (µs per step = wall / steps))."""
    rhs = lambda q, qd: system.acceleration(q, qd, 0.0, params)

    def loop_rhs(q, qd):
        body = lambda i, c: (c[0] + 1e-9 * c[1], c[1] + 1e-9 * rhs(*c))
        return jax.lax.fori_loop(0, evals, body, (q, qd))

    def f(y):
        return (y[1], rhs(*y))

    def rk4(q, qd):
        def step(i, y):
            k1 = f(y)
            k2 = f(jax.tree.map(lambda a, b: a + 0.5 * dt * b, y, k1))
            k3 = f(jax.tree.map(lambda a, b: a + 0.5 * dt * b, y, k2))
            k4 = f(jax.tree.map(lambda a, b: a + dt * b, y, k3))
            combine = lambda a, b1, b2, b3, b4: a + dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4)
            return jax.tree.map(combine, y, k1, k2, k3, k4)

        return jax.lax.fori_loop(0, steps, step, (q, qd))

    def diffrax_bare(q, qd):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: f(y)), ukjax.RK4(), 0.0, steps * dt, dt, (q, qd),
            saveat=diffrax.SaveAt(t1=True), stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=steps + 1,
        )
        return sol.ys

    def simulate(q, qd):
        t1 = steps * dt
        sol = ukjax.simulate(system, q, qd, params, t1=t1, ts=jnp.asarray([t1]), dt=dt, solver=ukjax.RK4(),
                             max_steps=steps + 1)
        return sol.q[-1], sol.qd[-1]

    out = {"kernels_per_evaluation": kernels_per_call(jax.jit(rhs).lower(q0, qd0).compile().as_text())}
    for label, fn, per in [("rhs", loop_rhs, evals / 4), ("bare_rk4", rk4, steps),
                           ("diffrax_bare", diffrax_bare, steps), ("simulate", simulate, steps)]:
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(q0, qd0).compile()
        out[label] = (lambda c=compiled: c(q0, qd0), time.perf_counter() - start, per)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--evals", type=int, default=2000, help="right-hand sides per rhs_* run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=["scan", "rnea_aba", "unrolled"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "robot-step-cpu.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.evals, args.rounds = 100, 400, 2
    import mujoco

    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = ur5_path()
    robot = robots.load(path)
    params = robot.params
    q0s, qd0s = robot_states(robot, HOMES["ur5"], 1, 0)
    q0, qd0 = q0s[0], qd0s[0]
    contenders, compile_s, finals, kernels = {}, {}, {}, {}
    for name in args.variants:
        variant(name)
        system = robot.system()  # built under the variant's switches (Tree.system reads _ONE_PASS)
        built = programs(system, params, q0, qd0, args.dt, args.steps, args.evals)
        kernels[name] = built.pop("kernels_per_evaluation")
        for label, (run, seconds, per) in built.items():
            contenders[f"{label}_{name}"] = (run, per)
            compile_s[f"{label}_{name}"] = seconds
            print(f"compiled {label}_{name} in {seconds:.1f} s", flush=True)
    variant(args.variants[0])
    model, _ = mujoco_model(path, args.dt)
    rollout = MujocoRollout(model, q0s, qd0s, args.steps, 1)
    contenders["mujoco_rk4"] = (lambda: rollout.run(args.steps), args.steps)
    for run, _ in contenders.values():
        jax.block_until_ready(run())  # first calls untimed
    walls = {name: [] for name in contenders}
    cpus = {name: [] for name in contenders}
    loads = []
    for r in range(args.rounds):
        for name, (run, _) in contenders.items():
            start, cpu = time.perf_counter(), time.process_time()
            finals[name] = jax.block_until_ready(run())
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu)
        loads.append(os.getloadavg())
        print(f"round {r + 1}/{args.rounds} load {loads[-1]}", flush=True)
    rows = {}
    for name, (_, per) in contenders.items():
        median = statistics.median(walls[name])
        rows[name] = {"us_per_step": median / per * 1e6, "walls_s": walls[name],
                      "compile_s": compile_s.get(name),
                      "cpu_per_wall": statistics.median(
                          c / w for c, w in zip(cpus[name], walls[name], strict=True))}
        if name.startswith("rhs_"):
            rows[name]["us_per_evaluation"] = median / (4 * per) * 1e6
            rows[name]["kernels_per_evaluation"] = kernels[name[4:]]
            rows[name]["ns_per_kernel"] = rows[name]["us_per_evaluation"] * 1e3 / kernels[name[4:]]
    mj = rows["mujoco_rk4"]["us_per_step"]
    for row in rows.values():
        row["x_mujoco"] = row["us_per_step"] / mj
    q_mj = rollout.positions(finals["mujoco_rk4"])[0]
    agreement = {
        name: float(np.max(np.abs(np.asarray(finals[name][0]) - q_mj)))
        for name in contenders if not name.startswith(("rhs_", "mujoco"))
    }
    payload = {
        "description": (
            f"UR5 ({UR5}), one scenario, RK4 at {args.dt} s for {args.steps} steps, float64, XLA CPU default "
            f"flags; medians of {args.rounds} interleaved rounds; µs per RK4 step (rhs_*: 4 evaluations)"
        ),
        "config": vars(args),
        "robot_file": str(path),
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "load_per_round": loads,
        "rows": rows,
        "max_final_q_difference_rad": agreement,
        "machine": machine_info(),
        "versions": {"jax": jax.__version__, "diffrax": diffrax.__version__, "mujoco": mujoco.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
    }
    write_results(args.out, payload)
    print(f"{'contender':<26}{'µs/step':>10}{'x MuJoCo':>10}{'compile s':>11}")
    for name, row in rows.items():
        compile_text = "" if row["compile_s"] is None else f"{row['compile_s']:.1f}"
        print(f"{name:<26}{row['us_per_step']:>10.2f}{row['x_mujoco']:>10.2f}{compile_text:>11}")
    print("max |Δq| vs MuJoCo (rad):", agreement)
    print("before:", uptime_before, "\nafter: ", payload["uptime_after"])
    return payload


if __name__ == "__main__":
    main()
