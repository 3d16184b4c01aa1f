"""Kinematic trees of rigid bodies in joint coordinates, with recursive O(n) dynamics.

A tree of ``n`` rigid bodies, each joined to its parent (or to the world) by a one-degree-of-freedom joint,
revolute or prismatic about a fixed axis, is a :class:`ukjax.System` whose mass matrix never has to be formed
or factorized: the articulated-body algorithm applies M(q)⁻¹ to a set of vectors in O(n) operations per
vector, where the dense path builds M by autodiff of a Lagrangian (O(n²) or more) and factorizes it (O(n³)).
The UK equation needs only M⁻¹Q and M⁻¹Aᵀ (de Falco et al. eq. 35), so with m constraint rows one
right-hand side costs O(n m) instead of O(n³): this is ukjax's path for serial robot arms and chains.

Spatial algebra and algorithms follow Featherstone (2008), *Rigid Body Dynamics Algorithms*, with its
conventions: motion vectors (ω, v), force vectors (n, f), both in body coordinates at the body's origin; the
Plücker transform ``^iX_λ`` from the parent frame λ to body i's frame is rot(E) xlt(r), i.e. body i's origin
sits at r (parent coordinates) and coordinates map by E (``x_i = E x_λ``):

* forward kinematics and velocities, v_i = ^iX_λ v_λ + S_i q̇_i (eq. 4.1, 7.1);
* the composite-rigid-body algorithm for M(q) (CRBA, Table 6.2), used where M itself is needed (energy,
  reference forms, checks);
* the recursive Newton-Euler algorithm for the bias force C(q, q̇) = M-free inverse dynamics at q̈ = 0,
  including gravity (RNEA, Table 5.1), so Q = τ - C;
* the articulated-body algorithm (ABA, Table 7.1) for M⁻¹B with any number of columns: the articulated
  inertias I^A_i are computed once and every column is one forward/backward sweep of vectors.

Bodies and their parameters (SI units) are a :class:`Bodies` of arrays built from the parameter pytree ``p``
by a user function, so every mass, length and inertia is a differentiable leaf of ``p``, not a constant.
The topology (parents, joint types, axes) is static.

Not from a seed paper: the seeds write M and Q by hand or by Lagrange's equations; the UK equation is the same
(Liu et al. 2015, eq. 11-13).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax.linalg import small_matmul as _mm
from ukjax.system import System

JOINT_KINDS = ("revolute", "prismatic")


class Joint(eqx.Module):
    """A one-degree-of-freedom joint: ``kind`` "revolute" (q in rad) or "prismatic" (q in m) about/along the
    unit ``axis`` of the joint frame (static)."""

    kind: str = eqx.field(static=True)
    axis: tuple[float, float, float] = eqx.field(static=True)

    def __check_init__(self):
        if self.kind not in JOINT_KINDS:
            raise ValueError(f"joint kind must be one of {JOINT_KINDS}, got {self.kind!r}")
        axis = np.asarray(self.axis, dtype=float)
        if axis.shape != (3,) or not np.all(np.isfinite(axis)) or abs(np.linalg.norm(axis) - 1.0) > 1e-12:
            raise ValueError(f"joint axis must be a finite unit 3-vector, got {self.axis!r}")

    @property
    def subspace(self) -> np.ndarray:
        """Motion subspace S (6,): (a, 0) for revolute, (0, a) for prismatic (Featherstone Table 4.1)."""
        a = np.asarray(self.axis, dtype=float)
        return np.concatenate([a, np.zeros(3)] if self.kind == "revolute" else [np.zeros(3), a])


def _unit(axis) -> tuple[float, float, float]:
    a = np.asarray(axis, dtype=float)
    norm = np.linalg.norm(a)
    if a.shape != (3,) or not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"joint axis must be a nonzero finite 3-vector, got {axis!r}")
    return tuple(float(x) for x in a / norm)


def revolute(axis=(0.0, 0.0, 1.0)) -> Joint:
    """A revolute joint about ``axis`` (normalized), angle q in rad."""
    return Joint("revolute", _unit(axis))


def prismatic(axis=(0.0, 0.0, 1.0)) -> Joint:
    """A prismatic joint along ``axis`` (normalized), displacement q in m."""
    return Joint("prismatic", _unit(axis))


class Bodies(eqx.Module):
    """Inertial and placement parameters of the n bodies (arrays, differentiable).

    Attributes:
        offset: (n, 3) position of joint i's frame origin in the frame of its parent body (the world frame for
            a root body), m.
        mass: (n,) body masses, kg (positive).
        com: (n, 3) centres of mass in the body frames, m.
        inertia: (n, 3, 3) rotational inertias about the centres of mass in the body frames, kg m²
            (symmetric positive semi-definite).
        rotation: optional (n, 3, 3) rotation E_T of joint i's frame relative to its parent's frame
            (joint-frame coordinates = E_T parent coordinates); ``None`` means identity for every joint.

    Body i's frame is joint i's frame moved by the joint: turned by q_i about the axis, or shifted by q_i
    along it.
    """

    offset: jax.Array
    mass: jax.Array
    com: jax.Array
    inertia: jax.Array
    rotation: jax.Array | None = None


def _skew(v):
    """[v]× (3, 3) with [v]× w = v × w."""
    zero = jnp.zeros_like(v[0])
    return jnp.stack(
        [jnp.stack([zero, -v[2], v[1]]), jnp.stack([v[2], zero, -v[0]]), jnp.stack([-v[1], v[0], zero])]
    )


def _cross(a, b):
    return jnp.stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def _motion_cross(v, m):
    """v ×ₘ m = (ω × m_ω, ω × m_v + v_o × m_ω) (Featherstone eq. 2.31)."""
    return jnp.concatenate([_cross(v[:3], m[:3]), _cross(v[:3], m[3:]) + _cross(v[3:], m[:3])])


def _force_cross(v, f):
    """v ×* f = (ω × n + v_o × f, ω × f) (Featherstone eq. 2.32)."""
    return jnp.concatenate([_cross(v[:3], f[:3]) + _cross(v[3:], f[3:]), _cross(v[:3], f[3:])])


def _to_child(E, r, m):
    """^iX_λ m for motion vectors m (6,) or (6, k): (E m_ω, E (m_v - r × m_ω)), X = rot(E) xlt(r)
    (Featherstone eq. 2.24), without forming the 6 x 6 matrix."""
    return jnp.concatenate([_mm(E, m[:3]), _mm(E, m[3:] - _cross(_column(r, m), m[:3]))])


def _to_parent(E, r, f):
    """^iX_λᵀ f for force vectors f (6,) or (6, k): (Eᵀ n + r × Eᵀ f, Eᵀ f)."""
    force = _mm(E.T, f[3:])
    return jnp.concatenate([_mm(E.T, f[:3]) + _cross(_column(r, force), force), force])


def _inertia_to_parent(E, r, I):
    """^iX_λᵀ I ^iX_λ of a symmetric 6 x 6 (articulated) inertia by 3 x 3 blocks: with I = [[A, B], [Bᵀ, C]],
    A' = EᵀAE, B' = EᵀBE, C' = EᵀCE and K = B' + [r]×C', the result is [[A' + [r]×B'ᵀ - K[r]×, K],
    [Kᵀ, C']] (about half the products of the 6 x 6 congruence)."""
    Et = E.T
    A, B, C = (_mm(Et, _mm(block, E)) for block in (I[:3, :3], I[:3, 3:], I[3:, 3:]))
    R = _skew(r)
    K = B + _mm(R, C)
    return jnp.block([[A + _mm(R, B.T) - _mm(K, R), K], [K.T, C]])


def _column(r, like):
    """r shaped to broadcast against ``like`` (a 3-vector, or 3 x k columns)."""
    return r if like.ndim == 1 else r[:, None]


def _spatial_inertia(mass, com, inertia):
    """I = [[I_c + m [c]×[c]×ᵀ, m [c]×], [m [c]×ᵀ, m 1]] about the body origin (Featherstone eq. 2.63)."""
    C = _skew(com)
    mC = mass * C
    return jnp.block([[inertia + _mm(mC, C.T), mC], [mC.T, mass * jnp.eye(3, dtype=C.dtype)]])


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


class Tree(eqx.Module):
    """A kinematic tree: body i hangs from body ``parents[i]`` (-1: the world) by ``joints[i]``.

    Parents come before children (``parents[i] < i``), so q_i is the coordinate of joint i and
    n = len(joints). The methods take the configuration q (n,), rates q̇ (n,), a :class:`Bodies` and, where
    gravity acts, the gravity vector g (3,) in world coordinates (m/s²). The recursions run as ``lax.scan``
    over the bodies of a serial chain (one compiled body step, whatever n) and as unrolled loops over a
    branched tree.
    """

    parents: tuple[int, ...] = eqx.field(static=True)
    joints: tuple[Joint, ...] = eqx.field(static=True)

    def __check_init__(self):
        if len(self.parents) != len(self.joints) or not self.joints:
            raise ValueError(
                f"a tree needs one parent per joint and at least one joint, got {len(self.parents)} parents "
                f"and {len(self.joints)} joints"
            )
        for i, parent in enumerate(self.parents):
            if not isinstance(parent, int) or not -1 <= parent < i:
                raise ValueError(
                    f"parents[{i}] = {parent!r}: a parent must be -1 (the world) or a body < {i}"
                )
        for joint in self.joints:
            if not isinstance(joint, Joint):
                raise TypeError(f"joints must be ukjax.multibody.Joint (revolute/prismatic), got {joint!r}")

    @classmethod
    def chain(cls, joints: Sequence[Joint]) -> Tree:
        """A serial chain: body 0 on the world, body i on body i - 1."""
        return cls(parents=tuple(range(-1, len(joints) - 1)), joints=tuple(joints))

    @property
    def n(self) -> int:
        return len(self.joints)

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.n - 1))

    # ------------------------------------------------------------------ checks
    def _checked(self, q, bodies: Bodies, qd=None):
        n = self.n
        q = jnp.asarray(q)
        if q.shape != (n,):
            raise ValueError(f"q has shape {q.shape}; this tree has n = {n} joints")
        if qd is not None and jnp.shape(qd) != (n,):
            raise ValueError(f"qd has shape {jnp.shape(qd)}; this tree has n = {n} joints")
        expected = {"offset": (n, 3), "mass": (n,), "com": (n, 3), "inertia": (n, 3, 3)}
        if bodies.rotation is not None:
            expected["rotation"] = (n, 3, 3)
        for name, shape in expected.items():
            if jnp.shape(getattr(bodies, name)) != shape:
                raise ValueError(
                    f"Bodies.{name} has shape {jnp.shape(getattr(bodies, name))}; expected {shape}"
                )
        return q

    # ------------------------------------------------------------------ recursions
    def _down(self, step, base, xs):
        """Root to leaves: (value_i, out_i) = step(value of the parent, or ``base`` at the world, xs[i]);
        returns the stacked outputs."""
        if self.is_chain:
            return jax.lax.scan(lambda value, x: step(value, x), base, xs)[1]
        values, outs = [], []
        for i, parent in enumerate(self.parents):
            value, out = step(base if parent < 0 else values[parent], jax.tree.map(lambda a, i=i: a[i], xs))
            values.append(value)
            outs.append(out)
        return jax.tree.map(lambda *o: jnp.stack(o), *outs)

    def _up(self, step, zero, xs):
        """Leaves to root: (to_parent_i, out_i) = step(sum of the children's to_parent, or ``zero``, xs[i]);
        returns the stacked outputs."""
        if self.is_chain:
            return jax.lax.scan(lambda incoming, x: step(incoming, x), zero, xs, reverse=True)[1]
        incoming, outs = [zero] * self.n, [None] * self.n
        for i in reversed(range(self.n)):
            to_parent, outs[i] = step(incoming[i], jax.tree.map(lambda a, i=i: a[i], xs))
            if self.parents[i] >= 0:
                incoming[self.parents[i]] = _add(incoming[self.parents[i]], to_parent)
        return jax.tree.map(lambda *o: jnp.stack(o), *outs)

    # ------------------------------------------------------------------ kinematics
    def _subspaces(self, dtype):
        return jnp.asarray(np.stack([joint.subspace for joint in self.joints]), dtype)

    def _joint_transforms(self, q, bodies: Bodies):
        """(E, r) (n, 3, 3), (n, 3) of every ^iX_λ = X_J(q_i) X_T(i): E = E_J E_T, r = r_T + E_Tᵀ r_J, all
        joints at once. Revolute: E_J = R(a, q)ᵀ = cos q 1 + (1 - cos q) a aᵀ - sin q [a]×, r_J = 0;
        prismatic: E_J = 1, r_J = q a (Featherstone Table 4.1)."""
        dtype = jnp.result_type(q, bodies.offset)
        axes = np.stack([joint.axis for joint in self.joints])
        revolute = np.asarray([joint.kind == "revolute" for joint in self.joints])
        c = jnp.where(revolute, jnp.cos(q), 1.0)[:, None, None]
        s = jnp.where(revolute, jnp.sin(q), 0.0)[:, None, None]
        outer = jnp.asarray(axes[:, :, None] * axes[:, None, :], dtype)
        skew = jnp.asarray(np.stack([np.cross(a, np.eye(3)).T for a in axes]), dtype)  # [a]× per joint
        E_J = c * jnp.eye(3, dtype=dtype) + (1 - c) * outer - s * skew
        r_J = jnp.where(revolute, 0.0, q)[:, None] * jnp.asarray(axes, dtype)
        if bodies.rotation is None:
            return E_J, bodies.offset + r_J
        E_T = bodies.rotation
        return jnp.einsum("nij,njk->nik", E_J, E_T), bodies.offset + jnp.einsum("nji,nj->ni", E_T, r_J)

    def frames(self, q, bodies: Bodies):
        """World pose of every body frame: rotations R (n, 3, 3), world = R body coordinates, and origins
        p (n, 3) (m)."""
        q = self._checked(q, bodies)
        E, r = self._joint_transforms(q, bodies)
        eye = jnp.eye(3, dtype=E.dtype)

        def step(parent, x):
            R_parent, p_parent = parent
            E_i, r_i = x
            pose = (_mm(R_parent, E_i.T), p_parent + _mm(R_parent, r_i))
            return pose, pose

        return self._down(step, (eye, jnp.zeros(3, E.dtype)), (E, r))

    def point(self, q, bodies: Bodies, body: int, local):
        """World position (3,) of the point with body-frame coordinates ``local`` on body ``body`` (m)."""
        if not isinstance(body, int) or not 0 <= body < self.n:
            raise ValueError(f"body must be an int in [0, {self.n}), got {body!r}")
        R, p = self.frames(q, bodies)
        return p[body] + _mm(R[body], jnp.asarray(local, p.dtype))

    # ------------------------------------------------------------------ dynamics
    def _inertias(self, bodies: Bodies):
        return jax.vmap(_spatial_inertia)(bodies.mass, bodies.com, bodies.inertia)

    def mass_matrix(self, q, bodies: Bodies):
        """M(q) (n, n) by the composite-rigid-body algorithm (Featherstone Table 6.2) in one sweep, leaves to
        root: body i's composite inertia I^c_i = I_i + Σ children's, and the forces F (6, n) whose column k is
        I^c_k S_k of every body k in i's subtree carried to frame i (columns of different subtrees are
        disjoint, so the children's F add); row i of M is S_iᵀ F (M_ik = 0 where k is not in i's subtree
        nor i in k's), mirrored to the upper-left triangle. O(n²), one compiled step per body."""
        q = self._checked(q, bodies)
        E, r = self._joint_transforms(q, bodies)
        S = self._subspaces(E.dtype)
        n = self.n

        def step(incoming, x):
            inertia_in, force_in = incoming
            E_i, r_i, inertia, S_i, column = x
            composite = inertia + inertia_in
            force = force_in + _mm(composite, S_i)[:, None] * column[None, :]
            row = _mm(S_i[None, :], force)[0]
            return (_inertia_to_parent(E_i, r_i, composite), _to_parent(E_i, r_i, force)), row

        zero = (jnp.zeros((6, 6), E.dtype), jnp.zeros((6, n), E.dtype))
        eye = jnp.eye(n, dtype=E.dtype)
        subtree = self._up(step, zero, (E, r, self._inertias(bodies), S, eye))  # row i: M_ik, k in subtree(i)
        return subtree + subtree.T - eye * jnp.diagonal(subtree)

    def _velocities(self, E, r, S, qd):
        """Body velocities v_i = ^iX_λ v_λ + S_i q̇_i."""

        def step(v_parent, x):
            E_i, r_i, v_joint = x
            v = _to_child(E_i, r_i, v_parent) + v_joint
            return v, v

        return self._down(step, jnp.zeros(6, E.dtype), (E, r, S * qd[:, None]))

    def bias_force(self, q, qd, bodies: Bodies, gravity):
        """C(q, q̇) = τ needed for q̈ = 0: Coriolis, centrifugal and gravity terms (n,), by the recursive
        Newton-Euler algorithm (Featherstone Table 5.1); the given force of the tree is Q = τ - C."""
        return self.inverse_dynamics(q, qd, None, bodies, gravity)

    def inverse_dynamics(self, q, qd, qdd, bodies: Bodies, gravity):
        """τ = M(q) q̈ + C(q, q̇) (n,) by the recursive Newton-Euler algorithm; ``qdd=None`` means q̈ = 0."""
        q = self._checked(q, bodies, qd)
        E, r = self._joint_transforms(q, bodies)
        S = self._subspaces(E.dtype)
        base = jnp.concatenate([jnp.zeros(3, E.dtype), -jnp.asarray(gravity, E.dtype)])
        joint_acceleration = () if qdd is None else (S * jnp.asarray(qdd)[:, None],)

        def forward(parent, x):
            # v_i = X v_λ + S q̇_i, a_i = X a_λ + S q̈_i + v_i ×ₘ S q̇_i, f_i = I a_i + v_i ×* I v_i
            v_parent, a_parent = parent
            E_i, r_i, v_joint, I, *a_joint = x
            v = _to_child(E_i, r_i, v_parent) + v_joint
            a = _to_child(E_i, r_i, a_parent) + _motion_cross(v, v_joint)
            if a_joint:  # q̈ = 0 (the bias force C) adds nothing
                a = a + a_joint[0]
            return (v, a), _mm(I, a) + _force_cross(v, _mm(I, v))

        xs = (E, r, S * qd[:, None], self._inertias(bodies), *joint_acceleration)
        force = self._down(forward, (jnp.zeros(6, E.dtype), base), xs)

        def backward(incoming, x):
            E_i, r_i, f, S_i = x
            total = f + incoming
            return _to_parent(E_i, r_i, total), jnp.sum(S_i * total)

        return self._up(backward, jnp.zeros(6, E.dtype), (E, r, force, S))

    def solve_mass(self, q, bodies: Bodies, B):
        """M(q)⁻¹ B for B of shape (n,) or (n, k), by the articulated-body algorithm (Featherstone Table 7.1)
        with zero velocity and no gravity: the articulated inertias are formed once, O(n), and each column of
        B costs one backward and one forward sweep of 6-vectors, O(n). Needs every D_i = S_iᵀ I^A_i S_i > 0
        (each joint moves a body with mass or inertia along its axis)."""
        q = self._checked(q, bodies)
        B = jnp.asarray(B)
        if B.ndim not in (1, 2) or B.shape[0] != self.n:
            raise ValueError(f"solve_mass expects B of shape ({self.n},) or ({self.n}, k), got {B.shape}")
        columns = B if B.ndim == 2 else B[:, None]
        dtype = jnp.result_type(q, bodies.offset, columns)
        E, r = (x.astype(dtype) for x in self._joint_transforms(q, bodies))
        S = self._subspaces(dtype)
        k = columns.shape[1]

        def backward(incoming, x):
            E_i, r_i, I, S_i, tau = x
            I_in, p_in = incoming
            articulated = I + I_in
            U = _mm(articulated, S_i)
            D_inv = 1.0 / jnp.sum(S_i * U)
            u = tau - _mm(S_i[None, :], p_in)[0]
            reduced = articulated - D_inv * U[:, None] * U[None, :]
            pa = p_in + D_inv * U[:, None] * u[None, :]
            return (_inertia_to_parent(E_i, r_i, reduced), _to_parent(E_i, r_i, pa)), (U, D_inv, u)

        zero = (jnp.zeros((6, 6), dtype), jnp.zeros((6, k), dtype))
        inertia = self._inertias(bodies).astype(dtype)
        U, D_inv, u = self._up(backward, zero, (E, r, inertia, S, columns))

        def forward(a_parent, x):
            E_i, r_i, S_i, U_i, D_inv_i, u_i = x
            a = _to_child(E_i, r_i, a_parent)
            qdd = D_inv_i * (u_i - _mm(U_i[None, :], a)[0])
            return a + S_i[:, None] * qdd[None, :], qdd

        qdd = self._down(forward, jnp.zeros((6, k), dtype), (E, r, S, U, D_inv, u))
        return qdd if B.ndim == 2 else qdd[:, 0]

    def forward_dynamics(self, q, qd, tau, bodies: Bodies, gravity):
        """q̈ = M⁻¹(τ - C(q, q̇)) of the unconstrained tree (n,)."""
        return self.solve_mass(q, bodies, tau - self.bias_force(q, qd, bodies, gravity))

    # ------------------------------------------------------------------ energies
    def kinetic_energy(self, q, qd, bodies: Bodies):
        """T = ½ Σ v_iᵀ I_i v_i (J)."""
        q = self._checked(q, bodies, qd)
        E, r = self._joint_transforms(q, bodies)
        velocity = self._velocities(E, r, self._subspaces(E.dtype), qd)
        inertia = self._inertias(bodies)
        return 0.5 * jnp.sum(velocity * jnp.einsum("nij,nj->ni", inertia, velocity))

    def potential_energy(self, q, bodies: Bodies, gravity):
        """V = -Σ m_i g · c_i^world (J), zero at the world origin's height."""
        R, p = self.frames(q, bodies)
        centres = p + jnp.einsum("nij,nj->ni", R, bodies.com)
        return -jnp.sum(bodies.mass * (centres @ jnp.asarray(gravity, p.dtype)))

    # ------------------------------------------------------------------ as a System
    def system(
        self,
        bodies: Callable[[Any], Bodies],
        gravity: Callable[[Any], Any],
        *,
        applied_force: Callable[..., Any] | None = None,
        constraints: tuple = (),
        nonideal: Callable[..., Any] | None = None,
        actuation: Callable[..., Any] | None = None,
        servo_constraints: tuple = (),
        coordinate_names: tuple[str, ...] | None = None,
        constraint_rank: int | None = None,
    ) -> System:
        """The tree as a :class:`ukjax.System`: M by CRBA, Q = τ(q, q̇, t, p) - C(q, q̇) by RNEA, and M⁻¹ by
        the articulated-body algorithm (``System.mass_solve``), which :meth:`ukjax.System.motion` uses for
        the Cholesky forms of the UK equation (``method="ldl"`` or ``"cholesky"``) instead of forming and
        factorizing M.

        ``bodies(p) -> Bodies`` and ``gravity(p) -> (3,)`` read the parameters; ``applied_force(q, qd, t, p)``
        gives joint forces/torques τ (default none); the rest as for :class:`ukjax.System`.
        """

        def mass(q, t, p):
            return self.mass_matrix(q, bodies(p))

        def force(q, qd, t, p):
            C = self.bias_force(q, qd, bodies(p), gravity(p))
            return -C if applied_force is None else jnp.asarray(applied_force(q, qd, t, p)) - C

        def mass_solve(q, t, p, B):
            return self.solve_mass(q, bodies(p), B)

        def kinetic(q, qd, t, p):
            return self.kinetic_energy(q, qd, bodies(p))

        def potential(q, t, p):
            return self.potential_energy(q, bodies(p), gravity(p))

        return System(
            mass=mass,
            force=force,
            n=self.n,
            constraints=tuple(constraints),
            nonideal=nonideal,
            actuation=actuation,
            servo_constraints=tuple(servo_constraints),
            kinetic=kinetic,
            potential=potential,
            coordinate_names=coordinate_names,
            mass_solve=mass_solve,
            constraint_rank=constraint_rank,
        )

