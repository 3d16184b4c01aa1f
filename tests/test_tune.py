"""ukjax.tune: gradients against central finite differences, masking of failed scenarios, parametrization,
risk measures, divergence back-off, resume from a checkpoint, determinism, the stability bounds, the CLI.

Everything runs on the two-mass spring of Liu et al. 2015 §IV (n = 2, one actuator): a few scenarios over a
short span, so that the compiled programs are small. Module-level objects (system, space, objective, options)
are shared so that jit caches are reused across tests.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers import assert_tree_allclose
from ukjax import tune
from ukjax.models import two_mass_spring as tms

SYSTEM = tms.system()
BASE = tms.default_params()
SPACE = tune.Parametrization(BASE, {"alpha": tune.log(), "beta": tune.log(lower=1.0, upper=30.0)})
OBJECTIVE = tune.servo_tracking() + 1e-3 * tune.control_effort() + 1e-2 * tune.peak_control()
FIXED = tune.simulation_options(t1=1.0, dt=0.01, num_saves=51)
ADAPTIVE = tune.simulation_options(t1=0.5, num_saves=11, rtol=1e-11, atol=1e-11)


def _batch(offsets, m1=None):
    """Scenarios starting off the servo constraint x2 - x1 = 2l by ``offsets``, with per-scenario parameters
    (m1 as given, else the default), so that every batch of one size shares one compiled program."""
    offsets = jnp.asarray(offsets)
    q0 = jnp.stack([jnp.zeros_like(offsets), 2.0 * BASE["l"] + offsets], axis=1)
    qd0 = jnp.zeros_like(q0).at[:, 1].set(0.3)
    params = {k: jnp.broadcast_to(v, (offsets.shape[0], *jnp.shape(v))) for k, v in BASE.items()}
    if m1 is not None:
        params["m1"] = jnp.asarray(m1)
    return tune.Scenarios(q0, qd0, params)


BATCH = _batch([0.2, -0.1, 0.05])
_COMPILED = {}


def _value_and_grad(options):
    """One jitted value-and-gradient per options (Mean risk, failure penalty 0.5), shared by the tests; the
    finite differences use its value too, so that no second program is compiled."""
    if id(options) not in _COMPILED:
        _COMPILED[id(options)] = jax.jit(
            lambda th, b: tune.batch_value_and_grad(
                SYSTEM, SPACE, th, b, OBJECTIVE, options=options, failure_penalty=0.5
            )
        )
    return _COMPILED[id(options)]


def _loss(theta, batch, options):
    return float(_value_and_grad(options)(theta, batch)[0])


@pytest.mark.parametrize("options", [FIXED, ADAPTIVE], ids=["fixed_step", "adaptive"])
def test_gradient_matches_central_differences(options):
    # Central differences in θ (log-gains) with h = 1e-5: truncation O(h²) ~ 1e-10 relative, round-off
    # ~1e-16 / 1e-5 = 1e-11 relative for the fixed step. The adaptive run's step sequence depends on θ, which
    # adds O(rtol / h) = 1e-6 noise; tolerance 1e-7 (fixed) and 1e-5 (adaptive) relative to the gradient norm.
    theta = SPACE.init()
    theta = {"alpha": theta["alpha"] + 0.1, "beta": theta["beta"] - 0.2}
    loss, info, grad = _value_and_grad(options)(theta, BATCH)
    assert int(info["failures"]) == 0
    h = 1e-5
    fd = {}
    for name in SPACE.names:
        plus = dict(theta, **{name: theta[name] + h})
        minus = dict(theta, **{name: theta[name] - h})
        fd[name] = (_loss(plus, BATCH, options) - _loss(minus, BATCH, options)) / (2 * h)
    norm = np.linalg.norm([fd[n] for n in SPACE.names])
    tol = 1e-7 if options is FIXED else 1e-5
    for name in SPACE.names:
        assert abs(float(grad[name]) - fd[name]) <= tol * norm, (name, float(grad[name]), fd[name])
    assert np.isclose(float(loss), _loss(theta, BATCH, options), rtol=1e-14)


def test_forward_and_reverse_mode_give_the_same_gradient_and_auto_picks_by_size():
    # The default for two tuned numbers is forward mode (the finite-difference test above checks it); reverse
    # mode (jax.vjp through RecursiveCheckpointAdjoint) computes the same derivative of the same discrete
    # solution by another route, so the two agree to rounding accumulated over 100 steps: 1e-12 relative.
    theta = SPACE.init()
    theta = {"alpha": theta["alpha"] + 0.1, "beta": theta["beta"] - 0.2}
    assert tune.resolve_gradient_mode("auto", theta) == "forward"
    many = {"k": jnp.zeros(tune.FORWARD_MODE_MAX_PARAMETERS + 1)}
    assert tune.resolve_gradient_mode("auto", many) == "reverse"
    with pytest.raises(ValueError, match="gradient_mode must be one of"):
        tune.resolve_gradient_mode("backward", theta)
    forward = _value_and_grad(FIXED)(theta, BATCH)
    reverse = jax.jit(
        lambda th, b: tune.batch_value_and_grad(
            SYSTEM, SPACE, th, b, OBJECTIVE, options=FIXED, failure_penalty=0.5, gradient_mode="reverse"
        )
    )(theta, BATCH)
    assert float(forward[0]) == float(reverse[0])
    assert_tree_allclose(forward[2], reverse[2], rtol=1e-12, atol=0.0)


def test_failed_scenario_is_masked_counted_and_does_not_poison_the_gradient():
    # A NaN mass in one scenario makes it fail (status nonfinite_state). The loss and gradient must equal
    # those of the batch without it, to rounding; the failure is counted and penalized only if asked.
    theta = SPACE.init()
    m1 = float(BASE["m1"])
    with_failure = _batch([0.2, 0.1, -0.1], m1=[m1, float("nan"), m1 * 1.1])
    loss, info, grad = _value_and_grad(FIXED)(theta, with_failure)
    # reference: the mean over the two good scenarios, each evaluated alone (as a batch of three copies, so
    # that the same compiled program serves)
    first = _value_and_grad(FIXED)(theta, _batch([0.2] * 3, m1=[m1] * 3))
    third = _value_and_grad(FIXED)(theta, _batch([-0.1] * 3, m1=[m1 * 1.1] * 3))
    ref_loss = 0.5 * (first[0] + third[0])
    ref_grad = jax.tree_util.tree_map(lambda a, b: 0.5 * (a + b), first[2], third[2])
    assert int(info["failures"]) == 1 and int(first[1]["failures"]) == int(third[1]["failures"]) == 0
    assert np.asarray(info["status"])[1] != 0
    assert np.isfinite(float(loss))
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-13)
    # the reported loss adds the penalty 0.5 per failed fraction; the gradient does not see it
    np.testing.assert_allclose(float(info["loss"]), float(ref_loss) + 0.5 / 3, rtol=1e-13)
    assert_tree_allclose(grad, ref_grad, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("risk", [tune.Mean(), tune.CVaR(0.5), tune.SmoothWorst(5.0)], ids=str)
def test_risk_measures_ignore_failed_entries_in_value_and_gradient(risk):
    # The failed entry holds NaN: the value equals that of the successful entries alone, and its weight
    # in the gradient (∂risk/∂L_i) is exactly zero, so the pullback's 0 · NaN never reaches the sum.
    losses = jnp.asarray([3.0, jnp.nan, 7.0, 2.0])
    ok = jnp.asarray([True, False, True, True])
    value_and_weights = jax.jit(jax.value_and_grad(risk))  # one program per shape (4 and 3 entries)
    value, weights = value_and_weights(losses, ok)
    ref_value, ref_weights = value_and_weights(losses[np.asarray(ok)], jnp.ones(3, bool))
    assert float(value) == pytest.approx(float(ref_value), rel=1e-14)
    assert float(weights[1]) == 0.0
    np.testing.assert_allclose(np.asarray(weights)[np.asarray(ok)], np.asarray(ref_weights), rtol=1e-14)


def test_risk_measures_against_numpy():
    losses = jnp.asarray([3.0, 1.0, np.nan, 7.0, 2.0, 5.0])
    ok = jnp.asarray([True, True, False, True, True, True])
    good = np.array([3.0, 1.0, 7.0, 2.0, 5.0])
    v = jnp.asarray([0.5, 2.0, 1.0, 1.9])

    @jax.jit
    def values(losses, ok, v):  # every value below in one compiled call
        return dict(
            mean=tune.Mean()(losses, ok),
            cvar=tune.CVaR(0.6)(losses, ok),
            soft=tune.SmoothWorst(4.0)(losses, ok),
            none_ok=tune.Mean()(losses, jnp.zeros(6, bool)),
            v_mean=jnp.mean(v),
            v_max=tune.smooth_max(v),
            v3_max=tune.smooth_max(3.0 * v),
            v_max400=tune.smooth_max(v, power=400.0),
        )

    out = {k: float(x) for k, x in values(losses, ok, v).items()}
    assert out["mean"] == pytest.approx(good.mean(), rel=1e-15)
    # CVaR at level 0.6: the worst ceil(0.4 * 5) = 2 of the 5 successful values
    assert out["cvar"] == pytest.approx((7.0 + 5.0) / 2, rel=1e-15)
    tau = good.mean() / 4.0
    expected = tau * np.log(np.mean(np.exp(good / tau)))
    soft = out["soft"]
    assert soft == pytest.approx(expected, rel=1e-12)
    assert good.mean() < soft < good.max()
    assert np.isnan(out["none_ok"])
    # smooth maximum: between mean and max, scale-free, tends to the max
    assert out["v_mean"] < out["v_max"] < 2.0
    assert out["v3_max"] == pytest.approx(3.0 * out["v_max"], rel=1e-14)
    assert out["v_max400"] == pytest.approx(2.0, rel=5e-3)


def test_parametrization_positivity_bounds_sharing_and_errors():
    p = {
        "a": jnp.asarray(2.0),
        "arm": {"k": jnp.asarray([1.0, 4.0]), "g": jnp.asarray([3.0, 3.0, 3.0])},
        "fixed": jnp.asarray(9.0),
    }
    space = tune.Parametrization(
        p,
        {
            "a": tune.softplus(),
            "arm/k": tune.log(lower=0.5, upper=5.0),
            "arm/g": tune.sigmoid(1.0, 4.0, shared=True),
        },
    )
    theta = space.init()
    assert theta["arm/g"].shape == ()  # shared: one number
    wild = {"a": jnp.asarray(-40.0), "arm/k": jnp.asarray([-50.0, 50.0]), "arm/g": jnp.asarray(60.0)}

    @jax.jit
    def mapped(theta, wild):  # the maps below in one compiled call
        return dict(
            params=space.params(theta),
            values=space.values(space.project(wild)),
            wild=space.params(wild),
            g=jax.grad(lambda th: space.params(th)["arm"]["k"].sum())(theta),
        )

    out = mapped(theta, wild)
    assert_tree_allclose(out["params"], p, rtol=1e-14, atol=1e-14)  # round trip
    # any θ maps to positive / in-bounds values; projection enforces the log box after a huge step
    values = out["values"]
    assert float(values["a"]) > 0
    np.testing.assert_allclose(np.asarray(values["arm/k"]), [0.5, 5.0], rtol=1e-14)
    assert np.all((np.asarray(values["arm/g"]) > 1.0) & (np.asarray(values["arm/g"]) <= 4.0))
    assert float(out["wild"]["fixed"]) == 9.0
    # gradients flow through the transforms (d exp θ / dθ = exp θ)
    g = out["g"]
    np.testing.assert_allclose(np.asarray(g["arm/k"]), [1.0, 4.0], rtol=1e-14)
    # a mask pytree tunes the leaves marked True with the default (log) transform
    mask = {"a": True, "arm": {"k": False, "g": False}, "fixed": False}
    assert tune.Parametrization(p, mask).names == ("a",)
    # θ is strongly typed even from weakly typed parameters (else a jitted step compiles again after optax)
    weak = tune.Parametrization({"a": jnp.array(2.0), "b": 3.0}, {"a": tune.log(), "b": tune.free()})
    assert not any(x.weak_type for x in weak.init().values())
    for bad, match in (
        ({"nope": tune.log()}, "not a leaf"),
        ({"arm/g": tune.free(shared=True), "a": "log"}, "Transform"),
        ({"a": True}, r"exactly the leaves of params .*; it lacks \['arm/g', 'arm/k', 'fixed'\]"),
        ({}, "nothing to tune"),
    ):
        with pytest.raises(ValueError, match=match):
            tune.Parametrization(p, bad)
    with pytest.raises(ValueError, match="lower must be smaller"):
        tune.box(3.0, 1.0)
    with pytest.raises(ValueError, match="positive initial value"):
        tune.Parametrization({"a": jnp.asarray(-1.0)}, ["a"]).init()
    with pytest.raises(ValueError, match="entries differ"):
        tune.Parametrization(p, {"arm/k": tune.log(shared=True)}).init()


def _sampler(key):
    """A fresh batch per step: three offsets drawn from key (jax-traceable)."""
    offsets = 0.2 * jax.random.uniform(key, (3,), jnp.float64, -1.0, 1.0)
    return _batch(offsets)


OPTIMIZER = optax.adam(0.2)
# The two tests of tune.fit share one compiled step (fit's _compiled_value_and_grad is keyed on the system,
# parametrization, scenario source, objective, risk and options, not on the optimizer or the loop's settings):
# the divergence test needs a fixed step at which large gains are unstable (Heun at 0.05 s, below) and
# unbounded log-gains, and the resume/determinism test holds for any such run as well (with Adam's 0.2 a step
# β grows from 5 to 12.8 in 6 steps, far from the unstable β ≳ 40, and the best loss, 1.2e-3, is below the
# first, 1.9e-3: measured), so both use these.
FIT_SPACE = tune.Parametrization(BASE, {"alpha": tune.log(), "beta": tune.log()})
FIT_OPTIONS = tune.simulation_options(t1=1.0, dt=0.05, solver=diffrax.Heun(), num_saves=21)
FIT_OBJECTIVE = tune.servo_tracking()


def _fit(steps, *, optimizer=OPTIMIZER, seed=7, **kwargs):
    return tune.fit(
        SYSTEM,
        FIT_SPACE,
        _sampler,
        FIT_OBJECTIVE,
        options=FIT_OPTIONS,
        steps=steps,
        optimizer=optimizer,
        seed=seed,
        progress=False,
        **kwargs,
    )


def test_fit_resume_from_checkpoint_is_bit_for_bit_and_runs_are_deterministic(tmp_path):
    full = _fit(6)
    again = _fit(6)
    assert [r["loss"] for r in full.history] == [r["loss"] for r in again.history]  # same seed, same numbers
    ckpt = tmp_path / "state.npz"
    first = _fit(3, checkpoint=ckpt, checkpoint_every=1)  # "killed" after 3 steps
    assert len(first.history) == 3 and ckpt.exists()
    resumed = _fit(6, checkpoint=ckpt, out=tmp_path)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history]
    assert [r["values"] for r in resumed.history] == [r["values"] for r in full.history]
    for name in SPACE.names:
        assert np.array_equal(np.asarray(resumed.final_theta[name]), np.asarray(full.final_theta[name]))
    assert resumed.simulations == full.simulations == 6 * 3
    assert (tmp_path / "history.json").exists() and (tmp_path / "history.csv").exists()
    rows = (tmp_path / "history.csv").read_text().splitlines()
    assert len(rows) == 7 and rows[0].startswith("step,loss")
    # the loss went down on this fresh-batch-per-step problem and the best step is reported
    assert full.best_loss < full.history[0]["loss"]
    # early stopping: no relative improvement of 1000 % is ever seen, so patience 2 stops after step 2
    stopped = _fit(6, patience=2, min_delta=10.0)
    assert stopped.stopped == "patience" and len(stopped.history) == 3
    assert [r["loss"] for r in stopped.history] == [r["loss"] for r in full.history[:3]]
    with pytest.raises(ValueError, match="seed"):
        _fit(6, seed=8, checkpoint=ckpt)


def test_divergence_is_detected_and_backed_off():
    # Fixed step 0.05 s with Heun (real stability limit |hλ| ≤ 2): the servo error dynamics φ̈ + 2αφ̇ + β²φ
    # = 0 are unstable at this step for β ≳ 40. The objective rewards larger gains, and an unbounded log-gain
    # with a large step walks there; the tuner must reject those steps and never accept a non-finite loss.
    # (FIT_OPTIONS, FIT_SPACE, FIT_OBJECTIVE, with a fresh batch per step: the program of the test above.)
    result = _fit(12, optimizer=optax.sgd(3e3), seed=0, max_increase=None)
    accepted = [r for r in result.history if r["accepted"]]
    rejected = [r for r in result.history if not r["accepted"]]
    assert rejected, "no step was rejected: the test did not reach the unstable region"
    assert all(np.isfinite(r["loss"]) and r["failures"] == 0 for r in accepted)
    assert all(r["scale"] < 1.0 for r in result.history[result.history.index(rejected[0]) + 1 :])
    assert np.isfinite(result.best_loss)


def test_stability_limits_and_gain_bounds():
    # Heun: R(z) = 1 + z + z²/2, |R(-x)| ≤ 1 iff x ≤ 2; classical 3rd-order RK (Bosh3 has the same
    # polynomial 1 + z + z²/2 + z³/6): 2.5127 (Hairer & Wanner II, Fig. IV.2.1).
    assert tune.real_stability_limit(diffrax.Heun()) == pytest.approx(2.0, abs=2e-4)
    assert tune.real_stability_limit(diffrax.Bosh3()) == pytest.approx(2.5127, abs=2e-4)
    z = np.array([-0.3 + 0.2j, -1.0])
    np.testing.assert_allclose(tune.stability_function(diffrax.Heun(), z), 1 + z + z**2 / 2, rtol=1e-14)
    r = tune.real_stability_limit(diffrax.Tsit5())
    assert 3.0 < r < 4.0
    bounds = tune.baumgarte_gain_bounds(diffrax.Tsit5(), 0.01, form="linear", safety=0.5)
    assert bounds["alpha"] == pytest.approx(0.5 * r / 0.01)
    assert bounds["beta"] == pytest.approx(bounds["alpha"] ** 2)
    quad = tune.baumgarte_gain_bounds(diffrax.Tsit5(), 0.01, form="quadratic", safety=0.5)
    assert quad["alpha"] == pytest.approx(bounds["alpha"] / 2)
    assert quad["beta"] == pytest.approx(bounds["alpha"])


def test_objective_terms_against_closed_forms():
    # On the servo manifold with the masses at rest, nothing moves: every violation term is zero. For one
    # scenario off the manifold the integrals are checked against the trapezoidal rule in NumPy.
    batch = _batch([0.2])
    from ukjax.simulation import simulate_batch

    sol = simulate_batch(SYSTEM, batch.q0, batch.qd0, BASE, **FIXED)
    ts, u = np.asarray(sol.ts[0]), np.asarray(sol.u[0])
    q, qd = np.asarray(sol.q[0]), np.asarray(sol.qd[0])
    phi = q[:, 1] - q[:, 0] - 2.0 * float(BASE["l"])
    trap = lambda y: float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(ts)))
    limit = 0.5 * np.abs(u).max()
    custom = tune.custom(lambda s, p: s.q[-1, 0] * p["m1"], name="x1_end")
    objective = custom + 2.0 * tune.control_effort()
    reweighted = objective.with_weights(control_effort=0.0)

    @jax.jit
    def terms(sol, limits):  # every term on the first scenario, in one compiled call
        one = jax.tree_util.tree_map(lambda x: x[0], sol)
        return dict(
            servo=tune.servo_tracking()(SYSTEM, one, BASE),
            effort=tune.control_effort()(SYSTEM, one, BASE),
            limit=tune.actuator_limit(limits[0])(SYSTEM, one, BASE),
            no_limit=tune.actuator_limit(limits[1])(SYSTEM, one, BASE),
            terminal=tune.terminal_violation()(SYSTEM, one, BASE),
            objective=objective(SYSTEM, one, BASE),
            reweighted=reweighted(SYSTEM, one, BASE),
        )

    out = {k: float(x) for k, x in terms(sol, jnp.asarray([limit, 2 * np.abs(u).max()])).items()}
    assert out["servo"] == pytest.approx(trap(phi**2), rel=1e-12)
    assert out["effort"] == pytest.approx(trap(np.sum(u**2, 1)), rel=1e-12)
    excess = np.maximum(np.abs(u) - limit, 0.0)
    assert out["limit"] == pytest.approx(trap(np.sum(excess**2, 1)))
    assert out["no_limit"] == 0.0
    assert out["terminal"] == pytest.approx(phi[-1] ** 2 + float(qd[-1, 1] - qd[-1, 0]) ** 2, rel=1e-10)
    assert out["objective"] == pytest.approx(float(q[-1, 0]) + 2.0 * trap(np.sum(u**2, 1)), rel=1e-12)
    assert out["reweighted"] == pytest.approx(float(q[-1, 0]), rel=1e-14)
    with pytest.raises(ValueError, match="distinct"):
        _ = tune.control_effort() + tune.control_effort()


def test_cli_tune_help_lists_the_studies(capsys):
    from ukjax import cli, studies

    assert cli.main(["tune", "--help"]) == 0
    text = capsys.readouterr().out
    for name in studies.TUNE_STUDIES:
        assert name in text
    assert set(studies.TUNE_STUDIES) == {"scara", "servo", "flexible_joint", "ur5"}
