"""Input checks shared by the Udwadia-Kalaba family of :mod:`ukjax.dynamics`.

Three layers, from cheapest to most informative:

1. **Shapes, at trace time** (always on): :func:`validate_system` and :func:`validate_blocks` raise
   ``ValueError`` naming the offending shapes when M is not square (n, n), Q or c is not of length n, A does
   not have n columns, or b does not have one entry per row of A. They cost nothing at run time.
2. **Values, as errors** (opt-in: ``check=True`` on every dynamics function; off by default):
   :func:`raise_if_invalid` uses ``equinox.error_if``, which survives ``jit`` and ``vmap``, to stop with a
   clear message on non-finite input, a mass matrix that is not symmetric, not positive definite (forms that
   invert M), or not positive semidefinite with a unique constrained motion (forms for singular M). Eagerly
   and under ``equinox.filter_jit`` the error is an ``equinox.EquinoxRuntimeError``; under ``jax.jit`` the
   XLA runtime wraps the same message in a ``RuntimeError`` or ``ValueError``.
3. **Values, as data** (:func:`input_status`): boolean flags a simulator records at every step instead of
   raising, so one bad member never stops a batch of scenarios. The flags are booleans, never NaN.

With ``check=False`` (the default) nothing is tested at run time: a mass matrix that is not positive definite
makes the positive-definite forms return NaN, and every form reads only the symmetric part (M + Mᵀ)/2 of M,
so a slightly asymmetric M computed by autodiff gives the answer for its symmetric part. Consistency of the
constraints (seed 000 Lemma 1, eq. 27: A q̈ = b has a solution iff A A⁺ b = b) is measured by
:func:`constraint_consistency`; an inconsistent b is not an error, because the UK equation then returns the
least-squares acceleration, and simulations report the residual.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ukjax.linalg import _finite_or_zero, check_rtol, cholesky, pinv

SYMMETRY_RTOL = 1e-10
"""M counts as symmetric when max|M - Mᵀ| <= rtol max|M|, rtol = max(SYMMETRY_RTOL, 100 eps)."""

CONSISTENCY_RTOL = 1e-8
"""A q̈ = b counts as consistent when ‖A A⁺ b - b‖ <= rtol (1 + ‖b‖), rtol = max(CONSISTENCY_RTOL, √eps)."""


def _eps(x) -> float:
    return float(jnp.finfo(x.dtype).eps)


def _as_float(x):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def validate_system(where: str, M, Q, A=None, b=None, c=None):
    """Check the shapes of one problem M (n, n), Q (n,), A (m, n), b (m,), c (n,) at trace time.

    Returns the inputs as floating arrays (None stays None); raises ``ValueError`` naming the shapes.
    Batches are handled by ``jax.vmap``, not by extra leading axes.
    """
    M, Q = _as_float(M), _as_float(Q)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"{where}: M must be a square (n, n) matrix, got M.shape={M.shape} (vmap batches)")
    n = M.shape[0]
    if Q.shape != (n,):
        raise ValueError(
            f"{where}: Q must have shape ({n},) to match M.shape={M.shape}, got Q.shape={Q.shape}"
        )
    if A is not None:
        A = _as_float(A)
        if A.ndim != 2 or A.shape[1] != n:
            raise ValueError(
                f"{where}: A must have shape (m, {n}) to match M.shape={M.shape}, got A.shape={A.shape}"
            )
    if b is not None:
        b = _as_float(b)
        m = None if A is None else A.shape[0]
        if b.ndim != 1 or (m is not None and b.shape[0] != m):
            raise ValueError(
                f"{where}: b must have shape ({m},) to match A.shape={A.shape}, got b.shape={b.shape}"
            )
    if c is not None:
        c = _as_float(c)
        if c.shape != (n,):
            raise ValueError(
                f"{where}: c must have shape ({n},) to match M.shape={M.shape}, got c.shape={c.shape}"
            )
    return M, Q, A, b, c


def validate_blocks(where: str, n: int, blocks, R=None):
    """Check constraint blocks (A_k (m_k, n), b_k (m_k,)) and optional covariances R_k (m_k, m_k).

    Returns lists ``As, bs, Rs`` (``Rs[k]`` is None for a noiseless block); raises ``ValueError`` naming the
    shapes otherwise.
    """
    blocks = list(blocks)
    if R is not None:
        R = list(R)
        if len(R) != len(blocks):
            raise ValueError(f"{where}: R needs one matrix or None per block: {len(blocks)} blocks, {len(R)}")
    As, bs, Rs = [], [], []
    for k, block in enumerate(blocks):
        if len(block) != 2:
            raise ValueError(f"{where}: block {k} must be a pair (A_k, b_k), got {len(block)} items")
        A_k, b_k = _as_float(block[0]), _as_float(block[1])
        if A_k.ndim != 2 or A_k.shape[1] != n:
            raise ValueError(f"{where}: block {k}: A_k must have shape (m_k, {n}), got A_k.shape={A_k.shape}")
        m_k = A_k.shape[0]
        if b_k.shape != (m_k,):
            raise ValueError(
                f"{where}: block {k}: b_k must have shape ({m_k},) to match A_k.shape={A_k.shape}, "
                f"got b_k.shape={b_k.shape}"
            )
        R_k = None if R is None or R[k] is None else _as_float(R[k])
        if R_k is not None and R_k.shape != (m_k, m_k):
            raise ValueError(
                f"{where}: block {k}: R_k must have shape {(m_k, m_k)} to match A_k.shape={A_k.shape}, "
                f"got R_k.shape={R_k.shape}"
            )
        As.append(A_k)
        bs.append(b_k)
        Rs.append(R_k)
    return As, bs, Rs


def symmetric_part(M):
    """(M + Mᵀ)/2: the part of M every dynamics form reads."""
    return 0.5 * (M + M.T)


def is_finite(*arrays) -> jax.Array:
    """True when every entry of every given array (None skipped) is finite."""
    flags = [jnp.all(jnp.isfinite(x)) for x in arrays if x is not None]
    return jnp.all(jnp.stack(flags)) if flags else jnp.array(True)


def is_symmetric(M, rtol=None) -> jax.Array:
    """max|M - Mᵀ| <= rtol * max|M| (``rtol=None``: see :data:`SYMMETRY_RTOL`)."""
    rtol = max(SYMMETRY_RTOL, 100 * _eps(M)) if rtol is None else rtol
    return jnp.max(jnp.abs(M - M.T), initial=0.0) <= rtol * jnp.max(jnp.abs(M), initial=0.0)


def is_positive_definite(M) -> jax.Array:
    """Cholesky of (M + Mᵀ)/2 succeeds with every pivot L_ii² above n eps max_i M_ii (numerically PD).

    False for non-finite M. The factorization is :func:`ukjax.linalg.cholesky` (no LAPACK call, which can
    deadlock under ``vmap`` with jaxlib 0.10) and runs on a zeroed matrix when M is not finite.
    """
    n = M.shape[0]
    M0, finite = _finite_or_zero(M)
    L = cholesky(symmetric_part(M0))
    floor = n * jnp.finfo(M.dtype).eps * jnp.max(jnp.diagonal(M0), initial=0.0)
    return finite & jnp.all(jnp.isfinite(L)) & jnp.all(jnp.diagonal(L) ** 2 > floor)


def is_positive_semidefinite(M) -> jax.Array:
    """Every eigenvalue of (M + Mᵀ)/2 is >= -10 n eps max|λ| (the round-off of an exactly singular M).

    False for non-finite M, without running LAPACK's eigensolver on it (which may not return on inf).
    """
    M0, finite = _finite_or_zero(M)
    w = jnp.linalg.eigvalsh(symmetric_part(M0))
    tol = 10 * M.shape[0] * jnp.finfo(M.dtype).eps * jnp.max(jnp.abs(w), initial=0.0)
    return finite & jnp.all(w >= -tol)


def motion_is_unique(M, A, rtol=None) -> jax.Array:
    """rank [M; A] = n: the condition under which M q̈ = Q + Q^c, A q̈ = b fix q̈ for a semidefinite M.

    Rank decided as :func:`ukjax.linalg.pinv` does: singular values above ``rtol`` times the largest
    (``rtol=None``: (n + m) eps), so M and A should be on comparable scales. False for non-finite input (the
    SVD is not run on it) and for a traced negative or NaN ``rtol``; a concrete one raises ``ValueError``.
    """
    check_rtol(rtol, "motion_is_unique")
    stacked, finite = _finite_or_zero(jnp.concatenate([symmetric_part(M), A], axis=0))
    s = jnp.linalg.svd(stacked, compute_uv=False)
    rtol = max(stacked.shape) * _eps(M) if rtol is None else rtol
    return finite & (rtol >= 0) & (s[-1] > rtol * s[0])


def constraint_consistency(A, b, *, rtol=None) -> jax.Array:
    """‖A A⁺ b - b‖: zero exactly when A q̈ = b has a solution (seed 000 Lemma 1, eq. 27).

    Liu et al. (2015) state consistency as A A⁺ b = b; this residual is the distance of b from range(A),
    which simulations report at every step. ``rtol`` is the rank tolerance of A⁺. At a consistent b the
    derivative is the subgradient 0 rather than the NaN of d‖r‖ at r = 0. Non-finite A or b gives NaN
    (A⁺ is then all NaN and the SVD is not run on A).
    """
    A, b = _as_float(A), _as_float(b)
    if A.ndim != 2 or b.shape != (A.shape[0],):
        raise ValueError(
            f"constraint_consistency: need A (m, n), b (m,), got A.shape={A.shape}, b.shape={b.shape}"
        )
    check_rtol(rtol, "constraint_consistency")
    return _consistency_residual(A, b, rtol)


@jax.jit
def _consistency_residual(A, b, rtol):
    r = A @ (pinv(A, "svd", rtol) @ b) - b
    r2 = jnp.sum(r * r)
    positive = r2 > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0 * r2)  # NaN stays NaN


class InputStatus(eqx.Module):
    """Boolean flags describing one problem (M, Q, A, b[, c]); record them instead of raising."""

    finite: jax.Array
    mass_symmetric: jax.Array
    mass_positive_definite: jax.Array
    constraints_consistent: jax.Array

    @property
    def ok(self) -> jax.Array:
        """All flags hold: every positive-definite form of :mod:`ukjax.dynamics` applies."""
        return self.finite & self.mass_symmetric & self.mass_positive_definite & self.constraints_consistent


def input_status(
    M, Q, A, b, c=None, *, rtol=None, symmetry_rtol=None, consistency_rtol=None
) -> InputStatus:
    """Flags for one problem, NaN-free and jit/vmap-able: the non-raising counterpart of ``check=True``.

    ``constraints_consistent``: ‖A A⁺ b - b‖ <= consistency_rtol (1 + ‖b‖) (seed 000 eq. 27), ``rtol`` the
    rank tolerance of A⁺. ``None`` tolerances: see :data:`SYMMETRY_RTOL`, :data:`CONSISTENCY_RTOL`.
    A non-finite input makes every flag that depends on it False.
    """
    M, Q, A, b, c = validate_system("input_status", M, Q, A, b, c)
    check_rtol(rtol, "input_status")
    if consistency_rtol is None:
        consistency_rtol = max(CONSISTENCY_RTOL, _eps(b) ** 0.5)
    return _input_status(M, Q, A, b, c, rtol, symmetry_rtol, consistency_rtol)


@jax.jit
def _input_status(M, Q, A, b, c, rtol, symmetry_rtol, consistency_rtol):
    def finite_or_zero(x):
        return jnp.where(jnp.isfinite(x), x, 0.0)

    residual = _consistency_residual(finite_or_zero(A), finite_or_zero(b), rtol)
    return InputStatus(
        finite=is_finite(M, Q, A, b, c),
        mass_symmetric=is_finite(M) & is_symmetric(M, symmetry_rtol),
        mass_positive_definite=is_finite(M) & is_positive_definite(finite_or_zero(M)),
        constraints_consistent=is_finite(A, b) & (residual <= consistency_rtol * (1.0 + jnp.linalg.norm(b))),
    )


def raise_if_invalid(where: str, M, *others, mass: str = "definite", A=None, rtol=None):
    """Return M tied to ``equinox.error_if`` checks that raise, under jit and vmap too, on invalid input.

    Always: every array in ``(M, *others)`` is finite and M is symmetric. ``mass="definite"``: M is positive
    definite (forms that factor or invert M). ``mass="semidefinite"``: M is positive semidefinite and
    rank [M; A] = n, so the constrained motion is unique (forms for singular M; needs ``A``).
    The returned M must be used downstream, or the checks are compiled away.
    """
    M = eqx.error_if(M, ~is_finite(M, *others), f"{where}: an input (M, Q, A, b or c) has a NaN or inf entry")
    M = eqx.error_if(M, ~is_symmetric(M), f"{where}: the mass matrix M is not symmetric")
    if mass == "definite":
        M = eqx.error_if(M, ~is_positive_definite(M), f"{where}: the mass matrix M is not positive definite")
    elif mass == "semidefinite":
        M = eqx.error_if(
            M, ~is_positive_semidefinite(M), f"{where}: the mass matrix M is not positive semidefinite"
        )
        unique = motion_is_unique(M, A, rtol)
        M = eqx.error_if(M, ~unique, f"{where}: rank [M; A] < n, the constrained motion is not unique")
    else:
        raise ValueError(f"{where}: mass must be 'definite' or 'semidefinite', got {mass!r}")
    return M
