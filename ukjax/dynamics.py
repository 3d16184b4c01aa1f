"""The Udwadia-Kalaba equation (provisional core; the foundation issue completes this module)."""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ukjax.linalg import pinv


def uk_acceleration(M, Q, A, b, c=None, *, method: str = "cholesky", rtol: float | None = None):
    """q̈ = a + M⁻¹Aᵀ(AM⁻¹Aᵀ)⁺(b - A a) [+ non-ideal part], a = M⁻¹Q (seed 004 eq. 35, seed 000 eq. 13)."""
    L = jnp.linalg.cholesky(M)
    a = jsl.cho_solve((L, True), Q)
    MinvAT = jsl.cho_solve((L, True), A.T)
    G = A @ MinvAT
    qdd = a + MinvAT @ (pinv(G, "svd", rtol) @ (b - A @ a))
    if c is not None:
        Minvc = jsl.cho_solve((L, True), c)
        qdd = qdd + Minvc - MinvAT @ (pinv(G, "svd", rtol) @ (A @ Minvc))
    return qdd
