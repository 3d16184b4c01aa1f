"""How large a gain a fixed-step explicit Runge-Kutta integrator tolerates: its stability function.

A linear error dynamics ẏ = λ y integrated with step h by an explicit Runge-Kutta method with Butcher matrix
A and weights b is multiplied per step by the stability function R(z) = 1 + z bᵀ (I - zA)⁻¹ 1 at z = hλ
(Hairer & Wanner, Solving ODEs II, §IV.2); the step is stable iff |R(hλ)| ≤ 1. Baumgarte's error dynamics
φ̈ + αφ̇ + βφ = 0 (Xu & Liu 2017, eq. 52; in Liu et al. 2015's form φ̈ + 2αφ̇ + β²φ = 0 replace α by 2α and
β by β²) have the eigenvalues λ = (-α ± √(α² - 4β)) / 2, so large gains push hλ out of the stability region
and a fixed-step simulation diverges: the tuner must keep the gains inside.

:func:`real_stability_limit` gives the interval [-r, 0] of the negative real axis inside the region (Tsit5:
r ≈ 3.5); :func:`baumgarte_gain_bounds` turns it into upper bounds on α and β for a step h with a safety
factor: α ≤ s r / h keeps both real roots inside (their magnitude is at most α), β ≤ (s r / h)² keeps the
modulus √β of complex roots at most s r / h. Complex roots near the imaginary axis (light damping) need a
much smaller modulus than the real-axis limit (Tsit5's region reaches only about 0.48 along the imaginary
axis), so the box does not guarantee stability for every (α, β) in it: :func:`baumgarte_amplification`
checks a pair exactly (max |R(hλ)| over both roots, ≤ 1 when stable), and the divergence back-off of
:func:`ukjax.tune.fit` stays on as the second line of defence.
"""

from __future__ import annotations

import numpy as np


def _butcher(solver):
    tableau = getattr(solver, "tableau", None)
    if tableau is None:
        raise ValueError(
            f"{type(solver).__name__} is not an explicit Runge-Kutta solver with a Butcher tableau"
        )
    b = np.asarray(tableau.b_sol, np.float64)
    s = b.shape[0]
    A = np.zeros((s, s))
    for i, row in enumerate(tableau.a_lower):
        row = np.asarray(row, np.float64)
        A[i + 1, : row.shape[0]] = row
    return A, b


def stability_function(solver, z):
    """R(z) = 1 + z bᵀ (I - zA)⁻¹ 1 of an explicit Runge-Kutta ``solver`` (diffrax), z complex array.

    A is strictly lower triangular, so y = (I - zA)⁻¹ 1 is the forward substitution
    y_i = 1 + z Σ_{j<i} A_ij y_j, vectorized over z."""
    A, b = _butcher(solver)
    z = np.asarray(z, np.complex128)
    stages = []
    for i in range(b.shape[0]):
        stages.append(1.0 + z * sum((A[i, j] * stages[j] for j in range(i)), np.zeros_like(z)))
    return 1.0 + z * sum((b[i] * stages[i] for i in range(b.shape[0])), np.zeros_like(z))


def real_stability_limit(solver, *, search: float = 20.0, resolution: float = 1e-4) -> float:
    """The largest r with |R(-x)| ≤ 1 for all x in [0, r] (the negative real axis inside the region)."""
    xs = np.arange(resolution, search, resolution)
    bad = np.abs(stability_function(solver, -xs)) > 1.0 + 1e-12
    if not bad.any():
        return float(search)
    return float(xs[np.argmax(bad)] - resolution)


def baumgarte_gain_bounds(solver, dt: float, *, form: str = "linear", safety: float = 0.5) -> dict:
    """Upper bounds on the Baumgarte gains (α, β) that keep the error dynamics' eigenvalues inside the
    integrator's real-axis stability interval times ``safety`` at step ``dt`` (module docstring).

    ``form="linear"``: φ̈ + αφ̇ + βφ = 0 (Xu & Liu 2017, eq. 52); ``"quadratic"``: φ̈ + 2αφ̇ + β²φ = 0
    (Liu et al. 2015). Returns ``{"alpha": ..., "beta": ..., "radius": s r / dt, "real_limit": r}``.
    """
    if dt <= 0 or not 0 < safety <= 1:
        raise ValueError(f"dt must be positive and safety in (0, 1], got dt={dt}, safety={safety}")
    r = real_stability_limit(solver)
    radius = safety * r / dt
    if form == "linear":
        return {"alpha": radius, "beta": radius**2, "radius": radius, "real_limit": r}
    if form == "quadratic":
        return {"alpha": radius / 2, "beta": radius, "radius": radius, "real_limit": r}
    raise ValueError(f"form must be 'linear' or 'quadratic', got {form!r}")


def baumgarte_amplification(solver, dt: float, alpha, beta, *, form: str = "linear"):
    """max |R(dt λ)| over the two roots λ of the Baumgarte error dynamics (≤ 1: the fixed step is stable for
    them). ``form`` as in :func:`baumgarte_gain_bounds`; ``alpha``, ``beta`` may be arrays (broadcast)."""
    alpha, beta = np.asarray(alpha, np.float64), np.asarray(beta, np.float64)
    if form == "quadratic":
        alpha, beta = 2.0 * alpha, beta**2
    elif form != "linear":
        raise ValueError(f"form must be 'linear' or 'quadratic', got {form!r}")
    root = np.sqrt((alpha**2 - 4.0 * beta).astype(np.complex128))
    roots = [(-alpha + root) / 2.0, (-alpha - root) / 2.0]
    return np.maximum(*(np.abs(stability_function(solver, dt * lam)) for lam in roots))
