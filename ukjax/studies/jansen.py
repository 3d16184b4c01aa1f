"""Theo Jansen's Strandbeest leg from an MJCF file, its three closed loops as exact constraints.

The leg (Jansen 2007, the "holy numbers"; ``ukjax/studies/data/jansen_leg.xml``) is a planar linkage of seven
moving links and ten hinges with one degree of freedom: a tree of seven hinge joints whose three remaining
hinges are MJCF ``<connect>`` equalities. ``ukjax.robots.load`` reads it in one line and
:meth:`ukjax.robots.Robot.system` makes the three connects exact :class:`ukjax.Holonomic` constraints
(3 rows each, of which 2 are independent in the plane), Baumgarte-stabilized, φ̈ + 2αφ̇ + β²φ = 0. The crank
is driven at constant speed ω by one more, rheonomic, holonomic constraint q_crank - ω t = 0 (Python, not in
the file; its multiplier is the crank torque). That is 10 rows of rank 7 on n = 7 coordinates: the motion is
fully prescribed and the default method (``"ldl"``) first compresses the rows to n = 7 by a Householder QR
(:func:`ukjax.dynamics.compress_rows`), then solves the 7 x 7 Gram matrix.

Checks against references that share no code with ukjax:

1. Kinematics: the linkage assembled in closed form by circle intersections (plain NumPy,
   :func:`linkage_points`; every joint of the leg lies on two circles about joints already placed) at the
   simulated crank angle, against the simulated foot (and every coordinate, :func:`joint_angles`).
2. Dynamics: the constraint force Aᵀλ and the crank torque at closed-form states against a KKT solve
   [[M, Jᵀ], [J, 0]] built from MuJoCo's mass matrix (``mj_fullM``), bias force and the point Jacobians of
   the connect anchors (``mj_jac``, ``mj_jacDot``).
3. MuJoCo's own simulation of the same file (soft equality constraints, the crank held at ω by the file's
   velocity actuator, RK4 at the same step): how far its loops open, reported, not asserted.

Outputs: ``metrics.json`` and ``foot_path.png`` (the foot path simulated and in closed form, the loop gaps
over time). metrics.json's ``joint_ranges`` and the printed summary report any joint the trajectory took out
of a range stated in the file (the shipped leg states none; ranges are not enforced).
"""

from __future__ import annotations

import argparse
import time
from importlib.resources import files
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.control import consistent_state
from ukjax.simulation import RESULTS, simulate
from ukjax.solvers import RK4
from ukjax.studies._common import (
    add_output_arguments,
    joint_range_lines,
    joint_range_record,
    prepare_output,
    pyplot,
    save_figure,
    write_json,
)

DESCRIPTION = "Jansen 2007: Strandbeest leg from MJCF, 3 connect loops as exact constraints vs closed form"
PAPER_DEFAULTS = {}

MODEL_FILE = Path(str(files("ukjax.studies") / "data" / "jansen_leg.xml"))

# Jansen's "holy numbers" (Jansen 2007; strandbeest.com), in units read as centimetres.
HOLY_NUMBERS = {
    "a": 38.0, "b": 41.5, "c": 39.3, "d": 40.1, "e": 55.8, "f": 39.4, "g": 36.7,
    "h": 65.7, "i": 49.0, "j": 50.0, "k": 61.9, "l": 7.8, "m": 15.0,
}  # fmt: skip
UNIT = 0.01  # metres per holy-number unit
REFERENCE_ANGLE = np.pi / 2  # the crank angle of the file's compiled configuration (q = 0): A above O

# The file's joints (MuJoCo's order) and the link each one turns: its direction in the plane is that of the
# segment between two closed-form points, so a joint angle is that link's rotation less its parent's.
JOINTS = ("crank", "j", "k", "bcd", "f", "c", "efg")
_LINK_SEGMENT = {
    "crank": ("O", "A"), "j": ("A", "C"), "k": ("A", "E"), "bcd": ("B", "C"),
    "f": ("D", "F"), "c": ("B", "E"), "efg": ("E", "F"),
}  # fmt: skip
_PARENT = {"crank": None, "j": "crank", "k": "crank", "bcd": None, "f": "bcd", "c": None, "efg": "c"}
# The file's sites at the closed-form points (the foot is G)
SITES = {"A": "A", "C": "C", "D": "D", "E": "E", "F": "F", "G": "foot"}


# ------------------------------------------------------------------------------------ closed form (NumPy)
def _circle_intersection(P, r1, Q, r2, side, name, theta):
    """The point at distance r1 from P and r2 from Q, left (side = +1) or right (-1) of the line P → Q
    (points of shape (..., 2)); a ValueError names the joint ``name`` and a crank angle where the circles do
    not meet (the lengths cannot be assembled there)."""
    d = Q - P
    dist = np.hypot(d[..., 0], d[..., 1])[..., None]
    along = (r1**2 - r2**2 + dist**2) / (2.0 * dist)
    squared = r1**2 - along**2
    if not np.all(squared >= 0.0):
        bad = np.broadcast_to(theta, squared.shape[:-1])[~np.all(squared >= 0.0, axis=-1)]
        raise ValueError(
            f"linkage_points: joint {name} cannot be assembled at crank angle {float(bad.flat[0]):.6g} rad "
            f"(its two circles, radii {r1:.6g} m and {r2:.6g} m, do not meet); check the link lengths"
        )
    height = np.sqrt(squared)
    normal = np.stack([-d[..., 1], d[..., 0]], axis=-1) / dist
    return P + along * d / dist + side * height * normal


def linkage_points(theta, lengths=None) -> dict[str, np.ndarray]:
    """Every joint of the leg at crank angle(s) ``theta`` (rad, counterclockwise from +x), in closed form.

    Plane coordinates (x, z) in metres, each of shape ``theta.shape + (2,)``: crank axle O = (0, 0), frame
    pivot B = (-a, -l), crank pin A = m (cos θ, sin θ); then, each on two circles about points already
    placed (the assembly branch of Jansen's leg): C (|AC| = j, |BC| = b, above), E (|AE| = k, |BE| = c,
    below), D (|BD| = d, |CD| = e, outside the triangle), F (|DF| = f, |EF| = g), G the foot (|FG| = h,
    |EG| = i, lowest). ``lengths``: the holy numbers (default :data:`HOLY_NUMBERS`) in cm.
    """
    lengths = HOLY_NUMBERS if lengths is None else lengths
    missing = sorted(set(HOLY_NUMBERS) - set(lengths))
    if missing:
        raise ValueError(
            f"linkage_points: lengths lacks {missing} (the 13 lengths a to m in cm, Jansen's lettering)"
        )
    L = {key: UNIT * float(value) for key, value in lengths.items()}
    theta = np.asarray(theta, dtype=float)
    zero = np.zeros(theta.shape + (2,))
    O = zero
    B = zero + np.array([-L["a"], -L["l"]])
    A = L["m"] * np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    C = _circle_intersection(A, L["j"], B, L["b"], -1, "C", theta)
    E = _circle_intersection(A, L["k"], B, L["c"], +1, "E", theta)
    D = _circle_intersection(B, L["d"], C, L["e"], +1, "D", theta)
    F = _circle_intersection(D, L["f"], E, L["g"], -1, "F", theta)
    G = _circle_intersection(F, L["h"], E, L["i"], -1, "G", theta)
    return {"O": O, "A": A, "B": B, "C": C, "D": D, "E": E, "F": F, "G": G}


def _link_directions(points) -> dict[str, np.ndarray]:
    out = {}
    for joint, (start, end) in _LINK_SEGMENT.items():
        d = points[end] - points[start]
        out[joint] = np.arctan2(d[..., 1], d[..., 0])
    return out


def joint_angles(theta) -> np.ndarray:
    """The file's coordinates q (..., 7) (:data:`JOINTS` order, MuJoCo's qpos) at crank angle(s) ``theta``,
    in closed form: each link's rotation since the compiled configuration less its parent's, wrapped to
    (-π, π] for all but the crank (whose q is θ - π/2 unwrapped)."""
    now = _link_directions(linkage_points(theta))
    ref = _link_directions(linkage_points(REFERENCE_ANGLE))
    turned = {joint: now[joint] - ref[joint] for joint in JOINTS}
    q = []
    for joint in JOINTS:
        parent = _PARENT[joint]
        angle = turned[joint] - (turned[parent] if parent else 0.0)
        q.append(np.asarray(theta, dtype=float) - REFERENCE_ANGLE if joint == "crank" else angle)
    q = np.stack(q, axis=-1)
    q[..., 1:] = np.angle(np.exp(1j * q[..., 1:]))
    return q


def gait(foot) -> dict:
    """Stride length (horizontal extent, m) and step height (vertical extent, m) of a foot path (samples, 2)
    evenly spaced in crank angle over a whole turn, and the fraction of the turn in stance (the foot within
    1 cm of its lowest point)."""
    foot = np.asarray(foot)
    low = foot[:, 1] - foot[:, 1].min()
    return {
        "stride_length_m": float(np.ptp(foot[:, 0])),
        "step_height_m": float(np.ptp(foot[:, 1])),
        "stance_fraction_within_1cm": float(np.mean(low <= 0.01)),
    }


# ------------------------------------------------------------------------------------ the ukjax model
def load_leg():
    """The leg as a :class:`ukjax.robots.Robot`, read from the shipped MJCF file (:data:`MODEL_FILE`)."""
    from ukjax import robots

    return robots.load(MODEL_FILE)


def crank_drive(baumgarte: Baumgarte | None = None) -> Holonomic:
    """q_crank - ω t = 0 with ω = ``p["omega"]`` (rad/s): the crank turned at constant speed from its compiled
    angle, an ideal rheonomic constraint whose multiplier is the driving torque (N m)."""
    return Holonomic(lambda q, t, p: q[:1] - p["omega"] * t, baumgarte=baumgarte, name="crank drive")


STABILIZED = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))


def leg_system(robot):
    """The driven leg: the three connect loops and the crank drive, all Baumgarte-stabilized with the gains
    ``p["alpha"]``, ``p["beta"]`` (1/s) of φ̈ + 2αφ̇ + β²φ = 0; the drive is the last constraint."""
    return robot.system(baumgarte=STABILIZED, constraints=(crank_drive(STABILIZED),))


def leg_params(robot, *, omega: float, alpha: float, beta: float) -> dict:
    """The robot's parameters with the crank speed ω (rad/s) and the Baumgarte gains α, β (1/s)."""
    extra = {"omega": omega, "alpha": alpha, "beta": beta}
    return {**robot.params, **{key: jnp.asarray(value, jnp.float64) for key, value in extra.items()}}


def initial_state(system, params):
    """(q0, q̇0) at the compiled configuration (q = 0), the crank at ω and the other rates consistent."""
    qd_guess = jnp.zeros(system.n).at[0].set(params["omega"])
    return consistent_state(system, jnp.zeros(system.n), qd_guess, 0.0, params, fixed=(0,))


# ------------------------------------------------------------------------------------ MuJoCo references
def _mujoco_model():
    import mujoco

    return mujoco, mujoco.MjModel.from_xml_path(str(MODEL_FILE))


def connect_gaps(mujoco, model, data) -> np.ndarray:
    """(loops, 3) x1 - x2 of every connect at the state in ``data`` (after ``mj_kinematics``), from MuJoCo's
    body poses and ``eq_data`` (anchor on body 1, its counterpart on body 2)."""
    gaps = []
    for e in range(model.neq):
        b1, b2 = model.eq_obj1id[e], model.eq_obj2id[e]
        x1 = data.xpos[b1] + data.xmat[b1].reshape(3, 3) @ model.eq_data[e, 0:3]
        x2 = data.xpos[b2] + data.xmat[b2].reshape(3, 3) @ model.eq_data[e, 3:6]
        gaps.append(x1 - x2)
    return np.asarray(gaps)


def kkt_reference(theta, omega, alpha=0.0, beta=0.0) -> dict:
    """The driven leg's q̈, constraint force and crank torque at the closed-form state of crank angle
    ``theta`` turning at ``omega``, from MuJoCo's M, bias force and connect Jacobians (no ukjax code).

    State: q = :func:`joint_angles`; q̇ solves [J; e_crankᵀ] q̇ = [0; ω] with J the stacked x1 - x2
    Jacobians of the connects (``mj_jac``). KKT: [[M, Aᵀ], [A, 0]] [q̈; μ] = [-c; b] with A = [J; e_crankᵀ],
    c MuJoCo's ``qfrc_bias`` (gravity, Coriolis) and b = [-J̇q̇ - 2αJq̇ - β²φ; 0] (the Baumgarte terms of the
    gaps φ = x1 - x2 that the file's 12-digit positions leave, ~1e-13 m), solved by least squares (the
    loops' out-of-plane rows are zero); the constraint force is -Aᵀμ = M q̈ + c and the crank torque
    -μ_drive.
    """
    mujoco, model = _mujoco_model()
    data = mujoco.MjData(model)
    nv = model.nv

    def jacobians(with_rates):
        rows, rates = [], []
        for e in range(model.neq):
            b1, b2 = model.eq_obj1id[e], model.eq_obj2id[e]
            pair = []
            for body, anchor in ((b1, model.eq_data[e, 0:3]), (b2, model.eq_data[e, 3:6])):
                point = data.xpos[body] + data.xmat[body].reshape(3, 3) @ anchor
                jp, jr, dp, dr = (np.zeros((3, nv)) for _ in range(4))
                mujoco.mj_jac(model, data, jp, jr, point, body)
                if with_rates:
                    mujoco.mj_jacDot(model, data, dp, dr, point, body)
                pair.append((jp, dp))
            rows.append(pair[0][0] - pair[1][0])
            rates.append(pair[0][1] - pair[1][1])
        drive = np.zeros((1, nv))
        drive[0, 0] = 1.0
        return np.vstack([*rows, drive]), np.vstack([*rates, np.zeros((1, nv))])

    q = joint_angles(theta)
    data.qpos[:] = q
    mujoco.mj_forward(model, data)
    A, _ = jacobians(False)
    rhs = np.zeros(A.shape[0])
    rhs[-1] = omega
    qd = np.linalg.lstsq(A, rhs, rcond=None)[0]
    data.qvel[:] = qd
    mujoco.mj_forward(model, data)
    A, A_dot = jacobians(True)
    gaps = np.concatenate([*connect_gaps(mujoco, model, data), [0.0]])  # the drive's φ is 0 at t = q_crank/ω
    b = -A_dot @ qd - 2.0 * alpha * (A @ qd - rhs) - beta**2 * gaps  # and so is its φ̇ = q̇_crank - ω
    M = np.zeros((nv, nv))
    mujoco.mj_fullM(model, data, M)
    m = A.shape[0]
    K = np.block([[M, A.T], [A, np.zeros((m, m))]])
    solution = np.linalg.lstsq(K, np.concatenate([-data.qfrc_bias, b]), rcond=None)[0]
    qdd, mu = solution[:nv], solution[nv:]
    return {
        "q": q,
        "qd": qd,
        "qdd": qdd,
        "constraint_force": M @ qdd + data.qfrc_bias,
        "crank_torque": float(-mu[-1]),
    }


def mujoco_soft_run(q0, qd0, omega, dt, steps, every) -> dict:
    """MuJoCo's own simulation of the file (soft equality constraints, default solref/solimp; RK4 at ``dt``;
    the crank held near ω by the file's velocity actuator, ctrl = ω): the states, connect gaps (m) and foot
    positions (x, z) (m) every ``every`` steps."""
    mujoco, model = _mujoco_model()
    model.opt.timestep = dt
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:], data.ctrl[:] = q0, qd0, omega
    foot = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, SITES["G"])
    qs, qds, gaps, feet, ts = [], [], [], [], []
    for step in range(steps + 1):
        if step % every == 0:
            mujoco.mj_kinematics(model, data)
            qs.append(data.qpos.copy())
            qds.append(data.qvel.copy())
            gaps.append(connect_gaps(mujoco, model, data))
            feet.append(data.site_xpos[foot][[0, 2]].copy())
            ts.append(data.time)
        if step < steps:
            mujoco.mj_step(model, data)
    return {
        "t": np.asarray(ts),
        "q": np.asarray(qs),
        "qd": np.asarray(qds),
        "gaps": np.asarray(gaps),
        "foot": np.asarray(feet),
    }


# ------------------------------------------------------------------------------------ the study
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_output_arguments(parser, "jansen")
    parser.add_argument("--periods", type=float, default=1.0, help="crank turns simulated")
    parser.add_argument(
        "--omega", type=float, default=2 * np.pi, help="crank speed ω (rad/s): one turn per second"
    )
    parser.add_argument("--dt", type=float, default=1e-3, help="fixed RK4 step (s), for ukjax and MuJoCo")
    parser.add_argument("--save-every", type=int, default=5, help="save every this many steps")
    parser.add_argument("--alpha", type=float, default=20.0, help="Baumgarte α (1/s) of φ̈ + 2αφ̇ + β²φ = 0")
    parser.add_argument("--beta", type=float, default=20.0, help="Baumgarte β (1/s)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-6,
        help="stated bound (m) on the foot's distance from the closed-form path at the same crank angle",
    )
    parser.add_argument("--kkt-states", type=int, default=4, help="crank angles of the KKT check")


def _figure(out, foot_closed, foot_sim, foot_mj, t, gap_uk, gap_mj, theta0):
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    points = linkage_points(theta0)
    for start, end in (("O", "A"), ("A", "C"), ("A", "E"), ("B", "C"), ("B", "D"), ("C", "D"), ("B", "E"),
                       ("D", "F"), ("E", "F"), ("E", "G"), ("F", "G")):  # fmt: skip
        segment = np.stack([points[start], points[end]])
        ax.plot(segment[:, 0], segment[:, 1], color="0.7", lw=1.5)
    ax.plot(foot_closed[:, 0], foot_closed[:, 1], "k-", lw=1, label="closed form (circle intersections)")
    ax.plot(foot_sim[:, 0], foot_sim[:, 1], "o", ms=2.5, color="C0", label="ukjax (exact loops, RK4)")
    ax.plot(foot_mj[:, 0], foot_mj[:, 1], "--", lw=1, color="C3", label="MuJoCo (soft loops, RK4)")
    ax.set_aspect("equal")
    ax.set_ylim(-1.0, 0.8)  # room above the leg for the legend
    ax.set_xlabel("x (m)")
    ax.set_ylabel("z (m)")
    ax.set_title("a) foot path, the leg drawn at t = 0")
    ax.legend(fontsize=7, loc="upper left")
    floor = 1e-16
    bx.semilogy(t, np.maximum(gap_uk, floor), label="ukjax: largest connect gap")
    bx.semilogy(t, np.maximum(gap_mj, floor), label="MuJoCo: largest connect gap")
    bx.set_xlabel("t (s)")
    bx.set_ylabel("gap |x₁ - x₂| (m)")
    bx.set_title("b) how far the loops open")
    bx.legend(fontsize=7)
    return save_figure(fig, out / "foot_path.png")


def run(args) -> dict:
    import mujoco

    out = prepare_output(args.out, overwrite=args.overwrite)
    if args.save_every < 1:
        raise ValueError(f"--save-every must be a positive number of steps, got {args.save_every}")
    steps = (
        int(round(args.periods * 2 * np.pi / abs(args.omega) / args.dt / args.save_every)) * args.save_every
    )
    if steps < args.save_every:
        raise ValueError("--periods, --omega and --dt give no step to simulate")
    robot = load_leg()
    system = leg_system(robot)
    params = leg_params(robot, omega=args.omega, alpha=args.alpha, beta=args.beta)
    q0, qd0 = initial_state(system, params)
    t1 = steps * args.dt
    ts = jnp.asarray(np.arange(0, steps + 1, args.save_every) * args.dt)
    start = time.perf_counter()
    sol = simulate(system, q0, qd0, params, t1=t1, ts=ts, dt0=args.dt, solver=RK4())
    jax.block_until_ready(sol.q)
    first_call_s = time.perf_counter() - start

    # 1. kinematics against the closed form at the simulated crank angle
    q = np.asarray(sol.q)
    theta = REFERENCE_ANGLE + q[:, 0]
    closed = linkage_points(theta)
    foot = np.asarray(jax.vmap(lambda qi: robot.point("foot")(qi, params))(sol.q))[:, [0, 2]]
    foot_error = np.linalg.norm(foot - closed["G"], axis=1)
    q_error = np.abs(np.angle(np.exp(1j * (q - joint_angles(theta)))))
    drive_error = np.abs(q[:, 0] - args.omega * np.asarray(ts))
    turn = np.linspace(0.0, 2 * np.pi, 721)
    foot_turn = linkage_points(turn)["G"]
    residual = np.asarray(sol.position_residual)
    loop_rows = residual[:, :-1].reshape(len(ts), -1, 3)

    # 2. constraint forces against a KKT solve from MuJoCo's M and Jacobians
    kkt_rows = []
    # the drive's time at a crank angle: t = (θ - θ_ref)/ω
    force = jax.jit(lambda q_, qd_, t_: system.constraint_force(q_, qd_, t_, params).ideal)
    torque = jax.jit(lambda q_, qd_, t_: system.multipliers(q_, qd_, t_, params)[-1][0])
    for angle in REFERENCE_ANGLE + np.linspace(0.0, 2 * np.pi, args.kkt_states, endpoint=False):
        ref = kkt_reference(angle, args.omega, args.alpha, args.beta)
        state = (jnp.asarray(ref["q"]), jnp.asarray(ref["qd"]), jnp.asarray(ref["q"][0] / args.omega))
        ours_force = np.asarray(force(*state))
        ours_torque = float(torque(*state))
        scale = np.max(np.abs(ref["constraint_force"]))
        kkt_rows.append(
            {
                "crank_angle_rad": float(angle),
                "constraint_force_relative_error": float(
                    np.max(np.abs(ours_force - ref["constraint_force"])) / scale
                ),
                "crank_torque_Nm": ours_torque,
                "crank_torque_kkt_Nm": ref["crank_torque"],
            }
        )
    torques = np.asarray(
        jax.vmap(lambda q_, qd_, t_: system.multipliers(q_, qd_, t_, params)[-1][0])(
            sol.q, sol.qd, jnp.asarray(ts)
        )
    )

    # 3. MuJoCo's soft-constraint simulation of the same file
    soft = mujoco_soft_run(np.asarray(q0), np.asarray(qd0), args.omega, args.dt, steps, args.save_every)
    soft_gap = np.linalg.norm(soft["gaps"], axis=2)
    soft_theta = REFERENCE_ANGLE + soft["q"][:, 0]
    soft_foot = soft["foot"]
    soft_foot_error = np.linalg.norm(soft_foot - linkage_points(soft_theta)["G"], axis=1)

    uk_gap = np.linalg.norm(loop_rows, axis=2).max(axis=1)
    metrics = {
        "model": {
            "file": "ukjax/studies/data/jansen_leg.xml",
            "link_lengths_cm": HOLY_NUMBERS,
            "source": "Jansen 2007 (The Great Pretender), the 'holy numbers'",
            "coordinates": list(robot.joint_names),
            "loops": [c.name for c in robot.equality_constraints()],
            "constraint_rows": int(residual.shape[1]),
            "constraint_rank": int(
                np.linalg.matrix_rank(np.asarray(system.constraint_equations(q0, qd0, 0.0, params)[0]))
            ),
            "method": "ldl (default): the rows compressed to n = 7 by a Householder QR, then a pivoted LDLᵀ "
            "of the 7 x 7 Gram matrix",
        },
        "integrator": {
            "solver": "ukjax RK4 (classical 4th order)",
            "step": "fixed",
            "dt": args.dt,
            "t1": t1,
            "saves": len(ts),
            "first_call_s": first_call_s,
        },
        "baumgarte": {"alpha": args.alpha, "beta": args.beta, "form": "quadratic: φ̈ + 2αφ̇ + β²φ = 0"},
        "crank_speed_rad_s": args.omega,
        "status": RESULTS(int(sol.status)).name,
        "joint_ranges": joint_range_record(robot, sol),
        "tolerance_foot_m": args.tolerance,
        "max_constraint_violation_m": float(np.max(np.abs(residual[:, :-1]))),
        "max_drive_error_rad": float(drive_error.max()),
        "max_foot_error_vs_closed_form_m": float(foot_error.max()),
        "max_coordinate_error_vs_closed_form_rad": float(q_error.max()),
        "foot_within_tolerance": bool(foot_error.max() <= args.tolerance),
        "gait_closed_form": gait(foot_turn[:-1]),  # 720 angles: without the repeated 2π
        "crank_torque_range_Nm": [float(torques.min()), float(torques.max())],
        "kkt_check": kkt_rows,
        "mujoco_soft": {
            "integrator": "MuJoCo RK4, same dt; soft equality constraints (default solref, solimp); crank by "
            "the file's velocity actuator (kv = 20 N m s), ctrl = ω",
            "version": mujoco.__version__,
            "max_connect_gap_m": float(soft_gap.max()),
            "max_crank_speed_error_rad_s": float(np.max(np.abs(soft["qd"][:, 0] - args.omega))),
            "max_foot_error_vs_closed_form_m": float(soft_foot_error.max()),
        },
    }
    metrics["figure"] = _figure(
        out, foot_turn, foot, soft_foot, np.asarray(ts), uk_gap, soft_gap.max(axis=1), REFERENCE_ANGLE
    )
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics)
    return metrics


def _print_summary(m: dict) -> None:
    kkt = max(row["constraint_force_relative_error"] for row in m["kkt_check"])
    torque = max(abs(row["crank_torque_Nm"] - row["crank_torque_kkt_Nm"]) for row in m["kkt_check"])
    gait_ = m["gait_closed_form"]
    rows, rank = m["model"]["constraint_rows"], m["model"]["constraint_rank"]
    soft = m["mujoco_soft"]
    lines = [
        f"Jansen leg: {rows} constraint rows of rank {rank}, "
        f"RK4 dt = {m['integrator']['dt']:g} s, {m['status']}",
        f"  foot vs closed form: max {m['max_foot_error_vs_closed_form_m']:.2e} m "
        f"(tolerance {m['tolerance_foot_m']:.0e} m); max |φ| {m['max_constraint_violation_m']:.2e} m",
        f"  stride {gait_['stride_length_m']:.3f} m, step height {gait_['step_height_m']:.3f} m; "
        f"crank torque {m['crank_torque_range_Nm'][0]:.2f} .. {m['crank_torque_range_Nm'][1]:.2f} N m",
        f"  KKT (MuJoCo M, mj_jac): constraint force rel. error {kkt:.1e}, crank torque |Δ| {torque:.1e} N m",
        f"  MuJoCo soft loops: max gap {soft['max_connect_gap_m']:.2e} m, foot off the closed form "
        f"by {soft['max_foot_error_vs_closed_form_m']:.2e} m",
        *joint_range_lines(m["joint_ranges"]),
    ]
    print("\n".join(lines))
