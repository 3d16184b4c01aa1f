"""Objectives: differentiable functionals of one simulated scenario, weighted sums of them, and risk measures
that turn the per-scenario values of a batch into one number while masking failed scenarios.

A **term** maps one scenario's :class:`~ukjax.simulation.Solution` (no batch axis), its parameters and the
system to a scalar. Integrals use the trapezoidal rule over the saved times ``sol.ts`` (save densely enough
for the quantity: the tuner's default saves every step of a fixed-step run):

* :func:`position_violation` ∫‖φ‖² dt and :func:`velocity_violation` ∫‖φ̇‖² dt of the passive constraints
  (``rows`` picks constraint rows, e.g. the three path rows of the SCARA, Xu & Liu 2017, eq. 48);
* :func:`servo_tracking` ∫‖φ_s‖² dt of the servo constraints (Liu et al. 2015, eq. 24; velocity residual ψ
  for nonholonomic ones);
* :func:`control_effort` ∫‖u‖² dt;
* :func:`peak_constraint_force` and :func:`peak_control`: a smooth maximum over time of ‖Q^c(t)‖ (Liu et
  al. 2015, eq. 11-12) or of max_i |u_i(t)| (:func:`smooth_max`);
* :func:`actuator_limit` ∫ Σ_i max(|u_i| - u_max, 0)² dt, zero while |u_i| ≤ u_max;
* :func:`terminal_violation` ‖φ(t1)‖² + ‖φ̇(t1)‖² (+ servo residuals);
* :func:`custom` any ``fn(sol, params) -> scalar``.

Terms combine with weights: ``position_violation() + 1e-6 * peak_constraint_force()`` is an
:class:`Objective`. Weights are traced numbers, so changing them does not recompile.

A **risk measure** reduces the (batch,) per-scenario values L_i with a mask ok_i (scenario i reached t1
with a finite state, ``Solution.completed``, and L_i is finite): :class:`Mean`, :class:`SmoothWorst` (a
log-sum-exp soft maximum) and :class:`CVaR` (the mean of the worst (1 - level) fraction). Failed scenarios
are left out of the value and, in :func:`ukjax.tune.fit`, of the gradient; they are counted and reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

DEFAULT_SMOOTH_MAX_POWER = 16.0


def integrate(ts, values):
    """∫ values dt over the saved times by the trapezoidal rule (values of shape (T,))."""
    dt = jnp.diff(ts)
    return jnp.sum(0.5 * (values[1:] + values[:-1]) * dt)


def smooth_max(values, power: float = DEFAULT_SMOOTH_MAX_POWER):
    """A smooth maximum of non-negative values: the power mean (mean vᵖ)^{1/p}.

    It lies between the mean and the maximum, tends to the maximum as p grows (for T values, max ≥ result ≥
    T^{-1/p} max: 0.81 max for T = 30, p = 16) and, unlike the maximum, spreads its gradient over the largest
    values instead of one. Scale-free: smooth_max(c v) = c smooth_max(v) for c > 0.
    """
    values = jnp.abs(values)
    scale = jax.lax.stop_gradient(jnp.max(values))
    safe = jnp.where(scale > 0, scale, 1.0)
    return safe * jnp.mean((values / safe) ** power) ** (1.0 / power)


def _rows(x, rows):
    return x if rows is None else x[..., jnp.asarray(rows)]


class Term(eqx.Module):
    """One objective term: ``fn(system, sol, params) -> scalar`` for a single scenario."""

    name: str = eqx.field(static=True)
    fn: Callable[..., Any] = eqx.field(static=True)

    def __call__(self, system, sol, params):
        return self.fn(system, sol, params)

    def __mul__(self, weight) -> Objective:
        return Objective((self,), jnp.asarray([weight], float))

    __rmul__ = __mul__

    def __add__(self, other) -> Objective:
        return as_objective(self) + other


class Objective(eqx.Module):
    """A weighted sum Σ_k w_k term_k of :class:`Term`s; ``parts`` gives every term's value."""

    terms: tuple = eqx.field(static=True)
    weights: jax.Array

    def __call__(self, system, sol, params):
        parts = self.parts(system, sol, params)
        return sum(w * parts[t.name] for t, w in zip(self.terms, self.weights, strict=True))

    def parts(self, system, sol, params) -> dict:
        """{term name: unweighted value} for one scenario."""
        return {t.name: t(system, sol, params) for t in self.terms}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.terms)

    def __add__(self, other) -> Objective:
        other = as_objective(other)
        names = set(self.names) & set(other.names)
        if names:
            raise ValueError(f"objective terms must have distinct names; repeated: {sorted(names)}")
        return Objective(self.terms + other.terms, jnp.concatenate([self.weights, other.weights]))

    def __mul__(self, weight) -> Objective:
        return Objective(self.terms, self.weights * weight)

    __rmul__ = __mul__

    def with_weights(self, **weights) -> Objective:
        """The same terms with some weights replaced, by term name (no recompilation: weights are traced)."""
        unknown = set(weights) - set(self.names)
        if unknown:
            raise ValueError(f"unknown objective terms {sorted(unknown)}; terms: {list(self.names)}")
        new = [weights.get(name, w) for name, w in zip(self.names, self.weights, strict=True)]
        return Objective(self.terms, jnp.asarray(new, self.weights.dtype))


def as_objective(x) -> Objective:
    if isinstance(x, Objective):
        return x
    if isinstance(x, Term):
        return Objective((x,), jnp.ones((1,), float))
    raise TypeError(f"expected a ukjax.tune Term or Objective, got {type(x).__name__}")


# ------------------------------------------------------------------------------------------ terms
def position_violation(rows=None, *, name: str = "position_violation") -> Term:
    """∫‖φ(q(t), t)‖² dt of the passive holonomic constraints (``rows``: a subset of constraint rows)."""
    rows = None if rows is None else tuple(rows)
    return Term(
        name, lambda system, sol, p: integrate(sol.ts, jnp.sum(_rows(sol.position_residual, rows) ** 2, -1))
    )


def velocity_violation(rows=None, *, name: str = "velocity_violation") -> Term:
    """∫‖φ̇ (and ψ)‖² dt of the passive constraints (``rows``: a subset of velocity-residual rows)."""
    rows = None if rows is None else tuple(rows)
    return Term(
        name, lambda system, sol, p: integrate(sol.ts, jnp.sum(_rows(sol.velocity_residual, rows) ** 2, -1))
    )


def _servo_residual(system, q, qd, t, p, *, velocity: bool = False):
    """φ_s of every holonomic servo constraint and ψ of every nonholonomic one, stacked; with ``velocity``
    also φ̇_s of the holonomic ones."""
    parts = []
    for constraint in system.servo_constraints:
        residuals = constraint.residuals(q, qd, t, p, system.retract)
        if residuals:
            parts.extend(jnp.ravel(r) for r in (residuals if velocity else residuals[:1]))
    if not parts:
        raise ValueError(
            "servo_tracking needs a servo constraint with a state-level residual (Holonomic or "
            "Nonholonomic); use custom(...) for an acceleration-level task"
        )
    return jnp.concatenate(parts)


def servo_tracking(*, name: str = "servo_tracking") -> Term:
    """∫‖φ_s(q(t), t)‖² dt: how far the motion is from the servo constraints (Liu et al. 2015, eq. 24)."""

    def fn(system, sol, p):
        phi = jax.vmap(lambda t, q, qd: _servo_residual(system, q, qd, t, p))(sol.ts, sol.q, sol.qd)
        return integrate(sol.ts, jnp.sum(phi**2, -1))

    return Term(name, fn)


def _controls(sol):
    if sol.u is None:
        raise ValueError("this objective term needs a controlled system (actuation and servo constraints)")
    return sol.u


def control_effort(*, name: str = "control_effort") -> Term:
    """∫‖u(t)‖² dt."""
    return Term(name, lambda system, sol, p: integrate(sol.ts, jnp.sum(_controls(sol) ** 2, -1)))


def peak_control(*, power: float = DEFAULT_SMOOTH_MAX_POWER, name: str = "peak_control") -> Term:
    """Smooth maximum over saved times and actuators of |u_i(t)| (:func:`smooth_max`)."""
    return Term(name, lambda system, sol, p: smooth_max(jnp.ravel(_controls(sol)), power))


def peak_constraint_force(
    rows=None, *, power: float = DEFAULT_SMOOTH_MAX_POWER, name: str = "peak_constraint_force"
) -> Term:
    """Smooth maximum over saved times of ‖Q^c(t)‖ (coordinates ``rows`` of the generalized constraint force,
    ideal plus non-ideal, Liu et al. 2015, eq. 11-12)."""
    rows = None if rows is None else tuple(rows)

    def fn(system, sol, p):
        force = _rows(sol.constraint_force.total, rows)
        return smooth_max(jnp.sqrt(jnp.sum(force**2, -1) + 1e-300), power)

    return Term(name, fn)


def actuator_limit(u_max, *, name: str = "actuator_limit") -> Term:
    """∫ Σ_i max(|u_i(t)| - u_max, 0)² dt: zero while every actuator stays within |u_i| ≤ u_max (a scalar or
    one limit per actuator)."""

    def fn(system, sol, p):
        excess = jax.nn.relu(jnp.abs(_controls(sol)) - jnp.asarray(u_max, sol.ts.dtype))
        return integrate(sol.ts, jnp.sum(excess**2, -1))

    return Term(name, fn)


def terminal_violation(*, name: str = "terminal_violation") -> Term:
    """‖φ(t1)‖² + ‖φ̇(t1)‖² at the last saved time, plus ‖φ_s(t1)‖² + ‖φ̇_s(t1)‖² of the servo constraints
    with state-level residuals."""

    def fn(system, sol, p):
        value = jnp.sum(sol.position_residual[-1] ** 2) + jnp.sum(sol.velocity_residual[-1] ** 2)
        q, qd, t = sol.q[-1], sol.qd[-1], sol.ts[-1]
        if any(c.residuals(q, qd, t, p) for c in system.servo_constraints):
            value = value + jnp.sum(_servo_residual(system, q, qd, t, p, velocity=True) ** 2)
        return value

    return Term(name, fn)


def custom(fn: Callable[[Any, Any], Any], *, name: str = "custom") -> Term:
    """A user term ``fn(sol, params) -> scalar`` of one scenario's Solution and parameters."""
    return Term(name, lambda system, sol, p: fn(sol, p))


# ------------------------------------------------------------------------------------------ risk measures
def _count(ok, dtype):
    """Number of successful scenarios, in the losses' floating dtype."""
    return jnp.sum(ok.astype(dtype))


def _masked_mean(losses, ok):
    n = _count(ok, losses.dtype)
    total = jnp.sum(jnp.where(ok, losses, 0.0))
    return jnp.where(n > 0, total / jnp.maximum(n, 1.0), jnp.nan)


class Mean(eqx.Module):
    """The mean over the successful scenarios."""

    def __call__(self, losses, ok):
        return _masked_mean(losses, ok)


class SmoothWorst(eqx.Module):
    """A soft worst case: τ log mean_ok exp(L_i / τ), between the mean (τ → ∞) and the maximum (τ → 0).

    τ = mean_ok |L| / sharpness (held constant for the gradient), so the measure is scale-free.
    """

    sharpness: float = eqx.field(static=True, default=10.0)

    def __call__(self, losses, ok):
        scale = jax.lax.stop_gradient(_masked_mean(jnp.abs(losses), ok))
        tau = jnp.where(scale > 0, scale, 1.0) / self.sharpness
        shifted = jnp.where(ok, losses, -jnp.inf) / tau
        top = jax.lax.stop_gradient(jnp.max(shifted))
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        count = _count(ok, losses.dtype)
        mean_exp = jnp.sum(jnp.where(ok, jnp.exp(jnp.where(ok, shifted, 0.0) - top), 0.0)) / jnp.maximum(
            count, 1.0
        )
        return jnp.where(count > 0, tau * (top + jnp.log(mean_exp)), jnp.nan)


class CVaR(eqx.Module):
    """Conditional value at risk: the mean of the worst ⌈(1 - level) n⌉ of the n successful scenarios."""

    level: float = eqx.field(static=True, default=0.9)

    def __check_init__(self):
        if not 0.0 <= self.level < 1.0:
            raise ValueError(f"CVaR level must lie in [0, 1), got {self.level}")

    def __call__(self, losses, ok):
        n = _count(ok, losses.dtype)
        k = jnp.maximum(jnp.ceil((1.0 - self.level) * n), 1.0)
        worst_first = -jnp.sort(-jnp.where(ok, losses, -jnp.inf))
        take = jnp.arange(losses.shape[0], dtype=losses.dtype) < k
        total = jnp.sum(jnp.where(take, worst_first, 0.0))
        return jnp.where(n > 0, total / k, jnp.nan)


RISKS = {"mean": Mean, "smooth_worst": SmoothWorst, "cvar": CVaR}
