"""A batch of small-matrix programs evaluated entry by entry, with the batch as the only array axis.

Under ``jax.vmap`` a right-hand side of a few-coordinate system is a program of ``(N, 4)`` and ``(N, 4, 4)``
arrays whose entries the model and the UK solve build and take apart one by one (``jnp.array([[...]])``,
``M[i, j]``, the unrolled Cholesky of :mod:`ukjax.linalg`). XLA:CPU lays those arrays out batch-major, so
every stack of entries is a strided scatter, every read of an entry a strided gather, and the batching
rules add transposes between them: in the SCARA right-hand side most of the time went to such layout
changes and not to arithmetic.

:func:`evaluate_entrywise` evaluates the jaxpr of one scenario's function with every array held as a NumPy
object array of its entries, each entry a vector over the batch (or a scalar the batch shares). Stacking,
slicing, reshaping, transposing and broadcasting then happen while tracing, at no run-time cost; matrix
products and reductions become sums of products of entries; every other operation is elementwise on
contiguous batch vectors. Equations it has no entry rule for (loops, gathers, LAPACK calls) run as they would
under ``vmap``: their operands are stacked into arrays, the primitive is bound under ``jax.vmap`` and its
results are split into entries again (for the fused kernel, :func:`unrolling_loops` unrolls loops with trip
counts known while tracing instead, and refuses the rest). So the values are those of ``jax.vmap(f)`` up to
the order of floating-point sums in matrix products (and which products XLA:CPU contracts into fused
multiply-adds: it does wherever a product and a sum share a kernel). Against one scenario's own program, the
SCARA's accelerations agree to 1e-15 relative, as ``vmap``'s do; along a trajectory the dynamics amplify that
round-off as they amplify a one-ulp change of the initial state (issue 39: docs/guide/precision.md, "Single vs
batch"; tests/test_entrywise.py pins single against batch at 1e-12 on a pendulum).

Only the values of the function it is given: custom derivative rules are inlined (their primal function
evaluated), so callers attach derivatives, from the ordinary program or from the jaxpr of ``jax.jvp`` of
the function evaluated entry by entry in turn (:func:`batched_by_entries` does either).
Platform-dependent code (``jax.lax.platform_dependent``) takes the branch of the default backend. Fusion
boundaries that ukjax puts in its own code (:func:`ukjax.linalg.materialize`) are kept, one per batch
vector.

Measured on the SCARA (n = m = 4; 1024 scenarios, 200 RK4 steps in a plain loop, 2-core Intel Xeon): the
right-hand side under ``vmap`` 241-265 ms, entry by entry 117-121 ms, for the shipped and the user-written
model alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Any, NamedTuple

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

from ukjax._shared import interpret
from ukjax.linalg import looped_factorizations

_ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type copy
    copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le log log1p
    logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n sign
    sin sinh sqrt square stop_gradient sub tan tanh xor""".split()
)
_INLINED = frozenset({"jit", "pjit", "closed_call", "core_call", "checkpoint", "remat", "custom_jvp_call",
                      "custom_vjp_call", "custom_vjp_call_jaxpr"})  # fmt: skip
_REDUCTIONS = {"reduce_sum": "add", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "mul",
               "reduce_and": "and", "reduce_or": "or"}  # fmt: skip


_INSIDE_KERNEL = contextvars.ContextVar("ukjax_entrywise_inside_kernel", default=False)
"""Set while a fused kernel (:mod:`ukjax.fused`) is traced: fusion boundaries are the identity there (the
whole solve is one kernel) and platform-dependent code takes its GPU branch."""


_UNROLLING = contextvars.ContextVar("ukjax_entrywise_unrolling", default=False)
"""Set while the fused kernel's right-hand side is traced (:mod:`ukjax.fused`, interpret mode included):
loops with a trip count known while tracing are unrolled (:func:`unrolling_loops`)."""


@contextlib.contextmanager
def unrolling_loops():
    """Evaluate entry by entry with loops unrolled, for the fused kernel (:mod:`ukjax.fused`), whose body
    holds no loop primitive of its own right-hand side: a ``scan`` (``fori_loop`` with static bounds) runs
    its body's jaxpr ``length`` times on the entries, carrying entries; a ``while`` runs its body as long as
    its condition, evaluated on the entries, is known while tracing (a ``fori_loop`` whose bounds are known
    numbers; the condition of a loop whose trip count depends on the data is a traced value: refused).
    Integer and boolean operations on entries known while tracing (loop counters, indices) are computed
    while tracing, a select with a known predicate takes its operand, and ``dynamic_slice``,
    ``dynamic_update_slice``, ``gather`` and ``scatter`` with known indices move entries (the
    factorizations of :mod:`ukjax.linalg` above its unroll limit index their matrices by the loop counter).
    An equation left without a rule raises instead of running under ``vmap`` (a kernel cannot):
    :func:`unruled_primitives` with ``unroll_loops=True`` names them beforehand.

    Not used by the XLA program (:func:`batched_by_entries`): there a loop keeps its ``vmap`` fallback, so
    the programs of the systems it evaluates entry by entry (n <= ``ukjax.options.ENTRYWISE_MAX_N``, whose
    factorizations :mod:`ukjax.linalg` unrolls itself) are what they were."""
    token = _UNROLLING.set(True)
    try:
        yield
    finally:
        _UNROLLING.reset(token)


@contextlib.contextmanager
def inside_kernel():
    """Evaluate entry by entry for the body of one GPU kernel (:mod:`ukjax.fused`): ``materialize`` is the
    identity and ``jax.lax.platform_dependent`` takes the branch for CUDA (else its default)."""
    token = _INSIDE_KERNEL.set(True)
    try:
        yield
    finally:
        _INSIDE_KERNEL.reset(token)


def _objects(shape, values):
    out = np.empty(shape, dtype=object)
    for idx, v in zip(np.ndindex(*shape), values, strict=True):
        out[idx] = v
    return out


def _entries_of_array(x, batched: bool):
    """Entries of an array: rows of its batch-last transpose if ``batched`` (leading batch axis)."""
    x = jnp.asarray(x) if not isinstance(x, (np.ndarray, np.generic)) else x
    shape = x.shape[1:] if batched else x.shape
    if batched:
        x = jnp.moveaxis(x, 0, -1)
    return _objects(shape, (x[idx] for idx in np.ndindex(*shape)))


def _is_known(entry):
    """Whether an entry is a number known while tracing (a NumPy value), not a traced one."""
    return isinstance(entry, (np.ndarray, np.generic))


def _is_batched(entry):
    return np.ndim(entry) == 1


def _assemble(entries, size, dtype):
    """An object array of entries as (array, batched): batch axis first where any entry is batched."""
    flat = list(entries.flat)
    batched = any(_is_batched(e) for e in flat)
    if not flat:
        return jnp.zeros(entries.shape, dtype), False
    if batched:
        flat = [jnp.broadcast_to(e, (size,)) for e in flat]
        return jnp.stack(flat, axis=-1).reshape(size, *entries.shape), True
    if all(isinstance(e, (np.ndarray, np.generic)) for e in flat):
        return np.asarray(flat).reshape(entries.shape), False
    return jnp.stack([jnp.asarray(e) for e in flat]).reshape(entries.shape), False


def _bind_entries(prim, params, args, size):
    """Bind ``prim`` on entries (vectors over the batch or scalars), broadcasting scalars as needed. Inside
    a kernel an operation on constants only is computed while tracing (a kernel's lowering may not take a
    constant operand where it expects a value)."""
    if (_INSIDE_KERNEL.get() or _UNROLLING.get()) and all(_is_known(a) for a in args):
        with jax.ensure_compile_time_eval():
            value = np.asarray(prim.bind(*args, **params))[()]
        # unrolling in interpret mode (XLA code): integers and booleans only (counters, indices, flags);
        # floating-point constants are left to XLA as in the XLA program
        if _INSIDE_KERNEL.get() or not np.issubdtype(value.dtype, np.inexact):
            return value
    if any(_is_batched(a) for a in args):
        args = [a if _is_batched(a) else jnp.broadcast_to(a, (size,)) for a in args]
    return prim.bind(*args, **params)


def _elementwise(eqn, invals, size):
    shape = eqn.outvars[0].aval.shape
    ops = [np.broadcast_to(x, shape) for x in invals]
    out = np.empty(shape, dtype=object)
    pick = eqn.primitive.name == "select_n" and (_UNROLLING.get() or _INSIDE_KERNEL.get())
    for idx in np.ndindex(*shape):
        entries = [o[idx] for o in ops]
        if pick and _is_known(entries[0]):  # a known predicate: the operand it selects, exactly
            out[idx] = entries[1 + int(np.clip(entries[0], 0, len(entries) - 2))]
            continue
        out[idx] = _bind_entries(eqn.primitive, eqn.params, entries, size)
    return [out]


_PRIMS: dict = {}


def _prim(name):
    if not _PRIMS:
        import jax.extend.core.primitives as p

        for attr in dir(p):
            value = getattr(p, attr)
            if isinstance(value, jex.Primitive):
                _PRIMS.setdefault(value.name, value)
    return _PRIMS[name]


def _combine(prim, entries, size):
    acc = entries[0]
    for e in entries[1:]:
        acc = _bind_entries(prim, {}, [acc, e], size)
    return acc


def _dot_general(eqn, invals, size):
    lhs, rhs = invals
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    L = np.transpose(lhs, [*lb, *lf, *lc])
    R = np.transpose(rhs, [*rb, *rc, *rf])
    bshape = L.shape[: len(lb)]
    fl, fr = L.shape[len(lb): len(lb) + len(lf)], R.shape[len(rb) + len(rc):]
    cshape = L.shape[len(lb) + len(lf):]
    nb, nl, nr, nc = (int(np.prod(s, dtype=int)) for s in (bshape, fl, fr, cshape))
    L = L.reshape(nb, nl, nc)
    R = R.reshape(nb, nc, nr)
    mul, add = _prim("mul"), _prim("add")
    out = np.empty((nb, nl, nr), dtype=object)
    dtype = eqn.outvars[0].aval.dtype
    for b, i, j in itertools.product(range(nb), range(nl), range(nr)):
        if nc == 0:
            out[b, i, j] = np.zeros((), dtype)
            continue
        terms = [_bind_entries(mul, {}, [L[b, i, k], R[b, k, j]], size) for k in range(nc)]
        total = _combine(add, terms, size)
        if jnp.result_type(total) != dtype:
            total = jnp.asarray(total).astype(dtype)
        out[b, i, j] = total
    return [out.reshape((*bshape, *fl, *fr))]


def _reduce(eqn, invals, size):
    (x,) = invals
    axes = tuple(eqn.params["axes"])
    keep = [d for d in range(x.ndim) if d not in axes]
    moved = np.transpose(x, [*keep, *axes])
    kshape = moved.shape[: len(keep)]
    moved = moved.reshape((*kshape, -1))
    prim = _prim(_REDUCTIONS[eqn.primitive.name])
    out = np.empty(kshape, dtype=object)
    for idx in np.ndindex(*kshape):
        out[idx] = _combine(prim, list(moved[idx]), size)
    return [out]


def _argmax_like(eqn, invals, size):
    (x,) = invals
    (axis,) = eqn.params["axes"]
    dtype = eqn.params["index_dtype"]
    better = _prim("gt" if eqn.primitive.name == "argmax" else "lt")
    select = _prim("select_n")
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], dtype=object)
    for idx in np.ndindex(*out.shape):
        row = moved[idx]
        best, where = row[0], np.zeros((), dtype)
        for k in range(1, len(row)):
            e = row[k]
            # NaN wins (first NaN), as in lax.argmax: take e if e beats best, or e is NaN and best is not.
            e_nan = _bind_entries(_prim("ne"), {}, [e, e], size)
            best_nan = _bind_entries(_prim("ne"), {}, [best, best], size)
            beats = _bind_entries(better, {}, [e, best], size)
            take = _bind_entries(
                _prim("and"), {}, [_bind_entries(_prim("or"), {}, [beats, e_nan], size),
                                   _bind_entries(_prim("not"), {}, [best_nan], size)], size
            )  # fmt: skip
            best = _bind_entries(select, {}, [take, best, e], size)
            where = _bind_entries(select, {}, [take, where, np.asarray(k, dtype)], size)
        out[idx] = where
    return [out]


_CUMULATIVE = {"cumsum": "add", "cumprod": "mul", "cummax": "max", "cummin": "min",
               "cumlogsumexp": None}  # fmt: skip


def _cumulative(eqn, invals, size):
    """Running sums (products, maxima, minima) along one axis, in order (from the end if ``reverse``)."""
    (x,) = invals
    op = _CUMULATIVE[eqn.primitive.name]
    if op is None:
        return _fallback(eqn, invals, size)
    moved = np.moveaxis(x, eqn.params["axis"], -1)
    out = np.empty(moved.shape, dtype=object)
    order = list(range(moved.shape[-1]))[::-1 if eqn.params["reverse"] else 1]
    for idx in np.ndindex(*moved.shape[:-1]):
        acc = None
        for k in order:
            entry = moved[idx + (k,)]
            acc = entry if acc is None else _bind_entries(_prim(op), {}, [acc, entry], size)
            out[idx + (k,)] = acc
    return [np.moveaxis(out, -1, eqn.params["axis"])]


def _broadcast_in_dim(eqn, invals, size):
    (x,) = invals[:1]
    shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    expanded = [1] * len(shape)
    for k, d in enumerate(dims):
        expanded[d] = x.shape[k]
    return [np.broadcast_to(x.reshape(expanded), shape)]


def _slice(eqn, invals, size):
    (x,) = invals
    p = eqn.params
    strides = p["strides"] or (1,) * x.ndim
    bounds = zip(p["start_indices"], p["limit_indices"], strides, strict=True)
    return [x[tuple(slice(start, stop, step) for start, stop, step in bounds)]]


def _pad(eqn, invals, size):
    x, value = invals
    out_shape = eqn.outvars[0].aval.shape
    fill = value[()] if isinstance(value, np.ndarray) else value
    out = _objects(out_shape, itertools.repeat(fill, int(np.prod(out_shape, dtype=int))))
    # Position of input index i along a dimension: lo + i (interior + 1); a negative lo or hi crops.
    index = [lo + np.arange(n) * (interior + 1)
             for (lo, _, interior), n in zip(eqn.params["padding_config"], x.shape, strict=True)]  # fmt: skip
    for idx in np.ndindex(*x.shape):
        pos = tuple(int(index[d][i]) for d, i in enumerate(idx))
        if all(0 <= p < m for p, m in zip(pos, out_shape, strict=True)):
            out[pos] = x[idx]
    return [out]


def _iota(eqn, invals, size):
    p = eqn.params
    shape, dim = p["shape"], p["dimension"]
    axis = np.arange(shape[dim], dtype=p["dtype"]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    values = np.broadcast_to(axis, shape)
    return [_objects(shape, values.flat)]


def _simple(fn):
    return lambda eqn, invals, size: [fn(eqn.params, *invals)]


def _split(eqn, invals, size):
    (x,) = invals
    axis = eqn.params["axis"]
    cuts = np.cumsum(eqn.params["sizes"])[:-1]
    return list(np.split(x, cuts, axis=axis))


def _unstack(eqn, invals, size):
    (x,) = invals
    moved = np.moveaxis(x, eqn.params["axis"], 0)
    return [moved[k, ...] for k in range(moved.shape[0])]


def _select_branch(index, n):
    if isinstance(index, _PlatformIndex):
        return index.branch()
    if isinstance(index, (np.ndarray, np.generic, int)):
        return int(np.clip(index, 0, n - 1))
    return None


class _PlatformIndex:
    """The value of ``platform_index``: the branch of the backend this program is traced for."""

    def __init__(self, params):
        self.platforms = params["platforms"]

    def branch(self):
        backend = "cuda" if _INSIDE_KERNEL.get() else jax.default_backend()
        default = None
        for i, names in enumerate(self.platforms):
            if names is None:
                default = i
            elif backend in names:
                return i
        if default is None:  # as lowering the program for this backend would refuse it
            raise ValueError(
                f"ukjax._entrywise: jax.lax.platform_dependent has no branch for the {backend!r} backend "
                f"(branches: {self.platforms})"
            )
        return default


def _cond(eqn, invals, size):
    index, *ops = invals
    branches = eqn.params["branches"]
    index_entry = index if isinstance(index, _PlatformIndex) else index.item() if index.shape == () else None
    chosen = _select_branch(index_entry, len(branches))
    if chosen is not None:
        return _eval_closed(branches[chosen], ops, size)
    outs = [_eval_closed(branch, ops, size) for branch in branches]
    select = _prim("select_n")
    # select_n takes a boolean for two cases, an int32 in range for more (cond clamps its index).
    n = len(branches)
    idx = jnp.not_equal(index_entry, 0) if n == 2 else jnp.clip(index_entry, 0, n - 1).astype(np.int32)
    results = []
    for k in range(len(outs[0])):
        shape = outs[0][k].shape
        out = np.empty(shape, dtype=object)
        for pos in np.ndindex(*shape):
            out[pos] = _bind_entries(select, {}, [idx, *(o[k][pos] for o in outs)], size)
        results.append(out)
    return results


def _is_materialize(eqn):
    """Whether the equation is a call of ukjax.linalg.materialize (or of its derivative): the program
    ``_materialize`` whose body is the platform-dependent identity on its operands, unchanged."""
    if eqn.primitive.name not in ("jit", "pjit") or eqn.params.get("name") != "_materialize":
        return False
    body = eqn.params["jaxpr"].jaxpr
    names = [e.primitive.name for e in body.eqns]
    if names != ["platform_index", "cond"]:
        return False  # a transformed form (e.g. a transpose for reverse mode): evaluated inline
    index, cond = body.eqns
    return list(cond.invars) == [*index.outvars, *body.invars] and list(cond.outvars) == list(body.outvars)


def _materialize_entries(x):
    """:func:`ukjax.linalg.materialize` of each batched entry of x, on its own: a fusion boundary per batch
    vector (stacking the entries into one array first made XLA:CPU's producer kernel a scalar loop over
    the stacked rows, 2x slower on the SCARA right-hand side)."""
    from ukjax.linalg import materialize

    out = x.copy()
    for idx in np.ndindex(*x.shape):
        if _is_batched(x[idx]):
            out[idx] = materialize(x[idx])
    return out


def _fallback(eqn, invals, size):
    """Bind an equation with no entry rule on assembled arrays, under ``vmap`` where an operand is batched;
    while unrolling for the fused kernel (:func:`unrolling_loops`), refused."""
    if _UNROLLING.get():
        raise ValueError(f"ukjax._entrywise: no entry rule for {eqn.primitive.name} here (unrolling loops "
                         f"for the fused kernel, which cannot run it under vmap): {str(eqn):.300}")
    assembled = [_assemble(x, size, v.aval.dtype) for x, v in zip(invals, eqn.invars, strict=True)]
    arrays, batched = zip(*assembled, strict=True) if assembled else ((), ())
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, bind_params = params if isinstance(params, tuple) else ([], params)

    def bound(*xs):
        out = eqn.primitive.bind(*subfuns, *xs, **bind_params)
        return list(out) if eqn.primitive.multiple_results else [out]

    with eqn.ctx.manager:
        if any(batched):
            outs = jax.vmap(bound, in_axes=[0 if b else None for b in batched])(*arrays)
        else:
            outs = bound(*arrays)
    return [_entries_of_array(o, any(batched)) for o in outs]


MAX_UNROLLED_TRIPS = 10_000
"""Trips of a ``while`` loop that :func:`unrolling_loops` unrolls at most (its condition known every trip)."""


def _trip_boundary(carry):
    """The carry of an unrolled trip behind a fusion boundary per batch vector, outside a kernel (Pallas's
    interpret mode is XLA:CPU code): as the loop's carry was, each trip's values computed once. Without it
    XLA:CPU fused the trips' chains of cheap operations into every consumer, recomputing them (the
    five-bar's interpret-mode program did not finish compiling in 10 minutes, 11 GB)."""
    if _INSIDE_KERNEL.get():
        return carry
    return [_materialize_entries(c) if c.size and jnp.issubdtype(jnp.result_type(*c.flat), jnp.inexact) else c
            for c in carry]  # fmt: skip


def _scan(eqn, invals, size):
    """A ``scan`` unrolled: its body's jaxpr evaluated ``length`` times on the entries (reversed if
    ``reverse``), the carry's entries passed on, the i-th entries of ``xs`` given to trip i and the trips'
    ``ys`` stacked along a new first axis."""
    p = eqn.params
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:nc], list(invals[nc: nc + nk]), invals[nc + nk:]
    trips = [None] * length
    for i in reversed(range(length)) if p["reverse"] else range(length):
        outs = _eval_closed(p["jaxpr"], [*consts, *carry, *(x[i, ...] for x in xs)], size)
        carry, trips[i] = _trip_boundary(outs[:nk]), outs[nk:]
    ys = []
    for k, v in enumerate(eqn.outvars[nk:]):
        ys.append(np.stack([t[k] for t in trips]) if length else np.empty(v.aval.shape, dtype=object))
    return [*carry, *ys]


def _while(eqn, invals, size):
    """A ``while`` unrolled: its body evaluated on the entries as long as its condition, evaluated on the
    entries too, is true; the condition must be known while tracing at every trip (a loop whose trip count
    depends on the data is refused)."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = invals[:cn], invals[cn: cn + bn], list(invals[cn + bn:])
    for _ in range(MAX_UNROLLED_TRIPS + 1):
        (flag,) = _eval_closed(p["cond_jaxpr"], [*cond_consts, *carry], size)
        if not _is_known(flag[()]):
            raise ValueError("ukjax._entrywise: a while loop whose condition depends on the data (its "
                             "trip count is not known while tracing) cannot be unrolled for the fused kernel")
        if not bool(flag[()]):
            return carry
        carry = _trip_boundary(_eval_closed(p["body_jaxpr"], [*body_consts, *carry], size))
    raise ValueError(f"ukjax._entrywise: a while loop ran over {MAX_UNROLLED_TRIPS} trips while unrolled")


def _known_indices(entries):
    """The integers of object arrays of entries if every entry is known while tracing, else None."""
    values = [e for x in entries for e in x.flat]
    if not all(_is_known(e) for e in values):
        return None
    return [np.asarray([int(e) for e in x.flat], dtype=np.int64).reshape(x.shape) for x in entries]


def _clamped_starts(eqn, starts, shape, sizes):
    return [min(max(int(s), 0), d - n) for s, d, n in zip(starts, shape, sizes, strict=True)]


def _dynamic_slice(eqn, invals, size):
    """``x[i:i + n, ...]`` for known start indices, clamped into the array as XLA clamps them."""
    x, *indices = invals
    starts = _known_indices(indices)
    if starts is None:
        return _fallback(eqn, invals, size)
    sizes = eqn.params["slice_sizes"]
    starts = _clamped_starts(eqn, starts, x.shape, sizes)
    return [x[tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))]]


def _dynamic_update_slice(eqn, invals, size):
    """x with a block replaced by ``update`` at known start indices (clamped as XLA clamps them)."""
    x, update, *indices = invals
    starts = _known_indices(indices)
    if starts is None:
        return _fallback(eqn, invals, size)
    starts = _clamped_starts(eqn, starts, x.shape, update.shape)
    out = x.copy()
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape, strict=True))] = update
    return [out]


_NO_ENTRY = -1


def _moved_entries(eqn, operands, indices, size, params):
    """The primitive (a gather or a scatter: it moves entries, computes none) bound while tracing on the
    positions of the operands' entries (known indices), and its result's entries read from those
    positions: XLA's own indexing semantics (clamping, dropped updates) without restating them. A position
    :data:`_NO_ENTRY` is a gather's fill value."""
    positions, start = [], 0
    for x in operands:
        positions.append(np.arange(start, start + x.size, dtype=np.int32).reshape(x.shape))
        start += x.size
    args = [positions[0], indices, *positions[1:]]
    with jax.ensure_compile_time_eval():
        moved = np.asarray(eqn.primitive.bind(*args, **params))
    flat = [e for x in operands for e in x.flat]
    return moved, flat


def _gather(eqn, invals, size):
    x, indices = invals
    known = _known_indices([indices])
    if known is None:
        return _fallback(eqn, invals, size)
    params = dict(eqn.params, fill_value=_NO_ENTRY)
    moved, flat = _moved_entries(eqn, [x], known[0], size, params)
    dtype = eqn.outvars[0].aval.dtype
    fill = eqn.params.get("fill_value")
    if fill is None:  # lax.gather's default fill: NaN, the smallest signed / largest unsigned integer, True
        fill = (np.nan if np.issubdtype(dtype, np.inexact) else np.iinfo(dtype).min
                if np.issubdtype(dtype, np.signedinteger) else np.iinfo(dtype).max
                if np.issubdtype(dtype, np.unsignedinteger) else True)  # fmt: skip
    fill = np.asarray(fill, dtype)[()]
    return [_objects(moved.shape, (flat[k] if k != _NO_ENTRY else fill for k in moved.flat))]


def _scatter(eqn, invals, size):
    """``scatter`` (replacing entries, not adding them) at known indices."""
    x, indices, updates = invals
    known = _known_indices([indices])
    if known is None:
        return _fallback(eqn, invals, size)
    moved, flat = _moved_entries(eqn, [x, updates], known[0], size, eqn.params)
    return [_objects(moved.shape, (flat[k] for k in moved.flat))]


_LOOP_RULES = {
    "scan": _scan,
    "while": _while,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    "scatter": _scatter,
}
"""Rules used while unrolling loops only (:func:`unrolling_loops`): elsewhere these primitives run under
``vmap`` as before (:func:`_fallback`)."""

_RULES = {
    "dot_general": _dot_general,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _simple(lambda p, x: x.reshape(p["new_sizes"])),
    "squeeze": _simple(lambda p, x: np.squeeze(x, axis=tuple(p["dimensions"]))),
    "expand_dims": _simple(lambda p, x: np.expand_dims(x, tuple(p["dimensions"]))),
    "transpose": _simple(lambda p, x: np.transpose(x, p["permutation"])),
    "slice": _slice,
    "concatenate": lambda eqn, invals, size: [np.concatenate(invals, axis=eqn.params["dimension"])],
    "stack": lambda eqn, invals, size: [np.stack(invals, axis=eqn.params["axis"])],
    "unstack": _unstack,
    "split": _split,
    "rev": _simple(lambda p, x: np.flip(x, axis=tuple(p["dimensions"]))),
    "pad": _pad,
    "iota": _iota,
    "argmax": _argmax_like,
    "argmin": _argmax_like,
    "cond": _cond,
    # placement annotations (a sweep's chunk program runs under shard_map): a scenario's entries have no place
    **{name: _simple(lambda p, x: x) for name in ("reshard", "sharding_constraint", "mesh_cast")},
    **{name: _cumulative for name in _CUMULATIVE},
    **{name: _reduce for name in _REDUCTIONS},
}


def _call_jaxpr(eqn):
    return next((eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params), None)


def _inlined_call(eqn, invals, size):
    """A call (jit, custom derivative, checkpoint) evaluated inline: its jaxpr, entry by entry (the primal
    function of a custom derivative); a call form without a jaxpr parameter is bound as it is."""
    closed = _call_jaxpr(eqn)
    if closed is None:
        return _fallback(eqn, invals, size)
    inner = getattr(closed, "jaxpr", closed)
    return _eval_closed(closed, invals[len(invals) - len(inner.invars):], size)


def _eval_closed(closed, args, size):
    """A (closed) jaxpr's outputs as entries; its constants are entries the batch shares."""
    inner, consts = getattr(closed, "jaxpr", closed), getattr(closed, "consts", ())
    if _UNROLLING.get():  # constants as NumPy values: known while tracing (an index array, say)
        consts = [c if isinstance(c, jax.core.Tracer) else np.asarray(c) for c in consts]
    return _eval(inner, [_entries_of_array(c, False) for c in consts], args, size)


def _eval(jaxpr, consts, args, size):
    return interpret(jaxpr, consts, args, lambda eqn, invals: _equation(eqn, invals, size), _literal)


def _literal(v):
    value = np.asarray(v.val, v.aval.dtype)
    return _objects(value.shape, value.reshape(-1)) if value.ndim else _scalar(value)


def _equation(eqn, invals, size):
    """One equation's outputs as entries, by its rule (or the fallback), checked against its output types."""
    name = eqn.primitive.name
    if name == "platform_index":
        outs = [_PlatformIndex(eqn.params)]
    elif _is_materialize(eqn):
        # The identity on each operand (a derivative of materialize carries primal and tangent).
        outs = list(invals) if _INSIDE_KERNEL.get() else [_materialize_entries(x) for x in invals]
    elif name in _INLINED:
        outs = _inlined_call(eqn, invals, size)
    elif name in _ELEMENTWISE:
        outs = _elementwise(eqn, invals, size)
    elif name in _RULES:
        outs = _RULES[name](eqn, invals, size)
    elif name in _LOOP_RULES and _UNROLLING.get():
        outs = _LOOP_RULES[name](eqn, invals, size)
    else:
        outs = _fallback(eqn, invals, size)
    if len(outs) != len(eqn.outvars) or any(
        not isinstance(x, _PlatformIndex) and (not isinstance(x, np.ndarray) or x.shape != v.aval.shape)
        for v, x in zip(eqn.outvars, outs, strict=False)
    ):
        raise AssertionError(f"ukjax._entrywise: the rule for {name} gave {outs!r:.200} for {eqn}")
    return outs


def _scalar(value):
    out = np.empty((), dtype=object)
    concrete = isinstance(value, (np.ndarray, np.generic, int, float, bool))
    out[()] = np.asarray(value)[()] if concrete else value
    return out


def unruled_primitives(jaxpr, unroll_loops: bool = False) -> set[str]:
    """Names of the primitives in a jaxpr (calls and conditionals included) that :func:`evaluate_entrywise`
    has no entry rule for and would run under ``vmap`` on assembled arrays (loops, LAPACK, gathers).

    With ``unroll_loops`` (the fused kernel, :func:`unrolling_loops`): loops and indexing are ruled where
    their trip count and indices are known while tracing, which this decides as the evaluation will, from
    which values are known (literals, constants, loop counters and what integer and boolean operations,
    selects and rearrangements make of them); a ``while`` whose condition is not known is named, as is an
    indexing primitive whose indices are not. ``jaxpr`` may be closed (its constants are then known)."""
    closed = getattr(jaxpr, "consts", None)
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    consts = [not isinstance(c, jax.core.Tracer) for c in closed] if closed is not None else None
    return _analyse(inner, consts, [False] * len(inner.invars), unroll_loops)[0]


_MOVES = frozenset("""reshape squeeze expand_dims transpose slice concatenate stack unstack split rev pad
    broadcast_in_dim""".split())  # rules that rearrange entries: known entries stay known
_INDEXING = {"dynamic_slice": 1, "dynamic_update_slice": 2, "gather": 1, "scatter": 1}
"""Indexing primitives (:data:`_LOOP_RULES`) and where their index operands start (a scatter's updates
follow its indices)."""


def _analyse(jaxpr, consts_known, known_in, unroll) -> tuple[set[str], list[bool]]:
    """(the primitives without an entry rule, which outputs are known while tracing) for a jaxpr whose
    constants and inputs are known or not as given (a closed jaxpr's constants: known where concrete, as
    :func:`_eval_closed` makes them while unrolling). Mirrors the evaluation, conservatively: a value marked
    known is a NumPy value there."""
    known: dict = {}

    def is_known(v):
        return isinstance(v, jex.Literal) or known.get(v, False)

    for v, k in zip(jaxpr.constvars, consts_known or [False] * len(jaxpr.constvars), strict=True):
        known[v] = k
    for v, k in zip(jaxpr.invars, known_in, strict=True):
        known[v] = k
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [is_known(v) for v in eqn.invars]
        outs = [False] * len(eqn.outvars)
        if name == "platform_index":
            outs = [True]
        elif _is_materialize(eqn):  # the identity on each operand (its body analysed as a call's)
            found |= _analyse_closed(_call_jaxpr(eqn), ins, unroll)[0]
            outs = list(ins)
        elif name in _INLINED:
            closed = _call_jaxpr(eqn)
            if closed is None:
                found.add(name)
            else:
                unruled, outs = _analyse_closed(closed, ins[len(ins) - len(_inner(closed).invars):], unroll)
                found |= unruled
        elif name == "cond":
            index, *operands = ins
            results = []
            for branch in eqn.params["branches"]:
                unruled, branch_known = _analyse_closed(branch, operands, unroll)
                found |= unruled
                results.append(branch_known)
            outs = [index and all(r[k] for r in results) for k in range(len(outs))]
        elif name in _ELEMENTWISE:
            if unroll and all(ins):  # folded while tracing where integer or boolean (_bind_entries)
                outs = [not jnp.issubdtype(v.aval.dtype, jnp.inexact) or name == "select_n"
                        for v in eqn.outvars]  # fmt: skip
        elif name in _MOVES:
            outs = [all(ins)] * len(outs)
        elif name == "iota":
            outs = [True]
        elif name in _RULES:
            if unroll and name == "cumlogsumexp":  # _cumulative's fallback
                found.add(name)
        elif unroll and name == "scan":
            found |= _analyse_scan(eqn, ins, outs)
        elif unroll and name == "while":
            found |= _analyse_while(eqn, ins, outs)
        elif unroll and name in _INDEXING:
            start = _INDEXING[name]
            stop = start + 1 if name in ("gather", "scatter") else len(ins)
            if not all(ins[start:stop]):
                found.add(name)
            outs = [all(ins[:start]) and all(ins[stop:])]
        else:
            found.add(name)
        for v, k in zip(eqn.outvars, outs, strict=True):
            known[v] = k
    return found, [is_known(v) for v in jaxpr.outvars]


def _inner(closed):
    return getattr(closed, "jaxpr", closed)


def _analyse_closed(closed, known_in, unroll):
    consts = getattr(closed, "consts", ())
    return _analyse(_inner(closed), [not isinstance(c, jax.core.Tracer) for c in consts], known_in, unroll)


def _analyse_scan(eqn, ins, outs) -> set[str]:
    """A scan's body analysed with each carry known only if it stays known every trip (a fixed point: a
    carry is dropped from the known ones until the body keeps every remaining one known)."""
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    carry = ins[nc: nc + nk]
    while True:
        unruled, body = _analyse_closed(p["jaxpr"], [*ins[:nc], *carry, *ins[nc + nk:]], True)
        kept = [c and b for c, b in zip(carry, body[:nk], strict=True)]
        if kept == carry:
            outs[:] = [*carry, *body[nk:]]
            return unruled
        carry = kept


def _analyse_while(eqn, ins, outs) -> set[str]:
    """A while loop's body as a scan's; ruled only if its condition is known on the carries that stay
    known (a trip count known while tracing)."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    carry = ins[cn + bn:]
    while True:
        unruled, body = _analyse_closed(p["body_jaxpr"], [*ins[cn: cn + bn], *carry], True)
        kept = [c and b for c, b in zip(carry, body, strict=True)]
        if kept == carry:
            break
        carry = kept
    cond_unruled, (flag,) = _analyse_closed(p["cond_jaxpr"], [*ins[:cn], *carry], True)
    outs[:] = carry
    return unruled | cond_unruled | (set() if flag else {"while"})


def one_scenario_jaxpr(field, y_one, args_one):
    """The jaxpr of ``field(t, y, args)`` for one scenario (``y_one``, ``args_one`` without a batch axis:
    arrays or ``jax.ShapeDtypeStruct``), at a time of the state's dtype."""
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(y_one))
    return jax.make_jaxpr(field)(jnp.zeros((), dtype), y_one, args_one)


def entry_operations(jaxpr) -> int:
    """About how many operations on entries the jaxpr becomes when evaluated entry by entry with its loops
    unrolled: the entries of every equation's outputs, a ``scan``'s body counted ``length`` times, a
    ``while``'s body once (its trip count is known only while evaluating), a ``cond``'s largest branch.
    The size of the fused kernel's right-hand side, which its compile time follows (:mod:`ukjax.fused`)."""
    total = 0
    for eqn in _inner(jaxpr).eqns:
        name = eqn.primitive.name
        if name in _INLINED and _call_jaxpr(eqn) is not None:
            total += entry_operations(_call_jaxpr(eqn))
        elif name == "cond":
            total += max(entry_operations(b) for b in eqn.params["branches"])
        elif name == "scan":
            total += eqn.params["length"] * entry_operations(eqn.params["jaxpr"])
        elif name == "while":
            total += entry_operations(eqn.params["body_jaxpr"]) + entry_operations(eqn.params["cond_jaxpr"])
        elif name not in _MOVES:
            total += sum(int(np.prod(v.aval.shape, dtype=int)) for v in eqn.outvars)
    return total


class _Traced(NamedTuple):
    """One scenario's jaxpr of f, and what evaluating it over the batch needs."""

    closed: jex.ClosedJaxpr
    out_tree: Any
    leaves: list
    flags: list
    size: int


def _trace(f, args, batched) -> _Traced:
    """f traced for one scenario: batched leaves (``batched``: booleans in a pytree prefix of ``args``, like
    ``in_axes``) lose their leading batch axis."""
    args, batched = tuple(args), tuple(batched)  # one flag or pytree of flags per argument
    leaves, tree = jax.tree_util.tree_flatten(args)
    prefix = jax.tree_util.tree_structure(batched)
    try:
        subtrees = prefix.flatten_up_to(args)
    except (ValueError, TypeError) as error:
        raise ValueError(f"evaluate_entrywise: batched flags {batched!r} do not match the arguments") from (
            error
        )
    flags = [flag for flag, sub in zip(jax.tree_util.tree_leaves(batched), subtrees, strict=True)
             for _ in jax.tree_util.tree_leaves(sub)]  # fmt: skip
    sizes = {jnp.shape(x)[0] for x, b in zip(leaves, flags, strict=True) if b}
    if len(sizes) != 1:
        raise ValueError(f"evaluate_entrywise: batched arguments need one common batch size, got {sizes}")

    def flat(*values):
        return f(*jax.tree_util.tree_unflatten(tree, values))

    one = [jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x)) if b else x
           for x, b in zip(leaves, flags, strict=True)]  # fmt: skip
    closed, shape = jax.make_jaxpr(flat, return_shape=True)(*one)
    return _Traced(closed, jax.tree_util.tree_structure(shape), leaves, flags, sizes.pop())


def _evaluate(traced: _Traced, fenced: bool = False):
    """The batch's outputs of a traced f, entry by entry, batch axis first on every leaf; with ``fenced``,
    assembled behind :func:`_fence`."""
    inputs = [_entries_of_array(x, b) for x, b in zip(traced.leaves, traced.flags, strict=True)]
    outs = _eval_closed(traced.closed, inputs, traced.size)

    def assemble(outs_):
        arrays = []
        for entries, aval in zip(outs_, traced.closed.out_avals, strict=True):
            arr, is_batched = _assemble(entries, traced.size, aval.dtype)
            arr = jnp.asarray(arr, aval.dtype)
            arrays.append(arr if is_batched else jnp.broadcast_to(arr, (traced.size, *aval.shape)))
        return arrays

    return jax.tree_util.tree_unflatten(traced.out_tree, _fence(assemble, outs) if fenced else assemble(outs))


def _fence(assemble, entries, *, cpu_only: bool = True):
    """``assemble(entries)`` (object arrays of entries -> arrays) computed in the body of a while loop of one
    trip, whose trip count XLA cannot see (``optimization_barrier``), so the loop stays: the entries reach it
    as computed arrays, and XLA cannot fuse the expressions that produce them into the assembling
    concatenate. XLA:CPU fuses producers into a concatenate of at most 8 operands on a minor dimension under
    64 bytes, which a few entries per scenario are: then the whole expression since the last fusion boundary
    (the tangents of a right-hand side: ~700 operations) runs in one scalar loop, 413 µs per evaluation of
    the SCARA's JVP along two directions over 256 scenarios, against 156 µs behind the fence (an
    ``optimization_barrier`` on the entries themselves did not keep them apart: 418 µs). The body multiplies
    every entry by (trip + 1) = 1, exact, so that XLA cannot hoist the assembly out of the loop.

    On CPU only: ``jax.lax.platform_dependent`` lowers the plain assembly for every other platform (GPU, TPU),
    where a loop inside the right-hand side costs kernel launches and, unless XLA captures it in a CUDA
    graph, a device-to-host copy of its condition per evaluation (docs/guide/gpu.md,
    ``tests/test_cuda_lowering.py``)."""
    flat, tree = jax.tree_util.tree_flatten([list(e.flat) for e in entries])
    if not flat:
        return assemble(entries)

    def assembled(values):
        lists = jax.tree_util.tree_unflatten(tree, values)
        return assemble([_objects(e.shape, vals) for e, vals in zip(entries, lists, strict=True)])

    def fenced(*values):
        def body(carry):
            trip, _ = carry
            return trip + 1, assembled([x * (trip + 1).astype(jnp.result_type(x)) for x in values])

        trips = jax.lax.optimization_barrier(jnp.int32(1))
        zeros = [jnp.zeros(s.shape, s.dtype) for s in jax.eval_shape(assembled, list(values))]
        return jax.lax.while_loop(lambda carry: carry[0] < trips, body, (jnp.int32(0), zeros))[1]

    # CPU only (chosen when the program is lowered): on a GPU the loop would cost a kernel launch per trip
    # and a device-to-host copy of its condition at every evaluation of the right-hand side.
    if not cpu_only:  # the fence on every platform, as it was before (benchmarks/cuda_lowering.py)
        return fenced(*flat)
    return jax.lax.platform_dependent(*flat, cpu=fenced, default=lambda *values: assembled(list(values)))


def evaluate_entrywise(f, args, batched):
    """``jax.vmap(f)(*args)`` with ``in_axes`` 0 where ``batched`` says so (booleans in a pytree prefix of
    ``args``, like ``in_axes``) and ``None`` elsewhere, evaluated entry by entry (module docstring). The
    output has f's structure with the batch axis first on every leaf."""
    return _evaluate(_trace(f, args, batched))


def _by_entries(f, min_batch: int, fenced: bool = False, jvp: bool = False):
    """f under ``jax.vmap`` over at least ``min_batch`` scenarios evaluated by :func:`evaluate_entrywise`
    (its outputs assembled behind :func:`_fence` if ``fenced``) where every equation has an entry rule, by
    ``jax.vmap`` otherwise; f itself unbatched. Primal only: a ``custom_vmap`` function has no derivative
    rules of its own.

    ``jvp=True``: f is ``(primals, tangents) -> (primal outputs, tangent outputs)``, a JVP. Where only the
    tangents are batched (``jax.jacfwd``: a ``vmap`` over tangent directions), the primal outputs are
    returned unbatched, as JAX requires of a JVP's primal outputs; every other output is batched."""

    @jax.custom_batching.custom_vmap
    def by_entries(*args):
        return f(*args)

    @by_entries.def_vmap
    def _rule(axis_size, in_batched, *args):
        traced = None
        if axis_size >= min_batch:
            with looped_factorizations(False):  # scalar code, which fuses across the batch entry by entry
                traced = _trace(f, args, in_batched)
        if traced is not None and not unruled_primitives(traced.closed.jaxpr):
            out = _evaluate(traced, fenced)
        else:
            axes = jax.tree_util.tree_map(lambda b: 0 if b else None, tuple(in_batched))
            out = jax.vmap(f, in_axes=axes)(*args)
        batched = jax.tree_util.tree_map(lambda _: True, out)
        if jvp and not any(jax.tree_util.tree_leaves(in_batched[0])):
            # the primal outputs depend on the primals alone: equal along the axis, so take the first
            primal_out, tangent_out = out
            out = (jax.tree_util.tree_map(lambda x: x[0], primal_out), tangent_out)
            batched = (jax.tree_util.tree_map(lambda _: False, primal_out), batched[1])
        return out, batched

    return by_entries


def batched_by_entries(f, min_batch: int = 1, tangents_by_entries: bool = False, fenced_values: bool = False):
    """f, evaluated by :func:`evaluate_entrywise` whenever ``jax.vmap`` batches it over at least
    ``min_batch`` scenarios and every equation of f has an entry rule; by ``jax.vmap`` itself otherwise (the
    entrywise program takes longer to trace and compile, which a small batch does not win back, and an
    equation without a rule costs a stack and a split of its operands: the flexible-joint closed loop, whose
    servo solves call LAPACK through ``jnp.linalg.solve``, ran 1.4x slower and compiled 1.8x longer so).
    Unbatched, f itself. The arguments must be arrays (pytrees of them).

    Derivatives are those of f (``jax.custom_jvp`` whose rule is ``jax.jvp`` of f, so custom derivative rules
    inside f apply as before). By default the rule is the ordinary batched program, which reverse mode can
    transpose. ``tangents_by_entries=True`` evaluates the rule entry by entry too (the jaxpr of ``jax.jvp``
    of f, tangents included, its outputs assembled behind :func:`_fence`), for forward mode only (diffrax's
    ``ForwardMode``; it cannot be transposed): the SCARA's JVP along the tuner's two directions over 256
    scenarios, 195-202 µs per evaluation as the ordinary program, takes 155 µs so. (Under ``ForwardMode``
    the entrywise primal beside the ordinary tangent rule made jaxlib 0.10 lower the tangent loop with
    operands of transposed layout, an MLIR verifier error.)

    ``fenced_values=True`` assembles the values behind the fence too: :func:`ukjax.simulate_batch` asks for
    it where it loops over chunks of scenarios, where it was faster (SCARA, RK4, 200 steps: 512 scenarios 87
    against 99 ms, 1024 173 against 196 ms), not for a batch in one piece, where it was slower at 256
    scenarios (RK4 75 against 66 ms, Tsit5 108 against 92 ms, the tuner's forward loss 566 against 494
    ms)."""
    primal = _by_entries(f, min_batch, fenced=fenced_values)
    tangent_program = (
        _by_entries(_jvp_of(f), min_batch, fenced=True, jvp=True) if tangents_by_entries else _jvp_of(f)
    )

    @jax.custom_jvp
    def g(*args):
        return primal(*args)

    @g.defjvp
    def _jvp(primals, tangents):
        return tangent_program(primals, tangents)

    return g


def _jvp_of(f):
    return lambda primals, tangents: jax.jvp(f, primals, tangents)
