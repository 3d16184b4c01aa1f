"""Particle on a logarithmic spiral (seed 002 §8.1): eq. 51 and 55 vs autodiff, simulated errors ε1, ε2."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference, random_normal, random_uniform

import ukjax
from ukjax.models import spiral

P = spiral.default_params()
SYSTEM = spiral.system()
KEY = jax.random.PRNGKey(2)
Q = jnp.stack(
    [
        random_uniform(jax.random.fold_in(KEY, 0), (5,), jnp.float64, 0.5, 20.0),
        random_uniform(jax.random.fold_in(KEY, 1), (5,), jnp.float64, -5.0, 30.0),
    ],
    axis=1,
)
QD = random_normal(jax.random.fold_in(KEY, 2), (5, 2), jnp.float64)
TS = random_uniform(jax.random.fold_in(KEY, 3), (5,), jnp.float64, 0.0, 30.0)


def test_lagrangian_dynamics_equal_eq51():
    # M⁻¹Q of T = ½(ṙ² + r²θ̇²), V = g r sin θ equals the hand-written a₀ of eq. 51 (O(10) numbers, 1e-12).
    def a(q, qd):
        return jnp.linalg.solve(SYSTEM.mass_matrix(q, 0.0, P), SYSTEM.given_force(q, qd, 0.0, P))

    ours = jax.vmap(a)(Q, QD)
    paper = jax.vmap(spiral.unconstrained_acceleration, in_axes=(0, 0, None))(Q, QD, P)
    assert_tree_allclose(ours, paper, rtol=1e-12, atol=1e-12)


def test_autodiff_constraint_equals_eq55():
    # Eq. 55: A = [[1, -0.1 e^{0.1θ}], [0, 1]], b = (0.01 e^{0.1θ} θ̇², 0); exact up to rounding of exp.
    for q, qd, t in zip(Q, QD, TS, strict=True):
        A, b = SYSTEM.constraint_equations(q, qd, t, P)
        e = np.exp(0.1 * float(q[1]))
        A_ref = np.array([[1.0, -0.1 * e], [0.0, 1.0]])
        b_ref = np.array([0.01 * e * float(qd[1]) ** 2, 0.0])
        assert_tree_allclose((A, b), (A_ref, b_ref), rtol=1e-13, atol=1e-13)


def test_uk_acceleration_is_prescribed_motion():
    # A is square and invertible, so the UK acceleration is A⁻¹ b whatever M and Q are (seed 002 eq. 57).
    accel = jax.jit(jax.vmap(SYSTEM.acceleration, in_axes=(0, 0, 0, None)))
    ours = accel(Q, QD, TS, P)
    for q, qd, t, qdd in zip(Q, QD, TS, ours, strict=True):
        A, b = (np.asarray(x) for x in SYSTEM.constraint_equations(q, qd, t, P))
        assert_tree_allclose(qdd, np.linalg.solve(A, b), rtol=1e-10, atol=1e-10)


def test_initial_state_is_the_papers():
    q0, qd0 = spiral.initial_state(P)
    assert_tree_allclose(q0, jnp.array([math.exp(3.0), 30.0]), rtol=1e-15)
    assert_tree_allclose(qd0, jnp.array([-0.1 * math.exp(3.0), -1.0]), rtol=1e-15)
    assert_tree_allclose(spiral.errors(q0, qd0, 0.0, P), (jnp.asarray(0.0), jnp.asarray(0.0)), atol=1e-15)


@pytest.fixture(scope="module")
def solution():
    q0, qd0 = spiral.initial_state(P)
    return ukjax.simulate(SYSTEM, q0, qd0, P, t1=30.0, ts=jnp.linspace(0.0, 30.0, 61), rtol=1e-10, atol=1e-10)


def test_simulation_follows_closed_form_and_errors_are_small(solution):
    # The exact motion is θ = 30 - t, r = e^{3 - 0.1 t}. Tsit5 at rtol = atol = 1e-10 over 30 s without
    # stabilization: measured max ε1 ≈ 2.8e-9, ε2 ≈ 2.6e-10 (seed 002 Figure 5 shows the same kind of slowly
    # growing integration drift; its values are not printed). Bounds 3e-8 leave a factor ~10.
    assert int(solution.status) == ukjax.RESULTS.success
    ts = solution.ts
    exact = jnp.stack([jnp.exp(3.0 - 0.1 * ts), 30.0 - ts], axis=1)
    assert_tree_allclose(solution.q, exact, rtol=3e-8, atol=3e-8)
    eps1, eps2 = jax.vmap(spiral.errors, in_axes=(0, 0, 0, None))(solution.q, solution.qd, ts, P)
    assert float(jnp.max(eps1)) < 3e-8
    assert float(jnp.max(eps2)) < 3e-8


def test_gradient_of_acceleration_wrt_spiral_rate():
    # d q̈ / d k (forward and reverse mode) against central differences (k = 0.1, step 1e-6 on O(10) values:
    # round-off ~1e-9, hence atol 1e-7). One compiled function gives the value and both derivatives.
    accel = lambda k: SYSTEM.acceleration(Q[0], QD[0], TS[0], dict(P, k=k))
    both = jax.jit(lambda k: (accel(k), jax.jvp(accel, (k,), (jnp.ones_like(k),))[1], jax.jacrev(accel)(k)))
    fd = central_difference(lambda k: both(k)[0], P["k"], jnp.asarray(1.0))
    _, forward, reverse = both(P["k"])
    assert_tree_allclose(forward, fd, rtol=1e-6, atol=1e-7)
    assert_tree_allclose(reverse, forward, rtol=1e-10, atol=1e-12)


def test_stabilized_variant_and_bad_shapes():
    stabilized = spiral.system(stabilized=True)
    p = dict(P, alpha=jnp.asarray(2.0), beta=jnp.asarray(3.0))
    q, qd, t = Q[0], QD[0], TS[0]
    phi = spiral.spiral_constraint(q, t, p)
    phid = jax.jvp(lambda q_, t_: spiral.spiral_constraint(q_, t_, p), (q, t), (qd, jnp.ones_like(t)))[1]
    A, b = stabilized.constraint_equations(q, qd, t, p)
    A0, b0 = SYSTEM.constraint_equations(q, qd, t, p)
    # quadratic Baumgarte (seed 004 eq. 32 convention): b = b0 - 2αφ̇ - β²φ
    assert_tree_allclose((A, b), (A0, b0 - 4.0 * phid - 9.0 * phi), rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="shape"):
        spiral.errors(jnp.zeros(3), jnp.zeros(2), 0.0, P)
