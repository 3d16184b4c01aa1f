"""Five-bar parallelogram linkage of seed 004: rank-11 Jacobian, consistent start, UK vs the 1-DOF
closed form."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference
from scipy.integrate import solve_ivp

import ukjax
from ukjax.models import five_bar

P = five_bar.default_params()
SYSTEM = five_bar.system()
PHIS = jnp.array([math.pi / 4, 1.0, -0.3, -2.0, 2.9])
OMEGAS = jnp.array([0.0, 1.5, -2.0, 0.7, 3.0])


def _reduced(p):
    """The linkage as one pendulum in the crank angle φ, written independently of the model: cranks
    rotate about their ground pins (inertia I + m L²/4 each), the coupler translates on a circle of
    radius L."""
    m, I, L, m2, g = (float(p[k]) for k in ("m", "I", "L", "m2", "g"))
    inertia = 3 * (I + m * L**2 / 4) + m2 * L**2
    weight = (3 * m * L / 2 + m2 * L) * g
    return lambda phi: -weight * np.cos(phi) / inertia, inertia, weight


def _full_acceleration(phi, omega, p):
    """q̈ (12,) of the assembled linkage from the reduced φ̈, by differentiating the positions by hand."""
    phidd = _reduced(p)[0](phi)
    L = float(p["L"])
    ax, ay = -np.sin(phi) * phidd - np.cos(phi) * omega**2, np.cos(phi) * phidd - np.sin(phi) * omega**2
    crank = [L / 2 * ax, L / 2 * ay, phidd]
    return np.array(crank * 3 + [L * ax, L * ay, 0.0])


def test_jacobian_rank_and_consistent_start():
    # Seed 004: 12 equations of rank 11 (one redundant crank), F = 1. The rank drops to 10 at the flat
    # configuration φ = 0 (cranks along the ground line). Rank by NumPy's SVD with its default tolerance.
    jac = jax.jacfwd(five_bar.revolute_constraints)
    for phi, omega in zip(PHIS, OMEGAS, strict=True):
        p = dict(P, phi0=phi, omega0=omega)
        q0, qd0 = five_bar.initial_state(p)
        J = np.asarray(jac(q0, 0.0, p))
        assert J.shape == (12, 12)
        assert np.linalg.matrix_rank(J) == 11
        # exactly assembled: φ(q0) = 0 and J q̇0 = 0 to rounding of O(1) coordinates
        assert_tree_allclose(five_bar.revolute_constraints(q0, 0.0, p), jnp.zeros(12), atol=1e-15)
        assert_tree_allclose(J @ np.asarray(qd0), np.zeros(12), atol=1e-15)
    flat = five_bar.configuration(jnp.asarray(0.0), P)
    assert np.linalg.matrix_rank(np.asarray(jac(flat, 0.0, P))) == 10


# The Cholesky (eq. 35) and SVD forms run in CI; the other four algorithms cost ~5 s of compilation each.
METHODS = [
    "cholesky",
    "svd",
    *(pytest.param(m, marks=pytest.mark.slow) for m in ukjax.PINV_METHODS if m != "svd"),
]


@pytest.mark.parametrize("method", METHODS)
def test_uk_acceleration_equals_one_dof_pendulum(method):
    # The UK equation with a rank-11 A (seed 004 eq. 31; every pseudoinverse algorithm) gives the unique
    # constrained motion, which is the reduced pendulum. Both are float64 evaluations of O(10) quantities; the
    # rank decision separates σ ≈ 0.2 from σ ≈ 1e-16, so agreement to 1e-9 has a wide margin.
    accel = jax.jit(jax.vmap(lambda q, qd: SYSTEM.acceleration(q, qd, 0.0, P, method=method, rtol=1e-10)))
    states = [
        five_bar.initial_state(dict(P, phi0=phi, omega0=w)) for phi, w in zip(PHIS, OMEGAS, strict=True)
    ]
    q0 = jnp.stack([s[0] for s in states])
    qd0 = jnp.stack([s[1] for s in states])
    ours = accel(q0, qd0)
    ref = np.stack([_full_acceleration(float(phi), float(w), P) for phi, w in zip(PHIS, OMEGAS, strict=True)])
    assert_tree_allclose(ours, ref, rtol=1e-9, atol=1e-9)


def test_gradient_of_acceleration_wrt_coupler_mass():
    # d q̈ / d m2 (forward mode, one compiled function) against central differences (step 1e-6
    # on m2 = 2: round-off ~1e-9 on O(1) derivatives) and against the closed form of the reduced pendulum.
    q0, qd0 = five_bar.initial_state(dict(P, omega0=jnp.asarray(1.0)))
    accel = lambda m2: SYSTEM.acceleration(q0, qd0, 0.0, dict(P, m2=m2))
    # Reverse mode through the same pseudoinverse derivative is covered by the SCARA and spiral tests; here it
    # would triple the compile time of the 12 x 12 problem.
    both = jax.jit(lambda m2: jax.jvp(accel, (m2,), (jnp.ones_like(m2),)))
    _, grad = both(P["m2"])
    fd = central_difference(lambda m2: both(m2)[0], P["m2"], jnp.asarray(1.0))
    assert_tree_allclose(grad, fd, rtol=1e-6, atol=1e-7)
    phidd = _reduced(P)[0](math.pi / 4)
    _, inertia, weight = _reduced(P)
    # closed form: ∂φ̈/∂m2 = -g L cos φ / J - φ̈ L² / J
    expected = -float(P["g"]) * math.cos(math.pi / 4) / inertia - phidd / inertia
    assert abs(float(grad[2]) - expected) < 1e-9


T_SHORT = 0.4


@pytest.fixture(scope="module")
def solutions():
    # One compiled program for both runs: zero gains are eq. 31, the paper's gains eq. 32.
    q0, qd0 = five_bar.initial_state(P)
    ts = jnp.linspace(0.0, T_SHORT, 9)
    runs = []
    for alpha, beta in ((0.0, 0.0), (1000.0, 100.0)):
        p = dict(P, alpha=jnp.asarray(alpha), beta=jnp.asarray(beta))
        runs.append(
            ukjax.simulate(SYSTEM, q0, qd0, p, t1=T_SHORT, ts=ts, rtol=1e-9, atol=1e-9, pinv_rtol=1e-9)
        )
    return runs


def test_short_simulation_keeps_constraints_and_energy(solutions):
    # 0.4 s from rest at φ = 45° (before the first flat configuration). Tsit5 at rtol = atol = 1e-9: measured
    # max |φ| ~1e-11 (no stabilization) and ~1e-13 (Baumgarte), energy drift ~1e-10 J, crank angle within 1e-9
    # of the reduced pendulum integrated by SciPy (DOP853, rtol 1e-12). Bounds: 1e-8 on violation and angle,
    # 1e-7 J on energy (no dissipation: energy is an invariant).
    assert all(int(sol.status) == ukjax.RESULTS.success for sol in solutions)
    f, _, _ = _reduced(P)
    ref = solve_ivp(
        lambda t, y: [y[1], f(y[0])],
        (0.0, T_SHORT),
        [math.pi / 4, 0.0],
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=np.asarray(solutions[0].ts),
    )
    for sol in solutions:  # the energy does not depend on the Baumgarte gains
        q, qd = sol.q, sol.qd
        assert float(sol.max_position_residual) < 1e-8
        energy = jax.vmap(lambda q_, qd_: SYSTEM.energy(q_, qd_, 0.0, P))(q, qd)
        assert float(jnp.max(jnp.abs(energy - energy[0]))) < 1e-7
        assert_tree_allclose(q[:, 2], ref.y[0], atol=1e-8)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="12 body coordinates"):
        five_bar.revolute_constraints(jnp.zeros(9), 0.0, P)
    with pytest.raises(ValueError, match=r"\(12,\)"):
        SYSTEM.acceleration(jnp.zeros(12), jnp.zeros(11), 0.0, P)
