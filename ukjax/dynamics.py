"""The Udwadia-Kalaba (UK) equation family: constrained accelerations and constraint forces.

Notation, used by all of ukjax
------------------------------
n generalized coordinates q; M(q, t) the n x n symmetric mass matrix; Q(q, q̇, t) the given (applied)
generalized force; the m constraints in second-order form A(q, q̇, t) q̈ = b(q, q̇, t); c(q, q̇, t) the
non-ideal constraint vector: the constraint force Q^c does the work vᵀQ^c = vᵀc on every virtual
displacement v (A v = 0), the extended D'Alembert principle of Liu et al. (2015, seed 000 eq. 8).
Derived names: a = M⁻¹Q the unconstrained acceleration, G = A M⁻¹Aᵀ, B = A M^{-1/2}, and λ the Lagrange
multipliers with Q^c_id = Aᵀλ.

==================  =================  ===================  ===================  ==================
ukjax               Liu et al. 2015    de Falco et al.      Orsino               Xu & Liu 2017
                    (seed 000)         (seed 004)           (seed 003)           (seed 001)
==================  =================  ===================  ===================  ==================
M, q̈                M, q̈               M, q̈                 M, α                 M, q̈
Q                   Q                  F                    f                    Q
A, b                Â, b̂ (eq. 5)       Ψ_q, γ               A_r, b_r             A, b
c                   c (eq. 12)         C (eq. 43)           --                   --
a = M⁻¹Q            M⁻¹Q               q̈_f (eq. 25)         α_0                  M⁻¹Q
B = A M^{-1/2}      B̂                  D (eq. 28b)          H_r                  --
G = A M⁻¹Aᵀ         --                 Q (eq. 34)           A_r M⁻¹A_r*          A M⁻¹Aᵀ
λ, Q^c_id = Aᵀλ     --                 -λ (eq. 23)          λ_r (eq. 4.1)        λ (eq. 10)
==================  =================  ===================  ===================  ==================

The equation (seed 000 eq. 11-13)::

    M q̈ = Q + Q^c_id + Q^c_nid,
    Q^c_id  = M^{1/2} B⁺ (b - A M⁻¹Q),          (ideal: vᵀQ^c_id = 0 for A v = 0)
    Q^c_nid = M^{1/2} (I - B⁺B) M^{-1/2} c.      (non-ideal: vᵀQ^c_nid = vᵀc for A v = 0)

q̈ is the unique minimizer of Gauss's function (q̈ - a)ᵀM(q̈ - a) - 2 cᵀq̈ subject to A q̈ = b, for every A
(rank deficient too) when b is consistent (A A⁺ b = b); otherwise the least-squares acceleration in the
M-metric.

Forms provided, all pure functions of arrays, differentiable, ``jit``/``vmap``-able:

* :func:`uk_acceleration_eq35` (the default of :func:`uk_acceleration`): Cholesky of M and the Moore-Penrose
  inverse of the m x m matrix G (seed 004 eq. 35). Since B⁺ = Bᵀ(BBᵀ)⁺ for every B, and BBᵀ = G,
  M^{-1/2}B⁺ = M⁻¹Aᵀ(AM⁻¹Aᵀ)⁺ (accelerations) and M^{1/2}B⁺ = Aᵀ(AM⁻¹Aᵀ)⁺ (forces) for positive-definite
  M, so it equals the reference form.
* the reference form (``method`` one of :data:`ukjax.linalg.PINV_METHODS`): M^{±1/2} by a symmetric
  eigendecomposition and B⁺ by the chosen generalized-inverse algorithm (seed 000 eq. 13, seed 004 eq. 31),
  as in the algorithm comparison of de Falco et al.
* :func:`kkt_acceleration`: the Lagrange-multiplier (augmented, KKT) system, solved by least squares.
* :func:`singular_mass_acceleration`: the de Falco (seed 004 eq. 41) and Udwadia-Phohomsiri (seed 004
  eq. 42-43) forms for a positive-semidefinite M with rank [M; A] = n.
* :func:`recursive_uk_acceleration`: constraint blocks enforced one after another by a Kalman update
  (Orsino, seed 003 eq. 4.14-4.18), optionally with clearance covariances.
* :func:`compress_rows`: redundant rows reduced before a solve, to n by a Householder QR (m > n), or to a
  declared bound r on rank(A) by a column-pivoted one (:attr:`ukjax.System.constraint_rank`).

Rank tolerance ``rtol`` and accuracy: ``rtol`` is passed to the generalized inverse the form computes (see
:func:`ukjax.linalg.pinv`); a float, or a traced scalar (a leaf of a parameter pytree), without derivative.
The Cholesky form inverts G = B Bᵀ, whose eigenvalues are the squared singular values of B and whose null
directions carry round-off of order max(m, n) eps ‖G‖. Its default, :func:`gram_rtol`, cuts G's pivots at
10 max(m, n) eps in float64, which keeps every direction with σ(B)/σ_max(B) ≥ 1.6e-7 (n = 12), and at
3 max(m, n) eps in float32 (σ/σ₁ ≥ 2e-3 at n = 12; see :func:`gram_rtol` for the measurements).
Squaring costs accuracy: q̈ of the Cholesky form errs like cond(B)² eps, against cond(B) eps for the
reference form: on 1,905 fuzzed float64 problems with cond(B) ≤ 1e6 (``benchmarks/linalg_fuzz.py``) the
Cholesky form erred by up to 2e-4 relative to ‖q̈‖ (1e-5 relative to the size of the terms), the reference
form with ``method="svd"`` by 6e-10 (6e-11). Where
accuracy matters more than speed (cond(B) above ~1e4 in float64, ~30 in float32) use the reference form,
``method="svd"`` (or another :data:`ukjax.linalg.PINV_METHODS` entry), which decides rank on B itself.

Input checks (:mod:`ukjax._checks`): shapes are checked at trace time, always. Every function takes
``check=False``; ``check=True`` adds ``equinox.error_if`` tests (non-finite input, asymmetric M, M not
positive (semi)definite as the form requires) that raise under ``jit`` and ``vmap``. Every form reads only
the symmetric part (M + Mᵀ)/2 of M. Each function is compiled (``jax.jit``) on first call per shape.
Arguments: a non-numeric one (strings, objects) raises ``TypeError`` naming it, a complex one ``ValueError``;
integers are promoted to float, and mixed float32/float64 inputs to float64.

Non-finite input: with ``check=False`` every form returns all NaN (q̈, forces, λ, P) as soon as an entry of
M, Q, A, b, c (or of a block, or R) is NaN or ±inf, at once and without running a factorization on it (the
eigendecomposition of the reference form and every SVD are screened, see :mod:`ukjax.linalg`, "Non-finite
input"); before, the Cholesky forms gave a finite q̈ for M[0, 0] = inf. With ``check=True`` the same input
raises ``ValueError``.
"""

from __future__ import annotations

import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp

from ukjax._checks import constraint_consistency as constraint_consistency
from ukjax._checks import raise_if_invalid, symmetric_part, validate_blocks, validate_system
from ukjax.linalg import (
    PINV_METHODS,
    _finite_or_zero,
    as_real_array,
    as_real_arrays,
    check_rtol,
    cho_solve,
    cholesky,
    factorizations_looped,
    gram,
    keyed_on_looping,
    materialize,
    pinv,
    promote_floats,
    psd_ginv,
    psd_pinv,
    small_matmul,
    solve_lower,
    solve_lower_t,
)

GRAM_METHODS = ("ldl", "cholesky")
"""The Cholesky forms of seed 004 eq. 35, by the generalized inverse they take of G = A M⁻¹Aᵀ: ``"ldl"``, a
reflexive generalized inverse by LDLᵀ with diagonal pivoting (:func:`ukjax.linalg.psd_ginv`; exact for
consistent constraints, the fast default of :class:`ukjax.System` and :func:`ukjax.simulate`), and
``"cholesky"``, the Moore-Penrose inverse by pivoted Cholesky (:func:`ukjax.linalg.psd_pinv`; least squares
for inconsistent b). Both pivot on the largest remaining diagonal entry, so both take the same rank decision
and pass the flat configurations of the five-bar linkage (:mod:`ukjax.models.five_bar`), where G is singular
for an instant next to its redundant direction."""

ACCELERATION_METHODS = GRAM_METHODS + tuple(PINV_METHODS)
"""Values of ``method`` for :func:`uk_acceleration`: a Cholesky form (:data:`GRAM_METHODS`) or the reference
form with a generalized-inverse algorithm of B = A M^{-1/2} (:data:`ukjax.linalg.PINV_METHODS`)."""

SINGULAR_MASS_FORMS = ("falco", "phohomsiri")

RECURSIVE_RTOL = 1e-10
"""Rank tolerance of :func:`recursive_uk_acceleration`, relative to a block's unconstrained scale; the default
is max(RECURSIVE_RTOL, 1000 eps): 1e-10 in float64 (round-off measured below 1e-15), 1.2e-4 in float32."""


class ConstraintForce(eqx.Module):
    """The constraint force of seed 000 eq. 7: ``ideal`` (eq. 11) + ``nonideal`` (eq. 12) = ``total``."""

    ideal: jax.Array
    nonideal: jax.Array

    @property
    def total(self) -> jax.Array:
        return self.ideal + self.nonideal


def gram_rtol(m: int, n: int, dtype=jnp.float64) -> float:
    """Default rank tolerance for G = A M⁻¹Aᵀ (a pivot ≤ rtol · max G_ii counts as zero): c max(m, n) eps with
    c = 10 in float64 and c = 3 in float32.

    Measured on fuzzed G from exactly rank-deficient B (pivots of G's pivoted Cholesky in units of
    max(m, n) eps · max G_ii): round-off pivots reached 0.99 in float64 (2,431 null directions) and 2.6 in
    float32 (7,888); real pivots of B with cond(B) ≤ 1e6 start at 509 in float64, so c = 10 has margins of 10
    and 50. In float32 the real pivots of B with cond(B) ≤ 1e3 start at 0.54 and overlap the round-off: of
    10,000 such problems, c = 10 (the former float32 default) dropped 398 real directions (4 %, up to
    σ/σ₁ ≈ 3.5e-3, breaking A q̈ = b by up to 70 %), c = 3 dropped 130 (1.3 %) and kept no round-off pivot,
    c = 1 dropped 12 but kept 2 round-off pivots (q̈ of order 1/√eps). Dropping a direction breaks one
    constraint equation; keeping round-off wrecks q̈, hence c = 3. For float32 rank decisions as good as
    the SVD's (cut at max(m, n) eps on σ, not σ²) use the reference form, ``method="svd"``.
    """
    c = 3.0 if jnp.dtype(dtype) == jnp.float32 else 10.0
    return c * max(m, n, 1) * float(jnp.finfo(dtype).eps)


_GRAM_INVERSES = {"ldl": psd_ginv, "cholesky": psd_pinv}


def _screened_eigh(M):
    """(w, V, finite): ``jnp.linalg.eigh`` of M, or of the identity when M holds NaN or ±inf, so that
    LAPACK's eigensolver never iterates on a non-finite matrix (``ukjax.linalg._finite_or_zero``); the
    callers put NaN back where ``finite`` is False."""
    M0, finite = _finite_or_zero(M)
    w, V = jnp.linalg.eigh(jnp.where(finite, M0, jnp.eye(M.shape[0], dtype=M.dtype)))
    return w, V, finite


@jax.custom_jvp
def _spd_sqrt_pair(M):
    """(M^{1/2}, M^{-1/2}) of a symmetric positive-definite M by M = V diag(w) Vᵀ; all NaN for non-finite M
    (the eigensolver is not run on it)."""
    w, V, finite = _screened_eigh(M)
    s = jnp.sqrt(w)
    return jnp.where(finite, (V * s) @ V.T, jnp.nan), jnp.where(finite, (V / s) @ V.T, jnp.nan)


@_spd_sqrt_pair.defjvp
def _spd_sqrt_pair_jvp(primals, tangents):
    # S dS + dS S = dM is diagonal in the eigenbasis with divisor s_i + s_j > 0: finite for repeated
    # eigenvalues, where the derivative of eigh itself is not.
    (M,), (dM,) = primals, tangents
    w, V, finite = _screened_eigh(M)
    s = jnp.sqrt(w)
    S, S_inv = (V * s) @ V.T, (V / s) @ V.T
    dS = V @ ((V.T @ dM @ V) / (s[:, None] + s[None, :])) @ V.T
    nan_unless_finite = lambda x: jnp.where(finite, x, jnp.nan)
    primal_out = (nan_unless_finite(S), nan_unless_finite(S_inv))
    return primal_out, (nan_unless_finite(dS), nan_unless_finite(-S_inv @ dS @ S_inv))


def _nan_unless_finite(outputs, *inputs):
    """``outputs`` (a pytree), every entry NaN unless every entry of ``inputs`` (None skipped) is finite.

    The forms' convention for non-finite input, whatever their arithmetic would make of it: the Cholesky
    form gave a finite q̈ for M[0, 0] = inf (that coordinate held still) and LAPACK's factorizations may not
    return on it (:mod:`ukjax.linalg`, "Non-finite input"). One finiteness test over all input entries
    (a single reduction: one more kernel under ``vmap``) and one select per output.
    """
    entries = [jnp.ravel(x) for x in inputs if x is not None]
    _, finite = _finite_or_zero(jnp.concatenate(entries))  # one reduction, not one kernel per input
    return jax.tree_util.tree_map(lambda x: jnp.where(finite, x, jnp.nan), outputs)


class _Eq35Factors(eqx.Module):
    """What the forward eq. 35 solve keeps for its derivative: nothing is factorized twice."""

    L: jax.Array  # Cholesky factor of M
    MinvAT: jax.Array  # M⁻¹Aᵀ
    G_pinv: jax.Array  # (A M⁻¹Aᵀ)⁺, or a reflexive generalized inverse G⁻ (method "ldl")
    lam_F: jax.Array  # λ of the total given force F = Q + c: q̈ = M⁻¹(F + Aᵀλ_F)
    lam_Q: jax.Array  # λ of Q alone (the ideal force is Aᵀλ_Q)
    qdd_Q: jax.Array  # M⁻¹(Q + Aᵀλ_Q)
    r_perp: jax.Array  # (I - G G⁺) b: the part of b outside range(A), zero for consistent constraints


def compress_rows(A, b, rank=None):
    """(A_r, b_r): the first rows of Hᵀ[A | b] for a Householder QR H R = A, where they say everything A q̈ = b
    says: r = min(m, n, rank) rows, or (A, b) itself when r = m.

    H is orthogonal, so ‖A q̈ - b‖² = ‖A_r q̈ - b_r‖² + ‖(Hᵀb)_rest‖² whenever the remaining rows of HᵀA
    vanish: A q̈ = b and A_r q̈ = b_r then have the same (least-squares) solutions, range(A_rᵀ) = range(Aᵀ)
    with the same singular values, and the UK forms give the same q̈ and an ideal force A_rᵀλ_r in
    range(Aᵀ), with the conditioning of the uncompressed problem.

    - ``rank=None`` and m > n (redundant constraints): n reflections without pivoting, R is n x n; the
      rest of HᵀA is zero for any A. O(m n²) for the QR, then an n x n G = R M⁻¹Rᵀ instead of an m x m one.
    - ``rank=r`` < min(m, n), an upper bound on rank(A) the caller knows (e.g. constraints written
      redundantly): r reflections with column pivoting (Golub & Van Loan 2013, Alg. 5.4.1), each on the
      column of A with the largest norm left below the rows already kept. When rank(A) ≤ r the pivot
      columns span range(A) and the rest of HᵀA is zero; O(r m n), then an r x r G and M⁻¹ applied to
      r + 1 columns. A bound that is too small drops part of the constraints: A q̈ ≠ b then, which
      :func:`ukjax.simulate` reports as status ``inconsistent_constraints`` (‖A q̈ - b‖ with the full A).

    Columns already zero below the kept rows are skipped without a division (finite derivatives).
    """
    m, n = A.shape
    rows = min(m, n) if rank is None else min(m, n, rank)
    if rows == m:
        return A, b
    pivoting = rows < min(m, n)
    W = jnp.concatenate([A, b[:, None]], axis=1)
    chosen = jnp.zeros(n, dtype=bool)
    for k in range(rows):
        if pivoting:
            left = jnp.where(chosen, -1.0, jnp.sum(W[k:, :n] ** 2, axis=0))
            pivot = jnp.arange(n) == jnp.argmax(left)
            chosen = chosen | pivot
            x = W[k:, :n] @ pivot.astype(W.dtype)
        else:
            x = W[k:, k]
        tail = x @ x
        nonzero = tail > 0
        norm = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, tail, 1.0)), 0.0)
        alpha = -jnp.where(x[0] >= 0, 1.0, -1.0) * norm  # H x = alpha e_1, sign against cancellation
        v = x.at[0].add(-alpha)
        vv = v @ v
        beta = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        W = W.at[k:, :].add(-beta * v[:, None] * (v @ W[k:, :])[None, :])
    return W[:rows, :n], W[:rows, n]


def _gram_problem(A, b, n, dtype, rtol):
    """(A, b, rtol) as the Cholesky forms take them: redundant rows compressed (:func:`compress_rows`) and
    the rank tolerance defaulted by :func:`gram_rtol` from the original m and n, as an array."""
    rtol = gram_rtol(A.shape[0], n, dtype) if rtol is None else rtol
    return (*compress_rows(A, b), jnp.asarray(rtol, dtype))


def _eq35_forward(method, M, Q, A, b, c, rtol):
    """(q̈, Q^c_id, Q^c_nid) by a Cholesky of M and G⁺, G = A M⁻¹Aᵀ (seed 004 eq. 34-36), and the factors.

    Written for small systems under ``vmap``: products as fused outer-product sums (linalg.small_matmul).
    Differentiating this function directly (autodiff through the Cholesky and the pivoted-Cholesky loop of
    G⁺) is the reference the custom derivative of :func:`_eq35_terms` is tested against.
    """
    L = cholesky(M)
    return _eq35_factored(method, L, Q, A, b, c, rtol)


def _eq35_factored(method, L, Q, A, b, c, rtol):
    """:func:`_eq35_given_solve` for M = L Lᵀ, by forward substitution W = L⁻¹[F, (Q,) Aᵀ] only: then
    G = W_AᵀW_A (exactly symmetric, m(m + 1)/2 distinct entries), A M⁻¹F = W_Aᵀw_F, and one back
    substitution gives q̈ = L⁻ᵀ(w_F + W_A λ_F). M⁻¹Aᵀ = L⁻ᵀW_A is formed for the derivative only (unused
    values are dropped by XLA). Equal to :func:`_eq35_given_solve` with ``cho_solve(L, ·)`` up to rounding,
    with about half its triangular-solve and Gram work."""
    mm = small_matmul
    F = Q if c is None else Q + c
    given = [F[:, None]] if c is None else [F[:, None], Q[:, None]]
    W = solve_lower(L, jnp.concatenate([*given, A.T], axis=1))
    w_F, W_A = W[:, 0], W[:, len(given):]
    G = gram(W_A)
    G_pinv = _GRAM_INVERSES[method](G, rtol)
    r_F = b - mm(W_A.T, w_F)
    lam_F = mm(G_pinv, r_F)
    qdd = solve_lower_t(L, w_F + mm(W_A, lam_F))
    if c is None:
        lam_Q, qdd_Q, nonideal = lam_F, qdd, jnp.zeros_like(Q)
    else:
        w_Q = W[:, 1]
        lam_Q = mm(G_pinv, b - mm(W_A.T, w_Q))
        qdd_Q = solve_lower_t(L, w_Q + mm(W_A, lam_Q))
        nonideal = c - mm(A.T, mm(G_pinv, mm(W_A.T, w_F - w_Q)))
    ideal = mm(A.T, lam_Q)
    parts = (solve_lower_t(L, W_A), G_pinv, lam_F, lam_Q, qdd_Q, r_F - mm(G, lam_F))
    return (qdd, ideal, nonideal), _Eq35Factors(L, *parts)


def _eq35_given_solve(method, solve, Q, A, b, c, rtol):
    """Seed 004 eq. 35 given ``solve(B) = M⁻¹B``: (q̈, Q^c_id, Q^c_nid) and what the derivative reuses
    (M⁻¹Aᵀ, G⁻, λ_F, λ_Q, q̈_Q, r⊥), with M⁻¹ applied once to the columns [F, (Q,) Aᵀ]."""
    mm = small_matmul
    F = Q if c is None else Q + c
    given = [F[:, None]] if c is None else [F[:, None], Q[:, None]]
    solved = solve(jnp.concatenate([*given, A.T], axis=1))
    a_F, MinvAT = solved[:, 0], solved[:, len(given):]
    G = mm(A, MinvAT)
    G_pinv = _GRAM_INVERSES[method](G, rtol)
    r_F = b - mm(A, a_F)
    lam_F = mm(G_pinv, r_F)
    qdd = a_F + mm(MinvAT, lam_F)
    if c is None:
        lam_Q, qdd_Q, nonideal = lam_F, qdd, jnp.zeros_like(Q)
    else:
        a = solved[:, 1]
        lam_Q = mm(G_pinv, b - mm(A, a))
        qdd_Q = a + mm(MinvAT, lam_Q)
        nonideal = c - mm(A.T, mm(G_pinv, mm(A, a_F - a)))
    ideal = mm(A.T, lam_Q)
    return (qdd, ideal, nonideal), (MinvAT, G_pinv, lam_F, lam_Q, qdd_Q, r_F - mm(G, lam_F))


def uk_solve_with(solve, Q, A, b, c=None, *, method: str = "ldl", rtol=None):
    """(q̈, constraint force) of the UK equation given the action of M⁻¹ instead of M.

    ``solve(B)`` returns M⁻¹B for B of shape (n, k); q̈ = a + M⁻¹Aᵀ G⁻(b - A a), a = M⁻¹(Q + c),
    G = A M⁻¹Aᵀ (de Falco et al. eq. 35, seed 004; the ideal and non-ideal forces of Liu et al. 2015 eq.
    11-13), with G⁻ by ``method`` ("ldl": :func:`ukjax.linalg.psd_ginv`, "cholesky":
    :func:`ukjax.linalg.psd_pinv`). M⁻¹ is applied once, to the m + 1 (m + 2 with c) columns [Q + c, (Q,) Aᵀ]:
    with the articulated-body algorithm of :mod:`ukjax.multibody` that is O(n m) work where the dense form
    costs O(n³). Derivatives by autodiff through ``solve`` and G⁻. Not jitted: it is meant to be traced
    inside a right-hand side.
    """
    if method not in GRAM_METHODS:
        raise ValueError(f"uk_solve_with: method must be one of {GRAM_METHODS}, got {method!r}")
    check_rtol(rtol, "uk_solve_with")
    Q, A, b, c = as_real_arrays("uk_solve_with", Q=Q, A=A, b=b, c=c)
    n, m = Q.shape[0], A.shape[0]
    if Q.ndim != 1 or A.shape != (m, n) or b.shape != (m,) or (c is not None and jnp.shape(c) != (n,)):
        raise ValueError(
            f"uk_solve_with: expected Q (n,), A (m, n), b (m,), c (n,) or None; got Q {Q.shape}, "
            f"A {A.shape}, b {b.shape}, c {None if c is None else jnp.shape(c)}"
        )
    A_, b_, rtol_ = _gram_problem(A, b, n, Q.dtype, rtol)
    qdd, ideal, nonideal = _eq35_given_solve(method, solve, Q, A_, b_, c, rtol_)[0]
    return qdd, ConstraintForce(ideal=ideal, nonideal=nonideal)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _eq35_terms(method, M, Q, A, b, c, rtol):
    """(q̈, Q^c_id, Q^c_nid) of seed 004 eq. 35 with a derivative that reuses the forward factorization.

    Differentiating the Lagrange-multiplier form M q̈ = F + Aᵀλ, A q̈ = b (F = Q + c, λ = G⁺(b - A M⁻¹F))
    gives the tangent as one more solve with the same M and G⁺ (Golub-Pereyra for dG⁺, with Aᵀ(I - G⁺G) = 0
    and (I - GG⁺)A = 0):

        x  = M⁻¹(dF - dM q̈ + dAᵀλ),
        dλ = G⁺(db - dA q̈ - A x) + G⁺G⁺ A M⁻¹ dAᵀ r⊥,     r⊥ = (I - GG⁺) b,
        dq̈ = x + M⁻¹Aᵀ dλ.

    The last term of dλ vanishes for consistent constraints (r⊥ = 0); it makes the derivative that of the
    least-squares acceleration otherwise. Exact wherever the rank of A is locally constant, as the
    Golub-Pereyra formula it comes from. The reflexive generalized inverse of method "ldl",
    G⁻ = Π [G_KK⁻¹ 0; 0 0] Πᵀ on the kept pivots K, has dG⁻ = -G⁻ dG G⁻ wherever the pivot order and K are
    locally constant, so its λ = G⁻ r (r = b - A M⁻¹F) has dλ = G⁻(dr - dG λ) = G⁻(db - dA q̈ - A x): the
    formula above without the r⊥ term, exact for inconsistent constraints too. The ideal force Aᵀλ_Q has the
    same tangent with Q in place of F, and the non-ideal force follows from M q̈ = Q + Q^c_id + Q^c_nid.
    Cost: a few small products and one triangular solve pair with the forward Cholesky factor (a second
    right-hand side for the r⊥ term of G⁺), against autodiff through the factorizations
    (``benchmarks/compile_and_gradient.py`` measures both).
    """
    return _eq35_forward(method, M, Q, A, b, c, rtol)[0]


def _multiplier_tangent(method, f, A, dM, dA, db, acc, lam, dforce):
    """(x, dλ) of :func:`_eq35_terms`'s tangent for the multiplier λ of the force ``dforce``'s primal
    (acceleration ``acc``), from the forward solve's factors ``f``: with the Golub-Pereyra r⊥ term for G⁺
    (method "cholesky"), without it for the G⁻ of "ldl"."""
    mm = small_matmul
    least_squares = method == "cholesky"
    # Every entry of a solution reads every entry of its right-hand side: materialized, XLA:CPU computes
    # the model's tangents once instead of once per entry (see linalg.materialize).
    columns = [dforce - mm(dM, acc) + mm(dA.T, lam)]
    if least_squares:
        columns.append(mm(dA.T, f.r_perp))
    solved = cho_solve(f.L, materialize(jnp.stack(columns, axis=1)))
    x = solved[:, 0]
    r = db - mm(dA, acc) - mm(A, x)
    if least_squares:
        r = r + mm(f.G_pinv, mm(A, solved[:, 1]))
    return x, mm(f.G_pinv, materialize(r))


@_eq35_terms.defjvp
def _eq35_terms_jvp(method, primals, tangents):
    M, Q, A, b, c, rtol = primals
    dM, dQ, dA, db, dc, _ = tangents
    mm = small_matmul
    (qdd, ideal, nonideal), f = _eq35_forward(method, M, Q, A, b, c, rtol)

    multiplier_tangent = functools.partial(_multiplier_tangent, method, f, A, dM, dA, db)
    x, dlam_F = multiplier_tangent(qdd, f.lam_F, dQ if c is None else dQ + dc)
    dqdd = x + mm(f.MinvAT, dlam_F)
    dlam_Q = dlam_F if c is None else multiplier_tangent(f.qdd_Q, f.lam_Q, dQ)[1]
    dideal = mm(dA.T, f.lam_Q) + mm(A.T, dlam_Q)
    if c is None:
        dnonideal = jnp.zeros_like(dqdd)
    else:
        dnonideal = mm(dM, qdd) + mm(M, dqdd) - dQ - dideal
    return (qdd, ideal, nonideal), (dqdd, dideal, dnonideal)


def _reference_terms(M, Q, A, b, c, method, rtol):
    """(q̈, Q^c_id, Q^c_nid) by M^{±1/2} and B⁺, B = A M^{-1/2} (seed 000 eq. 11-13, seed 004 eq. 31)."""
    S, S_inv = _spd_sqrt_pair(M)
    a = S_inv @ (S_inv @ Q)
    B = A @ S_inv
    B_pinv = pinv(B, method, rtol)
    y = B_pinv @ (b - A @ a)
    qdd, ideal = a + S_inv @ y, S @ y
    if c is None:
        return qdd, ideal, jnp.zeros_like(Q)
    z = S_inv @ c
    z_free = z - B_pinv @ (B @ z)
    return qdd + S_inv @ z_free, ideal, S @ z_free


@functools.partial(jax.jit, static_argnames=("where", "method", "check", "looped"))
@keyed_on_looping
def _uk_terms(M, Q, A, b, c, rtol, *, where, method, check):
    if check:
        M = raise_if_invalid(where, M, Q, A, b, c, mass="definite")
    inputs = (M, Q, A, b, c)
    M = symmetric_part(M)
    if method in GRAM_METHODS:
        A_, b_, rtol_ = _gram_problem(A, b, M.shape[0], M.dtype, rtol)
        return _nan_unless_finite(_eq35_terms(method, M, Q, A_, b_, c, rtol_), *inputs)
    return _nan_unless_finite(_reference_terms(M, Q, A, b, c, method, rtol), *inputs)


def _checked(program, *args, check, **static):
    """Call a jitted form; a ``check=True`` failure is re-raised as ``ValueError`` with its message alone.

    Under ``jax.jit`` the XLA runtime wraps equinox's error in ``JaxRuntimeError: INTERNAL: CpuCallback
    error ...``; the message of :func:`ukjax._checks.raise_if_invalid` is recovered from it.
    """
    static["looped"] = factorizations_looped()  # part of the key: it changes the trace
    if not check:
        return program(*args, check=False, **static)
    try:
        return program(*args, check=True, **static)
    except (jax.errors.JaxRuntimeError, eqx.EquinoxRuntimeError) as error:
        found = re.search(r"EquinoxRuntimeError: (.+)", str(error))
        if found is None:
            raise
        raise ValueError(found.group(1).strip()) from None


def _uk(where, M, Q, A, b, c, method, rtol, check):
    check_rtol(rtol, where)
    if method not in ACCELERATION_METHODS:
        raise ValueError(f"{where}: unknown method {method!r}; choose one of {ACCELERATION_METHODS}")
    M, Q, A, b, c = validate_system(where, *as_real_arrays(where, M=M, Q=Q, A=A, b=b, c=c))
    # ``where`` only names the function in check messages; unchecked, the three public names share a compile.
    check = bool(check)
    return _checked(_uk_terms, M, Q, A, b, c, rtol, where=where if check else "", method=method, check=check)


def uk_acceleration(M, Q, A, b, c=None, *, method: str = "cholesky", rtol=None, check: bool = False):
    """Constrained acceleration q̈ of the Udwadia-Kalaba equation with ideal and non-ideal constraints.

        M q̈ = Q + M^{1/2}B⁺(b - A M⁻¹Q) + M^{1/2}(I - B⁺B)M^{-1/2}c,   B = A M^{-1/2}

    (Liu et al. 2015, seed 000 eq. 13; with c = None the ideal equation, eq. 15, and seed 004 eq. 31).

    ``method="cholesky"`` (default) evaluates the same q̈ by seed 004 eq. 35 (:func:`uk_acceleration_eq35`):
    one Cholesky factorization of M (n³/3 flops), triangular solves and the Moore-Penrose inverse of the
    m x m matrix A M⁻¹Aᵀ, instead of an n x n symmetric square root (an eigendecomposition, ~9n³ flops) and
    the generalized inverse of the m x n matrix A M^{-1/2}. The identity M^{-1/2}(AM^{-1/2})⁺ =
    M⁻¹Aᵀ(AM⁻¹Aᵀ)⁺, valid for positive-definite M, makes the two equal. ``method`` in
    :data:`ukjax.linalg.PINV_METHODS` evaluates eq. 13 literally, B⁺ by that algorithm (the reference).

    Args:
        M: (n, n) symmetric positive-definite mass matrix. Q: (n,) given force.
        A: (m, n), b: (m,): the constraints A q̈ = b, of any rank.
        c: (n,) non-ideal constraint vector, or None for ideal constraints.
        rtol: rank tolerance of the generalized inverse (module docstring). check: raise on invalid input.
    """
    return _uk("uk_acceleration", M, Q, A, b, c, method, rtol, check)[0]


def uk_acceleration_eq35(M, Q, A, b, c=None, *, rtol=None, check: bool = False):
    """q̈ = (I - H A) M⁻¹(Q + c) + H b,  H = M⁻¹Aᵀ(A M⁻¹Aᵀ)⁺  (de Falco et al., seed 004 eq. 35-36).

    The least-squares solution of the augmented system by a Cholesky of M and an m x m generalized inverse:
    the cheapest form for positive-definite M. The non-ideal vector c enters as an extra given force,
    because M^{1/2}(I - B⁺B)M^{-1/2}c = c - Aᵀ(AM⁻¹Aᵀ)⁺AM⁻¹c (seed 000 eq. 12). Arguments as in
    :func:`uk_acceleration`.
    """
    return _uk("uk_acceleration_eq35", M, Q, A, b, c, "cholesky", rtol, check)[0]


def uk_constraint_force(
    M, Q, A, b, c=None, *, method: str = "cholesky", rtol=None, check: bool = False
) -> ConstraintForce:
    """Ideal and non-ideal constraint forces, seed 000 eq. 11 and 12 (Liu et al. 2015).

    Q^c_id = M^{1/2}B⁺(b - A M⁻¹Q) = Aᵀ(A M⁻¹Aᵀ)⁺(b - A M⁻¹Q) does no work on virtual displacements;
    Q^c_nid = M^{1/2}(I - B⁺B)M^{-1/2}c does the work vᵀc on every v with A v = 0.
    Arguments as in :func:`uk_acceleration`; ``M q̈ = Q + result.total``.
    """
    _, ideal, nonideal = _uk("uk_constraint_force", M, Q, A, b, c, method, rtol, check)
    return ConstraintForce(ideal=ideal, nonideal=nonideal)


def uk_solve(
    M, Q, A, b, c=None, *, method: str = "cholesky", rtol=None, check: bool = False
) -> tuple[jax.Array, ConstraintForce]:
    """(q̈, constraint force) from one evaluation of the UK equation: :func:`uk_acceleration` and
    :func:`uk_constraint_force` share every factorization. Arguments as in :func:`uk_acceleration`."""
    qdd, ideal, nonideal = _uk("uk_solve", M, Q, A, b, c, method, rtol, check)
    return qdd, ConstraintForce(ideal=ideal, nonideal=nonideal)


def kkt_acceleration(M, Q, A, b, *, rtol=None, check: bool = False):
    """(q̈, λ) from the Lagrange-multiplier system, solved as a minimum-norm least-squares problem:

        [[M, -Aᵀ], [A, 0]] [q̈; λ] = [Q; b]      (Xu & Liu 2017, seed 001 eq. 10)

    Sign convention: M q̈ = Q + Aᵀλ, so the ideal constraint force is Aᵀλ (seed 004 eq. 23 writes +Ψ_qᵀλ on
    the left: its λ is the negative of this one). The Moore-Penrose inverse of the (n + m) square matrix gives
    the solution for rank-deficient A too (λ is then the minimum-norm multiplier (AM⁻¹Aᵀ)⁺(b - AM⁻¹Q)), and
    for a semidefinite M with rank [M; A] = n. The baseline the UK forms are compared with: an SVD of size
    n + m. ``check=True`` requires M symmetric positive semidefinite with rank [M; A] = n.
    """
    check_rtol(rtol, "kkt_acceleration")
    where = "kkt_acceleration"
    M, Q, A, b, _ = validate_system(where, *as_real_arrays(where, M=M, Q=Q, A=A, b=b))
    return _checked(_kkt, M, Q, A, b, rtol, check=bool(check))


@functools.partial(jax.jit, static_argnames=("check", "looped"))
@keyed_on_looping
def _kkt(M, Q, A, b, rtol, *, check):
    if check:
        M = raise_if_invalid("kkt_acceleration", M, Q, A, b, mass="semidefinite", A=A, rtol=rtol)
    M = symmetric_part(M)
    n, m = M.shape[0], A.shape[0]
    K = jnp.block([[M, -A.T], [A, jnp.zeros((m, m), M.dtype)]])
    sol = pinv(K, "svd", rtol) @ jnp.concatenate([Q, b])
    return _nan_unless_finite((sol[:n], sol[n:]), M, Q, A, b)


def singular_mass_acceleration(
    M, Q, A, b, c=None, *, form: str = "falco", method: str = "svd", rtol=None, check: bool = False
):
    """q̈ for a positive-semidefinite (possibly singular) M with a unique constrained motion, rank [M; A] = n.

    With E = I - A⁺A, the projector onto the virtual displacements, the motion is fixed by
    E(M q̈ - Q - c) = 0 and A q̈ = b (seed 000 eq. 8). Two closed forms (de Falco et al., seed 004):

    * ``form="falco"`` (eq. 37-41): q̈ = Q̃(Q + c) + (A⁺ - Q̃ M A⁺) b,  Q̃ = (E M E)⁺.
      Eq. 41 is printed without c; c enters with Q, as it does in eq. 43.
    * ``form="phohomsiri"`` (eq. 42-43, Udwadia and Phohomsiri 2006), with η = 0 because [E M; A] has full
      column rank n when the motion is unique: q̈ = [E M; A]⁺ [E(Q + c); b]. Seed 004 prints the right-hand
      side as [Q + c; b]; for consistent b the least-squares solution is the same, since (I - E)(Q + c) is
      orthogonal to the range of E M, and ukjax projects explicitly.

    ``method`` is the generalized-inverse algorithm (:data:`ukjax.linalg.PINV_METHODS`) for A⁺ and for Q̃ or
    [E M; A]⁺, ``rtol`` its rank tolerance. For positive-definite M both equal :func:`uk_acceleration`.
    ``check=True`` requires M symmetric positive semidefinite with rank [M; A] = n.
    """
    where = "singular_mass_acceleration"
    check_rtol(rtol, where)
    if form not in SINGULAR_MASS_FORMS:
        raise ValueError(f"{where}: unknown form {form!r}; choose one of {SINGULAR_MASS_FORMS}")
    M, Q, A, b, c = validate_system(where, *as_real_arrays(where, M=M, Q=Q, A=A, b=b, c=c))
    return _checked(_singular_mass, M, Q, A, b, c, rtol, form=form, method=method, check=bool(check))


@functools.partial(jax.jit, static_argnames=("form", "method", "check", "looped"))
@keyed_on_looping
def _singular_mass(M, Q, A, b, c, rtol, *, form, method, check):
    if check:
        M = raise_if_invalid("singular_mass_acceleration", M, Q, A, b, c, mass="semidefinite", A=A, rtol=rtol)
    M = symmetric_part(M)
    F = Q if c is None else Q + c
    A_pinv = pinv(A, method, rtol)
    E = jnp.eye(M.shape[0], dtype=M.dtype) - A_pinv @ A
    if form == "falco":
        Q_tilde = pinv(E @ M @ E, method, rtol)
        qdd = Q_tilde @ F + A_pinv @ b - Q_tilde @ (M @ (A_pinv @ b))
    else:
        M_bar = jnp.concatenate([E @ M, A], axis=0)
        qdd = pinv(M_bar, method, rtol) @ jnp.concatenate([E @ F, b])
    return _nan_unless_finite(qdd, M, Q, A, b, c)


def recursive_uk_acceleration(
    M,
    Q,
    blocks,
    R=None,
    *,
    rtol=None,
    covariance_update: str = "joseph",
    return_covariance: bool = False,
    check: bool = False,
):
    """q̈ by enforcing constraint blocks A_k q̈ = b_k one after another by a Kalman update (seed 003 §4).

    Orsino's recursive UK algorithm. Start from the unconstrained acceleration a_0 = M⁻¹Q with covariance
    P_0 = M⁻¹ (seed 003 works in the coordinates M^{1/2}q̈, where P_0 = I; in q̈ it is M⁻¹). Per block::

        K = P A_kᵀ (A_k P A_kᵀ + R_k)⁺                          (eq. 4.16, 4.17)
        a ← a + K (b_k - A_k a)                                 (eq. 4.14)
        P ← (I - K A_k) P (I - K A_k)ᵀ + K R_k Kᵀ               (Joseph form, eq. 4.15, 4.18)
        P ← (I - K A_k) P                                       (covariance_update="simple")

    The two updates agree in exact arithmetic; the Joseph form keeps P symmetric positive semidefinite.
    With every R_k = 0 (None) the result equals one-shot :func:`uk_acceleration` with the stacked
    constraints, including blocks that repeat or depend on earlier rows: the generalized inverse drops the
    directions already enforced. That rank decision is relative to the block's unconstrained scale
    max diag(A_k M⁻¹A_kᵀ + R_k), not to A_k P A_kᵀ itself, which is pure round-off for a redundant block;
    ``rtol=None`` means :data:`RECURSIVE_RTOL`. A covariance R_k > 0 models clearance (eq. 4.17-4.18): block
    k holds only approximately, and q̈ minimizes (q̈ - a_0)ᵀM(q̈ - a_0) + Σ_k (A_k q̈ - b_k)ᵀR_k⁻¹(A_k q̈ - b_k).

    Args:
        M: (n, n) positive-definite mass matrix. Q: (n,) given force.
        blocks: sequence of pairs (A_k (m_k, n), b_k (m_k,)).
        R: None, or a sequence with one symmetric positive-semidefinite (m_k, m_k) matrix or None per block.
        return_covariance: also return the final covariance P (n, n).

    Returns:
        q̈, or (q̈, P) when ``return_covariance``.
    """
    where = "recursive_uk_acceleration"
    check_rtol(rtol, where)
    if covariance_update not in ("joseph", "simple"):
        raise ValueError(f"{where}: covariance_update must be joseph or simple, not {covariance_update!r}")
    blocks = [_real_block(where, k, block) for k, block in enumerate(blocks)]
    R = None if R is None else [None if R_k is None else as_real_array(R_k, where, f"R[{k}]")
                                for k, R_k in enumerate(R)]
    M, Q, _, _, _ = validate_system(where, *as_real_arrays(where, M=M, Q=Q))
    As, bs, Rs = validate_blocks(where, M.shape[0], blocks, R)
    dtype = promote_floats(*[x.dtype for x in (M, *As, *bs, *Rs) if x is not None])
    M, Q = M.astype(dtype), Q.astype(dtype)
    As, bs = [x.astype(dtype) for x in As], [x.astype(dtype) for x in bs]
    Rs = [None if x is None else x.astype(dtype) for x in Rs]
    acc, P = _checked(
        _recursive, M, Q, As, bs, Rs, rtol, covariance_update=covariance_update, check=bool(check)
    )
    return (acc, P) if return_covariance else acc


def _real_block(where, k, block):
    """Block k of :func:`recursive_uk_acceleration` with its entries checked by
    :func:`ukjax.linalg.as_real_array`; a block that is not a pair is left to ``validate_blocks``."""
    try:
        items = list(block)
    except TypeError:
        kind = type(block).__name__
        raise TypeError(f"{where}: blocks[{k}] must be a pair (A_k, b_k), got {kind}") from None
    if len(items) != 2:
        return block
    return tuple(as_real_array(x, where, f"blocks[{k}][{i}] ({'A_k' if i == 0 else 'b_k'})")
                 for i, x in enumerate(items))


@functools.partial(jax.jit, static_argnames=("covariance_update", "check", "looped"))
@keyed_on_looping
def _recursive(M, Q, As, bs, Rs, rtol, *, covariance_update, check):
    if check:
        noises = [R_k for R_k in Rs if R_k is not None]
        M = raise_if_invalid("recursive_uk_acceleration", M, Q, *As, *bs, *noises, mass="definite")
    M = symmetric_part(M)
    n = M.shape[0]
    rtol = max(RECURSIVE_RTOL, 1000 * float(jnp.finfo(M.dtype).eps)) if rtol is None else rtol
    identity = jnp.eye(n, dtype=M.dtype)
    P0 = cho_solve(cholesky(M), identity)
    acc, P = P0 @ Q, P0
    for A_k, b_k, R_k in zip(As, bs, Rs, strict=True):
        m_k = A_k.shape[0]
        noise = jnp.zeros((m_k, m_k), M.dtype) if R_k is None else symmetric_part(R_k)
        S = A_k @ P @ A_k.T + noise
        scale = jax.lax.stop_gradient(jnp.max(jnp.diagonal(A_k @ P0 @ A_k.T + noise), initial=0.0))
        # A generalized inverse cuts rank relative to its own size; the padded entry sets that size to scale.
        padded = jnp.zeros((m_k + 1, m_k + 1), M.dtype).at[:m_k, :m_k].set(S).at[m_k, m_k].set(scale)
        K = P @ A_k.T @ psd_pinv(padded, rtol)[:m_k, :m_k]
        acc = acc + K @ (b_k - A_k @ acc)
        if covariance_update == "joseph":
            I_KA = identity - K @ A_k
            P = I_KA @ P @ I_KA.T + K @ noise @ K.T
        else:
            P = P - K @ (A_k @ P)
    noises = [R_k for R_k in Rs if R_k is not None]
    return _nan_unless_finite((acc, P), M, Q, *As, *bs, *noises)
