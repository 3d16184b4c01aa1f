"""The 3RRR mechanism as a hierarchy of modules (Orsino 2017, seed 003): module structure, levels, recursive =
one-shot = KKT, clearance covariances through System (with gradients), inverse dynamics vs a KKT solve."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference

import ukjax
from ukjax import control
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.models import three_rrr as model
from ukjax.system import Level, System, compose

PARAMS = model.default_params()
RIGID = model.system()
CLEARANCE = model.system(clearances=True)
T = jnp.asarray(0.37)


def _states(count, seed):
    """Reference states at random times, perturbed off the manifold (q by ~1e-2, random q̇): generic
    configurations near the working ones, where every Baumgarte term is active."""
    rng = np.random.default_rng(seed)
    out = []
    for t in rng.uniform(0.0, 1.0, count):
        q, qd, _ = model.reference_state(t, PARAMS)
        out.append((q + 0.01 * rng.normal(size=q.shape), qd + rng.normal(size=q.shape)))
    qs, qds = (jnp.stack(x) for x in zip(*out, strict=True))
    return qs, qds


STATES = _states(3, seed=0)


def _row_owner(system):
    """Name of the constraint owning each row of the stacked A, in constraint order (from the shapes alone:
    jax.eval_shape traces, compiles nothing)."""
    q, qd = STATES[0][0], STATES[1][0]
    A, _ = jax.eval_shape(lambda q, qd: system.constraint_equations(q, qd, T, PARAMS), q, qd)
    names = []
    for c in system.constraints:
        A_k, _ = jax.eval_shape(lambda q, qd, c=c: c.second_order(q, qd, T, PARAMS), q, qd)
        names += [c.name] * A_k.shape[0]
    assert len(names) == A.shape[0]
    return names


# ------------------------------------------------------------------ structure (seed 003 §2)
def test_hierarchy_has_three_levels_of_ten_modules():
    """Level 1: the three pivots (one per U_K); level 2: gear + elbow of each leg; level 3: the three
    platform joints. 24 coordinates, 21 rows, 3 DOF."""
    assert RIGID.n == 24 and len(model.module_slices()) == 10
    names = [level.name for level in RIGID.hierarchy]
    assert names == ["pivots", "legs", "platform joints"]
    levels = RIGID.hierarchy
    assert [c.name for c in levels[0].members] == [f"{K}.bar.pivot" for K in model.LEGS]
    assert [c.name for c in levels[1].members] == [f"{K}.{j}" for K in model.LEGS for j in ("gear", "elbow")]
    assert [c.name for c in levels[2].members] == [f"{K}-L joint" for K in model.LEGS]
    # one group per leg at levels 1-2 (each keeps its own clearance parameters), one group at level 3
    assert [len(level.groups) for level in CLEARANCE.hierarchy] == [3, 3, 1]
    q, qd = STATES[0][0], STATES[1][0]
    blocks, covariances = jax.eval_shape(  # shapes and the absent covariances: traced, nothing compiled
        lambda q, qd: RIGID.level_blocks(RIGID.constraint_blocks(q, qd, T, PARAMS), PARAMS, q.dtype), q, qd
    )
    assert [A.shape[0] for A, _ in blocks] == [6, 9, 6] and covariances == [None, None, None]
    # the three legs are one definition: same constraint functions, different parameters
    legs = [model.leg() for _ in model.LEGS]
    assert legs[0].constraints[1].phi is legs[1].constraints[1].phi is legs[2].constraints[1].phi


def test_mass_is_block_diagonal_and_constraints_touch_only_the_modules_they_join():
    """Seed 003 §2: M block diagonal by the ten modules; a row of level 1 touches one module, of level 2 the
    modules of one leg, of level 3 one bar element and the platform."""
    out = _rigid_outputs(*STATES)  # at (STATES[0][0], STATES[1][0]): the program of the KKT test below
    M, A = np.asarray(out["M"][0]), np.asarray(out["A"][0])
    slices = model.module_slices()
    owner = np.empty(24, dtype=object)
    for name, sl in slices.items():
        owner[sl] = name
    off_block = np.array([[owner[i] != owner[j] for j in range(24)] for i in range(24)])
    assert np.all(M[off_block] == 0.0) and np.all(np.diag(M) > 0)
    rows = _row_owner(RIGID)
    for row, name in zip(A, rows, strict=True):
        touched = {owner[j] for j in np.nonzero(np.abs(row) > 0)[0]}
        K = name[0]
        if name.endswith("pivot"):
            assert touched == {f"{K}.bar"}, name
        elif name.endswith("gear") or name.endswith("elbow"):
            assert touched <= {f"{K}.act", f"{K}.bar", f"{K}.elem"} and len(touched) == 2, name
        else:
            assert touched == {f"{K}.elem", "L"}, name


def test_prescribed_trajectory_is_away_from_singularities():
    """Both measures (0 at a singularity) stay large along one period; the inverse kinematics closes every
    constraint and the servo constraint exactly."""
    ts = jnp.linspace(0.0, 1.0, 41)

    @jax.jit
    def along(ts):  # one compiled call
        poses = jax.vmap(model.trajectory, in_axes=(0, None))(ts, PARAMS)
        measures = jax.vmap(model.singularity_measures, in_axes=(0, None))(poses, PARAMS)
        q, qd, _ = jax.vmap(model.reference_state, in_axes=(0, None))(ts[:5], PARAMS)
        residuals = jax.vmap(lambda q_, qd_, t_: RIGID.residuals(q_, qd_, t_, PARAMS))(q, qd, ts[:5])
        servo = jax.vmap(lambda q_, qd_, t_: model.SERVO.residuals(q_, qd_, t_, PARAMS))(q, qd, ts[:5])
        return measures, residuals, servo

    (serial, parallel), residuals, servo = along(ts)
    assert float(jnp.min(serial)) > 0.8 and float(jnp.min(parallel)) > 0.5
    assert_tree_allclose(
        (residuals, servo), jax.tree_util.tree_map(jnp.zeros_like, (residuals, servo)), atol=1e-14
    )


# ------------------------------------------------------------------ recursive = one-shot = KKT
def _kkt(M, F, A, b):
    M, F, A, b = (np.asarray(x) for x in (M, F, A, b))
    n, m = M.shape[0], A.shape[0]
    K = np.block([[M, -A.T], [A, np.zeros((m, m))]])
    x = np.linalg.solve(K, np.concatenate([F, b]))
    return x[:n], x[n:]


def _rigid_outputs_at(q, qd):
    A, b = RIGID.constraint_equations(q, qd, T, PARAMS)
    return dict(
        M=RIGID.mass_matrix(q, T, PARAMS),
        Q=RIGID.given_force(q, qd, T, PARAMS),
        A=A,
        b=b,
        uk=RIGID.acceleration(q, qd, T, PARAMS),
        recursive=RIGID.acceleration(q, qd, T, PARAMS, solver="recursive"),
        multipliers=jnp.concatenate(RIGID.multipliers(q, qd, T, PARAMS)),
    )


# State by state in one compiled loop (lax.map), not vmap: the same numbers per state, and the program
# compiles faster (first call 14.9 CPU-s against 17.1 for the vmapped form, mean of five processes each).
_rigid_outputs = jax.jit(lambda qs, qds: jax.lax.map(lambda s: _rigid_outputs_at(*s), (qs, qds)))


def test_recursive_equals_one_shot_equals_kkt_at_random_states():
    """Three Kalman updates (one per level) = one-shot UK = NumPy KKT solve, and the multipliers equal the
    KKT λ. Accelerations are O(10-100) here; round-off of a 45 x 45 solve with cond ~1e5 is ~1e-11."""
    out = _rigid_outputs(*STATES)
    for i in range(STATES[0].shape[0]):
        qdd, lam = _kkt(out["M"][i], out["Q"][i], out["A"][i], out["b"][i])
        scale = 1.0 + np.max(np.abs(qdd))
        assert_tree_allclose(out["uk"][i] / scale, qdd / scale, rtol=0, atol=1e-10)
        assert_tree_allclose(out["recursive"][i] / scale, qdd / scale, rtol=0, atol=1e-10)
        assert_tree_allclose(out["multipliers"][i], lam, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------ clearances through System
def _clearance_params(values):
    """values (9,): σ² of the pivots, elbows and platform joints of legs A, B, C."""
    return model.with_clearances(PARAMS, pivot=values[:3], elbow=values[3:6], platform=values[6:])


SIGMA2 = jnp.asarray([0.02, 0.05, 0.01, 0.03, 0.0, 0.04, 0.1, 0.06, 0.08])


def _diag_covariance(values):
    """R in constraint order (built from the constraint names, independently of the Level machinery)."""
    legs = {K: k for k, K in enumerate(model.LEGS)}
    diag = []
    for name in _row_owner(CLEARANCE):
        k = legs[name[0]]
        if name.endswith("pivot"):
            diag.append(values[k])
        elif name.endswith("elbow"):
            diag.append(values[3 + k])
        elif name.endswith("gear"):
            diag.append(0.0)
        else:
            diag.append(values[6 + k])
    return np.diag(np.asarray(diag))


@jax.jit
def _clearance_outputs(values, q, qd):
    p = _clearance_params(values)
    return dict(
        recursive=CLEARANCE.acceleration(q, qd, T, p, solver="recursive"),
        multipliers=jnp.concatenate(CLEARANCE.multipliers(q, qd, T, p)),
        force=CLEARANCE.constraint_force(q, qd, T, p, solver="recursive").total,
    )


def test_clearance_is_weighted_least_squares_through_system():
    """With R (seed 003 eq. 4.17-4.18) the recursive q̈ is a + M⁻¹Aᵀ(AM⁻¹Aᵀ + R)⁻¹(b - Aa) (NumPy), the
    multipliers satisfy A q̈ - b = -R λ, the constraint force is Aᵀλ, and R = 0 gives the rigid answer."""
    q, qd = STATES[0][1], STATES[1][1]
    rigid = _rigid_outputs(*STATES)
    M, Q, A, b = (np.asarray(rigid[k][1]) for k in ("M", "Q", "A", "b"))
    out = _clearance_outputs(SIGMA2, q, qd)
    R = _diag_covariance(np.asarray(SIGMA2))
    a = np.linalg.solve(M, Q)
    lam = np.linalg.solve(A @ np.linalg.solve(M, A.T) + R, b - A @ a)
    expected = a + np.linalg.solve(M, A.T @ lam)
    scale = 1.0 + np.max(np.abs(expected))
    assert_tree_allclose(out["recursive"] / scale, expected / scale, rtol=0, atol=1e-10)
    assert_tree_allclose(out["multipliers"], lam, rtol=1e-9, atol=1e-9)
    assert_tree_allclose(A @ np.asarray(out["recursive"]) - b, -R @ lam, rtol=0, atol=1e-8 * scale)
    assert_tree_allclose(out["force"], A.T @ lam, rtol=1e-9, atol=1e-9)
    assert not np.allclose(out["recursive"], rigid["recursive"][1], atol=1e-3)  # the clearance matters
    zero = _clearance_outputs(jnp.zeros(9), q, qd)
    assert_tree_allclose(zero["recursive"], rigid["recursive"][1], rtol=1e-10, atol=1e-10)


def test_clearance_gradient_matches_finite_differences():
    """d/dσ² of a projection of the recursive q̈ by reverse mode vs central differences (eps = 1e-6 on σ² ~
    1e-2: truncation ~1e-12 f''', round-off ~1e-16 |f| / 1e-6; tolerance 1e-6 relative)."""
    q, qd = STATES[0][2], STATES[1][2]
    w = jnp.asarray(np.random.default_rng(3).normal(size=24))

    def f(v):  # through the compiled _clearance_outputs (the same shapes as above): no program of its own
        return w @ _clearance_outputs(v, q, qd)["recursive"]

    grad = jax.jit(jax.grad(lambda v: w @ _clearance_outputs(v, q, qd)["recursive"]))(SIGMA2)
    assert float(jnp.max(jnp.abs(grad))) > 1e-3  # not trivially zero
    for k in (0, 4, 8):
        e = jnp.zeros(9).at[k].set(1.0)
        fd = central_difference(f, SIGMA2, e, eps=1e-6)
        assert abs(float(grad[k]) - float(fd)) <= 1e-6 * (1.0 + abs(float(fd))), (k, grad[k], fd)


def test_one_shot_solver_refuses_clearances():
    q, qd = STATES[0][0], STATES[1][0]
    with pytest.raises(ValueError, match="recursive"):
        CLEARANCE.acceleration(q, qd, T, PARAMS)


# ------------------------------------------------------------------ levels on a small system
def test_levels_from_compose_and_with_constraints():
    """compose stacks levels bottom up and adds connections on top; with_constraints adds one level; a
    System whose constraints are replaced keeps a consistent hierarchy."""
    body = System(mass=lambda q, t, p: jnp.eye(2), force=lambda q, qd, t, p: jnp.zeros(2), n=2)
    pin = Holonomic(lambda q, t, p: q[0] - 1.0, name="pin")
    one = body.with_constraints(pin, level="own", clearance=lambda p: p["r"])
    two = compose({"a": one, "b": body}, [Holonomic(lambda q, t, p: q[1] - q[3], name="link")], level="top")
    assert [level.name for level in two.hierarchy] == ["own", "top"]
    assert two.has_clearance and not dataclasses.replace(two, levels=None).has_clearance
    three = two.with_constraints(Holonomic(lambda q, t, p: q[2], name="extra"))
    assert [level.name for level in three.hierarchy] == ["own", "top", "level 3"]
    view = dataclasses.replace(three, constraints=three.constraints[1:])
    assert [level.name for level in view.hierarchy] == ["top", "level 3"]
    p = {"a": {"r": jnp.asarray(0.5)}, "b": {}}
    q, qd = jnp.asarray([0.0, 1.0, 2.0, 3.0]), jnp.zeros(4)
    blocks, covariances = three.level_blocks(three.constraint_blocks(q, qd, T, p), p, q.dtype)
    assert [A.shape[0] for A, _ in blocks] == [1, 1, 1]
    assert_tree_allclose(covariances[0], jnp.asarray([[0.5]]))
    assert covariances[1] is None and covariances[2] is None
    with pytest.raises(ValueError, match="at most once"):
        System(
            mass=body.mass,
            force=body.force,
            n=2,
            constraints=(pin,),
            levels=(Level(name="x", groups=((pin, pin),), clearances=(None,)),),
        )


# ------------------------------------------------------------------ inverse dynamics
def test_servo_torques_equal_kkt_inverse_dynamics_on_the_reference():
    """Servo control (Liu et al. 2015 eq. 35 with the passive constraints projected, ukjax.control) at
    reference states = the KKT inverse dynamics [Aᵀ B][λ; u] = M q̈_ref - Q with the prescribed q̈ from
    the closed-form inverse kinematics (no UK equation involved). Torques O(0.1) N m; tolerance 1e-10."""
    ts = jnp.asarray([0.0, 0.3, 0.71])

    @jax.jit
    @jax.vmap
    def both(t):
        q, qd, qdd = model.reference_state(t, PARAMS)
        servo = control.servo_control(RIGID, q, qd, t, PARAMS)
        return servo, model.inverse_dynamics(RIGID, q, qd, qdd, t, PARAMS)[0]

    servo, kkt = both(ts)
    assert float(jnp.max(jnp.abs(kkt))) > 1e-2
    assert_tree_allclose(servo, kkt, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ over a simulation (slow: 3 compiles)
@pytest.mark.slow
def test_simulations_recursive_equals_one_shot_and_closed_loop_matches_kkt():
    """Open loop under the feedforward torques: recursive and one-shot trajectories agree to 1e-10 and follow
    the prescribed platform motion; the closed-loop torques equal a KKT inverse-dynamics solve at the
    simulated states (servo constraints included)."""
    q0, qd0, _ = model.reference_state(0.0, PARAMS)
    ts = jnp.linspace(0.0, 0.5, 11)
    kw = dict(t1=0.5, ts=ts, rtol=1e-11, atol=1e-11)
    runs = {
        s: ukjax.simulate(model.open_loop(), q0, qd0, PARAMS, uk_solver=s, **kw) for s in ("uk", "recursive")
    }
    assert all(bool(r.ok) for r in runs.values())
    assert_tree_allclose(runs["recursive"].q, runs["uk"].q, rtol=0, atol=1e-10)
    pose = jax.vmap(model.platform_pose)(runs["recursive"].q)
    assert_tree_allclose(pose, jax.vmap(model.trajectory, in_axes=(0, None))(ts, PARAMS), atol=1e-9)
    sol = ukjax.simulate(RIGID, q0, qd0, PARAMS, method="svd", **kw)
    assert bool(sol.ok)
    for i in range(0, 11, 5):
        q, qd, t = sol.q[i], sol.qd[i], sol.ts[i]
        M, Q = RIGID.mass_matrix(q, t, PARAMS), RIGID.given_force(q, qd, t, PARAMS)
        A, b = RIGID.constraint_equations(q, qd, t, PARAMS)
        A_s, b_s = model.SERVO.second_order(q, qd, t, PARAMS)
        B = np.asarray(RIGID.actuation(q, t, PARAMS))
        K = np.block(
            [
                [np.asarray(M), -np.asarray(A).T, -B],
                [np.asarray(A), np.zeros((21, 24))],
                [np.asarray(A_s), np.zeros((3, 24))],
            ]
        )
        x = np.linalg.solve(K, np.concatenate([Q, b, b_s]))
        assert_tree_allclose(sol.u[i], x[-3:], rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------ through simulate, on a small hierarchy
def _two_bobs():
    """Two particles: bob a on a rod to the origin (its own level), bob b on a rod to a (level 2, clearance
    p["r"] on that rod); gravity along -y, Baumgarte α = β = 5."""
    gains = Baumgarte(lambda p: (p["alpha"], p["beta"]))
    particle = System(
        mass=lambda q, t, p: p["m"] * jnp.eye(2),
        force=lambda q, qd, t, p: jnp.stack([jnp.zeros_like(p["m"]), -9.81 * p["m"]]),
        n=2,
    )
    a = particle.with_constraints(Holonomic(lambda q, t, p: q @ q - 1.0, baumgarte=gains), level="anchor")
    rod = Holonomic(lambda q, t, p: jnp.sum((q[2:] - q[:2]) ** 2) - 0.49, baumgarte=gains, name="rod")
    return compose({"a": a, "b": particle}, [rod], level="rod", clearance=lambda p: p["r"])


BOBS = _two_bobs()
BOB_PARAMS = {
    "a": {"m": jnp.asarray(1.0), "alpha": jnp.asarray(5.0), "beta": jnp.asarray(5.0)},
    "b": {"m": jnp.asarray(0.5)},
    "r": jnp.asarray(0.0),
    "alpha": jnp.asarray(5.0),
    "beta": jnp.asarray(5.0),
}
BOB_STATE = (jnp.asarray([1.0, 0.0, 1.7, 0.0]), jnp.zeros(4))
BOB_TS = jnp.linspace(0.0, 0.6, 4)


def _bob_final(r):
    p = {**BOB_PARAMS, "r": r}
    sol = ukjax.simulate(
        BOBS, *BOB_STATE, p, t1=0.6, ts=BOB_TS, rtol=1e-11, atol=1e-11, uk_solver="recursive"
    )
    return sol.q[-1, 3], sol


def test_simulate_recursive_levels_and_clearance():
    """simulate(uk_solver="recursive") with R = 0 gives the one-shot trajectory (1e-10); R > 0 lets the rod
    stretch (violation reported in the Solution) and the Solution's constraint force is Aᵀλ of
    System.multipliers (the clearance-consistent force, not the rigid one)."""
    rigid = dataclasses.replace(BOBS, levels=None)  # same constraints, no clearance: the one-shot solver
    one_shot = ukjax.simulate(rigid, *BOB_STATE, BOB_PARAMS, t1=0.6, ts=BOB_TS, rtol=1e-11, atol=1e-11)
    _, recursive = _bob_final(jnp.asarray(0.0))
    assert bool(one_shot.ok) and bool(recursive.ok)
    assert_tree_allclose(recursive.q, one_shot.q, rtol=0, atol=1e-10)
    r = jnp.asarray(0.05)
    _, soft = _bob_final(r)
    # the compliant rod stretches by design, so the rigid constraint is reported as not held
    assert int(soft.status) == ukjax.RESULTS.constraint_violated
    assert float(soft.max_position_residual) > 1e-4 > float(recursive.max_position_residual)
    q, qd, t = soft.q[-1], soft.qd[-1], soft.ts[-1]
    lam, (A, _) = jax.jit(
        lambda q, qd, t: (
            BOBS.multipliers(q, qd, t, {**BOB_PARAMS, "r": r}),
            BOBS.constraint_equations(q, qd, t, BOB_PARAMS),
        )
    )(q, qd, t)
    assert_tree_allclose(soft.constraint_force.total[-1], A.T @ jnp.concatenate(lam), rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_simulation_gradient_with_respect_to_clearance():
    """d y_b(t1)/dR by reverse mode through the simulation vs central differences (eps 1e-5 on R = 0.05:
    truncation ~1e-10, integration error at tol 1e-11 / eps ~1e-6; tolerance 1e-4 relative)."""
    r = jnp.asarray(0.05)
    grad = jax.grad(lambda r_: _bob_final(r_)[0])(r)
    fd = (_bob_final(r + 1e-5)[0] - _bob_final(r - 1e-5)[0]) / 2e-5
    assert abs(float(grad)) > 1e-3
    assert abs(float(grad) - float(fd)) <= 1e-4 * abs(float(fd)), (grad, fd)
