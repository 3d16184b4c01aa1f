"""Throughput of a batch of constrained SCARA robots: NumPy loop vs naive JAX vs ukjax.

Every contender integrates the same right-hand side, the SCARA of Xu & Liu 2017 (seed 001: M, C, G eq.
34-36, task-space trajectory constraint eq. 48, Baumgarte stabilization φ̈ + αφ̇ + βφ = 0 eq. 52-54 with
α = 0.5, β = 200) closed by the Udwadia-Kalaba equation, over the same time span, with the same fixed-step
integrator (Tsit5, ukjax's default solver: 5th order, six evaluations per step) and the same number of steps:

(a) ``numpy``: NumPy, one scenario at a time, stepped by a Python loop; q̈ = a + M^{-1/2}(A M^{-1/2})⁺(b - A a)
    with M^{±1/2} from ``np.linalg.eigh`` and ``np.linalg.pinv`` (seed 001 eq. 50-51). It is timed on a few
    scenarios and its per-scenario-step cost is extrapolated to the batch (the table says so).
(b) ``naive_jax``: the same closed-form right-hand side in ``jax.numpy`` with ``jnp.linalg.pinv(A M^{-1/2})``,
    ``vmap`` over the batch, its own Tsit5 loop (``lax.scan``, diffrax's Butcher tableau), ``jit``.
(c) ``ukjax``: ``ukjax.simulate_batch`` on ``ukjax.models.scara`` (constraints differentiated automatically),
    fixed step, default solver (``diffrax.Tsit5``), default UK method (``"ldl"``) and default chunking (256
    scenarios per chunk on CPU); above one chunk also ``ukjax_one_vmap``, the whole batch in one ``vmap``
    (``chunk_size=None``).

Reported per batch size: scenario-steps per second (one step of one scenario = one scenario-step) of wall
time, the CPU seconds of the same run (all threads; other load on the machine distorts them less), compile
time, the largest end-of-run constraint violation |φ(t1)| over the batch and the largest end-state difference
to ukjax (both show that the same work was done). Results go to
``benchmarks/results/throughput-<machine>.json``.

    python3 benchmarks/throughput.py                      # float64, batch sizes 1 64 1024 8192
    python3 benchmarks/throughput.py --float32            # also float32, with its error against float64
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax._entrywise import evaluate_entrywise
from ukjax.simulation import _chunk_size
from ukjax.studies._common import environment, write_json

ukjax.enable_float64()

# Seed 001, "Numerical simulations" and "Error reducing": the paper's values, in SI units.
PAPER = {
    "m1": 20.0, "m2": 15.0, "m3": 15.0, "m4": 0.5,
    "l0": 0.0, "l1": 0.2, "l2": 0.25, "r1": 0.1, "r2": 0.125,
    "Iz1": 0.27, "Iz2": 0.31, "Iz3": 0.02, "Iz4": 0.0001,
    "g": 9.81, "alpha": 0.5, "beta": 200.0,
}  # fmt: skip
# Trajectory of eq. 40: x = R sin(ωt), y = Y + R cos(ωt), z = V t.
RADIUS, CENTRE_Y, OMEGA, RISE = 0.05, 0.35, 0.4 * np.pi, 0.02
# ukjax's default solver, used by every contender (diffrax has no classical RK4).
TABLEAU = diffrax.Tsit5.tableau


# -------------------------------------------------------------------------- the closed-form model of (a), (b)
def scara_terms(xp, q, qd, t, p):
    """M, Q = -C q̇ - G, A, b (with Baumgarte terms) and φ of the SCARA (seed 001 eq. 34-36, 48, 54).

    ``xp`` is ``numpy`` or ``jax.numpy``; the same code is the NumPy and the naive-JAX model.
    """
    q1, q2, q3, q4 = q[0], q[1], q[2], q[3]
    v1, v2 = qd[0], qd[1]
    l1, l2 = p["l1"], p["l2"]
    a_ = p["Iz1"] + p["r1"] ** 2 * p["m1"] + l1**2 * (p["m2"] + p["m3"] + p["m4"])
    b_ = p["Iz2"] + p["Iz3"] + p["Iz4"] + l2**2 * (p["m3"] + p["m4"]) + p["m2"] * p["r2"] ** 2
    g_ = l1 * l2 * (p["m3"] + p["m4"]) + l1 * p["m2"] * p["r2"]
    d_ = p["Iz3"] + p["Iz4"]
    c2, s2 = xp.cos(q2), xp.sin(q2)
    zero = 0.0 * q1
    M = xp.stack([
        xp.stack([a_ + b_ + 2 * g_ * c2, b_ + g_ * c2, d_ + zero, zero]),
        xp.stack([b_ + g_ * c2, b_ + zero, d_ + zero, zero]),
        xp.stack([d_ + zero, d_ + zero, d_ + zero, zero]),
        xp.stack([zero, zero, zero, p["m4"] + zero]),
    ])  # fmt: skip
    Cqd = xp.stack([-g_ * s2 * v2 * v1 - g_ * s2 * (v1 + v2) * v2, g_ * s2 * v1**2, zero, zero])
    G = xp.stack([zero, zero, zero, p["m4"] * p["g"] + zero])
    Q = -Cqd - G
    c1, s1, c12, s12 = xp.cos(q1), xp.sin(q1), xp.cos(q1 + q2), xp.sin(q1 + q2)
    swt, cwt = xp.sin(OMEGA * t), xp.cos(OMEGA * t)
    one = 1.0 + zero
    A = xp.stack([
        xp.stack([-l1 * c1 - l2 * c12, -l2 * c12, zero, zero]),
        xp.stack([-l1 * s1 - l2 * s12, -l2 * s12, zero, zero]),
        xp.stack([one, one, one, zero]),
        xp.stack([zero, zero, zero, one]),
    ])  # fmt: skip
    phi = xp.stack([
        -l1 * s1 - l2 * s12 - RADIUS * swt,
        l1 * c1 + l2 * c12 - CENTRE_Y - RADIUS * cwt,
        q1 + q2 + q3,
        q4 + p["l0"] - RISE * t,
    ])  # fmt: skip
    phi_dot = A @ qd - xp.stack([RADIUS * OMEGA * cwt, -RADIUS * OMEGA * swt, zero, RISE + zero])
    w12 = v1 + v2
    convective = xp.stack([
        -l1 * s1 * v1**2 - l2 * s12 * w12**2 - RADIUS * OMEGA**2 * swt,
        l1 * c1 * v1**2 + l2 * c12 * w12**2 - RADIUS * OMEGA**2 * cwt,
        zero,
        zero,
    ])  # fmt: skip
    b = convective - p["alpha"] * phi_dot - p["beta"] * phi
    return M, Q, A, b, phi


def user_terms(xp, q, qd, t, p):
    """M, Q, A, b of the user-written SCARA (``benchmarks/user_scara.py``: plain functions, as a user writes
    them), called one by one as a plain program calls them; φ is not computed (None)."""
    import user_scara

    return (
        user_scara.mass_matrix(q, t, p),
        user_scara.forces(q, qd, t, p),
        user_scara.constraint_matrix(q, qd, t, p),
        user_scara.constraint_rhs(q, qd, t, p),
        None,
    )


def uk_sqrt_form(xp, linalg, q, qd, t, p, terms=scara_terms):
    """q̈ = a + M^{-1/2}(A M^{-1/2})⁺(b - A a), a = M⁻¹Q (seed 001 eq. 50-51), by eigh and an SVD pinv;
    ``terms`` gives (M, Q, A, b, φ): the closed form of this file, or :func:`user_terms`."""
    M, Q, A, b, _ = terms(xp, q, qd, t, p)
    w, V = linalg.eigh(M)
    M_inv_sqrt = (V / xp.sqrt(w)) @ V.T
    a = linalg.solve(M, Q)
    return a + M_inv_sqrt @ (linalg.pinv(A @ M_inv_sqrt) @ (b - A @ a))


def erk_step(f, t, q, qd, k0, dt):
    """One step of diffrax's Tsit5 (its Butcher tableau, first-same-as-last) for q̇ = v, v̇ = f(t, q, v).

    ``k0 = f(t, q, qd)``; returns (q, qd, f at the new state), so every step costs six evaluations of f,
    as in diffrax.
    """
    ks = [(qd, k0)]
    for c, row in zip(TABLEAU.c, TABLEAU.a_lower, strict=True):
        yq = q + dt * sum(float(a) * kq for a, (kq, _) in zip(row, ks, strict=False))
        yv = qd + dt * sum(float(a) * kv for a, (_, kv) in zip(row, ks, strict=False))
        ks.append((yv, f(t + float(c) * dt, yq, yv)))
    weights = [float(b) for b in TABLEAU.b_sol]
    q = q + dt * sum(b * kq for b, (kq, _) in zip(weights, ks, strict=True) if b)
    qd = qd + dt * sum(b * kv for b, (_, kv) in zip(weights, ks, strict=True) if b)
    return q, qd, ks[-1][1]


# The classical 4th-order Runge-Kutta tableau (Kutta 1901), written out here so that the naive program
# does not borrow ukjax's (ukjax.RK4 is the same method): c, a (rows), b.
RK4_C, RK4_A, RK4_B = (0.5, 0.5, 1.0), ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6)


def rk4_step(f, t, q, qd, dt):
    """One classical RK4 step for q̇ = v, v̇ = f(t, q, v): four evaluations of f (no FSAL)."""
    ks = [(qd, f(t, q, qd))]
    for c, row in zip(RK4_C, RK4_A, strict=True):
        yq = q + dt * sum(a * kq for a, (kq, _) in zip(row, ks, strict=False) if a)
        yv = qd + dt * sum(a * kv for a, (_, kv) in zip(row, ks, strict=False) if a)
        ks.append((yv, f(t + c * dt, yq, yv)))
    q = q + dt * sum(b * kq for b, (kq, _) in zip(RK4_B, ks, strict=True))
    qd = qd + dt * sum(b * kv for b, (_, kv) in zip(RK4_B, ks, strict=True))
    return q, qd


# ------------------------------------------------------------------------------------------------- contenders
def run_numpy(q0, qd0, steps, dt, params):
    """(a): one scenario at a time, a Python loop of Tsit5 steps; the final (q, qd) of every scenario."""
    f = lambda t, q, qd: uk_sqrt_form(np, np.linalg, q, qd, t, params)
    out_q, out_qd = [], []
    for q, qd in zip(q0, qd0, strict=True):
        k = f(0.0, q, qd)
        for step in range(steps):
            q, qd, k = erk_step(f, step * dt, q, qd, k, dt)
        out_q.append(q)
        out_qd.append(qd)
    return np.stack(out_q), np.stack(out_qd)


def naive_jax(q0, qd0, params, dt, *, steps, solver="Tsit5", terms=scara_terms):
    """(b): vmap of a lax.scan loop (Tsit5, or ``solver="RK4"``) over the closed-form right-hand side with
    ``jnp.linalg.eigh`` and ``jnp.linalg.pinv``; ``terms=user_terms`` runs the user-written model instead."""
    f = lambda t, q, qd: uk_sqrt_form(jnp, jnp.linalg, q, qd, t, params, terms)

    def one(q, qd):
        if solver == "RK4":

            def body(carry, step):
                return rk4_step(f, step * dt, *carry, dt), None

            (q, qd), _ = jax.lax.scan(body, (q, qd), jnp.arange(steps, dtype=q.dtype))
            return q, qd

        def body(carry, step):
            q, qd, k = carry
            return erk_step(f, step * dt, q, qd, k, dt), None

        start = (q, qd, f(jnp.zeros((), q.dtype), q, qd))
        (q, qd, _), _ = jax.lax.scan(body, start, jnp.arange(steps, dtype=q.dtype))
        return q, qd

    return jax.vmap(one)(q0, qd0)


def ukjax_batch(system, q0, qd0, params, dt, *, steps, chunk_size="auto", method="ldl", solver=None):
    """(c): ``ukjax.simulate_batch``, fixed-step Tsit5 (its default solver; ``solver="RK4"``:
    ``ukjax.RK4()``), default UK method, saving the final state only; ``chunk_size`` as in
    ``simulate_batch`` (default: 256-scenario chunks on CPU)."""
    t1 = float(steps * dt)
    options = {} if solver in (None, "Tsit5") else {"solver": ukjax.RK4() if solver == "RK4" else solver}
    sol = ukjax.simulate_batch(
        system, q0, qd0, params, t1=t1, ts=[t1], dt=dt, chunk_size=chunk_size, method=method, **options
    )
    return sol.q[:, -1], sol.qd[:, -1]


def max_violation(q, steps, dt, params):
    """max over the batch of |φ(q, t1)|, evaluated in NumPy float64 from the final states."""
    t1 = steps * dt
    phis = [scara_terms(np, np.asarray(qi, np.float64), np.zeros(4), t1, params)[4] for qi in np.asarray(q)]
    return float(np.max(np.abs(phis)))


def scenarios(base, batch, seed, dtype):
    """The paper's (constraint-incompatible) initial state ``base = (q0, qd0)`` of ``ukjax.models.scara``,
    perturbed: 1° on the angles, 1 mm on q4, 1 % on q̇."""
    rng = np.random.default_rng(seed)
    q0 = np.asarray(base[0]) + rng.normal(0.0, 1.0, (batch, 4)) * np.array([np.deg2rad(1.0)] * 3 + [1e-3])
    qd0 = np.asarray(base[1]) * (1 + 0.01 * rng.normal(0.0, 1.0, (batch, 4)))
    return q0.astype(dtype), qd0.astype(dtype)


def timed_jit(fn, *args, repeats):
    """(compile seconds, best run seconds of ``repeats``, CPU seconds of that run, outputs) of
    ``jax.jit(fn)`` applied to ``args``. CPU seconds count every thread of this process: above the wall time
    where XLA:CPU splits kernels over its thread pool."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    best, best_cpu = np.inf, np.inf
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(compiled(*args))
        wall = time.perf_counter() - start
        if wall < best:
            best, best_cpu = wall, time.process_time() - cpu
    return compile_s, best, best_cpu, out


def scara_model_params(dtype):
    """The default parameters of ``ukjax.models.scara`` cast to ``dtype``."""
    from ukjax.models import scara

    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), scara.default_params())


def check_same_model(system, params_ukjax, params, base):
    """The closed-form model and ``ukjax.models.scara`` must give the same q̈ at the paper's initial state."""
    q0, qd0 = (np.asarray(x) for x in base)
    qdd_ref = uk_sqrt_form(np, np.linalg, q0, qd0, 0.3, params)
    qdd = np.asarray(system.acceleration(jnp.asarray(q0), jnp.asarray(qd0), 0.3, params_ukjax))
    error = float(np.max(np.abs(qdd - qdd_ref)) / np.max(np.abs(qdd_ref)))
    # both are float64 solves of the same well-conditioned 4 x 4 system (cond(A) ~ 10): agreement to ~1e-12
    if not error < 1e-9:
        raise RuntimeError(
            f"ukjax.models.scara and the closed-form SCARA differ: relative q̈ error {error:.1e}"
        )
    return error


def bench(args):
    from ukjax.models import scara

    system = scara.system()
    dtypes = [np.float64] + ([np.float32] if args.float32 else [])
    p64 = {k: np.float64(v) for k, v in PAPER.items()}
    base = scara.initial_state(scara.default_params())
    model_error = check_same_model(system, scara_model_params(jnp.float64), p64, base)
    steps = int(round(args.duration / args.dt))
    rows = []
    for batch in args.batch:
        reference = None
        for dtype in dtypes:
            name = np.dtype(dtype).name
            q0, qd0 = scenarios(base, batch, args.seed, dtype)
            p_jax = {k: jnp.asarray(v, dtype) for k, v in PAPER.items()}
            dt = dtype(args.dt)
            row = {"batch": batch, "dtype": name, "steps": steps}
            repeats = 3 if batch <= 1024 else 2
            c_s, run_s, cpu_s, (qc, _) = timed_jit(
                functools.partial(ukjax_batch, system, dt=dt, steps=steps),
                jnp.asarray(q0), jnp.asarray(qd0), scara_model_params(dtype), repeats=repeats,
            )  # fmt: skip
            computed_in = str(qc.dtype)  # simulate may promote a float32 state to float64
            qc = np.asarray(qc, np.float64)
            if dtype is np.float64:
                reference = qc
            chunk = _chunk_size("auto")
            row["ukjax"] = {
                "chunk_size": chunk,
                "compile_s": c_s, "run_s": run_s, "cpu_s": cpu_s,
                "scenario_steps_per_s": batch * steps / run_s,
                "max_violation": max_violation(qc, steps, args.dt, p64),
                "max_state_error_vs_float64": float(np.max(np.abs(qc - reference))),
                "output_dtype": computed_in,
            }  # fmt: skip
            if chunk is not None and batch > chunk:
                # the same in one vmap over the whole batch (simulate_batch(chunk_size=None))
                c_s, run_s, cpu_s, (qv, _) = timed_jit(
                    functools.partial(ukjax_batch, system, dt=dt, steps=steps, chunk_size=None),
                    jnp.asarray(q0), jnp.asarray(qd0), scara_model_params(dtype), repeats=repeats,
                )  # fmt: skip
                row["ukjax_one_vmap"] = {
                    "chunk_size": None,
                    "compile_s": c_s, "run_s": run_s, "cpu_s": cpu_s,
                "scenario_steps_per_s": batch * steps / run_s,
                    "max_violation": max_violation(qv, steps, args.dt, p64),
                    "max_state_error_vs_ukjax": float(np.max(np.abs(np.asarray(qv, np.float64) - qc))),
                }  # fmt: skip
            if batch <= args.naive_max_batch:
                c_s, run_s, cpu_s, (qb, _) = timed_jit(
                    functools.partial(naive_jax, dt=dt, steps=steps),
                    jnp.asarray(q0), jnp.asarray(qd0), p_jax, repeats=repeats,
                )  # fmt: skip
                computed_in = str(qb.dtype)
                qb = np.asarray(qb, np.float64)
                row["naive_jax"] = {
                    "compile_s": c_s, "run_s": run_s, "cpu_s": cpu_s,
                "scenario_steps_per_s": batch * steps / run_s,
                    "max_violation": max_violation(qb, steps, args.dt, p64),
                    "max_state_error_vs_ukjax": float(np.max(np.abs(qb - qc))),
                    "max_state_error_vs_float64_ukjax": float(np.max(np.abs(qb - reference))),
                    "output_dtype": computed_in,
                }  # fmt: skip
            if dtype is np.float64:
                k = min(batch, args.numpy_scenarios)
                start, cpu = time.perf_counter(), time.process_time()
                qa, _ = run_numpy(q0[:k], qd0[:k], steps, args.dt, p64)
                run_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
                row["numpy"] = {
                    "timed_scenarios": k, "extrapolated": k < batch, "compile_s": 0.0,
                    "run_s": run_s * batch / k, "cpu_s": cpu_s * batch / k,
                    "scenario_steps_per_s": k * steps / run_s,
                    "max_violation": max_violation(qa, steps, args.dt, p64),
                    "max_state_error_vs_ukjax": float(np.max(np.abs(qa - qc[:k]))),
                }  # fmt: skip
            rows.append(row)
            print(format_row(row), flush=True)
    return {"model_check_relative_qdd_error": model_error, "steps": steps, "rows": rows}


def _ns_per_eval(f, q0, qd0, reps, *, compile_only=False):
    """CPU nanoseconds per scenario of ``vmap(f)(q, qd)``, evaluated ``reps`` times inside one compiled loop.

    Every output of the last pass is returned (carried through the loop), so XLA computes all of them (the
    former version kept only the first entry alive and XLA dropped the work of the others); each pass starts
    from q perturbed by the previous one, so nothing is hoisted out of the loop. CPU time of the process
    (all threads), best of five, so that other load on the machine counts less than in wall time.
    """
    batch = q0.shape[0]
    shapes = jax.eval_shape(jax.vmap(f), q0, qd0)

    def loop(q, qd):
        def body(_, carry):
            acc, _ = carry
            out = jax.vmap(f)(q + 1e-12 * acc, qd)
            first = jax.tree_util.tree_leaves(out)[0].reshape(batch, -1)[:, :1]
            return acc + 1e-30 * first, out

        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return jax.lax.fori_loop(0, reps, body, (jnp.zeros((batch, 1), q.dtype), zeros))

    compiled = jax.jit(loop).lower(q0, qd0).compile()
    jax.block_until_ready(compiled(q0, qd0))
    return compiled if compile_only else _best_cpu_ns(compiled, q0, qd0, reps)


def _best_cpu_ns(compiled, q0, qd0, reps):
    """CPU ns per scenario-evaluation of a loop compiled by :func:`_ns_per_eval`, best of five calls."""
    batch = q0.shape[0]
    best = np.inf
    for _ in range(5):
        start = time.process_time()
        jax.block_until_ready(compiled(q0, qd0))
        best = min(best, time.process_time() - start)
    return best / reps / batch * 1e9


def _matmul_unrolled(a, b):
    return sum(a[:, k, None] * b[None, k, :] for k in range(a.shape[1]))


def profile_rhs(system, params, base, batch, seed, reps=50):
    """Cost of each part of the right-hand side under ``vmap`` (ns per scenario per evaluation)."""
    from ukjax import dynamics, linalg

    q0, qd0 = (jnp.asarray(x) for x in scenarios(base, batch, seed, np.float64))
    closed = {k: jnp.asarray(v) for k, v in PAPER.items()}
    t = 0.3

    def terms(q, qd):
        A, b = system.constraint_equations(q, qd, t, params)
        return system.mass_matrix(q, t, params), system.given_force(q, qd, t, params), A, b

    def gram(q, qd):
        M, _, A, _ = terms(q, qd)
        return linalg.small_matmul(A, linalg.cho_solve(linalg.cholesky(M), A.T))

    flat = lambda *xs: jnp.concatenate([jnp.ravel(x) for x in xs])
    parts = {
        "ukjax System.acceleration (whole right-hand side)": lambda q, qd: system.acceleration(
            q, qd, t, params
        ),
        "  M and Q of ukjax.models.scara": lambda q, qd: flat(*terms(q, qd)[:2]),
        "  A and b by autodiff of phi (with Baumgarte terms)": lambda q, qd: flat(*terms(q, qd)[2:]),
        "  ukjax.uk_acceleration (method ldl, System's default), model included": lambda q, qd: (
            dynamics.uk_acceleration(*terms(q, qd), method="ldl")
        ),
        "  ukjax.uk_acceleration (method cholesky), model included": lambda q, qd: dynamics.uk_acceleration(
            *terms(q, qd), method="cholesky"
        ),
        "    linalg.cholesky + cho_solve of M, with A M^-1 A^T": gram,
        "    linalg.psd_ginv of G = A M^-1 A^T (ldl), G included": lambda q, qd: linalg.psd_ginv(gram(q, qd)),
        "    linalg.psd_pinv of G = A M^-1 A^T (cholesky), G included": lambda q, qd: linalg.psd_pinv(
            gram(q, qd)
        ),
        "naive: closed-form M, Q, A, b": lambda q, qd: flat(*scara_terms(jnp, q, qd, t, closed)),
        "naive: whole right-hand side (eigh, jnp.linalg.pinv)": lambda q, qd: uk_sqrt_form(
            jnp, jnp.linalg, q, qd, t, closed
        ),
        "4x4 @ 4x4 @ 4x4 by jnp.matmul (dot_general)": lambda q, qd: (lambda X: X @ X @ X)(jnp.outer(q, qd)),
        "4x4 @ 4x4 @ 4x4 by unrolled outer-product sums": lambda q, qd: (
            lambda X: _matmul_unrolled(_matmul_unrolled(X, X), X)
        )(jnp.outer(q, qd)),
    }
    result = {}
    for name, f in parts.items():
        result[name.strip()] = _ns_per_eval(f, q0, qd0, reps)
        print(f"{name:<60} {result[name.strip()]:9.0f} CPU ns per scenario-evaluation", flush=True)
    return result


OLD_LDL = "_ldl_unpivoted"  # the former default's algorithm, registered for the A/B only (--ab-ldl)


def register_old_ldl(path):
    """Make ``method=OLD_LDL`` run ``psd_ginv`` of another copy of ``ukjax/linalg.py`` (e.g. the unpivoted
    LDLᵀ of an earlier commit: ``git show COMMIT:ukjax/linalg.py > /tmp/old_linalg.py``), in this process
    only, so that the old and the new default are compiled and timed side by side in one run."""
    import importlib.util

    from ukjax import dynamics

    spec = importlib.util.spec_from_file_location("_ab_old_linalg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dynamics._GRAM_INVERSES[OLD_LDL] = module.psd_ginv
    dynamics.GRAM_METHODS = (*dynamics.GRAM_METHODS, OLD_LDL)
    dynamics.ACCELERATION_METHODS = (*dynamics.ACCELERATION_METHODS, OLD_LDL)
    return module


def ab_default_method(args):
    """Old (``OLD_LDL``) against new default method, interleaved: per round, each contender's SCARA batch
    (``simulate_batch``, fixed step, wall and CPU seconds of the whole run) and its right-hand side alone
    (CPU ns per scenario-evaluation under ``vmap``), the order alternating between rounds; medians over
    rounds. Also G⁻ alone (``psd_ginv`` of the SCARA's 4 x 4 G; the 12 x 12 ``fori_loop`` path on the
    five-bar's G) and the five-bar right-hand side."""
    from ukjax import linalg
    from ukjax.models import five_bar, scara

    old = register_old_ldl(args.ab_ldl)
    contenders = {"new": ("ldl", linalg.psd_ginv), "old": (OLD_LDL, old.psd_ginv)}
    system = scara.system()
    params = scara_model_params(np.float64)
    base = scara.initial_state(scara.default_params())
    steps = int(round(args.duration / args.dt))
    batch = args.batch[0]
    q0, qd0 = (jnp.asarray(x) for x in scenarios(base, batch, args.seed, np.float64))
    compiled, profile = {}, {}
    fb, fb_p = five_bar.system(), five_bar.default_params()
    phis = jnp.linspace(-3.0, 1.0, 256)
    fb_q = jax.vmap(lambda phi: five_bar.initial_state(dict(fb_p, phi0=phi, omega0=phi))[0])(phis)
    fb_qd = jax.vmap(lambda phi: five_bar.initial_state(dict(fb_p, phi0=phi, omega0=phi))[1])(phis)
    A_of = jax.jacfwd(five_bar.revolute_constraints)

    def gram(A, M):  # G = A M⁻¹Aᵀ without LAPACK (see linalg.cholesky)
        return linalg.small_matmul(A, linalg.cho_solve(linalg.cholesky(M), A.T))

    scara_gram = lambda q, qd: gram(
        system.constraint_equations(q, qd, 0.3, params)[0], system.mass_matrix(q, 0.3, params)
    )
    fb_gram = lambda q, qd: gram(A_of(q, 0.0, fb_p), five_bar.mass_matrix(q, fb_p))
    states = lambda part: (fb_q, fb_qd) if part.startswith("five_bar") else (q0, qd0)

    for name, (method, ginv) in contenders.items():
        start = time.perf_counter()
        run = functools.partial(ukjax_batch, system, dt=args.dt, steps=steps, method=method)
        compiled[name] = jax.jit(run).lower(q0, qd0, params).compile()
        jax.block_until_ready(compiled[name](q0, qd0, params))
        compile_s = time.perf_counter() - start
        parts = {
            "scara_rhs": lambda q, qd, m=method: system.acceleration(q, qd, 0.3, params, method=m),
            "scara_psd_ginv_4x4": lambda q, qd, g=ginv: g(scara_gram(q, qd)),
            "five_bar_rhs": lambda q, qd, m=method: fb.acceleration(q, qd, 0.0, fb_p, method=m),
            "five_bar_psd_ginv_12x12": lambda q, qd, g=ginv: g(fb_gram(q, qd)),
        }
        profile[name] = {
            part: _ns_per_eval(f, *states(part), args.reps, compile_only=True) for part, f in parts.items()
        }
        print(f"{name}: compiled the SCARA batch in {compile_s:.1f} s", flush=True)
    rounds = []
    names = list(contenders)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        row = {"order": order}
        for name in order:
            start, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(compiled[name](q0, qd0, params))
            wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
            entry = {"batch_wall_s": wall, "batch_cpu_s": cpu_s,
                     "scenario_steps_per_s": batch * steps / wall,
                     "cpu_us_per_scenario_step": cpu_s / (batch * steps) * 1e6}
            for part, compiled_part in profile[name].items():
                entry[f"{part}_cpu_ns"] = _best_cpu_ns(compiled_part, *states(part), args.reps)
            row[name] = entry
        rounds.append(row)
        print(f"round {r}: " + " | ".join(
            f"{n} {row[n]['scenario_steps_per_s']:.4g}/s rhs {row[n]['scara_rhs_cpu_ns']:.0f} ns "
            f"G⁻ {row[n]['scara_psd_ginv_4x4_cpu_ns']:.0f} ns "
            f"five-bar rhs {row[n]['five_bar_rhs_cpu_ns']:.0f} ns"
            for n in names), flush=True)
    keys = [k for k in rounds[0]["new"]]
    medians = {n: {k: float(np.median([row[n][k] for row in rounds])) for k in keys} for n in names}
    ratio = {k: medians["new"][k] / medians["old"][k] for k in keys}
    return {"batch": batch, "steps": steps, "rounds": rounds, "median": medians, "new_over_old": ratio}


USER_CONTENDERS = ("ukjax_scara", "naive_jax_scara", "ukjax_user_scara", "naive_jax_user_scara")


def user_contenders(dt, steps, solver):
    """The four programs of :func:`bench_user` as (function of (q0, qd0), its parameters): ukjax and a naive
    JAX program, each on the shipped model (``ukjax.models.scara``; the naive program on the closed form of
    this file) and on the user-written one (``benchmarks/user_scara.py``; the naive program calls the same
    plain functions, and its own eigh/pinv and Runge-Kutta loop)."""
    import user_scara

    from ukjax.models import scara

    paper = {k: jnp.asarray(v) for k, v in PAPER.items()}
    run = functools.partial(ukjax_batch, dt=dt, steps=steps, solver=solver)
    naive = functools.partial(naive_jax, dt=dt, steps=steps, solver=solver)
    return {
        "ukjax_scara": (functools.partial(run, scara.system()), scara_model_params(np.float64)),
        "naive_jax_scara": (naive, paper),
        "ukjax_user_scara": (functools.partial(run, user_scara.system()), user_scara.params()),
        "naive_jax_user_scara": (functools.partial(naive, terms=user_terms), user_scara.params()),
    }


def rhs_costs(batch, seed):
    """XLA's cost analysis of one right-hand side per model and engine (``vmap`` over ``batch`` states with
    per-scenario parameters and time; for ukjax also entry by entry, ``*_entrywise``, as ``simulate_batch``
    evaluates it): flops, bytes accessed and transcendental calls per scenario-evaluation."""
    import user_scara

    from ukjax.models import scara

    base = scara.initial_state(scara.default_params())
    q0, qd0 = (jnp.asarray(x) for x in scenarios(base, batch, seed, np.float64))
    t = jnp.full((batch,), 0.3)
    batched = lambda p: jax.tree_util.tree_map(
        lambda x: jnp.broadcast_to(jnp.asarray(x), (batch, *jnp.shape(x))), p
    )
    paper = {k: jnp.asarray(v) for k, v in PAPER.items()}
    cases = {
        "ukjax_scara": (lambda q, qd, t, p: scara.system().acceleration(q, qd, t, p), scara.default_params()),
        "ukjax_user_scara": (
            lambda q, qd, t, p: user_scara.system().acceleration(q, qd, t, p), user_scara.params()
        ),
        "naive_jax_scara": (lambda q, qd, t, p: uk_sqrt_form(jnp, jnp.linalg, q, qd, t, p), paper),
        "naive_jax_user_scara": (
            lambda q, qd, t, p: uk_sqrt_form(jnp, jnp.linalg, q, qd, t, p, user_terms), user_scara.params()
        ),
    }
    out = {}
    for name in ("ukjax_scara", "ukjax_user_scara"):  # as simulate_batch evaluates them (ukjax._entrywise)
        f, p = cases[name]
        cases[f"{name}_entrywise"] = (
            lambda q, qd, t, p, f=f: evaluate_entrywise(f, (q, qd, t, p), [True] * 4), p
        )
    for name, (f, p) in cases.items():
        batched_f = f if name.endswith("_entrywise") else jax.vmap(f)
        compiled = jax.jit(batched_f).lower(q0, qd0, t, batched(p)).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        text = compiled.as_text()
        out[name] = {
            "flops": cost.get("flops", 0.0) / batch,
            "bytes_accessed": cost.get("bytes accessed", 0.0) / batch,
            "transcendentals": cost.get("transcendentals", 0.0) / batch,
            "kernels": sum(1 for line in text.splitlines() if " fusion(" in line or "custom-call(" in line),
            "custom_calls": sorted(set(re.findall(r'custom_call_target="([^"]+)"', text))),
        }
    return out


def _compile_and_run_once(fn, q0, qd0, params):
    """(compiled ``jax.jit(fn)``, seconds to compile it and run it once, final positions of that run)."""
    start = time.perf_counter()
    program = jax.jit(fn).lower(q0, qd0, params).compile()
    final = np.asarray(jax.block_until_ready(program(q0, qd0, params))[0])
    return program, time.perf_counter() - start, final


def _timed_run(program, q0, qd0, params):
    """(wall seconds, CPU seconds of every thread of this process) of one run of ``program``."""
    start, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(program(q0, qd0, params))
    return time.perf_counter() - start, time.process_time() - cpu


def _user_measurements_in_process(args, batch, steps, q0, qd0):
    """Every (solver, contender) of :func:`user_contenders` compiled in this process, then ``--rounds``
    rounds each running every contender once (order alternating between rounds)."""
    compiled, out = {}, {}
    for solver in args.solvers:
        for name, (fn, params) in user_contenders(args.dt, steps, solver).items():
            program, compile_s, final = _compile_and_run_once(fn, q0, qd0, params)
            compiled[(solver, name)] = (program, params)
            out[(solver, name)] = {"compile_s": [compile_s], "times": [], "final": final}
    keys = list(compiled)
    for r in range(args.rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            program, params = compiled[key]
            out[key]["times"].append(_timed_run(program, q0, qd0, params))
    return out


def _user_worker(args):
    """``--user-worker SOLVER:NAME``: one contender of ``--user --isolate`` in this process (started by
    :func:`_user_measurements_isolated`): compile, ``--runs-per-process`` timed runs, results as JSON to
    ``--out``."""
    solver, name = args.user_worker.split(":")
    from ukjax.models import scara

    steps = int(round(args.duration / args.dt))
    base = scara.initial_state(scara.default_params())
    q0, qd0 = (jnp.asarray(x) for x in scenarios(base, args.batch[0], args.seed, np.float64))
    fn, params = user_contenders(args.dt, steps, solver)[name]
    program, compile_s, final = _compile_and_run_once(fn, q0, qd0, params)
    times = [_timed_run(program, q0, qd0, params) for _ in range(args.runs_per_process)]
    Path(args.out).write_text(json.dumps({"compile_s": compile_s, "times": times, "final": final.tolist()}))


def _user_measurements_isolated(args, batch):
    """Every (solver, contender) of :func:`user_contenders` in its own process, the processes interleaved:
    ``--rounds`` rounds each starting one process per contender (order alternating between rounds), each
    compiling and timing ``--runs-per-process`` runs. A process that does not finish in ``--timeout-s`` is
    killed, counted as hung and started again (up to ``--retries`` times): with JAX's default XLA:CPU
    configuration, the naive program's batched LAPACK calls (eigh, pinv under vmap) can wait on each other
    forever (jaxlib 0.10's ParallelBatchMap; ``benchmarks/lapack_batch_deadlock.py``)."""
    keys = [(solver, name) for solver in args.solvers for name in USER_CONTENDERS]
    out = {key: {"compile_s": [], "times": [], "final": None, "hung": 0} for key in keys}
    with tempfile.TemporaryDirectory(prefix="throughput-user-") as folder:
        _run_isolated_rounds(args, batch, keys, out, Path(folder))
    return out


def _run_isolated_rounds(args, batch, keys, out, scratch):
    """The rounds of :func:`_user_measurements_isolated`, each process writing its JSON into ``scratch``."""
    for r in range(args.rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            part = scratch / f"{key[0]}-{key[1]}-{r}.json"
            command = [
                sys.executable, __file__, "--user-worker", f"{key[0]}:{key[1]}", "--batch", str(batch),
                "--duration", str(args.duration), "--dt", str(args.dt), "--seed", str(args.seed),
                "--runs-per-process", str(args.runs_per_process), "--out", str(part),
            ]  # fmt: skip
            for attempt in range(1 + args.retries):
                try:
                    subprocess.run(command, check=True, timeout=args.timeout_s, capture_output=True)
                    break
                except subprocess.TimeoutExpired:
                    out[key]["hung"] += 1
                    then = "started again" if attempt < args.retries else "no result this round"
                    print(f"  {key[0]} {key[1]}: hung ({args.timeout_s:.0f} s), {then}", flush=True)
            else:
                continue
            done = json.loads(part.read_text())
            out[key]["compile_s"].append(done["compile_s"])
            out[key]["times"] += [tuple(t) for t in done["times"]]
            out[key]["final"] = np.asarray(done["final"])


def bench_user(args):
    """Shipped and user-written SCARA, ukjax and naive JAX, RK4 and Tsit5, per batch size, contenders
    interleaved: in one process (:func:`_user_measurements_in_process`) or, with ``--isolate``, one process
    per contender and round (:func:`_user_measurements_isolated`); medians of wall and CPU seconds."""
    from ukjax.models import scara

    base = scara.initial_state(scara.default_params())
    steps = int(round(args.duration / args.dt))
    p64 = {k: np.float64(v) for k, v in PAPER.items()}
    rows = []
    for batch in args.batch:
        if args.isolate:
            measured = _user_measurements_isolated(args, batch)
        else:
            q0, qd0 = (jnp.asarray(x) for x in scenarios(base, batch, args.seed, np.float64))
            measured = _user_measurements_in_process(args, batch, steps, q0, qd0)
        for solver in args.solvers:
            row = {"batch": batch, "solver": solver, "steps": steps}
            for name in USER_CONTENDERS:
                m = measured[(solver, name)]
                if not m["times"]:
                    row[name] = {"hung": m.get("hung", 0), "runs": 0}
                    continue
                wall = float(np.median([w for w, _ in m["times"]]))
                cpu_s = float(np.median([c for _, c in m["times"]]))
                reference = measured[(solver, "ukjax_scara")]["final"]
                row[name] = {
                    "compile_s": float(np.median(m["compile_s"])), "run_s": wall, "cpu_s": cpu_s,
                    "run_s_rounds": [w for w, _ in m["times"]],
                    "scenario_steps_per_s": batch * steps / wall,
                    "cpu_ns_per_scenario_step": cpu_s / (batch * steps) * 1e9,
                    "max_violation": max_violation(m["final"], steps, args.dt, p64),
                    "max_state_difference_vs_ukjax_scara": (
                        None if reference is None else float(np.max(np.abs(m["final"] - reference)))
                    ),
                    **({"hung_processes": m["hung"]} if "hung" in m else {}),
                }  # fmt: skip
            for model in ("scara", "user_scara"):
                mine, naive = row[f"ukjax_{model}"], row[f"naive_jax_{model}"]
                if "run_s" in mine and "run_s" in naive:
                    rates = mine["scenario_steps_per_s"], naive["scenario_steps_per_s"]
                    row[f"ukjax_over_naive_{model}"] = rates[0] / rates[1]
                    row[f"ukjax_over_naive_{model}_cpu"] = naive["cpu_s"] / mine["cpu_s"]
            rows.append(row)
            print(
                f"batch {batch:>5} {solver:<5} "
                + " | ".join(
                    f"{n} {row[n]['scenario_steps_per_s']:>9.4g}/s" if "run_s" in row[n] else f"{n} hung"
                    for n in USER_CONTENDERS
                )
                + "".join(
                    f" | ukjax/naive {m} {row[f'ukjax_over_naive_{m}']:.1f}x"
                    for m in ("scara", "user_scara")
                    if f"ukjax_over_naive_{m}" in row
                ),
                flush=True,
            )
    costs = rhs_costs(args.batch[-1], args.seed) if args.profile else None
    return {"steps": steps, "rows": rows, "rhs_cost_per_scenario_eval": costs}


def format_row(row) -> str:
    parts = [f"batch {row['batch']:>5} {row['dtype']:<7}"]
    for name in ("numpy", "naive_jax", "ukjax", "ukjax_one_vmap"):
        if name in row:
            r = row[name]
            note = "*" if r.get("extrapolated") else ""
            parts.append(
                f"{name} {r['scenario_steps_per_s']:>11.4g}/s{note} (CPU/wall {r['cpu_s'] / r['run_s']:.2f}) "
                f"compile {r['compile_s']:5.1f}s |φ|max {r['max_violation']:.1e}"
            )
    ukjax_rate = row["ukjax"]["scenario_steps_per_s"]
    for name in ("numpy", "naive_jax"):
        if name in row:
            parts.append(f"ukjax/{name} {ukjax_rate / row[name]['scenario_steps_per_s']:.1f}x")
    return " | ".join(parts)


def source_state() -> dict:
    """The commit measured and the files of ``ukjax/`` that differ from it (uncommitted code measured)."""
    root = Path(__file__).resolve().parent.parent
    try:
        git = lambda *cmd: subprocess.run(
            ["git", *cmd], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        return {
            "commit": git("rev-parse", "HEAD"),
            "modified": git("status", "--short", "ukjax").splitlines(),
        }
    except OSError:
        return {}


def machine_tag(env) -> str:
    backend = env["machine"]["backend"]
    kind = (
        env["machine"]["devices"][0]
        if backend != "cpu"
        else f"{env['machine']['cpu']}-{env['machine']['cores']}c"
    )
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{backend}-{kind}").strip("-").lower()


def _write_interleaved(args, results, description, default_name, uptime_before):
    """Write the results of an interleaved comparison with the machine, the source and ``uptime`` before
    and after to ``--out`` (default ``benchmarks/results/<default_name>``, ``{machine}`` filled in)."""
    env = environment()
    name = default_name.format(machine=machine_tag(env))
    out = Path(args.out or Path(__file__).parent / "results" / name)
    payload = {
        "description": description,
        "config": vars(args) | {"out": str(out)},
        "source": source_state(),
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        **results,
        "environment": env,
    }
    write_json(out, payload)
    print(f"wrote {out}\n  before: {payload['uptime_before']}\n  after:  {payload['uptime_after']}")
    return payload


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64, 1024, 8192], help="batch sizes")
    parser.add_argument("--duration", type=float, default=1.0, help="simulated seconds (default %(default)s)")
    parser.add_argument("--dt", type=float, default=5e-3, help="fixed Tsit5 step (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--numpy-scenarios", type=int, default=3, help="scenarios NumPy is timed on")
    parser.add_argument(
        "--naive-max-batch",
        type=int,
        default=1024,
        help="largest batch for naive JAX (default %(default)s: at 8192, vmap of jnp.linalg.eigh/pinv never "
        "returns on XLA:CPU with jax 0.10.2, every thread idle)",
    )
    parser.add_argument("--float32", action="store_true", help="also measure float32 throughput and error")
    parser.add_argument(
        "--profile", type=int, default=1024, help="batch size of the right-hand-side cost breakdown (0: none)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (default benchmarks/results/throughput-<machine>.json)"
    )
    parser.add_argument(
        "--ab-ldl", default=None, metavar="OLD_LINALG_PY",
        help="A/B the default method against psd_ginv of this copy of ukjax/linalg.py (interleaved rounds; "
        "uses the first --batch, --rounds, --reps) instead of the contenders above",
    )
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (default %(default)s)")
    parser.add_argument("--reps", type=int, default=50, help="right-hand-side evaluations per timing")
    parser.add_argument(
        "--user", action="store_true",
        help="compare the shipped and the user-written SCARA (benchmarks/user_scara.py), ukjax and naive "
        "JAX, for each of --solvers, interleaved in --rounds rounds, instead of the contenders above",
    )
    parser.add_argument("--solvers", nargs="+", default=["RK4", "Tsit5"], choices=["RK4", "Tsit5"])
    parser.add_argument(
        "--isolate", action="store_true",
        help="with --user: each contender in its own process, the processes interleaved over --rounds, a "
        "hung process killed after --timeout-s and started again (the naive program's batched LAPACK calls "
        "can deadlock with JAX's default XLA:CPU configuration)",
    )
    isolated = "with --isolate (default %(default)s)"
    parser.add_argument("--runs-per-process", type=int, default=3, help=isolated)
    parser.add_argument("--timeout-s", type=float, default=180.0, help=isolated)
    parser.add_argument("--retries", type=int, default=3, help=isolated)
    parser.add_argument("--user-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.user_worker:
        return _user_worker(args)
    load_before = os.getloadavg()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if args.user:
        results = bench_user(args)
        description = (
            "SCARA (seed 001), Baumgarte alpha=0.5, beta=200: ukjax.simulate_batch and a naive JAX program "
            "(eigh, jnp.linalg.pinv, its own Runge-Kutta loop), each on the shipped model and on the "
            f"user-written one (benchmarks/user_scara.py); fixed step {args.dt} s over {args.duration} s "
            f"({results['steps']} steps); {args.rounds} interleaved rounds, medians"
            + (
                f"; each contender in its own process per round ({args.runs_per_process} timed runs after "
                f"compiling), a process hung past {args.timeout_s:.0f} s killed and started again"
                if args.isolate
                else ""
            )
        )
        return _write_interleaved(args, results, description, "throughput-user-{machine}.json", uptime_before)
    if args.ab_ldl:
        results = ab_default_method(args)
        description = (
            "default method 'ldl' (psd_ginv, diagonal-pivoted LDLᵀ) against the unpivoted "
            f"LDLᵀ of {args.ab_ldl}: SCARA batch of {results['batch']}, fixed-step Tsit5 {args.dt} s over "
            f"{args.duration} s; right-hand sides and G⁻ alone in CPU ns per scenario-evaluation (vmap over "
            f"{results['batch']} SCARA / 256 five-bar states); {args.rounds} interleaved rounds, medians"
        )
        return _write_interleaved(args, results, description, "default-method-ab-cpu.json", uptime_before)
    results = bench(args)
    if args.profile:
        from ukjax.models import scara

        params = scara.default_params()
        print(f"right-hand-side cost breakdown at batch {args.profile} (vmap, float64):")
        results["profile_ns_per_scenario_eval"] = profile_rhs(
            scara.system(), params, scara.initial_state(params), args.profile, args.seed
        )
    env = environment()
    out = Path(args.out or Path(__file__).parent / "results" / f"throughput-{machine_tag(env)}.json")
    payload = {
        "description": "SCARA (seed 001) with Baumgarte alpha=0.5, beta=200 (linear form), Tsit5, "
        f"fixed step {args.dt} s over {args.duration} s ({results['steps']} steps) for every contender; "
        "numpy rate extrapolated from the timed scenarios where 'extrapolated' is true",
        "config": vars(args) | {"out": str(out)},
        "source": source_state(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        **results,
        "environment": env,
    }
    write_json(out, payload)
    print(f"wrote {out} (load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f})")
    return payload


if __name__ == "__main__":
    main()
