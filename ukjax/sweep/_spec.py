"""A sweep spec: what is simulated, what varies and how, what is kept; read from TOML and checked up front.

Spec fields (TOML, read with :mod:`tomllib`; or the same as a Python dict)::

    name = "scara"                  # default: the spec file's name
    description = "..."             # optional, one line (``ukjax sweep --list`` shows it)
    model = "scara"                 # registered name (ukjax.sweep.MODELS) or "module:function"
    scenarios = 100000              # random draws (replicates) per grid cell
    chunk_size = 4096               # scenarios per compiled call and Parquet file; "auto": sized to memory
    seed = 0                        # 0..2**63 - 1 (0..2**32 - 1 in float32): jax.random.key's range
    out = "ukjax-results/sweep_scara"  # default ./ukjax-results/sweep_NAME
    trajectories = [0, 1, 2]        # optional: scenarios whose full trajectories are saved

    [integrator]                    # options of ukjax.simulate_batch
    t1 = 5.0                        # required; t0 = 0 by default
    dt = 5e-3                       # fixed step; leave out for adaptive (rtol, atol)
    solver = "Tsit5"                # any diffrax solver class name
    max_steps = 1001
    num_saves = 101                 # evenly spaced saved times on which metrics are reduced
    method = "ldl"                  # UK method (ukjax.dynamics.ACCELERATION_METHODS)

    [vary]                          # one distribution per leaf; paths: params.NAME[.NAME...][INDEX], q0, qd0
    "params.m1" = { dist = "relative", spread = 0.05 }          # nominal * (1 + 0.05 U(-1, 1))
    "params.l[0]" = { dist = "uniform", low = 0.95, high = 1.05 }
    "q0" = { dist = "normal", std = 0.01 }                       # mean: the nominal value
    "params.g" = { dist = "lognormal", sigma = 0.1 }             # median: the nominal value
    "params.tau[3]" = { dist = "choice", values = [0.0, 1.0] }
    "params.alpha" = { dist = "grid", values = [0.5, 2.0] }      # Cartesian grid axis
    "integrator.method" = { dist = "grid", values = ["svd", "greville"] }

    [metrics]
    tail = 0.8                      # "tail" metrics cover t >= t0 + tail (t1 - t0)
    user = { path_error = "mymodule:path_error" }   # f(solution, params) -> scalar, or dict of scalars

Grids: every ``grid`` axis multiplies the sweep (Cartesian product); ``scenarios`` random draws are made per
grid cell, the same draws in every cell (common random numbers: cells differ by their grid values only). Grid
axes over parameters or the initial state vary inside one compiled program. Grid axes over integrator options
split the sweep into sub-sweeps run one after the other: ``method``, ``solver``, ``uk_solver`` and
``max_steps`` change the compiled program (one compile per combination); ``dt``, ``rtol``, ``atol``,
``pinv_rtol``, ``t1``, ``consistency_rtol``, ``constraint_rtol`` and ``constraint_atol`` do not.
``constraint_atol`` is one number here (every coordinate's absolute tolerance of the status, as in
``simulate``); the default is ``simulate``'s.

Every check that can be made from the spec and the model (unknown leaf or field, negative std, N <= 0, unknown
model, index out of range) raises ``ValueError`` naming the field, before anything is compiled.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import diffrax
import jax
import numpy as np
import tomllib

from ukjax.diagnostics import DEFAULT_CONSISTENCY_RTOL, DEFAULT_CONSTRAINT_RTOL
from ukjax.dynamics import ACCELERATION_METHODS
from ukjax.options import DEFAULT_MAX_STEPS, OPTION_DEFAULTS, STATIC_OPTIONS

DISTRIBUTIONS = {
    "uniform": ({"low", "high"}, set()),
    "normal": ({"std"}, {"mean"}),
    "lognormal": ({"sigma"}, {"median"}),
    "relative": ({"spread"}, set()),
    "choice": ({"values"}, {"weights"}),
    "grid": ({"values"}, set()),
}
"""kind -> (required fields, optional fields)."""

_GRID_OPTIONS = (
    "method", "solver", "uk_solver", "max_steps",
    "t1", "dt", "rtol", "atol", "pinv_rtol", "consistency_rtol", "constraint_rtol", "constraint_atol",
)
STATIC_INTEGRATOR = tuple(option for option in _GRID_OPTIONS if option in STATIC_OPTIONS)
"""Integrator options that change the compiled program (a grid over them: one compile per value)."""
NUMBER_INTEGRATOR = tuple(option for option in _GRID_OPTIONS if option not in STATIC_OPTIONS)
"""Integrator options that are traced numbers (a grid over them reuses the compiled program)."""
INTEGRATOR_DEFAULTS = {
    option: OPTION_DEFAULTS[option]
    for option in ("t0", "dt", "rtol", "atol", "max_steps", "method", "uk_solver", "pinv_rtol",
                   "consistency_rtol", "constraint_rtol", "constraint_atol", "solver")
} | {
    # Where simulate's default is None, chosen at the call (from the step, the dtype), a spec holds a value:
    # the float64 one, and the solver by name. The keys keep the order above (the manifest's).
    "max_steps": DEFAULT_MAX_STEPS,
    "consistency_rtol": DEFAULT_CONSISTENCY_RTOL,
    "constraint_rtol": DEFAULT_CONSTRAINT_RTOL,
    "solver": "Tsit5",
    "num_saves": 101,
}
TOP_LEVEL = {
    "name",
    "model",
    "scenarios",
    "chunk_size",
    "seed",
    "out",
    "integrator",
    "vary",
    "metrics",
    "trajectories",
    "description",
}
ROOTS = ("params", "q0", "qd0", "integrator")

_PATH = re.compile(
    r"^(?P<root>params|q0|qd0|integrator)(?P<keys>(\.[A-Za-z_][\w\-]*)*)(?P<index>\[[\d,\s]+\])?$"
)


def _fail(field: str, message: str):
    raise ValueError(f"spec field {field}: {message}")


@dataclasses.dataclass(frozen=True)
class Distribution:
    """How one leaf (or one element of a leaf) varies; ``fields`` as in the spec (see the module)."""

    kind: str
    fields: dict

    @property
    def is_grid(self) -> bool:
        return self.kind == "grid"


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A parsed path: ``root`` (params, q0, qd0, integrator), dict ``keys``, an optional array ``index``."""

    path: str
    root: str
    keys: tuple[str, ...]
    index: tuple[int, ...] | None


def parse_path(path: str, field: str) -> Leaf:
    match = _PATH.match(path.replace(" ", ""))
    if match is None:
        _fail(
            field,
            f"cannot read the leaf path {path!r}; write params.NAME[.NAME...][INDEX], q0[INDEX], qd0, "
            "or integrator.OPTION",
        )
    keys = tuple(k for k in match["keys"].split(".") if k)
    index = None
    if match["index"]:
        index = tuple(int(i) for i in match["index"].strip("[]").split(",") if i.strip())
    root = match["root"]
    if root in ("q0", "qd0") and keys:
        _fail(field, f"{root} is an array; index it as {root}[i], not with a dotted name")
    if root == "params" and not keys:
        _fail(field, "name a parameter: params.NAME")
    if root == "integrator" and (len(keys) != 1 or index is not None):
        _fail(field, "write integrator.OPTION")
    return Leaf(path=path.replace(" ", ""), root=root, keys=keys, index=index)


def _number(value, field, *, positive=False, nonnegative=False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(field, f"expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        _fail(field, f"must be finite, got {value}")
    if positive and not value > 0:
        _fail(field, f"must be positive, got {value}")
    if nonnegative and value < 0:
        _fail(field, f"must not be negative, got {value}")
    return value


def _numbers(value, field, **kwargs):
    """A number or a (nested) list of numbers, as a float array."""
    if isinstance(value, list):
        return np.asarray([_numbers(v, f"{field}[{i}]", **kwargs) for i, v in enumerate(value)], np.float64)
    return np.asarray(_number(value, field, **kwargs))


def parse_distribution(table, field: str, *, integrator_option: str | None = None) -> Distribution:
    if not isinstance(table, Mapping) or "dist" not in table:
        _fail(field, f"expected a table with 'dist' (one of {', '.join(DISTRIBUTIONS)}), got {table!r}")
    kind = table["dist"]
    if kind not in DISTRIBUTIONS:
        _fail(f"{field}.dist", f"unknown distribution {kind!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    required, optional = DISTRIBUTIONS[kind]
    given = set(table) - {"dist"}
    if missing := required - given:
        _fail(field, f"a {kind} distribution needs {', '.join(sorted(missing))}")
    if unknown := given - required - optional:
        _fail(
            field,
            f"unknown field(s) {', '.join(sorted(unknown))} for a {kind} distribution "
            f"(it takes {', '.join(sorted(required | optional))})",
        )
    if integrator_option is not None:
        if kind != "grid":
            _fail(field, 'integrator options can only vary on a grid (dist = "grid")')
        values = table["values"]
        if not isinstance(values, list) or not values:
            _fail(f"{field}.values", "expected a non-empty list")
        return Distribution(
            kind, {"values": [_integrator_value(integrator_option, v, f"{field}.values") for v in values]}
        )
    fields: dict[str, Any] = {}
    if kind == "uniform":
        fields["low"] = _numbers(table["low"], f"{field}.low")
        fields["high"] = _numbers(table["high"], f"{field}.high")
        if np.any(fields["high"] < fields["low"]):
            _fail(field, f"high must not be below low, got low={table['low']}, high={table['high']}")
    elif kind == "normal":
        fields["std"] = _numbers(table["std"], f"{field}.std", nonnegative=True)
        if "mean" in table:
            fields["mean"] = _numbers(table["mean"], f"{field}.mean")
    elif kind == "lognormal":
        fields["sigma"] = _numbers(table["sigma"], f"{field}.sigma", nonnegative=True)
        if "median" in table:
            fields["median"] = _numbers(table["median"], f"{field}.median", positive=True)
    elif kind == "relative":
        fields["spread"] = _numbers(table["spread"], f"{field}.spread", nonnegative=True)
    else:  # choice, grid
        values = table["values"]
        if not isinstance(values, list) or not values:
            _fail(f"{field}.values", "expected a non-empty list")
        fields["values"] = [_numbers(v, f"{field}.values[{i}]") for i, v in enumerate(values)]
        if "weights" in table:
            weights = _numbers(table["weights"], f"{field}.weights", nonnegative=True)
            if weights.shape != (len(values),) or not weights.sum() > 0:
                _fail(f"{field}.weights", f"expected {len(values)} non-negative weights with a positive sum")
            fields["weights"] = weights / weights.sum()
    return Distribution(kind, fields)


def solver_class(name: str, field: str = "integrator.solver"):
    solver = getattr(diffrax, name, None) if isinstance(name, str) else None
    if not (isinstance(solver, type) and issubclass(solver, diffrax.AbstractSolver)):
        _fail(field, f"unknown diffrax solver {name!r} (e.g. Tsit5, Dopri5, Dopri8, Heun, Bosh3, Euler)")
    return solver


def _integrator_value(option: str, value, field: str):
    if option == "method":
        if value not in ACCELERATION_METHODS:
            _fail(field, f"unknown method {value!r}; choose one of {', '.join(ACCELERATION_METHODS)}")
        return value
    if option == "uk_solver":
        if value not in ("uk", "recursive"):
            _fail(field, f"uk_solver must be 'uk' or 'recursive', got {value!r}")
        return value
    if option == "solver":
        solver_class(value, field)
        return value
    if option in ("max_steps", "num_saves"):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (2 if option == "num_saves" else 1)
        ):
            _fail(field, f"{option} must be an int >= {2 if option == 'num_saves' else 1}, got {value!r}")
        return value
    if option == "t0":
        return _number(value, field)
    if option in ("pinv_rtol", "dt", "constraint_atol") and value is None:
        return None
    if option == "constraint_rtol":
        return _number(value, field, nonnegative=True)
    return _number(value, field, positive=True)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A checked sweep spec (see the module docstring for the fields)."""

    name: str
    model: str
    scenarios: int
    chunk_size: int | None
    seed: int
    out: str
    integrator: dict
    vary: dict  # path -> Distribution, sorted by path
    leaves: dict  # path -> Leaf
    tail: float
    user_metrics: dict  # column prefix -> "module:function"
    trajectories: tuple[int, ...]
    source: dict  # the spec as given (JSON-able), for the manifest


def _integer(value, field, *, minimum, maximum=None, why=""):
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(field, f"expected an integer, got {value!r}")
    if value < minimum:
        _fail(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        _fail(field, f"must lie in {minimum}..{maximum}{why}, got {value}")
    return value


def max_seed() -> int:
    """The largest seed :func:`jax.random.key` takes without an overflow or a collision: 2**63 - 1 with
    float64 (int64 seeds), 2**32 - 1 without (``key(2**32)`` is ``key(0)`` with 32-bit integers)."""
    return 2**63 - 1 if jax.config.jax_enable_x64 else 2**32 - 1


def _flatten_vary(table, prefix=""):
    """``[vary]`` with nested tables (``[vary.params]``) flattened to ``{path: distribution table}``."""
    flat = {}
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and "dist" not in value:
            flat.update(_flatten_vary(value, path))
        else:
            flat[path] = value
    return flat


def parse_spec(source: Mapping, *, default_name: str = "sweep", **overrides) -> Spec:
    """Check a spec given as a dict (what :func:`tomllib.load` returns); ``overrides`` replace top-level
    fields (``scenarios``, ``chunk_size``, ``seed``, ``out``). Checks that need the model are in
    :func:`check_against_model`."""
    if not isinstance(source, Mapping):
        raise ValueError(f"a sweep spec must be a table, got {type(source).__name__}")
    source = copy.deepcopy(dict(source))
    source.update({k: v for k, v in overrides.items() if v is not None})
    if unknown := set(source) - TOP_LEVEL:
        _fail(
            ", ".join(sorted(unknown)), f"unknown top-level field(s); known: {', '.join(sorted(TOP_LEVEL))}"
        )
    if "model" not in source:
        _fail("model", "missing: name a registered model or 'module:function'")
    if not isinstance(source["model"], str):
        _fail("model", f"expected a string, got {source['model']!r}")
    if "scenarios" not in source:
        _fail("scenarios", "missing: the number of random draws per grid cell")
    scenarios = _integer(source["scenarios"], "scenarios", minimum=1)
    chunk = source.get("chunk_size", "auto")
    chunk_size = None if chunk == "auto" else _integer(chunk, "chunk_size", minimum=1)
    seed = _integer(
        source.get("seed", 0),
        "seed",
        minimum=0,
        maximum=max_seed(),
        why=" (the seeds jax.random.key takes" + ("" if jax.config.jax_enable_x64 else " with float32") + ")",
    )
    name = source.get("name", default_name)
    if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
        _fail("name", f"expected letters, digits, '_', '-', '.', got {name!r}")
    out = source.get("out", f"ukjax-results/sweep_{name}")
    if not isinstance(out, str) or not out:
        _fail("out", f"expected a folder name, got {out!r}")

    table = source.get("integrator", {})
    if not isinstance(table, Mapping):
        _fail("integrator", "expected a table")
    if unknown := set(table) - set(INTEGRATOR_DEFAULTS) - {"t1"}:
        _fail(
            f"integrator.{sorted(unknown)[0]}",
            f"unknown option; known: {', '.join(sorted(set(INTEGRATOR_DEFAULTS) | {'t1'}))}",
        )
    integrator = dict(INTEGRATOR_DEFAULTS)
    for option, value in table.items():
        integrator[option] = _integrator_value(option, value, f"integrator.{option}")

    vary_table = source.get("vary", {})
    if not isinstance(vary_table, Mapping):
        _fail("vary", "expected a table of leaf = { dist = ... }")
    vary, leaves = {}, {}
    for path, dist_table in sorted(_flatten_vary(vary_table).items()):
        field = f"vary.{path}"
        leaf = parse_path(path, field)
        option = leaf.keys[0] if leaf.root == "integrator" else None
        if option is not None and option not in STATIC_INTEGRATOR + NUMBER_INTEGRATOR:
            _fail(
                field,
                f"integrator option {option!r} cannot vary; options that can: "
                f"{', '.join(STATIC_INTEGRATOR + NUMBER_INTEGRATOR)}",
            )
        vary[leaf.path] = parse_distribution(dist_table, field, integrator_option=option)
        leaves[leaf.path] = leaf
    if "t1" not in integrator and "integrator.t1" not in vary:
        _fail("integrator.t1", "missing: the end time of every scenario")
    _check_span(integrator, vary)
    _check_overlaps(leaves)

    metrics = source.get("metrics", {})
    if not isinstance(metrics, Mapping):
        _fail("metrics", "expected a table")
    if unknown := set(metrics) - {"tail", "user"}:
        _fail(f"metrics.{sorted(unknown)[0]}", "unknown field; known: tail, user")
    tail = _number(metrics.get("tail", 0.8), "metrics.tail", nonnegative=True)
    if tail >= 1:
        _fail("metrics.tail", f"must lie in [0, 1), got {tail}")
    user = metrics.get("user", {})
    if not isinstance(user, Mapping) or not all(isinstance(v, str) for v in user.values()):
        _fail("metrics.user", 'expected a table name = "module:function"')
    for key in user:
        if not re.fullmatch(r"[A-Za-z_]\w*", key):
            _fail(f"metrics.user.{key}", "metric names are identifiers (letters, digits, '_')")

    trajectories = source.get("trajectories", [])
    if not isinstance(trajectories, list):
        _fail("trajectories", "expected a list of scenario indices")
    trajectories = tuple(_integer(i, f"trajectories[{k}]", minimum=0) for k, i in enumerate(trajectories))
    spec = Spec(
        name=name,
        model=source["model"],
        scenarios=scenarios,
        chunk_size=chunk_size,
        seed=seed,
        out=out,
        integrator=integrator,
        vary=vary,
        leaves=leaves,
        tail=tail,
        user_metrics=dict(user),
        trajectories=trajectories,
        source=source,
    )
    total = total_scenarios(spec)
    for k, i in enumerate(trajectories):
        if i >= total:
            _fail(f"trajectories[{k}]", f"index {i} is not below the number of scenarios, {total}")
    return spec


def _option_values(integrator: dict, vary: dict, option: str) -> list:
    """Every value an integrator option takes: its grid's values, else the integrator table's value."""
    grid = vary.get(f"integrator.{option}")
    return list(grid.fields["values"]) if grid is not None else [integrator.get(option)]


def _check_span(integrator: dict, vary: dict) -> None:
    """t1 > t0, and a fixed step shorter than the span t1 - t0 for every grid value (``ukjax.simulate``
    refuses dt >= t1 - t0; a sweep would otherwise run one clipped step)."""
    t0 = integrator["t0"]
    span = min(t1 for t1 in _option_values(integrator, vary, "t1")) - t0
    if span <= 0:
        _fail("integrator.t1", f"must be greater than t0 = {t0:g}, got t1 = {span + t0:g}")
    dts = [dt for dt in _option_values(integrator, vary, "dt") if dt is not None]
    if dts and max(dts) >= span:
        field = "vary.integrator.dt" if "integrator.dt" in vary else "integrator.dt"
        _fail(
            field,
            f"the fixed step dt = {max(dts):g} is not shorter than the span t1 - t0 = {span:g} "
            "(ukjax.simulate refuses it); choose dt < t1 - t0, or leave dt out for adaptive steps",
        )


def _check_overlaps(leaves: dict) -> None:
    by_leaf: dict[tuple, list[Leaf]] = {}
    for leaf in leaves.values():
        by_leaf.setdefault((leaf.root, leaf.keys), []).append(leaf)
    for group in by_leaf.values():
        whole = [leaf for leaf in group if leaf.index is None]
        if whole and len(group) > 1:
            other = next(leaf for leaf in group if leaf is not whole[0])
            _fail(
                f"vary.{other.path}", f"overlaps vary.{whole[0].path}: one distribution per leaf or element"
            )


def grid_axes(spec: Spec) -> tuple[list[tuple[str, list]], list[tuple[str, list]]]:
    """(integrator grid axes, traced grid axes), each a list of (path, values) in path order."""
    integrator, traced = [], []
    for path, dist in spec.vary.items():
        if dist.is_grid:
            (integrator if spec.leaves[path].root == "integrator" else traced).append(
                (path, dist.fields["values"])
            )
    return integrator, traced


def total_scenarios(spec: Spec) -> int:
    integrator, traced = grid_axes(spec)
    cells = math.prod(len(v) for _, v in integrator) * math.prod(len(v) for _, v in traced)
    return spec.scenarios * cells


SHIPPED_SPECS = "specs"
"""The folder of :mod:`ukjax.sweep` holding the specs shipped with ukjax (package data, one NAME.toml
each), so that ``ukjax sweep NAME`` runs them from an installed package as from a clone."""


def shipped_folder():
    """The folder of the shipped specs (an :mod:`importlib.resources` traversable; a path once installed)."""
    return importlib.resources.files("ukjax.sweep").joinpath(SHIPPED_SPECS)


def _shipped_files() -> dict:
    """name -> file (an :mod:`importlib.resources` traversable) of every shipped spec, in name order."""
    files = [f for f in shipped_folder().iterdir() if f.is_file() and f.name.endswith(".toml")]
    return {f.name.removesuffix(".toml"): f for f in sorted(files, key=lambda f: f.name)}


def shipped_specs() -> dict[str, str]:
    """name -> one-line description of every sweep spec shipped with ukjax, in name order.

    ``load_spec(NAME)``, ``run(NAME)`` and ``ukjax sweep NAME`` run one; ``ukjax sweep --list`` prints this
    table and the folder that holds the files (copy one to change it). A file that cannot be read (edited in
    place, say) is listed with the reason as its description, so that it does not hide the others."""
    found = {}
    for name, file in _shipped_files().items():
        try:
            found[name] = str(_read_toml(file, name).get("description", ""))
        except (ValueError, OSError) as error:
            found[name] = f"(cannot be read: {error})"
    return found


def _read_toml(file, shown: str) -> dict:
    try:
        with file.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"sweep spec {shown!r} is not valid TOML: {error}") from error


def _spec_file(source) -> tuple:
    """(file, shown name) of a spec given as a path or as the name of a shipped spec. A path to an existing
    file wins; otherwise a shipped name; otherwise ``ValueError`` listing the shipped names."""
    path = Path(source)
    if path.is_file():
        return path, str(path)
    shipped = _shipped_files()
    if isinstance(source, str) and source in shipped:
        return shipped[source], source
    known = ", ".join(shipped) or "none"
    if isinstance(source, str) and path.name == source and not path.suffix:  # a bare name, not a path
        raise ValueError(f"unknown sweep spec {source!r}: not a shipped spec ({known}) nor a file")
    raise ValueError(f"sweep spec {str(path)!r} is not a file (shipped specs, by name: {known})")


def load_spec(source, **overrides) -> Spec:
    """A :class:`Spec` from a TOML file path, the name of a shipped spec (:func:`shipped_specs`; a path to an
    existing file of that name wins), or a dict; ``overrides`` as in :func:`parse_spec`. The spec's name
    defaults to the file's, less a ``sweep_`` prefix."""
    if isinstance(source, Spec):
        return parse_spec(source.source, default_name=source.name, **overrides) if overrides else source
    if isinstance(source, Mapping):
        return parse_spec(source, **overrides)
    file, shown = _spec_file(source)
    table = _read_toml(file, shown)
    return parse_spec(table, default_name=Path(file.name).stem.removeprefix("sweep_"), **overrides)


# ------------------------------------------------------------------------------ checks against the model
def _params_leaf(params, keys, field):
    node = params
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping) or key not in node:
            where = "params" + "".join(f".{k}" for k in keys[:depth])
            known = ", ".join(sorted(node)) if isinstance(node, Mapping) else "none (not a dict)"
            _fail(field, f"unknown leaf {key!r} in {where} (its keys: {known})")
        node = node[key]
    if isinstance(node, Mapping):
        _fail(
            field, f"params.{'.'.join(keys)} is a table, not a leaf; name one of its keys: {', '.join(node)}"
        )
    return node


def nominal_shapes(model, spec: Spec) -> dict:
    """{path: (shape of the varied value, dtype)} for every non-integrator leaf; checks that each exists."""
    q0, qd0 = jax.eval_shape(model.initial_state, model.params)
    shapes = {}
    for path, leaf in spec.leaves.items():
        if leaf.root == "integrator":
            continue
        field = f"vary.{path}"
        if leaf.root == "params":
            value = _params_leaf(model.params, leaf.keys, field)
        else:
            value = q0 if leaf.root == "q0" else qd0
        shape, dtype = tuple(np.shape(value)), value.dtype
        if leaf.index is not None:
            if len(leaf.index) != len(shape) or any(
                not 0 <= i < s for i, s in zip(leaf.index, shape, strict=False)
            ):
                _fail(
                    field,
                    f"index {list(leaf.index)} is out of range for {leaf.root}"
                    f"{''.join('.' + k for k in leaf.keys)} of shape {shape}",
                )
            shape = ()
        shapes[path] = (shape, dtype)
        dist = spec.vary[path]
        for key in ("values",):
            for i, v in enumerate(dist.fields.get(key, [])):
                if np.shape(v) not in ((), shape):
                    _fail(f"{field}.values[{i}]", f"expected a number or an array of shape {shape}")
        for key in ("low", "high", "std", "mean", "sigma", "median", "spread"):
            if key in dist.fields and np.shape(dist.fields[key]) not in ((), shape):
                _fail(f"{field}.{key}", f"expected a number or an array of shape {shape}")
    return shapes


def check_lognormal_nominal(model, spec: Spec, nominal: dict) -> None:
    for path, dist in spec.vary.items():
        if (
            dist.kind == "lognormal"
            and "median" not in dist.fields
            and np.any(np.asarray(nominal[path]) <= 0)
        ):
            _fail(
                f"vary.{path}",
                "a lognormal distribution without a median takes the nominal value as its "
                "median, which must be positive here; give median = ...",
            )
