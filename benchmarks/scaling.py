"""Scaling with the system's size: ukjax vs a naive JAX implementation vs MuJoCo, on pinned chains of k links.

The family (``ukjax.models.chain``): a planar chain of k uniform links (0.25 m, 0.25 kg each) in joint
coordinates (n = k), its tip pinned to a fixed point (m = 2 rows), gravity along -y, Baumgarte
φ̈ + 2αφ̇ + β²φ = 0 with α = β = 10 1/s; consistent initial states (the half-circle configuration, joint rates
in the null space of the tip Jacobian, 0.5 rad/s spread). The redundantly constrained family pins the tip k
times (copy j written in a frame turned by πj/k), m = 2k = 2n rows of rank 2, consistent, so the motion is
the same as with one pin.

Contenders, interleaved in one process (each round runs every contender once; medians over rounds), the same
scenarios, span and fixed step:

(a) ``ukjax``: :func:`ukjax.simulate_batch` on ``chain.system(k)`` (M and Q from the Lagrangian by autodiff,
    M factorized) with the diffrax solvers Tsit5 (5th order, 6 evaluations per step), Bosh3 (3rd order, 3),
    Heun (2nd order, 2) and :class:`ukjax.RK4` (the classical 4th-order Runge-Kutta method, 4 evaluations,
    the same method as MuJoCo's RK4), the default UK method.
(a') ``ukjax_tree``: the same chain, pin and parameters as a kinematic tree, ``chain.multibody_system(k)``:
    Q by the recursive Newton-Euler algorithm and M⁻¹[Q, Aᵀ] by the articulated-body algorithm (Featherstone
    2008, Tables 5.1 and 7.1), O(n m) per right-hand side instead of O(n³); same solvers, scenarios, span.
(a'') ``ukjax_tree_rank`` (redundant family only): the tree model with the rank of its 2n rows declared,
    ``chain.multibody_system(k, copies=k, constraint_rank=2)`` (:attr:`ukjax.System.constraint_rank`): the
    rows are compressed to 2 by a column-pivoted QR before the solve; solvers ``--rank-solvers``.
(b) ``naive``: written here independently: the chain's Lagrangian in ``jax.numpy``, M = ``jax.hessian`` of T,
    Q = ∂L/∂q - (∂²L/∂q̇∂q) q̇ by ``jax.grad``/``jax.jacfwd``, A = ``jax.jacfwd`` of φ,
    b = -(∂(Aq̇)/∂q) q̇ - 2αφ̇ - β²φ, and q̈ = M⁻¹Q + M⁻¹Aᵀ pinv(A M⁻¹Aᵀ)(b - A M⁻¹Q) with
    ``jnp.linalg.inv`` and ``jnp.linalg.pinv``;
    ``jit(vmap)`` of a ``lax.scan`` loop of explicit Runge-Kutta steps (classic RK4, 4 evaluations, or
    diffrax's Tsit5 tableau).
(c) ``mujoco``: ``mujoco.rollout`` of an MJCF chain of k hinge joints with the same masses and inertias, a
    ``connect`` equality between a tip site and a world site (k of them for the redundant family), MuJoCo's
    default soft-constraint parameters, contacts off, integrators RK4 and Euler, one thread (the JAX
    contenders use the 2 cores as XLA sees fit: the CPU seconds are recorded beside the wall time).

Cost cap. A contender whose estimated full run (scenarios × span) exceeds ``--budget-s`` wall seconds runs a
shorter span on the same scenarios: each contender is compiled once with the number of steps as a run-time
argument, timed on ``--probe-steps`` steps (after one untimed first call), and then runs
min(all steps, budget / estimated cost of one step of the batch) steps in every round. The per-step cost
per scenario is what is compared (same batch, so the same vectorization); the JSON records each contender's
scenarios, steps and span, and its |φ| is at the end of its own span (marked in the table). The naive
contender is skipped where m > ``--naive-max-rows`` (the redundant family at n = 32, m = 64: it hung, with
no result, in an earlier run); the JSON says so.

Reported per size and family: cost per step per scenario (µs, median wall time / (steps × scenarios)), compile
time, CPU seconds per wall second, the largest tip error |φ| = |r_tip - p_tip| (m) over the batch at the end
of the span (MuJoCo: from the tip site), scenarios whose ukjax status is not success, and the ratios
naive/ukjax and MuJoCo/ukjax of the per-step cost (above 1: ukjax is faster; like for like: the same tableau,
RK4 against MuJoCo's RK4). Also (``--model-sizes``) the cost of building M and Q from the Lagrangian (old:
separate passes; new: one linearization), of A and b, and of the UK solve; and for the tree, Q by RNEA and
A, b against the articulated-body solve.

    python3 benchmarks/scaling.py --quick            # k = 2, 4, few scenarios: a minute or two
    python3 benchmarks/scaling.py                    # k = 2 ... 32, 256 scenarios, 5 s: long on 2 cores
    python3 benchmarks/scaling.py --ukjax-only       # re-measure ukjax alone (e.g. after a change)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import dynamics
from ukjax.models import chain

ukjax.enable_float64()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RunMeter, cpu_seconds, write_results  # noqa: E402
from throughput import machine_tag, source_state  # noqa: E402

UKJAX_SOLVERS = {"tsit5": diffrax.Tsit5, "bosh3": diffrax.Bosh3, "heun": diffrax.Heun, "rk4": ukjax.RK4}
FAMILIES = ("pinned", "redundant")


def copies_of(family: str, links: int) -> int:
    """How many times the tip is pinned: once, or k times (m = 2k = 2n) for the redundant family."""
    return 1 if family == "pinned" else links


# ------------------------------------------------------------------------------ (b) the naive implementation
def naive_lagrangian(q, qd, p):
    """L = T - V of the chain, written out: absolute angles φ = cumsum(q), mass-centre velocities
    ċ_i = Σ_{j<i} l_j φ̇_j u⊥(φ_j) + (l_i/2) φ̇_i u⊥(φ_i), rod inertias m l²/12."""
    length, mass = p["length"], p["mass"]
    phi, phid = jnp.cumsum(q), jnp.cumsum(qd)
    cos, sin = jnp.cos(phi), jnp.sin(phi)
    before_y = jnp.cumsum(length * sin) - length * sin  # joint i height
    cy = before_y + 0.5 * length * sin
    vx_joint = jnp.cumsum(-length * phid * sin) + length * phid * sin
    vy_joint = jnp.cumsum(length * phid * cos) - length * phid * cos
    vx = vx_joint - 0.5 * length * phid * sin
    vy = vy_joint + 0.5 * length * phid * cos
    T = 0.5 * jnp.sum(mass * (vx**2 + vy**2)) + 0.5 * jnp.sum(mass * length**2 / 12.0 * phid**2)
    V = p["g"] * jnp.sum(mass * cy)
    return T, V


def naive_constraint(q, p, frames):
    phi = jnp.cumsum(q)
    tip = jnp.stack([jnp.sum(p["length"] * jnp.cos(phi)), jnp.sum(p["length"] * jnp.sin(phi))])
    return frames @ (tip - p["tip"])


def naive_acceleration(q, qd, p, frames):
    """q̈ = M⁻¹Q + M⁻¹Aᵀ pinv(A M⁻¹Aᵀ)(b - A M⁻¹Q), every term by plain autodiff and jnp.linalg."""
    T = lambda q_, qd_: naive_lagrangian(q_, qd_, p)[0]
    L = lambda q_, qd_: (lambda TV: TV[0] - TV[1])(naive_lagrangian(q_, qd_, p))
    M = jax.hessian(T, argnums=1)(q, qd)
    mixed = jax.jacfwd(jax.grad(L, argnums=1), argnums=0)(q, qd)
    Q = jax.grad(L, argnums=0)(q, qd) - mixed @ qd - p["damping"] * qd
    phi = lambda q_: naive_constraint(q_, p, frames)
    A = jax.jacfwd(phi)(q)
    convective = jax.jacfwd(lambda q_: jax.jacfwd(phi)(q_) @ qd)(q) @ qd
    b = -convective - 2.0 * p["alpha"] * (A @ qd) - p["beta"] ** 2 * phi(q)
    M_inv = jnp.linalg.inv(M)
    a = M_inv @ Q
    return a + M_inv @ A.T @ jnp.linalg.pinv(A @ M_inv @ A.T) @ (b - A @ a)


RK4 = {"c": [0.5, 0.5, 1.0], "a": [[0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], "b": [1 / 6, 1 / 3, 1 / 3, 1 / 6]}


def tableau(name: str) -> dict:
    if name == "rk4":
        return RK4
    tab = diffrax.Tsit5.tableau
    return {
        "c": [float(c) for c in tab.c],
        "a": [[float(x) for x in row] for row in tab.a_lower],
        "b": [float(x) for x in tab.b_sol],
    }


def erk_step(f, t, q, qd, dt, tab):
    """One explicit Runge-Kutta step of q̇ = v, v̇ = f(t, q, v) (every stage evaluated, no FSAL reuse)."""
    ks = [(qd, f(t, q, qd))]
    for c, row in zip(tab["c"], tab["a"], strict=True):
        yq = q + dt * sum(a * kq for a, (kq, _) in zip(row, ks, strict=False) if a)
        yv = qd + dt * sum(a * kv for a, (_, kv) in zip(row, ks, strict=False) if a)
        ks.append((yv, f(t + c * dt, yq, yv)))
    q = q + dt * sum(b * kq for b, (kq, _) in zip(tab["b"], ks, strict=True) if b)
    qd = qd + dt * sum(b * kv for b, (_, kv) in zip(tab["b"], ks, strict=True) if b)
    return q, qd


def naive_batch(q0, qd0, p, frames, steps, *, dt, tab):
    """The batch after ``steps`` fixed steps (a run-time integer: one compiled program for every span)."""
    f = lambda t, q, qd: naive_acceleration(q, qd, p, frames)

    def one(q, qd):
        def body(step, carry):
            return erk_step(f, step * dt, *carry, dt, tab)

        return jax.lax.fori_loop(0, steps, body, (q, qd))[0]

    return jax.vmap(one)(q0, qd0)


def frames_of(copies: int) -> np.ndarray:
    rot = lambda a: np.asarray([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    return np.concatenate([rot(math.pi * j / copies) for j in range(copies)])


# ------------------------------------------------------------------------------------------------ (c) MuJoCo
def mjcf(params, copies: int, dt: float, integrator: str) -> str:
    """The chain in MJCF: nested bodies with z hinges, explicit inertials (rod: m l²/12 about y and z), a tip
    site, a world site at the pin and ``copies`` connect equalities between them; gravity along -y."""
    length = np.asarray(params["length"])
    mass = np.asarray(params["mass"])
    damping = float(params["damping"])
    tx, ty = (float(x) for x in np.asarray(params["tip"]))
    body = ""
    for i in reversed(range(len(length))):
        l, m = float(length[i]), float(mass[i])
        inertia = m * l * l / 12.0
        pos = "0 0 0" if i == 0 else f"{float(length[i - 1])!r} 0 0"
        tip = f'<site name="tip" pos="{l!r} 0 0"/>' if i == len(length) - 1 else ""
        body = (
            f'<body name="link{i}" pos="{pos}"><joint name="j{i}" type="hinge" axis="0 0 1" '
            f'damping="{damping!r}"/><inertial pos="{l / 2!r} 0 0" mass="{m!r}" '
            f'diaginertia="{inertia * 1e-6!r} {inertia!r} {inertia!r}"/>{tip}{body}</body>'
        )
    equality = "".join('<connect site1="tip" site2="target"/>' for _ in range(copies))
    return (
        f'<mujoco model="chain"><option timestep="{dt!r}" integrator="{integrator}" '
        f'gravity="0 {-float(params["g"])!r} 0"><flag contact="disable"/></option>'
        f'<worldbody><site name="target" pos="{tx!r} {ty!r} 0"/>{body}</worldbody>'
        f"<equality>{equality}</equality></mujoco>"
    )


class MujocoRollout:
    """``mujoco.rollout`` of a compiled model from a batch of initial states (qpos, qvel) with ``threads``
    MjData (one thread each); ``control`` (optional, (batch, 1, nu)): each scenario's actuator inputs, held
    over the span. :meth:`run` returns the full physics state after the steps."""

    def __init__(self, model, q0s, qd0s, steps, threads, compile_s=0.0, *, control=None):
        import mujoco
        from mujoco import rollout

        self.mujoco, self.rollout = mujoco, rollout
        self.model, self.compile_s, self.control = model, compile_s, control
        self.datas = [mujoco.MjData(self.model) for _ in range(threads)]
        self.spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        size = mujoco.mj_stateSize(self.model, self.spec)
        data = self.datas[0]
        self.initial = np.empty((len(q0s), size))
        for i, (q, qd) in enumerate(zip(np.asarray(q0s), np.asarray(qd0s), strict=True)):
            mujoco.mj_resetData(self.model, data)
            data.qpos[:], data.qvel[:] = q, qd
            mujoco.mj_getState(self.model, data, self.initial[i], self.spec)
        self.steps = steps
        self.out = np.empty((len(q0s), steps, size))

    def run(self, steps):
        if steps != self.out.shape[1]:
            self.out = np.empty((len(self.initial), steps, self.out.shape[2]))
        self.rollout.rollout(
            self.model, self.datas, self.initial, self.control, nstep=steps, state=self.out
        )
        return self.out[:, -1]

    def positions(self, states):
        """qpos (batch, nq) of full physics states (as :meth:`run` returns them)."""
        data = self.datas[0]
        qs = []
        for state in states:
            self.mujoco.mj_setState(self.model, data, state, self.spec)
            qs.append(data.qpos.copy())
        return np.stack(qs)


class MujocoChain(MujocoRollout):
    """``mujoco.rollout`` of the chain from a batch of initial states; final joint angles and tip errors."""

    def __init__(self, params, copies, dt, integrator, q0s, qd0s, steps, threads):
        import mujoco

        start = time.perf_counter()
        model = mujoco.MjModel.from_xml_string(mjcf(params, copies, dt, integrator))
        super().__init__(model, q0s, qd0s, steps, threads, time.perf_counter() - start)

    def final(self, states):
        """(final q (batch, k), tip error |r_tip - p_tip| (batch,) from the tip and target sites)."""
        mj, data = self.mujoco, self.datas[0]
        qs, errors = [], []
        tip, target = (mj.mj_name2id(self.model, mj.mjtObj.mjOBJ_SITE, s) for s in ("tip", "target"))
        for state in states:
            mj.mj_setState(self.model, data, state, self.spec)
            mj.mj_kinematics(self.model, data)
            qs.append(data.qpos.copy())
            errors.append(np.linalg.norm(data.site_xpos[tip] - data.site_xpos[target]))
        return np.stack(qs), np.asarray(errors)

    def accelerations(self, q, qd, *, constrained: bool):
        """MuJoCo's q̈ at one state (constraints on or off): checks that the MJCF is the same chain."""
        mj = self.mujoco
        model, data = self.model, self.mujoco.MjData(self.model)
        saved = model.opt.disableflags
        if not constrained:
            model.opt.disableflags |= int(mj.mjtDisableBit.mjDSBL_EQUALITY)
        data.qpos[:], data.qvel[:] = np.asarray(q), np.asarray(qd)
        mj.mj_forward(model, data)
        model.opt.disableflags = saved
        return data.qacc.copy()


# ------------------------------------------------------------------------------------------------ (a) ukjax
def ukjax_batch(system, solver, q0, qd0, p, steps, *, dt, max_steps, batch_params=False):
    """The batch after ``steps`` fixed steps (t1 = steps dt at run time; at most ``max_steps``);
    ``batch_params`` as in :func:`ukjax.simulate_batch`."""
    t1 = jnp.asarray(steps, q0.dtype) * dt
    sol = ukjax.simulate_batch(
        system, q0, qd0, p, t1=t1, ts=t1[None], dt=dt, solver=solver(), max_steps=max_steps,
        batch_params=batch_params,
    )
    return sol.q[:, -1], sol.status


def split_contenders(system, solver, q0, qd0, p, *, dt, max_steps, batch_params=False) -> dict:
    """``{"ukjax_rk4_<D>devices": (run, seconds of its first call)}`` in a process of D > 1 devices
    (``ukjax.use_cpu_cores``), else ``{}``: ``run(k)`` is :func:`ukjax_batch` with ``simulate_batch`` called
    as users call it, not inside a ``jit``, so that it splits the batch over the devices. The untimed first
    call of :func:`cap_steps` asks one step; a span holds at least two."""
    devices = len(jax.devices())
    if devices == 1:
        return {}

    def run(k):
        t1 = max(k, 2) * dt
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=dt, solver=solver(),
                                   max_steps=max_steps, batch_params=batch_params)  # fmt: skip
        return sol.q[:, -1], sol.status

    start = time.perf_counter()
    jax.block_until_ready(run(2))
    return {f"ukjax_{solver.__name__.lower()}_{devices}devices": (run, time.perf_counter() - start)}


# ----------------------------------------------------------------------------------------------- measuring
def compile_jit(fn, *args):
    """(compiled, seconds to trace and compile)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def tip_errors(q, params):
    return np.asarray(jax.vmap(lambda qi: jnp.linalg.norm(chain.tip(qi, params) - params["tip"]))(q))


def model_checks(system, tree_system, params, frames, q, qd, mujoco_chain):
    """Relative q̈ differences at the first scenario's initial state: naive vs ukjax and vs the tree; the tree
    vs ukjax (the same chain: ~1e-9 or better); MuJoCo unconstrained vs ukjax and the tree unconstrained (the
    same chain: ~1e-15) and constrained (MuJoCo's soft constraint: a few %)."""
    qdd = np.asarray(system.acceleration(q, qd, 0.0, params))
    qdd_tree = np.asarray(tree_system.acceleration(q, qd, 0.0, params))
    # relative to max(|q̈|, 1 rad/s²): at k = 2 the pinned chain is a rigid triangle at rest and q̈ = 0
    rel = lambda x, ref: float(np.max(np.abs(np.asarray(x) - ref)) / max(np.max(np.abs(ref)), 1.0))
    naive = naive_acceleration(q, qd, params, jnp.asarray(frames))
    out = {
        "naive_vs_ukjax": rel(naive, qdd),
        "naive_vs_tree": rel(naive, qdd_tree),
        "tree_vs_ukjax": rel(qdd_tree, qdd),
    }
    if mujoco_chain is not None:
        free = lambda sys_: np.asarray(
            dataclasses.replace(sys_, constraints=()).acceleration(q, qd, 0.0, params)
        )
        mj_free = mujoco_chain.accelerations(q, qd, constrained=False)
        mj = mujoco_chain.accelerations(q, qd, constrained=True)
        out["mujoco_unconstrained_vs_ukjax"] = rel(mj_free, free(system))
        out["mujoco_unconstrained_vs_tree"] = rel(mj_free, free(tree_system))
        out["mujoco_constrained_vs_ukjax"] = rel(mj, qdd)
        out["mujoco_constrained_vs_tree"] = rel(mj, qdd_tree)
    return out


def cap_steps(run, steps, scenarios, args):
    """(steps to run, estimated seconds of the full run): one untimed first call of one step, then
    ``--probe-steps`` steps timed; the full span if its estimate fits ``--budget-s``, else as many steps as
    fit (at least the probe's)."""
    jax.block_until_ready(run(1))  # the first call of a program is slower
    probe = min(args.probe_steps, steps)
    start = time.perf_counter()
    jax.block_until_ready(run(probe))
    per_step = (time.perf_counter() - start) / probe
    estimate = per_step * steps
    if estimate <= args.budget_s:
        return steps, estimate
    return max(probe, int(args.budget_s / per_step)), estimate


def interleaved_row(walls, cpus, ran: int, planned_steps: int, count: int, compile_s) -> dict:
    """One contender's row from :func:`run_interleaved`: microseconds per step per scenario (median wall and
    mean CPU time over ``ran`` steps of ``count`` scenarios), its compile time and whether its steps were
    capped below ``planned_steps``."""
    wall = statistics.median(walls)
    return {
        "us_per_step_per_scenario": wall / (ran * count) * 1e6,
        "cpu_us_per_step_per_scenario": statistics.mean(cpus) / (ran * count) * 1e6,
        "compile_s": compile_s,
        "median_wall_s": wall,
        "walls_s": walls,
        "cpu_per_wall": sum(cpus) / sum(walls),
        "steps": ran,
        "capped": ran < planned_steps,
    }


def run_interleaved(contenders, planned, rounds, progress, label):
    """Each round runs every contender once, in order, for its planned steps (``planned[name][0]``, as
    :func:`cap_steps` returns): (wall seconds and CPU seconds per name and round, each one's last output)."""
    walls = {name: [] for name in contenders}
    cpus = {name: [] for name in contenders}
    finals = {}
    for r in range(rounds):
        for name, (run, _) in contenders.items():
            wall, cpu = time.perf_counter(), cpu_seconds()
            finals[name] = jax.block_until_ready(run(planned[name][0]))
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(cpu_seconds() - cpu)
            progress(f"{label} round {r + 1}/{rounds}: {name} {walls[name][-1]:.2f} s")
    return walls, cpus, finals


def measure_size(links, family, args, progress):
    copies = copies_of(family, links)
    params = chain.default_params(links)
    models = {
        "ukjax": chain.system(links, copies=copies),
        "ukjax_tree": chain.multibody_system(links, copies=copies),
        "ukjax_tree_rank": chain.multibody_system(links, copies=copies, constraint_rank=2),
    }
    q0s, qd0s = chain.scenarios(params, args.scenarios, speed=args.speed, seed=args.seed)
    steps = int(round(args.span / args.dt))
    frames = jnp.asarray(frames_of(copies))
    m = 2 * copies
    contenders = {}  # name -> (run(steps) -> (final q, status or None), compile_s)
    skipped = {}
    rank_solvers = args.rank_solvers if copies > 1 else []  # one pin: m = 2 rows, nothing to compress
    for model, solvers in (
        ("ukjax", args.ukjax_solvers),
        ("ukjax_tree", args.tree_solvers),
        ("ukjax_tree_rank", rank_solvers),
    ):
        for name in solvers:
            fn = lambda q0, qd0, p, n_steps, s=UKJAX_SOLVERS[name], sys_=models[model]: ukjax_batch(
                sys_, s, q0, qd0, p, n_steps, dt=args.dt, max_steps=steps + 1
            )
            compiled, c_s = compile_jit(fn, q0s, qd0s, params, steps)
            contenders[f"{model}_{name}"] = (lambda k, c=compiled: c(q0s, qd0s, params, k), c_s)
            progress(f"k={links} {family}: compiled {model} {name} in {c_s:.1f} s")
    if not args.ukjax_only:
        for name in args.naive_solvers:
            if m > args.naive_max_rows:
                skipped[f"naive_{name}"] = (
                    f"m = {m} > --naive-max-rows {args.naive_max_rows}: the naive contender hung (no result) "
                    "at the redundant n = 32 (m = 64) in an earlier run"
                )
                continue
            tab = tableau(name)
            fn = lambda q0, qd0, p, f, k, tab=tab: naive_batch(q0, qd0, p, f, k, dt=args.dt, tab=tab)
            compiled, c_s = compile_jit(fn, q0s, qd0s, params, frames, steps)
            contenders[f"naive_{name}"] = (lambda k, c=compiled: (c(q0s, qd0s, params, frames, k), None), c_s)
            progress(f"k={links} {family}: compiled naive {name} in {c_s:.1f} s")
    mujocos = {}
    if not args.ukjax_only and args.mujoco_integrators:
        for integrator in args.mujoco_integrators:
            mj = MujocoChain(params, copies, args.dt, integrator, q0s, qd0s, steps, args.mujoco_threads)
            mujocos[f"mujoco_{integrator.lower()}"] = mj
            contenders[f"mujoco_{integrator.lower()}"] = (lambda k, mj=mj: (mj.run(k), None), mj.compile_s)
    checks = model_checks(
        models["ukjax"],
        models["ukjax_tree"],
        params,
        frames_of(copies),
        q0s[0],
        qd0s[0],
        next(iter(mujocos.values()), None),
    )
    planned = {}
    for name, (run, _) in contenders.items():
        planned[name] = cap_steps(run, steps, args.scenarios, args)
        if planned[name][0] < steps:
            progress(
                f"k={links} {family}: {name} capped to {planned[name][0]} of {steps} steps (full run "
                f"estimated {planned[name][1]:.0f} s > --budget-s {args.budget_s:g})"
            )
    walls, cpus, finals = run_interleaved(contenders, planned, args.rounds, progress, f"k={links} {family}")
    rows = {}
    for name in contenders:
        q_final, status = finals[name]
        if name.startswith("mujoco_"):
            _, errors = mujocos[name].final(q_final)
        else:
            errors = tip_errors(jnp.asarray(q_final), params)
        ran = planned[name][0]
        wall = statistics.median(walls[name])
        rows[name] = {
            "us_per_step_per_scenario": wall / (ran * args.scenarios) * 1e6,
            # the process's CPU time (mean over rounds): robust to the load of a shared machine
            "cpu_us_per_step_per_scenario": statistics.mean(cpus[name]) / (ran * args.scenarios) * 1e6,
            "compile_s": contenders[name][1],
            "median_wall_s": wall,
            "walls_s": walls[name],
            "cpu_per_wall": sum(cpus[name]) / sum(walls[name]),
            "scenarios": args.scenarios,
            "steps": ran,
            "span_s": ran * args.dt,
            "capped": ran < steps,
            "estimated_full_run_s": planned[name][1],
            "max_tip_error_m": float(np.nanmax(errors)) if np.any(np.isfinite(errors)) else float("nan"),
            "nonfinite_scenarios": int(np.sum(~np.isfinite(errors))),
        }
        if status is not None:
            rows[name]["not_success"] = int(np.sum(np.asarray(status) != int(ukjax.RESULTS.success)))
    return {
        "links": links,
        "n": links,
        "m": m,
        "family": family,
        "steps": steps,
        "model_check_relative_qdd": checks,
        "contenders": rows,
        "skipped": skipped,
    }


# -------------------------------------------------------------------------- model building vs the solve
def eval_loop(f, args, reps):
    """A compiled program evaluating ``vmap(f)(*args)`` ``reps`` times in a loop (each pass perturbs the first
    argument by the previous output, so nothing is hoisted out of the loop)."""
    batch = args[0].shape[0]

    def loop(*xs):
        def body(_, acc):
            out = jax.vmap(f)(xs[0] + 1e-12 * acc, *xs[1:])
            flat = jnp.concatenate(
                [jnp.ravel(o).reshape(batch, -1)[:, :1] for o in jax.tree_util.tree_leaves(out)], 1
            )
            return acc + 1e-30 * jnp.sum(flat, axis=1).reshape((batch,) + (1,) * (xs[0].ndim - 1))

        return jax.lax.fori_loop(0, reps, body, jnp.zeros((batch,) + (1,) * (xs[0].ndim - 1), xs[0].dtype))

    compiled = jax.jit(loop).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    return lambda: jax.block_until_ready(compiled(*args))


def model_building(links, args, progress):
    """CPU ns per scenario-evaluation of each part of one right-hand side of the pinned chain (minimum of 5
    interleaved rounds of the process's CPU time): the Lagrangian model (M, Q, A, b, the dense UK solve) and
    the tree (Q by RNEA, A and b, the UK solve with M⁻¹ by the articulated-body algorithm)."""
    params = chain.default_params(links)
    system = chain.system(links)
    old = dataclasses.replace(system, mass_and_force=None)
    q0s, qd0s = chain.scenarios(params, args.model_batch, speed=args.speed, seed=args.seed)
    t = 0.0
    terms = lambda q, qd: (
        *system.mass_and_given_force(q, qd, t, params),
        *system.constraint_equations(q, qd, t, params),
    )
    MQAb = jax.jit(jax.vmap(terms))(q0s, qd0s)
    tree, tree_system = chain.tree(links), chain.multibody_system(links)
    tree_terms = lambda q, qd: (
        tree_system.given_force(q, qd, t, params),
        *tree_system.constraint_equations(q, qd, t, params),
    )
    tree_QAb = jax.jit(jax.vmap(tree_terms))(q0s, qd0s)
    parts = {
        "M and Q, separate passes (old: jax.hessian of T; jax.grad and a JVP)": (
            lambda q, qd: (old.mass_matrix(q, t, params), old.given_force(q, qd, t, params)),
            (q0s, qd0s),
        ),
        "M and Q, one linearization (new: System.mass_and_given_force)": (
            lambda q, qd: system.mass_and_given_force(q, qd, t, params),
            (q0s, qd0s),
        ),
        "A and b (jacfwd and JVPs of the tip constraint)": (
            lambda q, qd: system.constraint_equations(q, qd, t, params),
            (q0s, qd0s),
        ),
        "UK solve from M, Q, A, b (ukjax.uk_acceleration, default method)": (
            # every input times a traced 1 (unknown to XLA): no factorization is hoisted out of the loop
            lambda one, M, Q, A, b: dynamics.uk_acceleration(one * M, one * Q, one * A, one * b),
            (jnp.ones(len(q0s), q0s.dtype), *MQAb),
        ),
        "whole right-hand side, old (System.acceleration without mass_and_force)": (
            lambda q, qd: old.acceleration(q, qd, t, params),
            (q0s, qd0s),
        ),
        "whole right-hand side, new (System.acceleration)": (
            lambda q, qd: system.acceleration(q, qd, t, params),
            (q0s, qd0s),
        ),
        "tree: Q by RNEA (Featherstone 2008, Table 5.1)": (
            lambda q, qd: tree_system.given_force(q, qd, t, params),
            (q0s, qd0s),
        ),
        "tree: A and b (reverse-mode Jacobian and JVPs of the tip constraint)": (
            lambda q, qd: tree_system.constraint_equations(q, qd, t, params),
            (q0s, qd0s),
        ),
        "tree: UK solve from q, Q, A, b, M⁻¹[Q, Aᵀ] by ABA (Featherstone 2008, Table 7.1)": (
            # q is the perturbed argument, so the articulated inertias and G are recomputed every pass
            lambda q, Q, A, b: dynamics.uk_solve_with(
                lambda B: tree.solve_mass(q, chain.bodies(params), B), Q, A, b
            )[0],
            (q0s, *tree_QAb),
        ),
        "tree: whole right-hand side (System.acceleration)": (
            lambda q, qd: tree_system.acceleration(q, qd, t, params),
            (q0s, qd0s),
        ),
    }
    loops = {name: eval_loop(f, xs, args.model_reps) for name, (f, xs) in parts.items()}
    cpu = {name: [] for name in parts}
    for _ in range(5):  # interleaved; the process's CPU time is robust to the load of a shared machine
        for name, run in loops.items():
            start = cpu_seconds()
            run()
            cpu[name].append(cpu_seconds() - start)
    out = {}
    for name in parts:
        out[name] = min(cpu[name]) / args.model_reps / args.model_batch * 1e9
        progress(f"n={links} model building: {name}: {out[name]:.0f} CPU ns per scenario-evaluation")
    return out


# ------------------------------------------------------------------------------------------------- tables
# (numerator, denominator): ratio of per-step costs, above 1 when the denominator (ukjax) is faster
RATIOS = (
    ("naive_tsit5", "ukjax_tsit5"),
    ("naive_tsit5", "ukjax_tree_tsit5"),
    ("naive_rk4", "ukjax_rk4"),
    ("naive_rk4", "ukjax_tree_rk4"),
    ("naive_rk4", "ukjax_tree_rank_rk4"),
    ("mujoco_rk4", "ukjax_rk4"),
    ("mujoco_rk4", "ukjax_tree_rk4"),
    ("mujoco_rk4", "ukjax_tree_rank_rk4"),
    ("mujoco_rk4", "ukjax_tree_bosh3"),
    ("mujoco_rk4", "ukjax_tree_tsit5"),
    ("mujoco_rk4", "ukjax_tree_rank_tsit5"),
    ("mujoco_euler", "ukjax_tree_heun"),
)


def markdown(rows, model_rows) -> str:
    lines = []
    for family in FAMILIES:
        sub = [r for r in rows if r["family"] == family]
        if not sub:
            continue
        names = list(dict.fromkeys(x for r in sub for x in r["contenders"]))
        pinned = "once" if family == "pinned" else "k times"
        lines += [
            f"\n**{family}** (tip pinned {pinned}): µs per step per scenario, compile s, max |φ| (m) at the "
            "end of the span (a capped contender: its steps in brackets)\n"
        ]
        head = "| k = n | m | " + " | ".join(names) + " |"
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for r in sub:
            c = r["contenders"]
            cells = [cell(c[x]) if x in c else "skipped" if x in r.get("skipped", {}) else "-" for x in names]
            lines.append(f"| {r['n']} | {r['m']} | " + " | ".join(cells) + " |")
        pairs = [(o, u) for o, u in RATIOS if any(o in r["contenders"] and u in r["contenders"] for r in sub)]
        if pairs:
            lines += [
                f"\n**{family}**, ratios of per-step cost (above 1: the ukjax contender is faster)\n",
                "| k = n | m | " + " | ".join(f"{o} / {u}" for o, u in pairs) + " |",
                "|---|---|" + "---|" * len(pairs),
            ]
            for r in sub:
                c = r["contenders"]
                cost = lambda x, c=c: c[x]["us_per_step_per_scenario"] if x in c else None
                cells = [f"{cost(o) / cost(u):.2f}" if cost(o) and cost(u) else "-" for o, u in pairs]
                lines.append(f"| {r['n']} | {r['m']} | " + " | ".join(cells) + " |")
    if model_rows:
        sizes = list(model_rows)
        lines += [
            "\n**Model building vs the solve** (pinned chain, CPU ns per scenario per right-hand-side "
            "evaluation, vmap)\n",
            "| part | " + " | ".join(f"n = {s}" for s in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for part in model_rows[sizes[0]]:
            lines.append(f"| {part} | " + " | ".join(f"{model_rows[s][part]:.0f}" for s in sizes) + " |")
    return "\n".join(lines) + "\n"


def cell(row) -> str:
    failed = f" ({row['not_success']} failed)" if row.get("not_success") else ""
    capped = f" [{row['steps']} steps]" if row.get("capped") else ""
    cost, compile_s, error = row["us_per_step_per_scenario"], row["compile_s"], row["max_tip_error_m"]
    return f"{cost:.3g} µs, {compile_s:.1f} s, {error:.1e}{capped}{failed}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8, 16, 32], help="links k (n = k)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--scenarios", type=int, default=256, help="batch size (default %(default)s)")
    parser.add_argument("--span", type=float, default=5.0, help="simulated seconds (default %(default)s)")
    parser.add_argument("--dt", type=float, default=5e-3, help="fixed step, s (default %(default)s)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds; medians (default %(default)s)"
    )
    parser.add_argument("--speed", type=float, default=0.5, help="spread of the initial joint rates, rad/s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ukjax-solvers",
        nargs="*",
        default=list(UKJAX_SOLVERS),
        choices=list(UKJAX_SOLVERS),
        help="solvers of the Lagrangian model (rk4: ukjax.RK4, classical Runge-Kutta)",
    )
    parser.add_argument(
        "--tree-solvers",
        nargs="*",
        default=list(UKJAX_SOLVERS),
        choices=list(UKJAX_SOLVERS),
        help="solvers of the tree model (chain.multibody_system: RNEA and the articulated-body algorithm)",
    )
    parser.add_argument(
        "--rank-solvers",
        nargs="*",
        default=["rk4", "tsit5"],
        choices=list(UKJAX_SOLVERS),
        help="solvers of the tree model with constraint_rank=2 (redundant family only)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help="wall seconds a contender's run may take; above it, fewer steps (default %(default)s)",
    )
    parser.add_argument(
        "--probe-steps",
        type=int,
        default=5,
        help="steps timed to estimate a run's cost (default %(default)s)",
    )
    parser.add_argument(
        "--naive-max-rows",
        type=int,
        default=32,
        help="skip the naive contender above this many constraint rows (default %(default)s)",
    )
    parser.add_argument("--naive-solvers", nargs="*", default=["tsit5", "rk4"], choices=["tsit5", "rk4"])
    parser.add_argument("--mujoco-integrators", nargs="*", default=["RK4", "Euler"], choices=["RK4", "Euler"])
    parser.add_argument("--mujoco-threads", type=int, default=1, help="mujoco.rollout threads (default 1)")
    parser.add_argument(
        "--ukjax-only", action="store_true", help="time ukjax alone (no naive JAX, no MuJoCo)"
    )
    parser.add_argument(
        "--model-sizes",
        type=int,
        nargs="*",
        default=[8, 16, 32],
        help="sizes of the model-building breakdown (none: skip)",
    )
    parser.add_argument("--model-batch", type=int, default=256, help="batch of the model-building breakdown")
    parser.add_argument(
        "--model-reps", type=int, default=20, help="evaluations per timed model-building loop"
    )
    parser.add_argument(
        "--quick", action="store_true", help="k = 2, 4; 16 scenarios, 1 s, 2 rounds; n = 8 only"
    )
    parser.add_argument(
        "--note", default="", help="free text recorded in the JSON (e.g. why a contender is left out)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/scaling-<machine>.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.scenarios, args.span, args.rounds = [2, 4], 16, 1.0, 2
        args.model_sizes, args.model_batch = [8], 64
    positive = args.scenarios >= 1 and args.span > 0 and args.dt > 0 and args.rounds >= 1
    positive = positive and args.budget_s > 0 and args.probe_steps >= 1
    if not positive or min(args.sizes, default=2) < 2:
        raise ValueError(
            "--scenarios, --span, --dt, --rounds, --budget-s, --probe-steps must be positive and --sizes at "
            "least 2"
        )
    from tqdm import tqdm

    meter = RunMeter()
    bar = tqdm(total=len(args.sizes) * len(args.families) + len(args.model_sizes or []), unit="size")
    progress = lambda text: tqdm.write(text)
    from ukjax.studies._common import environment

    env = environment()
    out = Path(args.out or Path(__file__).parent / "results" / f"scaling-{machine_tag(env)}.json")
    rows, model_rows = [], {}

    def save(complete: bool) -> dict:
        """Write the JSON and the markdown table (after every size, so an interrupted run keeps its rows)."""
        table = markdown(rows, model_rows)
        payload = {
            "description": "planar chains of k links with the tip pinned once (m = 2) or k times (m = 2k), "
            f"{args.scenarios} scenarios, fixed step {args.dt} s over {args.span} s, contenders interleaved "
            f"({args.rounds} rounds, medians); cost = wall time / (steps x scenarios); a contender whose "
            f"full run was estimated above {args.budget_s:g} s ran fewer steps "
            "(its row: steps, span_s, capped); "
            "max_tip_error_m at the end of the contender's span; ukjax/naive float64, MuJoCo float64 with "
            "its default soft constraints; ukjax_tree: chain.multibody_system (RNEA + articulated-body "
            "algorithm); ukjax_tree_rank: the same with constraint_rank=2 (redundant family)",
            "complete": complete,
            "note": args.note,
            "config": vars(args) | {"out": str(out)},
            "source": source_state(),
            **meter.record(),
            "rows": rows,
            "model_building_ns_per_scenario_eval": {str(k): v for k, v in model_rows.items()},
            "table_markdown": table,
        }
        try:
            import mujoco

            payload["mujoco_version"] = mujoco.__version__
        except ImportError:
            pass
        write_results(out, payload)
        out.with_suffix(".md").write_text(table)
        return payload

    for links in args.sizes:
        for family in args.families:
            rows.append(measure_size(links, family, args, progress) | {"load_average": os.getloadavg()})
            save(complete=False)
            bar.update()
    for links in args.model_sizes or []:
        model_rows[links] = model_building(links, args, progress)
        save(complete=False)
        bar.update()
    bar.close()
    payload = save(complete=True)
    print(payload["table_markdown"])
    print(
        f"wrote {out} and {out.with_suffix('.md')} (load average before {meter.load_before[0]:.2f}, "
        f"after {os.getloadavg()[0]:.2f})"
    )
    return payload


if __name__ == "__main__":
    main()
