"""A batch's fixed-step Runge-Kutta solve fused into one GPU kernel per save interval (Pallas).

Under ``jax.vmap`` XLA compiles a right-hand side of a few-coordinate system into many kernels, and the
intermediates of the UK solve travel through the device's memory between them. Here the whole solve
between two saved times runs in one kernel: one program instance per tile of scenarios, each scenario's
state held as entries (one vector over the tile per coordinate, which is what a kernel's block is), the
right-hand side evaluated from the same jaxpr that :mod:`ukjax._entrywise` interprets (every array of one
scenario's program held as its entries: stacking, slicing and small matrix products resolved while tracing,
everything else elementwise on the tile's vectors), the explicit Runge-Kutta stages a loop whose body holds
the right-hand side once, inside a ``fori_loop`` over the steps, and the state written to memory once per
save. This is what DiffEqGPU.jl's
``EnsembleGPUKernel`` does for an ODE (Utkarsh et al. 2024: one thread per trajectory, the fixed-step solve
in one kernel), applied to the Udwadia-Kalaba right-hand side of a constrained system the user writes.

The Runge-Kutta step is diffrax's explicit one (``diffrax.AbstractERK``: stages kᵢ = h f(t + cᵢ h, y + Σⱼ
aᵢⱼ kⱼ), y₁ = y + Σᵢ bᵢ kᵢ) for any Butcher tableau (``RK4``'s, ``Tsit5``'s); stages that no later stage
and not the solution use (Tsit5's first-same-as-last stage) are not evaluated. Times advance as diffrax's
constant step does (t ← t + h), so a fused trajectory equals the XLA program's up to the order of
floating-point sums (``tests/test_fused.py``: 1e-13 in float64).

Loops in the right-hand side (the ``fori_loop`` factorizations of :mod:`ukjax.linalg` above its unroll
limit, a model's own ``scan`` or ``fori_loop``) are unrolled while the kernel is traced, where their trip
counts are known then (:func:`ukjax._entrywise.unrolling_loops`: the body's jaxpr evaluated trip by trip on
the entries, indexing by the loop counter resolved while tracing; ``tests/test_fused.py`` checks a
right-hand side with a scan-based Cholesky, loop substitutions and a while loop with traced bounds to
1e-13). A loop whose trip count depends on the data is refused with its name, and so is a right-hand
side of more than :data:`MAX_ENTRY_OPERATIONS` operations on entries, loops unrolled or not (the kernel's
compile time): the five-bar (n = 12, ~34,000), whose interpret-mode program XLA:CPU did not finish
compiling in 5 minutes, the UR5 and the Panda loaded from their URDFs (~8,000 and ~12,300).

Backends: on a GPU the kernel is lowered by Pallas's Triton backend, which lowers float64 arithmetic
(libdevice's float64 functions; jax 0.10's default GPU backend, Mosaic GPU, targets warpgroup matrix
instructions, has no float64 path, and failed to lower this kernel's jaxpr); on any other platform, and in
the tests, Pallas's interpret mode runs the same kernel as ordinary XLA code (keeping ukjax's fusion
boundaries there, which keep XLA:CPU's compile time near the XLA engine's).

:func:`ukjax.simulation.simulate_batch` runs it with ``engine="fused"`` (or ``"auto"`` on a GPU) and
post-processes the saved states as the XLA program does; derivatives are the XLA program's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ukjax import _entrywise

DEFAULT_TILE = 128
"""Scenarios per program instance on a GPU: one per thread of 4 warps (Triton's default ``num_warps``)."""
NUM_WARPS = 4
"""Warps per program instance (Triton): 128 threads, one scenario each at the default tile."""
INTERPRET_TILE = 1024
"""Scenarios per program instance in interpret mode (CPU): few grid steps, long vectors."""


def _stages(tableau) -> tuple[tuple[float, tuple[float, ...]], ...]:
    """(cᵢ, (aᵢ₀, ..., aᵢ,ᵢ₋₁)) of every stage that the solution or a later stage uses."""
    c = (0.0, *(float(x) for x in np.asarray(tableau.c)))
    a = ((),) + tuple(tuple(float(x) for x in np.asarray(row)) for row in tableau.a_lower)
    b = [float(x) for x in np.asarray(tableau.b_sol)]
    used = len(b)
    while (
        used > 0
        and b[used - 1] == 0.0
        and all(len(a[j]) < used or a[j][used - 1] == 0.0 for j in range(used, len(a)))
    ):
        used -= 1
    return tuple((c[i], a[i]) for i in range(used)), tuple(b[:used])


def _pick(i, values, dtype):
    """values[i] for a traced stage index i and constant values, as Σⱼ valuesⱼ · [i = j] (exact: one term
    is the value, the others 0; Pallas's Triton lowering mistypes a select between scalars)."""
    return _weighted_sum(list(values), [_indicator(i, j, dtype) for j in range(len(values))])


def _indicator(i, j, dtype):
    """1.0 where the traced index i equals j, else 0.0."""
    return (i == j).astype(dtype)


def _weighted_sum(weights, vectors):
    """Σ weights[j] · vectors[j]."""
    total = weights[0] * vectors[0]
    for w, v in zip(weights[1:], vectors[1:], strict=True):
        total = total + w * v
    return total


def _rk_step(rhs, tableau_stages, t, h, y):
    """One explicit Runge-Kutta step on entries (y: a list of vectors over the tile), its stages a
    ``fori_loop`` whose body evaluates the right-hand side once: stage i forms yᵢ = y + Σⱼ aᵢⱼ kⱼ with the
    tableau's row i picked by the loop index (kⱼ = 0 for the stages not yet computed, so the sum runs over
    all of them), evaluates kᵢ = h f(t + cᵢ h, yᵢ) and stores it; then y₁ = y + Σᵢ bᵢ kᵢ. One copy of the
    right-hand side in the kernel instead of one per stage: 4-6x less code to compile (the kernel's
    compilation, not its arithmetic, is what a large model makes expensive)."""
    stages, b = tableau_stages
    s = len(stages)
    rows = [[a[j] if j < len(a) else 0.0 for j in range(s)] for _, a in stages]
    c = [ci for ci, _ in stages]

    def stage(i, ks):
        dtype = y[0].dtype
        weights = [_pick(i, [rows[r][j] for r in range(s)], dtype) for j in range(s)]
        yi = [y[e] + _weighted_sum(weights, [k[e] for k in ks]) for e in range(len(y))]
        k_new = [h * fe for fe in rhs(t + _pick(i, c, dtype) * h, yi)]
        # kᵢ stored by blending with the indicator of stage i (exact for finite values: 1·k + 0·old)
        hit = [_indicator(i, j, dtype) for j in range(s)]
        return tuple(tuple(hit[j] * k_new[e] + (1.0 - hit[j]) * ks[j][e] for e in range(len(y)))
                     for j in range(s))  # fmt: skip

    zeros = tuple(jnp.zeros_like(v) for v in y)
    ks = jax.lax.fori_loop(0, s, stage, tuple(zeros for _ in range(s)))
    return [y[e] + _weighted_sum(list(b), [k[e] for k in ks]) for e in range(len(y))]


class _Program:
    """The jaxpr of one scenario's right-hand side with its inputs laid out for the kernel: the state's
    entries and the batched argument entries as one vector over the scenarios each, the shared numbers
    (unbatched arguments, the interval's start time, the step) in one small array."""

    def __init__(self, field, y0, args, batched_args):
        self.y_tree = jax.tree_util.tree_structure(y0)
        y_leaves = jax.tree_util.tree_leaves(y0)
        self.y_shapes = [x.shape[1:] for x in y_leaves]
        self.dtype = jnp.result_type(*y_leaves)
        arg_leaves, self.arg_tree = jax.tree_util.tree_flatten(args)
        flags = jax.tree_util.tree_structure(batched_args).flatten_up_to(args)
        flag_leaves = jax.tree_util.tree_leaves(batched_args)
        self.arg_flags = [flag for flag, sub in zip(flag_leaves, flags, strict=True)
                          for _ in jax.tree_util.tree_leaves(sub)]  # fmt: skip
        self.arg_avals = [jax.ShapeDtypeStruct(jnp.shape(x)[1:] if b else jnp.shape(x), jnp.result_type(x))
                          for x, b in zip(arg_leaves, self.arg_flags, strict=True)]  # fmt: skip
        t_aval = jax.ShapeDtypeStruct((), self.dtype)
        y_avals = [jax.ShapeDtypeStruct(s, self.dtype) for s in self.y_shapes]

        def flat(t, *leaves):
            y = jax.tree_util.tree_unflatten(self.y_tree, leaves[: len(y_avals)])
            a = jax.tree_util.tree_unflatten(self.arg_tree, leaves[len(y_avals) :])
            return jax.tree_util.tree_leaves(field(t, y, a))

        self.closed = jax.make_jaxpr(flat)(t_aval, *y_avals, *self.arg_avals)
        out_shapes = [v.aval.shape for v in self.closed.jaxpr.outvars]
        if out_shapes != self.y_shapes:
            raise ValueError(
                f"ukjax.fused: the field's outputs {out_shapes} do not match the state {self.y_shapes}"
            )
        self.refusal = _unruled(self.closed)[1]
        self.consts = [_entrywise._entries_of_array(np.asarray(c), False) if _is_concrete(c)
                       else None for c in self.closed.consts]  # fmt: skip
        self.traced_consts = [c for c in self.closed.consts if not _is_concrete(c)]

    def batched_vectors(self, y0, args) -> list:
        """The state's entries and the batched arguments' entries, one (N,) vector each."""
        out = []
        for x in jax.tree_util.tree_leaves(y0):
            out += [x[(slice(None), *idx)] for idx in np.ndindex(*x.shape[1:])]
        for x, b in zip(jax.tree_util.tree_leaves(args), self.arg_flags, strict=True):
            if b:
                x = jnp.asarray(x)
                out += [x[(slice(None), *idx)].astype(self.dtype) for idx in np.ndindex(*x.shape[1:])]
        return out

    def shared_numbers(self, args) -> list:
        """The unbatched arguments' entries (as the state's dtype) and the traced constants, flattened."""
        out = []
        for x, b in zip(jax.tree_util.tree_leaves(args), self.arg_flags, strict=True):
            if not b:
                out += list(jnp.ravel(jnp.asarray(x)).astype(self.dtype))
        for c in self.traced_consts:
            out += list(jnp.ravel(jnp.asarray(c)).astype(self.dtype))
        return out

    @property
    def state_size(self) -> int:
        return sum(int(np.prod(s)) for s in self.y_shapes)

    def rhs_on_entries(self, batched_entries, shared, size: int):
        """rhs(t, y_entries) -> dy/dt entries, the arguments' entries taken from the kernel's inputs."""
        arg_inputs, k, s = [], 0, 0
        for aval, b in zip(self.arg_avals, self.arg_flags, strict=True):
            count = int(np.prod(aval.shape))
            if b:
                values = [
                    v.astype(aval.dtype) if aval.dtype != self.dtype else v
                    for v in batched_entries[k : k + count]
                ]
                k += count
            else:
                values = [_cast(shared(s + i), aval.dtype) for i in range(count)]
                s += count
            arg_inputs.append(_entrywise._objects(aval.shape, values))
        consts = []
        for entries, c in zip(self.consts, self.closed.consts, strict=True):
            if entries is not None:
                consts.append(entries)
                continue
            count = int(np.prod(np.shape(c)))
            consts.append(
                _entrywise._objects(
                    np.shape(c), [_cast(shared(s + i), jnp.result_type(c)) for i in range(count)]
                )
            )
            s += count

        def rhs(t, y):
            y_inputs, e = [], 0
            for shape in self.y_shapes:
                count = int(np.prod(shape))
                y_inputs.append(_entrywise._objects(shape, y[e : e + count]))
                e += count
            outs = _entrywise._eval(
                self.closed.jaxpr, consts, [_entrywise._scalar(t), *y_inputs, *arg_inputs], size
            )
            return [entry for out in outs for entry in out.flat]

        return rhs


def _unrolled(rhs, in_kernel: bool):
    """rhs evaluated with loops unrolled (:func:`ukjax._entrywise.unrolling_loops`) and, ``in_kernel``, as
    the body of a GPU kernel (:func:`ukjax._entrywise.inside_kernel`)."""

    def evaluated(t, y):
        with _entrywise.unrolling_loops():
            if not in_kernel:
                return rhs(t, y)
            with _entrywise.inside_kernel():
                return rhs(t, y)

    return evaluated


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _cast(x, dtype):
    return x if jnp.result_type(x) == dtype else jnp.asarray(x).astype(dtype)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _launch(program: _Program, tableau_stages, steps: int, tile: int, interpret: bool, batched_count: int,
            shared_count: int, padded: int):  # fmt: skip
    """The pallas_call that advances every scenario by ``steps`` steps: (state vectors, batched argument
    vectors, shared numbers) -> state vectors."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pl_triton

    n_state = program.state_size
    shared_width = _pow2(shared_count + 2)

    def kernel(*refs):
        inputs, outputs = refs[: batched_count + 1], refs[batched_count + 1 :]
        shared_ref = inputs[-1]
        shared = lambda i: shared_ref[i + 2]
        vectors = [ref[...] for ref in inputs[:batched_count]]
        t_start, h = shared_ref[0], shared_ref[1]
        y = vectors[:n_state]
        rhs = program.rhs_on_entries(vectors[n_state:], shared, tile)
        # interpret mode is XLA:CPU code: its fusion boundaries keep it quick to compile
        rhs = _unrolled(rhs, in_kernel=not interpret)
        rhs_vectors = lambda t, y_: [jnp.broadcast_to(v, (tile,)).astype(program.dtype) for v in rhs(t, y_)]

        def body(_, carry):
            t, y_ = carry
            y_next = _rk_step(rhs_vectors, tableau_stages, t, h, list(y_))
            return t + h, tuple(y_next)

        _, y_end = jax.lax.fori_loop(0, steps, body, (t_start, tuple(y)))
        for ref, value in zip(outputs, y_end, strict=True):
            ref[...] = value

    vector_spec = pl.BlockSpec((tile,), lambda i: (i,))
    shared_spec = pl.BlockSpec((shared_width,), lambda i: (0,))
    call = pl.pallas_call(
        kernel,
        grid=(padded // tile,),
        in_specs=[vector_spec] * batched_count + [shared_spec],
        out_specs=[vector_spec] * n_state,
        out_shape=[jax.ShapeDtypeStruct((padded,), program.dtype)] * n_state,
        interpret=interpret,
        compiler_params=None if interpret else pl_triton.CompilerParams(num_warps=NUM_WARPS),
        name="ukjax_fused_rk",
    )

    def advance(state, batched_args, t_start, h, shared_numbers):
        numbers = jnp.stack([t_start, h, *shared_numbers]) if shared_numbers else jnp.stack([t_start, h])
        numbers = jnp.pad(numbers, (0, shared_width - numbers.shape[0]))
        return call(*state, *batched_args, numbers)

    return advance


def integrate(field, y0, args, batched_args, *, t0, dt, steps_per_save: int, num_saves: int, tableau,
              steps_to_first_save: int = 0, tile: int | None = None,
              interpret: bool | None = None):  # fmt: skip
    """The states of a batch at ``num_saves`` saved times t0 + (f + k · steps_per_save) · dt (k = 0, 1, ...;
    f = ``steps_to_first_save``, 0: the first save is the initial state), by fixed steps of the explicit
    Runge-Kutta method ``tableau`` (a ``diffrax.ButcherTableau``), one fused kernel per save interval (and
    one more from t0 to the first save where f > 0).

    ``field(t, y, args)``: dy/dt of ONE scenario, y a pytree of arrays; ``y0``: that pytree with a leading
    batch axis (N, ...); ``args``: the arguments, with ``batched_args`` (booleans in a pytree prefix of
    ``args``, like ``in_axes``) saying which leaves carry the batch axis. Returns y's pytree with leaves
    (N, num_saves, ...). ``tile``: scenarios per program instance (default :data:`DEFAULT_TILE` on a GPU,
    :data:`INTERPRET_TILE` elsewhere); ``interpret``: Pallas's interpret mode (default: off on a GPU only).
    Raises ``ValueError`` where the right-hand side holds an operation the entrywise evaluation has no rule
    for (:func:`ukjax._entrywise.unruled_primitives`; loops are unrolled where their trip counts are known
    while tracing) or exceeds :data:`MAX_ENTRY_OPERATIONS` (:func:`refusal`): those need the XLA program."""
    program = _Program(field, y0, args, batched_args)
    if program.refusal:
        raise ValueError(f"ukjax.fused: {program.refusal}; use the XLA engine")
    on_gpu = jax.default_backend() == "gpu"
    interpret = (not on_gpu) if interpret is None else interpret
    batch = jax.tree_util.tree_leaves(y0)[0].shape[0]
    tile = tile or (DEFAULT_TILE if not interpret else min(INTERPRET_TILE, _pow2(batch)))
    padded = -(-batch // tile) * tile
    vectors = program.batched_vectors(y0, args)
    vectors = [
        jnp.concatenate([v, jnp.repeat(v[-1:], padded - batch)]) if padded > batch else v for v in vectors
    ]
    n_state = program.state_size
    state, batched_arg_vectors = vectors[:n_state], vectors[n_state:]
    shared_numbers = program.shared_numbers(args)
    launch = lambda steps: _launch(program, _stages(tableau), steps, tile, interpret, len(vectors),
                                   len(shared_numbers), padded)  # fmt: skip
    dtype = program.dtype
    t0, h = jnp.asarray(t0, dtype), jnp.asarray(dt, dtype)
    if steps_to_first_save:
        state = launch(steps_to_first_save)(list(state), batched_arg_vectors, t0, h, shared_numbers)
        t0 = _advanced_time(t0, h, steps_to_first_save)
    if num_saves > 1:
        advance = launch(steps_per_save)

        def interval(carry, _):
            t, state_ = carry
            state_next = advance(list(state_), batched_arg_vectors, t, h, shared_numbers)
            t_next = _advanced_time(t, h, steps_per_save)
            return (t_next, tuple(state_next)), tuple(state_next)

        _, later = jax.lax.scan(interval, (t0, tuple(state)), None, length=num_saves - 1)
        saved = [jnp.concatenate([v[None], w], axis=0)[:, :batch] for v, w in zip(state, later, strict=True)]
    else:
        saved = [v[None, :batch] for v in state]
    leaves, e = [], 0
    for shape in program.y_shapes:
        count = int(np.prod(shape))
        stacked = (
            jnp.stack(saved[e : e + count], axis=-1) if count else jnp.zeros((num_saves, batch, 0), dtype)
        )
        leaves.append(jnp.moveaxis(stacked.reshape(num_saves, batch, *shape), 0, 1))
        e += count
    return jax.tree_util.tree_unflatten(program.y_tree, leaves)


def _advanced_time(t, h, steps: int):
    """t advanced by ``steps`` steps of h one addition at a time, as the kernel and diffrax's constant step
    do."""
    return jax.lax.fori_loop(0, steps, lambda _, s: s + h, t)


def lowered_for_cuda(fn, *args) -> str:
    """The StableHLO text of ``jax.jit(fn)`` lowered for CUDA, without a GPU (the lowering ``jax.export``
    uses, without its refusal of custom calls that have no compatibility guarantee, as Triton kernels
    have): the fused kernel appears as a ``__gpu$xla.gpu.triton`` custom call."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def save_grid(ts, t0, dt) -> tuple[int, int] | None:
    """(steps from t0 to the first saved time, steps between consecutive saved times) when the saved times lie
    on the step grid from t0: ts[0] = t0 + f dt for an integer f >= 0 (``ts=[t1]``, the final state only, is
    f = (t1 - t0)/dt and no interval: m = 0) and ts[k] = ts[0] + k m dt for an integer m >= 1, to 1e-9
    relative, or 64 ulps of the times' dtype where that is coarser (float32 times such as 0.025 and a step of
    0.005 are 5 steps apart to 6e-8 only); None otherwise or where the times are not known on the host
    (traced)."""
    try:
        dtypes = [np.asarray(x).dtype for x in (ts, t0, dt)]
        ts, t0, dt = np.asarray(ts, np.float64), float(t0), float(dt)
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None
    ulps = 64 * max((float(np.finfo(d).eps) for d in dtypes if np.issubdtype(d, np.floating)), default=0.0)
    tol = max(1e-9, ulps)
    if ts.ndim != 1 or ts.size < 1 or not np.all(np.isfinite(ts)) or not dt > 0:
        return None

    def whole_steps(span) -> int | None:
        count = span / dt
        steps = int(round(count))
        return steps if steps >= 0 and abs(count - steps) <= tol * max(1, steps) else None

    first = whole_steps(ts[0] - t0)
    every = whole_steps(ts[1] - ts[0]) if ts.size > 1 else 0
    if first is None or every is None or (ts.size > 1 and every < 1):
        return None
    grid = t0 + (first + np.arange(ts.size) * every) * dt
    grid_tol = max(1e-12, ulps)
    on_grid = np.allclose(ts, grid, rtol=grid_tol, atol=grid_tol * max(1.0, abs(float(ts[-1]))))
    return (first, every) if on_grid else None


def is_explicit_runge_kutta(solver_type) -> bool:
    """Whether a diffrax solver class is an explicit Runge-Kutta method (RK4, Tsit5, ...), which the kernel
    runs."""
    import diffrax

    explicit = issubclass(solver_type, diffrax.AbstractERK)
    return explicit and not getattr(solver_type.tableau, "implicit", False)


def reason_not_applicable(system, config, numbers) -> str | None:
    """Why the fused kernel cannot run this simulation (None where it can): it runs fixed-step explicit
    Runge-Kutta solves without a projection, saved on the step grid; whether the right-hand side has entry
    rules is checked when it is traced (:func:`integrate`)."""

    solver = config.solver
    if config.adaptive or numbers.controller is not None or not config.has_dt0:
        return "it integrates with a fixed step only (give dt, no stepsize_controller)"
    if not is_explicit_runge_kutta(type(solver)):
        return f"it runs explicit Runge-Kutta solvers only (RK4, Tsit5, ...), not {type(solver).__name__}"
    if system.normalize is not None:
        return "the system's coordinates are projected onto a manifold after every step (ball or free joints)"
    if save_grid(numbers.ts, numbers.t0, numbers.dt) is None:
        return "the saved times must be t0 + (f + k m) dt for integers f, m (evenly spaced on the step grid)"
    t1, last = float(np.asarray(numbers.t1)), float(np.asarray(numbers.ts)[-1])  # host values (no JAX op)
    if abs(t1 - last) > 1e-12 * max(1.0, abs(t1)):
        return "the last saved time must be t1"
    return None


def unruled_primitives(field, y_one, args_one) -> set[str]:
    """The primitives of ``field(t, y, args)`` for one scenario (``y_one``, ``args_one`` without a batch axis)
    that the entrywise evaluation has no rule for, loops unrolled as the kernel unrolls them (a loop too
    large to unroll, :data:`MAX_ENTRY_OPERATIONS`, is named): empty where the fused kernel can run it
    (:func:`refusal` also says whether it is too large)."""
    return _unruled(_entrywise.one_scenario_jaxpr(field, y_one, args_one))[0]


def refusal(field, y_one, args_one) -> str | None:
    """Why the fused kernel does not run ``field(t, y, args)`` (one scenario, as for
    :func:`unruled_primitives`): operations without entry rules, or a right-hand side above
    :data:`MAX_ENTRY_OPERATIONS`; None where it runs it."""
    return _unruled(_entrywise.one_scenario_jaxpr(field, y_one, args_one))[1] or None


MAX_ENTRY_OPERATIONS = 5000
"""Operations on entries (:func:`ukjax._entrywise.entry_operations`, loops unrolled) above which the kernel
is not built: its compile time grows with them. The SCARA's right-hand side is ~1,600 (its interpret-mode
program compiles in ~15 s on the CPU, its Triton kernel in 4-7 s on an H200); the five-bar's (n = 12:
loop-based Cholesky, substitutions and pivoted LDLᵀ sweeps, 5 loops of 12 trips over 12 x 12 matrices)
unrolls into ~34,000, whose program XLA:CPU did not finish compiling in 5 minutes (13 GB; the unrolled
right-hand side alone, under ``jax.jit``, not in 280 s); the UR5's is ~8,000 and the Panda's ~12,300 (the
Panda's interpret-mode program did not compile in 9 minutes here). Triton's compile time for those sizes
is still to be measured on a GPU (``benchmarks/fused_reach.py --max-entry-operations``)."""


_NO_RULE = "cannot evaluate entry by entry"


def _unruled(closed) -> tuple[set[str], str]:
    """(the primitives the kernel has no entry rule for, why the kernel does not run the right-hand side:
    empty where it does). Loops are unrolled (:func:`ukjax._entrywise.unrolling_loops`) where their trip
    counts are known while tracing; a right-hand side above :data:`MAX_ENTRY_OPERATIONS` is refused, its
    loops named as without a rule."""
    unruled = _entrywise.unruled_primitives(closed, unroll_loops=True)
    if unruled:
        return unruled, f"the right-hand side holds {sorted(unruled)}, which the fused kernel {_NO_RULE}"
    size = _entrywise.entry_operations(closed)
    if size <= MAX_ENTRY_OPERATIONS:
        return set(), ""
    loops = _entrywise.unruled_primitives(closed)
    unrolled = f" holds {sorted(loops)}, whose unrolled right-hand side" if loops else ""
    return loops, (f"the right-hand side{unrolled} would hold ~{size} operations on entries, above the fused "
                   f"kernel's {MAX_ENTRY_OPERATIONS} (its compile time)")  # fmt: skip


__all__ = [
    "integrate",
    "save_grid",
    "reason_not_applicable",
    "is_explicit_runge_kutta",
    "unruled_primitives",
    "refusal",
    "lowered_for_cuda",
    "DEFAULT_TILE",
    "NUM_WARPS",
    "INTERPRET_TILE",
    "MAX_ENTRY_OPERATIONS",
]
