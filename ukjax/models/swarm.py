"""Swarm of mobile robots held to a velocity-level swarm constraint (UK review, seed 002 §8.2).

Robot i (i = 1..N, N = 5 in the paper) is a point mass in the horizontal plane, q⁽ⁱ⁾ = (x_i, y_i), M_i q̈⁽ⁱ⁾
= F_i + F_i^c with M_i = m_i I₂ and F_i = 0 (seed 002 eq. 60). The swarm behaviour is the velocity-level
(nonholonomic) constraint

    q̇⁽ⁱ⁾ = -Σ_{j≠i} ∇_{q⁽ⁱ⁾} G_ij(q⁽ⁱ⁾, q⁽ʲ⁾),                                        (eq. 61)
    G_ij = -a_r ‖q⁽ⁱ⁾ - q⁽ʲ⁾‖ + (a_a/2) ‖q⁽ⁱ⁾ - q⁽ʲ⁾‖² + G₀                             (eq. 62)

with a_r = 0.5, a_a = 1, G₀ = 50: attraction at long range, repulsion closer than a_r / a_a = 0.5, the
aggregation model of Gazi and Passino cited by the paper. Its error is β_i = q̇⁽ⁱ⁾ + Σ_{j≠i} ∇G_ij (eq. 65).
ukjax writes eq. 61 as one :class:`~ukjax.constraints.Nonholonomic` constraint ψ = β = 0 on the stacked q ∈
R²ᴺ; its second-order form is A = I (eq. 64, A_i = I) and b = φ - κβ, where φ is eq. 63, obtained by
automatic differentiation of ∇G. The UK force eq. 64 then gives q̈ = φ - κβ, so β̇ = -κβ and β(t) = e^{-κt}
β(0) exactly.

With κ = 0 (eq. 63 literally) β̇ = 0: a robot that starts off the constraint never reaches it. The paper
reports ‖β‖ falling from a large initial value below 0.01, which requires a stabilizing term; ukjax uses the
first-order stabilization ψ̇ + κψ = 0 of :class:`~ukjax.constraints.Nonholonomic` with κ = 2 s⁻¹ (‖β‖ falls
by e⁻² per second).

The paper's table of initial conditions (Table 1) is missing from the text; :data:`INITIAL_POSITIONS` is the
choice of ukjax: robots scattered over about 7 m x 6 m, two of them (1 and 2) only 0.27 m apart (inside the
repulsion range; the pull of the distant robots first brings them to 0.241 m at t ≈ 0.84 s, then they
separate, the behaviour the paper describes), all at rest, so β(0) = ∇U(q(0)) is large (‖β(0)‖ ≈ 30.6 m/s).
The robots aggregate into a regular pentagon (sides ≈ 0.362 m, diagonals ≈ 0.585 m) around the centroid,
which does not move: Σ_i q̇⁽ⁱ⁾ = Σ_i β_i, and Σ_i ∇_{q⁽ⁱ⁾} U = 0 because U is translation invariant.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.constraints import Nonholonomic
from ukjax.system import System

NUM_ROBOTS = 5
INITIAL_POSITIONS = np.array([[0.0, 0.0], [0.25, 0.1], [4.0, 1.5], [-3.0, 2.5], [1.0, -3.5]])
"""Initial robot positions (m), one row per robot, chosen by ukjax (the paper's Table 1 is missing)."""


def default_params(num_robots: int = NUM_ROBOTS) -> dict:
    """m_i = 2 kg (seed 002 §8.2), G_ij of eq. 62 (a_r = 0.5, a_a = 1, G₀ = 50), stabilization κ = 2 s⁻¹."""
    f = lambda x: jnp.asarray(x, jnp.float64)
    return {
        "mass": jnp.full((num_robots,), 2.0, jnp.float64),
        "repulsion": f(0.5),
        "attraction": f(1.0),
        "offset": f(50.0),
        "kappa": f(2.0),
    }


def num_robots(params) -> int:
    """N, read from the shape of ``params["mass"]`` (one mass per robot)."""
    return int(jnp.shape(params["mass"])[-1])


def pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays (i, j), i < j, of every pair of N robots."""
    i, j = np.array(list(itertools.combinations(range(n), 2))).T
    return i, j


def _positions(q, n):
    if jnp.ndim(q) != 1 or jnp.shape(q)[0] != 2 * n:
        raise ValueError(f"a swarm of {n} robots needs q of shape ({2 * n},), got {jnp.shape(q)}")
    return jnp.reshape(q, (n, 2))


def pair_potential(qi, qj, p):
    """G_ij = -a_r ‖q⁽ⁱ⁾ - q⁽ʲ⁾‖ + (a_a/2) ‖q⁽ⁱ⁾ - q⁽ʲ⁾‖² + G₀ (seed 002 eq. 62)."""
    d2 = jnp.sum((qi - qj) ** 2, axis=-1)
    return -p["repulsion"] * jnp.sqrt(d2) + 0.5 * p["attraction"] * d2 + p["offset"]


def swarm_potential(q, p):
    """U = Σ_{i<j} G_ij, so that ∇_{q⁽ⁱ⁾} U = Σ_{j≠i} ∇_{q⁽ⁱ⁾} G_ij (G_ij = G_ji)."""
    n = num_robots(p)
    x = _positions(q, n)
    i, j = pairs(n)
    return jnp.sum(pair_potential(x[i], x[j], p))


def desired_velocity(q, p):
    """The right-hand side of seed 002 eq. 61: q̇ = -∇U(q), stacked (x_1, y_1, x_2, ...)."""
    return -jax.grad(swarm_potential)(q, p)


def performance_error(q, qd, t, p):
    """β = q̇ + ∇U(q), the swarm performance error of seed 002 eq. 65 (stacked, shape (2N,))."""
    if jnp.shape(qd) != jnp.shape(q):
        raise ValueError(f"q and qd must have the same shape, got {jnp.shape(q)} and {jnp.shape(qd)}")
    return qd - desired_velocity(q, p)


def mass_matrix(q, t, p):
    """M = diag(m_1, m_1, ..., m_N, m_N) (seed 002 eq. 60)."""
    return jnp.diag(jnp.repeat(p["mass"], 2))


def given_force(q, qd, t, p):
    """F = 0 (seed 002 §8.2)."""
    return jnp.zeros_like(q)


def system(n: int = NUM_ROBOTS) -> System:
    """N robots held to eq. 61 by the UK constraint force (eq. 64), stabilized by β̇ = -κβ (see the module)."""
    return System(
        mass=mass_matrix,
        force=given_force,
        n=2 * n,
        constraints=(Nonholonomic(psi=performance_error, gain=lambda p: p["kappa"], name="swarm eq. 61"),),
        coordinate_names=tuple(f"{axis}{k + 1}" for k in range(n) for axis in "xy"),
    )


def initial_state(params):
    """(q0, qd0): :data:`INITIAL_POSITIONS` with all robots at rest (only for the paper's five robots)."""
    n = num_robots(params)
    if n != NUM_ROBOTS:
        raise ValueError(f"initial_state holds positions for {NUM_ROBOTS} robots; params describe {n}")
    q0 = jnp.asarray(INITIAL_POSITIONS.reshape(-1), jnp.float64)
    return q0, jnp.zeros_like(q0)


def pairwise_distances(q, n: int = NUM_ROBOTS):
    """‖q⁽ⁱ⁾ - q⁽ʲ⁾‖ for every pair i < j, in the order of :func:`pairs`."""
    x = _positions(q, n)
    i, j = pairs(n)
    return jnp.linalg.norm(x[i] - x[j], axis=-1)


def beta_closed_form(t, beta0, params):
    """β(t) = e^{-κt} β(0), the error dynamics β̇ = -κβ the stabilized constraint imposes; t of any shape."""
    t = jnp.asarray(t, jnp.float64)
    return jnp.exp(-params["kappa"] * t)[..., None] * jnp.asarray(beta0, jnp.float64)
