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

import hashlib
import importlib
import inspect
import sys
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
"""module object -> {"module": name, "sha256": ...}: a module's source is hashed once, when first asked after
its import, so the hash describes the code this process runs (a module re-imported from an edited file is a
new module object, hashed again)."""


def module_identity(module_name: str) -> dict:
    """``{"module": NAME, "sha256": SHA-256 of its source file}`` of an imported module: what a sweep's
    fingerprint records of the user's model and metric code, so that a resume refuses rows of edited code."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    if module not in _DIGESTS:
        try:
            data = Path(module.__file__).read_bytes() if getattr(module, "__file__", None) else None
        except OSError:
            data = None
        if data is None:
            try:
                data = inspect.getsource(module).encode()
            except (OSError, TypeError):
                data = b""
        _DIGESTS[module] = {"module": module_name, "sha256": hashlib.sha256(data).hexdigest()}
    return dict(_DIGESTS[module])


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
