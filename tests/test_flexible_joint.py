"""Flexible-joint manipulator, seed 002 §8.3: the model against a Lagrangian built from the link kinematics,
the control law eq. 71-72 against the error dynamics it must impose, the closed loop against 0.9 e^{-t/P}."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_plain_jit_vmap_agree,
    assert_tree_allclose,
    central_difference,
    random_normal,
    random_uniform,
)

import ukjax
from ukjax import control
from ukjax.constraints import Nonholonomic
from ukjax.models import flexible_joint as fj
from ukjax.studies._common import first_time_below
from ukjax.system import System

PARAMS = fj.default_params()
SYSTEM = fj.system()


def _other_params():
    """Paper structure, unequal values (m₁ ≠ m₂ exposes the m₁ printed in c₁₁ of eq. 68)."""
    values = dict(m1=1.3, m2=0.7, l1=1.1, lc1=0.45, lc2=0.6, I1=0.8, I2=0.3)
    values.update(J11=0.9, J22=1.4, K1=2.0, K2=0.5)
    return {**PARAMS, **{k: jnp.asarray(v, jnp.float64) for k, v in values.items()}}


def _random_state(seed):
    key_q, key_v = jax.random.split(jax.random.PRNGKey(seed))
    q = random_uniform(key_q, (4,), jnp.float64, -2.0, 2.0)
    return q, random_normal(key_v, (4,), jnp.float64)


def _kinetic(q, qd, t, p):
    """T of two rigid links (centres of mass from their positions) and two motor rotors."""

    def centres(x):
        a, b = x[0], x[0] + x[1]
        c1 = jnp.stack([p["lc1"] * jnp.sin(a), -p["lc1"] * jnp.cos(a)])
        x2 = p["l1"] * jnp.sin(a) + p["lc2"] * jnp.sin(b)
        c2 = jnp.stack([x2, -p["l1"] * jnp.cos(a) - p["lc2"] * jnp.cos(b)])
        return c1, c2

    _, (v1, v2) = jax.jvp(centres, (q[:2],), (qd[:2],))
    links = p["m1"] * v1 @ v1 + p["I1"] * qd[0] ** 2 + p["m2"] * v2 @ v2 + p["I2"] * (qd[0] + qd[1]) ** 2
    return 0.5 * (links + p["J11"] * qd[2] ** 2 + p["J22"] * qd[3] ** 2)


def _potential(q, t, p):
    """Gravity (y up, angles from the downward vertical) and the two joint springs."""
    y1 = -p["lc1"] * jnp.cos(q[0])
    y2 = -p["l1"] * jnp.cos(q[0]) - p["lc2"] * jnp.cos(q[0] + q[1])
    springs = p["K1"] * (q[0] - q[2]) ** 2 + p["K2"] * (q[1] - q[3]) ** 2
    return p["g"] * (p["m1"] * y1 + p["m2"] * y2) + 0.5 * springs


LAGRANGIAN = System.from_lagrangian(_kinetic, _potential, 4)


@jax.jit
def _both_models(q, qd, p):
    ours = fj.mass_matrix(q, 0.0, p), fj.given_force(q, qd, 0.0, p)
    return ours, (LAGRANGIAN.mass_matrix(q, 0.0, p), LAGRANGIAN.given_force(q, qd, 0.0, p))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_matches_lagrangian_of_the_link_kinematics(seed):
    q, qd = _random_state(seed)
    p = _other_params()
    ours, lagrangian = _both_models(q, qd, p)
    # Two exact derivations of the same M and Q, evaluated in float64: agreement to round-off.
    assert_tree_allclose(ours, lagrangian, rtol=1e-12, atol=1e-12)


@jax.jit
def _link_terms(q1, qd1, p):
    """D, C, G and the control torque τ_d of eq. 71, in one compiled call (every seed and P shares it)."""
    return fj.link_matrices(q1, qd1, p), fj.link_control_torque(q1, qd1, p)


@pytest.mark.parametrize("seed, P", [(3, 0.25), (4, 0.1), (5, 2.0)])
def test_control_law_imposes_beta_dot_equal_minus_beta_over_P(seed, P):
    q, qd = _random_state(seed)
    p = {**_other_params(), "P": jnp.full((1, 1), P)}
    q1, qd1 = q[:2], qd[:2]
    matrices, tau = _link_terms(q1, qd1, p)
    D, C, G = (np.asarray(x) for x in matrices)
    F = -(C @ np.asarray(qd1) + G)
    tau = np.asarray(tau)
    A = np.ones((1, 2))
    beta = A @ np.asarray(qd1)
    # With D q̈₁ = F + τ_d: A q̈₁ = -β/P (eq. 72); a linear solve of a well-conditioned 2 x 2: round-off only.
    assert_tree_allclose(A @ np.linalg.solve(D, F + tau), -beta / P, rtol=1e-12, atol=1e-12)
    # The UK part, by numpy: Aᵀ(A D⁻¹Aᵀ)⁻¹(b - A D⁻¹F) with b = 0, plus the eq. 72 decay term.
    uk = A.T @ np.linalg.solve(A @ np.linalg.solve(D, A.T), -A @ np.linalg.solve(D, F))
    expected = uk - D @ A.T @ np.linalg.solve(A @ A.T, beta / P)
    assert_tree_allclose(tau, expected, rtol=1e-12, atol=1e-12)


def test_motor_torques_reach_links_only_through_the_springs():
    q, qd = _random_state(6)
    p = _other_params()
    task = Nonholonomic(psi=lambda q, qd, t, p: fj.tracking_error(q, qd, p), gain=lambda p: 1 / p["P"][0, 0])
    direct = System(
        mass=fj.mass_matrix, force=fj.given_force, n=4, actuation=fj.actuation, servo_constraints=(task,)
    )
    def servo_terms(q, qd, p):
        equation = control.servo_equation(direct, q, qd, 0.0, p)
        return (
            equation,
            control.servo_controllability(equation.D, equation.r).feasible,
            (
                fj.motor_servo_constraint().second_order(q, qd, 0.0, p)[0],
                fj.mass_matrix(q, 0.0, p),
                fj.actuation(q, 0.0, p),
            ),
        )

    # one compiled call (the controllability test inside it: eagerly it compiles a dozen small programs)
    equation, feasible, (A_s, M, B) = jax.jit(servo_terms)(q, qd, p)
    # Block-diagonal M and B = [0; I]: A M⁻¹B is exactly zero, so the link-rate task alone is infeasible.
    assert_tree_allclose(equation.D, np.zeros((1, 2)), rtol=0, atol=1e-15)
    assert not bool(feasible)
    # The torque servo constraint of the model involves q̈₂ with coefficient K: A_s M⁻¹B = K J⁻¹.
    D = A_s @ np.linalg.solve(np.asarray(M), np.asarray(B))
    K_over_J = np.diag([float(p["K1"] / p["J11"]), float(p["K2"] / p["J22"])])
    assert_tree_allclose(D, K_over_J, rtol=1e-12, atol=1e-12)


@functools.partial(jax.jit, static_argnames="motor")
def _initial_state(p, *, motor):
    """fj.initial_state compiled (one program per motor start, shared with the simulations below; pass motor
    by keyword always: jit keys its cache on how a static argument is given)."""
    return fj.initial_state(p, motor=motor)


@jax.jit
def _errors(q, qd, p):
    """β, e and ė at one state, in one compiled call."""
    return fj.tracking_error(q, qd, p), fj.torque_error(q, qd, p), fj.torque_error_rate(q, qd, p)


def test_initial_states():
    q0, qd0 = _initial_state(PARAMS, motor="matched")
    beta, e, e_dot = _errors(q0, qd0, PARAMS)
    assert_tree_allclose(beta, np.array([0.9]), atol=1e-15)
    # Matched motors: e = ė = 0 by construction (one exact Newton step on an affine function of q̇₂).
    assert_tree_allclose(e, np.zeros(2), rtol=0, atol=1e-12)
    assert_tree_allclose(e_dot, np.zeros(2), rtol=0, atol=1e-12)
    q0, qd0 = _initial_state(PARAMS, motor="relaxed")
    assert_tree_allclose((q0[2:], qd0[2:]), (q0[:2], qd0[:2]), rtol=0, atol=0)


@pytest.fixture(scope="module")
def solutions():
    runs = {}
    for motor in fj.MOTOR_STARTS:  # same shapes and options: one compiled program
        q0, qd0 = _initial_state(PARAMS, motor=motor)
        runs[motor] = ukjax.simulate(SYSTEM, q0, qd0, PARAMS, t1=2.5, rtol=1e-10, atol=1e-10)
    return runs


@jax.jit
def _along(ts, q, qd):
    """β and e at every save of a solution, and the closed form of eq. 72 at its times: one compiled call for
    both solutions (same save times)."""
    beta, e = jax.vmap(lambda q, qd: (fj.tracking_error(q, qd, PARAMS), fj.torque_error(q, qd, PARAMS)))(
        q, qd
    )
    return beta, e, fj.beta_closed_form(ts, jnp.array([0.9]), PARAMS)


def test_beta_follows_the_closed_form_of_eq72(solutions):
    sol = solutions["matched"]
    assert int(sol.status) == int(ukjax.RESULTS.success), sol.message
    beta, _, closed = (np.asarray(x) for x in _along(sol.ts, sol.q, sol.qd))
    # e stays 0, so β̇ = -β/P exactly; Tsit5 at rtol = atol = 1e-10 (~650 steps) measured 1.2e-12: 1e-9 margin.
    assert_tree_allclose(beta, closed, rtol=0, atol=1e-9)
    # The paper's claim, |β| < 1e-3 within 2 s, at the closed-form time P ln 900 = 1.7006 s (log interpolation
    # between saves is exact for an exponential, so only the 1e-9 error above enters).
    t_hit = first_time_below(sol.ts, beta[:, 0], 1e-3)
    assert t_hit < 2.0
    assert abs(t_hit - float(fj.time_to_tolerance(0.9, 1e-3, PARAMS))) < 1e-6
    # The servo constraint ë + 2α ė + β² e = 0 holds to round-off of terms of O(1e3) in the motor equations.
    assert np.max(np.abs(np.asarray(sol.servo_residual))) < 1e-9


def test_relaxed_motors_meet_the_paper_claim_too(solutions):
    sol = solutions["relaxed"]
    assert int(sol.status) == int(ukjax.RESULTS.success), sol.message
    beta, e, _ = (np.asarray(x) for x in _along(sol.ts, sol.q, sol.qd))
    beta = beta[:, 0]
    # e(0) = -τ_d(0) ≈ -(11.3, 5.4) N m decays as (e₀ + (ė₀ + 20 e₀) t) e^{-20 t}: below 1e-4 N m by t = 1 s.
    assert np.max(np.abs(e[sol.ts >= 1.0])) < 1e-4
    assert first_time_below(sol.ts, beta, 1e-3) < 2.0  # measured 1.82 s


def _probe(q, qd, p):
    """A scalar touching every public model function, for the transformation tests.

    The servo-constraint form (A_s, b_s) is left out: its gradient is a third derivative of the UK force whose
    compilation alone exceeds this file's time budget; it runs under jit and vmap inside every simulation.
    """
    return (
        jnp.sum(fj.mass_matrix(q, 0.0, p) * fj.link_acceleration(q, qd, p)[0])
        + jnp.sum(fj.given_force(q, qd, 0.0, p) * fj.actuation(q, 0.0, p)[:, 0])
        + jnp.sum(fj.link_control_torque(q[:2], qd[:2], p) ** 2)
        + jnp.sum(fj.torque_error(q, qd, p) * fj.torque_error_rate(q, qd, p))
        + jnp.sum(fj.tracking_error(q, qd, p) * fj.beta_closed_form(0.7, jnp.ones(1), p))
        + fj.time_to_tolerance(0.9, 1e-3, p)
    )


PROBE_JIT = jax.jit(_probe)


def test_plain_jit_vmap_agree():
    states = [_random_state(s) for s in range(7, 10)]
    # Same operations, different fusion: round-off relative to terms of O(1e3).
    assert_plain_jit_vmap_agree(_probe, states, PARAMS, rtol=1e-11, atol=1e-11)


def test_gradients_match_central_differences():
    q, qd = _random_state(11)
    grads = jax.jit(jax.grad(_probe, argnums=(0, 1, 2)))(q, qd, PARAMS)
    key = jax.random.PRNGKey(12)
    # eps = 1e-5: truncation ~eps² f''' and round-off ~1e-16 |f| / eps, both below 1e-6 relative here.
    for k, arg in enumerate((q, qd)):
        direction = random_normal(jax.random.fold_in(key, k), (4,), jnp.float64)
        args = [q, qd]

        def along(x, k=k, args=args):
            args = list(args)
            args[k] = x
            return PROBE_JIT(*args, PARAMS)

        fd = central_difference(along, arg, direction, eps=1e-5)
        assert abs(float(grads[k] @ direction) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
    for name in ("m1", "m2", "l1", "lc2", "I2", "K1", "g", "P"):
        leaf = PARAMS[name]
        fd = central_difference(
            lambda x, name=name: PROBE_JIT(q, qd, {**PARAMS, name: x}), leaf, jnp.ones_like(leaf), eps=1e-5
        )
        assert abs(float(jnp.sum(grads[2][name])) - float(fd)) < 1e-6 * max(1.0, abs(float(fd))), name


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\(2,\)"):
        fj.link_matrices(jnp.zeros(3), jnp.zeros(2), PARAMS)
    with pytest.raises(ValueError, match=r"\(4,\)"):
        fj.torque_error(jnp.zeros(4), jnp.zeros(5), PARAMS)
    with pytest.raises(ValueError, match=r"\(1,\)"):
        fj.beta_closed_form(1.0, jnp.zeros(2), PARAMS)
    with pytest.raises(ValueError, match="motor"):
        fj.initial_state(PARAMS, motor="stiff")


@pytest.mark.slow
def test_gradient_through_the_simulation_matches_the_closed_form():
    T = 1.0

    def beta_at_T(P):
        p = {**PARAMS, "P": P}
        q0, qd0 = fj.initial_state(p)  # the matched motor state depends on P
        sol = ukjax.simulate(SYSTEM, q0, qd0, p, t1=T, ts=jnp.array([T]), rtol=1e-10, atol=1e-10)
        return fj.tracking_error(sol.q[-1], sol.qd[-1], p)[0]

    P = float(PARAMS["P"][0, 0])
    # β(T) = 0.9 e^{-T/P} for every P (matched motors): dβ(T)/dP = 0.9 T/P² e^{-T/P}; discrete-scheme
    # derivative equal to it to about rtol.
    expected = 0.9 * T / P**2 * np.exp(-T / P)
    assert abs(float(jax.grad(beta_at_T)(PARAMS["P"])[0, 0]) - expected) < 1e-6 * abs(expected)
