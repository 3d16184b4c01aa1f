"""One integration step at a time, for control and learning loops (the shape of MJX's ``mjx.step``).

:func:`simulate` integrates a whole span in one compiled program and reports diagnostics at saved times. A
controller, a reinforcement-learning environment or a model-predictive loop instead wants to advance the
state by one step, look at it, and decide what to do next::

    state = ukjax.State(q=q0, qd=qd0, t=0.0)
    step = jax.jit(ukjax.step, static_argnums=0)
    for k in range(1000):
        params = params | {"gain": policy(state)}      # anything may change between steps
        state = step(system, state, params, 0.005)

:func:`step` is one step of the same explicit diffrax solver and the same right-hand side as a fixed-step
:func:`simulate` (q̈ from the Udwadia-Kalaba equation, Liu et al. 2015, eq. 13, or from the servo-constraint
controller for controlled systems), so ``n`` steps reproduce ``simulate(..., dt0=dt)`` at the same times.
It is a pure function of arrays: ``jax.jit``, ``jax.vmap`` (over states and parameters: a batch of
environments) and ``jax.grad`` (through any number of steps) work on it. A system with ball or free joints
(``System.nq`` ≠ n) takes q of shape (nq,); the step ends with q ← ``System.normalize(q)``.
"""

from __future__ import annotations

import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ukjax import dynamics
from ukjax.linalg import looped_factorizations
from ukjax.options import _loops_pay
from ukjax.simulation import _Config, _Numbers, _state_derivative, _with_unrolled_recursions
from ukjax.system import SOLVERS, System


class State(eqx.Module):
    """The state (q, q̇) of a mechanical system at time t; a pytree, so it can be ``vmap``-ed and carried."""

    q: jax.Array
    qd: jax.Array
    t: jax.Array

    def __init__(self, q, qd, t=0.0):
        self.q = jnp.asarray(q)
        self.qd = jnp.asarray(qd, dtype=self.q.dtype)
        self.t = jnp.asarray(t, dtype=self.q.dtype)


def step(
    system: System,
    state: State,
    params,
    dt,
    *,
    solver=None,
    method: str = "ldl",
    uk_solver: str = "uk",
    pinv_rtol=None,
) -> State:
    """Advance ``state`` by one step of size ``dt`` with an explicit diffrax solver (default ``Tsit5``).

    Arguments as in :func:`ukjax.simulate` (``method``, ``uk_solver``, ``pinv_rtol``: how q̈ is computed).
    ``dt`` may be traced; ``system``, ``solver``, ``method`` and ``uk_solver`` are static under ``jit``.
    No diagnostics and no status are computed: check ``jnp.isfinite`` of the new state, or
    :meth:`System.residuals` for the constraint violation, where it matters. A non-finite state stays
    non-finite (no exception inside a compiled loop).

    For many steps (a model-predictive controller's horizon), call it inside ``jax.lax.scan`` or
    ``fori_loop`` in one ``jit``: on the CPU XLA then compiles the loop into one function
    (:func:`ukjax.whole_cpu_loops`; measured for :func:`ukjax.simulate` by
    ``benchmarks/one_scenario_cpu.py``), where a jitted ``step`` called from a Python loop pays the call
    and runs its kernels one by one.
    """
    if not isinstance(system, System):
        raise TypeError(f"system must be a ukjax.System, got {type(system).__name__}")
    if not isinstance(state, State):
        raise TypeError(f"state must be a ukjax.State, got {type(state).__name__}")
    if state.q.shape != (system.nq,) or state.qd.shape != (system.n,):
        raise ValueError(f"state.q must have shape ({system.nq},) and state.qd shape ({system.n},), got "
                         f"{state.q.shape} and {state.qd.shape}")
    if method not in dynamics.ACCELERATION_METHODS:
        raise ValueError(f"method must be one of {dynamics.ACCELERATION_METHODS}, got {method!r}")
    if uk_solver not in SOLVERS:
        raise ValueError(f"uk_solver must be one of {SOLVERS}, got {uk_solver!r}")
    solver = diffrax.Tsit5() if solver is None else solver
    if not isinstance(solver, diffrax.AbstractSolver) or isinstance(solver, diffrax.AbstractImplicitSolver):
        raise ValueError(f"step needs an explicit diffrax solver, got {solver!r}")
    dtype = state.q.dtype
    nan = jnp.asarray(math.nan, dtype)
    config = _Config(solver=solver, adaptive=False, has_dt0=True, max_steps=1, method=method,
                     uk_solver=uk_solver, default_pinv_rtol=pinv_rtol is None, progress=False, throw=False,
                     adjoint=None)  # fmt: skip
    numbers = _Numbers(ts=nan[None], t0=state.t, t1=state.t, dt=jnp.asarray(dt, dtype), rtol=nan, atol=nan,
                       pinv_rtol=nan if pinv_rtol is None else jnp.asarray(pinv_rtol, dtype),
                       consistency_rtol=nan, constraint_rtol=nan)  # fmt: skip

    term = diffrax.ODETerm(_with_unrolled_recursions(system, _state_derivative(system, config, numbers)))
    t0, t1 = state.t, state.t + jnp.asarray(dt, dtype)
    y0 = (state.q, state.qd)
    # one scenario's small factorizations as loops on the CPU, as ukjax.simulate traces them (Jansen's leg,
    # 200 RK4 steps in a lax.scan: 197 against 435 µs per step). A tree's per-body values stay together: the
    # parameters come from the caller whole (a loop over steps holds them as they are), and under a
    # caller's vmap values apart would cost a large batch 1.3x (multibody.per_body_values)
    with looped_factorizations(_loops_pay()):
        solver_state = solver.init(term, t0, t1, y0, params)
        (q, qd), *_ = solver.step(term, t0, t1, y0, params, solver_state, made_jump=False)
    return State(q=system.project(q), qd=qd, t=t1)
