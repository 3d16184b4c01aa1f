"""Simulation: integrate a constrained system in time with diffrax and report what happened.

The state is y = (q, q̇) and the right-hand side is ``(q̇, q̈(q, q̇, t, p))`` with q̈ from the Udwadia-Kalaba
equation (:meth:`ukjax.system.System.acceleration`), or from the servo-constraint controller
(:func:`ukjax.control.closed_loop_acceleration`, seed 000 §III) when the system has an actuation matrix and
servo constraints. Constraint drift is the numerical integrator's doing, so the Baumgarte terms of the
constraints (φ̈ + 2αφ̇ + β²φ = 0, seeds 000 and 004 eq. 32; φ̈ + αφ̇ + βφ = 0, seed 001 eq. 52-54) decide
how well the constraints keep holding; every :class:`Solution` reports the residuals φ and φ̇/ψ at the saved
times next to the trajectory.

Integration (all keyword-only options of :func:`simulate`):

* **adaptive** (``dt=None``, the default): ``diffrax.PIDController(rtol, atol)`` with an automatic first step;
  for accuracy studies.
* **fixed step** (``dt`` given): ``diffrax.ConstantStepSize`` with step ``dt``; for throughput, above all in
  batches (see :func:`simulate_batch`).
* ``solver``: any diffrax solver; the default for both is ``diffrax.Tsit5()`` (explicit 5th-order Runge-Kutta,
  6 vector-field evaluations per step). diffrax has no classical RK4; ``diffrax.Heun()`` (2nd order) or
  ``diffrax.Bosh3()`` (3rd order) are cheaper fixed-step choices.
* ``max_steps``: bound on the number of steps (accepted + rejected); the default 65536 costs nothing unless
  reached.

Failures never raise from inside diffrax (``throw=False`` there): they become a status code per scenario,
:class:`RESULTS`. ``simulate(..., throw=True)`` instead raises an ``equinox`` runtime error with the message
of the code (``eqx.branched_error_if``, which works under ``jit`` and ``vmap``).

Post-processing runs at the saved times only (``jax.vmap`` over ts, not inside the ODE): q̈, the constraint
force (ideal and non-ideal parts, seed 000 eq. 11-12, :func:`ukjax.dynamics.uk_constraint_force`), the
residuals, the consistency residual ‖A A⁺ b - b‖ of seed 000 eq. 27 and, for controlled systems, u(t) and
the servo residual.

Everything is differentiable with respect to ``params`` (diffrax's ``RecursiveCheckpointAdjoint``), so
``jax.grad`` of any scalar function of a :class:`Solution` gives derivatives with respect to masses, lengths
and Baumgarte gains.
"""

from __future__ import annotations

import enum
import math
import warnings
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import dynamics
from ukjax._config import float64_enabled
from ukjax.system import System

DEFAULT_NUM_SAVES = 201
"""Number of evenly spaced save times when ``ts`` is not given."""

DEFAULT_MAX_STEPS = 65536

DEFAULT_CONSISTENCY_RTOL = 1e-6
"""A q̈ = b counts as consistent at a saved time when ‖A A⁺ b - b‖ <= consistency_rtol * (1 + ‖b‖).

Looser than the exact-arithmetic test of :mod:`ukjax._checks` because in a simulation the state drifts off
the constraint manifold by the integration error, and for redundant (rank-deficient) constraints the
Baumgarte terms of that drift, β²φ, are not exactly in the range of A: with φ ~ 1e-9 and β² ~ 1e2 that is
~1e-7 relative."""

DTMIN_FRACTION = 1e-12
"""The adaptive controller stops with ``RESULTS.step_size_collapse`` below dt = DTMIN_FRACTION * (t1 - t0)."""


class RESULTS(enum.IntEnum):
    """Status code of one simulated scenario (``Solution.status``); ``RESULTS.message(code)`` explains it."""

    success = 0
    max_steps_reached = 1
    nonfinite_state = 2
    inconsistent_constraints = 3
    control_infeasible = 4
    step_size_collapse = 5

    @staticmethod
    def message(code) -> str:
        return _MESSAGES[RESULTS(int(code))]


_MESSAGES = {
    RESULTS.success: "success",
    RESULTS.max_steps_reached: "the integrator took max_steps steps before reaching t1; raise max_steps",
    RESULTS.nonfinite_state: "the state or the acceleration became NaN or infinite (check the parameters: "
    "a mass matrix that is not positive definite, a NaN gain, a singular configuration)",
    RESULTS.inconsistent_constraints: "the constraints were inconsistent at a saved time: ‖A A⁺ b - b‖ > "
    "consistency_rtol (1 + ‖b‖) (seed 000 eq. 27); the acceleration is only a least-squares compromise",
    RESULTS.control_infeasible: "the servo constraints could not be met by the actuators at a saved time: "
    "(C B̄) u = b̄ has no solution (seed 000 Assumption 3)",
    RESULTS.step_size_collapse: "the adaptive step size fell below DTMIN_FRACTION (t1 - t0): the vector "
    "field is non-finite or singular near the last accepted state",
}
_MESSAGE_LIST = tuple(_MESSAGES[code] for code in RESULTS)


class Solution(eqx.Module):
    """A simulated trajectory at the saved times ``ts`` (T of them), with diagnostics.

    Batched solutions (:func:`simulate_batch`) carry a leading batch axis on every array.

    Attributes:
        ts: (T,) saved times.
        q, qd, qdd: (T, n) coordinates, velocities and accelerations.
        position_residual: (T, k_h) φ of every holonomic constraint.
        velocity_residual: (T, k_v) φ̇ of every holonomic and ψ of every nonholonomic constraint.
        constraint_force: :class:`ukjax.dynamics.ConstraintForce` with ``ideal``, ``nonideal`` and
            ``total``, each (T, n): the force of the passive constraints, seed 000 eq. 11-12
            (``M q̈ = Q [+ B u] + total``).
        consistency: (T,) ‖A A⁺ b - b‖ of the passive constraints (seed 000 eq. 27); 0 when consistent.
        u, servo_residual: (T, n_u) controls and (T, k_s) servo-constraint residuals (controlled systems
            only, else None).
        status: int code, see :class:`RESULTS`.
        num_steps, num_accepted_steps: diffrax step counts.
        num_function_evals: right-hand-side evaluations, counted from the solver's stages (exact for fixed
            step; the adaptive first-step selection may add one or two); -1 for a solver whose count is not
            known.

    After a failure (status other than success, inconsistent_constraints, control_infeasible) the values at
    saved times past the point of failure are not meaningful (diffrax fills them with inf).
    """

    ts: jax.Array
    q: jax.Array
    qd: jax.Array
    qdd: jax.Array
    position_residual: jax.Array
    velocity_residual: jax.Array
    constraint_force: dynamics.ConstraintForce
    consistency: jax.Array
    u: jax.Array | None
    servo_residual: jax.Array | None
    status: jax.Array
    num_steps: jax.Array
    num_accepted_steps: jax.Array
    num_function_evals: jax.Array

    @property
    def ok(self) -> jax.Array:
        """True (per scenario) where the simulation succeeded."""
        return self.status == RESULTS.success

    @property
    def message(self) -> str | list[str]:
        """The message of the status code; a list of messages for a batch."""
        status = np.asarray(self.status)
        if status.ndim == 0:
            return RESULTS.message(status)
        return [RESULTS.message(code) for code in status.ravel()]

    @property
    def max_position_residual(self) -> jax.Array:
        """max over saved times of ‖φ‖∞ (0 without holonomic constraints)."""
        return jnp.max(jnp.abs(self.position_residual), axis=(-2, -1), initial=0.0)

    @property
    def max_velocity_residual(self) -> jax.Array:
        """max over saved times of ‖(φ̇, ψ)‖∞ (0 without velocity-level residuals)."""
        return jnp.max(jnp.abs(self.velocity_residual), axis=(-2, -1), initial=0.0)


# ---------------------------------------------------------------------- configuration (static under jit)
class _Config(eqx.Module):
    """Everything that changes the compiled program; hashable, so jit caches one program per configuration."""

    solver: Any = eqx.field(static=True)
    adaptive: bool = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    method: str = eqx.field(static=True)
    uk_solver: str = eqx.field(static=True)
    default_pinv_rtol: bool = eqx.field(static=True)
    progress: bool = eqx.field(static=True)


class _Numbers(eqx.Module):
    """Every number that does not change the compiled program: traced, so changing it does not recompile."""

    ts: jax.Array
    t0: jax.Array
    t1: jax.Array
    dt: jax.Array
    rtol: jax.Array
    atol: jax.Array
    pinv_rtol: jax.Array
    consistency_rtol: jax.Array
    throw: jax.Array


def _evals_per_step(solver) -> tuple[int, int]:
    """(evaluations per step, extra at the start) for explicit Runge-Kutta solvers; (-1, 0) else."""
    if isinstance(solver, diffrax.Euler):
        return 1, 0
    if isinstance(solver, diffrax.AbstractERK):
        stages = len(solver.tableau.c) + 1
        return (stages - 1, 1) if solver.tableau.fsal else (stages, 0)
    return -1, 0


def _is_controlled(system: System) -> bool:
    return system.actuation is not None and bool(system.servo_constraints)


def _pinv_rtol(config, numbers):
    return None if config.default_pinv_rtol else numbers.pinv_rtol


def _acceleration(system, config, numbers, q, qd, t, p):
    """q̈ and, for controlled systems, the closed-loop record (u, servo residual, feasible)."""
    rtol = _pinv_rtol(config, numbers)
    if _is_controlled(system):
        from ukjax.control import closed_loop_acceleration

        loop = closed_loop_acceleration(system, q, qd, t, p, method=config.method, rtol=rtol)
        return loop.qdd, loop
    return system.acceleration(q, qd, t, p, method=config.method, solver=config.uk_solver, rtol=rtol), None


def _diagnostics(system, config, numbers, q, qd, t, p):
    """Everything a Solution reports at one saved time."""
    qdd, loop = _acceleration(system, config, numbers, q, qd, t, p)
    rtol = _pinv_rtol(config, numbers)
    Q = system.given_force(q, qd, t, p)
    if loop is not None:
        Q = Q + system.actuation(q, t, p) @ loop.u
    A, b = system.constraint_equations(q, qd, t, p)
    c = system.nonideal_vector(q, qd, t, p)
    if A.shape[0] == 0:
        # No passive constraint: no ideal force, the non-ideal force is c itself (B⁺B = 0 in seed 000 eq. 12).
        zero = jnp.zeros_like(Q)
        force = dynamics.ConstraintForce(ideal=zero, nonideal=zero if c is None else c)
        consistency = jnp.zeros((), Q.dtype)
    else:
        force = system.constraint_force(
            q, qd, t, p, force=Q, method=config.method, solver=config.uk_solver, rtol=rtol
        )
        consistency = dynamics.constraint_consistency(A, b, rtol=rtol)
    consistent = consistency <= numbers.consistency_rtol * (1.0 + jnp.linalg.norm(b))
    position, velocity = system.residuals(q, qd, t, p)
    finite = jnp.all(jnp.isfinite(qdd)) & jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd))
    out = dict(
        qdd=qdd,
        position_residual=position,
        velocity_residual=velocity,
        constraint_force=force,
        consistency=consistency,
        consistent=consistent,
        finite=finite,
    )
    if loop is not None:
        out.update(u=loop.u, servo_residual=loop.servo_residual, feasible=jnp.asarray(loop.feasible))
    return out


def _solve(system: System, config: _Config, numbers: _Numbers, q0, qd0, params) -> Solution:
    """One scenario: diffrax integration, post-processing at the saved times, status."""
    dtype = jnp.result_type(q0)
    qdd0, _ = _acceleration(system, config, numbers, q0, qd0, numbers.t0, params)
    start_bad = ~(jnp.all(jnp.isfinite(qdd0)) & jnp.all(jnp.isfinite(q0)) & jnp.all(jnp.isfinite(qd0)))

    def vector_field(t, y, p):
        q, qd = y
        qdd, _ = _acceleration(system, config, numbers, q, qd, t, p)
        # A scenario that is non-finite from the start integrates nothing (status nonfinite_state) instead of
        # letting the adaptive controller reject max_steps steps of NaN.
        return jnp.where(start_bad, 0.0, qd), jnp.where(start_bad, 0.0, qdd)

    def nonfinite(t, y, args, **kwargs):
        q, qd = y
        return start_bad | ~(jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd)))

    if config.adaptive:
        controller = diffrax.PIDController(
            rtol=numbers.rtol,
            atol=numbers.atol,
            dtmin=DTMIN_FRACTION * (numbers.t1 - numbers.t0),
            force_dtmin=False,
        )
        dt0 = None
    else:
        controller = diffrax.ConstantStepSize()
        dt0 = numbers.dt
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field),
        config.solver,
        numbers.t0,
        numbers.t1,
        dt0,
        (q0, qd0),
        params,
        saveat=diffrax.SaveAt(ts=numbers.ts),
        stepsize_controller=controller,
        event=diffrax.Event(nonfinite),
        max_steps=config.max_steps,
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if config.progress else diffrax.NoProgressMeter(),
    )
    q, qd = sol.ys
    diag = jax.vmap(lambda t, q_, qd_: _diagnostics(system, config, numbers, q_, qd_, t, params))(
        numbers.ts, q, qd
    )

    result = sol.result
    status = jnp.where(
        start_bad | (result == diffrax.RESULTS.event_occurred),
        RESULTS.nonfinite_state,
        jnp.where(
            result == diffrax.RESULTS.max_steps_reached,
            RESULTS.max_steps_reached,
            jnp.where(
                result == diffrax.RESULTS.dt_min_reached,
                RESULTS.step_size_collapse,
                jnp.where(
                    ~jnp.all(diag["finite"]),
                    RESULTS.nonfinite_state,
                    jnp.where(
                        ~jnp.all(diag["consistent"]), RESULTS.inconsistent_constraints, RESULTS.success
                    ),
                ),
            ),
        ),
    )
    if "feasible" in diag:
        status = jnp.where(
            (status == RESULTS.success) & ~jnp.all(diag["feasible"]), RESULTS.control_infeasible, status
        )
    status = jnp.where(
        (status == RESULTS.success) & ~(result == diffrax.RESULTS.successful),
        RESULTS.step_size_collapse,
        status,
    ).astype(jnp.int32)

    per_step, extra = _evals_per_step(config.solver)
    num_steps = jnp.asarray(sol.stats["num_steps"])
    evals = jnp.full_like(num_steps, -1) if per_step < 0 else per_step * num_steps + extra
    out = Solution(
        ts=numbers.ts.astype(dtype),
        q=q,
        qd=qd,
        qdd=diag["qdd"],
        position_residual=diag["position_residual"],
        velocity_residual=diag["velocity_residual"],
        constraint_force=diag["constraint_force"],
        consistency=diag["consistency"],
        u=diag.get("u"),
        servo_residual=diag.get("servo_residual"),
        status=status,
        num_steps=num_steps,
        num_accepted_steps=jnp.asarray(sol.stats["num_accepted_steps"]),
        num_function_evals=evals,
    )
    return eqx.branched_error_if(out, numbers.throw & (status != RESULTS.success), status, _MESSAGE_LIST)


@eqx.filter_jit
def _simulate_one(system, config, numbers, q0, qd0, params):
    return _solve(system, config, numbers, q0, qd0, params)


@eqx.filter_jit
def _simulate_many(system, config, numbers, q0, qd0, params):
    return jax.vmap(lambda q, qd, p: _solve(system, config, numbers, q, qd, p))(q0, qd0, params)


# ---------------------------------------------------------------------- input checks (before integration)
def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _scalar(x, name, dtype):
    x = jnp.asarray(x, dtype=dtype)
    if x.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got shape {x.shape}")
    return x


def _check_state(system: System, q0, qd0, batched: bool):
    q0, qd0 = jnp.asarray(q0), jnp.asarray(qd0)
    if not (jnp.issubdtype(q0.dtype, jnp.floating) and q0.dtype == qd0.dtype):
        q0, qd0 = q0.astype(jnp.result_type(float)), qd0.astype(jnp.result_type(float))
    expected = "(batch, n)" if batched else "(n,)"
    ndim = 2 if batched else 1
    if q0.ndim != ndim or qd0.ndim != ndim or q0.shape != qd0.shape or q0.shape[-1] != system.n:
        raise ValueError(
            f"q0 and qd0 must both have shape {expected} with n = {system.n}; got q0.shape={q0.shape}, "
            f"qd0.shape={qd0.shape}"
        )
    for name, x in (("q0", q0), ("qd0", qd0)):
        if _is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
            raise ValueError(f"{name} has NaN or infinite entries: {np.asarray(x)}")
    return q0, qd0


def _save_times(t0, t1, ts):
    concrete = _is_concrete(t0) and _is_concrete(t1)
    if concrete and not float(t1) > float(t0):
        raise ValueError(f"t1 must be larger than t0, got t0={float(t0)}, t1={float(t1)}")
    if ts is None:
        return jnp.linspace(t0, t1, DEFAULT_NUM_SAVES)
    ts = jnp.asarray(ts, dtype=t0.dtype)
    if ts.ndim != 1 or ts.shape[0] < 1:
        raise ValueError(f"ts must be a non-empty vector of save times, got shape {ts.shape}")
    if concrete and _is_concrete(ts):
        values = np.asarray(ts)
        if values.min() < float(t0) or values.max() > float(t1):
            raise ValueError(
                f"ts must lie in [t0, t1] = [{float(t0)}, {float(t1)}], got [{values.min()}, {values.max()}]"
            )
        if np.any(np.diff(values) < 0):
            raise ValueError("ts must be non-decreasing")
    return ts


_OPTIONS = (
    "t0", "t1", "ts", "solver", "dt", "rtol", "atol", "max_steps", "method", "uk_solver", "pinv_rtol",
    "consistency_rtol", "progress", "throw",
)


def _options(arguments: dict) -> dict:
    """The integration options among the arguments of :func:`simulate` / :func:`simulate_batch`."""
    return {name: arguments[name] for name in _OPTIONS}


def _prepare(
    system,
    q0,
    qd0,
    *,
    batched: bool,
    t0,
    t1,
    ts,
    solver,
    dt,
    rtol,
    atol,
    max_steps,
    method,
    uk_solver,
    pinv_rtol,
    consistency_rtol,
    progress,
    throw,
):
    if not isinstance(system, System):
        raise TypeError(f"system must be a ukjax.system.System, got {type(system).__name__}")
    if not float64_enabled():
        warnings.warn(
            "ukjax: float64 is not enabled, so this simulation runs in float32 (call ukjax.enable_float64() "
            "first for accuracy work)",
            stacklevel=3,
        )
    q0, qd0 = _check_state(system, q0, qd0, batched=batched)
    # Times and tolerances take the state's dtype, so a float32 state is integrated in float32.
    dtype = q0.dtype
    if uk_solver not in ("uk", "recursive"):
        raise ValueError(f"uk_solver must be 'uk' or 'recursive', got {uk_solver!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
    t0, t1 = _scalar(t0, "t0", dtype), _scalar(t1, "t1", dtype)
    ts = _save_times(t0, t1, ts)
    if dt is not None:
        dt = _scalar(dt, "dt", dtype)
        if _is_concrete(dt) and not float(dt) > 0:
            raise ValueError(f"dt must be positive, got {float(dt)}")
    config = _Config(
        solver=diffrax.Tsit5() if solver is None else solver,
        adaptive=dt is None,
        max_steps=max_steps,
        method=method,
        uk_solver=uk_solver,
        default_pinv_rtol=pinv_rtol is None,
        progress=bool(progress),
    )
    nan = jnp.asarray(math.nan, t0.dtype)
    numbers = _Numbers(
        ts=ts,
        t0=t0,
        t1=t1,
        dt=nan if dt is None else dt,
        rtol=_scalar(rtol, "rtol", dtype),
        atol=_scalar(atol, "atol", dtype),
        pinv_rtol=nan if pinv_rtol is None else _scalar(pinv_rtol, "pinv_rtol", dtype),
        consistency_rtol=_scalar(consistency_rtol, "consistency_rtol", dtype),
        throw=jnp.asarray(bool(throw)),
    )
    return config, numbers, q0, qd0


def simulate(
    system: System,
    q0,
    qd0,
    params,
    *,
    t0=0.0,
    t1,
    ts=None,
    solver=None,
    dt=None,
    rtol=1e-8,
    atol=1e-8,
    max_steps: int = DEFAULT_MAX_STEPS,
    method: str = "cholesky",
    uk_solver: str = "uk",
    pinv_rtol=None,
    consistency_rtol=DEFAULT_CONSISTENCY_RTOL,
    progress: bool = False,
    throw: bool = False,
) -> Solution:
    """Integrate ``system`` from (q0, q̇0) at t0 to t1 with parameters ``params``; one compiled program.

    Arguments:
        system: a :class:`ukjax.system.System`.
        q0, qd0: (n,) initial coordinates and velocities. They need not satisfy the constraints (seed 001
            starts off the constraint manifold on purpose); Baumgarte terms then pull the motion back.
        params: the parameter pytree passed to every function of the system; differentiable.
        t0, t1: start and end time (t1 > t0).
        ts: save times in [t0, t1], non-decreasing; default ``DEFAULT_NUM_SAVES`` evenly spaced.
        solver: a diffrax solver; default ``diffrax.Tsit5()`` (5th order, also for fixed step).
        dt: fixed step size (``diffrax.ConstantStepSize``); ``None`` = adaptive ``diffrax.PIDController(rtol,
            atol)``, which stops with ``step_size_collapse`` below ``DTMIN_FRACTION * (t1 - t0)``.
        rtol, atol: tolerances of the adaptive controller (ignored for fixed step).
        max_steps: step budget; reaching it gives status ``max_steps_reached``.
        method, uk_solver, pinv_rtol: how q̈ is computed (:meth:`System.acceleration` ``method``, ``solver``,
            ``rtol``); ``pinv_rtol`` is also the rank tolerance of the consistency residual.
        consistency_rtol: status ``inconsistent_constraints`` when ‖A A⁺ b - b‖ > consistency_rtol (1 + ‖b‖)
            at any saved time (see ``DEFAULT_CONSISTENCY_RTOL``).
        progress: show a tqdm progress bar (``diffrax.TqdmProgressMeter``).
        throw: raise (``equinox`` runtime error carrying the :class:`RESULTS` message) instead of returning a
            failure status.

    Input errors raise ``ValueError`` before anything is integrated: q0/qd0 not of shape (n,), NaN or inf in
    q0/qd0 (checked when they are concrete arrays, i.e. not inside a user's ``jit``/``vmap``/``grad`` of them;
    traced non-finite input gives status ``nonfinite_state``), constraint or model functions returning the
    wrong shape (at trace time), t1 <= t0, ts outside [t0, t1] (when concrete).

    The compiled program is cached by (system, solver, fixed/adaptive, max_steps, method, uk_solver, progress,
    shapes): a second call that changes only numbers (q0, params, t1, dt, tolerances) does not
    recompile.
    """
    config, numbers, q0, qd0 = _prepare(system, q0, qd0, batched=False, **_options(locals()))
    return _simulate_one(system, config, numbers, q0, qd0, params)


def simulate_batch(
    system: System,
    q0,
    qd0,
    params,
    *,
    batch_params: bool = False,
    t0=0.0,
    t1,
    ts=None,
    solver=None,
    dt=None,
    rtol=1e-8,
    atol=1e-8,
    max_steps: int = DEFAULT_MAX_STEPS,
    method: str = "cholesky",
    uk_solver: str = "uk",
    pinv_rtol=None,
    consistency_rtol=DEFAULT_CONSISTENCY_RTOL,
    progress: bool = False,
    throw: bool = False,
) -> Solution:
    """Simulate a batch of scenarios in ONE compiled call (``jax.jit`` of ``jax.vmap`` of :func:`simulate`).

    ``q0``, ``qd0`` have shape (batch, n); with ``batch_params=True`` every leaf of ``params`` also has the
    batch axis first (one parameter set per scenario), otherwise all scenarios share ``params``. Every array
    of the returned :class:`Solution` has the batch axis first; ``status`` is one code per scenario, so one
    failing scenario never stops the others.

    Speed: adaptive stepping under ``vmap`` runs in **lockstep**: the batch advances together and every
    scenario takes as many steps as the slowest one (diffrax keeps finished scenarios idle, not free). For
    throughput use a fixed step (``dt=...``), where all scenarios cost the same; use adaptive stepping for
    accuracy. A progress bar (``progress=True``) follows the slowest scenario. Other arguments as in
    :func:`simulate`.
    """
    config, numbers, q0, qd0 = _prepare(system, q0, qd0, batched=True, **_options(locals()))
    if batch_params:
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            shape = jnp.shape(leaf)
            if not shape or shape[0] != q0.shape[0]:
                raise ValueError(
                    f"batch_params=True needs every params leaf to have the batch size {q0.shape[0]} as "
                    f"its first axis; leaf {jax.tree_util.keystr(path)} has shape {shape}"
                )
    else:
        # Shared parameters are broadcast, so shared and per-scenario parameters use one compiled program.
        params = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (q0.shape[0], *jnp.shape(x))), params)
    return _simulate_many(system, config, numbers, q0, qd0, params)
