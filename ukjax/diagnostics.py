"""Whether to trust a trajectory: the diagnostics at the saved times and the status code they decide.

At every saved time, from the state and the q̈ the integrator used there, :func:`_diagnostics` evaluates
the constraint force, ideal and non-ideal parts (Liu et al. 2015, seed 000 eq. 11-12,
:func:`ukjax.dynamics.uk_constraint_force`); the consistency residual ‖A q̈ - b‖, which for the
Moore-Penrose forms is ‖A A⁺ b - b‖, the distance of b from range(A) (seed 000 eq. 27), and counts as
consistent up to ``consistency_rtol`` (1 + ‖b‖); the residuals φ (positions) and φ̇/ψ (velocities); and from
them the violations, each constraint row's first-order distance from its surface in units of its own
tolerance:

    v_i = |r_i| / (‖a_i ⊙ c‖ (1 + constraint_rtol ‖(motion_j / c_j) for a_ij ≠ 0‖)),
    c_j = constraint_atol_j + COORDINATE_RESOLUTION eps |value_j|,

for the row's residual r_i and gradient a_i, with the motion q - q0 and the value q for positions, q̇ and q̇
for velocities (the test, and why it is scaled so: :class:`~ukjax.solution.Solution`).

:func:`_status` turns diffrax's result and these diagnostics into one :class:`~ukjax.solution.RESULTS` code
per scenario, the first that applies of: a non-finite start, state or acceleration; the step budget
reached; a step-size collapse; a non-finite value at a saved time; inconsistent constraints; infeasible
servo constraints; constraints that did not hold (:func:`_violated`: a violation above 1 at the last saved
time or, for a start on the constraints, at any saved time; a start off them, as in Xu & Liu 2017, is
judged by where it ends).

The default tolerances of these tests are here too: :func:`~ukjax.simulation.simulate` uses them when its
``consistency_rtol``, ``constraint_atol`` or ``constraint_rtol`` is ``None``.

Stated ranges. A System may carry ranges of its coordinates as data (``System.coordinate_ranges``, e.g. the
joint limits of a robot file, :meth:`ukjax.robots.Robot.system`); they are not enforced, and leaving them
does not change the status (the integration itself succeeded). :func:`range_violations` checks a solution
against them afterwards and names each coordinate that left its range, when it first did and by how much
(:class:`RangeViolation`); :func:`range_excess` is the same check reduced to one number per range, a JAX
function for use on the device (a sweep's metrics).
"""

from __future__ import annotations

from typing import NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import dynamics
from ukjax.constraints import stack_blocks
from ukjax.solution import RESULTS

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
:class:`~ukjax.solution.Solution` for the test it enters."""

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
    """max_i of row i's distance from its constraint surface in units of its tolerance
    (:class:`~ukjax.solution.Solution`):

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


def _position_motion(system, q, q0):
    """(motion, value) of every coordinate of the velocity for the position tolerance of
    :func:`_violation`: q - q0 and q, or on a configuration manifold (``System.retract``) their first-order
    chart coordinates N⁺(q - q0) and N⁺q with N = ∂(q ⊕ δ)/∂δ at δ = 0 (nq x n) and N⁺ = (NᵀN)⁻¹Nᵀ. For a
    unit quaternion N⁺(q - q0) = 2 sin(θ/2) e, θ and e the angle and axis turned since t0, and N⁺q = 0: an
    orientation is resolved to eps whatever it is."""
    if system.retract is None:
        return q - q0, q
    N = jax.jacfwd(lambda d: system.retract(q, d))(jnp.zeros(system.n, q.dtype))
    local = jnp.linalg.solve(N.T @ N, N.T @ jnp.stack([q - q0, q], axis=1))
    return local[:, 0], local[:, 1]


def _diagnostics(system, config, numbers, q, qd, t, p, q0, found, rtol):
    """Everything a Solution reports at one saved time, from what the right-hand side found at that state:
    ``found`` = (q̈, passive motion record or None, closed-loop record or None) of
    ``ukjax.simulation._motion``, and ``rtol`` the rank tolerance it used (None: each method's default)."""
    qdd, motion, loop = found
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
        position_violation=_violation(position, position_gradient, numbers, *_position_motion(system, q, q0)),
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
    """The constraints did not hold: a violation (in units of its tolerance,
    :class:`~ukjax.solution.Solution`) above tol at the last saved time, or, for a start on the constraints,
    at any saved time."""
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


# ---------------------------------------------------------------------------------------------- stated ranges
def _ranges(ranges) -> tuple[tuple[int, str, float, float], ...]:
    """``(index into q, name, lower, upper)`` of each range: ``ranges`` itself, or the ``coordinate_ranges``
    of a :class:`~ukjax.System` or :class:`~ukjax.robots.Robot`."""
    return tuple(getattr(ranges, "coordinate_ranges", ranges))


def _beyond(x, lower, upper, xp):
    """Distance of x beyond [lower, upper] (0 inside, and where x is not finite), with ``xp`` NumPy or
    jax.numpy."""
    return xp.where(xp.isfinite(x), xp.maximum(xp.maximum(lower - x, x - upper), 0.0), 0.0)


def range_excess(q, ranges) -> jax.Array:
    """How far each coordinate went beyond its stated range: for q of shape (..., T, nq) (one trajectory's
    saved coordinates, or a batch of them) and the ranges ``(index, name, lower, upper)`` (or a System or
    Robot carrying them), the array (..., k) of max over saved times of max(lower - q_i, q_i - upper, 0),
    one per range, in the coordinate's unit (rad or m); 0 where the coordinate stayed in its range.
    Non-finite values (saved times after a failure, :class:`~ukjax.solution.Solution`) count as 0.
    A JAX function: it runs inside ``jit`` and ``vmap``."""
    ranges = _ranges(ranges)
    q = jnp.asarray(q)
    if not ranges:
        return jnp.zeros((*q.shape[:-2], 0), q.dtype)
    index = jnp.asarray([r[0] for r in ranges])
    lower = jnp.asarray([r[2] for r in ranges], q.dtype)
    upper = jnp.asarray([r[3] for r in ranges], q.dtype)
    return jnp.max(_beyond(q[..., index], lower, upper, jnp), axis=-2)


class RangeViolation(NamedTuple):
    """A coordinate that left its stated range in one scenario (:func:`range_violations`).

    Attributes:
        name: the coordinate's name (a robot's joint).
        coordinate: its index in q.
        scenario: the index in the batch of a batched solution, ``None`` for a single one.
        time: when it first left the range (s): the crossing of ``limit``, interpolated linearly between the
            last saved time inside and the first outside (``ts[0]`` if it starts outside).
        bound: ``"lower"`` or ``"upper"``, the bound crossed at ``time``.
        limit: that bound's value (rad or m).
        excess: the largest distance beyond the range over the saved times (rad or m), > 0.
        excess_time: the saved time of that largest distance (s).
    """

    name: str
    coordinate: int
    scenario: int | None
    time: float
    bound: str
    limit: float
    excess: float
    excess_time: float

    def describe(self) -> str:
        """One line, e.g. ``joint 'wrist' (q[5]) left its range through its lower limit -6.283 at t =
        0.1042 s, by up to 0.8 at t = 0.2 s``."""
        where = "" if self.scenario is None else f"scenario {self.scenario}: "
        return (
            f"{where}joint {self.name!r} (q[{self.coordinate}]) left its range through its {self.bound} "
            f"limit {self.limit:.4g} at t = {self.time:.4g} s, by up to {self.excess:.3g} at t = "
            f"{self.excess_time:.4g} s"
        )


def range_violations(solution, ranges) -> list[RangeViolation]:
    """Every coordinate of ``solution`` that left its stated range at a saved time, first by scenario then
    in the order of the ranges.

    ``ranges``: a :class:`~ukjax.System` or :class:`~ukjax.robots.Robot` (their ``coordinate_ranges``), or
    ``(index into q, name, lower, upper)`` tuples. ``solution``: a :class:`~ukjax.solution.Solution` (or
    anything with its ``ts`` and ``q``), single (q of shape (T, nq)) or batched ((B, T, nq); then each
    :class:`RangeViolation` names its scenario).

    A value exactly at a bound is inside. Only the saved times are seen: a coordinate that leaves and
    re-enters its range between two of them is not flagged, so save densely enough for the motion
    (``simulate(..., ts=...)``). Non-finite values (after a failure) are skipped; the status says why the
    run failed. The status itself is not changed by a violation: the ranges are not enforced.
    """
    ranges = _ranges(ranges)
    q, ts = np.asarray(solution.q), np.asarray(solution.ts)
    batched = q.ndim == 3
    if not batched:
        q, ts = q[None], ts[None]
    ts = np.broadcast_to(ts, q.shape[:2])
    found = []
    for b in range(q.shape[0]):
        for index, name, lower, upper in ranges:
            x, t = q[b, :, index], ts[b]
            finite = np.isfinite(x)
            outside = np.flatnonzero(finite & ((x < lower) | (x > upper)))
            if outside.size == 0:
                continue
            k = int(outside[0])
            bound, limit = ("lower", lower) if x[k] < lower else ("upper", upper)
            crossed = float(t[k])
            if k > 0 and finite[k - 1]:
                crossed = float(t[k - 1] + (t[k] - t[k - 1]) * (limit - x[k - 1]) / (x[k] - x[k - 1]))
            beyond = _beyond(x, lower, upper, np)
            worst = int(np.argmax(beyond))
            found.append(
                RangeViolation(
                    name=name,
                    coordinate=int(index),
                    scenario=b if batched else None,
                    time=crossed,
                    bound=bound,
                    limit=float(limit),
                    excess=float(beyond[worst]),
                    excess_time=float(t[worst]),
                )
            )
    return found
