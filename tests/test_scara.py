"""SCARA model of seed 001 (Xu & Liu 2017): hand M, C, G vs a Lagrangian, eq. 49/54 vs autodiff, UK vs KKT."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference, random_normal, random_uniform

from ukjax.models import scara

P = scara.default_params()
HAND = scara.system()
LAGRANGE = scara.system(lagrangian=True)
KEY = jax.random.PRNGKey(1)
STATES = (
    random_uniform(jax.random.fold_in(KEY, 0), (6, 4), jnp.float64, -math.pi, math.pi),
    random_normal(jax.random.fold_in(KEY, 1), (6, 4), jnp.float64),
    random_uniform(jax.random.fold_in(KEY, 2), (6,), jnp.float64, 0.0, 20.0),
)


@jax.jit
def _dynamics_pair(q, qd, t, p):
    return (
        (HAND.mass_matrix(q, t, p), HAND.given_force(q, qd, t, p)),
        (LAGRANGE.mass_matrix(q, t, p), LAGRANGE.given_force(q, qd, t, p)),
    )


def test_hand_dynamics_equal_lagrangian():
    # Eq. 34-36 typed by hand vs T and V from the link positions (eq. 39) differentiated by ukjax. Both are
    # O(1) sums of a few float64 products, so they agree to rounding; 1e-12 leaves ~1e3 ulps.
    hand, derived = jax.vmap(_dynamics_pair, in_axes=(0, 0, 0, None))(*STATES, P)
    assert_tree_allclose(hand, derived, rtol=1e-12, atol=1e-12)


def test_coriolis_matrix_is_christoffel_form():
    # Seed 001 eq. 30: Ṁ - 2C is skew-symmetric for C built from Christoffel symbols (eq. 35 must have it).
    q, qd = STATES[0][0], STATES[1][0]
    Mdot = jax.jvp(lambda q_: scara.mass_matrix(q_, P), (q,), (qd,))[1]
    S = Mdot - 2 * scara.coriolis_matrix(q, qd, P)
    assert_tree_allclose(S, -S.T, atol=1e-13)


def _eq54(q, qd, t, p, alpha, beta):
    """Seed 001 eq. 49 (alpha = beta = 0) and eq. 54 typed from the paper, in NumPy."""
    l1, l2, l0 = float(p["l1"]), float(p["l2"]), float(p["l0"])
    q1, q2, q3, q4 = q
    d1, d2, d3, d4 = qd
    s1, c1, s12, c12 = np.sin(q1), np.cos(q1), np.sin(q1 + q2), np.cos(q1 + q2)
    w = 0.4 * np.pi
    A = np.array(
        [
            [-l1 * c1 - l2 * c12, -l2 * c12, 0, 0],
            [-l1 * s1 - l2 * s12, -l2 * s12, 0, 0],
            [1, 1, 1, 0],
            [0, 0, 0, 1.0],
        ]
    )
    b = np.array(
        [
            -(d1**2) * l1 * s1
            - (d1 + d2) ** 2 * l2 * s12
            - 0.05 * w**2 * np.sin(w * t)
            - alpha[0] * (-d1 * l1 * c1 - (d1 + d2) * l2 * c12 - 0.05 * w * np.cos(w * t))
            - beta[0] * (-l1 * s1 - l2 * s12 - 0.05 * np.sin(w * t)),
            d1**2 * l1 * c1
            + (d1 + d2) ** 2 * l2 * c12
            - 0.05 * w**2 * np.cos(w * t)
            - alpha[1] * (-d1 * l1 * s1 - (d1 + d2) * l2 * s12 + 0.05 * w * np.sin(w * t))
            - beta[1] * (l1 * c1 + l2 * c12 - 0.35 - 0.05 * np.cos(w * t)),
            -alpha[2] * (d1 + d2 + d3) - beta[2] * (q1 + q2 + q3),
            -alpha[3] * (d4 - 0.02) - beta[3] * (q4 + l0 - 0.02 * t),
        ]
    )
    return A, b


@pytest.mark.parametrize("stabilized", [False, True])
def test_autodiff_constraint_equals_eq49_eq54(stabilized):
    # Eq. 49 and 54 as printed: A, b agree with ukjax's autodiff of φ (eq. 48) to rounding (entries O(10)).
    # The "linear" Baumgarte form of ukjax (φ̈ + αφ̇ + βφ = 0) is seed 001's eq. 52. Distinct gains per row
    # check that each row gets its own gain.
    system = scara.system(stabilized=stabilized)
    p = dict(P, alpha=jnp.array([0.5, 1.0, 2.0, 3.0]), beta=jnp.array([200.0, 150.0, 100.0, 50.0]))
    gains = (np.asarray(p["alpha"]), np.asarray(p["beta"])) if stabilized else (np.zeros(4), np.zeros(4))
    for q, qd, t in zip(*STATES, strict=True):
        A, b = system.constraint_equations(q, qd, t, p)
        A_ref, b_ref = _eq54(np.asarray(q), np.asarray(qd), float(t), p, *gains)
        assert_tree_allclose((A, b), (A_ref, b_ref), rtol=1e-12, atol=1e-12)


@jax.jit
def _uk(q, qd, t, p):
    return HAND.acceleration(q, qd, t, p)


def test_uk_equals_kkt():
    # Seed 001 eq. 53: [[M, -Aᵀ], [A, 0]] [q̈; λ] = [Q; b - αφ̇ - βφ], solved densely by NumPy. A has full
    # rank 4 = n here, so the constrained motion is A⁻¹ b; the KKT matrix has condition number ~1e3 at these
    # states, so 1e-9 relative agreement is the float64 expectation with margin.
    for q, qd, t in zip(*STATES, strict=True):
        M = np.asarray(HAND.mass_matrix(q, t, P))
        Q = np.asarray(HAND.given_force(q, qd, t, P))
        A, b = (np.asarray(x) for x in HAND.constraint_equations(q, qd, t, P))
        K = np.block([[M, -A.T], [A, np.zeros((4, 4))]])
        ref = np.linalg.solve(K, np.concatenate([Q, b]))[:4]
        assert_tree_allclose(_uk(q, qd, t, P), ref, rtol=1e-9, atol=1e-9)


def test_inverse_kinematics_satisfies_constraint_and_printed_velocities():
    # The "theoretical" joint path solves φ(q, t) = 0; at t = 0 its joint rates match the printed q̇(0) to the
    # printed 3 digits, which is the evidence for the sign-corrected initial angles (module docstring).
    ts = jnp.linspace(0.0, 20.0, 7)
    q_ref = jax.vmap(scara.inverse_kinematics, in_axes=(0, None))(ts, P)
    phi = jax.vmap(scara.trajectory_constraint, in_axes=(0, 0, None))(q_ref, ts, P)
    assert_tree_allclose(phi, jnp.zeros_like(phi), atol=1e-14)
    qd_ref = jax.jacfwd(scara.inverse_kinematics)(0.0, P)
    assert_tree_allclose(qd_ref, jnp.asarray(scara.PRINTED_QD0), atol=6e-4)
    q0, _ = scara.initial_state(P)
    assert_tree_allclose(q0[:3], q_ref[0, :3], atol=math.radians(1.0))


def test_initial_states():
    q0, qd0 = scara.initial_state(P, reading="printed")
    assert_tree_allclose(jnp.degrees(q0[:3]), jnp.array([30.0, 55.0, 24.0]))
    phi = scara.trajectory_constraint(scara.initial_state(P)[0], 0.0, P)
    # corrected reading: 1° orientation error and 5.7 mm in x, as stated in the module docstring
    assert_tree_allclose(phi[2], jnp.asarray(math.radians(1.0)), atol=1e-12)
    assert abs(float(phi[0]) + 5.65e-3) < 1e-4
    with pytest.raises(ValueError, match="reading"):
        scara.initial_state(P, reading="other")


def test_transformations_of_the_acceleration():
    q, qd, t = STATES[0][0], STATES[1][0], STATES[2][0]
    plain = HAND.acceleration(q, qd, t, P)
    assert_tree_allclose(_uk(q, qd, t, P), plain, rtol=1e-12, atol=1e-12)
    batched = jax.vmap(_uk, in_axes=(0, 0, 0, None))(*STATES, P)
    assert_tree_allclose(batched[0], plain, rtol=1e-12, atol=1e-12)
    # d q̈ / d l1 against central differences (step 1e-6 on l1 = 0.2: truncation ~1e-12, round-off ~1e-10).
    # Value, forward and reverse derivative from one compiled function.
    f = lambda l1: HAND.acceleration(q, qd, t, dict(P, l1=l1))
    both = jax.jit(lambda l1: (*jax.jvp(f, (l1,), (jnp.ones_like(l1),)), jax.jacrev(f)(l1)))
    _, grad, rev = both(P["l1"])
    fd = central_difference(lambda l1: both(l1)[0], P["l1"], jnp.asarray(1.0))
    assert_tree_allclose(grad, fd, rtol=1e-6, atol=1e-6)
    assert_tree_allclose(rev, grad, rtol=1e-10, atol=1e-10)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="shape"):
        scara.mass_matrix(jnp.zeros(3), P)
    with pytest.raises(ValueError, match=r"\(4,\)"):
        HAND.acceleration(jnp.zeros(4), jnp.zeros(5), 0.0, P)
