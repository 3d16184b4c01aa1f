"""The overconstrained five-bar parallelogram linkage in planar body coordinates (n = 12, Jacobian rank 11).

de Falco, Pennestrì & Vita, "Influence of pseudoinverse calculations on multibody simulations by means of
the UK formulation", seed 004, "SIMULATION RESULTS" and Figure 2.

Reading of the geometry (the paper's Figure 1 is not in its text): three parallel cranks of length L = 1
(mass m = 1, central moment of inertia I = 0.1) are pinned to the ground at (0, 0), (d, 0) and (2d, 0)
with d = L2 / 2, and their tips are pinned to a coupler of length L2 = 2 (m2 = 2, I2 = 0.2) at its left
end, its middle and its right end. The three cranks and the coupler form a parallelogram with a redundant
middle crank, so the 12 constraint equations of the six revolute pairs have rank 11 and the linkage has
F = 12 - 11 = 1 degree of freedom (seed 004: "n = 12 coordinates and k = 12 algebraic constraints ...
Jacobian rank is r = 11").

Coordinates (Nikravesh's planar body coordinates, one triple per body):
``q = (x1, y1, φ1, x2, y2, φ2, x3, y3, φ3, xc, yc, φc)`` with (x, y) the mass centre (mid-point) and φ the
angle of the body axis from the ground line. Mass matrix ``M = diag(m, m, I, m, m, I, m, m, I, m2, m2, I2)``
(constant), given force gravity ``Q = (0, -m g, 0, ..., 0, -m2 g, 0)`` with no dissipation. Revolute pair
between point P of body i and point R of body j: ``r_i + A(φ_i) s_i^P - r_j - A(φ_j) s_j^R = 0`` (two
equations each):

* ground pins: ``r_k - (L/2) u(φ_k) - ((k - 1) d, 0) = 0``, k = 1, 2, 3,
* coupler pins: ``r_k + (L/2) u(φ_k) - r_c - (k - 2) d u(φ_c) = 0``, k = 1, 2, 3,

with u(φ) = (cos φ, sin φ). The constrained motion is unique although the Jacobian is rank deficient: the
UK equation with a Moore-Penrose inverse handles the redundant constraint (seed 004 eq. 31/32). Baumgarte
stabilization follows eq. 32's quadratic convention φ̈ + 2αφ̇ + β²φ = 0 with the paper's α = 1000, β = 100.

Initial state (not printed in seed 004; our choice, in the parameters): all cranks at angle ``p["phi0"]``
from the ground line (default π/4, the coupler above the ground) turning at ``p["omega0"]`` (default 0,
released from rest). Falling under gravity, the linkage swings through the flat configurations φ = 0 and
φ = -π, where the cranks are collinear with the ground line and the Jacobian rank drops to 10 for an
instant: the situation in which the choice of pseudoinverse and rank tolerance matters.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System

N_COORDINATES = 12
COORDINATES = tuple(f"{c}{b}" for b in ("1", "2", "3", "c") for c in ("x", "y", "phi"))


def _f64(value):
    return jnp.asarray(value, dtype=jnp.float64)


def default_params() -> dict:
    """Seed 004 values: L = 1, m = 1, I = 0.1 per crank; L2 = 2, m2 = 2, I2 = 0.2 for the coupler;
    Baumgarte α = 1000, β = 100 (eq. 32). g = 9.81 m/s² and the initial crank angle are our choices."""
    return {
        "L": _f64(1.0),
        "m": _f64(1.0),
        "I": _f64(0.1),
        "L2": _f64(2.0),
        "m2": _f64(2.0),
        "I2": _f64(0.2),
        "g": _f64(9.81),
        "alpha": _f64(1000.0),
        "beta": _f64(100.0),
        "phi0": _f64(math.pi / 4),
        "omega0": _f64(0.0),
    }


def _check(q, name="q"):
    if jnp.shape(q) != (N_COORDINATES,):
        raise ValueError(f"the five-bar linkage has 12 body coordinates; {name} has shape {jnp.shape(q)}")


def _u(phi):
    return jnp.stack([jnp.cos(phi), jnp.sin(phi)])


def mass_matrix(q, p):
    """The constant diagonal mass matrix of the four bodies (Nikravesh body coordinates)."""
    _check(q)
    crank = jnp.stack([p["m"], p["m"], p["I"]])
    coupler = jnp.stack([p["m2"], p["m2"], p["I2"]])
    return jnp.diag(jnp.concatenate([crank, crank, crank, coupler]))


def gravity_force(q, qd, t, p):
    """Weights of the four bodies along -y."""
    _check(q)
    zero = jnp.zeros_like(p["m"])
    crank = jnp.stack([zero, -p["m"] * p["g"], zero])
    coupler = jnp.stack([zero, -p["m2"] * p["g"], zero])
    return jnp.concatenate([crank, crank, crank, coupler])


def revolute_constraints(q, t, p):
    """φ(q) of the six revolute pairs, 12 equations: three ground pins, then three crank-coupler pins."""
    _check(q)
    half, d = 0.5 * p["L"], 0.5 * p["L2"]
    bodies = q.reshape(4, 3)
    rc, phic = bodies[3, :2], bodies[3, 2]
    ground, coupler = [], []
    for k in range(3):
        r, phi = bodies[k, :2], bodies[k, 2]
        pin = jnp.stack([k * d, jnp.zeros_like(d)])
        ground.append(r - half * _u(phi) - pin)
        coupler.append(r + half * _u(phi) - rc - (k - 1) * d * _u(phic))
    return jnp.concatenate(ground + coupler)


def configuration(phi, p):
    """Body coordinates of the assembled linkage, all cranks at angle ``phi`` (coupler parallel to ground)."""
    half, d, L = 0.5 * p["L"], 0.5 * p["L2"], p["L"]
    u = _u(phi)
    zero = jnp.zeros_like(phi)
    cranks = [jnp.stack([k * d + half * u[0], half * u[1], phi]) for k in range(3)]
    coupler = jnp.stack([d + L * u[0], L * u[1], zero])
    return jnp.concatenate([*cranks, coupler])


def initial_state(params):
    """(q0, qd0): the assembled linkage at crank angle ``phi0``, crank rate ``omega0``; exactly consistent."""
    q0 = configuration(params["phi0"], params)
    # d/dφ of the assembled configuration, times the crank rate
    phi, omega = params["phi0"], params["omega0"]
    half, L = 0.5 * params["L"], params["L"]
    du = jnp.stack([-jnp.sin(phi), jnp.cos(phi)])
    zero = jnp.zeros_like(phi)
    crank = jnp.stack([half * du[0], half * du[1], jnp.ones_like(phi)])
    coupler = jnp.stack([L * du[0], L * du[1], zero])
    return q0, omega * jnp.concatenate([crank, crank, crank, coupler])


def crank_angle(q):
    """The angle of the first crank: the linkage's one degree of freedom, for plots."""
    _check(q)
    return q[2]


def system(*, stabilized: bool = True) -> System:
    """The five-bar parallelogram of seed 004 with the UK equation; ``stabilized`` adds eq. 32's Baumgarte
    terms, gains ``p["alpha"], p["beta"]`` (zero gains give eq. 31 in the same compiled function)."""
    stab = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="quadratic") if stabilized else None

    def kinetic(q, qd, t, p):
        return 0.5 * qd @ mass_matrix(q, p) @ qd

    def potential(q, t, p):
        return -gravity_force(q, jnp.zeros_like(q), t, p) @ q

    return System(
        mass=lambda q, t, p: mass_matrix(q, p),
        force=gravity_force,
        n=N_COORDINATES,
        constraints=(Holonomic(phi=revolute_constraints, baumgarte=stab, name="revolute pairs"),),
        kinetic=kinetic,
        potential=potential,
        coordinate_names=COORDINATES,
    )
