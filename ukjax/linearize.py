"""Linearization of a constrained system in minimal (independent) coordinates, for control and stability.

Why not the Jacobian of the full right-hand side. ukjax integrates (q, q̇) ∈ R²ⁿ with the UK acceleration
q̈(q, q̇). The Jacobian of (q̇, q̈) at an operating point has dimension 2n, but the motion lives on the
constraint manifold {φ = 0, φ̇ = 0, ψ = 0}: the extra eigenvalues belong to directions off it. With Baumgarte
stabilization (φ̈ + 2αφ̇ + β²φ = 0) they are the roots of λ² + 2αλ + β² (defective when α = β), without it
they are zeros in Jordan blocks (φ̈ = 0 lets φ drift linearly), and a numerical eigensolver scatters a
defective zero of multiplicity k by ~eps^(1/k) (1e-8 for k = 2): such eigenvalues say nothing of the
mechanism's stability and may even carry a positive real part. This module returns instead the Jacobian of
the dynamics restricted to the manifold, of exactly the minimal dimension.

Minimal state. Of the n coordinates, k_h holonomic constraint rows φ(q, t) = 0 leave n - k_h independent
positions q_I; the dependent ones follow by the implicit function theorem,

    ∂q_D/∂q_I = -(∂φ/∂q_D)⁻¹ ∂φ/∂q_I,

which needs ∂φ/∂q_D square and regular at the operating point (a choice of independent coordinates that is
valid there). Nonholonomic constraints ψ(q, q̇, t) = 0 (k_n rows) do not reduce the configuration, only the
velocities: of the n rates, n - k_h - k_n are independent (v_I), the others follow from the velocity-level
constraints v(q, q̇) = (φ̇, ψ) = 0 with ∂q̇_D/∂(q, v_I) = -(∂v/∂q̇_D)⁻¹ ∂v/∂(q, v_I). The minimal state is

    x = (q_I, v_I),   ẋ = f(x, u) = (q̇_I, q̈_{I_v}),

where (q, q̇) are reconstructed on the manifold from x and q̈ is the UK acceleration there (given force
Q + B(q) u; servo constraints are not enforced: u is an open-loop input for a controller to design). This
is the classical reduction of Neimark & Fufaev (1972, Ch. III) for nonholonomic systems; for a holonomic
system the independent rates are those of the independent positions. Baumgarte terms vanish identically on
the manifold, so their gains do not enter the result.

Reconstruction. One Newton step from the operating point, q_D = q_D* - (∂φ/∂q_D)⁻¹ φ(q_I, q_D*) and likewise
for the rates, is exact to first order in x - x* (the residual vanishes at x*, so the step's derivative is
the implicit-function derivative above), which is all the Jacobian reads: A = ∂f/∂x and B = ∂f/∂u at
(x*, u*) by ``jax.jacfwd``, exact to rounding, with no finite differences.

Cyclic coordinates. A coordinate whose position enters neither the dynamics of the others nor its own (a
rolling disk's heading and contact point, a cart's position on a rail) adds a zero eigenvalue (or a Jordan
block with its rate) that is a symmetry, not a mode. ``drop=[...]`` removes such positions from the state
(their rates stay); the columns removed must vanish (checked, within ``drop_rtol`` of the largest entry of
the Jacobian), else the drop is refused. At a steady motion that is not an equilibrium (steady rolling)
``rate`` = f(x*) is zero in the entries kept: a relative equilibrium.

Everything is a pure function of arrays and the parameter pytree: ``jax.jit``, ``jax.vmap`` and ``jax.grad``
(e.g. of an eigenvalue's real part with respect to a parameter) compose over :func:`linearize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax._validation import coordinate_indices, is_concrete
from ukjax.constraints import AccelerationLevel
from ukjax.control import actuation_matrix

RESIDUAL_ATOL = 1e-8
"""Largest |constraint residual| at the operating point :func:`linearize` accepts (concrete inputs)."""

DROP_RTOL = 1e-8
"""Largest entry of a dropped position's column, relative to the largest entry of the Jacobian."""


class Linearization(eqx.Module):
    """ẋ ≈ rate + A (x - x*) + B (u - u*) in the minimal state x of :func:`linearize`.

    Attributes:
        A: the state matrix (k, k), k = (independent positions not dropped) + (independent rates).
        B: the input matrix (k, n_u) for the inputs u of the system's ``actuation`` B(q, t, p), or None for
            a system without actuation.
        state: x* (k,), the operating point in the minimal state.
        rate: f(x*) (k,): zero at an equilibrium or, after dropping cyclic positions, at a steady motion.
        residual: the largest |constraint residual| (φ, φ̇, ψ) at the operating point.
        drop_coupling: the largest |entry| of the dropped positions' columns (zero for cyclic coordinates).
        names: the name of each entry of x: a coordinate's name for its position, ``name + "_dot"`` for its
            rate (``q3``, ``q3_dot`` without ``coordinate_names``).
        positions, rates: the coordinate index of each position entry and of each rate entry of x.
    """

    A: jax.Array
    B: jax.Array | None
    state: jax.Array
    rate: jax.Array
    residual: jax.Array
    drop_coupling: jax.Array
    names: tuple[str, ...] = eqx.field(static=True)
    positions: tuple[int, ...] = eqx.field(static=True)
    rates: tuple[int, ...] = eqx.field(static=True)

    def eigenvalues(self) -> jax.Array:
        """The eigenvalues of A (complex, LAPACK order), differentiable at each simple eigenvalue even where
        others are defective (:func:`eigenvalues`)."""
        return eigenvalues(self.A)


@jax.custom_jvp
def _eigenvalues(A):
    return jnp.linalg.eigvals(A)


@_eigenvalues.defjvp
def _eigenvalues_jvp(primals, tangents):
    """dλ = wᴴ dA v / (wᴴ v) per eigenvalue, v and w its right and left null vectors of A - λI (the last
    singular vectors of its SVD)."""
    (A,), (dA,) = primals, tangents
    values = jnp.linalg.eigvals(A)
    identity = jnp.eye(A.shape[-1], dtype=values.dtype)

    def null_vectors(value):
        U, _, Vh = jnp.linalg.svd(A.astype(values.dtype) - value * identity)
        return U[:, -1], jnp.conj(Vh[-1])

    w, v = jax.vmap(null_vectors)(values)
    change = jnp.einsum("ia,ab,ib->i", jnp.conj(w), dA.astype(values.dtype), v)
    return values, change / jnp.einsum("ia,ia->i", jnp.conj(w), v)


def eigenvalues(A) -> jax.Array:
    """The eigenvalues of real square matrices A (..., k, k), with a derivative that needs only each
    eigenvalue to be simple.

    The derivative of a simple eigenvalue λ is dλ = wᴴ dA v / (wᴴ v), v and w its right and left
    eigenvectors (first-order perturbation of a simple eigenvalue, e.g. Magnus 1985), taken here as the null
    vectors of A - λI from its SVD.
    ``jnp.linalg.eigvals`` differentiates through the inverse of the whole eigenvector matrix instead, which
    a defective eigenvalue anywhere in A makes singular: the double zero of a free cart (a Jordan block)
    then spoils the derivative of the pendulum's unstable eigenvalue too. At a defective eigenvalue itself
    wᴴv = 0 and the derivative is infinite, as it should be (eigenvalues there are not differentiable).
    """
    A = jnp.asarray(A)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"eigenvalues needs square matrices (..., k, k), got shape {A.shape}")
    return jnp.vectorize(_eigenvalues, signature="(k,k)->(k)")(A)


def _name(system, i: int) -> str:
    return system.coordinate_names[i] if system.coordinate_names is not None else f"q{i}"


def _refuse_singular(matrix, dependent, system, what: str):
    """Raise where ``matrix`` (∂(constraints)/∂(dependent)) is singular at concrete inputs."""
    if matrix is None or not is_concrete(matrix):
        return
    values = np.asarray(matrix)
    condition = np.linalg.cond(values) if np.all(np.isfinite(values)) else np.inf
    if not condition < 1e12:
        names = [_name(system, i) for i in dependent]
        raise ValueError(
            f"linearize: the {what} constraints do not determine the dependent coordinates {names} from "
            f"the independent ones here (their Jacobian with respect to them has condition number "
            f"{condition:.3g}); choose other independent {what} coordinates"
        )


@eqx.filter_jit
def _linear_terms(system, indices, choices, q, qd, t, p, u, rtol):
    """The numbers of :func:`linearize` in one compiled program (its checks read them afterwards): the
    largest constraint residual, ∂φ/∂q_D and ∂ψ/∂q̇_D (None without such rows), the minimal state x0, the
    Jacobians of its rate with respect to x and u (None without inputs) and the rate itself. Compiled once
    per system, choice of coordinates and shapes; called eagerly its ~260 operations would each compile on
    their own (11.5 against 3.6 CPU-s for the cart-pendulum of tests/test_linearize.py)."""
    positions, _, rates, _ = indices
    method, solver = choices
    P, D, R, Dr = (jnp.asarray(x, dtype=int) for x in indices)
    position_residual = lambda q_: system.residuals(q_, qd, t, p)[0]
    velocity_residual = lambda q_, qd_: system.residuals(q_, qd_, t, p)[1]
    k_h, k_v = system.n - len(positions), system.n - len(rates)
    residual = jnp.max(jnp.abs(jnp.concatenate([*system.residuals(q, qd, t, p), jnp.zeros(1, q.dtype)])))
    J_D = jax.jacfwd(position_residual)(q)[:, D] if k_h else None
    K_D = jax.jacfwd(lambda v: velocity_residual(q, v))(qd)[:, Dr] if k_v else None

    def on_manifold(x):
        """(q, q̇) from x by one Newton step from the operating point (exact to first order)."""
        q_ = q.at[P].set(x[: len(positions)])
        if k_h:
            q_ = q_.at[D].add(-jnp.linalg.solve(J_D, position_residual(q_)))
        qd_ = qd.at[R].set(x[len(positions) :])
        if k_v:
            qd_ = qd_.at[Dr].add(-jnp.linalg.solve(K_D, velocity_residual(q_, qd_)))
        return q_, qd_

    def field(x, inputs):
        q_, qd_ = on_manifold(x)
        force = None
        if inputs is not None:
            force = system.given_force(q_, qd_, t, p) + actuation_matrix(system, q_, t, p) @ inputs
        qdd = system.acceleration(q_, qd_, t, p, force=force, method=method, solver=solver, rtol=rtol)
        return jnp.concatenate([qd_[P], qdd[R]])

    x0 = jnp.concatenate([q[P], qd[R]])
    A_full, rate = jax.jacfwd(lambda x: (field(x, u),) * 2, has_aux=True)(x0)  # the rate: jacfwd's primal
    B_full = None if u is None else jax.jacfwd(field, argnums=1)(x0, u)
    return residual, J_D, K_D, x0, A_full, B_full, rate


def linearize(
    system,
    q,
    qd,
    t,
    p,
    *,
    independent: Sequence,
    independent_rates: Sequence | None = None,
    drop: Sequence = (),
    u=None,
    method: str = "ldl",
    solver: str = "uk",
    rtol=None,
    residual_atol: float = RESIDUAL_ATOL,
    drop_rtol: float = DROP_RTOL,
) -> Linearization:
    """Linearize the constrained dynamics at (q, q̇, t) in the minimal state x = (q_I, v_I) (module docstring).

    Args:
        system: a :class:`ukjax.System` whose passive constraints are holonomic or nonholonomic.
        q, qd: the operating point (n,), on the constraint manifold (see
            :func:`ukjax.consistent_state`, whose ``fixed_position``/``fixed_rate`` pin the chosen values).
        t, p: time and parameters.
        independent: the n - k_h coordinates (indices or names) whose positions are independent, k_h the
            number of holonomic constraint rows; the holonomic constraints must determine the others there.
        independent_rates: the n - k_h - k_n coordinates whose rates are independent (k_n nonholonomic
            rows); defaults to ``independent`` for a system without nonholonomic constraints.
        drop: cyclic coordinates among ``independent`` whose positions are left out of the state (their
            columns of the Jacobian must vanish, within ``drop_rtol`` of its largest entry).
        u: the inputs (n_u,) of the system's actuation at the operating point (default zeros).
        method, solver, rtol: those of :meth:`ukjax.System.acceleration`.
        residual_atol: refuse an operating point whose constraint residuals exceed it.

    Returns:
        A :class:`Linearization`: A, B, the names of the state entries, ``eigenvalues()``.

    With concrete inputs an invalid choice (a wrong count, a singular elimination, a non-cyclic dropped
    coordinate, an operating point off the manifold) raises ``ValueError``; under ``jax.jit`` or
    ``jax.vmap`` the same is visible in ``residual`` and ``drop_coupling`` (and as non-finite entries).
    """
    system.check_state(q, qd)
    q, qd = jnp.asarray(q), jnp.asarray(qd)
    if system.retract is not None:
        raise ValueError(
            "linearize: this system's configuration has its own chart (ball or free joints: q has "
            f"{system.nq} numbers, v has {system.n}); linearize needs q̇ = v. Describe the orientation by "
            "angles (e.g. revolute joints) around the operating point"
        )
    levels = [c for c in system.constraints if isinstance(c, AccelerationLevel)]
    if levels:
        raise ValueError(
            f"linearize: acceleration-level constraints {[c.name for c in levels]} restrict q̈ only, so they "
            "define no minimal state; write them as Holonomic or Nonholonomic constraints"
        )
    shapes = jax.eval_shape(system.residuals, q, qd, t, p)
    k_h, k_v = shapes[0].shape[0], shapes[1].shape[0]
    n = system.n
    positions = coordinate_indices(system, independent, "linearize", "independent")
    if len(positions) != n - k_h:
        raise ValueError(
            f"linearize: {n} coordinates and {k_h} holonomic constraint rows leave {n - k_h} independent "
            f"positions; independent lists {len(positions)}"
        )
    if independent_rates is None:
        if k_v != k_h:
            raise ValueError(
                f"linearize: the system has {k_v - k_h} nonholonomic constraint rows, so only "
                f"{n - k_v} of the {n - k_h} independent coordinates' rates are independent; "
                "name them with independent_rates=[...]"
            )
        independent_rates = positions
    rates = coordinate_indices(system, independent_rates, "linearize", "independent_rates")
    if len(rates) != n - k_v:
        raise ValueError(
            f"linearize: {n} coordinates and {k_v} velocity-level constraint rows (φ̇ and ψ) leave {n - k_v} "
            f"independent rates; independent_rates lists {len(rates)}"
        )
    dropped = coordinate_indices(system, drop, "linearize", "drop")
    outside = [_name(system, i) for i in dropped if i not in positions]
    if outside:
        raise ValueError(f"linearize: drop names {outside}, which are not among the independent positions")
    dependent = tuple(i for i in range(n) if i not in positions)
    dependent_rates = tuple(i for i in range(n) if i not in rates)
    if u is not None and system.actuation is None:
        raise ValueError("linearize: inputs u need a system with actuation B(q, t, p)")
    if system.actuation is not None:
        n_u = jax.eval_shape(lambda q_: actuation_matrix(system, q_, t, p), q).shape[1]
        u = jnp.zeros(n_u, q.dtype) if u is None else jnp.asarray(u, dtype=q.dtype)
        if u.shape != (n_u,):
            raise ValueError(f"linearize: u must have shape ({n_u},) for the system's inputs, got {u.shape}")
    indices = (positions, dependent, rates, dependent_rates)
    residual, J_D, K_D, x0, A_full, B_full, rate = _linear_terms(
        system, indices, (method, solver), q, qd, t, p, u, rtol
    )
    if is_concrete(residual) and not float(residual) <= residual_atol:
        raise ValueError(
            f"linearize: the operating point is off the constraint manifold (largest residual "
            f"{float(residual):.3g} > residual_atol = {residual_atol:g}); project it first with "
            "ukjax.consistent_state(..., fixed_position=[...], fixed_rate=[...])"
        )
    _refuse_singular(J_D, dependent, system, "position")
    _refuse_singular(K_D, dependent_rates, system, "velocity")
    kept = [i for i, c in enumerate(positions) if c not in dropped] + [
        len(positions) + j for j in range(len(rates))
    ]
    gone = [i for i, c in enumerate(positions) if c in dropped]
    kept_index = jnp.asarray(kept, dtype=int)
    coupling = (
        jnp.max(jnp.abs(A_full[kept_index][:, jnp.asarray(gone, dtype=int)]))
        if gone
        else jnp.zeros((), A_full.dtype)
    )
    if gone and is_concrete(coupling):
        scale = float(jnp.max(jnp.abs(A_full)))
        columns = np.max(np.abs(np.asarray(A_full)[np.asarray(kept)][:, np.asarray(gone)]), axis=0)
        coupled = [
            _name(system, positions[i])
            for i, c in zip(gone, columns, strict=True)
            if not c <= drop_rtol * scale
        ]
        if coupled:
            raise ValueError(
                f"linearize: the positions of {coupled} enter the dynamics (their Jacobian columns reach "
                f"{float(coupling):.3g}, > drop_rtol · max|A| = {drop_rtol * scale:.3g}); they are not "
                "cyclic and cannot be dropped"
            )
    names = tuple(_name(system, positions[i]) for i in kept if i < len(positions)) + tuple(
        f"{_name(system, i)}_dot" for i in rates
    )
    return Linearization(
        A=A_full[kept_index][:, kept_index],
        B=None if B_full is None else B_full[kept_index],
        state=x0[kept_index],
        rate=rate[kept_index],
        residual=residual,
        drop_coupling=coupling,
        names=names,
        positions=tuple(positions[i] for i in kept if i < len(positions)),
        rates=rates,
    )
