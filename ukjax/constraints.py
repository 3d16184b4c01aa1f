"""Constraints and their second-order form ``A(q, q̇, t) q̈ = b(q, q̇, t)``, derived by autodiff.

Every constraint is a pure function of the state and a parameter pytree ``p``; ukjax differentiates it, so
users never differentiate by hand (Udwadia-Kalaba review, seed 002, Cases I and II; Liu et al. 2015, seed 000,
eq. 18-23):

* :class:`Holonomic` ``φ(q, t, p) = 0`` (scleronomic or rheonomic). With J = ∂φ/∂q and
  φ̇ = J q̇ + ∂φ/∂t, differentiating once more gives ``J q̈ = -(∂φ̇/∂q q̇ + ∂φ̇/∂t)``, i.e.
  ``A = J`` and ``b = -(d/dt φ̇)|_{q̈=0}``, computed as a Jacobian-vector product of φ̇ along (q̇, 0, 1).
* :class:`Nonholonomic` ``ψ(q, q̇, t, p) = 0``, possibly nonlinear in q̇: ``A = ∂ψ/∂q̇``,
  ``b = -(∂ψ/∂q q̇ + ∂ψ/∂t)``.
* :class:`AccelerationLevel` ``A(q, q̇, t, p) q̈ = b(q, q̇, t, p)`` given directly.

Baumgarte stabilization replaces φ̈ = 0 by a damped error equation, with gains read from ``p`` so that
``jax.grad`` can tune them. The seeds use two conventions; both are offered and named:

* ``form="quadratic"``: φ̈ + 2α φ̇ + β² φ = 0 (Liu et al. 2015, seed 000; de Falco et al., seed 004 eq. 32),
* ``form="linear"``:    φ̈ + α φ̇ + β φ = 0 (Xu & Liu 2017, seed 001 eq. 52-54).

The same error dynamics in the two conventions: α_linear = 2 α_quadratic, β_linear = β_quadratic².
First-order (nonholonomic) constraints are stabilized by ψ̇ + κ ψ = 0 with one gain κ.
Gains may be scalars or arrays with one entry per constraint row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp

BAUMGARTE_FORMS = ("quadratic", "linear")


class Baumgarte(eqx.Module):
    """Baumgarte stabilization of a holonomic constraint: ``gains(p) -> (alpha, beta)`` read from parameters.

    ``form="quadratic"`` means φ̈ + 2αφ̇ + β²φ = 0 (seeds 000, 004); ``form="linear"`` means φ̈ + αφ̇ + βφ = 0
    (seed 001). ``gains`` is a function of the parameter pytree, e.g. ``lambda p: (p["alpha"], p["beta"])``,
    so the gains are differentiable leaves of ``p``, not constants of the model.
    """

    gains: Callable[[Any], tuple[Any, Any]] = eqx.field(static=True)
    form: Literal["quadratic", "linear"] = eqx.field(static=True, default="quadratic")

    def __check_init__(self):
        if self.form not in BAUMGARTE_FORMS:
            raise ValueError(f"Baumgarte form must be one of {BAUMGARTE_FORMS}, got {self.form!r}")

    def feedback(self, phi, phi_dot, p):
        """The stabilizing term subtracted from b: 2αφ̇ + β²φ (quadratic) or αφ̇ + βφ (linear)."""
        alpha, beta = _gain_pair(self.gains(p))
        if self.form == "quadratic":
            return 2.0 * alpha * phi_dot + beta**2 * phi
        return alpha * phi_dot + beta * phi


def _gain_pair(gains):
    """``(alpha, beta)`` from what a Baumgarte ``gains(p)`` returned: a pair (tuple, list, or an array whose
    first axis has length 2); anything else is refused naming the gains function and what it returned."""
    if isinstance(gains, tuple | list) and len(gains) == 2:
        return gains
    if isinstance(gains, tuple | list):
        what = f"a {type(gains).__name__} of {len(gains)} entries"
    elif isinstance(gains, int | float):
        what = f"the number {gains!r}"
    else:
        shape = jnp.shape(gains)
        if len(shape) >= 1 and shape[0] == 2:
            return gains[0], gains[1]
        what = "a scalar" if not shape else f"an array of shape {shape}"
    raise ValueError(
        f"the Baumgarte gains function gains(p) must return a pair (alpha, beta); it returned {what} "
        "(e.g. gains=lambda p: (p['alpha'], p['beta']))"
    )


def _as_vector(value, name: str, where: str):
    value = jnp.asarray(value)
    if value.ndim == 0:
        value = value[None]
    if value.ndim != 1:
        raise ValueError(f"{where}: {name} must return a vector (k,), got shape {value.shape}")
    return value


def _jacobian(f, argnum, *args):
    """∂f/∂args[argnum] by reverse mode when f has fewer rows than the argument has entries (one pullback
    per row: a tip constraint of an n-link chain costs 2 passes, not n), else forward mode (one push per
    entry)."""
    rows = jax.eval_shape(f, *args).shape[0]
    jacobian = jax.jacrev if rows < jnp.shape(args[argnum])[0] else jax.jacfwd
    return jacobian(f, argnums=argnum)(*args)


def _time_like(t, q):
    return jnp.asarray(t, dtype=jnp.result_type(q))


def _time_argument(t, q):
    """t given as a Python number as a floating array (q's precision), so that a compiled program takes a new
    time as a new argument value instead of compiling again; an array t as it is."""
    return jnp.asarray(t, jnp.result_type(float, q)) if isinstance(t, (int, float)) else t


def _origin(q, qd):
    """δ = 0 of the chart at q: zeros of the velocity's shape."""
    return jnp.zeros(jnp.shape(qd), jnp.result_type(q, qd))


class Holonomic(eqx.Module):
    """Position-level constraint ``phi(q, t, p) = 0`` returning a vector of k equations.

    Second-order form (seed 002 Case I): A = ∂φ/∂q, b = -(∂φ̇/∂q q̇ + ∂φ̇/∂t) - stabilization.

    On a configuration manifold (``retract`` given: q ⊕ δ, :class:`ukjax.System`) the constraint is posed in
    the velocity v through the chart at the current q, φ_q(δ, t) = φ(q ⊕ δ, t): A = ∂φ_q/∂δ at δ = 0,
    φ̇ = A v + ∂φ/∂t and b the same second directional derivative with q → δ = 0 and q̇ → v.
    """

    phi: Callable[..., Any] = eqx.field(static=True)
    baumgarte: Baumgarte | None = None
    name: str = eqx.field(static=True, default="holonomic")

    def value(self, q, t, p):
        return _as_vector(self.phi(q, t, p), "phi", self.name)

    def in_chart(self, q, retract) -> Holonomic:
        """The same constraint in the chart at q: φ_q(δ, t, p) = φ(q ⊕ δ, t, p), δ of the velocity's size
        (its value at δ = 0 is φ(q), since q ⊕ 0 = q)."""
        return Holonomic(phi=lambda d, t, p: self.phi(retract(q, d), t, p), baumgarte=self.baumgarte,
                         name=self.name)  # fmt: skip

    def velocity(self, q, qd, t, p, retract=None):
        """φ̇ = J q̇ + ∂φ/∂t, by one forward-mode product (through the chart at q where ``retract`` is
        given)."""
        if retract is not None:
            return self.in_chart(q, retract).velocity(_origin(q, qd), qd, t, p)
        t = _time_like(t, q)
        _, phi_dot = jax.jvp(lambda q_, t_: self.value(q_, t_, p), (q, t), (qd, jnp.ones_like(t)))
        return phi_dot

    def second_order(self, q, qd, t, p, retract=None):
        """(A, b) with A q̈ = b equivalent to φ̈ = -(stabilization); in v through the chart at q where
        ``retract`` is given."""
        if retract is not None:
            return self.in_chart(q, retract).second_order(_origin(q, qd), qd, t, p)
        t = _time_like(t, q)
        A = _jacobian(self.value, 0, q, t, p)
        phi_dot, convective = jax.jvp(
            lambda q_, t_: self.velocity(q_, qd, t_, p), (q, t), (qd, jnp.ones_like(t))
        )
        b = -convective
        if self.baumgarte is not None:
            b = b - self.baumgarte.feedback(self.value(q, t, p), phi_dot, p)
        return A, b

    def residuals(self, q, qd, t, p, retract=None):
        """Position and velocity residuals (φ, φ̇)."""
        return self.value(q, t, p), self.velocity(q, qd, t, p, retract)


class Nonholonomic(eqx.Module):
    """Velocity-level constraint ``psi(q, qd, t, p) = 0`` (linear or nonlinear in q̇), k equations.

    Second-order form (seed 002 Case II; seed 000 eq. 18-23): A = ∂ψ/∂q̇, b = -(∂ψ/∂q q̇ + ∂ψ/∂t) - κψ, where
    ``gain(p) -> κ`` is optional first-order stabilization ψ̇ + κψ = 0. On a configuration manifold
    (``retract`` given) ψ's dependence on q is differentiated through the chart at q, ψ(q ⊕ δ, v, t).
    """

    psi: Callable[..., Any] = eqx.field(static=True)
    gain: Callable[[Any], Any] | None = eqx.field(static=True, default=None)
    name: str = eqx.field(static=True, default="nonholonomic")

    def value(self, q, qd, t, p):
        return _as_vector(self.psi(q, qd, t, p), "psi", self.name)

    def in_chart(self, q, retract) -> Nonholonomic:
        """The same constraint in the chart at q: ψ_q(δ, v, t, p) = ψ(q ⊕ δ, v, t, p)."""
        return Nonholonomic(psi=lambda d, v, t, p: self.psi(retract(q, d), v, t, p), gain=self.gain,
                            name=self.name)  # fmt: skip

    def second_order(self, q, qd, t, p, retract=None):
        if retract is not None:
            return self.in_chart(q, retract).second_order(_origin(q, qd), qd, t, p)
        t = _time_like(t, q)
        A = _jacobian(self.value, 1, q, qd, t, p)
        psi, convective = jax.jvp(
            lambda q_, t_: self.value(q_, qd, t_, p), (q, t), (qd, jnp.ones_like(t))
        )
        b = -convective
        if self.gain is not None:
            b = b - self.gain(p) * psi
        return A, b

    def residuals(self, q, qd, t, p, retract=None):
        """The velocity residual ψ (there is no position-level residual)."""
        return (self.value(q, qd, t, p),)


class AccelerationLevel(eqx.Module):
    """A constraint already in second-order form: ``A(q, qd, t, p) q̈ = b(q, qd, t, p)`` (seed 000 eq. 23)."""

    A: Callable[..., Any] = eqx.field(static=True)
    b: Callable[..., Any] = eqx.field(static=True)
    name: str = eqx.field(static=True, default="acceleration")

    def second_order(self, q, qd, t, p, retract=None):
        """(A, b) as given: A is written in the velocity (``retract`` is not needed)."""
        A = jnp.asarray(self.A(q, qd, t, p))
        b = _as_vector(self.b(q, qd, t, p), "b", self.name)
        if A.ndim == 1:
            A = A[None, :]
        return A, b

    def residuals(self, q, qd, t, p, retract=None):
        """No state-level residual: the constraint only restricts accelerations."""
        return ()


Constraint = Holonomic | Nonholonomic | AccelerationLevel


def second_order_blocks(constraints, q, qd, t, p, retract=None):
    """The list of (A_k, b_k), one block per constraint, each checked against the number of velocities
    (``retract``: the chart of a configuration manifold, :class:`ukjax.System`)."""
    n = jnp.shape(qd)[-1]
    blocks = []
    for constraint in constraints:
        A, b = constraint.second_order(q, qd, t, p, retract)
        if A.ndim != 2 or A.shape[1] != n or A.shape[0] != b.shape[0]:
            raise ValueError(
                f"constraint {constraint.name!r} gives A of shape {A.shape} and b of shape {b.shape}; "
                f"expected (k, {n}) and (k,)"
            )
        blocks.append((A, b))
    return blocks


def stack_blocks(blocks, n, dtype):
    """Stack (A_k, b_k) blocks into one (A, b); an unconstrained system gives A of shape (0, n)."""
    if not blocks:
        return jnp.zeros((0, n), dtype), jnp.zeros((0,), dtype)
    return jnp.concatenate([A for A, _ in blocks]), jnp.concatenate([b for _, b in blocks])


def pfaffian_integrability(coefficients, x):
    """The Frobenius expression A · (∇ × A) of A1 dx + A2 dy + A3 dz = 0 at the point x (seed 002 eq. 11).

    ``coefficients(x) -> (3,)`` gives (A1, A2, A3) = (α, β, γ) in seed 002's notation.
    """
    x = jnp.asarray(x)
    if x.shape != (3,):
        raise ValueError(f"a Pfaffian form in three variables needs x of shape (3,), got {x.shape}")
    return frobenius_terms(coefficients, x)[0]


def frobenius_terms(coefficients, x):
    """Every component of ω ∧ dω for the Pfaffian form ω = Σ_i a_i(x) dx_i in k >= 3 variables, at x.

    One value per triple i < j < l (lexicographic order), a_i(∂_l a_j - ∂_j a_l) + a_j(∂_i a_l - ∂_l a_i)
    + a_l(∂_j a_i - ∂_i a_j); for k = 3 the single value is seed 002 eq. 11 (Lemma 1). By Frobenius' theorem
    ω = 0 is holonomic (has an integrating factor) iff all of them vanish identically. A rheonomic constraint
    Σ A_j(q, t) q̇_j + c(q, t) = 0 (seed 002 eq. 21-22) is the form in the k = n + 1 variables (q, t) with
    coefficients (A_1, ..., A_n, c).
    """
    x = jnp.asarray(x)
    if x.ndim != 1 or x.shape[0] < 3:
        raise ValueError(f"a Pfaffian form needs a point x of shape (k,) with k >= 3, got {x.shape}")
    k = x.shape[0]

    def form(x_):
        a_ = _as_vector(coefficients(x_), "coefficients", "pfaffian")
        if a_.shape != (k,):
            raise ValueError(f"coefficients(x) for x of shape ({k},) must have shape ({k},), got {a_.shape}")
        return a_

    a = form(x)
    J = jax.jacfwd(form)(x)  # J[i, j] = ∂a_i/∂x_j
    values = [
        a[i] * (J[j, l] - J[l, j]) + a[j] * (J[l, i] - J[i, l]) + a[l] * (J[i, j] - J[j, i])
        for i, j, l in itertools.combinations(range(k), 3)
    ]
    return jnp.stack(values)


def is_holonomic_pfaffian(coefficients, points, *, atol=1e-9):
    """Whether the Pfaffian constraint Σ_i a_i dx_i = 0 is holonomic (integrable), by seed 002 Lemma 1.

    With three variables (α dx + β dy + γ dz = 0) it is holonomic iff α(β_z - γ_y) + β(γ_x - α_z) + γ(α_y -
    β_x) = 0 identically; with k > 3 variables (e.g. (x, y, z, t) for a rheonomic constraint, seed 002
    Example 3) every component of ω ∧ dω must vanish (:func:`frobenius_terms`); with k = 2 every form is
    integrable. The expressions are evaluated by automatic differentiation at every row of ``points`` (N, k)
    — e.g. random points of the region of interest — and the constraint is declared holonomic when they
    vanish (|value| <= atol) at all of them. Returns ``(is_holonomic, max_abs_value)``. A nonzero value
    anywhere proves nonholonomy; zero at sample points is evidence, not proof, of integrability.
    """
    points = jnp.atleast_2d(jnp.asarray(points))
    if points.ndim != 2 or points.shape[1] < 2:
        raise ValueError(f"points must have shape (N, k) with k >= 2 variables, got {points.shape}")
    if points.shape[1] == 2:
        zero = jnp.zeros((), jnp.result_type(points.dtype, float))
        return jnp.array(True), zero
    values = jax.vmap(lambda x: frobenius_terms(coefficients, x))(points)
    worst = jnp.max(jnp.abs(values))
    return worst <= atol, worst
