"""Mechanical systems: unconstrained dynamics, constraints and actuation, as pure functions of parameters.

A :class:`System` describes ``M(q, t, p) q̈ = Q(q, q̇, t, p) + Q^c`` where the constraint force Q^c makes the
constraints hold (Udwadia-Kalaba equation, see :mod:`ukjax.dynamics`). A System holds functions only; every
number a user may tune (masses, lengths, Baumgarte and servo gains) lives in the parameter pytree ``p``
passed alongside, so ``jax.grad`` with respect to ``p`` reaches all of them. A System is an equinox Module
with no array leaves: it can be passed straight through ``jax.jit`` and ``jax.vmap`` (with ``in_axes=None``).

Systems can be written from M and Q (:class:`System`), from a Lagrangian (:meth:`System.from_lagrangian`), or
assembled from subsystems level by level (:func:`compose`, after Orsino, seed 003 §2-3).

Hierarchies (Orsino 2017, seed 003 §2-4). A System records which of its constraints form each level of
the hierarchy (:class:`Level`, ``System.levels``): :func:`compose` stacks the subsystems' levels bottom up
(level r of the result joins level r of every subsystem, whose blocks touch disjoint coordinates) and adds the
connections as one new level on top; :meth:`System.with_constraints` adds one level. The recursive solver
(``solver="recursive"``) performs one Kalman update per level (seed 003 eq. 4.14-4.16), and a level may carry
clearance covariances R(p) (eq. 4.17-4.18), read from the parameter pytree so they can be swept and
differentiated.

Configuration manifolds (nq ≠ n). A rigid body's orientation is a unit quaternion whose rate is not its
angular velocity, so q may have ``nq`` numbers and the velocity v (``qd``) ``n`` < nq. The System then has a
local chart (retraction) ``retract(q, δ) = q ⊕ δ`` for δ ∈ Rⁿ with q ⊕ 0 = q (:class:`ukjax.multibody.Tree`
provides it: quat ⊗ exp(δ/2) for a quaternion with ω in the body frame), and q̇ = N(q) v = d/ds (q ⊕ s v) at
s = 0. Because q(t + s) = q(t) ⊕ (s v + s²/2 v̇ + O(s³)) (the Magnus expansion of the orientation: its first
commutator term is of third order), a constraint written on q is posed in v exactly by composing it with the
chart at the current q: φ_q(δ, t) = φ(q ⊕ δ, t) gives A = ∂φ_q/∂δ at δ = 0 (= J N(q)), φ̇ = A v + ∂φ/∂t, and
the convective term b its second directional derivative along (v, 1), the Euclidean formulas with q → δ = 0,
q̇ → v. M, Q and every term of the UK equation (Liu et al. 2015, eq. 11-13) are in v: M(q) v̇ = Q(q, v, t) +
Qᶜ, A(q, v, t) v̇ = b. :func:`ukjax.simulate` integrates (q, v) with q̇ = N(q) v and projects q back onto
the manifold (``normalize``) after every step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from ukjax import dynamics
from ukjax._checks import symmetric_part
from ukjax._settings import SMALL_BUFFER_BYTES
from ukjax._shared import evaluate_shared
from ukjax.constraints import (
    AccelerationLevel,
    Baumgarte,
    Holonomic,
    Nonholonomic,
    _time_argument,
    second_order_blocks,
    stack_blocks,
)
from ukjax.linalg import (
    PINV_METHODS,
    cho_solve,
    cholesky,
    factorizations_looped,
    looped_factorizations,
    pinv,
    psd_pinv,
)

SOLVERS = ("uk", "recursive", "falco", "phohomsiri")


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


def _as_covariance(value, m: int, where: str):
    """A clearance value as an (m, m) covariance: a scalar means σ² I, a vector (m,) a diagonal."""
    R = jnp.asarray(value)
    if R.ndim == 0:
        return R * jnp.eye(m, dtype=R.dtype)
    if R.shape == (m,):
        return jnp.diag(R)
    if R.shape == (m, m):
        return R
    raise ValueError(
        f"clearance of {where} must be a scalar, a vector ({m},) or a matrix ({m}, {m}) for its {m} "
        f"constraint rows; got shape {R.shape}"
    )


class Level(eqx.Module):
    """One level of a hierarchy of models (Orsino 2017, seed 003 §2 and eq. 3.7): the constraints Ã_r
    enforced together, in one Kalman update of the recursive solver (eq. 4.14-4.16).

    A level is made of ``groups``: each group is a tuple of constraint objects (members of
    ``System.constraints``) together with an optional clearance ``R(p)`` for their rows (eq. 4.17-4.18).
    R(p) may return a scalar σ² (σ² I), a vector of variances (diagonal) or a full symmetric
    positive-semidefinite matrix; the level's covariance is block diagonal over its groups (zero where a
    group has no clearance). When :func:`compose` joins the levels r of several subsystems into one, their
    groups are kept side by side, so each subsystem's clearance keeps reading its own parameters.

    Levels name constraint objects, not positions, so a System whose constraints are replaced (e.g. by
    ``dataclasses.replace``) keeps a meaningful hierarchy: groups whose constraints are gone are dropped, and
    constraints no level names form one last level (:attr:`System.hierarchy`).

    What a clearance means physically: see :meth:`System.acceleration`.
    """

    name: str = eqx.field(static=True)
    groups: tuple[tuple[Any, ...], ...] = eqx.field(static=True)
    clearances: tuple[Callable[[Any], Any] | None, ...] = eqx.field(static=True)

    def __check_init__(self):
        if len(self.groups) != len(self.clearances):
            raise ValueError(f"Level {self.name!r}: one clearance (or None) per group is needed")

    @property
    def members(self) -> tuple:
        """The level's constraints, in the order their rows are stacked."""
        return tuple(c for group in self.groups for c in group)

    @property
    def has_clearance(self) -> bool:
        return any(c is not None for c in self.clearances)

    def embedded(self, new_of: Mapping[int, Any], key: str) -> Level:
        """The same level inside a composed system: constraints replaced by their embedded versions
        (``new_of[id(old)]``), clearances reading ``p[key]``."""
        return Level(
            name=self.name,
            groups=tuple(tuple(new_of[id(c)] for c in g) for g in self.groups),
            clearances=tuple(None if c is None else (lambda P, c=c: c(P[key])) for c in self.clearances),
        )

    def blocks(self, index_groups, blocks, p, dtype):
        """(A_r, b_r, R_r) of this level from the per-constraint blocks; ``index_groups`` are the positions
        of each group's constraints in ``blocks``. R_r is None without clearance."""
        parts = [blocks[i] for group in index_groups for i in group]
        A = jnp.concatenate([A_k for A_k, _ in parts])
        b = jnp.concatenate([b_k for _, b_k in parts])
        if not self.has_clearance:
            return A, b, None
        covariances = []
        for group, clearance in zip(index_groups, self.clearances, strict=True):
            m_g = sum(blocks[i][0].shape[0] for i in group)
            if clearance is None:
                covariances.append(jnp.zeros((m_g, m_g), dtype))
            else:
                covariances.append(jnp.asarray(_as_covariance(clearance(p), m_g, self.name), dtype))
        return A, b, jsl.block_diag(*covariances)


def _merge_levels(levels: list[Level]) -> Level:
    names = list(dict.fromkeys(level.name for level in levels))
    return Level(
        name=" + ".join(names),
        groups=tuple(g for level in levels for g in level.groups),
        clearances=tuple(c for level in levels for c in level.clearances),
    )


_MODEL_FUNCTIONS = {
    "mass": "(q, t, p) -> M",
    "force": "(q, qd, t, p) -> Q",
    "nonideal": "(q, qd, t, p) -> c",
    "actuation": "(q, t, p) -> B",
    "mass_and_force": "(q, qd, t, p) -> (M, Q)",
}
"""The model functions a :class:`System` holds, with their signatures (for the message when one is not)."""


class System(eqx.Module):
    """A constrained mechanical system with ``n`` coordinates (velocities; ``nq`` configuration numbers).

    Attributes:
        mass: ``M(q, t, p) -> (n, n)``, symmetric positive definite for the default solver.
        force: ``Q(q, qd, t, p) -> (n,)``, all given (applied, Coriolis/centrifugal, gravity) forces.
        n: number of generalized coordinates: of velocities, the size of M, Q and of A's rows (where nq ≠ n,
            q has nq numbers).
        constraints: passive constraints (:class:`~ukjax.constraints.Holonomic`,
            :class:`~ukjax.constraints.Nonholonomic`, :class:`~ukjax.constraints.AccelerationLevel`), in the
            order the recursive solver enforces them (lower levels of a composed system first).
        nonideal: optional ``c(q, qd, t, p) -> (n,)``, the non-ideal constraint vector of Liu et al. 2015
            (seed 000 eq. 12-13); ``None`` means ideal constraints.
        actuation: optional ``B(q, t, p) -> (n, n_u)``, so the control force is ``B u`` (servo control).
        servo_constraints: constraints the controls must enforce (seed 000 §III); unused by passive dynamics.
        kinetic, potential: kept when the system comes from a Lagrangian, for :meth:`energy`.
        mass_and_force: optional ``(q, qd, t, p) -> (M, Q)``, both in one evaluation (what
            :meth:`from_lagrangian` builds from one linearization); :meth:`motion` and :meth:`acceleration`
            use it instead of calling ``mass`` and ``force`` separately. It must agree with them; one built by
            :meth:`from_lagrangian` records the ``mass`` and ``force`` it agrees with and is ignored once
            either is replaced (``dataclasses.replace(system, force=...)``), see :meth:`mass_and_given_force`.
        mass_solve: optional ``(q, t, p, B) -> M(q)⁻¹B`` for B of shape (n, k), e.g. the articulated-body
            algorithm of a :class:`ukjax.multibody.Tree` (:meth:`ukjax.multibody.Tree.system` sets it). Where
            given, :meth:`motion` evaluates the Cholesky forms of the UK equation (``method`` "ldl" or
            "cholesky", ``solver="uk"``) through it without forming or factorizing M
            (:func:`ukjax.dynamics.uk_solve_with`); the other forms still use ``mass``. It must agree with
            ``mass``.
        constraint_rank: optional upper bound r on rank(A) of the passive constraints, for constraints
            written redundantly (m rows of rank r < m). :meth:`motion` (``solver="uk"``) then compresses
            A q̈ = b to r rows by r steps of a column-pivoted Householder QR
            (:func:`ukjax.dynamics.compress_rows`) before the UK solve: G is r x r and ``mass_solve`` is
            applied to r + 1 columns. The motion is unchanged where the bound holds; where it does not,
            A q̈ ≠ b and :func:`ukjax.simulate` reports status ``inconsistent_constraints``. ``None``: no
            bound (m > n rows are still compressed to n for the Cholesky forms).
        nq: number of configuration coordinates, the length of q; default n. Where nq ≠ n, ``retract`` is
            required (a free rigid body: nq = 7, n = 6).
        retract: optional ``retract(q, delta) -> q'`` (nq,) for delta (n,): the local chart q ⊕ δ of a
            configuration manifold, with q ⊕ 0 = q; q̇ = N(q) v = d/ds (q ⊕ s v) at s = 0
            (:meth:`configuration_rate`). ``None``: Euclidean coordinates, q ⊕ δ = q + δ. Constraints are
            then posed in the velocity through this chart (module docstring).
        normalize: optional ``normalize(q) -> q`` projecting q onto its manifold (quaternions to unit
            norm); :func:`ukjax.simulate` applies it after every step and evaluates the right-hand side at
            ``normalize(q)``. ``None``: the identity.
        coordinate_names: optional names of the coordinates (of the velocity: n of them), for plots and
            tables.
        coordinate_ranges: ranges stated for configuration numbers, as data: ``(index into q, name, lower,
            upper)`` each (e.g. a robot file's joint limits, :meth:`ukjax.robots.Robot.system`). They are not
            enforced; :func:`ukjax.diagnostics.range_violations` checks a solution against them.
        layout: set by :func:`compose`: where each subsystem's coordinates sit (:class:`Layout`).
        levels: the hierarchy (:class:`Level`), lowest first, partitioning ``constraints``; ``None`` means
            one level holding all of them (a module's own constraints). :func:`compose` and
            :meth:`with_constraints` record it; :attr:`hierarchy` gives the effective levels.
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
    levels: tuple[Level, ...] | None = eqx.field(static=True, default=None)
    mass_and_force: Callable[..., Any] | None = eqx.field(static=True, default=None)
    mass_solve: Callable[..., Any] | None = eqx.field(static=True, default=None)
    constraint_rank: int | None = eqx.field(static=True, default=None)
    nq: int | None = eqx.field(static=True, default=None)
    retract: Callable[..., Any] | None = eqx.field(static=True, default=None)
    normalize: Callable[..., Any] | None = eqx.field(static=True, default=None)
    coordinate_ranges: tuple[tuple[int, str, float, float], ...] = eqx.field(static=True, default=())

    def __post_init__(self):
        if self.nq is None:
            self.nq = self.n

    def __check_init__(self):
        for name, signature in _MODEL_FUNCTIONS.items():
            value = getattr(self, name)
            if value is not None and not callable(value):
                given = f"an array of shape {value.shape}" if hasattr(value, "shape") else repr(value)
                raise TypeError(
                    f"System.{name} must be a function {signature}, got {given}; a constant is written as a "
                    f"function that returns it, e.g. {name}=lambda {signature.split(' ->')[0][1:-1]}: value"
                )
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"System.n must be a positive int, got {self.n!r}")
        if not isinstance(self.nq, int) or isinstance(self.nq, bool) or self.nq < self.n:
            raise ValueError(f"System.nq must be an int >= n = {self.n} (or None: n), got {self.nq!r}")
        if self.nq != self.n and self.retract is None:
            raise ValueError(
                f"System with nq = {self.nq} configuration numbers and n = {self.n} velocities needs "
                "retract(q, delta), the chart that moves q by a velocity-sized delta"
            )
        if self.constraint_rank is not None and (
            not isinstance(self.constraint_rank, int) or isinstance(self.constraint_rank, bool)
            or self.constraint_rank < 1
        ):
            raise ValueError(
                f"System.constraint_rank must be a positive int or None, got {self.constraint_rank!r}"
            )
        for constraint in (*self.constraints, *self.servo_constraints):
            if not isinstance(constraint, Holonomic | Nonholonomic | AccelerationLevel):
                raise TypeError(
                    f"constraints must be Holonomic, Nonholonomic or AccelerationLevel, got {constraint!r}"
                )
        if self.coordinate_names is not None and len(self.coordinate_names) != self.n:
            raise ValueError(f"{len(self.coordinate_names)} coordinate names for n = {self.n} coordinates")
        for index, name, lower, upper in self.coordinate_ranges:
            if not 0 <= index < self.nq or not lower <= upper:
                raise ValueError(
                    f"coordinate range {name!r}: needs 0 <= index < nq = {self.nq} and lower <= upper, "
                    f"got index {index}, [{lower}, {upper}]"
                )
        if self.layout is not None and self.layout.n != self.n:
            raise ValueError(f"layout covers {self.layout.n} coordinates, the system has n = {self.n}")
        if self.levels is not None:
            named = [id(c) for level in self.levels for c in level.members]
            if len(set(named)) != len(named):
                raise ValueError("levels must name each constraint at most once")
            self._resolved_levels()  # raises on a group that is only partly present

    def _resolved_levels(self) -> list[tuple[Level, tuple[tuple[int, ...], ...]]]:
        """(level, positions of its groups' constraints in ``constraints``) for every level of
        :attr:`hierarchy`."""
        positions: dict[int, list[int]] = {}
        for i, c in enumerate(self.constraints):
            positions.setdefault(id(c), []).append(i)
        out, used = [], set()
        for level in self.levels or ():
            groups, clearances, index_groups = [], [], []
            for group, clearance in zip(level.groups, level.clearances, strict=True):
                present = [id(c) in positions for c in group]
                if not any(present):
                    continue
                if not all(present):
                    raise ValueError(
                        f"level {level.name!r}: a group's constraints are only partly in the system"
                    )
                ids = list(dict.fromkeys(id(c) for c in group))
                index_groups.append(tuple(i for k in ids for i in positions[k]))
                used.update(ids)
                groups.append(group)
                clearances.append(clearance)
            if groups:
                out.append(
                    (
                        Level(name=level.name, groups=tuple(groups), clearances=tuple(clearances)),
                        tuple(index_groups),
                    )
                )
        rest = list({id(c): c for c in self.constraints if id(c) not in used}.values())
        if rest:
            index = tuple(i for i, c in enumerate(self.constraints) if id(c) not in used)
            level = Level(name=f"level {len(out) + 1}", groups=(tuple(rest),), clearances=(None,))
            out.append((level, (index,)))
        return out

    @property
    def hierarchy(self) -> tuple[Level, ...]:
        """The levels the recursive solver enforces, lowest first: ``levels`` (those of its constraints still
        present), then one more level with every constraint no level names (all of them when ``levels`` is
        None: a module's own constraints); empty without constraints."""
        return tuple(level for level, _ in self._resolved_levels())

    @property
    def has_clearance(self) -> bool:
        """Whether some level carries a clearance covariance (only ``solver="recursive"`` reads it)."""
        return any(level.has_clearance for level in self.hierarchy)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lagrangian(
        cls,
        kinetic: Callable[..., Any],
        potential: Callable[..., Any] | None,
        n: int,
        *,
        applied_force: Callable[..., Any] | None = None,
        **kwargs,
    ) -> System:
        """A system from ``T(q, qd, t, p)``, ``V(q, t, p)`` and optional applied forces ``Q_a(q, qd, t, p)``.

        Lagrange's equations d/dt ∂L/∂q̇ - ∂L/∂q = Q_a with L = T - V give M q̈ = Q where
        ``M = ∂²T/∂q̇²`` and ``Q = ∂L/∂q - (∂²L/∂q̇∂q) q̇ - ∂²L/∂q̇∂t + Q_a``: Coriolis, centrifugal, gravity
        and (for rheonomic T) transport terms, all by automatic differentiation. T must be at most quadratic
        in q̇ (true of every mechanical kinetic energy), so that ∂²T/∂q̇² does not depend on q̇.
        ``potential=None`` means V = 0.

        The system's ``mass_and_force`` (used by :meth:`motion`) gives M and Q from ONE linearization of
        the gradient g(q, q̇, t) = (∂L/∂q, ∂L/∂q̇): one reverse pass gives g, and its linear map (one forward
        pass, ``jax.linearize``) applied to the n + 1 tangents (0, e_i, 0) and (q̇, 0, 1) gives the columns
        ∂²L/∂q̇² e_i = M e_i (V has no q̇) and the velocity term (∂²L/∂q̇∂q) q̇ + ∂²L/∂q̇∂t. ``mass`` and
        ``force`` alone stay separate passes (``jax.hessian`` of T at q̇ = 0; ``jax.grad`` and one JVP),
        for callers that need only one of them.
        """
        chart = [k for k in ("nq", "retract", "normalize") if kwargs.get(k) is not None]
        if chart:
            raise ValueError(
                f"System.from_lagrangian needs q̇ = v (Lagrange's equations in q, q̇); it cannot take "
                f"{chart}. Write M and Q in the velocity directly (System(mass=..., force=..., nq=..., "
                "retract=...)) or use ukjax.multibody.Tree.system for rigid bodies with ball or free joints"
            )
        if potential is None:

            def potential(q, t, p):
                return jnp.zeros((), jnp.result_type(q))

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

        def mass_and_force(q, qd, t, p):
            dtype = jnp.result_type(q)
            t = jnp.asarray(t, dtype=dtype)
            gradient = lambda q_, qd_, t_: jax.grad(lagrangian, argnums=(0, 1))(q_, qd_, t_, p)
            (dL_dq, _), linear = jax.linearize(gradient, q, qd, t)
            size = q.shape[0]
            # tangents (0, e_i, 0), i < n, and (q̇, 0, 1), stacked: one forward pass for all n + 1
            tangent_q = jnp.concatenate([jnp.zeros((size, size), dtype), qd[None, :]])
            tangent_qd = jnp.concatenate([jnp.eye(size, dtype=dtype), jnp.zeros((1, size), dtype)])
            tangent_t = jnp.concatenate([jnp.zeros((size,), dtype), jnp.ones((1,), dtype)])
            _, d_qd = jax.vmap(linear)(tangent_q, tangent_qd, tangent_t)
            M = d_qd[:size].T  # column i is (∂²L/∂q̇²) e_i
            Q = dL_dq - d_qd[size]
            if applied_force is not None:
                Q = Q + applied_force(q, qd, t, p)
            return M, Q

        mass_and_force.agrees_with = (mass, force)
        return cls(
            mass=mass,
            force=force,
            n=n,
            kinetic=kinetic,
            potential=potential,
            mass_and_force=mass_and_force,
            **kwargs,
        )

    def with_constraints(self, *constraints, servo_constraints=(), level: str | None = None, clearance=None):
        """The same system with more constraints enforced: the next level of a hierarchy (seed 003 eq. 3.7).

        Orsino's levels share one set of coordinates, A_{r+1} = [A_r; Ã_{r+1}]: the new constraints
        (functions of the full q, q̇ and p of this system) are appended after the existing ones and form one
        new level (named ``level``, default "level r"), which the recursive solver enforces after this
        system's own levels, in one Kalman update. ``clearance(p)`` optionally gives that level's covariance
        R_{r+1} (seed 003 eq. 4.17-4.18; see :class:`Level`). ``servo_constraints`` are appended likewise.
        """
        levels = self.hierarchy
        if constraints:
            new = Level(
                name=level or f"level {len(levels) + 1}",
                groups=(tuple(constraints),),
                clearances=(clearance,),
            )
            levels = levels + (new,)
        elif clearance is not None:
            raise ValueError("with_constraints: a clearance needs constraints to apply to")
        return dataclasses.replace(
            self,
            constraints=self.constraints + tuple(constraints),
            servo_constraints=self.servo_constraints + tuple(servo_constraints),
            levels=levels,
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

    def mass_and_given_force(self, q, qd, t, p):
        """(M, Q) at one state: from ``mass_and_force`` in one evaluation where the system has one that agrees
        with its ``mass`` and ``force`` (:meth:`from_lagrangian` records which; a user-supplied one without
        that record is trusted), else :meth:`mass_matrix` and :meth:`given_force`."""
        joint = self.mass_and_force
        agrees_with = getattr(joint, "agrees_with", None)
        if joint is None or (
            agrees_with is not None and (agrees_with[0] is not self.mass or agrees_with[1] is not self.force)
        ):
            return self.mass_matrix(q, t, p), self.given_force(q, qd, t, p)
        M, Q = (jnp.asarray(x) for x in joint(q, qd, t, p))
        if M.shape != (self.n, self.n) or Q.shape != (self.n,):
            raise ValueError(
                f"mass_and_force(q, qd, t, p) returned shapes {M.shape} and {Q.shape}; expected "
                f"({self.n}, {self.n}) and ({self.n},)"
            )
        return M, Q

    def solve_mass(self, q, t, p, B):
        """M(q)⁻¹B for B of shape (n,) or (n, k): by ``mass_solve`` where the system has one, else by a
        Cholesky factorization of :meth:`mass_matrix` (:func:`ukjax.linalg.cholesky`)."""
        B = jnp.asarray(B)
        if self.mass_solve is None:
            return cho_solve(cholesky(self.mass_matrix(q, t, p)), B)
        X = jnp.asarray(self.mass_solve(q, t, p, B))
        if X.shape != B.shape:
            raise ValueError(f"mass_solve(q, t, p, B) returned shape {X.shape}; expected {B.shape}")
        return X

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
        return second_order_blocks(self.constraints, q, qd, t, p, self.retract)

    def constraint_equations(self, q, qd, t, p):
        """The stacked second-order form (A, b) of all passive constraints, with Baumgarte terms in b."""
        return stack_blocks(self.constraint_blocks(q, qd, t, p), self.n, jnp.result_type(q))

    def acceleration(
        self, q, qd, t, p, *, method: str = "ldl", solver: str = "uk", rtol=None, force=None
    ):
        """q̈ of the constrained system, M q̈ = Q + Q^c (seed 000 eq. 11-13).

        ``solver="uk"``: the one-shot UK equation with the stacked (A, b), any ``method`` of
        :func:`ukjax.uk_acceleration`. ``solver="recursive"``: the Kalman-filter form of Orsino (2017, seed
        003 eq. 4.14-4.16), one update per level of :attr:`hierarchy` (lowest first) from a_0 = M⁻¹(Q + c)
        (eq. 4.2: a non-ideal vector enters as a given force) with P_0 = M⁻¹; ``method`` is unused there.
        Without constraints (A of shape (0, n)) both give q̈ = M⁻¹(Q + c) by a Cholesky solve. ``force``
        replaces Q (e.g. Q + B u).

        ``solver="falco"`` or ``"phohomsiri"``: the forms of de Falco et al. (eq. 37-41) and Udwadia &
        Phohomsiri (2006; de Falco et al. eq. 42-43) for a positive-semidefinite, possibly singular M with
        rank [M; A] = n (:func:`ukjax.dynamics.singular_mass_acceleration`), generalized inverses by
        ``method`` when it is one of :data:`ukjax.linalg.PINV_METHODS`, else by SVD. Their constraint force
        is M q̈ - Q split into a non-ideal part (I - A⁺A) c, which does the work vᵀc on every virtual
        displacement v, and an ideal part in range(Aᵀ).

        Clearances (``solver="recursive"`` only; eq. 4.17-4.18). With covariances R_r on the levels the
        update is K = P Ãᵀ(Ã P Ãᵀ + R)⁺ and the result is the weighted least-squares acceleration

            q̈ = argmin (q̈ - a_0)ᵀM(q̈ - a_0) + Σ_r (Ã_r q̈ - b̃_r)ᵀ R_r⁻¹ (Ã_r q̈ - b̃_r),

        i.e. M q̈ = Q + c + Aᵀλ with A q̈ - b = -R λ: each constraint may be violated, at the acceleration
        level, in proportion to its own reaction λ. Physically that is a compliant joint: R is a compliance
        (acceleration per unit force, units 1/kg for a position constraint in metres); with Baumgarte terms
        φ̈ + 2αφ̇ + β²φ = -Rλ, so quasi-statically the joint deflects by φ ≈ -Rλ/β², as if held by a
        massless spring of stiffness β²R⁻¹ and damper 2αR⁻¹ along the constraint directions. It is not a
        geometric gap (no free play, no contact loss or impact, no dead zone), not a random disturbance (the
        motion is deterministic: the Kalman mean, not a sample), and the covariance P carried by the update
        is not an uncertainty of the trajectory. R = 0 gives the exact (rigid) constraints. ``solver="uk"``
        refuses a system with clearances rather than silently ignoring them.
        """
        return self.motion(q, qd, t, p, method=method, solver=solver, rtol=rtol, force=force).qdd

    def motion(
        self, q, qd, t, p, *, method: str = "ldl", solver: str = "uk", rtol=None, force=None
    ) -> Motion:
        """q̈, the constraint forces and (A, b) at one state from one UK solve (see :meth:`acceleration`).

        The recursive solver forms no constraint force (``constraint_force`` is None; see
        :meth:`constraint_force`)."""
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
        if method not in dynamics.ACCELERATION_METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {dynamics.ACCELERATION_METHODS}")
        self.check_state(q, qd)
        # One program per system, shapes and options (an inner jit when traced): the right-hand side is
        # traced once, not once per Runge-Kutta stage, saved time and derivative pass; on concrete arrays
        # it is one compiled call instead of JAX's op-by-op dispatch of the solve's few hundred operations.
        from ukjax.multibody import recursions_unrolled, values_per_body

        settings = (recursions_unrolled(), factorizations_looped(), values_per_body())
        return _compiled_motion(self, q, qd, _time_argument(t, q), p, method, solver, rtol, force, *settings)

    def _motion(self, q, qd, t, p, method, solver, rtol, force) -> Motion:
        uses_mass_solve = (self.mass_solve is not None and solver == "uk" and method in dynamics.GRAM_METHODS
                           and not self._dense_mass_pays(q, qd, t, p))  # fmt: skip
        given_solve = self._given_force_solve() if uses_mass_solve and force is None else None
        c, blocks, M, Q = evaluate_shared(
            functools.partial(self._model_terms, mass=not uses_mass_solve, given=given_solve is None),
            q, qd, t, p, force,
        )
        A, b = stack_blocks(blocks, self.n, jnp.result_type(q))
        rows = tuple(A_k.shape[0] for A_k, _ in blocks)
        if solver == "uk" and self.constraint_rank is not None:  # only the one-shot UK solve takes fewer rows
            A_solve, b_solve = dynamics.compress_rows(A, b, self.constraint_rank)
        else:
            A_solve, b_solve = A, b
        if uses_mass_solve:
            self._refuse_clearance("solver='uk'")
            if given_solve is None:
                solve = lambda B: self.solve_mass(q, t, p, B)  # noqa: E731
            else:
                # M⁻¹ applied to [Q + c, (Q,) Aᵀ] with the given force's share in the first 1 (2 with c)
                # columns: Q passed as 0 and added back inside the solve, M⁻¹(B + Q wᵀ)
                Q = jnp.zeros(self.n, jnp.result_type(q, qd, float))
                given = 1 if c is None else 2
                solve = lambda B: given_solve(q, qd, t, p, B, np.arange(B.shape[1]) < given)  # noqa: E731
            qdd, reaction = dynamics.uk_solve_with(solve, Q, A_solve, b_solve, c, method=method, rtol=rtol)
            return Motion(qdd=qdd, constraint_force=reaction, A=A, b=b, rows=rows)
        F = Q if c is None else Q + c
        if solver in dynamics.SINGULAR_MASS_FORMS and A.shape[0] > 0:
            self._refuse_clearance(f"solver={solver!r}")
            inverse = method if method in PINV_METHODS else "svd"
            qdd = dynamics.singular_mass_acceleration(M, Q, A, b, c, form=solver, method=inverse, rtol=rtol)
            nonideal = jnp.zeros_like(Q) if c is None else c - pinv(A, inverse, rtol) @ (A @ c)
            reaction = dynamics.ConstraintForce(ideal=0.5 * (M + M.T) @ qdd - Q - nonideal, nonideal=nonideal)
            return Motion(qdd=qdd, constraint_force=reaction, A=A, b=b, rows=rows)
        if A.shape[0] == 0:
            qdd = jsl.cho_solve((jnp.linalg.cholesky(0.5 * (M + M.T)), True), F)
            zero = jnp.zeros_like(Q)
            reaction = dynamics.ConstraintForce(ideal=zero, nonideal=zero if c is None else c)
            return Motion(qdd=qdd, constraint_force=reaction, A=A, b=b, rows=rows)
        if solver == "uk":
            self._refuse_clearance("solver='uk'")
            qdd, reaction = dynamics.uk_solve(M, Q, A_solve, b_solve, c, method=method, rtol=rtol)
            return Motion(qdd=qdd, constraint_force=reaction, A=A, b=b, rows=rows)
        level_blocks, covariances = self.level_blocks(blocks, p, jnp.result_type(q))
        qdd = dynamics.recursive_uk_acceleration(M, F, level_blocks, covariances, rtol=rtol)
        return Motion(qdd=qdd, constraint_force=None, A=A, b=b, rows=rows)

    def _solve_fits_small_buffers(self, q, qd, t, p, solver) -> bool:
        """Whether the UK solve's matrices at one state, A and [A | b] (m x n, m x (n + 1)) and, where it is
        formed, M (n x n), all fit in :data:`ukjax._settings.SMALL_BUFFER_BYTES`: only then can keeping a
        tree's per-body values apart (:func:`ukjax.multibody.per_body_values`) leave one scenario's step
        with small buffers alone. Jansen's leg (10 x 7 rows: 560 bytes in float64) ran its step 1.4x slower
        with them apart (261 against 186 µs, 9 interleaved rounds) and compiled 1.4x longer."""
        itemsize = jnp.result_type(q, float).itemsize
        rows = self._constraint_rows(q, qd, t, p)
        dense = self.mass_solve is None or solver != "uk" or self._dense_mass_pays(q, qd, t, p, rows)
        largest = max(rows * (self.n + 1), self.n * self.n if dense else 0)
        return largest * itemsize <= SMALL_BUFFER_BYTES

    def _constraint_rows(self, q, qd, t, p) -> int:
        """The number of constraint rows m at a state, from the blocks' shapes (nothing evaluated)."""
        return sum(A.shape[0] for A, _ in jax.eval_shape(self.constraint_blocks, q, qd, t, p))

    def _dense_mass_pays(self, q, qd, t, p, rows: int | None = None) -> bool:
        """Whether a kinematic tree's M, formed by its composite-rigid-body pass and factorized by Cholesky,
        serves the UK solve better than its articulated-body solve: with at least n constraint rows, which
        the solve compresses to n (:func:`ukjax.dynamics.compress_rows`), M⁻¹ is applied to n + 1 columns,
        as many sweeps as forming M⁻¹ itself. Jansen's leg (n = 7, 10 rows), 256 scenarios, RK4: 31.4
        against 94.8 µs per step; with fewer rows than n the articulated-body solve stays (the UR5 without
        constraints 9.2 against 17.8 µs, a pinned 8-link chain 26.5 against 32.4). Only for a tree's solve
        (``mass_solve.given_force_solve``, :meth:`ukjax.multibody.Tree.system`); another ``mass_solve`` (a
        composed system's blocks, a user's) is always used. ``rows``: m where the caller has it
        (:meth:`_constraint_rows`)."""
        if getattr(self.mass_solve, "given_force_solve", None) is None:
            return False
        return (self._constraint_rows(q, qd, t, p) if rows is None else rows) >= self.n

    def _given_force_solve(self):
        """``(q, qd, t, p, B, w) -> M⁻¹(B + Q wᵀ)`` (B (n, k), w (k,)) where ``mass_solve`` carries one
        (``mass_solve.given_force_solve``, set by :meth:`ukjax.multibody.Tree.system`: the articulated-body
        algorithm with velocities, Featherstone 2008 Table 7.1, so Q = τ - C is never formed) and it agrees
        with this system's ``force``; else None."""
        solve = getattr(self.mass_solve, "given_force_solve", None)
        if solve is None or getattr(solve, "agrees_with", None) is not self.force:
            return None
        return solve

    def _model_terms(self, q, qd, t, p, force, *, mass: bool, given: bool = True):
        """(c, constraint blocks, M or None, Q) at one state: every model function :meth:`motion` reads,
        evaluated together (:func:`ukjax._shared.evaluate_shared` shares their transcendental values).
        ``force`` replaces Q; ``mass=False`` skips M (``mass_solve`` applies M⁻¹); ``given=False`` skips Q
        (None: the solve applies M⁻¹ to it, :meth:`_given_force_solve`)."""
        c = self.nonideal_vector(q, qd, t, p)
        blocks = self.constraint_blocks(q, qd, t, p)
        if not given:
            return c, blocks, None, None
        if force is not None:
            return c, blocks, self.mass_matrix(q, t, p) if mass else None, jnp.asarray(force)
        if mass:
            return c, blocks, *self.mass_and_given_force(q, qd, t, p)
        return c, blocks, None, self.given_force(q, qd, t, p)

    def _refuse_clearance(self, what: str):
        if self.has_clearance:
            names = [level.name for level in self.hierarchy if level.has_clearance]
            raise ValueError(
                f"{what} enforces the constraints exactly; the clearance covariances of levels {names} "
                "(Orsino 2017 eq. 4.17-4.18) are read only by solver='recursive' (simulate(..., "
                "uk_solver='recursive'))"
            )

    def level_blocks(self, blocks, p, dtype):
        """Per level of :attr:`hierarchy`: ``[(A_r, b_r), ...]`` and ``[R_r or None, ...]``, from the
        per-constraint blocks of :meth:`constraint_blocks`."""
        triples = [level.blocks(index, blocks, p, dtype) for level, index in self._resolved_levels()]
        return [(A, b) for A, b, _ in triples], [R for _, _, R in triples]

    def constraint_force(
        self, q, qd, t, p, *, force=None, method: str = "ldl", solver: str = "uk", rtol=None
    ):
        """The constraint force (ideal and non-ideal parts, seed 000 eq. 11-12) consistent with ``solver``.

        Without clearances this is :func:`ukjax.uk_constraint_force` with the stacked (A, b) for either
        solver. With clearances (``solver="recursive"``) it is M q̈ - Q - c + (non-ideal part) from the
        recursive accelerations, by linearity in the force: ideal = M q̈(Q) - Q, non-ideal = M(q̈(Q + c) -
        q̈(Q)). ``force`` replaces Q (e.g. Q + B u).
        """
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
        M = self.mass_matrix(q, t, p)
        Q = self.given_force(q, qd, t, p) if force is None else jnp.asarray(force)
        c = self.nonideal_vector(q, qd, t, p)
        if solver == "uk":
            self._refuse_clearance("constraint_force with solver='uk'")
        if not self.has_clearance:
            A, b = self.constraint_equations(q, qd, t, p)
            return dynamics.uk_constraint_force(M, Q, A, b, c, method=method, rtol=rtol)
        plain = dataclasses.replace(self, nonideal=None)
        qdd_Q = plain.acceleration(q, qd, t, p, solver="recursive", rtol=rtol, force=Q)
        ideal = M @ qdd_Q - Q
        if c is None:
            return dynamics.ConstraintForce(ideal=ideal, nonideal=jnp.zeros_like(Q))
        qdd_F = self.acceleration(q, qd, t, p, solver="recursive", rtol=rtol, force=Q)
        return dynamics.ConstraintForce(ideal=ideal, nonideal=M @ (qdd_F - qdd_Q))

    def multipliers(self, q, qd, t, p, *, force=None, rtol=None):
        """λ_k per constraint (a tuple aligned with ``constraints``): M q̈ = Q + c + Σ_k A_kᵀλ_k.

        One-shot: λ = (A M⁻¹Aᵀ + R)⁺(b - A M⁻¹(Q + c)) with the stacked levels and the block-diagonal
        clearance covariance R (zero without clearances: the Lagrange multipliers of the KKT system, minimum
        norm for redundant constraints). For a revolute joint written as p_a - p_b = 0 in Cartesian
        coordinates, λ is the joint force on body a. With clearances it equals R⁻¹(b - A q̈) of the recursive
        solution (Orsino 2017 eq. 4.17-4.18), by the normal equations of its least-squares problem.
        """
        self.check_state(q, qd)
        dtype = jnp.result_type(q)
        M = symmetric_part(self.mass_matrix(q, t, p))
        Q = self.given_force(q, qd, t, p) if force is None else jnp.asarray(force)
        c = self.nonideal_vector(q, qd, t, p)
        F = Q if c is None else Q + c
        blocks = self.constraint_blocks(q, qd, t, p)
        if not blocks:
            return ()
        level_blocks, covariances = self.level_blocks(blocks, p, dtype)
        A = jnp.concatenate([A_r for A_r, _ in level_blocks])
        b = jnp.concatenate([b_r for _, b_r in level_blocks])
        R = jsl.block_diag(
            *[
                jnp.zeros((A_r.shape[0], A_r.shape[0]), dtype) if R_r is None else R_r
                for (A_r, _), R_r in zip(level_blocks, covariances, strict=True)
            ]
        )
        L = cholesky(M)
        solved = cho_solve(L, jnp.concatenate([F[:, None], A.T], axis=1))
        G = A @ solved[:, 1:] + R
        lam = psd_pinv(G, dynamics.gram_rtol(G.shape[0], self.n, dtype) if rtol is None else rtol) @ (
            b - A @ solved[:, 0]
        )
        # rows are stacked level by level; hand them back per constraint
        out, row = {}, 0
        for _, index_groups in self._resolved_levels():
            for i in (i for group in index_groups for i in group):
                m_i = blocks[i][0].shape[0]
                out[i] = lam[row : row + m_i]
                row += m_i
        return tuple(out[i] for i in range(len(blocks)))

    def residuals(self, q, qd, t, p):
        """Constraint residuals at a state: ``(position, velocity)``.

        ``position`` stacks φ of every holonomic constraint; ``velocity`` stacks φ̇ of every holonomic and ψ
        of every nonholonomic constraint. Either may be empty. On a manifold φ̇ = A v + ∂φ/∂t through the
        chart.
        """
        self.check_state(q, qd)
        dtype = jnp.result_type(q)
        position, velocity = [], []
        for constraint in self.constraints:
            if isinstance(constraint, Holonomic):
                phi, phi_dot = constraint.residuals(q, qd, t, p, self.retract)
                position.append(phi)
                velocity.append(phi_dot)
            elif isinstance(constraint, Nonholonomic):
                velocity.extend(constraint.residuals(q, qd, t, p, self.retract))
        join = lambda xs: jnp.concatenate(xs) if xs else jnp.zeros((0,), dtype)
        return join(position), join(velocity)

    def residual_gradients(self, A, rows):
        """The gradient of every residual of :meth:`residuals` from the stacked constraint matrix A of the
        same state: ``(∂φ/∂q (k_h, n), ∂(φ̇, ψ)/∂q̇ (k_v, n))``, rows in the order of :meth:`residuals`.

        The rows of A are exactly these gradients (A = ∂φ/∂q for a holonomic block, ∂ψ/∂q̇ for a nonholonomic
        one, and ∂φ̇/∂q̇ = ∂φ/∂q; on a manifold ∂φ(q ⊕ δ)/∂δ at δ = 0), so nothing is differentiated
        again. ``rows``: the rows of each constraint's block of A.
        """
        position, velocity, row = [], [], 0
        for constraint, count in zip(self.constraints, rows, strict=True):
            if isinstance(constraint, Holonomic):
                position.append(A[row : row + count])
                velocity.append(A[row : row + count])
            elif isinstance(constraint, Nonholonomic):
                velocity.append(A[row : row + count])
            row += count
        join = lambda xs: jnp.concatenate(xs) if xs else jnp.zeros((0, self.n), A.dtype)
        return join(position), join(velocity)

    def residual_scales(self, A, rows):
        """Per-row scales of :meth:`residuals`: ``(‖∂φ_i/∂q‖, ‖∂φ̇_i/∂q̇‖ or ‖∂ψ_i/∂q̇‖)``
        (:meth:`residual_gradients`). |φ_i| / ‖∂φ_i/∂q‖ is, to first order, the distance of q from the
        constraint surface φ_i = 0 in coordinate units, whatever units φ_i is written in; likewise for the
        velocity residuals. :func:`ukjax.simulate` judges its status by these distances with per-coordinate
        tolerances (:class:`ukjax.Solution`).
        """
        return tuple(jnp.linalg.norm(G, axis=1) for G in self.residual_gradients(A, rows))

    def linearize(self, q, qd, t, p, *, independent, **options):
        """The dynamics linearized at (q, q̇, t) in minimal coordinates: ẋ ≈ A x + B u for x = (q_I, v_I),
        constraint and Baumgarte directions eliminated; see :func:`ukjax.linearize.linearize` (its keyword
        arguments: ``independent_rates``, ``drop``, ``u``, ...) and :class:`ukjax.linearize.Linearization`."""
        from ukjax.linearize import linearize  # ukjax.linearize reads Systems; a local import keeps one way

        return linearize(self, q, qd, t, p, independent=independent, **options)

    def energy(self, q, qd, t, p):
        """Total mechanical energy T + V (systems built from a Lagrangian only)."""
        if self.kinetic is None or self.potential is None:
            raise ValueError("energy() needs a system built with System.from_lagrangian")
        return self.kinetic(q, qd, t, p) + self.potential(q, t, p)

    def check_state(self, q, qd):
        if jnp.shape(q) != (self.nq,) or jnp.shape(qd) != (self.n,):
            what = (f"q and qd of shape ({self.n},)" if self.nq == self.n
                    else f"q of shape ({self.nq},) and qd of shape ({self.n},)")  # fmt: skip
            raise ValueError(
                f"state of a system with nq = {self.nq}, n = {self.n} needs {what}; "
                f"got {jnp.shape(q)} and {jnp.shape(qd)}"
            )

    def configuration_rate(self, q, qd):
        """q̇ = N(q) v = d/ds (q ⊕ s v)|_{s=0} (nq,): ``qd`` itself for Euclidean coordinates."""
        if self.retract is None:
            return qd
        q = jnp.asarray(q)
        zero, qd = jnp.zeros(jnp.shape(qd), q.dtype), jnp.asarray(qd, q.dtype)
        return jax.jvp(lambda d: self.retract(q, d), (zero,), (qd,))[1]

    def project(self, q):
        """``normalize(q)``: q on its manifold (the identity without ``normalize``)."""
        return q if self.normalize is None else self.normalize(q)


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
    subsystems: Mapping[str, System],
    connections=(),
    *,
    actuation=None,
    servo_constraints=(),
    level: str | None = None,
    clearance=None,
) -> System:
    """Join subsystems into one system and add the constraints that connect them (Orsino, seed 003 §2-3).

    The coordinates are stacked in the order of ``subsystems`` (a mapping name -> System), as recorded in the
    result's ``layout`` (:class:`Layout`); the mass matrix is block diagonal (``mass_solve`` solves it
    block by block, each subsystem by its own ``mass_solve`` or a Cholesky of its block) and the given forces
    are stacked (seed 003 §2: M and f come from the lowest level, with its modular decoupling). The
    parameters of the composed system are a dict ``{name: p_name, ...}`` holding each subsystem's parameters
    under its name, plus any entries the connecting constraints read. Connection functions receive the full
    stacked q (q̇) and the full dict p; ``Layout.of(subsystems).split(q)`` gives them each subsystem's own
    coordinates.

    Levels (seed 003 §2, Fig. 4): the subsystems' hierarchies are stacked bottom up: level r of the result
    joins level r of every subsystem that has one (their blocks touch disjoint coordinates, seed 003 §2), and
    ``connections`` form one new level on top (named ``level``, default "level r"; optional ``clearance(p)``
    gives its covariance, :class:`Level`). A subsystem's clearances keep reading its own parameters
    ``p[name]``. The recursive solver (``System.acceleration(..., solver="recursive")``) performs one Kalman
    update per level, lowest first; a composed System can be composed again, and
    :meth:`System.with_constraints` adds a level without new subsystems. ``constraints`` lists each
    subsystem's own constraints in subsystem order, then ``connections``.
    Subsystems with non-ideal constraint vectors contribute them in their coordinate slots. Actuation: an
    explicit ``actuation(q, t, p) -> (n, n_u)`` replaces the subsystems'; otherwise the subsystems' B matrices
    are placed block-diagonally (controls stacked in subsystem order). Servo constraints: the subsystems'
    (embedded), then ``servo_constraints``.
    """
    if not subsystems:
        raise ValueError("compose needs at least one subsystem")
    charted = [k for k in subsystems if subsystems[k].retract is not None]
    if charted:
        raise ValueError(
            f"compose stacks coordinates with q̇ = v; subsystems {charted} have a configuration manifold "
            "(retract: ball or free joints, nq != n), which compose does not support; build one "
            "ukjax.multibody.Tree holding all the bodies instead"
        )
    layout = Layout.of(subsystems)
    names = layout.names
    slices = layout.slices
    n = layout.n

    def mass(q, t, p):
        return jsl.block_diag(*[subsystems[k].mass_matrix(q[slices[k]], t, p[k]) for k in names])

    def force(q, qd, t, p):
        parts = [subsystems[k].given_force(q[slices[k]], qd[slices[k]], t, p[k]) for k in names]
        return jnp.concatenate(parts)

    def mass_solve(q, t, p, B):
        # M is block diagonal (Orsino 2017 §2): each subsystem solves its own rows, by its own mass_solve or
        # a Cholesky of its small block, instead of one factorization of the n x n matrix.
        parts = [subsystems[k].solve_mass(q[slices[k]], t, p[k], B[slices[k]]) for k in names]
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

    embedded = {k: [_embed_constraint(c, slices[k], k) for c in subsystems[k].constraints] for k in names}
    inherited = tuple(c for k in names for c in embedded[k])
    new_of = {
        k: {id(old): new for old, new in zip(subsystems[k].constraints, embedded[k], strict=True)}
        for k in names
    }
    depth = max(len(subsystems[k].hierarchy) for k in names)
    levels = []
    for r in range(depth):
        parts = [
            subsystems[k].hierarchy[r].embedded(new_of[k], k)
            for k in names
            if r < len(subsystems[k].hierarchy)
        ]
        levels.append(_merge_levels(parts))
    connections = tuple(connections)
    if connections:
        levels.append(
            Level(
                name=level or f"level {depth + 1}",
                groups=(connections,),
                clearances=(clearance,),
            )
        )
    elif clearance is not None:
        raise ValueError("compose: a clearance needs connections to apply to")
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
        constraints=inherited + connections,
        nonideal=nonideal,
        actuation=actuation,
        servo_constraints=inherited_servo + tuple(servo_constraints),
        kinetic=kinetic,
        potential=potential,
        coordinate_names=coordinate_names,
        layout=layout,
        levels=tuple(levels),
        mass_solve=mass_solve,
        coordinate_ranges=tuple(  # each subsystem's ranges, at its place in the stacked q (nq = n here)
            (slices[k].start + index, f"{k}.{name}", lower, upper)
            for k in names
            for index, name, lower, upper in subsystems[k].coordinate_ranges
        ),
    )


@eqx.filter_jit
def _compiled_motion(
    system, q, qd, t, p, method, solver, rtol, force, unrolled: bool, looped: bool, per_body: bool
) -> Motion:
    """:meth:`System.motion` as one program per system, shapes and options. Inside a traced function it is
    a nested jit: JAX traces it once and reuses the trace (and its derivatives' traces) at every call with
    the same system and shapes, and XLA inlines it, so the compiled code is that of the inlined solve.
    ``unrolled``: a kinematic tree's recursions unrolled (:func:`ukjax.multibody.unrolled_recursions`);
    ``looped``: the small factorizations as loops (:func:`ukjax.linalg.looped_factorizations`); ``per_body``:
    a tree's per-body values kept apart (:func:`ukjax.multibody.per_body_values`); all part of the program's
    key as they change the trace."""
    from ukjax.multibody import per_body_values, unrolled_recursions

    per_body = per_body and system._solve_fits_small_buffers(q, qd, t, p, solver)
    with unrolled_recursions(unrolled), looped_factorizations(looped), per_body_values(per_body):
        return system._motion(q, qd, t, p, method, solver, rtol, force)
