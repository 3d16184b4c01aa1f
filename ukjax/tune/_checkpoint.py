"""Tuning checkpoints that know what they belong to: a fingerprint of the run, checked field by field on
resume, and a reader that names the file when it is damaged.

A checkpoint (``.npz``, written atomically with :func:`ukjax._io.atomic_savez`) holds the loop state of
:func:`ukjax.tune.fit` (θ, the optimizer state, the last accepted point, the best θ, the history) and a
*fingerprint* of everything that decides the numbers of the run:

* ``parametrization``: every tuned leaf's name, leaf shape, θ shape and dtype, transform and bounds, and a
  hash of the base parameters;
* ``optimizer``: the tree structure, shapes and dtypes of its state, a hash of its initial state (this shows
  hyperparameters held in the state, e.g. ``optax.inject_hyperparams``), its transformation's functions with
  the hyperparameters their closures capture, by name (:func:`optimizer_identity`: ``scale_by_adam``'s
  ``b1``, ``nesterov``, ``scale``'s ``step_size``), and its description (set by
  :func:`ukjax.tune.default_optimizer`, or ``fit(optimizer_description=...)``);
* ``options`` (t0, t1, dt, ts, solver, tolerances, ...), ``objective`` (term names, weights, and the source
  and captured values of every term's function), ``risk``, ``scenarios`` (a hash of the batch's arrays, or the
  sampler's source and output shapes), ``system`` (its functions' sources and static fields);
* ``seed``, the divergence and stopping settings (``loop``), and the versions of ukjax, jax, jaxlib, diffrax,
  equinox and optax.

Functions are identified by module, qualified name, a hash of their source text (byte code when there is no
source) and of their module's source file (so that an edited helper they call is seen), and, recursively, the
values their closures capture (by the captured variable's name); arrays by shape, dtype and a SHA-256 of their
bytes. Two runs with equal fingerprints compute the same numbers; a resume whose fingerprint differs is
refused with the fields that differ. What cannot be seen: a value :func:`describe` cannot look into (an
object without attributes, a closure nested deeper than its limit: :func:`undescribed`); ``fit`` warns,
naming the checkpoint, when the optimizer holds one, and ``optimizer_description`` identifies it.

**The contents prove themselves.** The meta entry holds a SHA-256 of the checkpoint's contents
(:func:`contents_digest`: every array entry, θ, the optimizer state, the accepted and best points, and the
loop state, ``best_loss`` and the history included); :func:`read` refuses, naming the file, a checkpoint
whose contents do not match it (an edited θ or optimizer-state entry, a NaN written in, an edited
``best_loss``), so a resume never continues from numbers the run did not compute.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re
import zipfile
import zlib
from pathlib import Path

import jax
import numpy as np

CHECKPOINT_FORMAT = 3
"""Version of the checkpoint layout (1: no fingerprint, before ukjax 0.1.0's integrity checks; 2: no checksum
of the contents, no description of the optimizer's functions)."""

FOLDER_CHECKPOINT = "checkpoint.npz"
"""The checkpoint's name in the output folder of a tuning study's fit (``ukjax tune NAME``), which resumes
from it when started again (``--fresh`` removes it)."""

TREE_GROUPS = ("theta", "opt_state", "acc_theta", "acc_opt_state", "acc_grad", "best_theta")
_MAX_DEPTH = 6
_SHOWN_VALUES = 8  # arrays with at most this many entries are fingerprinted by value, not only by hash


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def array_identity(value) -> dict:
    """Shape, dtype and a SHA-256 of the bytes (the values themselves too for a small array)."""
    array = np.ascontiguousarray(np.asarray(value))
    out = {"shape": list(array.shape), "dtype": str(array.dtype)}
    if array.size <= _SHOWN_VALUES and array.dtype.kind in "biuf":
        out["values"] = [
            v if not isinstance(v, float) or math.isfinite(v) else str(v) for v in array.ravel().tolist()
        ]
    else:
        out["sha256"] = _sha(array.tobytes())
    return out


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray | np.generic | jax.Array)


@functools.lru_cache(maxsize=256)
def _file_hash(filename: str, mtime_ns: int) -> str:
    return _sha(Path(filename).read_bytes())


def _module_source_hash(fn) -> str | None:
    """A hash of the source file of ``fn``'s module: a helper it calls that changed is seen too."""
    try:
        filename = inspect.getsourcefile(fn)
        return None if filename is None else _file_hash(filename, Path(filename).stat().st_mtime_ns)
    except (OSError, TypeError):
        return None


def _function_identity(fn, depth: int) -> dict:
    if isinstance(fn, functools.partial):
        return {
            "partial": describe(fn.func, depth + 1),
            "args": describe(fn.args, depth + 1),
            "keywords": describe(fn.keywords, depth + 1),
        }
    if inspect.ismethod(fn):
        return {"method": describe(fn.__func__, depth + 1), "of": describe(fn.__self__, depth + 1)}
    inner = getattr(fn, "__wrapped__", None)  # jax.jit and functools.wraps keep the user's function here
    if inner is not None and inner is not fn:
        return describe(inner, depth + 1)
    name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    out = {"function": name}
    try:
        out["source_sha256"] = _sha(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is not None:
            out["code_sha256"] = _sha(code.co_code + repr(code.co_consts).encode())
    module_hash = _module_source_hash(fn)
    if module_hash is not None:
        out["module_sha256"] = module_hash
    closure = getattr(fn, "__closure__", None) or ()
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    names = names if len(names) == len(closure) else [str(i) for i in range(len(closure))]
    cells = {}
    for name, cell in zip(names, closure, strict=True):  # by the captured variable's name: learning_rate, ...
        try:
            cells[name] = describe(cell.cell_contents, depth + 1)
        except ValueError:  # an empty cell
            cells[name] = None
    if cells:
        out["closure"] = cells
    defaults = getattr(fn, "__defaults__", None)
    if defaults:
        out["defaults"] = describe(defaults, depth + 1)
    return out


def describe(value, depth: int = 0):
    """A JSON-able description of ``value`` that is equal for values that compute the same: numbers and
    strings as they are, arrays by :func:`array_identity`, containers element by element, functions by
    source and closure, dataclasses (equinox modules, diffrax solvers) by type and fields, other objects by
    type and attributes. No memory address enters it, so it is the same in every process."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > _MAX_DEPTH:
        return {"type": f"{type(value).__module__}.{type(value).__qualname__}", TRUNCATED: True}
    if _is_array(value):
        return array_identity(value)
    if isinstance(value, dict):
        return {str(k): describe(v, depth + 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return {
            "type": f"{type(value).__module__}.{type(value).__qualname__}",
            **{f: describe(getattr(value, f), depth + 1) for f in value._fields},
        }
    if isinstance(value, list | tuple):
        return [describe(v, depth + 1) for v in value]
    if isinstance(value, type):
        return {"class": f"{value.__module__}.{value.__qualname__}"}
    if (
        isinstance(value, functools.partial)
        or inspect.isfunction(value)
        or inspect.ismethod(value)
        or inspect.isbuiltin(value)
        or (callable(value) and getattr(value, "__wrapped__", None) is not None)
    ):
        return _function_identity(value, depth)
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if dataclasses.is_dataclass(value):
        return {
            "type": kind,
            **{f.name: describe(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)},
        }
    attributes = getattr(value, "__dict__", None)
    if attributes:
        return {"type": kind, **{k: describe(v, depth + 1) for k, v in sorted(attributes.items())}}
    if callable(value):
        return _function_identity(value, depth)
    return {"type": kind}


TRUNCATED = "not described deeper"
"""Key marking where :func:`describe` stopped (nested deeper than its limit)."""


def optimizer_identity(optimizer) -> dict:
    """What identifies an optax transformation beyond its state: :func:`describe` of its ``init`` and
    ``update`` functions, twice as deep as other values. optax builds a transformation from closures, so this
    holds each function's name (``scale_by_adam.<locals>.update_fn``) and the hyperparameters it captured, by
    the variable's name (``b1``, ``nesterov``, ``step_size``, a schedule's ``init_value``...): ``adam(1e-3)``
    against ``adam(1e-2)``, or ``nadam`` (``nesterov=True``) against ``adam``, differ here."""
    return describe(optimizer, -_MAX_DEPTH)


def undescribed(payload, prefix: str = "") -> list[str]:
    """Where a description holds a value that :func:`describe` could not see into: cut at its depth limit, or
    an object with neither attributes nor a function's code (a C object), as ``field`` paths."""
    found = []
    if isinstance(payload, dict):
        if payload.get(TRUNCATED) or (set(payload) == {"type"} and payload["type"] != "builtins.NoneType"):
            return [prefix or "(the value)"]
        for key, value in payload.items():
            found += undescribed(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(payload, list):
        for i, value in enumerate(payload):
            found += undescribed(value, f"{prefix}[{i}]")
    return found


def tree_identity(tree) -> dict:
    """Structure, shapes and dtypes of a pytree (an optimizer state), and a hash of its values."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [np.ascontiguousarray(np.asarray(leaf)) for leaf in leaves]
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(array.tobytes())
    return {
        "structure": re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef)),  # no address of a function in it
        "leaves": [[list(a.shape), str(a.dtype)] for a in arrays],
        "initial_sha256": digest.hexdigest()[:16],
    }


def versions() -> dict:
    import diffrax
    import equinox
    import optax

    import ukjax

    return {
        "ukjax": ukjax.__version__,
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or jax.__version__,
        "diffrax": diffrax.__version__,
        "equinox": equinox.__version__,
        "optax": optax.__version__,
    }


def canonical(payload):
    """``payload`` as it reads back from JSON (tuples as lists, 1.0 and 1 equal), for comparison."""
    return json.loads(json.dumps(payload))


def flatten(payload, prefix: str = "") -> dict:
    """``{"a.b[0].c": leaf}`` of a nested description."""
    if isinstance(payload, dict) and payload:
        out = {}
        for key, value in payload.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(payload, list) and payload:
        out = {}
        for i, value in enumerate(payload):
            out.update(flatten(value, f"{prefix}[{i}]"))
        return out
    return {prefix: payload}


def _shown(value, missing: bool) -> str:
    if missing:
        return "(absent)"
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def differences(old: dict, new: dict, limit: int = 8) -> list[str]:
    """One line per differing leaf of two fingerprints: ``field: OLD in the checkpoint, NEW now``."""
    flat_old, flat_new = flatten(old), flatten(new)
    lines = []
    for key in (
        [k for k in flat_old if k in flat_new]
        + [k for k in flat_old if k not in flat_new]
        + [k for k in flat_new if k not in flat_old]
    ):
        a, b = flat_old.get(key), flat_new.get(key)
        if key in flat_old and key in flat_new and a == b:
            continue
        lines.append(
            f"{key}: {_shown(a, key not in flat_old)} in the checkpoint, {_shown(b, key not in flat_new)} now"
        )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return lines


AFRESH = "to start afresh, delete the file or pass another checkpoint path"


class CheckpointMismatch(ValueError):
    """The checkpoint was written by a different tuning run (the message names the file and the fields)."""


def check_fingerprint(path: Path, old: dict, new: dict, hint: str = "") -> None:
    """Refuse (:class:`CheckpointMismatch`) a resume whose fingerprint differs from the checkpoint's."""
    new = canonical(new)
    if old == new:
        return
    fields = sorted({k for k in set(old) | set(new) if old.get(k) != new.get(k)})
    lines = "\n  ".join(differences(old, new))
    raise CheckpointMismatch(
        f"checkpoint {path} belongs to a different tuning run; these differ ({', '.join(fields)}):\n"
        f"  {lines}\n"
        f"{hint}{AFRESH}"
    )


# ------------------------------------------------------------------------------------------ the file
def save(path: Path, trees: dict, meta: dict) -> None:
    """Write the checkpoint atomically: each leaf of ``trees`` as an entry ``GROUP/i``, ``meta`` as JSON."""
    from ukjax._io import atomic_savez

    arrays = {}
    for group, tree in trees.items():
        if tree is None:
            continue
        for i, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
            arrays[f"{group}/{i}"] = np.asarray(leaf)
    meta = dict(meta, checksum=contents_digest(meta, arrays))
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    atomic_savez(path, compressed=False, **arrays)


def contents_digest(meta: dict, arrays: dict) -> str:
    """SHA-256 of a checkpoint's contents: its meta entry (fingerprint, loop state with ``best_loss``,
    history...; without the checksum itself) and every array entry's name, dtype, shape and bytes."""
    digest = hashlib.sha256(
        json.dumps({k: v for k, v in meta.items() if k != "checksum"}, sort_keys=True).encode()
    )
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class _Damaged(Exception):
    pass


def read(path: Path) -> tuple[dict, dict]:
    """(meta, {entry: array}) of a checkpoint; ``ValueError`` naming the file when it cannot be read or is not
    a ukjax tuning checkpoint (truncated, not a zip, no meta entry, meta not JSON, an older layout)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise _Damaged("it is a single array, not the .npz archive fit writes")
            if "meta" not in data.files:
                raise _Damaged("it has no 'meta' entry")
            arrays = {name: np.asarray(data[name]) for name in data.files}
    except _Damaged as error:
        raise ValueError(f"checkpoint {path} is not a ukjax tuning checkpoint: {error}; {AFRESH}") from None
    except OSError as error:
        if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):
            raise ValueError(f"cannot read checkpoint {path}: {error.strerror or error}") from error
        raise ValueError(f"checkpoint {path} is damaged ({error}); {AFRESH}") from error
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, zlib.error, RuntimeError) as error:
        reason = str(error) or type(error).__name__
        if "allow_pickle" in reason:
            reason = "it is neither an .npz archive nor a NumPy array"
        raise ValueError(f"checkpoint {path} is damaged or not a checkpoint ({reason}); {AFRESH}") from error
    raw = arrays.pop("meta")
    try:
        meta = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"checkpoint {path}: its meta entry is not JSON ({error}); {AFRESH}") from error
    if not isinstance(meta, dict) or "format" not in meta:
        raise ValueError(
            f"checkpoint {path} has no fingerprint (written by an older ukjax, or not by ukjax.tune.fit); "
            f"{AFRESH}"
        )
    if meta["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {path} has layout {meta['format']!r}; this ukjax reads layout {CHECKPOINT_FORMAT}; "
            f"{AFRESH}"
        )
    missing = [key for key in ("fingerprint", "steps", "state", "groups", "checksum") if key not in meta]
    if missing or not isinstance(meta["state"], dict) or not isinstance(meta["fingerprint"], dict):
        raise ValueError(f"checkpoint {path}: its meta entry lacks {missing or 'a valid state'}; {AFRESH}")
    if meta["checksum"] != contents_digest(meta, arrays):
        raise ValueError(
            f"checkpoint {path}: its contents (θ, the optimizer state, the best point or the loop state) do "
            f"not match the checksum written with them: edited or damaged; {AFRESH}"
        )
    return meta, arrays


def restore(path: Path, arrays: dict, group: str, like):
    """The tree ``group`` rebuilt with the structure of ``like``; every leaf's shape and dtype checked."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    out = []
    for i, leaf in enumerate(leaves):
        name = f"{group}/{i}"
        if name not in arrays:
            raise ValueError(f"checkpoint {path} lacks the entry {name!r}; {AFRESH}")
        value, expected = arrays[name], np.asarray(leaf)
        if value.shape != expected.shape or value.dtype != expected.dtype:
            raise ValueError(
                f"checkpoint {path}: entry {name!r} has shape {value.shape} and dtype {value.dtype}, "
                f"expected {expected.shape} and {expected.dtype}; {AFRESH}"
            )
        out.append(jax.numpy.asarray(value))
    return jax.tree_util.tree_unflatten(treedef, out)
