"""Second-order constraint forms (A, b) by autodiff against hand derivations (seed 002 eq. 19-20 and closed
forms), Baumgarte conventions, and the holonomy test of seed 002 Lemma 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference

from ukjax.constraints import (
    AccelerationLevel,
    Baumgarte,
    Holonomic,
    Nonholonomic,
    frobenius_terms,
    is_holonomic_pfaffian,
    pfaffian_integrability,
    second_order_blocks,
    stack_blocks,
)

# (A, b) of closed forms are products of a few O(1) numbers: agreement to 1e-12 is round-off only.
TOL = dict(rtol=1e-12, atol=1e-12)


@jax.jit
def _second_order_batch(constraint, q, qd, t, p):
    """(A, b) at a batch of states; one compile per constraint."""
    return jax.vmap(lambda q_, qd_, t_: constraint.second_order(q_, qd_, t_, p))(q, qd, t)


def _states(n, count=5, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(count, n)))
    qd = jnp.asarray(rng.normal(size=(count, n)))
    t = jnp.asarray(rng.uniform(0.0, 3.0, size=count))
    return q, qd, t


NO_PARAMS = {}


# ------------------------------------------------------------------ seed 002 Examples 2-4 (eq. 12-20)
def _expect_eq19(q, qd):
    """Seed 002 eq. 19: A = [1, 2y, 1], b = -2ẏ²."""
    A = jnp.stack([jnp.ones_like(q[:, 1]), 2 * q[:, 1], jnp.ones_like(q[:, 1])], axis=-1)[:, None, :]
    return A, (-2 * qd[:, 1] ** 2)[:, None]


EXAMPLES_EQ19 = {
    # Example 2, eq. 12 (velocity form) and eq. 13 (integrated, scleronomic).
    "ex2_velocity": Nonholonomic(lambda q, qd, t, p: qd[0] + 2 * q[1] * qd[1] + qd[2]),
    "ex2_position": Holonomic(lambda q, t, p: q[0] + q[1] ** 2 + q[2]),
    # Example 3, eq. 14 (velocity form) and eq. 15 (integrated, rheonomic); same (A, b) as Example 2.
    "ex3_velocity": Nonholonomic(lambda q, qd, t, p: qd[0] + 2 * q[1] * qd[1] + qd[2] - 1.0),
    "ex3_position": Holonomic(lambda q, t, p: q[0] + q[1] ** 2 + q[2] - t),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES_EQ19))
def test_seed002_examples_2_3_eq19(name):
    q, qd, t = _states(3)
    A, b = _second_order_batch(EXAMPLES_EQ19[name], q, qd, t, NO_PARAMS)
    assert_tree_allclose((A, b), _expect_eq19(q, qd), **TOL, msg=name)


def test_seed002_example_4_eq20():
    q, qd, t = _states(3)
    constraint = Nonholonomic(lambda q, qd, t, p: qd[0] + 2 * q[2] * qd[1] + qd[2])
    A, b = _second_order_batch(constraint, q, qd, t, NO_PARAMS)
    A_hand = jnp.stack([jnp.ones_like(q[:, 2]), 2 * q[:, 2], jnp.ones_like(q[:, 2])], axis=-1)[:, None, :]
    assert_tree_allclose((A, b), (A_hand, (-2 * qd[:, 1] * qd[:, 2])[:, None]), **TOL)


# ------------------------------------------------------------------ rheonomic holonomic, nonlinear
# nonholonomic
def _rotating_line(q, t, p):
    """x cos ωt + y sin ωt - d = 0: a point on a line rotating at rate ω (rheonomic)."""
    w = p["omega"]
    return q[0] * jnp.cos(w * t) + q[1] * jnp.sin(w * t) - p["d"]


def _rotating_line_hand(q, qd, t, p):
    """By hand: A = [cos ωt, sin ωt]; b = -2ω(-ẋ sin ωt + ẏ cos ωt) + ω²(x cos ωt + y sin ωt)."""
    w = p["omega"]
    c, s = jnp.cos(w * t), jnp.sin(w * t)
    A = jnp.stack([c, s], axis=-1)[:, None, :]
    b = -2 * w * (-qd[:, 0] * s + qd[:, 1] * c) + w**2 * (q[:, 0] * c + q[:, 1] * s)
    phi = q[:, 0] * c + q[:, 1] * s - p["d"]
    phi_dot = qd[:, 0] * c + qd[:, 1] * s + w * (-q[:, 0] * s + q[:, 1] * c)
    return A, b[:, None], phi[:, None], phi_dot[:, None]


LINE_PARAMS = {
    "omega": jnp.asarray(1.3),
    "d": jnp.asarray(0.4),
    "alpha": jnp.asarray(0.7),
    "beta": jnp.asarray(2.5),
}


def test_rheonomic_sine_constraint():
    """x - sin t = 0: A = [1, 0], b = -sin t - 2α(ẋ - cos t) - β²(x - sin t) (quadratic Baumgarte)."""
    q, qd, t = _states(2)
    constraint = Holonomic(
        lambda q, t, p: q[0] - jnp.sin(t), baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"]))
    )
    A, b = _second_order_batch(constraint, q, qd, t, LINE_PARAMS)
    a, beta = LINE_PARAMS["alpha"], LINE_PARAMS["beta"]
    b_hand = -jnp.sin(t) - 2 * a * (qd[:, 0] - jnp.cos(t)) - beta**2 * (q[:, 0] - jnp.sin(t))
    A_hand = jnp.broadcast_to(jnp.asarray([[1.0, 0.0]]), (5, 1, 2))
    assert_tree_allclose((A, b), (A_hand, b_hand[:, None]), **TOL)


def test_rheonomic_rotating_line_and_residuals():
    q, qd, t = _states(2)
    constraint = Holonomic(_rotating_line)
    A, b = _second_order_batch(constraint, q, qd, t, LINE_PARAMS)
    A_hand, b_hand, phi_hand, phi_dot_hand = _rotating_line_hand(q, qd, t, LINE_PARAMS)
    assert_tree_allclose((A, b), (A_hand, b_hand), **TOL)
    residuals = jax.vmap(lambda q_, qd_, t_: constraint.residuals(q_, qd_, t_, LINE_PARAMS))(q, qd, t)
    assert_tree_allclose(residuals, (phi_hand, phi_dot_hand), **TOL)


def _speed_law(q, qd, t, p):
    """ψ = ẋ² + x ẏ² - sin t, nonlinear in q̇."""
    return qd[0] ** 2 + q[0] * qd[1] ** 2 - jnp.sin(t)


def test_nonholonomic_nonlinear_in_velocity():
    """A = [2ẋ, 2xẏ], b = -ẋẏ² + cos t - κψ (differentiated by hand)."""
    q, qd, t = _states(2)
    p = {"kappa": jnp.asarray(3.0)}
    constraint = Nonholonomic(_speed_law, gain=lambda p: p["kappa"])
    A, b = _second_order_batch(constraint, q, qd, t, p)
    psi = qd[:, 0] ** 2 + q[:, 0] * qd[:, 1] ** 2 - jnp.sin(t)
    A_hand = jnp.stack([2 * qd[:, 0], 2 * q[:, 0] * qd[:, 1]], axis=-1)[:, None, :]
    b_hand = -qd[:, 0] * qd[:, 1] ** 2 + jnp.cos(t) - p["kappa"] * psi
    assert_tree_allclose((A, b), (A_hand, b_hand[:, None]), **TOL)


def _path(t):
    """A smooth test trajectory q(t) in the plane, for derivation-free checks of A q̈ - b."""
    return jnp.stack([0.3 + jnp.sin(1.7 * t), 0.5 * jnp.cos(0.9 * t) - 0.2 * t**2])


def test_second_order_form_matches_time_derivative_along_a_path():
    """Along any path q(t): φ̈ = A q̈ - b (no stabilization) and ψ̇ = A q̈ - b, with φ̈ and ψ̇ taken by
    central differences of φ(q(t), t) and ψ(q(t), q̇(t), t): an independent check of the autodiff derivation.
    Differences with h = 1e-3 (second) and 1e-5 (first) have errors ~h² |φ''''| ≈ 1e-6 and ~1e-9."""
    t0 = jnp.asarray(0.8)
    h = 1e-3
    errors = _path_errors(t0, h)
    assert_tree_allclose(errors[0], errors[1], rtol=1e-5, atol=1e-5)
    assert_tree_allclose(errors[2], errors[3], rtol=1e-8, atol=1e-8)


@jax.jit
def _path_errors(t0, h):
    q, qd, qdd = _path(t0), jax.jacfwd(_path)(t0), jax.jacfwd(jax.jacfwd(_path))(t0)
    holonomic, nonholonomic = Holonomic(_rotating_line), Nonholonomic(_speed_law)
    A, b = holonomic.second_order(q, qd, t0, LINE_PARAMS)
    phi_t = lambda t: holonomic.value(_path(t), t, LINE_PARAMS)
    phi_ddot = (phi_t(t0 + h) - 2 * phi_t(t0) + phi_t(t0 - h)) / h**2
    A2, b2 = nonholonomic.second_order(q, qd, t0, NO_PARAMS)
    psi_t = lambda t: nonholonomic.value(_path(t), jax.jacfwd(_path)(t), t, NO_PARAMS)
    psi_dot = central_difference(psi_t, t0, jnp.asarray(1.0), eps=1e-5)
    return A @ qdd - b, phi_ddot, A2 @ qdd - b2, psi_dot


# ------------------------------------------------------------------ Baumgarte conventions
def test_baumgarte_quadratic_linear_mapping_and_per_row_gains():
    """quadratic (α, β) gives b0 - 2αφ̇ - β²φ; linear (α', β') gives b0 - α'φ̇ - β'φ; they agree for α' = 2α,
    β' = β² (seed 000/004 vs seed 001 conventions). Gains may be per-row arrays."""
    q, qd, t = _states(2)
    two_rows = lambda q, t, p: jnp.stack([_rotating_line(q, t, p), q[0] ** 2 + q[1] ** 2 - 1.0 - 0.1 * t])
    p = {
        **LINE_PARAMS,
        "alpha": jnp.asarray([0.7, 1.1]),
        "beta": jnp.asarray([2.5, 4.0]),
        "alpha_lin": jnp.asarray([1.4, 2.2]),
        "beta_lin": jnp.asarray([6.25, 16.0]),
    }
    plain = Holonomic(two_rows)
    quad = Holonomic(two_rows, baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"]), form="quadratic"))
    lin = Holonomic(two_rows, baumgarte=Baumgarte(lambda p: (p["alpha_lin"], p["beta_lin"]), form="linear"))
    lin_same = Holonomic(two_rows, baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"]), form="linear"))
    A0, b0 = _second_order_batch(plain, q, qd, t, p)
    phi, phi_dot = jax.vmap(lambda q_, qd_, t_: plain.residuals(q_, qd_, t_, p))(q, qd, t)
    Aq, bq = _second_order_batch(quad, q, qd, t, p)
    Al, bl = _second_order_batch(lin, q, qd, t, p)
    As, bs = _second_order_batch(lin_same, q, qd, t, p)
    assert_tree_allclose(bq, b0 - 2 * p["alpha"] * phi_dot - p["beta"] ** 2 * phi, **TOL)
    assert_tree_allclose(bs, b0 - p["alpha"] * phi_dot - p["beta"] * phi, **TOL)
    assert_tree_allclose((Al, bl), (Aq, bq), **TOL)
    assert_tree_allclose((Aq, As), (A0, A0), **TOL)
    assert not np.allclose(bs, bq)  # the two conventions differ for the same numbers


def test_baumgarte_rejects_unknown_form():
    with pytest.raises(ValueError, match="Baumgarte form"):
        Baumgarte(lambda p: (1.0, 1.0), form="cubic")


def test_gains_are_differentiable_parameters():
    """∂b/∂(α, β) by autodiff vs central differences; the quadratic form has ∂b/∂β = -2βφ."""
    constraint = Holonomic(_rotating_line, baumgarte=Baumgarte(lambda p: (p["alpha"], p["beta"])))
    q, qd, t = jnp.asarray([0.9, -0.3]), jnp.asarray([0.2, 0.5]), jnp.asarray(0.4)

    def b_of(gains):
        return constraint.second_order(q, qd, t, {**LINE_PARAMS, "alpha": gains[0], "beta": gains[1]})[1][0]

    gains = jnp.asarray([0.7, 2.5])
    b_of = jax.jit(b_of)
    grad = jax.jit(jax.grad(b_of))(gains)
    fd = jnp.stack([central_difference(b_of, gains, e) for e in jnp.eye(2)])
    assert_tree_allclose(grad, fd, rtol=1e-8, atol=1e-8)  # b is quadratic in β: FD error is round-off only
    phi, phi_dot = constraint.residuals(q, qd, t, LINE_PARAMS)
    assert_tree_allclose(grad, jnp.stack([-2 * phi_dot[0], -2 * 2.5 * phi[0]]), **TOL)


# ------------------------------------------------------------------ acceleration-level constraints and
# stacking
def test_acceleration_level_and_stacking():
    constraint = AccelerationLevel(
        A=lambda q, qd, t, p: jnp.asarray([1.0, -q[0]]), b=lambda q, qd, t, p: qd[1] * t
    )
    q, qd, t = jnp.asarray([2.0, 1.0]), jnp.asarray([0.5, 3.0]), jnp.asarray(0.5)
    blocks = second_order_blocks((constraint, Holonomic(lambda q, t, p: q[1])), q, qd, t, NO_PARAMS)
    A, b = stack_blocks(blocks, 2, jnp.float64)
    assert_tree_allclose((A, b), (jnp.asarray([[1.0, -2.0], [0.0, 1.0]]), jnp.asarray([1.5, 0.0])), **TOL)
    A0, b0 = stack_blocks([], 3, jnp.float64)
    assert A0.shape == (0, 3) and b0.shape == (0,)


def test_bad_constraint_shapes_raise_value_errors_naming_shapes():
    q, qd, t = jnp.zeros(3), jnp.zeros(3), jnp.asarray(0.0)
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        Holonomic(lambda q, t, p: jnp.zeros((2, 2)), name="matrix").second_order(q, qd, t, NO_PARAMS)
    wide = AccelerationLevel(A=lambda q, qd, t, p: jnp.zeros((1, 4)), b=lambda q, qd, t, p: 0.0, name="wide")
    with pytest.raises(ValueError, match=r"\(1, 4\).*\(k, 3\)"):
        second_order_blocks((wide,), q, qd, t, NO_PARAMS)
    rows = AccelerationLevel(A=lambda q, qd, t, p: jnp.zeros((2, 3)), b=lambda q, qd, t, p: jnp.zeros(3))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3,\)"):
        second_order_blocks((rows,), q, qd, t, NO_PARAMS)


# ------------------------------------------------------------------ holonomy (seed 002 Lemma 1, eq. 11)
POINTS3 = jnp.asarray(np.random.default_rng(1).normal(size=(6, 3)))
POINTS4 = jnp.asarray(np.random.default_rng(2).normal(size=(6, 4)))
_holonomy = jax.jit(is_holonomic_pfaffian, static_argnums=0)  # one compile per coefficient function


def test_lemma1_examples_2_3_holonomic():
    holonomic, worst = _holonomy(lambda x: jnp.stack([1.0, 2 * x[1], 1.0]), POINTS3)  # Example 2
    assert bool(holonomic) and float(worst) == 0.0
    # Example 3 (eq. 14) is a Pfaffian form in (x, y, z, t): dx + 2y dy + dz - dt = 0, integral eq. 15.
    holonomic, worst = _holonomy(lambda x: jnp.stack([1.0, 2 * x[1], 1.0, -1.0]), POINTS4)
    assert bool(holonomic) and float(worst) == 0.0


def test_lemma1_example_4_nonholonomic():
    """Example 4 (α, β, γ) = (1, 2z, 1): α(β_z - γ_y) + β(γ_x - α_z) + γ(α_y - β_x) = 1·2 = 2 everywhere.

    Seed 002 eq. 17 prints the value as 1; the conclusion (nonzero, so nonholonomic) is the same. ∂β/∂z = 2
    makes the value 2, which is what ukjax computes and what this test asserts."""
    coefficients = lambda x: jnp.stack([1.0, 2 * x[2], 1.0])
    holonomic, worst = _holonomy(coefficients, POINTS3)
    assert not bool(holonomic)
    values = jax.vmap(lambda x: pfaffian_integrability(coefficients, x))(POINTS3)
    assert_tree_allclose(values, 2.0 * jnp.ones(6))
    # With a rheonomic term the form in (x, y, z, t) stays nonholonomic.
    assert not bool(_holonomy(lambda x: jnp.stack([1.0, 2 * x[2], 1.0, x[0]]), POINTS4)[0])


def test_knife_edge_is_nonholonomic_with_unit_value():
    """-sin θ dx + cos θ dy = 0 in (x, y, θ): value sin²θ + cos²θ = 1 (a closed form, not from the seed)."""
    coefficients = lambda x: jnp.stack([-jnp.sin(x[2]), jnp.cos(x[2]), 0.0])
    values = jax.vmap(lambda x: frobenius_terms(coefficients, x))(POINTS3)
    assert_tree_allclose(values, jnp.ones((6, 1)))


def test_frobenius_terms_four_variables_against_numpy():
    """Each triple (i, j, l) of a 4-variable form vs seed 002 eq. 11 written out in (α, β, γ) = (a_i, a_j,
    a_l) with partial derivatives by NumPy central differences."""
    coefficients = jax.jit(lambda x: jnp.stack([x[1] * x[3], jnp.sin(x[0]), x[2] ** 2, x[0] * x[1]]))
    x = np.asarray(POINTS4[0])
    values = np.asarray(jax.jit(frobenius_terms, static_argnums=0)(coefficients, jnp.asarray(x)))
    a = lambda y: np.asarray(coefficients(jnp.asarray(y)))
    h = 1e-6
    d = lambda f, v: (a(x + h * np.eye(4)[v])[f] - a(x - h * np.eye(4)[v])[f]) / (2 * h)  # ∂a_f/∂x_v
    expected = []
    for i, j, l in [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]:
        alpha, beta, gamma = a(x)[[i, j, l]]
        expected.append(
            alpha * (d(j, l) - d(l, j)) + beta * (d(l, i) - d(i, l)) + gamma * (d(i, j) - d(j, i))
        )
    # central differences with h = 1e-6: error ~1e-10 on O(1) entries.
    np.testing.assert_allclose(values, expected, rtol=1e-8, atol=1e-8)


def test_pfaffian_bad_shapes():
    with pytest.raises(ValueError, match=r"\(5, 1\)"):
        is_holonomic_pfaffian(lambda x: x, jnp.zeros((5, 1)))
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(2,\)"):
        is_holonomic_pfaffian(lambda x: x[:2], POINTS3)
    assert bool(is_holonomic_pfaffian(lambda x: x, jnp.zeros((4, 2)))[0])
