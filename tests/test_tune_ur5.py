"""The servo pipeline of ``ukjax tune ur5`` (ukjax/studies/tune_ur5.py): a robot file, a task-space servo
constraint on a frame, a controller computed from a model (``ukjax.control.servo_force``) acting on a plant.

The fast tests use tests/data/arm3.xml (4 joints, armature, damping, tilted gravity) with its ``tip`` site on
a circle (3 position rows, 4 joint torques: the minimum-norm control), so they need mujoco (dev extra) but
not example-robot-data. They check, against things that share no code with ukjax's servo control:

* MuJoCo's own M, bias force, damping, site Jacobian and its time derivative (``mj_jacDot``) give the
  minimum-norm torque u = D⁺ r, D = J M⁻¹, r = c̈ - J̇q̇ - 2αφ̇ - β²φ + J M⁻¹ h (NumPy's pinv): ukjax's u and
  the plant's q̈ agree to 1e-8 relative (float64 recursions on 4 bodies, measured ~1e-13);
* along a simulated trajectory with the exact model, φ̈ + 2αφ̇ + β²φ = 0 at every saved state, with φ̇ and
  φ̈ by nested JVPs of φ(q, t) and q̈ from the plant (an identity of the closed loop: 1e-8 relative to β²|φ|);
  and φ(t) follows the closed form (φ₀ + (φ̇₀ + αφ₀) t) e^{-αt} of the critically damped error (α = β) to
  the fixed-step integration error (RK4, dt = 2 ms: 1e-7 m);
* :func:`with_payload` gives the mass matrix MuJoCo computes for the file with the payload as a body.

The whole study runs at tiny sizes in a slow test (needs example-robot-data).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax import control, robots
from ukjax.studies import tune_ur5

mujoco = pytest.importorskip("mujoco")

DATA = Path(__file__).parent / "data"
HOME = jnp.array([0.3, 0.5, 0.2, 0.05])
RADIUS, FREQUENCY, GAIN = 0.05, 0.5, 4.0


@pytest.fixture(scope="module")
def arm():
    """arm3 with its tip on a circle: (robot, path, constraint, model, plant, params with the exact model)."""
    robot = robots.load(DATA / "arm3.xml")
    tip = robot.point("tip")(HOME, robot.params)
    path = tune_ur5.circle(tip - jnp.array([RADIUS, 0.0, 0.0]), RADIUS, FREQUENCY)
    constraint = tune_ur5.tracking_constraint(robot, "tip", path)
    model, plant = tune_ur5.controlled_arm(robot, constraint)
    gains = {"alpha": jnp.asarray(GAIN), "beta": jnp.asarray(GAIN)}
    params = {**robot.params, "controller": {**robot.params, **gains}}
    return robot, path, constraint, model, plant, params


def mujoco_control(q, qd, t, path, alpha, beta):
    """(u, q̈) of the minimum-norm servo torque from MuJoCo's M, bias, passive force and tip Jacobians."""
    model = mujoco.MjModel.from_xml_path(str(DATA / "arm3.xml"))
    model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = q, qd
    mujoco.mj_forward(model, data)
    M = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, M)
    h = data.qfrc_bias - data.qfrc_passive  # M q̈ + h = τ
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "tip")
    J, Jr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, J, Jr, site)
    Jdot, Jrdot = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    mujoco.mj_jacDot(model, data, Jdot, Jrdot, data.site_xpos[site], model.site_bodyid[site])
    c, c_dot, c_ddot = (
        np.asarray(x) for x in (path(t), jax.jacfwd(path)(t), jax.jacfwd(jax.jacfwd(path))(t))
    )
    phi, phi_dot = data.site_xpos[site] - c, J @ qd - c_dot
    b = c_ddot - Jdot @ qd - 2 * alpha * phi_dot - beta**2 * phi
    M_inv = np.linalg.inv(M)
    D = J @ M_inv
    u = np.linalg.pinv(D) @ (b + D @ h)
    return u, M_inv @ (u - h)


def test_servo_torque_matches_a_solve_from_mujocos_matrices(arm):
    robot, path, _, model, plant, params = arm

    def closed_loop(q, qd, t):
        u = control.servo_control(model, q, qd, t, params["controller"], pinv_method="householder")
        exact = control.closed_loop_acceleration(model, q, qd, t, params["controller"])
        return u, plant.acceleration(q, qd, t, params), exact.qdd

    rng = np.random.default_rng(0)
    qs = HOME + 0.2 * rng.uniform(-1, 1, (3, 4))
    qds, ts = rng.uniform(-1, 1, (3, 4)), rng.uniform(0, 2, 3)
    us, qdds, exact = jax.jit(jax.vmap(closed_loop))(qs, qds, ts)
    for q, qd, t, u, qdd in zip(qs, qds, ts, us, qdds, strict=True):
        u_ref, qdd_ref = mujoco_control(q, qd, t, path, GAIN, GAIN)
        assert np.max(np.abs(u - u_ref)) <= 1e-8 * np.max(np.abs(u_ref))
        assert np.max(np.abs(qdd - qdd_ref)) <= 1e-8 * np.max(np.abs(qdd_ref))
    # jit of one state gives the batch's numbers (the plant's q̈, servo torque included: only it is compared,
    # so only it is compiled unbatched); with the model's parameters equal to the plant's, servo_force
    # reproduces simulate's own control hook (closed_loop_acceleration, LAPACK SVD)
    one = jax.jit(lambda q, qd, t: plant.acceleration(q, qd, t, params))(qs[1], qds[1], ts[1])
    np.testing.assert_allclose(one, qdds[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(qdds, exact, rtol=1e-10, atol=1e-12)


def test_exact_model_tracking_error_decays_at_the_baumgarte_rate(arm):
    robot, path, constraint, model, plant, params = arm
    phi = lambda q, t: constraint.value(q, t, params["controller"])
    start = jax.jit(lambda q: ukjax.consistent_state(model, q, jnp.zeros(4), 0.0, params["controller"]))
    q0, qd0 = start(HOME)
    q0 = q0 + jnp.array([0.02, -0.03, 0.01, 0.01])  # off the path: φ(0) of about 1 cm
    ts = jnp.linspace(0.0, 0.6, 31)
    sol = ukjax.simulate(plant, q0, qd0, params, t1=0.6, dt=2e-3, ts=ts, solver=ukjax.RK4())
    assert bool(sol.ok)

    def derivatives(q, qd, t):
        rate = lambda q, qd, t: jax.jvp(phi, (q, t), (qd, 1.0))[1]
        qdd = plant.acceleration(q, qd, t, params)
        return phi(q, t), rate(q, qd, t), jax.jvp(rate, (q, qd, t), (qd, qdd, 1.0))[1]

    value, rate, accel = jax.jit(jax.vmap(derivatives))(sol.q, sol.qd, sol.ts)
    residual = accel + 2 * GAIN * rate + GAIN**2 * value
    scale = GAIN**2 * np.max(np.abs(value), axis=1, keepdims=True)
    assert np.max(np.abs(residual) / scale) <= 1e-8
    # the error itself: φ(t) = (φ0 + (φ̇0 + αφ0) t) e^{-αt} (critical damping, α = β)
    t = sol.ts[:, None]
    closed_form = (value[0] + (rate[0] + GAIN * value[0]) * t) * jnp.exp(-GAIN * t)
    assert float(jnp.max(jnp.abs(value[0]))) > 5e-3
    assert float(jnp.max(jnp.abs(value - closed_form))) <= 1e-7


def test_payload_mass_matrix_matches_mujoco_with_the_payload_as_a_body(arm):
    robot, *_ = arm
    point, mass = np.array([0.2, 0.01, -0.02]), 0.7
    q = HOME + jnp.array([0.1, -0.2, 0.3, 0.02])
    loaded = tune_ur5.with_payload(robot.params, jnp.asarray(mass), jnp.asarray(point))
    system = robot.system()
    M = system.mass_matrix(q, 0.0, loaded)
    # the payload as a jointless body on link3 (MuJoCo needs a positive inertia: 1e-12 kg m², far below 1e-10)
    text = (DATA / "arm3.xml").read_text()
    payload = (
        f'<body name="payload" pos="{point[0]} {point[1]} {point[2]}"><inertial pos="0 0 0" mass="{mass}" '
        'diaginertia="1e-12 1e-12 1e-12"/></body>'
    )
    text = text.replace('<site name="tip"', payload + '<site name="tip"')
    # link3's frame in MuJoCo is its body frame; the tree's last body frame sits at the slide's anchor (the
    # body origin: the slide has no pos), so the point has the same coordinates in both
    model = mujoco.MjModel.from_xml_string(text)
    data = mujoco.MjData(model)
    data.qpos[:] = np.asarray(q)
    mujoco.mj_forward(model, data)
    M_ref = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, M_ref)
    assert np.max(np.abs(M - M_ref)) <= 1e-10 * np.max(np.abs(M_ref))
    assert float(loaded["mass"][-1]) == pytest.approx(float(robot.params["mass"][-1]) + mass, rel=1e-14)


def test_servo_force_refuses_a_model_without_servo_constraints(arm):
    robot, *_ = arm
    with pytest.raises(ValueError, match="servo_force: the system needs actuation"):
        control.servo_force(robot.system(), lambda p: p)


@pytest.mark.slow
def test_tune_ur5_study_runs_at_tiny_sizes(tmp_path, capsys):
    from ukjax.cli import main
    from ukjax.studies._common import example_robot_file

    try:
        example_robot_file(tune_ur5.URDF)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    out = tmp_path / "ur5"
    assert main(["tune", "ur5", "--quick", "--no-progress", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["start"]["consistent_state_residual_max"] < 1e-10
    assert metrics["heldout_tuned"]["failures"] == 0
    assert set(metrics["tuned_gains"]) == {"alpha", "beta"}
    assert {"tool_path.png", "tracking_error.png", "fit.png"} <= {p.name for p in out.glob("*.png")}
    assert "peak |τ| N m" in capsys.readouterr().out


def test_example_robot_file_reads_a_copy_named_by_ukjax_robot_data(tmp_path, monkeypatch):
    """A machine without a package index (the GPU machine) brings a copy of example-robot-data's robots
    folder and names it in UKJAX_ROBOT_DATA: the file is read from there; a copy without the file falls back
    to the installed package, whose absence is an error naming both ways to provide it."""
    from ukjax.studies._common import example_robot_file

    copy = tmp_path / "robots" / tune_ur5.URDF
    copy.parent.mkdir(parents=True)
    copy.write_text("<robot name='ur5'/>")
    monkeypatch.setenv("UKJAX_ROBOT_DATA", str(tmp_path / "robots"))
    assert example_robot_file(tune_ur5.URDF) == copy
    monkeypatch.setattr("site.getsitepackages", lambda: [str(tmp_path / "empty")])
    monkeypatch.setattr("site.ENABLE_USER_SITE", False)
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"purelib": str(tmp_path / "empty")})
    with pytest.raises(FileNotFoundError, match="UKJAX_ROBOT_DATA"):
        example_robot_file("panda_description/urdf/panda.urdf")
