"""A status that means the constraints held, bad input refused before compiling, clean error messages.

Each case here is one a user met: before this module's fixes, the contradictory constraints and the too-long
steps ended with status success, and the bad arguments were accepted or failed deep inside JAX.
Compile budget: two tiny systems (n = 1 and a circle in the plane), fixed steps, short spans.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.simulation import RESULTS, SimulationError, simulate, simulate_batch
from ukjax.system import System

f64 = lambda x: jnp.asarray(x, dtype=jnp.float64)


def _line(*constraints):
    return System(mass=lambda q, t, p: p["m"] * jnp.eye(1), force=lambda q, qd, t, p: jnp.zeros(1), n=1,
                  constraints=constraints)


# x = c + v t and x = -(c + v t): contradictory for c = 1, v = 0 (x = 1 and x = -1), moving apart for c = 0,
# v = 1 (x = t and x = -t). One system with c and v as parameters: both cases share one compiled program.
TWO_TARGETS = _line(Holonomic(lambda q, t, p: q - (p["c"] + p["v"] * t), name="x_is_target"),
                    Holonomic(lambda q, t, p: q + (p["c"] + p["v"] * t), name="x_is_minus_target"))
CONTRADICTORY = {"m": f64(1.0), "c": f64(1.0), "v": f64(0.0)}
MOVING_APART = {"m": f64(1.0), "c": f64(0.0), "v": f64(1.0)}
CIRCLE = System(
    mass=lambda q, t, p: p["m"] * jnp.eye(2),
    force=lambda q, qd, t, p: jnp.stack([0.0 * q[0], -p["m"] * 9.81]),
    n=2,
    constraints=(Holonomic(lambda q, t, p: jnp.stack([q @ q - 1.0]), name="circle"),),
)
P = {"m": f64(1.0)}


def test_contradictory_constraints_are_not_success():
    # x = 1 and x = -1 without stabilization: A q̈ = b is consistent (b = 0) but φ = (0, 2) throughout.
    sol = simulate(TWO_TARGETS, f64([1.0]), f64([0.0]), CONTRADICTORY, t1=1.0, dt=0.1)
    assert int(sol.status) == RESULTS.constraint_violated and not bool(sol.ok)
    # x = 1 is 2 m from x = -1: the violation is that distance in units of the default 1 µm tolerance
    assert float(sol.position_violation[-1]) == pytest.approx(2.0 / 1e-6, rel=1e-7)
    with pytest.raises(SimulationError, match="the constraints did not hold"):
        simulate(TWO_TARGETS, f64([1.0]), f64([0.0]), CONTRADICTORY, t1=1.0, dt=0.1, throw=True)
    # x = t and x = -t: both hold at t = 0 only, then drift apart
    sol = simulate(TWO_TARGETS, f64([0.0]), f64([0.0]), MOVING_APART, t1=1.0, dt=0.1)
    assert int(sol.status) == RESULTS.constraint_violated


STABILIZED = _line(Holonomic(lambda q, t, p: q, name="at_zero",
                             baumgarte=Baumgarte(gains=lambda p: (20.0, 20.0))))


def test_a_start_off_the_constraints_is_judged_by_where_it_ends():
    """x = 0 with critically damped Baumgarte gains (α = β = 20/s), started at x = 0.1 at rest: the velocity
    residual grows from 0 to ~0.7 during the pull-back (it used to make the run 'constraint_violated'), and φ
    ends at ~1e-15 by t = 2 s, so the run succeeds; stopped at t = 0.1 s, still 0.04 off, it is violated."""
    settled = simulate(STABILIZED, f64([0.1]), f64([0.0]), P, t1=2.0, dt=0.01)
    # (violations are in units of the tolerance, 1e-6 m and 1e-6 m/s: 0.7 m/s is ~4e5 of it, 1e-11 m is 1e-5)
    assert float(settled.velocity_violation.max()) > 1e5 and float(settled.position_violation[-1]) < 1e-4
    assert int(settled.status) == RESULTS.success
    # (max_steps given: t1 and dt are numbers of the settled run's compiled program, 10 of its 201 steps)
    early = simulate(STABILIZED, f64([0.1]), f64([0.0]), P, t1=0.1, dt=0.01, max_steps=201)
    assert int(early.status) == RESULTS.constraint_violated


def test_steps_too_long_for_the_constraint_are_flagged_and_a_good_run_succeeds():
    q0, qd0 = f64([1.0, 0.0]), f64([0.0, 0.0])
    good = simulate(CIRCLE, q0, qd0, P, t1=1.0, dt=0.01)
    assert int(good.status) == RESULTS.success and float(good.position_violation.max()) < 1e-3  # < 1 nm
    # dt = 0.3 without stabilization: |φ| reaches 0.04-3 (as a user reported), no longer "success"
    # (max_steps given: t1 and dt are numbers of the good run's compiled program, 4 of its 101 steps)
    coarse = simulate(CIRCLE, q0, qd0, P, t1=1.2, dt=0.3, max_steps=101)
    assert int(coarse.status) in (RESULTS.constraint_violated, RESULTS.nonfinite_state)
    # the tolerance is the user's: a loose one accepts the coarse run
    loose = simulate(CIRCLE, q0, qd0, P, t1=1.2, dt=0.3, constraint_rtol=10.0, max_steps=101)
    assert int(loose.status) == RESULTS.success


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dt=10.0), r"dt = 10.0 is not smaller than the span"),
        (dict(dt=-0.1), "dt must be positive"),
        (dict(dt=0.0), "dt must be positive"),
        (dict(rtol=-1.0), "rtol must be positive"),
        (dict(rtol=float("nan")), "rtol must be finite"),
        (dict(atol=0.0), "atol must be positive"),
        (dict(t1=float("inf")), "t1 must be finite"),
        (dict(t0=float("nan")), "t0 must be finite"),
        (dict(pinv_rtol=-1.0), "pinv_rtol must be positive"),
        (dict(constraint_rtol=float("nan")), "constraint_rtol must be finite"),
        (dict(ts=jnp.array([0.0, jnp.nan])), "ts must be finite"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(kwargs, match):
    options = dict(t1=1.0) | kwargs
    with pytest.raises(ValueError, match=match):
        simulate(CIRCLE, f64([1.0, 0.0]), f64([0.0, 0.0]), P, **options)


def test_bad_states_and_parameters_are_refused_naming_them():
    q0, qd0 = f64([1.0, 0.0]), f64([0.0, 0.0])
    with pytest.raises(ValueError, match="q0 must be real"):
        simulate(CIRCLE, q0.astype(jnp.complex128), qd0, P, t1=1.0)
    with pytest.raises(ValueError, match="parameter params\\['m'\\] is complex"):
        simulate(CIRCLE, q0, qd0, {"m": jnp.asarray(1.0 + 0j)}, t1=1.0)
    with pytest.raises(ValueError, match="the batch is empty"):
        simulate_batch(CIRCLE, jnp.zeros((0, 2)), jnp.zeros((0, 2)), P, t1=1.0)
    with pytest.raises(ValueError, match="mass matrix is not positive definite"):
        simulate(CIRCLE, q0, qd0, {"m": f64(-1.0)}, t1=1.0)
    skew = System(mass=lambda q, t, p: jnp.array([[1.0, 0.5], [0.0, 1.0]]),
                  force=lambda q, qd, t, p: jnp.zeros(2), n=2)
    with pytest.raises(ValueError, match="mass matrix is not symmetric"):
        simulate(skew, q0, qd0, {}, t1=1.0)


def test_model_functions_are_named_when_they_fail():
    q0, qd0 = f64([1.0, 0.0]), f64([0.0, 0.0])
    gains = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
    stabilized = System(mass=CIRCLE.mass, force=CIRCLE.force, n=2,
                        constraints=(Holonomic(lambda q, t, p: jnp.stack([q @ q - 1.0]), gains, name="rod"),))
    with pytest.raises(ValueError, match=r"constraint 'rod' \(Holonomic\): the parameter pytree has no "
                       r"entry 'alpha'"):
        simulate(stabilized, q0, qd0, P, t1=1.0)
    wrong_signature = System(mass=CIRCLE.mass, force=CIRCLE.force, n=2,
                             constraints=(Holonomic(lambda q: q @ q - 1.0, name="rod"),))
    with pytest.raises(ValueError, match=r"constraint 'rod' \(Holonomic\) could not be called as "
                       r"phi\(q, t, p\)"):
        simulate(wrong_signature, q0, qd0, P, t1=1.0)
    with pytest.raises(ValueError, match=r"mass: the parameter pytree has no entry 'm'"):
        simulate(CIRCLE, q0, qd0, {}, t1=1.0)


def test_poisoned_scenarios_are_flagged_and_the_healthy_ones_unchanged():
    q0s = jnp.tile(f64([1.0, 0.0]), (4, 1))
    qd0s = jnp.zeros((4, 2))
    masses = f64([1.0, np.nan, -1.0, 2.0])  # NaN, and a negative mass (M not positive definite)
    with pytest.warns(UserWarning, match=r"params\['m'\] is NaN or infinite in scenarios \[1\]"):
        batch = simulate_batch(CIRCLE, q0s, qd0s, {"m": masses}, batch_params=True, t1=1.0, dt=0.01)
    assert [int(s) for s in batch.status] == [RESULTS.success, RESULTS.nonfinite_state,
                                              RESULTS.nonfinite_state, RESULTS.success]
    for k in (0, 3):
        alone = simulate(CIRCLE, q0s[k], qd0s[k], {"m": masses[k]}, t1=1.0, dt=0.01)
        # batched and single programs are compiled separately: they may differ in the last bits only
        np.testing.assert_allclose(np.asarray(batch.q[k]), np.asarray(alone.q), rtol=1e-12, atol=1e-14)


def test_check_true_reports_the_message_not_an_internal_callback_error():
    Q, A, b = jnp.ones(2), jnp.ones((1, 2)), jnp.ones(1)
    for M, match in [
        (jnp.array([[1.0, 2.0], [0.0, 1.0]]), "M is not symmetric"),
        (-jnp.eye(2), "M is not positive definite"),
        (jnp.eye(2).at[0, 0].set(jnp.nan), "NaN or inf"),
    ]:
        with pytest.raises(ValueError, match=match):
            ukjax.uk_acceleration(M, Q, A, b, check=True)
    with pytest.raises(ValueError, match="kkt_acceleration: the mass matrix M is not symmetric"):
        ukjax.kkt_acceleration(jnp.array([[1.0, 2.0], [0.0, 1.0]]), Q, A, b, check=True)


def test_no_runtime_callbacks_unless_throw():
    q0, qd0 = f64([1.0, 0.0]), f64([0.0, 0.0])
    plain = jax.jit(lambda q: simulate(CIRCLE, q, qd0, P, t1=1.0, dt=0.01).q).lower(q0).as_text()
    assert "callback" not in plain
    thrown = jax.jit(lambda q: simulate(CIRCLE, q, qd0, P, t1=1.0, dt=0.01, throw=True).q).lower(q0).as_text()
    assert "callback" in thrown


def test_invalid_rank_tolerance_is_refused_by_every_uk_form():
    M, Q, A, b = jnp.eye(2), jnp.ones(2), jnp.ones((1, 2)), jnp.ones(1)
    for rtol in (-1.0, float("nan")):
        for call in (
            lambda r: ukjax.uk_acceleration(M, Q, A, b, rtol=r),
            lambda r: ukjax.uk_acceleration(M, Q, A, b, method="greville", rtol=r),
            lambda r: ukjax.kkt_acceleration(M, Q, A, b, rtol=r),
            lambda r: ukjax.recursive_uk_acceleration(M, Q, [(A, b)], rtol=r),
        ):
            with pytest.raises(ValueError, match="rtol must be a real finite number"):
                call(rtol)
