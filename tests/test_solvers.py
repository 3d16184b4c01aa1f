"""ukjax.RK4, the classical 4th-order Runge-Kutta method, against independent references: one step written out
by hand in NumPy, the closed-form solution of a linear ODE (global order 4), diffrax's refusal of adaptive
stepping without an error estimate, and simulate with it (pendulum: plain vs jit vs vmap, gradient vs central
differences).

Compile budget: one diffrax program per ODE (the step sizes are traced arguments), one simulate program for
the pendulum, its batch and its gradient.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import PENDULUM, assert_tree_allclose, central_difference

import ukjax


def _nonlinear(t, y, args):
    """A driven, damped pendulum in first-order form: explicit time dependence exercises the stage times."""
    return jnp.stack([y[1], -args["k"] * jnp.sin(y[0]) - 0.3 * y[1] + jnp.cos(2.0 * t)])


def _by_hand(t, y, h, k):
    """The classical RK4 step written out in NumPy (Kutta 1901)."""
    f = lambda t_, y_: np.array([y_[1], -k * np.sin(y_[0]) - 0.3 * y_[1] + np.cos(2.0 * t_)])
    k1 = f(t, y)
    k2 = f(t + h / 2, y + h / 2 * k1)
    k3 = f(t + h / 2, y + h / 2 * k2)
    k4 = f(t + h, y + h * k3)
    return y + h * (k1 + 2 * k2 + 2 * k3 + k4) / 6


@jax.jit
def _solve(f_args, y0, t0, t1, dt):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_nonlinear), ukjax.RK4(), t0, t1, dt, y0, f_args,
        stepsize_controller=diffrax.ConstantStepSize(), max_steps=64,
    )
    return sol.ys[-1]


def test_one_step_is_the_classical_rk4_step():
    # Round-off only: the same arithmetic summed in a different order (a few ulps of |y| ~ 1).
    rng = np.random.default_rng(0)
    for _ in range(3):
        y0 = rng.normal(size=2)
        t0, h, k = rng.uniform(0, 1), rng.uniform(0.05, 0.3), rng.uniform(1, 5)
        got = _solve({"k": jnp.asarray(k)}, jnp.asarray(y0), t0, t0 + h, h)
        np.testing.assert_allclose(np.asarray(got), _by_hand(t0, y0, h, k), rtol=1e-14, atol=1e-14)
    # Two steps: the second starts from the first (no state carried between steps, no FSAL).
    y0, h = np.array([0.4, -0.2]), 0.1
    two = _solve({"k": jnp.asarray(2.0)}, jnp.asarray(y0), 0.0, 2 * h, h)
    np.testing.assert_allclose(np.asarray(two), _by_hand(h, _by_hand(0.0, y0, h, 2.0), h, 2.0), rtol=1e-14,
                               atol=1e-14)


def test_global_error_is_fourth_order_on_a_linear_ode():
    # y' = L y, a damped oscillator: closed form y(t) = expm(L t) y0 (SciPy). RK4's global error is
    # C dt⁴ + O(dt⁵), so halving dt divides it by 2⁴ = 16; the dt⁵ term moves the ratio by a few % at these
    # steps (measured 16.4 and 16.1), so [14.5, 17.5] accepts order 4 and rejects 3 (ratio 8) and 5 (32).
    L = jnp.asarray([[0.0, 1.0], [-4.0, -0.5]])
    y0 = jnp.asarray([1.0, 0.0])
    exact = scipy.linalg.expm(np.asarray(L) * 2.0) @ np.asarray(y0)

    @jax.jit
    def final(dt):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: L @ y), ukjax.RK4(), 0.0, 2.0, dt, y0,
            stepsize_controller=diffrax.ConstantStepSize(), max_steps=512,
        )
        return sol.ys[-1]

    errors = [np.linalg.norm(np.asarray(final(2.0 / steps)) - exact) for steps in (40, 80, 160)]
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    assert all(14.5 < r < 17.5 for r in ratios), (errors, ratios)


def test_adaptive_stepping_is_refused():
    # The classical method has no embedded pair: like diffrax.Euler, the step gives no error estimate, and an
    # adaptive controller must refuse it rather than step by a meaningless estimate.
    with pytest.raises(RuntimeError, match="does not provide error estimates"):
        diffrax.diffeqsolve(
            diffrax.ODETerm(_nonlinear), ukjax.RK4(), 0.0, 1.0, 0.1, jnp.asarray([0.1, 0.0]), {"k": 1.0},
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
        )
    with pytest.raises(RuntimeError, match="does not provide error estimates"):
        ukjax.simulate(PENDULUM, *_pendulum_state(0.0), _params(), t1=0.1, solver=ukjax.RK4())


# ------------------------------------------------------------------ through simulate: the pendulum in (x, y)
RUN = dict(t1=0.5, dt=0.01, ts=jnp.linspace(0.0, 0.5, 6), solver=ukjax.RK4())


def _params(**kw):
    base = dict(m=1.2, g=9.81, c=0.3, l=1.0, alpha=5.0, beta=5.0)
    return {k: jnp.asarray(v, jnp.float64) for k, v in (base | kw).items()}


def _pendulum_state(angle):
    q = jnp.asarray([jnp.sin(angle), -jnp.cos(angle)])
    qd = 0.7 * jnp.asarray([jnp.cos(angle), jnp.sin(angle)])
    return q, qd


def _pendulum_angle(angle, p):
    """The same pendulum in its angle θ, m l² θ̈ = -m g l sin θ - c l² θ̇, by the hand RK4 (NumPy)."""
    def f(t, y):
        th, om = y
        return np.array([om, -p["g"] / p["l"] * np.sin(th) - p["c"] / p["m"] * om])
    y, h = np.array([angle, 0.7 / p["l"]]), 0.01
    for _ in range(50):
        k1 = f(0, y)
        k2 = f(0, y + h / 2 * k1)
        k3 = f(0, y + h / 2 * k2)
        k4 = f(0, y + h * k3)
        y = y + h * (k1 + 2 * k2 + 2 * k3 + k4) / 6
    return y


def test_simulate_with_rk4_matches_the_pendulum_angle_and_counts_evaluations():
    p = _params()
    sol = ukjax.simulate(PENDULUM, *_pendulum_state(0.6), p, **RUN)
    assert int(sol.status) == int(ukjax.RESULTS.success)
    assert int(sol.num_steps) == 50 and int(sol.num_function_evals) == 4 * 50
    # Cartesian UK with Baumgarte vs the angle ODE, both RK4 at 10 ms: the Cartesian form has a different
    # truncation error and a Baumgarte-controlled drift (|φ| checked): measured 1.4e-8 m apart, |φ| 3e-8, so
    # 1e-7 for both (Bosh3, order 3, is 9e-7 off here; Heun 1e-4).
    theta, _ = _pendulum_angle(0.6, {k: float(v) for k, v in p.items()})
    q_end = np.asarray(sol.q[-1])
    np.testing.assert_allclose(q_end, [np.sin(theta), -np.cos(theta)], atol=1e-7)
    assert float(jnp.max(sol.position_residual)) < 1e-7


def test_simulate_with_rk4_plain_jit_vmap_and_gradient():
    p = _params()
    angles = jnp.asarray([0.3, 0.6, 0.9])
    states = [_pendulum_state(a) for a in angles]
    final = lambda q0, qd0, p_: ukjax.simulate(PENDULUM, q0, qd0, p_, **RUN).q[-1]
    plain = final(*states[1], p)
    compiled = jax.jit(final)
    jitted = compiled(*states[1], p)
    q0s, qd0s = (jnp.stack(x) for x in zip(*states, strict=True))
    batch = ukjax.simulate_batch(PENDULUM, q0s, qd0s, p, **RUN)
    # The same operations fused differently: agreement to round-off.
    assert_tree_allclose(jitted, plain, rtol=1e-12, atol=1e-12)
    assert_tree_allclose(batch.q[1, -1], plain, rtol=1e-12, atol=1e-12)
    # d q_x(t1) / d c (the drag) vs a central difference (eps 1e-5: truncation ~1e-10, round-off ~1e-11).
    x_of_c = lambda c: final(*states[1], p | {"c": c})[0]
    grad = jax.jit(jax.grad(x_of_c))(p["c"])  # one program (eager, the forward and transposed halves: two)
    # the differences by the jitted program above (c an argument, not a constant: no second compile)
    fd = central_difference(lambda c: compiled(*states[1], p | {"c": c})[0], p["c"], 1.0, eps=1e-5)
    np.testing.assert_allclose(float(grad), float(fd), rtol=1e-6, atol=1e-9)
