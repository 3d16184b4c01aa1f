"""The SCARA of Xu & Liu 2017 written the way a user writes it: plain functions for M, Q and the
Baumgarte-stabilized A, b, copied from the paper's equations, with nothing ukjax-specific inside.

M of eq. 34, C q̇ of eq. 35, G of eq. 36; the end effector (eq. 39) follows the helix of eq. 40 with the
orientation and stroke of eq. 46-48, and the constraint is stabilized as φ̈ + α φ̇ + β φ = 0 (eq. 52), so the
second-order form is A q̈ = b with A = ∂φ/∂q and b = -(Ȧ q̇ + φ_tt) - α φ̇ - β φ (eq. 49, 54). The parameters
are the paper's (α = 0.5, β = 200; g = 9.81). This is the "user-written model" of the benchmarks; the shipped
:mod:`ukjax.models.scara` is the same robot written with ukjax's helpers.
"""

from __future__ import annotations

import jax.numpy as jnp

import ukjax
from ukjax.constraints import AccelerationLevel

RADIUS, CENTRE_Y, OMEGA, RISE = 0.05, 0.35, 0.4 * jnp.pi, 0.02


def params(dtype=jnp.float64) -> dict:
    values = {
        "m1": 20.0, "m2": 15.0, "m3": 15.0, "m4": 0.5, "l1": 0.2, "l2": 0.25, "r1": 0.1, "r2": 0.125,
        "Iz1": 0.27, "Iz2": 0.31, "Iz3": 0.02, "Iz4": 0.0001, "g": 9.81, "alpha": 0.5, "beta": 200.0,
    }  # fmt: skip
    return {k: jnp.asarray(v, dtype) for k, v in values.items()}


def mass_matrix(q, t, p):
    a = p["Iz1"] + p["r1"] ** 2 * p["m1"] + p["l1"] ** 2 * (p["m2"] + p["m3"] + p["m4"])
    b = p["Iz2"] + p["Iz3"] + p["Iz4"] + p["l2"] ** 2 * (p["m3"] + p["m4"]) + p["m2"] * p["r2"] ** 2
    g = p["l1"] * p["l2"] * (p["m3"] + p["m4"]) + p["l1"] * p["m2"] * p["r2"]
    d = p["Iz3"] + p["Iz4"]
    c2 = jnp.cos(q[1])
    return jnp.array([
        [a + b + 2 * g * c2, b + g * c2, d, 0.0],
        [b + g * c2, b, d, 0.0],
        [d, d, d, 0.0],
        [0.0, 0.0, 0.0, p["m4"]],
    ])  # fmt: skip


def forces(q, qd, t, p):
    g = p["l1"] * p["l2"] * (p["m3"] + p["m4"]) + p["l1"] * p["m2"] * p["r2"]
    s2 = jnp.sin(q[1])
    coriolis = jnp.array([-g * s2 * qd[1] * (2 * qd[0] + qd[1]), g * s2 * qd[0] ** 2, 0.0, 0.0])
    gravity = jnp.array([0.0, 0.0, 0.0, p["m4"] * p["g"]])
    return -coriolis - gravity


def constraint_matrix(q, qd, t, p):
    l1, l2 = p["l1"], p["l2"]
    c1, s1 = jnp.cos(q[0]), jnp.sin(q[0])
    c12, s12 = jnp.cos(q[0] + q[1]), jnp.sin(q[0] + q[1])
    return jnp.array([
        [-l1 * c1 - l2 * c12, -l2 * c12, 0.0, 0.0],
        [-l1 * s1 - l2 * s12, -l2 * s12, 0.0, 0.0],
        [1.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ])  # fmt: skip


def constraint_rhs(q, qd, t, p):
    l1, l2 = p["l1"], p["l2"]
    c1, s1 = jnp.cos(q[0]), jnp.sin(q[0])
    c12, s12 = jnp.cos(q[0] + q[1]), jnp.sin(q[0] + q[1])
    swt, cwt = jnp.sin(OMEGA * t), jnp.cos(OMEGA * t)
    phi = jnp.array([
        -l1 * s1 - l2 * s12 - RADIUS * swt,
        l1 * c1 + l2 * c12 - CENTRE_Y - RADIUS * cwt,
        q[0] + q[1] + q[2],
        q[3] - RISE * t,
    ])  # fmt: skip
    phi_dot = constraint_matrix(q, qd, t, p) @ qd - jnp.array(
        [RADIUS * OMEGA * cwt, -RADIUS * OMEGA * swt, 0.0, RISE]
    )
    w = qd[0] + qd[1]
    convective = jnp.array([
        -l1 * s1 * qd[0] ** 2 - l2 * s12 * w**2 - RADIUS * OMEGA**2 * swt,
        l1 * c1 * qd[0] ** 2 + l2 * c12 * w**2 - RADIUS * OMEGA**2 * cwt,
        0.0,
        0.0,
    ])  # fmt: skip
    return convective - p["alpha"] * phi_dot - p["beta"] * phi


def system() -> ukjax.System:
    return ukjax.System(
        mass=mass_matrix,
        force=forces,
        n=4,
        constraints=(AccelerationLevel(A=constraint_matrix, b=constraint_rhs, name="helix"),),
    )
