"""Jansen's Strandbeest leg (ukjax/studies/data/jansen_leg.xml): the shipped MJCF file against the linkage
assembled in closed form by circle intersections (plain NumPy), a short driven simulation with the three
connect loops as exact constraints, and the constraint forces against a KKT solve from MuJoCo's mass matrix
and Jacobians.

Tolerances: the file's positions are written to 12 decimals in metres, so the file and the closed form agree
to ~1e-12 m (bound 1e-11 m on points, 1e-10 rad on joint angles, where a 0.15 m link turns a 1e-12 m
rounding into ~1e-11 rad). The short simulation's errors are the RK4 truncation error the Baumgarte terms
hold (dt = 2 ms over 0.1 s, measured: loop gaps 8e-10 m, foot 1.6e-9 m, joint angles 2.8e-9 rad; bounds
1e-8 m, 1e-7 m, 1e-7 rad). The KKT comparison is two float64 solves of a 7-coordinate problem (measured 2e-14
relative; bound 1e-10).
"""

import numpy as np
import pytest

from ukjax.studies import jansen

THETAS = jansen.REFERENCE_ANGLE + np.array([0.0, 0.9, 2.3, 3.6, 5.1])
LINKS = {  # link -> (point, point) of each holy number
    "m": ("O", "A"), "j": ("A", "C"), "k": ("A", "E"), "b": ("B", "C"), "d": ("B", "D"), "e": ("C", "D"),
    "c": ("B", "E"), "f": ("D", "F"), "g": ("E", "F"), "h": ("F", "G"), "i": ("E", "G"),
}  # fmt: skip


def test_closed_form_keeps_every_link_length_and_the_gait():
    """Every link of the closed-form leg has its holy-number length at 360 crank angles, the frame pivot
    sits at (-a, -l), and the foot path has Jansen's shape: a flat stance (the foot within 1 cm of its lowest
    point for ~40 % of the turn) of about 4.5 crank radii in stride."""
    theta = np.linspace(0.0, 2 * np.pi, 360, endpoint=False)
    points = jansen.linkage_points(theta)
    for link, (start, end) in LINKS.items():
        length = np.linalg.norm(points[end] - points[start], axis=-1)
        np.testing.assert_allclose(length, jansen.UNIT * jansen.HOLY_NUMBERS[link], atol=1e-12, err_msg=link)
    np.testing.assert_allclose(points["B"], np.broadcast_to([-0.38, -0.078], (360, 2)))
    gait = jansen.gait(points["G"])
    assert 0.67 < gait["stride_length_m"] < 0.69 and 0.22 < gait["step_height_m"] < 0.23
    assert 0.35 < gait["stance_fraction_within_1cm"] < 0.5
    assert np.all(points["G"][:, 1] < points["F"][:, 1])  # the foot is the lowest joint


def test_closed_form_names_what_cannot_be_assembled():
    with pytest.raises(ValueError, match="joint C cannot be assembled"):
        jansen.linkage_points(0.0, dict(jansen.HOLY_NUMBERS, j=10.0))
    with pytest.raises(ValueError, match=r"lacks \['m'\]"):
        jansen.linkage_points(0.0, {k: v for k, v in jansen.HOLY_NUMBERS.items() if k != "m"})


@pytest.fixture(scope="module")
def leg():
    pytest.importorskip("mujoco")
    import jax.numpy as jnp

    robot = jansen.load_leg()
    system = jansen.leg_system(robot)
    params = jansen.leg_params(robot, omega=2 * np.pi, alpha=20.0, beta=20.0)
    q0, qd0 = jansen.initial_state(system, params)
    return robot, system, params, q0, qd0, jnp


def test_file_is_the_closed_form_leg(leg):
    """Loaded in one line: 7 hinges, 3 connect loops closed at q = 0; at closed-form coordinates every named
    joint (a site of the file, by ukjax's forward kinematics) is where the circle intersections put it and
    the loops stay closed."""
    import jax

    robot, _, params, _, _, jnp = leg
    assert robot.joint_names == jansen.JOINTS
    loops = robot.equality_constraints()
    assert [c.name for c in loops] == ["loop_C", "loop_E", "loop_F"]
    q = jnp.asarray(jansen.joint_angles(THETAS))
    sites = list(jansen.SITES.items())
    where = jax.jit(
        jax.vmap(
            lambda qi: (
                jnp.stack([robot.point(site)(qi, params) for _, site in sites]),
                jnp.concatenate([c.value(qi, 0.0, params) for c in loops]),
            )
        )
    )
    positions, gaps = where(q)
    closed = jansen.linkage_points(THETAS)
    for k, (label, _) in enumerate(sites):
        np.testing.assert_allclose(positions[:, k, [0, 2]], closed[label], atol=1e-11, err_msg=label)
    np.testing.assert_allclose(positions[:, :, 1], 0.0, atol=1e-15)  # planar
    np.testing.assert_allclose(gaps, 0.0, atol=1e-11)
    np.testing.assert_allclose(jansen.joint_angles(jansen.REFERENCE_ANGLE), 0.0, atol=1e-10)


def test_driven_simulation_follows_the_closed_form(leg):
    """0.1 s of the crank turned at 2π rad/s (10 rows of rank 7 by the default method), 50 RK4 steps of 2 ms
    by ``ukjax.step`` (the step ``simulate(..., dt0=2e-3, solver=ukjax.RK4())`` takes; the study runs
    ``simulate`` itself, which compiles three times longer): the foot and every coordinate follow the closed
    form at the simulated crank angle and the loops stay closed."""
    import jax

    import ukjax

    robot, system, params, q0, qd0, jnp = leg

    def advance(state, _):
        state = ukjax.step(system, state, params, 2e-3, solver=ukjax.RK4())
        loops = jnp.concatenate([c.value(state.q, state.t, params) for c in robot.equality_constraints()])
        return state, (state.q, state.t, robot.point("foot")(state.q, params), loops)

    def run(s):  # the constraint rows at the start and the 50 steps: one compiled program
        rows = system.constraint_equations(s.q, s.qd, 0.0, params)[0]
        return rows, jax.lax.scan(advance, s, None, length=50)[1]

    start = ukjax.State(q0, qd0, jnp.asarray(0.0))
    rows, (q, t, foot, loops) = jax.jit(run)(start)
    rows = np.asarray(rows)
    assert rows.shape == (10, 7) and np.linalg.matrix_rank(rows) == 7
    assert float(jnp.max(jnp.abs(loops))) < 1e-8
    np.testing.assert_allclose(q[:, 0], 2 * np.pi * np.asarray(t), atol=1e-10)
    theta = jansen.REFERENCE_ANGLE + np.asarray(q[:, 0])
    np.testing.assert_allclose(np.asarray(foot)[:, [0, 2]], jansen.linkage_points(theta)["G"], atol=1e-7)
    np.testing.assert_allclose(q, jansen.joint_angles(theta), atol=1e-7)
    assert float(t[-1]) == pytest.approx(0.1) and float(theta[-1] - theta[0]) > 0.5  # it turned


@pytest.fixture(scope="module")
def kkt(leg):
    """The constraint force Aᵀλ, the crank torque (the drive's multiplier) and its forward-mode derivative by
    the foot triangle's mass at the closed-form states THETAS[1:5], with MuJoCo's KKT references: one compiled
    program (vmapped over the states, called at the mass and at mass ± h) serves both tests below."""
    import jax

    _, system, params, _, _, jnp = leg
    omega = float(params["omega"])
    gains = float(params["alpha"]), float(params["beta"])
    refs = [jansen.kkt_reference(a, omega, *gains) for a in THETAS[1:5]]
    q = jnp.asarray(np.stack([r["q"] for r in refs]))
    qd = jnp.asarray(np.stack([r["qd"] for r in refs]))
    t = q[:, 0] / omega

    def torque(m, q_, qd_, t_):
        p = dict(params, mass=params["mass"].at[6].set(m))
        return system.multipliers(q_, qd_, t_, p)[-1][0]

    def everything(m, q_, qd_, t_):
        p = dict(params, mass=params["mass"].at[6].set(m))
        force = system.constraint_force(q_, qd_, t_, p).ideal
        return (force, *jax.jvp(lambda m_: torque(m_, q_, qd_, t_), (m,), (jnp.ones_like(m),)))

    program = jax.jit(jax.vmap(everything, in_axes=(None, 0, 0, 0)))
    mass, h = params["mass"][6], 1e-3
    force, values, derivative = program(mass, q, qd, t)
    central = (program(mass + h, q, qd, t)[1] - program(mass - h, q, qd, t)[1]) / (2 * h)
    return refs, np.asarray(force), np.asarray(values), np.asarray(derivative), np.asarray(central)


def test_constraint_forces_match_a_kkt_solve_from_mujoco(kkt):
    """The constraint force Aᵀλ and the crank torque (the drive's multiplier) at two closed-form states
    against [[M, Aᵀ], [A, 0]] from MuJoCo's mj_fullM, qfrc_bias, mj_jac and mj_jacDot."""
    refs, forces, torques, _, _ = kkt
    for ref, force, torque in zip(refs[:2], forces[:2], torques[:2], strict=True):
        scale = np.max(np.abs(ref["constraint_force"]))
        assert np.max(np.abs(force - ref["constraint_force"])) < 1e-10 * scale
        assert abs(float(torque) - ref["crank_torque"]) < 1e-10 * scale


@pytest.mark.slow
def test_study_meets_its_stated_tolerance(tmp_path, capsys):
    """``ukjax run jansen`` over a quarter turn: the foot within the stated 1e-6 m of the closed form, the
    KKT check to 1e-10, MuJoCo's soft loops open by more than ukjax's exact ones."""
    pytest.importorskip("mujoco")
    from ukjax.cli import main

    assert main(["run", "jansen", "--out", str(tmp_path), "--periods", "0.25", "--kkt-states", "2"]) == 0
    import json

    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "success"
    assert metrics["foot_within_tolerance"] and metrics["max_foot_error_vs_closed_form_m"] < 1e-6
    assert max(row["constraint_force_relative_error"] for row in metrics["kkt_check"]) < 1e-10
    assert metrics["mujoco_soft"]["max_connect_gap_m"] > 100 * metrics["max_constraint_violation_m"]
    assert "foot vs closed form" in capsys.readouterr().out


def test_crank_torque_under_vmap_and_a_derivative(kkt):
    """The crank torque (the drive's multiplier) at two closed-form states in one ``vmap``, with its
    derivative by the foot triangle's mass (forward mode): the values equal the KKT solve's, the derivative a
    central difference of the same function (the torque is affine in the mass at fixed centre of mass and
    inertia, so the difference has no truncation error: bound 1e-8 relative for round-off at step 1e-3 kg).
    The program is the ``kkt`` fixture's (its states THETAS[3:5] here)."""
    refs, _, values, derivative, central = kkt
    values, derivative, central = values[2:], derivative[2:], central[2:]
    np.testing.assert_allclose(values, [r["crank_torque"] for r in refs[2:]], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(derivative, central, rtol=1e-8, atol=1e-10)
    assert np.all(np.abs(central) > 1e-3)  # the foot triangle's weight loads the crank
