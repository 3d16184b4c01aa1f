"""ukjax.robots: robots read from MJCF and URDF, checked against MuJoCo's own dynamics of the same files.

The references share no code with ukjax's recursions: MuJoCo's mass matrix (``mj_fullM``), bias force
(``qfrc_bias``: Coriolis, centrifugal and gravity), unconstrained ``qacc`` (all constraints disabled, so
``qacc`` = M⁻¹(-qfrc_bias + qfrc_passive) with armature in M and joint damping in qfrc_passive), body and
site poses, equality residuals (``efc_pos``), and a KKT solve [[M, Jᵀ], [J, 0]] built from MuJoCo's M, its
point and body Jacobians (``mj_jac``) and their time derivatives (``mj_jacDot``) for the closed loops.
Tolerance: 1e-10 relative to the largest entry of the compared quantity; both sides are float64 recursions
over a handful of bodies (measured differences ~1e-15), so 1e-10 leaves room for conditioning and still
catches any modelling error (a wrong offset, axis, inertia rotation or fused mass changes entries at 1e-3
or more).

The small models are hand-written files under tests/data: ``arm3.xml`` (a jointless base, a joint ``pos``
offset, a fused tool, a body with two joints, armature, damping, tilted gravity, sites), ``arm2.urdf``
(rotated origins, a prismatic joint, a fused link on a fixed joint), ``four_bar.xml`` (a planar loop closed
by ``connect``) and ``weld.xml`` (a six-joint body welded to an arm, plus a joint equality).
"""

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax import robots
from ukjax.constraints import Baumgarte, Holonomic

mujoco = pytest.importorskip("mujoco")

DATA = Path(__file__).parent / "data"
RTOL = 1e-10


def relative_error(a, b) -> float:
    b = np.asarray(b)
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


def mujoco_model(name: str, *, constraints: bool = False):
    """MuJoCo's own compilation of a test file (a URDF read by MuJoCo directly, its static links fused by
    MuJoCo, not by ukjax); constraints (equalities, limits, contacts) disabled unless asked for."""
    model = mujoco.MjModel.from_xml_path(str(DATA / name))
    if not constraints:
        model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    else:
        model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT | mujoco.mjtDisableBit.mjDSBL_LIMIT
    return model


def mujoco_state(model, q, qd):
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = q, qd
    mujoco.mj_forward(model, data)
    return data


def full_mass(model, data):
    M = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, M)
    return M


def random_states(robot, count, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.uniform(-scale, scale, robot.n), rng.uniform(-1.0, 1.0, robot.n)) for _ in range(count)]


@functools.cache
def loaded(name: str):
    """A test file read once per module: the robot, its system and the system's jitted acceleration (one
    compiled program per file, shared by the tests that use it)."""
    robot = robots.load(DATA / name)
    system = robot.system()
    return robot, system, jax.jit(system.acceleration)


@pytest.fixture(scope="module")
def arm3():
    return loaded("arm3.xml")


# ---------------------------------------------------------------------------------------------- mapping
def test_names_and_structure():
    robot = robots.load(DATA / "arm3.xml")
    assert robot.name == "arm3"
    assert robot.joint_names == ("shoulder", "elbow", "wrist", "extend")
    assert robot.body_names == ("link1", "link2", "link3:wrist", "link3")  # link3's hinge: a massless body
    assert robot.tree.parents == (-1, 0, 1, 2)
    assert robot.frame_names == ("world", "base", "link1", "link2", "tool", "link3")
    assert robot.site_names == ("tool_tip", "tip")
    np.testing.assert_allclose(robot.joint_range[1], np.radians([-120.0, 120.0]))  # MJCF angles in degrees
    assert robot.joint_range[0] == (-np.inf, np.inf)
    np.testing.assert_allclose(robot.params["mass"], [2.0, 1.5 + 0.4, 0.0, 0.8])  # tool fused into link2
    np.testing.assert_allclose(robot.params["damping"], [0.2, 0.0, 0.0, 1.5])
    np.testing.assert_allclose(robot.params["armature"], [0.01, 0.0, 0.0, 0.05])
    np.testing.assert_allclose(robot.params["gravity"], [0.5, -1.0, -9.7])
    urdf = robots.load(DATA / "arm2.urdf")
    assert urdf.joint_names == ("j1", "j2", "j3")
    assert urdf.frame_names == ("world", "base_link", "upper", "lower", "slider", "tool")
    np.testing.assert_allclose(urdf.params["mass"], [2.0, 1.2, 0.5 + 0.3])
    assert urdf.system().coordinate_names == ("j1", "j2", "j3")


@pytest.mark.parametrize("name", ["arm3.xml", "arm2.urdf"])
def test_unconstrained_dynamics_match_mujoco(name):
    """M (armature included), the bias force C and unconstrained q̈ (damping included) at 3 random states."""
    robot, system, acceleration = loaded(name)
    model = mujoco_model(name)
    mass_and_bias = jax.jit(
        lambda q, qd, p: (
            system.mass(q, 0.0, p),
            robot.tree.bias_force(q, qd, robot.bodies(p), robot.gravity(p)),
        )
    )
    for q, qd in random_states(robot, 3, seed=1):
        data = mujoco_state(model, q, qd)
        mass, bias = mass_and_bias(q, qd, robot.params)
        assert relative_error(mass, full_mass(model, data)) < RTOL
        assert relative_error(bias, data.qfrc_bias) < RTOL
        assert relative_error(acceleration(q, qd, 0.0, robot.params), data.qacc) < RTOL


def test_frames_and_sites_match_mujoco(arm3):
    """World poses of every body (fused ones too) and site: MuJoCo's xpos/xmat and site_xpos/site_xmat."""
    robot, _, _ = arm3
    model = mujoco_model("arm3.xml")
    poses_and_tip = jax.jit(
        lambda q, p: (
            [robot.frame(name)(q, p) for name in (*robot.frame_names, *robot.site_names)],
            robot.point("tip", [0.0, 0.1, 0.0])(q, p),
        )
    )
    for q, qd in random_states(robot, 2, seed=2):
        data = mujoco_state(model, q, qd)
        expected = [(data.xmat[b].reshape(3, 3), data.xpos[b]) for b in range(model.nbody)]
        expected += [(data.site_xmat[s].reshape(3, 3), data.site_xpos[s]) for s in range(model.nsite)]
        poses, tip = poses_and_tip(q, robot.params)
        for (R, p), (R_ref, p_ref) in zip(poses, expected, strict=True):
            np.testing.assert_allclose(R, R_ref, atol=1e-12)
            np.testing.assert_allclose(p, p_ref, atol=1e-12)
        np.testing.assert_allclose(
            tip, data.site_xpos[1] + data.site_xmat[1].reshape(3, 3)[:, 1] * 0.1, atol=1e-12
        )


# ---------------------------------------------------------------------------------------------- loops
def kkt_acceleration(model, data, J, Jdot_qd):
    """q̈ of [[M, Jᵀ], [J, 0]] [q̈, λ] = [-C + passive, -J̇ q̇] (least squares: J may have dependent rows)."""
    M, n, m = full_mass(model, data), model.nv, J.shape[0]
    K = np.block([[M, J.T], [J, np.zeros((m, m))]])
    rhs = np.concatenate([data.qfrc_passive - data.qfrc_bias, -Jdot_qd])
    return np.linalg.lstsq(K, rhs, rcond=None)[0][:n]


def point_jacobians(model, data, body, point):
    """(∂x/∂q, ∂ω/∂q, d/dt ∂x/∂q, d/dt ∂ω/∂q) of a world point fixed on ``body``."""
    jacp, jacr, dp, dr = (np.zeros((3, model.nv)) for _ in range(4))
    mujoco.mj_jac(model, data, jacp, jacr, point, body)
    mujoco.mj_jacDot(model, data, dp, dr, point, body)
    return jacp, jacr, dp, dr


def test_four_bar_constrained_acceleration_matches_kkt():
    """The connect loop as an exact constraint: q̈ equals the KKT solution from MuJoCo's M, mj_jac and
    mj_jacDot of the two coinciding points, at random (not necessarily closed) states."""
    robot, _, acceleration = loaded("four_bar.xml")
    model = mujoco_model("four_bar.xml")
    coupler, rocker = (mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in ("coupler", "rocker"))
    for q, qd in random_states(robot, 3, seed=3):
        data = mujoco_state(model, q, qd)
        anchor = data.xpos[coupler] + data.xmat[coupler].reshape(3, 3) @ model.eq_data[0, :3]
        other = data.xpos[rocker] + data.xmat[rocker].reshape(3, 3) @ model.eq_data[0, 3:6]
        J1, _, D1, _ = point_jacobians(model, data, coupler, anchor)
        J2, _, D2, _ = point_jacobians(model, data, rocker, other)
        expected = kkt_acceleration(model, data, J1 - J2, (D1 - D2) @ qd)
        assert relative_error(acceleration(q, qd, 0.0, robot.params), expected) < RTOL


def test_weld_and_joint_equality_match_kkt():
    """A weld (6 rows, between two moving bodies of one chain) and a joint equality (1 row) against the KKT
    solution from MuJoCo's Jacobians of the welded points and the two bodies' rotations, at states with
    consistent velocities (the weld's orientation rows, the skew part of R₂ᵀR₁R_rel, are a nonlinear
    function of the orientation error whose acceleration rows agree with the relative angular acceleration
    where the relative angular velocity vanishes)."""
    robot, _, acceleration = loaded("weld.xml")
    model = mujoco_model("weld.xml")
    upper, platform = (mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in ("upper", "platform"))
    c1, c2 = model.eq_data[1, 1:3]  # q_a2 = c1 q_a1 + c2 q_a1²
    for q, qd in random_states(robot, 3, seed=4, scale=0.3):
        data = mujoco_state(model, q, qd)
        x1 = data.xpos[upper] + data.xmat[upper].reshape(3, 3) @ model.eq_data[0, 3:6]
        x2 = data.xpos[platform] + data.xmat[platform].reshape(3, 3) @ model.eq_data[0, 0:3]
        P1, R1, DP1, DR1 = point_jacobians(model, data, upper, x1)
        P2, R2, DP2, DR2 = point_jacobians(model, data, platform, x2)
        coupling = np.zeros(model.nv)
        coupling[[0, 1]] = -(c1 + 2 * c2 * q[0]), 1.0
        J = np.vstack([P1 - P2, R1 - R2, coupling])
        qd = qd - np.linalg.pinv(J) @ (J @ qd)  # consistent velocities: J q̇ = 0
        data = mujoco_state(model, q, qd)
        P1, R1, DP1, DR1 = point_jacobians(model, data, upper, x1)
        P2, R2, DP2, DR2 = point_jacobians(model, data, platform, x2)
        Jdot_qd = np.concatenate([(DP1 - DP2) @ qd, (DR1 - DR2) @ qd, [-2 * c2 * qd[0] ** 2]])
        expected = kkt_acceleration(model, data, J, Jdot_qd)
        assert relative_error(acceleration(q, qd, 0.0, robot.params), expected) < RTOL


def test_point_kinematics_equalities_equal_automatic_differentiation():
    """On trees of hinges and slides, connect and joint equalities take A and the velocity product from the
    tree's point kinematics (robots._PointEqualities, Tree.point_motion); a weld keeps automatic
    differentiation. Both forms of the same φ, Baumgarte-stabilized, agree to 1e-12 (relative to the
    largest entry; both exact) at random states: the four-bar's connect, weld.xml's joint equality
    (q_a2 = c1 q_a1 + c2 q_a1²) on its own, and the three loops of Jansen's leg in one constraint."""
    from ukjax.studies import jansen

    stabilized = Baumgarte(lambda p: (3.0, 5.0))
    weld_robot = loaded("weld.xml")[0]
    cases = [(loaded("four_bar.xml")[0], loaded("four_bar.xml")[0].loop_constraint(stabilized)),
             (weld_robot, weld_robot.equality_constraints(stabilized)[1]),
             (robots.load(jansen.MODEL_FILE), None)]  # fmt: skip
    assert type(weld_robot.loop_constraint()) is Holonomic  # a weld: automatic differentiation
    for robot, constraint in cases:
        constraint = constraint or robot.loop_constraint(stabilized)
        assert type(constraint).__name__ == "_PointEqualities"
        reference = Holonomic(phi=constraint.phi, baumgarte=constraint.baumgarte, name=constraint.name)

        def forms(q, qd, constraint=constraint, reference=reference, params=robot.params):
            return [(c.second_order(q, qd, 0.0, params), c.velocity(q, qd, 0.0, params))
                    for c in (constraint, reference)]  # fmt: skip

        for q, qd in random_states(robot, 3, seed=11):
            ours, theirs = jax.jit(forms)(jnp.asarray(q), jnp.asarray(qd))
            for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
                assert relative_error(a, b) < 1e-12


def test_a_tree_with_as_many_constraint_rows_as_velocities_solves_with_its_dense_mass_matrix():
    """With m ≥ n constraint rows the UK solve would apply M⁻¹ to n + 1 columns: the tree's M by CRBA and a
    Cholesky serve it instead of n + 1 articulated-body sweeps (System._dense_mass_pays); with fewer rows
    the articulated-body solve stays. Either way the same q̈ (1e-12 relative): the four-bar (n = 3, a
    connect of 3 rows) and the same tree with one of its rows (q_rocker fixed)."""
    robot, system, _ = loaded("four_bar.xml")
    one_row = robot.system(loops=False, constraints=(Holonomic(lambda q, t, p: q[2:3]),))
    for sys_, dense in ((system, True), (one_row, False)):
        for q, qd in random_states(robot, 2, seed=5):
            q, qd = jnp.asarray(q), jnp.asarray(qd)
            assert bool(sys_._dense_mass_pays(q, qd, 0.0, robot.params)) is dense
            reference = dataclasses.replace(sys_, mass_solve=None).motion(q, qd, 0.0, robot.params).qdd
            assert relative_error(sys_.motion(q, qd, 0.0, robot.params).qdd, reference) < 1e-12


def test_equality_residuals_match_mujoco():
    """φ of every equality row against MuJoCo's efc_pos at random configurations: connect and weld
    positions and the joint equality equal; the weld's orientation rows are 2w·v where MuJoCo's are v
    (the error quaternion (w, v), torque scale 1). The same rows from ``robot.loop_constraint()`` (all
    equalities in one constraint, one forward-kinematics pass: what ``robot.system()`` holds)."""
    residuals = {}
    for name in ("four_bar.xml", "weld.xml"):
        robot, _, _ = loaded(name)
        model = mujoco_model(name, constraints=True)
        constraints = robot.equality_constraints()
        values = jax.jit(lambda q, p, constraints=constraints: [c.value(q, 0.0, p) for c in constraints])
        loop = robot.loop_constraint()
        stacked = jax.jit(lambda q, p, loop=loop: loop.value(q, 0.0, p))
        residuals[name] = values
        assert robot.system().constraints[0].name.startswith("equalities")
        for q, qd in random_states(robot, 2, seed=5, scale=0.3):
            data = mujoco_state(model, q, qd)
            ours = np.concatenate(values(jnp.asarray(q), robot.params))
            theirs = np.array(data.efc_pos)
            if name == "weld.xml":
                v = theirs[3:6]
                theirs[3:6] = 2.0 * np.sqrt(1.0 - v @ v) * v
            np.testing.assert_allclose(ours, theirs, atol=1e-12)
            np.testing.assert_allclose(stacked(jnp.asarray(q), robot.params), theirs, atol=1e-12)
    # the compiled configuration closes the four-bar's loop (connect's second anchor is computed there);
    # weld.xml's relpose deliberately differs from it, so its residual above shows relpose is honoured
    robot, _, _ = loaded("four_bar.xml")
    assert len(robot.equality_constraints()) == 1  # the loop
    (closed,) = residuals["four_bar.xml"](jnp.zeros(3), robot.params)
    np.testing.assert_allclose(closed, 0.0, atol=1e-15)


def test_four_bar_simulation_stays_closed():
    """1 s of the four-bar falling under gravity from a consistent start, the loop Baumgarte-stabilized:
    the connect points stay together (Tsit5 at 2 ms, gains α = β = 20 1/s; measured |φ| ~1e-9 m)."""
    robot, _, _ = loaded("four_bar.xml")
    stabilized = ukjax.Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
    system = robot.system(baumgarte=stabilized)
    params = {**robot.params, "alpha": jnp.asarray(20.0), "beta": jnp.asarray(20.0)}
    q0, qd0 = ukjax.consistent_state(
        system, jnp.zeros(3), jnp.array([1.0, 0.0, 0.0]), 0.0, params, fixed=(0,)
    )
    sol = ukjax.simulate(system, q0, qd0, params, t1=1.0, dt0=2e-3)
    assert bool(sol.ok)
    assert float(jnp.max(jnp.abs(sol.q[:, 0] - q0[0]))) > 0.1  # it moves
    assert float(jnp.max(jnp.abs(sol.position_residual))) < 1e-6


# ---------------------------------------------------------------------------------------------- transforms
def test_gradient_with_respect_to_a_mass_matches_finite_differences(arm3):
    """d q̈_0/d m_link2 by jax.grad through params["mass"] against a central difference (step 1e-5 kg; the
    difference's truncation error is O(h²) ~1e-10, round-off ~1e-11, so rtol 1e-6)."""
    robot, system, acceleration = arm3
    q, qd = random_states(robot, 1, seed=6)[0]

    def shoulder_acceleration(mass_link2):
        params = {**robot.params, "mass": robot.params["mass"].at[1].set(mass_link2)}
        return acceleration(q, qd, 0.0, params)[0]

    m, h = robot.params["mass"][1], 1e-5
    gradient = jax.jit(jax.grad(shoulder_acceleration))(m)
    difference = (shoulder_acceleration(m + h) - shoulder_acceleration(m - h)) / (2 * h)
    assert abs(float(gradient)) > 1e-3
    np.testing.assert_allclose(gradient, difference, rtol=1e-6)


def test_vmap_over_masses_matches_plain_and_jit(arm3):
    """A batch of mass vectors through jax.vmap equals one jitted call per member, and the plain (not
    jitted) call equals the jitted one (to round-off: the same operations, fused differently)."""
    robot, system, acceleration = arm3
    q, qd = random_states(robot, 1, seed=7)[0]
    scales = jnp.array([0.5, 1.0, 2.0])
    batch = {**robot.params, "mass": robot.params["mass"][None, :] * scales[:, None]}
    axes = {key: (0 if key == "mass" else None) for key in robot.params}
    batched = jax.vmap(acceleration, in_axes=(None, None, None, axes))(q, qd, 0.0, batch)
    for i, scale in enumerate(scales):
        params = {**robot.params, "mass": robot.params["mass"] * scale}
        np.testing.assert_allclose(batched[i], acceleration(q, qd, 0.0, params), rtol=1e-12, atol=1e-12)
    plain = system.acceleration(q, qd, 0.0, robot.params)
    np.testing.assert_allclose(plain, batched[1], rtol=1e-12, atol=1e-12)
    assert not np.allclose(batched[0], batched[2])


def test_task_constraint_on_a_named_point(arm3):
    """robot.point inside a Holonomic: A is the point's Jacobian, MuJoCo's mj_jac of the site."""
    robot, _, _ = arm3
    target = jnp.array([0.3, 0.2, 0.6])
    task = ukjax.Holonomic(lambda q, t, p: robot.point("tip")(q, p) - target)
    model = mujoco_model("arm3.xml")
    q, qd = random_states(robot, 1, seed=8)[0]
    A, _ = jax.jit(task.second_order)(jnp.asarray(q), jnp.asarray(qd), 0.0, robot.params)
    data = mujoco_state(model, q, qd)
    jacp = np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, jacp, None, mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "tip"))
    np.testing.assert_allclose(A, jacp, atol=1e-12)


# ---------------------------------------------------------------------------------------------- inputs
def test_bad_inputs_are_named():
    with pytest.raises(FileNotFoundError, match="no_such.xml"):
        robots.load(DATA / "no_such.xml")
    with pytest.raises(ValueError, match="expected an MJCF"):
        robots.load("<sdf/>")
    with pytest.raises(ValueError, match="not well-formed"):
        robots.load("<mujoco>")
    with pytest.raises(ValueError, match="MuJoCo could not compile"):
        robots.load("<mujoco><worldbody><body><joint type='bogus'/></body></worldbody></mujoco>")
    robot = robots.load(DATA / "four_bar.xml")
    with pytest.raises(ValueError, match="no body or site named 'hand'"):
        robot.frame("hand")
    with pytest.raises(ValueError, match="finite 3-vector"):
        robot.point("crank", [0.0, 1.0])
    with pytest.raises(NotImplementedError, match="reference position"):
        robots.load("<mujoco><worldbody><body><joint ref='10'/><geom size='.1'/></body></worldbody></mujoco>")


BALL_AND_FREE = """<mujoco model="ball_free"><worldbody>
  <body name="base" pos="0 0 1"><joint name="free" type="free"/>
    <geom type="box" size="0.1 0.2 0.05" mass="2"/>
    <body name="arm" pos="0.1 0 0"><joint name="ball" type="ball" pos="0.02 0 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="0.7"/></body></body>
</worldbody></mujoco>"""


def test_ball_and_free_joints_match_mujoco():
    robot = robots.load(BALL_AND_FREE)
    model = mujoco.MjModel.from_xml_string(BALL_AND_FREE)
    model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    data = mujoco.MjData(model)
    rng = np.random.default_rng(9)
    mujoco.mj_integratePos(model, data.qpos, rng.uniform(-1, 1, model.nv), 1.0)
    data.qvel[:] = rng.uniform(-1, 1, model.nv)
    mujoco.mj_forward(model, data)
    q, qd = jnp.asarray(data.qpos), jnp.asarray(data.qvel)
    system = robot.system()

    @jax.jit
    def tree_terms(q, qd, p):
        bodies = robot.bodies(p)
        return (
            robot.tree.mass_matrix(q, bodies),
            robot.tree.bias_force(q, qd, bodies, p["gravity"]),
            system.acceleration(q, qd, 0.0, p),
        )

    mass, bias, acceleration = tree_terms(q, qd, robot.params)
    assert relative_error(mass, full_mass(model, data)) < RTOL
    assert relative_error(bias, data.qfrc_bias) < RTOL
    assert (system.nq, system.n) == (model.nq, model.nv) == (11, 9)
    names = system.coordinate_names
    assert names[:3] == ("free:vx", "free:vy", "free:vz") and names[-1] == "ball:wz"
    assert relative_error(acceleration, data.qacc) < RTOL


@pytest.mark.slow
def test_ur5_and_panda_match_pinocchio_and_mujoco():
    """benchmarks/validate_robots.py at 3 states: UR5 and Panda (example-robot-data URDFs) against
    Pinocchio's crba/rnea/aba and MuJoCo, every relative error below 1e-10 (measured ≤ 1.3e-14 at 20
    states)."""
    pytest.importorskip("pinocchio")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from validate_robots import ROBOTS, TOLERANCE, run

    from ukjax.studies._common import example_robot_file

    try:
        for path in ROBOTS.values():
            example_robot_file(path)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    results = run(states=3, seed=1)
    assert {"ur5", "panda"} <= set(results)
    for name, result in results.items():
        if result.get("refused"):  # dm-control's quadruped: tendon equalities, refused by name
            assert "equalit" in result["refused"], name
            continue
        for quantity, error in result["max_relative_error"].items():
            assert error < TOLERANCE, (name, quantity, error)


def test_joint_springs_are_named_in_a_warning():
    """Joint stiffness is not mapped: loading a file with a spring warns, naming the joint (a silent missing
    force would be a wrong number)."""
    spring = (
        "<mujoco><worldbody><body><joint name='sprung' axis='0 1 0' stiffness='3'/>"
        "<geom size='.1' mass='1'/></body></worldbody></mujoco>"
    )
    with pytest.warns(UserWarning, match=r"\['sprung'\] have springs"):
        robots.load(spring)
