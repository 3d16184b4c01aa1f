"""The fused kernel (issue 42, ``ukjax.fused``): Pallas's interpret mode runs the same kernel on the CPU, and
its trajectories equal the XLA program's (``simulate_batch``'s diffrax solve) to 1e-13 in float64; its CUDA
lowering (a Triton kernel) is built here without a GPU.

Tolerance: the kernel computes the same Runge-Kutta stages with the same right-hand side; only the order of
floating-point sums differs (the stages' weighted sums, the entrywise matrix products), a few ulp per step,
which the dynamics amplify over the steps as they amplify a one-ulp change of the initial state (issue 39:
~2e-14 relative after 100 SCARA steps). 1e-13 relative to each quantity's largest value is the issue's
bound; a wrong stage weight or a missing stage gives differences of order h^p, above 1e-8 here.
"""

import functools
import sys
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax import fused
from ukjax.constraints import AccelerationLevel
from ukjax.models import five_bar, scara, spiral

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import user_scara  # noqa: E402

DT, STEPS_PER_SAVE, SAVES, BATCH = 1e-3, 8, 3, 32  # 16 steps: short, and enough for a wrong stage to show;
# 32 scenarios: the XLA reference below the entrywise threshold (its vmap program compiles faster)


def _random_system():
    """A random 3-coordinate system: constant SPD M, linear spring-damper forces with a cos(t) drive, one
    Baumgarte-stabilized linear constraint row A q̈ = -α A q̇ - β A q (a rheonomic-free row, so A is
    constant)."""
    rng = np.random.default_rng(7)
    L = rng.normal(size=(3, 3))
    M = L @ L.T + 3 * np.eye(3)
    K, D, a = rng.uniform(1, 4, 3), rng.uniform(0.1, 0.5, 3), rng.normal(size=(1, 3))
    system = ukjax.System(
        mass=lambda q, t, p: p["M"],
        force=lambda q, qd, t, p: -p["K"] * q - p["D"] * qd + jnp.cos(t) * jnp.ones(3),
        n=3,
        constraints=(AccelerationLevel(
            A=lambda q, qd, t, p: p["a"], b=lambda q, qd, t, p: -p["a"] @ (p["alpha"] * qd + p["beta"] * q),
            name="row"),),
    )  # fmt: skip
    params = {"M": M, "K": K, "D": D, "a": a, "alpha": 2.0, "beta": 10.0}
    params = jax.tree_util.tree_map(jnp.asarray, params)
    q0, qd0 = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    return system, params, q0, qd0


@functools.cache  # one System object per case for the module: simulate_batch's programs compiled for a
def _case(name):  # case are reused by every later test that runs it with the same shapes and options
    if name == "scara":
        p = scara.default_params()
        return (scara.system(), p, *scara.initial_state(p))
    if name == "user_scara":
        p = user_scara.params()
        q0, qd0 = scara.initial_state(scara.default_params())
        return user_scara.system(), p, q0, qd0
    if name == "spiral":  # a holonomic constraint whose A and b ukjax derives by automatic differentiation
        p = spiral.default_params()
        return (spiral.system(stabilized=True), p, *spiral.initial_state(p))
    return _random_system()


# Tsit5 (6 stages) on the small systems: the interpret-mode program of a SCARA's Tsit5 step compiles for a
# minute on this CPU; RK4 on both SCARAs
CASES = [("scara", ukjax.RK4()), ("user_scara", ukjax.RK4()), ("spiral", diffrax.Tsit5()),
         ("random", diffrax.Tsit5())]  # fmt: skip


def _field(system):
    def field(t, y, p):
        q, qd = y
        return qd, system.acceleration(q, qd, t, p)

    return field


@pytest.mark.parametrize("name, solver", CASES, ids=[c[0] for c in CASES])
def test_interpret_mode_trajectories_equal_the_xla_program(name, solver):
    system, params, q0, qd0 = _case(name)
    rng = np.random.default_rng(0)
    n = q0.shape[0]
    Q0 = jnp.asarray(np.asarray(q0) + 1e-3 * rng.normal(size=(BATCH, n)))
    QD0 = jnp.asarray(np.asarray(qd0) * (1 + 1e-2 * rng.normal(size=(BATCH, n))))
    run = jax.jit(lambda y0, p: fused.integrate(
        _field(system), y0, p, False, t0=0.0, dt=DT, steps_per_save=STEPS_PER_SAVE, num_saves=SAVES,
        tableau=solver.tableau, interpret=True))  # fmt: skip
    q, qd = run((Q0, QD0), params)
    t1 = (SAVES - 1) * STEPS_PER_SAVE * DT
    ts = jnp.asarray([k * STEPS_PER_SAVE * DT for k in range(SAVES)])
    sol = ukjax.simulate_batch(system, Q0, QD0, params, t1=t1, ts=ts, dt=DT, solver=solver)
    assert q.shape == sol.q.shape == (BATCH, SAVES, n)
    np.testing.assert_array_equal(q[:, 0], Q0)  # the first save is the initial state itself
    for ours, theirs in ((q, sol.q), (qd, sol.qd)):
        scale = float(jnp.max(jnp.abs(theirs)))
        assert float(jnp.max(jnp.abs(ours - theirs))) <= 1e-13 * scale, (name, ours - theirs)
    assert float(jnp.max(jnp.abs(q[:, -1] - Q0))) > 1e-6  # the state moved: the comparison is not vacuous


def test_stages_skip_only_unused_ones():
    stages, b = fused._stages(diffrax.Tsit5.tableau)
    assert len(stages) == 6 and len(b) == 6  # the 7th (first-same-as-last) stage has weight 0: not evaluated
    stages, b = fused._stages(ukjax.RK4.tableau)
    assert [c for c, _ in stages] == [0.0, 0.5, 0.5, 1.0] and b == pytest.approx((1 / 6, 1 / 3, 1 / 3, 1 / 6))


def test_cuda_lowering_is_one_triton_kernel_per_save_interval():
    """Lowered for CUDA on this CPU machine: one Triton custom call (the fused kernel, float64), inside the
    loop over the save intervals; no loop inside the kernel's operands' producers."""
    system, params, q0, qd0 = _case("scara")
    Q0, QD0 = jnp.tile(q0, (256, 1)), jnp.tile(qd0, (256, 1))

    def run(y0, p):
        return fused.integrate(_field(system), y0, p, False, t0=0.0, dt=DT, steps_per_save=STEPS_PER_SAVE,
                               num_saves=SAVES, tableau=ukjax.RK4.tableau, interpret=False)  # fmt: skip

    text = fused.lowered_for_cuda(run, (Q0, QD0), params)
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "tensor<256xf64>" in text and "__nv_sin" in text  # float64 vectors, libdevice's float64 sine
    assert "custom_call @lapack" not in text and "cusolver" not in text


def _looped_field(t, y, p):
    """A 3-coordinate oscillator whose right-hand side holds loops with trip counts known while tracing, as
    ukjax.linalg's factorizations above its unroll limit do: M(q) factorized by the loop Cholesky (a scan
    indexing its matrices by the counter: dynamic_slice, scatter), solved by loop substitutions, and a
    fori_loop whose bounds are traced numbers (a while loop with a known trip count)."""
    from ukjax import linalg

    q, qd = y
    M = p["M"] + 0.1 * jnp.diag(jnp.sin(q) ** 2)
    L = linalg._cholesky(M, False)
    upper = jnp.int32(3)  # a traced bound: the fori_loop becomes a while loop
    damping = jax.lax.fori_loop(0, upper, lambda i, a: a + p["D"][i] * qd[i] * jnp.eye(3)[i], jnp.zeros(3))
    f = -p["K"] * q - damping + jnp.cos(t)
    return qd, linalg._substitution(L, linalg._substitution(L, f, False, False), False, True)


def test_loops_with_known_trip_counts_are_unrolled_in_the_kernel():
    """Loops whose trip count is known while tracing (scan, a while with known bounds) are unrolled entry by
    entry in the kernel, their indexing (dynamic_slice, scatter by the counter) resolved while tracing: the
    interpret-mode trajectories equal diffrax's RK4 under vmap to 1e-13 in float64 (the same operations,
    the order of the stages' weighted sums may differ: a few ulp per step, amplified by the dynamics).
    Without unrolling the same right-hand side has no entry rule (the XLA entrywise path is unchanged)."""
    system, params, q0, qd0 = _random_system()
    params = dict(params, D=params["D"])
    closed = jax.make_jaxpr(_looped_field)(0.0, (q0, qd0), params)
    assert {"scan", "while"} <= fused._entrywise.unruled_primitives(closed)
    assert fused.unruled_primitives(_looped_field, (q0, qd0), params) == set()
    rng = np.random.default_rng(3)
    Q0 = jnp.asarray(np.asarray(q0) + 1e-2 * rng.normal(size=(4, 3)))
    QD0 = jnp.tile(qd0, (4, 1))
    q, qd = fused.integrate(_looped_field, (Q0, QD0), params, False, t0=0.0, dt=DT, steps_per_save=4,
                            num_saves=3, tableau=ukjax.RK4.tableau, interpret=True)  # fmt: skip
    ts = np.asarray([k * 4 * DT for k in range(3)])

    def reference(y0):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(_looped_field), ukjax.RK4(), 0.0, ts[-1], DT, y0, args=params,
            saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.ConstantStepSize(),
        ).ys  # fmt: skip

    q_ref, qd_ref = jax.jit(jax.vmap(reference))((Q0, QD0))
    for ours, theirs in ((q, q_ref), (qd, qd_ref)):
        assert float(jnp.max(jnp.abs(ours - theirs))) <= 1e-13 * float(jnp.max(jnp.abs(theirs)))
    assert float(jnp.max(jnp.abs(q[:, -1] - Q0))) > 1e-6


def test_the_five_bar_is_refused_with_its_reason():
    """The five-bar (n = 12) factorizes M with loop-based Cholesky (ukjax.linalg unrolls n <= 8 only). Its
    loops have known trip counts and entry rules, but unrolled they make ~34,000 operations on entries, a
    program XLA:CPU did not compile in 5 minutes (fused.MAX_ENTRY_OPERATIONS): the fused engine refuses it,
    naming the loop and the size."""
    p = five_bar.default_params()
    q0, qd0 = five_bar.initial_state(p)
    assert fused._entrywise.unruled_primitives(
        jax.make_jaxpr(_field(five_bar.system()))(0.0, (q0, qd0), p), unroll_loops=True
    ) == set()  # fmt: skip
    y0 = (jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1)))
    with pytest.raises(ValueError, match=r"holds \['scan'\], whose unrolled .* on entries.*XLA engine"):
        fused.integrate(_field(five_bar.system()), y0, p, False, t0=0.0, dt=DT, steps_per_save=2, num_saves=2,
                        tableau=ukjax.RK4.tableau)  # fmt: skip


def test_a_right_hand_side_above_the_size_limit_is_refused(monkeypatch):
    """A right-hand side without loops above fused.MAX_ENTRY_OPERATIONS is refused too, with its size (the
    kernel's compile time grows with it; the Panda's, ~12,300 operations and no loop, was admitted before
    and its interpret-mode program did not compile in 9 minutes). The limit lowered to 10 here: traced
    only."""
    system, params, q0, qd0 = _case("random")
    monkeypatch.setattr(fused, "MAX_ENTRY_OPERATIONS", 10)
    why = fused.refusal(_field(system), (q0, qd0), params)
    assert "operations on entries, above the fused kernel's 10" in why, why
    assert fused.unruled_primitives(_field(system), (q0, qd0), params) == set()  # no loop to name
    Q0, QD0 = jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1))
    with pytest.raises(ValueError, match=r"cannot run this simulation: the right-hand side would hold ~\d+"):
        ukjax.simulate_batch(system, Q0, QD0, params, t1=2 * DT, ts=[2 * DT], dt=DT, solver=ukjax.RK4(),
                             engine="fused")  # fmt: skip


def test_a_data_dependent_while_loop_is_refused():
    """A while loop whose trip count depends on the state has no entry rule: refused with its name."""

    def field(t, y, p):
        q, qd = y
        trips = jax.lax.while_loop(lambda c: c[1] < q[0], lambda c: (c[0] + 1, c[1] + 1.0), (0, -2.0))[0]
        return qd, -q * trips

    y0 = (jnp.zeros((4, 2)), jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"holds \['while'\], which the fused kernel cannot"):
        fused.integrate(field, y0, {}, False, t0=0.0, dt=DT, steps_per_save=2, num_saves=2,
                        tableau=ukjax.RK4.tableau)  # fmt: skip


def test_a_right_hand_side_without_entry_rules_is_refused():
    def field(t, y, p):
        q, qd = y
        return qd, jnp.linalg.solve(p["M"], -q)  # LAPACK: no entry rule

    y0 = (jnp.zeros((4, 2)), jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="use the XLA engine"):
        fused.integrate(field, y0, {"M": jnp.eye(2)}, False, t0=0.0, dt=DT, steps_per_save=2, num_saves=2,
                        tableau=ukjax.RK4.tableau)  # fmt: skip


def test_simulate_batch_engine_fused_equals_the_xla_engine():
    """``simulate_batch(engine="fused")``: the whole Solution (states, accelerations, constraint forces,
    violations, status, step counts) as the XLA engine gives it, and says which engine ran."""
    system, params, q0, qd0 = _case("scara")
    rng = np.random.default_rng(1)
    Q0 = jnp.asarray(np.asarray(q0) + 1e-3 * rng.normal(size=(BATCH, 4)))
    QD0 = jnp.tile(qd0, (BATCH, 1))
    t1 = (SAVES - 1) * STEPS_PER_SAVE * DT
    # the options and shapes of the SCARA's interpret-mode test above: its XLA program serves here again
    kw = dict(t1=t1, ts=jnp.linspace(0.0, t1, SAVES), dt=DT, solver=ukjax.RK4())
    xla = ukjax.simulate_batch(system, Q0, QD0, params, engine="xla", **kw)
    kernel = ukjax.simulate_batch(system, Q0, QD0, params, engine="fused", **kw)
    assert (xla.engine, kernel.engine) == ("xla", "fused")
    for name in ("q", "qd", "qdd", "position_violation", "velocity_violation"):
        a, b = getattr(xla, name), getattr(kernel, name)
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-13 * float(jnp.max(jnp.abs(a))), name
    np.testing.assert_allclose(kernel.constraint_force.total, xla.constraint_force.total, rtol=0, atol=1e-9)
    for name in ("status", "num_steps", "num_accepted_steps", "num_function_evals"):
        np.testing.assert_array_equal(getattr(kernel, name), getattr(xla, name), err_msg=name)


def test_fused_engine_derivatives_are_the_xla_engines_in_both_modes():
    """Reverse mode (the default adjoint) and forward mode (``adjoint=diffrax.ForwardMode()``) through the
    fused engine give the XLA engine's derivatives: the kernel's states carry the XLA program's pullback or
    JVP. To 1e-12 relative: the same XLA program computes both, and only the loss's cotangent 2 q comes
    from each engine's own final states (which differ in the last bits)."""
    system, params, q0, qd0 = _case("random")
    Q0, QD0 = jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1))
    kw = dict(t1=4 * DT, ts=jnp.linspace(0.0, 4 * DT, 3), dt=DT, solver=ukjax.RK4())

    def loss(K, engine, adjoint=None):
        p = dict(params, K=K)
        sol = ukjax.simulate_batch(system, Q0, QD0, p, engine=engine, adjoint=adjoint, **kw)
        return jnp.sum(sol.q[:, -1] ** 2)

    forward = diffrax.ForwardMode()

    @jax.jit  # one program for the four derivatives: eager ones compile their halves apart, with glue
    def derivatives(K):
        modes = {
            "reverse": lambda engine: jax.grad(loss)(K, engine),
            "forward": lambda engine: jax.jacfwd(loss)(K, engine, forward),
        }
        return {mode: (d("fused"), d("xla")) for mode, d in modes.items()}

    for mode, (kernel, xla) in derivatives(params["K"]).items():
        np.testing.assert_allclose(kernel, xla, rtol=1e-12, atol=0, err_msg=mode)


def test_fused_engine_inside_a_users_jit():
    """Inside a user's ``jax.jit`` the engine is chosen from the same host values as outside it: save times
    and step given as numbers stay known while tracing (they were traced before, and the fused engine was
    refused with "not on the step grid" in every jitted program, the GPU suite's rows among them)."""
    system, params, q0, qd0 = _case("random")
    Q0, QD0 = jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1))
    kw = dict(t1=4 * DT, ts=[0.0, 2 * DT, 4 * DT], dt=DT, solver=ukjax.RK4())
    run = jax.jit(lambda Q0, QD0: ukjax.simulate_batch(system, Q0, QD0, params, engine="fused", **kw).q)
    xla = ukjax.simulate_batch(system, Q0, QD0, params, engine="xla", **kw).q
    assert float(jnp.max(jnp.abs(run(Q0, QD0) - xla))) <= 1e-13 * float(jnp.max(jnp.abs(xla)))


def test_saves_after_t0_run_fused():
    """Saved times on the step grid that do not start at t0 run in the kernel: ``ts=[t1]`` (the final state
    only, the commonest call of a throughput run, which took the XLA program on a GPU before) and a first
    save two steps after t0 (a lead kernel of 2 steps, then 1 step per save). States, violations and step
    counts equal the XLA engine's (the tolerance of the module docstring); the final-only run against the
    XLA run's last save (one XLA program for both)."""
    system, params, q0, qd0 = _case("random")
    Q0, QD0 = jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1))
    kw = dict(t1=4 * DT, dt=DT, solver=ukjax.RK4())
    xla = ukjax.simulate_batch(system, Q0, QD0, params, engine="xla", ts=[2 * DT, 3 * DT, 4 * DT], **kw)
    for ts, saves in (([2 * DT, 3 * DT, 4 * DT], slice(None)), ([4 * DT], slice(-1, None))):
        kernel = ukjax.simulate_batch(system, Q0, QD0, params, engine="fused", ts=ts, **kw)
        assert kernel.engine == "fused" and kernel.q.shape == (4, len(ts), 3)
        for name in ("q", "qd", "position_violation"):
            a, b = getattr(xla, name)[:, saves], getattr(kernel, name)
            assert float(jnp.max(jnp.abs(a - b))) <= 1e-13 * float(jnp.max(jnp.abs(a))), (ts, name)
        np.testing.assert_array_equal(kernel.num_steps, xla.num_steps)
        assert float(jnp.max(jnp.abs(kernel.q[:, 0] - Q0))) > 1e-9  # the first save is not the initial state


def test_engine_choice_and_refusals():
    system, params, q0, qd0 = _case("random")
    # BATCH scenarios, the default solver (Tsit5), the same span (its step count is the step budget: static)
    # and saves: the XLA program of the random case's interpret-mode test above (the same System object)
    Q0, QD0 = jnp.tile(q0, (BATCH, 1)), jnp.tile(qd0, (BATCH, 1))
    t1 = (SAVES - 1) * STEPS_PER_SAVE * DT
    # on this CPU "auto" takes the XLA program (the kernel is for GPUs; interpret mode only tests it)
    sol = ukjax.simulate_batch(system, Q0, QD0, params, t1=t1, ts=jnp.linspace(0, t1, SAVES), dt=DT)
    assert sol.engine == "xla"
    refusals = {
        "fixed step only": dict(t1=0.01),  # adaptive
        "evenly spaced on the step grid": dict(t1=4 * DT, dt=DT),  # the default saves are not on the grid
        "explicit Runge-Kutta": dict(
            t1=4 * DT, ts=jnp.linspace(0, 4 * DT, 3), dt=DT, solver=diffrax.Kvaerno5()
        ),
    }
    for reason, kw in refusals.items():
        with pytest.raises(ValueError, match=reason):
            ukjax.simulate_batch(system, Q0, QD0, params, engine="fused", **kw)
    with pytest.raises(ValueError, match="engine must be one of"):
        ukjax.simulate_batch(system, Q0, QD0, params, t1=4 * DT, dt=DT, engine="triton")


def test_saved_times_on_the_step_grid_in_float32():
    """Saved times on the step grid are recognized at the times' own precision: float32 0.025 and a step of
    0.005 are 5 steps apart to ~6e-8 only (the GPU suite's float32 fused rows were refused before), while a
    save off the grid by more than 64 ulps is still refused, in both dtypes. The grid is (steps from t0 to
    the first save, steps between saves)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    assert fused.save_grid(f32([0.0, 0.025]), f32(0.0), f32(0.005)) == (0, 5)
    assert fused.save_grid(f32([0.0, 0.025, 0.05]), f32(0.0), f32(0.005)) == (0, 5)
    assert fused.save_grid(f32([0.0, 0.0251]), f32(0.0), f32(0.005)) is None
    assert fused.save_grid(jnp.asarray([0.0, 0.025]), 0.0, 0.005) == (0, 5)
    assert fused.save_grid(jnp.asarray([0.0, 0.025 + 1e-10]), 0.0, 0.005) is None
    assert fused.save_grid([1.0], 0.0, 0.005) == (200, 0)  # the final state only
    assert fused.save_grid(f32([1.0]), f32(0.0), f32(0.005)) == (200, 0)
    assert fused.save_grid([0.5, 0.75, 1.0], 0.0, 0.005) == (100, 50)
    assert fused.save_grid([0.5, 0.75, 1.0], 0.25, 0.005) == (50, 50)
    assert fused.save_grid([0.5003], 0.0, 0.005) is None  # the first save off the grid
    assert fused.save_grid([0.5, 0.5], 0.0, 0.005) is None  # a repeated time: no interval
    assert fused.save_grid([0.5], 1.0, 0.005) is None  # before t0
