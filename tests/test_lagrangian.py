"""System.from_lagrangian: M and Q from one linearization (``mass_and_force``), against closed forms and the
separate passes (jax.hessian of T; jax.grad and a JVP of the Lagrangian), under jit, vmap and grad."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_plain_jit_vmap_agree, assert_tree_allclose, central_difference

from ukjax import Holonomic, System
from ukjax.models import chain

T0 = jnp.asarray(0.0)


# ------------------------------------------------------------------ the double pendulum, point masses
def _pendulum_kinetic(q, qd, t, p):
    """Point masses m1, m2 on massless rods l1, l2; absolute angles from the downward vertical."""
    (m1, m2), (l1, l2) = p["m"], p["l"]
    v1 = l1 * qd[0] * jnp.stack([jnp.cos(q[0]), jnp.sin(q[0])])
    v2 = v1 + l2 * qd[1] * jnp.stack([jnp.cos(q[1]), jnp.sin(q[1])])
    return 0.5 * m1 * v1 @ v1 + 0.5 * m2 * v2 @ v2


def _pendulum_potential(q, t, p):
    (m1, m2), (l1, l2) = p["m"], p["l"]
    y1 = -l1 * jnp.cos(q[0])
    y2 = y1 - l2 * jnp.cos(q[1])
    return p["g"] * (m1 * y1 + m2 * y2)


PENDULUM_PARAMS = {"m": jnp.asarray([1.3, 0.7]), "l": jnp.asarray([0.9, 0.6]), "g": jnp.asarray(9.81)}
PENDULUM = System.from_lagrangian(_pendulum_kinetic, _pendulum_potential, 2)


def _states(n, count, seed):
    rng = np.random.default_rng(seed)
    return [(jnp.asarray(rng.uniform(-3, 3, n)), jnp.asarray(rng.normal(0, 2, n))) for _ in range(count)]


@pytest.fixture(scope="module")
def one_pass():
    """The one-linearization (M, Q) of the double pendulum, compiled once."""
    return jax.jit(lambda q, qd, p: PENDULUM.mass_and_given_force(q, qd, T0, p))


def test_double_pendulum_closed_form(one_pass):
    """M = [[(m1+m2)l1², m2 l1 l2 c], [m2 l1 l2 c, m2 l2²]], c = cos(θ1 - θ2); Q = -(Coriolis/centrifugal) -
    gravity = [-m2 l1 l2 s θ̇2² - (m1+m2) g l1 sin θ1, m2 l1 l2 s θ̇1² - m2 g l2 sin θ2], s = sin(θ1 - θ2).
    float64 at O(1) values: 1e-12 leaves room for a few hundred roundings."""
    p = PENDULUM_PARAMS

    @jax.jit
    def closed_form(q, qd, p):  # one compiled call, not op by op
        (m1, m2), (l1, l2), g = p["m"], p["l"], p["g"]
        c, s = jnp.cos(q[0] - q[1]), jnp.sin(q[0] - q[1])
        M = jnp.asarray([[(m1 + m2) * l1**2, m2 * l1 * l2 * c], [m2 * l1 * l2 * c, m2 * l2**2]])
        Q = jnp.stack(
            [
                -m2 * l1 * l2 * s * qd[1] ** 2 - (m1 + m2) * g * l1 * jnp.sin(q[0]),
                m2 * l1 * l2 * s * qd[0] ** 2 - m2 * g * l2 * jnp.sin(q[1]),
            ]
        )
        return M, Q

    for q, qd in _states(2, 5, seed=1):
        assert_tree_allclose(one_pass(q, qd, p), closed_form(q, qd, p), rtol=1e-12, atol=1e-12)


def _bead_kinetic(q, qd, t, p):
    """Rheonomic: a bead on a wire turning at ω about a pivot that moves vertically (q̇-t cross terms)."""
    w, h, nu = p["omega"], p["h"], p["nu"]
    e, e_perp = jnp.stack([jnp.cos(w * t), jnp.sin(w * t)]), jnp.stack([-jnp.sin(w * t), jnp.cos(w * t)])
    R_dot = qd[0] * e + q[0] * w * e_perp + jnp.stack([jnp.zeros_like(t), h * nu * jnp.cos(nu * t)])
    return 0.5 * p["m"] * jnp.sum(R_dot**2) + 0.5 * p["m"] * qd[1] ** 2 * (1.0 + q[0] ** 2)


def _bead_potential(q, t, p):
    return p["m"] * p["g"] * (q[0] * jnp.sin(p["omega"] * t) + p["h"] * jnp.sin(p["nu"] * t)) + q[1] ** 2


BEAD_PARAMS = {k: jnp.asarray(v) for k, v in dict(m=0.8, g=9.81, omega=1.7, h=0.3, nu=2.9).items()}
BEAD = System.from_lagrangian(
    _bead_kinetic, _bead_potential, 2, applied_force=lambda q, qd, t, p: -0.1 * qd * jnp.cos(t)
)


@pytest.mark.parametrize(
    "system, params, n",
    [(PENDULUM, PENDULUM_PARAMS, 2), (BEAD, BEAD_PARAMS, 2), (chain.system(5), chain.default_params(5), 5)],
    ids=["double pendulum", "rheonomic bead with applied force", "5-link chain"],
)
def test_one_pass_matches_separate_passes(system, params, n):
    """The one linearization against ``mass`` (jax.hessian of T at q̇ = 0) and ``force`` (jax.grad and a JVP):
    the same derivatives by another route, at random states and times (float64, O(1)-O(10) values: 1e-12)."""
    both = jax.jit(lambda q, qd, t: system.mass_and_given_force(q, qd, t, params))
    apart = jax.jit(lambda q, qd, t: (system.mass_matrix(q, t, params), system.given_force(q, qd, t, params)))
    for i, (q, qd) in enumerate(_states(n, 4, seed=2)):
        t = jnp.asarray(0.37 * i + 0.1)
        assert_tree_allclose(both(q, qd, t), apart(q, qd, t), rtol=1e-12, atol=1e-12)


def _counting(fn, agrees_with=None):
    calls = []

    def wrapped(*args):
        calls.append(1)
        return fn(*args)

    if agrees_with is not None:
        wrapped.agrees_with = agrees_with
    return wrapped, calls


def test_motion_uses_the_hook_only_while_it_agrees():
    """motion() calls mass_and_force (one evaluation) for a system from a Lagrangian; once ``force`` is
    replaced the recorded hook no longer agrees and motion() calls mass and force, so the new force counts."""
    q, qd = _states(2, 1, seed=3)[0]
    p = PENDULUM_PARAMS
    spy, calls = _counting(PENDULUM.mass_and_force, PENDULUM.mass_and_force.agrees_with)
    system = dataclasses.replace(PENDULUM, mass_and_force=spy)
    assert PENDULUM.mass_and_force.agrees_with == (PENDULUM.mass, PENDULUM.force)
    qdd = system.acceleration(q, qd, T0, p)
    assert len(calls) == 1
    M, Q = jax.jit(lambda q, qd: (PENDULUM.mass_matrix(q, T0, p), PENDULUM.given_force(q, qd, T0, p)))(q, qd)
    assert_tree_allclose(qdd, jnp.linalg.solve(M, Q), rtol=1e-12, atol=1e-12)

    push = jnp.asarray([0.5, -2.0])
    pushed = dataclasses.replace(system, force=lambda q, qd, t, p: PENDULUM.force(q, qd, t, p) + push)
    qdd = pushed.acceleration(q, qd, T0, p)
    assert len(calls) == 1  # not called again
    assert_tree_allclose(qdd, jnp.linalg.solve(M, Q + push), rtol=1e-12, atol=1e-12)

    # a user-supplied hook without the record is trusted
    trusted, trusted_calls = _counting(lambda q, qd, t, p: (M, Q + push))
    qdd = dataclasses.replace(PENDULUM, mass_and_force=trusted).acceleration(q, qd, T0, p)
    assert len(trusted_calls) == 1
    assert_tree_allclose(qdd, jnp.linalg.solve(M, Q + push), rtol=1e-12, atol=1e-12)


def test_hook_shapes_are_checked():
    bad = dataclasses.replace(PENDULUM, mass_and_force=lambda q, qd, t, p: (jnp.eye(3), qd))
    with pytest.raises(ValueError, match="mass_and_force"):
        bad.acceleration(jnp.zeros(2), jnp.zeros(2), T0, PENDULUM_PARAMS)


def test_jit_vmap_agree(one_pass):
    """Plain, jit and jit(vmap) give the same (M, Q): the same operations, fused differently (1e-12)."""
    flat = lambda q, qd, p: jnp.concatenate(
        [jnp.ravel(x) for x in PENDULUM.mass_and_given_force(q, qd, T0, p)]
    )
    assert_plain_jit_vmap_agree(flat, _states(2, 3, seed=4), PENDULUM_PARAMS, rtol=1e-12, atol=1e-12)


def test_gradient_matches_central_differences():
    """d/dp of a scalar of (M, Q) and of the constrained q̈ (the hook inside motion) vs central differences:
    step 1e-6 on O(1) values gives truncation ~1e-12 and round-off ~1e-10, so agreement to 1e-7 relative."""
    q, qd = _states(2, 1, seed=5)[0]
    w = jnp.asarray([0.3, -1.1])
    pin = Holonomic(phi=lambda q, t, p: jnp.sin(q[0]) + jnp.sin(q[1]) - 0.4, name="level")
    constrained = dataclasses.replace(PENDULUM, constraints=(pin,))
    q = jnp.asarray([jnp.arcsin(0.2), jnp.arcsin(0.2)])  # on the constraint, moving along it
    qd = jnp.asarray([1.0, -1.0])

    def scalar(masses):
        p = {**PENDULUM_PARAMS, "m": masses}
        M, Q = PENDULUM.mass_and_given_force(q, qd, T0, p)
        return jnp.sum(M * jnp.outer(w, w)) + w @ Q + w @ constrained.acceleration(q, qd, T0, p)

    masses = PENDULUM_PARAMS["m"]
    grad = jax.jit(jax.grad(scalar))(masses)
    scalar = jax.jit(scalar)  # the differences: one compiled program, not op by op
    for i in range(2):
        e = jnp.zeros(2).at[i].set(1.0)
        fd = central_difference(scalar, masses, e)
        np.testing.assert_allclose(grad[i], fd, rtol=1e-7, atol=1e-9)


def test_potential_none_means_no_potential():
    """potential=None: V = 0 (Q has no gravity term) and energy() is the kinetic energy."""
    free = System.from_lagrangian(_pendulum_kinetic, None, 2)
    zero = System.from_lagrangian(_pendulum_kinetic, lambda q, t, p: jnp.zeros((), q.dtype), 2)
    q, qd = _states(2, 1, seed=6)[0]

    @jax.jit
    def both(q, qd, p):  # one compiled call
        return [
            (system.mass_and_given_force(q, qd, T0, p), system.given_force(q, qd, T0, p))
            for system in (free, zero)
        ] + [(free.energy(q, qd, T0, p), _pendulum_kinetic(q, qd, T0, p))]

    (free_one, free_q), (zero_one, zero_q), (energy, kinetic) = both(q, qd, PENDULUM_PARAMS)
    assert_tree_allclose(free_one, zero_one, rtol=0, atol=0)
    assert_tree_allclose(free_q, zero_q, rtol=0, atol=0)
    assert_tree_allclose(energy, kinetic, rtol=1e-14, atol=0)
