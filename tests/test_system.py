"""Systems: Lagrangian construction vs hand-derived M and Q, composition (seed 003) vs directly written
systems and vs joint-coordinate Lagrangians, recursive vs one-shot UK, residuals, transformations, and bad
input."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, central_difference

from ukjax.constraints import AccelerationLevel, Baumgarte, Holonomic
from ukjax.system import Layout, System, compose

# Accelerations of O(1)-O(10) systems from different but exact formulas agree to round-off, ~1e-13; 1e-10
# leaves room for the rank-tolerance-free Cholesky and Kalman paths on conditions up to ~1e3.
TOL = dict(rtol=1e-10, atol=1e-10)
T0 = jnp.asarray(0.3)


# ------------------------------------------------------------------ building blocks
def _particle(actuated=False):
    """A planar point mass, coordinates (x, y), gravity along -y; parameters {"m", "g"}."""
    return System(
        mass=lambda q, t, p: p["m"] * jnp.eye(2),
        force=lambda q, qd, t, p: jnp.stack([jnp.zeros_like(p["m"]), -p["m"] * p["g"]]),
        n=2,
        actuation=(lambda q, t, p: jnp.eye(2)) if actuated else None,
        coordinate_names=("x", "y"),
    )


def _rod(a, b, length):
    """|b - a|² - l² = 0."""
    return jnp.sum((b - a) ** 2) - length**2


_GAINS = Baumgarte(lambda p: (p["alpha"], p["beta"]))


def _pendulum():
    """A particle on a rod of length p["l"] to the origin, stabilized with quadratic Baumgarte gains from p,
    with a non-ideal constraint vector c = -μ q̇ (seed 000 eq. 12; μ = p["mu"], zero for ideal
    constraints)."""
    rod = Holonomic(lambda q, t, p: _rod(jnp.zeros(2), q, p["l"]), baumgarte=_GAINS, name="rod")
    bob = _particle()
    return System(
        mass=bob.mass,
        force=bob.force,
        n=2,
        constraints=(rod,),
        nonideal=lambda q, qd, t, p: -p["mu"] * qd,
        coordinate_names=bob.coordinate_names,
    )


def _link(layout_path, length_key="link"):
    """A rod between the bobs at ``layout_path`` ((layout, name) pairs); gains and length from p[key]."""

    def phi(q, t, p):
        ends = []
        for path in layout_path:
            x = q
            for layout, name in path:
                x = layout.split(x)[name]
            ends.append(x)
        return _rod(ends[0], ends[1], p[length_key]["l"])

    return Holonomic(phi, baumgarte=Baumgarte(lambda p: (p[length_key]["alpha"], p[length_key]["beta"])))


PENDULUM, PARTICLE = _pendulum(), _particle()
LAYOUT2 = Layout.of({"a": PENDULUM, "b": PARTICLE})
DOUBLE = compose({"a": PENDULUM, "b": PARTICLE}, [_link([[(LAYOUT2, "a")], [(LAYOUT2, "b")]])])
LAYOUT3 = Layout.of({"dp": DOUBLE, "c": PARTICLE})
TRIPLE = compose(  # level 3: the double pendulum (itself two levels) and a third bob on a rod
    {"dp": DOUBLE, "c": PARTICLE},
    [_link([[(LAYOUT3, "dp"), (LAYOUT2, "b")], [(LAYOUT3, "c")]])],
)


def _direct_chain(N):
    """The N-link pendulum written at once in 2N Cartesian coordinates (flat parameters, arrays of N)."""

    def rods(q, t, p):
        pos = q.reshape(N, 2)
        prev = jnp.concatenate([jnp.zeros((1, 2)), pos[:-1]])
        return jnp.sum((pos - prev) ** 2, axis=1) - p["l"] ** 2

    free = System(
        mass=lambda q, t, p: jnp.diag(jnp.repeat(p["m"], 2)),
        force=lambda q, qd, t, p: jnp.stack([jnp.zeros_like(p["m"]), -p["m"] * p["g"]], axis=1).reshape(-1),
        n=2 * N,
    )
    return free.with_constraints(Holonomic(rods, baumgarte=_GAINS))


DIRECT2, DIRECT3 = _direct_chain(2), _direct_chain(3)


def _flat_params(N):
    return {
        "m": jnp.asarray([1.0, 0.7, 1.3][:N]),
        "l": jnp.asarray([1.0, 0.8, 0.6][:N]),
        "g": jnp.asarray(9.81),
        "alpha": jnp.asarray([2.0, 3.0, 1.5][:N]),
        "beta": jnp.asarray([5.0, 4.0, 6.0][:N]),
    }


def _nested_params(flat):
    """The composed systems' parameters {name: p_name, ..., "link": ...} from the flat ones."""
    g = flat["g"]
    bob = lambda k: {"m": flat["m"][k], "g": g}
    link = lambda k: {"l": flat["l"][k], "alpha": flat["alpha"][k], "beta": flat["beta"][k]}
    a = {**bob(0), **link(0), "mu": flat.get("mu", jnp.asarray(0.0))}
    double = {"a": a, "b": bob(1), "link": link(1)}
    if flat["m"].shape[0] == 2:
        return double
    return {"dp": double, "c": bob(2), "link": link(2)}


# Joint-coordinate chain from a Lagrangian (T from the Cartesian kinematics), the independent reference.
def _chain_positions(theta, lengths):
    return jnp.cumsum(jnp.stack([lengths * jnp.sin(theta), -lengths * jnp.cos(theta)], axis=1), axis=0)


def _chain_kinetic(q, qd, t, p):
    _, vel = jax.jvp(lambda th: _chain_positions(th, p["l"]), (q,), (qd,))
    return 0.5 * jnp.sum(p["m"] * jnp.sum(vel**2, axis=1))


def _chain_potential(q, t, p):
    return jnp.sum(p["m"] * p["g"] * _chain_positions(q, p["l"])[:, 1])


JOINT2 = System.from_lagrangian(_chain_kinetic, _chain_potential, 2)
JOINT3 = System.from_lagrangian(_chain_kinetic, _chain_potential, 3)


def _consistent_state(theta, theta_dot, p):
    """Cartesian q, q̇ of the chain at joint state (θ, θ̇): on the constraint manifold."""
    q, qd = jax.jvp(lambda th: _chain_positions(th, p["l"]).reshape(-1), (theta,), (theta_dot,))
    return q, qd


def _cartesian_acceleration(theta, theta_dot, theta_ddot, p):
    """d²/dt² of the bob positions: J θ̈ + (d/dt J) θ̇, by nested forward-mode products."""
    pos = lambda th: _chain_positions(th, p["l"]).reshape(-1)
    _, J_thdd = jax.jvp(pos, (theta,), (theta_ddot,))
    _, convective = jax.jvp(lambda th: jax.jvp(pos, (th,), (theta_dot,))[1], (theta,), (theta_dot,))
    return J_thdd + convective


@functools.partial(jax.jit, static_argnames="solvers")
def _evaluate(system, qs, qds, t, p, solvers=("uk", "recursive")):
    """Everything a System computes, at a batch of states: one compile per system."""

    def one(q, qd):
        A, b = system.constraint_equations(q, qd, t, p)
        out = dict(A=A, b=b, M=system.mass_matrix(q, t, p), Q=system.given_force(q, qd, t, p))
        out["residuals"] = system.residuals(q, qd, t, p)
        if system.nonideal is not None:
            out["c"] = system.nonideal_vector(q, qd, t, p)
        if "uk" in solvers:
            out["uk"] = system.acceleration(q, qd, t, p, method="svd")  # compiles faster than "cholesky"
        if "recursive" in solvers:
            out["recursive"] = system.acceleration(q, qd, t, p, solver="recursive")
        return out

    return jax.vmap(one)(qs, qds)


def _kkt_reference(M, F, A, b):
    """q̈ from the Lagrange-multiplier system [[M, -Aᵀ], [A, 0]] [q̈; λ] = [F; b], solved by NumPy."""
    M, F, A, b = (np.asarray(x) for x in (M, F, A, b))
    n, m = M.shape[0], A.shape[0]
    K = np.block([[M, -A.T], [A, np.zeros((m, m))]])
    return np.linalg.solve(K, np.concatenate([F, b]))[:n]


def _random_states(n, count, seed):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(count, n))), jnp.asarray(rng.normal(size=(count, n)))


# ------------------------------------------------------------------ from_lagrangian
def test_double_pendulum_lagrangian_matches_hand_mass_and_force():
    """Joint coordinates: M = [[(m1+m2)l1², m2 l1 l2 c], [m2 l1 l2 c, m2 l2²]],
    Q = [-m2 l1 l2 s θ̇2² - (m1+m2) g l1 sin θ1, m2 l1 l2 s θ̇1² - m2 g l2 sin θ2], c, s = cos, sin(θ1 -
    θ2)."""
    p = _flat_params(2)
    m1, m2 = p["m"]
    l1, l2 = p["l"]
    g = p["g"]

    @jax.jit
    def both(q, qd):  # the system's M, Q and energy, and the hand-written forms: one compiled call
        c, s = jnp.cos(q[0] - q[1]), jnp.sin(q[0] - q[1])
        M_hand = jnp.asarray([[(m1 + m2) * l1**2, m2 * l1 * l2 * c], [m2 * l1 * l2 * c, m2 * l2**2]])
        Q_hand = jnp.stack(
            [
                -m2 * l1 * l2 * s * qd[1] ** 2 - (m1 + m2) * g * l1 * jnp.sin(q[0]),
                m2 * l1 * l2 * s * qd[0] ** 2 - m2 * g * l2 * jnp.sin(q[1]),
            ]
        )
        ours = (JOINT2.mass_matrix(q, T0, p), JOINT2.given_force(q, qd, T0, p), JOINT2.energy(q, qd, T0, p))
        return ours, (M_hand, Q_hand, _chain_kinetic(q, qd, T0, p) + _chain_potential(q, T0, p))

    for q, qd in zip(*_random_states(2, 3, seed=3), strict=True):
        (M, Q, E), (M_hand, Q_hand, E_hand) = both(q, qd)
        assert_tree_allclose((M, Q), (M_hand, Q_hand), rtol=1e-12, atol=1e-12)
        assert_tree_allclose(E, E_hand, rtol=1e-12, atol=1e-12)


def _bead_kinetic(q, qd, t, p):
    """Bead at R = r e(ωt) + h sin(νt) ĵ on a wire turning at ω about a pivot that moves vertically."""
    w, h, nu = p["omega"], p["h"], p["nu"]
    e, e_perp = jnp.stack([jnp.cos(w * t), jnp.sin(w * t)]), jnp.stack([-jnp.sin(w * t), jnp.cos(w * t)])
    R_dot = qd[0] * e + q[0] * w * e_perp + jnp.stack([jnp.zeros_like(t), h * nu * jnp.cos(nu * t)])
    return 0.5 * p["m"] * jnp.sum(R_dot**2)


def _bead_potential(q, t, p):
    return p["m"] * p["g"] * (q[0] * jnp.sin(p["omega"] * t) + p["h"] * jnp.sin(p["nu"] * t))


def test_rheonomic_bead_lagrangian_matches_newton():
    """T depends on t (with a q̇-t cross term). Newton along the wire: m r̈ = m r ω² + m h ν² sin νt sin ωt
    - m g sin ωt, M = m."""
    p = {k: jnp.asarray(v) for k, v in dict(m=0.8, g=9.81, omega=1.7, h=0.3, nu=2.9).items()}
    bead = System.from_lagrangian(_bead_kinetic, _bead_potential, 1)

    @jax.jit
    def both(q, qd, t):  # the system's M and Q, and Newton's: one compiled call
        w, nu, r = p["omega"], p["nu"], q[0]
        Q_hand = p["m"] * (
            r * w**2 + p["h"] * nu**2 * jnp.sin(nu * t) * jnp.sin(w * t) - p["g"] * jnp.sin(w * t)
        )
        return (bead.mass_matrix(q, t, p), bead.given_force(q, qd, t, p)), (p["m"] * jnp.eye(1), Q_hand[None])

    for r, r_dot, t in [(0.5, -0.2, 0.1), (1.3, 0.7, 1.9), (-0.4, 2.0, 4.2)]:
        ours, hand = both(jnp.asarray([r]), jnp.asarray([r_dot]), jnp.asarray(t))
        assert_tree_allclose(ours, hand, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ composition
@functools.cache
def _chain_case(N):
    """Composed and direct N-link chains evaluated at 2 random states and 2 states on the manifold (from joint
    coordinates), with μ = 0.4 on bob a in the composed system; plus the joint-coordinate reference θ̈."""
    composed, direct, joint = (DOUBLE, DIRECT2, JOINT2) if N == 2 else (TRIPLE, DIRECT3, JOINT3)
    flat = _flat_params(N)
    nested = _nested_params({**flat, "mu": jnp.asarray(0.4)})
    ideal = _nested_params(flat)
    q_rand, qd_rand = _random_states(2 * N, 2, seed=10 + N)
    thetas, theta_dots = _random_states(N, 2, seed=20 + N)
    q_on, qd_on = jax.jit(jax.vmap(_consistent_state, in_axes=(0, 0, None)))(thetas, theta_dots, flat)
    qs, qds = jnp.concatenate([q_rand, q_on]), jnp.concatenate([qd_rand, qd_on])
    solve = jax.jit(
        jax.vmap(
            lambda th, thd: jnp.linalg.solve(
                joint.mass_matrix(th, T0, flat), joint.given_force(th, thd, T0, flat)
            )
        )
    )
    # The recursive solver (slow to compile) runs on the three-level system only.
    solvers = ("uk", "recursive") if N == 3 else ("uk",)
    arrays = dict(  # as NumPy arrays: the tests index them, which op by op would compile a program per slice
        composed=_evaluate(composed, qs, qds, T0, nested, solvers=solvers),
        composed_ideal=_evaluate(composed, qs, qds, T0, ideal, solvers=solvers),
        direct=_evaluate(direct, qs, qds, T0, flat, solvers=()),
        qs=qs,
        qds=qds,
        thetas=thetas,
        theta_dots=theta_dots,
        theta_ddots=solve(thetas, theta_dots),
    )
    return dict(jax.tree_util.tree_map(np.asarray, arrays), solvers=solvers, flat=flat)


@pytest.mark.parametrize("N", [2, 3])
def test_composed_chain_equals_direct_chain(N):
    """Two (three) pendulums composed level by level equal the chain written at once: same M, Q, A, b
    (Baumgarte terms included, states off the manifold too) and residuals; c sits in bob a's slots; q̈ by the
    UK equation and by the recursive (Kalman) solver equal the NumPy KKT solution with F = Q + c."""
    case = _chain_case(N)
    composed, direct = case["composed"], case["direct"]
    for key in ("A", "b", "M", "Q", "residuals"):
        assert_tree_allclose(composed[key], direct[key], **TOL, msg=key)
    qds = case["qds"]
    c_hand = np.concatenate([-0.4 * qds[:, :2], np.zeros((4, 2 * N - 2))], axis=1)
    assert_tree_allclose(composed["c"], c_hand, **TOL)
    for i in range(4):
        F = direct["Q"][i] + c_hand[i]
        expected = _kkt_reference(direct["M"][i], F, direct["A"][i], direct["b"][i])
        for solver in case["solvers"]:
            assert_tree_allclose(composed[solver][i], expected, **TOL, msg=f"{solver} {i}")
    assert not np.allclose(composed["uk"], case["composed_ideal"]["uk"])  # c matters
    assert (TRIPLE if N == 3 else DOUBLE).coordinate_names[-2:] == (
        ("c.x", "c.y") if N == 3 else ("b.x", "b.y")
    )


@pytest.mark.parametrize("N", [2, 3])
def test_composed_chain_equals_joint_coordinate_lagrangian(N):
    """On the manifold, composed Cartesian UK accelerations (ideal, μ = 0) = kinematics of the
    joint-coordinate Lagrangian solution θ̈ = M(θ)⁻¹Q(θ, θ̇): two formulations sharing no dynamics code. The
    ideal constraint force does no work there: q̇ᵀ(M q̈ - Q) = 0."""
    case = _chain_case(N)
    ideal = case["composed_ideal"]
    position, velocity = ideal["residuals"]
    assert_tree_allclose((position[2:], velocity[2:]), (np.zeros((2, N)), np.zeros((2, N))), atol=1e-12)
    expected_all = np.asarray(
        jax.jit(jax.vmap(_cartesian_acceleration, in_axes=(0, 0, 0, None)))(
            case["thetas"], case["theta_dots"], case["theta_ddots"], case["flat"]
        )
    )
    for i in range(2):
        expected = expected_all[i]
        for solver in case["solvers"]:
            assert_tree_allclose(ideal[solver][2 + i], expected, **TOL, msg=solver)
        qd, qdd = case["qds"][2 + i], ideal["uk"][2 + i]
        assert abs(float(qd @ (ideal["M"][2 + i] @ qdd - ideal["Q"][2 + i]))) < 1e-10


def test_layout_split_join_and_nesting():
    q = jnp.arange(6.0)
    parts = TRIPLE.layout.split(q)
    assert_tree_allclose(parts, {"dp": q[:4], "c": q[4:]})
    assert_tree_allclose(DOUBLE.layout.split(parts["dp"]), {"a": q[:2], "b": q[2:4]})
    assert_tree_allclose(TRIPLE.layout.join(parts), q)
    assert TRIPLE.layout == LAYOUT3 and TRIPLE.n == 6
    with pytest.raises(ValueError, match=r"\(6,\).*\(5,\)"):
        TRIPLE.layout.split(jnp.zeros(5))


def test_composed_energy_is_the_sum_of_the_parts():
    p = _flat_params(2)
    pair = compose({"j": JOINT2, "k": JOINT2})
    q, qd = jnp.asarray([0.1, 0.2, -0.3, 0.4]), jnp.asarray([1.0, -1.0, 0.5, 0.2])
    expected = JOINT2.energy(q[:2], qd[:2], T0, p) + JOINT2.energy(q[2:], qd[2:], T0, p)
    assert_tree_allclose(pair.energy(q, qd, T0, {"j": p, "k": p}), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="from_lagrangian"):
        DOUBLE.energy(jnp.zeros(4), jnp.zeros(4), T0, _nested_params(p))


def test_actuation_and_servo_constraints_are_inherited():
    servo = Holonomic(lambda q, t, p: q[0] - jnp.sin(t), name="track")
    actuated = _particle(actuated=True).with_constraints(servo_constraints=(servo,))
    both = compose({"a": actuated, "b": PARTICLE})
    q = jnp.asarray([0.1, 0.2, 0.3, 0.4])
    B = both.actuation(q, T0, {"a": {}, "b": {}})
    assert_tree_allclose(B, jnp.concatenate([jnp.eye(2), jnp.zeros((2, 2))]))
    assert len(both.servo_constraints) == 1 and both.servo_constraints[0].name == "a.track"
    A, b = both.servo_constraints[0].second_order(q, q, T0, {"a": {}, "b": {}})
    assert_tree_allclose((A, b), (jnp.asarray([[1.0, 0.0, 0.0, 0.0]]), -jnp.sin(T0)[None]))  # φ̈ = ẍ + sin t
    explicit = compose({"a": actuated, "b": PARTICLE}, actuation=lambda q, t, p: jnp.ones((4, 1)))
    assert explicit.actuation(q, T0, {}).shape == (4, 1)


# ------------------------------------------------------------------ no constraints
UNCONSTRAINED_METHODS = ("cholesky", "svd", "greville", "householder", "mgs", "varga")


@functools.cache
def _unconstrained():
    """A, b, the residuals and q̈ by every method and solver of the damped particle, in one compiled call
    shared by the parametrized test below."""
    p = {"m": jnp.asarray(2.0), "g": jnp.asarray(9.81), "mu": jnp.asarray(0.5)}
    system = dataclasses.replace(PARTICLE, nonideal=lambda q, qd, t, p: -p["mu"] * qd)

    @jax.jit
    def everything(q, qd):
        qdd = {
            (method, solver): system.acceleration(q, qd, T0, p, method=method, solver=solver)
            for method in UNCONSTRAINED_METHODS
            for solver in ("uk", "recursive")
        }
        return system.constraint_equations(q, qd, T0, p), system.residuals(q, qd, T0, p), qdd

    return everything(jnp.asarray([0.3, -0.1]), jnp.asarray([1.0, 2.0]))


@pytest.mark.parametrize("method", UNCONSTRAINED_METHODS)
def test_unconstrained_system_all_methods(method):
    """A of shape (0, n): q̈ = M⁻¹(Q + c) whatever the method or solver."""
    (A, b), residuals, qdd = _unconstrained()
    assert A.shape == (0, 2) and b.shape == (0,)
    assert all(r.shape == (0,) for r in residuals)
    expected = jnp.asarray([-0.25 * 1.0, -9.81 - 0.25 * 2.0])
    for solver in ("uk", "recursive"):
        assert_tree_allclose(qdd[method, solver], expected, **TOL)


# ------------------------------------------------------------------ transformations
PENDULUM_PARAMS = {
    k: jnp.asarray(v) for k, v in dict(m=1.2, g=9.81, l=0.9, alpha=2.0, beta=5.0, mu=0.3).items()
}


def _pendulum_outputs(theta, q, qd):
    """q̈ and b of the pendulum as functions of (m, l, α, β, μ) = theta."""
    p = {**PENDULUM_PARAMS, **dict(zip(("m", "l", "alpha", "beta", "mu"), theta, strict=True))}
    return PENDULUM.acceleration(q, qd, T0, p), PENDULUM.constraint_equations(q, qd, T0, p)[1]


_pendulum_jit = jax.jit(_pendulum_outputs)


def test_jit_vmap_grad_of_acceleration_and_constraint_equations():
    """plain vs jit vs vmap; gradients w.r.t. mass, rod length, Baumgarte gains and friction vs central
    differences (eps = 1e-6: truncation ~1e-12 |f'''|, round-off ~1e-16/1e-6 |f| = 1e-10; tolerance 1e-7)."""
    theta = jnp.asarray([1.2, 0.9, 2.0, 5.0, 0.3])
    qs, qds = _random_states(2, 3, seed=7)  # off the manifold: every Baumgarte term is active
    plain = _pendulum_outputs(theta, qs[0], qds[0])
    jitted = [_pendulum_jit(theta, q, qd) for q, qd in zip(qs, qds, strict=True)]
    batched = jax.jit(jax.vmap(_pendulum_outputs, in_axes=(None, 0, 0)))(theta, qs, qds)
    assert_tree_allclose(plain, jitted[0], **TOL)
    assert_tree_allclose(batched, jax.tree_util.tree_map(lambda *x: jnp.stack(x), *jitted), **TOL)

    def objective(th):
        qdd, b = _pendulum_outputs(th, qs[1], qds[1])
        return jnp.asarray([0.3, -1.0]) @ qdd + 0.1 * b[0]

    def objective_jit(th):
        qdd, b = _pendulum_jit(th, qs[1], qds[1])
        return jnp.asarray([0.3, -1.0]) @ qdd + 0.1 * b[0]

    grad = jax.jit(jax.grad(objective))(theta)
    fd = jnp.stack([central_difference(objective_jit, theta, e) for e in jnp.eye(5)])
    assert_tree_allclose(grad, fd, rtol=1e-7, atol=1e-7)
    assert np.all(np.abs(np.asarray(grad)) > 1e-3)  # every parameter reaches the output


# ------------------------------------------------------------------ bad input
def test_bad_input_raises_value_errors_naming_shapes():
    flat = _flat_params(2)
    with pytest.raises(ValueError, match=r"\(4,\).*\(3,\) and \(4,\)"):
        DIRECT2.acceleration(jnp.zeros(3), jnp.zeros(4), T0, flat)
    with pytest.raises(ValueError, match=r"\(4,\).*\(4,\) and \(5,\)"):
        DIRECT2.constraint_equations(jnp.zeros(4), jnp.zeros(5), T0, flat)
    with pytest.raises(ValueError, match=r"\(4,\).*\(2,\) and \(2,\)"):
        DIRECT2.residuals(jnp.zeros(2), jnp.zeros(2), T0, flat)
    bad_mass = System(mass=lambda q, t, p: jnp.eye(3), force=lambda q, qd, t, p: jnp.zeros(2), n=2)
    with pytest.raises(ValueError, match=r"\(3, 3\).*\(2, 2\)"):
        bad_mass.acceleration(jnp.zeros(2), jnp.zeros(2), T0, {})
    bad_force = System(mass=lambda q, t, p: jnp.eye(2), force=lambda q, qd, t, p: jnp.zeros(3), n=2)
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        bad_force.acceleration(jnp.zeros(2), jnp.zeros(2), T0, {})
    wide = AccelerationLevel(A=lambda q, qd, t, p: jnp.ones((1, 3)), b=lambda q, qd, t, p: 1.0, name="wide")
    with pytest.raises(ValueError, match=r"'wide'.*\(1, 3\).*\(k, 2\)"):
        _particle().with_constraints(wide).constraint_equations(jnp.zeros(2), jnp.zeros(2), T0, {})
    matrix = Holonomic(lambda q, t, p: jnp.outer(q, q), name="matrix")
    with pytest.raises(ValueError, match=r"matrix.*\(2, 2\)"):
        _particle().with_constraints(matrix).acceleration(jnp.ones(2), jnp.ones(2), T0, {"m": 1.0, "g": 1.0})
    with pytest.raises(ValueError, match="solver"):
        DIRECT2.acceleration(jnp.zeros(4), jnp.zeros(4), T0, flat, solver="kalman")
    with pytest.raises(ValueError, match="method"):
        DIRECT2.acceleration(jnp.zeros(4), jnp.zeros(4), T0, flat, method="lu")
    with pytest.raises(ValueError, match="layout covers 2"):
        System(mass=DIRECT2.mass, force=DIRECT2.force, n=4, layout=Layout(names=("a",), sizes=(2,)))
