"""Speed per step on Jansen's Strandbeest leg (``ukjax/studies/data/jansen_leg.xml``): ukjax against MuJoCo on
the same file, RK4 like for like.

Contenders, interleaved in one process (each round runs every contender once; medians over rounds), on the
same scenarios, span and fixed step:

(a) ``ukjax_rk4``: :func:`ukjax.simulate_batch` with :class:`ukjax.RK4` of the driven leg of ``ukjax run
    jansen`` (:func:`ukjax.studies.jansen.leg_system`): the tree of 7 hinges loaded from the file, its three
    ``connect`` loops (one constraint, ``Robot.loop_constraint``) and the crank drive q_crank = ω t as exact
    Baumgarte-stabilized constraints (10 rows of rank 7, the default method), float64;
    ``ukjax_rk4_autodiff`` (``--baseline autodiff``): the same loop constraint with A = ∂φ/∂q and the
    velocity product by automatic differentiation of φ (a plain ``Holonomic`` of the same φ: the engine
    before A and J̇q̇ came from the tree's point kinematics, ``Tree.point_motion``); ``ukjax_rk4_aba``
    (``--baseline aba``): the same system with its UK solve by the articulated-body algorithm instead of its
    dense M (the engine before ``System._dense_mass_pays``); ``ukjax_rk4_<D>devices`` (``--cpu-devices D``,
    D > 1): ``simulate_batch`` called as users call it in a process of D CPU devices
    (``ukjax.use_cpu_cores``), which splits the batch over them (scaling.py's ``split_contenders``).
(b) ``mujoco_rk4``: ``mujoco.rollout`` of the same file with MuJoCo's RK4 (its integrator in the file), the
    loops as MuJoCo's soft equality constraints (default solref/solimp), the crank held at ω by the file's
    velocity actuator (ctrl = ω), ``--mujoco-threads`` threads (default 1; the JAX contender uses the cores
    as XLA sees fit, so the CPU seconds are recorded beside the wall time).

Scenarios: N crank speeds ω evenly spread over [π, 3π] rad/s (N = 1: 2π), from the compiled configuration with
consistent joint rates. Both contenders run the same scenarios for the same number of steps; a contender
whose full span is estimated above ``--budget-s`` runs fewer steps (scaling.py's ``cap_steps``), and the cost
per step per scenario is what is compared. Reported per batch size N: µs per step per scenario (median
wall time / (steps × N)), CPU µs likewise, compile time, and the largest connect gap |x₁ - x₂| over the
batch at the end of each contender's span (ukjax: exact loops, MuJoCo: soft). ``uptime`` is recorded before
and after.

    python3 benchmarks/jansen_speed.py --quick     # N = 1, 64; a few minutes
    python3 benchmarks/jansen_speed.py             # N = 1, 64, 1024
    python3 benchmarks/jansen_speed.py --batch 1024 --cpu-devices 2 --mujoco-threads 2   # both cores each
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax.constraints import Holonomic
from ukjax.studies import jansen

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RunMeter, add_cpu_devices_argument, add_rollout_arguments, use_cpu_devices  # noqa: E402
from scaling import (  # noqa: E402
    MujocoRollout,
    cap_steps,
    compile_jit,
    interleaved_row,
    run_interleaved,
    split_contenders,
    ukjax_batch,
)
from throughput import _write_interleaved  # noqa: E402

ALPHA = BETA = 20.0  # the study's Baumgarte gains (1/s)


def scenarios(robot, system, count: int):
    """(ω (N,), parameters with ω batched, q0s (N, 7), q̇0s (N, 7)): q̇ is linear in ω for the driven leg."""
    omegas = np.full(1, 2 * np.pi) if count == 1 else np.linspace(np.pi, 3 * np.pi, count)
    params = jansen.leg_params(robot, omega=2 * np.pi, alpha=ALPHA, beta=BETA)
    q0, qd0 = jansen.initial_state(system, params)
    qd0s = jnp.asarray(omegas[:, None] / (2 * np.pi)) * qd0[None, :]
    batch = dict(params, omega=jnp.asarray(omegas))
    return omegas, batch, jnp.tile(q0, (count, 1)), qd0s


def ukjax_gaps(robot, params, q_final) -> np.ndarray:
    loops = robot.equality_constraints()
    gap = jax.jit(
        jax.vmap(
            lambda q: jnp.max(jnp.linalg.norm(jnp.stack([c.value(q, 0.0, params) for c in loops]), axis=1))
        )
    )
    return np.asarray(gap(q_final))


def mujoco_gaps(mj: MujocoRollout, states) -> np.ndarray:
    mujoco, model, data = mj.mujoco, mj.model, mj.datas[0]
    out = []
    for state in states:
        mujoco.mj_setState(model, data, state, mj.spec)
        mujoco.mj_kinematics(model, data)
        out.append(np.max(np.linalg.norm(jansen.connect_gaps(mujoco, model, data), axis=1)))
    return np.asarray(out)


@contextlib.contextmanager
def _articulated_body_solve(forced: bool):
    """Programs traced inside solve a tree's UK equation by its articulated-body algorithm whatever its rows
    (``forced``; the engine before ``System._dense_mass_pays``)."""
    from ukjax.system import System

    shipped = System._dense_mass_pays
    if forced:
        System._dense_mass_pays = lambda self, *args: False
        jax.clear_caches()  # System.motion's compiled program of the same system was traced the other way
    try:
        yield
    finally:
        System._dense_mass_pays = shipped
        if forced:
            jax.clear_caches()


def measure(count: int, args, progress) -> dict:
    import mujoco

    robot = jansen.load_leg()
    system = jansen.leg_system(robot)
    omegas, params, q0s, qd0s = scenarios(robot, system, count)
    steps = int(round(args.span / args.dt))
    spec = {key: key == "omega" for key in params}
    fn = lambda q0, qd0, p, k: ukjax_batch(
        system, ukjax.RK4, q0, qd0, p, k, dt=args.dt, max_steps=steps + 1, batch_params=spec
    )
    compiled, compile_s = compile_jit(fn, q0s, qd0s, params, steps)
    progress(f"N={count}: compiled ukjax RK4 in {compile_s:.1f} s")
    before = f"ukjax_rk4_{args.baseline}"
    if args.baseline == "autodiff":
        # the engine before the loops' A and J̇q̇ came from the tree's point kinematics: the same φ, its
        # derivatives by automatic differentiation
        loop = robot.loop_constraint(jansen.STABILIZED)
        autodiff = Holonomic(phi=loop.phi, baumgarte=loop.baumgarte, name=loop.name)
        separate = robot.system(loops=False, baumgarte=jansen.STABILIZED,
                                constraints=(autodiff, jansen.crank_drive(jansen.STABILIZED)))  # fmt: skip
    else:  # the engine before a tree with as many rows as velocities solved with its dense M
        separate = system
    fn_separate = lambda q0, qd0, p, k: ukjax_batch(
        separate, ukjax.RK4, q0, qd0, p, k, dt=args.dt, max_steps=steps + 1, batch_params=spec
    )
    with _articulated_body_solve(args.baseline == "aba"):
        compiled_separate, compile_separate_s = compile_jit(fn_separate, q0s, qd0s, params, steps)
    progress(f"N={count}: compiled {before} in {compile_separate_s:.1f} s")
    start = time.perf_counter()
    model = mujoco.MjModel.from_xml_path(str(jansen.MODEL_FILE))
    model.opt.timestep = args.dt
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    control = np.asarray(omegas)[:, None, None]
    mj = MujocoRollout(
        model, q0s, qd0s, steps, args.mujoco_threads, control=control, compile_s=time.perf_counter() - start
    )
    contenders = {
        "ukjax_rk4": (lambda k: compiled(q0s, qd0s, params, k), compile_s),
        before: (lambda k: compiled_separate(q0s, qd0s, params, k), compile_separate_s),
        "mujoco_rk4": (lambda k: (mj.run(k), None), mj.compile_s),
    }
    splits = split_contenders(system, ukjax.RK4, q0s, qd0s, params, dt=args.dt, max_steps=steps + 1,
                              batch_params=spec)  # fmt: skip
    contenders |= splits
    split = next(iter(splits), None)  # its name, or None on one device
    planned = {name: cap_steps(run, steps, count, args) for name, (run, _) in contenders.items()}
    walls, cpus, finals = run_interleaved(contenders, planned, args.rounds, progress, f"N={count}")
    one_omega = dict(params, omega=params["omega"][0])
    gaps = {
        "ukjax_rk4": ukjax_gaps(robot, one_omega, finals["ukjax_rk4"][0]),
        before: ukjax_gaps(robot, one_omega, finals[before][0]),
        "mujoco_rk4": mujoco_gaps(mj, finals["mujoco_rk4"][0]),
    }
    if split is not None:
        gaps[split] = ukjax_gaps(robot, one_omega, finals[split][0])
    rows = {}
    for name in contenders:
        ran = planned[name][0]
        rows[name] = {
            **interleaved_row(walls[name], cpus[name], ran, steps, count, contenders[name][1]),
            "span_s": ran * args.dt,
            "max_connect_gap_m": float(np.max(gaps[name])),
        }
    status = finals["ukjax_rk4"][1]
    rows["ukjax_rk4"]["not_success"] = int(np.sum(np.asarray(status) != int(ukjax.RESULTS.success)))
    cost = {name: row["us_per_step_per_scenario"] for name, row in rows.items()}
    one, each = (np.asarray(finals[name][0]) for name in ("ukjax_rk4", before))
    # the same steps (a contender above the budget runs fewer): the same trajectories up to round-off
    same_span = planned["ukjax_rk4"][0] == planned[before][0]
    same = float(np.max(np.abs(one - each))) if same_span else None
    out = {"batch": count, "contenders": rows, "mujoco_over_ukjax": cost["mujoco_rk4"] / cost["ukjax_rk4"],
           "before_over_now": cost[before] / cost["ukjax_rk4"], "baseline": args.baseline,
           "max_abs_dq_now_vs_before": same}  # fmt: skip
    if split is not None:
        out[f"mujoco_over_{split}"] = cost["mujoco_rk4"] / cost[split]
        same_span = planned["ukjax_rk4"][0] == planned[split][0]
        out["max_abs_dq_split_vs_one_device"] = (
            float(np.max(np.abs(one - np.asarray(finals[split][0])))) if same_span else None
        )
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_arguments(
        parser, span=1.0, rounds=3, budget_s=20.0, probe_steps=50, quick="N = 1, 64 and 2 rounds",
        out="benchmarks/results/jansen-speed-<machine>.json",
    )
    parser.add_argument("--mujoco-threads", type=int, default=1, help="mujoco.rollout threads (default 1)")
    parser.add_argument("--baseline", choices=("autodiff", "aba"), default="autodiff",
                        help="the second ukjax contender: the loops' derivatives by autodiff, or the UK "
                        "solve by the articulated-body algorithm instead of the dense M (the engines before)")
    add_cpu_devices_argument(parser)
    args = parser.parse_args(argv)
    use_cpu_devices(args)
    if args.quick:
        args.batch, args.rounds = [1, 64], 2
    import mujoco

    before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    meter = RunMeter()
    rows = [measure(count, args, lambda text: print(text, flush=True)) for count in args.batch]
    description = (
        "Jansen leg (7 hinges, 3 connect loops, crank at constant speed), ukjax simulate_batch RK4 (exact "
        "loops and drive, float64) vs mujoco.rollout RK4 (soft loops, velocity actuator) on the same file, "
        f"fixed step {args.dt} s over {args.span} s, contenders interleaved ({args.rounds} rounds, medians); "
        "cost = wall time / (steps x scenarios)"
    )
    results = {**meter.record(), "mujoco_version": mujoco.__version__, "rows": rows}
    payload = _write_interleaved(args, results, description, "jansen-speed-{machine}.json", before)
    print(
        f"{'N':>6} {'ukjax µs/step/sc':>17} {'MuJoCo µs/step/sc':>18} {'MuJoCo/ukjax':>13} {'gaps (m)':>20}"
    )
    for row in rows:
        uk, mj = row["contenders"]["ukjax_rk4"], row["contenders"]["mujoco_rk4"]
        costs = f"{uk['us_per_step_per_scenario']:>17.2f} {mj['us_per_step_per_scenario']:>18.2f}"
        gaps = f"{uk['max_connect_gap_m']:>9.1e} {mj['max_connect_gap_m']:>9.1e}"
        print(f"{row['batch']:>6} {costs} {row['mujoco_over_ukjax']:>13.2f} {gaps}")
    return payload


if __name__ == "__main__":
    main()
