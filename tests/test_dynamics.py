"""ukjax.dynamics against references it shares no code with.

References: the augmented (KKT) system solved by NumPy least squares; Gauss's principle and the
virtual-work statements of seed 000 eq. 8-12, checked with SciPy null-space bases; a pendulum in redundant
coordinates with a massless coordinate, solved in its single angle; the information form of a static Kalman
filter for clearance covariances (seed 003 eq. 4.17-4.18); NumPy projection residuals for seed 000 eq. 27.

Compile budget: every public function compiles (jax.jit inside ukjax) once per shape and option set, so
all tests share one problem shape (n = 6, m = 4, full rank or rank 3), one block structure for the
recursive form and few clearance patterns; the references pass c = 0 rather than no c, to reuse the programs
that all_forms compiles, and the clearance test's information form is built in NumPy. The gradient tests
stay op by op on purpose: their finite differences then reuse the forms' compiled programs (jitting f and
grad(f) compiled each form again inside them: 108 instead of 178 programs, but 1.6 times the compile time).

Tolerances: the random problems have cond(M) <= 30 and singular values of A in [0.5, 2], so every form is
accurate to ~1e-13 (worst observed 5e-14); 1e-10 leaves room for platform differences while still catching
any wrong term, whose effect is O(1). Finite differences are central with eps = 1e-6: truncation O(eps²) ~
1e-12 and round-off O(1e-16 / eps) ~ 1e-10 relative to O(1) values, hence rtol = 1e-6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import assert_tree_allclose, central_difference, random_matrix, random_normal, random_spd

from ukjax import dynamics as dyn
from ukjax.linalg import PINV_METHODS

TOL = dict(rtol=1e-10, atol=1e-10)
# (n, m, rank A): full row rank, and rank-deficient. Every test below uses these array shapes, so each public
# function compiles once for the whole file (see the compile budget in the module docstring).
FULL, DEFICIENT = (6, 4, 4), (6, 4, 3)


def make_problem(seed, n, m, rank, cond=30.0):
    """Random SPD M, consistent b = A x (b in range(A)), non-ideal vector c."""
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    A = random_matrix(k[2], m, n, rank)
    return (
        random_spd(k[0], n, cond),
        random_normal(k[1], (n,)),
        A,
        A @ random_normal(k[3], (n,)),
        random_normal(k[4], (n,)),
    )


def blocks_of(A, b):
    """Three constraint blocks: the first two rows, the rest, and the first row again (redundant)."""
    return [(A[:2], b[:2]), (A[2:], b[2:]), (A[:1], b[:1])]


def all_forms(M, Q, A, b, c, methods=("svd",)):
    # Forms without a c argument get Q + c as given force: by seed 000 eq. 12, Q^c_nid - c lies in
    # range(Aᵀ), so q̈ with non-ideal vector c is the ideal q̈ for the force Q + c.
    F = Q + c
    out = {"cholesky": dyn.uk_acceleration(M, Q, A, b, c), "eq35": dyn.uk_acceleration_eq35(M, Q, A, b, c)}
    for method in methods:
        out[method] = dyn.uk_acceleration(M, Q, A, b, c, method=method)
    out["kkt"], out["kkt_lambda"] = dyn.kkt_acceleration(M, F, A, b)
    for form in dyn.SINGULAR_MASS_FORMS:
        out[form] = dyn.singular_mass_acceleration(M, Q, A, b, c, form=form)
    out["recursive"] = dyn.recursive_uk_acceleration(M, F, blocks_of(A, b))
    for method in ("cholesky", "svd"):
        force = dyn.uk_constraint_force(M, Q, A, b, c, method=method)
        out["ideal_" + method], out["nonideal_" + method] = force.ideal, force.nonideal
    return out


ACCELERATION_KEYS = ["cholesky", "eq35", "kkt", *dyn.SINGULAR_MASS_FORMS, "recursive"]


def numpy_kkt(M, F, A, b):
    """Minimum-norm least-squares solution of [[M, -Aᵀ], [A, 0]] [q̈; λ] = [F; b] by NumPy."""
    M, F, A, b = (np.asarray(x) for x in (M, F, A, b))
    n, m = M.shape[0], A.shape[0]
    K = np.block([[M, -A.T], [A, np.zeros((m, m))]])
    sol = np.linalg.lstsq(K, np.concatenate([F, b]), rcond=None)[0]
    return sol[:n], sol[n:]


@pytest.mark.parametrize("shape,methods", [(FULL, ("svd",)), (DEFICIENT, PINV_METHODS)])
def test_all_forms_agree_with_numpy_kkt(shape, methods):
    """Every form and every generalized-inverse algorithm vs the KKT system solved by NumPy."""
    M, Q, A, b, c = make_problem(0, *shape)
    out = all_forms(M, Q, A, b, c, methods)
    qdd_ref, lam_ref = numpy_kkt(M, Q + c, A, b)
    qdd_ideal, _ = numpy_kkt(M, Q, A, b)
    for key in [*ACCELERATION_KEYS, *methods]:
        assert_tree_allclose(out[key], qdd_ref, **TOL, msg=key)
    assert_tree_allclose(out["kkt_lambda"], lam_ref, **TOL, msg="multiplier")
    ideal_ref = np.asarray(M) @ qdd_ideal - np.asarray(Q)
    total_ref = np.asarray(M) @ qdd_ref - np.asarray(Q)
    for method in ("cholesky", "svd"):
        assert_tree_allclose(out["ideal_" + method], ideal_ref, **TOL, msg="ideal " + method)
        assert_tree_allclose(out["nonideal_" + method], total_ref - ideal_ref, **TOL, msg=method)


def test_jit_and_vmap_agree_with_plain_calls():
    """jit(vmap(...)) over three problems vs one plain call per problem (plain calls compile internally)."""
    problems = [make_problem(seed, *DEFICIENT) for seed in (1, 2, 3)]
    plain = [all_forms(*p) for p in problems]
    batched = jax.jit(jax.vmap(all_forms))(*(jnp.stack(x) for x in zip(*problems, strict=True)))
    expected = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *plain)
    assert_tree_allclose(batched, expected, rtol=1e-12, atol=1e-12, msg="jit(vmap) vs plain")


@pytest.mark.parametrize("shape", [FULL, DEFICIENT])
def test_gauss_principle_and_virtual_work(shape):
    M, Q, A, b, c = make_problem(4, *shape)
    out = all_forms(M, Q, A, b, c)
    Mn, An, cn = np.asarray(M), np.asarray(A), np.asarray(c)
    N = scipy.linalg.null_space(An)  # virtual displacements: A v = 0
    a_F = np.linalg.solve(Mn, np.asarray(Q) + cn)
    qdd = np.asarray(out["cholesky"])

    def gauss(x):  # Gauss's function for the force Q + c, i.e. (x - a)ᵀM(x - a) - 2cᵀx + const
        return (x - a_F) @ Mn @ (x - a_F)

    np.testing.assert_allclose(An @ qdd, np.asarray(b), **TOL)
    np.testing.assert_allclose(N.T @ Mn @ (qdd - a_F), 0.0, atol=1e-10)  # stationary on the constraint set
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = N @ rng.normal(size=N.shape[1]) * 10.0 ** rng.uniform(-4, 1)
        assert gauss(qdd + z) > gauss(qdd) - 1e-12
    for method in ("cholesky", "svd"):
        # seed 000 eq. 9-10: the ideal force does no virtual work, the non-ideal one does vᵀc.
        np.testing.assert_allclose(N.T @ np.asarray(out["ideal_" + method]), 0.0, atol=1e-10)
        np.testing.assert_allclose(N.T @ np.asarray(out["nonideal_" + method]), N.T @ cn, **TOL)


def test_square_root_identity():
    """The identities behind the Cholesky form, by SciPy's sqrtm and NumPy's pinv, at rank-deficient A."""
    M, _, A, _, _ = (np.asarray(x) for x in make_problem(5, *DEFICIENT))
    S = np.real(scipy.linalg.sqrtm(M))
    B_pinv = np.linalg.pinv(A @ np.linalg.inv(S), rcond=1e-12)
    G_pinv = np.linalg.pinv(A @ np.linalg.solve(M, A.T), rcond=1e-12, hermitian=True)
    np.testing.assert_allclose(np.linalg.solve(S, B_pinv), np.linalg.solve(M, A.T) @ G_pinv, **TOL)
    np.testing.assert_allclose(S @ B_pinv, A.T @ G_pinv, **TOL)


def test_unconstrained_problem():
    M, Q, _, _, c = make_problem(6, *DEFICIENT)
    A, b = jnp.zeros((0, 6)), jnp.zeros((0,))
    expected = np.linalg.solve(np.asarray(M), np.asarray(Q + c))
    for method in ("cholesky", "svd"):
        assert_tree_allclose(dyn.uk_acceleration(M, Q, A, b, c, method=method), expected, **TOL, msg=method)


def pendulum_in_redundant_coordinates(theta, omega, length=1.5, mass=2.0, g=9.81):
    """q = (x, y, s): a point mass on a rod of the given length, and a massless coordinate s = x y."""
    x, y = length * np.sin(theta), -length * np.cos(theta)
    xd, yd = length * np.cos(theta) * omega, length * np.sin(theta) * omega
    M = np.diag([mass, mass, 0.0])
    Q = np.array([0.0, -mass * g, 0.0])
    A = np.array([[x, y, 0.0], [-y, -x, 1.0]])  # d²/dt² of (x² + y² - l²)/2 and of s - x y
    b = np.array([-(xd**2 + yd**2), 2 * xd * yd])
    # The same motion in its one angle: θ̈ = -(g/l) sin θ, then differentiate x, y, s = x y twice.
    thdd = -g / length * np.sin(theta)
    xdd = length * (np.cos(theta) * thdd - np.sin(theta) * omega**2)
    ydd = length * (np.sin(theta) * thdd + np.cos(theta) * omega**2)
    return M, Q, A, b, np.array([xdd, ydd, xdd * y + 2 * xd * yd + x * ydd])


@pytest.mark.parametrize("theta,omega", [(0.7, 1.3), (-2.0, 0.0)])
def test_singular_mass_pendulum(theta, omega):
    M, Q, A, b, expected = pendulum_in_redundant_coordinates(theta, omega)
    for form in dyn.SINGULAR_MASS_FORMS:
        qdd = dyn.singular_mass_acceleration(M, Q, A, b, form=form, check=True)
        assert_tree_allclose(qdd, expected, **TOL, msg=form)
    assert_tree_allclose(dyn.kkt_acceleration(M, Q, A, b, check=True)[0], expected, **TOL, msg="kkt")


@pytest.mark.parametrize("rank", [4, 3])
def test_singular_mass_random(rank):
    """M = WᵀW of rank 4 in 6 coordinates; [M; A] has rank 6, so the constrained motion is unique."""
    k = jax.random.split(jax.random.PRNGKey(7), 4)
    W = random_normal(k[0], (4, 6))
    M, Q, c = W.T @ W, random_normal(k[1], (6,)), random_normal(k[2], (6,))
    A = random_matrix(k[3], 4, 6, rank)
    b = A @ jnp.arange(1.0, 7.0)
    assert np.linalg.matrix_rank(np.vstack([M, A])) == 6
    expected, _ = numpy_kkt(M, Q + c, A, b)
    for form in dyn.SINGULAR_MASS_FORMS:
        qdd = dyn.singular_mass_acceleration(M, Q, A, b, c, form=form)
        assert_tree_allclose(qdd, expected, **TOL, msg=form)


def test_recursive_equals_one_shot_and_projected_covariance():
    """R = 0, rank-deficient A split into blocks whose second depends on the first, plus a repeated row."""
    M, Q, A, b, _ = make_problem(8, *DEFICIENT)
    expected = dyn.uk_acceleration(M, Q, A, b, jnp.zeros(6), method="svd")  # c = 0: all_forms' program
    Mn, An = np.asarray(M), np.asarray(A)
    MinvAT = np.linalg.solve(Mn, An.T)
    # M^{-1/2}(I - B⁺B)M^{-1/2}: the covariance left after all constraints
    P_expected = np.linalg.inv(Mn) - MinvAT @ np.linalg.pinv(An @ MinvAT, rcond=1e-12) @ MinvAT.T
    for update in ("joseph", "simple"):
        qdd, P = dyn.recursive_uk_acceleration(
            M, Q, blocks_of(A, b), covariance_update=update, return_covariance=True
        )
        assert_tree_allclose(qdd, expected, **TOL, msg=update)
        assert_tree_allclose(P, P_expected, **TOL, msg=update)


def clearances(scale):
    return [scale * random_spd(jax.random.PRNGKey(1), 2, 5.0), 0.5 * scale * jnp.eye(2), scale * jnp.eye(1)]


def test_recursive_with_clearance_is_weighted_least_squares():
    """Kalman filtering of a static state = the information form (M + Σ AᵀR⁻¹A) q̈ = Q + Σ AᵀR⁻¹b."""
    M, Q, A, b, _ = make_problem(9, *DEFICIENT)
    blocks, R = blocks_of(A, b), clearances(0.1)
    info, rhs = np.asarray(M), np.asarray(Q)
    for (A_k, b_k), R_k in zip(blocks, R, strict=True):
        A_k, b_k, R_k = np.asarray(A_k), np.asarray(b_k), np.asarray(R_k)
        info = info + A_k.T @ np.linalg.solve(R_k, A_k)
        rhs = rhs + A_k.T @ np.linalg.solve(R_k, b_k)
    for update in ("joseph", "simple"):
        qdd, P = dyn.recursive_uk_acceleration(
            M, Q, blocks, R, covariance_update=update, return_covariance=True
        )
        assert_tree_allclose(qdd, np.linalg.solve(info, rhs), **TOL, msg=update)
        assert_tree_allclose(P, np.linalg.inv(info), **TOL, msg=update)
        assert np.linalg.norm(A @ qdd - b) > 1e-3  # the constraints hold only approximately
    P = np.asarray(dyn.recursive_uk_acceleration(M, Q, blocks, R, return_covariance=True)[1])
    np.testing.assert_allclose(P, P.T, atol=1e-14)  # the Joseph form keeps P symmetric


def test_recursive_tends_to_exact_as_clearance_vanishes():
    M, Q, A, b, _ = make_problem(10, *DEFICIENT)
    exact = np.asarray(dyn.uk_acceleration(M, Q, A, b, jnp.zeros(6)))  # c = 0: all_forms' program
    errors = []
    for eps in (1e-2, 1e-4, 1e-6):
        qdd = dyn.recursive_uk_acceleration(M, Q, blocks_of(A, b), clearances(eps))
        errors.append(np.linalg.norm(np.asarray(qdd) - exact))
    # Weighted least squares differs from the constrained solution by O(R): 100x smaller R, ~100x error.
    assert errors[0] > 50 * errors[1] > 2500 * errors[2]
    assert errors[2] < 1e-5 * np.linalg.norm(exact)


@pytest.mark.parametrize("consistent", [True, False])
def test_constraint_consistency(consistent):
    M, Q, A, b, _ = make_problem(11, *DEFICIENT)
    if not consistent:
        b = b + jnp.linspace(-1.0, 1.0, 4)
    residual = dyn.constraint_consistency(A, b)
    An, bn = np.asarray(A), np.asarray(b)
    expected = np.linalg.norm(An @ np.linalg.lstsq(An, bn, rcond=None)[0] - bn)  # distance of b from range(A)
    if consistent:
        assert residual < 1e-13
    else:
        assert expected > 0.1
        np.testing.assert_allclose(residual, expected, rtol=1e-10)
    batched = jax.jit(jax.vmap(dyn.constraint_consistency))(jnp.stack([A, A]), jnp.stack([b, 2 * b]))
    np.testing.assert_allclose(batched, [residual, 2 * residual], rtol=1e-10, atol=1e-13)


# --- derivatives: every public function at rank-deficient A, against central differences -----------------
_kg = jax.random.split(jax.random.PRNGKey(12), 12)
GRAD_N, GRAD_M, GRAD_RANK = DEFICIENT
C_FIXED = random_normal(_kg[0], (GRAD_M, GRAD_RANK))  # A = C F keeps rank 3 under perturbations of F
W_OUT = random_normal(_kg[1], (GRAD_N,))
W_LAM = random_normal(_kg[2], (GRAD_M,))
GRAD_PARAMS = {
    "M": jnp.diag(jnp.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])),  # repeated eigenvalues, as diagonal masses have
    "W": random_normal(_kg[3], (4, GRAD_N)),  # singular mass WᵀW of rank 4
    "Q": random_normal(_kg[4], (GRAD_N,)),
    "F": random_normal(_kg[5], (GRAD_RANK, GRAD_N)),
    "x": random_normal(_kg[6], (GRAD_N,)),  # b = A x is consistent
    "c": random_normal(_kg[7], (GRAD_N,)),
    "e": random_normal(_kg[8], (GRAD_M,)),  # b + e is not
    "rho": jnp.array(0.2),  # clearance covariance of the second block
}


def unpack(p):
    A = C_FIXED @ p["F"]
    return p["M"], p["Q"], A, A @ p["x"], p["c"]


def _weighted_force(force):
    return W_OUT @ force.ideal + W_OUT[::-1] @ force.nonideal


def _weighted_kkt(qdd, lam):
    return W_OUT @ qdd + W_LAM @ lam


# One scalar per public function (a weighted sum of its outputs), all at the rank-deficient A = C F.
SCALAR_OUTPUTS = {
    "cholesky": lambda M, Q, A, b, c, p: W_OUT @ dyn.uk_acceleration(M, Q, A, b, c),
    "svd": lambda M, Q, A, b, c, p: W_OUT @ dyn.uk_acceleration(M, Q, A, b, c, method="svd"),
    "eq35": lambda M, Q, A, b, c, p: W_OUT @ dyn.uk_acceleration_eq35(M, Q, A, b, c),
    "force": lambda M, Q, A, b, c, p: _weighted_force(dyn.uk_constraint_force(M, Q, A, b, c)),
    "force_svd": lambda M, Q, A, b, c, p: _weighted_force(
        dyn.uk_constraint_force(M, Q, A, b, c, method="svd")
    ),
    "kkt": lambda M, Q, A, b, c, p: _weighted_kkt(*dyn.kkt_acceleration(M, Q, A, b)),
    **{
        form: lambda M, Q, A, b, c, p, form=form: W_OUT
        @ dyn.singular_mass_acceleration(p["W"].T @ p["W"], Q, A, b, c, form=form)
        for form in dyn.SINGULAR_MASS_FORMS
    },
    # Block 2 (partly redundant after block 1) has clearance rho I; block 3 repeats an enforced row exactly,
    # so its A P Aᵀ is round-off that the rank decision drops: both paths under one derivative.
    "recursive": lambda M, Q, A, b, c, p: W_OUT
    @ dyn.recursive_uk_acceleration(M, Q, blocks_of(A, b), [None, p["rho"] * jnp.eye(2), None]),
    "consistency": lambda M, Q, A, b, c, p: dyn.constraint_consistency(A, b + p["e"]),
}


@pytest.mark.parametrize("key", list(SCALAR_OUTPUTS))
def test_gradient_matches_central_differences(key):
    """jax.grad w.r.t. M (symmetric direction), Q, A, b, c, the singular mass and R vs central differences."""
    leaves, tree = jax.tree_util.tree_flatten(GRAD_PARAMS)
    keys = jax.random.split(_kg[9], len(leaves))
    d = jax.tree_util.tree_unflatten(
        tree, [random_normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    )
    d = {**d, "M": d["M"] + d["M"].T}

    def f(p):
        return SCALAR_OUTPUTS[key](*unpack(p), p)

    # The finite differences take f's value from value_and_grad: op by op, JAX differentiates a jitted form
    # by compiling its linearization (which computes the value) and that map's transpose, so the shifted
    # points reuse those two programs; f alone would compile the plain forward program too where no test
    # above has (the recursive form with this clearance pattern: 3 programs instead of 2).
    value_and_grad = jax.value_and_grad(f)
    grad = value_and_grad(GRAD_PARAMS)[1]
    directional = sum(jnp.vdot(grad[name], d[name]) for name in GRAD_PARAMS)
    assert np.isfinite(directional)
    shifted = lambda t: value_and_grad(jax.tree_util.tree_map(lambda x, v: x + t * v, GRAD_PARAMS, d))[0]
    fd = central_difference(shifted, 0, 1)
    np.testing.assert_allclose(directional, fd, rtol=1e-6, atol=1e-8)


def test_gradient_of_consistency_at_consistent_b_is_finite():
    _, _, A, b, _ = make_problem(13, *DEFICIENT)
    g = jax.grad(dyn.constraint_consistency, argnums=(0, 1))(A, b)
    assert all(np.all(np.isfinite(x)) for x in g)


def test_arguments_that_are_not_real_numbers_are_named():
    """A string array reached JAX ("Error interpreting argument to stage as a JAX value") and mixed float32
    and float64 inputs failed deep inside the solve under strict promotion (issue 39). Now a non-numeric
    argument raises TypeError naming the function and the argument; integers and mixed precisions are
    promoted."""
    M, Q, A, b = np.eye(2), np.ones(2), np.array([[1.0, 1.0]]), np.ones(1)
    words = np.array(["1", "2"])
    for call, named in [
        (lambda: dyn.uk_acceleration(M, words, A, b), "uk_acceleration: Q"),
        (lambda: dyn.uk_acceleration(M, Q, A, b, words), "uk_acceleration: c"),
        (lambda: dyn.uk_constraint_force(M, Q, A, words, method="svd"), "uk_constraint_force: b"),
        (lambda: dyn.kkt_acceleration(words.reshape(1, 2), Q, A, b), "kkt_acceleration: M"),
        (lambda: dyn.singular_mass_acceleration(M, Q, words.reshape(1, 2), b), "singular_mass_acc.*: A"),
        (lambda: dyn.recursive_uk_acceleration(M, Q, [(A, words[:1])]), r"recursive_uk.*: blocks\[0\]\[1\]"),
    ]:
        with pytest.raises(TypeError, match=named + r".* must be a real floating-point array, got dtype <U1"):
            call()
    with pytest.raises(ValueError, match="uk_acceleration: M must be a real array, got dtype complex128"):
        dyn.uk_acceleration(M + 0j, Q, A, b)
    expected = dyn.uk_acceleration(M, Q, A, b)
    mixed = dyn.uk_acceleration(M.astype(np.float32), Q.astype(np.int32), A, b)
    assert mixed.dtype == jnp.float64
    assert_tree_allclose(mixed, expected, rtol=1e-15, atol=0)
    assert_tree_allclose(dyn.recursive_uk_acceleration(M.astype(np.float32), Q, [(A, b)]), expected,
                         rtol=1e-12, atol=1e-12)
