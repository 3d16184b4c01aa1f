"""Compile once, cache across processes, exact fixed-step budgets, and derivatives of the UK solve that reuse
the forward factorization (checked against autodiff through the factorizations and finite differences)."""

import functools
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, random_matrix, random_normal, random_spd

from ukjax import dynamics, simulation
from ukjax.constraints import Holonomic
from ukjax.system import System

CACHE_SCRIPT = """
import sys
import jax, jax.numpy as jnp
import ukjax
from ukjax.constraints import Baumgarte, Holonomic
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
ukjax.enable_float64()
ukjax.enable_compilation_cache(sys.argv[1])
rod = Holonomic(lambda q, t, p: jnp.stack([q @ q - 1.0]), Baumgarte(gains=lambda p: (p["a"], p["b"])))
system = ukjax.System(mass=lambda q, t, p: jnp.eye(2), force=lambda q, qd, t, p: jnp.array([0.0, -9.81]),
                      n=2, constraints=(rod,))
p = {"a": jnp.asarray(2.0), "b": jnp.asarray(2.0)}
sol = ukjax.simulate_batch(system, jnp.tile(jnp.array([1.0, 0.0]), (4, 1)), jnp.zeros((4, 2)), p, t1=0.5,
                           dt=0.01)
assert bool(sol.ok.all())
print("hits", hits.count("/jax/compilation_cache/cache_hits"))
"""


def test_a_second_process_reads_the_compiled_simulation_from_the_cache(tmp_path):
    runs = [
        subprocess.run([sys.executable, "-c", CACHE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       check=True, timeout=600).stdout
        for _ in range(2)
    ]
    first, second = (int(out.split("hits")[-1]) for out in runs)
    # every program is cached (however fast it compiled), so a small program the first process compiles
    # twice is already read back there; the second process reads back more, the simulation among them
    assert second > first, runs
    assert any(path.name.startswith("jit__simulate_many") for path in tmp_path.iterdir())


LINE = System(mass=lambda q, t, p: jnp.eye(1), force=lambda q, qd, t, p: -q, n=1,
              constraints=(Holonomic(lambda q, t, p: q - jnp.sin(t), name="driven"),))


def _prepare(**options):
    defaults = dict(t0=0.0, t1=1.0, ts=None, solver=None, dt0=None, rtol=1e-8, atol=1e-8, max_steps=None,
                    method="ldl", uk_solver="uk", pinv_rtol=None, consistency_rtol=None,
                    constraint_rtol=None, saveat=None, stepsize_controller=None, adjoint=None, progress=False,
                    throw=False, dt=None)
    q0, qd0 = jnp.zeros(1), jnp.ones(1)
    return simulation._prepare(LINE, q0, qd0, {}, batched=False, **(defaults | options))[0]


SHARED_BUDGET = 335  # math.ceil(1.0 / 0.003) + 1


@pytest.mark.parametrize("t1, dt", [(1.0, 0.01), (1.0, 0.003), (2.5, 0.1), (1.0, 1 / 3)])
def test_fixed_step_budget_is_the_number_of_steps_the_span_needs(t1, dt):
    config = _prepare(t1=t1, dt=dt)
    steps = math.ceil(t1 / dt - 1e-9)
    assert config.max_steps == steps + 1
    # one checkpoint per step: reverse mode stores the trajectory's states and recomputes each step once
    assert config.adjoint.checkpoints == config.max_steps
    # The budget is static: each span's own would compile a simulation of its own. Every span runs in the
    # program of the largest, SHARED_BUDGET (that of t1 = 1, dt = 0.003, which gets it automatically), and
    # takes exactly the steps its span needs, which its automatic budget (checked above) covers.
    budget = None if config.max_steps == SHARED_BUDGET else SHARED_BUDGET
    sol = simulation.simulate(LINE, jnp.zeros(1), jnp.ones(1), {}, t1=t1, dt=dt, max_steps=budget)
    assert int(sol.num_steps) == steps and bool(sol.ok)


def test_adaptive_and_explicit_budgets_are_kept():
    assert _prepare().max_steps == simulation.DEFAULT_MAX_STEPS
    assert _prepare().adjoint.checkpoints is None  # diffrax's binomial default
    assert _prepare(dt=0.01, max_steps=500).max_steps == 500


def _problem(key, n, m, rank, consistent, nonideal):
    k = jax.random.split(key, 6)
    M = random_spd(k[0], n, cond=20.0)
    A = random_matrix(k[1], m, n, rank)
    b = A @ random_normal(k[2], (n,)) if consistent else random_normal(k[2], (m,))
    c = random_normal(k[3], (n,)) if nonideal else None
    return M, random_normal(k[4], (n,)), A, b, c


def _tangents(key, M, Q, A, b, c, rank):
    """Tangent directions, built in NumPy (no op-by-op JAX programs)."""
    k = jax.random.split(key, 5)
    dM = np.asarray(random_normal(k[0], M.shape))
    dA = random_normal(k[2], A.shape)
    db = random_normal(k[3], b.shape)
    if rank < min(A.shape):
        # along a constant-rank curve: the derivative of a generalized inverse exists only there
        u, _, vt = np.linalg.svd(np.asarray(A))
        dA = jnp.asarray(u[:, :rank] @ np.asarray(random_normal(k[2], (rank, rank))) @ vt[:rank])
    dc = None if c is None else random_normal(k[4], c.shape)
    return jnp.asarray(dM + dM.T), random_normal(k[1], Q.shape), dA, db, dc


# (n, m, rank, consistent b, non-ideal c). Three main cases share one shape (n = 4, m = 3), so one compiled
# program (_EQ35_PROGRAM: the jit cache hits for equal shapes) serves them: full row rank (G invertible),
# rank-deficient with a redundant row, and a redundant row with inconsistent b (r⊥ ≠ 0, where the two
# generalized inverses and their derivatives differ). A fourth, small one has more constraints than
# coordinates (m > n = 2, rank 1 < n, inconsistent): its own program. The unrolled factorizations of
# ukjax.linalg compile in time growing with n and m, most with m (measured, CPU seconds for trace, lowering
# and compilation of the program: 19.1 for (5, 4), 14.1 for (3, 4), 14.5 for (4, 3), 9.0 for (2, 3)); the
# smallest shapes that still hold every case above are used here, and the former main shapes (5, 4) and
# (3, 4), the larger m > n cases and the ideal (c = None) ones are in the slow set.
CASES = [(4, 3, 3, True, True), (4, 3, 2, True, True), (4, 3, 2, False, True), (2, 3, 1, False, True)]
SLOW_CASES = [
    (5, 4, 4, True, True), (5, 4, 2, True, True), (5, 4, 3, False, True), (3, 4, 2, False, True),
    (5, 7, 4, False, True), (6, 4, 2, True, True), (4, 4, 4, True, True), (4, 4, 4, True, False),
    (5, 3, 3, False, True), (6, 4, 2, False, False), (5, 7, 4, True, False), (3, 1, 1, True, True),
]
CASES += [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW_CASES]


def _with_method(method, cases):
    """The eq. 35 cases for one generalized inverse of G."""
    return [pytest.param(method, *c.values, marks=c.marks) if hasattr(c, "values") else (method, *c)
            for c in cases]  # fmt: skip


H = 1e-6  # central differences: truncation O(h²) ~1e-12, round-off O(eps/h) ~1e-10


def _eq35_checks(method, x, v, rtol):
    """Every quantity the eq. 35 test compares, for one generalized inverse of G."""

    def custom(M, Q, A, b, c):
        return dynamics._eq35_terms(method, M, Q, A, b, c, rtol)

    # autodiff through the Cholesky factorization and G's generalized inverse
    def autodiff(M, Q, A, b, c):
        return dynamics._eq35_forward(method, M, Q, A, b, c, rtol)[0]

    primal, derivative = jax.jvp(custom, x, v)
    primal_ref, derivative_ref = jax.jvp(autodiff, x, v)
    shift = lambda s: [None if y is None else y + s * dy for y, dy in zip(x, v, strict=True)]
    # both shifted points in one vmapped evaluation (one copy of the solve in the program, not two)
    both = jax.vmap(lambda s: autodiff(*shift(s)))(jnp.array([H, -H]))
    fd = jax.tree_util.tree_map(lambda y: (y[0] - y[1]) / (2 * H), both)
    # reverse mode is the transpose of the same linear map: <w, J v> = <Jᵀ w, v>
    weights = jax.tree_util.tree_map(
        lambda y: jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape), primal
    )
    cotangents = jax.vjp(custom, *x)[1](weights)
    lhs = sum(jnp.vdot(w, d) for w, d in zip(jax.tree_util.tree_leaves(weights),
                                             jax.tree_util.tree_leaves(derivative), strict=True))
    rhs = sum(jnp.vdot(ct, t) for ct, t in zip(jax.tree_util.tree_leaves(cotangents),
                                               jax.tree_util.tree_leaves(v), strict=True))
    return dict(primal=primal, primal_ref=primal_ref, derivative=derivative,
                derivative_ref=derivative_ref, fd=fd, lhs=lhs, rhs=rhs)


# One program for both generalized inverses, defined once: cases of equal shapes (and both with or both
# without c) reuse its compilation; rtol, a number that depends on the shape, is an argument.
_EQ35_PROGRAM = jax.jit(
    lambda x, v, rtol: {method: _eq35_checks(method, x, v, rtol) for method in ("cholesky", "ldl")}
)


@functools.cache
def _eq35_results(n, m, rank, consistent, nonideal):
    """Every quantity the eq. 35 test compares, for both generalized inverses of G, from the one compiled
    program of the case's shapes: the cholesky and ldl tests of a case share it, and nothing runs op by op
    (eager JAX compiles one small program per primitive and shape)."""
    key = jax.random.PRNGKey(n * 100 + m * 10 + rank + 1000 * consistent + 2000 * nonideal)
    M, Q, A, b, c = _problem(key, n, m, rank, consistent, nonideal)
    tangents = _tangents(jax.random.fold_in(key, 1), M, Q, A, b, c, rank)
    rtol = jnp.asarray(dynamics.gram_rtol(m, n))
    return jax.device_get(_EQ35_PROGRAM((M, Q, A, b, c), tangents, rtol))


@pytest.mark.parametrize(
    "method, n, m, rank, consistent, nonideal", _with_method("cholesky", CASES) + _with_method("ldl", CASES)
)
def test_custom_derivative_of_the_eq35_solve_matches_autodiff_and_finite_differences(
    method, n, m, rank, consistent, nonideal
):
    """The tangent rule of ``_eq35_terms`` against autodiff through the factorizations and against central
    differences, for both generalized inverses of G, consistent and inconsistent b, full and deficient rank:
    the least-squares acceleration of G⁺ (method "cholesky") and the reflexive G⁻ of "ldl", whose
    derivative has no r⊥ term (a rule with it differs from both references by ~1 here where r⊥ ≠ 0). Along
    a constant-rank curve of A, where both inverses are differentiable. Reverse mode (the VJP) against the
    same tangents: <w, J v> = <Jᵀ w, v>."""
    r = _eq35_results(n, m, rank, consistent, nonideal)[method]
    assert_tree_allclose(r["primal"], r["primal_ref"], rtol=1e-12, atol=1e-12)
    # both are exact derivatives; they differ by round-off amplified by cond(G) (≤ ~1e4 here)
    assert_tree_allclose(r["derivative"], r["derivative_ref"], rtol=1e-10, atol=1e-10)
    assert_tree_allclose(r["derivative"], r["fd"], rtol=1e-6, atol=1e-7)
    lhs, rhs = r["lhs"], r["rhs"]
    assert float(abs(lhs - rhs)) <= 1e-9 * (1 + float(abs(lhs)))


def test_benchmark_times_both_derivatives_of_the_same_right_hand_side():
    """``benchmarks/compile_and_gradient.py``'s right-hand-side measurement (its worker's ``rhs``, in this
    process at 8 scenarios): the custom derivative and autodiff through the factorization are derivatives of
    the same q̈, so their JVP and VJP agree to rounding (well-conditioned SCARA states: ~1e-16 measured; 1e-12
    leaves room for other BLAS orderings), and every time is positive."""
    import importlib.util
    from pathlib import Path

    from ukjax.demo import sample_scenarios
    from ukjax.models import scara

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "_compile_worker.py"
    spec = importlib.util.spec_from_file_location("compile_worker", path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    params = scara.default_params()
    q0, qd0 = scara.initial_state(params)
    batch, q0s, qd0s = sample_scenarios(jax.random.PRNGKey(0), params, q0, qd0, 8, spread=0.05,
                                        angle_noise_deg=1.0)  # fmt: skip
    out = worker.rhs(scara.system(), q0s, qd0s, batch)
    assert out["jvp_relative_difference"] < 1e-12 and out["vjp_relative_difference"] < 1e-12, out
    for key in ("custom_derivative", "autodiff_through_factorization"):
        assert all(math.isfinite(v) and v > 0 for v in out[key].values()), out
