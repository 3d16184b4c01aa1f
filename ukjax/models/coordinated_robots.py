"""Two coordinated 3-link planar robots holding a load: the redundantly actuated closed chain, seed 000 §V.

Liu, Zhen, Huang, Zhao, Chen & Shao (2015). The two robots and the rigidly held object form a five-link chain
from the base of robot 1 at (0, 0) to the base of robot 2 at (L, 0); link 3 is the object. Coordinates
q = (θ1, ..., θ5), each the absolute angle of a link from the horizontal (n = 5).

Unconstrained dynamics (the open five-link serial chain, seed 000 eq. 48-59): M q̈ + C(q, q̇) q̇ + G(q) = τ,
with M, C, G of appendix eq. A2-A4; the given force is Q = -C q̇ - G (τ = 0, eq. 55-56). In closed form,
with μ_i = Σ_{k>i} m_k,

    M_ii = (m_i/4 + μ_i) l_i² + I_i, M_ij = (m_j/2 + μ_j) l_i l_j cos(θ_i - θ_j) (i < j, M symmetric),
    C_ij = (m_j/2 + μ_j) l_i l_j sin(θ_i - θ_j) θ̇_j (i < j; C_ji the same coefficient, sin(θ_j - θ_i)
    θ̇_i), G_i = (m_i/2 + μ_i) g l_i cos θ_i.

Passive constraint (the end of link 5 hinged to the ground, eq. 60-63): Σ l_i cos θ_i = L, Σ l_i sin θ_i
= 0, Baumgarte-stabilized with gains ``alpha_p``, ``beta_p``.

Servo constraints (the task of the object, eq. 64-68): x3 = 1.5 l, y3 = (l/2)(1 - cos t), θ3 = 0 with (x3,
y3) = (l1 cos θ1 + l2 cos θ2 + (l3/2) cos θ3, l1 sin θ1 + l2 sin θ2 + (l3/2) sin θ3) (eq. 65), gains
``alpha``, ``beta``. Actuation: six joint torques u1...u6 mapped by the constant B of eq. 70 (u1 at the base
of robot 1, u6 at the base of robot 2). 5 coordinates - 2 passive constraints = 3 degrees of freedom, 3
servo constraints, 6 actuators: redundant actuation, resolved by the minimum-norm control u = (C B̄)⁺ b̄ (eq.
71, computed with the passive constraints projected out as derived in :mod:`ukjax.control`).

Parameters (§VI): m_i = I_i = l_i = l = 1, g = 9.8. Not in the text: L and Table I (initial state) and the
Baumgarte gains. L = 3l, because the task x3 = 1.5 l sits midway between the bases only then (the symmetric
layout of Fig. 3). The initial state is derived, not copied: :func:`initial_state` solves φ_passive(q0) = 0
and φ_servo(q0, 0) = 0 (five equations, five unknowns) by Newton's method from an elbow-up guess, then the
velocity equations (both constraint Jacobians times q̇0 = the rheonomic terms, here zero at t = 0) by least
squares (:func:`ukjax.control.consistent_state`). The result is θ = (π/3, -π/3, 0, π/3, -π/3), q̇0 = 0:
robot 2 is the mirror image of robot 1 (θ4 = -θ2, θ5 = -θ1). Baumgarte gains α = β = 10 (§III-B asks
α = β > 0).
"""

from __future__ import annotations

import jax.numpy as jnp

from ukjax import control
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System

N_LINKS = 5

# eq. 70: columns are the joint torques u1..u6, rows the links they act on.
B_MATRIX = (
    (1.0, -1.0, 0.0, 0.0, 0.0, 0.0),
    (0.0, 1.0, -1.0, 0.0, 0.0, 0.0),
    (0.0, 0.0, 1.0, 1.0, 0.0, 0.0),
    (0.0, 0.0, 0.0, -1.0, 1.0, 0.0),
    (0.0, 0.0, 0.0, 0.0, -1.0, 1.0),
)

# Reported in §VI (read from Figures 9-14): (min, max) of u1..u6.
PAPER_CONTROL_RANGES = ((0.0, 10.0), (3.0, 5.0), (-8.0, -5.5), (4.5, 10.0), (-4.5, 0.5), (-5.0, 0.0))


def _outboard_mass(m):
    """μ_i = Σ_{k>i} m_k."""
    return jnp.cumsum(m[::-1])[::-1] - m


def _coupling(p):
    """a_ij = (m_j/2 + μ_j) l_i l_j for i < j (and a_ji = a_ij), the coefficient of eq. A2 and A3."""
    m, l = p["m"], p["l"]
    mu = _outboard_mass(m)
    column = m / 2 + mu
    upper = jnp.triu(jnp.ones((N_LINKS, N_LINKS)), 1) * column[None, :]
    return (upper + upper.T) * jnp.outer(l, l)


def mass(q, t, p):
    """M of seed 000 eq. A2."""
    m, l, inertia = p["m"], p["l"], p["I"]
    diagonal = (m / 4 + _outboard_mass(m)) * l**2 + inertia
    return _coupling(p) * jnp.cos(q[:, None] - q[None, :]) + jnp.diag(diagonal)


def coriolis(q, qd, p):
    """C(q, q̇) of seed 000 eq. A3: C_ij = a_ij sin(θ_i - θ_j) θ̇_j, zero diagonal."""
    return _coupling(p) * jnp.sin(q[:, None] - q[None, :]) * qd[None, :]


def gravity(q, p):
    """G of seed 000 eq. A4."""
    m, l = p["m"], p["l"]
    return (m / 2 + _outboard_mass(m)) * p["g"] * l * jnp.cos(q)


def given_force(q, qd, t, p):
    """Q = τ - C q̇ - G with τ = 0 (seed 000 eq. 55)."""
    return -coriolis(q, qd, p) @ qd - gravity(q, p)


def centroids(q, p):
    """Centre of mass of each link (5, 2): the joints before it plus half its own length (seed 000 eq. 57)."""
    l = p["l"]
    ends = l[:, None] * jnp.stack([jnp.cos(q), jnp.sin(q)], axis=1)
    return jnp.cumsum(ends, axis=0) - ends / 2


def kinetic(q, qd, t, p):
    """T = Σ ½ m_i |v_ci|² + ½ I_i θ̇_i² (seed 000 eq. 49-50 in energy form)."""
    v = jnp.stack([jnp.zeros(()), jnp.zeros(())])
    velocities = []
    l = p["l"]
    for i in range(N_LINKS):
        own = 0.5 * l[i] * qd[i] * jnp.stack([-jnp.sin(q[i]), jnp.cos(q[i])])
        velocities.append(v + own)
        v = v + l[i] * qd[i] * jnp.stack([-jnp.sin(q[i]), jnp.cos(q[i])])
    speeds2 = jnp.stack([vi @ vi for vi in velocities])
    return 0.5 * jnp.sum(p["m"] * speeds2) + 0.5 * jnp.sum(p["I"] * qd**2)


def potential(q, t, p):
    """V = Σ m_i g y_ci (gravity along -y, seed 000 eq. 53 with g = (0, g))."""
    return p["g"] * jnp.sum(p["m"] * centroids(q, p)[:, 1])


def closure(q, t, p):
    """φ of eq. 60: the end of link 5 at the base of robot 2, (Σ l_i cos θ_i - L, Σ l_i sin θ_i)."""
    l = p["l"]
    return jnp.stack([l @ jnp.cos(q) - p["L"], l @ jnp.sin(q)])


def object_pose(q, p):
    """(x3, y3, θ3) of eq. 65: the centre of the object (link 3) and its angle."""
    l = p["l"]
    x3 = l[0] * jnp.cos(q[0]) + l[1] * jnp.cos(q[1]) + l[2] / 2 * jnp.cos(q[2])
    y3 = l[0] * jnp.sin(q[0]) + l[1] * jnp.sin(q[1]) + l[2] / 2 * jnp.sin(q[2])
    return jnp.stack([x3, y3, q[2]])


def task(t, p):
    """The desired object pose of eq. 64: (1.5 l, (l/2)(1 - cos t), 0)."""
    l = p["l_task"]
    t = jnp.asarray(t, l.dtype)
    return jnp.stack([1.5 * l, l / 2 * (1 - jnp.cos(t)), jnp.zeros_like(l)])


def servo_phi(q, t, p):
    """φ_s = pose(q) - task(t) (seed 000 eq. 64-65)."""
    return object_pose(q, p) - task(t, p)


def actuation(q, t, p):
    """B of eq. 70 (5 x 6)."""
    return jnp.asarray(B_MATRIX, jnp.result_type(q))


PASSIVE = Holonomic(closure, baumgarte=Baumgarte(lambda p: (p["alpha_p"], p["beta_p"])), name="closed chain")
SERVO = Holonomic(servo_phi, baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"])), name="object task")


def hand_passive_second_order(q, qd, p):
    """(Â, b̂) of eq. 62-63 typed from the paper (no stabilization)."""
    l = p["l"]
    A = jnp.stack([-l * jnp.sin(q), l * jnp.cos(q)])
    b = jnp.stack([l @ (jnp.cos(q) * qd**2), l @ (jnp.sin(q) * qd**2)])
    return A, b


def hand_servo_second_order(q, qd, t, p):
    """(A, b) of eq. 67-68 typed from the paper (no stabilization)."""
    l = p["l"]
    w = jnp.stack([l[0], l[1], l[2] / 2])
    s, c, v2 = jnp.sin(q[:3]), jnp.cos(q[:3]), qd[:3] ** 2
    zeros = jnp.zeros(2, q.dtype)
    A = jnp.stack(
        [
            jnp.concatenate([-w * s, zeros]),
            jnp.concatenate([w * c, zeros]),
            jnp.zeros(N_LINKS, q.dtype).at[2].set(1.0),
        ]
    )
    b = jnp.stack([w @ (c * v2), w @ (s * v2) + p["l_task"] / 2 * jnp.cos(t), jnp.zeros((), q.dtype)])
    return A, b


def system() -> System:
    """The controlled closed chain of seed 000 §V (eq. 55-70, appendix A2-A4)."""
    return System(
        mass=mass,
        force=given_force,
        n=N_LINKS,
        constraints=(PASSIVE,),
        actuation=actuation,
        servo_constraints=(SERVO,),
        kinetic=kinetic,
        potential=potential,
        coordinate_names=tuple(f"theta{i + 1}" for i in range(N_LINKS)),
    )


def default_params() -> dict:
    """§VI: m_i = I_i = l_i = l = 1, g = 9.8; L = 3l and α = β = 10 (not in the text, see the module)."""
    f = lambda x: jnp.asarray(x, jnp.float64)
    return {
        "m": f([1.0] * N_LINKS),
        "I": f([1.0] * N_LINKS),
        "l": f([1.0] * N_LINKS),
        "g": f(9.8),
        "L": f(3.0),
        "l_task": f(1.0),
        "alpha_p": f(10.0),
        "beta_p": f(10.0),
        "alpha": f(10.0),
        "beta": f(10.0),
    }


GUESS = (1.0, -1.0, 0.1, 1.0, -1.0)  # elbows up, object roughly level


def initial_state(params, *, t0=0.0, guess=GUESS):
    """(q0, q̇0) satisfying the passive and servo constraints at t0, by Newton's method from ``guess``.

    See :func:`ukjax.control.consistent_state`; for the default parameters this is
    θ = (π/3, -π/3, 0, π/3, -π/3), q̇0 = 0.
    """
    q_guess = jnp.asarray(guess, jnp.float64)
    return control.consistent_state(system(), q_guess, jnp.zeros_like(q_guess), t0, params)
