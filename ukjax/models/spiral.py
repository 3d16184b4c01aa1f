"""A particle moving along a logarithmic spiral at a prescribed angular rate, in polar coordinates.

Udwadia-Kalaba equation review (Chinese J. Mech. Eng.), seed 002 §8.1, eq. 51-59.

Coordinates ``q = (r, θ)`` of a particle of mass m in a vertical plane (x = r cos θ, y = r sin θ, gravity
along -y). Kinetic energy T = ½ m (ṙ² + r² θ̇²), potential V = m g r sin θ, so ``M = diag(m, m r²)`` and
``Q = (m r θ̇² - m g sin θ, -2 m r ṙ θ̇ - m g r cos θ)``; ``M⁻¹ Q`` is the unconstrained acceleration a₀ of
eq. 51-52. (Seed 002 eq. 56 then writes the constraint force with M = I although M = diag(1, r²) in polar
coordinates; here the constraint matrix A is square and invertible, so the constrained motion q̈ = A⁻¹ b
does not depend on M and both readings give the same trajectory.)

Constraints, eq. 53 (rheonomic, holonomic): ``r = exp(k θ)`` (k = 0.1) and ``θ = θ₀ - ω t`` (θ₀ = 30, ω = 1).
Their second-order form (eq. 55) is ``[[1, -k e^{kθ}], [0, 1]] q̈ = (k² e^{kθ} θ̇², 0)``; ukjax derives it by
automatic differentiation. The paper integrates without stabilization; ``system(stabilized=True)`` adds the
Baumgarte terms ``φ̈ + 2αφ̇ + β²φ = 0`` with ``p["alpha"]``, ``p["beta"]``.

Initial conditions (seed 002 §8.1): r(0) = e³, θ(0) = 30, ṙ(0) = -0.1 e³, θ̇(0) = -1, consistent with the
constraints, so the errors ε₁ (position, eq. 58) and ε₂ (velocity, eq. 59) measure numerical drift only.
"""

from __future__ import annotations

import jax.numpy as jnp

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System

COORDINATES = ("r", "theta")


def _f64(value):
    return jnp.asarray(value, dtype=jnp.float64)


def default_params() -> dict:
    """Seed 002 §8.1: unit mass, spiral r = e^{0.1 θ}, θ = 30 - t. ``g`` is not printed; 9.81 m/s² is used."""
    return {
        "m": _f64(1.0),
        "g": _f64(9.81),
        "k": _f64(0.1),
        "theta0": _f64(30.0),
        "rate": _f64(1.0),
        "alpha": _f64(0.0),
        "beta": _f64(0.0),
    }


def initial_state(params):
    """(q0, qd0) = ((e^{kθ₀}, θ₀), (-k ω e^{kθ₀}, -ω)): the paper's (e³, 30), (-0.1 e³, -1)."""
    k, theta0, rate = params["k"], params["theta0"], params["rate"]
    r0 = jnp.exp(k * theta0)
    return jnp.stack([r0, theta0]), jnp.stack([-k * rate * r0, -rate])


def _check(q, name="q"):
    if jnp.shape(q) != (2,):
        raise ValueError(f"the spiral particle has 2 coordinates (r, theta); {name} has shape {jnp.shape(q)}")


def kinetic_energy(q, qd, t, p):
    """T = ½ m (ṙ² + r² θ̇²)."""
    _check(q)
    _check(qd, "qd")
    return 0.5 * p["m"] * (qd[0] ** 2 + q[0] ** 2 * qd[1] ** 2)


def potential_energy(q, t, p):
    """V = m g y = m g r sin θ."""
    _check(q)
    return p["m"] * p["g"] * q[0] * jnp.sin(q[1])


def unconstrained_acceleration(q, qd, p):
    """a₀ of seed 002 eq. 51-52: (r θ̇² - g sin θ, (-2 ṙ θ̇ - g cos θ) / r)."""
    _check(q)
    _check(qd, "qd")
    r, theta = q
    rd, thetad = qd
    g = p["g"]
    return jnp.stack([r * thetad**2 - g * jnp.sin(theta), (-2 * rd * thetad - g * jnp.cos(theta)) / r])


def spiral_constraint(q, t, p):
    """φ(q, t) of seed 002 eq. 53: (r - e^{kθ}, θ - θ₀ + ω t)."""
    _check(q)
    r, theta = q
    return jnp.stack([r - jnp.exp(p["k"] * theta), theta - p["theta0"] + p["rate"] * t])


def errors(q, qd, t, p):
    """(ε₁, ε₂) of seed 002 eq. 58-59: norms of the position and velocity residuals of eq. 53-54."""
    _check(q)
    _check(qd, "qd")
    r, theta = q
    rd, thetad = qd
    e = jnp.exp(p["k"] * theta)
    eps1 = jnp.sqrt((r - e) ** 2 + (theta + p["rate"] * t - p["theta0"]) ** 2)
    eps2 = jnp.sqrt((rd - p["k"] * e * thetad) ** 2 + (thetad + p["rate"]) ** 2)
    return eps1, eps2


def system(*, stabilized: bool = False) -> System:
    """The constrained particle of seed 002 §8.1, dynamics derived by ukjax from T and V (eq. 51)."""
    stab = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="quadratic") if stabilized else None
    return System.from_lagrangian(
        kinetic_energy,
        potential_energy,
        n=2,
        constraints=(Holonomic(phi=spiral_constraint, baumgarte=stab, name="spiral"),),
        coordinate_names=COORDINATES,
    )
