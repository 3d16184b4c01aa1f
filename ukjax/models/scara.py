"""SCARA robot (three revolute joints and one prismatic joint) following a helical task-space trajectory.

Xu & Liu, "Dynamic modeling of SCARA robot based on Udwadia-Kalaba theory" (2017), seed 001.

Coordinates ``q = (q1, q2, q3, q4)``: three joint angles about vertical axes and the vertical stroke of the
prismatic joint. The unconstrained dynamics are ``τ = M(q) q̈ + C(q, q̇) q̇ + G`` (seed 001 eq. 11) with

* ``M`` of eq. 34, built from α = I_z1 + r1² m1 + l1²(m2 + m3 + m4),
  β = I_z2 + I_z3 + I_z4 + l2²(m3 + m4) + m2 r2², γ = l1 l2 (m3 + m4) + l1 m2 r2, δ = I_z3 + I_z4,
* ``C`` of eq. 35 (Christoffel symbols of M) and ``G = (0, 0, 0, m4 g)`` of eq. 36,

so that the given force of ukjax's ``M q̈ = Q + Q^c`` is ``Q = τ - C q̇ - G`` with the joint torques
``τ = p["tau"]`` (zero in the paper: the trajectory is enforced by the constraint torques alone).

The same dynamics follow from a kinetic and a potential energy written from the link positions of the forward
kinematics eq. 39 (link 1: mass centre at distance r1 from axis 1; link 2: at r2 from axis 2; links 3 and 4:
at the end point of link 2, link 4 translating along z): :func:`kinetic_energy`, :func:`potential_energy`, and
``system(lagrangian=True)``; the two versions agree to rounding.

The trajectory constraint (eq. 47-48), rheonomic and holonomic: the end effector (eq. 39) follows
``x = R sin(ωt)``, ``y = y_c + R cos(ωt)``, ``z = v_z t`` (eq. 40, R = 0.05 m, y_c = 0.35 m, ω = 0.4π rad/s,
v_z = 0.02 m/s) with fixed orientation ``q1 + q2 + q3 = 0`` (eq. 46). ukjax differentiates φ automatically;
the result equals the hand-derived (A, b) of eq. 49. Baumgarte stabilization in seed 001's convention
``φ̈ + α φ̇ + β φ = 0`` (eq. 52, ``form="linear"``) with one gain per constraint row, ``p["alpha"]`` and
``p["beta"]`` of shape (4,) (paper: α_i = 0.5, β_i = 200).

Initial conditions. The paper prints q(0) = (30°, 55°, 24°, 0) and q̇(0) = (-0.157, 0.0001, 0.157, 0.0195).
The printed velocities are those of the desired trajectory (ẋ = 0.4π·0.05, ẏ = 0) only at q1 ≈ -30.8°,
q2 ≈ 54.9°, so the printed q1 and q3 have lost their signs; ``initial_state`` returns the sign-corrected
q(0) = (-30°, 55°, -24°, 0) by default (``reading="printed"`` gives the literal values). Both readings violate
the constraints at t = 0 (the corrected one by 1° in orientation, 5.7 mm in x and 0.5 mm/s in ż), as the paper
intends.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.linalg import materialize
from ukjax.system import System

COORDINATES = ("q1", "q2", "q3", "q4")

# Seed 001, "Numerical simulations": printed initial conditions (degrees, m, rad/s, m/s).
PRINTED_Q0_DEG = (30.0, 55.0, 24.0)
CORRECTED_Q0_DEG = (-30.0, 55.0, -24.0)
PRINTED_QD0 = (-0.157, 0.0001, 0.157, 0.0195)
READINGS = ("corrected", "printed")


def _f64(value):
    return jnp.asarray(value, dtype=jnp.float64)


def default_params() -> dict:
    """Seed 001 parameters (SI units). ``g`` is not printed in the paper; 9.81 m/s² is used."""
    return {
        "m1": _f64(20.0),
        "m2": _f64(15.0),
        "m3": _f64(15.0),
        "m4": _f64(0.5),
        "l0": _f64(0.0),
        "l1": _f64(0.2),
        "l2": _f64(0.25),
        "r1": _f64(0.1),
        "r2": _f64(0.125),
        "Iz1": _f64(0.27),
        "Iz2": _f64(0.31),
        "Iz3": _f64(0.02),
        "Iz4": _f64(0.0001),
        "g": _f64(9.81),
        "tau": jnp.zeros(4, jnp.float64),
        # trajectory, eq. 40
        "radius": _f64(0.05),
        "center_y": _f64(0.35),
        "omega": _f64(0.4 * math.pi),
        "vz": _f64(0.02),
        # Baumgarte gains, eq. 52-54 (linear convention), one per constraint row
        "alpha": jnp.full(4, 0.5, jnp.float64),
        "beta": jnp.full(4, 200.0, jnp.float64),
    }


def initial_state(params, reading: str = "corrected"):
    """(q0, qd0) of seed 001 "Numerical simulations"; see the module docstring for the two readings."""
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS}, got {reading!r}")
    degrees = CORRECTED_Q0_DEG if reading == "corrected" else PRINTED_Q0_DEG
    dtype = jnp.result_type(params["l1"])
    q0 = jnp.asarray([*(math.radians(d) for d in degrees), 0.0], dtype)
    qd0 = jnp.asarray(PRINTED_QD0, dtype)
    return q0, qd0


def _check_q(q, name="q"):
    if jnp.shape(q) != (4,):
        raise ValueError(f"the SCARA model has 4 coordinates; {name} has shape {jnp.shape(q)}")


@jax.custom_jvp
def _sin_cos(x):
    """(sin x, cos x), each computed once (:func:`ukjax.linalg.materialize`) however many entries of M, C q̇,
    φ or its derivatives read it: under ``vmap`` on CPU, M, A and b of the right-hand side cost 14 + 46 ns
    per scenario instead of 33 + 87 (batch 1024, one core). Derivative d(sin, cos) = (cos, -sin) dx from the
    same two values, so the derivatives of φ that give A and b reuse them too."""
    return materialize(jnp.sin(x)), materialize(jnp.cos(x))


@_sin_cos.defjvp
def _sin_cos_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    s, c = _sin_cos(x)
    return (s, c), (c * dx, -s * dx)


# ------------------------------------------------------------------------------------ hand-derived form
def inertia_coefficients(p):
    """(α, β, γ, δ) of seed 001 eq. 34."""
    m2, m3, m4 = p["m2"], p["m3"], p["m4"]
    l1, l2 = p["l1"], p["l2"]
    alpha = p["Iz1"] + p["r1"] ** 2 * p["m1"] + l1**2 * (m2 + m3 + m4)
    beta = p["Iz2"] + p["Iz3"] + p["Iz4"] + l2**2 * (m3 + m4) + m2 * p["r2"] ** 2
    gamma = l1 * l2 * (m3 + m4) + l1 * m2 * p["r2"]
    delta = p["Iz3"] + p["Iz4"]
    return alpha, beta, gamma, delta


def mass_matrix(q, p):
    """M(q) of seed 001 eq. 34."""
    _check_q(q)
    a, b, g, d = inertia_coefficients(p)
    c2 = _sin_cos(q[1])[1]
    zero = jnp.zeros_like(c2)
    return jnp.stack(
        [
            jnp.stack([a + b + 2 * g * c2, b + g * c2, d + zero, zero]),
            jnp.stack([b + g * c2, b + zero, d + zero, zero]),
            jnp.stack([d + zero, d + zero, d + zero, zero]),
            jnp.stack([zero, zero, zero, p["m4"] + zero]),
        ]
    )


def coriolis_matrix(q, qd, p):
    """C(q, q̇) of seed 001 eq. 35, so that C q̇ holds the Coriolis and centrifugal torques."""
    _check_q(q)
    _check_q(qd, "qd")
    _, _, g, _ = inertia_coefficients(p)
    h = g * _sin_cos(q[1])[0]
    zero = jnp.zeros_like(h)
    return jnp.stack(
        [
            jnp.stack([-h * qd[1], -h * (qd[0] + qd[1]), zero, zero]),
            jnp.stack([h * qd[0], zero, zero, zero]),
            jnp.stack([zero, zero, zero, zero]),
            jnp.stack([zero, zero, zero, zero]),
        ]
    )


def gravity_vector(q, p):
    """G of seed 001 eq. 36: only the prismatic joint carries weight."""
    _check_q(q)
    zero = jnp.zeros_like(q[0])
    return jnp.stack([zero, zero, zero, p["m4"] * p["g"] + zero])


def given_force(q, qd, t, p):
    """Q = τ - C q̇ - G (seed 001 eq. 11 rearranged as eq. 1)."""
    return p["tau"] - coriolis_matrix(q, qd, p) @ qd - gravity_vector(q, p)


# ------------------------------------------------------------------------------------ Lagrangian form
def end_effector(q, p):
    """End-effector position p(q) of the forward kinematics, seed 001 eq. 39."""
    _check_q(q)
    (s1, c1), (s12, c12) = _sin_cos(q[0]), _sin_cos(q[0] + q[1])
    l1, l2 = p["l1"], p["l2"]
    return jnp.stack([-l1 * s1 - l2 * s12, l1 * c1 + l2 * c12, p["l0"] + q[3]])


def _link_centres(q, p):
    """Mass centres of links 1, 2 and of the link-3/4 assembly (planar x, y) and the height of link 4."""
    s1, c1 = jnp.sin(q[0]), jnp.cos(q[0])
    s12, c12 = jnp.sin(q[0] + q[1]), jnp.cos(q[0] + q[1])
    centre1 = jnp.stack([-p["r1"] * s1, p["r1"] * c1])
    centre2 = jnp.stack([-p["l1"] * s1 - p["r2"] * s12, p["l1"] * c1 + p["r2"] * c12])
    centre34 = end_effector(q, p)[:2]
    return centre1, centre2, centre34


def kinetic_energy(q, qd, t, p):
    """T = Σ ½ m_i |v_i|² + ½ I_i ω_i², from the link positions (independent of eq. 34)."""
    _check_q(q)
    _check_q(qd, "qd")
    _, (v1, v2, v34) = jax.jvp(lambda q_: _link_centres(q_, p), (q,), (qd,))
    w1, w12, w123 = qd[0], qd[0] + qd[1], qd[0] + qd[1] + qd[2]
    translation = (
        p["m1"] * v1 @ v1 + p["m2"] * v2 @ v2 + (p["m3"] + p["m4"]) * v34 @ v34 + p["m4"] * qd[3] ** 2
    )
    rotation = p["Iz1"] * w1**2 + p["Iz2"] * w12**2 + (p["Iz3"] + p["Iz4"]) * w123**2
    return 0.5 * (translation + rotation)


def potential_energy(q, t, p):
    """V = m4 g z4 (eq. 19; links 1-3 move in a horizontal plane)."""
    _check_q(q)
    return p["m4"] * p["g"] * (p["l0"] + q[3])


def _applied_torque(q, qd, t, p):
    return p["tau"]


# ------------------------------------------------------------------------------------ constraints
def desired_trajectory(t, p):
    """The desired end-effector path of seed 001 eq. 40: a helix of radius R about (0, y_c)."""
    s, c = _sin_cos(p["omega"] * t)
    return jnp.stack([p["radius"] * s, p["center_y"] + p["radius"] * c, p["vz"] * t])


def trajectory_constraint(q, t, p):
    """φ(q, t) of seed 001 eq. 48: position error (x, y), orientation q1 + q2 + q3, and z error."""
    position = end_effector(q, p)
    desired = desired_trajectory(t, p)
    return jnp.stack(
        [position[0] - desired[0], position[1] - desired[1], q[0] + q[1] + q[2], position[2] - desired[2]]
    )


def inverse_kinematics(t, p):
    """The 'theoretical' joint values of seed 001 Figures 2-4: the exact solution of φ(q, t) = 0 on the branch
    q2 > 0 (the branch of the printed initial conditions)."""
    x, y, z = desired_trajectory(t, p)
    l1, l2 = p["l1"], p["l2"]
    c2 = (x**2 + y**2 - l1**2 - l2**2) / (2 * l1 * l2)
    q2 = jnp.arccos(jnp.clip(c2, -1.0, 1.0))
    # end effector at angle atan2(y, x) = π/2 + q1 + atan2(l2 sin q2, l1 + l2 cos q2)
    q1 = jnp.arctan2(y, x) - 0.5 * jnp.pi - jnp.arctan2(l2 * jnp.sin(q2), l1 + l2 * jnp.cos(q2))
    q1 = jnp.mod(q1 + jnp.pi, 2 * jnp.pi) - jnp.pi
    return jnp.stack([q1, q2, -(q1 + q2), z - p["l0"]])


def path_error(ts, q, p):
    """e(t) = |p(q(t)) - p_d(t)| at the saved times ``ts`` of one trajectory ``q`` (T, 4) (eq. 39-40)."""
    return jax.vmap(lambda t, qi: jnp.linalg.norm(end_effector(qi, p) - desired_trajectory(t, p)))(ts, q)


def constraint(*, stabilized: bool = True) -> Holonomic:
    """The trajectory constraint eq. 48, with per-row Baumgarte gains ``p["alpha"], p["beta"]`` (eq. 52)."""
    stab = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="linear") if stabilized else None
    return Holonomic(phi=trajectory_constraint, baumgarte=stab, name="trajectory")


def system(*, lagrangian: bool = False, stabilized: bool = True) -> System:
    """The constrained SCARA of seed 001: hand-derived M, C, G (eq. 34-36), or, with ``lagrangian=True``, the
    same dynamics derived by ukjax from T and V. ``stabilized=False`` drops the Baumgarte terms (the paper's
    Figures 2-5); setting ``p["alpha"] = p["beta"] = 0`` does the same inside one compiled function."""
    fields = dict(
        n=4,
        constraints=(constraint(stabilized=stabilized),),
        coordinate_names=COORDINATES,
    )
    if lagrangian:
        return System.from_lagrangian(
            kinetic_energy, potential_energy, applied_force=_applied_torque, **fields
        )
    return System(
        mass=lambda q, t, p: mass_matrix(q, p),
        force=given_force,
        kinetic=kinetic_energy,
        potential=potential_energy,
        **fields,
    )


# ------------------------------------------------------------------------------------ Monte-Carlo batch
# Parameters that describe the robot (perturbed per scenario by sample_scenarios); the trajectory, gravity,
# torques and Baumgarte gains stay at the paper's values.
PERTURBED = ("m1", "m2", "m3", "m4", "l1", "l2", "r1", "r2", "Iz1", "Iz2", "Iz3", "Iz4")
VELOCITY_NOISE = 0.01


def sample_scenarios(key, params, q0, qd0, count, *, spread, angle_noise_deg):
    """``count`` perturbed copies of (params, q0, qd0), with a leading batch axis on every leaf.

    Every mass, length and moment of inertia (``PERTURBED``) is scaled by a uniform factor in
    [1 - spread, 1 + spread]; the joint angles get a normal error of ``angle_noise_deg`` degrees, the stroke
    a tenth of a millimetre per degree of that, the initial velocities 1 % (``VELOCITY_NOISE``). Pure and
    jax-traceable (usable inside a compiled sampler).
    """
    keys = jax.random.split(key, len(PERTURBED) + 2)
    batch = {}
    for name, value in params.items():
        value = jnp.asarray(value)
        batch[name] = jnp.broadcast_to(value, (count, *value.shape))
    for k, name in zip(keys, PERTURBED, strict=False):
        factor = 1.0 + spread * jax.random.uniform(k, (count,), params[name].dtype, -1.0, 1.0)
        batch[name] = params[name] * factor
    sigma = math.radians(angle_noise_deg)
    scale = jnp.asarray([sigma, sigma, sigma, 1e-4 * angle_noise_deg], q0.dtype)
    q0s = q0 + scale * jax.random.normal(keys[-2], (count, q0.shape[0]), q0.dtype)
    qd0s = qd0 * (1.0 + VELOCITY_NOISE * jax.random.normal(keys[-1], (count, qd0.shape[0]), qd0.dtype))
    return batch, q0s, qd0s
