"""Integrators that diffrax does not ship: the classical 4th-order Runge-Kutta method, and a projection of
every step onto a manifold.

:class:`RK4` is the method MuJoCo calls ``integrator="RK4"`` (Kutta 1901; Hairer, Nørsett & Wanner 1993,
Section II.1), so a benchmark against MuJoCo can compare like with like: 4 right-hand-side evaluations per
step, global error O(dt⁴). For y' = f(t, y) and a step h from (t, y):

    k1 = f(t, y)
    k2 = f(t + h/2, y + h/2 k1)
    k3 = f(t + h/2, y + h/2 k2)
    k4 = f(t + h, y + h k3)
    y⁺ = y + h (k1 + 2 k2 + 2 k3 + k4) / 6

It is written as a :class:`diffrax.AbstractERK` with that Butcher tableau, so it runs through diffrax's
explicit Runge-Kutta machinery (jit, vmap, reverse-mode through the step) and any ``solver=`` of
:func:`ukjax.simulate` / :func:`ukjax.simulate_batch` accepts it.

The classical method has no embedded lower-order pair, so it gives no error estimate and is a fixed-step
solver only: like ``diffrax.Euler``, its step returns no error estimate (``None``), so an adaptive controller
(``diffrax.PIDController``; in ukjax, ``simulate`` without ``dt``) fails when the program is traced with
diffrax's error "Cannot use adaptive step sizes with a solver that does not provide error estimates" instead
of stepping by a meaningless estimate. Use it with a fixed step (``dt=...`` in ukjax, or
``diffrax.ConstantStepSize``). Dense output between steps (``ts`` that are not step boundaries) is diffrax's
third-order Hermite interpolation from k1 and k4 (as for ``diffrax.Midpoint`` and ``diffrax.Heun``); at step
boundaries the saved values are the steps' own.
"""

from collections.abc import Callable
from typing import ClassVar

import diffrax
import equinox as eqx
import numpy as np

RK4_TABLEAU = diffrax.ButcherTableau(
    c=np.array([0.5, 0.5, 1.0]),
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # No embedded method: diffrax's tableau needs error weights summing to 0; these are never used, since
    # RK4.step discards the estimate and returns None in its place.
    b_error=np.zeros(4),
)
"""The classical Runge-Kutta tableau (c = 0, ½, ½, 1; b = 1/6, 1/3, 1/3, 1/6)."""


class RK4(diffrax.AbstractERK):
    """The classical 4th-order Runge-Kutta method (4 evaluations per step, no FSAL), fixed step only.

    The step is diffrax's explicit Runge-Kutta step with :data:`RK4_TABLEAU`; the error estimate is replaced
    by ``None`` (the classical method has none), so an adaptive step-size controller refuses it with a clear
    error, as it does for ``diffrax.Euler``. See the module docstring for the equations.
    """

    tableau: ClassVar[diffrax.ButcherTableau] = RK4_TABLEAU
    interpolation_cls: ClassVar[Callable[..., diffrax.ThirdOrderHermitePolynomialInterpolation]] = (
        diffrax.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        del terms
        return 4

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, _, dense_info, solver_state, result = super().step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        return y1, None, dense_info, solver_state, result


class Projected(diffrax.AbstractWrappedSolver):
    """Any diffrax solver whose every step ends with the projection y₁ ← project(y₁).

    For states on a manifold embedded in Rᵏ (a unit quaternion in R⁴) integrated in the embedding, the
    projection after every accepted step (the standard projection method, Hairer, Lubich & Wanner 2006,
    Section IV.4) keeps the state on the manifold to round-off without changing the order of the method.
    The error estimate and dense output are the wrapped solver's (interpolated values are not projected;
    :func:`ukjax.simulate` projects its saved states). With a first-same-as-last solver (Tsit5) the
    right-hand side must not change under the projection (``ukjax.simulate`` evaluates it at the projected
    state), else the reused last stage is that of the unprojected y₁.
    """

    solver: diffrax.AbstractSolver
    project: Callable = eqx.field(static=True)

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        return self.project(y1), error, dense_info, solver_state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)
