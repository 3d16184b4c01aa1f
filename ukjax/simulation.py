"""Simulation: integrate a constrained system in time with diffrax and report what happened.

The state is y = (q, q̇) and the right-hand side is ``(q̇, q̈(q, q̇, t, p))`` with q̈ from the Udwadia-Kalaba
equation (:meth:`ukjax.system.System.acceleration`), or from the servo-constraint controller
(:func:`ukjax.control.closed_loop_acceleration`, seed 000 §III) when the system has an actuation matrix and
servo constraints. Constraint drift is the numerical integrator's doing, so the Baumgarte terms of the
constraints (φ̈ + 2αφ̇ + β²φ = 0, seeds 000 and 004 eq. 32; φ̈ + αφ̇ + βφ = 0, seed 001 eq. 52-54) decide
how well the constraints keep holding; every :class:`Solution` reports the residuals φ and φ̇/ψ at the saved
times next to the trajectory.

Integration (all keyword-only options of :func:`simulate`):

* **adaptive** (``dt0=None``, the default): ``diffrax.PIDController(rtol, atol)`` with an automatic first
  step; for accuracy studies.
* **fixed step** (``dt0`` given; ``dt`` is its former name): ``diffrax.ConstantStepSize`` with step
  ``dt0``; for throughput, above all in batches (see :func:`simulate_batch`).
* any diffrax ``stepsize_controller``, ``saveat=diffrax.SaveAt(ts=..., t0=..., t1=...)`` and ``adjoint`` are
  passed through, as in ``diffrax.diffeqsolve``.
* ``solver``: any diffrax solver; the default for both is ``diffrax.Tsit5()`` (explicit 5th-order Runge-Kutta,
  6 vector-field evaluations per step). diffrax has no classical RK4; ``diffrax.Heun()`` (2nd order) or
  ``diffrax.Bosh3()`` (3rd order) are cheaper fixed-step choices.
* ``max_steps``: bound on the number of steps (accepted + rejected); the default 65536 costs nothing unless
  reached (exactly the steps the span needs for a fixed step).

One step at a time, for control loops: :func:`ukjax.stepping.step`.

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

import contextlib
import dataclasses
import enum
import math
import os
import warnings
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import _validation as validate
from ukjax import dynamics
from ukjax._config import float64_enabled
from ukjax.constraints import stack_blocks
from ukjax.system import SOLVERS, System

DEFAULT_NUM_SAVES = 201
"""Number of evenly spaced save times when ``ts`` is not given."""

DEFAULT_MAX_STEPS = 65536

DEFAULT_CONSISTENCY_RTOL = 1e-6
"""A q̈ = b counts as consistent at a saved time when ‖A A⁺ b - b‖ <= consistency_rtol * (1 + ‖b‖).

Looser than the exact-arithmetic test of :mod:`ukjax._checks` because in a simulation the state drifts off
the constraint manifold by the integration error, and for redundant (rank-deficient) constraints the
Baumgarte terms of that drift, β²φ, are not exactly in the range of A: with φ ~ 1e-9 and β² ~ 1e2 that is
~1e-7 relative."""

DEFAULT_CONSTRAINT_ATOL = 1e-6
"""Default ``constraint_atol`` in float64 (float32: 1e4 eps ≈ 1.2e-3): how far, in each coordinate's own
unit, the state may be off a constraint surface and still count as "the constraints held": 1 µm for a
coordinate in metres, 1 µrad for an angle in radians; for velocity residuals 1 µm/s and 1 µrad/s. See
:class:`Solution` for the test it enters."""

DEFAULT_CONSTRAINT_RTOL = 1e-6
"""Default ``constraint_rtol`` in float64 (float32: 1e4 eps ≈ 1.2e-3): the part of the tolerance that grows
with the motion of the coordinates a constraint row touches, 1e-6 of how far they have moved from their
initial values (positions) and of their speed (velocities). Integration error of a stabilized system is far
below atol + rtol · that (adaptive Tsit5 at 1e-8: ~1e-9 m; fixed 5 ms steps on the SCARA with critically
damped gains: ~1e-8 m)."""

COORDINATE_RESOLUTION = 100
"""The absolute tolerance of coordinate j is constraint_atol_j + COORDINATE_RESOLUTION · eps · |q_j| (|q̇_j|
for velocities): the second term is the spacing of floating-point numbers near q_j times the rounding that
an integration accumulates, below which no constraint can be resolved. In float64 at |q_j| = 1e6 m that is
2.2e-8 m."""

DEFAULT_CPU_CHUNK = 256
"""Scenarios per chunk of :func:`simulate_batch` on CPU (``chunk_size="auto"``).

Under ``vmap`` every intermediate of an integration step is an array over the batch, hundreds of them alive;
past a few hundred scenarios they no longer fit the CPU caches. SCARA, fixed-step Tsit5, 200 steps, CPU
seconds per scenario-step on one core of the 2-core CPU (load ~3.5; ``benchmarks/throughput.py``): 1024
scenarios in one ``vmap`` 2.73 µs, in chunks of 512 / 256 / 128 / 64: 2.67 / 2.36 / 2.31 / 2.69 µs; 8192
scenarios in one ``vmap`` 4.23 µs, in chunks of 2048 / 1024 / 256: 3.74 / 2.70 / 2.33 µs. On an accelerator
the whole batch is one ``vmap`` (it wants large batches)."""

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
    constraint_violated = 6
    successful = 0  # alias of ``success``: the name of diffrax.RESULTS

    @staticmethod
    def message(code) -> str:
        return _MESSAGES[RESULTS(int(code))]


_MESSAGES = {
    RESULTS.success: "success",
    RESULTS.max_steps_reached: "the integrator took max_steps steps before reaching t1; raise max_steps",
    RESULTS.nonfinite_state: "the state or the acceleration became NaN or infinite (check the parameters: "
    "a mass matrix that is not positive definite, a NaN gain, a singular configuration)",
    RESULTS.inconsistent_constraints: "the constraints were inconsistent at a saved time: ‖A q̈ - b‖ = "
    "‖A A⁺ b - b‖ > consistency_rtol (1 + ‖b‖) (Liu et al. 2015, eq. 27); the acceleration is only a "
    "compromise (least squares with method='cholesky' or a reference method)",
    RESULTS.control_infeasible: "the servo constraints could not be met by the actuators at a saved time: "
    "(C B̄) u = b̄ has no solution (Liu et al. 2015, Assumption 3)",
    RESULTS.step_size_collapse: "the adaptive step size fell below DTMIN_FRACTION (t1 - t0): the vector "
    "field is non-finite or singular near the last accepted state",
    RESULTS.constraint_violated: "the constraints did not hold: a position or velocity residual, as a "
    "distance from the constraint surface in units of its tolerance, constraint_atol + constraint_rtol x "
    "(how far the coordinates it touches have moved, or their speed) (Solution.position_violation / "
    "velocity_violation), exceeded 1 at "
    "the last saved time, or, for a start on the constraints, at any saved time; stabilize (Baumgarte), "
    "shorten the step, or check that the constraints are compatible",
}
_MESSAGE_LIST = tuple(_MESSAGES[code] for code in RESULTS)
COMPLETED = tuple(
    int(code)
    for code in (
        RESULTS.success,
        RESULTS.constraint_violated,
        RESULTS.inconsistent_constraints,
        RESULTS.control_infeasible,
    )
)
"""Statuses of a run that reached t1 with a finite state (:attr:`Solution.completed`)."""


def as_params(params):
    """``params`` with every floating leaf a strongly typed JAX array of its own dtype (Python floats in the
    default float dtype); other leaves unchanged.

    ``jnp.array(1.0)`` and Python floats are *weakly typed*: a ``jax.jit`` compiled for them is compiled
    again when the same leaves come back strongly typed, e.g. after an optax update (three compilations of a
    tuning step instead of one). :func:`simulate` and :mod:`ukjax.tune` normalize their parameters with this
    function; call it on parameters you pass to your own jitted functions.
    """

    def strong(x):
        if isinstance(x, float) or (
            isinstance(x, jax.Array | np.ndarray | np.floating) and np.issubdtype(x.dtype, np.inexact)
        ):
            return jnp.asarray(x, dtype=jnp.result_type(x))
        return x  # integers, booleans, and what the input checks refuse by name (strings)

    return jax.tree_util.tree_map(strong, params)


class SimulationError(RuntimeError):
    """Raised by ``simulate(..., throw=True)``: the :class:`RESULTS` message of the scenario that failed."""


def _run(program, *args):
    """Call a compiled simulation; with ``throw=True`` its runtime error is re-raised here, at this call,
    with the status message alone (equinox's own traceback points at the call that first traced it)."""
    try:
        return program(*args)
    except eqx.EquinoxRuntimeError as error:
        text = str(error)
        message = max((m for m in _MESSAGE_LIST[1:] if m in text), key=len, default=text)
        raise SimulationError(f"ukjax.simulate: {message}") from None


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
        consistency: (T,) ‖A q̈ - b‖ of the passive constraints for the computed q̈; 0 exactly when b is
            consistent. With ``method="cholesky"`` or a reference method it equals ‖A A⁺ b - b‖ (seed 000
            eq. 27), the distance of b from range(A); the default ``"ldl"`` keeps the rows it can satisfy and
            reports a residual at least that large.
        position_violation, velocity_violation: (T,) the quantities the status is judged by: the worst
            constraint row's distance from its constraint surface in units of its own tolerance, so that
            values above 1 are violations (0 without such constraints); defined below.
        u, servo_residual: (T, n_u) controls and (T, k_s) servo-constraint residuals (controlled systems
            only, else None).
        status: int code, see :class:`RESULTS`.
        num_steps, num_accepted_steps: diffrax step counts.
        num_function_evals: right-hand-side evaluations, counted from the solver's stages (exact for fixed
            step; the adaptive first-step selection may add one or two); -1 for a solver whose count is not
            known.

    After a failure (status other than success, inconsistent_constraints, control_infeasible,
    constraint_violated) the values at saved times past the point of failure are not meaningful (diffrax
    fills them with inf).

    **How a constraint row is judged** (``position_violation``, ``velocity_violation``, status
    ``constraint_violated``). Each row is judged on its own scale, in the manner of diffrax's per-component
    ``atol + rtol·|y|``. A row φ_i of the holonomic constraints, with gradient a_i = ∂φ_i/∂q (a row of A),
    is off its surface φ_i = 0 by, to first order, |φ_i| / ‖a_i‖ in coordinate units, whatever units φ_i is
    written in (φ = x² + y² - L² and φ = √(x² + y²) - L give the same distance). In coordinates measured in
    units of their absolute tolerances, z_j = q_j / c_j with c_j = constraint_atol_j + COORDINATE_RESOLUTION
    · eps · |q_j|, that distance is |φ_i| / ‖a_i ⊙ c‖, and the row's tolerance there is 1 + constraint_rtol ·
    ‖Δz‖ over the coordinates the row touches (a_ij ≠ 0), Δz_j = (q_j(t) - q_j(t0)) / c_j. So

        v_i = |φ_i| / (‖a_i ⊙ c‖ (1 + constraint_rtol ‖(Δq_j / c_j) for a_ij ≠ 0‖)),

    and ``position_violation`` = max_i v_i.

    With one tolerance c for every coordinate this is the distance |φ_i| / ‖a_i‖ against c + constraint_rtol ·
    (how far the coordinates of the row have moved since t0, ‖Δq‖ over them): for a pendulum, 1 µm plus 1e-6
    of the distance its bob has travelled from its start. Velocity rows (φ̇_i, ψ_i, gradient ∂φ̇_i/∂q̇ = a_i
    or ∂ψ_i/∂q̇) are judged alike with q̇ in place of q and of Δq: tolerance constraint_atol (per second) +
    constraint_rtol · (the speed of the coordinates the row touches). The status is ``constraint_violated``
    when a violation exceeds 1 (see :func:`simulate`, ``constraint_rtol``, for which saved times count).

    Why this scale: a coordinate the row does not touch (a_ij = 0, e.g. a rotor turning at 314 rad/s beside a
    pendulum) enters neither the distance nor the tolerance. The relative part is measured from the start,
    not from the origin: a pendulum pivoted at x = 1e6 m is judged as one pivoted at 0 (its x moves by at most
    twice the rod's length), where a relative part |q_j| (as in diffrax) would allow 1 m of error. Only the
    floating-point resolution of q_j, COORDINATE_RESOLUTION · eps · |q_j|, depends on where the origin is
    (2.2e-8 m at 1e6 m in float64). Defaults (float64): a coordinate in metres may be 1 µm off its
    constraint surface and one in radians 1 µrad, plus 1e-6 of how far the row's coordinates have moved;
    give ``constraint_atol`` per coordinate (or by coordinate name) for systems in other units.
    """

    ts: jax.Array
    q: jax.Array
    qd: jax.Array
    qdd: jax.Array
    position_residual: jax.Array
    velocity_residual: jax.Array
    constraint_force: dynamics.ConstraintForce
    consistency: jax.Array
    position_violation: jax.Array
    velocity_violation: jax.Array
    u: jax.Array | None
    servo_residual: jax.Array | None
    status: jax.Array
    num_steps: jax.Array
    num_accepted_steps: jax.Array
    num_function_evals: jax.Array

    @property
    def ok(self) -> jax.Array:
        """True (per scenario) where the simulation succeeded and the constraints held (status success)."""
        return self.status == RESULTS.success

    @property
    def completed(self) -> jax.Array:
        """True (per scenario) where the integration reached t1 with a finite state, whether or not the
        constraints held: status success, constraint_violated, inconsistent_constraints or
        control_infeasible. The trajectory is then meaningful as a whole (a tuning objective that measures the
        violation needs exactly these scenarios)."""
        return jnp.isin(self.status, jnp.asarray(COMPLETED, self.status.dtype))

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

    def save(self, path) -> Path:
        """Write every array of this solution (batched or not) to a NumPy ``.npz`` file; returns its path.

        The file holds plain arrays named after the fields (``constraint_force.ideal``, ...) plus the ukjax
        version, so NumPy, pandas or another language can read it without ukjax. Written to a temporary file
        and renamed, so an interrupted save never leaves a half-written file. :meth:`load` reads it back.
        """
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        arrays = {"__format__": np.asarray(_SAVE_FORMAT)}
        for name, value in _solution_fields(self):
            if value is not None:
                arrays[name] = np.asarray(value)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        with open(partial, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(partial, path)
        return path

    @classmethod
    def load(cls, path) -> Solution:
        """Read a solution written by :meth:`save` (arrays come back as JAX arrays of the saved dtypes)."""
        with np.load(Path(path), allow_pickle=False) as data:
            if "__format__" not in data or str(data["__format__"]) != _SAVE_FORMAT:
                raise ValueError(f"{path} is not a ukjax Solution file (written by Solution.save)")
            values = {k: jnp.asarray(data[k]) for k in data.files if k != "__format__"}
        force = dynamics.ConstraintForce(
            ideal=values.pop("constraint_force.ideal"), nonideal=values.pop("constraint_force.nonideal")
        )
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(values) - {"constraint_force", "u", "servo_residual"}
        if missing:
            raise ValueError(f"{path}: missing fields {sorted(missing)}")
        return cls(constraint_force=force, **{k: values.get(k) for k in fields if k != "constraint_force"})


_SAVE_FORMAT = "ukjax.Solution/1"


def _solution_fields(solution: Solution):
    """(name, array or None) for every field; the constraint force as its two parts."""
    for field in dataclasses.fields(solution):
        value = getattr(solution, field.name)
        if isinstance(value, dynamics.ConstraintForce):
            yield f"{field.name}.ideal", value.ideal
            yield f"{field.name}.nonideal", value.nonideal
        else:
            yield field.name, value


# ---------------------------------------------------------------------- configuration (static under jit)
class _Config(eqx.Module):
    """Everything that changes the compiled program; hashable, so jit caches one program per configuration."""

    solver: Any = eqx.field(static=True)
    adaptive: bool = eqx.field(static=True)
    has_dt0: bool = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    method: str = eqx.field(static=True)
    uk_solver: str = eqx.field(static=True)
    default_pinv_rtol: bool = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    adjoint: Any = eqx.field(static=True)


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
    constraint_rtol: jax.Array
    controller: Any = None  # a user's stepsize_controller: its arrays traced, its other fields static
    constraint_atol: Any = None  # (n,) per-coordinate absolute tolerance of the status (see Solution)


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


def _motion(system, config, numbers, q, qd, t, p):
    """(q̈, passive motion record or None, closed-loop record or None) at one state.

    The ODE right-hand side and the diagnostics at the saved times both call this one function, so they
    share one UK solve per evaluation: the vector field uses q̈ only and XLA drops the rest there.
    """
    rtol = _pinv_rtol(config, numbers)
    if _is_controlled(system):
        from ukjax.control import closed_loop_acceleration

        loop = closed_loop_acceleration(system, q, qd, t, p, method=config.method, rtol=rtol)
        return loop.qdd, None, loop
    motion = system.motion(q, qd, t, p, method=config.method, solver=config.uk_solver, rtol=rtol)
    return motion.qdd, motion, None


def _state_derivative(system, config, numbers):
    """(t, (q, q̇), p) -> (q̇, q̈): the ODE right-hand side, shared by :func:`simulate` and
    :func:`ukjax.stepping.step`."""

    def derivative(t, y, p):
        q, qd = y
        return qd, _motion(system, config, numbers, q, qd, t, p)[0]

    return derivative


def _norm(r):
    """‖r‖ with derivative 0 (not NaN) at r = 0."""
    r2 = jnp.sum(r * r)
    positive = r2 > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0)


def _row_norms(x):
    """‖x_i‖ of every row, with derivative 0 (not NaN) at a zero row."""
    squares = jnp.sum(x * x, axis=-1)
    positive = squares > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squares, 1.0)), 0.0)


def _violation(residual, gradients, numbers, motion, value):
    """max_i of row i's distance from its constraint surface in units of its tolerance (:class:`Solution`):

        v_i = |r_i| / (‖a_i ⊙ c‖ (1 + rtol ‖(motion_j / c_j) for j with a_ij ≠ 0‖)),
        c_j = atol_j + COORDINATE_RESOLUTION eps |value_j|,

    for residuals r (k,), their gradients a (k, n) and the per-coordinate motion (q - q0, or q̇). A row of
    zero gradient (singular point) counts in units of the largest c_j."""
    eps = float(jnp.finfo(value.dtype).eps)
    c = numbers.constraint_atol + COORDINATE_RESOLUTION * eps * jnp.abs(value)
    touched = gradients != 0
    spread = _row_norms(jnp.where(touched, motion / c, 0.0))
    scale = _row_norms(gradients * c)
    scale = jnp.where(scale > 0, scale, jnp.max(c)) * (1.0 + numbers.constraint_rtol * spread)
    return jnp.max(jnp.abs(residual) / scale, initial=0.0)


def _diagnostics(system, config, numbers, q, qd, t, p, q0):
    """Everything a Solution reports at one saved time."""
    qdd, motion, loop = _motion(system, config, numbers, q, qd, t, p)
    rtol = _pinv_rtol(config, numbers)
    if motion is not None and motion.constraint_force is not None:
        force, A, b, rows = motion.constraint_force, motion.A, motion.b, motion.rows
    else:
        # Forces of the controlled or recursive motion (Liu et al. 2015, eq. 11-12), with the actuator force
        # as a given force: the one-shot UK equation, or the recursive solution where clearances make them
        # differ (System.constraint_force).
        Q = system.given_force(q, qd, t, p)
        if loop is not None:
            Q = Q + system.actuation(q, t, p) @ loop.u
        blocks = system.constraint_blocks(q, qd, t, p)
        A, b = stack_blocks(blocks, system.n, q.dtype)
        rows = tuple(A_k.shape[0] for A_k, _ in blocks)
        c = system.nonideal_vector(q, qd, t, p)
        if A.shape[0] == 0:
            zero = jnp.zeros_like(Q)
            force = dynamics.ConstraintForce(ideal=zero, nonideal=zero if c is None else c)
        else:
            force = system.constraint_force(
                q, qd, t, p, force=Q, method=config.method, solver=config.uk_solver, rtol=rtol
            )
    if config.uk_solver == "recursive" and A.shape[0] > 0:
        consistency = dynamics.constraint_consistency(A, b, rtol=rtol)
    else:
        consistency = _norm(A @ qdd - b)
    consistent = consistency <= numbers.consistency_rtol * (1.0 + _norm(b))
    position, velocity = system.residuals(q, qd, t, p)
    position_gradient, velocity_gradient = system.residual_gradients(A, rows)
    finite = jnp.all(jnp.isfinite(qdd)) & jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd))
    out = dict(
        qdd=qdd,
        position_residual=position,
        velocity_residual=velocity,
        position_violation=_violation(position, position_gradient, numbers, q - q0, q),
        velocity_violation=_violation(velocity, velocity_gradient, numbers, qd, qd),
        constraint_force=force,
        consistency=consistency,
        consistent=consistent,
        finite=finite,
        state_finite=jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd)),
    )
    if loop is not None:
        out.update(u=loop.u, servo_residual=loop.servo_residual, feasible=jnp.asarray(loop.feasible))
    return out


def _violated(position, velocity, tol=1.0):
    """The constraints did not hold: a violation (in units of its tolerance, :class:`Solution`) above tol at
    the last saved time, or, for a start on the constraints, at any saved time."""
    start_on = (position[0] <= tol) & (velocity[0] <= tol)
    end_off = (position[-1] > tol) | (velocity[-1] > tol)
    anywhere_off = jnp.any(position > tol) | jnp.any(velocity > tol)
    return end_off | (start_on & anywhere_off)


def _status(result, start_bad, diag):
    """The RESULTS code of one scenario from diffrax's result and the diagnostics at the saved times."""
    R = diffrax.RESULTS
    # A non-finite acceleration at a state the integrator reached (finite q, q̇) is nonfinite_state even when
    # the adaptive controller reported it as a step-size collapse.
    acceleration_bad = jnp.any(diag["state_finite"] & ~jnp.isfinite(diag["qdd"]).all(axis=-1))
    violated = _violated(diag["position_violation"], diag["velocity_violation"])
    checks = [
        (start_bad | (result == R.event_occurred) | acceleration_bad, RESULTS.nonfinite_state),
        (result == R.max_steps_reached, RESULTS.max_steps_reached),
        (result != R.successful, RESULTS.step_size_collapse),
        (~jnp.all(diag["finite"]), RESULTS.nonfinite_state),
        (~jnp.all(diag["consistent"]), RESULTS.inconsistent_constraints),
    ]
    if "feasible" in diag:
        checks.append((~jnp.all(diag["feasible"]), RESULTS.control_infeasible))
    checks.append((violated, RESULTS.constraint_violated))
    status = jnp.asarray(RESULTS.success, jnp.int32)
    for condition, code in reversed(checks):
        status = jnp.where(condition, jnp.int32(code), status)
    return status


@contextlib.contextmanager
def _runtime_checks_as_nan(active: bool):
    """While tracing, make equinox's ``error_if`` checks (diffrax has a few: dt0 sign, ts increasing) return
    NaN instead of calling back to the host, as ``EQX_ON_ERROR=nan`` would for the whole process.

    A program holding a host callback is never written to JAX's persistent compilation cache; ukjax checks
    the same conditions on the host before compiling (``ukjax._validation``). Uses equinox's module-level
    setting (``equinox._errors.EQX_ON_ERROR``, read at trace time); does nothing if a future equinox moves it.
    """
    import equinox._errors as errors

    previous = getattr(errors, "EQX_ON_ERROR", None)
    if not active or previous is None:
        yield
        return
    errors.EQX_ON_ERROR = "nan"
    try:
        yield
    finally:
        errors.EQX_ON_ERROR = previous


def _solve(system: System, config: _Config, numbers: _Numbers, q0, qd0, params) -> Solution:
    """One scenario: diffrax integration, post-processing at the saved times, status."""
    with _runtime_checks_as_nan(not config.throw):
        return _solve_traced(system, config, numbers, q0, qd0, params)


def _solve_traced(system, config, numbers, q0, qd0, params) -> Solution:
    dtype = jnp.result_type(q0)
    # Non-finite input (possible only when traced: concrete input is refused on the host) integrates nothing
    # instead of letting the adaptive controller reject max_steps steps of NaN.
    leaves = [x for x in jax.tree_util.tree_leaves(params) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    start_bad = ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in (q0, qd0, *leaves)]))

    motion = _state_derivative(system, config, numbers)

    def vector_field(t, y, p):
        qd, qdd = motion(t, y, p)
        return jnp.where(start_bad, 0.0, qd), jnp.where(start_bad, 0.0, qdd)

    def nonfinite(t, y, args, **kwargs):
        q, qd = y
        return ~(jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd)))

    if numbers.controller is not None:
        controller = numbers.controller
        dt0 = numbers.dt if config.has_dt0 else None
    elif config.adaptive:
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
        adjoint=config.adjoint,
        event=diffrax.Event(nonfinite),
        max_steps=config.max_steps,
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if config.progress else diffrax.NoProgressMeter(),
    )
    q, qd = sol.ys
    diag = jax.vmap(lambda t, q_, qd_: _diagnostics(system, config, numbers, q_, qd_, t, params, q0))(
        numbers.ts, q, qd
    )
    status = _status(sol.result, start_bad, diag)

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
        position_violation=diag["position_violation"],
        velocity_violation=diag["velocity_violation"],
        u=diag.get("u"),
        servo_residual=diag.get("servo_residual"),
        status=status,
        num_steps=num_steps,
        num_accepted_steps=jnp.asarray(sol.stats["num_accepted_steps"]),
        num_function_evals=evals,
    )
    if not config.throw:
        # No runtime error check in the program unless asked: host callbacks defeat JAX's persistent
        # compilation cache.
        return out
    return eqx.branched_error_if(out, status != RESULTS.success, status, _MESSAGE_LIST)


@eqx.filter_jit
def _simulate_one(system, config, numbers, q0, qd0, params):
    return _solve(system, config, numbers, q0, qd0, params)


@eqx.filter_jit
def _simulate_many(system, config, numbers, q0, qd0, params, chunk_size):
    solve = lambda q, qd, p: _solve(system, config, numbers, q, qd, p)
    batch = q0.shape[0]
    if chunk_size is None or chunk_size >= batch:
        return jax.vmap(solve)(q0, qd0, params)
    # Equal chunks of at most chunk_size scenarios: lax.map vmaps `solve` over one chunk and loops over them.
    # A batch that does not split evenly is padded with copies of its last scenario (fewer than `chunks`
    # of them, cut off again), so that one compiled chunk serves all (a remainder chunk would be a second
    # compilation of the whole solver).
    chunks = -(-batch // chunk_size)
    size = -(-batch // chunks)
    pad = chunks * size - batch
    padded = jax.tree_util.tree_map(
        lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x, (q0, qd0, params)
    )
    # The chunks are formed and undone with explicit shapes: ``lax.map(..., batch_size=)`` reshapes with -1,
    # which fails on the zero-size arrays of a system without position or velocity residuals (constraints
    # that are all AccelerationLevel, or none).
    split = lambda x: jnp.reshape(x, (chunks, size, *x.shape[1:]))
    out = jax.lax.map(lambda chunk: jax.vmap(solve)(*chunk), jax.tree_util.tree_map(split, padded))
    join = lambda x: jnp.reshape(x, (chunks * size, *x.shape[2:]))[:batch]
    return jax.tree_util.tree_map(join, out)


# ---------------------------------------------------------------------- options (checked before compiling)
_OPTIONS = (
    "t0", "t1", "ts", "solver", "dt0", "rtol", "atol", "max_steps", "method", "uk_solver", "pinv_rtol",
    "consistency_rtol", "constraint_rtol", "constraint_atol", "saveat", "stepsize_controller", "adjoint",
    "progress", "throw",
    "dt",
)


def _options(arguments: dict) -> dict:
    """The integration options among the arguments of :func:`simulate` / :func:`simulate_batch`."""
    return {name: arguments[name] for name in _OPTIONS}


def _prepare(
    system,
    q0,
    qd0,
    params,
    *,
    batched: bool,
    batch_params: bool = False,
    t0,
    t1,
    ts,
    solver,
    dt0,
    rtol,
    atol,
    max_steps,
    method,
    uk_solver,
    pinv_rtol,
    consistency_rtol,
    constraint_rtol,
    saveat,
    stepsize_controller,
    adjoint,
    progress,
    throw,
    dt,
    constraint_atol=None,
):
    """Check every argument on the host (``ukjax._validation``) and split them into config and numbers."""
    if dt0 is not None and dt is not None:
        raise ValueError("give the step as dt0 (or dt, its former name), not both")
    step_name = "dt" if dt0 is None else "dt0"
    dt = dt0 if dt0 is not None else dt
    if saveat is not None:
        if ts is not None:
            raise ValueError("give the save times as ts or as saveat, not both")
        ts = _times_of(saveat, t0, t1)
    controller = stepsize_controller
    if controller is not None and not isinstance(controller, diffrax.AbstractStepSizeController):
        raise TypeError(f"stepsize_controller must be a diffrax step-size controller, got {type(controller)}")
    fixed_step = controller is None and dt is not None or isinstance(controller, diffrax.ConstantStepSize)
    if fixed_step and dt is None:
        raise ValueError("stepsize_controller=diffrax.ConstantStepSize() needs the step: give dt0")
    if not isinstance(system, System):
        raise TypeError(f"system must be a ukjax.system.System, got {type(system).__name__}")
    if not float64_enabled():
        warnings.warn(
            "ukjax: float64 is not enabled, so this simulation runs in float32 (call ukjax.enable_float64() "
            "first for accuracy work)",
            stacklevel=3,
        )
    solver = validate.solver(solver, diffrax.Tsit5())
    q0, qd0 = validate.state(system.n, q0, qd0, batched=batched)
    params = as_params(params)
    # Times and tolerances take the state's dtype, so a float32 state is integrated in float32.
    dtype = q0.dtype
    if uk_solver not in SOLVERS:
        raise ValueError(f"uk_solver must be one of {SOLVERS}, got {uk_solver!r}")
    if method not in dynamics.ACCELERATION_METHODS:
        raise ValueError(f"method must be one of {dynamics.ACCELERATION_METHODS}, got {method!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")
    t0_value, t1_value = validate.host_float(t0), validate.host_float(t1)
    t0, t1 = validate.scalar(t0, "t0", dtype), validate.scalar(t1, "t1", dtype)
    ts = validate.save_times(t0, t1, ts, DEFAULT_NUM_SAVES, t0_value, t1_value)
    dt_value = None if dt is None else validate.host_float(dt)
    if dt is not None:
        dt = validate.scalar(dt, step_name, dtype, positive=True)
        if fixed_step:
            validate.fixed_step(t0_value, t1_value, dt_value)
    known = None not in (t0_value, t1_value, dt_value)
    if max_steps is None:
        # Fixed step: exactly the steps the span needs (+1 for the clipped last step), so reverse-mode memory
        # is what the trajectory needs; adaptive or traced times: DEFAULT_MAX_STEPS.
        fixed_known = fixed_step and known
        steps = validate.fixed_step_count(t0_value, t1_value, dt_value) if fixed_known else None
        max_steps = DEFAULT_MAX_STEPS if steps is None else steps + 1
    if adjoint is None:
        # Fixed step with a known step count: one checkpoint per step, so the backward pass recomputes each
        # step once (cost ~ forward + one step and its VJP per step; memory = the states of the trajectory).
        # Otherwise diffrax's default binomial checkpointing, O(sqrt(max_steps)) checkpoints.
        fixed = fixed_step and known
        adjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps if fixed else None)
    batch = q0.shape[0] if batched else None
    poisoned = validate.parameters(params, batched=batched and batch_params, batch=batch)
    if poisoned:
        warnings.warn("ukjax: " + "; ".join(poisoned) + " (those scenarios get status nonfinite_state)",
                      stacklevel=3)
    leaves = jax.tree_util.tree_leaves((q0, qd0, params))
    if t0_value is not None and all(validate.is_concrete(x) for x in leaves):
        # Eager even inside a user's jit over other arguments (there, JAX would otherwise trace these calls).
        with jax.ensure_compile_time_eval():
            t_start = jnp.asarray(t0_value, dtype)
            singular = uk_solver in dynamics.SINGULAR_MASS_FORMS
            if not batched:
                validate.model_at_start(system, q0, qd0, t_start, params, singular_mass=singular)
            else:
                k = validate.first_finite_scenario(q0, qd0, params if batch_params else None)
                if k is not None:
                    p_k = jax.tree_util.tree_map(lambda x: x[k], params) if batch_params else params
                    validate.model_at_start(system, q0[k], qd0[k], t_start, p_k, singular_mass=singular)
    eps = float(jnp.finfo(dtype).eps)
    if constraint_rtol is None:
        constraint_rtol = max(DEFAULT_CONSTRAINT_RTOL, 1e4 * eps)
    default_atol = max(DEFAULT_CONSTRAINT_ATOL, 1e4 * eps)
    constraint_atol = validate.coordinate_tolerance(
        constraint_atol, "constraint_atol", system, default_atol, dtype
    )
    if consistency_rtol is None:
        consistency_rtol = max(DEFAULT_CONSISTENCY_RTOL, math.sqrt(eps))
    config = _Config(
        solver=solver,
        adaptive=not fixed_step,
        has_dt0=dt is not None,
        max_steps=max_steps,
        method=method,
        uk_solver=uk_solver,
        default_pinv_rtol=pinv_rtol is None,
        progress=bool(progress),
        throw=bool(throw),
        adjoint=adjoint,
    )
    nan = jnp.asarray(math.nan, t0.dtype)
    numbers = _Numbers(
        ts=ts,
        t0=t0,
        t1=t1,
        dt=nan if dt is None else dt,
        rtol=validate.scalar(rtol, "rtol", dtype, positive=True),
        atol=validate.scalar(atol, "atol", dtype, positive=True),
        pinv_rtol=nan if pinv_rtol is None else validate.scalar(pinv_rtol, "pinv_rtol", dtype, positive=True),
        consistency_rtol=validate.scalar(consistency_rtol, "consistency_rtol", dtype, positive=True),
        constraint_rtol=validate.scalar(constraint_rtol, "constraint_rtol", dtype, nonnegative=True),
        controller=controller,
        constraint_atol=constraint_atol,
    )
    return config, numbers, q0, qd0, params


def _batched_by_spec(params, spec, batch: int | None):
    """``params`` with every leaf batched: leaves that ``spec`` marks shared (False/None) are broadcast to
    (batch, ...), those it marks batched (True/0) are checked to have the batch axis first."""
    if batch is None:
        raise ValueError("q0 must have shape (batch, n) for simulate_batch")
    flag_leaf = lambda x: x is None or isinstance(x, (bool, int, np.bool_))

    def apply(prefix, flag, subtree):
        if isinstance(flag, (bool, np.bool_)):
            batched = bool(flag)
        elif flag is None or (isinstance(flag, int) and flag == 0):
            batched = flag == 0
        else:
            raise ValueError(f"batch_params: a leaf of the spec must be True/0 (batched) or False/None "
                             f"(shared), got {flag!r}")

        def one(path, x):
            validate.numeric_parameter(f"params{jax.tree_util.keystr(prefix + path)}", x)
            x = jnp.asarray(x)
            if not batched:
                return jnp.broadcast_to(x, (batch, *x.shape))
            if x.ndim == 0 or x.shape[0] != batch:
                name = f"params{jax.tree_util.keystr(prefix + path)}"
                raise ValueError(f"batch_params marks {name} as batched, but its shape {x.shape} does not "
                                 f"start with the batch size {batch}")
            return x

        return jax.tree_util.tree_map_with_path(one, subtree)

    try:
        return jax.tree_util.tree_map_with_path(apply, spec, params, is_leaf=flag_leaf)
    except (TypeError, ValueError) as error:
        if "batch_params" in str(error):
            raise
        raise ValueError(f"batch_params must be a bool or a pytree prefix of params: {error}") from None


def _times_of(saveat, t0, t1):
    """The save times of a ``diffrax.SaveAt`` made of ``ts``, ``t0`` and ``t1`` (in the order t0, ts, t1)."""
    if not isinstance(saveat, diffrax.SaveAt):
        raise TypeError(f"saveat must be a diffrax.SaveAt, got {type(saveat).__name__}")
    sub = saveat.subs
    plain = diffrax.SaveAt(t1=True).subs
    if (not isinstance(sub, diffrax.SubSaveAt) or sub.steps or sub.fn is not plain.fn or saveat.dense
            or saveat.solver_state or saveat.controller_state or saveat.made_jump):
        raise ValueError(
            "saveat: ukjax computes its diagnostics at fixed save times, so only SaveAt(ts=..., t0=..., "
            "t1=...) is supported (not steps, dense, fn, subs or solver/controller state)"
        )
    parts = ([jnp.reshape(jnp.asarray(t0, float), (1,))] if sub.t0 else []) + (
        [jnp.asarray(sub.ts)] if sub.ts is not None else []
    ) + ([jnp.reshape(jnp.asarray(t1, float), (1,))] if sub.t1 else [])
    if not parts:
        raise ValueError("saveat saves nothing: give ts, t0=True or t1=True")
    return jnp.concatenate([jnp.ravel(x) for x in parts])


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
    dt0=None,
    rtol=1e-8,
    atol=1e-8,
    max_steps: int | None = None,
    method: str = "ldl",
    uk_solver: str = "uk",
    pinv_rtol=None,
    consistency_rtol=None,
    constraint_rtol=None,
    constraint_atol=None,
    saveat=None,
    stepsize_controller=None,
    adjoint=None,
    progress: bool = False,
    throw: bool = False,
    dt=None,
) -> Solution:
    """Integrate ``system`` from (q0, q̇0) at t0 to t1 with parameters ``params``; one compiled program.

    Arguments:
        system: a :class:`ukjax.system.System`.
        q0, qd0: (n,) initial coordinates and velocities. They need not satisfy the constraints (Xu & Liu
            2017 start off the constraint manifold on purpose); Baumgarte terms then pull the motion back.
        params: the parameter pytree passed to every function of the system; differentiable.
        t0, t1: start and end time (t1 > t0, both finite).
        ts: save times in [t0, t1], non-decreasing; default ``DEFAULT_NUM_SAVES`` evenly spaced.
        saveat: instead of ``ts``, a ``diffrax.SaveAt`` with ``ts``, ``t0`` and/or ``t1`` (diagnostics are
            computed at fixed save times, so ``steps``, ``dense`` and ``fn`` are refused).
        solver: a diffrax solver; default ``diffrax.Tsit5()`` (5th order, also for fixed step); also
            :class:`ukjax.RK4` (classical 4th-order Runge-Kutta, fixed step only: it has no error estimate).
            A name (any case) stands for a new instance: "Tsit5", "Dopri5", "Dopri8", "Heun", "Euler",
            "Bosh3", "Ralston", "Midpoint" (diffrax's) and "RK4" (ukjax's); another string is refused.
        dt0: as in ``diffrax.diffeqsolve``: without ``stepsize_controller``, the fixed step size
            (``diffrax.ConstantStepSize``), 0 < dt0 < t1 - t0; ``None`` = adaptive
            ``diffrax.PIDController(rtol, atol)``, which stops with ``step_size_collapse`` below
            ``DTMIN_FRACTION * (t1 - t0)``. With an adaptive ``stepsize_controller``, the first step
            (``None``: chosen automatically).
        dt: the former name of ``dt0``, still accepted (give one of the two).
        stepsize_controller: any diffrax step-size controller, used as given (then ``rtol``/``atol`` are
            unused); ``diffrax.ConstantStepSize()`` needs ``dt0``. Numbers inside it are part of the
            compiled program's cache key unless they are JAX arrays.
        rtol, atol: tolerances of the default adaptive controller (positive; ignored for fixed step).
        max_steps: step budget; reaching it gives status ``max_steps_reached``. ``None``: for a fixed step
            exactly ceil((t1 - t0)/dt) + 1, so reverse-mode memory is what the trajectory needs; otherwise
            ``DEFAULT_MAX_STEPS``. A new span or step then compiles a new program (the budget is static).
        method, uk_solver, pinv_rtol: how q̈ is computed (:meth:`System.acceleration` ``method``, ``solver``,
            ``rtol``); ``pinv_rtol`` (positive) is also the rank tolerance of the consistency residual.
            ``method="ldl"`` (default): Cholesky of M and an LDLᵀ generalized inverse of A M⁻¹Aᵀ, the fast
            form, exact for consistent constraints (redundant ones too); ``"cholesky"``: its Moore-Penrose
            inverse (least squares when b is inconsistent); a :data:`ukjax.linalg.PINV_METHODS` name: the
            reference form (Liu et al. 2015, eq. 13). ``uk_solver``: ``"uk"`` (one-shot), ``"recursive"``
            (Orsino 2017, eq. 4.14-4.18), ``"falco"`` / ``"phohomsiri"`` for a singular mass matrix (de
            Falco et al., eq. 41 and 42-43; rank [M; A] = n is checked at the start).
        consistency_rtol: status ``inconsistent_constraints`` when ‖A q̈ - b‖ > consistency_rtol (1 + ‖b‖)
            at any saved time; ``None``: ``DEFAULT_CONSISTENCY_RTOL`` (float64), √eps (float32).
        constraint_atol, constraint_rtol: the tolerance of the status ``constraint_violated``. A constraint
            row's first-order distance from its surface, |φ_i| / ‖∂φ_i/∂q‖ in coordinate units, may be
            constraint_atol + constraint_rtol · (how far the coordinates the row touches have moved since t0);
            a velocity residual constraint_atol (per second) + constraint_rtol · (their speed). With a
            tolerance per coordinate, the distance is measured in units of each coordinate's own
            (:class:`Solution` gives the exact test and why), and ``Solution.position_violation`` /
            ``velocity_violation`` is the worst row's distance in units of its tolerance. Only the coordinates
            a row touches count, and the origin does not. The status is ``constraint_violated`` when that
            exceeds 1 at the last saved time; for a start on the constraints (both at most 1 at the first
            saved time), also at any other saved time. A start off the constraints (as in Xu & Liu 2017) is
            judged by where it ends, since the Baumgarte transient that pulls it back passes through larger
            residuals, above all in velocity. ``constraint_atol``: a number (every coordinate), an (n,) array,
            or a dict from coordinate names (``System.coordinate_names``) to numbers, the others keeping the
            default; positive, in each coordinate's unit (metres, radians). ``None``:
            ``DEFAULT_CONSTRAINT_ATOL`` = 1e-6 (1 µm, 1 µrad; float32: 1e4 eps). ``constraint_rtol`` >= 0;
            ``None``: ``DEFAULT_CONSTRAINT_RTOL`` = 1e-6 (float32: 1e4 eps).
        adjoint: a diffrax adjoint for reverse-mode derivatives. ``None``: for a fixed step with known span,
            ``diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps)``: every step's state is kept and
            the backward pass recomputes each step once (memory = the trajectory's states, time ≈ forward +
            one step and its VJP per step); otherwise diffrax's default binomial checkpointing with
            O(sqrt(max_steps)) checkpoints (less memory, each step recomputed a few times).
        progress: show a tqdm progress bar (``diffrax.TqdmProgressMeter``).
        throw: raise :class:`SimulationError` with the :class:`RESULTS` message instead of returning a
            failure status (inside a user's ``jit`` it surfaces as equinox's runtime error). Only then
            does the program hold a runtime check (a host callback, which JAX's persistent compilation
            cache cannot store).

    Input errors raise ``ValueError`` naming the argument before anything is compiled (``ukjax._validation``):
    shapes, q0/qd0 that are not numbers, complex or non-finite q0/qd0/params and parameter leaves that are
    strings (the leaf is named), an unknown solver name, an empty batch, t0/t1/dt/tolerances that
    are not finite or not positive, dt not smaller than the span, ts outside [t0, t1]; the system is evaluated
    once at the initial state, so a missing parameter key, a model function with the wrong signature, or a
    mass matrix that is not symmetric positive definite is reported by name. Value checks need concrete
    arrays: inside a user's ``jit``/``vmap``/``grad`` the same problems give a status code instead.

    The compiled program is cached by (system, solver, fixed/adaptive, max_steps, method, uk_solver, adjoint,
    progress, throw, shapes): a second call that changes only numbers (q0, params, tolerances, and t1 or dt
    when ``max_steps`` is given) does not recompile.
    """
    options = _options(locals())
    config, numbers, q0, qd0, params = _prepare(system, q0, qd0, params, batched=False, **options)
    return _run(_simulate_one, system, config, numbers, q0, qd0, params)


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
    dt0=None,
    rtol=1e-8,
    atol=1e-8,
    max_steps: int | None = None,
    method: str = "ldl",
    uk_solver: str = "uk",
    pinv_rtol=None,
    consistency_rtol=None,
    constraint_rtol=None,
    constraint_atol=None,
    saveat=None,
    stepsize_controller=None,
    adjoint=None,
    progress: bool = False,
    throw: bool = False,
    dt=None,
    chunk_size="auto",
) -> Solution:
    """Simulate a batch of scenarios in ONE compiled call (``jax.jit`` of ``jax.vmap`` of :func:`simulate`).

    ``q0``, ``qd0`` have shape (batch, n), batch >= 1. ``batch_params`` says which leaves of ``params`` carry
    the batch axis first (one value per scenario), like ``in_axes`` of ``jax.vmap``: ``True`` (every leaf),
    ``False`` (none: all scenarios share ``params``), or a pytree prefix of ``params`` whose leaves are
    True/0 (batched) or False/None (shared), e.g. ``{"alpha": True, "beta": True, "mass": False}`` or
    ``{"gains": True, "model": None}``. Every array of the returned :class:`Solution` has the batch axis
    first; ``status`` is one code per scenario, so one failing scenario never stops the others.

    Speed: adaptive stepping under ``vmap`` runs in **lockstep**: the batch advances together and every
    scenario takes as many steps as the slowest one (diffrax keeps finished scenarios idle, not free). For
    throughput use a fixed step (``dt0=...``), where all scenarios cost the same; use adaptive stepping for
    accuracy. A progress bar (``progress=True``) follows the slowest scenario. Other arguments as in
    :func:`simulate`; the model is checked at the first scenario's initial state.

    ``chunk_size``: scenarios integrated together. The batch is split into equal chunks of at most
    ``chunk_size`` scenarios that one compiled loop integrates one after another (``jax.lax.map``; each chunk
    a ``vmap``, in lockstep only within itself; a batch that does not split evenly is padded with copies
    of its last scenario, fewer than the number of chunks, whose results are dropped), so the arrays of
    one right-hand-side evaluation stay in the CPU caches. ``"auto"`` (default): :data:`DEFAULT_CPU_CHUNK`
    on CPU, the whole batch on GPU/TPU; ``None``: the whole batch; an int >= 1. Every scenario gets the
    same result as in one ``vmap`` (the computation per scenario is the same); only speed and memory
    change. With several chunks a progress bar (``progress=True``) runs once per chunk.
    """
    options = _options(locals())
    chunk_size = _chunk_size(chunk_size)
    if not isinstance(batch_params, bool):
        params = _batched_by_spec(params, batch_params, np.shape(q0)[0] if np.ndim(q0) == 2 else None)
        batch_params = True
    config, numbers, q0, qd0, params = _prepare(
        system, q0, qd0, params, batched=True, batch_params=batch_params, **options
    )
    if not batch_params:
        # Shared parameters are broadcast, so shared and per-scenario parameters use one compiled program.
        params = _batched_by_spec(params, False, q0.shape[0])
    return _run(_simulate_many, system, config, numbers, q0, qd0, params, chunk_size)


def _chunk_size(chunk_size) -> int | None:
    """The chunk size of :func:`simulate_batch` (None: the whole batch) from its ``chunk_size`` argument."""
    if isinstance(chunk_size, str) and chunk_size == "auto":
        return DEFAULT_CPU_CHUNK if jax.default_backend() == "cpu" else None
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be 'auto', None or an int >= 1, got {chunk_size!r}")
    return int(chunk_size)
