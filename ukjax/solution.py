"""What a simulation returns: the :class:`Solution` type, its status codes :class:`RESULTS`, and its file.

A :class:`Solution` holds one scenario's trajectory (q, q̇, q̈ at the saved times, with a leading batch axis
for :func:`~ukjax.simulation.simulate_batch`) next to the diagnostics that tell whether to trust it: the
constraint residuals φ and φ̇/ψ, the constraint force (Liu et al. 2015, seed 000 eq. 11-12), the
consistency residual ‖A q̈ - b‖ (seed 000 eq. 27), the violations in units of their tolerance, and one
:class:`RESULTS` code per scenario. How those diagnostics are computed and how the code is decided is
:mod:`ukjax.diagnostics`; this module is the record itself:

* :class:`RESULTS`: the status codes, with a message each (``RESULTS.message(code)``); :data:`COMPLETED`, the
  codes of a run that reached t1 with a finite state;
* :class:`SimulationError`: what ``simulate(..., throw=True)`` raises, with that message;
* :meth:`Solution.save` / :meth:`Solution.load`: every array in a NumPy ``.npz`` file (format
  ``"ukjax.Solution/1"``), readable without ukjax.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import dynamics


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


class SimulationError(RuntimeError):
    """Raised by ``simulate(..., throw=True)``: the :class:`RESULTS` message of the scenario that failed."""


class Solution(eqx.Module):
    """A simulated trajectory at the saved times ``ts`` (T of them), with diagnostics.

    Batched solutions (:func:`~ukjax.simulation.simulate_batch`) carry a leading batch axis on every array.

    Attributes:
        ts: (T,) saved times.
        q, qd, qdd: (T, nq), (T, n), (T, n) coordinates, velocities and accelerations (nq = n unless the
            system has ball or free joints, ``System.nq``).
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
        num_steps, num_accepted_steps: diffrax step counts (in a fixed-step batch, the batch's: every
            scenario is integrated over the same steps, one that failed on the way too).
        num_function_evals: right-hand-side evaluations, counted from the solver's stages (exact for fixed
            step; the adaptive first-step selection may add one or two); -1 for a solver whose count is not
            known.
        engine: what integrated it: ``"xla"`` (diffrax's solve compiled by XLA) or ``"fused"`` (one
            kernel per save interval, :mod:`ukjax.fused`; :func:`~ukjax.simulation.simulate_batch`).

    After a failure (status other than success, inconsistent_constraints, control_infeasible,
    constraint_violated) the values at saved times past the point of failure are not meaningful (diffrax
    fills them with inf).

    Ranges stated for the coordinates (``System.coordinate_ranges``, a robot file's joint limits) are not
    enforced and do not enter the status: a trajectory that leaves them integrated correctly. Check it with
    :func:`ukjax.diagnostics.range_violations` (``Robot.joint_range_violations``).

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
    when a violation exceeds 1 (see :func:`~ukjax.simulation.simulate`, ``constraint_rtol``, for which saved
    times count).

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
    engine: str = eqx.field(static=True, default="xla")

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
            values = {k: str(data[k]) if data[k].dtype.kind == "U" else jnp.asarray(data[k])
                      for k in data.files if k != "__format__"}  # fmt: skip
        force = dynamics.ConstraintForce(
            ideal=values.pop("constraint_force.ideal"), nonideal=values.pop("constraint_force.nonideal")
        )
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(values) - {"constraint_force", "u", "servo_residual", "engine"}
        if missing:
            raise ValueError(f"{path}: missing fields {sorted(missing)}")
        values.setdefault("engine", "xla")  # files written before the engine was recorded
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
