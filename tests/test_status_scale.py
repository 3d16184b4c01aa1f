"""The status judges each constraint row on its own scale: no unrelated coordinate, and not the origin, can
turn a visible violation into ``success`` (issue: a 1 m pendulum pivoted at x = 1e6 m reported success 0.5 m
off its circle; a rotor turning at 314 rad/s beside a 2 mm violation did too).

One system, one compiled batch: a pendulum (x, y) on a rod of length L about a pivot (X, 0) with
φ = (x - X)² + y² - L², and a free rotor angle θ that no constraint touches. The Baumgarte gains and the
pivot are per-scenario parameters, so every case below shares one program (tolerances are traced numbers:
changing constraint_atol does not recompile).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from ukjax.constraints import AccelerationLevel, Baumgarte, Holonomic, Nonholonomic
from ukjax.simulation import RESULTS, simulate_batch
from ukjax.system import System

L = 1.0
FAR = 1e6  # the pivot's x in metres
SPIN = 314.0  # rad/s, the rotor's speed (50 Hz)
ANGLE = 0.6  # rad from the downward vertical at the start: the rod has both an x and a y component


def _phi(q, t, p):
    return jnp.stack([(q[0] - p["X"]) ** 2 + q[1] ** 2 - L**2])


PENDULUM_AND_ROTOR = System(
    mass=lambda q, t, p: jnp.diag(jnp.stack([1.0 + 0.0 * q[0], 1.0 + 0.0 * q[0], 0.1 + 0.0 * q[0]])),
    force=lambda q, qd, t, p: jnp.stack([0.0 * q[0], -9.81 + 0.0 * q[0], 0.0 * q[0]]),
    n=3,
    constraints=(Holonomic(_phi, Baumgarte(lambda p: (p["alpha"], p["beta"])), name="rod"),),
    coordinate_names=("x", "y", "theta"),
)

# (pivot X, radial offset of the start in metres, rotor speed, Baumgarte on?)
CASES = {
    "far, 0.5 m off": (FAR, 0.5, 0.0, False),
    "origin, 0.5 m off": (0.0, 0.5, 0.0, False),
    "2 mm off": (0.0, 2e-3, 0.0, False),
    "2 mm off, rotor": (0.0, 2e-3, SPIN, False),
    "far, on the circle, rotor": (FAR, 0.0, SPIN, True),
    "origin, on the circle, rotor": (0.0, 0.0, SPIN, True),
}
ROW = {name: i for i, name in enumerate(CASES)}


def _scenarios():
    q0, qd0, X, gain = [], [], [], []
    for pivot, offset, spin, stabilized in CASES.values():
        r = L + offset
        q0.append([pivot + r * np.sin(ANGLE), -r * np.cos(ANGLE), 0.0])
        qd0.append([0.0, 0.0, spin])
        X.append(pivot)
        gain.append(10.0 if stabilized else 0.0)
    gains = jnp.asarray(gain)
    params = {"X": jnp.asarray(X), "alpha": gains, "beta": gains}
    return jnp.asarray(q0), jnp.asarray(qd0), params


def _run(**options):
    q0, qd0, params = _scenarios()
    return simulate_batch(
        PENDULUM_AND_ROTOR,
        q0,
        qd0,
        params,
        batch_params=True,
        t1=10.0,
        dt0=0.01,
        ts=jnp.linspace(0.0, 10.0, 11),
        chunk_size=None,
        **options,
    )


@pytest.fixture(scope="module")
def default():
    return _run()


def test_a_pendulum_far_from_the_origin_is_judged_as_at_the_origin(default):
    far, near = ROW["far, 0.5 m off"], ROW["origin, 0.5 m off"]
    assert int(default.status[far]) == RESULTS.constraint_violated
    assert int(default.status[near]) == RESULTS.constraint_violated
    # first-order distance |φ| / ‖∇φ‖ = ((1.5)² - 1) / (2 · 1.5) m, over the default 1 µm tolerance (plus the
    # float resolution at 1e6 m, 2.2e-8 m): the same number wherever the pivot is
    # (at the start, before the relative part 1e-6 |q - q0| grows with the swing)
    distance = ((L + 0.5) ** 2 - L**2) / (2 * (L + 0.5))
    assert float(default.position_violation[near, 0]) == pytest.approx(
        distance / 1e-6, rel=1e-7
    )  # + 100 eps |q|
    resolution = 100 * np.finfo(np.float64).eps * FAR
    # there x has the tolerance 1e-6 + resolution and y 1e-6, weighted by the rod's direction (sin, -cos)
    weighted = np.hypot(np.sin(ANGLE) * (1e-6 + resolution), np.cos(ANGLE) * 1e-6)
    assert float(default.position_violation[far, 0]) == pytest.approx(distance / weighted, rel=1e-6)
    # and at every saved time the far pendulum is judged as the near one, up to that float resolution
    np.testing.assert_allclose(default.position_violation[far], default.position_violation[near], rtol=0.03)


def test_an_unrelated_rotor_changes_nothing(default):
    alone, spinning = ROW["2 mm off"], ROW["2 mm off, rotor"]
    assert int(default.status[alone]) == RESULTS.constraint_violated
    assert int(default.status[spinning]) == int(default.status[alone])
    assert float(default.q[spinning, -1, 2]) == pytest.approx(SPIN * 10.0)  # the rotor did turn, 3140 rad
    np.testing.assert_array_equal(default.position_violation[spinning], default.position_violation[alone])
    np.testing.assert_array_equal(default.velocity_violation[spinning], default.velocity_violation[alone])


def test_no_false_alarm_far_away_or_beside_a_fast_rotor(default):
    for case in ("far, on the circle, rotor", "origin, on the circle, rotor"):
        assert int(default.status[ROW[case]]) == RESULTS.success, case
        assert float(default.position_violation[ROW[case]].max()) < 1e-2, case  # far inside the tolerance


def test_users_state_the_tolerance_in_coordinate_units(default):
    # 1 m in x and y: 0.42 m off the circle is then within tolerance, 2 mm certainly
    loose = _run(constraint_atol={"x": 1.0, "y": 1.0})
    assert all(int(s) == RESULTS.success for s in loose.status)
    # the same as an (n,) array; the rotor's own tolerance does not matter (the rod does not touch θ)
    same = _run(constraint_atol=jnp.asarray([1.0, 1.0, 1e-12]))
    np.testing.assert_allclose(same.position_violation, loose.position_violation, rtol=1e-12)
    with pytest.raises(
        ValueError, match=r"constraint_atol names coordinates \['z'\] that the system does not"
    ):
        _run(constraint_atol={"x": 1.0, "z": 1.0})
    # a scalar: 1 mm everywhere flags the 2 mm start, 1 cm does not
    assert int(_run(constraint_atol=1e-3).status[ROW["2 mm off"]]) == RESULTS.constraint_violated
    assert int(_run(constraint_atol=1e-2).status[ROW["2 mm off"]]) == RESULTS.success


# ---------------------------------------------------------------- systems with no position residuals at all
def _free_pair(constraint):
    return System(
        mass=lambda q, t, p: jnp.eye(2),
        force=lambda q, qd, t, p: jnp.stack([0.0 * q[0], -9.81 + 0.0 * q[0]]),
        n=2,
        constraints=(constraint,),
    )


ACCELERATION_ONLY = _free_pair(
    AccelerationLevel(
        A=lambda q, qd, t, p: jnp.ones((1, 2)), b=lambda q, qd, t, p: jnp.zeros(1), name="sum_fixed"
    )
)
NONHOLONOMIC_ONLY = _free_pair(
    Nonholonomic(lambda q, qd, t, p: jnp.stack([qd[0] - qd[1]]), name="equal_speeds")
)


@pytest.mark.parametrize(
    "system", [ACCELERATION_ONLY, NONHOLONOMIC_ONLY], ids=["acceleration", "nonholonomic"]
)
def test_a_batch_larger_than_its_chunk_without_position_residuals(system):
    # Zero-size residual arrays (T, 0) went through a reshape with -1 in the chunking: ZeroDivisionError for
    # any batch larger than the chunk (257 scenarios and up with the default chunk of 256 on CPU).
    batch = 5  # 3 chunks of 2, one padded scenario
    q0 = jnp.stack([jnp.arange(batch, dtype=jnp.float64), jnp.zeros(batch)], axis=1)
    qd0 = jnp.ones((batch, 2)) * jnp.arange(1.0, batch + 1.0)[:, None]
    # Euler: the chunking (and its zero-size arrays) is the same for every solver, and Euler's programs
    # compile in ~0.7x the CPU time of the default Tsit5's (measured 3.9 + 3.4 against 6.5 + 4.8 CPU-s for
    # the chunked and the whole batch); the comparison chunked = whole is still exact.
    options = dict(t1=0.2, dt0=0.05, ts=jnp.linspace(0.0, 0.2, 3), solver="Euler")
    chunked = simulate_batch(system, q0, qd0, {}, chunk_size=2, **options)
    whole = simulate_batch(system, q0, qd0, {}, chunk_size=None, **options)
    assert chunked.position_residual.shape == (batch, 3, 0)
    assert chunked.status.shape == (batch,) and all(int(s) == RESULTS.success for s in chunked.status)
    np.testing.assert_array_equal(chunked.q, whole.q)
    np.testing.assert_array_equal(chunked.velocity_violation, whole.velocity_violation)
    assert chunked.velocity_residual.shape == whole.velocity_residual.shape
