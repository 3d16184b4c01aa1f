"""The planar 3RRR parallel mechanism as a hierarchy of modules (Orsino 2017, seed 003 §2, Figs. 2-4).

Built exactly as seed 003 §2 describes it:

* **Level 1**, ten decoupled modules, each with its own coordinates, mass matrix and forces: for each leg
  K = A, B, C an actuator A_K (:func:`actuator`, the motor rotor, coordinate ψ), a pivoted rigid bar U_K
  (:func:`pivoted_bar`, a planar body (x, y, θ) whose own constraint is its pivot on the base) and a
  two-dimensional bar element B_K (:func:`bar_element`, a free planar body (x, y, θ)), plus the platform L
  (:func:`platform`, a free planar body (x, y, θ)). The level-1 constraints are the three pivots (2 rows
  each), each touching one module.
* **Level 2**, the legs H_K (:func:`leg`): A_K, U_K and B_K joined by the gear ψ = N θ_U (1 row) and the
  elbow revolute joint (2 rows). The three legs are one module definition used three times (the topological
  symmetry seed 003 stresses); they differ only in their parameters (where the base pivot is).
* **Level 3**, the mechanism M (:func:`system`): the legs joined to the platform by three revolute joints
  (2 rows each).

n = 3 x (1 + 3 + 3) + 3 = 24 coordinates, 6 + 9 + 6 = 21 constraint rows, 3 degrees of freedom, 3 actuators
(one motor torque per leg, on its rotor). Coordinates are stacked [leg A (ψ, U: x, y, θ, B: x, y, θ), leg B,
leg C, platform (x, y, θ)] (``system().layout`` and :func:`module_slices`). M is block diagonal by module and
every constraint block touches only the modules it joins (seed 003 §2), see :func:`module_slices`.

Joint forces: a revolute joint is written p_a - p_b = 0 in the Cartesian coordinates of the two bodies, so
its multiplier λ (:meth:`ukjax.System.multipliers`) is the force (N) the joint exerts on body a; the gear's
multiplier is the torque (N m) it transmits to the rotor.

Dimensions (the seed's supplementary appendix S1 with its numbers is not in the text; these are a standard
symmetric 3RRR of bench-top size, moving in a horizontal plane, g = 0 by default):

* base pivots O_K on a circle of radius 0.40 m at 90°, 210°, 330°; platform joints on a circle of radius
  0.10 m at the same angles in the platform frame (equilateral base and platform triangles);
* proximal bars U_K: l1 = 0.25 m, m1 = 0.50 kg, I1 = m1 l1²/12 about the centre; distal bars B_K:
  l2 = 0.25 m, m2 = 0.30 kg, I2 = m2 l2²/12; platform: m = 0.60 kg, I = m a²/12 = 1.5e-3 kg m² (equilateral
  plate of side a = 0.1 √3 m);
* actuators: rotor inertia J = 3e-5 kg m², gear ratio N = 10 (reflected inertia N²J = 3e-3 kg m²);
* all legs in the same working mode (elbow on the same side, ``elbow = +1``).

At the home pose (platform centred, θ = 0) each leg spans d = 0.30 m with links at γ = 73.7° to each other
(|sin γ| = 0.96: far from the serial singularity γ = 0, π) and the three distal links are not concurrent (far
from the parallel singularity); :func:`singularity_measures` quantifies both along a trajectory, and the
tests and the study check that the prescribed trajectory stays away from both.

Prescribed platform motion (inverse dynamics, :func:`trajectory`): x = c_x + a_x sin ωt, y = c_y + a_y sin
2ωt, θ = a_θ sin ωt (a figure of eight with a rocking platform), ω = 2π/T; the closed-form inverse
kinematics :func:`coordinates_from_pose` gives every module coordinate from the platform pose, and so the
reference state and acceleration (:func:`reference_state`).

Clearances (``system(clearances=True)``; Orsino 2017 eq. 4.17-4.18; what they mean physically is stated in
:meth:`ukjax.System.acceleration`): isotropic covariances σ² (1/kg) read from the parameters,
``p[K]["bar"]["clearance"]`` for the pivot of leg K (level 1), ``p[K]["clearance"]`` for its elbow (level 2;
the gear stays rigid) and ``p["clearance"][k]`` for its platform joint (level 3); :func:`with_clearances`
sets them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import Layout, System, compose

LEGS = ("A", "B", "C")
MODULES = ("act", "bar", "elem")
BASE_ANGLES_DEG = (90.0, 210.0, 330.0)

_f = lambda x: jnp.asarray(x, jnp.float64)


def _e(theta):
    """Unit vector (cos θ, sin θ)."""
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)])


def _rot(theta):
    c, s = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


def _gains(p):
    return p["alpha"], p["beta"]


def _rigid_body_mass(q, t, p):
    return jnp.diag(jnp.stack([p["m"], p["m"], p["I"]]))


def _rigid_body_force(q, qd, t, p):
    """Gravity along -y of the plane (g = 0: horizontal plane); no gyroscopic terms in (x, y, θ)."""
    zero = jnp.zeros_like(p["m"])
    return jnp.stack([zero, -p["m"] * p["g"], zero])


def _rigid_body(name):
    return System(
        mass=_rigid_body_mass,
        force=_rigid_body_force,
        n=3,
        coordinate_names=(f"{name}_x", f"{name}_y", f"{name}_theta"),
    )


# ---------------------------------------------------------------------- level 1: the ten modules
def actuator() -> System:
    """A_K: the motor rotor, coordinate ψ, inertia p["J"]; the motor torque u acts on it (B = [1])."""
    return System(
        mass=lambda q, t, p: p["J"][None, None],
        force=lambda q, qd, t, p: jnp.zeros_like(q),
        n=1,
        actuation=lambda q, t, p: jnp.ones((1, 1), jnp.result_type(q)),
        coordinate_names=("psi",),
    )


def _pivot(q, t, p):
    """The bar's proximal end at the base pivot: (x, y) - (l/2) e(θ) - O = 0."""
    return q[:2] - 0.5 * p["l"] * _e(q[2]) - p["base"]


def pivoted_bar(*, clearances: bool = False) -> System:
    """U_K: a planar bar (x, y, θ) of its centre, held by a pivot at p["base"] (its own level-1 constraint,
    Baumgarte gains p["alpha"], p["beta"]; clearance p["clearance"] when ``clearances``)."""
    pivot = Holonomic(_pivot, baumgarte=Baumgarte(_gains), name="pivot")
    clearance = (lambda p: p["clearance"]) if clearances else None
    return _rigid_body("U").with_constraints(pivot, level="pivots", clearance=clearance)


def bar_element() -> System:
    """B_K: a free two-dimensional bar (x, y, θ) of its centre."""
    return _rigid_body("B")


def platform() -> System:
    """L: the free platform (x, y, θ); p["joints"] (3, 2) are its joint positions in its own frame."""
    return _rigid_body("L")


# ---------------------------------------------------------------------- level 2: one leg, used three times
LEG_LAYOUT = Layout.of({"act": actuator(), "bar": pivoted_bar(), "elem": bar_element()})


def _gear(q, t, p):
    """ψ = N θ_U: the rotor turns N times faster than the bar."""
    parts = LEG_LAYOUT.split(q)
    return parts["act"][0] - p["gear"] * parts["bar"][2]


def _elbow(q, t, p):
    """Distal end of U_K = proximal end of B_K."""
    parts = LEG_LAYOUT.split(q)
    U, B = parts["bar"], parts["elem"]
    return (U[:2] + 0.5 * p["bar"]["l"] * _e(U[2])) - (B[:2] - 0.5 * p["elem"]["l"] * _e(B[2]))


def leg(*, clearances: bool = False) -> System:
    """H_K: actuator, pivoted bar and bar element joined by the gear and the elbow joint (one level).

    Parameters {"act": .., "bar": .., "elem": .., "gear": N, "alpha", "beta", "clearance"}; the clearance
    (when ``clearances``) is the elbow's isotropic σ², the gear stays rigid.
    """
    gear = Holonomic(_gear, baumgarte=Baumgarte(_gains), name="gear")
    elbow = Holonomic(_elbow, baumgarte=Baumgarte(_gains), name="elbow")
    clearance = None
    if clearances:
        clearance = lambda p: jnp.concatenate(
            [jnp.zeros(1, p["clearance"].dtype), jnp.full(2, p["clearance"])]
        )
    modules = {"act": actuator(), "bar": pivoted_bar(clearances=clearances), "elem": bar_element()}
    return compose(modules, [gear, elbow], level="legs", clearance=clearance)


# ---------------------------------------------------------------------- level 3: the mechanism
LAYOUT = Layout.of({**{K: leg() for K in LEGS}, "L": platform()})


def platform_joint_positions(pose, p):
    """World positions (3, 2) of the platform joints at platform pose (x, y, θ)."""
    return pose[:2][None, :] + p["L"]["joints"] @ _rot(pose[2]).T


def _platform_joint(k):
    K = LEGS[k]

    def phi(q, t, p):
        parts = LAYOUT.split(q)
        B = LEG_LAYOUT.split(parts[K])["elem"]
        distal = B[:2] + 0.5 * p[K]["elem"]["l"] * _e(B[2])
        return distal - platform_joint_positions(parts["L"], p)[k]

    return Holonomic(phi, baumgarte=Baumgarte(_gains), name=f"{K}-L joint")


def platform_pose(q):
    """The platform coordinates (x, y, θ) from the full q."""
    return LAYOUT.split(q)["L"]


def trajectory(t, p):
    """The prescribed platform pose (x, y, θ) at time t (figure of eight, rocking platform)."""
    tr = p["trajectory"]
    w = 2 * jnp.pi / tr["period"]
    t = jnp.asarray(t, tr["period"].dtype)
    s1, s2 = jnp.sin(w * t), jnp.sin(2 * w * t)
    return jnp.stack(
        [
            tr["center"][0] + tr["amplitude"][0] * s1,
            tr["center"][1] + tr["amplitude"][1] * s2,
            tr["amplitude"][2] * s1,
        ]
    )


def _servo(q, t, p):
    return platform_pose(q) - trajectory(t, p)


SERVO = Holonomic(
    _servo,
    baumgarte=Baumgarte(lambda p: (p["servo"]["alpha"], p["servo"]["beta"])),
    name="platform trajectory",
)


def system(*, clearances: bool = False, servo: bool = True) -> System:
    """The 3RRR mechanism M: three legs (one definition) and the platform, joined at level 3.

    ``servo=True`` adds the platform trajectory as servo constraints (inverse dynamics by servo control,
    :mod:`ukjax.control`); ``clearances=True`` attaches the clearance covariances of every joint (module
    docstring), read only by the recursive solver.
    """
    legs = {K: leg(clearances=clearances) for K in LEGS}
    joints = [_platform_joint(k) for k in range(3)]
    clearance = (lambda p: jnp.repeat(p["clearance"], 2)) if clearances else None
    return compose(
        {**legs, "L": platform()},
        joints,
        level="platform joints",
        clearance=clearance,
        servo_constraints=(SERVO,) if servo else (),
    )


def module_slices() -> dict[str, slice]:
    """Where each of the ten level-1 modules sits in q: {"A.act": slice, ..., "L": slice}."""
    out = {}
    for K, top in LAYOUT.slices.items():
        if K == "L":
            out["L"] = top
            continue
        for name, sl in LEG_LAYOUT.slices.items():
            out[f"{K}.{name}"] = slice(top.start + sl.start, top.start + sl.stop)
    return out


# ---------------------------------------------------------------------- parameters
def default_params(*, alpha=20.0, beta=20.0) -> dict:
    """The dimensions of the module docstring; Baumgarte α = β = 20 1/s on every passive level and on the
    servo constraints; trajectory amplitudes 40 mm, 30 mm, 0.2 rad, period 1 s; clearances zero."""
    gains = {"alpha": _f(alpha), "beta": _f(beta)}
    l1, m1, l2, m2 = 0.25, 0.5, 0.25, 0.3
    legs = {}
    for K, angle in zip(LEGS, BASE_ANGLES_DEG, strict=True):
        a = np.radians(angle)
        legs[K] = {
            "act": {"J": _f(3e-5)},
            "bar": {
                "m": _f(m1),
                "I": _f(m1 * l1**2 / 12),
                "l": _f(l1),
                "g": _f(0.0),
                "base": _f([0.4 * np.cos(a), 0.4 * np.sin(a)]),
                "clearance": _f(0.0),
                **gains,
            },
            "elem": {"m": _f(m2), "I": _f(m2 * l2**2 / 12), "l": _f(l2), "g": _f(0.0)},
            "gear": _f(10.0),
            "clearance": _f(0.0),
            **gains,
        }
    angles = np.radians(BASE_ANGLES_DEG)
    return {
        **legs,
        "L": {
            "m": _f(0.6),
            "I": _f(1.5e-3),
            "g": _f(0.0),
            "joints": _f(0.1 * np.stack([np.cos(angles), np.sin(angles)], axis=1)),
        },
        "clearance": _f([0.0, 0.0, 0.0]),
        **gains,
        "servo": dict(gains),
        "trajectory": {"center": _f([0.0, 0.0]), "amplitude": _f([0.04, 0.03, 0.2]), "period": _f(1.0)},
        "elbow": _f(1.0),
    }


def with_clearances(p, *, pivot, elbow, platform) -> dict:
    """A copy of p with the clearance variances σ² (1/kg) of each joint: ``pivot``, ``elbow`` and ``platform``
    are scalars or (3,) arrays, one per leg A, B, C."""
    pivot, elbow, platform = (
        jnp.broadcast_to(jnp.asarray(x, jnp.float64), (3,)) for x in (pivot, elbow, platform)
    )
    p = jax.tree_util.tree_map(lambda x: x, p)
    for k, K in enumerate(LEGS):
        p[K] = {**p[K], "clearance": elbow[k], "bar": {**p[K]["bar"], "clearance": pivot[k]}}
    p["clearance"] = platform
    return p


# ---------------------------------------------------------------------- kinematics
def _leg_from_joint(P, K, p):
    """Leg K's seven coordinates (ψ, U: x, y, θ, B: x, y, θ) reaching the platform joint at P (closed
    form)."""
    leg_p = p[K]
    O, l1, l2 = leg_p["bar"]["base"], leg_p["bar"]["l"], leg_p["elem"]["l"]
    inward = jnp.arctan2(-O[1], -O[0])  # constant per leg: keeps every angle continuous (no atan2 wrap)
    local = _rot(-inward) @ (P - O)
    d = jnp.linalg.norm(local)
    gamma = jnp.arccos((l1**2 + d**2 - l2**2) / (2 * l1 * d))
    theta_U = inward + jnp.arctan2(local[1], local[0]) + p["elbow"] * gamma
    E = O + l1 * _e(theta_U)
    r = _rot(-theta_U) @ (P - E)
    theta_B = theta_U + jnp.arctan2(r[1], r[0])
    U = jnp.concatenate([O + 0.5 * l1 * _e(theta_U), theta_U[None]])
    B = jnp.concatenate([E + 0.5 * l2 * _e(theta_B), theta_B[None]])
    return jnp.concatenate([(leg_p["gear"] * theta_U)[None], U, B])


def coordinates_from_pose(pose, p):
    """All 24 coordinates from the platform pose (x, y, θ): the closed-form inverse kinematics (circle
    intersection per leg, working mode p["elbow"])."""
    joints = platform_joint_positions(pose, p)
    legs = [_leg_from_joint(joints[k], K, p) for k, K in enumerate(LEGS)]
    return jnp.concatenate([*legs, pose])


@jax.jit
def reference_state(t, p):
    """(q, q̇, q̈) of the prescribed motion at time t, by forward-mode derivatives of the inverse kinematics.
    One compiled program (0.7 s to compile, then 0.2 ms a call; evaluated operation by operation it took
    1.7 s, then 54 ms a call)."""
    t = jnp.asarray(t, jnp.float64)
    q_of_t = lambda s: coordinates_from_pose(trajectory(s, p), p)
    velocity = lambda s: jax.jvp(q_of_t, (s,), (jnp.ones_like(s),))[1]
    q, qd = jax.jvp(q_of_t, (t,), (jnp.ones_like(t),))
    _, qdd = jax.jvp(velocity, (t,), (jnp.ones_like(t),))
    return q, qd, qdd


def singularity_measures(pose, p):
    """(serial, parallel): two numbers in [0, 1] that vanish at the two kinds of 3RRR singularity.

    serial: min_K |sin(θ_B - θ_U)|, zero when a leg is stretched or folded (type I). parallel: the inverse
    condition number of the platform Jacobian J_x, rows (u_K, (R r_K) × u_K / r) with u_K the unit vector
    along distal link K, R r_K the platform joint offset and r its radius (so the columns share units); zero
    when the three distal links are concurrent or parallel (type II).
    """
    q = coordinates_from_pose(pose, p)
    parts = LAYOUT.split(q)
    serial, rows = [], []
    offsets = p["L"]["joints"] @ _rot(pose[2]).T
    radius = jnp.max(jnp.linalg.norm(p["L"]["joints"], axis=1))
    for k, K in enumerate(LEGS):
        leg_q = LEG_LAYOUT.split(parts[K])
        theta_U, theta_B = leg_q["bar"][2], leg_q["elem"][2]
        serial.append(jnp.abs(jnp.sin(theta_B - theta_U)))
        u = _e(theta_B)
        a = offsets[k]
        rows.append(jnp.stack([u[0], u[1], (a[0] * u[1] - a[1] * u[0]) / radius]))
    s = jnp.linalg.svd(jnp.stack(rows), compute_uv=False)
    return jnp.min(jnp.stack(serial)), s[-1] / s[0]


# ---------------------------------------------------------------------- inverse dynamics without UK
def inverse_dynamics(system_, q, qd, qdd, t, p):
    """(u, λ) with M q̈ = Q + Aᵀλ + B u at a state and a prescribed q̈: the Lagrange-multiplier (KKT) form of
    the inverse dynamics, [Aᵀ B][λ; u] = M q̈ - Q, a square system (24 equations, 21 + 3 unknowns) solved by
    LU, nonsingular away from singularities. Independent of the UK equation and of servo control."""
    M = system_.mass_matrix(q, t, p)
    Q = system_.given_force(q, qd, t, p)
    A, _ = system_.constraint_equations(q, qd, t, p)
    B = system_.actuation(q, t, p)
    W = jnp.concatenate([A.T, B], axis=1)
    x = jnp.linalg.solve(W, M @ qdd - Q)
    return x[A.shape[0] :], x[: A.shape[0]]


def feedforward_torque(system_, t, p):
    """u_ff(t): the motor torques that produce the prescribed motion with rigid joints
    (:func:`inverse_dynamics` at :func:`reference_state`)."""
    q, qd, qdd = reference_state(t, p)
    return inverse_dynamics(system_, q, qd, qdd, t, p)[0]


def open_loop(*, clearances: bool = False) -> System:
    """The passive mechanism driven by the feedforward torques u_ff(t) as a given force (no servo
    constraints): the forward simulation of the study. u_ff is computed with rigid joints, whatever the
    clearances."""
    rigid = system(clearances=False, servo=True)
    mechanism = system(clearances=clearances, servo=False)

    def force(q, qd, t, p):
        u = feedforward_torque(rigid, t, p)
        return mechanism.force(q, qd, t, p) + rigid.actuation(q, t, p) @ u

    return dataclasses.replace(mechanism, force=force, actuation=None)
