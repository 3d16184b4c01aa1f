"""Two masses joined by a spring, one actuator: the underactuated example of Liu et al. (2015), seed 000 §IV.

Coordinates q = (x1, x2), the positions of m1 and m2 on a line. With T = ½ m1 ẋ1² + ½ m2 ẋ2² and
V = ½ k (x2 - x1 - l)² (seed 000 eq. 36), Lagrange's equations are (eq. 37-38)

    m1 ẍ1 - k (x2 - x1 - l) = F,    m2 ẍ2 + k (x2 - x1 - l) = 0,

so M = diag(m1, m2) (eq. 39 prints M₂₂ = x2; it is m2), the given force is the spring force
Q = k (x2 - x1 - l) (1, -1) (seed 000 calls it Q^c in eq. 40, it is not a constraint force), and the control
force is B F with B = (1, 0)ᵀ (eq. 41). No passive constraints.

Servo constraint (eq. 44-46): x2 - x1 = 2l, kept by the one actuator on m1 (n = 2, one control:
underactuated).
In ukjax it is a :class:`~ukjax.constraints.Holonomic` constraint with Baumgarte stabilization
φ̈ + 2αφ̇ + β²φ = 0 (seed 000 §III-B, α = β); the gains are ``params["alpha"]``, ``params["beta"]``.
On the constraint manifold (φ = φ̇ = 0) the control is the closed form eq. 47,

    F = (C B̄)⁺ b̄ = -(1 + m1/m2) k (x2 - x1 - l),

and off it the Baumgarte terms add m1 (2αφ̇ + β²φ) (:func:`closed_form_control`).

Parameters: seed 000 gives no numbers for this example; :func:`default_params` uses m1 = 1, m2 = 2, k = 10,
l = 1 (SI units) and α = β = 5.
"""

from __future__ import annotations

import jax.numpy as jnp

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System


def _stretch(q, p):
    return q[1] - q[0] - p["l"]


def mass(q, t, p):
    """M = diag(m1, m2), seed 000 eq. 39 (with M₂₂ = m2)."""
    return jnp.diag(jnp.stack([p["m1"], p["m2"]]))


def spring_force(q, qd, t, p):
    """Q = k (x2 - x1 - l) (1, -1), the spring force (seed 000 eq. 37-38, 40)."""
    return p["k"] * _stretch(q, p) * jnp.array([1.0, -1.0])


def kinetic(q, qd, t, p):
    """T = ½ m1 ẋ1² + ½ m2 ẋ2² (seed 000 eq. 36)."""
    return 0.5 * p["m1"] * qd[0] ** 2 + 0.5 * p["m2"] * qd[1] ** 2


def potential(q, t, p):
    """V = ½ k (x2 - x1 - l)² (seed 000 eq. 36)."""
    return 0.5 * p["k"] * _stretch(q, p) ** 2


def actuation(q, t, p):
    """B = (1, 0)ᵀ: the force F acts on m1 only (seed 000 eq. 41)."""
    return jnp.array([[1.0], [0.0]])


def servo_phi(q, t, p):
    """φ = x2 - x1 - 2l (seed 000 eq. 44)."""
    return (q[1] - q[0] - 2.0 * p["l"])[None]


SERVO = Holonomic(servo_phi, baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"])), name="x2 - x1 = 2l")


def system() -> System:
    """The controlled two-mass spring of seed 000 §IV (eq. 36-46)."""
    return System(
        mass=mass,
        force=spring_force,
        n=2,
        actuation=actuation,
        servo_constraints=(SERVO,),
        kinetic=kinetic,
        potential=potential,
        coordinate_names=("x1", "x2"),
    )


def default_params() -> dict:
    """m1 = 1, m2 = 2, k = 10, l = 1, α = β = 5 (seed 000 gives no numbers; α = β as in §III-B)."""
    values = {"m1": 1.0, "m2": 2.0, "k": 10.0, "l": 1.0, "alpha": 5.0, "beta": 5.0}
    return {key: jnp.asarray(value, jnp.float64) for key, value in values.items()}


def initial_state(params, *, offset=0.0, velocity=0.0):
    """x1 = 0, x2 = 2l + offset, both masses moving at ``velocity``; ``offset = 0`` satisfies eq. 44."""
    l = params["l"]
    q0 = jnp.stack([jnp.zeros_like(l), 2.0 * l + offset])
    qd0 = jnp.full((2,), velocity, jnp.float64)
    return q0, qd0


def closed_form_control(q, qd, p):
    """F = -(1 + m1/m2) k (x2 - x1 - l) + m1 (2α φ̇ + β² φ): eq. 47 plus the Baumgarte terms (zero on eq. 44).

    Derivation: C B̄ = A M⁻¹ B = -1/m1 and b̄ = -2αφ̇ - β²φ + k (x2 - x1 - l)(1/m1 + 1/m2), so F = -m1 b̄.
    """
    phi = q[1] - q[0] - 2.0 * p["l"]
    phi_dot = qd[1] - qd[0]
    eq47 = -(1.0 + p["m1"] / p["m2"]) * p["k"] * _stretch(q, p)
    return eq47 + p["m1"] * (2.0 * p["alpha"] * phi_dot + p["beta"] ** 2 * phi)


def servo_error_closed_form(t, phi0, phi_dot0, p):
    """φ(t) of φ̈ + 2αφ̇ + β²φ = 0 for α = β: (φ0 + (φ̇0 + α φ0) t) e^{-α t} (critical damping)."""
    alpha = p["alpha"]
    return (phi0 + (phi_dot0 + alpha * phi0) * t) * jnp.exp(-alpha * t)
