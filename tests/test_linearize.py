"""System.linearize (ukjax.linearize) against closed forms that share no code with it.

* Cart-pendulum in redundant Cartesian coordinates (cart x_c, bob (x_b, y_b), rod length as a holonomic
  constraint with Baumgarte terms): the state and input matrices at the upright and hanging equilibria are the
  textbook linearization in (x, θ) (point mass on a massless rod; e.g. Ogata 2010, Modern Control
  Engineering, Example 3-5), mapped to (x_c, x_b) by x_b = x_c + l sin θ.
* The upright rolling disk (thin uniform disk, Nonholonomic rolling constraints): state matrix, characteristic
  polynomial and critical spin Ω_c = sqrt(g / (3 r)) from the linearized Newton-Euler equations (derived in
  ``disk_closed_form``; the classic result, e.g. Neimark & Fufaev 1972, Ch. III).
* A compound pendulum built with ukjax.lagrangian.rigid_body_kinetic_energy: small-oscillation frequency.
* The full-coordinate Jacobian is not what is returned; jit, vmap and grad (vs finite differences).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference, rotation_x, rotation_y, rotation_z

from ukjax import Baumgarte, Holonomic, Nonholonomic, System
from ukjax.lagrangian import rigid_body_kinetic_energy
from ukjax.linearize import Linearization


# ------------------------------------------------------------------ cart-pendulum, Cartesian bob
def _cart_kinetic(q, qd, t, p):
    return 0.5 * p["M"] * qd[0] ** 2 + 0.5 * p["m"] * (qd[1] ** 2 + qd[2] ** 2)


def _cart_potential(q, t, p):
    return p["m"] * p["g"] * q[2]


ROD = Holonomic(
    lambda q, t, p: (q[1] - q[0]) ** 2 + q[2] ** 2 - p["l"] ** 2,
    baumgarte=Baumgarte(gains=lambda p: (p["alpha"], p["beta"])),
    name="rod",
)
CART = System.from_lagrangian(
    _cart_kinetic,
    _cart_potential,
    3,
    constraints=(ROD,),
    actuation=lambda q, t, p: jnp.eye(3, 1, dtype=q.dtype),  # a force on the cart
    coordinate_names=("x_c", "x_b", "y_b"),
)
CART_P = {
    name: jnp.asarray(value)
    for name, value in {"M": 2.0, "m": 0.5, "l": 0.8, "g": 9.81, "alpha": 5.0, "beta": 5.0}.items()
}
INDEPENDENT = ("x_c", "x_b")


def cart_point(upright: bool, p=CART_P):
    """The equilibrium: bob above (upright) or below the cart at x = 0.3, at rest."""
    y = p["l"] if upright else -p["l"]
    return jnp.stack([jnp.asarray(0.3), jnp.asarray(0.3), y]), jnp.zeros(3)


def cart_closed_form(upright: bool, p=CART_P):
    """Textbook linearization in (x, θ, ẋ, θ̇), θ from the upward (upright) or downward (hanging) vertical:
    M ẍ = u ∓ m g θ, M l θ̈ = ±(M + m) g θ - u (upper signs upright), mapped to (x_c, x_b, ẋ_c, ẋ_b) with
    x_b = x + l θ to first order: A = S A_θ S⁻¹, B = S B_θ."""
    M, m, l, g = (float(p[k]) for k in ("M", "m", "l", "g"))
    s = 1.0 if upright else -1.0
    A = np.array(
        [[0, 0, 1, 0], [0, 0, 0, 1], [0, -s * m * g / M, 0, 0], [0, s * (M + m) * g / (M * l), 0, 0]]
    )
    B = np.array([[0.0], [0.0], [1 / M], [-1 / (M * l)]])
    S = np.kron(np.eye(2), np.array([[1.0, 0.0], [1.0, l]]))
    return S @ A @ np.linalg.inv(S), S @ B


@pytest.fixture(scope="module")
def cart_linearize():
    return jax.jit(lambda q, qd, p: CART.linearize(q, qd, 0.0, p, independent=INDEPENDENT))


@pytest.mark.parametrize("upright", [True, False])
def test_cart_pendulum_matches_the_textbook_linearization(cart_linearize, upright):
    """A and B equal the closed form to 1e-12 relative to max|A| ≈ 12 (automatic differentiation, a few
    dozen roundings). The eigenvalues: ±sqrt((M + m) g / (M l)) real upright, imaginary hanging, and a double
    zero (the free cart)."""
    lin = cart_linearize(*cart_point(upright), CART_P)
    A, B = cart_closed_form(upright)
    assert lin.names == ("x_c", "x_b", "x_c_dot", "x_b_dot")
    assert_tree_allclose(lin.A, jnp.asarray(A), rtol=0, atol=1e-12 * np.abs(A).max())
    assert_tree_allclose(lin.B, jnp.asarray(B), rtol=0, atol=1e-12)
    assert_tree_allclose(lin.rate, jnp.zeros(4), rtol=0, atol=1e-12)  # an equilibrium
    p = CART_P
    rate = float(jnp.sqrt((p["M"] + p["m"]) * p["g"] / (p["M"] * p["l"])))
    eig = np.asarray(lin.eigenvalues())
    expected = np.asarray([-rate, 0, 0, rate] if upright else [-1j * rate, 0, 0, 1j * rate])
    # the double zero is defective (ẍ_c = const: a Jordan block), so it scatters by ~sqrt(eps) = 1e-8
    for part in (np.real, np.imag):
        assert np.allclose(np.sort(part(eig)), np.sort(part(expected)), rtol=0, atol=1e-7)


def test_full_coordinate_jacobian_is_not_what_is_returned(cart_linearize):
    """The Jacobian of (q̇, q̈) in all 2n = 6 coordinates has the Baumgarte roots of λ² + 2αλ + β² = (λ + 5)²
    (defective: they scatter around -5 by ~1e-7) and a constraint drift pair; the returned A is 4 x 4 and
    holds only the pendulum's ±i·3.9 and the cart's double zero."""
    q, qd = cart_point(upright=False)

    def full(state):
        return jnp.concatenate([state[3:], CART.acceleration(state[:3], state[3:], 0.0, CART_P)])

    full_eig = np.linalg.eigvals(np.asarray(jax.jit(jax.jacfwd(full))(jnp.concatenate([q, qd]))))
    assert full_eig.shape == (6,) and np.sum(np.abs(full_eig + 5.0) < 1e-5) == 2
    lin = cart_linearize(q, qd, CART_P)
    assert lin.A.shape == (4, 4) and lin.B.shape == (4, 1)
    assert np.all(np.abs(np.asarray(lin.eigenvalues()) + 5.0) > 1.0)  # no Baumgarte mode
    # and changing the Baumgarte gains changes nothing in A (they vanish on the manifold)
    other = cart_linearize(q, qd, dict(CART_P, alpha=jnp.asarray(50.0), beta=jnp.asarray(0.0)))
    assert_tree_allclose(other.A, lin.A, rtol=0, atol=1e-12)


def test_gradient_of_the_unstable_eigenvalue_matches_finite_differences():
    """d/dp of the largest real part (the upright pendulum's sqrt((M + m) g / (M l))) by jax.grad through
    linearize and eigenvalues(), against central differences (step 1e-6: error ~1e-9) and the closed form.
    The free cart's defective double zero does not spoil it (jnp.linalg.eigvals' derivative is off by 78 %
    here: it inverts the singular eigenvector matrix)."""

    def growth(p):
        return jnp.max(
            jnp.real(CART.linearize(*cart_point(True, p), 0.0, p, independent=INDEPENDENT).eigenvalues())
        )

    # One compiled program gives the growth rate, its gradient and the closed form's gradient (the finite
    # differences call it too and use the value only): one compilation instead of three.
    closed_form = lambda p: jnp.sqrt((p["M"] + p["m"]) * p["g"] / (p["M"] * p["l"]))
    value_and_grads = jax.jit(lambda p: (jax.value_and_grad(growth)(p), jax.grad(closed_form)(p)))
    p = CART_P
    (_, grad), closed = value_and_grads(p)
    for key in ("M", "m", "l", "g"):
        fd = central_difference(
            lambda v, key=key: value_and_grads(dict(p, **{key: v}))[0][0], p[key], jnp.asarray(1.0)
        )
        assert abs(float(grad[key] - fd)) <= 1e-7 * (1 + abs(float(fd))), key
        assert abs(float(grad[key] - closed[key])) <= 1e-9 * (1 + abs(float(closed[key]))), key


def test_bad_choices_are_refused_with_the_culprit_named():
    q, qd = cart_point(upright=True)
    with pytest.raises(ValueError, match="leave 2 independent positions; independent lists 3"):
        CART.linearize(q, qd, 0.0, CART_P, independent=("x_c", "x_b", "y_b"))
    with pytest.raises(ValueError, match=r"dependent coordinates \['x_b'\].*condition number"):
        CART.linearize(
            q, qd, 0.0, CART_P, independent=("x_c", "y_b")
        )  # upright: x_b is not determined by y_b
    with pytest.raises(ValueError, match=r"positions of \['x_c'\] enter the dynamics"):
        CART.linearize(q, qd, 0.0, CART_P, independent=INDEPENDENT, drop=["x_c"])
    with pytest.raises(ValueError, match="off the constraint manifold"):
        CART.linearize(q.at[2].add(1e-3), qd, 0.0, CART_P, independent=INDEPENDENT)
    with pytest.raises(ValueError, match="coordinate 'z'"):
        CART.linearize(q, qd, 0.0, CART_P, independent=("x_c", "z"))
    with pytest.raises(ValueError, match="not among the independent positions"):
        CART.linearize(q, qd, 0.0, CART_P, independent=INDEPENDENT, drop=["y_b"])
    with pytest.raises(ValueError, match=r"u must have shape \(1,\)"):
        CART.linearize(q, qd, 0.0, CART_P, independent=INDEPENDENT, u=jnp.ones(2))


# ------------------------------------------------------------------ the rolling disk


def _disk_kinetic(q, qd, t, p):
    """q = (x, y, ψ, θ, φ): contact point (x, y), heading ψ, lean θ from the vertical, spin φ about the axis
    (body y). Orientation Rz(ψ) Rx(θ) Ry(φ); centre at (x, y, 0) + r Rz(ψ) Rx(θ) e_z; thin uniform disk:
    moments m r²/4 about a diameter, m r²/2 about the axis."""
    m, r = p["m"], p["r"]
    rotation = lambda q_: rotation_z(q_[2]) @ rotation_x(q_[3]) @ rotation_y(q_[4])
    tilt = lambda q_: rotation_z(q_[2]) @ rotation_x(q_[3])
    centre = lambda q_: jnp.stack([q_[0], q_[1], 0.0 * q_[0]]) + r * tilt(q_)[:, 2]
    inertia = jnp.stack([m * r**2 / 4, m * r**2 / 2, m * r**2 / 4])
    return rigid_body_kinetic_energy(rotation, centre, q, qd, m, inertia)


def _disk_potential(q, t, p):
    return p["m"] * p["g"] * p["r"] * jnp.cos(q[3])


ROLLING = Nonholonomic(
    lambda q, qd, t, p: jnp.stack(
        [qd[0] - p["r"] * qd[4] * jnp.cos(q[2]), qd[1] - p["r"] * qd[4] * jnp.sin(q[2])]
    ),
    name="rolling",
)
DISK = System.from_lagrangian(
    _disk_kinetic,
    _disk_potential,
    5,
    constraints=(ROLLING,),
    coordinate_names=("x", "y", "psi", "theta", "phi"),
)
DISK_P = {"m": jnp.asarray(1.5), "r": jnp.asarray(0.3), "g": jnp.asarray(9.81)}
CRITICAL = float(np.sqrt(9.81 / (3 * 0.3)))


def disk_linearization(spin, p=DISK_P):
    """Steady upright rolling at spin rate Ω along heading 0.4; x, y, ψ, φ dropped (cyclic)."""
    q = jnp.asarray([0.1, -0.2, 0.4, 0.0, 0.3])
    zero = 0.0 * spin
    qd = jnp.stack([p["r"] * spin * jnp.cos(0.4), p["r"] * spin * jnp.sin(0.4), zero, zero, spin])
    return DISK.linearize(
        q,
        qd,
        0.0,
        p,
        independent=("x", "y", "psi", "theta", "phi"),
        independent_rates=("psi", "theta", "phi"),
        drop=("x", "y", "psi", "phi"),
    )


def disk_closed_form(spin, p=DISK_P):
    """State matrix in (θ, ψ̇, θ̇, φ̇). Linearized Newton-Euler about the centre G, in the frame (e1 along the
    rolling direction, n the disk axis, u from contact to centre), moments A about a diameter and C about the
    axis, contact force F1 e1 + F2 e2 + N e3:

    * translation: F1 = m r ω̇_n, F2 = m r (Ω ψ̇ - θ̈), N = m g (ω_n = φ̇ + ψ̇ sin θ ≈ φ̇);
    * e1: A θ̈ - C Ω ψ̇ = m g r θ + r F2  →  (A + m r²) θ̈ = m g r θ + (C + m r²) Ω ψ̇;
    * u:  A ψ̈ + C Ω θ̇ = 0;   n: (C + m r²) ω̇_n = 0.

    Characteristic polynomial λ² (λ² + (C + m r²) C Ω² / ((A + m r²) A) - m g r / (A + m r²)): the lean is
    stable iff Ω² > m g r A / ((C + m r²) C) = g / (3 r) for the thin disk (A = m r²/4, C = m r²/2)."""
    m, r, g = (float(p[k]) for k in ("m", "r", "g"))
    A, C = m * r**2 / 4, m * r**2 / 2
    a, b, c = m * g * r / (A + m * r**2), (C + m * r**2) / (A + m * r**2), C / A
    matrix = np.array([[0, 0, 1, 0], [0, 0, -c * spin, 0], [a, b * spin, 0, 0], [0, 0, 0, 0]])
    return matrix, np.array([1.0, 0.0, b * c * spin**2 - a, 0.0, 0.0])


@pytest.fixture(scope="module")
def disk():
    """disk_linearization compiled once: the spin is made a strongly typed float64 (a Python float gives a
    weakly typed array, an entry of an array a strong one, and jit compiles each kind separately)."""
    jitted = jax.jit(disk_linearization)
    return lambda spin: jitted(jnp.asarray(spin, jnp.float64))


def test_rolling_disk_matches_the_closed_form(disk):
    """At 0.8 Ω_c and 1.3 Ω_c: names, the 4 x 4 state matrix and its characteristic polynomial equal the
    closed form to 1e-12 relative to max|A| ≈ 26; the dropped columns are zero to rounding (x, y, ψ, φ are
    cyclic) and the steady motion is a relative equilibrium (rate = 0)."""
    for spin in (0.8 * CRITICAL, 1.3 * CRITICAL):
        lin = disk(jnp.asarray(spin))
        matrix, poly = disk_closed_form(spin)
        assert lin.names == ("theta", "psi_dot", "theta_dot", "phi_dot") and lin.B is None
        tol = 1e-12 * np.abs(matrix).max()
        assert_tree_allclose(lin.A, jnp.asarray(matrix), rtol=0, atol=tol)
        assert np.allclose(np.poly(np.asarray(lin.A)), poly, rtol=0, atol=tol * np.abs(matrix).max())
        assert float(lin.drop_coupling) <= tol and float(jnp.max(jnp.abs(lin.rate))) <= tol


def test_rolling_disk_changes_stability_at_the_critical_spin(disk):
    """Bisection on the eigenvalues of the returned A (unstable iff some Re λ > 1e-6; below Ω_c the lean grows
    at sqrt(2 a δ) ~ 1e-2 for a relative speed deficit δ = 1e-6, far above the ~1e-8 scatter of the double
    zero) brackets Ω_c = sqrt(g / (3 r)) to 1e-6 relative; the secant method on the λ² coefficient of the
    characteristic polynomial (a quadratic in Ω, zero at Ω_c) finds it to 1e-10."""
    unstable = lambda spin: float(jnp.max(jnp.real(disk(jnp.asarray(spin)).eigenvalues()))) > 1e-6
    low, high = 0.5 * CRITICAL, 2.0 * CRITICAL
    assert unstable(low) and not unstable(high)
    while high - low > 1e-7 * CRITICAL:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if unstable(middle) else (low, middle)
    assert abs(0.5 * (low + high) / CRITICAL - 1) <= 1e-6

    def coefficient(spin):  # e₂ of the eigenvalues: the λ² coefficient of det(λI - A) for a 4 x 4 A
        A = np.asarray(disk(jnp.asarray(spin)).A)
        return 0.5 * (np.trace(A) ** 2 - np.trace(A @ A))

    spins = [1.5 * CRITICAL, 1.4 * CRITICAL]
    values = [coefficient(spin) for spin in spins]
    for _ in range(12):  # secant steps, superlinear
        if values[-1] == values[-2]:
            break
        spins.append(spins[-1] - values[-1] * (spins[-1] - spins[-2]) / (values[-1] - values[-2]))
        values.append(coefficient(spins[-1]))
    assert abs(spins[-1] / CRITICAL - 1) <= 1e-10


def test_plain_jit_and_vmap_agree(disk, cart_linearize):
    """The cart-pendulum plain and jitted, the disk jitted one rate at a time and vmapped over three rates:
    the same A (1e-12: the same operations, compiled or not)."""
    q, qd = cart_point(upright=True)
    plain = CART.linearize(q, qd, 0.0, CART_P, independent=INDEPENDENT)
    assert_tree_allclose(cart_linearize(q, qd, CART_P).A, plain.A, rtol=0, atol=1e-12)
    spins = jnp.asarray([0.7, 1.0, 1.4]) * CRITICAL
    batch = jax.jit(jax.vmap(disk_linearization))(spins)
    assert isinstance(batch, Linearization) and batch.A.shape == (3, 4, 4)
    assert batch.eigenvalues().shape == (3, 4)
    for i, spin in enumerate(spins):
        assert_tree_allclose(batch.A[i], disk(spin).A, rtol=0, atol=1e-12)


def test_nonholonomic_system_needs_its_independent_rates():
    q, qd = jnp.zeros(5), jnp.zeros(5)
    with pytest.raises(ValueError, match="2 nonholonomic constraint rows.*independent_rates"):
        DISK.linearize(q, qd, 0.0, DISK_P, independent=("x", "y", "psi", "theta", "phi"))
    with pytest.raises(ValueError, match="leave 3 independent rates; independent_rates lists 2"):
        DISK.linearize(q, qd, 0.0, DISK_P, independent=range(5), independent_rates=("theta", "phi"))


# ------------------------------------------------------------------ a compound pendulum from the helper
def test_compound_pendulum_from_the_kinetic_energy_helper():
    """A rigid body on a pivot, centre of mass at distance d, inertia I_c about it (axis z): the linearized
    hanging motion has ω² = m g d / (I_c + m d²) (e.g. Goldstein, Poole & Safko 2002, §5.1's compound
    pendulum), i.e. a small-oscillation period 2π sqrt((I_c + m d²)/(m g d)); 1e-12 relative."""
    p = {"m": jnp.asarray(2.0), "d": jnp.asarray(0.4), "I": jnp.asarray(0.05), "g": jnp.asarray(9.81)}

    def kinetic(q, qd, t, p):
        centre = lambda q_: p["d"] * jnp.stack([jnp.sin(q_[0]), -jnp.cos(q_[0]), 0.0 * q_[0]])
        inertia = jnp.stack([p["I"], p["I"], p["I"]])
        return rigid_body_kinetic_energy(lambda q_: rotation_z(q_[0]), centre, q, qd, p["m"], inertia)

    pendulum = System.from_lagrangian(kinetic, lambda q, t, p: -p["m"] * p["g"] * p["d"] * jnp.cos(q[0]), 1)
    lin = jax.jit(lambda q, qd, p: pendulum.linearize(q, qd, 0.0, p, independent=[0]))(
        jnp.zeros(1), jnp.zeros(1), p
    )
    omega2 = float(p["m"] * p["g"] * p["d"] / (p["I"] + p["m"] * p["d"] ** 2))
    assert lin.names == ("q0", "q0_dot")
    assert_tree_allclose(lin.A, jnp.asarray([[0.0, 1.0], [-omega2, 0.0]]), rtol=1e-12, atol=1e-12)
