"""The options of :func:`~ukjax.simulation.simulate` and :func:`~ukjax.simulation.simulate_batch`: their
defaults, the checks made on the host before anything is compiled, and their split into the program's
static configuration and its traced numbers.

Both functions hand their arguments to :func:`_arguments`, the one path from what the user gave to what the
compiled program takes:

* every argument is checked on the host (``ukjax._validation``): a wrong shape, dtype, span, step or
  tolerance, or a model that fails at the initial state, raises ``ValueError`` naming it before compiling;
* defaults that depend on the call are chosen: the step budget (for a fixed step exactly the steps the
  span needs), the adjoint's checkpoints, the tolerances of the status in the state's dtype (the defaults
  of :mod:`ukjax.diagnostics`);
* what changes the compiled program goes into :class:`_Config` (static, hashable: the jit cache key) and
  every other number into :class:`_Numbers` (traced: a new value does not recompile);
* for a batch, ``batch_params`` is applied and shared parameters are broadcast, so that shared and
  per-scenario parameters use one compiled program, and ``chunk_size`` is resolved.

:data:`OPTION_DEFAULTS` is the table of the options and their defaults, as the two signatures give them, and
:data:`STATIC_OPTIONS` those that change the compiled program; the sweep spec (``ukjax.sweep``) takes its
integrator defaults, and which of its options compile a new program, from them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import _validation as validate
from ukjax import dynamics
from ukjax._config import float64_enabled
from ukjax.diagnostics import DEFAULT_CONSISTENCY_RTOL, DEFAULT_CONSTRAINT_ATOL, DEFAULT_CONSTRAINT_RTOL
from ukjax.system import SOLVERS, System

DEFAULT_NUM_SAVES = 201
"""Number of evenly spaced save times when ``ts`` is not given."""

DEFAULT_MAX_STEPS = 65536
"""Step budget when ``max_steps`` is ``None`` and the step count is not known on the host (adaptive steps,
or a span or step that is traced); a fixed step over a known span gets exactly the steps it needs."""

DEFAULT_CPU_CHUNK = 256
"""Scenarios per chunk of :func:`~ukjax.simulation.simulate_batch` on CPU (``chunk_size="auto"``).

Under ``vmap`` every intermediate of an integration step is an array over the batch, hundreds of them alive;
past a few hundred scenarios they no longer fit the CPU caches. SCARA, fixed-step Tsit5, 200 steps, CPU
seconds per scenario-step on one core of the 2-core CPU (load ~3.5; ``benchmarks/throughput.py``): 1024
scenarios in one ``vmap`` 2.73 µs, in chunks of 512 / 256 / 128 / 64: 2.67 / 2.36 / 2.31 / 2.69 µs; 8192
scenarios in one ``vmap`` 4.23 µs, in chunks of 2048 / 1024 / 256: 3.74 / 2.70 / 2.33 µs. On an accelerator
the whole batch is one ``vmap`` (it wants large batches). Where XLA:CPU compiles small loops whole
(:func:`ukjax.whole_cpu_loops`), the chunks are smaller still: :func:`whole_loop_chunk`."""

WHOLE_LOOP_STEP_BYTES = 6_000_000
"""Budget of :func:`whole_loop_chunk`: the bytes one step of a chunk writes, counted on the right-hand side's
jaxpr (:func:`ukjax._entrywise.entry_operations` x the dtype's size x evaluations per step x scenarios).

XLA:CPU compiles a loop whole when its iteration touches fewer bytes than its threshold after fusion
(:data:`ukjax._config.CPU_LOOP_BYTES`, 4 MiB), a number known only once compiled. The jaxpr's count is
larger and its ratio to XLA's varies by model: at a threshold of 1 MiB, chunks of 8 UR5 scenarios (RK4,
1.9 MB by this count) and of 64 user-written SCARAs (Tsit5, entry by entry, 4.2 MB) and of 8 Jansen legs
(5.1 MB) were compiled whole, 16 UR5s (3.9 MB) and 128 SCARAs (8.4 MB) were not; at 4 MiB, 32 UR5s (7.7 MB)
were. So XLA's bytes are 0.27-0.54 of this count for the UR5, less than 0.21 for the others, and 6 MB keeps
every chunk chosen below 3.3 MB by XLA's count, under the 4 MiB threshold."""


OPTION_DEFAULTS = {
    "t0": 0.0, "ts": None, "solver": None, "dt0": None, "rtol": 1e-8, "atol": 1e-8, "max_steps": None,
    "method": "ldl", "uk_solver": "uk", "pinv_rtol": None, "consistency_rtol": None, "constraint_rtol": None,
    "constraint_atol": None, "saveat": None, "stepsize_controller": None, "adjoint": None, "progress": False,
    "throw": False, "dt": None,
}
"""The keyword options of :func:`~ukjax.simulation.simulate` and their defaults, as its signature (and that of
:func:`~ukjax.simulation.simulate_batch`, which adds ``batch_params``, ``chunk_size``, ``bucket``, ``engine``
and ``devices``) gives them; ``t1`` is required. ``None`` stands for a value chosen at the call (from the
dtype, the step, the span)."""

_OPTIONS = ("t1", *OPTION_DEFAULTS)


def as_params(params):
    """``params`` with every floating leaf a strongly typed JAX array of its own dtype (Python floats in the
    default float dtype); other leaves unchanged.

    ``jnp.array(1.0)`` and Python floats are *weakly typed*: a ``jax.jit`` compiled for them is compiled
    again when the same leaves come back strongly typed, e.g. after an optax update (three compilations of a
    tuning step instead of one). :func:`~ukjax.simulation.simulate` and :mod:`ukjax.tune` normalize their
    parameters with this function; call it on parameters you pass to your own jitted functions.
    """

    def strong(x):
        if isinstance(x, float) or (
            isinstance(x, jax.Array | np.ndarray | np.floating) and np.issubdtype(x.dtype, np.inexact)
        ):
            return jnp.asarray(x, dtype=jnp.result_type(x))
        return x  # integers, booleans, and what the input checks refuse by name (strings)

    return jax.tree_util.tree_map(strong, params)


# ---------------------------------------------------------------------- configuration (static under jit)
ENTRYWISE_MAX_N = 8
"""Largest number of velocity coordinates for which a batch evaluates the right-hand side entry by entry
(:mod:`ukjax._entrywise`): the size up to which ukjax's small-matrix algebra is unrolled into entries."""

ENTRYWISE_MIN_BATCH = 64
"""Fewest scenarios per ``vmap`` (per chunk of :func:`~ukjax.simulation.simulate_batch`) evaluated entry by
entry; smaller batches use ``vmap``'s program, which compiles faster (SCARA: 3.2 against 3.6 s)."""


def _entrywise_pays() -> bool:
    """Whether the default backend is one where the entrywise right-hand side was measured to pay: the CPU
    (1.3-1.7x the ``vmap`` program's speed). On one H200 both ran the user-written SCARA at the same rate
    (1.31e8 float64 scenario-steps/s at 1e6 scenarios; 4.23e8 and 4.27e8 float32) and the ``vmap`` program
    compiled faster (5.2 against 8.2 s float64): a GPU gets the ``vmap`` program."""
    return jax.default_backend() == "cpu"


def _loops_pay() -> bool:
    """Whether one scenario's right-hand side, and a ``vmap`` of it below the entrywise threshold, trace the
    small factorizations as loops (:func:`ukjax.linalg.looped_factorizations`, where the measurements are):
    on the CPU, where each of the unrolled form's tiny kernels is dispatched on its own; not on a GPU, where
    a loop inside the right-hand side costs kernel launches at every trip."""
    return jax.default_backend() == "cpu"


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
    # Fewest scenarios per vmap whose right-hand side is evaluated entry by entry; None: never (see
    # ENTRYWISE_MAX_N, ENTRYWISE_MIN_BATCH).
    entrywise_min_batch: int | None = eqx.field(static=True, default=None)
    # Its values assembled behind ukjax._entrywise._fence (simulate_batch sets it where it loops over chunks).
    entrywise_fenced_values: bool = eqx.field(static=True, default=False)

    @property
    def entrywise_tangents(self) -> bool:
        """Its tangents entry by entry too: under diffrax's ``ForwardMode`` only (it cannot be transposed;
        see ukjax._entrywise.batched_by_entries)."""
        return self.entrywise_min_batch is not None and isinstance(self.adjoint, diffrax.ForwardMode)


STATIC_OPTIONS = tuple(name for name in _OPTIONS if name in {f.name for f in dataclasses.fields(_Config)})
"""The options whose value is part of the compiled program (fields of :class:`_Config`): a new value
compiles a new program. The other options become traced numbers (:class:`_Numbers`), and a new value of one
does not recompile unless it switches between ``None`` and a value (``dt0``, ``pinv_rtol``), changes a
shape (``ts``, ``saveat``), changes the step budget that ``max_steps=None`` takes from a fixed step's span
(``t0``, ``t1``, ``dt0``), or is a ``stepsize_controller`` holding numbers that are not JAX arrays."""


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


def _pinv_rtol(config, numbers):
    return None if config.default_pinv_rtol else numbers.pinv_rtol


# ---------------------------------------------------------------------- options (checked before compiling)
def _arguments(arguments: dict, *, batched: bool):
    """The arguments of :func:`~ukjax.simulation.simulate` (``batched=False``) or
    :func:`~ukjax.simulation.simulate_batch` (``batched=True``), their ``locals()``, checked and prepared for
    the compiled program: (config, numbers, q0, qd0, params, chunk size). A batch's parameters come out with
    the batch axis on every leaf."""
    system, q0, qd0, params = (arguments[name] for name in ("system", "q0", "qd0", "params"))
    options = {name: arguments[name] for name in _OPTIONS}
    chunk_size = _chunk_size(arguments["chunk_size"]) if batched else None
    batch_params = arguments.get("batch_params", False)
    if not isinstance(batch_params, bool):
        params = _batched_by_spec(params, batch_params, np.shape(q0)[0] if np.ndim(q0) == 2 else None)
        batch_params = True
    config, numbers, q0, qd0, params = _prepare(
        system, q0, qd0, params, batched=batched, batch_params=batch_params, **options
    )
    if batched and not batch_params:
        # Shared parameters are broadcast, so shared and per-scenario parameters use one compiled program.
        params = _batched_by_spec(params, False, q0.shape[0])
    return config, numbers, q0, qd0, params, chunk_size


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
    # The warnings below name the user's call: stacklevel 4 = _prepare, _arguments, simulate(_batch), caller.
    if not float64_enabled():
        warnings.warn(
            "ukjax: float64 is not enabled, so this simulation runs in float32 (call ukjax.enable_float64() "
            "first for accuracy work)",
            stacklevel=4,
        )
    solver = validate.solver(solver, diffrax.Tsit5())
    q0, qd0 = validate.state(system.n, q0, qd0, batched=batched, nq=system.nq)
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
    dt_value = None if dt is None else validate.host_float(dt)
    times_known = None not in (t0_value, t1_value) and (dt is None or dt_value is not None)
    times_known = times_known and all(validate.is_concrete(x) for x in jax.tree_util.tree_leaves(ts))
    # Times known on the host stay concrete inside a user's jit (where JAX would otherwise trace even
    # jnp.asarray of a Python number), so what is decided from them on the host (the fused engine's steps
    # between saves) is decided the same way under jit as outside it.
    with jax.ensure_compile_time_eval() if times_known else contextlib.nullcontext():
        t0, t1 = validate.scalar(t0, "t0", dtype), validate.scalar(t1, "t1", dtype)
        ts = validate.save_times(t0, t1, ts, DEFAULT_NUM_SAVES, t0_value, t1_value)
        if dt is not None:
            dt = validate.scalar(dt, step_name, dtype, positive=True)
    if dt is not None and fixed_step:
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
        # step once (cost ~ forward + one step and its VJP per step; memory ~ each step's solver state).
        # Otherwise diffrax's default binomial checkpointing, O(sqrt(max_steps)) checkpoints.
        fixed = fixed_step and known
        adjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=max_steps if fixed else None)
    batch = q0.shape[0] if batched else None
    poisoned = validate.parameters(params, batched=batched and batch_params, batch=batch)
    if poisoned:
        warnings.warn("ukjax: " + "; ".join(poisoned) + " (those scenarios get status nonfinite_state)",
                      stacklevel=4)
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
        entrywise_min_batch=(
            ENTRYWISE_MIN_BATCH if system.n <= ENTRYWISE_MAX_N and _entrywise_pays() else None
        ),
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


def bucket_of(count: int) -> int:
    """The smallest batch bucket >= ``count``: a power of two or three times one (1, 2, 3, 4, 6, 8, 12, 16,
    24, 32, 48, 64, 96, 128, 192, 256, ...), two buckets per octave.

    Why two per octave: a study or a sweep runs a few batch sizes near each other (100, 120; 200, 250), and
    each size compiles the whole simulation again (the SCARA program: ~16 CPU-s of XLA compile and ~4.5 of
    tracing on the 2-core CPU at load ~7; 100, 120, 200, 250, 1000, 1020 scenarios took 126-131 CPU-s in
    6 programs, 62-67 CPU-s in 3 with buckets: ``benchmarks/compile_buckets.py``). With two per octave those
    share a program, for at most 50 % padded scenarios (129 -> 192) and ~20 % on average over sizes; four
    per octave would bound the padding at 25 % but put 100 and 120 in different buckets."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"a batch bucket needs a count >= 1, got {count!r}")
    power = 1 << (int(count) - 1).bit_length()  # smallest power of two >= count
    three = 3 * power // 4  # 3 * 2^(k-2): the bucket between power/2 and power
    return three if power >= 4 and three >= count else power


def bucket_size(batch: int, chunk_size: int | None) -> int:
    """The padded batch that :func:`~ukjax.simulation.simulate_batch` compiles for ``batch`` scenarios in
    chunks of at most ``chunk_size`` (``None``: one ``vmap``), so that nearby batch sizes share one program.

    Up to one chunk, :func:`bucket_of` the batch, never more than the chunk (the batch stays one ``vmap``, as
    unpadded); above it, ``chunk_size`` times :func:`bucket_of` the number of chunks (then every chunk is
    exactly ``chunk_size``: 1000 and 1020 scenarios in chunks of 256 both run 4 x 256)."""
    if chunk_size is not None and batch > chunk_size:
        return bucket_of(-(-batch // chunk_size)) * chunk_size
    bucket = bucket_of(batch)
    return bucket if chunk_size is None else min(bucket, chunk_size)


def vmap_size(batch: int, chunk_size: int | None) -> int:
    """Scenarios per ``vmap`` when ``batch`` scenarios are split into equal chunks of at most ``chunk_size``
    (what :func:`~ukjax.simulation.simulate_batch` compiles, and what decides the entrywise evaluation)."""
    if chunk_size is None or batch <= chunk_size:
        return batch
    return -(-batch // -(-batch // chunk_size))


def whole_loop_chunk(step_bytes: int, chunk_size: int, entrywise_min_batch: int | None = None) -> int:
    """Scenarios per chunk of a CPU batch whose loop XLA:CPU compiles whole (one function, its arrays in the
    caches): the largest power of two up to ``chunk_size`` whose ``step_bytes`` per scenario and step stay
    within :data:`WHOLE_LOOP_STEP_BYTES`, at least 1; at least ``entrywise_min_batch`` where that is given
    (a system evaluated entry by entry from that many scenarios on, 1.3-1.7x faster than under ``vmap``).

    Measured (``benchmarks/batch_chunks_cpu.py``; one CPU device, medians of interleaved rounds, fresh
    processes): see the Benchmarks page, "Batches in whole loops"."""
    chunk = 1
    while 2 * chunk <= chunk_size and 2 * chunk * step_bytes <= WHOLE_LOOP_STEP_BYTES:
        chunk *= 2
    if entrywise_min_batch is not None and chunk < entrywise_min_batch <= chunk_size:
        chunk = entrywise_min_batch
    return chunk


def _chunk_size(chunk_size) -> int | None:
    """The chunk size of :func:`~ukjax.simulation.simulate_batch` (None: the whole batch) from its
    ``chunk_size`` argument."""
    if isinstance(chunk_size, str) and chunk_size == "auto":
        return DEFAULT_CPU_CHUNK if jax.default_backend() == "cpu" else None
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be 'auto', None or an int >= 1, got {chunk_size!r}")
    return int(chunk_size)
