"""From a scenario's index to its inputs, and from its solution to its row of metrics, on the device.

Index layout. With S integrator-grid combinations (sub-sweeps), G cells of the parameter/initial-state grid
and N = ``scenarios`` random draws per cell, the scenarios are numbered ``i = (s G + g) N + r`` (s the
sub-sweep, g the cell, r the replicate). Scenario i's random values are drawn with the key
``fold_in(fold_in(key(seed), r), crc32(path))`` for each varied leaf: they depend on the seed, the replicate
and the leaf's name only, so the table does not depend on chunk size, device count or host count, and every
grid cell sees the same N draws (common random numbers).

Metrics (one row per scenario, reduced on the device, so trajectories never leave it): see
:data:`METRIC_DESCRIPTIONS`; NaN for scenarios whose integration failed (:data:`VALID_TRAJECTORY`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.diagnostics import range_excess
from ukjax.simulation import COMPLETED
from ukjax.sweep._spec import NUMBER_INTEGRATOR, STATIC_INTEGRATOR, Spec, grid_axes

RANGE_COLUMN = "joint_range_excess"
"""Columns ``RANGE_COLUMN.NAME``: how far coordinate NAME left the range its model states."""

METRIC_DESCRIPTIONS = {
    "status": "ukjax.RESULTS code (0 = success); status_name is its name",
    "num_steps": "integrator steps taken (accepted + rejected)",
    "num_accepted_steps": "accepted integrator steps",
    "max_abs_phi": "max over saved times of |φ| (holonomic position residuals, max over rows)",
    "tail_abs_phi": "the same over the tail window t >= t0 + tail (t1 - t0)",
    "max_abs_velocity_residual": "max over saved times of |φ̇| and |ψ| (velocity-level residuals)",
    "tail_abs_velocity_residual": "the same over the tail window",
    "peak_constraint_force": "max over saved times and coordinates of |Q^c| (ideal + non-ideal force)",
    "max_consistency": "max over saved times of ‖A A⁺ b - b‖ (0 when the constraints are consistent)",
    "peak_abs_u": "controlled systems: max over saved times and actuators of |u|",
    "max_abs_servo_residual": "controlled systems: max over saved times of the servo-constraint residual",
    "tail_abs_servo_residual": "controlled systems: the same over the tail window",
    "joint_range_excess.NAME": "models that state ranges (System.coordinate_ranges, a robot file's joint "
    "limits): max over saved times of how far coordinate NAME was beyond its range (0 inside; not enforced)",
    "q_final[i]": "coordinate i at t1",
    "qd_final[i]": "velocity i at t1",
}


VALID_TRAJECTORY = COMPLETED
"""Statuses after which the whole trajectory is meaningful; for every other status (the integration stopped
early or the state became non-finite) the scenario's metrics are NaN; status and step counts are kept."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the sweep's scenarios are numbered and cut into chunks (see the module docstring)."""

    replicates: int
    integrator_axes: list  # [(path, values)]
    traced_axes: list  # [(path, values)]
    chunk_size: int

    @classmethod
    def from_spec(cls, spec: Spec, chunk_size: int) -> Plan:
        integrator, traced = grid_axes(spec)
        return cls(spec.scenarios, integrator, traced, chunk_size)

    @property
    def cells(self) -> int:
        return math.prod(len(v) for _, v in self.traced_axes)

    @property
    def subsweeps(self) -> int:
        return math.prod(len(v) for _, v in self.integrator_axes)

    @property
    def per_subsweep(self) -> int:
        return self.replicates * self.cells

    @property
    def total(self) -> int:
        return self.subsweeps * self.per_subsweep

    @property
    def chunks_per_subsweep(self) -> int:
        return -(-self.per_subsweep // self.chunk_size)

    @property
    def num_chunks(self) -> int:
        return self.subsweeps * self.chunks_per_subsweep

    def chunk(self, c: int) -> tuple[int, int, int]:
        """(sub-sweep, first index, end index) of chunk ``c``."""
        s, k = divmod(c, self.chunks_per_subsweep)
        start = s * self.per_subsweep + k * self.chunk_size
        return s, start, min(start + self.chunk_size, (s + 1) * self.per_subsweep)

    def subsweep_of(self, index: int) -> int:
        return index // self.per_subsweep

    def integrator_values(self, s: int) -> dict:
        """{option: value} of the integrator grid for sub-sweep ``s`` (first axis slowest)."""
        combos = list(itertools.product(*(values for _, values in self.integrator_axes)))
        return {
            path.split(".", 1)[1]: v for (path, _), v in zip(self.integrator_axes, combos[s], strict=True)
        }


def integrator_options(spec: Spec, plan: Plan, s: int) -> tuple[dict, dict]:
    """(static options, number options) of sub-sweep ``s``: the spec's integrator table and grid values."""
    options = dict(spec.integrator)
    options.update(plan.integrator_values(s))
    static = {k: options[k] for k in STATIC_INTEGRATOR}
    numbers = {
        k: options[k]
        for k in ("t0",) + NUMBER_INTEGRATOR
    }
    static["num_saves"] = options["num_saves"]
    return static, numbers


def _leaf_key(path: str) -> np.uint32:
    return np.uint32(zlib.crc32(path.encode()) & 0xFFFFFFFF)


def _draw(dist, key, nominal):
    """One draw of ``dist`` with the shape and dtype of ``nominal`` (the leaf's value in the model)."""
    shape, dtype = nominal.shape, nominal.dtype
    f = {k: jnp.asarray(v, dtype) for k, v in dist.fields.items() if k not in ("values", "weights")}
    if dist.kind == "uniform":
        return f["low"] + (f["high"] - f["low"]) * jax.random.uniform(key, shape, dtype)
    if dist.kind == "normal":
        return f.get("mean", nominal) + f["std"] * jax.random.normal(key, shape, dtype)
    if dist.kind == "lognormal":
        return f.get("median", nominal) * jnp.exp(f["sigma"] * jax.random.normal(key, shape, dtype))
    if dist.kind == "relative":
        return nominal * (1.0 + f["spread"] * jax.random.uniform(key, shape, dtype, -1.0, 1.0))
    values = jnp.stack([jnp.broadcast_to(jnp.asarray(v, dtype), shape) for v in dist.fields["values"]])
    weights = dist.fields.get("weights")
    p = None if weights is None else jnp.asarray(weights, dtype)
    return values[jax.random.choice(key, len(dist.fields["values"]), p=p)]


def _get(params, keys):
    for key in keys:
        params = params[key]
    return params


def _set(params, keys, value):
    """A copy of the nested dict ``params`` with the leaf at ``keys`` replaced."""
    out = dict(params)
    out[keys[0]] = value if len(keys) == 1 else _set(params[keys[0]], keys[1:], value)
    return out


def column_names(path: str, shape: tuple) -> list[str]:
    """Table columns of a varied value: ``path`` for a scalar, ``path[i]`` / ``path[i,j]`` per element."""
    if not shape:
        return [path]
    return [f"{path}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def scenario_builder(spec: Spec, plan: Plan, model, s: int) -> Callable:
    """``build(index) -> (params, q0, qd0, sampled)`` for one scenario of sub-sweep ``s`` (vmap it).

    ``sampled`` maps table columns to the scenario's drawn or grid values (scalars)."""
    base = jax.random.key(spec.seed)
    traced_sizes = [len(v) for _, v in plan.traced_axes]
    strides = [math.prod(traced_sizes[k + 1 :]) for k in range(len(traced_sizes))]
    grid_digit = {
        path: (stride, size)
        for (path, _), stride, size in zip(plan.traced_axes, strides, traced_sizes, strict=True)
    }
    offset = s * plan.per_subsweep
    varied = [(p, d) for p, d in spec.vary.items() if spec.leaves[p].root != "integrator"]
    # parameters first: the initial state may be a function of the drawn parameters
    order = {"params": 0, "q0": 1, "qd0": 1}
    varied.sort(key=lambda item: (order[spec.leaves[item[0]].root], item[0]))

    def build(index):
        local = index - offset
        cell, replicate = local // plan.replicates, local % plan.replicates
        key = jax.random.fold_in(base, replicate.astype(jnp.uint32))
        params, state, sampled = model.params, None, {}
        for path, dist in varied:
            leaf = spec.leaves[path]
            if leaf.root != "params" and state is None:
                state = dict(zip(("q0", "qd0"), model.initial_state(params), strict=True))
            container = _get(params, leaf.keys) if leaf.root == "params" else state[leaf.root]
            nominal = container if leaf.index is None else container[leaf.index]
            if dist.is_grid:
                stride, size = grid_digit[path]
                digit = (cell // stride) % size
                values = jnp.stack(
                    [
                        jnp.broadcast_to(jnp.asarray(v, nominal.dtype), nominal.shape)
                        for v in dist.fields["values"]
                    ]
                )
                value = values[digit]
            else:
                value = _draw(dist, jax.random.fold_in(key, _leaf_key(path)), nominal)
            new = value if leaf.index is None else container.at[leaf.index].set(value)
            if leaf.root == "params":
                params = _set(params, leaf.keys, new)
            else:
                state[leaf.root] = new
            for name, element in zip(column_names(path, nominal.shape), jnp.ravel(value), strict=True):
                sampled[name] = element
        if state is None:
            state = dict(zip(("q0", "qd0"), model.initial_state(params), strict=True))
        return params, state["q0"], state["qd0"], sampled

    return build


def _max(x, axes):
    return jnp.max(jnp.abs(x), axis=axes, initial=0.0)


def reducer(system, ts, t0, t1, tail: float, user_metrics: dict) -> Callable:
    """``reduce(solution, params) -> {column: scalar}`` for ONE scenario (vmap it)."""
    late = ts >= t0 + tail * (t1 - t0)

    def tail_max(x):  # x: (T, k)
        return jnp.max(jnp.where(late[:, None], jnp.abs(x), 0.0), axis=(0, 1), initial=0.0)

    def reduce(sol, params):
        row = {
            "status": sol.status.astype(jnp.int32),
            "num_steps": sol.num_steps,
            "num_accepted_steps": sol.num_accepted_steps,
            "max_abs_phi": _max(sol.position_residual, (0, 1)),
            "tail_abs_phi": tail_max(sol.position_residual),
            "max_abs_velocity_residual": _max(sol.velocity_residual, (0, 1)),
            "tail_abs_velocity_residual": tail_max(sol.velocity_residual),
            "peak_constraint_force": _max(sol.constraint_force.total, (0, 1)),
            "max_consistency": _max(sol.consistency, (0,)),
        }
        if sol.u is not None:
            row["peak_abs_u"] = _max(sol.u, (0, 1))
            row["max_abs_servo_residual"] = _max(sol.servo_residual, (0, 1))
            row["tail_abs_servo_residual"] = tail_max(sol.servo_residual)
        excess = range_excess(sol.q, system)  # (k,): one per range the model states
        for k, (_, name, _, _) in enumerate(system.coordinate_ranges):
            row[f"{RANGE_COLUMN}.{name}"] = excess[k]
        for i in range(system.nq):
            row[f"q_final[{i}]"] = sol.q[-1, i]
        for i in range(system.n):
            row[f"qd_final[{i}]"] = sol.qd[-1, i]
        for name, function in user_metrics.items():
            value = function(sol, params)
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for key, v in items:
                v = jnp.asarray(v)
                column = name if key is None else f"{name}.{key}"
                if v.shape != ():
                    raise ValueError(
                        f"spec field metrics.user.{name}: the metric must return a scalar (or a "
                        f"dict of scalars) per scenario; {column} has shape {v.shape}"
                    )
                row[column] = v
        # After a failure that stops the integration the saved values are not meaningful (see Solution): such
        # a scenario's metrics are NaN rather than numbers that depend on how the batch was cut.
        valid = jnp.isin(sol.status, jnp.asarray(VALID_TRAJECTORY, sol.status.dtype))
        for name, value in row.items():
            if name not in ("status", "num_steps", "num_accepted_steps"):
                row[name] = jnp.where(valid, value, jnp.nan).astype(value.dtype)
        return row

    return reduce
