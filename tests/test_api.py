"""The diffrax-shaped API of simulate: dt0, saveat, stepsize_controller, an in_axes-like batch spec,
Solution.save/load, the single-step function, parameter dtypes, and the default LDLᵀ method.

Every test integrates the planar pendulum of test_simulation (Cartesian, one rod constraint) over short spans,
so the compiled programs are shared between tests."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CompileCounter, assert_tree_allclose, central_difference
from test_simulation import PENDULUM, pendulum_params, pendulum_state

import ukjax
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.simulation import RESULTS, Solution, as_params, simulate, simulate_batch
from ukjax.stepping import State, step
from ukjax.system import System

COMPILES = CompileCounter("_simulate_one")
P = pendulum_params(c=0.3, alpha=5.0, beta=10.0)
Q0, QD0 = pendulum_state(1.0, 0.5, 0.8)
TS = jnp.array([0.0, 0.25, 0.5])


def test_dt0_is_the_step_and_dt_its_former_name():
    new = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    old = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt=0.01, ts=TS)
    explicit = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS,
                        stepsize_controller=diffrax.ConstantStepSize())
    assert_tree_allclose(new, old, rtol=0, atol=0)
    assert_tree_allclose(new.q, explicit.q, rtol=0, atol=0)
    assert int(new.num_steps) == 50 and bool(new.ok)
    with pytest.raises(ValueError, match="dt0 .*not both"):
        simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, dt=0.01)
    with pytest.raises(ValueError, match="needs the step: give dt0"):
        simulate(PENDULUM, Q0, QD0, P, t1=0.5, stepsize_controller=diffrax.ConstantStepSize())
    with pytest.raises(TypeError, match="stepsize_controller"):
        simulate(PENDULUM, Q0, QD0, P, t1=0.5, stepsize_controller="pid")


def test_saveat_with_ts_t0_t1_is_the_same_as_ts():
    sol = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01,
                   saveat=diffrax.SaveAt(t0=True, ts=jnp.array([0.25]), t1=True))
    reference = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    assert_tree_allclose(sol, reference, rtol=0, atol=0)
    first_coordinate = diffrax.SaveAt(t1=True, fn=lambda t, y, a: y[0])
    for bad in (diffrax.SaveAt(steps=True), diffrax.SaveAt(dense=True), first_coordinate):
        with pytest.raises(ValueError, match="saveat"):
            simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, saveat=bad)
    with pytest.raises(ValueError, match="ts or as saveat"):
        simulate(PENDULUM, Q0, QD0, P, t1=0.5, ts=TS, saveat=diffrax.SaveAt(t1=True))


def test_a_users_adaptive_controller_is_used_as_given():
    """A PIDController passed through takes the place of ukjax's own (rtol/atol unused): tighter tolerances
    take more steps, and both agree with a fixed 10 ms Tsit5 run to their tolerance (the pendulum: q ~ 1 m).

    The reference is the program of test_dt0_is_the_step_and_dt_its_former_name (a new step compiles a new
    one): its error is 2e-11 (measured against a 1 ms run), 50 times below the tight run's 1e-9. The two
    controllers hold their tolerances as arrays, which are traced, so they share one program (Python floats
    are static fields: one program each); the run with a first step keeps Python floats."""
    reference = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    loose, tight = (
        simulate(PENDULUM, Q0, QD0, P, t1=0.5, ts=TS, rtol=1.0, atol=1.0,
                 stepsize_controller=diffrax.PIDController(rtol=jnp.asarray(tol), atol=jnp.asarray(tol)))
        for tol in (1e-6, 1e-10)
    )
    assert int(tight.num_steps) > int(loose.num_steps) > 1
    assert_tree_allclose(loose.q, reference.q, rtol=0, atol=1e-5)
    assert_tree_allclose(tight.q, reference.q, rtol=0, atol=1e-9)
    first = simulate(PENDULUM, Q0, QD0, P, t1=0.5, ts=TS, dt0=1e-4,
                     stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-10))
    assert_tree_allclose(first.q, reference.q, rtol=0, atol=1e-9)  # dt0 is then the first step


def test_batch_params_spec_like_in_axes():
    """Only the gains batched ({"alpha": True, "beta": True}, the rest shared) gives the same solution as
    every leaf batched by hand; a wrong leading size or flag is refused naming the leaf."""
    alphas, betas = jnp.array([2.0, 5.0, 8.0]), jnp.array([4.0, 10.0, 12.0])
    q0s, qd0s = jnp.stack([1.05 * Q0] * 3), jnp.stack([QD0] * 3)  # off the rod: the gains matter
    spec = {k: k in ("alpha", "beta") for k in P}
    batch = P | {"alpha": alphas, "beta": betas}
    sol = simulate_batch(PENDULUM, q0s, qd0s, batch, batch_params=spec, t1=0.5, dt0=0.01, ts=TS)
    by_hand = simulate_batch(PENDULUM, q0s, qd0s, {k: jnp.broadcast_to(v, (3,)) for k, v in batch.items()},
                             batch_params=True, t1=0.5, dt0=0.01, ts=TS)
    assert_tree_allclose(sol, by_hand, rtol=0, atol=0)
    assert not np.allclose(sol.q[0], sol.q[1])  # the gains did reach the scenarios
    with pytest.raises(ValueError, match=r"params\['alpha'\] as batched, but its shape \(2,\)"):
        simulate_batch(PENDULUM, q0s, qd0s, batch | {"alpha": alphas[:2]}, batch_params=spec, t1=0.5,
                       dt0=0.01)
    with pytest.raises(ValueError, match="True/0 .* or False/None"):
        simulate_batch(PENDULUM, q0s, qd0s, batch, batch_params=spec | {"m": "yes"}, t1=0.5, dt0=0.01)


def test_solution_save_and_load_round_trip(tmp_path):
    # a batch of 3 with batch_params=True: the compiled program of test_batch_params_spec_like_in_axes
    params = {k: jnp.stack([v, v, v]) for k, v in P.items()}
    sol = simulate_batch(PENDULUM, jnp.stack([Q0, Q0, -Q0]), jnp.stack([QD0, QD0, QD0]), params,
                         batch_params=True, t1=0.5, dt0=0.01, ts=TS)
    path = sol.save(tmp_path / "run")
    assert path.name == "run.npz" and not list(tmp_path.glob(".*partial"))
    back = Solution.load(path)
    assert_tree_allclose(back, sol, rtol=0, atol=0)
    assert back.u is None and back.q.dtype == sol.q.dtype and back.status.dtype == sol.status.dtype
    with np.load(path) as raw:  # plain arrays, readable without ukjax
        assert raw["q"].shape == (3, 3, 2) and "constraint_force.ideal" in raw.files
    np.savez(tmp_path / "other.npz", q=np.zeros(3))
    with pytest.raises(ValueError, match="not a ukjax Solution file"):
        Solution.load(tmp_path / "other.npz")


def test_results_has_diffraxs_name_for_success():
    assert RESULTS.successful == RESULTS.success == 0


def test_step_reproduces_simulate_and_is_differentiable():
    """50 steps of ukjax.step = simulate(dt0=0.01) at t = 0.5 (round-off, 1e-13); vmap over states; the
    derivative of the state after 10 steps w.r.t. the drag c vs central differences (1e-6 relative plus
    FD round-off)."""
    one = jax.jit(step, static_argnums=0)
    state = State(Q0, QD0)
    for _ in range(50):
        state = one(PENDULUM, state, P, 0.01)
    sol = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    assert abs(float(state.t) - 0.5) < 1e-14
    assert_tree_allclose((state.q, state.qd), (sol.q[-1], sol.qd[-1]), rtol=0, atol=1e-13)
    states = State(jnp.stack([Q0, -Q0]), jnp.stack([QD0, QD0]), jnp.zeros(2))
    batch = jax.jit(jax.vmap(lambda s: step(PENDULUM, s, P, 0.01)))(states)  # one program, not op by op
    assert_tree_allclose(batch.q[0], one(PENDULUM, State(Q0, QD0), P, 0.01).q, rtol=0, atol=1e-15)

    def after_ten(c):  # a loop: one step in the compiled program, not 10 unrolled copies
        s = jax.lax.fori_loop(0, 10, lambda _, s: step(PENDULUM, s, P | {"c": c}, 0.01), State(Q0, QD0))
        return s.qd[0]

    # one program for the derivative and the values the finite difference needs
    value_and_derivative = jax.jit(jax.value_and_grad(after_ten))
    derivative = value_and_derivative(P["c"])[1]
    fd = central_difference(lambda c: value_and_derivative(c)[0], P["c"], 1.0)
    assert abs(float(derivative - fd)) <= 1e-6 * abs(float(fd)) + 2e-9  # FD round-off: eps |q̇| / h ≈ 2e-10
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        step(PENDULUM, State(jnp.zeros(3), jnp.zeros(3)), P, 0.01)


def test_weakly_typed_and_python_float_parameters_compile_once():
    """jnp.array(1.0) is weakly typed and a Python float was a static argument: both used to compile new
    programs (for a new value, or when the same value came back strongly typed after an optax update)."""
    # The program of strongly typed parameters (the one test_dt0_is_the_step_and_dt_its_former_name compiles;
    # compiled here if that test did not run) serves every other kind: none compiles a new one.
    simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    before = COMPILES.count
    params = [{k: float(v) for k, v in P.items()}, {k: jnp.array(float(v)) for k, v in P.items()},
              P, {k: float(v) * 1.01 for k, v in P.items()}]
    runs = [simulate(PENDULUM, Q0, QD0, p, t1=0.5, dt0=0.01, ts=TS) for p in params]
    assert COMPILES.count == before
    assert not np.allclose(runs[0].q, runs[3].q)
    strong = as_params({"a": 1.0, "b": jnp.array(2.0), "n": 3, "f32": jnp.ones(2, jnp.float32)})
    assert not strong["a"].weak_type and not strong["b"].weak_type and strong["n"] == 3
    assert strong["f32"].dtype == jnp.float32


def test_default_ldl_method_matches_moore_penrose_on_redundant_constraints():
    """The rod held twice (rank-deficient A, consistent b): the LDLᵀ {1,2}-inverse of A M⁻¹Aᵀ (default) and
    the pivoted-Cholesky Moore-Penrose inverse give the same motion and the same total constraint force
    (1e-10: both err like cond(G) eps; the multipliers differ, their sum Aᵀλ does not)."""
    rod = PENDULUM.constraints[0]
    twice = System(mass=PENDULUM.mass, force=PENDULUM.force, n=2, constraints=(rod, Holonomic(
        rod.phi, baumgarte=Baumgarte(gains=lambda p: (p["alpha"], p["beta"])), name="rod again")))
    fast, reference = (simulate(twice, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS, method=m)
                       for m in ("ldl", "cholesky"))
    assert bool(fast.ok) and bool(reference.ok)
    assert_tree_allclose((fast.q, fast.qd, fast.qdd), (reference.q, reference.qd, reference.qdd), rtol=0,
                         atol=1e-10)
    assert_tree_allclose(fast.constraint_force.total, reference.constraint_force.total, rtol=0, atol=1e-9)
    assert ukjax.simulation.simulate.__kwdefaults__["method"] == "ldl"


def test_singular_mass_forms_through_simulate():
    """The pendulum with a third, massless coordinate s held to s = x (M = diag(m, m, 0), rank [M; A] = 3):
    both singular-mass forms reproduce the pendulum's (x, y) (1e-9: both integrate the same motion with
    tolerance-free fixed steps; the forms' SVDs agree to ~1e-13) with s = x; the default form refuses the
    singular M before compiling, naming the way out."""
    rod = PENDULUM.constraints[0]
    follow = Holonomic(lambda q, t, p: q[2:] - q[:1], baumgarte=rod.baumgarte, name="s = x")
    extended = System(
        mass=lambda q, t, p: jnp.diag(jnp.stack([p["m"], p["m"], 0.0 * p["m"]])),
        force=lambda q, qd, t, p: jnp.concatenate([PENDULUM.force(q[:2], qd[:2], t, p), jnp.zeros(1)]),
        n=3,
        constraints=(Holonomic(lambda q, t, p: rod.phi(q[:2], t, p), baumgarte=rod.baumgarte, name="rod"),
                     follow),
    )
    q0, qd0 = jnp.concatenate([Q0, Q0[:1]]), jnp.concatenate([QD0, QD0[:1]])
    pendulum = simulate(PENDULUM, Q0, QD0, P, t1=0.5, dt0=0.01, ts=TS)
    for form in ("falco", "phohomsiri"):
        sol = simulate(extended, q0, qd0, P, t1=0.5, dt0=0.01, ts=TS, uk_solver=form)
        assert bool(sol.ok), sol.message
        assert_tree_allclose(sol.q[:, :2], pendulum.q, rtol=0, atol=1e-9)
        assert_tree_allclose(sol.q[:, 2], sol.q[:, 0], rtol=0, atol=1e-9)
        # M q̈ = Q + total constraint force, with the ideal part the pendulum's rod force
        assert_tree_allclose(sol.constraint_force.total[:, :2], pendulum.constraint_force.total, rtol=0,
                             atol=1e-7)
    with pytest.raises(ValueError, match="not positive definite.*uk_solver='falco'"):
        simulate(extended, q0, qd0, P, t1=0.5, dt0=0.01)


def test_consistent_state_can_hold_coordinates_fixed():
    """Rod of length l = 0.8 with x held at 0.3 and ẋ at 1.0: y = -√(l² - x²) (the root near the guess) and
    ẏ = -x ẋ / y, in closed form (1e-12: Gauss-Newton converges quadratically in 30 iterations)."""
    guess_q, guess_qd = jnp.array([0.3, -0.5]), jnp.array([1.0, 0.0])
    q, qd = ukjax.consistent_state(PENDULUM, guess_q, guess_qd, 0.0, P, fixed=[0])
    y = -np.sqrt(0.8**2 - 0.3**2)
    assert_tree_allclose((q, qd), (jnp.array([0.3, y]), jnp.array([1.0, -0.3 * 1.0 / y])), rtol=0, atol=1e-12)
    free_q, _ = ukjax.consistent_state(PENDULUM, guess_q, guess_qd, 0.0, P)
    assert abs(float(free_q[0]) - 0.3) > 1e-3  # without it, x moves too (minimum-norm step)
    with pytest.raises(ValueError, match="fixed indices"):
        ukjax.consistent_state(PENDULUM, guess_q, guess_qd, 0.0, P, fixed=[2])
