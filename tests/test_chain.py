"""ukjax.models.chain: the pinned k-link chain of the scaling benchmark, against an independent NumPy
Jacobian formulation, energy balance and the redundant (pinned k times) variant."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

from ukjax.models import chain

LINKS = 5
PARAMS = {**chain.default_params(LINKS), "length": jnp.asarray([0.3, 0.2, 0.25, 0.4, 0.15]),
          "mass": jnp.asarray([0.5, 0.2, 0.3, 0.6, 0.1]), "damping": jnp.asarray(0.0)}  # fmt: skip
PARAMS["tip"] = chain.tip(chain.initial_state(PARAMS)[0], PARAMS)
SYSTEM = chain.system(LINKS)
REDUNDANT = chain.system(LINKS, copies=LINKS)
T0 = jnp.asarray(0.0)


def _numpy_mass_and_gravity(q, p):
    """M = Σ m_i J_iᵀJ_i + (m_i l_i²/12) 1_iᵀ1_i and the gravity force -∂V/∂q, from
    ∂c_i/∂θ_j = ẑ × (c_i - r_j) for j ≤ i (a relative joint angle turns everything beyond joint j about
    r_j), in NumPy."""
    q, length, mass = (np.asarray(x) for x in (q, p["length"], p["mass"]))
    phi = np.cumsum(q)
    u = np.stack([np.cos(phi), np.sin(phi)], axis=1)
    r = np.concatenate([np.zeros((1, 2)), np.cumsum(length[:, None] * u, axis=0)])
    c = r[:-1] + 0.5 * length[:, None] * u
    k = len(q)
    M, G = np.zeros((k, k)), np.zeros(k)
    for i in range(k):
        J = np.zeros((2, k))
        for j in range(i + 1):
            d = c[i] - r[j]
            J[:, j] = [-d[1], d[0]]
        ones = (np.arange(k) <= i).astype(float)
        M += mass[i] * J.T @ J + mass[i] * length[i] ** 2 / 12.0 * np.outer(ones, ones)
        G -= mass[i] * float(p["g"]) * J[1]
    return M, G


@pytest.fixture(scope="module")
def terms():
    return jax.jit(lambda q, qd: SYSTEM.mass_and_given_force(q, qd, T0, PARAMS))


def test_mass_matrix_and_gravity_match_numpy(terms):
    """At random configurations, at rest (no velocity terms): M and Q = gravity against the NumPy Jacobian
    formulation (float64, O(1) entries: 1e-12)."""
    rng = np.random.default_rng(0)
    for _ in range(3):
        q = jnp.asarray(rng.uniform(-np.pi, np.pi, LINKS))
        M, Q = terms(q, jnp.zeros(LINKS))
        M_ref, G_ref = _numpy_mass_and_gravity(q, PARAMS)
        assert_tree_allclose((M, Q), (M_ref, G_ref), rtol=1e-12, atol=1e-12)


def test_power_balance(terms):
    """Unconstrained and undamped, dE/dt = ∂E/∂q q̇ + ∂E/∂q̇ q̈ = 0 with q̈ = M⁻¹Q: checks the velocity
    (Coriolis, centrifugal) terms of Q at random states. Terms are O(10-100) W; 1e-10 absolute."""
    energy = lambda q, qd: chain.kinetic_energy(q, qd, T0, PARAMS) + chain.potential_energy(q, T0, PARAMS)

    @jax.jit
    def power(q, qd, M, Q):  # one compiled call per state
        qdd = jnp.linalg.solve(M, Q)
        dE_dq, dE_dqd = jax.grad(energy, argnums=(0, 1))(q, qd)
        return dE_dq @ qd + dE_dqd @ qdd

    rng = np.random.default_rng(1)
    for _ in range(3):
        q, qd = jnp.asarray(rng.uniform(-3, 3, LINKS)), jnp.asarray(rng.normal(0, 3, LINKS))
        M, Q = terms(q, qd)
        assert abs(float(power(q, qd, M, Q))) < 1e-10


def test_initial_states_are_consistent():
    """φ(q0) = 0 and J q̇0 = 0 for every scenario (rounding only: 1e-14), and the tip Jacobian has rank 2."""
    q0s, qd0s = chain.scenarios(PARAMS, 4, speed=1.0, seed=3)
    J, tip, (position, velocity) = jax.jit(  # one compiled call
        lambda q0s, qd0s: (
            jax.jacfwd(chain.tip)(q0s[0], PARAMS),
            chain.tip(q0s[0], PARAMS),
            SYSTEM.residuals(q0s[1], qd0s[1], T0, PARAMS),
        )
    )(q0s, qd0s)
    J, qd0s = np.asarray(J), np.asarray(qd0s)
    assert np.linalg.matrix_rank(J) == 2
    assert float(np.max(np.abs(np.asarray(tip) - np.asarray(PARAMS["tip"])))) < 1e-14
    assert float(np.max(np.abs(qd0s @ J.T))) < 1e-14
    assert float(np.min(np.linalg.norm(qd0s, axis=1))) > 0.1  # the scenarios do move
    assert float(jnp.max(jnp.abs(position))) < 1e-14 and float(jnp.max(jnp.abs(velocity))) < 1e-14


def test_redundant_pins_give_the_same_motion():
    """Pinning the tip k times (2k rows of rank 2, consistent) gives the q̈ of one pin, on and off the
    constraint (Baumgarte terms rotate with their rows, so b stays consistent); 1e-10 for the generalized
    inverse of a rank-deficient 10 x 10 Gram matrix at O(10) accelerations."""
    qdd = jax.jit(jax.vmap(lambda q, qd: SYSTEM.acceleration(q, qd, T0, PARAMS)))
    qdd_redundant = jax.jit(jax.vmap(lambda q, qd: REDUNDANT.acceleration(q, qd, T0, PARAMS)))
    q0s, qd0s = chain.scenarios(PARAMS, 3, speed=1.0, seed=4)
    off = q0s + 0.01 * jnp.asarray(np.random.default_rng(5).normal(size=q0s.shape))
    for qs in (q0s, off):
        assert_tree_allclose(qdd_redundant(qs, qd0s), qdd(qs, qd0s), rtol=1e-10, atol=1e-10)
    A, _ = jax.jit(lambda q, qd: REDUNDANT.constraint_equations(q, qd, T0, PARAMS))(q0s[0], qd0s[0])
    assert A.shape == (2 * LINKS, LINKS) and np.linalg.matrix_rank(np.asarray(A)) == 2


def test_bad_input():
    with pytest.raises(ValueError, match="links"):
        chain.system(1)
    with pytest.raises(ValueError, match="copies"):
        chain.system(3, copies=0)
    with pytest.raises(ValueError, match="count"):
        chain.scenarios(PARAMS, 0)
