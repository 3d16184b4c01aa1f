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

Configuration manifolds (``System.nq`` ≠ n, ball and free joints): the state is (q, v), the right-hand side
(N(q) v, v̇) evaluated at ``normalize(q)``, and every step of the solver is followed by the projection
q ← normalize(q) (:class:`ukjax.solvers.Projected`), so unit quaternions stay unit to round-off.

Failures never raise from inside diffrax (``throw=False`` there): they become a status code per scenario,
:class:`RESULTS`. ``simulate(..., throw=True)`` instead raises an ``equinox`` runtime error with the message
of the code (``eqx.branched_error_if``, which works under ``jit`` and ``vmap``).

Post-processing runs at the saved times only (a ``lax.map`` loop over ts, not inside the ODE): q̈, the
constraint force (ideal and non-ideal parts, seed 000 eq. 11-12,
:func:`ukjax.dynamics.uk_constraint_force`), the residuals, the consistency residual ‖A A⁺ b - b‖ of seed
000 eq. 27 and, for controlled systems, u(t) and the servo residual.

Everything is differentiable with respect to ``params`` (diffrax's ``RecursiveCheckpointAdjoint``), so
``jax.grad`` of any scalar function of a :class:`Solution` gives derivatives with respect to masses, lengths
and Baumgarte gains.

The pieces, one module each: the options and their checks before compiling are :mod:`ukjax.options`,
the diagnostics at the saved times and the status they decide :mod:`ukjax.diagnostics`, the returned
:class:`Solution` and its :class:`RESULTS` codes :mod:`ukjax.solution`; this module integrates (the solve,
batching and chunking) and re-exports their public names, so ``from ukjax.simulation import Solution``
keeps working.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import multibody
from ukjax._config import cpu_loops_compiled_whole
from ukjax._entrywise import batched_by_entries, entry_operations, one_scenario_jaxpr, unruled_primitives
from ukjax._settings import SMALL_BUFFER_BYTES
from ukjax.diagnostics import COORDINATE_RESOLUTION as COORDINATE_RESOLUTION
from ukjax.diagnostics import DEFAULT_CONSISTENCY_RTOL as DEFAULT_CONSISTENCY_RTOL
from ukjax.diagnostics import DEFAULT_CONSTRAINT_ATOL as DEFAULT_CONSTRAINT_ATOL
from ukjax.diagnostics import DEFAULT_CONSTRAINT_RTOL as DEFAULT_CONSTRAINT_RTOL
from ukjax.diagnostics import _diagnostics, _status
from ukjax.linalg import blocks_on_cpu_pool, lapack_calls, looped_factorizations
from ukjax.options import DEFAULT_CPU_CHUNK as DEFAULT_CPU_CHUNK
from ukjax.options import DEFAULT_MAX_STEPS as DEFAULT_MAX_STEPS
from ukjax.options import DEFAULT_NUM_SAVES as DEFAULT_NUM_SAVES
from ukjax.options import (
    OPTION_DEFAULTS,
    _arguments,
    _loops_pay,
    _pinv_rtol,
    bucket_size,
    vmap_size,
    whole_loop_chunk,
)
from ukjax.options import _chunk_size as _chunk_size
from ukjax.options import _Config as _Config
from ukjax.options import _Numbers as _Numbers
from ukjax.options import _prepare as _prepare
from ukjax.options import as_params as as_params
from ukjax.solution import _MESSAGE_LIST
from ukjax.solution import COMPLETED as COMPLETED
from ukjax.solution import RESULTS as RESULTS
from ukjax.solution import SimulationError as SimulationError
from ukjax.solution import Solution as Solution
from ukjax.solvers import Projected
from ukjax.system import System

DTMIN_FRACTION = 1e-12
"""The adaptive controller stops with ``RESULTS.step_size_collapse`` below dt = DTMIN_FRACTION * (t1 - t0)."""


def _run(program, *args):
    """Call a compiled simulation; with ``throw=True`` its runtime error is re-raised here, at this call,
    with the status message alone (equinox's own traceback points at the call that first traced it)."""
    try:
        return program(*args)
    except eqx.EquinoxRuntimeError as error:
        text = str(error)
        message = max((m for m in _MESSAGE_LIST[1:] if m in text), key=len, default=text)
        raise SimulationError(f"ukjax.simulate: {message}") from None


def _evals_per_step(solver) -> tuple[int, int]:
    """(evaluations per step, extra at the start) for explicit Runge-Kutta solvers; (-1, 0) else."""
    if isinstance(solver, diffrax.Euler):
        return 1, 0
    if isinstance(solver, diffrax.AbstractERK):
        stages = len(solver.tableau.c) + 1
        return (stages - 1, 1) if solver.tableau.fsal else (stages, 0)
    return -1, 0


class _PerProgram:
    """What is decided once per program: keyed by everything in ``parts`` (arrays by their shapes and dtypes,
    the rest as it is; where a part cannot be hashed it is decided at every call), at most ``kept`` of them,
    the oldest going first (the keys hold systems)."""

    def __init__(self, kept: int = 256):
        self.kept, self._found = kept, {}

    def __len__(self) -> int:
        return len(self._found)

    def get(self, parts, decide):
        """The value kept for ``parts``, else ``decide()``, kept."""
        dynamic, static = eqx.partition(parts, eqx.is_array)
        fixed, fixed_tree = jax.tree_util.tree_flatten(static)
        shapes = tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(dynamic))
        key = (fixed_tree, tuple(fixed), jax.tree_util.tree_structure(dynamic), shapes)
        try:
            return self._found[key]
        except TypeError:  # a static part that cannot be hashed
            return decide()
        except KeyError:
            pass
        if len(self._found) >= self.kept:
            del self._found[next(iter(self._found))]
        found = self._found[key] = decide()
        return found


_STEP_COSTS = _PerProgram()
""":func:`_step_cost` per system, configuration and one scenario's shapes."""


def _step_cost(system, config, numbers, q0, qd0, params) -> tuple[int, bool] | None:
    """(bytes that one scenario's step writes, whether a batch evaluates its right-hand side entry by entry),
    from its right-hand side's jaxpr traced as a batch's is (factorizations unrolled): its entries
    (:func:`ukjax._entrywise.entry_operations`) x the dtype's size x evaluations per step; entry by entry
    where ``config`` allows it and every equation has an entry rule
    (:func:`ukjax._entrywise.batched_by_entries`). ``q0``, ``qd0``, ``params`` have the batch axis first.
    None for a solver without a fixed number of evaluations per step. Traced once per system, configuration
    and shapes."""
    evals, _ = _evals_per_step(config.solver)
    if evals < 0:
        return None
    one = lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x))  # noqa: E731
    y_one, p_one = jax.tree_util.tree_map(one, ((q0, qd0), params))

    def count():
        with looped_factorizations(False):
            closed = one_scenario_jaxpr(_state_derivative(system, config, numbers), y_one, p_one)
        entrywise = config.entrywise_min_batch is not None and not unruled_primitives(closed.jaxpr)
        return entry_operations(closed) * jnp.dtype(jnp.result_type(q0)).itemsize * evals, entrywise

    return _STEP_COSTS.get((system, config, numbers, y_one, p_one), count)


def _batch_arguments(arguments: dict):
    """:func:`ukjax.options._arguments` of a batch; ``chunk_size="auto"`` on a CPU whose loops XLA compiles
    whole (:func:`ukjax.whole_cpu_loops`) becomes :func:`ukjax.options.whole_loop_chunk` of the scenario's
    step, except under differentiation: the UR5's reverse-mode gradient (256 scenarios, 100 RK4 steps, chunks
    of 16) ran 1.66 against 1.79 s but compiled in 41.9 against 19.0 s (its backward loops compiled whole
    too); the user-written SCARA's forward-mode gradient 0.38 against 0.47 s, compiled in 12.9 against
    9.8 s. Both keep chunks of :data:`DEFAULT_CPU_CHUNK`."""
    config, numbers, q0, qd0, params, chunk_size = _arguments(arguments, batched=True)
    auto = isinstance(arguments["chunk_size"], str) and arguments["chunk_size"] == "auto"
    differentiated = _traced(arguments["system"], q0, qd0, params, by=_DIFFERENTIATION)
    if auto and chunk_size is not None and not differentiated and cpu_loops_compiled_whole():
        cost = _step_cost(arguments["system"], config, numbers, q0, qd0, params)
        if cost is not None:
            step_bytes, entrywise = cost
            floor = config.entrywise_min_batch if entrywise else None
            chunk_size = whole_loop_chunk(step_bytes, chunk_size, floor)
    return config, numbers, q0, qd0, params, chunk_size


def _is_controlled(system: System) -> bool:
    return system.actuation is not None and bool(system.servo_constraints)


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
    """(t, (q, v), p) -> (q̇, v̇): the ODE right-hand side, shared by :func:`simulate` and
    :func:`ukjax.stepping.step`. q̇ = N(q) v (:meth:`ukjax.System.configuration_rate`; v itself for
    Euclidean coordinates). A system with ``normalize`` is evaluated at normalize(q), so the right-hand side
    does not depend on the drift of q off its manifold (and a projected step keeps first-same-as-last
    solvers consistent)."""

    def derivative(t, y, p):
        q, qd = y
        q = system.project(q)
        return system.configuration_rate(q, qd), _motion(system, config, numbers, q, qd, t, p)[0]

    return derivative


def _with_unrolled_recursions(system, derivative):
    """``derivative`` traced with a kinematic tree's recursions unrolled
    (:func:`ukjax.multibody.unrolled_recursions`) for a system without constraints: faster for a batch of an
    unconstrained serial chain on the CPU, as they are on a GPU anyway (:func:`_solve_lockstep`), and for
    one scenario whose loop runs its kernels in order (:func:`_diffeqsolve`; one UR5 scenario 22 against
    37 µs per RK4 step, an unconstrained 8-link chain 57 against 238, its bodies kept apart; a pinned
    4-link chain was 1.3x slower unrolled, so constrained systems keep the loops); ``derivative`` itself
    otherwise."""
    if system.constraints or system.servo_constraints:
        return derivative

    def unrolled(t, y, p):
        with multibody.unrolled_recursions():
            return derivative(t, y, p)

    return unrolled


def _batched_state_derivative(system, config, numbers):
    """:func:`_state_derivative`, evaluated entry by entry under the batch's ``vmap``
    (:func:`ukjax._entrywise.batched_by_entries`: same values up to the order of sums) where
    ``config.entrywise_min_batch`` says so (:data:`ukjax.options.ENTRYWISE_MAX_N`,
    :data:`ukjax.options.ENTRYWISE_MIN_BATCH`); its tangents too under diffrax's ``ForwardMode``
    (``config.entrywise_tangents``), else from the ordinary program, which reverse mode transposes. The
    arrays the right-hand side closes over (the system's, the tolerances) are passed as arguments: a custom
    batching rule takes no batched closure."""
    if config.entrywise_min_batch is None:
        return _state_derivative(system, config, numbers)
    dynamic, static = eqx.partition((system, numbers), eqx.is_array)

    def field(t, y, p, dynamic):
        system_, numbers_ = eqx.combine(dynamic, static)
        return _state_derivative(system_, config, numbers_)(t, y, p)

    batched = batched_by_entries(
        field, config.entrywise_min_batch, config.entrywise_tangents, config.entrywise_fenced_values
    )
    return lambda t, y, p: batched(t, y, p, dynamic)


def _projected_solver(system, solver, batched: bool = False):
    """``solver`` whose every step ends on the system's manifold (:class:`ukjax.solvers.Projected`), for a
    system with ``normalize``; ``solver`` itself otherwise. ``batched``: the state holds a batch of
    scenarios, batch axis first (:func:`_solve_lockstep`)."""
    if system.normalize is None:
        return solver
    normalize = jax.vmap(system.normalize) if batched else system.normalize
    return Projected(solver, lambda y: (normalize(y[0]), y[1]))


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
    """One scenario: diffrax integration, post-processing at the saved times, status.

    The post-processing (one UK solve and the diagnostics at every saved time) is a loop over the saved
    times, not vectorized over them: under the batch's ``vmap`` that kept every intermediate of the solve for
    every (scenario, saved time) pair alive at once (the SCARA tuning objective, 256 scenarios x 201 saves:
    55 MiB of temporaries against 10 MiB as a loop, and 110 against 25 MiB for its forward-mode gradient),
    and the loop compiles faster (a single SCARA simulation with 201 saves: 3.6 against 4.7 s) and runs as
    fast."""
    with _runtime_checks_as_nan(not config.throw):
        return _solve_traced(system, config, numbers, q0, qd0, params)


def _at_saves(diagnose, ts, q, qd):
    """``diagnose(t, q, q̇)`` at every saved time, one after the other (see :func:`_solve`).

    Rematerialized under reverse mode (``jax.checkpoint``): the pullback keeps only each save's (t, q, q̇),
    which the solution holds anyway, and re-runs ``diagnose`` on the way back instead of keeping its
    intermediates for every save (on the tuner's SCARA objective, 256 scenarios × 201 saves, those were
    70 of the reverse pass's 127 MiB; recomputing 201 post-processings costs nothing measurable next to
    1000 steps). ``prevent_cse=False``: inside a loop body there is nothing for XLA to merge across."""
    return jax.lax.map(jax.checkpoint(lambda save: diagnose(*save), prevent_cse=False), (ts, q, qd))


def _solve_traced(system, config, numbers, q0, qd0, params) -> Solution:
    # Non-finite input (possible only when traced: concrete input is refused on the host) integrates nothing
    # instead of letting the adaptive controller reject max_steps steps of NaN.
    start_bad = _start_bad(q0, qd0, params)

    vector_field = _field(_batched_state_derivative(system, config, numbers), start_bad)

    def nonfinite(t, y, args, **kwargs):
        q, qd = y
        return ~(jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(qd)))

    sol = _diffeqsolve(system, config, numbers, vector_field, (q0, qd0), params, diffrax.Event(nonfinite))
    q, qd = sol.ys
    if system.normalize is not None:  # saved states between steps are interpolated: project them too
        q = jax.vmap(system.normalize)(q)
    return _finished(system, config, numbers, q0, params, q, qd, sol.result, start_bad, *_step_counts(sol))


def _field(motion, start_bad):
    """The ODE right-hand side ``motion`` with zero rates where ``start_bad`` (one scenario's flag, or one per
    scenario of a batch, batch axis first).

    One jit around the field: diffrax calls it at several places (first step, stages), and JAX traces a
    jitted function once per signature, so the right-hand side (and its entrywise evaluation) is traced 4
    times instead of 11 for the demo's SCARA batch: 4.2 against 4.9 CPU-s of tracing (median of 3,
    interleaved, load 6-11). XLA inlines it: the same program, bitwise the same results."""
    bad = start_bad[..., None]

    @jax.jit
    def vector_field(t, y, p):
        rate, qdd = motion(t, y, p)
        return jnp.where(bad, 0.0, rate), jnp.where(bad, 0.0, qdd)

    return vector_field


def _step_counts(sol):
    """diffrax's (steps, accepted steps) of a solve."""
    return jnp.asarray(sol.stats["num_steps"]), jnp.asarray(sol.stats["num_accepted_steps"])


def _diffeqsolve(system, config, numbers, vector_field, y0, params, event, batched: bool = False):
    """diffrax's solve of ``vector_field`` from ``y0`` with the options of ``config`` and ``numbers``, saving
    at ``numbers.ts``; failures as a result code (``throw=False``). ``batched``: ``y0`` is a batch of
    scenarios' states (:func:`_solve_lockstep`)."""
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
    small = _loops_pay() and _small_state(y0) and not cpu_loops_compiled_whole()
    pieces, restore = _in_small_pieces(params, batched) if small else (params, lambda p: p)
    field = lambda t, y, args: vector_field(t, y, restore(args))  # noqa: E731
    if small:
        field = _with_unrolled_recursions(system, field)
    with multibody.per_body_values(small):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            _projected_solver(system, config.solver, batched),
            numbers.t0,
            numbers.t1,
            dt0,
            y0,
            pieces,
            saveat=diffrax.SaveAt(ts=numbers.ts),
            stepsize_controller=controller,
            adjoint=config.adjoint,
            event=event,
            max_steps=config.max_steps,
            throw=False,
            progress_meter=diffrax.TqdmProgressMeter() if config.progress else diffrax.NoProgressMeter(),
        )


def _small_state(y0) -> bool:
    """Whether every array of the integrated state fits in :data:`SMALL_BUFFER_BYTES` (one scenario, or a
    few, of a small system): only then can a step's loop body run its kernels in order.

    :func:`_diffeqsolve` keeps such a body's buffers that small (parameters split into rows, a tree's
    per-body values apart, an unconstrained chain's recursions unrolled) only where XLA:CPU runs the loop
    kernel by kernel: where it compiles the loop into one function
    (:func:`ukjax._config.cpu_loops_compiled_whole`, what ``import ukjax`` asks for), the stacked values
    and loops are as fast or faster (``benchmarks/one_scenario_cpu.py``: the Panda 12.1 against 21.4 µs per
    RK4 step, an unconstrained 8-link chain 18.8 against 33.8)."""
    return all(jnp.size(x) * jnp.result_type(x).itemsize <= SMALL_BUFFER_BYTES for x in jax.tree.leaves(y0))


def _in_small_pieces(params, batched: bool):
    """``(pieces, restore)``: ``params`` with every array of more than :data:`SMALL_BUFFER_BYTES` per scenario
    and at least two axes split into its rows (recursively), and the function that stacks them back.

    diffrax carries its ``args`` through its loop, so every kernel of the step that reads a stacked body
    parameter reads the whole buffer: the Panda's (9, 3, 3) inertia tensors (648 bytes in float64) alone
    made one scenario's step dispatch its ~180 kernels to the thread pool. Split, each kernel reads its
    body's row (XLA folds the slice of the restacked array into the row). ``batched``: batch axis first."""
    axis = 1 if batched else 0

    def split(x):
        x = jnp.asarray(x)
        per_scenario = x.shape[axis:]
        if len(per_scenario) < 2 or x.dtype.itemsize * np.prod(per_scenario) <= SMALL_BUFFER_BYTES:
            return x
        return tuple(split(row) for row in jnp.unstack(x, axis=axis))

    def stack(piece):
        return jnp.stack([stack(p) for p in piece], axis=axis) if isinstance(piece, tuple) else piece

    leaves, treedef = jax.tree.flatten(params)
    pieces = [split(leaf) for leaf in leaves]
    return pieces, lambda pieces: jax.tree.unflatten(treedef, [stack(p) for p in pieces])


def _solve_lockstep(system, config, numbers, q0, qd0, params) -> Solution:
    """A batch of fixed-step scenarios (batch axis first in every argument) integrated together: one diffrax
    solve whose state is the whole batch and whose right-hand side is the one-scenario right-hand side under
    ``jax.vmap``, then :func:`_finished` per scenario under ``jax.vmap``.

    With a fixed step every scenario takes the same steps at the same times, so this computes what
    ``jax.vmap`` of :func:`_solve` computes (the same right-hand side, batched the same way, entry by entry
    where ``config`` says so; equal up to the order of floating-point operations XLA chooses), without
    batching diffrax's loop: ``jax.vmap`` of a ``while_loop`` whose condition differs per scenario batches its
    body several times while tracing (a fixpoint over which carried values are batched, then once more with
    all of them batched) and guards every carried value with a per-scenario select at every step. Measured
    (``benchmarks/lockstep_batch.py``, fresh processes, medians of 2 interleaved rounds, 2-core CPU): tracing
    takes 0.5-0.75x the time (the user-written SCARA's 1024-scenario program 1.7 against 3.2 s, the UR5's
    2.3 against 4.4 s, the tuner's reverse-mode gradient 9.6 against 13.8 s), XLA's compile 0.8-1.1x, the
    run 0.85-1.07x; the first result 0.75-1.0x (gradient 30.8 against 37.5 s).

    A scenario whose state stops being finite is not stopped on its own (the non-finite event of
    :func:`_solve` would end the whole batch): it goes on as NaN beside the others, and its saved states
    from the first non-finite one on are set to inf, as diffrax fills the saves after a terminating event.
    Its status is ``nonfinite_state`` either way; its ``num_steps`` are the batch's."""
    states = _lockstep_states(system, config, numbers, q0, qd0, params)
    return _lockstep_finished(system, config, numbers, q0, params, states)


def _lockstep_states(system, config, numbers, q0, qd0, params) -> dict:
    """The integration of :func:`_solve_lockstep` alone, every value per scenario: the saved states ``q``,
    ``qd`` (batch, T, n), a failed scenario's saves from its first non-finite one on set to inf; diffrax's
    result code ``result`` and step counts ``num_steps``, ``num_accepted_steps`` (the batch's, one copy per
    scenario); ``start_bad``, whether the scenario's input was not finite. Arrays only, so that a program of
    its own can return them (:func:`_fixed_step_stage`); :func:`_lockstep_finished` makes the batch's
    :class:`Solution` of them."""
    with _runtime_checks_as_nan(not config.throw):
        start_bad = jax.vmap(_start_bad)(q0, qd0, params)
        derivative = _with_unrolled_recursions(system, _batched_state_derivative(system, config, numbers))
        motion = jax.vmap(derivative, in_axes=(None, 0, 0))
        vector_field = _field(motion, start_bad)
        sol = _diffeqsolve(system, config, numbers, vector_field, (q0, qd0), params, None, batched=True)
        q, qd = (jnp.swapaxes(x, 0, 1) for x in sol.ys)  # (T, batch, ...) -> (batch, T, ...)
        failed = jnp.cumsum(~(_all_finite(q) & _all_finite(qd)), axis=1) > 0
        q = jnp.where(failed[..., None], jnp.inf, q)
        qd = jnp.where(failed[..., None], jnp.inf, qd)
        if system.normalize is not None:
            q = jax.vmap(jax.vmap(system.normalize))(q)
        per_scenario = lambda x: jnp.broadcast_to(x, start_bad.shape)
        steps, accepted = _step_counts(sol)
        return {
            "q": q, "qd": qd, "result": per_scenario(_result_code(sol.result)),
            "num_steps": per_scenario(steps), "num_accepted_steps": per_scenario(accepted),
            "start_bad": start_bad,
        }  # fmt: skip


_RESULT_TREE = jax.tree_util.tree_structure(diffrax.RESULTS.successful)
"""The pytree of a diffrax result: its one leaf is the integer code, which a program can return."""


def _result_code(result):
    """The integer code of diffrax's ``result`` (its one pytree leaf)."""
    (code,) = jax.tree_util.tree_leaves(result)
    return code


def _lockstep_finished(system, config, numbers, q0, params, states: dict) -> Solution:
    """The batch's :class:`Solution` from :func:`_lockstep_states`: :func:`_finished` per scenario.

    The UK solve and diagnostics at the saved times trace the small factorizations as loops on the CPU
    (:func:`ukjax.linalg.looped_factorizations`) whether or not the right-hand side is evaluated entry by
    entry: a few hundred evaluations against the integration's thousands, they cost little more to run as
    loops and much less to compile. ``ukjax demo``'s 256 SCARA scenarios x 201 saves (its diagnostics
    program, ``_fixed_step_stage``), looped against unrolled: with the demo's XLA flags (legacy emitters)
    XLA's compile 2.2-2.7 against 3.4-3.5 CPU-s and the run 0.055 against 0.043 s; with JAX's default flags
    4.0-4.3 against 6.0-6.3 CPU-s and 0.060 against 0.044-0.054 s (the chunk's integration ~0.45 s)."""

    def finished(q0_, p_, s):
        result = jax.tree_util.tree_unflatten(_RESULT_TREE, [s["result"]])
        return _finished(system, config, numbers, q0_, p_, s["q"], s["qd"], result, s["start_bad"],
                         s["num_steps"], s["num_accepted_steps"])  # fmt: skip

    with _runtime_checks_as_nan(not config.throw), looped_factorizations(_loops_pay()):
        return jax.vmap(finished)(q0, params, states)


def _all_finite(x):
    """Whether every entry of each saved state (the last axis) is finite."""
    return jnp.all(jnp.isfinite(x), axis=-1)


def _start_bad(q0, qd0, params):
    """Whether any input of one scenario is not finite."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in (q0, qd0, *leaves)]))


def _finished(system, config, numbers, q0, params, q, qd, result, start_bad, num_steps, accepted,
              engine: str = "xla") -> Solution:  # fmt: skip
    """One scenario's :class:`Solution` from its states at the saved times: the UK solve and the diagnostics
    at every saved time, the status from the integrator's ``result`` and them."""
    dtype = jnp.result_type(q0)
    rtol = _pinv_rtol(config, numbers)

    def diagnose(t, q_, qd_):
        found = _motion(system, config, numbers, q_, qd_, t, params)
        return _diagnostics(system, config, numbers, q_, qd_, t, params, q0, found, rtol)

    diag = _at_saves(diagnose, numbers.ts, q, qd)
    status = _status(result, start_bad, diag)

    per_step, extra = _evals_per_step(config.solver)
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
        num_accepted_steps=accepted,
        num_function_evals=evals,
        engine=engine,
    )
    if not config.throw:
        # No runtime error check in the program unless asked: host callbacks defeat JAX's persistent
        # compilation cache.
        return out
    return eqx.branched_error_if(out, status != RESULTS.success, status, _MESSAGE_LIST)


@eqx.filter_jit
def _simulate_one(system, config, numbers, q0, qd0, params):
    with looped_factorizations(_loops_pay()):
        return _solve(system, config, numbers, q0, qd0, params)


@eqx.filter_jit
def _simulate_many(system, config, numbers, q0, qd0, params, chunk_size):
    config, loops = _batch_config(config, q0.shape[0], chunk_size)
    with looped_factorizations(loops):
        if config.adaptive:  # each scenario its own steps: diffrax's solve under vmap
            solve = jax.vmap(lambda q, qd, p: _solve(system, config, numbers, q, qd, p))
        else:  # the same steps for all: one solve of the whole batch
            solve = lambda q, qd, p: _solve_lockstep(system, config, numbers, q, qd, p)
        return _in_chunks(solve, (q0, qd0, params), chunk_size)


def _batch_config(config, batch: int, chunk_size: int | None):
    """``(config, loops)`` of a batch of ``batch`` scenarios in chunks of ``chunk_size``: a chunked batch's
    entrywise values behind a fence (faster there, not in one piece: ``batched_by_entries``), and whether
    its small factorizations are loops (on the CPU for a batch below the entrywise threshold; a batch
    evaluated entry by entry keeps them unrolled; a fixed-step batch's diagnostics are loops on the CPU
    either way: :func:`_lockstep_finished`)."""
    entrywise = config.entrywise_min_batch is not None and (
        vmap_size(batch, chunk_size) >= config.entrywise_min_batch
    )
    if chunk_size is not None and chunk_size < batch:
        config = dataclasses.replace(config, entrywise_fenced_values=True)
    return config, _loops_pay() and not entrywise


def _in_chunks(solve, args: tuple, chunk_size: int | None):
    """``solve(*args)`` (every leaf of ``args`` with the batch axis first) in equal chunks of at most
    ``chunk_size`` scenarios, one after the other (``jax.lax.map``); the whole batch at once for
    ``chunk_size`` None or not below the batch.

    A batch that does not split evenly is padded with copies of its last scenario (fewer than the number of
    chunks, cut off again), so that one compiled chunk serves all (a remainder chunk would be a second
    compilation of the whole solver)."""
    batch = jax.tree_util.tree_leaves(args)[0].shape[0]
    if chunk_size is None or chunk_size >= batch:
        return solve(*args)
    chunks = -(-batch // chunk_size)
    size = -(-batch // chunks)
    padded = _with_last_repeated(args, chunks * size)
    # The chunks are formed and undone with explicit shapes: ``lax.map(..., batch_size=)`` reshapes with -1,
    # which fails on the zero-size arrays of a system without position or velocity residuals (constraints
    # that are all AccelerationLevel, or none).
    split = lambda x: jnp.reshape(x, (chunks, size, *x.shape[1:]))
    out = jax.lax.map(lambda chunk: solve(*chunk), jax.tree_util.tree_map(split, padded))
    join = lambda x: jnp.reshape(x, (chunks * size, *x.shape[2:]))[:batch]
    return jax.tree_util.tree_map(join, out)


def _staged() -> bool:
    """Whether this call is being traced into an enclosing program (a user's ``jit``, ``scan``, the sweep's
    chunk program): there a new constant is a tracer. Padding to a bucket saves no compilation then (the
    enclosing program is compiled for its own shapes), so :func:`simulate_batch` does not pad."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def _with_last_repeated(tree, size: int):
    """Every leaf (batch axis first) padded to ``size`` rows with copies of its last row (the scenarios whose
    results a padded batch drops)."""
    pad = lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], size - x.shape[0], axis=0)])
    return jax.tree_util.tree_map(lambda x: pad(x) if size > x.shape[0] else x, tree)


# one small program per (batch, bucket) pair, instead of one per leaf as eager jnp.concatenate would compile
_pad_batch = jax.jit(_with_last_repeated, static_argnums=1)


@functools.partial(jax.jit, static_argnums=1)
def _first_rows(tree, count: int):
    """Every leaf's first ``count`` rows (the real scenarios of a padded batch), in one small program."""
    return jax.tree_util.tree_map(lambda x: x[:count], tree)


def _bucketed(config, batch: int, size: int, chunk_size: int | None):
    """``config`` for the padded batch of ``size`` scenarios, evaluating the right-hand side as the unpadded
    batch of ``batch`` would: entry by entry only if its own ``vmap`` reaches ``entrywise_min_batch`` (else a
    threshold above the padded ``vmap``, so the same ``jax.vmap`` fallback of
    :func:`ukjax._entrywise.batched_by_entries` is traced). Chunked or not is the same by construction of
    :func:`ukjax.options.bucket_size`."""
    threshold, padded = config.entrywise_min_batch, vmap_size(size, chunk_size)
    if threshold is None or padded < threshold or vmap_size(batch, chunk_size) >= threshold:
        return config  # the same choice either way: one program per bucket
    return dataclasses.replace(config, entrywise_min_batch=padded + 1)


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
            A system with nq ≠ n (ball or free joints) takes q0 of shape (nq,): then q̇ = N(q) v and q is
            projected onto its manifold (``System.normalize``) after every step and at the saved times.
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
            the backward pass recomputes each step once (memory: each step's solver state, a few times the
            trajectory's states, 3.5x on the demo's batch with Tsit5; time ≈ forward + one step and its VJP
            per step); otherwise diffrax's default binomial checkpointing with
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
    config, numbers, q0, qd0, params, _ = _arguments(locals(), batched=False)
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
    bucket: bool = True,
    engine: str = "auto",
    devices="all",
) -> Solution:
    """Simulate a batch of scenarios in ONE compiled call: per scenario what ``jax.jit`` of ``jax.vmap`` of
    :func:`simulate` computes.

    ``q0``, ``qd0`` have shape (batch, n), batch >= 1. ``batch_params`` says which leaves of ``params`` carry
    the batch axis first (one value per scenario), like ``in_axes`` of ``jax.vmap``: ``True`` (every leaf),
    ``False`` (none: all scenarios share ``params``), or a pytree prefix of ``params`` whose leaves are
    True/0 (batched) or False/None (shared), e.g. ``{"alpha": True, "beta": True, "mass": False}`` or
    ``{"gains": True, "model": None}``. Every array of the returned :class:`Solution` has the batch axis
    first; ``status`` is one code per scenario, so one failing scenario never stops the others.

    Speed: with a fixed step (``dt=...``) the batch is one diffrax solve whose state is the whole batch and
    whose right-hand side is the scenario's under ``jax.vmap``: every scenario takes the same steps, and
    the program traces in 0.5-0.75x the time of diffrax's solve under ``vmap`` (first result 0.75-1.0x;
    ``benchmarks/lockstep_batch.py``). A scenario whose state stops being finite goes on as NaN beside the
    others (its saves from then on are inf, its status ``nonfinite_state``) and its ``num_steps`` is the
    batch's. Adaptive stepping is diffrax's solve under ``vmap``, which runs in
    **lockstep** too: every scenario takes as many loop trips as the slowest one (diffrax keeps finished
    scenarios idle, not free), and each reports its own step counts. For throughput use a fixed step, where
    all scenarios cost the same; use adaptive stepping for accuracy. A progress bar (``progress=True``)
    follows the slowest scenario. Other arguments as in :func:`simulate`; the model is checked at the first
    scenario's initial state.

    ``chunk_size``: scenarios integrated together. The batch is split into equal chunks of at most
    ``chunk_size`` scenarios that one compiled loop integrates one after another (``jax.lax.map``; each chunk
    in lockstep only within itself; a batch that does not split evenly is padded with copies
    of its last scenario, fewer than the number of chunks, whose results are dropped), so the arrays of
    one right-hand-side evaluation stay in the CPU caches. ``"auto"`` (default): on a CPU whose loops XLA
    compiles whole (:func:`ukjax.whole_cpu_loops`, set by ``import ukjax``), the chunk whose step stays
    within that (:func:`ukjax.options.whole_loop_chunk`: 64 user-written SCARAs, 16 UR5s or Pandas, 8
    Jansen legs in float64), else :data:`DEFAULT_CPU_CHUNK`; the whole batch on GPU/TPU; ``None``: the
    whole batch; an int >= 1. Every scenario gets the
    same result as in one ``vmap`` (the computation per scenario is the same); only speed and memory
    change. With several chunks a progress bar (``progress=True``) runs once per chunk.

    ``bucket`` (default ``True``): the batch is padded to a bucket size (:func:`ukjax.options.bucket_size`: a
    power of two or three times one up to one chunk, a bucketed number of whole chunks above it) with copies
    of its last scenario, whose results are dropped, so that nearby batch sizes (100 and 120; 1000 and 1020 in
    chunks of 256) share one compiled program instead of compiling the simulation again (~20 CPU-s of tracing
    and XLA compile for the SCARA on a 2-core CPU; 4-10 s on an H200). The real scenarios' results, statuses
    and gradients are those of the unpadded batch (the computation per scenario is the same; the right-hand
    side is evaluated entry by entry exactly when the unpadded batch would be; the gradient of a shared
    parameter up to the order of floating-point operations, 1e-15 of its largest component). Padding costs
    at most 50 % more scenarios (~20 % on average); ``bucket=False`` compiles for the exact size. Inside a
    ``jit`` (or any trace) of your own nothing is padded: the enclosing program is compiled for its shapes.

    ``engine`` (:data:`ENGINES`): ``"auto"`` (default) integrates with the fused kernel (:mod:`ukjax.fused`:
    one GPU kernel per interval between saved times) on a GPU where it applies (a fixed ``dt``, an explicit
    Runge-Kutta solver, saved times on the step grid, ``ts=[t1]`` included, no projection, and a right-hand
    side that the entrywise evaluation covers: no LAPACK calls, no loop whose trip count depends on the data,
    loops unrolled within :data:`ukjax.fused.MAX_ENTRY_OPERATIONS`), XLA's program otherwise;
    ``"xla"`` always XLA's; ``"fused"`` the kernel, or ``ValueError`` saying why it does not apply (on a CPU
    it runs in Pallas's interpret mode: for testing, not speed). ``Solution.engine`` says which ran. Both give
    the same trajectories up to the order of floating-point sums (1e-13 relative in float64,
    tests/test_fused.py); the fused engine's derivatives are the XLA program's.

    ``devices``: where the process has several devices of its default backend (GPUs, or CPU devices from
    :func:`ukjax.use_cpu_cores`), ``"all"`` (default) splits the batch into equal shares, one per device
    (``jax.shard_map`` over the batch axis; the last share padded with copies of the last scenario, each
    share bucketed and chunked as one device's batch), and the devices integrate their shares side by side;
    an int uses that many of them, ``1`` one device. Each scenario's result is the one-device program's (the
    same program per share). With one device, and where the call is traced (inside a ``jit``, ``grad`` or
    ``vmap`` of your own, or with ``throw=True`` or ``progress=True``, whose host callbacks stay on one
    device), and on the fused engine (not yet measured on several GPUs), the batch runs on one device; so
    does a program that calls jaxlib's batched LAPACK kernels (a user's ``jnp.linalg`` call, ``method="svd"``)
    on CPU devices, with a warning: several CPU devices running them at once can deadlock
    (:func:`ukjax.linalg.blocks_on_cpu_pool`).
    """
    if not isinstance(bucket, bool):
        raise ValueError(f"bucket must be True or False, got {bucket!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    config, numbers, q0, qd0, params, chunk_size = _batch_arguments(locals())
    steps = _fused_steps(engine, system, config, numbers, q0, qd0, params)
    # the fused kernel takes any batch (its tile is padded): chunk_size only concerns the XLA program
    program, last = (_simulate_fused, steps) if steps is not None else (_simulate_many, chunk_size)
    batch = q0.shape[0]
    staged = _staged()
    spread = _spread_devices(devices, batch)
    one_device = staged or config.throw or config.progress or steps is not None  # (host callbacks, fused)
    if spread and (one_device or _traced(system, q0, qd0, params)):
        spread = ()
    count = max(len(spread), 1)
    local = -(-batch // count)  # scenarios per device (the last device's share padded up to it)
    size = count * (bucket_size(local, chunk_size) if bucket and not staged else local)
    if size != batch:
        config = _bucketed(config, local, size // count, chunk_size)
        q0, qd0, params = _pad_batch((q0, qd0, params), size)
    args = (system, config, numbers, q0, qd0, params, last)
    placed = _placed(spread, args) if spread else args
    if spread and _split_safely(program, spread, placed):
        program, args = functools.partial(_simulate_spread, program, spread), placed
    out = _run(program, *args)
    return out if size == batch else _first_rows(out, batch)


def _fixed_step_stage(
    system, q0, qd0, params, states=None, *, batch_params=False, chunk_size="auto", **options
):
    """:func:`simulate_batch` of a fixed-step batch in two stages, for two programs of one's own traced one
    after the other: with ``states=None`` the integration (a dict of arrays: the saved states, diffrax's
    result and step counts, each scenario's input check), with ``states`` the :class:`Solution` that
    :func:`simulate_batch` returns, from them (the UK solve and the diagnostics at every saved time).
    Arguments as for :func:`simulate_batch` (``dt`` given, an explicit solver; nothing padded to a bucket,
    one device), the same in both stages; call it only inside a trace (``jax.jit(...).lower``).

    Why: XLA:CPU compiles one program on ~1.6 cores, and tracing is Python on one. Traced into two programs,
    the second is traced while XLA compiles the first, and both compile side by side
    (:func:`ukjax._programs.compiled_pipeline`): ``ukjax demo`` (1024 SCARA scenarios of Xu & Liu 2017 in
    chunks of 256) compiles in 4.2 against 6.5 s as one program on a 2-core CPU (medians of 5 rounds, fresh
    processes, ``benchmarks/demo_first_result.py``; the diagnostics looped in both).
    The numbers are the single program's: the same operations on the same values."""
    if not _staged():
        raise ValueError("_fixed_step_stage is traced into a program of its caller's: call it inside jax.jit")
    arguments = dict(OPTION_DEFAULTS, system=system, q0=q0, qd0=qd0, params=params, batch_params=batch_params,
                     chunk_size=chunk_size, **options)  # fmt: skip
    config, numbers, q0, qd0, params, chunk_size = _batch_arguments(arguments)
    if config.adaptive:
        raise ValueError("_fixed_step_stage integrates with a fixed step: give dt")
    config, loops = _batch_config(config, q0.shape[0], chunk_size)
    if states is not None:  # (its factorizations looped on the CPU: _lockstep_finished)
        finish = lambda q, p, s: _lockstep_finished(system, config, numbers, q, p, s)
        return _in_chunks(finish, (q0, params, states), chunk_size)
    with looped_factorizations(loops):
        integrate = lambda q, qd, p: _lockstep_states(system, config, numbers, q, qd, p)
        return _in_chunks(integrate, (q0, qd0, params), chunk_size)


_DIFFERENTIATION = frozenset({"JVPTracer", "LinearizeTracer"})
"""The tracers of JAX's differentiation (``jax.grad``, ``jax.vjp``, ``jax.jvp``, ``jax.jacfwd``), by name."""


def _traced(*trees, by: frozenset | None = None) -> bool:
    """Whether any leaf is a tracer: the call is inside a transformation of the user's (``grad``,
    ``vmap``); with ``by``, a tracer of one of the transformations named (:data:`_DIFFERENTIATION`)."""
    return any(
        isinstance(x, jax.core.Tracer) and (by is None or any(c.__name__ in by for c in type(x).__mro__))
        for x in jax.tree_util.tree_leaves(trees)
    )


def _batch_mesh(devices):
    """The one-axis mesh (``"batch"``) a split batch's shares lie on."""
    return jax.sharding.Mesh(np.asarray(devices), ("batch",))


def _spread_devices(devices, batch: int) -> tuple:
    """The devices :func:`simulate_batch` splits a batch of ``batch`` scenarios over (``devices``: ``"all"``,
    the default backend's local devices, or their count): at most one per scenario; ``()`` for one device."""
    local = jax.local_devices()
    if devices == "all":
        count = len(local)
    elif isinstance(devices, int) and not isinstance(devices, bool) and 1 <= devices <= len(local):
        count = devices
    else:
        raise ValueError(
            f"devices must be 'all' or a number of devices from 1 to {len(local)} (this process's "
            f"{jax.default_backend()} devices), got {devices!r}"
        )
    count = min(count, batch)
    return tuple(local[:count]) if count > 1 else ()


def _placed(devices, args):
    """The arguments of a split program on its ``devices``: the batch (q0, q̇0, parameters) split into equal
    shares, the system and the numbers replicated (arrays the caller put on one device of them would
    otherwise be refused by the split program)."""
    mesh = _batch_mesh(devices)
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    put = lambda tree, where: jax.tree_util.tree_map(
        lambda x: jax.device_put(x, where) if eqx.is_array(x) else x, tree
    )
    system, config, numbers, q0, qd0, params, last = args
    return (put(system, whole), config, put(numbers, whole), *put((q0, qd0, params), split), last)


_SPLIT_SAFELY = _PerProgram()
"""Whether a split program may run split, per program (its static parts, argument shapes and devices)."""


def _split_safely(program, devices, args) -> bool:
    """Whether ``program`` may run split over ``devices`` (:func:`_simulate_spread`): not where it calls
    jaxlib's batched LAPACK kernels and the devices are CPUs (:func:`ukjax.linalg.blocks_on_cpu_pool`: it may
    deadlock; it then runs on one device, with a warning). Decided from the split program's lowering, once
    per program."""
    if devices[0].platform != "cpu":
        return True
    return _SPLIT_SAFELY.get((program, devices, args), lambda: _decide_split(program, devices, args))


def _decide_split(program, devices, args) -> bool:
    """:func:`_split_safely`, decided from the split program's lowering."""
    lapack = lapack_calls(_simulate_spread.lower(program, devices, *args))
    safe = not blocks_on_cpu_pool(devices, lapack)
    if not safe:
        kernels = ", ".join(sorted(lapack))
        warnings.warn(
            f"ukjax.simulate_batch: the program calls jaxlib's batched LAPACK kernels ({kernels}), which can "
            f"deadlock when {len(devices)} CPU devices run them at once on one thread pool (jaxlib 0.10); "
            "running the batch on one CPU device instead (the same results)",
            RuntimeWarning,
            stacklevel=6,  # the user's call: _decide_split, get's lambda, get, _split_safely, simulate_batch
        )
    return safe


@eqx.filter_jit
def _simulate_spread(program, devices, system, config, numbers, q0, qd0, params, last):
    """``program`` (:func:`_simulate_many`; the fused engine is not split yet) run on every device of
    ``devices`` for its equal share of the batch (``jax.shard_map`` over the batch axis; the system and the
    numbers replicated): each device integrates its scenarios as one device would, with no communication
    between them, so every scenario's result is the one-device program's."""
    mesh = _batch_mesh(devices)
    split, whole = jax.sharding.PartitionSpec("batch"), jax.sharding.PartitionSpec()
    shared, static = eqx.partition((system, numbers), eqx.is_array)

    def share(shared_, q0_, qd0_, params_):
        system_, numbers_ = eqx.combine(shared_, static)
        return program(system_, config, numbers_, q0_, qd0_, params_, last)

    return jax.shard_map(share, mesh=mesh, in_specs=(whole, split, split, split), out_specs=split,
                         check_vma=False)(shared, q0, qd0, params)  # fmt: skip


ENGINES = ("auto", "xla", "fused")
"""What :func:`simulate_batch` integrates with: ``"xla"``, diffrax's solve compiled by XLA (every system,
solver and option); ``"fused"``, one kernel per save interval (:mod:`ukjax.fused`: fixed-step explicit
Runge-Kutta, a right-hand side the entrywise evaluation covers, saves on the step grid); ``"auto"``, the fused
kernel on a GPU where it applies, the XLA program otherwise."""


def _fused_steps(engine, system, config, numbers, q0, qd0, params) -> tuple[int, int] | None:
    """(steps to the first save, steps between saves) for the fused kernel (:func:`ukjax.fused.save_grid`)
    where ``engine`` asks for it and it applies; None for the XLA program. ``engine="fused"`` where it does
    not apply raises ``ValueError`` with the reason."""
    from ukjax import fused

    if engine == "xla" or (engine == "auto" and jax.default_backend() != "gpu"):
        return None
    reason = fused.reason_not_applicable(system, config, numbers)
    if reason is None:
        field, dynamic = _fused_field(system, config, numbers)
        q, qd, p = jax.tree_util.tree_map(lambda x: x[0], (q0, qd0, params))
        reason = fused.refusal(field, (q, qd), (p, dynamic))
    if reason is None:
        return fused.save_grid(numbers.ts, numbers.t0, numbers.dt)
    if engine == "fused":
        raise ValueError(
            f"simulate_batch(engine='fused'): the fused kernel cannot run this simulation: {reason}"
        )
    return None


def _fused_field(system, config, numbers):
    """(field(t, y, (p, dynamic)), dynamic): the ODE right-hand side of one scenario with the arrays of the
    system and the numbers as an argument (a kernel takes no closed-over arrays)."""
    dynamic, static = eqx.partition((system, numbers), eqx.is_array)

    def field(t, y, args):
        p, dyn = args
        system_, numbers_ = eqx.combine(dyn, static)
        return _state_derivative(system_, config, numbers_)(t, y, p)

    return field, dynamic


@eqx.filter_jit
def _simulate_fused(system, config, numbers, q0, qd0, params, grid: tuple[int, int]):
    """The batch by the fused kernel (:mod:`ukjax.fused`), post-processed at the saves as the XLA program
    is. Derivatives are the XLA program's, in the mode its adjoint supports: reverse mode (the default
    adjoint: the kernel's states get the XLA program's pullback, whose forward pass XLA runs again) or, with
    ``adjoint=diffrax.ForwardMode()``, forward mode (the XLA program's JVP)."""
    from ukjax import fused

    field, dynamic = _fused_field(system, config, numbers)
    static = eqx.partition((system, numbers), eqx.is_array)[1]
    num_saves = numbers.ts.shape[0]

    def kernel_states(q0, qd0, params, dyn):
        numbers_ = eqx.combine(dyn, static)[1]
        return fused.integrate(
            field, (q0, qd0), (params, dyn), (True, False), t0=numbers_.t0, dt=numbers_.dt,
            steps_to_first_save=grid[0], steps_per_save=grid[1], num_saves=num_saves,
            tableau=config.solver.tableau,
        )  # fmt: skip

    def xla_states(q0, qd0, params, dyn):
        system_, numbers_ = eqx.combine(dyn, static)
        sol = _solve_lockstep(system_, config, numbers_, q0, qd0, params)
        return sol.q, sol.qd

    if isinstance(config.adjoint, diffrax.ForwardMode):  # forward mode, as the XLA program supports it
        states = jax.custom_jvp(kernel_states)
        states.defjvp(lambda primals, tangents: jax.jvp(xla_states, primals, tangents))
    else:  # reverse mode: the XLA program's pullback (its adjoint), its forward pass run again by XLA
        states = jax.custom_vjp(kernel_states)
        states.defvjp(lambda *args: (kernel_states(*args), args),
                      lambda args, cotangent: jax.vjp(xla_states, *args)[1](cotangent))  # fmt: skip
    q, qd = states(q0, qd0, params, dynamic)
    total = jnp.asarray(grid[0] + grid[1] * (num_saves - 1), jnp.int32)

    def finish(q0_, qd0_, p_, q_, qd_):
        bad = _start_bad(q0_, qd0_, p_)
        result = diffrax.RESULTS.successful
        return _finished(system, config, numbers, q0_, p_, q_, qd_, result, bad, total, total, engine="fused")

    return jax.vmap(finish)(q0, qd0, params, q, qd)
