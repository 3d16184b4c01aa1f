"""Generalized inverses (ukjax.linalg) against NumPy/LAPACK, the Penrose conditions and finite differences.

Compile budget: every jitted function below is module level and takes ``rtol`` as an array argument, so one
compiled program per (method, shape) serves all tests of that shape; A⁺, its jvp and a gradient of it are one
program (``pinv_derivatives``); test data is built and read back in NumPy (op-by-op JAX compiles a program
per primitive and shape).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference, random_matrix, random_normal, random_spd

from ukjax import linalg
from ukjax.linalg import (
    PINV_METHODS,
    cho_solve,
    cholesky,
    default_rtol,
    matrix_rank,
    pinv,
    psd_ginv,
    psd_pinv,
    small_matmul,
)

EPS = float(np.finfo(np.float64).eps)

# Shapes of the Penrose/NumPy test: (m, n, rank of the rank-deficient member of the batch). Each costs one
# compilation per method (~2 CPU-s for the QR methods, whatever the size: the fori_loop bodies are what XLA
# compiles); five of them run only with `pytest -m slow` to keep CI within its time budget. The main suite
# keeps one shape of each kind at the smallest size: 30 x 30 rank 20 is the square rank-deficient fori_loop
# case that 12 x 12 rank 11 makes; 28 x 19 rank 12 (tall, rank-deficient, both sides above 8) the case that
# 3 x 2 rank 1 (tall, rank-deficient) and 12 x 12 (above 8) make, and 15 x 18 / 19 x 28 the wide ones of
# 2 x 3 rank 1. (Several dropped singular values at once: the zero member of each batch and the rank 3, 4
# and 5 cases of 12 x 12 in test_rtol_decides_the_rank.)
SHAPES = [(1, 1, 0), (2, 3, 1), (3, 2, 1), (12, 12, 11)]
SLOW_SHAPES = [(5, 5, 3), (15, 18, 12), (19, 28, 10), (28, 19, 12), (30, 30, 20)]
SMALL = (2, 3)  # shape of the transformation and derivative tests


@functools.partial(jax.jit, static_argnames="method")
def _pinv_batch(As, rtol, method):
    return jax.vmap(lambda A: pinv(A, method, rtol))(As)


def pinv_batch(As, rtol, method):
    """jit(vmap(pinv)); ``rtol`` always a strongly typed array of A's dtype (a Python float is weakly typed
    and would compile a second program for the same shape)."""
    return _pinv_batch(As, jnp.asarray(rtol, As.dtype), method)


@functools.partial(jax.jit, static_argnames="method")
def _pinv_derivatives(A, dA, W, rtol, method):
    P, dP = jax.jvp(lambda A: pinv(A, method, rtol), (A,), (dA,))
    grad = jax.grad(lambda A: jnp.sum(W * pinv(A, method, rtol)))(A)
    return P, dP, grad


def pinv_derivatives(A, dA, W, rtol, method):
    """(A⁺, its jvp along dA, the gradient of sum(W * A⁺)): one compiled program per (method, shape) for the
    value (jit), forward and reverse mode (``rtol`` as in :func:`pinv_batch`)."""
    return _pinv_derivatives(A, dA, W, jnp.asarray(rtol, A.dtype), method)


def pinv_small(A, rtol, method):
    """jit(pinv) at a SMALL-shaped A: the value of :func:`pinv_derivatives` (the same program)."""
    m, n = SMALL
    return pinv_derivatives(A, jnp.zeros((m, n), A.dtype), jnp.zeros((n, m), A.dtype), rtol, method)[0]


def pinv_jvp(A, dA, rtol, method):
    return pinv_derivatives(A, dA, jnp.zeros(A.shape[::-1], A.dtype), rtol, method)[1]


def batch_of(m, n, r, seed=0, dtype=jnp.float64):
    """[full rank, rank r, zero] matrices of one shape (one compiled program); singular values in [0.5, 2]."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 100 * m + n))
    return jnp.asarray(np.stack([np.asarray(random_matrix(k1, m, n, dtype=dtype)),
                                 np.asarray(random_matrix(k2, m, n, r, dtype=dtype)),
                                 np.zeros((m, n), dtype)]))


def penrose_residuals(A, P):
    """Max-abs residuals of seed 004 eq. 1a-1d, each divided by the size of the products it compares."""
    A, P = np.asarray(A, np.float64), np.asarray(P, np.float64)
    a, p = np.abs(A).max(), np.abs(P).max()
    AP, PA = A @ P, P @ A
    pairs = [(AP.T, AP, a * p), (PA.T, PA, a * p), (AP @ A, A, a * a * p), (PA @ P, P, p * p * a)]
    return [np.abs(x - y).max() / (scale if scale > 0 else 1.0) for x, y, scale in pairs]


def rank_preserving_curve(m, n, r, seed):
    """t ↦ A(t) = (B + t dB)(C + t dC), of rank r for every t (B is m x r, C is r x n)."""
    kB, kC, kdB, kdC = jax.random.split(jax.random.PRNGKey(seed), 4)
    B, C = random_normal(kB, (m, r)), random_normal(kC, (r, n))
    dB, dC = random_normal(kdB, (m, r)), random_normal(kdC, (r, n))
    return lambda t: (B + t * dB) @ (C + t * dC)


# ------------------------------------------------------------------------------------ Penrose and NumPy


@pytest.mark.parametrize(
    "shape",
    SHAPES + [pytest.param(s, marks=pytest.mark.slow) for s in SLOW_SHAPES],
    ids=lambda s: f"{s[0]}x{s[1]}r{s[2]}",
)
@pytest.mark.parametrize("method", PINV_METHODS)
def test_penrose_and_numpy(method, shape):
    m, n, r = shape
    As = batch_of(m, n, r)
    rtol = default_rtol((m, n), jnp.float64)
    P = np.asarray(pinv_batch(As, rtol, method))
    # cond(A) ≤ 4 here; backward-stable methods reach ~10 n eps (seen ≤ 1e-14). Greville's error grows like
    # cond(A_i)² over its intermediate row blocks A_i, which are not controlled: seen up to 2e-12 over 200
    # random matrices per shape. 1e-10 leaves a factor 50 for Greville and 1e4 for the others.
    for A, Pi in zip(np.asarray(As), P, strict=True):
        assert all(res < 1e-10 for res in penrose_residuals(A, Pi)), (method, shape, penrose_residuals(A, Pi))
        reference = np.linalg.pinv(A, rtol=rtol)
        assert_tree_allclose(Pi, reference, rtol=0, atol=1e-10 * max(np.abs(reference).max(), 1.0))
    assert np.all(P[-1] == 0), "pinv of the zero matrix is the zero matrix"


@pytest.mark.parametrize("method", PINV_METHODS)
def test_accuracy_ill_conditioned(method):
    """cond(A) = 1e6, full rank, 12 x 12: the QR and SVD methods err like cond·eps, Greville like cond²·eps.

    The exact A⁺ = V Σ⁻¹ Uᵀ of A = U Σ Vᵀ is known; storing A rounds it by ~eps, which moves A⁺ by ~cond·eps
    relative, so that is the floor for every method. Measured (20 matrices): SVD, Householder, Varga
    ≤ 4e-11 = 0.2 cond·eps, plain MGS ≤ 9e-11 (its Q loses orthogonality like cond·eps; ukjax's MGS is now
    reorthogonalized, the 3 cond·eps bound stays), Greville ≤ 1e-7 = 5e-4 cond²·eps.
    """
    cond = 1e6
    rng = np.random.default_rng(1)
    As, exact = [], []
    for _ in range(3):
        U, _ = np.linalg.qr(rng.normal(size=(12, 12)))
        V, _ = np.linalg.qr(rng.normal(size=(12, 12)))
        s = np.geomspace(1.0, 1.0 / cond, 12)
        As.append((U * s) @ V.T)
        exact.append((V / s) @ U.T)
    P = np.asarray(pinv_batch(jnp.asarray(np.stack(As)), default_rtol((12, 12), jnp.float64), method))
    err = np.max(np.abs(P - np.stack(exact)), axis=(1, 2)) / np.max(np.abs(np.stack(exact)), axis=(1, 2))
    bound = {"greville": 10 * cond**2 * EPS, "mgs": 3 * cond * EPS}.get(method, cond * EPS)
    assert np.all(err < bound), (method, err, bound)


@pytest.mark.parametrize("method", PINV_METHODS)
def test_rtol_decides_the_rank(method):
    """Singular values (1, 0.5, 0.2, 1e-3, 1e-9): an rtol between two of them keeps exactly those above it.

    ``rtol`` is a traced argument: one compiled program serves every tolerance. With gaps of 10³ or more the
    pivots of the QR methods and Greville's ‖c_i‖ give the same rank as the singular values, but the rank-r
    matrix they invert differs from the truncated SVD by O(σ_{r+1}), so their A⁺ differs from NumPy's by
    O(σ_{r+1}/σ_r²); the tolerance is 10 times that. On top, A⁺ of the kept part errs like eps·cond_kept
    (cond_kept = 1/σ_r; Greville: eps·cond_kept²), allowed 100 times. Greville is not asked to keep 1e-9
    (eps·1e18 is no accuracy at all).

    The 5 x 5 matrix is embedded in 12 x 12 with zero rows and columns (pinv((A 0; 0 0)) = (A⁺ 0; 0 0), the
    same singular values and rank), so that the (12, 12) program of the Penrose test serves it.
    """
    rng = np.random.default_rng(2)
    U, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    V, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    s = np.array([1.0, 0.5, 0.2, 1e-3, 1e-9, 0.0])
    A = np.zeros((12, 12))
    A[:5, :5] = (U * s[:5]) @ V.T
    cases = [(1e-2, 3), (1e-6, 4)] + ([] if method == "greville" else [(1e-12, 5)])
    for rtol, kept in cases:
        P = np.asarray(pinv_batch(jnp.asarray(np.stack([A, A, A])), jnp.asarray(rtol), method))[0]
        reference = np.linalg.pinv(A, rtol=rtol)
        assert np.linalg.matrix_rank(P) == kept
        cond = 1 / s[kept - 1]
        tol = 100 * EPS * (cond**2 if method == "greville" else cond) * np.abs(reference).max()
        if method != "svd":
            tol += 10 * s[kept] / s[kept - 1] ** 2
        assert_tree_allclose(P, reference, rtol=0, atol=tol)


# --------------------------------------------------------------------- transformations and derivatives


@pytest.mark.parametrize("method", PINV_METHODS)
def test_plain_jit_vmap_agree(method):
    """Same algorithm, three ways: plain call (default rtol), jit, and jit(vmap) over a batch.

    (Eager vmap is left out: it compiles every loop of the method separately, seconds per method.)
    """
    As = batch_of(*SMALL, 1)
    rtol = default_rtol(SMALL, jnp.float64)
    plain = pinv(As[1], method)
    batched = np.asarray(pinv_batch(As, rtol, method))
    # only XLA's fusion differs between these (reassociated sums): a few ulps, times cond(A) ≤ 4.
    for i, A in enumerate(np.asarray(As)):
        assert_tree_allclose(batched[i], pinv_small(jnp.asarray(A), rtol, method), rtol=1e-13, atol=1e-13)
    assert_tree_allclose(plain, batched[1], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("method", PINV_METHODS)
@pytest.mark.parametrize("rank", [2, 1], ids=["full_rank", "rank_deficient"])
def test_derivatives_match_finite_differences(method, rank):
    """jvp and grad at full-rank and rank-deficient A, along a curve A(t) of constant rank, vs central FD.

    FD step 1e-6: truncation ~1e-12·|d³A⁺/dt³| plus round-off ~eps·|A⁺|/1e-6 ≈ 1e-10; seen ≤ 5e-10 absolute on
    derivatives of size ~1, hence 1e-7 relative to the largest entry.
    """
    m, n = SMALL
    curve = rank_preserving_curve(m, n, rank, seed=3 + rank)
    A, dA = jax.jvp(curve, (0.0,), (1.0,))
    rtol = jnp.asarray(default_rtol(SMALL, jnp.float64))
    fd = central_difference(lambda t: pinv_small(curve(t), rtol, method), 0.0, 1.0)
    W = random_normal(jax.random.PRNGKey(7), (n, m))
    _, jvp, grad = pinv_derivatives(A, dA, W, rtol, method)
    assert np.all(np.isfinite(jvp))
    assert_tree_allclose(jvp, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(jnp.sum(grad * dA), jnp.sum(W * fd), rtol=1e-7)


@pytest.mark.parametrize("method", PINV_METHODS)
def test_derivative_finite_at_zero_and_repeated_singular_values(method):
    """At A = 0 the derivative is 0; at A = [I 0] (all singular values equal) it is finite and matches finite
    differences, where differentiating V Σ⁻¹ Uᵀ through jnp.linalg.svd gives NaN (next test)."""
    m, n = SMALL
    rtol = jnp.asarray(default_rtol(SMALL, jnp.float64))
    dA = random_normal(jax.random.PRNGKey(8), (m, n))
    assert np.all(pinv_jvp(jnp.zeros((m, n)), dA, rtol, method) == 0)
    A = jnp.eye(m, n)
    fd = central_difference(lambda X: pinv_small(X, rtol, method), A, dA)
    assert_tree_allclose(pinv_jvp(A, dA, rtol, method), fd, rtol=0, atol=1e-7)


def test_naive_svd_derivative_is_nan_where_ours_is_not():
    """Autodiff through the SVD factors is NaN at repeated singular values; ours matches finite differences,
    and so does jnp.linalg.pinv, which in jax 0.10 has the same Golub-Pereyra custom JVP (an independent
    implementation of it: the two agree to round-off)."""

    def naive(A):
        u, s, vt = jnp.linalg.svd(A, full_matrices=False)
        return (vt.T / s) @ u.T

    A = jnp.eye(*SMALL)
    dA = random_normal(jax.random.PRNGKey(9), SMALL)
    fd = central_difference(naive, A, dA)
    assert np.any(np.isnan(jax.jvp(naive, (A,), (dA,))[1]))
    ours = jax.jvp(pinv, (A,), (dA,))[1]
    assert_tree_allclose(ours, fd, rtol=0, atol=1e-7)  # FD error as in the test above
    assert_tree_allclose(ours, jax.jvp(jnp.linalg.pinv, (A,), (dA,))[1], rtol=1e-12, atol=1e-12)
    # at a rank-deficient A (rank 1 of 2), along a curve of constant rank, the same holds
    curve = rank_preserving_curve(*SMALL, 1, seed=10)
    A, dA = jax.jvp(curve, (0.0,), (1.0,))
    fd = central_difference(lambda t: pinv(curve(t)), 0.0, 1.0)
    assert_tree_allclose(jax.jvp(pinv, (A,), (dA,))[1], fd, rtol=0, atol=1e-7 * np.abs(fd).max())


# ---------------------------------------------------------------------------- dtypes, bad input, NaN


@pytest.mark.parametrize("method", PINV_METHODS)
def test_float32(method):
    """float32 in, float32 out; errors relative to float64 NumPy ≲ 10 n eps32 cond ≈ 1e-5 (seen ≤ 2e-6);
    Greville's cond² growth (see above) reached 9e-4 over 256 matrices of this kind, hence 1e-2 for it."""
    As = batch_of(12, 12, 11, dtype=jnp.float32)
    P = pinv_batch(As, jnp.asarray(default_rtol((12, 12), jnp.float32), jnp.float32), method)
    assert P.dtype == jnp.float32
    for A, Pi in zip(As, P, strict=True):
        reference = np.linalg.pinv(np.asarray(A, np.float64), rtol=default_rtol((12, 12), jnp.float32))
        tol = 1e-2 if method == "greville" else 1e-4
        assert_tree_allclose(Pi, reference, rtol=0, atol=tol * max(np.abs(reference).max(), 1.0))


@pytest.mark.parametrize("method", PINV_METHODS)
def test_non_finite_input_gives_all_nan(method):
    """NaN or inf anywhere in A: every entry of A⁺ is NaN, no exception (under jit and vmap alike)."""
    rtol = jnp.asarray(default_rtol(SMALL, jnp.float64))
    A = batch_of(*SMALL, 1)[0]
    for bad in (jnp.nan, jnp.inf):
        assert np.all(np.isnan(pinv_small(A.at[0, 1].set(bad), rtol, method)))
    As = jnp.stack([A, A.at[1, 2].set(jnp.nan), A])
    P = pinv_batch(As, rtol, method)
    assert np.all(np.isnan(P[1])) and np.all(np.isfinite(P[0])) and np.all(np.isfinite(P[2]))


def test_bad_input_raises():
    for bad in (jnp.ones(3), jnp.ones((2, 3, 4))):
        with pytest.raises(ValueError, match=str(bad.shape).replace("(", r"\(").replace(")", r"\)")):
            pinv(bad)
    with pytest.raises(ValueError, match="unknown pinv method 'lu'"):
        pinv(jnp.ones((2, 2)), "lu")
    for fn in (cholesky, psd_pinv, psd_ginv):
        with pytest.raises(ValueError, match=r"\(2, 3\)"):
            fn(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        cho_solve(jnp.eye(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        matrix_rank(jnp.ones(3))


def test_empty_matrices():
    """No constraints (m = 0) or no coordinates: A⁺ is the empty n x m matrix, as in NumPy."""
    for method in PINV_METHODS:
        for shape in ((0, 3), (3, 0)):
            assert pinv(jnp.zeros(shape), method).shape == np.linalg.pinv(np.zeros(shape)).shape
    empty = jnp.zeros((0, 0))
    assert psd_ginv(empty).shape == psd_pinv(empty).shape == cholesky(empty).shape == (0, 0)
    assert cho_solve(jnp.zeros((0, 0)), jnp.zeros((0, 2))).shape == (0, 2)
    assert int(matrix_rank(jnp.zeros((0, 3)))) == 0


def test_matrix_rank_matches_numpy():
    for m, n, r in SHAPES + SLOW_SHAPES:
        A = jnp.asarray(np.asarray(batch_of(m, n, r))[1])
        assert int(matrix_rank(A)) == np.linalg.matrix_rank(np.asarray(A)) == r
    assert int(matrix_rank(jnp.diag(jnp.array([1.0, 1e-3, 1e-9])), rtol=1e-6)) == 2


# ------------------------------------------------------------------------- SPD / PSD kernels


@jax.jit
def psd_pinv_batch(Gs, rtol):
    return jax.vmap(lambda G: psd_pinv(G, rtol))(Gs)


def value_jvp_grad(f, W=None):
    """One compiled program t ↦ (f(t), df/dt by jvp, d/dt sum(W f(t)) by grad; 0 without W): the value
    (for finite differences), forward and reverse mode."""

    @jax.jit
    def program(t):
        value, tangent = jax.jvp(f, (t,), (jnp.ones_like(t),))
        grad = 0.0 if W is None else jax.grad(lambda s: jnp.sum(W * f(s)))(t)
        return value, tangent, grad

    return program


def psd_batch(n, r, seed=0):
    """[full rank, rank r, zero] PSD matrices G = B Bᵀ, eigenvalues in [0.25, 4]."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed + n))
    full, deficient = np.asarray(random_matrix(k1, n, n)), np.asarray(random_matrix(k2, n, r))
    return jnp.asarray(np.stack([full @ full.T, deficient @ deficient.T, np.zeros((n, n))]))


@pytest.mark.parametrize("n, r", [(1, 0), (5, 2), (12, 11)])  # n ≤ 8: unrolled Cholesky of FᵀF
def test_psd_pinv_matches_numpy(n, r):
    """Pivoted-Cholesky G⁺ vs NumPy's SVD pinv with the same tolerance: cond(G) ≤ 16, G⁺ error ~ eps·cond(G)
    (seen ≤ 6e-15 over 200 matrices), so 1e-10 relative; the plain call agrees with vmap/jit to 1e-13."""
    Gs = psd_batch(n, r)
    rtol = default_rtol((n, n), jnp.float64)
    P = np.asarray(psd_pinv_batch(Gs, jnp.asarray(rtol)))
    for G, Pi in zip(np.asarray(Gs), P, strict=True):
        reference = np.linalg.pinv(G, rtol=rtol)
        assert_tree_allclose(Pi, reference, rtol=0, atol=1e-10 * max(np.abs(reference).max(), 1.0))
        assert_tree_allclose(Pi, Pi.T, rtol=0, atol=1e-14 * max(np.abs(reference).max(), 1.0))
    assert_tree_allclose(psd_pinv(Gs[1]), P[1], rtol=1e-13, atol=1e-13)


def test_psd_pinv_ties_and_pivot_order():
    """Equal diagonal entries (the pivot search must take exactly one of them per step) and pivots that are
    not in row order: closed forms (2I)⁺ = I/2, (11ᵀ)⁺ = 11ᵀ/25, diag(0, 3, 3, 0, 1)⁺ = diag(0, ⅓, ⅓, 0, 1),
    to 1e-14 (a few roundings of O(1) numbers). Same shape as the (5, 2) case above: no new compilation."""
    d = jnp.array([0.0, 3.0, 3.0, 0.0, 1.0])
    Gs = jnp.stack([2 * jnp.eye(5), jnp.ones((5, 5)), jnp.diag(d)])
    expected = np.stack([np.eye(5) / 2, np.ones((5, 5)) / 25, np.diag([0, 1 / 3, 1 / 3, 0, 1])])
    P = psd_pinv_batch(Gs, jnp.asarray(default_rtol((5, 5), jnp.float64)))
    assert_tree_allclose(P, expected, rtol=0, atol=1e-14)


@jax.jit
def psd_ginv_batch(Gs, rtol):
    return jax.vmap(lambda G: psd_ginv(G, rtol))(Gs)


@pytest.mark.parametrize("n, r", [(1, 0), (5, 2), (12, 11)])  # n = 12: the fori_loop path
def test_psd_ginv_is_a_reflexive_inverse_that_gives_the_uk_acceleration(n, r):
    """LDLᵀ generalized inverse: Penrose conditions 1 and 2 and symmetry (G G⁻ G = G, G⁻ G G⁻ = G⁻, to 1e-12
    relative: cond(G) ≤ 16), G⁻ = G⁻¹ at full rank (vs NumPy, 1e-10), and what the UK equation needs: for
    G = B Bᵀ and r ∈ range(G), Bᵀ G⁻ r = Bᵀ G⁺ r (NumPy's pinv), to 1e-10 relative."""
    Gs = psd_batch(n, r)
    X = psd_ginv_batch(Gs, jnp.asarray(default_rtol((n, n), jnp.float64)))
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed := n))
    Bs = [random_matrix(k1, n, n), random_matrix(k2, n, r), jnp.zeros((n, n))]
    for G, Xi, B in zip(np.asarray(Gs), np.asarray(X), Bs, strict=True):
        scale = max(np.abs(G).max(), 1.0) * max(np.abs(Xi).max(), 1.0)
        np.testing.assert_allclose(G @ Xi @ G, G, rtol=0, atol=1e-12 * scale * max(np.abs(G).max(), 1.0))
        np.testing.assert_allclose(Xi @ G @ Xi, Xi, rtol=0, atol=1e-12 * scale * max(np.abs(Xi).max(), 1.0))
        np.testing.assert_allclose(Xi, Xi.T, rtol=0, atol=1e-14 * scale)
        y = G @ np.random.default_rng(seed).normal(size=n)
        reference = np.asarray(B).T @ np.linalg.pinv(G, rtol=default_rtol((n, n), jnp.float64)) @ y
        np.testing.assert_allclose(np.asarray(B).T @ Xi @ y, reference, rtol=0,
                                   atol=1e-10 * max(np.abs(reference).max(initial=0.0), 1.0))
    if r == 0 or n > 1:
        np.testing.assert_allclose(X[0], np.linalg.inv(np.asarray(Gs[0])), rtol=0,
                                   atol=1e-10 * np.abs(np.linalg.inv(np.asarray(Gs[0]))).max())


def test_psd_ginv_unrolled_and_loop_agree(monkeypatch):
    """The unrolled (m ≤ 8) and fori_loop factorizations are the same algorithm: 1e-13 on a rank-2 5 x 5 G
    (the shape of the closed forms below, whose unrolled program this one compiles)."""
    G = psd_batch(5, 2)[1]
    unrolled = psd_ginv(G)
    monkeypatch.setattr(linalg, "_UNROLL_MAX", 0)
    assert_tree_allclose(psd_ginv(G), unrolled, rtol=1e-13, atol=1e-13)


def test_psd_ginv_closed_forms_derivative_and_bad_input():
    """diag(0, 3, 3, 0, 1)⁻ = diag(0, ⅓, ⅓, 0, 1) and the zero matrix (1e-15: a few roundings); 11ᵀ (rank
    1: of equal diagonal entries the first is the pivot) satisfies G G⁻ G = G. Derivative along a
    constant-rank curve vs central differences (1e-7, h = 1e-4 in units where G ~ 1). NaN in G or a traced
    NaN rtol: all NaN."""
    d = jnp.array([0.0, 3.0, 3.0, 0.0, 1.0])
    assert_tree_allclose(psd_ginv(jnp.diag(d)), np.diag([0, 1 / 3, 1 / 3, 0, 1]), rtol=0, atol=1e-15)
    assert_tree_allclose(psd_ginv(jnp.zeros((3, 3))), np.zeros((3, 3)), rtol=0, atol=0)
    ones = jnp.ones((5, 5))
    assert_tree_allclose(ones @ psd_ginv(ones) @ ones, ones, rtol=0, atol=1e-14)
    B = random_normal(jax.random.PRNGKey(11), (5, 2))
    dB = random_normal(jax.random.PRNGKey(12), (5, 2))
    program = value_jvp_grad(lambda t: psd_ginv((B + t * dB) @ (B + t * dB).T))
    fd = central_difference(lambda t: program(t)[0], 0.0, 1.0)
    jvp = program(0.0)[1]
    assert_tree_allclose(jvp, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    assert np.all(np.isnan(psd_ginv(jnp.eye(3).at[0, 0].set(jnp.nan))))
    assert np.all(np.isnan(jax.jit(lambda r: psd_ginv(jnp.eye(3), r))(jnp.nan)))
    with pytest.raises(ValueError, match="rtol"):
        psd_ginv(jnp.eye(3), -1.0)


def tiny_pivot_before_redundant_row(delta, m):
    """G = B Bᵀ for B = [[1, 0], [1, δ], [0, 1]] (rank 2: row 3 = (row 2 - row 1)/δ), in the top-left corner
    of diag(G, I) for m > 3. Without pivoting the second pivot is δ² (kept) and the third, 0 in exact
    arithmetic, comes out as the round-off of G's second row (~eps) times multipliers ~1/δ²: ~eps/δ²."""
    B = np.array([[1.0, 0.0], [1.0, delta], [0.0, 1.0]])
    G = np.eye(m)
    G[:3, :3] = B @ B.T
    return G


@pytest.mark.parametrize("m", [3, 12])  # unrolled and fori_loop paths
def test_psd_ginv_pivoting_drops_the_redundant_direction(m):
    """At δ = 1e-6 the unpivoted LDLᵀ kept a third pivot of 9e-5 (a round-off direction, far above the cut
    m eps max G_ii), so G⁻ had entries ~1e16 and G G⁻ G missed G by 1.0 (the five-bar linkage near its flat
    configuration, tests/test_default_method.py). Pivoted (largest remaining diagonal first), every multiplier
    is ≤ 1: G G⁻ G = G, G⁻ G G⁻ = G⁻ and G G⁻ y = y for y ∈ range(G) to 1e-12 (cond of the kept part ~1
    here, entries of G ≤ 2), and the rank of G G⁻ is NumPy's rank of G."""
    G = tiny_pivot_before_redundant_row(1e-6, m)
    X = np.asarray(psd_ginv(jnp.asarray(G)))
    np.testing.assert_allclose(G @ X @ G, G, rtol=0, atol=1e-12)
    np.testing.assert_allclose(X @ G @ X, X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(X, X.T, rtol=0, atol=1e-14)
    assert np.abs(X).max() < 10
    y = G @ np.linspace(-1.0, 2.0, m)  # in range(G): G G⁻ y = y, as for G⁺
    np.testing.assert_allclose(G @ X @ y, y, rtol=0, atol=1e-12 * np.abs(y).max())
    assert np.linalg.matrix_rank(G @ X) == np.linalg.matrix_rank(G)


def test_psd_ginv_derivative_at_rank_deficient_loop_path():
    """The fori_loop path (m = 12 > 8) at a rank-11 G = B Bᵀ, along B(t) = B + t dB (rank 11 for all t):
    forward mode through jit against central differences (h = 1e-6 in units where G ~ 1: error ~1e-9), and
    reverse mode of a scalar loss against the same directional derivative."""
    B = random_matrix(jax.random.PRNGKey(21), 12, 11)
    dB = random_matrix(jax.random.PRNGKey(22), 12, 11)
    W = random_matrix(jax.random.PRNGKey(23), 12, 12)
    program = value_jvp_grad(lambda t: psd_ginv((B + t * dB) @ (B + t * dB).T), W)
    fd = central_difference(lambda t: program(t)[0], 0.0, 1.0)
    _, jvp, grad = program(0.0)
    assert np.all(np.isfinite(jvp))
    assert_tree_allclose(jvp, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    assert abs(float(grad) - float(jnp.sum(W * fd))) < 1e-7 * float(jnp.sum(jnp.abs(W * fd)))


def test_psd_pinv_derivative_and_non_finite():
    """Rank-deficient G = B Bᵀ moved along B + t dB (rank kept): jvp and grad vs central FD (as for pinv)."""
    B = random_normal(jax.random.PRNGKey(11), (5, 2))
    dB = random_normal(jax.random.PRNGKey(12), (5, 2))
    W = random_normal(jax.random.PRNGKey(13), (5, 5))
    program = value_jvp_grad(lambda t: psd_pinv((B + t * dB) @ (B + t * dB).T), W)
    fd = central_difference(lambda t: program(t)[0], 0.0, 1.0)
    _, jvp, grad = program(0.0)
    assert_tree_allclose(jvp, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    np.testing.assert_allclose(grad, jnp.sum(W * fd), rtol=1e-7)
    # 5 x 5: the plain psd_pinv program of test_psd_pinv_matches_numpy[5-2]
    assert np.all(np.isnan(psd_pinv(jnp.eye(5).at[0, 0].set(jnp.nan))))


@pytest.mark.parametrize("n", [1, 5, 12])  # ≤ 8: unrolled scalar code, 12: LAPACK
def test_cholesky_and_cho_solve(n):
    """vs NumPy on SPD matrices of condition 100: L to 1e-13 (error ~ eps·‖M‖), X to 1e-11 (~ eps·cond);
    plain, jit, vmap; gradient of a solve vs FD along a symmetric direction (1e-7, FD error as above)."""
    keys = jax.random.split(jax.random.PRNGKey(20 + n), 3)
    Ms = jnp.stack([random_spd(k, n, cond=100.0) for k in keys])
    B = random_normal(jax.random.PRNGKey(30), (n, 2))

    solve = jax.jit(jax.vmap(lambda M: cho_solve(cholesky(M), B)))
    X = np.asarray(solve(Ms))
    for M, Xi in zip(np.asarray(Ms), X, strict=True):
        assert_tree_allclose(cholesky(M), np.linalg.cholesky(np.asarray(M)), rtol=0, atol=1e-13)
        assert_tree_allclose(Xi, np.linalg.solve(np.asarray(M), np.asarray(B)), rtol=0, atol=1e-11)
        assert_tree_allclose(cho_solve(cholesky(M), B[:, 0]), Xi[:, 0], rtol=1e-13, atol=1e-13)

    dM = random_normal(jax.random.PRNGKey(31), (n, n))
    dM = dM + dM.T
    loss_and_grad = jax.jit(jax.value_and_grad(lambda M: jnp.sum(cho_solve(cholesky(M), B) ** 2)))
    grad = loss_and_grad(Ms[0])[1]
    fd = central_difference(lambda M: loss_and_grad(M)[0], Ms[0], dM)
    np.testing.assert_allclose(jnp.sum(grad * dM), fd, rtol=1e-7)



def test_looped_factorizations_are_loops_on_the_cpu_only_and_give_the_same_values():
    """Under looped_factorizations the small factorizations (n ≤ 8) are the fori_loop code on the CPU and
    the unrolled code in a program lowered for a GPU (no while loop in the CUDA lowering); the same values
    as unrolled (NumPy reference: L to 1e-13, solves and the reflexive inverse to 1e-12 at condition ~10),
    their derivatives too. Without it, unrolled on every platform (no loop on the CPU)."""
    M = random_spd(jax.random.PRNGKey(40), 5, cond=10.0)
    B = random_normal(jax.random.PRNGKey(41), (5, 2))

    def everything(M, B):
        L = cholesky(M)
        return L, cho_solve(L, B), linalg.solve_lower(L, B), linalg.solve_lower_t(L, B), linalg.psd_ginv(M)

    loss = lambda M: sum(jnp.sum(x**2) for x in everything(M, B)[1:])  # noqa: E731
    results = {}
    for looped in (False, True):
        with linalg.looped_factorizations(looped):
            assert linalg.factorizations_looped() is looped
            program = jax.jit(lambda M, B: (everything(M, B), jax.grad(loss)(M)))
            cpu = program.lower(M, B).compile().as_text()
            assert (" while(" in cpu) is looped
            cuda = jax.export.export(program, platforms=["cuda"])(M, B).mlir_module()
            assert "stablehlo.while" not in cuda
            results[looped] = program(M, B)
    assert linalg.factorizations_looped() is False
    L, X, Y, Z, G = results[True][0]
    Mn, Bn = np.asarray(M), np.asarray(B)
    assert_tree_allclose(L, np.linalg.cholesky(Mn), rtol=0, atol=1e-13)
    for got, expected in ((X, np.linalg.solve(Mn, Bn)), (Y, np.linalg.solve(L, Bn)),
                          (Z, np.linalg.solve(np.asarray(L).T, Bn)), (G, np.linalg.inv(Mn))):  # fmt: skip
        assert_tree_allclose(got, expected, rtol=0, atol=1e-12)
    assert_tree_allclose(results[True], results[False], rtol=1e-12, atol=1e-12)

# (a shape, b shape): matrix-matrix, matrix-vector, vector-matrix, vector-vector, one dim above unroll size
MATMUL_SHAPES = [((4, 3), (3, 4)), ((3, 4), (4,)), ((4,), (4, 2)), ((3,), (3,)), ((9, 2), (2, 3))]


@pytest.mark.parametrize("a_shape, b_shape", MATMUL_SHAPES)
def test_small_matmul_matches_numpy(a_shape, b_shape):
    """vs NumPy's a @ b to 1e-14 (a few eps for sums of ≤ 4 products of O(1) numbers); plain, jit, vmap (under
    jit: op by op it compiles a program per batched primitive); gradient (jitted) vs FD (1e-8: the product is
    bilinear, so FD has only round-off error ~ eps/1e-6)."""
    ka, kb = jax.random.split(jax.random.PRNGKey(sum(a_shape) + 10 * len(b_shape)))
    a_np, b_np = (np.asarray(random_normal(k, (3, *shape))) for k, shape in ((ka, a_shape), (kb, b_shape)))
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    a0, a1, b0 = jnp.asarray(a_np[0]), a_np[1], jnp.asarray(b_np[0])
    expected = a_np[0] @ b_np[0]
    assert_tree_allclose(small_matmul(a0, b0), expected, rtol=1e-14, atol=1e-14)
    assert_tree_allclose(jax.jit(small_matmul)(a0, b0), expected, rtol=1e-14, atol=1e-14)
    batched = jax.jit(jax.vmap(small_matmul))(a, b)
    expected_batch = np.stack([ai @ bi for ai, bi in zip(a_np, b_np, strict=True)])
    assert_tree_allclose(batched, expected_batch, rtol=1e-14, atol=1e-14)
    loss_and_grad = jax.jit(jax.value_and_grad(lambda a: jnp.sum(jnp.sin(small_matmul(a, b0)))))
    fd = central_difference(lambda a: float(loss_and_grad(a)[0]), a_np[0], a1)
    np.testing.assert_allclose(np.sum(np.asarray(loss_and_grad(a0)[1]) * a1), fd, rtol=1e-8)
    with pytest.raises(ValueError, match="small_matmul"):
        small_matmul(a0, jnp.ones((a_shape[-1] + 1,)))


# ------------------------------------------------- issue 15: hangs, bad arguments, rank decisions, accuracy

HANG_CHILD = r"""
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from ukjax.linalg import pinv, psd_pinv, matrix_rank
from ukjax._checks import constraint_consistency, input_status, motion_is_unique, is_positive_semidefinite
A = jnp.eye(3).at[0, 1].set(jnp.inf)
out = {
    "pinv": pinv(A), "pinv_jit_vmap": jax.jit(jax.vmap(pinv))(jnp.stack([A, jnp.eye(3)]))[0],
    "psd_pinv": psd_pinv(A), "consistency": constraint_consistency(A, jnp.ones(3)),
    "consistency_vmap": jax.jit(jax.vmap(constraint_consistency))(jnp.stack([A, A]), jnp.ones((2, 3)))[0],
}
assert all(bool(jnp.all(jnp.isnan(v))) for v in out.values()), out
assert int(jax.jit(matrix_rank)(A)) == -1 and int(jax.jit(jax.vmap(matrix_rank))(jnp.stack([A, A]))[0]) == -1
try:
    matrix_rank(A)
    raise AssertionError("matrix_rank of a concrete non-finite A returned")
except ValueError as error:
    assert "NaN or inf" in str(error)
s = input_status(jnp.eye(3), jnp.ones(3), A, jnp.ones(3))
assert not bool(s.finite) and not bool(s.constraints_consistent) and bool(s.mass_positive_definite)
assert not bool(motion_is_unique(A, A)) and not bool(is_positive_semidefinite(A))
print("returned")
"""


def test_non_finite_input_returns_without_entering_lapack():
    """A 3 x 3 matrix holding one inf: LAPACK's SVD never returned on it (pinv, matrix_rank,
    constraint_consistency, also under jit(vmap)); now every function returns NaN (rank -1 under jit, a
    ValueError for a concrete A: there is no NaN rank; flags False). tests/test_nonfinite.py covers the
    dynamics and control functions.
    Run in a subprocess with a timeout, so that a regression fails instead of hanging the suite."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run([sys.executable, "-c", HANG_CHILD], capture_output=True, text=True, timeout=120,
                             cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    except subprocess.TimeoutExpired:
        pytest.fail("a linear-algebra function did not return on a matrix holding inf (LAPACK loop)")
    assert out.returncode == 0 and "returned" in out.stdout, out.stderr[-2000:]


def test_non_numeric_input_is_refused_naming_the_argument():
    """An array of strings reached JAX and failed with "Error interpreting argument to stage as a JAX value";
    now each function names itself and its argument (issue 39). Integers are promoted to float (also under
    strict dtype promotion), as jnp.linalg does."""
    words = np.array([["1", "2"], ["3", "4"]])
    cases = [(pinv, "pinv: A"), (lambda x: pinv(x, "householder"), "pinv: A"),
             (matrix_rank, "matrix_rank: A"), (psd_pinv, "psd_pinv: G"), (psd_ginv, "psd_ginv: G"),
             (cholesky, "cholesky: M")]
    for fn, named in cases:
        with pytest.raises(TypeError, match=named + r" must be a real floating-point matrix, got dtype <U1"):
            fn(words)
    ragged = r"pinv: A must be a real floating-point matrix, got a list that is not a rectangular array"
    with pytest.raises(TypeError, match=ragged):
        pinv([[1.0, 2.0], [3.0]])
    with pytest.raises(TypeError, match=r"pinv: A .* got dtype object \(ndarray\)"):
        pinv(np.array([[{}, 1.0]], dtype=object))
    # 2 x 3 (SMALL), full rank, cond 2.4, no zero entry in A⁺: the plain pinv programs of
    # test_plain_jit_vmap_agree serve it
    integers = jnp.array([[2, 1, 3], [1, 4, 2]], dtype=jnp.int32)
    for method in ("svd", "greville"):
        P = pinv(integers, method)
        assert P.dtype == jnp.result_type(float)
        np.testing.assert_allclose(P, np.linalg.pinv([[2.0, 1.0, 3.0], [1.0, 4.0, 2.0]]), rtol=1e-12)
    assert int(matrix_rank(np.array([[1, 2], [2, 4]]))) == 1


def test_complex_matrix_and_invalid_rtol_raise():
    """Complex A was silently cast to its real part (wrong by 6.5 relative); a negative or NaN rtol gave a
    wrong A⁺ (rtol = -1 keeps zero singular values as rank). Both now raise ValueError naming the argument;
    a traced invalid rtol, which cannot be checked on the host, gives an all-NaN result (rank -1)."""
    A = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match="real matrix"):
        pinv(A.astype(jnp.complex128) * (1 + 1j))
    with pytest.raises(ValueError, match="real matrix"):
        matrix_rank(A.astype(jnp.complex128))
    for bad in (-1.0, float("nan"), jnp.array([1e-3, 1e-3]), 1j):
        for fn in (lambda r: pinv(A, rtol=r), lambda r: pinv(A, "greville", rtol=r),
                   lambda r: psd_pinv(A @ A.T, rtol=r), lambda r: matrix_rank(A, rtol=r)):
            with pytest.raises(ValueError, match="rtol"):
                fn(bad)
    A_small = batch_of(*SMALL, 1)[0]  # traced rtol: the SMALL programs of the derivative tests serve it
    for method in ("svd", "householder"):
        for bad in (-1.0, jnp.nan):
            assert np.all(np.isnan(pinv_small(A_small, jnp.asarray(bad), method)))
    assert np.all(np.isnan(psd_pinv_batch(psd_batch(5, 2), jnp.asarray(-1.0))))  # the (5, 2) case's program
    assert int(jax.jit(matrix_rank)(A, jnp.asarray(jnp.nan))) == -1


def test_greville_pivoted_rows_near_duplicate():
    """Rows (1, 2), (1, 2 + 1e-12), (3, -1): cond(A) = 1.2, but the seed's top-to-bottom recursion goes
    through A_2 of cond 1e12 and was off by 7.8e-4 relative; in pivoted order it agrees with NumPy to
    round-off (1e-14 allows ~50 eps)."""
    A = jnp.array([[1.0, 2.0], [1.0, 2.0 + 1e-12], [3.0, -1.0]])
    reference = np.linalg.pinv(np.asarray(A))
    P = pinv(A, "greville")
    assert np.abs(np.asarray(P) - reference).max() <= 1e-14 * np.abs(reference).max()


def near_rank_one(delta_units):
    """3 x 12 matrix u 1ᵀ + δ w zᵀ with σ₂/σ₁ = delta_units · max(m, n) eps (below the SVD's cut for < 1).

    All twelve columns have about the same norm, so the first QR pivot is σ₁/√12 and the second pivot,
    relative to it, is √12/√2 ≈ 2.4 times σ₂/σ₁: above the SVD's cut although σ₂ is below it.
    """
    u = np.array([1.0, 2.0, 2.0]) / 3.0
    w = np.array([2.0, -1.0, 0.0]) / np.sqrt(5.0)
    z = np.zeros(12)
    z[0], z[1] = 1 / np.sqrt(2), -1 / np.sqrt(2)
    sigma1 = np.sqrt(12.0)
    delta = delta_units * 12 * EPS * sigma1
    return np.outer(u, np.ones(12)) + delta * np.outer(w, z)


@pytest.mark.parametrize("method", PINV_METHODS)
def test_default_rank_decision_matches_svd_near_the_cut(method):
    """σ₂/σ₁ = 0.9 max(m, n) eps: the SVD drops σ₂; at the SVD's tolerance the QR pivot of that direction
    (2.2 times larger) was kept, giving A⁺ with entries ~1e15. With each method's default tolerance
    (10 max(m, n) eps for the non-SVD methods) all agree with NumPy's rank-1 A⁺ to 1e-12 relative (the
    rank-1 matrices they invert differ by O(σ₂), A⁺ by O(σ₂/σ₁²) ~ 1e-15)."""
    A = jnp.asarray(near_rank_one(0.9))
    reference = np.linalg.pinv(np.asarray(A), rtol=default_rtol(A.shape, jnp.float64))
    assert np.linalg.matrix_rank(np.asarray(A)) == 1
    P = np.asarray(pinv(A, method))
    assert np.abs(P - reference).max() <= 1e-12 * np.abs(reference).max(), method
    if method in ("householder", "mgs", "varga"):  # the old default: the SVD's tolerance on QR pivots
        P_old = np.asarray(pinv(A, method, rtol=default_rtol(A.shape, jnp.float64)))
        assert np.abs(P_old).max() > 1e10 * np.abs(reference).max()


def test_batched_cholesky_does_not_deadlock():
    """jit(vmap) of four independent 12 x 12 Cholesky factorizations: with jnp.linalg.cholesky (jaxlib 0.10.2
    batched LAPACK) runs of 200 calls (batch 1024) hung in 3 of 6 tries on 2 cores (XLA:CPU pool threads
    all blocked in jax::ParallelBatchMap; see benchmarks/lapack_batch_deadlock.py). ukjax.linalg.cholesky,
    and the UK solve's gradient built on it, call no LAPACK kernel (read from the lowered programs, where
    jnp.linalg.cholesky's is found), and 40 calls at batch 1024 in a fresh process finish."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from conftest import xla_flags_without
    from lapack_batch_deadlock import run_once

    from ukjax.dynamics import uk_acceleration

    Ms = jnp.tile(4.0 * jnp.eye(12) + 0.1, (4, 8, 1, 1))
    factor = lambda chol: jax.jit(jax.vmap(lambda *ms: sum(jnp.sum(chol(m)) for m in ms))).lower(*Ms)
    assert linalg.lapack_calls(factor(jnp.linalg.cholesky))
    assert linalg.lapack_calls(factor(linalg.cholesky)) == set()
    Q, A, b = jnp.ones((8, 12)), jnp.ones((8, 6, 12)) * jnp.arange(12.0), jnp.ones((8, 6))
    loss = lambda M, Q, A, b: jnp.sum(uk_acceleration(M, Q, A, b))
    gradient = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)))).lower(Ms[0], Q, A, b)
    assert linalg.lapack_calls(gradient) == set()
    # in the configuration users run (JAX's default XLA flags), where the hangs were seen
    users = dict(os.environ, XLA_FLAGS=xla_flags_without())
    finished, seconds, tail = run_once("ukjax", iters=40, timeout=120.0, env=users)
    assert finished, f"ukjax.linalg.cholesky under jit(vmap) did not finish in {seconds:.0f} s: {tail}"


# No subnormals: XLA:CPU flushes them to zero in every arithmetic operation, this one included.
_SPECIAL = [0.0, 1.0, -2.5, 1e-30, 3e-7, 1e30, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_materialize_is_the_exact_identity_with_identity_derivative(dtype):
    """linalg.materialize (the fusion boundary of cho_solve and psd_ginv) returns x exactly (±inf; NaN stays
    NaN; -0 compares equal), plain, jit and vmap; its jvp and grad are the identity exactly, and, being
    linear, it runs on tangents inside a custom derivative rule that reverse mode transposes."""
    x = jnp.asarray(_SPECIAL, dtype)
    expected = np.asarray(x)
    for out in (linalg.materialize(x), jax.jit(linalg.materialize)(x), jax.vmap(linalg.materialize)(x)):
        assert out.dtype == x.dtype
        np.testing.assert_array_equal(out, expected)
    assert linalg.materialize(jnp.asarray(-0.0, dtype)) == 0
    y = jnp.asarray([0.3, -1.7], dtype)
    _, tangent = jax.jvp(linalg.materialize, (y,), (jnp.asarray([2.0, -5.0], dtype),))
    np.testing.assert_array_equal(tangent, [2.0, -5.0])
    np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(3 * linalg.materialize(v)))(y), [3.0, 3.0])

    # as in the derivative of ukjax.dynamics' eq. 35 form: a custom rule that solves with the tangent
    M = jnp.asarray([[4.0, 1.0], [1.0, 3.0]], dtype)

    @jax.custom_jvp
    def solve(b):
        return cho_solve(cholesky(M), b)

    @solve.defjvp
    def solve_jvp(primals, tangents):
        (b,), (db,) = primals, tangents
        return solve(b), cho_solve(cholesky(M), db)

    grad = jax.jit(jax.vmap(jax.grad(lambda b: jnp.sum(solve(b)))))(jnp.stack([y, 2 * y]))
    np.testing.assert_allclose(grad[0], np.linalg.solve(np.asarray(M), np.ones(2)), rtol=1e-6)


def test_materialize_stops_xla_recomputing_a_shared_value():
    """The reason materialize exists: XLA:CPU fuses a shared cheap producer into every consumer kernel, so
    cos(x) read by 16 stacked entries is computed 16 times under vmap; behind materialize, once. Counts
    ``cosine`` instructions in the optimized program (a structural check, no timing). If a jaxlib release
    stops duplicating, the first assertion fails: materialize may then be dropped. (CPU only: elsewhere
    materialize is the identity.)"""

    def entries(x, boundary):
        c = jnp.cos(x[1])
        c = linalg.materialize(c) if boundary else c
        return jnp.stack([c * (i + 1) + x[i % 4] for i in range(16)])

    x = jnp.ones((8, 4))

    def count(boundary):
        program = jax.jit(jax.vmap(lambda v: entries(v, boundary))).lower(x).compile()
        return program.as_text().count(" cosine(")

    if jax.default_backend() == "cpu":
        assert count(False) > 1
        assert count(True) == 1
    else:  # materialize is the plain identity there
        assert count(True) == count(False)
