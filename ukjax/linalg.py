"""Generalized (Moore-Penrose) inverses, after de Falco, Pennestri & Vita (seed 004, "Review of methods").

A⁺ is the unique matrix with (A A⁺)ᵀ = A A⁺, (A⁺ A)ᵀ = A⁺ A, A A⁺ A = A, A⁺ A A⁺ = A⁺ (seed 004 eq. 1a-1d).

Rank decision: a singular value (or pivot) smaller than ``rtol * largest`` counts as zero. The default
``rtol = max(m, n) * eps(dtype)`` is NumPy's; seed 004 ("The problem of rank computation") shows that this
threshold decides whether a simulation of an overconstrained mechanism survives, so every function takes it.

Derivatives: every method shares one ``jax.custom_jvp`` whose tangent is the Golub-Pereyra formula
    dA⁺ = -A⁺ dA A⁺ + A⁺ A⁺ᵀ dAᵀ (I - A A⁺) + (I - A⁺ A) dAᵀ A⁺ᵀ A⁺,
exact wherever the rank is locally constant (also at rank-deficient A) and always finite, unlike the derivative
of ``jnp.linalg.pinv``, which is NaN at rank-deficient points.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

PINV_METHODS = ("svd",)


def default_rtol(shape, dtype) -> float:
    """NumPy's default relative rank tolerance: ``max(m, n) * eps``."""
    return max(shape[-2], shape[-1]) * float(jnp.finfo(dtype).eps)


def _check_matrix(A):
    A = jnp.asarray(A)
    if A.ndim != 2:
        raise ValueError(f"pinv expects a 2-D matrix, got shape {A.shape}; use jax.vmap for batches")
    if not jnp.issubdtype(A.dtype, jnp.floating):
        A = A.astype(jnp.result_type(float))
    return A


def _pinv_svd(A, rtol):
    """Seed 004 eq. 19: A = U Σ Vᵀ, A⁺ = V Σ⁺ Uᵀ, singular values below rtol·σ₁ dropped."""
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)
    cutoff = rtol * jnp.max(s, initial=0.0)
    keep = s > cutoff
    s_inv = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0), 0.0)
    return (vt.T * s_inv) @ u.T


_IMPLEMENTATIONS = {"svd": _pinv_svd}


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _pinv(A, method, rtol):
    return _IMPLEMENTATIONS[method](A, rtol)


@_pinv.defjvp
def _pinv_jvp(method, rtol, primals, tangents):
    (A,), (dA,) = primals, tangents
    P = _pinv(A, method, rtol)
    m, n = A.shape
    left = jnp.eye(m, dtype=A.dtype) - A @ P
    right = jnp.eye(n, dtype=A.dtype) - P @ A
    dP = -P @ dA @ P + P @ P.T @ dA.T @ left + right @ dA.T @ P.T @ P
    return P, dP


def pinv(A, method: str = "svd", rtol: float | None = None):
    """Moore-Penrose inverse A⁺ of a real m x n matrix by the algorithm ``method`` (one of ``PINV_METHODS``).

    ``rtol``: relative rank tolerance (see the module docstring); ``None`` means ``max(m, n) * eps``.
    """
    A = _check_matrix(A)
    if method not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown pinv method {method!r}; choose one of {PINV_METHODS}")
    rtol = default_rtol(A.shape, A.dtype) if rtol is None else float(rtol)
    return _pinv(A, method, rtol)
