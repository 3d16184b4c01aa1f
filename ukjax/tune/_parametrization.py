"""Which leaves of the parameter pytree ``p`` are tuned, and in which coordinates the optimizer sees them.

A :class:`Parametrization` splits ``p`` into the tuned leaves and the rest, which stays fixed. The optimizer
works on an unconstrained vector θ (a dict ``path -> array``); each tuned leaf x is recovered from its θ by a
:class:`Transform`:

* :func:`free`: x = θ (no constraint);
* :func:`log`: x = exp θ, so x > 0 whatever step the optimizer takes; optional bounds lower ≤ x ≤ upper by
  projecting θ onto [log lower, log upper] after every step (``optax.projections.projection_box``);
* :func:`softplus`: x = log(1 + e^θ) > 0 (gradients do not vanish for large x as they do not for log either,
  but the map is nearly linear there);
* :func:`sigmoid`: x = lower + (upper - lower) σ(θ), a smooth box;
* :func:`box`: x = θ projected onto [lower, upper] (a hard box in the leaf's own units).

``shared=True`` tunes ONE number for all entries of an array leaf (e.g. the same Baumgarte gain on every
constraint row, ``p["alpha"]`` of shape (4,)); otherwise every entry is tuned on its own.

Leaves are named by paths: ``"alpha"`` for ``p["alpha"]``, ``"arm/mass"`` for ``p["arm"]["mass"]``, ``"0"``
for a list entry; a boolean mask pytree of the same structure as ``p`` works too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax.simulation import as_params

KINDS = ("free", "log", "softplus", "sigmoid", "box")


class Transform(eqx.Module):
    """x = f(θ) for one tuned leaf, with optional bounds; build it with :func:`free`, :func:`log`, ... ."""

    kind: str = eqx.field(static=True)
    lower: float | None = eqx.field(static=True, default=None)
    upper: float | None = eqx.field(static=True, default=None)
    shared: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"transform kind must be one of {KINDS}, got {self.kind!r}")
        lo, hi = self.lower, self.upper
        if self.kind in ("log", "softplus") and lo is not None and not lo > 0:
            raise ValueError(f"a {self.kind} transform keeps x > 0; lower must be positive, got {lo}")
        if self.kind == "sigmoid" and (lo is None or hi is None):
            raise ValueError("a sigmoid transform needs both lower and upper")
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError(f"lower must be smaller than upper, got lower={lo}, upper={hi}")
        if self.kind == "softplus" and (lo is not None or hi is not None):
            raise ValueError("softplus takes no bounds; use log(lower=..., upper=...) or sigmoid for a box")

    def forward(self, theta):
        """x = f(θ)."""
        if self.kind == "log":
            return jnp.exp(theta)
        if self.kind == "softplus":
            return jax.nn.softplus(theta)
        if self.kind == "sigmoid":
            return self.lower + (self.upper - self.lower) * jax.nn.sigmoid(theta)
        return theta

    def inverse(self, x):
        """θ = f⁻¹(x); raises ValueError for a concrete x outside the transform's range."""
        x = jnp.asarray(x)
        if isinstance(x, jax.core.Tracer):
            concrete = None
        else:
            concrete = np.asarray(x)
        if self.kind in ("log", "softplus"):
            if concrete is not None and not np.all(concrete > 0):
                raise ValueError(f"a {self.kind} transform needs a positive initial value, got {concrete}")
            return jnp.log(x) if self.kind == "log" else x + jnp.log(-jnp.expm1(-x))
        if self.kind == "sigmoid":
            if concrete is not None and not np.all((concrete > self.lower) & (concrete < self.upper)):
                raise ValueError(
                    f"a sigmoid transform needs lower < x < upper = ({self.lower}, {self.upper}), "
                    f"got {concrete}"
                )
            u = (x - self.lower) / (self.upper - self.lower)
            return jnp.log(u) - jnp.log1p(-u)
        return x

    def check_initial(self, name: str, x) -> None:
        """Refuse (ValueError naming the leaf, the value and the bounds) an initial value x the transform
        cannot start from: NaN or infinite, x ≤ 0 for log and softplus, x outside [lower, upper] (outside
        (lower, upper) for sigmoid). Projection would otherwise clamp it to the box without a word. Values
        under a jax transformation are not checked."""
        if isinstance(x, jax.core.Tracer):
            return
        values = np.asarray(x, dtype=np.float64)
        shown = values.tolist()
        if not np.all(np.isfinite(values)):
            raise ValueError(f"tuned leaf {name!r} has a NaN or infinite initial value: {shown}")
        if self.kind in ("log", "softplus") and not np.all(values > 0):
            raise ValueError(
                f"tuned leaf {name!r}: a {self.kind} transform needs a positive initial value, got {shown}"
            )
        lo = -np.inf if self.lower is None else self.lower
        hi = np.inf if self.upper is None else self.upper
        inside = (values > lo) & (values < hi) if self.kind == "sigmoid" else (values >= lo) & (values <= hi)
        if not np.all(inside):
            box = f"({lo}, {hi})" if self.kind == "sigmoid" else f"[{lo}, {hi}]"
            raise ValueError(
                f"tuned leaf {name!r} has the initial value {shown}, outside the bounds {box} of its "
                f"{self.kind} transform; give an initial value inside them or widen the bounds (the tuner "
                "would otherwise clamp it to the box silently)"
            )

    def theta_bounds(self) -> tuple[float | None, float | None]:
        """Bounds on θ enforced by projection (None where there is none)."""
        if self.kind == "log":
            lo = None if self.lower is None else math.log(self.lower)
            hi = None if self.upper is None else math.log(self.upper)
            return lo, hi
        if self.kind in ("box", "free"):
            return self.lower, self.upper
        return None, None

    def project(self, theta):
        """θ projected onto its box (``optax.projections.projection_box``); the identity without bounds."""
        lo, hi = self.theta_bounds()
        if lo is None and hi is None:
            return theta
        from optax import projections

        lo = -jnp.inf if lo is None else lo
        hi = jnp.inf if hi is None else hi
        return projections.projection_box(theta, jnp.asarray(lo, theta.dtype), jnp.asarray(hi, theta.dtype))


def free(*, shared: bool = False) -> Transform:
    """x = θ, unconstrained."""
    return Transform("free", shared=shared)


def log(*, lower: float | None = None, upper: float | None = None, shared: bool = False) -> Transform:
    """x = exp θ > 0; with bounds, θ is projected onto [log lower, log upper] after every step."""
    return Transform("log", lower, upper, shared)


def softplus(*, shared: bool = False) -> Transform:
    """x = log(1 + e^θ) > 0."""
    return Transform("softplus", shared=shared)


def sigmoid(lower: float, upper: float, *, shared: bool = False) -> Transform:
    """x = lower + (upper - lower) σ(θ): a smooth box lower < x < upper."""
    return Transform("sigmoid", lower, upper, shared)


def box(lower: float | None = None, upper: float | None = None, *, shared: bool = False) -> Transform:
    """x = θ, projected onto [lower, upper] after every step."""
    return Transform("box", lower, upper, shared)


def _key_name(key) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def path_name(path) -> str:
    """``"a/b/0"`` for the key path of ``p["a"]["b"][0]``."""
    return "/".join(_key_name(k) for k in path)


def _mask_mismatch(tuned, leaves: dict) -> str:
    """Why ``tuned``, read as a boolean mask, does not fit the params whose leaves (by path) are ``leaves``:
    the paths it lacks and those it has beyond them, and what ``tuned`` can be instead."""
    given = [path_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(tuned)]
    missing = [name for name in leaves if name not in given]
    extra = [name for name in given if name not in leaves]
    words = [
        f"tuned {tuned!r} is read as a boolean mask (its values are not ukjax.tune Transforms), and a mask "
        f"needs exactly the leaves of params {sorted(leaves)}"
    ]
    if missing:
        words.append(f"it lacks {missing}")
    if extra:
        words.append(f"it has {extra}, which params does not")
    if not missing and not extra:
        structure = jax.tree_util.tree_structure
        words.append(f"its structure {structure(tuned)} differs from params' {structure(leaves)}")
    named = [v for v in jax.tree_util.tree_leaves(tuned) if isinstance(v, str)]
    hint = (
        f" ({named[0]!r} is a string: the transform is the function ukjax.tune.{named[0]}())"
        if named and named[0] in ("log", "free", "softplus", "sigmoid", "box")
        else ""
    )
    return (
        "; ".join(words)
        + f". To tune some leaves by name, give {{path: Transform}} such as {{'{(given or ['alpha'])[0]}': "
        f"ukjax.tune.log()}}, or a list of paths{hint}"
    )


class Parametrization(eqx.Module):
    """The tuned leaves of a parameter pytree and their transforms; the other leaves stay as in ``params``.

    Arguments:
        params: the full parameter pytree (initial values of the tuned leaves, fixed values of the rest).
        tuned: ``{path: Transform}`` (a :class:`Transform` per tuned leaf), a sequence of paths (each gets
            ``transform``), or a boolean mask pytree with the structure of ``params``.
        transform: the transform of paths given without one (default :func:`log`, i.e. positive gains).

    θ (:meth:`init`) is a dict ``path -> array``: the unconstrained coordinates the optimizer updates.
    :meth:`params` maps θ back to a full parameter pytree; :meth:`values` to the tuned leaves alone.
    """

    base: Any
    specs: tuple = eqx.field(static=True)  # ((path, Transform, leaf shape), ...), hashable for jit

    def __init__(self, params, tuned, *, transform: Transform | None = None):
        default = log() if transform is None else transform
        flat = {path_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
        is_spec = isinstance(tuned, Mapping) and (
            not tuned or any(v is None or isinstance(v, Transform) for v in tuned.values())
        )
        if is_spec:
            specs = {str(k): (default if v is None else v) for k, v in tuned.items()}
        elif isinstance(tuned, Sequence) and not isinstance(tuned, str):
            specs = {str(k): default for k in tuned}
        elif isinstance(tuned, str):
            specs = {tuned: default}
        else:
            mask = jax.tree_util.tree_leaves_with_path(tuned)
            if jax.tree_util.tree_structure(tuned) != jax.tree_util.tree_structure(params):
                raise ValueError(_mask_mismatch(tuned, flat))
            specs = {path_name(path): default for path, on in mask if bool(on)}
        if not specs:
            raise ValueError("tuned names no leaf of params: nothing to tune")
        for name, spec in specs.items():
            if name not in flat:
                raise ValueError(f"tuned path {name!r} is not a leaf of params; leaves: {sorted(flat)}")
            if not isinstance(spec, Transform):
                raise ValueError(f"tuned[{name!r}] must be a ukjax.tune Transform, got {type(spec).__name__}")
            leaf = jnp.asarray(flat[name])
            if not jnp.issubdtype(leaf.dtype, jnp.floating):
                raise ValueError(f"tuned leaf {name!r} must be floating point, got dtype {leaf.dtype}")
        self.base = params
        self.specs = tuple((name, spec, tuple(jnp.shape(flat[name]))) for name, spec in specs.items())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.specs)

    @property
    def transforms(self) -> dict:
        """``{path: Transform}`` of the tuned leaves."""
        return {name: spec for name, spec, _ in self.specs}

    @property
    def shapes(self) -> dict:
        return {name: shape for name, _, shape in self.specs}

    def init(self, params=None) -> dict:
        """θ of the tuned leaves of ``params`` (default: the ``params`` given at construction)."""
        flat = self._flat(self.base if params is None else params)
        theta = {}
        for name, spec in self.transforms.items():
            value = jnp.asarray(flat[name])
            if spec.shared:
                if value.size and not bool(jnp.all(value == value.ravel()[0])):
                    raise ValueError(
                        f"tuned leaf {name!r} is shared (one number for all entries) but its entries differ: "
                        f"{np.asarray(value)}"
                    )
                value = value.ravel()[0] if value.ndim else value
            spec.check_initial(name, value)
            theta[name] = spec.project(spec.inverse(value))
        # strongly typed leaves: a weakly typed θ (from jnp.array(1.0) parameters) would make the jitted
        # tuning step compile again once optax returns it strongly typed
        return as_params(theta)

    def values(self, theta) -> dict:
        """The tuned leaves x = f(θ), in their own shapes."""
        out = {}
        for name, spec in self.transforms.items():
            x = spec.forward(theta[name])
            out[name] = jnp.broadcast_to(x, self.shapes[name]) if spec.shared else x
        return out

    def compact_values(self, theta) -> dict:
        """The tuned values f(θ) as the optimizer sees them: one number for a shared leaf."""
        return {name: spec.forward(theta[name]) for name, spec, _ in self.specs}

    def params(self, theta, base=None):
        """The full parameter pytree: ``base`` (default the construction's params) with the tuned leaves
        replaced by f(θ). ``base`` may be one scenario's parameters of a batch."""
        values = self.values(theta)
        base = self.base if base is None else base

        def replace(path, leaf):
            name = path_name(path)
            return values[name].astype(jnp.result_type(leaf)) if name in values else leaf

        return jax.tree_util.tree_map_with_path(replace, base)

    def project(self, theta) -> dict:
        """θ with every bounded coordinate projected onto its box."""
        return {name: spec.project(theta[name]) for name, spec in self.transforms.items()}

    def _flat(self, params) -> dict:
        return {path_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
