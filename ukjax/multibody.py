"""Kinematic trees of rigid bodies in joint coordinates, with recursive O(n) dynamics.

A tree of rigid bodies, each joined to its parent (or to the world) by a joint (revolute or prismatic about a
fixed axis, ball, or free), is a :class:`ukjax.System` whose mass matrix never has to be formed
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
  inertias I^A_i are computed once and every column is one forward/backward sweep of vectors;
* the same algorithm with velocities and gravity (Table 7.1 in full) for the free acceleration
  M⁻¹(τ - C(q, q̇)) in one pass of three sweeps, without the RNEA (:meth:`Tree.forward_dynamics`, and
  :meth:`Tree.system`'s right-hand side wherever M⁻¹ meets the given force);
* the derivatives of those solves in closed form (Carpentier & Mansard 2018): the tangent of X = M⁻¹(B +
  (τ - C) wᵀ) is M⁻¹ applied to the tangent of B + τ wᵀ less the RNEA's tangent at X held fixed, so
  forward and reverse mode (gradients with respect to q, q̇ and every mass, inertia and placement) never
  differentiate the articulated inertias' 6 x 6 algebra (:meth:`Tree._solve_given`).

Bodies and their parameters (SI units) are a :class:`Bodies` of arrays built from the parameter pytree ``p``
by a user function, so every mass, length and inertia is a differentiable leaf of ``p``, not a constant.
The topology (parents, joint types, axes) is static.

Ball and free joints (MuJoCo's conventions, so models loaded through MuJoCo map one to one): the orientation
is a unit quaternion (w, x, y, z), 4 numbers, and the velocity the angular velocity in the body frame, 3
numbers; a free joint adds the position of the body origin and its velocity in the joint (parent) frame. So q
has nq numbers and the velocity v (``qd``) nv < nq; all dynamics are in v (M is nv x nv), q̇ = N(q) v, and q
moves by the chart q ⊕ δ (:meth:`ukjax.multibody.Tree.retract`); how the UK equation is posed in v:
:class:`ukjax.System`.

Not from a seed paper: the seeds write M and Q by hand or by Lagrange's equations; the UK equation is the same
(Liu et al. 2015, eq. 11-13).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax._settings import SMALL_BUFFER_BYTES, trace_setting
from ukjax.linalg import small_matmul as _mm
from ukjax.linalg import sum_of_outer_products
from ukjax.system import System

_ONE_PASS = True
"""Whether :meth:`Tree.forward_dynamics` and the systems :meth:`Tree.system` builds get M⁻¹(τ - C) from one
articulated-body pass with velocities (Featherstone 2008, Table 7.1) rather than the RNEA bias force
(Table 5.1) followed by :meth:`Tree.solve_mass`; private, kept for A/B measurements (issue 41). Read when a
function is traced (:meth:`Tree.forward_dynamics`) or a system is built (:meth:`Tree.system`)."""

_CLOSED_FORM_DERIVATIVES = True
"""Whether the articulated-body solves (:meth:`Tree.solve_mass`, :meth:`Tree.forward_dynamics` and the
systems :meth:`Tree.system` builds) carry their derivatives in closed form (:meth:`Tree._solve_given`) rather
than automatic differentiation through the articulated-body pass; private, kept for A/B measurements (issue
41). Read when a system is built (:meth:`Tree.system`) or a function is traced (the others)."""

JOINT_KINDS = ("revolute", "prismatic", "ball", "free")
JOINT_SIZES = {"revolute": (1, 1), "prismatic": (1, 1), "ball": (4, 3), "free": (7, 6)}
"""(nq, nv) of each joint kind: the numbers of its configuration coordinates and of its velocities."""


class Joint(eqx.Module):
    """A joint between a body and its parent (static).

    * ``"revolute"`` (q in rad) or ``"prismatic"`` (q in m) about/along the unit ``axis`` of the joint frame:
      one coordinate, one velocity q̇.
    * ``"ball"`` (spherical): q = a unit quaternion (w, x, y, z) turning the joint frame into the body
      frame (body → joint coordinates), 4 numbers; velocity = the body's angular velocity relative to the
      joint frame, in BODY coordinates, 3 numbers (MuJoCo's convention).
    * ``"free"`` (floating base): q = (position (3) of the body origin in the joint frame, quaternion (4)),
      7 numbers; velocity = (velocity of the body origin in the JOINT frame (3), angular velocity in the
      BODY frame (3)), 6 numbers (MuJoCo's ``qvel`` of a free joint on a body of the world).

    ``axis`` is ``None`` for ball and free joints. :attr:`nq` and :attr:`nv` give the sizes.
    """

    kind: str = eqx.field(static=True)
    axis: tuple[float, float, float] | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if self.kind not in JOINT_KINDS:
            raise ValueError(f"joint kind must be one of {JOINT_KINDS}, got {self.kind!r}")
        if self.kind in ("ball", "free"):
            if self.axis is not None:
                raise ValueError(f"a {self.kind} joint has no axis, got axis={self.axis!r}")
            return
        axis = np.asarray(self.axis, dtype=float)
        if axis.shape != (3,) or not np.all(np.isfinite(axis)) or abs(np.linalg.norm(axis) - 1.0) > 1e-12:
            raise ValueError(f"joint axis must be a finite unit 3-vector, got {self.axis!r}")

    @property
    def nq(self) -> int:
        """Number of configuration coordinates (1, 1, 4, 7 for revolute, prismatic, ball, free)."""
        return JOINT_SIZES[self.kind][0]

    @property
    def nv(self) -> int:
        """Number of velocities, the joint's degrees of freedom (1, 1, 3, 6)."""
        return JOINT_SIZES[self.kind][1]

    @property
    def subspace(self) -> np.ndarray:
        """Motion subspace S in body coordinates (Featherstone Table 4.1): (a, 0) (6,) for revolute, (0, a)
        for prismatic, [1; 0] (6, 3) for ball. A free joint's S depends on its orientation (its linear
        velocity is given in the joint frame): [[0, 1], [E_J, 0]] with E_J the joint's rotation (body
        coordinates = E_J joint coordinates), formed inside :class:`Tree`."""
        if self.kind == "free":
            raise ValueError("a free joint's motion subspace depends on its orientation; see Joint.subspace")
        if self.kind == "ball":
            return np.concatenate([np.eye(3), np.zeros((3, 3))])
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


def ball() -> Joint:
    """A ball (spherical) joint: q a unit quaternion (w, x, y, z), velocity the angular velocity in the body
    frame (nq = 4, nv = 3)."""
    return Joint("ball")


def free() -> Joint:
    """A free joint (floating base): q = (position, quaternion), velocity = (linear velocity of the body
    origin in the joint frame, angular velocity in the body frame) (nq = 7, nv = 6)."""
    return Joint("free")


# ---------------------------------------------------------------------- unit quaternions (w, x, y, z)
def quaternion_multiply(a, b):
    """The Hamilton product a ⊗ b of quaternions (w, x, y, z)."""
    w1, v1, w2, v2 = a[0], a[1:], b[0], b[1:]
    return jnp.concatenate([(w1 * w2 - jnp.dot(v1, v2))[None], w1 * v2 + w2 * v1 + _cross(v1, v2)])


def quaternion_exp(rotation_vector):
    """The unit quaternion exp(δ/2) = (cos(θ/2), sin(θ/2) δ/θ), θ = |δ|, of the rotation by the rotation
    vector δ (3,) (Solà 2017, eq. 101). Below θ² = 1e-4 the Taylor series to θ⁴ is used (its next terms are
    below 1e-16), so that every derivative at δ = 0 is exact and finite."""
    d = jnp.asarray(rotation_vector)
    theta2 = jnp.sum(d * d)
    small = theta2 < 1e-4
    theta = jnp.sqrt(jnp.where(small, 1.0, theta2))
    cos_half = jnp.where(small, 1.0 - theta2 / 8.0 + theta2**2 / 384.0, jnp.cos(0.5 * theta))
    sinc_half = jnp.where(small, 0.5 - theta2 / 48.0 + theta2**2 / 3840.0, jnp.sin(0.5 * theta) / theta)
    return jnp.concatenate([cos_half[None], sinc_half * d])


def quaternion_rotation(quaternion):
    """The rotation matrix R (3, 3) of the quaternion q/|q| (R maps body to parent coordinates), so the
    kinematics do not depend on the drift of |q| from 1."""
    w, x, y, z = quaternion / jnp.sqrt(jnp.sum(quaternion * quaternion))
    return jnp.stack(
        [
            jnp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)]),
            jnp.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)]),
            jnp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]),
        ]
    )


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


# Entries and halves are taken by unstack and split rather than by indexing: in reverse mode an index's
# transpose pads its cotangent to the whole operand and adds it, one pad and add per index, where unstack's
# and split's transposes are one stack or concatenate.
def _skew(v):
    """[v]× (3, 3) with [v]× w = v × w."""
    v0, v1, v2 = jnp.unstack(v)
    zero = jnp.zeros_like(v0)
    return jnp.stack([jnp.stack([zero, -v2, v1]), jnp.stack([v2, zero, -v0]), jnp.stack([-v1, v0, zero])])


def _cross(a, b):
    (a0, a1, a2), (b0, b1, b2) = jnp.unstack(a), jnp.unstack(b)
    return jnp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0])


def _halves(x):
    """(x[:3], x[3:]) of a spatial vector (6,) or 6 x k columns."""
    return tuple(jnp.split(x, 2))


def _motion_cross(v, m):
    """v ×ₘ m = (ω × m_ω, ω × m_v + v_o × m_ω) (Featherstone eq. 2.31)."""
    (w, v_o), (m_w, m_v) = _halves(v), _halves(m)
    return jnp.concatenate([_cross(w, m_w), _cross(w, m_v) + _cross(v_o, m_w)])


def _force_cross(v, f):
    """v ×* f = (ω × n + v_o × f, ω × f) (Featherstone eq. 2.32)."""
    (w, v_o), (n, f_) = _halves(v), _halves(f)
    return jnp.concatenate([_cross(w, n) + _cross(v_o, f_), _cross(w, f_)])


def _to_child(E, r, m):
    """^iX_λ m for motion vectors m (6,) or (6, k): (E m_ω, E (m_v - r × m_ω)), X = rot(E) xlt(r)
    (Featherstone eq. 2.24), without forming the 6 x 6 matrix."""
    m_w, m_v = _halves(m)
    return jnp.concatenate([_mm(E, m_w), _mm(E, m_v - _cross(_column(r, m), m_w))])


def _to_parent(E, r, f):
    """^iX_λᵀ f for force vectors f (6,) or (6, k): (Eᵀ n + r × Eᵀ f, Eᵀ f)."""
    n, f_ = _halves(f)
    force = _mm(E.T, f_)
    return jnp.concatenate([_mm(E.T, n) + _cross(_column(r, force), force), force])


def _inertia_to_parent(E, r, I):
    """^iX_λᵀ I ^iX_λ of a symmetric 6 x 6 (articulated) inertia by 3 x 3 blocks: with I = [[A, B], [Bᵀ, C]],
    A' = EᵀAE, B' = EᵀBE, C' = EᵀCE and K = B' + [r]×C', the result is [[A' + [r]×B'ᵀ - K[r]×, K],
    [Kᵀ, C']] (about half the products of the 6 x 6 congruence)."""
    Et = E.T
    (top_left, top_right), (_, bottom_right) = (jnp.split(half, 2, axis=1) for half in _halves(I))
    A, B, C = (_mm(Et, _mm(block, E)) for block in (top_left, top_right, bottom_right))
    R = _skew(r)
    K = B + _mm(R, C)
    return jnp.block([[A + _mm(R, B.T) - _mm(K, R), K], [K.T, C]])


def _column(r, like):
    """r shaped to broadcast against ``like`` (a 3-vector, or 3 x k columns)."""
    return r if like.ndim == 1 else r[:, None]


def _spatial_inertia(mass, com, inertia):
    """I = [[I_c + m [c]×[c]×ᵀ, m [c]×], [m [c]×ᵀ, m 1]] about the body origin (Featherstone eq. 2.63), with
    I_c the symmetric part of ``inertia``: the articulated-body algorithm holds only for a symmetric I, and
    so the derivatives with respect to the inertia tensor are symmetric and the same whichever way they are
    taken (:meth:`Tree._solve_given`)."""
    inertia = _symmetric(inertia)
    C = _skew(com)
    mC = mass * C
    return jnp.block([[inertia + _mm(mC, C.T), mC], [mC.T, mass * jnp.eye(3, dtype=C.dtype)]])


def _body_parameters(bodies: Bodies, dtype):
    """(mass, com, inertia) of every body in ``dtype``: what :func:`_spatial_inertia` and
    :func:`_inertia_times` take."""
    return bodies.mass.astype(dtype), bodies.com.astype(dtype), bodies.inertia.astype(dtype)


def _symmetric(inertia):
    """The symmetric part of a 3 x 3 inertia tensor."""
    return 0.5 * (inertia + inertia.T)


def _inertia_times(mass, com, inertia, m):
    """I m for the spatial inertia I of (mass, com, inertia) (:func:`_spatial_inertia`) and motion vectors m
    (6,) or (6, k), without forming I: with h = mass (m_v - c × m_ω), I m = (I_c m_ω + c × h, h)
    (Featherstone eq. 2.63 multiplied out; I_c the symmetric part of ``inertia``)."""
    m_w, m_v = _halves(m)
    c = _column(com, m_w)
    h = mass * (m_v - _cross(c, m_w))
    return jnp.concatenate([_mm(_symmetric(inertia), m_w) + _cross(c, h), h])


def _one_dof_motions(axes, revolute, angle, dtype):
    """(E_J, r_J) of revolute or prismatic joints (:meth:`Tree._joint_motions`), one joint or a stack: unit
    ``axes`` (..., 3) and ``revolute`` (...) as NumPy constants, coordinates ``angle`` (...). Revolute:
    E_J = cos q 1 + (1 - cos q) a aᵀ - sin q [a]×, r_J = 0; prismatic: E_J = 1, r_J = q a."""
    c = jnp.where(revolute, jnp.cos(angle), 1.0)[..., None, None]
    s = jnp.where(revolute, jnp.sin(angle), 0.0)[..., None, None]
    outer = jnp.asarray(axes[..., :, None] * axes[..., None, :], dtype)
    skew = jnp.asarray(np.swapaxes(np.cross(axes[..., None, :], np.eye(3)), -1, -2), dtype)  # [a]× per joint
    E = c * jnp.eye(3, dtype=dtype) + (1 - c) * outer - s * skew
    return E, jnp.where(revolute, 0.0, angle)[..., None] * jnp.asarray(axes, dtype)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


_dot = sum_of_outer_products
"""a @ b for a (m, c) and b (c, k) with a small contraction size c (a joint's velocities, <= 6), whatever k
(:func:`small_matmul` turns to ``jnp.matmul`` above 8)."""


def _joint_velocities(S, qd_parts):
    """The joints' velocities S_i q̇_i (6,) per body: a list, or one (n, 6) array for a one-DoF tree."""
    if isinstance(S, list):
        return [_dot(S_i, qd_i[:, None])[:, 0] for S_i, qd_i in zip(S, qd_parts, strict=True)]
    return S[:, :, 0] * qd_parts


def _inverse(D):
    """D⁻¹ of a joint's k x k articulated inertia D = Sᵀ I^A S (1/D for k = 1)."""
    return 1.0 / D if D.shape == (1, 1) else jnp.linalg.inv(D)


def _stacked(field):
    """Per-body values (a list, from the unrolled loops, or an array stacked by ``lax.scan``) as one array
    with the body axis first."""
    return jnp.stack(field) if isinstance(field, list) else field


def _joined(field):
    """Per-joint blocks (joint i's rows first) concatenated into one array over the velocities: a list of
    (nv_i, ...) blocks, or the (n, 1, ...) stack of a one-DoF chain."""
    return jnp.concatenate(field) if isinstance(field, list) else jnp.reshape(field, (-1, *field.shape[2:]))


def _scanned(step, init, xs, reverse, unroll=1):
    """The outputs of ``lax.scan(step, init, xs)`` (``unroll``: 1, a loop; True, straight-line code)."""
    return jax.lax.scan(lambda carry, x: step(carry, x), init, xs, reverse=reverse, unroll=unroll)[1]


_UNROLLED = contextvars.ContextVar("ukjax_tree_recursions_unrolled", default=False)


def unrolled_recursions(unrolled: bool = True):
    """Trace the recursions of serial one-DoF chains unrolled on every platform, the CPU included (see
    :func:`_scan_per_platform`; ``unrolled=False``: as the platform chooses). :func:`ukjax.simulate_batch`
    traces a batch's right-hand side of an unconstrained system so (``benchmarks/tree_unroll_batch.py``:
    the UR5 at 1024 scenarios, RK4, 1.2-1.35x faster per step on 2 CPU cores), not a constrained one, where
    it did not pay (the UR5 with one joint-space constraint as fast either way, pinned planar chains of 4-8
    links 1.2x slower). :meth:`ukjax.System.motion` keys its compiled program on this setting
    (:func:`recursions_unrolled`)."""
    return trace_setting(_UNROLLED, unrolled)


def recursions_unrolled() -> bool:
    """Whether :func:`unrolled_recursions` is in effect."""
    return _UNROLLED.get()


_PER_BODY = contextvars.ContextVar("ukjax_tree_values_per_body", default=False)


def per_body_values(per_body: bool = True):
    """Trace a tree whose recursions are unrolled (not a serial one-DoF chain) with its per-body values
    (joint rotations, velocities, forces, spatial inertias) kept body by body, no array spanning the
    bodies (``per_body=False``: evaluated for all bodies at once where the algorithm allows, the default).

    XLA:CPU runs a compiled loop body's kernels in order in the calling thread only when every buffer it
    touches is at most 512 bytes (``ukjax._settings.SMALL_BUFFER_BYTES``); with one larger buffer it
    dispatches them to its thread pool, which for one scenario's step of tiny kernels costs more than it
    gains. The Panda's (9, 3, 3) rotations (648 bytes in float64) did that. :func:`ukjax.simulate` and
    :func:`ukjax.simulate_batch` trace inside this on the CPU where the integrated state itself is that
    small (one scenario, or a few, of a small system), and :meth:`ukjax.System.motion` keeps it only where
    the UK solve's own matrices are that small too (``System._solve_fits_small_buffers``). For a batch,
    evaluating all bodies at once compiles faster and runs as fast or faster (the Panda at 1024 scenarios
    on two devices: 7.8 and 9.1 against 11.1 µs per step per scenario; Jansen's leg at 64 compiled in 29-33
    against 41-43 s). :meth:`ukjax.System.motion` keys its compiled program on this setting
    (:func:`values_per_body`)."""
    return trace_setting(_PER_BODY, per_body)


def values_per_body() -> bool:
    """Whether :func:`per_body_values` is in effect."""
    return _PER_BODY.get()


def _scan_per_platform(step, init, xs, reverse):
    """:func:`_scanned` as a loop over the bodies on the CPU (one compiled body step whatever n: compiles
    fast, and one scenario of a constrained chain steps faster so: a pinned 4-link chain 25 against 34 µs
    per RK4 step; an unconstrained one is traced inside :func:`unrolled_recursions` by
    :func:`ukjax.simulate`, ``simulate_batch`` and ``step``), unrolled into straight-line code on every
    other platform (chosen when the program is lowered, ``jax.lax.platform_dependent``) and inside
    :func:`unrolled_recursions`. On a GPU
    each trip of a loop inside the right-hand side costs kernel launches and a device-to-host copy of its
    condition at every evaluation (``benchmarks/cuda_lowering.py``, ``tests/test_cuda_lowering.py``)."""
    if _UNROLLED.get():
        return _scanned(step, init, xs, reverse, unroll=True)
    cpu = functools.partial(_scanned, step, reverse=reverse)
    default = functools.partial(_scanned, step, reverse=reverse, unroll=True)
    return jax.lax.platform_dependent(init, xs, cpu=cpu, default=default)


class Tree(eqx.Module):
    """A kinematic tree: body i hangs from body ``parents[i]`` (-1: the world) by ``joints[i]``.

    Parents come before children (``parents[i] < i``). The configuration q stacks the joints' coordinates
    (``nq`` numbers: 1 per revolute or prismatic joint, 4 per ball joint, 7 per free joint) and the velocity
    v (called qd) their velocities (``nv`` numbers: 1, 1, 3, 6), joint by joint; ``n`` is ``nv``, the size of
    M and of the forces. Where nq ≠ nv, q̇ is not v: q̇ = N(q) v (:meth:`configuration_rate`) and q moves
    on its manifold by :meth:`retract`; every dynamic quantity (M, C, M⁻¹, τ, energies) is in v.

    The methods take q (nq,), qd (nv,), a :class:`Bodies` and, where gravity acts, the gravity vector g (3,)
    in world coordinates (m/s²). The recursions run as ``lax.scan`` over the bodies of a serial chain of
    one-DoF joints (one compiled body step, whatever n; unrolled when lowered for a GPU) and as unrolled
    loops otherwise. Rotations are
    evaluated from q/|q| of every quaternion, so the dynamics do not depend on the drift of |q|.
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
                raise TypeError(
                    f"joints must be ukjax.multibody.Joint (revolute, prismatic, ball, free), got {joint!r}"
                )

    @classmethod
    def chain(cls, joints: Sequence[Joint]) -> Tree:
        """A serial chain: body 0 on the world, body i on body i - 1."""
        return cls(parents=tuple(range(-1, len(joints) - 1)), joints=tuple(joints))

    @property
    def num_bodies(self) -> int:
        """Number of bodies (= joints)."""
        return len(self.joints)

    @property
    def nq(self) -> int:
        """Number of configuration coordinates, Σ joint.nq."""
        return sum(joint.nq for joint in self.joints)

    @property
    def nv(self) -> int:
        """Number of velocities (degrees of freedom), Σ joint.nv."""
        return sum(joint.nv for joint in self.joints)

    @property
    def n(self) -> int:
        """The velocity dimension nv: the size of M(q), of the forces and of qd (equal to the number of
        joints for revolute and prismatic joints only)."""
        return self.nv

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.num_bodies - 1))

    @property
    def _one_dof(self) -> bool:
        return all(joint.nq == 1 and joint.nv == 1 for joint in self.joints)

    @property
    def _scans(self) -> bool:
        """Whether the recursions run as ``lax.scan`` (a serial chain of one-DoF joints)."""
        return self.is_chain and self._one_dof

    def _slices(self, size: str) -> tuple[slice, ...]:
        """Each joint's slice of q (``size="nq"``) or of v (``"nv"``)."""
        sizes = [getattr(joint, size) for joint in self.joints]
        ends = np.cumsum(sizes)
        return tuple(slice(int(end) - k, int(end)) for k, end in zip(sizes, ends, strict=True))

    def _per_joint(self, x):
        """A vector or matrix over the velocities (nv, ...) as per-joint blocks: a list of (nv_i, ...), or
        the (n, 1, ...) stack of a one-DoF tree."""
        if self._one_dof:
            return jnp.reshape(x, (self.num_bodies, 1, *x.shape[1:]))
        return [x[s] for s in self._slices("nv")]

    # ------------------------------------------------------------------ configuration manifold
    def neutral(self, dtype=None):
        """The neutral configuration (nq,): zero angles and displacements, identity quaternions."""
        identity = [1.0, 0.0, 0.0, 0.0]
        parts = {"revolute": [0.0], "prismatic": [0.0], "ball": identity, "free": [0.0] * 3 + identity}
        return jnp.asarray([x for joint in self.joints for x in parts[joint.kind]], dtype)

    def retract(self, q, delta):
        """q ⊕ δ (nq,) for δ (nv,): q + δ for revolute and prismatic joints, quat ⊗ exp(δ/2) for a ball
        joint (right multiplication: δ is in the body frame, like its angular velocity), (p + δ_lin,
        quat ⊗ exp(δ_ang/2)) for a free joint. q ⊕ 0 = q; d/ds (q ⊕ s v) at s = 0 is q̇ = N(q) v."""
        q, delta = jnp.asarray(q), jnp.asarray(delta)
        if self._one_dof:
            return q + delta
        parts = []
        for joint, qs, vs in zip(self.joints, self._slices("nq"), self._slices("nv"), strict=True):
            qi, di = q[qs], delta[vs]
            if joint.kind == "ball":
                parts.append(quaternion_multiply(qi, quaternion_exp(di)))
            elif joint.kind == "free":
                parts += [qi[:3] + di[:3], quaternion_multiply(qi[3:], quaternion_exp(di[3:]))]
            else:
                parts.append(qi + di)
        return jnp.concatenate(parts)

    def normalize(self, q):
        """q with every quaternion divided by its norm: the projection onto the configuration manifold."""
        q = jnp.asarray(q)
        if self._one_dof:
            return q
        parts = []
        for joint, qs in zip(self.joints, self._slices("nq"), strict=True):
            qi = q[qs]
            if joint.kind in ("ball", "free"):
                head, quat = qi[:-4], qi[-4:]
                qi = jnp.concatenate([head, quat / jnp.sqrt(jnp.sum(quat * quat))])
            parts.append(qi)
        return jnp.concatenate(parts)

    def configuration_rate(self, q, v):
        """q̇ = N(q) v = d/ds (q ⊕ s v)|_{s=0} (nq,): v itself for one-DoF joints, ½ quat ⊗ (0, ω) for a
        quaternion."""
        q = jnp.asarray(q)
        zero, v = jnp.zeros(self.nv, q.dtype), jnp.asarray(v, q.dtype)
        return jax.jvp(lambda d: self.retract(q, d), (zero,), (v,))[1]

    # ------------------------------------------------------------------ checks
    def _checked(self, q, bodies: Bodies, qd=None):
        n, nq, nv = self.num_bodies, self.nq, self.nv
        q = jnp.asarray(q)
        sizes = (f"n = {n} joints",) * 2 if self._one_dof else (
            f"nq = {nq} configuration coordinates", f"nv = {nv} velocities")
        if q.shape != (nq,):
            raise ValueError(f"q has shape {q.shape}; this tree has {sizes[0]}")
        if qd is not None and jnp.shape(qd) != (nv,):
            raise ValueError(f"qd has shape {jnp.shape(qd)}; this tree has {sizes[1]}")
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
        """Root to leaves: (value_i, out_i) = step(value of the parent, or ``base`` at the world, x_i) with
        x_i = tuple(field[i] for field in xs); returns the outputs per body (stacked by ``lax.scan``, or
        lists: :func:`_stacked`, :func:`_joined`)."""
        if self._scans and not self._apart:
            return _scan_per_platform(step, base, xs, reverse=False)
        values, outs = [], []
        for i, parent in enumerate(self.parents):
            value, out = step(base if parent < 0 else values[parent], tuple(field[i] for field in xs))
            values.append(value)
            outs.append(out)
        return tuple(map(list, zip(*outs, strict=True))) if isinstance(outs[0], tuple) else outs

    def _up(self, step, zero, xs):
        """Leaves to root: (to_parent_i, out_i) = step(sum of the children's to_parent, or ``zero``, x_i);
        returns the outputs per body as :meth:`_down` does."""
        if self._scans and not self._apart:
            return _scan_per_platform(step, zero, xs, reverse=True)
        incoming, outs = [zero] * self.num_bodies, [None] * self.num_bodies
        for i in reversed(range(self.num_bodies)):
            to_parent, outs[i] = step(incoming[i], tuple(field[i] for field in xs))
            if self.parents[i] >= 0:
                incoming[self.parents[i]] = _add(incoming[self.parents[i]], to_parent)
        return tuple(map(list, zip(*outs, strict=True))) if isinstance(outs[0], tuple) else outs

    # ------------------------------------------------------------------ kinematics
    def _joint_motions(self, q, dtype):
        """(E_J, r_J) of every joint, (n, 3, 3) stacked, or a list of (3, 3) inside :func:`per_body_values`,
        and (n, 3): body coordinates = E_J (joint-frame coordinates - r_J). Revolute:
        E_J = R(a, q)ᵀ = cos q 1 + (1 - cos q) a aᵀ - sin q [a]×, r_J = 0; prismatic: E_J = 1, r_J = q a
        (Featherstone Table 4.1); ball: E_J = R(quat)ᵀ, r_J = 0; free: E_J = R(quat)ᵀ, r_J = p. The one-DoF
        joints are evaluated together unless kept apart."""
        one = [i for i, joint in enumerate(self.joints) if joint.nv == 1]
        starts = [s.start for s in self._slices("nq")]
        E_J, r_J = [None] * self.num_bodies, [None] * self.num_bodies
        if one:
            axes = np.stack([self.joints[i].axis for i in one])
            revolute = np.asarray([self.joints[i].kind == "revolute" for i in one])
        if one and self._apart:
            for k, i in enumerate(one):
                E_J[i], r_J[i] = _one_dof_motions(axes[k], revolute[k], q[starts[i]], dtype)
        elif one:
            angle = q if self._one_dof else q[np.asarray([starts[i] for i in one])]
            E_one, r_one = _one_dof_motions(axes, revolute, angle, dtype)
            if self._one_dof:
                return E_one, r_one
            for k, i in enumerate(one):
                E_J[i], r_J[i] = E_one[k], r_one[k]
        for i, (joint, start) in enumerate(zip(self.joints, starts, strict=True)):
            if joint.kind in ("ball", "free"):
                end = start + joint.nq
                E_J[i] = quaternion_rotation(q[end - 4 : end].astype(dtype)).T
                r_J[i] = q[start : start + 3].astype(dtype) if joint.kind == "free" else jnp.zeros(3, dtype)
        return (E_J if self._apart else jnp.stack(E_J)), jnp.stack(r_J)

    def _joint_transforms(self, q, bodies: Bodies):
        """(E_J, E, r): the joint rotations E_J (:meth:`_joint_motions`) and every ^iX_λ = X_J X_T(i) as
        (E, r), E = E_J E_T as E_J is stored, r = r_T + E_Tᵀ r_J (n, 3)."""
        dtype = jnp.result_type(q, bodies.offset)
        E_J, r_J = self._joint_motions(q, dtype)
        if bodies.rotation is None:
            return E_J, E_J, bodies.offset + r_J
        E_T = bodies.rotation
        if isinstance(E_J, list):
            E = [_mm(E_J_i, E_T[i]) for i, E_J_i in enumerate(E_J)]
            return E_J, E, bodies.offset + jnp.stack([_mm(E_T[i].T, r_J[i]) for i in range(self.num_bodies)])
        E = jnp.einsum("nij,njk->nik", E_J, E_T)
        return E_J, E, bodies.offset + jnp.einsum("nji,nj->ni", E_T, r_J)

    def _subspaces(self, E_J, dtype):
        """Motion subspaces S_i (6, nv_i) in body coordinates: stacked (n, 6, 1) for a one-DoF tree, else a
        list. A free joint's velocity (ṗ in the joint frame, ω in the body frame) moves the body by
        (ω, E_J ṗ), so S = [[0, 1], [E_J, 0]]."""
        if self._one_dof:
            return jnp.asarray(np.stack([joint.subspace for joint in self.joints]), dtype)[:, :, None]
        out = []
        for joint, E_i in zip(self.joints, E_J, strict=True):
            if joint.kind == "free":
                zero, eye = jnp.zeros((3, 3), dtype), jnp.eye(3, dtype=dtype)
                out.append(jnp.block([[zero, eye], [E_i, zero]]))
            else:
                out.append(jnp.asarray(np.reshape(joint.subspace, (6, -1)), dtype))
        return out

    def _joint_bias(self, E_J, qd_parts, dtype):
        """c_J = S̊ q̇ (n, 6), the velocity product of a joint whose S varies in body coordinates
        (Featherstone eq. 3.42): for a free joint, d/dt (E_J ṗ) = E_J p̈ - ω × E_J ṗ gives (0, -ω × E_J ṗ);
        zero for the others. ``None`` for a tree without free joints."""
        if not any(joint.kind == "free" for joint in self.joints):
            return None
        out = []
        for joint, E_i, v in zip(self.joints, E_J, qd_parts, strict=True):
            if joint.kind == "free":
                out.append(jnp.concatenate([jnp.zeros(3, dtype), -_cross(v[3:], _mm(E_i, v[:3]))]))
            else:
                out.append(jnp.zeros(6, dtype))
        return jnp.stack(out)

    def frames(self, q, bodies: Bodies):
        """World pose of every body frame: rotations R (n, 3, 3), world = R body coordinates, and origins
        p (n, 3) (m)."""
        q = self._checked(q, bodies)
        _, E, r = self._joint_transforms(q, bodies)
        eye = jnp.eye(3, dtype=r.dtype)

        def step(parent, x):
            R_parent, p_parent = parent
            E_i, r_i = x
            pose = (_mm(R_parent, E_i.T), p_parent + _mm(R_parent, r_i))
            return pose, pose

        R, p = self._down(step, (eye, jnp.zeros(3, r.dtype)), (E, r))
        return _stacked(R), _stacked(p)

    def point(self, q, bodies: Bodies, body: int, local):
        """World position (3,) of the point with body-frame coordinates ``local`` on body ``body`` (m)."""
        if not isinstance(body, int) or not 0 <= body < self.num_bodies:
            raise ValueError(f"body must be an int in [0, {self.num_bodies}), got {body!r}")
        R, p = self.frames(q, bodies)
        return p[body] + _mm(R[body], jnp.asarray(local, p.dtype))

    def point_motion(self, q, qd, bodies: Bodies, points):
        """(x, J, J̇q̇) of points fixed on bodies, ``points`` = ((body, local (3,)), ...): world positions x
        (k, 3), Jacobians J = ∂x/∂q (k, 3, n) and velocity products J̇q̇ (k, 3) (ẍ = J q̈ + J̇q̇), all from one
        root-to-leaves pass over the world poses and velocities of the bodies. Trees of revolute and prismatic
        joints only.

        Joint i turns (or shifts) body i about (along) its world axis w_i = R_i a_i through the body's origin
        p_i, so the column of joint k for a point x on a body of k's subtree is w_k × (x - p_k) (revolute) or
        w_k (prismatic), zero elsewhere; with ẇ_k = ω_k × w_k (ω_k body k's angular velocity) its rate is
        (ω_k × w_k) × (x - p_k) + w_k × (ẋ - ṗ_k), or ω_k × w_k, and J̇q̇ = Σ_k q̇_k d/dt column_k. Where
        automatic differentiation pushes n tangents through the forward kinematics for J and a second-order
        tangent for J̇q̇, this evaluates it once (Featherstone 2008, §4.6 and eq. 3.42 in world coordinates)."""
        if not self._one_dof:
            raise ValueError("point_motion: trees of revolute and prismatic joints only")
        q = self._checked(q, bodies, qd)
        E_J, E, r = self._joint_transforms(q, bodies)
        dtype = r.dtype
        qd = jnp.asarray(qd, dtype)
        revolute_np = np.asarray([joint.kind == "revolute" for joint in self.joints])
        axes = jnp.asarray(np.stack([joint.axis for joint in self.joints]), dtype)
        turning = jnp.asarray(revolute_np, dtype) * qd  # the angular rate each joint adds
        sliding = jnp.asarray(~revolute_np, dtype) * qd

        def step(parent, x):
            R_parent, p_parent, w_parent, v_parent = parent
            E_i, r_i, a_i, turn_i, slide_i = x
            R = _mm(R_parent, E_i.T)
            offset = _mm(R_parent, r_i)
            axis = _mm(R, a_i)
            state = (R, p_parent + offset, w_parent + axis * turn_i,
                     v_parent + _cross(w_parent, offset) + axis * slide_i)  # fmt: skip
            return state, (*state, axis)

        zero = jnp.zeros(3, dtype)
        base = (jnp.eye(3, dtype=dtype), zero, zero, zero)
        R, *rest = self._down(step, base, (E, r, axes, turning, sliding))  # R: only R[body] is read
        p, w, v, axis = map(_stacked, rest)
        spin = jax.vmap(_cross)(w, axis)  # ẇ_k = ω_k × w_k
        x_all, J_all, rate_all = [], [], []
        for body, local in points:
            chain = self._ancestors(body)
            rows = lambda a, chain=chain: jnp.stack([a[k] for k in chain])  # noqa: E731  (static: no gather)
            x = p[body] + _mm(R[body], jnp.asarray(local, dtype))
            xd = v[body] + _cross(w[body], x - p[body])
            lever, axes_k, spin_k = x - rows(p), rows(axis), rows(spin)
            turns = revolute_np[chain][:, None]
            columns = jnp.where(turns, jax.vmap(_cross)(axes_k, lever), axes_k)
            rates = jnp.where(
                turns, jax.vmap(_cross)(spin_k, lever) + jax.vmap(_cross)(axes_k, xd - rows(v)), spin_k
            )
            place = {k: i for i, k in enumerate(chain)}  # the other joints' columns are zero (no scatter)
            J = jnp.stack([columns[place[k]] if k in place else zero for k in range(self.nv)], axis=1)
            x_all.append(x)
            J_all.append(J)
            rate_all.append(_mm(rates.T, rows(qd)))
        return jnp.stack(x_all), jnp.stack(J_all), jnp.stack(rate_all)

    def _ancestors(self, body: int) -> list[int]:
        """Body ``body`` and its ancestors, root first."""
        chain = []
        while body >= 0:
            chain.append(body)
            body = self.parents[body]
        return chain[::-1]

    # ------------------------------------------------------------------ dynamics
    @property
    def _apart(self) -> bool:
        """Whether per-body values are kept body by body (:func:`per_body_values`): where the bodies' stacked
        rotations (n, 3, 3) would exceed ``SMALL_BUFFER_BYTES`` (8 bodies and more in float64; below, the
        stacks are small and fuse into fewer kernels: the UR5's one-scenario step 37-49 µs apart against
        25-36 µs stacked), for a tree whose recursions are unrolled (a serial chain's inside
        :func:`unrolled_recursions`, its loops then unrolled in Python like any tree's)."""
        stacked = self.num_bodies * 9 * jax.dtypes.canonicalize_dtype(float).itemsize
        return _PER_BODY.get() and stacked > SMALL_BUFFER_BYTES and (not self._scans or _UNROLLED.get())

    def _over_bodies(self, fn, *fields):
        """``fn`` of every body's entries of ``fields`` (per-body values: stacked arrays, or lists from the
        unrolled recursions): body by body, a list, inside :func:`per_body_values`; else one ``jax.vmap``
        over the stacks."""
        if self._apart:
            return [fn(*(field[i] for field in fields)) for i in range(self.num_bodies)]
        return jax.vmap(fn)(*(_stacked(field) for field in fields))

    def mass_matrix(self, q, bodies: Bodies):
        """M(q) (nv, nv) by the composite-rigid-body algorithm (Featherstone Table 6.2) in one sweep, leaves
        to root: body i's composite inertia I^c_i = I_i + Σ children's, and the forces F (6, nv) whose
        columns of joint k are I^c_k S_k of every body k in i's subtree carried to frame i (columns of
        different subtrees are disjoint, so the children's F add); the rows of joint i are S_iᵀ F (M_ik = 0
        where k is not in i's subtree nor i in k's), mirrored to the upper-left triangle. O(n²), one compiled
        step per body."""
        q = self._checked(q, bodies)
        E_J, E, r = self._joint_transforms(q, bodies)
        S = self._subspaces(E_J, r.dtype)
        nv = self.nv

        def step(incoming, x):
            inertia_in, force_in = incoming
            E_i, r_i, inertia, S_i, columns = x
            composite = inertia + inertia_in
            force = force_in + _dot(_mm(composite, S_i), columns)
            rows = _mm(S_i.T, force)
            return (_inertia_to_parent(E_i, r_i, composite), _to_parent(E_i, r_i, force)), rows

        zero = (jnp.zeros((6, 6), r.dtype), jnp.zeros((6, nv), r.dtype))
        eye = jnp.eye(nv, dtype=r.dtype)
        xs = (E, r, self._over_bodies(_spatial_inertia, *_body_parameters(bodies, r.dtype)), S,
              self._per_joint(eye))
        subtree = _joined(self._up(step, zero, xs))  # rows of joint i: M_ik, k in subtree(i)
        diagonal = np.zeros((nv, nv))
        for s in self._slices("nv"):
            diagonal[s, s] = 1.0  # the joints' own blocks, in both subtree and its transpose
        return subtree + subtree.T - jnp.asarray(diagonal, r.dtype) * subtree

    def _velocities(self, E, r, v_joint):
        """Body velocities v_i = ^iX_λ v_λ + S_i q̇_i (6,) per body (stacked or a list, as the recursions
        give them) from the joints' S_i q̇_i (:func:`_joint_velocities`)."""

        def step(v_parent, x):
            E_i, r_i, v_joint_i = x
            v = _to_child(E_i, r_i, v_parent) + v_joint_i
            return v, v

        return self._down(step, jnp.zeros(6, r.dtype), (E, r, v_joint))

    def bias_force(self, q, qd, bodies: Bodies, gravity):
        """C(q, v) = τ needed for v̇ = 0: Coriolis, centrifugal and gravity terms (nv,), by the recursive
        Newton-Euler algorithm (Featherstone Table 5.1); the given force of the tree is Q = τ - C."""
        return self.inverse_dynamics(q, qd, None, bodies, gravity)

    def inverse_dynamics(self, q, qd, qdd, bodies: Bodies, gravity):
        """τ = M(q) v̇ + C(q, v) (nv,) by the recursive Newton-Euler algorithm (:meth:`_inverse_given` with one
        column); ``qdd=None`` means v̇ = 0."""
        q = self._checked(q, bodies, qd)
        dtype = jnp.result_type(q, bodies.offset, qd, float)
        X = jnp.zeros((self.nv, 1), dtype) if qdd is None else jnp.asarray(qdd, dtype)[:, None]
        g = jnp.asarray(gravity, dtype)
        return self._inverse_given(q, jnp.asarray(qd, dtype), bodies, g, X, np.ones(1))[:, 0]

    def solve_mass(self, q, bodies: Bodies, B, *, closed_form: bool | None = None):
        """M(q)⁻¹ B for B of shape (nv,) or (nv, k), by the articulated-body algorithm (Featherstone Table
        7.1) with zero velocity and no gravity: the articulated inertias are formed once, O(n), and each
        column of B costs one backward and one forward sweep of 6-vectors, O(n). Needs every
        D_i = S_iᵀ I^A_i S_i positive definite (each joint moves a body with mass or inertia along every
        direction it allows). Derivatives in closed form (:meth:`_solve_given`)."""
        q = self._checked(q, bodies)
        B = jnp.asarray(B)
        if B.ndim not in (1, 2) or B.shape[0] != self.nv:
            raise ValueError(f"solve_mass expects B of shape ({self.nv},) or ({self.nv}, k), got {B.shape}")
        columns = B if B.ndim == 2 else B[:, None]
        dtype = jnp.result_type(q, bodies.offset, columns, float)
        zero = jnp.zeros(self.nv, dtype)
        X = self._solve_given(q, zero, zero, bodies, jnp.zeros(3, dtype), columns, np.zeros(columns.shape[1]),
                              closed_form=closed_form)
        return X if B.ndim == 2 else X[:, 0]

    def forward_dynamics(self, q, qd, tau, bodies: Bodies, gravity):
        """v̇ = M⁻¹(τ - C(q, v)) of the unconstrained tree (nv,): one articulated-body pass with velocities
        and gravity (Featherstone 2008, Table 7.1; :meth:`_solve_given`)."""
        if not _ONE_PASS:
            return self.solve_mass(q, bodies, tau - self.bias_force(q, qd, bodies, gravity))
        tau = jnp.asarray(tau)
        zero = jnp.zeros((self.nv, 1), jnp.result_type(tau, float))
        return self._solve_given(q, qd, tau, bodies, gravity, zero, np.ones(1))[:, 0]

    def _solve_given(self, q, qd, tau, bodies: Bodies, gravity, B, weights, *, closed_form=None):
        """X = M⁻¹(B + (τ - C(q, v)) wᵀ) (nv, k) for B (nv, k) and weights w (k,) (a NumPy constant), by
        :meth:`_articulated_pass`, with derivatives in closed form (Carpentier & Mansard 2018, "Analytical
        derivatives of rigid body dynamics algorithms", §III): from M X + C wᵀ = B + τ wᵀ,

            dX = M⁻¹(dB + dτ wᵀ - ∂(M X + C wᵀ)),

        where ∂(M X + C wᵀ) is the tangent of the recursive Newton-Euler algorithm at the accelerations X held
        fixed (:meth:`_inverse_given`) with respect to q, v, the bodies and gravity, and M⁻¹ reuses the
        articulated inertias of the primal pass (:meth:`_articulated_apply`). Reverse mode transposes that
        rule: the pullback is one Newton-Euler pullback over 6-vectors and one sweep pair of vectors, not the
        pullback of the articulated inertias' 6 x 6 algebra. ``closed_form=False`` (or the module's
        ``_CLOSED_FORM_DERIVATIVES`` where None) differentiates the articulated-body pass itself."""
        q = self._checked(q, bodies, qd)
        weights = np.asarray(weights, dtype=float)
        k = B.shape[1]
        if B.shape != (self.nv, k) or weights.shape != (k,):
            raise ValueError(f"expected B (nv, k) = ({self.nv}, k) and weights (k,), got {B.shape}, "
                             f"{weights.shape}")
        dtype = jnp.result_type(q, bodies.offset, B, qd, tau, float)
        args = (q, *(jnp.asarray(x, dtype) for x in (qd, tau)), bodies, jnp.asarray(gravity, dtype),
                jnp.asarray(B, dtype))  # fmt: skip
        if not (_CLOSED_FORM_DERIVATIVES if closed_form is None else closed_form):
            return self._articulated_pass(*args, weights)[0]
        return self._closed_form_solve(weights)(*args)

    def _closed_form_solve(self, weights):
        """:meth:`_articulated_pass`'s X as a ``jax.custom_jvp`` whose tangent is :meth:`_solve_given`'s
        rule."""
        w = np.asarray(weights, dtype=float)

        @jax.custom_jvp
        def solve(q, qd, tau, bodies, gravity, B):
            return self._articulated_pass(q, qd, tau, bodies, gravity, B, w)[0]

        @solve.defjvp
        def tangent(primals, tangents):
            q, qd, tau, bodies, gravity, B = primals
            dq, dqd, dtau, dbodies, dgravity, dB = tangents
            X, sweeps = self._articulated_pass(q, qd, tau, bodies, gravity, B, w)
            moved = lambda q, qd, bodies, gravity: self._inverse_given(q, qd, bodies, gravity, X, w)  # noqa: E731
            _, dR = jax.jvp(moved, (q, qd, bodies, gravity), (dq, dqd, dbodies, dgravity))
            given = dB - dR if not w.any() else dB - dR + dtau[:, None] * jnp.asarray(w, X.dtype)[None, :]
            return X, self._articulated_apply(sweeps, given)

        return solve

    def _velocity_products(self, E_J, E, r, S, qd, bodies: Bodies):
        """(c, p) (n, 6) each: the velocity products c_i = c_J + v_i ×ₘ S_i q̇_i (eq. 3.42 for c_J of a free
        joint) and the gyroscopic forces p_i = v_i ×* I_i v_i of every body (Featherstone 2008, Table 7.1,
        pass 1), from one root-to-leaves pass over the velocities v_i (which alone needs the loop: c_i and
        p_i depend on body i alone and are evaluated for all bodies at once)."""
        qd_parts = self._per_joint(qd)
        v_joint = _joint_velocities(S, qd_parts)
        v = self._velocities(E, r, v_joint)
        joint_bias = self._joint_bias(E_J, qd_parts, r.dtype)
        c = self._over_bodies(_motion_cross, v, v_joint)
        if joint_bias is not None:
            c = self._over_bodies(jnp.add, c, joint_bias)
        parameters = _body_parameters(bodies, r.dtype)
        gyroscopic = lambda v_i, *body: _force_cross(v_i, _inertia_times(*body, v_i))
        p = self._over_bodies(gyroscopic, v, *parameters)
        return c, p

    def _articulated_pass(self, q, qd, tau, bodies: Bodies, gravity, B, weights):
        """(X, sweeps): X = M⁻¹(B + (τ - C(q, v)) wᵀ) (nv, k) by the articulated-body algorithm of
        Featherstone 2008, Table 7.1, with every column linear in its share w_j of the velocity terms and
        gravity, so the free acceleration M⁻¹(τ - C) (w_j = 1) comes out of the same three sweeps as M⁻¹B
        (w_j = 0) and the RNEA (Table 5.1) is not needed; ``sweeps`` are what :meth:`_articulated_apply`
        needs to apply M⁻¹ to further columns. Gravity enters as the base acceleration a_0 = -a_g = (0, -g)
        (Featherstone §5.3); no external forces. With w = 0 the velocity terms are skipped (M⁻¹B alone).

        1. root to leaves: v_i = ^iX_λ v_λ + S_i q̇_i, c_i and p_i (:meth:`_velocity_products`);
        2. leaves to root: I^A_i = I_i + Σ children's, p^A_i = p_i wᵀ + Σ children's, U_i = I^A_i S_i,
           D_i = S_iᵀ U_i, u_i = τ_i - S_iᵀ p^A_i, and to the parent I^a = I^A - U D⁻¹ Uᵀ and
           p^a = p^A + I^a c_i wᵀ + U D⁻¹ u_i;
        3. root to leaves: a'_i = ^iX_λ a_λ + c_i wᵀ (a_λ = a_0 wᵀ at the world),
           q̈_i = D_i⁻¹(u_i - U_iᵀ a'_i), a_i = a'_i + S_i q̈_i.
        """
        dtype = B.dtype
        k = B.shape[1]
        velocity = bool(weights.any())
        E_J, E, r = jax.tree.map(lambda x: x.astype(dtype), self._joint_transforms(q, bodies))
        S = self._subspaces(E_J, dtype)
        w = jnp.asarray(weights, dtype)
        columns = B + tau[:, None] * w[None, :] if velocity else B
        if velocity:
            c, p = self._velocity_products(E_J, E, r, S, qd, bodies)
            per_body = (c, p)
        else:
            per_body = ()

        def backward(incoming, x):
            E_i, r_i, mass, com, inertia_c, S_i, tau_i, *terms = x
            I_in, p_in = incoming
            # I_i formed inside the step: its 10 parameters, not a stacked (n, 6, 6), enter the loop (a
            # loop over small buffers compiles to one kernel on the CPU)
            articulated = _spatial_inertia(mass, com, inertia_c) + I_in
            pA = p_in + terms[1][:, None] * w[None, :] if velocity else p_in
            U = _mm(articulated, S_i)
            D_inv = _inverse(_mm(S_i.T, U))
            u = tau_i - _mm(S_i.T, pA)
            UD = _dot(U, D_inv)
            reduced = articulated - _dot(UD, U.T)
            pa = pA + _dot(UD, u)
            if velocity:
                pa = pa + _mm(reduced, terms[0])[:, None] * w[None, :]
            return (_inertia_to_parent(E_i, r_i, reduced), _to_parent(E_i, r_i, pa)), (U, D_inv, u)

        zero = (jnp.zeros((6, 6), dtype), jnp.zeros((6, k), dtype))
        parameters = _body_parameters(bodies, dtype)
        U, D_inv, u = self._up(backward, zero, (E, r, *parameters, S, self._per_joint(columns), *per_body))

        def forward(a_parent, x):
            E_i, r_i, S_i, U_i, D_inv_i, u_i, *c_i = x
            a = _to_child(E_i, r_i, a_parent)
            if velocity:
                a = a + c_i[0][:, None] * w[None, :]
            qdd = _dot(D_inv_i, u_i - _mm(U_i.T, a))
            return a + _dot(S_i, qdd), qdd

        base = jnp.concatenate([jnp.zeros(3, dtype), -gravity])[:, None] * w[None, :]
        X = _joined(self._down(forward, base, (E, r, S, U, D_inv, u, *per_body[:1])))
        return X, (E, r, S, U, D_inv)

    def _articulated_apply(self, sweeps, B):
        """M⁻¹B (nv, k) from the articulated inertias' U_i = I^A_i S_i and D_i⁻¹ of a pass already made
        (:meth:`_articulated_pass`'s ``sweeps``): one leaves-to-root sweep of the bias forces
        p^a = p^A + U D⁻¹ u_i, u_i = B_i - S_iᵀ p^A_i, and one root-to-leaves sweep of the accelerations
        (Featherstone 2008, Table 7.1 with zero velocity and gravity)."""
        E, r, S, U, D_inv = sweeps
        dtype, k = B.dtype, B.shape[1]

        def backward(p_in, x):
            E_i, r_i, S_i, U_i, D_inv_i, B_i = x
            u = B_i - _mm(S_i.T, p_in)
            return _to_parent(E_i, r_i, p_in + _dot(_dot(U_i, D_inv_i), u)), u

        u = self._up(backward, jnp.zeros((6, k), dtype), (E, r, S, U, D_inv, self._per_joint(B)))

        def forward(a_parent, x):
            E_i, r_i, S_i, U_i, D_inv_i, u_i = x
            a = _to_child(E_i, r_i, a_parent)
            qdd = _dot(D_inv_i, u_i - _mm(U_i.T, a))
            return a + _dot(S_i, qdd), qdd

        return _joined(self._down(forward, jnp.zeros((6, k), dtype), (E, r, S, U, D_inv, u)))

    def _inverse_given(self, q, qd, bodies: Bodies, gravity, X, weights):
        """M X + C(q, v) wᵀ (nv, k) for accelerations X (nv, k) and weights w (k,) (a NumPy constant): the
        recursive Newton-Euler algorithm (Featherstone 2008, Table 5.1) with k columns, each carrying its
        share w_j of the velocity terms and gravity; the inverse of :meth:`_articulated_pass`
        (B + τ wᵀ = M X + C wᵀ): a_i = ^iX_λ a_λ + S_i X_i + c_i wᵀ (a_0 = (0, -g) wᵀ),
        f_i = I_i a_i + p_i wᵀ, and leaves to root the joint forces S_iᵀ (f_i + Σ children's)."""
        dtype = X.dtype
        k = X.shape[1]
        velocity = bool(np.any(weights))
        w = jnp.asarray(weights, dtype)
        E_J, E, r = jax.tree.map(lambda x: x.astype(dtype), self._joint_transforms(q, bodies))
        S = self._subspaces(E_J, dtype)
        c, p = self._velocity_products(E_J, E, r, S, qd, bodies) if velocity else (None, None)

        def forward(a_parent, x):
            E_i, r_i, S_i, X_i, *c_i = x
            a = _to_child(E_i, r_i, a_parent) + _dot(S_i, X_i)
            if velocity:
                a = a + c_i[0][:, None] * w[None, :]
            return a, a

        base = jnp.concatenate([jnp.zeros(3, dtype), -gravity])[:, None] * w[None, :]
        a = self._down(forward, base, (E, r, S, self._per_joint(X), *(() if c is None else (c,))))
        parameters = _body_parameters(bodies, dtype)
        force = self._over_bodies(_inertia_times, *parameters, a)
        if velocity:
            force = self._over_bodies(lambda f_i, p_i: f_i + p_i[:, None] * w[None, :], force, p)

        def backward(incoming, x):
            E_i, r_i, f_i, S_i = x
            total = f_i + incoming
            return _to_parent(E_i, r_i, total), _mm(S_i.T, total)

        return _joined(self._up(backward, jnp.zeros((6, k), dtype), (E, r, force, S)))

    # ------------------------------------------------------------------ energies
    def kinetic_energy(self, q, qd, bodies: Bodies):
        """T = ½ Σ v_iᵀ I_i v_i (J)."""
        q = self._checked(q, bodies, qd)
        E_J, E, r = self._joint_transforms(q, bodies)
        S = self._subspaces(E_J, r.dtype)
        velocity = self._velocities(E, r, _joint_velocities(S, self._per_joint(jnp.asarray(qd, r.dtype))))
        momenta = self._over_bodies(_inertia_times, *_body_parameters(bodies, r.dtype), velocity)
        return 0.5 * jnp.sum(_stacked(velocity) * _stacked(momenta))

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
        factorizing M, unless the constraints have at least n rows (then M⁻¹ would be applied to n + 1
        columns, and M and a Cholesky cost less: ``System._dense_mass_pays``). There the free acceleration
        M⁻¹Q (with M⁻¹Aᵀ in the same sweeps) comes from one articulated-body pass with velocities and
        gravity (Featherstone 2008, Table 7.1), not from the RNEA (Table 5.1) followed by M⁻¹
        (``mass_solve.given_force_solve``, which :class:`ukjax.System` uses only while ``force`` and
        ``mass_solve`` are the ones built here).

        ``bodies(p) -> Bodies`` and ``gravity(p) -> (3,)`` read the parameters; ``applied_force(q, qd, t, p)``
        gives joint forces/torques τ (nv,) (default none); the rest as for :class:`ukjax.System`. A tree with
        ball or free joints gives a System with ``nq`` = :attr:`nq`, ``n`` = :attr:`nv` and the tree's
        :meth:`retract` and :meth:`normalize` (its configuration is a manifold; see :class:`ukjax.System`).
        """

        def mass(q, t, p):
            return self.mass_matrix(q, bodies(p))

        def force(q, qd, t, p):
            C = self.bias_force(q, qd, bodies(p), gravity(p))
            return -C if applied_force is None else jnp.asarray(applied_force(q, qd, t, p)) - C

        closed_form = _CLOSED_FORM_DERIVATIVES

        def mass_solve(q, t, p, B):
            return self.solve_mass(q, bodies(p), B, closed_form=closed_form)

        def given_force_solve(q, qd, t, p, B, weights):
            # M⁻¹(B + Q wᵀ) with Q = τ - C: one articulated-body pass with velocities (Table 7.1), no RNEA
            tau = jnp.zeros(self.nv, jnp.result_type(q, qd, float)) if applied_force is None else (
                jnp.asarray(applied_force(q, qd, t, p)))
            return self._solve_given(q, qd, tau, bodies(p), gravity(p), B, weights, closed_form=closed_form)

        if _ONE_PASS:
            given_force_solve.agrees_with = force
            mass_solve.given_force_solve = given_force_solve

        def kinetic(q, qd, t, p):
            return self.kinetic_energy(q, qd, bodies(p))

        def potential(q, t, p):
            return self.potential_energy(q, bodies(p), gravity(p))

        chart = {} if self._one_dof else dict(nq=self.nq, retract=self.retract, normalize=self.normalize)
        return System(
            mass=mass,
            force=force,
            n=self.nv,
            **chart,
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

