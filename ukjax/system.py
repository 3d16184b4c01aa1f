"""Mechanical systems: unconstrained dynamics, constraints and actuation, as pure functions of parameters.

A :class:`System` describes ``M(q, t, p) q̈ = Q(q, q̇, t, p) + Q^c`` where the constraint force Q^c makes the
constraints hold (Udwadia-Kalaba equation, see :mod:`ukjax.dynamics`). A System holds functions only; every
number a user may tune (masses, lengths, Baumgarte and servo gains) lives in the parameter pytree ``p``
passed alongside, so ``jax.grad`` with respect to ``p`` reaches all of them. A System is an equinox Module
with no array leaves: it can be passed straight through ``jax.jit`` and ``jax.vmap`` (with ``in_axes=None``).

Systems can be written from M and Q (:class:`System`), from a Lagrangian (:meth:`System.from_lagrangian`), or
assembled from subsystems level by level (:func:`compose`, after Orsino, seed 003 §2-3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ukjax import dynamics
from ukjax.constraints import (
    AccelerationLevel,
    Baumgarte,
    Holonomic,
    Nonholonomic,
    second_order_blocks,
    stack_blocks,
)

SOLVERS = ("uk", "recursive")


class Motion(eqx.Module):
    """The constrained motion at one state: what one evaluation of the UK equation gives.

    Attributes:
        qdd: q̈ (n,).
        constraint_force: ideal and non-ideal constraint forces (:class:`ukjax.dynamics.ConstraintForce`),
            or None where the solver does not form them (``solver="recursive"``).
        A, b: the stacked passive constraints A q̈ = b (Baumgarte terms in b); A is (0, n) without any.
        rows: rows of A contributed by each passive constraint, in order.
    """

    qdd: jax.Array
    constraint_force: dynamics.ConstraintForce | None
    A: jax.Array
    b: jax.Array
    rows: tuple[int, ...] = eqx.field(static=True)


class Layout(eqx.Module):
    """Where each subsystem's coordinates sit in the stacked coordinates of a composed system (seed 003 §2).

    ``names`` and ``sizes`` give the subsystems in stacking order. :meth:`split` turns a stacked vector (q,
    q̇ or q̈) into ``{name: part}``, so that the constraints of a level can be written in the coordinates of
    the modules they connect; :meth:`join` stacks parts back. ``Layout.of(subsystems)`` gives the layout
    :func:`compose` will use, before composing (to write the connections); a composed System carries it as
    ``system.layout``.
    """

    names: tuple[str, ...] = eqx.field(static=True)
    sizes: tuple[int, ...] = eqx.field(static=True)

    def __check_init__(self):
        if len(self.names) != len(self.sizes) or len(set(self.names)) != len(self.names):
            raise ValueError(f"Layout needs distinct names, one per size; got {self.names} and {self.sizes}")

    @classmethod
    def of(cls, subsystems: Mapping[str, System]) -> Layout:
        """The layout of ``compose(subsystems, ...)``: subsystems stacked in mapping order."""
        return cls(names=tuple(subsystems), sizes=tuple(int(subsystems[k].n) for k in subsystems))

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def slices(self) -> dict[str, slice]:
        offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        return {k: slice(o, o + s) for k, o, s in zip(self.names, offsets, self.sizes, strict=True)}

    def split(self, x) -> dict[str, Any]:
        """``{name: x[slice of name]}`` for a stacked vector x of shape (n,)."""
        if jnp.shape(x) != (self.n,):
            raise ValueError(f"Layout.split expects a vector of shape ({self.n},), got {jnp.shape(x)}")
        return {k: x[sl] for k, sl in self.slices.items()}

    def join(self, parts: Mapping[str, Any]):
        """The stacked vector from ``{name: part}`` (inverse of :meth:`split`)."""
        for k, size in zip(self.names, self.sizes, strict=True):
            if jnp.shape(parts[k]) != (size,):
                raise ValueError(f"Layout.join: part {k!r} needs shape ({size},), got {jnp.shape(parts[k])}")
        return jnp.concatenate([jnp.asarray(parts[k]) for k in self.names])



class System(eqx.Module):
    """A constrained mechanical system with ``n`` coordinates.

    Attributes:
        mass: ``M(q, t, p) -> (n, n)``, symmetric positive definite for the default solver.
        force: ``Q(q, qd, t, p) -> (n,)``, all given (applied, Coriolis/centrifugal, gravity) forces.
        n: number of generalized coordinates.
        constraints: passive constraints (:class:`~ukjax.constraints.Holonomic`,
            :class:`~ukjax.constraints.Nonholonomic`, :class:`~ukjax.constraints.AccelerationLevel`), in the
            order the recursive solver enforces them (lower levels of a composed system first).
        nonideal: optional ``c(q, qd, t, p) -> (n,)``, the non-ideal constraint vector of Liu et al. 2015
            (seed 000 eq. 12-13); ``None`` means ideal constraints.
        actuation: optional ``B(q, t, p) -> (n, n_u)``, so the control force is ``B u`` (servo control).
        servo_constraints: constraints the controls must enforce (seed 000 §III); unused by passive dynamics.
        kinetic, potential: kept when the system comes from a Lagrangian, for :meth:`energy`.
        coordinate_names: optional names of the coordinates, for plots and tables.
        layout: set by :func:`compose`: where each subsystem's coordinates sit (:class:`Layout`).
    """

    mass: Callable[..., Any] = eqx.field(static=True)
    force: Callable[..., Any] = eqx.field(static=True)
    n: int = eqx.field(static=True)
    constraints: tuple = eqx.field(static=True, default=())
    nonideal: Callable[..., Any] | None = eqx.field(static=True, default=None)
    actuation: Callable[..., Any] | None = eqx.field(static=True, default=None)
    servo_constraints: tuple = eqx.field(static=True, default=())
    kinetic: Callable[..., Any] | None = eqx.field(static=True, default=None)
    potential: Callable[..., Any] | None = eqx.field(static=True, default=None)
    coordinate_names: tuple[str, ...] | None = eqx.field(static=True, default=None)
    layout: Layout | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"System.n must be a positive int, got {self.n!r}")
        for constraint in (*self.constraints, *self.servo_constraints):
            if not isinstance(constraint, Holonomic | Nonholonomic | AccelerationLevel):
                raise TypeError(
                    f"constraints must be Holonomic, Nonholonomic or AccelerationLevel, got {constraint!r}"
                )
        if self.coordinate_names is not None and len(self.coordinate_names) != self.n:
            raise ValueError(f"{len(self.coordinate_names)} coordinate names for n = {self.n} coordinates")
        if self.layout is not None and self.layout.n != self.n:
            raise ValueError(f"layout covers {self.layout.n} coordinates, the system has n = {self.n}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lagrangian(
        cls,
        kinetic: Callable[..., Any],
        potential: Callable[..., Any],
        n: int,
        *,
        applied_force: Callable[..., Any] | None = None,
        **kwargs,
    ) -> System:
        """A system from ``T(q, qd, t, p)``, ``V(q, t, p)`` and optional applied forces ``Q_a(q, qd, t, p)``.

        Lagrange's equations d/dt ∂L/∂q̇ - ∂L/∂q = Q_a with L = T - V give M q̈ = Q where
        ``M = ∂²T/∂q̇²`` and ``Q = ∂L/∂q - (∂²L/∂q̇∂q) q̇ - ∂²L/∂q̇∂t + Q_a``: Coriolis, centrifugal, gravity
        and (for rheonomic T) transport terms, all by automatic differentiation. T must be at most quadratic
        in q̇ (true of every mechanical kinetic energy); M is evaluated at q̇ = 0.
        """

        def lagrangian(q, qd, t, p):
            return kinetic(q, qd, t, p) - potential(q, t, p)

        def mass(q, t, p):
            return jax.hessian(kinetic, argnums=1)(q, jnp.zeros_like(q), t, p)

        def force(q, qd, t, p):
            t = jnp.asarray(t, dtype=jnp.result_type(q))
            dL_dq = jax.grad(lagrangian, argnums=0)(q, qd, t, p)
            _, mixed = jax.jvp(
                lambda q_, t_: jax.grad(lagrangian, argnums=1)(q_, qd, t_, p), (q, t), (qd, jnp.ones_like(t))
            )
            Q = dL_dq - mixed
            if applied_force is not None:
                Q = Q + applied_force(q, qd, t, p)
            return Q

        return cls(mass=mass, force=force, n=n, kinetic=kinetic, potential=potential, **kwargs)

    def with_constraints(self, *constraints, servo_constraints=()) -> System:
        """The same system with more constraints enforced: the next level of a hierarchy (seed 003 eq. 3.7).

        Orsino's levels share one set of coordinates, A_{r+1} = [A_r; Ã_{r+1}]: the new constraints
        (functions of the full q, q̇ and p of this system) are appended after the existing ones, so the
        recursive solver enforces them after this system's own. ``servo_constraints`` are appended likewise.
        """
        return dataclasses.replace(
            self,
            constraints=self.constraints + tuple(constraints),
            servo_constraints=self.servo_constraints + tuple(servo_constraints),
        )

    # ------------------------------------------------------------------ evaluation
    def mass_matrix(self, q, t, p):
        M = jnp.asarray(self.mass(q, t, p))
        if M.shape != (self.n, self.n):
            raise ValueError(f"mass(q, t, p) returned shape {M.shape}; expected ({self.n}, {self.n})")
        return M

    def given_force(self, q, qd, t, p):
        Q = jnp.asarray(self.force(q, qd, t, p))
        if Q.shape != (self.n,):
            raise ValueError(f"force(q, qd, t, p) returned shape {Q.shape}; expected ({self.n},)")
        return Q

    def nonideal_vector(self, q, qd, t, p):
        if self.nonideal is None:
            return None
        c = jnp.asarray(self.nonideal(q, qd, t, p))
        if c.shape != (self.n,):
            raise ValueError(f"nonideal(q, qd, t, p) returned shape {c.shape}; expected ({self.n},)")
        return c

    def constraint_blocks(self, q, qd, t, p):
        """One (A_k, b_k) block per passive constraint, in enforcement order."""
        self.check_state(q, qd)
        return second_order_blocks(self.constraints, q, qd, t, p)

    def constraint_equations(self, q, qd, t, p):
        """The stacked second-order form (A, b) of all passive constraints, with Baumgarte terms in b."""
        return stack_blocks(self.constraint_blocks(q, qd, t, p), self.n, jnp.result_type(q))

    def acceleration(self, q, qd, t, p, *, method: str = "cholesky", solver: str = "uk", rtol=None):
        """q̈ of the constrained system, M q̈ = Q + Q^c (seed 000 eq. 11-13).

        ``solver="uk"``: the one-shot UK equation with the stacked (A, b), any ``method`` of
        :func:`ukjax.uk_acceleration`. ``solver="recursive"``: the Kalman-filter form of Orsino (seed 003
        eq. 4.14-4.16), enforcing the constraints block by block in level order from a_0 = M⁻¹(Q + c) (seed
        003 eq. 4.2: a non-ideal vector enters as a given force); ``method`` is unused there. Without
        constraints (A of shape (0, n)) both give q̈ = M⁻¹(Q + c) by a Cholesky solve.
        """
        return self.motion(q, qd, t, p, method=method, solver=solver, rtol=rtol).qdd

    def motion(self, q, qd, t, p, *, method: str = "cholesky", solver: str = "uk", rtol=None) -> Motion:
        """q̈, the constraint forces and (A, b) at one state from one UK solve (see :meth:`acceleration`)."""
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
        if method not in dynamics.ACCELERATION_METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {dynamics.ACCELERATION_METHODS}")
        self.check_state(q, qd)
        M = self.mass_matrix(q, t, p)
        Q = self.given_force(q, qd, t, p)
        c = self.nonideal_vector(q, qd, t, p)
        blocks = self.constraint_blocks(q, qd, t, p)
        A, b = stack_blocks(blocks, self.n, jnp.result_type(q))
        rows = tuple(A_k.shape[0] for A_k, _ in blocks)
        if A.shape[0] == 0:
            F = Q if c is None else Q + c
            qdd = jsl.cho_solve((jnp.linalg.cholesky(0.5 * (M + M.T)), True), F)
            zero = jnp.zeros_like(Q)
            force = dynamics.ConstraintForce(ideal=zero, nonideal=zero if c is None else c)
            return Motion(qdd=qdd, constraint_force=force, A=A, b=b, rows=rows)
        if solver == "uk":
            qdd, force = dynamics.uk_solve(M, Q, A, b, c, method=method, rtol=rtol)
            return Motion(qdd=qdd, constraint_force=force, A=A, b=b, rows=rows)
        F = Q if c is None else Q + c
        qdd = dynamics.recursive_uk_acceleration(M, F, blocks, rtol=rtol)
        return Motion(qdd=qdd, constraint_force=None, A=A, b=b, rows=rows)

    def residuals(self, q, qd, t, p):
        """Constraint residuals at a state: ``(position, velocity)``.

        ``position`` stacks φ of every holonomic constraint; ``velocity`` stacks φ̇ of every holonomic and ψ
        of every nonholonomic constraint. Either may be empty.
        """
        self.check_state(q, qd)
        dtype = jnp.result_type(q)
        position, velocity = [], []
        for constraint in self.constraints:
            if isinstance(constraint, Holonomic):
                phi, phi_dot = constraint.residuals(q, qd, t, p)
                position.append(phi)
                velocity.append(phi_dot)
            elif isinstance(constraint, Nonholonomic):
                velocity.extend(constraint.residuals(q, qd, t, p))
        join = lambda xs: jnp.concatenate(xs) if xs else jnp.zeros((0,), dtype)
        return join(position), join(velocity)

    def residual_scales(self, A, rows):
        """Per-row scales of :meth:`residuals` from the stacked constraint matrix A of the same state.

        Returns ``(‖∂φ_i/∂q‖, ‖∂φ̇_i/∂q̇‖ or ‖∂ψ_i/∂q̇‖)``: the rows of A are exactly these gradients
        (A = ∂φ/∂q for a holonomic block, ∂ψ/∂q̇ for a nonholonomic one), so nothing is differentiated again.
        |φ_i| / ‖∂φ_i/∂q‖ is, to first order, the distance of q from the constraint surface φ_i = 0 in
        coordinate units, whatever units φ_i is written in; likewise for the velocity residuals (∂φ̇/∂q̇ =
        ∂φ/∂q). Rows are in the order of :meth:`residuals`.
        """
        norms = jnp.linalg.norm(A, axis=1)
        position, velocity, row = [], [], 0
        for constraint, count in zip(self.constraints, rows, strict=True):
            block = norms[row : row + count]
            if isinstance(constraint, Holonomic):
                position.append(block)
                velocity.append(block)
            elif isinstance(constraint, Nonholonomic):
                velocity.append(block)
            row += count
        join = lambda xs: jnp.concatenate(xs) if xs else jnp.zeros((0,), A.dtype)
        return join(position), join(velocity)

    def energy(self, q, qd, t, p):
        """Total mechanical energy T + V (systems built from a Lagrangian only)."""
        if self.kinetic is None or self.potential is None:
            raise ValueError("energy() needs a system built with System.from_lagrangian")
        return self.kinetic(q, qd, t, p) + self.potential(q, t, p)

    def check_state(self, q, qd):
        if jnp.shape(q) != (self.n,) or jnp.shape(qd) != (self.n,):
            raise ValueError(
                f"state of a system with n = {self.n} needs q and qd of shape ({self.n},); "
                f"got {jnp.shape(q)} and {jnp.shape(qd)}"
            )


# ---------------------------------------------------------------------- composition (seed 003)
def _embed_constraint(constraint, index, key):
    """The same constraint acting on ``q[index]`` of a larger system, with parameters from ``p[key]``."""
    if isinstance(constraint, Holonomic):
        stab = constraint.baumgarte
        if stab is not None:
            stab = Baumgarte(gains=lambda P, g=stab.gains: g(P[key]), form=stab.form)
        return Holonomic(
            phi=lambda q, t, P, f=constraint.phi: f(q[index], t, P[key]),
            baumgarte=stab,
            name=f"{key}.{constraint.name}",
        )
    if isinstance(constraint, Nonholonomic):
        gain = None if constraint.gain is None else (lambda P, g=constraint.gain: g(P[key]))
        return Nonholonomic(
            psi=lambda q, qd, t, P, f=constraint.psi: f(q[index], qd[index], t, P[key]),
            gain=gain,
            name=f"{key}.{constraint.name}",
        )

    def A_full(q, qd, t, P, A=constraint.A):
        A_sub = jnp.atleast_2d(jnp.asarray(A(q[index], qd[index], t, P[key])))
        return jnp.zeros((A_sub.shape[0], q.shape[0]), A_sub.dtype).at[:, index].set(A_sub)

    return AccelerationLevel(
        A=A_full,
        b=lambda q, qd, t, P, b=constraint.b: b(q[index], qd[index], t, P[key]),
        name=f"{key}.{constraint.name}",
    )


def compose(
    subsystems: Mapping[str, System], connections=(), *, actuation=None, servo_constraints=()
) -> System:
    """Join subsystems into one system and add the constraints that connect them (Orsino, seed 003 §2-3).

    The coordinates are stacked in the order of ``subsystems`` (a mapping name -> System), as recorded in the
    result's ``layout`` (:class:`Layout`); the mass matrix is block diagonal and the given forces are stacked
    (seed 003 §2: M and f come from the lowest level, with its modular decoupling). The parameters of the
    composed system are a dict ``{name: p_name, ...}`` holding each subsystem's parameters under its name,
    plus any entries the connecting constraints read. Connection functions receive the full stacked q (q̇)
    and the full dict p; ``Layout.of(subsystems).split(q)`` gives them each subsystem's own coordinates.

    Constraint order is level order: each subsystem's own constraints (themselves in level order when the
    subsystem was composed), then ``connections``. The recursive solver (``System.acceleration(...,
    solver="recursive")``) enforces them in this order, level by level; a composed System can be composed
    again, and :meth:`System.with_constraints` adds a level without new subsystems.
    Subsystems with non-ideal constraint vectors contribute them in their coordinate slots. Actuation: an
    explicit ``actuation(q, t, p) -> (n, n_u)`` replaces the subsystems'; otherwise the subsystems' B matrices
    are placed block-diagonally (controls stacked in subsystem order). Servo constraints: the subsystems'
    (embedded), then ``servo_constraints``.
    """
    if not subsystems:
        raise ValueError("compose needs at least one subsystem")
    layout = Layout.of(subsystems)
    names = layout.names
    slices = layout.slices
    n = layout.n

    def mass(q, t, p):
        return jsl.block_diag(*[subsystems[k].mass_matrix(q[slices[k]], t, p[k]) for k in names])

    def force(q, qd, t, p):
        parts = [subsystems[k].given_force(q[slices[k]], qd[slices[k]], t, p[k]) for k in names]
        return jnp.concatenate(parts)

    nonideal = None
    if any(subsystems[k].nonideal is not None for k in names):

        def nonideal(q, qd, t, p):
            parts = []
            for k in names:
                c = subsystems[k].nonideal_vector(q[slices[k]], qd[slices[k]], t, p[k])
                parts.append(jnp.zeros(subsystems[k].n, jnp.result_type(q)) if c is None else c)
            return jnp.concatenate(parts)

    if actuation is None and any(subsystems[k].actuation is not None for k in names):
        actuated = [k for k in names if subsystems[k].actuation is not None]

        def actuation(q, t, p):
            parts = []
            for k in actuated:
                B_k = jnp.asarray(subsystems[k].actuation(q[slices[k]], t, p[k]))
                if B_k.ndim != 2 or B_k.shape[0] != subsystems[k].n:
                    raise ValueError(
                        f"actuation of subsystem {k!r} returned shape {B_k.shape}; "
                        f"expected ({subsystems[k].n}, n_u)"
                    )
                parts.append(jnp.zeros((n, B_k.shape[1]), B_k.dtype).at[slices[k]].set(B_k))
            return jnp.concatenate(parts, axis=1)

    inherited = tuple(_embed_constraint(c, slices[k], k) for k in names for c in subsystems[k].constraints)
    inherited_servo = tuple(
        _embed_constraint(c, slices[k], k) for k in names for c in subsystems[k].servo_constraints
    )
    coordinate_names = None
    if all(subsystems[k].coordinate_names is not None for k in names):
        coordinate_names = tuple(f"{k}.{c}" for k in names for c in subsystems[k].coordinate_names)

    kinetic = potential = None
    if all(subsystems[k].kinetic is not None and subsystems[k].potential is not None for k in names):

        def kinetic(q, qd, t, p):
            return sum(subsystems[k].kinetic(q[slices[k]], qd[slices[k]], t, p[k]) for k in names)

        def potential(q, t, p):
            return sum(subsystems[k].potential(q[slices[k]], t, p[k]) for k in names)

    return System(
        mass=mass,
        force=force,
        n=n,
        constraints=inherited + tuple(connections),
        nonideal=nonideal,
        actuation=actuation,
        servo_constraints=inherited_servo + tuple(servo_constraints),
        kinetic=kinetic,
        potential=potential,
        coordinate_names=coordinate_names,
        layout=layout,
    )
