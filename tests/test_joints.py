"""Ball and free joints: configurations with more numbers than velocities (nq ≠ nv).

What is checked, and against what (nothing shares code with ukjax.multibody's recursions):

* MuJoCo (``tests/data/free_ball_hinge.xml``, a free body carrying a ball-jointed pendulum carrying a hinged
  link; only with mujoco installed): M (``mj_fullM``), the bias force (``qfrc_bias``), the forward dynamics
  (``qacc`` of ``mj_forward``) and the body positions at random states, to 1e-10 relative: both are float64
  evaluations of the same O(1) quantities, agreeing to ~1e-15 (observed), so 1e-10 only allows for
  conditioning.
* Invariants of simulations: a torque-free asymmetric rigid body (free joint, no gravity, spinning near its
  unstable middle axis) keeps |quat| = 1 to 1e-12 (the projection after each step), its energy and world
  angular momentum to 1e-8 relative (adaptive Tsit5 at rtol = atol = 1e-10 over 10 s: ~4e-10 observed) and
  moves its centre at constant velocity; a spherical pendulum (ball joint, gravity) keeps its energy and
  its vertical angular momentum about the pivot.
* A holonomic constraint on a ball-jointed body against a KKT solve with a closed-form A = -nᵀR[c]× and
  b = -nᵀR(ω × (ω × c)) (the second derivative of n·R c with Ṙ = R[ω]×), to 1e-10.
* simulate_batch (vmap) against simulate, and a gradient through a free-body simulation against central
  differences.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference

import ukjax
from ukjax import multibody

DATA = Path(__file__).parent / "data"
RNG = np.random.default_rng(27)


def _quaternion_rotation(q):
    """R of a quaternion (w, x, y, z), written out in numpy (independent of ukjax's)."""
    w, x, y, z = np.asarray(q) / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


def _skew(c):
    return np.array([[0.0, -c[2], c[1]], [c[2], 0.0, -c[0]], [-c[1], c[0], 0.0]])


# ---------------------------------------------------------------------- models
FREE = multibody.Tree.chain([multibody.free()])
BALL = multibody.Tree.chain([multibody.ball()])
COM = np.array([0.05, -0.03, -0.5])  # the pendulum's centre of mass, body frame (pivot at the origin)
TIP = np.array([0.1, 0.05, -0.6])  # a point of the pendulum


def free_bodies(p):
    return multibody.Bodies(
        offset=jnp.zeros((1, 3)), mass=p["m"][None], com=jnp.zeros((1, 3)), inertia=jnp.diag(p["I"])[None]
    )


def ball_bodies(p):
    inertia = jnp.array([[0.03, 0.002, -0.001], [0.002, 0.025, 0.003], [-0.001, 0.003, 0.01]])
    return multibody.Bodies(
        offset=jnp.zeros((1, 3)), mass=p["m"][None], com=jnp.asarray(COM)[None], inertia=inertia[None]
    )


FREE_PARAMS = {"m": jnp.asarray(2.0), "I": jnp.array([0.1, 0.2, 0.3])}
BALL_PARAMS = {"m": jnp.asarray(1.5), "g": jnp.array([0.0, 0.0, -9.81])}
FREE_SYSTEM = FREE.system(free_bodies, gravity=lambda p: jnp.zeros(3))
BALL_SYSTEM = BALL.system(ball_bodies, gravity=lambda p: p["g"])
# (1, 0, 1)/√2 · (tip) = d: the tip held on a plane; d is its value at the test state
NORMAL = np.array([1.0, 0.0, 1.0]) / np.sqrt(2.0)


def tip_on_plane(baumgarte=None):
    return ukjax.Holonomic(
        phi=lambda q, t, p: jnp.dot(jnp.asarray(NORMAL), BALL.point(q, ball_bodies(p), 0, TIP)) - p["d"],
        baumgarte=baumgarte,
        name="tip on plane",
    )


def random_configuration(tree):
    return tree.retract(tree.neutral(jnp.float64), jnp.asarray(RNG.normal(size=tree.nv)))


# ---------------------------------------------------------------------- sizes, chart
def test_sizes_chart_and_configuration_rate():
    tree = multibody.Tree(
        parents=(-1, 0, 0), joints=(multibody.free(), multibody.ball(), multibody.revolute((0.0, 1.0, 0.0)))
    )
    assert (tree.nq, tree.nv, tree.n, tree.num_bodies) == (12, 10, 10, 3)
    np.testing.assert_array_equal(tree.neutral(), [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0])
    q, v = random_configuration(tree), jnp.asarray(RNG.normal(size=10))
    np.testing.assert_array_equal(tree.retract(q, jnp.zeros(10)), q)  # q ⊕ 0 = q exactly
    rate = np.asarray(tree.configuration_rate(q, v))
    # closed forms: ṗ = v_lin, quat' = ½ quat ⊗ (0, ω), angle' = v
    half_product = lambda quat, w: 0.5 * np.asarray(
        multibody.quaternion_multiply(quat, jnp.concatenate([jnp.zeros(1), w]))
    )
    np.testing.assert_allclose(rate[:3], v[:3], rtol=1e-15)
    np.testing.assert_allclose(rate[3:7], half_product(q[3:7], v[3:6]), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(rate[7:11], half_product(q[7:11], v[6:9]), rtol=1e-14, atol=1e-15)
    assert rate[11] == v[9]
    # the exponential of a rotation vector is the rotation about it (Rodrigues), also below the series cut
    for angle in (0.7, 3e-3):
        axis = np.array([0.36, 0.48, 0.8])
        R = _quaternion_rotation(np.asarray(multibody.quaternion_exp(jnp.asarray(angle * axis))))
        rodrigues = np.eye(3) + np.sin(angle) * _skew(axis) + (1 - np.cos(angle)) * _skew(axis) @ _skew(axis)
        np.testing.assert_allclose(R, rodrigues, atol=1e-15)
    # normalize divides quaternions only; the dynamics see q/|q| (drift does not change them)
    drifted = q.at[3:7].multiply(1.3).at[7:11].multiply(0.8)
    np.testing.assert_allclose(tree.normalize(drifted), q, rtol=1e-15, atol=1e-15)
    bodies = multibody.Bodies(
        offset=jnp.asarray(RNG.normal(size=(3, 3))), mass=jnp.array([1.0, 2.0, 0.5]),
        com=jnp.asarray(RNG.normal(size=(3, 3)) * 0.1), inertia=jnp.stack([0.1 * jnp.eye(3)] * 3),
    )  # fmt: skip
    M = tree.mass_matrix(q, bodies)
    np.testing.assert_allclose(tree.mass_matrix(drifted, bodies), M, atol=1e-14)
    # plain, jit and vmap agree (vmap under jit, the same batching rules: op by op, vmap compiled a program
    # per batched primitive, 1.6 against 0.2 CPU-s)
    np.testing.assert_allclose(jax.jit(tree.mass_matrix)(q, bodies), M, rtol=1e-14, atol=1e-15)
    rates = jax.jit(jax.vmap(tree.configuration_rate))(jnp.stack([q, drifted]), jnp.stack([v, v]))
    np.testing.assert_allclose(rates[0], rate, rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError, match="has no axis"):
        multibody.Joint("ball", (0.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="depends on its orientation"):
        _ = multibody.free().subspace
    with pytest.raises(ValueError, match="nq = 12"):
        tree.mass_matrix(jnp.zeros(10), bodies)


def test_matches_mujoco():
    mujoco = pytest.importorskip("mujoco")
    model = mujoco.MjModel.from_xml_path(str(DATA / "free_ball_hinge.xml"))
    data = mujoco.MjData(model)

    def full(ixx, iyy, izz, ixy, ixz, iyz):  # MJCF fullinertia order
        return np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])

    tree = multibody.Tree(
        parents=(-1, 0, 1), joints=(multibody.free(), multibody.ball(), multibody.revolute((0.6, 0.0, 0.8)))
    )
    body_quat = np.array([0.9238795325112867, 0.0, 0.3826834323650898, 0.0])  # the pendulum's <body quat>
    bodies = multibody.Bodies(
        offset=jnp.array([[0.0, 0.0, 0.0], [0.2, 0.1, -0.15], [0.0, 0.0, -0.5]]),
        mass=jnp.array([2.0, 0.8, 0.5]),
        com=jnp.array([[0.05, -0.02, 0.03], [0.0, 0.01, -0.25], [0.1, 0.0, -0.05]]),
        inertia=jnp.asarray(np.stack([
            full(0.09, 0.07, 0.05, 0.01, -0.005, 0.004),
            full(0.02, 0.025, 0.012, 0.002, 0.001, -0.003),
            full(0.004, 0.006, 0.005, 0.0005, 0.0, 0.001),
        ])),
        rotation=jnp.asarray(np.stack([np.eye(3), _quaternion_rotation(body_quat).T, np.eye(3)])),
    )  # fmt: skip
    gravity = jnp.asarray(model.opt.gravity)
    assert (model.nq, model.nv) == (tree.nq, tree.nv)
    relative = lambda a, b: np.max(np.abs(a - b)) / np.max(np.abs(b))

    @jax.jit
    def everything(q, v, bodies, gravity):  # one compiled call per state
        return (
            tree.mass_matrix(q, bodies),
            tree.bias_force(q, v, bodies, gravity),
            tree.forward_dynamics(q, v, jnp.zeros(tree.nv), bodies, gravity),
            tree.frames(q, bodies),
        )

    for _ in range(3):
        q, v = random_configuration(tree), RNG.normal(size=tree.nv)
        data.qpos[:], data.qvel[:] = np.asarray(q), v
        mujoco.mj_forward(model, data)
        M = np.zeros((model.nv, model.nv))
        mujoco.mj_fullM(model, data, M)
        ours, bias, qdd, (R, p) = everything(q, jnp.asarray(v), bodies, gravity)
        assert relative(np.asarray(ours), M) < 1e-10
        assert relative(np.asarray(bias), data.qfrc_bias) < 1e-10
        assert relative(np.asarray(qdd), data.qacc) < 1e-10
        np.testing.assert_allclose(np.asarray(p), data.xpos[1:], atol=1e-13)
        np.testing.assert_allclose(np.asarray(R).reshape(3, 9), data.xmat[1:], atol=1e-13)


# ---------------------------------------------------------------------- invariants of simulations
def test_torque_free_body_conserves_energy_and_momentum():
    q0 = FREE.neutral(jnp.float64)
    v0 = jnp.array([0.1, 0.0, 0.2, 0.05, 3.0, 0.1])  # spinning near the unstable middle axis: it tumbles
    sol = ukjax.simulate(FREE_SYSTEM, q0, v0, FREE_PARAMS, t1=10.0, ts=jnp.linspace(0, 10, 51), rtol=1e-10,
                         atol=1e-10)  # fmt: skip
    assert int(sol.status) == 0
    assert np.max(np.abs(np.linalg.norm(sol.q[:, 3:], axis=1) - 1.0)) < 1e-12
    energy = jax.jit(jax.vmap(lambda q, v: FREE_SYSTEM.energy(q, v, 0.0, FREE_PARAMS)))(sol.q, sol.qd)
    assert np.max(np.abs(energy - energy[0])) < 1e-8 * energy[0]
    momentum = np.stack([_quaternion_rotation(q[3:]) @ (FREE_PARAMS["I"] * v[3:]) for q, v in zip(
        np.asarray(sol.q), np.asarray(sol.qd), strict=True)])  # fmt: skip
    assert np.max(np.abs(momentum - momentum[0])) < 1e-8 * np.linalg.norm(momentum[0])
    spin = np.asarray(sol.qd[:, 4])
    assert spin.min() < 0 < spin.max()  # it did tumble (the middle axis turned over)
    np.testing.assert_allclose(sol.q[:, :3], np.outer(sol.ts, v0[:3]), atol=1e-9)


@pytest.mark.slow
def test_spherical_pendulum_conserves_energy_and_vertical_momentum():
    q0 = BALL.retract(BALL.neutral(jnp.float64), jnp.array([0.8, -0.3, 0.0]))
    v0 = jnp.array([0.5, 1.0, 2.0])
    sol = ukjax.simulate(BALL_SYSTEM, q0, v0, BALL_PARAMS, t1=3.0, ts=jnp.linspace(0, 3, 31), rtol=1e-10,
                         atol=1e-10)  # fmt: skip
    assert int(sol.status) == 0
    assert np.max(np.abs(np.linalg.norm(sol.q, axis=1) - 1.0)) < 1e-12
    energy = jax.vmap(lambda q, v: BALL_SYSTEM.energy(q, v, 0.0, BALL_PARAMS))(sol.q, sol.qd)
    assert np.max(np.abs(energy - energy[0])) < 1e-8 * np.max(np.abs(energy))
    bodies = ball_bodies(BALL_PARAMS)
    m, c = float(BALL_PARAMS["m"]), COM
    pivot_inertia = np.asarray(bodies.inertia[0]) + m * (c @ c * np.eye(3) - np.outer(c, c))
    vertical = [(_quaternion_rotation(q) @ pivot_inertia @ v)[2] for q, v in zip(
        np.asarray(sol.q), np.asarray(sol.qd), strict=True)]  # fmt: skip
    assert np.ptp(vertical) < 1e-8 * np.max(np.abs(vertical))


# ---------------------------------------------------------------------- constraints in the chart
def test_holonomic_constraint_on_ball_body_matches_kkt():
    q = random_configuration(BALL)
    v = jnp.asarray(RNG.normal(size=3))
    R = _quaternion_rotation(np.asarray(q))
    params = BALL_PARAMS | {"d": jnp.asarray(NORMAL @ R @ TIP)}
    system = BALL_SYSTEM.with_constraints(tip_on_plane())

    @jax.jit
    def everything(q, v, params):  # one compiled call (also at the consistent state below)
        return dict(
            Ab=system.constraint_equations(q, v, 0.0, params),
            M=system.mass_matrix(q, 0.0, params),
            Q=system.given_force(q, v, 0.0, params),
            qdd={method: system.acceleration(q, v, 0.0, params, method=method) for method in ("ldl", "svd")},
            residuals=system.residuals(q, v, 0.0, params),
        )

    out = everything(q, v, params)
    A, b = out["Ab"]
    w = np.asarray(v)
    A_ref = -NORMAL @ R @ _skew(TIP)
    b_ref = -NORMAL @ R @ np.cross(w, np.cross(w, TIP))
    np.testing.assert_allclose(A[0], A_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(b[0], b_ref, rtol=1e-12, atol=1e-14)
    M, Q = np.asarray(out["M"]), np.asarray(out["Q"])
    kkt = np.block([[M, A_ref[:, None]], [A_ref[None, :], np.zeros((1, 1))]])
    expected = np.linalg.solve(kkt, np.concatenate([Q, [b_ref]]))[:3]
    for method in ("ldl", "svd"):
        np.testing.assert_allclose(out["qdd"][method], expected, rtol=1e-10, atol=1e-12)
    phi, phi_dot = out["residuals"]
    assert abs(float(phi[0])) < 1e-14 and abs(float(phi_dot[0]) - A_ref @ w) < 1e-14
    # consistent_state moves a guess onto the plane through the chart and keeps the quaternion unit
    guess = q.at[1].add(0.05) * 1.1
    q_c, v_c = ukjax.consistent_state(system, guess, v, 0.0, params)
    phi, phi_dot = everything(q_c, v_c, params)["residuals"]
    assert abs(float(phi[0])) < 1e-12 and abs(float(phi_dot[0])) < 1e-12
    assert abs(float(jnp.linalg.norm(q_c)) - 1.0) < 1e-15


@pytest.mark.slow
def test_constrained_ball_body_simulates_on_its_constraint():
    baumgarte = ukjax.Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
    system = BALL_SYSTEM.with_constraints(tip_on_plane(baumgarte))
    q0 = BALL.retract(BALL.neutral(jnp.float64), jnp.array([0.3, 0.2, 0.1]))
    plane = NORMAL @ _quaternion_rotation(np.asarray(q0)) @ TIP
    params = BALL_PARAMS | {"d": plane, "alpha": 10.0, "beta": 10.0}
    q0, v0 = ukjax.consistent_state(system, q0, jnp.array([1.0, -0.5, 0.3]), 0.0, params)
    sol = ukjax.simulate(system, q0, v0, params, t1=1.0, dt0=2e-3, ts=jnp.linspace(0, 1, 11))
    assert int(sol.status) == 0, sol.message
    assert np.max(np.abs(sol.position_residual)) < 1e-8
    assert np.max(np.abs(np.linalg.norm(sol.q, axis=1) - 1.0)) < 1e-14
    energy = jax.vmap(lambda q, v: system.energy(q, v, 0.0, params))(sol.q, sol.qd)
    assert np.ptp(energy) < 1e-6 * np.max(np.abs(energy))  # the ideal constraint does no work


# ---------------------------------------------------------------------- batch, jit, gradient, step
BATCH_OPTIONS = dict(t1=0.5, dt0=0.01, ts=jnp.array([0.0, 0.5]))
WEIGHTS = jnp.array([0.0, 0.0, 0.0, 0.3, -1.0, 0.5, 2.0])


@jax.jit
def simulate_with_gradient(q0, v0, inertia):
    """simulate of one free body, the loss weights · q(t1) and its reverse-mode gradient with respect to the
    inertia, in one compiled program. It serves the single-scenario solutions (compared with simulate_batch),
    the gradient and the loss values of the finite differences: compiled on their own, the plain simulate and
    the gradient's forward and backward passes took 31 CPU-s, this one program 25 (the backward pass is most
    of either)."""

    def loss(inertia):
        sol = ukjax.simulate(FREE_SYSTEM, q0, v0, FREE_PARAMS | {"I": inertia}, **BATCH_OPTIONS)
        return WEIGHTS @ sol.q[-1], sol

    (value, sol), gradient = jax.value_and_grad(loss, has_aux=True)(inertia)
    return sol, value, gradient


def test_free_body_batch_equals_single_and_gradient_matches_differences():
    """simulate_batch (vmap of the compiled solve) equals simulate per scenario to round-off; the reverse-mode
    gradient of the final configuration with respect to the inertia matches central differences (step 1e-6:
    truncation ~1e-12, round-off ~1e-10 relative) to 1e-6."""
    q0 = jnp.stack([FREE.neutral(jnp.float64), random_configuration(FREE)])
    v0 = jnp.array([[0.1, 0.0, 0.2, 0.05, 3.0, 0.1], [0.0, 1.0, 0.0, 1.0, -0.5, 2.0]])
    batch = ukjax.simulate_batch(FREE_SYSTEM, q0, v0, FREE_PARAMS, **BATCH_OPTIONS)
    assert np.all(np.asarray(batch.status) == 0)
    inertia, direction = FREE_PARAMS["I"], jnp.array([0.3, -1.0, 0.6])
    singles = [simulate_with_gradient(q0[k], v0[k], inertia) for k in range(2)]
    for k, (single, _, _) in enumerate(singles):
        np.testing.assert_allclose(batch.q[k], single.q, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(batch.qd[k], single.qd, rtol=1e-12, atol=1e-14)

    gradient = singles[0][2]
    loss = lambda inertia: simulate_with_gradient(q0[0], v0[0], inertia)[1]
    finite = central_difference(loss, inertia, direction, 1e-6)  # the same program, twice
    np.testing.assert_allclose(gradient @ direction, finite, rtol=1e-6)

    state = ukjax.State(q=q0[1], qd=v0[1])
    stepped = jax.jit(ukjax.step, static_argnums=0)(FREE_SYSTEM, state, FREE_PARAMS, 0.01)
    assert abs(float(jnp.linalg.norm(stepped.q[3:])) - 1.0) < 1e-15


# ---------------------------------------------------------------------- what nq ≠ n refuses
def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="needs retract"):
        ukjax.System(mass=lambda q, t, p: jnp.eye(6), force=lambda q, qd, t, p: jnp.zeros(6), n=6, nq=7)
    with pytest.raises(ValueError, match=r"q0 must have shape \(nq,\) and qd0 shape \(n,\) with nq = 7"):
        ukjax.simulate(FREE_SYSTEM, jnp.zeros(6), jnp.zeros(6), FREE_PARAMS, t1=1.0)
    with pytest.raises(ValueError, match=r"q of shape \(7,\) and qd of shape \(6,\)"):
        FREE_SYSTEM.acceleration(jnp.zeros(6), jnp.zeros(6), 0.0, FREE_PARAMS)
    with pytest.raises(ValueError, match="from_lagrangian needs q̇ = v"):
        ukjax.System.from_lagrangian(lambda q, qd, t, p: 0.5 * qd @ qd, None, 6, nq=7, retract=FREE.retract)
    with pytest.raises(ValueError, match="compose does not support"):
        ukjax.compose({"a": FREE_SYSTEM, "b": BALL_SYSTEM})
    with pytest.raises(ValueError, match="nq must be an int >= n"):
        dataclasses.replace(FREE_SYSTEM, nq=5)
    scenarios = ukjax.tune.Scenarios(q0=jnp.zeros((2, 6)), qd0=jnp.zeros((2, 6)))
    with pytest.raises(ValueError, match="q0 has 6 coordinates per scenario; the system has 7"):
        scenarios.check(FREE_SYSTEM.n, nq=FREE_SYSTEM.nq)
    with pytest.raises(ValueError, match="linearize needs q̇ = v"):
        FREE_SYSTEM.linearize(FREE.neutral(), jnp.zeros(6), 0.0, FREE_PARAMS, independent=range(6))
