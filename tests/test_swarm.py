"""Swarm of five robots, seed 002 §8.2: the model against hand-coded eq. 61-64, and the simulated swarm
against the closed-form decay of β, the fixed centroid, the equilibrium pentagon and no collisions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_plain_jit_vmap_agree, assert_tree_allclose, central_difference, random_normal

import ukjax
from ukjax.models import swarm
from ukjax.studies._common import first_time_below
from ukjax.studies.swarm import pentagon_distances

PARAMS = swarm.default_params()
SYSTEM = swarm.system()
ACCELERATION_JIT = jax.jit(SYSTEM.acceleration)


def _random_state(seed):
    key_q, key_v = jax.random.split(jax.random.PRNGKey(seed))
    q = jnp.asarray(swarm.INITIAL_POSITIONS.reshape(-1)) + 0.5 * random_normal(key_q, (10,), jnp.float64)
    return q, random_normal(key_v, (10,), jnp.float64)


def _eq61_numpy(q, p):
    """-Σ_{j≠i} (q⁽ⁱ⁾ - q⁽ʲ⁾)(a_a - a_r/d_ij): eq. 61 with ∇G_ij of eq. 62 differentiated by hand."""
    x, a_r, a_a = np.asarray(q).reshape(5, 2), float(p["repulsion"]), float(p["attraction"])
    v = np.zeros_like(x)
    for i in range(5):
        for j in range(5):
            if i != j:
                r = x[i] - x[j]
                v[i] -= r * (a_a - a_r / np.linalg.norm(r))
    return v.reshape(-1)


def _eq63_numpy(q, qd, p):
    """φ_i of seed 002 eq. 63 (written for a_a = 1, a_r = 0.5), term by term."""
    x, xd = np.asarray(q).reshape(5, 2), np.asarray(qd).reshape(5, 2)
    phi = np.zeros_like(x)
    for i in range(5):
        for j in range(5):
            if i != j:
                r, rd = x[i] - x[j], xd[i] - xd[j]
                d2 = r @ r
                phi[i] -= rd * (1 - 0.5 / np.sqrt(d2)) + 0.5 * r * d2**-1.5 * (r @ rd)
    return phi.reshape(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_matches_hand_derived_eq61_to_eq64(seed):
    q, qd = _random_state(seed)
    # Autodiff and the hand formulas evaluate the same closed forms: round-off of O(10) terms of O(10).
    assert_tree_allclose(swarm.desired_velocity(q, PARAMS), _eq61_numpy(q, PARAMS), rtol=1e-12, atol=1e-12)
    # A = ∂β/∂q̇ = I (eq. 64), so with κ = 0, M ∝ I and F = 0 the UK acceleration is b = φ of eq. 63.
    A = jax.jacfwd(swarm.performance_error, argnums=1)(q, qd, 0.0, PARAMS)
    assert_tree_allclose(A, np.eye(10), rtol=0, atol=0)
    no_gain = {**PARAMS, "kappa": jnp.asarray(0.0)}
    phi = _eq63_numpy(q, qd, PARAMS)
    assert_tree_allclose(ACCELERATION_JIT(q, qd, 0.0, no_gain), phi, rtol=1e-11, atol=1e-11)
    # UK constraint force eq. 64 with A = I and F = 0 by numpy's pinv: M^{1/2}(A M^{-1/2})⁺(b - A M⁻¹F).
    beta = np.asarray(qd) - _eq61_numpy(q, PARAMS)
    b_stab = _eq63_numpy(q, qd, PARAMS) - float(PARAMS["kappa"]) * beta
    M_half = np.sqrt(2.0) * np.eye(10)
    force = M_half @ np.linalg.pinv(np.linalg.inv(M_half)) @ b_stab
    assert_tree_allclose(ACCELERATION_JIT(q, qd, 0.0, PARAMS), force / 2.0, rtol=1e-11, atol=1e-11)


def test_pentagon_is_an_equilibrium_of_eq61():
    side, diagonal = pentagon_distances(PARAMS)
    R = side / (2 * np.sin(np.pi / 5))
    angles = 2 * np.pi * np.arange(5) / 5
    q = jnp.asarray(np.stack([R * np.cos(angles), R * np.sin(angles)], axis=1).reshape(-1))
    # brentq converges to ~1e-12 in R; the velocity is Lipschitz in R with constant O(10).
    assert_tree_allclose(swarm.desired_velocity(q, PARAMS), np.zeros(10), rtol=0, atol=1e-10)
    distances = np.sort(np.asarray(swarm.pairwise_distances(q)))
    assert_tree_allclose(distances, np.array([side] * 5 + [diagonal] * 5), atol=1e-12)


@pytest.fixture(scope="module")
def solution():
    q0, qd0 = swarm.initial_state(PARAMS)
    return ukjax.simulate(SYSTEM, q0, qd0, PARAMS, t1=10.0, rtol=1e-10, atol=1e-10)


def test_beta_decays_as_the_closed_form_and_falls_below_0p01(solution):
    assert int(solution.status) == int(ukjax.RESULTS.success), solution.message
    beta = np.asarray(solution.velocity_residual)
    closed = np.asarray(swarm.beta_closed_form(solution.ts, beta[0], PARAMS))
    # β̇ = -κβ holds exactly in the UK equation; the integrator (rtol = atol = 1e-10, ~250 steps) adds O(1e-10)
    # per unit of ‖β(0)‖ ≈ 30: 1e-8 absolute leaves two orders of margin and catches any wrong gain or sign.
    assert_tree_allclose(beta, closed, rtol=0, atol=1e-8)
    norms = np.linalg.norm(beta, axis=1)
    assert norms[0] > 30.0 and norms[-1] < 0.01
    # ‖β(t)‖ = e^{-κt}‖β(0)‖ reaches 0.01 at ln(‖β(0)‖/0.01)/κ; log interpolation of an exponential is exact.
    expected = np.log(norms[0] / 0.01) / float(PARAMS["kappa"])
    assert abs(first_time_below(solution.ts, norms, 0.01) - expected) < 1e-6


def test_no_collision_fixed_centroid_and_pentagon(solution):
    distances = np.asarray(jax.vmap(swarm.pairwise_distances)(solution.q))
    # Saved every 0.05 s; the closest approach (0.241 m, robots 1-2 near t = 0.84 s, relative speed < 0.2 m/s)
    # stays far above 0.2 m, the margin covering motion between saves.
    assert distances.min() > 0.2
    x = np.asarray(solution.q).reshape(-1, 5, 2)
    centroid = x.mean(axis=1)
    # Σ_i q̇⁽ⁱ⁾ = Σ_i β_i(0) e^{-κt} = 0 for robots at rest: the centroid moves only by integration error.
    assert_tree_allclose(centroid, np.broadcast_to(centroid[0], centroid.shape), rtol=0, atol=1e-9)
    side, diagonal = pentagon_distances(PARAMS)
    # After 10 s the slowest formation mode has decayed far below 1e-4 m.
    assert_tree_allclose(np.sort(distances[-1]), np.array([side] * 5 + [diagonal] * 5), rtol=0, atol=1e-4)


def _probe(q, qd, p):
    """A scalar touching every public model function, for the transformation tests."""
    return (
        swarm.swarm_potential(q, p)
        + jnp.sum(swarm.desired_velocity(q, p) ** 2)
        + jnp.sum(swarm.performance_error(q, qd, 0.0, p) * qd)
        + jnp.sum(swarm.pairwise_distances(q))
        + jnp.sum(swarm.mass_matrix(q, 0.0, p) @ qd + swarm.given_force(q, qd, 0.0, p))
        + jnp.sum(swarm.beta_closed_form(0.3, qd, p))
    )


PROBE_JIT = jax.jit(_probe)


def test_plain_jit_vmap_agree():
    states = [_random_state(s) for s in range(3)]
    # Same operations, different fusion: round-off only.
    assert_plain_jit_vmap_agree(_probe, states, PARAMS, rtol=1e-12, atol=1e-12)


def test_gradients_match_central_differences():
    q, qd = _random_state(4)
    grads = jax.jit(jax.grad(_probe, argnums=(0, 2)))(q, qd, PARAMS)
    direction = random_normal(jax.random.PRNGKey(9), (10,), jnp.float64)
    fd = central_difference(lambda x: PROBE_JIT(x, qd, PARAMS), q, direction, eps=1e-5)
    # Central differences with eps = 1e-5 on a smooth function of O(1e3): truncation ~eps² f''' and round-off
    # ~1e-16 |f| / eps, both below 1e-6 relative.
    assert abs(float(grads[0] @ direction) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
    for name in ("repulsion", "attraction", "kappa", "mass"):
        leaf = PARAMS[name]
        unit = jnp.ones_like(leaf)
        fd = central_difference(
            lambda x, name=name: PROBE_JIT(q, qd, {**PARAMS, name: x}), leaf, unit, eps=1e-5
        )
        assert abs(float(jnp.sum(grads[1][name])) - float(fd)) < 1e-6 * max(1.0, abs(float(fd))), name


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\(10,\)"):
        swarm.desired_velocity(jnp.zeros(9), PARAMS)
    with pytest.raises(ValueError, match="same shape"):
        swarm.performance_error(jnp.zeros(10), jnp.zeros(8), 0.0, PARAMS)
    with pytest.raises(ValueError, match="5 robots"):
        swarm.initial_state(swarm.default_params(num_robots=4))


@pytest.mark.slow
def test_gradient_through_the_simulation_matches_the_closed_form():
    q0, qd0 = swarm.initial_state(PARAMS)
    T = 1.0

    def beta_at_T(kappa):
        p = {**PARAMS, "kappa": kappa}
        sol = ukjax.simulate(SYSTEM, q0, qd0, p, t1=T, ts=jnp.array([T]), rtol=1e-10, atol=1e-10)
        return sol.velocity_residual[-1, 0]

    beta0 = float(swarm.performance_error(q0, qd0, 0.0, PARAMS)[0])
    kappa = PARAMS["kappa"]
    # β₁(T) = e^{-κT} β₁(0) with β(0) independent of κ: dβ₁(T)/dκ = -T e^{-κT} β₁(0). Backpropagation through
    # the adaptive solve differentiates the discrete scheme, equal to the exact derivative to about rtol.
    expected = -T * np.exp(-float(kappa) * T) * beta0
    assert abs(float(jax.grad(beta_at_T)(kappa)) - expected) < 1e-6 * abs(expected)
