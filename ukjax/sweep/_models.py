"""Which model a sweep simulates: a registered name or the user's own ``module:function``.

The protocol: a *model provider* is a function without arguments that returns either

* ``(system, params, q0, qd0)``: a :class:`ukjax.System`, its nominal parameter pytree (a dict, possibly
  nested, of arrays) and a fixed nominal initial state; or
* ``(system, params, initial_state)``: the same with a function ``initial_state(params) -> (q0, qd0)``,
  evaluated for every scenario after its parameters were drawn, so that an initial state that must satisfy the
  constraints follows sampled lengths (it must be a pure JAX function of ``params``).

Distributions over ``q0``/``qd0`` in a sweep spec perturb that initial state.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import site
import sys
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ukjax.system import System

MODELS: dict[str, str] = {
    "scara": "ukjax.models.scara",
    "five_bar": "ukjax.models.five_bar",
    "coordinated_robots": "ukjax.models.coordinated_robots",
    "two_mass_spring": "ukjax.models.two_mass_spring",
    "spiral": "ukjax.models.spiral",
    "flexible_joint": "ukjax.models.flexible_joint",
    "swarm": "ukjax.models.swarm",
}
"""Registered models: name -> module offering ``system()``, ``default_params()``, ``initial_state(params)``
(the papers' mechanisms, :mod:`ukjax.models`)."""


class Model(NamedTuple):
    """A model ready to sweep: ``initial_state(params) -> (q0, qd0)`` is traced per scenario."""

    name: str
    system: System
    params: Any
    initial_state: Callable


def _registered(name: str):
    module = importlib.import_module(MODELS[name])
    return module.system(), module.default_params(), module.initial_state


_DIGESTS: dict = {}
"""module object -> SHA-256 of its source file (``None``: it has none): a module's source is hashed once, when
first asked after its import, so the hash describes the code this process runs (a module re-imported from an
edited file is a new module object, hashed again)."""

LIBRARY_PACKAGES = ("ukjax",)
"""Packages whose code a sweep identifies by version (the identity's ``versions`` part), wherever they are
installed (ukjax may be an editable install outside site-packages)."""


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """The folders of the standard library and of installed packages (site-packages, dist-packages)."""
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    return tuple(sorted(str(Path(r).resolve()) + os.sep for r in roots if r))


def _is_library(name: str, file: str | None) -> bool:
    """Whether module ``name`` (source ``file``) is library code, identified by the versions, not hashed."""
    if name.partition(".")[0] in LIBRARY_PACKAGES or name in sys.builtin_module_names:
        return True
    if file is None:
        return False
    return str(Path(file).resolve()).startswith(_library_roots())


def _file_of(name: str) -> tuple[bool, str | None]:
    """(whether module ``name`` exists, its file or ``None``), without importing it when it is not imported
    (only its parent packages, as ``importlib.util.find_spec`` does)."""
    module = sys.modules.get(name)
    if module is not None:
        file = getattr(module, "__file__", None)
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        return True, file or (origin if origin not in (None, "built-in", "frozen") else None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):  # an optional import that is absent: no dependency
        return False, None
    if spec is None:
        return False, None
    return True, spec.origin if spec.has_location else None


def _imported_names(data: bytes, module_name: str, package: str | None) -> set[str]:
    """The modules the source ``data`` of ``module_name`` imports anywhere (top level or inside functions):
    ``import a.b`` gives a and a.b; ``from .c import d`` gives the resolved c and c.d (when d is a module)."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                names.update(".".join(parts[: k + 1]) for k in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _referenced_modules(module) -> set[str]:
    """The modules whose objects ``module``'s globals hold: imported modules, and the modules of the
    functions and classes imported from them."""
    names = set()
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            names.add(value.__name__)
            continue
        if isinstance(value, functools.partial):
            value = value.func
        if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
            owner = getattr(value, "__module__", None)
            if isinstance(owner, str):
                names.add(owner)
    return names


def _source_digest(name: str, file: str | None) -> tuple[str | None, bytes | None]:
    """(SHA-256, bytes) of module ``name``'s file; the digest of an imported module is that of the file it
    was imported from (:data:`_DIGESTS`)."""
    module = sys.modules.get(name)
    if module is not None and module in _DIGESTS and _DIGESTS[module][1] == file:
        digest = _DIGESTS[module][0]
        return digest, None if digest is None else _read(file)
    data = _read(file)
    if data is None and module is not None:
        try:
            data = inspect.getsource(module).encode()
        except (OSError, TypeError):
            data = None
    digest = None if data is None else hashlib.sha256(data).hexdigest()
    if module is not None:
        _DIGESTS[module] = (digest, file)
    return digest, data


def _read(file: str | None) -> bytes | None:
    if not file:
        return None
    try:
        return Path(file).read_bytes()
    except OSError:
        return None


def module_identity(module_name: str) -> dict:
    """``{"module": NAME, "sha256": ..., "imports": {MODULE: SHA-256}}`` of an imported module: the SHA-256 of
    its source file and of the source file of every module of the user's it depends on, directly or not
    (those it imports, found in its source and its globals, that are not in the standard library, in
    site-packages or in ukjax, which the identity's versions cover). What a sweep's fingerprint records of the
    user's model and metric code, so that a resume refuses rows of edited code, a helper module's constants
    included. A digest is ``None`` where the module has no source file to hash: a resume of such a sweep is
    refused (:func:`ukjax.sweep._store.unverifiable`), since that its code is unchanged cannot be proven."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    _, own_file = _file_of(module_name)
    own, _ = _source_digest(module_name, own_file)
    imports: dict[str, str | None] = {}
    todo, seen = [(module_name, own_file)], {module_name}
    while todo:
        name, file = todo.pop()
        digest, data = _source_digest(name, file)
        if name != module_name:
            imports[name] = digest
        found = _imported_names(data, name, _package_of(name, file)) if data else set()
        if name in sys.modules:
            found |= _referenced_modules(sys.modules[name])
        for dependency in sorted(found - seen):
            seen.add(dependency)
            top = sys.modules.get(dependency.partition(".")[0])
            if top is not None and _is_library(top.__name__, getattr(top, "__file__", None)):
                continue  # library code (versions): no need to look for its submodules
            exists, dep_file = _file_of(dependency)
            if not exists or _is_library(dependency, dep_file):
                continue
            dep_module = sys.modules.get(dependency)
            if dep_file is None and dep_module is not None and hasattr(dep_module, "__path__"):
                continue  # a namespace package: a folder, no code of its own
            todo.append((dependency, dep_file))
    del module
    return {"module": module_name, "sha256": own, "imports": dict(sorted(imports.items()))}


def _package_of(name: str, file: str | None) -> str | None:
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__package__", None)
    is_package = file is not None and Path(file).stem == "__init__"
    return name if is_package else name.rpartition(".")[0]


def reference_module(reference: str) -> str:
    """The module that defines a model (registered name or ``module:function``) or a user metric."""
    return MODELS[reference] if reference in MODELS else reference.partition(":")[0]


def _import(reference: str, field: str) -> Callable:
    """The callable named by ``module:function`` (``field`` names the spec field in error messages)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"spec field {field}: expected 'module:function', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"spec field {field}: cannot import module {module_name!r} ({error})") from error
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"spec field {field}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"spec field {field}: {reference!r} is not callable")
    return target


def _as_arrays(params):
    """Every leaf as a JAX array of a floating dtype (user providers may give Python floats)."""

    def convert(x):
        x = jnp.asarray(x)
        return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))

    return jax.tree_util.tree_map(convert, params)


_LOADED: dict[str, Model] = {}


def load_model(reference: str) -> Model:
    """The model a spec's ``model`` field names: a key of :data:`MODELS` or ``module:function``.

    The provider is called once per process and reference: the same :class:`ukjax.System` object is returned
    afterwards, so that re-running scenarios (:func:`ukjax.sweep.rerun`) reuses compiled programs."""
    if not isinstance(reference, str) or not reference:
        raise ValueError(f"spec field model: expected a model name or 'module:function', got {reference!r}")
    if reference not in _LOADED:
        _LOADED[reference] = _load(reference)
    return _LOADED[reference]


def _load(reference: str) -> Model:
    if ":" in reference:
        provided = _import(reference, "model")()
    elif reference in MODELS:
        provided = _registered(reference)
    else:
        raise ValueError(
            f"spec field model: unknown model {reference!r}; registered models: {', '.join(sorted(MODELS))}, "
            "or give your own as 'module:function'"
        )
    if not isinstance(provided, tuple) or len(provided) not in (3, 4):
        raise ValueError(
            f"spec field model: {reference!r} must return (system, params, q0, qd0) or "
            f"(system, params, initial_state); got {type(provided).__name__}"
        )
    system, params = provided[0], provided[1]
    if not isinstance(system, System):
        raise ValueError(
            f"spec field model: {reference!r} returned {type(system).__name__}, not a ukjax.System"
        )
    if not isinstance(params, dict):
        raise ValueError(
            f"spec field model: the parameters of {reference!r} must be a dict (possibly nested) of arrays, "
            f"got {type(params).__name__}"
        )
    params = _as_arrays(params)
    if len(provided) == 4:
        fixed = tuple(jnp.asarray(x, jnp.result_type(float)) for x in provided[2:])
        initial_state = lambda p: fixed
    else:
        initial_state = provided[2]
        if not callable(initial_state):
            raise ValueError(f"spec field model: the third value returned by {reference!r} must be callable")
    return Model(name=reference, system=system, params=params, initial_state=initial_state)
