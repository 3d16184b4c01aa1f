"""Two-link flexible-joint manipulator under Udwadia-Kalaba-based control (UK review, seed 002 §8.3).

Model (seed 002 eq. 66-68, Spong's flexible-joint manipulator)::

    D(q₁) q̈₁ + C(q₁, q̇₁) q̇₁ + G(q₁) + K (q₁ - q₂) = 0        (links)
    J q̈₂ - K (q₁ - q₂) = u                                 (motors)

with link angles q₁ = (q⁽²⁾, q⁽⁴⁾) (q⁽⁴⁾ relative to link 1, measured from the downward vertical) and motor
angles q₂ = (q⁽¹⁾, q⁽³⁾). ukjax orders the coordinates as the paper does, q = (q₁ᵀ, q₂ᵀ)ᵀ = (q⁽²⁾, q⁽⁴⁾,
q⁽¹⁾, q⁽³⁾), so ``M = diag(D, J)``, ``Q = (-(C q̇₁ + G + K(q₁ - q₂)), K(q₁ - q₂))`` and the actuation is
``B = [0; I₂]``. Eq. 68 prints c₁₁ = -m₁ l₁ l_c2 sin q⁽⁴⁾ q̇⁽⁴⁾; the Lagrangian of the two links gives m₂ there
(as in c₁₂, c₂₁), which ukjax uses (the paper's simulation has m₁ = m₂, where the two agree).

Task (eq. 69-70): the link rates must satisfy A q̇₁ = c with A = [1 1], c = 0; the tracking error is
β = A q̇₁ - c. The UK-based control law of eq. 71-72 is the torque on the links

    τ_d = D^{1/2}(A D^{-1/2})⁺ [b - A D⁻¹F] - D Aᵀ(A Aᵀ)⁻¹ P⁻¹ β,     F = -(C q̇₁ + G),  b = 0,

whose first term is the UK constraint force (seed 000 eq. 11) for the link equations D q̈₁ = F + τ, and
whose second term turns the constraint into A q̈₁ = -P⁻¹β, so that β̇ = -P⁻¹β and β(t) = exp(-P⁻¹t) β(0) for
any positive-definite P. (Eq. 71 prints the given force as C q̇₁ + G + q₁; here F is the link force of eq.
66 without the elastic torque, which is the actuator of the links.)

In eq. 66 the motor torque u acts on the motors, not on the links: A M⁻¹B = 0, so the link-rate task alone
is a servo constraint u cannot enforce (seed 000 Assumption 3 fails; β has relative degree three in u). The
links are driven by the elastic torque τ = K(q₂ - q₁). ukjax therefore realizes eq. 72 as the torque the
springs must transmit and lets u enforce a second servo constraint (Liu et al. 2015, seed 000 §III, eq.
24-35) on the torque error e = K(q₂ - q₁) - τ_d(q₁, q̇₁):

    ë + 2 α_m ė + β_m² e = 0                                   (seed 000 Baumgarte convention),

whose second-order form involves q̈₂, so A_s M⁻¹B = K J⁻¹ is invertible and u exists at every state. When
the motors start on the manifold e = ė = 0 (:func:`initial_state` with ``motor="matched"``) e stays zero and
β decays exactly as exp(-P⁻¹t) β(0), the closed form of eq. 72 (:func:`beta_closed_form`); from any other
motor state e decays with the rates α_m ± sqrt(α_m² - β_m²) first.

Parameters (seed 002 §8.3): m₁ = m₂ = 1, l₁ = 1, l_c1 = l_c2 = 0.5, K₁ = K₂ = 1, I₁ = I₂ = 1, J₁₁ = J₂₂ = 1,
g = 9.81, link rates q̇⁽²⁾(0) = 1, q̇⁽⁴⁾(0) = -0.1 (β(0) = 0.9). Values the paper omits, chosen here:

* P = 0.25 s (1 x 1, positive definite). The paper reports |β| below 10⁻³ within 2 s from β(0) = 0.9, which
  the closed form reaches iff P < 2 / ln(900) = 0.294 s; P = 0.25 s reaches it at P ln 900 = 1.70 s.
* α_m = β_m = 20 s⁻¹: a critically damped torque loop five times faster than the task (1/P = 4 s⁻¹).
* link angles q₁(0) = (0, 0): the links hang at the stable equilibrium; the motor state is the matched one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ukjax.constraints import AccelerationLevel
from ukjax.dynamics import uk_constraint_force
from ukjax.system import System

LINKS = slice(0, 2)
MOTORS = slice(2, 4)
COORDINATE_NAMES = ("q(2) link 1", "q(4) link 2", "q(1) motor 1", "q(3) motor 2")
MOTOR_STARTS = ("matched", "relaxed")


def task_matrix(dtype=jnp.float64):
    """A of the link-rate task A q̇₁ = c (seed 002 eq. 69-70): A = [1 1]."""
    return jnp.ones((1, 2), dtype)


def default_params() -> dict:
    """Seed 002 §8.3 values plus the gains the paper leaves open (module docstring), as float64 arrays."""
    values = {
        "m1": 1.0,
        "m2": 1.0,
        "l1": 1.0,
        "lc1": 0.5,
        "lc2": 0.5,
        "I1": 1.0,
        "I2": 1.0,
        "J11": 1.0,
        "J22": 1.0,
        "K1": 1.0,
        "K2": 1.0,
        "g": 9.81,
        "alpha_motor": 20.0,
        "beta_motor": 20.0,
    }
    params = {k: jnp.asarray(v, jnp.float64) for k, v in values.items()}
    params["P"] = jnp.full((1, 1), 0.25, jnp.float64)
    return params


def _check_pair(name, x):
    x = jnp.asarray(x)
    if x.shape != (2,):
        raise ValueError(f"{name} must have shape (2,) (two links), got {x.shape}")
    return x


def _check_state(q, qd):
    if jnp.shape(q) != (4,) or jnp.shape(qd) != (4,):
        raise ValueError(
            f"the flexible-joint manipulator needs q, qd of shape (4,), got {jnp.shape(q)}, {jnp.shape(qd)}"
        )


def link_matrices(q1, qd1, p):
    """(D, C, G) of seed 002 eq. 67-68 at link angles q₁ = (q⁽²⁾, q⁽⁴⁾), rates q̇₁ (c₁₁: see module)."""
    q1, qd1 = _check_pair("q1", q1), _check_pair("qd1", qd1)
    c4, s4 = jnp.cos(q1[1]), jnp.sin(q1[1])
    m2, l1, lc2 = p["m2"], p["l1"], p["lc2"]
    d11 = m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * c4) + p["m1"] * p["lc1"] ** 2 + p["I1"] + p["I2"]
    d12 = m2 * (lc2**2 + l1 * lc2 * c4) + p["I2"]
    d22 = m2 * lc2**2 + p["I2"]
    D = jnp.stack([jnp.stack([d11, d12]), jnp.stack([d12, d22])])
    h = m2 * l1 * lc2 * s4
    zero = jnp.zeros_like(h)
    C = jnp.stack([jnp.stack([-h * qd1[1], -h * (qd1[1] + qd1[0])]), jnp.stack([h * qd1[0], zero])])
    g_outer = m2 * lc2 * p["g"] * jnp.sin(q1[0] + q1[1])
    G = jnp.stack([(p["m1"] * p["lc1"] + m2 * l1) * p["g"] * jnp.sin(q1[0]) + g_outer, g_outer])
    return D, C, G


def _stiffness(p):
    return jnp.diag(jnp.stack([p["K1"], p["K2"]]))


def _link_force(q1, qd1, p):
    """F = -(C q̇₁ + G): the given force on the links without the elastic torque."""
    _, C, G = link_matrices(q1, qd1, p)
    return -(C @ qd1 + G)


def mass_matrix(q, t, p):
    """M = diag(D(q₁), J) (seed 002 eq. 66-67)."""
    D, _, _ = link_matrices(q[LINKS], jnp.zeros(2, q.dtype), p)
    J = jnp.diag(jnp.stack([p["J11"], p["J22"]]))
    return jax.scipy.linalg.block_diag(D, J)


def given_force(q, qd, t, p):
    """Q = (-(C q̇₁ + G + K(q₁ - q₂)), K(q₁ - q₂)) (seed 002 eq. 66)."""
    spring = _stiffness(p) @ (q[LINKS] - q[MOTORS])
    return jnp.concatenate([_link_force(q[LINKS], qd[LINKS], p) - spring, spring])


def actuation(q, t, p):
    """B = [0; I₂]: the motor torques u act on the motor coordinates (seed 002 eq. 66)."""
    return jnp.concatenate([jnp.zeros((2, 2), q.dtype), jnp.eye(2, dtype=q.dtype)])


def tracking_error(q, qd, p):
    """β = A q̇₁ - c with A = [1 1], c = 0 (seed 002 eq. 69-70), shape (1,)."""
    _check_state(q, qd)
    return task_matrix(qd.dtype) @ qd[LINKS]


def link_control_torque(q1, qd1, p):
    """τ_d = D^{1/2}(AD^{-1/2})⁺(b - AD⁻¹F) - D Aᵀ(AAᵀ)⁻¹P⁻¹β, the UK-based control of seed 002 eq. 71-72.

    The first term is the ideal UK constraint force (seed 000 eq. 11) of the links, F = -(C q̇₁ + G), b = 0;
    with D q̈₁ = F + τ_d the link accelerations obey A q̈₁ = -P⁻¹β.
    """
    D, _, _ = link_matrices(q1, qd1, p)
    A = task_matrix(D.dtype)
    beta = A @ qd1
    uk_force = uk_constraint_force(D, _link_force(q1, qd1, p), A, jnp.zeros(1, D.dtype)).ideal
    decay = D @ A.T @ jnp.linalg.solve(A @ A.T, jnp.linalg.solve(p["P"], beta))
    return uk_force - decay


def link_acceleration(q, qd, p):
    """q̈₁ = D⁻¹(F + K(q₂ - q₁)): link accelerations, fixed by the state whatever u is (seed 002 eq. 66)."""
    q1, qd1 = q[LINKS], qd[LINKS]
    D, _, _ = link_matrices(q1, qd1, p)
    return jnp.linalg.solve(D, _link_force(q1, qd1, p) + _stiffness(p) @ (q[MOTORS] - q1))


def torque_error(q, qd, p):
    """e = K(q₂ - q₁) - τ_d(q₁, q̇₁): how far the elastic torque is from the control law of eq. 72."""
    _check_state(q, qd)
    return _stiffness(p) @ (q[MOTORS] - q[LINKS]) - link_control_torque(q[LINKS], qd[LINKS], p)


def torque_error_rate(q, qd, p):
    """ė along the motion: K(q̇₂ - q̇₁) - dτ_d/dt, with q̈₁ from :func:`link_acceleration` (a state function)."""
    _check_state(q, qd)
    q1, qd1 = q[LINKS], qd[LINKS]
    tangent = (qd1, link_acceleration(q, qd, p))
    _, tau_rate = jax.jvp(lambda x, v: link_control_torque(x, v, p), (q1, qd1), tangent)
    return _stiffness(p) @ (qd[MOTORS] - qd[LINKS]) - tau_rate


def _servo_form(q, qd, p):
    """(A_s, b_s) of ë + 2α_m ė + β_m² e = 0: ë = ∂ė/∂q̇ q̈ + ∂ė/∂q q̇, both by automatic differentiation."""
    A_s = jax.jacfwd(torque_error_rate, argnums=1)(q, qd, p)
    e_rate, convective = jax.jvp(lambda q_: torque_error_rate(q_, qd, p), (q,), (qd,))
    b_s = -convective - 2 * p["alpha_motor"] * e_rate - p["beta_motor"] ** 2 * torque_error(q, qd, p)
    return A_s, b_s


def motor_servo_constraint() -> AccelerationLevel:
    """The servo constraint u enforces: ë + 2α_m ė + β_m² e = 0 on the torque error e (module docstring)."""
    return AccelerationLevel(
        A=lambda q, qd, t, p: _servo_form(q, qd, p)[0],
        b=lambda q, qd, t, p: _servo_form(q, qd, p)[1],
        name="elastic torque follows eq. 72",
    )


def system() -> System:
    """The manipulator of seed 002 eq. 66-68 with motor actuation and the eq. 72 servo constraint."""
    return System(
        mass=mass_matrix,
        force=given_force,
        n=4,
        actuation=actuation,
        servo_constraints=(motor_servo_constraint(),),
        coordinate_names=COORDINATE_NAMES,
    )


def initial_state(params, *, link_angles=(0.0, 0.0), link_rates=(1.0, -0.1), motor: str = "matched"):
    """(q0, qd0) with the paper's link rates (β(0) = 0.9) and a chosen motor state.

    ``motor="matched"``: q₂ = q₁ + K⁻¹τ_d and q̇₂ = q̇₁ + K⁻¹ dτ_d/dt, so e = ė = 0 and β follows the closed
    form of eq. 72 from t = 0. ``motor="relaxed"``: q₂ = q₁, q̇₂ = q̇₁ (unloaded springs), so the torque loop
    starts with e = -τ_d and β decays only once it has caught up.
    """
    if motor not in MOTOR_STARTS:
        raise ValueError(f"motor must be one of {MOTOR_STARTS}, got {motor!r}")
    q1 = _check_pair("link_angles", jnp.asarray(link_angles, jnp.float64))
    qd1 = _check_pair("link_rates", jnp.asarray(link_rates, jnp.float64))
    if motor == "relaxed":
        return jnp.concatenate([q1, q1]), jnp.concatenate([qd1, qd1])
    K = _stiffness(params)
    q2 = q1 + jnp.linalg.solve(K, link_control_torque(q1, qd1, params))
    q = jnp.concatenate([q1, q2])
    # ė is affine in q̇₂ with slope K: one Newton step from q̇₂ = q̇₁ makes it vanish exactly.
    qd = jnp.concatenate([qd1, qd1])
    qd2 = qd1 - jnp.linalg.solve(K, torque_error_rate(q, qd, params))
    return q, jnp.concatenate([qd1, qd2])


def beta_closed_form(t, beta0, params):
    """β(t) = exp(-P⁻¹t) β(0), the error dynamics β̇ = -P⁻¹β of eq. 72; t of any shape, β(0) of shape (1,)."""
    t = jnp.asarray(t, jnp.float64)
    beta0 = jnp.asarray(beta0, jnp.float64)
    if beta0.shape != (1,):
        raise ValueError(f"beta0 must have shape (1,) (one task row), got {beta0.shape}")
    rate = 1.0 / params["P"][0, 0]
    return jnp.exp(-rate * t)[..., None] * beta0


def time_to_tolerance(beta0, tolerance, params):
    """The time at which |β| of the closed form falls to ``tolerance``: P ln(|β(0)| / tolerance)."""
    return params["P"][0, 0] * jnp.log(jnp.abs(jnp.asarray(beta0, jnp.float64)) / tolerance)
