"""Servo-constraint (constraint-following) control after Liu, Zhen, Huang, Zhao, Chen & Shao (2015), seed 000.

A controlled system is ``M q̈ = Q + Q^c + B u`` (seed 000 eq. 16-17): Q^c is the force of the passive
constraints ``A_p q̈ = b_p`` (the UK equation, seed 000 eq. 13-15) and ``B(q, t, p) u`` is the force of ``n_u``
actuators. The controls must make the system also obey the servo constraints ``A_s q̈ = b_s`` (seed 000
eq. 18-23, each given as a :class:`~ukjax.constraints.Holonomic`, :class:`~ukjax.constraints.Nonholonomic` or
:class:`~ukjax.constraints.AccelerationLevel` in ``System.servo_constraints``, Baumgarte gains read from ``p``
- section II of the seed).

Derivation with passive constraints. The UK acceleration is affine in the given force: for a force f added to
Q,

    q̈(u) = q̈₀ + P f,    P = M⁻¹ - M⁻¹A_pᵀ (A_p M⁻¹ A_pᵀ)⁺ A_p M⁻¹ = M^{-1/2} (I - B̂⁺B̂) M^{-1/2},

with q̈₀ the passive constrained acceleration (non-ideal part included) and B̂ = A_p M^{-1/2} (seed 000
eq. 11-12).
P is M⁻¹ projected M-orthogonally onto the null space of A_p: the part of an actuator force that the passive
constraint reactions do not cancel. With f = B u the servo constraints become the equation for u

    (A_s P B) u = b_s - A_s q̈₀,                                                              (*)

and the minimum-norm solution plus any null-space component (seed 000 eq. 35)

    u = (A_s P B)⁺ (b_s - A_s q̈₀) + [I - (A_s P B)⁺ (A_s P B)] s.

Mapping to seed 000's x = M^{1/2} q form (eq. 24-35): with C = A_s M^{-1/2}, B̄ = M^{-1/2} B,
a = M^{-1/2}(Q + Q^c) and b̄ = b_s - C a, (*) reads (C B̄_p) u = b̄ with B̄_p = (I - B̂⁺B̂) B̄. Without passive
constraints B̄_p = B̄ and (*) is eq. 32 exactly; with them, B̄ is replaced by its projection onto ker B̂, because
the passive constraint force responds to B u (it is computed from Q + B u, not from Q). Using the unprojected
C B̄ in a closed chain gives controls under which either the passive or the servo constraints fail;
ukjax enforces both at once, and :func:`closed_loop_acceleration` is checked against a KKT solve that contains
both sets.

Controllability (seed 000 Assumption 3 eq. 33, Theorem 1 eq. 34): (*) is solvable iff D D⁺ r = r with
D = A_s P B and r its right-hand side. :func:`servo_controllability` reports the residual ‖D D⁺ r - r‖,
rank D and a ``feasible`` flag; an infeasible problem still yields the finite least-squares control (never
NaN), and ``ukjax.simulate`` records the flag as status ``control_infeasible``.

Everything here is a pure function of arrays and the parameter pytree ``p``: ``jax.jit``, ``jax.vmap`` and
``jax.grad`` (e.g. with respect to servo Baumgarte gains) compose over it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from ukjax._checks import CONSISTENCY_RTOL, constraint_consistency
from ukjax._validation import coordinate_indices
from ukjax.constraints import AccelerationLevel, Holonomic, Nonholonomic, _time_argument
from ukjax.dynamics import uk_acceleration
from ukjax.linalg import (
    _rank_or_minus_one,
    as_real_array,
    as_real_arrays,
    factorizations_looped,
    keyed_on_looping,
    pinv,
)


class ServoEquation(eqx.Module):
    """The linear equation ``D u = r`` for the controls at one state, and what it is built from.

    Attributes:
        qdd_passive: q̈₀ (n,), the acceleration under the passive constraints with u = 0.
        response: P B (n, n_u), the change of q̈ per unit control with the passive constraints enforced.
        A, b: the servo constraints in second-order form, A_s (m_s, n) and b_s (m_s,), Baumgarte terms in b_s.
        D: A_s P B (m_s, n_u), seed 000's C B̄ (with B̄ projected onto the passive null space).
        r: b_s - A_s q̈₀ (m_s,), seed 000's b̄.
    """

    qdd_passive: jax.Array
    response: jax.Array
    A: jax.Array
    b: jax.Array
    D: jax.Array
    r: jax.Array


class Controllability(eqx.Module):
    """Solvability of ``D u = r`` (seed 000 Assumption 3 eq. 33 and Theorem 1 eq. 34).

    Attributes:
        residual: ‖D D⁺ r - r‖, zero exactly when some u satisfies the servo constraints.
        rank: rank of D; with a consistent equation the system is servo-constraint controllable iff rank ≥ 1
            (or trivially, when r = 0).
        feasible: residual ≤ consistency_rtol · (1 + ‖r‖) and everything finite.
    """

    residual: jax.Array
    rank: jax.Array
    feasible: jax.Array


class ClosedLoop(eqx.Module):
    """The controlled motion at one state (the contract with ``ukjax.simulate``).

    Attributes:
        qdd: q̈ (n,) with both passive and servo constraints enforced (least squares when infeasible).
        u: the controls (n_u,).
        servo_residual: one entry per servo-constraint row at the constraint's own order: φ for
            :class:`Holonomic`, ψ for :class:`Nonholonomic`, A q̈ - b for :class:`AccelerationLevel`.
        feasible: bool, whether D u = r has a solution (:class:`Controllability`).
    """

    qdd: jax.Array
    u: jax.Array
    servo_residual: jax.Array
    feasible: jax.Array


def _require_controlled(system, where):
    if system.actuation is None or not system.servo_constraints:
        raise ValueError(f"{where}: the system needs actuation B(q, t, p) and at least one servo constraint")


def _servo_view(system):
    """The same system with its servo constraints in place of its passive ones (to reuse System's methods)."""
    return dataclasses.replace(system, constraints=tuple(system.servo_constraints), servo_constraints=())


def actuation_matrix(system, q, t, p):
    """B(q, t, p) (n, n_u), checked: a vector is taken as a single actuator (n, 1)."""
    B = jnp.asarray(system.actuation(q, t, p))
    if B.ndim == 1:
        B = B[:, None]
    if B.ndim != 2 or B.shape[0] != system.n:
        raise ValueError(f"actuation(q, t, p) returned shape {B.shape}; expected ({system.n}, n_u)")
    return B


def force_response(system, q, qd, t, p, B, *, method: str = "ldl", rtol=None):
    """P B: the acceleration per unit of each column of a force matrix B (n, k), passive constraints enforced.

    Column j is the UK acceleration (seed 000 eq. 15) of the given force B[:, j] with b_p = 0 and no non-ideal
    part, i.e. P B[:, j] with P = M^{-1/2}(I - B̂⁺B̂)M^{-1/2}: the force minus the passive reaction it provokes.
    """
    M = system.mass_matrix(q, t, p)
    A_p, b_p = system.constraint_equations(q, qd, t, p)
    zeros = jnp.zeros_like(b_p)
    one = lambda f: uk_acceleration(M, f, A_p, zeros, method=method, rtol=rtol)
    return jax.vmap(one, in_axes=1, out_axes=1)(B)


def servo_equation(system, q, qd, t, p, *, method: str = "ldl", rtol=None) -> ServoEquation:
    """Assemble ``(A_s P B) u = b_s - A_s q̈₀`` (eq. (*) of the module docstring; seed 000 eq. 24-32).

    ``method``/``rtol`` are those of :func:`ukjax.uk_acceleration` for the passive dynamics.
    """
    _require_controlled(system, "servo_equation")
    qdd0 = system.acceleration(q, qd, t, p, method=method, rtol=rtol)
    B = actuation_matrix(system, q, t, p)
    response = force_response(system, q, qd, t, p, B, method=method, rtol=rtol)
    A_s, b_s = _servo_view(system).constraint_equations(q, qd, t, p)
    D, r = A_s @ response, b_s - A_s @ qdd0
    return ServoEquation(qdd_passive=qdd0, response=response, A=A_s, b=b_s, D=D, r=r)


def servo_controllability(D, r, *, rtol=None, consistency_rtol: float = CONSISTENCY_RTOL) -> Controllability:
    """Whether (C B̄) u = b̄ has a solution: seed 000 Assumption 3 (eq. 33) with the rank of Theorem 1 (eq. 34).

    ``rtol`` is the rank tolerance of D⁺ (``None``: max(m, n) · eps); never NaN for finite input. Non-finite
    D or r (a NaN or inf entry): ``residual`` NaN, ``rank`` -1 and ``feasible`` False, at once, without an
    SVD of the non-finite matrix (:mod:`ukjax.linalg`, "Non-finite input"), concrete or traced alike. A
    non-numeric D or r raises ``TypeError`` naming it.
    """
    D, r = as_real_arrays("servo_controllability", ("D",), D=D, r=r)
    if D.ndim != 2 or r.shape != (D.shape[0],):
        raise ValueError(f"servo_controllability: need D (m, n_u) and r (m,), got {D.shape} and {r.shape}")
    finite = jnp.all(jnp.isfinite(D)) & jnp.all(jnp.isfinite(r))
    residual = jnp.where(finite, constraint_consistency(D, r, rtol=rtol), jnp.nan)
    rank = jnp.where(finite, _rank_or_minus_one(D, rtol), -1) if D.size else jnp.array(0)
    r0 = jnp.where(jnp.isfinite(r), r, 0.0)
    feasible = finite & (residual <= consistency_rtol * (1.0 + jnp.linalg.norm(r0)))
    return Controllability(residual=residual, rank=rank, feasible=feasible)


def constraint_following_control(D, r, s=None, *, rtol=None, pinv_method: str = "svd"):
    """u = D⁺ r + (I - D⁺ D) s (seed 000 eq. 35); ``s=None`` is the minimum-norm control s = 0 (eq. 71).

    For an inconsistent equation this is the least-squares control (finite, never NaN). ``pinv_method`` is a
    method of :func:`ukjax.linalg.pinv`: ``"svd"`` (LAPACK) or a LAPACK-free one such as ``"householder"``,
    which batched simulations want (:mod:`ukjax.linalg`: jaxlib 0.10's batched LAPACK can deadlock XLA:CPU).
    A NaN or inf in D, r or s gives an all-NaN u, without a factorization of the non-finite D; a non-numeric
    argument raises ``TypeError`` naming it.
    """
    where = "constraint_following_control"
    D, r = as_real_arrays(where, ("D",), D=D, r=r)
    if D.ndim != 2 or r.shape != (D.shape[0],):
        raise ValueError(f"constraint_following_control: need D (m, n_u), r (m,); got {D.shape}, {r.shape}")
    D_pinv = pinv(D, pinv_method, rtol)
    u = D_pinv @ r
    if s is not None:
        s = as_real_array(s, where, "s").astype(D.dtype)
        if s.shape != (D.shape[1],):
            n_u = D.shape[1]
            raise ValueError(f"constraint_following_control: s must have shape ({n_u},), got {s.shape}")
        u = u + s - D_pinv @ (D @ s)
    # D⁺ is all NaN for a non-finite D already; r and s are tested in one reduction (one kernel under vmap)
    finite = jnp.all(jnp.isfinite(r if s is None else jnp.concatenate([r, s])))
    return jnp.where(finite, u, jnp.nan)


def _null_vector(s, q, qd, t, p):
    return None if s is None else s(q, qd, t, p)


def servo_control(
    system,
    q,
    qd,
    t,
    p,
    *,
    s: Callable | None = None,
    method: str = "ldl",
    rtol=None,
    pinv_method: str = "svd",
):
    """The servo controls u (n_u,) at one state (seed 000 eq. 35, with passive constraints as derived above).

    ``s(q, qd, t, p) -> (n_u,)`` picks the null-space component; ``None`` gives the minimum-norm u.
    ``pinv_method``: how D⁺ is computed (:func:`constraint_following_control`).
    A NaN or inf in the system's M, Q, A or B at this state (a poisoned parameter, say) gives an all-NaN u at
    once: every factorization on the way is screened (:mod:`ukjax.linalg`, "Non-finite input").
    """
    system.check_state(q, qd)
    eq = servo_equation(system, q, qd, t, p, method=method, rtol=rtol)
    s_value = _null_vector(s, q, qd, t, p)
    return constraint_following_control(eq.D, eq.r, s_value, rtol=rtol, pinv_method=pinv_method)


def servo_force(
    model,
    model_params: Callable,
    *,
    s: Callable | None = None,
    method: str = "ldl",
    rtol=None,
    pinv_method: str = "householder",
) -> Callable:
    """A controller computed from a model, acting on another system (the plant) as an applied force.

    ``ukjax.simulate`` of a system with ``actuation`` and ``servo_constraints`` computes the controls from
    that same system, i.e. with an exact model of the plant. To simulate a controller whose model differs
    from the plant (a payload it does not know, masses it has wrong), give the plant no servo constraints
    and this force:

        Q_u(q, q̇, t, p) = B_m(q, t, p_m) u,   u = servo_control(model, q, q̇, t, p_m),   p_m = model_params(p),

    the controls of seed 000 eq. 35 computed at the plant's measured state (q, q̇) from the model's M, Q, A_s
    and b_s, applied to the plant through the model's actuation matrix. ``model`` is a system with
    ``actuation`` and ``servo_constraints``; ``model_params(p)`` picks the model's parameters out of the
    plant's pytree, e.g. ``lambda p: p["controller"]``, so the model's parameters (and the servo gains) stay
    differentiable leaves of ``p``. With ``model_params(p)`` equal to the plant's parameters and the same
    equations, the plant obeys the servo constraints exactly as under :func:`closed_loop_acceleration`.

    D⁺ is computed by ``pinv_method`` (default ``"householder"``: column-pivoted QR completed to a
    minimum-norm solve, written in JAX): the force runs inside batched simulations, where jaxlib 0.10's
    batched LAPACK SVD can deadlock XLA:CPU's thread pool (:mod:`ukjax.linalg`).
    """
    _require_controlled(model, "servo_force")

    def force(q, qd, t, p):
        pm = model_params(p)
        u = servo_control(model, q, qd, t, pm, s=s, method=method, rtol=rtol, pinv_method=pinv_method)
        return actuation_matrix(model, q, t, pm) @ u

    return force


def servo_residual(system, q, qd, t, p, qdd):
    """One entry per servo-constraint row: φ (holonomic), ψ (nonholonomic), A q̈ - b (acceleration level)."""
    parts = []
    for constraint in system.servo_constraints:
        if isinstance(constraint, Holonomic):
            parts.append(constraint.value(q, t, p))
        elif isinstance(constraint, Nonholonomic):
            parts.append(constraint.value(q, qd, t, p))
        elif isinstance(constraint, AccelerationLevel):
            A, b = constraint.second_order(q, qd, t, p)
            parts.append(A @ qdd - b)
    return jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.result_type(q))


def closed_loop_acceleration(
    system, q, qd, t, p, *, s: Callable | None = None, method: str = "ldl", rtol=None
) -> ClosedLoop:
    """q̈ = q̈₀ + P B u with u from :func:`servo_control`: the controlled motion of seed 000 eq. 16.

    This is the hook ``ukjax.simulate`` calls for systems with ``actuation`` and ``servo_constraints``; it
    records u(t), ``servo_residual`` (see :class:`ClosedLoop`) and ``feasible`` (status ``control_infeasible``
    when False).
    Non-finite M, Q, A or B at this state gives an all-NaN q̈ and u and ``feasible`` False, without a
    factorization of the non-finite matrices.
    """
    system.check_state(q, qd)
    return _closed_loop_acceleration(
        system, q, qd, _time_argument(t, q), p, s, method, rtol, looped=factorizations_looped()
    )


@eqx.filter_jit
@keyed_on_looping
def _closed_loop_acceleration(system, q, qd, t, p, s, method, rtol) -> ClosedLoop:
    """:func:`closed_loop_acceleration` as one program per system, shapes, options and
    :func:`ukjax.linalg.factorizations_looped`: traced once and reused by every caller (see
    :meth:`ukjax.System.motion`)."""
    eq = servo_equation(system, q, qd, t, p, method=method, rtol=rtol)
    u = constraint_following_control(eq.D, eq.r, _null_vector(s, q, qd, t, p), rtol=rtol)
    qdd = eq.qdd_passive + eq.response @ u
    return ClosedLoop(
        qdd=qdd,
        u=u,
        servo_residual=servo_residual(system, q, qd, t, p, qdd),
        feasible=servo_controllability(eq.D, eq.r, rtol=rtol).feasible,
    )


def controllability(system, q, qd, t, p, *, method: str = "ldl", rtol=None) -> Controllability:
    """:func:`servo_controllability` of the system's servo equation at one state."""
    system.check_state(q, qd)
    eq = servo_equation(system, q, qd, t, p, method=method, rtol=rtol)
    return servo_controllability(eq.D, eq.r, rtol=rtol)


def consistent_state(
    system,
    q_guess,
    qd_guess,
    t,
    p,
    *,
    fixed=(),
    fixed_position=(),
    fixed_rate=(),
    servo: bool = True,
    iterations: int = 30,
):
    """An initial state (q0, q̇0) on the constraint manifold, found from a guess.

    Position: Gauss-Newton with minimum-norm steps, q ← q - J⁺ φ(q), on all holonomic constraints (passive,
    plus servo when ``servo=True``), a fixed number of ``iterations`` (quadratic convergence near a regular
    solution).
    Velocity: then q̇ ← q̇ - K⁺ v(q̇) on v = (φ̇, ψ), the velocity residuals of the same constraints, repeated
    ``iterations`` times (one step is exact when v is affine in q̇, as for holonomic and Pfaffian constraints).
    The minimum-norm steps keep (q0, q̇0) as close to the guess as the constraints let them. Liu et al. (2015,
    §II) note that second-order constraints lose no information only if the initial state satisfies the
    constraints of order zero and one; this function supplies such a state when a paper gives none.

    Pins (indices of coordinates in [0, n), or their names): ``fixed_position`` keeps those coordinates'
    positions exactly as guessed (J restricted to the other columns), ``fixed_rate`` their rates (K likewise),
    and ``fixed`` both (a driving crank's angle and speed, say). A crank angle may be pinned while its rate
    follows from the others (``fixed_position=[i]``), or a speed while the angle is solved for
    (``fixed_rate=[i]``). An index listed in ``fixed`` and again in ``fixed_position`` or ``fixed_rate`` is
    refused as ambiguous. On a configuration manifold (``System.retract``, ball or free joints) the position
    steps are taken in the chart, q ← normalize(q ⊕ δ), and the pins index the velocity's coordinates. If the
    pinned values admit no consistent state, the result is the least-squares
    compromise: check ``system.residuals(q0, qd0, t, p)``.
    """
    system.check_state(q_guess, qd_guess)
    pins = lambda items, what: set(coordinate_indices(system, items, "consistent_state", what, unique=False))
    both, positions = pins(fixed, "fixed"), pins(fixed_position, "fixed_position")
    rates = pins(fixed_rate, "fixed_rate")
    for name, pinned in (("fixed_position", positions), ("fixed_rate", rates)):
        if pinned & both:
            raise ValueError(
                f"consistent_state: coordinates {sorted(pinned & both)} are listed in fixed (position and "
                f"rate) and again in {name}; list each coordinate once"
            )
    free_q = tuple(i for i in range(system.n) if i not in both | positions)
    free_qd = tuple(i for i in range(system.n) if i not in both | rates)
    constraints = tuple(system.constraints) + (tuple(system.servo_constraints) if servo else ())
    view = dataclasses.replace(system, constraints=constraints, servo_constraints=())
    q_guess, qd_guess = jnp.asarray(q_guess), jnp.asarray(qd_guess)
    return _newton_to_the_manifold(view, q_guess, qd_guess, _time_argument(t, q_guess), p, free_q, free_qd,
                                   iterations)


@eqx.filter_jit
def _newton_to_the_manifold(system, q_guess, qd_guess, t, p, free_q, free_qd, iterations):
    """The Gauss-Newton iterations of :func:`consistent_state` (``system``'s constraints are the ones to
    meet), one compiled program per system, shapes and pins: a second call reuses it, where op-by-op
    dispatch compiled both loops again (new loop bodies) at every call."""
    free_q, free_qd = jnp.asarray(free_q, dtype=int), jnp.asarray(free_qd, dtype=int)
    position = lambda q: system.residuals(q, qd_guess, t, p)[0]
    velocity = lambda qd, q: system.residuals(q, qd, t, p)[1]
    add = lambda x, d: x + d
    # On a configuration manifold q moves through the chart, q ⊕ δ, and back onto the manifold.
    move = add if system.retract is None else (lambda x, d: system.project(system.retract(x, d)))

    def newton(residual, x, free, move):
        zero = jnp.zeros(system.n, x.dtype)
        jacobian = jax.jacfwd(lambda d: residual(move(x, d)))(zero)[:, free]
        return move(x, zero.at[free].set(-pinv(jacobian) @ residual(x)))

    q = q_guess
    if position(q).size and free_q.size:
        q = jax.lax.fori_loop(0, iterations, lambda _, x: newton(position, x, free_q, move), q)
    qd = qd_guess
    if velocity(qd, q).size and free_qd.size:
        qd = jax.lax.fori_loop(
            0, iterations, lambda _, x: newton(lambda v: velocity(v, q), x, free_qd, add), qd
        )
    return q, qd
