"""The default UK method (``method="ldl"``: Cholesky of M and the diagonal-pivoted LDLᵀ generalized inverse of
G = A M⁻¹Aᵀ, :func:`ukjax.linalg.psd_ginv`) on the project's overconstrained example, the five-bar
parallelogram of de Falco, Pennestrì & Vita (2008): rank 11 of 12 everywhere, 10 at the flat configurations
φ = 0 and φ = -π, which the linkage released from rest at φ = π/4 first reaches at t ≈ 0.41 s.

Before pivoting, the default stopped there (``max_steps_reached`` adaptive, ``nonfinite_state`` at
dt0 = 1e-3): near the flat configuration G has a tiny but kept eigenvalue (~φ²) next to the redundant zero
one, the unpivoted factorization took the tiny pivot first, and the zero pivot came out as round-off times
multipliers of order 1/φ², far above the cut. References: the linkage is a one-degree-of-freedom pendulum
in the crank angle (``test_five_bar._reduced``), integrated by SciPy, and its exact q̈
(``test_five_bar._full_acceleration``).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference
from scipy.integrate import solve_ivp
from test_five_bar import _full_acceleration, _reduced

import ukjax
from ukjax import demo, sweep
from ukjax.models import five_bar

P = five_bar.default_params()
SYSTEM = five_bar.system()
T_CROSS = 0.6  # past the first flat configuration (t ≈ 0.41 s)


def reduced_angle(ts):
    """Crank angle of the reduced pendulum released from rest at π/4 (DOP853, rtol = atol = 1e-12)."""
    f = _reduced(P)[0]
    ref = solve_ivp(
        lambda t, y: [y[1], f(y[0])],
        (0.0, float(ts[-1])),
        [math.pi / 4, 0.0],
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=np.asarray(ts),
    )
    return ref.y[0]


def run(t1, dt0, n_save):
    q0, qd0 = five_bar.initial_state(P)
    ts = jnp.linspace(0.0, t1, n_save)
    sol = ukjax.simulate(SYSTEM, q0, qd0, P, t1=t1, ts=ts, dt0=dt0)  # every option at its default
    return sol, reduced_angle(ts)


def angle_error(sol, ref):
    return float(np.max(np.abs(np.asarray(sol.q[:, 2]) - ref)))


@pytest.fixture(scope="module")
def crossing():
    return {dt0: run(T_CROSS, dt0, 7) for dt0 in (None, 1e-3)}


def test_default_method_crosses_the_first_flat_configuration(crossing):
    # Measured: adaptive Tsit5 (default rtol/atol) 2e-11 rad from the reduced pendulum after the crossing,
    # fixed step 1e-3 s 5e-10 rad; violation |φ| 1e-11 and 4e-10 m. A fixed step whose stage lands within
    # ~1e-7 rad of φ = 0 (where G's smallest kept eigenvalue, ~φ², falls below the cut) loses that direction
    # for one stage, an error of up to ~1e-5 rad (the 20 s run below); bounds 1e-8 rad (adaptive) and
    # 1e-4 rad (fixed), 1e-8 m on the violation.
    for dt0, bound in ((None, 1e-8), (1e-3, 1e-4)):
        sol, ref = crossing[dt0]
        assert int(sol.status) == ukjax.RESULTS.success, (dt0, sol.message)
        assert float(sol.q[-1, 2]) < -0.3  # the crank went through φ = 0
        assert angle_error(sol, ref) < bound, (dt0, angle_error(sol, ref))
        assert float(sol.max_position_residual) < 1e-8


@pytest.mark.parametrize("phi", [1e-3, 1e-6, 0.0])
def test_default_acceleration_near_and_at_the_flat_configuration(phi):
    # The exact q̈ of the assembled linkage turning at 2 rad/s. At φ = 1e-6 the unpivoted factorization erred
    # by 1.0 m/s² (q̈ ~ 11); pivoted: 4e-9 (G's kept eigenvalue ~1e-12 gives cond(G) ~ 1e13, and the error
    # of the Cholesky forms grows like cond(G) eps in the worst case). Bound 1e-7 m/s².
    p = dict(P, phi0=jnp.asarray(phi), omega0=jnp.asarray(2.0))
    q0, qd0 = five_bar.initial_state(p)
    qdd = accel(q0, qd0)
    np.testing.assert_allclose(np.asarray(qdd), _full_acceleration(phi, 2.0, P), rtol=0, atol=1e-7)


accel = jax.jit(lambda q, qd: SYSTEM.acceleration(q, qd, 0.0, P))


def test_gradient_at_the_rank_deficient_flat_configuration():
    # At φ = 0 exactly (rank 10 of 12) the rank does not change with the coupler mass m2, so q̈(m2) is smooth:
    # reverse mode through jit and vmap against central differences (step 1e-6 on m2 = 2, round-off ~1e-9)
    # and against the closed form ∂φ̈/∂m2 = -(g L cos φ + φ̈ L²)/J of the reduced pendulum.
    q0, qd0 = five_bar.initial_state(dict(P, phi0=jnp.asarray(0.0), omega0=jnp.asarray(1.0)))
    crank_accel = lambda m2: SYSTEM.acceleration(q0, qd0, 0.0, dict(P, m2=m2))[2]
    m2s = jnp.array([2.0, 3.0])
    grads = jax.jit(jax.vmap(jax.grad(crank_accel)))(m2s)
    f = jax.jit(crank_accel)
    for m2, grad in zip(m2s, grads, strict=True):
        fd = central_difference(f, m2, jnp.asarray(1.0))
        assert np.isfinite(float(grad))
        assert abs(float(grad) - float(fd)) < 1e-7
        phidd, inertia, _ = _reduced(dict(P, m2=m2))
        expected = -(float(P["g"]) * float(P["L"]) + phidd(0.0) * float(P["L"]) ** 2) / inertia
        assert abs(float(grad) - expected) < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("dt0", [None, 1e-3], ids=["adaptive", "fixed-1e-3"])
def test_default_method_runs_the_five_bar_for_20_seconds(dt0):
    # 20 s: the crank swings between π/4 and -5π/4, through a flat configuration about 20 times. Measured
    # (2-core CPU, ~25 s each): adaptive 3.6e-9 rad from the reduced pendulum (27,583 steps); fixed 1e-3 s
    # 2.0e-3 rad, from a step between t = 4 and 5 s that lands a stage next to φ = 0 (see above) and shifts
    # the energy slightly; method="cholesky" 9e-4 rad, the same effect. Bounds 1e-7 and 1e-2 rad; violation
    # below 1e-8 m.
    sol, ref = run(20.0, dt0, 21)
    assert int(sol.status) == ukjax.RESULTS.success, sol.message
    assert angle_error(sol, ref) < (1e-7 if dt0 is None else 1e-2), angle_error(sol, ref)
    assert float(sol.max_position_residual) < 1e-8


# ------------------------------------------------------------------ demo and shipped specs: gains that settle

SCARA_SPEC = "scara"  # the shipped spec (ukjax/sweep/specs/scara.toml)
SETTLED = 1e-4  # fraction of the initial error (~1 cm at the end effector) left at t1: below 1e-6 m


def spec_gains(spec):
    """(α, β) that a sweep spec's [vary] section sets for every scenario (one-value choices), else the model's
    defaults."""
    gains = {}
    for leaf in ("alpha", "beta"):
        dist = spec.vary.get(f"params.{leaf}")
        if dist is None:
            gains[leaf] = float(np.max(sweep.load_model(spec.model).params[leaf]))
        else:
            assert dist.kind == "choice" and len(dist.fields["values"]) == 1, dist
            gains[leaf] = float(dist.fields["values"][0])
    return gains["alpha"], gains["beta"]


def test_demo_and_scara_spec_gains_settle_and_paper_gains_do_not():
    # φ̈ + αφ̇ + βφ = 0 from Xu & Liu 2017, eq. 52: the demo's and the shipped spec's gains leave at most 1e-4
    # of the initial error at t1 (critically damped α = 2√β = 20: (1 + 50) e^(-50) ≈ 1e-20); the paper's
    # α = 0.5, β = 200 leave e^(-1.25) = 0.29 (the reason the old defaults flagged every scenario).
    flags = {flag: default for flag, _, default, _ in demo.FLAGS}
    spec = sweep.load_spec(SCARA_SPEC)
    demo_gains = (flags["--alpha"], flags["--beta"], flags["--duration"])
    cases = (demo_gains, (*spec_gains(spec), spec.integrator["t1"]))
    for alpha, beta, t1 in cases:
        settling = demo._settling(alpha, beta, t1)
        assert settling["kind"] != "underdamped" and settling["envelope_at_t1"] < SETTLED, (alpha, beta)
    assert spec.integrator["t1"] == 5.0
    paper = demo._settling(demo.PAPER_GAINS["alpha"], demo.PAPER_GAINS["beta"], flags["--duration"])
    assert paper["kind"] == "underdamped" and paper["envelope_at_t1"] > 0.2


@pytest.mark.slow
def test_shipped_scara_spec_ends_settled(tmp_path):
    # 4 scenarios of the shipped spec: every one success and the end-effector constraint (metres) at the tail
    # below 1e-6 m (measured on 64: 2.3e-14 m; with the paper's gains 64 of 64 constraint_violated).
    spec = sweep.load_spec(SCARA_SPEC, scenarios=4, chunk_size=4)
    sweep.run(spec, out=tmp_path, progress=False)
    table = sweep.load(tmp_path)
    assert set(table.column("status").to_pylist()) == {int(ukjax.RESULTS.success)}
    assert max(table.column("tail_abs_phi").to_pylist()) < 1e-6
