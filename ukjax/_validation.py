"""Input checks of :func:`ukjax.simulate` and :func:`ukjax.simulate_batch`, run on the host before compiling.

Every check raises ``ValueError`` (``TypeError`` for a wrong kind of object) naming the argument, the
parameter leaf or the model function at fault, before any program is compiled. Checks that need values run
only on concrete arrays: inside a user's ``jax.jit``/``vmap``/``grad`` the same problems show up as a status
code of the :class:`~ukjax.simulation.Solution` instead (see ``RESULTS``).

The model check evaluates the system once, eagerly, at the initial state of the first scenario: every user
function is called with the documented signature, so a missing parameter key or a wrong signature is
reported with the function's name and the expected form; the mass matrix must be finite, symmetric and
positive definite there (every UK form ukjax integrates factors M); the initial constraint residuals must
be finite (they need not be zero: a start off the constraint manifold is allowed, Baumgarte terms pull the
motion back).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

try:
    from jax._src.config import eager_constant_folding as _EAGER_CONSTANT_FOLDING
except ImportError:  # a JAX without the switch: see _staged_as_usual
    _EAGER_CONSTANT_FOLDING = None

SYMMETRY_RTOL = 1e-10
"""M at the initial state counts as symmetric when max|M - Mᵀ| <= SYMMETRY_RTOL max|M| (as ukjax._checks)."""


def is_concrete(x) -> bool:
    """True for a value known on the host (not a tracer of an enclosing jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def host_float(x) -> float | None:
    """The value of a scalar known on the host (a Python number, NumPy or concrete JAX array), else None.

    Read before the value enters JAX: inside a user's ``jit``, even ``jnp.asarray(1.0)`` is a tracer.
    """
    return float(np.asarray(x).real) if is_concrete(x) and np.ndim(x) == 0 else None


def scalar(x, name, dtype, *, positive=False, nonnegative=False, finite=True):
    """``x`` as a 0-d array of ``dtype``; refuses complex, non-scalar, non-finite and (optionally) x <= 0
    (``positive``) or x < 0 (``nonnegative``)."""
    if np.iscomplexobj(x):
        raise ValueError(f"{name} must be real, got the complex value {x!r}")
    if np.ndim(x) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(x)}")
    value = host_float(x)
    if value is not None:
        if finite and not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        if positive and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")
        if nonnegative and not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return jnp.asarray(x, dtype=dtype)


def coordinate_indices(system, items, where: str, what: str, *, unique: bool = True) -> tuple[int, ...]:
    """Coordinate indices in [0, n) from ints or ``system.coordinate_names``, refused (ValueError naming
    ``where``, the argument ``what`` and the culprit) otherwise; a coordinate listed twice is refused where
    ``unique``, else kept once."""
    if isinstance(items, str | int):
        items = (items,)
    names = system.coordinate_names
    out = []
    for item in items:
        if isinstance(item, str):
            if names is None or item not in names:
                known = "the system has no coordinate_names" if names is None else f"names are {list(names)}"
                raise ValueError(f"{where}: {what} names coordinate {item!r}, which is unknown; {known}")
            index = names.index(item)
        elif isinstance(item, int | np.integer) and not isinstance(item, bool):
            index = int(item)
            if not 0 <= index < system.n:
                raise ValueError(f"{where}: {what} indices must lie in [0, {system.n}), got {index}")
        else:
            raise ValueError(f"{where}: {what} must hold coordinate indices or names, got {item!r}")
        if index in out and not unique:
            continue
        out.append(index)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: {what} lists a coordinate twice: {out}")
    return tuple(out)


def coordinate_tolerance(value, name, system, default: float, dtype):
    """A per-coordinate tolerance (n,) from ``None`` (``default`` everywhere), a number, an (n,) array, or a
    dict from ``system.coordinate_names`` to numbers (the coordinates it does not name keep ``default``);
    every entry positive and finite when concrete."""
    n = system.n
    if value is None:
        return jnp.full((n,), default, dtype)
    if isinstance(value, dict):
        names = system.coordinate_names
        if names is None:
            raise ValueError(
                f"{name} is given by coordinate name, but the system has no coordinate_names; "
                f"give a number or an array of shape ({n},)"
            )
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(
                f"{name} names coordinates {unknown} that the system does not have; its "
                f"coordinates are {list(names)}"
            )
        entries = [value.get(k, default) for k in names]
        for k, entry in zip(names, entries, strict=True):
            if np.ndim(entry) != 0:
                raise ValueError(f"{name}[{k!r}] must be a number, got shape {np.shape(entry)}")
        value = jnp.stack([jnp.asarray(entry, dtype) for entry in entries])
    if isinstance(value, str) or np.iscomplexobj(value):
        raise ValueError(f"{name} must be a positive number or an array of shape ({n},), got {value!r}")
    try:
        array = jnp.asarray(value, dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a positive number or an array of shape ({n},): {error}") from None
    if array.ndim == 0:
        array = jnp.full((n,), array, dtype)
    if array.shape != (n,):
        raise ValueError(
            f"{name} must be a number or have shape ({n},) (one per coordinate), got {array.shape}"
        )
    if is_concrete(array):
        values = np.asarray(array)
        if not (np.all(np.isfinite(values)) and np.all(values > 0)):
            raise ValueError(f"{name} must be positive and finite for every coordinate, got {values}")
    return array


def _not_numeric(x, *, any_object: bool) -> str | None:
    """What is wrong with a value that should be numbers, else None: a string, or a list, tuple or NumPy
    array of strings or other objects; with ``any_object``, any value that is not an array of numbers.
    Tracers and JAX arrays are numbers."""
    if isinstance(x, (str, bytes)):
        return f"the string {x!r}"
    if isinstance(x, jax.Array | jax.core.Tracer | int | float | complex | np.number | np.bool_):
        return None
    if isinstance(x, list | tuple):  # entry by entry: a list may hold tracers
        for entry in jax.tree_util.tree_leaves(x):
            wrong = _not_numeric(entry, any_object=True)
            if wrong is not None:
                return f"a {type(x).__name__} holding {wrong}"
        return None
    if not any_object and not isinstance(x, np.ndarray):
        return None  # another object: a static setting of the model under equinox's filter_jit
    try:
        array = np.asarray(x)
    except (TypeError, ValueError) as error:
        return f"a {type(x).__name__} that is not an array of numbers ({error})"
    if array.dtype.kind not in "biufc":
        return f"an array of {array.dtype} {array.ravel()[:3].tolist()}"
    return None


def numeric_parameter(name: str, leaf) -> None:
    """Refuse a parameter leaf that is a string or an array of strings/objects, naming it."""
    wrong = _not_numeric(leaf, any_object=False)
    if wrong is not None:
        raise ValueError(
            f"parameter {name} is {wrong}; parameters must be numbers or arrays of numbers (write 1.0, not "
            "'1.0'; a setting that is not a number belongs in the model function, e.g. a closure)"
        )


def _solver_classes() -> dict:
    import diffrax

    from ukjax.solvers import RK4

    classes = (
        diffrax.Tsit5,
        diffrax.Dopri5,
        diffrax.Dopri8,
        diffrax.Heun,
        diffrax.Euler,
        diffrax.Bosh3,
        diffrax.Ralston,
        diffrax.Midpoint,
        RK4,
    )
    return {cls.__name__.lower(): cls for cls in classes}


SOLVER_NAMES = ("Tsit5", "Dopri5", "Dopri8", "Heun", "Euler", "Bosh3", "Ralston", "Midpoint", "RK4")
"""The solver names :func:`solver` accepts as strings (any case): diffrax's explicit solvers of those names,
and ``"RK4"`` for :class:`ukjax.solvers.RK4`."""


def solver(value, default):
    """The solver of ``solver=``: ``default`` for None, a diffrax solver as given, a name of
    :data:`SOLVER_NAMES` (any case) as a new instance; anything else is refused naming ``solver``."""
    import diffrax

    if value is None:
        return default
    if isinstance(value, str):
        cls = _solver_classes().get(value.strip().lower())
        if cls is None:
            raise ValueError(
                f"solver={value!r} is not a solver name ukjax knows; give one of "
                f"{', '.join(SOLVER_NAMES)} (any case) or a diffrax solver such as diffrax.Tsit5()"
            )
        return cls()
    if isinstance(value, type) and issubclass(value, diffrax.AbstractSolver):
        raise ValueError(
            f"solver must be a solver instance, got the class {value.__name__}: write {value.__name__}()"
        )
    if not isinstance(value, diffrax.AbstractSolver):
        raise ValueError(
            f"solver must be a diffrax solver (e.g. diffrax.Tsit5()) or one of the names "
            f"{', '.join(SOLVER_NAMES)}; got {type(value).__name__} {value!r}"
        )
    return value


def state(n: int, q0, qd0, batched: bool, nq: int | None = None):
    """(q0, qd0) as real floating arrays of shape (nq,) and (n,) (``nq=None``: n), or with a batch axis
    first, batch >= 1, finite when concrete."""
    nq = n if nq is None else nq
    for name, x in (("q0", q0), ("qd0", qd0)):
        wrong = _not_numeric(x, any_object=True)
        if wrong is not None:
            raise ValueError(
                f"{name} must be an array of numbers of shape ({'batch, ' if batched else ''}n,); got {wrong}"
            )
    q0, qd0 = jnp.asarray(q0), jnp.asarray(qd0)  # (a list may hold tracers: converted before inspection)
    for name, x in (("q0", q0), ("qd0", qd0)):
        if jnp.iscomplexobj(x):
            raise ValueError(f"{name} must be real; got a complex array (ukjax integrates real states)")
    if not (jnp.issubdtype(q0.dtype, jnp.floating) and q0.dtype == qd0.dtype):
        q0, qd0 = q0.astype(jnp.result_type(float)), qd0.astype(jnp.result_type(float))
    ndim = 2 if batched else 1
    same_batch = not batched or q0.shape[:1] == qd0.shape[:1]
    if q0.ndim != ndim or qd0.ndim != ndim or not same_batch or q0.shape[-1] != nq or qd0.shape[-1] != n:
        expected = "(batch, n)" if batched else "(n,)"
        if nq == n:
            what = f"q0 and qd0 must both have shape {expected} with n = {n}"
        else:
            shapes = ("(batch, nq)", "(batch, n)") if batched else ("(nq,)", "(n,)")
            what = (f"q0 must have shape {shapes[0]} and qd0 shape {shapes[1]} with nq = {nq} configuration "
                    f"numbers and n = {n} velocities")  # fmt: skip
        raise ValueError(f"{what}; got q0.shape={q0.shape}, qd0.shape={qd0.shape}")
    if batched and q0.shape[0] == 0:
        raise ValueError("the batch is empty: q0 and qd0 have 0 scenarios (shape (0, n))")
    for name, x in (("q0", q0), ("qd0", qd0)):
        if is_concrete(x):
            values = np.asarray(x)
            if not np.all(np.isfinite(values)):
                where = np.argwhere(~np.isfinite(values))[0].tolist()
                bad = values[tuple(where)]
                raise ValueError(f"{name} has a NaN or infinite entry at index {where}: {bad}")
    return q0, qd0


def save_times(t0, t1, ts, num_saves: int, t0_value: float | None, t1_value: float | None):
    """The save times: ``ts`` checked against [t0, t1], or ``num_saves`` evenly spaced."""
    concrete = t0_value is not None and t1_value is not None
    if concrete and not t1_value > t0_value:
        raise ValueError(f"t1 must be larger than t0, got t0={t0_value}, t1={t1_value}")
    if ts is None:
        return jnp.linspace(t0, t1, num_saves)
    if np.iscomplexobj(ts):
        raise ValueError("ts must be real save times, got a complex array")
    if np.ndim(ts) != 1 or np.shape(ts)[0] < 1:
        raise ValueError(f"ts must be a non-empty vector of save times, got shape {np.shape(ts)}")
    if concrete and is_concrete(ts):
        values = np.asarray(ts, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"ts must be finite, got {values}")
        if values.min() < t0_value or values.max() > t1_value:
            raise ValueError(
                f"ts must lie in [t0, t1] = [{t0_value}, {t1_value}], got [{values.min()}, {values.max()}]"
            )
        if np.any(np.diff(values) < 0):
            raise ValueError("ts must be non-decreasing")
    return jnp.asarray(ts, dtype=t0.dtype)


def fixed_step(t0: float | None, t1: float | None, dt: float | None):
    """Check a fixed step against the span: 0 < dt < t1 - t0 (a single step over the span is refused)."""
    if None not in (t0, t1, dt) and not dt < t1 - t0:
        raise ValueError(
            f"dt = {dt} is not smaller than the span t1 - t0 = {t1 - t0}: a fixed step must divide the span "
            "into at least two steps"
        )


def fixed_step_count(t0: float, t1: float, dt: float) -> int:
    """Steps diffrax's ``ConstantStepSize`` takes from t0 to t1: ceil((t1 - t0)/dt), the last one clipped."""
    return max(1, math.ceil((t1 - t0) / dt * (1 - 1e-12)))


def parameters(params, batched: bool, batch: int | None) -> list[str]:
    """Every floating leaf of ``params`` real and finite (when concrete), named by its path on failure.

    Per-scenario parameters (``batched``) are not refused for a non-finite value: one poisoned scenario must
    not stop a batch. The function returns one line per such leaf naming it and the scenarios it poisons
    (they end with status ``nonfinite_state``); the caller warns with them.
    """
    poisoned = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = f"params{jax.tree_util.keystr(path)}"
        numeric_parameter(name, leaf)
        if np.iscomplexobj(leaf):
            raise ValueError(f"parameter {name} is complex; ukjax's models take real parameters")
        if batched:
            shape = jnp.shape(leaf)
            if not shape or shape[0] != batch:
                raise ValueError(
                    f"batch_params=True needs every params leaf to have the batch size {batch} as its first "
                    f"axis; leaf {name} has shape {shape}"
                )
        if not is_concrete(leaf):
            continue
        values = np.asarray(leaf)
        if not np.issubdtype(values.dtype, np.inexact) or np.all(np.isfinite(values)):
            continue
        if batched:
            bad = ~np.isfinite(values).reshape(values.shape[0], -1).all(axis=1)
            poisoned.append(f"{name} is NaN or infinite in scenarios {np.flatnonzero(bad).tolist()}")
            continue
        where = np.argwhere(~np.isfinite(values))[0].tolist() if values.ndim else []
        detail = f" at index {where}" if where else ""
        raise ValueError(f"parameter {name} has a NaN or infinite value{detail}: {values}")
    return poisoned


def first_finite_scenario(q0, qd0, params) -> int | None:
    """Index of the first scenario whose state and parameters are all finite (None if there is none)."""
    ok = np.isfinite(np.asarray(q0)).all(axis=1) & np.isfinite(np.asarray(qd0)).all(axis=1)
    for leaf in jax.tree_util.tree_leaves(params):  # None: shared parameters, checked already
        values = np.asarray(leaf)
        if np.issubdtype(values.dtype, np.inexact):
            ok &= np.isfinite(values).reshape(values.shape[0], -1).all(axis=1)
    hits = np.flatnonzero(ok)
    return int(hits[0]) if hits.size else None


# A TypeError with one of these in its message is about the call itself (a wrong signature), not its body.
_CALL_ERRORS = re.compile(
    r"positional argument|keyword argument|required argument|takes \d+|is not callable|missing \d+ required"
)
# ... and with one of these, about indexing a value that is not a dict (p["m"] on a list, tuple or array).
_INDEXING_ERRORS = re.compile(
    r"indices must be integers|string indexing|not subscriptable|has no attribute|unhashable"
    r"|index out of range|Too many indices|is not a valid JAX type"
)
_SHAPE = re.compile(r"\((\d+(?:, ?\d+)*,?)?\)")


def _kind(params) -> str:
    if isinstance(params, list | tuple):
        count = len(params)
        return f"a {type(params).__name__} of {count} {'entry' if count == 1 else 'entries'}"
    return f"an array of shape {params.shape}" if hasattr(params, "shape") else f"a {type(params).__name__}"


def _sequences(tree, path="params") -> list[str]:
    """Paths of the lists and tuples inside a dict-like parameter pytree (a vector written as a list)."""
    if isinstance(tree, Mapping):
        return [hit for k, v in tree.items() for hit in _sequences(v, f"{path}[{k!r}]")]
    return [path] if isinstance(tree, list | tuple) and path != "params" else []


def _shape_hint(error_text: str, args) -> str:
    """Which arguments have a shape that the error message names: the parameter leaves first (a mass or
    length given as an array of the wrong shape), then q; empty when none does."""
    named = set()
    for found in _SHAPE.finditer(error_text):
        inner = found.group(1) or ""
        named.add(tuple(int(k) for k in inner.replace(" ", "").split(",") if k))
    leaves = jax.tree_util.tree_leaves_with_path(args[-1])
    hits = [f"params{jax.tree_util.keystr(path)} has shape {tuple(jnp.shape(leaf))}"
            for path, leaf in leaves if jnp.ndim(leaf) and tuple(jnp.shape(leaf)) in named]
    q_shape = tuple(jnp.shape(args[0]))
    if hits:
        return (f"; {', '.join(hits[:5])}, a shape this error names: check it against what the function "
                f"expects for a system whose q has shape {q_shape}")
    arrays = [f"params{jax.tree_util.keystr(path)} {tuple(jnp.shape(leaf))}" for path, leaf in leaves
              if jnp.ndim(leaf)]
    if not (named and arrays):
        return ""
    return f" (q has shape {q_shape}; the array parameters are {', '.join(arrays[:6])})"


def _call(what: str, signature: str, fn, *args):
    """``fn(*args)``, with a failure of the user's function re-raised naming it, its signature and, where the
    failure points at one, the argument at fault: ``params`` when a function indexes a params that is not a
    dict, a parameter leaf whose shape the error names."""
    params = args[-1]
    try:
        return fn(*args)
    except KeyError as error:
        keys = f"; its top-level keys are {sorted(map(str, params))}" if isinstance(params, Mapping) else ""
        raise ValueError(
            f"{what}: the parameter pytree has no entry {error}{keys}; {what} reads it from p (signature "
            f"{signature})"
        ) from error
    except (TypeError, IndexError) as error:
        text = str(error)
        indexing = isinstance(error, IndexError) or _INDEXING_ERRORS.search(text)
        if not isinstance(params, Mapping) and indexing:
            raise ValueError(
                f"{what}: params is {_kind(params)}, and {signature} could not index it "
                f"({type(error).__name__}: {text}); pass params as the pytree your model functions index, "
                f"e.g. a dict {{'m': 1.0}} for p['m']"
            ) from error
        if isinstance(error, TypeError) and _CALL_ERRORS.search(text):
            raise ValueError(f"{what} could not be called as {signature}: {text}") from error
        sequences = _sequences(params)
        if isinstance(error, TypeError) and sequences and re.search(r"'(?:list|tuple)'", text):
            raise ValueError(
                f"{what} failed at the initial state: {text}; {', '.join(sequences[:5])} "
                f"{'is a list or tuple' if len(sequences) == 1 else 'are lists or tuples'}: give arrays "
                f"(jnp.asarray([...])) for parameters the model computes with"
            ) from error
        raise ValueError(
            f"{what} failed at the initial state: {type(error).__name__}: {text.rstrip('.')}"
            f"{_shape_hint(text, args)}"
        ) from error
    except ValueError as error:
        text = str(error)
        hint = _shape_hint(text, args)
        text = text.rstrip(".") if hint else text
        raise ValueError(f"{what} failed at the initial state: {text}{hint}") from error


def model_at_start(system, q0, qd0, t0, params, *, singular_mass: bool = False) -> None:
    """Check every function of ``system`` at the initial state before the simulation is compiled.

    Every function (mass, force, non-ideal vector, actuation, every constraint's second-order form and
    residuals) is traced at the initial state (:func:`_start_values`), which reports a missing parameter key,
    a wrong signature or a wrong output shape with the function's name. The values that decide whether
    integration can start are checked here: the mass matrix (finite, symmetric, positive definite) and the
    position-level residuals φ (finite).
    """
    phis, M = _start_values(system, q0, qd0, t0, params)
    for label, phi in phis:
        phi = np.asarray(phi)
        if not np.all(np.isfinite(phi)):
            raise ValueError(
                f"{label}: φ is NaN or infinite at the initial state (q0 = {np.asarray(q0)}, φ = {phi})"
            )
    M = np.asarray(M)
    if not np.all(np.isfinite(M)):
        raise ValueError(f"the mass matrix is NaN or infinite at the initial state q0 = {np.asarray(q0)}")
    if not np.max(np.abs(M - M.T), initial=0.0) <= SYMMETRY_RTOL * np.max(np.abs(M), initial=0.0):
        raise ValueError(
            f"the mass matrix is not symmetric at the initial state (max |M - Mᵀ| = "
            f"{np.max(np.abs(M - M.T)):.3g}); the Udwadia-Kalaba equation needs a symmetric M"
        )
    smallest = np.linalg.eigvalsh((M + M.T) / 2)[0]
    cut = M.shape[0] * np.finfo(M.dtype).eps * np.max(np.abs(np.diagonal(M)), initial=0.0)
    if singular_mass:
        if not smallest >= -cut:
            raise ValueError(
                f"the mass matrix is not positive semidefinite at the initial state (smallest eigenvalue "
                f"{smallest:.3g}); check masses and inertias in params"
            )
        A, _ = system.constraint_equations(q0, qd0, t0, params)
        stacked = np.concatenate([(M + M.T) / 2, np.asarray(A)], axis=0)
        if np.linalg.matrix_rank(stacked) < M.shape[0]:
            raise ValueError(
                "rank [M; A] < n at the initial state: the constraints do not fix the accelerations that the "
                "singular mass matrix leaves free, so the motion is not unique (de Falco et al., eq. 37-43)"
            )
        return
    if not smallest > cut:
        raise ValueError(
            f"the mass matrix is not positive definite at the initial state (smallest eigenvalue "
            f"{smallest:.3g}); check masses and inertias in params, or use a singular-mass form "
            f"(uk_solver='falco' or 'phohomsiri')"
        )


def _staged_as_usual():
    """A context in which JAX stages every operation of a traced function, as it does outside
    ``jax.ensure_compile_time_eval``. The start-of-simulation checks are called in that context (so that they
    run eagerly inside a user's ``jit``), but inside it JAX also evaluates, while tracing, every operation
    whose inputs are constants (the basis vectors of ``jax.jacfwd``, iotas, ...), each compiled on its own:
    ~390 single-operation compilations over the test suite. JAX's switch for this is not public
    (``jax._src.config.eager_constant_folding``); without it the checks still run, only slower to trace."""
    return contextlib.nullcontext() if _EAGER_CONSTANT_FOLDING is None else _EAGER_CONSTANT_FOLDING(False)


@eqx.filter_jit
def _start_values(system, q0, qd0, t0, params):
    """((label, φ) of every holonomic constraint, M) at the initial state, from one program that calls every
    function of ``system`` there, each failure re-raised naming the function (:func:`_call`). Compiled once
    per system and shapes: a later simulation of the same system reuses it instead of tracing every model
    function again (a multibody system's functions take a second to trace) and evaluating φ and M
    operation by operation."""
    with _staged_as_usual():
        return _start_values_traced(system, q0, qd0, t0, params)


def _start_values_traced(system, q0, qd0, t0, params):
    M = _call("mass", "mass(q, t, p)", system.mass_matrix, q0, t0, params)
    _call("force", "force(q, qd, t, p)", system.given_force, q0, qd0, t0, params)
    if system.nonideal is not None:
        _call("nonideal", "nonideal(q, qd, t, p)", system.nonideal_vector, q0, qd0, t0, params)
    if system.actuation is not None:
        _call("actuation", "actuation(q, t, p)", system.actuation, q0, t0, params)
    signatures = {
        "Holonomic": "phi(q, t, p)",
        "Nonholonomic": "psi(q, qd, t, p)",
        "AccelerationLevel": "A(q, qd, t, p) and b(q, qd, t, p)",
    }
    phis = []
    for group, constraints in (
        ("constraint", system.constraints),
        ("servo constraint", system.servo_constraints),
    ):
        for constraint in constraints:
            kind = next(c.__name__ for c in type(constraint).__mro__ if c.__name__ in signatures)
            label = f"{group} {constraint.name!r} ({kind})"
            signature = signatures[kind]
            for form in (constraint.second_order, constraint.residuals):
                _call(label, signature, functools.partial(form, retract=system.retract), q0, qd0, t0, params)
            if hasattr(constraint, "phi"):
                phis.append((label, constraint.value(q0, t0, params)))
    return phis, M
