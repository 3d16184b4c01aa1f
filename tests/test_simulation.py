"""Simulation against independent references: the pendulum ODE in its angle (SciPy), energy and constraint
invariants of a closed chain, the knife edge's closed-form motion, finite differences, and per-scenario runs.

Compile budget: one pendulum system, reused in an adaptive and a fixed-step configuration; every other test
changes only numbers (parameters, t1, dt, q0), which does not recompile.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PENDULUM,
    CompileCounter,
    assert_tree_allclose,
    central_difference,
    violations_in_tolerance_units_of,
)
from scipy.integrate import solve_ivp

import ukjax
from ukjax import linalg, options, simulation, stepping
from ukjax.constraints import Baumgarte, Holonomic, Nonholonomic
from ukjax.simulation import RESULTS, SimulationError, simulate, simulate_batch
from ukjax.system import System

in_metres = lambda sol: violations_in_tolerance_units_of(sol, simulation.DEFAULT_CONSTRAINT_ATOL)

f64 = lambda x: jnp.asarray(x, dtype=jnp.float64)


# ---------------------------------------------------------------------- planar pendulum, Cartesian (x, y)


def pendulum_params(**kw):
    p = dict(m=1.3, g=9.81, l=0.8, c=0.0, alpha=0.0, beta=0.0)
    p.update(kw)
    return {k: f64(v) for k, v in p.items()}


def pendulum_state(theta, omega, l):
    q = f64([l * np.sin(theta), -l * np.cos(theta)])
    qd = f64([l * omega * np.cos(theta), l * omega * np.sin(theta)])
    return q, qd


FIXED = dict(t1=1.0, dt=0.01)  # the fixed-step configuration shared by batch, gradient and status tests


def test_pendulum_matches_angle_ode_from_scipy():
    p = pendulum_params()
    theta0, l, g = 2.5, 0.8, 9.81  # large amplitude: 143 degrees, period ≈ 3.0 s
    q0, qd0 = pendulum_state(theta0, 0.0, l)
    ts = np.linspace(0.0, 10.0, 101)  # about 3.3 periods
    sol = simulate(PENDULUM, q0, qd0, p, t1=10.0, ts=ts, rtol=1e-11, atol=1e-11)
    assert int(sol.status) == RESULTS.success
    ref = solve_ivp(
        lambda t, y: [y[1], -(g / l) * np.sin(y[0])],
        (0.0, 10.0),
        [theta0, 0.0],
        t_eval=ts,
        rtol=1e-11,
        atol=1e-12,
        method="DOP853",
    )
    xy = np.stack([l * np.sin(ref.y[0]), -l * np.cos(ref.y[0])], axis=1)
    # Integration error, not modelling error: the measured max error falls with the tolerance, 2.1e-5, 1.0e-7,
    # 7.2e-9, 4.8e-10 at rtol = atol = 1e-8, 1e-10, 1e-11, 1e-12. Bound 5e-8 at 1e-11 leaves margin for other
    # machines; a wrong q̈ (e.g. a sign in b) gives O(1) errors.
    assert_tree_allclose(sol.q, f64(xy), rtol=0.0, atol=5e-8)
    # Without Baumgarte the drift of |q|² - l² is integration error only: measured 3.0e-10.
    assert float(sol.max_position_residual) < 3e-9
    assert float(jnp.max(sol.consistency)) < 1e-10  # one full-rank constraint row: always consistent
    # The rod force is the closed-form tension m(v²/l + g cos θ) along -q/l, cos θ = -y/l (independent of UK).
    v2 = jnp.sum(sol.qd**2, axis=1)
    tension = p["m"] * (v2 / l + g * (-sol.q[:, 1] / l))
    assert_tree_allclose(sol.constraint_force.total, -tension[:, None] * sol.q / l, rtol=0.0, atol=1e-6)
    assert_tree_allclose(sol.constraint_force.nonideal, jnp.zeros_like(sol.q), atol=0.0)
    # q̈ reported at the saved times is the constrained acceleration: d/dt φ̇ = 2(q̇·q̇ + q·q̈) = 0.
    assert_tree_allclose(v2 + jnp.sum(sol.q * sol.qdd, axis=1), jnp.zeros_like(v2), atol=1e-6)
    assert int(sol.num_accepted_steps) <= int(sol.num_steps)


def test_fixed_step_counts_and_function_evaluations():
    p = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    sol = simulate(PENDULUM, q0, qd0, p, **FIXED)
    assert int(sol.status) == RESULTS.success
    assert int(sol.num_steps) == 100  # (t1 - t0) / dt
    assert int(sol.num_function_evals) == 6 * 100 + 1  # Tsit5: 7 stages, first same as last (FSAL)
    assert sol.ts.shape == (201,) and sol.q.shape == (201, 2) and sol.position_residual.shape == (201, 1)


# ---------------------------------------------------------------------- batches and transformations
def test_batch_equals_per_scenario_runs_and_jit_vmap():
    thetas = [0.3, 1.2, 2.9]
    states = [pendulum_state(th, 0.5, 0.8) for th in thetas]
    q0s = jnp.stack([s[0] for s in states])
    qd0s = jnp.stack([s[1] for s in states])
    p = pendulum_params(c=0.2, alpha=2.0, beta=3.0)
    batch = simulate_batch(PENDULUM, q0s, qd0s, p, **FIXED)
    singles = [simulate(PENDULUM, q0, qd0, p, **FIXED) for q0, qd0 in states]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *singles)
    # Same arithmetic, batched or not: agreement to round-off (vmapped LAPACK calls may reorder sums); the
    # violations are compared in metres (they are in units of the 1e-6 m tolerance).
    assert_tree_allclose(in_metres(batch), in_metres(stacked), rtol=1e-12, atol=1e-12)
    assert batch.ok.all() and batch.message == ["success"] * 3

    # jit of vmap of the public function gives the same as the batch entry point.
    jitted = jax.jit(jax.vmap(lambda q0, qd0: simulate(PENDULUM, q0, qd0, p, **FIXED)))(q0s, qd0s)
    assert_tree_allclose(in_metres(jitted), in_metres(batch), rtol=1e-12, atol=1e-12)


def test_batch_over_parameters():
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    masses, drags = [0.5, 1.0, 2.0], [0.1, 0.4, 0.9]
    params = [pendulum_params(m=m, c=c) for m, c in zip(masses, drags, strict=True)]
    batched = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    q0s, qd0s = jnp.tile(q0, (3, 1)), jnp.tile(qd0, (3, 1))
    batch = simulate_batch(PENDULUM, q0s, qd0s, batched, batch_params=True, **FIXED)
    singles = [simulate(PENDULUM, q0, qd0, pi, **FIXED) for pi in params]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *singles)
    assert_tree_allclose(in_metres(batch), in_metres(stacked), rtol=1e-12, atol=1e-12)
    # Different drag/mass ratios really give different motions (the batch is not silently sharing params).
    assert float(jnp.abs(batch.q[0, -1] - batch.q[2, -1]).max()) > 1e-3


def test_chunked_batch_equals_one_vmap_and_chunk_size_is_checked():
    """simulate_batch(chunk_size=k) integrates at most k scenarios at a time (lax.map over vmapped chunks,
    here 2 chunks of 2, the last one padded with a copy of scenario 3): every scenario's solution, status
    and step counts equal those of one vmap over the batch to round-off (1e-12: the same arithmetic per
    scenario, only the vector width differs), with per-scenario parameters. chunk_size must be 'auto',
    None or an int >= 1. (A batch of 3 and the default chunk_size, one vmap for a batch this small: the one
    vmap is the compiled program of the other batch tests; chunk_size is static, so None would be another.)"""
    thetas, masses = [0.3, 1.2, -0.7], [0.5, 1.0, 2.0]
    states = [pendulum_state(th, 0.5, 0.8) for th in thetas]
    q0s, qd0s = jnp.stack([s[0] for s in states]), jnp.stack([s[1] for s in states])
    params = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[pendulum_params(m=m) for m in masses])
    whole = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, **FIXED)
    assert len(thetas) < simulation.DEFAULT_CPU_CHUNK  # the default chunk_size: whole is one vmap
    chunked = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, chunk_size=2, **FIXED)
    assert_tree_allclose(chunked, whole, rtol=1e-12, atol=1e-12)
    assert whole.ok.all() and float(jnp.abs(whole.q[0, -1] - whole.q[2, -1]).max()) > 1e-3
    assert simulation._chunk_size("auto") == (
        simulation.DEFAULT_CPU_CHUNK if jax.default_backend() == "cpu" else None
    )
    for bad in (0, -3, 1.5, True, "all"):
        with pytest.raises(ValueError, match="chunk_size"):
            simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, chunk_size=bad, **FIXED)



def test_small_factorizations_are_loops_for_one_scenario_and_small_batches_on_the_cpu(monkeypatch):
    """What each program traces (ukjax.linalg.looped_factorizations), read inside the model's mass function
    while tracing, nothing compiled: on the CPU one scenario (simulate, step) and a vmap below the entrywise
    threshold trace their right-hand side and diagnostics with loops (faster there: the measurements are in
    the docstring of looped_factorizations); a batch evaluated entry by entry traces its right-hand side
    unrolled and its diagnostics at the saves with loops (cheaper to compile);
    where loops do not pay (a GPU: options._loops_pay), nothing is looped. The values are the same up to
    round-off (test_linalg; test_entrywise's single-against-batch check runs both forms). (simulate_batch's
    chunk size is fixed here: "auto" traces the right-hand side once more on its own, unrolled, to count its
    step's bytes, ``simulation._step_cost``, outside the program.)"""
    seen = []
    monkeypatch.setattr(simulation, "_step_cost", lambda *args: None)

    def mass(q, t, p):
        seen.append(linalg.factorizations_looped())
        return PENDULUM.mass(q, t, p)

    system = System(mass=mass, force=PENDULUM.force, n=2, constraints=PENDULUM.constraints)
    p = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    run = dict(t1=0.1, dt=0.01, solver=ukjax.RK4())

    def traced(count):
        jax.clear_caches()  # the model's functions are traced once per program, then read from JAX's caches
        seen.clear()
        if count == "step":
            jax.jit(lambda q, qd: ukjax.step(system, ukjax.State(q, qd), p, 0.01).q).trace(q0, qd0)
        elif count is None:
            jax.jit(lambda q, qd: simulate(system, q, qd, p, **run).q).trace(q0, qd0)
        else:
            Q0, QD0 = jnp.tile(q0, (count, 1)), jnp.tile(qd0, (count, 1))
            jax.jit(lambda q, qd: simulate_batch(system, q, qd, p, **run).q).trace(Q0, QD0)
        assert seen
        return set(seen)

    assert jax.default_backend() == "cpu"
    assert traced(None) == {True} and traced(4) == {True} and traced("step") == {True}
    # a batch evaluated entry by entry: its right-hand side unrolled (traced first, by the integration), its
    # UK solve and diagnostics at the saved times as loops (simulation._lockstep_finished)
    assert traced(options.ENTRYWISE_MIN_BATCH) == {False, True} and seen[0] is False and seen[-1] is True
    # an eager reverse-mode gradient of a vmap of the looped program (it failed to lower with looped
    # triangular solves) equals the jitted one
    # (5 scenarios: with 2 the lowering did not fail)
    angles = (1.0, 0.9, 0.8, 0.7, 0.6)
    q0s, qd0s = (jnp.stack(x) for x in zip(*(pendulum_state(a, 0.1, 0.8) for a in angles), strict=True))
    saves = dict(t1=0.2, dt=0.01, ts=jnp.linspace(0.0, 0.2, 5))
    finals = lambda p_: jax.vmap(lambda q, qd: simulate(PENDULUM, q, qd, p_, **saves).q[-1])(q0s, qd0s)  # noqa: E731
    loss = lambda p_: jnp.sum(finals(p_) ** 2)  # noqa: E731
    assert_tree_allclose(jax.grad(loss)(p), jax.jit(jax.grad(loss))(p), rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(simulation, "_loops_pay", lambda: False)
    monkeypatch.setattr(stepping, "_loops_pay", lambda: False)
    assert traced(None) == {False} and traced(4) == {False} and traced("step") == {False}

# ---------------------------------------------------------------------- gradients
def _final_score(p):
    """Final x plus 10 x the final |q|² - l² of an off-manifold start: depends on the mass (through the drag)
    and on both Baumgarte gains."""
    q0 = f64([0.5, -0.7])  # |q0| = 0.86 != l = 0.8: the Baumgarte terms pull the motion back to the circle
    qd0 = f64([0.3, 0.0])
    sol = simulate(PENDULUM, q0, qd0, p, **FIXED)
    return sol.q[-1, 0] + 10.0 * sol.position_residual[100, 0]


def test_grad_wrt_mass_and_baumgarte_gains_matches_finite_differences():
    p = pendulum_params(c=0.5, alpha=1.5, beta=2.0)
    grad = jax.jit(jax.grad(_final_score))(p)  # one program: an eager grad compiles its halves apart
    for name in ("m", "beta", "alpha"):
        fd = central_difference(lambda x, k=name: _final_score({**p, k: x}), p[name], f64(1.0), eps=1e-5)
        # Fixed step: AD differentiates the same discrete map that FD perturbs; central FD error is
        # O(eps²) ≈ 1e-10 plus round-off ~1e-16/1e-5 = 1e-11. Measured relative differences 4.7e-10 (m),
        # 7.7e-10 (beta), 5.3e-10 (alpha).
        assert_tree_allclose(grad[name], fd, rtol=1e-6, atol=1e-8, msg=name)
        assert abs(float(fd)) > 1e-4, name  # a real dependence, not 0 == 0


# ---------------------------------------------------------------------- status codes
def test_max_steps_reached_is_a_status_not_an_exception():
    p = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    # 101 of the 200 steps of dt = 0.005: the budget the shared fixed-step program (FIXED: 100 steps of 0.01,
    # +1) already has. max_steps is static, t1 and dt are numbers, so this reuses that compiled program.
    sol = simulate(PENDULUM, q0, qd0, p, t1=1.0, dt=0.005, max_steps=101)
    assert int(sol.status) == RESULTS.max_steps_reached
    assert "max_steps" in sol.message


def test_nonfinite_parameters_and_blow_up_give_status():
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    # NaN mass: refused on the host, naming the leaf; traced (inside the user's jit) it is a status, and the
    # scenario integrates nothing (adaptive stepping would otherwise reject max_steps steps of NaN).
    with pytest.raises(ValueError, match=r"params\['m'\]"):
        simulate(PENDULUM, q0, qd0, pendulum_params(m=np.nan), t1=1.0)
    sol = jax.jit(lambda p: simulate(PENDULUM, q0, qd0, p, t1=1.0))(pendulum_params(m=np.nan))
    assert int(sol.status) == RESULTS.nonfinite_state
    assert int(sol.num_steps) < 100
    # A fixed step far beyond the stability limit of stiff Baumgarte gains diverges to inf/NaN (β dt = 1e3;
    # the shared fixed-step program, FIXED).
    sol = simulate(PENDULUM, q0 * 1.1, qd0, pendulum_params(alpha=0.0, beta=1e5), **FIXED)
    assert int(sol.status) == RESULTS.nonfinite_state
    # In a batch, the failing scenario does not stop the good one.
    params = jax.tree_util.tree_map(
        lambda *xs: jnp.stack(xs), pendulum_params(), pendulum_params(m=np.nan), pendulum_params(g=-1.0)
    )
    # a batch of 3 reuses the compiled program of the batch tests
    q0s, qd0s = jnp.stack([q0, q0, q0]), jnp.stack([qd0, qd0, qd0])
    with pytest.warns(UserWarning, match=r"params\['m'\] is NaN or infinite in scenarios \[1\]"):
        batch = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, **FIXED)
    assert [int(s) for s in batch.status] == [RESULTS.success, RESULTS.nonfinite_state, RESULTS.success]
    assert bool(jnp.all(jnp.isfinite(batch.q[0]))) and bool(jnp.all(jnp.isfinite(batch.q[2])))


def test_a_fixed_step_batch_is_one_solve_in_which_a_diverging_scenario_stays_its_own():
    """A fixed-step batch is integrated as one solve of the whole batch (``simulation._solve_lockstep``): no
    scenario stops the others. Scenario 1 diverges (β dt = 1e3 beyond the stability limit, as above) while
    0 and 2 run normally: these equal their own runs to round-off (1e-12, as the batch tests), scenario 1 has
    the status of its own run, its saved states (q, q̇) are finite exactly where its own run's are and equal
    there, and from its first non-finite save on they are inf (its own run, ended by the non-finite event,
    holds NaN interpolated within its last step, then the inf diffrax fills after the event). Its step
    count is the batch's (100); its own run stopped at the event."""
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    params = [pendulum_params(c=0.1), pendulum_params(alpha=0.0, beta=1e5), pendulum_params(m=2.0, c=0.3)]
    q0s = jnp.stack([q0, 1.1 * q0, q0])
    batched = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    batch = simulate_batch(PENDULUM, q0s, jnp.stack([qd0] * 3), batched, batch_params=True, **FIXED)
    singles = [simulate(PENDULUM, q0s[k], qd0, params[k], **FIXED) for k in range(3)]
    assert [int(s) for s in batch.status] == [int(s.status) for s in singles]
    assert [int(s) for s in batch.status] == [RESULTS.success, RESULTS.nonfinite_state, RESULTS.success]
    for k in (0, 2):
        assert_tree_allclose(batch.q[k], singles[k].q, rtol=1e-12, atol=1e-12)
        assert_tree_allclose(batch.qd[k], singles[k].qd, rtol=1e-12, atol=1e-12)
    state_finite = lambda sol: np.isfinite(np.concatenate([sol.q, sol.qd], axis=-1)).all(axis=-1)
    finite = state_finite(jax.tree_util.tree_map(lambda x: x[1], batch))
    assert np.array_equal(finite, state_finite(singles[1]))
    first = int(np.argmin(finite))
    assert 0 < first < len(finite) and np.all(np.isinf(np.asarray(batch.q[1, first:])))
    np.testing.assert_allclose(batch.q[1, :first], singles[1].q[:first], rtol=1e-12, atol=1e-12)
    assert [int(n) for n in batch.num_steps] == [100] * 3 and int(singles[1].num_steps) < 100


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_a_fixed_step_batch_in_two_programs_is_simulate_batch(chunk_size):
    """``simulation._fixed_step_stage`` (what ``ukjax demo`` compiles as two programs, side by side): the
    integration in one program, the UK solve and diagnostics at the saves in a second, gives bit for bit
    what ``simulate_batch`` gives inside a ``jit`` (the same batch, unpadded): the same operations on the
    same values. A diverging scenario's inf saves and diffrax's result cross between the programs. Whole
    and in chunks of 2 (3 scenarios: one padded)."""
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    params = [pendulum_params(c=0.1), pendulum_params(alpha=0.0, beta=1e5), pendulum_params(m=2.0, c=0.3)]
    q0s, qd0s = jnp.stack([q0, 1.1 * q0, q0]), jnp.stack([qd0] * 3)
    batched = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    options = dict(FIXED, batch_params=True, chunk_size=chunk_size)
    stage = simulation._fixed_step_stage
    integrate = jax.jit(lambda q, qd, p: stage(PENDULUM, q, qd, p, **options))
    finish = jax.jit(lambda q, qd, p, states: stage(PENDULUM, q, qd, p, states, **options))
    states = integrate(q0s, qd0s, batched)
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(states))  # a program's output
    staged = finish(q0s, qd0s, batched, states)
    whole = jax.jit(lambda q, qd, p: simulate_batch(PENDULUM, q, qd, p, **options))(q0s, qd0s, batched)
    assert [int(s) for s in staged.status] == [RESULTS.success, RESULTS.nonfinite_state, RESULTS.success]
    assert staged.num_steps.tolist() == [100] * 3
    leaves = jax.tree_util.tree_leaves
    for got, expected in zip(leaves(staged), leaves(whole), strict=True):
        assert np.array_equal(got, expected, equal_nan=True)
    with pytest.raises(ValueError, match="inside jax.jit"):
        stage(PENDULUM, q0s, qd0s, batched, **options)
    with pytest.raises(ValueError, match="fixed step"):
        jax.jit(lambda q: stage(PENDULUM, q, qd0s, batched, batch_params=True, t1=1.0))(q0s)


def test_nonfinite_force_during_an_adaptive_run_collapses_the_step():
    # Q = sqrt(0.5 - t) is NaN after t = 0.5: the controller rejects NaN steps until dt < 1e-12 (t1 - t0) and
    # stops (measured 109 steps) instead of spending max_steps on rejected steps.
    compiles = CompileCounter("_simulate_one")

    def force(q, qd, t, p):
        return jnp.sqrt(0.5 - t) * jnp.ones(1)

    system = System(mass=lambda q, t, p: jnp.eye(1), force=force, n=1)
    sol = simulate(system, jnp.zeros(1), jnp.zeros(1), {}, t1=1.0)
    assert int(sol.status) == RESULTS.step_size_collapse
    assert int(sol.num_steps) < 1000
    # Before t = 0.5 the motion is right: q̇ = (2/3)(0.5^{3/2} - (0.5 - t)^{3/2}) (closed form).
    t = sol.ts[:50]
    assert_tree_allclose(sol.qd[:50, 0], (2.0 / 3.0) * (0.5**1.5 - (0.5 - t) ** 1.5), rtol=0.0, atol=1e-7)
    # New numbers (t1, q0, tolerances) reuse the compiled program: no new compile. Stopping at t1 = 0.4,
    # before the singularity, succeeds. throw=True is a different program (it holds the runtime check).
    count = compiles.count
    assert count >= 1
    sol = simulate(system, f64([1.0]), jnp.zeros(1), {}, t1=0.4, rtol=1e-6, atol=1e-6)
    assert int(sol.status) == RESULTS.success and compiles.count == count
    sol = simulate(system, f64([1.0]), jnp.zeros(1), {}, t1=0.4, throw=True)
    assert int(sol.status) == RESULTS.success and compiles.count == count + 1


def test_inconsistent_constraints_status_and_throw():
    # x = 0 and x = 1 as two stabilized rows: A = [[1, 0], [1, 0]], b = -β²(x, x - 1) is not in range(A).
    gains = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
    system = System(
        mass=lambda q, t, p: jnp.eye(2),
        force=lambda q, qd, t, p: jnp.zeros(2),
        n=2,
        constraints=(
            Holonomic(lambda q, t, p: q[:1], baumgarte=gains, name="x=0"),
            Holonomic(lambda q, t, p: q[:1] - 1.0, baumgarte=gains, name="x=1"),
        ),
    )
    p = {"alpha": f64(1.0), "beta": f64(1.0)}
    sol = simulate(system, jnp.zeros(2), jnp.zeros(2), p, t1=0.1, dt=0.01, method="cholesky")
    assert int(sol.status) == RESULTS.inconsistent_constraints
    # Moore-Penrose (least-squares) q̈: ‖AA⁺b - b‖ at x = 0, b = (0, β²) projected off span(1, 1): β²/√2.
    assert abs(float(sol.consistency[0]) - 1.0 / np.sqrt(2.0)) < 1e-12
    # The default LDLᵀ inverse satisfies the rows it keeps (row 1: x = 0) and leaves the residual of the other
    # (β² = 1), which is more than the least-squares distance: the status is the same.
    fast = simulate(system, jnp.zeros(2), jnp.zeros(2), p, t1=0.1, dt=0.01)
    assert int(fast.status) == RESULTS.inconsistent_constraints
    assert abs(float(fast.consistency[0]) - 1.0) < 1e-12
    with pytest.raises(SimulationError, match="inconsistent"):
        simulate(system, jnp.zeros(2), jnp.zeros(2), p, t1=0.1, dt=0.01, throw=True)


# ---------------------------------------------------------------------- bad input
def test_bad_input_raises_value_error_before_integration():
    p = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    with pytest.raises(ValueError, match=r"q0 and qd0 must both have shape \(n,\) with n = 2"):
        simulate(PENDULUM, jnp.zeros(3), jnp.zeros(3), p, t1=1.0)
    with pytest.raises(ValueError, match="q0 has a NaN or infinite entry"):
        simulate(PENDULUM, q0.at[0].set(jnp.nan), qd0, p, t1=1.0)
    with pytest.raises(ValueError, match="t1 must be larger than t0"):
        simulate(PENDULUM, q0, qd0, p, t0=1.0, t1=1.0)
    with pytest.raises(ValueError, match=r"ts must lie in \[t0, t1\]"):
        simulate(PENDULUM, q0, qd0, p, t1=1.0, ts=jnp.array([0.0, 1.5]))
    with pytest.raises(ValueError, match=r"\(batch, n\)"):
        simulate_batch(PENDULUM, q0, qd0, p, t1=1.0)
    with pytest.raises(ValueError, match="batch size 2"):
        simulate_batch(PENDULUM, jnp.stack([q0, q0]), jnp.stack([qd0, qd0]), p, batch_params=True, t1=1.0)
    bad = System(
        mass=lambda q, t, p: jnp.eye(2),
        force=lambda q, qd, t, p: jnp.zeros(2),
        n=2,
        constraints=(Holonomic(lambda q, t, p: jnp.outer(q, q), name="matrix"),),
    )
    with pytest.raises(ValueError, match="must return a vector"):
        simulate(bad, q0, qd0, {}, t1=1.0)


# ---------------------------------------------------------------------- closed chain: double pendulum
def _double_kinetic(q, qd, t, p):
    return 0.5 * p["m1"] * (qd[0] ** 2 + qd[1] ** 2) + 0.5 * p["m2"] * (qd[2] ** 2 + qd[3] ** 2)


def _double_potential(q, t, p):
    return p["g"] * (p["m1"] * q[1] + p["m2"] * q[3])


_LINK_GAINS = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
DOUBLE = System.from_lagrangian(
    _double_kinetic,
    _double_potential,
    4,
    constraints=(
        Holonomic(lambda q, t, p: jnp.stack([q[0] ** 2 + q[1] ** 2 - p["l1"] ** 2]), _LINK_GAINS, "link1"),
        Holonomic(
            lambda q, t, p: jnp.stack([(q[2] - q[0]) ** 2 + (q[3] - q[1]) ** 2 - p["l2"] ** 2]),
            _LINK_GAINS,
            "link2",
        ),
    ),
)


@jax.jit
def _double_drift_and_power(q, qd, force, p):
    """Max energy drift and max |Q^c · q̇| of a double-pendulum run, in one compiled program (op by op, JAX
    compiles one small program per primitive)."""
    energy = jax.vmap(lambda q_, qd_: DOUBLE.energy(q_, qd_, 0.0, p))(q, qd)
    power = jnp.sum(force * qd, axis=1)
    return jnp.max(jnp.abs(energy - energy[0])), jnp.max(jnp.abs(power))


@pytest.mark.parametrize(
    "gains, max_drift, max_residual, max_velocity_residual",
    [
        # Measured (Tsit5, rtol = atol = 1e-9, 10 s, chaotic regime, 1535 steps): energy drift 4.4e-6,
        # |φ| 2.4e-7, |φ̇| 9.9e-8. Bounds about 10x the measurement.
        ((0.0, 0.0), 5e-5, 3e-6, 1e-6),
        # Baumgarte α = β = 10 (quadratic form, 1833 steps): measured drift 4.2e-7, |φ| 5.2e-10, |φ̇| 3.2e-8:
        # the stabilization keeps the motion on the constraint manifold (|φ| 450x smaller), and with it the
        # energy (10x smaller drift).
        ((10.0, 10.0), 5e-6, 5e-9, 3e-7),
    ],
)
def test_double_pendulum_energy_and_constraints_over_10_seconds(
    gains, max_drift, max_residual, max_velocity_residual
):
    p = {k: f64(v) for k, v in dict(m1=1.0, m2=0.7, l1=1.0, l2=0.8, g=9.81).items()}
    p["alpha"], p["beta"] = f64(gains[0]), f64(gains[1])
    th1, th2 = 2.0, 2.6  # high start: chaotic motion
    x1, y1 = np.sin(th1), -np.cos(th1)
    q0 = f64([x1, y1, x1 + 0.8 * np.sin(th2), y1 - 0.8 * np.cos(th2)])
    qd0 = jnp.zeros(4)
    sol = simulate(DOUBLE, q0, qd0, p, t1=10.0, rtol=1e-9, atol=1e-9)
    assert int(sol.status) == RESULTS.success
    drift, power = map(float, _double_drift_and_power(sol.q, sol.qd, sol.constraint_force.total, p))
    assert drift < max_drift, drift
    assert float(sol.max_position_residual) < max_residual
    assert float(sol.max_velocity_residual) < max_velocity_residual
    # The constraint forces do no work: Q^c · q̇ = Aᵀλ · q̇ = λ · φ̇ ≈ 0 (ideal constraints, seed 000 eq. 11);
    # measured max |Q^c · q̇| 8.6e-6 and 4.3e-6 (forces of order 100 N times |φ̇| ~ 1e-7).
    assert power < 1e-4


# ---------------------------------------------------------------------- nonholonomic: knife edge
KNIFE = System(
    mass=lambda q, t, p: jnp.diag(jnp.stack([p["m"], p["m"], p["I"]])),
    force=lambda q, qd, t, p: jnp.zeros(3),
    n=3,
    constraints=(
        Nonholonomic(lambda q, qd, t, p: -qd[0] * jnp.sin(q[2]) + qd[1] * jnp.cos(q[2]), name="no side slip"),
    ),
)


def test_knife_edge_follows_its_closed_form_circle():
    p = {"m": f64(2.0), "I": f64(0.3)}
    v, omega, theta0 = 1.5, 0.7, 0.4
    q0 = f64([0.1, -0.2, theta0])
    qd0 = f64([v * np.cos(theta0), v * np.sin(theta0), omega])
    ts = np.linspace(0.0, 12.0, 61)
    sol = simulate(KNIFE, q0, qd0, p, t1=12.0, ts=ts, rtol=1e-10, atol=1e-10)
    assert int(sol.status) == RESULTS.success
    # No forces: θ̇ = ω, speed v along the heading, so the contact point runs on a circle of radius v/ω.
    theta = theta0 + omega * ts
    exact = np.stack(
        [
            0.1 + v / omega * (np.sin(theta) - np.sin(theta0)),
            -0.2 - v / omega * (np.cos(theta) - np.cos(theta0)),
            theta,
        ],
        axis=1,
    )
    # rtol = atol = 1e-10 over 12 s (about 1.3 turns, 191 steps); measured max error 1.3e-10. Bound 1e-8.
    assert_tree_allclose(sol.q, f64(exact), rtol=0.0, atol=1e-8)
    assert float(sol.max_velocity_residual) < 1e-9  # ψ, measured 4.2e-11
    kinetic = 0.5 * p["m"] * (sol.qd[:, 0] ** 2 + sol.qd[:, 1] ** 2) + 0.5 * p["I"] * sol.qd[:, 2] ** 2
    assert (
        float(jnp.max(jnp.abs(kinetic - kinetic[0]))) < 1e-8
    )  # kinetic energy 2.6 J, measured drift 3.3e-10
    assert sol.position_residual.shape == (61, 0)


# ---------------------------------------------------------------------- servo control hook
# A mass on a table (passive constraint y = 0 carries its weight), a spring -k x and an actuator b u along x
# with the servo constraint x = r (seed 000 §III), Baumgarte α = β: the controlled error φ = x - r obeys
# φ̈ + 2βφ̇ + β²φ = 0, so φ(t) = (φ0 + (φ̇0 + βφ0) t) e^{-βt}, u = (m ẍ + k x) / b and the table pushes (0, m g).
SERVO_TABLE = System(
    mass=lambda q, t, p: p["m"] * jnp.eye(2, dtype=q.dtype),
    force=lambda q, qd, t, p: jnp.stack([-p["k"] * q[0], -p["m"] * p["g"]]),
    n=2,
    constraints=(Holonomic(lambda q, t, p: q[1:], name="table"),),
    actuation=lambda q, t, p: jnp.stack([p["b"], jnp.zeros_like(p["b"])])[:, None],
    servo_constraints=(
        Holonomic(
            lambda q, t, p: q[:1] - p["r"], baumgarte=Baumgarte(gains=lambda p: (p["beta"], p["beta"]))
        ),
    ),
)


def test_controlled_system_records_u_and_servo_residual_and_infeasibility():
    p = {k: f64(v) for k, v in dict(m=2.0, k=5.0, g=9.81, b=1.5, r=0.3, beta=4.0).items()}
    q0, qd0 = f64([0.0, 0.0]), f64([0.5, 0.0])
    sol = simulate(SERVO_TABLE, q0, qd0, p, t1=2.0, dt=0.005)
    assert int(sol.status) == RESULTS.success
    t, phi0, phi_dot0, beta = sol.ts, -0.3, 0.5, 4.0
    phi = (phi0 + (phi_dot0 + beta * phi0) * t) * jnp.exp(-beta * t)
    # Tsit5 at dt = 0.005 on a decay rate β = 4: global error ~ (β dt)^5 ~ 1e-11; bound 1e-8.
    assert_tree_allclose(sol.servo_residual[:, 0], phi, rtol=0.0, atol=1e-8)
    u = (p["m"] * sol.qdd[:, 0] + p["k"] * sol.q[:, 0]) / p["b"]
    assert_tree_allclose(sol.u[:, 0], u, rtol=1e-12, atol=1e-10)
    table = jnp.zeros_like(sol.q).at[:, 1].set(p["m"] * p["g"])
    assert_tree_allclose(sol.constraint_force.total, table, rtol=1e-12, atol=1e-10)
    assert float(sol.max_position_residual) < 1e-12  # the table constraint is never violated
    # An actuator with zero gain cannot move the mass: (C B̄) u = b̄ has no solution.
    sol = simulate(SERVO_TABLE, q0, qd0, {**p, "b": f64(0.0)}, t1=2.0, dt=0.005)
    assert int(sol.status) == RESULTS.control_infeasible


# ---------------------------------------------------------------------- progress meter
@pytest.mark.slow  # one extra compile: the progress meter is part of the compiled program
def test_progress_meter_runs_for_a_batch(capsys):
    p = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    batch = simulate_batch(
        PENDULUM, jnp.stack([q0, q0, q0]), jnp.stack([qd0, qd0, qd0]), p, progress=True, **FIXED
    )
    jax.block_until_ready(batch.q)
    assert batch.ok.all()
    assert "100.00%" in capsys.readouterr().err


def test_float32_state_is_integrated_in_float32():
    # A float32 run stays float32 end to end (times, tolerances and state), and its error against the
    # float64 run is float32 round-off accumulated over 100 steps: measured ~1e-6; bound 1e-4 (a float64
    # leak would give 0, a wrong dtype path an exception under strict promotion).
    p64 = pendulum_params()
    q0, qd0 = pendulum_state(1.0, 0.0, 0.8)
    ref = simulate(PENDULUM, q0, qd0, p64, **FIXED)
    p32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), p64)
    sol = simulate(PENDULUM, q0.astype(jnp.float32), qd0.astype(jnp.float32), p32, **FIXED)
    assert sol.q.dtype == jnp.float32 and sol.ts.dtype == jnp.float32
    assert int(sol.status) == RESULTS.success
    assert float(jnp.max(jnp.abs(sol.q.astype(jnp.float64) - ref.q))) < 1e-4
