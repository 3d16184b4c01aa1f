"""Joint ranges of robot files: read in the right units, carried by the System, and a trajectory that leaves
them flagged with the joint's name, the time it left and by how much (issue 39).

The flagged crossing time and excess are checked against an independent computation: a pendulum without
damping, whose crossing time is the quadrature t = ∫ dθ / θ̇(θ) with θ̇² = ω₀² - 2k(1 - cos θ) from energy
conservation, and whose amplitude is cos θ_max = 1 - ω₀² / (2k).
"""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad

import ukjax
from ukjax import diagnostics

robots = pytest.importorskip("ukjax.robots")
pytest.importorskip("mujoco")

LIMIT_DEG = 30.0
LIMIT = np.radians(LIMIT_DEG)
MASS, LENGTH, IYY, G = 1.0, 0.5, 1e-3, 9.81
K = MASS * G * LENGTH / (MASS * LENGTH**2 + IYY)  # θ̈ = -K sin θ

PENDULUM = f"""
<mujoco model="pendulum">
  <worldbody>
    <body name="bob">
      <joint name="swing" type="hinge" axis="0 1 0" range="-{LIMIT_DEG} {LIMIT_DEG}"/>
      <inertial pos="0 0 -{LENGTH}" mass="{MASS}" diaginertia="{IYY} {IYY} {IYY}"/>
    </body>
  </worldbody>
</mujoco>
"""


# ---------------------------------------------------------------------------------------------- units
def test_mjcf_ranges_in_degrees_by_default_and_radians_when_stated():
    mjcf = """
    <mujoco model="units">
      <compiler angle="{angle}"/>
      <worldbody>
        <body name="a">
          <joint name="hinge" type="hinge" axis="0 0 1" range="{hinge}"/>
          <geom size="0.1" mass="1"/>
          <body name="b" pos="0.3 0 0">
            <joint name="slide" type="slide" axis="1 0 0" range="0 0.2"/>
            <geom size="0.1" mass="1"/>
            <body name="c" pos="0.3 0 0">
              <joint name="free_turn" type="hinge" axis="0 0 1" limited="false" range="-10 10"/>
              <geom size="0.1" mass="1"/>
            </body>
          </body>
        </body>
      </worldbody>
    </mujoco>
    """
    degrees = robots.load(mjcf.format(angle="degree", hinge="-30 30"))
    np.testing.assert_allclose(degrees.joint_range[0], [-0.5235987755982988, 0.5235987755982988], rtol=1e-15)
    assert degrees.joint_range[1] == (0.0, 0.2)  # a slide's range is a length: never converted
    assert degrees.joint_range[2] == (-np.inf, np.inf)  # limited="false": the range is ignored
    assert [r[:2] for r in degrees.coordinate_ranges] == [(0, "hinge"), (1, "slide")]
    assert degrees.system().coordinate_ranges == degrees.coordinate_ranges
    radians = robots.load(mjcf.format(angle="radian", hinge="-0.5 0.5"))
    assert radians.joint_range[0] == (-0.5, 0.5)


def test_urdf_limits_in_radians_and_metres():
    inertial = (
        '<inertial><mass value="1"/><inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial>'
    )
    urdf = f"""
    <robot name="limits">
      <link name="base"/>
      <joint name="spin" type="continuous"><parent link="base"/><child link="a"/><axis xyz="0 0 1"/></joint>
      <link name="a">{inertial}</link>
      <joint name="elbow" type="revolute"><parent link="a"/><child link="b"/><axis xyz="0 1 0"/>
        <limit lower="-0.5" upper="0.7" effort="1" velocity="1"/></joint>
      <link name="b">{inertial}</link>
      <joint name="rail" type="prismatic"><parent link="b"/><child link="c"/><axis xyz="1 0 0"/>
        <limit lower="0" upper="0.25" effort="1" velocity="1"/></joint>
      <link name="c">{inertial}</link>
    </robot>
    """
    robot = robots.load(urdf)
    assert robot.joint_names == ("spin", "elbow", "rail")
    assert robot.joint_range == ((-np.inf, np.inf), (-0.5, 0.7), (0.0, 0.25))  # URDF angles are radians
    assert robot.coordinate_ranges == ((1, "elbow", -0.5, 0.7), (2, "rail", 0.0, 0.25))


def test_ranges_index_q_past_ball_joints():
    """A ball joint's 4 quaternion numbers come before a later hinge's q entry; its own range is left out."""
    robot = robots.load(
        """
        <mujoco model="ball_then_hinge">
          <worldbody>
            <body name="a"><joint name="ball" type="ball" range="0 45"/><geom size="0.1" mass="1"/>
              <body name="b" pos="0.3 0 0"><joint name="hinge" type="hinge" range="-45 45"/>
                <geom size="0.1" mass="1"/></body>
            </body>
          </worldbody>
        </mujoco>
        """
    )
    assert robot.coordinate_ranges == ((4, "hinge", -np.pi / 4, np.pi / 4),)


def test_compose_keeps_each_systems_ranges_at_its_place():
    pendulum = robots.load(PENDULUM).system()
    two = ukjax.compose({"left": pendulum, "right": pendulum})
    assert two.coordinate_ranges == ((0, "left.swing", -LIMIT, LIMIT), (1, "right.swing", -LIMIT, LIMIT))


def test_system_refuses_a_range_outside_q():
    system = robots.load(PENDULUM).system()
    with pytest.raises(ValueError, match="coordinate range 'x'"):
        dataclasses.replace(system, coordinate_ranges=((1, "x", -1.0, 1.0),))  # q has one number
    with pytest.raises(ValueError, match="coordinate range 'y'"):
        dataclasses.replace(system, coordinate_ranges=((0, "y", 1.0, -1.0),))  # lower > upper


# ---------------------------------------------------------------------------------------------- flagging
def _crossing_time(omega0, limit):
    """Time for the undamped pendulum started at θ = 0 with θ̇ = ω₀ to reach |θ| = limit (quadrature of
    dθ / θ̇, θ̇ from energy conservation)."""
    return quad(lambda th: 1.0 / np.sqrt(omega0**2 - 2 * K * (1 - np.cos(th))), 0.0, limit)[0]


@pytest.fixture(scope="module")
def swings():
    """One batch of three swings from the bottom: through the upper limit, inside the range, through the
    lower limit; saved every 5 ms for 0.5 s."""
    robot = robots.load(PENDULUM)
    ts = jnp.linspace(0.0, 0.5, 101)
    sol = ukjax.simulate_batch(
        robot.system(), jnp.zeros((3, 1)), jnp.array([[3.0], [2.0], [-3.0]]), robot.params, t1=0.5, ts=ts
    )
    assert np.all(np.asarray(sol.ok))
    return robot, sol


def test_a_swing_through_its_limit_is_flagged_with_name_time_and_excess(swings):
    robot, batch = swings
    single = jax.tree_util.tree_map(lambda x: x[0], batch)  # q (T, 1): a single solution
    assert single.q.shape == (101, 1)
    (violation,) = robot.joint_range_violations(single)
    assert violation.name == "swing" and violation.coordinate == 0 and violation.scenario is None
    assert violation.bound == "upper" and violation.limit == pytest.approx(LIMIT, rel=1e-15)
    expected = _crossing_time(3.0, LIMIT)  # ≈ 0.202 s
    assert abs(violation.time - expected) < 5e-5  # linear interpolation between saves 5 ms apart
    ts = np.asarray(single.ts)
    assert np.min(np.abs(ts - expected)) > 5e-4  # so the saved time itself would fail the check above
    amplitude = np.arccos(1 - 3.0**2 / (2 * K))
    assert violation.excess == pytest.approx(amplitude - LIMIT, abs=1e-4)  # ≈ 0.17 rad
    assert "'swing'" in violation.describe() and "upper limit 0.5236" in violation.describe()


def test_a_batch_names_its_scenarios_and_a_swing_inside_is_not_flagged(swings):
    robot, batch = swings
    violations = robot.joint_range_violations(batch)
    assert [(v.scenario, v.bound) for v in violations] == [(0, "upper"), (2, "lower")]
    assert violations[1].limit == pytest.approx(-LIMIT, rel=1e-15)
    assert violations[0].time == pytest.approx(violations[1].time, abs=1e-9)  # mirror images
    assert diagnostics.range_violations(batch, robot.system()) == violations  # the System carries the ranges
    inside = jax.tree_util.tree_map(lambda x: x[1], batch)
    assert np.max(np.abs(np.asarray(inside.q))) < LIMIT  # amplitude 0.457 rad < 0.524 rad
    assert robot.joint_range_violations(inside) == []
    excess = jax.jit(jax.vmap(lambda q: diagnostics.range_excess(q, robot.coordinate_ranges)))(batch.q)
    np.testing.assert_allclose(
        np.asarray(excess)[:, 0], [violations[0].excess, 0.0, violations[1].excess], rtol=1e-15
    )


def test_what_a_robot_study_records_and_prints(swings, tmp_path):
    """metrics.json's ``joint_ranges`` and the printed warning of ``ukjax run jansen``, ``ukjax tune ur5``."""
    from ukjax.studies._common import joint_range_lines, joint_range_record, write_json

    robot, batch = swings
    write_json(tmp_path / "metrics.json", joint_range_record(robot, batch))
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["stated"] == {"swing": [-LIMIT, LIMIT]} and record["enforced"] is False
    assert [(v["name"], v["scenario"], v["bound"]) for v in record["violations"]] == [
        ("swing", 0, "upper"),
        ("swing", 2, "lower"),
    ]
    warning, first, second = joint_range_lines(record, "held-out")
    assert warning.startswith("  WARNING joint ranges (held-out): 2 joint-range violation(s)")
    assert first.strip() == robot.joint_range_violations(batch)[0].describe()
    assert "scenario 2: joint 'swing' (q[0]) left its range through its lower limit -0.5236" in second
    inside = joint_range_record(robot, jax.tree_util.tree_map(lambda x: x[1], batch))
    assert joint_range_lines(inside) == ["  joint ranges: held at every saved time (1 stated; not enforced)"]
    free = robots.load(PENDULUM.replace(f' range="-{LIMIT_DEG} {LIMIT_DEG}"', ""))
    assert joint_range_lines(joint_range_record(free, batch)) == ["  joint ranges: none stated in the file"]


def test_start_outside_and_failed_samples():
    """A coordinate outside its range at the first saved time left it at ts[0]; non-finite values (saved
    times after a failure) are skipped, not flagged."""
    ranges = ((0, "a", -1.0, 1.0), (1, "b", 0.0, 2.0))
    q = np.array([[1.5, 1.0], [1.2, np.inf], [0.5, np.nan]])
    sol = types.SimpleNamespace(ts=np.array([0.0, 0.1, 0.2]), q=q)
    (violation,) = diagnostics.range_violations(sol, ranges)
    assert (violation.name, violation.time, violation.excess, violation.excess_time) == ("a", 0.0, 0.5, 0.0)
    np.testing.assert_allclose(diagnostics.range_excess(q, ranges), [0.5, 0.0])


# ---------------------------------------------------------------------------------------------- sweep report
def limited_pendulum():
    """A sweep model (``module:function``): the pendulum from the bottom at 2.5 rad/s (speeds swept)."""
    robot = robots.load(PENDULUM)
    return robot.system(), robot.params, jnp.zeros(1), jnp.array([2.5])


PENDULUM_RANGES = robots.load(PENDULUM).coordinate_ranges  # read once, outside any traced function


def range_excess_metric(solution, params):
    """A sweep user metric whose columns ``joint_range_excess.NAME`` are what the report reads."""
    excess = diagnostics.range_excess(solution.q, PENDULUM_RANGES)
    return {name: excess[k] for k, (_, name, _, _) in enumerate(PENDULUM_RANGES)}


def test_sweep_report_counts_the_scenarios_that_left_a_range(tmp_path, capsys):
    from ukjax import sweep

    spec = {
        "name": "limited_pendulum",
        "model": "test_joint_limits:limited_pendulum",
        "scenarios": 1,
        "chunk_size": 8,
        "seed": 0,
        "integrator": {"t1": 0.5, "num_saves": 51},
        "vary": {"qd0[0]": {"dist": "grid", "values": [-3.0, 2.0, 2.2, 2.5, 3.0]}},
        "metrics": {"user": {"joint_range_excess": "test_joint_limits:range_excess_metric"}},
    }
    sweep.run(spec, out=tmp_path, devices=1, progress=False)
    result = sweep.report(tmp_path)
    table = sweep.load(tmp_path)
    speed, index = np.asarray(table.column("qd0[0]")), np.asarray(table.column("index"))
    crossing = np.sqrt(2 * K * (1 - np.cos(LIMIT)))  # ≈ 2.29 rad/s: slower swings stay inside
    ranges = result["joint_ranges"]
    assert ranges["scenarios_checked"] == 5 and ranges["scenarios_outside"] == 3
    assert ranges["by_coordinate"]["swing"]["indices"] == sorted(index[np.abs(speed) > crossing].tolist())
    amplitude = np.arccos(1 - 3.0**2 / (2 * K))
    assert ranges["by_coordinate"]["swing"]["max_excess"] == pytest.approx(amplitude - LIMIT, abs=1e-3)
    printed = capsys.readouterr().out
    assert "WARNING joint ranges: 3 of 5 completed scenarios" in printed and "swing: 3 scenarios" in printed
    assert not any("joint_range" in figure for figure in result["figures"])  # its own section, not a figure
