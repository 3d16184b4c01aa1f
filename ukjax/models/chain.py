"""A planar chain of k rigid links in joint coordinates with its tip pinned: a family of any size.

Not from a seed paper: the scaling family of ``benchmarks/scaling.py`` (n = k coordinates, m = 2 constraint
rows, or m = 2c with the tip pinned c times), built with :meth:`ukjax.System.from_lagrangian` from T and V
and a :class:`ukjax.Holonomic` tip constraint, so that every size exercises the same code a user's model does.

Geometry (SI units). Link i (i = 0, ..., k-1) is a uniform rod of length l_i (m) and mass m_i (kg), central
moment of inertia m_i l_i²/12 (kg m²), in the x-y plane; gravity g (m/s²) acts along -y. Joint 0 pins link 0
to the origin; joint i > 0 joins link i to the end of link i-1. Coordinates ``q = (θ_0, ..., θ_{k-1})`` are
the relative joint angles (rad), θ_0 measured from the x axis: link i points along u(φ_i) = (cos φ_i, sin φ_i)
with absolute angle φ_i = θ_0 + ... + θ_i. Joint positions r_0 = 0, r_{i+1} = r_i + l_i u(φ_i); the mass
centre of link i is c_i = r_i + (l_i/2) u(φ_i); the tip is r_k.

Energies: T = Σ_i ½ m_i |ċ_i|² + ½ (m_i l_i²/12) φ̇_i², V = Σ_i m_i g c_i·ŷ (joules).

Constraint: the tip is pinned at ``p["tip"]`` (m): φ(q) = r_k(q) - p_tip = 0, two rows, stabilized by
Baumgarte's φ̈ + 2αφ̇ + β²φ = 0 (gains ``p["alpha"]``, ``p["beta"]`` in 1/s). ``copies = c > 1`` writes
the same pin c times, copy j in a frame turned by πj/c: R(πj/c) φ(q) = 0. The 2c rows have rank 2 and are
consistent (they vanish together and their Baumgarte terms are the same rotations), so the motion is the
same as with one copy: the redundantly constrained family of the benchmark (c = k gives m = 2n).

Initial state: the links form a half circle hanging below the x axis, absolute angles
φ_i = -π/2 + π(i + ½)/k (the chain leaves the origin downwards and arrives at the pin upwards), and
``p["tip"]`` is the tip of that configuration, on the x axis at 2/π of the chain's length when the links are
equal, so φ(q0) = 0 exactly. The half circle keeps the tip Jacobian of full rank 2 for every k ≥ 2 (k = 2
is a rigid triangle: n - m = 0 degrees of freedom) and is close to the hanging equilibrium (a catenary), so
released from rest the chain sways gently instead of whipping; :func:`scenarios` adds initial velocities in
the null space of the tip Jacobian, so every scenario starts consistent too.
Joint damping: optional viscous torques -c θ̇ at every joint (``p["damping"]``, N m s/rad, default 0).

Defaults: links of 0.25 m and 0.25 kg each, so that a chain of more links is longer (its fastest motions do
not speed up with k; with the length 1 m shared by 32 links the chain whips and a fixed 5 ms step diverges),
g = 9.81, α = β = 10 (critically damped), no damping.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ukjax import multibody
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System


def _f64(value):
    return jnp.asarray(value, dtype=jnp.float64)


def _check_links(links):
    if not isinstance(links, int) or links < 2:
        raise ValueError(f"a pinned chain needs links >= 2 (an int), got {links!r}")


def arc_angles(links: int) -> np.ndarray:
    """Absolute link angles φ_i of the initial half circle (rad)."""
    _check_links(links)
    i = np.arange(links)
    return -0.5 * math.pi + math.pi * (i + 0.5) / links


def _joints(q, p):
    """Absolute angles φ (k,) and joint positions r_0..r_k (k + 1, 2) of configuration q."""
    phi = jnp.cumsum(q)
    steps = p["length"][:, None] * jnp.stack([jnp.cos(phi), jnp.sin(phi)], axis=1)
    r = jnp.concatenate([jnp.zeros((1, 2), q.dtype), jnp.cumsum(steps, axis=0)])
    return phi, r


def tip(q, p):
    """Tip position r_k(q) (m), shape (2,)."""
    return _joints(q, p)[1][-1]


def centres(q, p):
    """Mass centres c_i(q) of the links (m), shape (k, 2)."""
    phi, r = _joints(q, p)
    return r[:-1] + 0.5 * p["length"][:, None] * jnp.stack([jnp.cos(phi), jnp.sin(phi)], axis=1)


def kinetic_energy(q, qd, t, p):
    """T = Σ ½ m_i |ċ_i|² + ½ (m_i l_i²/12) φ̇_i² (J), ċ_i = dc_i/dq q̇ by one forward-mode product."""
    centre_velocity = jax.jvp(lambda q_: centres(q_, p), (q,), (qd,))[1]
    phi_dot = jnp.cumsum(qd)
    inertia = p["mass"] * p["length"] ** 2 / 12.0
    translation = jnp.sum(p["mass"] * jnp.sum(centre_velocity**2, axis=1))
    return 0.5 * translation + 0.5 * jnp.sum(inertia * phi_dot**2)


def potential_energy(q, t, p):
    """V = Σ m_i g c_i·ŷ (J)."""
    return p["g"] * jnp.sum(p["mass"] * centres(q, p)[:, 1])


def joint_damping(q, qd, t, p):
    """Viscous joint torques -c θ̇ (N m), c = ``p["damping"]`` (N m s/rad) at every joint."""
    return -p["damping"] * qd


def _rotation(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.asarray([[c, -s], [s, c]])


def tip_constraint(copies: int = 1):
    """φ(q, t, p) of the pin, ``copies`` times in frames turned by πj/copies (2 copies rows)."""
    if not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a positive int, got {copies!r}")
    frames = np.concatenate([_rotation(math.pi * j / copies) for j in range(copies)])  # (2c, 2)

    def phi(q, t, p):
        error = tip(q, p) - p["tip"]
        return error if copies == 1 else jnp.asarray(frames, error.dtype) @ error

    return phi


def default_params(
    links: int, *, link_length: float = 0.25, link_mass: float = 0.25, damping: float = 0.0
) -> dict:
    """Equal links of ``link_length`` (m) and ``link_mass`` (kg); joint damping ``damping`` (N m s/rad);
    g = 9.81 m/s²; α = β = 10 1/s; the pin at the tip of the initial half circle."""
    _check_links(links)
    params = {
        "length": _f64(np.full(links, link_length)),
        "mass": _f64(np.full(links, link_mass)),
        "g": _f64(9.81),
        "damping": _f64(damping),
        "alpha": _f64(10.0),
        "beta": _f64(10.0),
    }
    params["tip"] = tip(initial_state(params)[0], params)
    return params


def initial_state(params):
    """(q0, q̇0): the half-circle configuration at rest (consistent with the pin at ``params["tip"]``)."""
    phi = arc_angles(int(jnp.shape(params["length"])[0]))
    q0 = _f64(np.diff(phi, prepend=0.0))
    return q0, jnp.zeros_like(q0)


def scenarios(params, count: int, *, speed: float = 1.0, seed: int = 0):
    """``count`` consistent initial states (q0s, q̇0s), shape (count, k) each: the half-circle configuration,
    and joint rates drawn normal with standard deviation ``speed`` (rad/s) and projected onto the null space
    of the tip Jacobian J (q̇ = (I - J⁺J) v, in NumPy), so that J q̇0 = 0 for every scenario."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    q0, _ = initial_state(params)
    J = np.asarray(jax.jacfwd(tip)(q0, params))
    k = q0.shape[0]
    null = np.eye(k) - np.linalg.pinv(J) @ J
    v = np.random.default_rng(seed).normal(0.0, speed, (count, k))
    qd0s = v @ null.T
    return jnp.broadcast_to(q0, (count, k)), _f64(qd0s)


def system(
    links: int, *, copies: int = 1, stabilized: bool = True, constraint_rank: int | None = None
) -> System:
    """The chain of ``links`` links with its tip pinned ``copies`` times (m = 2 copies rows); Baumgarte
    terms with gains ``p["alpha"], p["beta"]`` unless ``stabilized=False``. ``constraint_rank=2`` declares
    the rank of the copies' rows (:attr:`ukjax.System.constraint_rank`), so that the solve keeps 2 rows."""
    return System.from_lagrangian(
        kinetic_energy,
        potential_energy,
        links,
        applied_force=joint_damping,
        **_pinned(links, copies, stabilized, constraint_rank),
    )


def _pinned(links, copies, stabilized, constraint_rank) -> dict:
    """The keywords :func:`system` and :func:`multibody_system` share: the pin (Baumgarte terms unless
    ``stabilized=False``), the coordinates' names and the declared rank."""
    _check_links(links)
    stab = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="quadratic") if stabilized else None
    name = "tip pin" if copies == 1 else f"tip pin x{copies}"
    return dict(
        constraints=(Holonomic(phi=tip_constraint(copies), baumgarte=stab, name=name),),
        coordinate_names=tuple(f"theta{i}" for i in range(links)),
        constraint_rank=constraint_rank,
    )


def tree(links: int) -> multibody.Tree:
    """The chain as a :class:`ukjax.multibody.Tree`: ``links`` revolute joints about z, body i on body
    i - 1."""
    _check_links(links)
    return multibody.Tree.chain([multibody.revolute((0.0, 0.0, 1.0))] * links)


def bodies(p) -> multibody.Bodies:
    """The links as :class:`ukjax.multibody.Bodies`: body i's x axis along link i, its joint at the end of
    link i - 1 (the origin for i = 0), its mass centre at (l_i/2, 0, 0) and central inertia
    diag(0, m_i l_i²/12, m_i l_i²/12), read from ``p["length"]`` and ``p["mass"]``."""
    length, mass = p["length"], p["mass"]
    zero = jnp.zeros_like(length)
    previous = jnp.concatenate([jnp.zeros_like(length[:1]), length[:-1]])
    rod = mass * length**2 / 12.0
    return multibody.Bodies(
        offset=jnp.stack([previous, zero, zero], axis=1),
        mass=mass,
        com=jnp.stack([0.5 * length, zero, zero], axis=1),
        inertia=jnp.stack([zero, rod, rod], axis=1)[:, :, None] * jnp.eye(3, dtype=length.dtype),
    )


def _gravity(p):
    return jnp.stack([jnp.zeros_like(p["g"]), -p["g"], jnp.zeros_like(p["g"])])


def multibody_system(
    links: int, *, copies: int = 1, stabilized: bool = True, constraint_rank: int | None = None
) -> System:
    """The same chain, pin and parameters as :func:`system`, written as a kinematic tree, so that
    :meth:`ukjax.System.motion` applies M⁻¹ by the articulated-body algorithm (O(n) per column) instead of
    building M from the Lagrangian and factorizing it. The pin is the same constraint function (the tip by
    :func:`tip`; ``Tree.point`` gives the same point); the motion is the same as :func:`system`'s to
    round-off."""
    keywords = _pinned(links, copies, stabilized, constraint_rank)
    return tree(links).system(bodies, _gravity, applied_force=joint_damping, **keywords)
