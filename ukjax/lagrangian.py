"""Helpers for writing a Lagrangian by hand: the kinetic energy of a rigid body from its pose.

A rigid body whose orientation is ``R(q)`` (body to world, a rotation matrix) and whose centre of mass is at
``x(q)`` has the kinetic energy (König's theorem; e.g. Goldstein, Poole & Safko 2002, §5.1 and eq. 5.9)

    T = ½ m |ẋ|² + ½ ωᵀ I ω,

with I the inertia tensor about the centre of mass in body axes and ω the body-frame angular velocity, read
off the skew-symmetric matrix ω̂ = Rᵀ Ṙ (Murray, Li & Sastry 1994, §2.4, eq. 2.49: the body angular
velocity). Both ẋ and Ṙ are directional derivatives along q̇, one forward-mode product each
(``jax.jvp``), so a user never derives Euler-angle kinematics by hand. The result is a pure function of
arrays that :meth:`ukjax.System.from_lagrangian` differentiates again (M = ∂²T/∂q̇², Coriolis terms).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def _evaluated(function: Callable, q, qd, name: str, shapes: tuple[tuple[int, ...], ...]):
    """(value, directional derivative along q̇) of ``function(q)``, its shape checked against ``shapes``."""
    value, rate = jax.jvp(function, (q,), (qd,))
    if jnp.shape(value) not in shapes:
        expected = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name}(q) must return an array of shape {expected}, got {jnp.shape(value)}")
    return value, rate


def body_angular_velocity(rotation: Callable, q, qd):
    """The body-frame angular velocity ω (3,) of the orientation ``rotation(q) -> R`` (3, 3) moving at q̇.

    ω̂ = Rᵀ Ṙ with Ṙ = (∂R/∂q) q̇ by one ``jax.jvp`` (Murray, Li & Sastry 1994, eq. 2.49); ω is the vee of
    the skew-symmetric part ½(ω̂ - ω̂ᵀ), which equals ω̂ for an exactly orthogonal R and discards the
    symmetric part that rounding or a not quite orthogonal R leave.
    """
    R, R_dot = _evaluated(rotation, q, qd, "rotation", ((3, 3),))
    W = R.T @ R_dot
    W = 0.5 * (W - W.T)
    return jnp.stack([W[2, 1], W[0, 2], W[1, 0]])


def rigid_body_kinetic_energy(rotation: Callable, position: Callable, q, qd, mass, inertia):
    """T = ½ m |ẋ|² + ½ ωᵀ I ω of one rigid body at (q, q̇) (König's theorem, see the module docstring).

    Args:
        rotation: ``R(q) -> (3, 3)``, the body's orientation (body axes to world axes).
        position: ``x(q) -> (3,)`` (or (2,) for planar motion), its centre of mass in world axes.
        q, qd: the generalized coordinates and velocities (n,).
        mass: m, a scalar.
        inertia: the inertia tensor about the centre of mass in body axes, (3, 3), or its principal
            moments (3,) when the body axes are principal.

    Functions of time or of the parameters are closed over by the caller, e.g.
    ``lambda q, qd, t, p: rigid_body_kinetic_energy(R, lambda q: x(q, p), q, qd, p["m"], p["I"])``. Sum
    the bodies' energies for a multibody Lagrangian.
    """
    q, qd = jnp.asarray(q), jnp.asarray(qd)
    if q.ndim != 1 or q.shape != qd.shape:
        raise ValueError(f"q and qd must be vectors of one shape (n,), got {q.shape} and {qd.shape}")
    inertia = jnp.asarray(inertia)
    if inertia.shape == (3,):
        inertia = jnp.diag(inertia)
    if inertia.shape != (3, 3):
        raise ValueError(f"inertia must be a (3, 3) tensor or principal moments (3,), got {inertia.shape}")
    if jnp.ndim(mass) != 0:
        raise ValueError(f"mass must be a scalar, got shape {jnp.shape(mass)}")
    _, velocity = _evaluated(position, q, qd, "position", ((3,), (2,)))
    omega = body_angular_velocity(rotation, q, qd)
    return 0.5 * mass * (velocity @ velocity) + 0.5 * (omega @ inertia @ omega)
