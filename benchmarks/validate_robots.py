"""Robots loaded by ukjax.robots against Pinocchio and MuJoCo: UR5 and Panda from example-robot-data, and
the MJCF models of dm-control's suite (cheetah, walker, hopper, humanoid, swimmer, acrobot, cartpole).

For each robot, at STATES random states (q uniform inside the joint ranges, clipped to ±π; q̇ and τ uniform
in ±1 rad/s and ±1 N m), the maximum over states of the relative error (max |a - b| / max |b|) of

* against Pinocchio (``pinocchio.buildModelFromUrdf`` of the same URDF, a parser and recursions that share
  nothing with ukjax or MuJoCo): the mass matrix (``crba``, mirrored), the bias force with gravity (``rnea``
  at q̈ = 0) and the unconstrained forward dynamics (``aba``) with a random τ, compared with the tree's
  ``mass_matrix``, ``bias_force`` and ``forward_dynamics`` (no damping, no armature: Pinocchio's ABA has
  none);
* against MuJoCo (the URDF compiled by MuJoCo directly, its static links fused by MuJoCo, constraints
  disabled): ``mj_fullM``, ``qfrc_bias`` and ``qacc`` with the same τ as ``qfrc_applied``, compared with
  ``robot.system(loops=False)`` (MuJoCo's joint damping included as ukjax's damping force).

The dm-control MJCF files, as shipped in the dm-control package, are loaded by ukjax.robots and compared
with MuJoCo's own compilation of the same file (constraints disabled: contacts, limits, friction loss):
``mj_fullM`` (armature included), ``qfrc_bias`` and ``qacc`` with a random τ as ``qfrc_applied`` (damping
included). Joint springs and MuJoCo's fluid forces are not mapped by ukjax.robots (it warns of springs), so
MuJoCo's stiffness, density and viscosity are set to zero for the comparison and the JSON lists what was
removed. q is drawn by ``mj_integratePos`` from the model's ``qpos0`` along a random velocity (so quaternions
stay unit), q̇ and τ uniform in ±1. A file the loader refuses is listed with the reason (the quadruped's
tendon equalities).

Joint order is checked by name: Pinocchio's joint names and MuJoCo's must equal ``robot.joint_names``. The
URDFs reference meshes by package:// paths; ukjax.robots removes the visual and collision elements before
compiling, and so does this script for MuJoCo's own compilation. Panda's second finger mimics the first in
the URDF: MuJoCo turns that into a joint equality, which ``loops=False`` leaves out (Pinocchio ignores mimic
tags too), so all compare the 9 independent joints.

    python3 benchmarks/validate_robots.py                   # 20 states each
    python3 benchmarks/validate_robots.py --states 3 --out /tmp/validate.json
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

import ukjax  # noqa: E402
from ukjax import robots  # noqa: E402
from ukjax.studies._common import example_robot_file  # noqa: E402

ukjax.enable_float64()

HERE = Path(__file__).resolve().parent
ROBOTS = {
    "ur5": "ur_description/urdf/ur5_robot.urdf",
    "panda": "panda_description/urdf/panda.urdf",
}
# float64 recursions over 6-9 bodies agree to ~1e-15 relative; 1e-10 flags any modelling difference
TOLERANCE = 1e-10


def relative_error(a, b) -> float:
    b = np.asarray(b)
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


def record_mujoco(errors: dict, model, data, M, C, qacc) -> None:
    """Run ``mj_forward`` at the state in ``data`` and raise the running maxima ``errors["mujoco_M"]``,
    ``["mujoco_bias"]`` and ``["mujoco_qacc"]`` to the relative errors of ukjax's M, bias force C and q̈
    against MuJoCo's ``mj_fullM``, ``qfrc_bias`` and ``qacc``."""
    import mujoco

    mujoco.mj_forward(model, data)
    M_mj = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, M_mj)
    for key, ours, theirs in (("mujoco_M", M, M_mj), ("mujoco_bias", C, data.qfrc_bias),
                              ("mujoco_qacc", qacc, data.qacc)):  # fmt: skip
        errors[key] = max(errors[key], relative_error(ours, theirs))


def mujoco_urdf_model(path: Path):
    """MuJoCo's own compilation of a URDF (its static links fused by MuJoCo), without the visual and
    collision elements (their meshes sit behind package:// paths)."""
    import mujoco

    text = re.sub(r"<(visual|collision)\b.*?</\1>", "", path.read_text(), flags=re.S)
    return mujoco.MjModel.from_xml_string(text)


def compare(name: str, path: Path, states: int, seed: int) -> dict:
    import mujoco
    import pinocchio

    robot = robots.load(path)
    system = robot.system(loops=False)
    tree_terms = jax.jit(
        lambda q, qd, tau, p: (
            robot.tree.mass_matrix(q, robot.bodies(p)),
            robot.tree.bias_force(q, qd, robot.bodies(p), robot.gravity(p)),
            robot.tree.forward_dynamics(q, qd, tau, robot.bodies(p), robot.gravity(p)),
        )
    )
    system_terms = jax.jit(
        lambda q, qd, tau, p: (
            system.mass(q, 0.0, p),
            system.acceleration(q, qd, 0.0, p, force=system.force(q, qd, 0.0, p) + tau),
        )
    )

    pin_model = pinocchio.buildModelFromUrdf(str(path))
    pin_data = pin_model.createData()
    pin_names = tuple(pin_model.names[1:])
    mj_model = mujoco_urdf_model(path)
    mj_model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    mj_data = mujoco.MjData(mj_model)
    mj_names = tuple(mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(mj_model.njnt))
    if pin_names != robot.joint_names or mj_names != robot.joint_names:
        raise AssertionError(
            f"{name}: joint order differs: ukjax {robot.joint_names}, Pinocchio {pin_names}, "
            f"MuJoCo {mj_names}"
        )

    rng = np.random.default_rng(seed)
    ranges = np.clip(np.array(robot.joint_range), -np.pi, np.pi)
    errors = {
        key: 0.0
        for key in (
            "pinocchio_M",
            "pinocchio_bias",
            "pinocchio_aba",
            "mujoco_M",
            "mujoco_bias",
            "mujoco_qacc",
        )
    }
    start = time.perf_counter()
    for _ in range(states):
        q = rng.uniform(ranges[:, 0], ranges[:, 1])
        qd, tau = rng.uniform(-1.0, 1.0, robot.n), rng.uniform(-1.0, 1.0, robot.n)
        M, C, qdd = (np.asarray(x) for x in tree_terms(q, qd, tau, robot.params))
        M_system, qacc = (np.asarray(x) for x in system_terms(q, qd, tau, robot.params))

        M_pin = pinocchio.crba(pin_model, pin_data, q)
        M_pin = np.triu(M_pin) + np.triu(M_pin, 1).T
        errors["pinocchio_M"] = max(errors["pinocchio_M"], relative_error(M, M_pin))
        C_pin = pinocchio.rnea(pin_model, pin_data, q, qd, np.zeros(robot.n))
        errors["pinocchio_bias"] = max(errors["pinocchio_bias"], relative_error(C, C_pin))
        qdd_pin = pinocchio.aba(pin_model, pin_data, q, qd, tau)
        errors["pinocchio_aba"] = max(errors["pinocchio_aba"], relative_error(qdd, qdd_pin))

        mj_data.qpos[:], mj_data.qvel[:], mj_data.qfrc_applied[:] = q, qd, tau
        record_mujoco(errors, mj_model, mj_data, M_system, C, qacc)
    return {
        "urdf": ROBOTS[name],
        "n": robot.n,
        "joints": list(robot.joint_names),
        "states": states,
        "max_relative_error": errors,
        "wall_s": time.perf_counter() - start,
        "passed": all(e < TOLERANCE for e in errors.values()),
    }


MJCF_MODELS = ("cheetah", "walker", "hopper", "humanoid", "swimmer", "acrobot", "cartpole", "quadruped")


def dm_control_suite() -> Path | None:
    """The folder of dm-control's suite MJCF files, or None where dm-control is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("dm_control")
    return None if spec is None else Path(spec.submodule_search_locations[0]) / "suite"


def compare_mjcf(name: str, path: Path, states: int, seed: int) -> dict:
    import warnings

    import mujoco

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            robot = robots.load(path)
        except NotImplementedError as refusal:
            return {"mjcf": f"dm_control/suite/{path.name}", "refused": str(refusal), "passed": None}
    system = robot.system(loops=False)
    terms = jax.jit(
        lambda q, qd, tau, p: (
            system.mass(q, 0.0, p),
            robot.tree.bias_force(q, qd, robot.bodies(p), robot.gravity(p)),
            system.acceleration(q, qd, 0.0, p, force=system.force(q, qd, 0.0, p) + tau),
        )
    )
    model = mujoco.MjModel.from_xml_path(str(path))
    springs = [
        mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in np.flatnonzero(model.jnt_stiffness)
    ]
    model.jnt_stiffness[:] = 0.0
    fluid = {"density": float(model.opt.density), "viscosity": float(model.opt.viscosity)}
    model.opt.density = model.opt.viscosity = 0.0  # MuJoCo's fluid forces (the swimmer's) are not mapped
    model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    data = mujoco.MjData(model)
    if (model.nq, model.nv) != (system.nq, system.n):
        raise AssertionError(
            f"{name}: MuJoCo has nq, nv = {model.nq}, {model.nv}; ukjax {system.nq}, {system.n}"
        )
    rng = np.random.default_rng(seed)
    errors = {"mujoco_M": 0.0, "mujoco_bias": 0.0, "mujoco_qacc": 0.0}
    start = time.perf_counter()
    for _ in range(states):
        data.qpos[:] = model.qpos0
        mujoco.mj_integratePos(model, data.qpos, rng.uniform(-1.0, 1.0, model.nv), 1.0)
        data.qvel[:] = rng.uniform(-1.0, 1.0, model.nv)
        data.qfrc_applied[:] = rng.uniform(-1.0, 1.0, model.nv)
        data.ctrl[:] = 0.0
        M, C, qacc = (np.asarray(x) for x in terms(data.qpos, data.qvel, data.qfrc_applied, robot.params))
        record_mujoco(errors, model, data, M, C, qacc)
    return {
        "mjcf": f"dm_control/suite/{path.name}",
        "nq": system.nq,
        "n": system.n,
        "joints": list(robot.joint_names),
        "springs_not_mapped": springs,
        "fluid_not_mapped": fluid,
        "states": states,
        "max_relative_error": errors,
        "wall_s": time.perf_counter() - start,
        "passed": all(e < TOLERANCE for e in errors.values()),
    }


def run(states: int = 20, seed: int = 0) -> dict:
    results = {name: compare(name, example_robot_file(path), states, seed) for name, path in ROBOTS.items()}
    suite = dm_control_suite()
    if suite is None:
        print("dm-control is not installed (pip install -e '.[validate]'): its MJCF models are left out")
        return results
    for name in MJCF_MODELS:
        results[f"dm_control/{name}"] = compare_mjcf(name, suite / f"{name}.xml", states, seed)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--states", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=HERE / "results" / f"validate_robots-{jax.default_backend()}.json"
    )
    args = parser.parse_args()
    import mujoco
    import pinocchio

    results = run(args.states, args.seed)
    for name, result in results.items():
        if result.get("refused"):
            print(f"{name}: refused by the loader: {result['refused']}")
            continue
        errors = ", ".join(f"{k} {v:.1e}" for k, v in result["max_relative_error"].items())
        print(f"{name} (n = {result['n']}, {result['states']} states): {errors}")
    config = {
        "states": args.states,
        "seed": args.seed,
        "tolerance": TOLERANCE,
        "mujoco": mujoco.__version__,
        "pinocchio": pinocchio.__version__,
    }
    path = write_results(args.out, {"benchmark": "validate_robots", "config": config, "results": results})
    print(f"wrote {path}")
    if not all(result["passed"] is not False for result in results.values()):
        raise SystemExit(f"a relative error above {TOLERANCE}")


if __name__ == "__main__":
    main()
