"""Robots from MJCF and URDF files: one line from a robot description to a :class:`ukjax.System`.

``robot = ukjax.robots.load("ur5.urdf")`` reads the file with MuJoCo's compiler (``mujoco.MjModel``, an
optional dependency: ``pip install 'ukjax[robots]'``), which parses both formats, resolves MJCF defaults,
includes and ``childclass``, and computes inertias from geometry where a file gives none. The compiled
model is then mapped onto a :class:`ukjax.multibody.Tree` (Featherstone 2008 conventions) with every
inertial and placement number a leaf of the parameter pytree ``robot.params``, so ``jax.grad`` and sweeps
reach masses, centres of mass, inertias and joint placements:

* MuJoCo's body tree (``body_parentid``) in its order, parents before children; a body's frame sits at
  ``body_pos`` in its parent's frame, turned by ``body_quat``;
* each hinge (revolute) or slide (prismatic) joint becomes one joint of the tree, about/along ``jnt_axis``
  through ``jnt_pos`` (body frame): the tree's joint frame is placed at that anchor, so a revolute joint
  turns the body about the axis through it, as MuJoCo does;
* a body with several joints (MJCF allows it) becomes a chain of massless intermediate bodies, one per
  joint, in MuJoCo's order (each later joint's axis moves with the earlier ones);
* a body without joints (a URDF ``fixed`` joint, an MJCF body welded to its parent) is fused into the body
  it hangs from: its mass, centre of mass and inertia join that body's (composite rigid body: masses add,
  inertias are carried to the common centre of mass by the parallel-axis theorem, Featherstone 2008,
  eq. 2.63), and its frame stays reachable by name; bodies fused into the world carry nothing;
* ``body_mass``, ``body_ipos`` and the principal inertia ``body_inertia`` in the frame ``body_iquat``,
  rotated into the body frame (I = R diag(I_p) Rᵀ); gravity from ``opt.gravity``;
* joint damping (``dof_damping``, the viscous torque -b q̇) and armature (``dof_armature``, a rotor
  inertia added to M's diagonal), both parameters;
* joint ranges (``jnt_range`` where ``jnt_limited``; MuJoCo compiles MJCF angles given in degrees, the
  default of ``<compiler angle>``, and URDF ``<limit lower upper>`` to radians) as data,
  :attr:`Robot.joint_range`: they are not enforced, but :meth:`Robot.system` records those of hinge and
  slide joints on the System (``coordinate_ranges``) and :meth:`Robot.joint_range_violations` names every
  joint a simulated trajectory took out of its range (:func:`ukjax.diagnostics.range_violations`);
* MJCF ``<equality>`` ``connect`` (3 rows: a point of body 1 on a point of body 2), ``weld`` (6 rows:
  the relative pose fixed at MuJoCo's reference ``relpose``) and ``joint`` (q₁ = polynomial of q₂) as
  exact :class:`ukjax.Holonomic` constraints, not MuJoCo's soft constraints, optionally
  Baumgarte-stabilized: :meth:`Robot.equality_constraints`, included by :meth:`Robot.system` by default.

ukjax's coordinates are MuJoCo's ``qpos`` for hinge and slide joints (same order and sign), so states
carry over between the two. Contacts, actuators, tendons, joint limits (as forces: the ranges are data, see
above), friction loss and joint springs (stiffness: a warning names the joints) are not mapped;
joint references (``ref``, a nonzero ``qpos0``) are refused. Ball and free joints map onto
``ukjax.multibody.ball()``/``free()`` (quaternion coordinates, nq ≠ nv, MuJoCo's conventions).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import diagnostics, multibody
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.system import System

_EXTRA = "pip install 'ukjax[robots]'"
_DOFS = {0: 6, 1: 3, 2: 1, 3: 1}  # degrees of freedom of MuJoCo's free, ball, slide and hinge joints


def _mujoco():
    """The ``mujoco`` module, imported on first use (an optional dependency of ukjax)."""
    try:
        import mujoco
    except ImportError as error:  # pragma: no cover - mujoco is in the dev extra
        raise ImportError(
            f"ukjax.robots reads MJCF and URDF with MuJoCo's compiler; install it with {_EXTRA} "
            "(the 'robots' extra: mujoco>=4.0)"
        ) from error
    return mujoco


# ---------------------------------------------------------------------------------------------- geometry
def _quat_to_matrix(quat) -> np.ndarray:
    """Rotation matrix (NumPy) of a quaternion (w, x, y, z), MuJoCo's order, by
    :func:`ukjax.multibody.quaternion_rotation` (at load time)."""
    return np.asarray(multibody.quaternion_rotation(jnp.asarray(quat, dtype=float)))


class _Placement:
    """A frame fixed on tree body ``body`` (-1: the world): rotation R and origin p in that body's frame."""

    def __init__(self, body: int, R=None, p=None):
        self.body = body
        self.R = np.eye(3) if R is None else np.asarray(R, dtype=float)
        self.p = np.zeros(3) if p is None else np.asarray(p, dtype=float)

    def then(self, R, p) -> _Placement:
        """This frame moved by (R, p) given in its own coordinates."""
        return _Placement(self.body, self.R @ R, self.p + self.R @ p)

    def frozen(self) -> tuple:
        return (self.body, tuple(map(tuple, self.R.tolist())), tuple(self.p.tolist()))


def _composite(parts):
    """Mass, centre of mass and inertia about it (all in one frame) of rigid parts (m, c, I_c)."""
    mass = sum(m for m, _, _ in parts)
    if mass <= 0.0:
        return 0.0, np.zeros(3), sum((I for _, _, I in parts), np.zeros((3, 3)))
    com = sum(m * c for m, c, _ in parts) / mass
    inertia = np.zeros((3, 3))
    for m, c, I in parts:
        d = c - com
        inertia += I + m * (d @ d * np.eye(3) - np.outer(d, d))  # parallel axes (Featherstone eq. 2.63)
    return mass, com, inertia


# ---------------------------------------------------------------------------------------------- Robot
class Robot(eqx.Module):
    """A robot read from MJCF or URDF: its :class:`ukjax.multibody.Tree`, names and default parameters.

    Attributes:
        tree: the kinematic tree (one joint per coordinate, MuJoCo's joint order).
        params: default parameters, a dict of arrays: ``offset`` (n, 3), ``rotation`` (n, 3, 3), ``mass``
            (n,), ``com`` (n, 3), ``inertia`` (n, 3, 3) as in :class:`ukjax.multibody.Bodies`, ``gravity``
            (3,) (m/s²), ``damping`` (n,) (N m s/rad or N s/m) and ``armature`` (n,) (kg m² or kg).
        name: the model's name.
        body_names: the tree's bodies; a body with several joints gives intermediate bodies named
            ``"body:joint"`` for all but its last joint.
        joint_names: the joints, one per tree joint (:attr:`coordinate_names` names the velocity coordinates).
        joint_range: (lower, upper) of each joint (rad or m), ``(-inf, inf)`` where it has no limit (for a
            ball joint MuJoCo's (0, largest rotation angle), which :attr:`coordinate_ranges` leaves out).
        frame_names, site_names: the MuJoCo bodies (fused ones included) and sites reachable by
            :meth:`frame` and :meth:`point`.
    """

    tree: multibody.Tree
    params: dict
    name: str = eqx.field(static=True)
    body_names: tuple[str, ...] = eqx.field(static=True)
    joint_names: tuple[str, ...] = eqx.field(static=True)
    joint_range: tuple[tuple[float, float], ...] = eqx.field(static=True)
    _frames: tuple[tuple[str, tuple], ...] = eqx.field(static=True)
    _sites: tuple[tuple[str, tuple], ...] = eqx.field(static=True)
    _equalities: tuple[tuple, ...] = eqx.field(static=True)

    @property
    def coordinate_names(self) -> tuple[str, ...]:
        """One name per velocity coordinate (the system's ``coordinate_names``): a hinge or slide joint's
        name; ``"NAME:wx"`` ... for a ball joint's angular velocity (body frame) and ``"NAME:vx"`` ...
        ``"NAME:wz"`` for a free joint's linear (world frame) and angular velocity."""
        parts = {"ball": ("wx", "wy", "wz"), "free": ("vx", "vy", "vz", "wx", "wy", "wz")}
        return tuple(
            name
            for joint, joint_name in zip(self.tree.joints, self.joint_names, strict=True)
            for name in (
                [f"{joint_name}:{part}" for part in parts[joint.kind]]
                if joint.kind in parts
                else [joint_name]
            )
        )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model) -> Robot:
        """The robot of a compiled ``mujoco.MjModel`` (see the module docstring for the mapping)."""
        return _from_model(model)

    @property
    def n(self) -> int:
        return self.tree.n

    @property
    def coordinate_ranges(self) -> tuple[tuple[int, str, float, float], ...]:
        """``(index into q, joint name, lower, upper)`` of every limited hinge and slide joint: the ranges
        :meth:`system` records on the System and :meth:`joint_range_violations` checks (not enforced)."""
        ranges, index = [], 0
        for joint, name, (lower, upper) in zip(
            self.tree.joints, self.joint_names, self.joint_range, strict=True
        ):
            if joint.kind in ("revolute", "prismatic") and (np.isfinite(lower) or np.isfinite(upper)):
                ranges.append((index, name, lower, upper))
            index += joint.nq
        return tuple(ranges)

    def joint_range_violations(self, solution) -> list:
        """The joints of this robot that ``solution`` (single or batched, of a system of this robot) took
        out of the ranges stated in its file: one :class:`ukjax.diagnostics.RangeViolation` per joint and
        scenario, naming the joint, when it first left its range (interpolated between saved times) and by
        how much at most; empty when every joint stayed in range. See
        :func:`ukjax.diagnostics.range_violations`."""
        return diagnostics.range_violations(solution, self.coordinate_ranges)

    @property
    def frame_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._frames)

    @property
    def site_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._sites)

    # ------------------------------------------------------------------ dynamics
    def bodies(self, params) -> multibody.Bodies:
        """The tree's :class:`ukjax.multibody.Bodies` read from ``params`` (differentiable)."""
        return multibody.Bodies(
            offset=params["offset"],
            mass=params["mass"],
            com=params["com"],
            inertia=params["inertia"],
            rotation=params["rotation"],
        )

    @staticmethod
    def gravity(params):
        """Gravity (3,) in world coordinates, m/s²."""
        return params["gravity"]

    def system(
        self,
        *,
        applied_force: Callable[..., Any] | None = None,
        constraints: tuple = (),
        loops: bool = True,
        baumgarte: Baumgarte | None = None,
        **options,
    ) -> System:
        """The robot as a :class:`ukjax.System` (:meth:`ukjax.multibody.Tree.system`), coordinates named by
        the joints.

        Q = τ(q, q̇, t, p) - b q̇ - C(q, q̇): ``applied_force`` gives the joint forces τ (default none), b is
        ``params["damping"]`` (MuJoCo's joint damping) and C the bias force by RNEA. Where the loaded model
        has armature (``robot.params["armature"]`` not all zero), M is the tree's mass matrix plus
        ``diag(params["armature"])``, factorized by Cholesky; otherwise M is the tree's alone and M⁻¹ is
        applied by the articulated-body algorithm (O(n); with at least as many constraint rows as
        velocities, M by CRBA and a Cholesky instead: ``System._dense_mass_pays``), so an armature
        set in ``params`` for a model loaded without one is not used: add it to the file.

        The System carries the joint ranges as data (``coordinate_ranges``, :attr:`coordinate_ranges`); they
        are not enforced: check a solution with :meth:`joint_range_violations`.

        ``loops=True`` adds :meth:`equality_constraints` (the MJCF ``<equality>`` elements active at the
        start, stabilized by ``baumgarte`` if given) before ``constraints``, as one constraint of all their
        rows (:meth:`loop_constraint`: one forward-kinematics pass for all); the other ``options``
        (``servo_constraints``, ``actuation``, ``nonideal``, ``constraint_rank``) go to
        :meth:`ukjax.multibody.Tree.system`.
        """
        loop = self.loop_constraint(baumgarte) if loops else None
        loop_constraints = () if loop is None else (loop,)

        def force(q, qd, t, p):
            damping = p["damping"] * qd
            return -damping if applied_force is None else jnp.asarray(applied_force(q, qd, t, p)) - damping

        system = self.tree.system(
            self.bodies,
            self.gravity,
            applied_force=force,
            constraints=(*loop_constraints, *constraints),
            coordinate_names=self.coordinate_names,
            **options,
        )
        system = dataclasses.replace(system, coordinate_ranges=self.coordinate_ranges)
        if not np.any(np.asarray(self.params["armature"])):
            return system
        tree_mass, tree_kinetic = system.mass, system.kinetic

        def mass(q, t, p):
            return tree_mass(q, t, p) + jnp.diag(p["armature"])

        def kinetic(q, qd, t, p):
            return tree_kinetic(q, qd, t, p) + 0.5 * jnp.sum(p["armature"] * qd**2)

        return dataclasses.replace(system, mass=mass, kinetic=kinetic, mass_solve=None)

    # ------------------------------------------------------------------ frames
    def _placement(self, name: str) -> tuple:
        frames, sites = dict(self._frames), dict(self._sites)
        if name in frames and name in sites:
            raise ValueError(
                f"{name!r} names both a body and a site of {self.name!r}; rename one in the file"
            )
        if name in frames:
            return frames[name]
        if name in sites:
            return sites[name]
        raise ValueError(
            f"{self.name!r} has no body or site named {name!r}; bodies: {list(frames)}, sites: {list(sites)}"
        )

    def _poses(self, placements, q, params) -> list[tuple[jax.Array, jax.Array]]:
        """World (R, p) of frames fixed on tree bodies, from one forward-kinematics pass."""
        dtype = jnp.result_type(q, params["offset"])
        frames = None
        if any(body >= 0 for body, _, _ in placements):
            frames = self.tree.frames(q, self.bodies(params))
        poses = []
        for body, R_fixed, p_fixed in placements:
            R_fixed, p_fixed = jnp.asarray(R_fixed, dtype), jnp.asarray(p_fixed, dtype)
            if body < 0:
                poses.append((R_fixed, p_fixed))
            else:
                R, p = frames[0][body], frames[1][body]
                poses.append((R @ R_fixed, p + R @ p_fixed))
        return poses

    def frame(self, name: str) -> Callable[[Any, Any], tuple[jax.Array, jax.Array]]:
        """``pose(q, params) -> (R, p)``: the world orientation R (3, 3) (world = R frame coordinates) and
        origin p (3,) (m) of the body or site ``name`` (a MuJoCo body, fused or not, or a site)."""
        placement = self._placement(name)
        return lambda q, params: self._poses([placement], q, params)[0]

    def point(self, name: str, offset=(0.0, 0.0, 0.0)) -> Callable[[Any, Any], jax.Array]:
        """``position(q, params) -> (3,)``: world position (m) of the point with coordinates ``offset`` in the
        frame of body or site ``name``, e.g. for a task constraint
        ``Holonomic(lambda q, t, p: robot.point("wrist_3_link", [0, 0, 0.1])(q, p) - path(t))``."""
        placement = self._placement(name)
        local = np.asarray(offset, dtype=float)
        if local.shape != (3,) or not np.all(np.isfinite(local)):
            raise ValueError(f"point offset must be a finite 3-vector, got {offset!r}")

        def position(q, params):
            R, p = self._poses([placement], q, params)[0]
            return p + R @ jnp.asarray(local, p.dtype)

        return position

    # ------------------------------------------------------------------ equality constraints
    def equality_constraints(self, baumgarte: Baumgarte | None = None) -> tuple[Holonomic, ...]:
        """The MJCF ``<equality>`` elements active at the start, as exact holonomic constraints φ(q) = 0:

        * ``connect``: φ = x₁ - x₂ (3 rows), the world positions of the anchor on body 1 and its
          counterpart on body 2 (MuJoCo's ``eq_data``: the anchor in body 1's frame, the point of body 2
          that coincides with it in the compiled configuration), or of ``site1`` and ``site2``;
        * ``weld``: φ = (x₁ - x₂, ½ vee(E - Eᵀ)) (6 rows) with E = R₂ᵀ R₁ R_rel, the relative
          orientation against MuJoCo's reference ``relpose`` (R_rel; the skew part of E is sin θ times
          the axis of the orientation error θ), the positions as for ``connect`` with the anchor on body 2;
          for two sites, their frames coincide;
        * ``joint``: φ = q₁ - (c₀ + c₁ q₂ + … + c₄ q₂⁴) (1 row), or q₁ - c₀ without a second joint.

        ``baumgarte`` (optional, the same for all) stabilizes their drift, e.g.
        ``ukjax.Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))`` with the gains added to the params.
        """
        return tuple(self._equality(spec, baumgarte) for spec in self._equalities)

    def _equality(self, spec, baumgarte) -> Holonomic:
        return self._equalities_constraint((spec,), baumgarte, spec[1])

    def _equalities_constraint(self, specs, baumgarte, name) -> Holonomic:
        """The equality ``specs`` as one constraint: on a tree of revolute and prismatic joints with
        ``connect`` and ``joint`` equalities only, A and the velocity product from the tree's point
        kinematics (:class:`_PointEqualities`); by automatic differentiation of φ otherwise."""
        phi = self._equalities_phi(specs)
        if self.tree._one_dof and all(spec[0] in ("connect", "joint") for spec in specs):
            motion = self._equalities_motion(specs)
            return _PointEqualities(phi=phi, baumgarte=baumgarte, name=name, motion=motion)
        return Holonomic(phi=phi, baumgarte=baumgarte, name=name)

    def _equalities_motion(self, specs):
        """``motion(q, q̇, p) -> (φ, A, J̇q̇)`` of ``connect`` and ``joint`` equality ``specs`` (their rows as
        :meth:`_equalities_phi` stacks them): connect rows from :meth:`ukjax.multibody.Tree.point_motion`
        of both anchors (one pass for all), joint rows φ = q₁ - P(q₂) from the polynomial's derivatives."""
        points = []  # (body, anchor in the body frame) of every connect's two ends
        for spec in specs:
            if spec[0] == "connect":
                _, _, frame1, frame2, anchor1, anchor2, _ = spec
                for (body, R_fixed, p_fixed), anchor in ((frame1, anchor1), (frame2, anchor2)):
                    points.append((body, np.asarray(p_fixed) + np.asarray(R_fixed) @ np.asarray(anchor)))
        moving = [point for point in points if point[0] >= 0]
        n = self.tree.nv

        def motion(q, qd, p):
            dtype = jnp.result_type(q, qd, p["offset"])
            if moving:
                x, J, rate = self.tree.point_motion(q, qd, self.bodies(p), moving)
            found = iter(range(len(moving)))
            ends = []
            for body, local in points:  # a world-fixed anchor: constant, no Jacobian
                if body >= 0:
                    k = next(found)
                    ends.append((x[k], J[k], rate[k]))
                else:
                    ends.append((jnp.asarray(local, dtype), jnp.zeros((3, n), dtype), jnp.zeros(3, dtype)))
            ends = iter(ends)
            rows = []
            for spec in specs:
                if spec[0] == "connect":
                    (x1, J1, rate1), (x2, J2, rate2) = next(ends), next(ends)
                    rows.append((x1 - x2, J1 - J2, rate1 - rate2))
                    continue
                _, _, j1, j2, coefficients = spec
                row = jnp.zeros((1, n), dtype).at[0, j1].add(1.0)
                if j2 < 0:
                    rows.append((q[j1 : j1 + 1] - coefficients[0], row, jnp.zeros(1, dtype)))
                    continue
                s, sd = q[j2], qd[j2]
                value, slope, curvature = (_polynomial(coefficients, s, d) for d in range(3))
                rows.append((q[j1 : j1 + 1] - value, row.at[0, j2].add(-slope), -(curvature * sd**2)[None]))
            return tuple(jnp.concatenate(parts) for parts in zip(*rows, strict=True))

        return motion

    def loop_constraint(self, baumgarte: Baumgarte | None = None) -> Holonomic | None:
        """Every :meth:`equality_constraints` row in one constraint (their rows in the same order; None
        without equalities), whose φ places all their frames from one forward-kinematics pass, so that A =
        ∂φ/∂q and the velocity product b come from one differentiated pass instead of one per equality.
        :meth:`system` uses it. On a tree of hinges and slides its ``connect`` and ``joint`` rows take A and
        the velocity product from the tree's point kinematics (:class:`_PointEqualities`): Jansen's leg
        (three ``connect`` loops), RK4, 110 against 126 µs per step at 1024 scenarios and 541 against 667
        µs for one, the same trajectories (``benchmarks/jansen_speed.py``)."""
        if not self._equalities:
            return None
        names = ", ".join(spec[1] for spec in self._equalities)
        return self._equalities_constraint(self._equalities, baumgarte, f"equalities ({names})")

    def _equalities_phi(self, specs):
        """φ(q, t, p) of the equality ``specs`` stacked (the rows of :meth:`equality_constraints`), the frames
        of all of them placed by one :meth:`_poses` call."""
        frames = [frame for spec in specs if spec[0] != "joint" for frame in spec[2:4]]

        def phi(q, t, p):
            poses = iter(self._poses(frames, q, p))
            rows = []
            for spec in specs:
                kind = spec[0]
                if kind == "joint":
                    _, _, j1, j2, coefficients = spec
                    polynomial = coefficients[0] if j2 < 0 else _polynomial(coefficients, q[j2])
                    rows.append(q[j1 : j1 + 1] - polynomial)
                    continue
                _, _, _, _, anchor1, anchor2, relative = spec
                (R1, x1), (R2, x2) = next(poses), next(poses)
                position = x1 + R1 @ jnp.asarray(anchor1, x1.dtype) - x2 - R2 @ jnp.asarray(anchor2, x2.dtype)
                if kind == "connect":
                    rows.append(position)
                    continue
                E = R2.T @ R1 @ jnp.asarray(relative, R1.dtype)
                rows += [position, 0.5 * jnp.stack([E[2, 1] - E[1, 2], E[0, 2] - E[2, 0], E[1, 0] - E[0, 1]])]
            return jnp.concatenate(rows)

        return phi


def _polynomial(coefficients, s, derivative: int = 0):
    """The ``derivative``-th derivative of P(s) = Σ c_k s^k (a ``joint`` equality's polynomial)."""
    total = 0.0
    for k, c in enumerate(coefficients):
        if k >= derivative:
            total = total + math.perm(k, derivative) * c * s ** (k - derivative)
    return total


class _PointEqualities(Holonomic):
    """Equality rows φ(q) = 0 of a tree of revolute and prismatic joints whose A = ∂φ/∂q and velocity
    product φ̈|q̈=0 come from ``motion(q, q̇, p) -> (φ, A, J̇q̇)`` (:meth:`Robot._equalities_motion`: the tree's
    point kinematics in one pass) instead of automatic differentiation of ``phi`` (which it equals, and which
    a chart on a configuration manifold still differentiates): seed 002 Case I, b = -J̇q̇ - stabilization."""

    motion: Callable[..., Any] = eqx.field(static=True, default=None)

    def velocity(self, q, qd, t, p, retract=None):
        if retract is not None:
            return super().velocity(q, qd, t, p, retract)
        return self.motion(q, qd, p)[1] @ qd

    def second_order(self, q, qd, t, p, retract=None):
        if retract is not None:
            return super().second_order(q, qd, t, p, retract)
        phi, A, rate = self.motion(q, qd, p)
        b = -rate
        if self.baumgarte is not None:
            b = b - self.baumgarte.feedback(phi, A @ qd, p)
        return A, b


# ---------------------------------------------------------------------------------------------- loading
def load(source) -> Robot:
    """The :class:`Robot` of an MJCF or URDF file (a path) or XML text (a string that starts with ``<``).

    MJCF files are compiled from their path, so includes, meshes and assets resolve relative to the file.
    URDF is read as text: its ``<visual>`` and ``<collision>`` elements are removed (meshes behind
    ``package://`` paths are not needed for the dynamics) and MuJoCo's ``fusestatic`` is turned off, so
    every link stays reachable by name (ukjax fuses links on fixed joints itself).
    """
    mujoco = _mujoco()
    text = source.strip() if isinstance(source, str) and source.lstrip().startswith("<") else None
    path = None
    if text is None:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no robot description file at {str(path)!r}")
        text = path.read_text()
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise ValueError(f"{path or 'the XML text'} is not well-formed XML: {error}") from error
    try:
        if root.tag == "robot":
            model = mujoco.MjModel.from_xml_string(_urdf_for_mujoco(root))
        elif root.tag == "mujoco":
            model = mujoco.MjModel.from_xml_path(str(path)) if path else mujoco.MjModel.from_xml_string(text)
        else:
            raise ValueError(f"expected an MJCF (<mujoco>) or URDF (<robot>) document, found <{root.tag}>")
    except ValueError as error:
        if "expected an MJCF" in str(error):
            raise
        raise ValueError(f"MuJoCo could not compile {path or 'the XML text'}: {error}") from error
    return _from_model(model)


def _urdf_for_mujoco(root: ET.Element) -> str:
    """URDF text without visual/collision elements and with ``fusestatic="false"`` for MuJoCo."""
    for link in root.iter("link"):
        for child in [c for c in link if c.tag in ("visual", "collision")]:
            link.remove(child)
    extension = root.find("mujoco")
    if extension is None:
        extension = ET.SubElement(root, "mujoco")
    compiler = extension.find("compiler")
    if compiler is None:
        compiler = ET.SubElement(extension, "compiler")
    compiler.set("fusestatic", "false")
    compiler.set("discardvisual", "true")
    return ET.tostring(root, encoding="unicode")


def _names(model, kind, count: int, fallback: str) -> list[str]:
    mujoco = _mujoco()
    return [mujoco.mj_id2name(model, kind, i) or f"{fallback}{i}" for i in range(count)]


def _tree_joint(jtype: int, axis, name: str):
    """The ukjax joint of a MuJoCo joint type: hinge, slide, ball or free (MuJoCo's qpos/qvel conventions)."""
    mujoco = _mujoco()
    if jtype == mujoco.mjtJoint.mjJNT_HINGE:
        return multibody.revolute(axis)
    if jtype == mujoco.mjtJoint.mjJNT_SLIDE:
        return multibody.prismatic(axis)
    return multibody.ball() if jtype == mujoco.mjtJoint.mjJNT_BALL else multibody.free()


def _from_model(model) -> Robot:
    mujoco = _mujoco()
    obj = mujoco.mjtObj
    body_names = _names(model, obj.mjOBJ_BODY, model.nbody, "body")
    joint_names = _names(model, obj.mjOBJ_JOINT, model.njnt, "joint")
    site_names = _names(model, obj.mjOBJ_SITE, model.nsite, "site")
    model_name = bytes(model.names).split(b"\0", 1)[0].decode() or "robot"  # the model's name comes first
    if model.njnt == 0:
        raise ValueError("the model has no joints: nothing moves")
    one_dof = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    nonzero_reference = [
        joint_names[j]
        for j in range(model.njnt)
        if int(model.jnt_type[j]) in one_dof and model.qpos0[model.jnt_qposadr[j]] != 0.0
    ]
    if nonzero_reference:
        raise NotImplementedError(
            f"joints {nonzero_reference} have a reference position (ref, qpos0 != 0); ukjax's coordinates "
            "are measured from the compiled configuration: remove ref from the file"
        )
    springs = [joint_names[j] for j in range(model.njnt) if model.jnt_stiffness[j] != 0.0]
    if springs:
        warnings.warn(
            f"joints {springs} have springs (stiffness), which ukjax.robots does not map: the loaded system "
            "has no spring force; add -k (q - q_ref) through Robot.system(applied_force=...)",
            stacklevel=3,
        )

    placements = [_Placement(-1)]  # every MuJoCo body's frame on a tree body (the world: -1)
    parents, joints, names, ranges = [], [], [], []
    offsets, rotations, damping, armature, joint_ids = [], [], [], [], []
    parts: list[list] = []  # rigid parts (mass, com, inertia) of each tree body, in its frame
    for b in range(1, model.nbody):
        frame = placements[model.body_parentid[b]].then(
            _quat_to_matrix(model.body_quat[b]), model.body_pos[b]
        )
        for k in range(model.body_jntnum[b]):
            j = model.body_jntadr[b] + k
            dof = model.jnt_dofadr[j]
            anchor = frame.then(np.eye(3), model.jnt_pos[j])
            if int(model.jnt_type[j]) == mujoco.mjtJoint.mjJNT_FREE:  # qpos is the body's world pose itself
                anchor = _Placement(-1)
            parents.append(anchor.body)
            joints.append(_tree_joint(int(model.jnt_type[j]), model.jnt_axis[j], joint_names[j]))
            offsets.append(anchor.p)
            rotations.append(anchor.R.T)  # joint coordinates = E_T parent coordinates
            dofs = range(dof, dof + _DOFS[int(model.jnt_type[j])])  # per degree of freedom, as MuJoCo's
            damping.extend(float(model.dof_damping[d]) for d in dofs)
            armature.extend(float(model.dof_armature[d]) for d in dofs)
            limited = bool(model.jnt_limited[j])
            ranges.append(tuple(float(x) for x in model.jnt_range[j]) if limited else (-np.inf, np.inf))
            last = k == model.body_jntnum[b] - 1
            names.append(body_names[b] if last else f"{body_names[b]}:{joint_names[j]}")
            joint_ids.append(j)
            parts.append([])
            frame = _Placement(len(joints) - 1, p=-np.asarray(model.jnt_pos[j], dtype=float))
        placements.append(frame)
        if frame.body >= 0 and model.body_mass[b] > 0.0:
            R_inertial = frame.R @ _quat_to_matrix(model.body_iquat[b])
            parts[frame.body].append(
                (
                    float(model.body_mass[b]),
                    frame.p + frame.R @ model.body_ipos[b],
                    R_inertial @ np.diag(model.body_inertia[b]) @ R_inertial.T,
                )
            )
    composites = [_composite(p) for p in parts]
    params = {
        "offset": jnp.asarray(np.stack(offsets)),
        "rotation": jnp.asarray(np.stack(rotations)),
        "mass": jnp.asarray([m for m, _, _ in composites]),
        "com": jnp.asarray(np.stack([c for _, c, _ in composites])),
        "inertia": jnp.asarray(np.stack([I for _, _, I in composites])),
        "gravity": jnp.asarray(np.array(model.opt.gravity, dtype=float)),
        "damping": jnp.asarray(damping),
        "armature": jnp.asarray(armature),
    }
    frames = tuple((body_names[b], placements[b].frozen()) for b in range(model.nbody))
    sites = tuple(
        (
            site_names[s],
            placements[model.site_bodyid[s]]
            .then(_quat_to_matrix(model.site_quat[s]), model.site_pos[s])
            .frozen(),
        )
        for s in range(model.nsite)
    )
    equalities = _equalities(model, placements, joint_ids, joint_names, site_names)
    return Robot(
        tree=multibody.Tree(parents=tuple(parents), joints=tuple(joints)),
        params=params,
        name=model_name,
        body_names=tuple(names),
        joint_names=tuple(joint_names[j] for j in joint_ids),
        joint_range=tuple(ranges),
        _frames=frames,
        _sites=sites,
        _equalities=equalities,
    )


def _equalities(model, placements, joint_ids, joint_names, site_names) -> tuple[tuple, ...]:
    """Static descriptions of the active equality constraints (see :meth:`Robot.equality_constraints`)."""
    mujoco = _mujoco()
    eq, obj = mujoco.mjtEq, mujoco.mjtObj
    coordinate = {j: i for i, j in enumerate(joint_ids)}
    identity = tuple(map(tuple, np.eye(3).tolist()))
    out = []
    for e in range(model.neq):
        if not model.eq_active0[e]:
            continue
        kind, data = int(model.eq_type[e]), np.asarray(model.eq_data[e], dtype=float)
        label = mujoco.mj_id2name(model, obj.mjOBJ_EQUALITY, e) or f"equality{e}"
        id1, id2 = int(model.eq_obj1id[e]), int(model.eq_obj2id[e])
        if kind == eq.mjEQ_JOINT:
            out.append(
                (
                    "joint",
                    label,
                    coordinate[id1],
                    coordinate[id2] if id2 >= 0 else -1,
                    tuple(float(c) for c in data[:5]),
                )
            )
            continue
        if kind not in (eq.mjEQ_CONNECT, eq.mjEQ_WELD):
            raise NotImplementedError(
                f"equality {label!r}: only connect, weld and joint equalities are mapped (type {kind})"
            )
        if model.eq_objtype[e] == obj.mjOBJ_SITE:
            frames = [
                placements[model.site_bodyid[s]].then(_quat_to_matrix(model.site_quat[s]), model.site_pos[s])
                for s in (id1, id2)
            ]
            anchors, relative = (np.zeros(3), np.zeros(3)), np.eye(3)
        else:
            frames = [placements[id1], placements[id2]]
            if kind == eq.mjEQ_CONNECT:
                anchors, relative = (data[0:3], data[3:6]), np.eye(3)
            else:
                anchors, relative = (data[3:6], data[0:3]), _quat_to_matrix(data[6:10])
        out.append(
            (
                "connect" if kind == eq.mjEQ_CONNECT else "weld",
                label,
                frames[0].frozen(),
                frames[1].frozen(),
                tuple(anchors[0].tolist()),
                tuple(anchors[1].tolist()),
                identity if kind == eq.mjEQ_CONNECT else tuple(map(tuple, relative.tolist())),
            )
        )
    return tuple(out)
