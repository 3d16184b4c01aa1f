"""Servo-constraint control (ukjax.control) against references that share no code with it.

References: a NumPy KKT solve containing the passive constraints (with the servo equation solved by NumPy's
minimum-norm least squares), and seed 000's own x = M^{1/2} q formulation (eq. 24-35) with M^{1/2} from SciPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import assert_tree_allclose, central_difference, random_matrix, random_normal, random_spd

from ukjax import control
from ukjax.constraints import Baumgarte, Holonomic, Nonholonomic
from ukjax.system import System

N = 5


def _mass(q, t, p):
    return p["M0"] + jnp.diag(0.1 * jnp.sin(q) ** 2)


def _force(q, qd, t, p):
    return -p["K"] @ q - 0.1 * qd * jnp.abs(qd) + jnp.sin(t)


PASSIVE = (
    Holonomic(
        lambda q, t, p: jnp.stack([q[0] + 0.3 * jnp.sin(q[1]) - q[2], q[3] * q[4] - 0.2 + 0.1 * t]),
        baumgarte=Baumgarte(lambda p: (p["alpha_p"], p["beta_p"])),
        name="passive",
    ),
)
SERVO = (
    Holonomic(
        lambda q, t, p: (q[0] + q[3] - jnp.cos(t))[None],
        baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"])),
        name="servo position",
    ),
    Nonholonomic(
        lambda q, qd, t, p: (qd[1] + 0.5 * q[2] * qd[4] - 0.1)[None], gain=lambda p: p["kappa"], name="servo"
    ),
)


def make_system(passive=PASSIVE):
    return System(
        mass=_mass,
        force=_force,
        n=N,
        constraints=passive,
        actuation=lambda q, t, p: p["B"],
        servo_constraints=SERVO,
    )


SYSTEM = make_system()
FREE = make_system(passive=())  # no passive constraints: seed 000 eq. 32 applies literally


def make_params(key, n_u):
    k1, k2, k3 = jax.random.split(key, 3)
    f = lambda x: jnp.asarray(x, jnp.float64)
    return {
        "M0": random_spd(k1, N, cond=10.0),
        "K": random_matrix(k2, N, N),
        "B": random_matrix(k3, N, n_u),
        "alpha_p": f(2.0),
        "beta_p": f(3.0),
        "alpha": f(4.0),
        "beta": f(5.0),
        "kappa": f(6.0),
    }


def make_state(key):
    k1, k2 = jax.random.split(key)
    return random_normal(k1, (N,)), random_normal(k2, (N,)), jnp.asarray(0.7)


_REFERENCE_TERMS = {}


def reference_terms(system, q, qd, t, p):
    """M, Q, (A_p, b_p) and the servo rows (A_s, b_s) of a System with the servo constraints as its passive
    ones, as NumPy arrays: one compiled program per system (op by op, the autodiff of the constraints
    compiled a program per primitive)."""
    if id(system) not in _REFERENCE_TERMS:
        servo = System(mass=_mass, force=_force, n=N, constraints=system.servo_constraints)
        _REFERENCE_TERMS[id(system)] = jax.jit(lambda q, qd, t, p: (
            system.mass_matrix(q, t, p), system.given_force(q, qd, t, p),
            system.constraint_equations(q, qd, t, p), servo.constraint_equations(q, qd, t, p)))
    no_actuators = {k: v for k, v in p.items() if k != "B"}  # not read: one program for every n_u
    return jax.tree_util.tree_map(np.asarray, _REFERENCE_TERMS[id(system)](q, qd, t, no_actuators))


def numpy_reference(system, q, qd, t, p):
    """u and q̈ by KKT solves in NumPy: M q̈ - A_pᵀλ = Q + B u, A_p q̈ = b_p; then min-norm lstsq for u."""
    M, Q, (A_p, b_p), (A_s, b_s) = reference_terms(system, q, qd, t, p)
    B = np.asarray(p["B"])
    m = A_p.shape[0]
    K = np.block([[M, -A_p.T], [A_p, np.zeros((m, m))]])
    solve = lambda f, rhs: np.linalg.lstsq(K, np.concatenate([f, rhs]), rcond=None)[0][:N]
    qdd0 = solve(Q, b_p)
    R = np.stack([solve(B[:, j], np.zeros(m)) for j in range(B.shape[1])], axis=1)
    u = np.linalg.lstsq(A_s @ R, b_s - A_s @ qdd0, rcond=None)[0]
    return u, qdd0 + R @ u, (A_p, b_p, A_s, b_s)


@jax.jit
def _closed_loop(q, qd, t, p):
    """One compiled closed loop shared by the tests (recompiled only per number of actuators)."""
    return control.closed_loop_acceleration(SYSTEM, q, qd, t, p)


@pytest.mark.parametrize("n_u", [3, 6])
def test_matches_kkt_and_enforces_both_constraint_sets(n_u):
    p = make_params(jax.random.key(n_u), n_u)
    q, qd, t = make_state(jax.random.key(10 + n_u))
    out = _closed_loop(q, qd, t, p)
    u_ref, qdd_ref, (A_p, b_p, A_s, b_s) = numpy_reference(SYSTEM, q, qd, t, p)
    # cond(M) = 10 and O(1) constraint Jacobians: both solves lose at most a few digits of 1e-16.
    assert_tree_allclose(out.u, u_ref, rtol=1e-9, atol=1e-9)
    assert_tree_allclose(out.qdd, qdd_ref, rtol=1e-9, atol=1e-9)
    assert_tree_allclose(A_p @ np.asarray(out.qdd), b_p, atol=1e-9)
    assert_tree_allclose(A_s @ np.asarray(out.qdd), b_s, atol=1e-9)
    assert bool(out.feasible)


@pytest.mark.parametrize("system", [FREE, SYSTEM], ids=["no passive", "passive"])
def test_matches_seed000_x_formulation(system):
    """u = (C B̄)⁺ b̄ with C = A M^{-1/2}, B̄ = (I - B̂⁺B̂) M^{-1/2} B, b̄ = b - C M^{-1/2}(Q + Q^c).

    Seed 000 eq. 24-35, with B̄ projected as derived in ukjax.control.
    """
    p = make_params(jax.random.key(3), 3)
    q, qd, t = make_state(jax.random.key(4))
    M, Q, (A_p, b_p), (A_s, b_s) = reference_terms(system, q, qd, t, p)
    Mh = np.real(scipy.linalg.sqrtm(M))
    Mih = np.linalg.inv(Mh)
    B_hat = A_p @ Mih
    Bh_pinv = np.linalg.pinv(B_hat) if A_p.size else np.zeros((N, 0))
    Qc = Mh @ Bh_pinv @ (b_p - A_p @ np.linalg.solve(M, Q))  # seed 000 eq. 14
    a = Mih @ (Q + Qc)
    C = A_s @ Mih
    B_bar = (np.eye(N) - Bh_pinv @ B_hat) @ Mih @ np.asarray(p["B"])
    u_ref = np.linalg.pinv(C @ B_bar) @ (b_s - C @ a)
    # sqrtm of a cond-10 matrix is accurate to ~1e-13; the comparison allows a few orders more.
    assert_tree_allclose(control.servo_control(system, q, qd, t, p), u_ref, rtol=1e-9, atol=1e-9)


def test_null_space_choice_and_minimum_norm():
    p = make_params(jax.random.key(5), 6)
    q, qd, t = make_state(jax.random.key(6))
    s_fn = lambda q, qd, t, p: jnp.arange(6.0) - 2.0 + q[0]
    u0 = control.servo_control(SYSTEM, q, qd, t, p)
    out = control.closed_loop_acceleration(SYSTEM, q, qd, t, p, s=s_fn)
    eq = control.servo_equation(SYSTEM, q, qd, t, p)
    # Any s keeps D u = r; the difference lies in ker D; s = 0 is the shortest (seed 000 eq. 30).
    assert_tree_allclose(eq.D @ out.u, eq.r, atol=1e-9)
    assert_tree_allclose(eq.D @ (out.u - u0), jnp.zeros(2), atol=1e-9)
    assert float(jnp.linalg.norm(u0)) < float(jnp.linalg.norm(out.u))
    assert float(jnp.max(jnp.abs(out.u - u0))) > 1e-3


def test_underactuated_inconsistent_is_reported_not_nan():
    # One actuator for two servo rows: D (2 x 1) generically has rank 1 and r is not in its range.
    p = make_params(jax.random.key(7), 1)
    q, qd, t = make_state(jax.random.key(8))
    out = _closed_loop(q, qd, t, p)
    report = control.controllability(SYSTEM, q, qd, t, p)
    assert not bool(out.feasible) and not bool(report.feasible)
    assert int(report.rank) == 1 and float(report.residual) > 1e-3
    assert np.all(np.isfinite(out.u)) and np.all(np.isfinite(out.qdd))
    u_ref, _, _ = numpy_reference(SYSTEM, q, qd, t, p)  # least squares when no exact control exists
    assert_tree_allclose(out.u, u_ref, rtol=1e-9, atol=1e-9)


def test_actuators_that_cannot_reach_the_servo_constraint():
    # Diagonal M, no coupling: a force on q[2] cannot change q̈[0] + q̈[3] (rank C B̄ = 0, seed 000 Theorem 1).
    system = System(
        mass=lambda q, t, p: jnp.eye(N),
        force=lambda q, qd, t, p: jnp.ones(N),
        n=N,
        actuation=lambda q, t, p: jnp.eye(N)[:, 2:3],
        servo_constraints=SERVO[:1],
    )
    p = make_params(jax.random.key(9), 1)
    q, qd, t = make_state(jax.random.key(10))
    report = control.controllability(system, q, qd, t, p)
    assert int(report.rank) == 0 and not bool(report.feasible)
    assert_tree_allclose(control.servo_control(system, q, qd, t, p), jnp.zeros(1))


def test_jit_vmap_and_servo_residual():
    p = make_params(jax.random.key(11), 3)
    states = [make_state(key) for key in jax.random.split(jax.random.key(12), 3)]
    qs, qds, ts = (jnp.stack(parts) for parts in zip(*states, strict=True))
    batch = jax.vmap(_closed_loop, in_axes=(0, 0, 0, None))(qs, qds, ts, p)
    u_b, res_b, ok_b = batch.u, batch.servo_residual, batch.feasible
    plain = control.servo_control(SYSTEM, qs[0], qds[0], ts[0], p)
    # jit/vmap reorder floating-point operations only.
    assert_tree_allclose(u_b[0], plain, rtol=1e-12, atol=1e-12)
    for i in range(3):
        assert_tree_allclose(u_b[i], _closed_loop(qs[i], qds[i], ts[i], p).u, rtol=1e-12, atol=1e-12)
        expected = jnp.concatenate([SERVO[0].value(qs[i], ts[i], p), SERVO[1].value(qs[i], qds[i], ts[i], p)])
        assert_tree_allclose(res_b[i], expected, rtol=1e-14, atol=1e-14)
    assert bool(jnp.all(ok_b))


def test_gradient_with_respect_to_servo_gains():
    p = make_params(jax.random.key(13), 3)
    q, qd, t = make_state(jax.random.key(14))

    def loss(gains):
        p2 = {**p, "alpha": gains[0], "beta": gains[1], "kappa": gains[2]}
        return jnp.sum(jnp.sin(_closed_loop(q, qd, t, p2).u))

    gains = jnp.array([4.0, 5.0, 6.0])
    grad = jax.jit(jax.grad(loss))(gains)
    for i in range(3):
        e = jnp.zeros(3).at[i].set(1.0)
        # O(eps²) truncation with eps = 1e-5 on O(10) second derivatives, plus round-off 1e-16/1e-5.
        assert_tree_allclose(grad[i], central_difference(loss, gains, e, eps=1e-5), rtol=1e-6, atol=1e-7)


def test_bad_shapes_raise():
    p = make_params(jax.random.key(15), 3)
    q, qd, t = make_state(jax.random.key(16))
    with pytest.raises(ValueError, match=r"shape"):
        control.closed_loop_acceleration(SYSTEM, q[:3], qd, t, p)
    with pytest.raises(ValueError, match=r"\(5, n_u\)"):
        control.servo_control(SYSTEM, q, qd, t, {**p, "B": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match="actuation"):
        control.servo_control(System(mass=_mass, force=_force, n=N, servo_constraints=SERVO), q, qd, t, p)
    with pytest.raises(ValueError, match=r"s must have shape"):
        control.constraint_following_control(jnp.ones((2, 3)), jnp.ones(2), jnp.ones(2))


def test_consistent_state_satisfies_position_and_velocity_constraints():
    p = make_params(jax.random.key(17), 3)
    q, qd, t = make_state(jax.random.key(18))
    q0, qd0 = jax.jit(lambda q, qd: control.consistent_state(SYSTEM, 0.3 * q, qd, t, p))(q, qd)
    pos, vel = SYSTEM.residuals(q0, qd0, t, p)
    # Newton converges quadratically; 30 steps leave round-off only.
    assert_tree_allclose(pos, jnp.zeros(2), atol=1e-12)
    assert_tree_allclose(vel, jnp.zeros(2), atol=1e-12)
    servo = control.servo_residual(SYSTEM, q0, qd0, t, p, jnp.zeros(N))
    assert_tree_allclose(servo, jnp.zeros(2), atol=1e-12)


def test_consistent_state_pins_a_crank_angle_or_rate_separately():
    """Five-bar parallelogram (one degree of freedom), guess off the manifold. Pinning crank 1's angle only
    (``fixed_position``): the linkage assembles at that angle (its closed-form configuration) and the rates
    are the minimum-norm correction, so crank 1's rate moves off its guess. Pinning its rate only
    (``fixed_rate``): every rate is the closed-form rate pattern times that crank rate at the solved angle.
    Residuals and closed forms to 1e-10 (Gauss-Newton converges quadratically; the rank-11 Jacobian's
    pseudoinverse rounding stays ~1e-13)."""
    from ukjax.models import five_bar

    system, p = five_bar.system(), five_bar.default_params()
    angle, rate = 0.9, 1.3
    q_on, qd_on = five_bar.initial_state(dict(p, phi0=jnp.asarray(angle), omega0=jnp.asarray(rate)))
    noise = jnp.asarray(np.random.default_rng(7).normal(0.0, 0.05, (2, 12)))
    guess_q, guess_qd = q_on + noise[0], qd_on + noise[1]
    guess_q = guess_q.at[2].set(angle)
    pins = ("fixed_position", "fixed_rate")
    solve = jax.jit(control.consistent_state, static_argnums=0, static_argnames=pins)

    q, qd = solve(system, guess_q, guess_qd, 0.0, p, fixed_position=(2,))
    assert float(q[2]) == angle
    assert_tree_allclose(q, q_on, rtol=0, atol=1e-10)
    assert_tree_allclose(system.residuals(q, qd, 0.0, p), (jnp.zeros(12), jnp.zeros(12)), rtol=0, atol=1e-10)
    assert abs(float(qd[2] - guess_qd[2])) > 1e-4  # the rate was free to move
    pattern = five_bar.initial_state(dict(p, phi0=q[2], omega0=qd[2]))[1]
    assert_tree_allclose(qd, pattern, rtol=0, atol=1e-10)

    guess_qd = guess_qd.at[2].set(rate)
    q, qd = solve(system, guess_q.at[2].add(0.02), guess_qd, 0.0, p, fixed_rate=(2,))
    assert float(qd[2]) == rate
    assert_tree_allclose(system.residuals(q, qd, 0.0, p), (jnp.zeros(12), jnp.zeros(12)), rtol=0, atol=1e-10)
    assert_tree_allclose(q, five_bar.configuration(q[2], p), rtol=0, atol=1e-10)
    assert_tree_allclose(qd, five_bar.initial_state(dict(p, phi0=q[2], omega0=jnp.asarray(rate)))[1],
                         rtol=0, atol=1e-10)


def test_consistent_state_refuses_bad_pins():
    from ukjax.models import five_bar

    system, p = five_bar.system(), five_bar.default_params()
    q, qd = five_bar.initial_state(p)
    with pytest.raises(ValueError, match=r"fixed_rate indices must lie in \[0, 12\), got 12"):
        control.consistent_state(system, q, qd, 0.0, p, fixed_rate=[12])
    with pytest.raises(ValueError, match=r"fixed_position indices must lie in \[0, 12\), got -1"):
        control.consistent_state(system, q, qd, 0.0, p, fixed_position=[-1])
    with pytest.raises(ValueError, match=r"coordinates \[2\] are listed in fixed .* and again in fixed_rate"):
        control.consistent_state(system, q, qd, 0.0, p, fixed=[2], fixed_rate=[2, 3])
    with pytest.raises(ValueError, match="fixed_position must hold coordinate indices"):
        control.consistent_state(system, q, qd, 0.0, p, fixed_position=[1.0])


def test_non_numeric_servo_equations_are_named():
    """Strings in D or r reached JAX's "Error interpreting argument" (issue 39); now the argument is named."""
    D, r, words = jnp.eye(2), jnp.ones(2), np.array(["1", "1"])
    for call, named in [
        (lambda: control.servo_controllability(np.diag(words), r), "servo_controllability: D"),
        (lambda: control.constraint_following_control(D, words), "constraint_following_control: r"),
        (lambda: control.constraint_following_control(D, r, ["a", "b"]), "constraint_following_control: s"),
    ]:
        with pytest.raises(TypeError, match=named + " must be a real floating-point"):
            call()


def test_non_finite_servo_equation_is_reported_not_ranked():
    """D with an inf entry: the rank was that of D with the entry zeroed (3 for this D), a number that looks
    valid; now -1 (the rank of a non-finite matrix is undefined), the residual NaN and feasible False."""
    D = jnp.arange(1.0, 10.0).reshape(3, 3).at[0, 0].set(jnp.inf)
    report = control.servo_controllability(D, jnp.ones(3))
    assert int(report.rank) == -1 and np.isnan(report.residual) and not bool(report.feasible)
    report = control.servo_controllability(jnp.eye(3), jnp.ones(3).at[1].set(jnp.nan))
    assert int(report.rank) == -1 and np.isnan(report.residual) and not bool(report.feasible)
    finite = control.servo_controllability(jnp.arange(1.0, 10.0).reshape(3, 3), jnp.ones(3))
    assert int(finite.rank) == 2 and bool(finite.feasible)
