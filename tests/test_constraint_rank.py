"""Redundant constraints with a declared rank: ``dynamics.compress_rows`` and ``System.constraint_rank``.

References share no code with the compression: NumPy's SVD, pseudo-inverse and least squares, and the UK
equation's reference form (``method="svd"``: B⁺ of B = A M^{-1/2} by SVD, seed 000 eq. 13) on the full,
uncompressed rows.

Compile budget: ``compress_rows`` unrolls a Python loop over rows of shrinking slices, so called op by op it
compiles a program per primitive, shape and step; every check of the compression itself runs jitted (one
program per shape and rank; the plain call is the dense model's in
``test_declared_rank_plain_jit_vmap_grad``).
"""

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference, random_matrix, random_normal

import ukjax
from ukjax import dynamics
from ukjax.models import chain
from ukjax.simulation import RESULTS

# (m, n, rank of A, declared rank): more rows than coordinates, fewer, and a bound above the true rank;
# "leading" zeroes A's first column and copies its third into the second, so that reflections on the
# leading columns without pivoting would keep only one direction of range(Aᵀ)
CASES = [(7, 5, 2, 2, ""), (9, 4, 1, 1, ""), (3, 6, 2, 2, ""), (8, 6, 2, 3, ""), (7, 5, 2, 2, "leading")]
compress = jax.jit(dynamics.compress_rows, static_argnums=2)


@pytest.mark.parametrize(("m", "n", "rank", "declared", "shape"), CASES)
def test_compress_rows_keeps_the_row_space_and_the_solutions(m, n, rank, declared, shape):
    key = jax.random.PRNGKey(m * 100 + n)
    A = np.array(random_matrix(key, m, n, rank=rank))
    if shape == "leading":
        A[:, 0], A[:, 1] = 0.0, A[:, 2]
    x0 = np.asarray(random_normal(jax.random.PRNGKey(1), (n,), A.dtype))
    A, b = jnp.asarray(A), jnp.asarray(A @ x0)  # consistent
    A_r, b_r = compress(A, b, declared)
    assert A_r.shape == (min(m, n, declared), n) and b_r.shape == (min(m, n, declared),)
    A_np, A_r_np = np.asarray(A), np.asarray(A_r)
    # rows of A_r lie in range(Aᵀ) and span it: the same nonzero singular values (H is orthogonal)
    np.testing.assert_allclose(A_r_np @ (np.eye(n) - np.linalg.pinv(A_np) @ A_np), 0.0, atol=1e-12)
    s, s_r = np.linalg.svd(A_np, compute_uv=False), np.linalg.svd(A_r_np, compute_uv=False)
    np.testing.assert_allclose(s_r[:rank], s[:rank], rtol=1e-12)
    np.testing.assert_allclose(s_r[rank:], 0.0, atol=1e-12)
    np.testing.assert_allclose(A_r_np @ np.asarray(x0), np.asarray(b_r), atol=1e-12)
    # inconsistent b: the same least-squares solutions (minimum-norm one compared)
    b_bad = random_normal(jax.random.PRNGKey(2), (m,), A.dtype)
    A_r, b_r = compress(A, b_bad, declared)
    expected = np.linalg.lstsq(A_np, np.asarray(b_bad), rcond=None)[0]
    np.testing.assert_allclose(np.linalg.pinv(np.asarray(A_r)) @ np.asarray(b_r), expected, atol=1e-11)


def test_compress_rows_without_a_rank_keeps_m_le_n_and_compresses_m_gt_n():
    A = random_matrix(jax.random.PRNGKey(3), 4, 6)
    b = jnp.arange(4.0)
    assert dynamics.compress_rows(A, b) == (A, b)
    tall = random_matrix(jax.random.PRNGKey(4), 9, 4, rank=3)
    A_r, b_r = compress(tall, jnp.asarray(np.asarray(tall) @ np.ones(4)), None)
    assert A_r.shape == (4, 4)
    np.testing.assert_allclose(np.linalg.svd(np.asarray(A_r), compute_uv=False),
                               np.linalg.svd(np.asarray(tall), compute_uv=False), atol=1e-12)


def test_compress_rows_too_small_a_rank_drops_constraints():
    """A bound below rank(A) loses rows: the kept system no longer implies A x = b (what simulate reports as
    inconsistent_constraints)."""
    A = random_matrix(jax.random.PRNGKey(5), 6, 5, rank=3)
    x0 = np.ones(5)
    A_r, b_r = compress(A, jnp.asarray(np.asarray(A) @ x0), 2)
    x = np.linalg.pinv(np.asarray(A_r)) @ np.asarray(b_r)  # satisfies the 2 kept rows
    assert float(np.linalg.norm(np.asarray(A) @ (x - x0))) > 1e-3


def test_compress_rows_is_differentiable():
    """d/dε of the compressed rows' minimum-norm solution against central differences (the pivots stay put
    for a small step)."""
    A0 = random_matrix(jax.random.PRNGKey(6), 7, 5, rank=2)
    dA = random_matrix(jax.random.PRNGKey(7), 7, 5, rank=2)
    x0 = jnp.linspace(-1.0, 1.0, 5)

    def f(eps):
        A = A0 + eps * dA
        A_r, b_r = dynamics.compress_rows(A, A @ x0, 2)
        return jnp.linalg.pinv(A_r) @ b_r

    # f, its forward- and its reverse-mode derivative as ONE compiled program (three were compiled before;
    # the ε = ±h calls for the finite difference reuse it and ignore its derivatives)
    program = jax.jit(lambda eps: (f(eps), jax.jacfwd(f)(eps), jax.jacrev(f)(eps)))
    _, derivative, reverse = program(0.0)
    h = 1e-6
    fd = (program(h)[0] - program(-h)[0]) / (2 * h)
    np.testing.assert_allclose(derivative, fd, atol=1e-8)  # truncation h² ~ 1e-12, round-off eps/h ~ 1e-10
    np.testing.assert_allclose(reverse, derivative, atol=1e-12)


# ------------------------------------------------------------------------- System.constraint_rank
LINKS, COPIES = 5, 4  # m = 8 > n = 5 rows of rank 2


@pytest.fixture(scope="module")
def state():
    p = chain.default_params(LINKS)
    q0s, qd0s = chain.scenarios(p, 3, speed=0.8, seed=5)
    q = q0s + jnp.asarray(np.random.default_rng(5).normal(size=q0s.shape)) * 0.2  # off the constraint too
    return p, q, qd0s


@pytest.fixture(scope="module")
def reference_motion(state):
    """The SVD reference form on all 8 rows at the three states: compiled once for the four cases below."""
    p, qs, qds = state
    reference = chain.system(LINKS, copies=COPIES)
    return jax.jit(jax.vmap(lambda q_, qd_: reference.motion(q_, qd_, 0.0, p, method="svd")))(qs, qds)


# the dense model with the default form and the SVD reference form, the tree with both Cholesky forms
@pytest.mark.parametrize(
    ("model", "method"),
    [(chain.system, "ldl"), (chain.system, "svd"), (chain.multibody_system, "ldl"),
     (chain.multibody_system, "cholesky")],
)
def test_declared_rank_gives_the_motion_of_the_full_rows(state, reference_motion, model, method):
    """q̈ and the constraint force with the 8 rows compressed to 2 against the SVD reference form on all 8
    rows; ~1e-12 relative agreement is expected (cond(A) ~ 10), 1e-9 on q̈ ~ 10-100 leaves a wide margin."""
    p, qs, qds = state
    declared = model(LINKS, copies=COPIES, constraint_rank=2)
    ours = jax.jit(jax.vmap(lambda q_, qd_: declared.motion(q_, qd_, 0.0, p, method=method)))(qs, qds)
    ref = reference_motion
    np.testing.assert_allclose(ours.qdd, ref.qdd, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ours.constraint_force.total, ref.constraint_force.total, rtol=1e-9, atol=1e-9)
    assert ours.A.shape == (3, 2 * COPIES, LINKS)  # the Motion reports the full rows
    np.testing.assert_allclose(jnp.einsum("kij,kj->ki", ours.A, ours.qdd), ours.b, atol=1e-9)


def test_declared_rank_plain_jit_vmap_grad(state):
    """The dense model (op-by-op evaluation of the tree's scans is slow; the compression is the same code)."""
    p, qs, qds = state
    system = chain.system(LINKS, copies=COPIES, constraint_rank=2)
    q, qd = qs[0], qds[0]
    plain = system.acceleration(q, qd, 0.0, p)
    jitted = jax.jit(lambda q_, qd_: system.acceleration(q_, qd_, 0.0, p))(q, qd)
    batched = jax.jit(jax.vmap(lambda q_, qd_: system.acceleration(q_, qd_, 0.0, p)))(qs, qds)
    np.testing.assert_allclose(jitted, plain, atol=1e-12)
    np.testing.assert_allclose(batched[0], plain, atol=1e-12)

    def loss(length):
        return jnp.sum(system.acceleration(q, qd, 0.0, {**p, "length": length}) ** 2)

    # the loss and its gradient as one compiled program (the finite differences read its value)
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    grad = value_and_grad(p["length"])[1]
    value = lambda length: value_and_grad(length)[0]
    fd = np.stack([central_difference(value, p["length"], e) for e in np.eye(LINKS)])
    # a loss of O(1e4): truncation h² ~ 1e-12 relative, round-off eps ‖loss‖/h ~ 1e-6 absolute
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_too_small_a_declared_rank_is_reported_by_simulate(state):
    p, _, _ = state
    q0s, qd0s = chain.scenarios(p, 1, speed=0.8, seed=5)
    kw = dict(t1=0.02, dt0=5e-3, saveat=diffrax.SaveAt(t1=True), throw=False)
    good = ukjax.simulate(chain.system(LINKS, copies=COPIES, constraint_rank=2), q0s[0], qd0s[0], p, **kw)
    bad = ukjax.simulate(chain.system(LINKS, copies=COPIES, constraint_rank=1), q0s[0], qd0s[0], p, **kw)
    assert int(good.status) == RESULTS.success
    assert int(bad.status) == RESULTS.inconsistent_constraints


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_constraint_rank_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="constraint_rank must be a positive int"):
        dataclasses.replace(chain.system(2), constraint_rank=bad)
