"""Input checks of ukjax.dynamics: shape errors at trace time, opt-in runtime errors, NaN-free flags."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, random_matrix, random_normal, random_spd

from ukjax import _checks
from ukjax import dynamics as dyn

# The shapes of tests/test_dynamics.py's rank-deficient case (n = 6, m = 4), so that compiled functions are
# shared when the suite runs in one process.
_k = jax.random.split(jax.random.PRNGKey(21), 4)
M6 = random_spd(_k[0], 6, 20.0)
Q6 = random_normal(_k[1], (6,))
A46 = random_matrix(_k[2], 4, 6, 3)
B4 = A46 @ jnp.arange(1.0, 7.0)
C6 = random_normal(_k[3], (6,))
INDEFINITE = jnp.diag(jnp.array([1.0, -1.0, 2.0, 1.0, 1.0, 1.0]))
ASYMMETRIC = M6.at[0, 1].add(0.1)

WITH_C = {
    "uk_acceleration": dyn.uk_acceleration,
    "uk_acceleration_svd": lambda *a, **k: dyn.uk_acceleration(*a, method="svd", **k),
    "uk_acceleration_eq35": dyn.uk_acceleration_eq35,
    "uk_constraint_force": dyn.uk_constraint_force,
    "singular_mass_acceleration": dyn.singular_mass_acceleration,
    "singular_mass_acceleration_phohomsiri": lambda *a, **k: dyn.singular_mass_acceleration(
        *a, form="phohomsiri", **k
    ),
}
WITHOUT_C = {
    "kkt_acceleration": dyn.kkt_acceleration,
    "recursive_uk_acceleration": lambda M, Q, A, b, **k: dyn.recursive_uk_acceleration(
        M, Q, [(A[:2], b[:2]), (A[2:], b[2:]), (A[:1], b[:1])], **k
    ),
}
ALL = {**WITH_C, **WITHOUT_C}
# equinox.error_if raises EquinoxRuntimeError eagerly and under equinox.filter_jit; under jax.jit the same
# message arrives wrapped by the XLA runtime, as a RuntimeError or a ValueError depending on the call path.
CHECK_ERRORS = (RuntimeError, ValueError)

BAD_SHAPES = [  # (argument, wrong value, pattern the error must contain; the recursive form names blocks)
    ("M", jnp.ones((6, 7)), re.escape("M.shape=(6, 7)")),
    ("M", jnp.ones(6), re.escape("M.shape=(6,)")),
    ("Q", jnp.ones(7), re.escape("Q.shape=(7,)")),
    ("A", jnp.ones((4, 7)), r"A(_k)?\.shape=\(\d, 7\)"),
    ("b", jnp.ones(5), r"b(_k)?\.shape=\(\d,\)"),
]


def call(name, M=M6, Q=Q6, A=A46, b=B4, c=C6, **kwargs):
    if name in WITH_C:
        return WITH_C[name](M, Q, A, b, c, **kwargs)
    return WITHOUT_C[name](M, Q, A, b, **kwargs)


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("arg,value,pattern", BAD_SHAPES)
def test_wrong_shape_raises_value_error_naming_it(name, arg, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(name, **{arg: value})


@pytest.mark.parametrize("name", list(WITH_C))
def test_wrong_c_shape(name):
    with pytest.raises(ValueError, match=re.escape("c.shape=(5,)")):
        call(name, c=jnp.ones(5))


def test_wrong_shapes_of_blocks_and_options():
    rec = dyn.recursive_uk_acceleration
    with pytest.raises(ValueError, match=re.escape("block 1: A_k must have shape (m_k, 6), got A_k.shape")):
        rec(M6, Q6, [(A46, B4), (jnp.ones((1, 2)), jnp.ones(1))])
    with pytest.raises(ValueError, match=r"block 0: b_k must have shape \(4,\).*b_k.shape=\(3,\)"):
        rec(M6, Q6, [(A46, jnp.ones(3))])
    with pytest.raises(ValueError, match=r"R_k must have shape \(4, 4\).*R_k.shape=\(1, 1\)"):
        rec(M6, Q6, [(A46, B4)], [jnp.ones((1, 1))])
    with pytest.raises(ValueError, match="one matrix or None per block"):
        rec(M6, Q6, [(A46, B4)], [None, None])
    with pytest.raises(ValueError, match="covariance_update"):
        rec(M6, Q6, [(A46, B4)], covariance_update="kalman")
    with pytest.raises(ValueError, match="unknown method"):
        dyn.uk_acceleration(M6, Q6, A46, B4, method="qr")
    with pytest.raises(ValueError, match="unknown form"):
        dyn.singular_mass_acceleration(M6, Q6, A46, B4, form="lagrange")
    with pytest.raises(ValueError, match=re.escape("A.shape=(3,), b.shape=(4,)")):
        dyn.constraint_consistency(jnp.ones(3), B4)
    with pytest.raises(ValueError, match=re.escape("b.shape=(3,)")):
        _checks.input_status(M6, Q6, A46, jnp.ones(3))


@pytest.mark.parametrize("name", list(ALL))
def test_runtime_checks(name):
    """Valid input passes; asymmetric M: the answer for (M + Mᵀ)/2 unchecked, a named error checked;
    a NaN or inf in any input: a named error checked."""
    assert_tree_allclose(call(name, check=True), call(name), rtol=1e-14, atol=1e-14)
    symmetrized = call(name, M=(ASYMMETRIC + ASYMMETRIC.T) / 2)
    assert_tree_allclose(call(name, M=ASYMMETRIC), symmetrized, rtol=1e-13, atol=1e-13)
    with pytest.raises(CHECK_ERRORS, match="not symmetric"):
        jax.block_until_ready(call(name, M=ASYMMETRIC, check=True))
    for arg, value in {"M": M6, "Q": Q6, "A": A46, "b": B4}.items():
        bad = value.at[(1,) * value.ndim].set(jnp.inf if arg == "Q" else jnp.nan)
        with pytest.raises(CHECK_ERRORS, match="NaN or inf"):
            jax.block_until_ready(call(name, check=True, **{arg: bad}))


def test_checks_survive_jit_and_vmap():
    """Every call above already runs compiled (ukjax jits its functions); here under an outer jit(vmap)."""
    batched = jax.jit(jax.vmap(lambda M, Q: dyn.uk_acceleration(M, Q, A46, B4, check=True)))
    Ms, Qs = jnp.stack([M6, 2 * M6]), jnp.stack([Q6, Q6])
    # The reference passes c = 0, which adds exactly nothing (eq. 35: Q + c), rather than no c: it then runs
    # the unchecked program test_runtime_checks compiled (with C6), not a second compile of the same solve.
    expected = [dyn.uk_acceleration(M, Q6, A46, B4, jnp.zeros_like(Q6)) for M in (M6, 2 * M6)]
    assert_tree_allclose(batched(Ms, Qs), jnp.stack(expected), rtol=1e-14, atol=1e-14)
    with pytest.raises(CHECK_ERRORS, match="NaN or inf"):
        jax.block_until_ready(batched(Ms, Qs.at[1, 1].set(jnp.inf)))
    with pytest.raises(CHECK_ERRORS, match="not positive definite"):  # one bad member stops the batch
        jax.block_until_ready(batched(jnp.stack([M6, INDEFINITE]), Qs))


@pytest.mark.parametrize("name", ["uk_acceleration", "uk_acceleration_svd", "recursive_uk_acceleration"])
def test_non_positive_definite_mass(name):
    """Unchecked: NaN, never finite garbage. Checked: a named error; a singular M is rejected as well."""
    assert np.all(np.isnan(call(name, M=INDEFINITE)))
    for M in (INDEFINITE, jnp.diag(jnp.array([1.0, 0.0, 2.0, 1.0, 1.0, 1.0]))):
        with pytest.raises(CHECK_ERRORS, match="not positive definite"):
            jax.block_until_ready(call(name, M=M, check=True))


@pytest.mark.parametrize("name", ["singular_mass_acceleration", "kkt_acceleration"])
def test_singular_mass_requirements(name):
    singular = jnp.diag(jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0]))
    call(name, M=singular, check=True)  # A moves the massless last coordinate: unique motion
    with pytest.raises(CHECK_ERRORS, match="not unique"):  # nothing fixes the last coordinate
        jax.block_until_ready(call(name, M=singular, A=A46.at[:, 5].set(0.0), check=True))
    with pytest.raises(CHECK_ERRORS, match="not positive semidefinite"):
        jax.block_until_ready(call(name, M=INDEFINITE, check=True))


STATUS_CASES = {  # name: (M, Q, A, b, expected (finite, symmetric, positive definite, consistent))
    "good": (M6, Q6, A46, B4, (True, True, True, True)),
    "nan_in_M": (M6.at[2, 2].set(jnp.nan), Q6, A46, B4, (False, False, False, True)),
    "inf_in_Q": (M6, Q6.at[0].set(jnp.inf), A46, B4, (False, True, True, True)),
    "nan_in_b": (M6, Q6, A46, B4.at[0].set(jnp.nan), (False, True, True, False)),
    "asymmetric": (ASYMMETRIC, Q6, A46, B4, (True, False, True, True)),
    "indefinite": (INDEFINITE, Q6, A46, B4, (True, True, False, True)),
    "singular": (jnp.diag(jnp.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])), Q6, A46, B4, (True, True, False, True)),
    "inconsistent": (M6, Q6, A46, B4.at[0].add(1.0), (True, True, True, False)),  # rank 3: b ∉ range(A)
}


def test_input_status_flags_plain_jit_vmap():
    names = list(STATUS_CASES)
    expected = np.array([STATUS_CASES[k][4] for k in names])

    def flags(status):
        fields = ("finite", "mass_symmetric", "mass_positive_definite", "constraints_consistent")
        return np.stack([np.asarray(getattr(status, f)) for f in fields], axis=-1)

    plain = np.array([flags(_checks.input_status(*STATUS_CASES[k][:4])) for k in names])
    np.testing.assert_array_equal(plain, expected)
    stacked = [jnp.stack([STATUS_CASES[k][i] for k in names]) for i in range(4)]
    batched = jax.jit(jax.vmap(_checks.input_status))(*stacked)
    np.testing.assert_array_equal(flags(batched), expected)
    assert batched.ok.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(batched.ok), expected.all(axis=1))


def test_predicates_against_numpy():
    rng = np.random.default_rng(3)
    for _ in range(20):
        X = rng.normal(size=(5, 5))
        S = X + X.T + rng.uniform(-2.0, 6.0) * np.eye(5)
        assert bool(_checks.is_positive_definite(jnp.asarray(S))) == (np.linalg.eigvalsh(S).min() > 0)
        A = rng.normal(size=(2, 5))
        W = rng.normal(size=(rng.integers(1, 5), 5))
        stacked_rank = np.linalg.matrix_rank(np.vstack([W.T @ W, A]))
        assert bool(_checks.motion_is_unique(jnp.asarray(W.T @ W), jnp.asarray(A))) == (stacked_rank == 5)
    assert bool(_checks.is_positive_semidefinite(jnp.asarray(W.T @ W)))
    assert not bool(_checks.is_positive_semidefinite(INDEFINITE))


def test_invalid_rtol_raises_and_non_finite_gives_nan():
    """A concrete negative or NaN rtol raises ValueError naming rtol (it used to give a wrong residual);
    non-finite A or b gives a NaN residual (it used to run LAPACK's SVD on inf, which did not return; the
    subprocess check is in test_linalg) and False flags, never NaN flags."""
    A, b = jnp.array([[1.0, 2.0], [2.0, 4.0]]), jnp.array([1.0, 2.0])
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="rtol"):
            _checks.constraint_consistency(A, b, rtol=bad)
        with pytest.raises(ValueError, match="rtol"):
            _checks.input_status(jnp.eye(2), jnp.zeros(2), A, b, rtol=bad)
        with pytest.raises(ValueError, match="rtol"):
            _checks.motion_is_unique(jnp.eye(2), A, rtol=bad)
    assert np.isnan(_checks.constraint_consistency(A, b.at[0].set(jnp.nan)))
    assert float(_checks.constraint_consistency(A, b)) <= 1e-14  # consistent: round-off only
    assert not bool(_checks.is_positive_definite(jnp.eye(2).at[0, 0].set(jnp.inf)))
