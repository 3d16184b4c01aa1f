"""Coordinated robots (seed 000 §V-VI): appendix M, C, G vs Lagrangian, hand (A, b) vs autodiff, closed
loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, random_normal, random_uniform

import ukjax
from ukjax import control
from ukjax.constraints import Holonomic
from ukjax.models import coordinated_robots as model
from ukjax.system import System

SYSTEM = model.system()
PARAMS = model.default_params()
LAGRANGIAN = System.from_lagrangian(model.kinetic, model.potential, 5)


def _params_unequal():
    """Unequal masses, inertias and lengths, so that every index of A2-A4 is exercised."""
    p = dict(PARAMS)
    p["m"] = jnp.array([1.0, 1.3, 0.7, 1.9, 1.1])
    p["I"] = jnp.array([0.2, 0.5, 0.9, 0.3, 0.4])
    p["l"] = jnp.array([1.0, 0.8, 1.2, 0.9, 1.1])
    return p


def _states(key, count=3):
    k1, k2, k3 = jax.random.split(key, 3)
    return (
        random_uniform(k1, (count, 5), minval=-3.0, maxval=3.0),
        random_normal(k2, (count, 5)),
        random_uniform(k3, (count,), maxval=6.0),
    )


@jax.jit
@jax.vmap
def _mass_and_force(q, qd, t):
    p = _params_unequal()
    return [(s.mass_matrix(q, t, p), s.given_force(q, qd, t, p)) for s in (SYSTEM, LAGRANGIAN)]


def test_appendix_matches_lagrangian():
    hand, lagrangian = _mass_and_force(*_states(jax.random.key(0)))
    # Two exact expressions of the same dynamics; entries are O(10), round-off ~1e-14.
    assert_tree_allclose(hand, lagrangian, rtol=1e-12, atol=1e-12)


@jax.jit
@jax.vmap
def _mdot_minus_2c(q, qd):
    """Ṁ - 2C at each state, Ṁ = dM/dq · q̇ by forward mode: one compiled program for the three states (op by
    op, the jvp and C compiled a few dozen small programs)."""
    p = _params_unequal()
    _, M_dot = jax.jvp(lambda q_: model.mass(q_, 0.0, p), (q,), (qd,))
    return M_dot - 2 * model.coriolis(q, qd, p)


def test_coriolis_matrix_makes_mdot_minus_2c_skew():
    """Seed 000 eq. 52: the chosen C makes Ṁ - 2C skew-symmetric."""
    qs, qds, _ = _states(jax.random.key(1))
    for S in _mdot_minus_2c(qs, qds):
        assert_tree_allclose(S, -S.T, atol=1e-13)


@jax.jit
@jax.vmap
def _second_order_forms(q, qd, t):
    p = _params_unequal()
    passive = Holonomic(model.closure)  # unstabilized: eq. 61-63 and 67-68 have no Baumgarte terms
    servo = Holonomic(model.servo_phi)
    hand = (model.hand_passive_second_order(q, qd, p), model.hand_servo_second_order(q, qd, t, p))
    return hand, (passive.second_order(q, qd, t, p), servo.second_order(q, qd, t, p))


def test_hand_second_order_forms_match_autodiff():
    hand, autodiff = _second_order_forms(*_states(jax.random.key(2)))
    # Closed forms vs forward-mode derivatives of the same trigonometric sums: round-off only.
    assert_tree_allclose(hand, autodiff, atol=1e-12)


@pytest.fixture(scope="module")
def start():
    """(q0, q̇0) by ``model.initial_state``, jitted: computed once and shared by the test of its value, the
    simulation and the controllability test (eagerly, each call dispatched the Newton program again and
    compiled the small programs around it)."""
    return jax.jit(model.initial_state)(PARAMS)


def test_initial_state_is_the_symmetric_configuration(start):
    q0, qd0 = start
    third = np.pi / 3
    # Newton's method converges quadratically to the root; round-off remains.
    assert_tree_allclose(q0, jnp.array([third, -third, 0.0, third, -third]), atol=1e-12)
    assert_tree_allclose(qd0, jnp.zeros(5), atol=1e-12)
    assert_tree_allclose(model.closure(q0, 0.0, PARAMS), jnp.zeros(2), atol=1e-12)


@pytest.fixture(scope="module")
def solution(start):
    q0, qd0 = start
    ts = jnp.linspace(0.0, 1.5, 7)
    return ukjax.simulate(SYSTEM, q0, qd0, PARAMS, t1=1.5, ts=ts, rtol=1e-10, atol=1e-10)


def test_closed_loop_follows_the_task_with_mirror_symmetric_torques(solution):
    sol = solution
    assert int(sol.status) == int(ukjax.RESULTS.success)
    # Consistent start and tolerance 1e-10: both constraint sets hold to ~1e-10.
    assert float(jnp.max(jnp.abs(sol.position_residual))) < 1e-8
    assert float(jnp.max(jnp.abs(sol.servo_residual))) < 1e-8
    pose = jax.vmap(model.object_pose, in_axes=(0, None))(sol.q, PARAMS)
    assert_tree_allclose(pose[:, 1], 0.5 * (1 - jnp.cos(sol.ts)), atol=1e-8)
    # The task and the chain are mirror symmetric about x = L/2, and so is the minimum-norm control:
    # θ4 = -θ2, θ5 = -θ1 and (u1, u2, u3) = -(u6, u5, u4).
    assert_tree_allclose(sol.q[:, 3:], -sol.q[:, 1::-1], atol=1e-8)
    assert_tree_allclose(sol.u[:, :3], -sol.u[:, :2:-1], atol=1e-7)


@jax.jit
def _report_and_control(q, qd):
    """controllability and servo_control at one state in one compiled program (op by op, each compiled its
    servo equation and the factorizations after it as a few dozen small programs)."""
    return (
        control.controllability(SYSTEM, q, qd, 0.0, PARAMS),
        control.servo_control(SYSTEM, q, qd, 0.0, PARAMS),
    )


def test_control_is_redundant_and_feasible(start):
    report, u = _report_and_control(*start)
    assert int(report.rank) == 3 and bool(report.feasible)  # 3 DOF, 3 servo rows, 6 actuators
    # At rest in the symmetric start the torques are mirror symmetric too: (u1, u2, u3) = -(u6, u5, u4).
    assert_tree_allclose(u[:3], -u[:2:-1], atol=1e-10)
