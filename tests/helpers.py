"""The one tolerance helper of the test suite, and small shared utilities."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System


def tree_allclose(x, y, *, rtol=1e-10, atol=1e-10) -> bool:
    """True when two pytrees have the same structure and all leaves agree within ``atol + rtol * |y|``."""
    if jax.tree_util.tree_structure(x) != jax.tree_util.tree_structure(y):
        return False
    for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False):
            return False
    return True


def assert_tree_allclose(x, y, *, rtol=1e-10, atol=1e-10, msg=""):
    """Assert :func:`tree_allclose`, printing the largest absolute difference on failure."""
    if not tree_allclose(x, y, rtol=rtol, atol=atol):
        leaves_x, leaves_y = jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)
        diffs = [
            float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
            if np.shape(a) == np.shape(b)
            else float("inf")
            for a, b in zip(leaves_x, leaves_y, strict=True)
        ]
        raise AssertionError(f"{msg} trees differ: max abs diff per leaf {diffs} (rtol={rtol}, atol={atol})")


def violations_in_tolerance_units_of(sol, tolerance):
    """``sol`` with ``position_violation`` and ``velocity_violation`` times ``tolerance``: back to roughly
    coordinate units (metres), so that an absolute comparison at round-off level means metres, not units of
    the status's 1e-6 tolerance (which magnify round-off of φ by 1e6)."""
    import equinox as eqx

    return eqx.tree_at(
        lambda s: (s.position_violation, s.velocity_violation),
        sol,
        (sol.position_violation * tolerance, sol.velocity_violation * tolerance),
    )


def central_difference(f, x, direction, eps=1e-6):
    """Central finite difference of ``f`` at ``x`` along ``direction``.

    Error O(eps²) truncation + O(round-off / eps)."""
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


def _generator(key):
    """NumPy's generator seeded by the bits of a JAX key (``jax.random.PRNGKey``, ``split``, ``fold_in``)."""
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


def random_normal(key, shape, dtype=jnp.float64):
    """Standard-normal test data for ``key``, drawn by NumPy: ``jax.random.normal`` compiles a program per
    shape and dtype (~0.25 s each, again after every test module releases its programs; ~25 s of the suite's
    CPU time went to them)."""
    return jnp.asarray(_generator(key).normal(size=shape), dtype)


def random_uniform(key, shape, dtype=jnp.float64, minval=0.0, maxval=1.0):
    """Uniform test data on [minval, maxval) for ``key``, drawn by NumPy (see :func:`random_normal`)."""
    return jnp.asarray(_generator(key).uniform(minval, maxval, size=shape), dtype)


def random_matrix(key, m, n, rank=None, dtype=jnp.float64):
    """A random m x n matrix of the given rank (full rank by default), singular values in [0.5, 2]; built in
    NumPy float64 (no compiled program per shape), then cast to ``dtype``."""
    rank = min(m, n) if rank is None else rank
    if rank == 0:
        return jnp.zeros((m, n), dtype)
    rng = _generator(key)
    u, _ = np.linalg.qr(rng.normal(size=(m, rank)))
    v, _ = np.linalg.qr(rng.normal(size=(n, rank)))
    return jnp.asarray((u * rng.uniform(0.5, 2.0, size=rank)) @ v.T, dtype)


def random_spd(key, n, cond=10.0, dtype=jnp.float64):
    """A random symmetric positive-definite n x n matrix with condition number ``cond`` (built in NumPy)."""
    q, _ = np.linalg.qr(_generator(key).normal(size=(n, n)))
    return jnp.asarray((q * np.geomspace(1.0, cond, n)) @ q.T, dtype)


def assert_plain_jit_vmap_agree(fn, states, params, *, rtol, atol):
    """``fn(q, qd, params)`` gives the same numbers called plainly (first state only), under ``jit`` and
    under ``jit(vmap)`` over a list of (q, qd) states: the same operations, fused differently."""
    jitted_fn = jax.jit(fn)
    plain = fn(*states[0], params)  # op by op: slow, so once
    jitted = jnp.stack([jitted_fn(q, qd, params) for q, qd in states])
    qs, qds = (jnp.stack(x) for x in zip(*states, strict=True))
    mapped = jax.jit(jax.vmap(fn, in_axes=(0, 0, None)))(qs, qds, params)
    assert_tree_allclose(jitted[0], plain, rtol=rtol, atol=atol)
    assert_tree_allclose(mapped, jitted, rtol=rtol, atol=atol)


class CompileCounter:
    """Counts XLA compilations of programs whose name contains ``name`` (JAX's monitoring events), so a test
    can check that a second call reuses the compiled program. Register once per test module."""

    def __init__(self, name: str):
        self.name, self.count = name, 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration" and self.name in str(kwargs.get("fun_name")):
            self.count += 1


# A unit inside parentheses or brackets: "t (s)", "x [m]", "|φ| (m or rad)", "β (1/s²)", "u (N m)".
_UNIT = re.compile(r"[(\[][^)\]]*(?<![A-Za-z])(m|mm|s|rad|mrad|deg|N|kg)(?![A-Za-z])")
UNITLESS_LABELS = frozenset({"", "scenarios", "step"})  # counts


def labels_without_units(fig) -> list[str]:
    """Axis labels (x, y, z, colorbars) of a matplotlib figure that name no unit and are not counts."""
    labels = []
    for ax in fig.axes:
        labels += [ax.get_xlabel(), ax.get_ylabel()]
        if hasattr(ax, "get_zlabel"):
            labels.append(ax.get_zlabel())
    return [label for label in labels if label not in UNITLESS_LABELS and not _UNIT.search(label)]


def _pendulum_force(q, qd, t, p):
    # gravity and a linear drag -c q̇ (drag makes the motion depend on the mass, for gradient tests)
    return jnp.stack([jnp.zeros_like(p["m"]), -p["m"] * p["g"]]) - p["c"] * qd


PENDULUM = System(
    mass=lambda q, t, p: p["m"] * jnp.eye(2, dtype=q.dtype),
    force=_pendulum_force,
    n=2,
    constraints=(
        Holonomic(
            lambda q, t, p: jnp.stack([q @ q - p["l"] ** 2]),
            baumgarte=Baumgarte(gains=lambda p: (p["alpha"], p["beta"])),
            name="rod",
        ),
    ),
)
"""A damped pendulum in Cartesian coordinates (x, y): mass p["m"], rod p["l"], gravity p["g"], drag p["c"],
Baumgarte gains p["alpha"], p["beta"]; shared by the simulation and solver tests."""


def rotation_x(a):
    """The rotation by angle a about the x axis (3, 3)."""
    c, s, z, o = jnp.cos(a), jnp.sin(a), jnp.zeros_like(a), jnp.ones_like(a)
    return jnp.stack([jnp.stack([o, z, z]), jnp.stack([z, c, -s]), jnp.stack([z, s, c])])


def rotation_y(a):
    """The rotation by angle a about the y axis (3, 3)."""
    c, s, z, o = jnp.cos(a), jnp.sin(a), jnp.zeros_like(a), jnp.ones_like(a)
    return jnp.stack([jnp.stack([c, z, s]), jnp.stack([z, o, z]), jnp.stack([-s, z, c])])


def rotation_z(a):
    """The rotation by angle a about the z axis (3, 3)."""
    c, s, z, o = jnp.cos(a), jnp.sin(a), jnp.zeros_like(a), jnp.ones_like(a)
    return jnp.stack([jnp.stack([c, -s, z]), jnp.stack([s, c, z]), jnp.stack([z, z, o])])
