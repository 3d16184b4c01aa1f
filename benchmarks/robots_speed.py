"""Speed per step of a loaded robot against MuJoCo on the same file: the UR5 or the Panda of
example-robot-data, RK4 like for like.

The URDF is loaded by ``ukjax.robots.load`` (``robot.system(loops=False)``: Q = -b q̇ - C(q, q̇), C by RNEA
with gravity, M⁻¹ by the articulated-body algorithm, Featherstone 2008, Tables 5.1 and 7.1) and compiled by
MuJoCo directly (``benchmarks/validate_robots.py``'s ``mujoco_urdf_model``: MuJoCo fuses the static links
itself). Passive dynamics: gravity and the URDF's joint damping, no contacts, no joint limits, no equalities
(MuJoCo's constraints disabled; the Panda's finger mimic equality left out of both), the same N initial states
(each hinge uniform in ±1 rad about a home pose and its rate in ±1 rad/s; each slide, the Panda's fingers, in
±1 cm and ±1 cm/s), the same fixed step and number of steps. Contenders, interleaved in every round (medians
over rounds):

* ``ukjax_rk4``: :func:`ukjax.simulate_batch` with ``solver=ukjax.RK4()`` (classical Runge-Kutta, 4
  evaluations per step) and a fixed ``dt``, one compiled program (``scaling.ukjax_batch``), float64;
* ``ukjax_rk4_<D>devices`` (with ``--cpu-devices D``, D > 1): the same ``simulate_batch`` called as users
  call it (not inside a ``jit``) in a process of D CPU devices (``ukjax.use_cpu_cores(D)``), which splits
  the batch into D equal shares integrated side by side; its largest final-angle difference from
  ``ukjax_rk4`` (one device) is recorded;
* ``mujoco_rk4_1thread`` and ``mujoco_rk4_<T>threads``: ``mujoco.rollout`` with ``opt.integrator =
  mjINT_RK4`` and one MjData per thread (``scaling.MujocoRollout``), float64.

Reported per batch size N (default 1, 64, 1024): µs per step per scenario (median wall time / (steps × N)),
compile time, the ratio MuJoCo / ukjax (above 1: ukjax is faster), and the largest difference of the final
joint angles between ukjax and MuJoCo (the same ODE and the same method: rounding, amplified by the motion).
``uptime`` before and after goes to the JSON with the machine and the versions.

    python3 benchmarks/robots_speed.py                  # UR5, N = 1, 64, 1024; 0.5 s at 1 ms
    python3 benchmarks/robots_speed.py --robot panda    # the Panda (9 coordinates: 7 hinges, 2 fingers)
    python3 benchmarks/robots_speed.py --quick          # N = 1, 8; 0.05 s
    python3 benchmarks/robots_speed.py --cpu-devices 2  # also the batch split over two CPU devices
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import ukjax
from ukjax import robots

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    HOMES,
    add_cpu_devices_argument,
    add_rollout_arguments,
    robot_states,
    use_cpu_devices,
)
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
from validate_robots import ROBOTS, mujoco_urdf_model  # noqa: E402

from ukjax.studies._common import example_robot_file  # noqa: E402

OUTPUTS = {"ur5": "robots_speed-cpu.json", "panda": "robots_speed-panda-cpu.json"}


def mujoco_model(path: Path, dt: float):
    import mujoco

    start = time.perf_counter()
    model = mujoco_urdf_model(path)
    model.opt.timestep = dt
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT | mujoco.mjtDisableBit.mjDSBL_CONTACT
    return model, time.perf_counter() - start


def measure(robot, path, count, args, progress):
    # MuJoCo's constraints are disabled, the Panda's finger mimic equality with them: ukjax leaves it out too
    system, params = robot.system(loops=False), robot.params
    q0s, qd0s = robot_states(robot, HOMES[args.robot], count, args.seed)
    steps = int(round(args.span / args.dt))
    contenders = {}
    fn = lambda q0, qd0, p, k: ukjax_batch(system, ukjax.RK4, q0, qd0, p, k, dt=args.dt, max_steps=steps + 1)
    compiled, compile_s = compile_jit(fn, q0s, qd0s, params, steps)
    contenders["ukjax_rk4"] = (lambda k: compiled(q0s, qd0s, params, k), compile_s)
    progress(f"N={count}: compiled ukjax RK4 in {compile_s:.1f} s")
    contenders |= split_contenders(system, ukjax.RK4, q0s, qd0s, params, dt=args.dt, max_steps=steps + 1)
    model, mj_compile_s = mujoco_model(path, args.dt)
    rollouts = {}
    for threads in sorted({1, args.threads}):
        name = f"mujoco_rk4_{threads}thread" + ("s" if threads > 1 else "")
        rollouts[name] = MujocoRollout(model, q0s, qd0s, steps, threads, mj_compile_s)
        contenders[name] = (lambda k, mj=rollouts[name]: (mj.run(k), None), mj_compile_s)
    planned = {name: cap_steps(run, steps, count, args) for name, (run, _) in contenders.items()}
    walls, cpus, finals = run_interleaved(contenders, planned, args.rounds, progress, f"N={count}")
    ours = [name for name in contenders if name.startswith("ukjax")]
    q_ukjax, status = (np.asarray(x) for x in finals["ukjax_rk4"])
    rows = {}
    for name in contenders:
        ran = planned[name][0]
        rows[name] = interleaved_row(walls[name], cpus[name], ran, steps, count, contenders[name][1])
        if name in rollouts:
            same = ran == planned["ukjax_rk4"][0]
            q_mj = rollouts[name].positions(finals[name][0])
            rows[name]["max_final_q_difference_rad"] = float(np.max(np.abs(q_mj - q_ukjax))) if same else None
    for name in ours:
        q, status = (np.asarray(x) for x in finals[name])
        rows[name]["not_success"] = int(np.sum(status != int(ukjax.RESULTS.success)))
        same = planned[name][0] == planned["ukjax_rk4"][0]
        difference = float(np.max(np.abs(q - q_ukjax))) if same else None
        rows[name]["max_final_q_difference_from_one_device"] = difference
    ratios = {
        f"{name} / {mine}": rows[name]["us_per_step_per_scenario"] / rows[mine]["us_per_step_per_scenario"]
        for mine in ours
        for name in rollouts
    }
    return {
        "scenarios": count,
        "steps": steps,
        "contenders": rows,
        "ratios": ratios,
        "load_average": os.getloadavg(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_arguments(
        parser, span=0.5, rounds=3, budget_s=60.0, probe_steps=5, quick="N = 1, 8; 0.05 s; 2 rounds",
        out="benchmarks/results/robots_speed-cpu.json (--robot panda: robots_speed-panda-cpu.json)",
    )
    parser.add_argument("--robot", choices=sorted(HOMES), default="ur5", help="example-robot-data's URDF")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="MuJoCo's 'all threads' count")
    parser.add_argument("--seed", type=int, default=0)
    add_cpu_devices_argument(parser)
    args = parser.parse_args(argv)
    use_cpu_devices(args)
    if args.quick:
        args.batch, args.span, args.rounds = [1, 8], 0.05, 2
    import mujoco

    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = example_robot_file(ROBOTS[args.robot])
    robot = robots.load(path)
    progress = lambda text: print(text, flush=True)
    rows = [measure(robot, path, count, args, progress) for count in args.batch]
    description = (
        f"{args.robot.upper()} (example-robot-data {ROBOTS[args.robot]}) passive dynamics under gravity, "
        "no contacts, limits or equalities; "
        f"RK4 at a fixed step of {args.dt} s for {args.span} s; ukjax.simulate_batch(solver=ukjax.RK4()) vs "
        "mujoco.rollout with mjINT_RK4 (one thread and all threads); the same initial states; medians of "
        f"{args.rounds} interleaved rounds; cost = wall time / (steps x scenarios)"
    )
    results = {
        "rows": rows,
        "mujoco_version": mujoco.__version__,
        "robot": {"name": robot.name, "n": robot.n},
    }
    payload = _write_interleaved(args, results, description, OUTPUTS[args.robot], uptime_before)
    print(f"{'N':>6}" + "".join(f"{name:>24}" for name in rows[0]["contenders"]) + f"{'max |Δq| rad':>14}")
    for row in rows:
        c = row["contenders"]
        diffs = [v.get("max_final_q_difference_rad") for v in c.values()]
        diff = max((d for d in diffs if d is not None), default=float("nan"))
        print(
            f"{row['scenarios']:>6}"
            + "".join(f"{v['us_per_step_per_scenario']:>21.3g} µs" for v in c.values())
            + f"{diff:>14.1e}"
        )
    return payload


if __name__ == "__main__":
    main()
