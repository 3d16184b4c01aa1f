"""Two-mass spring (seed 000 §IV): simulated control equals closed form eq. 47; Baumgarte error decays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference

import ukjax
from ukjax import control
from ukjax.models import two_mass_spring as model
from ukjax.system import System

SYSTEM = model.system()
PARAMS = model.default_params()
OFFSET = 0.2  # incompatible start: x2 - x1 = 2l + 0.2


@pytest.fixture(scope="module")
def solutions():
    """One compiled batch: a compatible start (moving at 0.5 m/s) and an incompatible one."""
    starts = [model.initial_state(PARAMS, velocity=0.5), model.initial_state(PARAMS, offset=OFFSET)]
    q0 = jnp.stack([s[0] for s in starts])
    qd0 = jnp.stack([s[1] for s in starts])
    return ukjax.simulate_batch(SYSTEM, q0, qd0, PARAMS, t1=3.0, rtol=1e-11, atol=1e-11)


def test_model_matches_lagrangian():
    lagrangian = System.from_lagrangian(model.kinetic, model.potential, 2)
    q, qd = jnp.array([0.3, 2.9]), jnp.array([-0.4, 1.1])
    # Both are exact expressions of eq. 36-38; only round-off differs.
    M = SYSTEM.mass_matrix(q, 0.0, PARAMS)
    assert_tree_allclose(M, lagrangian.mass_matrix(q, 0.0, PARAMS), atol=1e-14)
    assert_tree_allclose(SYSTEM.given_force(q, qd, 0.0, PARAMS), lagrangian.given_force(q, qd, 0.0, PARAMS))


def test_simulated_control_equals_eq47_on_the_constraint(solutions):
    sol = jax.tree_util.tree_map(lambda x: x[0], solutions)
    assert int(sol.status) == int(ukjax.RESULTS.success)
    stretch = sol.q[:, 1] - sol.q[:, 0] - PARAMS["l"]
    eq47 = -(1 + PARAMS["m1"] / PARAMS["m2"]) * PARAMS["k"] * stretch
    # On the manifold F is eq. 47 exactly; the only difference is β²φ from drift of the integrated state
    # (|φ| ≲ 1e-11 at tolerance 1e-11, times β² m1 = 25) plus round-off.
    assert_tree_allclose(sol.u[:, 0], eq47, rtol=1e-9, atol=1e-9)
    assert float(jnp.max(jnp.abs(sol.servo_residual))) < 1e-9  # positions reach ~25 m at tolerance 1e-11
    # eq. 47 makes both masses accelerate together at -k l / m2.
    common = -PARAMS["k"] * PARAMS["l"] / PARAMS["m2"]
    assert_tree_allclose(sol.qdd, jnp.full_like(sol.qdd, common), atol=1e-8)  # β² φ drift terms, φ ≲ 1e-10


def test_incompatible_start_decays_like_critical_damping(solutions):
    sol = jax.tree_util.tree_map(lambda x: x[1], solutions)
    phi = sol.servo_residual[:, 0]
    expected = model.servo_error_closed_form(sol.ts, OFFSET, 0.0, PARAMS)
    # Integration tolerance 1e-11 on O(1) states: the error dynamics φ̈ + 2αφ̇ + α²φ = 0 are met to ~1e-9.
    assert_tree_allclose(phi, expected, atol=1e-8)
    assert abs(float(phi[-1])) < 1e-4 * OFFSET
    # The recorded control is the closed form with Baumgarte terms, at every saved state.
    F = jax.vmap(model.closed_form_control, in_axes=(0, 0, None))(sol.q, sol.qd, PARAMS)
    assert_tree_allclose(sol.u[:, 0], F, rtol=1e-9, atol=1e-9)


@jax.jit
def _u(q, qd, p):
    return control.servo_control(SYSTEM, q, qd, 0.0, p)[0]


def test_control_transformations_and_gradient():
    qs = jnp.array([[0.0, 2.0], [0.1, 2.5], [-0.3, 1.6]])
    qds = jnp.array([[0.0, 0.0], [0.2, -0.1], [1.0, 0.5]])
    batched = jax.vmap(_u, in_axes=(0, 0, None))(qs, qds, PARAMS)
    reference = jax.vmap(model.closed_form_control, in_axes=(0, 0, None))(qs, qds, PARAMS)
    # Division by C B̄ = -1/m1 and a pseudo-inverse of a 1 x 1 matrix: round-off only.
    assert_tree_allclose(batched, reference, rtol=1e-12, atol=1e-12)
    plain = control.servo_control(SYSTEM, qs[1], qds[1], 0.0, PARAMS)[0]
    assert_tree_allclose(plain, reference[1], rtol=1e-12)
    for name in ("m1", "m2", "k", "alpha", "beta"):
        f = lambda v, name=name: _u(qs[1], qds[1], {**PARAMS, name: v})
        g = jax.grad(f)(PARAMS[name])
        # Central differences at eps = 1e-6 on a polynomial/rational function: ~1e-9 absolute.
        assert_tree_allclose(g, central_difference(f, PARAMS[name], 1.0), rtol=1e-7, atol=1e-7)


def test_initial_state_and_bad_shapes():
    q0, qd0 = model.initial_state(PARAMS)
    assert_tree_allclose(model.servo_phi(q0, 0.0, PARAMS), jnp.zeros(1), atol=0.0)
    assert np.shape(qd0) == (2,)
    with pytest.raises(ValueError, match=r"shape"):
        control.closed_loop_acceleration(SYSTEM, jnp.zeros(3), jnp.zeros(2), 0.0, PARAMS)
