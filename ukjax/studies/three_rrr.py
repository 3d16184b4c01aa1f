"""The 3RRR parallel mechanism built as a hierarchy of modules (Orsino 2017, Figs. 2-4), with the recursive
(Kalman) UK solver and joint clearances (eq. 4.14-4.18).

1. Inverse dynamics by servo constraints: the platform follows a prescribed planar motion (x, y, θ) with the
   three motor torques (Liu et al. 2015 eq. 35 with the passive constraints projected, :mod:`ukjax.control`);
   the torques are checked at every saved state against a Lagrange-multiplier (KKT) solve holding the passive
   and servo constraints, and against the feedforward torques of the closed-form inverse kinematics.
2. Forward simulation: the passive mechanism driven by those feedforward torques, with the recursive solver
   (one Kalman update per level: pivots, legs, platform joints) and with the one-shot UK equation; then a
   Monte-Carlo over the clearance covariances R (per joint, random around each level σ²) in one batch: how
   the platform trajectory and the joint reaction forces change as R grows, with the constraint violation of
   every run beside it.

Model, dimensions and the meaning of a clearance covariance: :mod:`ukjax.models.three_rrr` and
:meth:`ukjax.System.acceleration`.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from ukjax.models import three_rrr as model
from ukjax.simulation import RESULTS, simulate, simulate_batch
from ukjax.studies._common import (
    add_integrator_arguments,
    add_output_arguments,
    integrator_record,
    prepare_output,
    pyplot,
    save_figure,
    status_name,
    write_json,
)

DESCRIPTION = (
    "Orsino 2017 Figs. 2-4, eq. 4.14-4.18: 3RRR from 10 modules in 3 levels; servo inverse dynamics, "
    "recursive solver, clearances"
)

CLOSED_LOOP_METHOD = "svd"

CLEARANCE_MEANING = " ".join(
    """
A clearance covariance R (Orsino 2017 eq. 4.17-4.18) lets a joint be violated at the acceleration level in
proportion to its own reaction: A q̈ - b = -R λ. With the Baumgarte terms φ̈ + 2αφ̇ + β²φ = -Rλ the joint
deflects quasi-statically by φ ≈ -Rλ/β², like a massless spring of stiffness β²/R and damper 2α/R along the
joint directions: a compliant joint. It is not a geometric gap (no free play, contact loss or impact), not a
random disturbance (each run is deterministic; the Monte-Carlo samples R, not noise), and R is a compliance
in 1/kg, not a length.
""".split()
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = model.default_params()
    add_output_arguments(parser, "three_rrr")
    parser.add_argument("--t1", type=float, default=float(d["trajectory"]["period"]), help="end time (s)")
    parser.add_argument(
        "--levels",
        default="1e-4,1e-3,1e-2,1e-1",
        help="clearance variance levels σ² (1/kg), comma separated; every joint's σ² is drawn around each",
    )
    parser.add_argument("--samples", type=int, default=8, help="Monte-Carlo samples per clearance level")
    parser.add_argument(
        "--spread",
        type=float,
        default=3.0,
        help="per-joint σ² = level x s, log s uniform in [-ln spread, ln spread]",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the Monte-Carlo")
    parser.add_argument(
        "--alpha", type=float, default=float(d["alpha"]), help="Baumgarte α = β of every joint (1/s)"
    )
    add_integrator_arguments(parser, tolerance=1e-10, num_saves=101)


def _params(args):
    p = model.default_params(alpha=args.alpha, beta=args.alpha)
    return p


def _kkt_torques(system, sol, params):
    """u from [[M, -Aᵀ, -B], [A, 0, 0], [A_s, 0, 0]] [q̈; λ; u] = [Q; b; b_s] at every saved state (NumPy)."""

    @jax.jit
    @jax.vmap
    def pieces(q, qd, t):
        A, b = system.constraint_equations(q, qd, t, params)
        A_s, b_s = model.SERVO.second_order(q, qd, t, params)
        return (
            system.mass_matrix(q, t, params),
            system.given_force(q, qd, t, params),
            A,
            b,
            A_s,
            b_s,
            system.actuation(q, t, params),
        )

    M, Q, A, b, A_s, b_s, B = (np.asarray(x) for x in pieces(sol.q, sol.qd, sol.ts))
    n, m, k = M.shape[1], A.shape[1], A_s.shape[1]
    u = []
    for i in range(M.shape[0]):
        K = np.block([[M[i], -A[i].T, -B[i]], [A[i], np.zeros((m, m + k))], [A_s[i], np.zeros((k, m + k))]])
        u.append(np.linalg.solve(K, np.concatenate([Q[i], b[i], b_s[i]]))[n + m :])
    return np.asarray(u)


def _clearance_batch(params, levels, samples, spread, seed):
    """Scenario 0 rigid (R = 0), then ``samples`` per level: σ² of each of the 9 joints = level x s_j."""
    rng = np.random.default_rng(seed)
    values = [np.zeros(9)]
    level_of = [0.0]
    for level in levels:
        for _ in range(samples):
            values.append(level * np.exp(rng.uniform(-np.log(spread), np.log(spread), 9)))
            level_of.append(level)
    values = np.asarray(values)
    batch = [model.with_clearances(params, pivot=v[:3], elbow=v[3:6], platform=v[6:]) for v in values]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *batch)
    return stacked, values, np.asarray(level_of)


def _reactions(system, sols_q, sols_qd, ts, batch_params):
    """|λ| per joint (N) and gear torque (N m) at every saved time of every run: (batch, T, 12)."""

    def one(q, qd, t, p):
        lam = system.multipliers(q, qd, t, p)
        return jnp.stack([jnp.linalg.norm(x) for x in lam])

    per_run = jax.vmap(jax.vmap(one, in_axes=(0, 0, 0, None)), in_axes=(0, 0, None, 0))
    return np.asarray(jax.jit(per_run)(sols_q, sols_qd, ts, batch_params))


def _spring_check(system, runs, reactions, sigma2, beta, params):
    """max_t |φ_j| / max_t (σ²_j |λ_j| / β²) for the 9 joints with clearance of every clearance run."""
    q0 = runs.q[0, 0]
    rows, start = {}, 0
    for c in system.constraints:
        m = c.value(q0, 0.0, params).shape[0]
        rows[c.name] = slice(start, start + m)
        start += m
    names = [c.name for c in system.constraints]
    joint_sigma = {}
    for k, K in enumerate(model.LEGS):
        joint_sigma[f"{K}.bar.pivot"] = k
        joint_sigma[f"{K}.elbow"] = 3 + k
        joint_sigma[f"{K}-L joint"] = 6 + k
    residual = np.asarray(runs.position_residual)
    ratios = []
    for i in range(1, sigma2.shape[0]):
        for name, j in joint_sigma.items():
            phi = np.max(np.linalg.norm(residual[i][:, rows[name]], axis=-1))
            predicted = np.max(sigma2[i, j] * reactions[i, :, names.index(name)]) / beta**2
            ratios.append(phi / predicted)
    return np.asarray(ratios)


def _joint_names(system):
    return [c.name for c in system.constraints]


def _figures(
    out,
    args,
    ts,
    ref_pose,
    closed,
    u_kkt,
    u_ff,
    runs,
    levels_of,
    violation,
    deviation,
    reactions,
    names,
    params,
):
    plt = pyplot()

    files = []
    # 1. the mechanism at a few instants
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.6), sharex=True, sharey=True)
    for ax, frac in zip(axes, (0.0, 0.25, 0.5, 0.75), strict=True):
        i = int(round(frac * (len(ts) - 1)))
        q = np.asarray(closed.q[i])
        parts = model.LAYOUT.split(jnp.asarray(q))
        joints = np.asarray(model.platform_joint_positions(parts["L"], params))
        for k, K in enumerate(model.LEGS):
            leg = model.LEG_LAYOUT.split(parts[K])
            O = np.asarray(params[K]["bar"]["base"])
            U = np.asarray(leg["bar"])
            E = U[:2] + 0.5 * float(params[K]["bar"]["l"]) * np.array([np.cos(U[2]), np.sin(U[2])])
            ax.plot([O[0], E[0]], [O[1], E[1]], "-o", color="C0", lw=3, ms=4)
            ax.plot([E[0], joints[k, 0]], [E[1], joints[k, 1]], "-o", color="C1", lw=2, ms=4)
            ax.plot(*O, "ks", ms=7)
            ax.annotate(K, O, textcoords="offset points", xytext=(5, 5))
        tri = np.vstack([joints, joints[:1]])
        ax.fill(tri[:, 0], tri[:, 1], color="C2", alpha=0.5)
        ax.plot(np.asarray(ref_pose[:, 0]), np.asarray(ref_pose[:, 1]), "k:", lw=1)
        ax.set(title=f"t = {float(ts[i]):.2f} s", aspect="equal", xlabel="x (m)")
    axes[0].set_ylabel("y (m)")
    fig.suptitle("3RRR mechanism (motors at the squares), platform path dotted")
    files.append("mechanism.png")
    save_figure(fig, out / files[-1])

    # 2. platform path
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(ref_pose[:, 0] * 1e3, ref_pose[:, 1] * 1e3, "k-", lw=3, alpha=0.3, label="prescribed")
    pose_rigid = np.asarray(jax.vmap(model.platform_pose)(runs.q[0]))
    axes[0].plot(pose_rigid[:, 0] * 1e3, pose_rigid[:, 1] * 1e3, "C0--", label="forward, rigid (recursive)")
    for j, level in enumerate(sorted(set(levels_of[1:]))):
        i = int(np.nonzero(levels_of == level)[0][0])
        pose = np.asarray(jax.vmap(model.platform_pose)(runs.q[i]))
        axes[0].plot(
            pose[:, 0] * 1e3, pose[:, 1] * 1e3, color=f"C{j + 1}", lw=1, label=f"σ² ~ {level:g} 1/kg"
        )
        axes[1].plot(ts, (pose[:, 2] - ref_pose[:, 2]) * 1e3, color=f"C{j + 1}", lw=1)
    axes[0].set(
        xlabel="x (mm)",
        ylabel="y (mm)",
        title="Platform path: feedforward torques, clearances",
        aspect="equal",
    )
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="t (s)", ylabel="θ - θ_ref (mrad)", title="Platform angle error (one run per level)")
    files.append("platform_path.png")
    save_figure(fig, out / files[-1])

    # 3. actuator torques
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for k, K in enumerate(model.LEGS):
        ax.plot(ts, np.asarray(closed.u[:, k]) * 1e3, color=f"C{k}", label=f"u_{K} servo control")
        ax.plot(ts[::5], u_kkt[::5, k] * 1e3, "x", color=f"C{k}", ms=5)
        ax.plot(ts, u_ff[:, k] * 1e3, ":", color="k", lw=1)
    ax.set(
        xlabel="t (s)",
        ylabel="motor torque (mN m)",
        title="Actuator torques (x: KKT inverse dynamics, dotted: feedforward)",
    )
    ax.legend(fontsize=7)
    files.append("actuator_torques.png")
    save_figure(fig, out / files[-1])

    # 4. joint reactions: rigid, and the change with the clearance
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.4), sharex=True)
    groups = sorted(set(levels_of[1:]))
    for col, kind in enumerate(("pivot", "elbow", "-L joint")):
        idx = [c for c, name in enumerate(names) if name.endswith(kind) and name.startswith("A")][0]
        axes[0, col].plot(ts, reactions[0, :, idx], "k-", lw=2, label="rigid")
        for j, level in enumerate(groups):
            runs_at = np.nonzero(levels_of == level)[0]
            for n_run, i in enumerate(runs_at[:3]):
                label = f"σ² ~ {level:g} 1/kg" if n_run == 0 else None
                axes[1, col].plot(
                    ts, reactions[i, :, idx] - reactions[0, :, idx], color=f"C{j + 1}", lw=0.8, label=label
                )
            if j == len(groups) - 1:
                axes[0, col].plot(
                    ts, reactions[runs_at[0], :, idx], color=f"C{j + 1}", lw=1, label=f"σ² ~ {level:g} 1/kg"
                )
        joint = names[idx].split(".")[-1]
        axes[0, col].set(ylabel="|λ| (N)", title=f"leg A {joint} reaction")
        axes[1, col].set(
            xlabel="t (s)", ylabel="|λ| - |λ_rigid| (N)", title=f"change with clearance ({joint})"
        )
        axes[1, col].set_yscale("symlog", linthresh=1e-4)
    axes[0, 0].legend(fontsize=7)
    axes[1, 0].legend(fontsize=7)
    files.append("joint_reactions.png")
    save_figure(fig, out / files[-1])

    # 5. violation and deviation vs clearance
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    mean_sigma2 = np.array([np.mean(v) for v in violation["sigma2"]])
    axes[0].loglog(mean_sigma2[1:], violation["position"][1:], "o", ms=4)
    axes[0].axhline(max(violation["position"][0], 1e-16), color="k", ls=":", label="rigid (R = 0)")
    axes[0].set(
        xlabel="mean joint σ² (1/kg)", ylabel="max |φ| (m or rad)", title="Constraint violation per run"
    )
    axes[0].legend(fontsize=7)
    axes[1].loglog(mean_sigma2[1:], deviation[1:] * 1e3, "o", ms=4)
    axes[1].set(
        xlabel="mean joint σ² (1/kg)",
        ylabel="max platform position deviation (mm)",
        title="Platform deviation from the rigid run",
    )
    files.append("clearance_violation.png")
    save_figure(fig, out / files[-1])
    return files


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    levels = [float(x) for x in args.levels.split(",") if x.strip()]
    if any(level <= 0 for level in levels) or args.samples < 1:
        raise ValueError("--levels must be positive variances and --samples at least 1")
    params = _params(args)
    rigid, clearance_system = model.system(), model.open_loop(clearances=True)
    ts = jnp.linspace(0.0, args.t1, args.num_saves)
    kw = dict(t1=args.t1, ts=ts, rtol=args.rtol, atol=args.atol)
    q0, qd0, _ = model.reference_state(0.0, params)
    ref_pose = np.asarray(jax.vmap(model.trajectory, in_axes=(0, None))(ts, params))
    serial, parallel = jax.jit(jax.vmap(model.singularity_measures, in_axes=(0, None)))(
        jnp.asarray(ref_pose), params
    )
    steps = tqdm(total=4, desc="three_rrr", unit="stage")
    timings = {}

    # 1. inverse dynamics
    start = time.perf_counter()
    # method="svd" (M^{±1/2} and B⁺ by SVD, Liu et al. 2015 eq. 13): the same numbers as the default Cholesky
    # form, ~25x faster here because the servo controller vmaps the UK solve over the three actuators
    closed = simulate(rigid, q0, qd0, params, method=CLOSED_LOOP_METHOD, **kw)
    jax.block_until_ready(closed.q)
    timings["closed_loop_simulate_s"] = time.perf_counter() - start
    u_kkt = _kkt_torques(rigid, closed, params)
    u_ff = np.asarray(jax.jit(jax.vmap(lambda t: model.feedforward_torque(rigid, t, params)))(ts))
    closed_pose = np.asarray(jax.vmap(model.platform_pose)(closed.q))
    steps.update()

    # 2. forward, recursive solver: the clearance Monte-Carlo in one batch, scenario 0 rigid
    batch_params, sigma2, levels_of = _clearance_batch(params, levels, args.samples, args.spread, args.seed)
    count = sigma2.shape[0]
    start = time.perf_counter()
    runs = simulate_batch(
        clearance_system,
        jnp.broadcast_to(q0, (count, q0.shape[0])),
        jnp.broadcast_to(qd0, (count, qd0.shape[0])),
        batch_params,
        batch_params=True,
        uk_solver="recursive",
        **kw,
    )
    jax.block_until_ready(runs.q)
    timings["recursive_clearance_batch_simulate_s"] = time.perf_counter() - start
    steps.update()
    # the one-shot UK q̈ at the states of the rigid recursive run (the full trajectories agree to 1e-10 in
    # tests/test_three_rrr.py; a second simulation here would double the compile time)
    one_shot = model.open_loop()
    qdd_one_shot = jax.jit(jax.vmap(lambda q, qd, t: one_shot.acceleration(q, qd, t, params)))(
        runs.q[0], runs.qd[0], ts
    )
    qdd_gap = float(jnp.max(jnp.abs(qdd_one_shot - runs.qdd[0])) / jnp.max(jnp.abs(qdd_one_shot)))
    steps.update()
    names = _joint_names(clearance_system)
    reactions = _reactions(clearance_system, runs.q, runs.qd, ts, batch_params)
    steps.update()
    steps.close()

    poses = np.asarray(jax.vmap(jax.vmap(model.platform_pose))(runs.q))
    deviation = np.max(np.linalg.norm(poses[:, :, :2] - poses[0, :, :2], axis=-1), axis=1)
    angle_dev = np.max(np.abs(poses[:, :, 2] - poses[0, :, 2]), axis=1)
    position_violation = np.asarray(runs.max_position_residual)
    reaction_change = np.max(np.abs(reactions - reactions[0]), axis=(1, 2))
    spring_ratio = _spring_check(clearance_system, runs, reactions, sigma2, args.alpha, params)
    rigid_peak = np.max(reactions[0], axis=0)
    status = [RESULTS(int(s)).name for s in np.asarray(runs.status)]

    per_level = []
    for level in levels:
        sel = levels_of == level
        per_level.append(
            {
                "sigma2_level_per_kg": level,
                "runs": int(sel.sum()),
                # a compliant joint violates the rigid constraint by design: status constraint_violated
                "statuses": {
                    name: sum(1 for s, keep in zip(status, sel, strict=True) if keep and s == name)
                    for name in sorted(set(status))
                },
                "platform_position_deviation_m": {
                    "mean": float(deviation[sel].mean()),
                    "max": float(deviation[sel].max()),
                },
                "platform_angle_deviation_rad": {
                    "mean": float(angle_dev[sel].mean()),
                    "max": float(angle_dev[sel].max()),
                },
                "max_reaction_change_N": {
                    "mean": float(reaction_change[sel].mean()),
                    "max": float(reaction_change[sel].max()),
                },
                "max_position_violation_m": {
                    "mean": float(position_violation[sel].mean()),
                    "max": float(position_violation[sel].max()),
                },
                "equivalent_joint_stiffness_beta2_over_sigma2_N_per_m": float(args.alpha**2 / level),
            }
        )
    recursive_rigid_pose = poses[0]
    metrics = {
        "paper": "Orsino 2017, Proc. R. Soc. A: §2 Figs. 2-4 (3RRR as a hierarchy of modules), eq. 4.14-4.16 "
        "(recursive UK = Kalman filter), eq. 4.17-4.18 (clearances as measurement noise)",
        "model": {
            "coordinates": rigid.n,
            "constraint_rows": 21,
            "levels": [
                {"name": level.name, "constraints": [c.name for c in level.members]}
                for level in rigid.hierarchy
            ],
            "dimensions": "base radius 0.40 m, platform radius 0.10 m, l1 = l2 = 0.25 m, m1 = 0.5 kg, "
            "m2 = 0.3 kg, platform 0.6 kg / 1.5e-3 kg m², rotor 3e-5 kg m², gear 10 (chosen: the paper's "
            "appendix S1 is not in the text)",
            "baumgarte_alpha_beta": args.alpha,
            "trajectory": {k: np.asarray(v).tolist() for k, v in params["trajectory"].items()},
            "min_serial_singularity_measure": float(jnp.min(serial)),
            "min_parallel_singularity_measure": float(jnp.min(parallel)),
        },
        "integrator": integrator_record(args),
        "inverse_dynamics": {
            "how": "servo constraints platform pose = prescribed (x, y, θ)(t), minimum-norm servo control "
            "(Liu et al. 2015 eq. 35, passive constraints projected); one-shot UK, method "
            f"{CLOSED_LOOP_METHOD!r}",
            "status": RESULTS.message(closed.status),
            "max_abs_platform_tracking_error": float(np.max(np.abs(closed_pose - ref_pose))),
            "max_abs_passive_violation_m": float(closed.max_position_residual),
            "torque_range_Nm": [
                [float(lo), float(hi)]
                for lo, hi in zip(np.asarray(closed.u).min(0), np.asarray(closed.u).max(0), strict=True)
            ],
            "max_abs_torque_minus_kkt_Nm": float(np.max(np.abs(np.asarray(closed.u) - u_kkt))),
            "max_abs_torque_minus_feedforward_Nm": float(np.max(np.abs(np.asarray(closed.u) - u_ff))),
            "kkt": "[[M, -Aᵀ, -B], [A, 0, 0], [A_s, 0, 0]] [q̈; λ; u] = [Q; b; b_s] at each saved state "
            "(NumPy)",
        },
        "forward_rigid": {
            "how": "passive mechanism driven by the feedforward torques (KKT inverse dynamics on the "
            "closed-form inverse kinematics); recursive solver, one Kalman update per level = scenario 0 of "
            "the batch (R = 0)",
            "status_recursive": status[0],
            "max_rel_qdd_recursive_minus_one_shot_along_run": qdd_gap,
            "max_abs_platform_error_vs_prescribed": float(np.max(np.abs(recursive_rigid_pose - ref_pose))),
            "max_position_violation_m": float(position_violation[0]),
            "rigid_peak_reaction_N_or_Nm": dict(zip(names, rigid_peak.tolist(), strict=True)),
        },
        "clearance_monte_carlo": {
            "meaning": CLEARANCE_MEANING,
            "how": f"{args.samples} runs per level; each of the 9 joints (3 pivots, 3 elbows, 3 platform "
            f"joints) gets σ² = level x s, ln s uniform in [-ln {args.spread}, ln {args.spread}] "
            f"(seed {args.seed}); gears rigid; deviation and reaction change are against the rigid run "
            "(scenario 0)",
            "per_level": per_level,
            "compliant_joint_check": {
                "how": "per joint with clearance: max_t |φ_j| / max_t (σ²_j |λ_j| / β²), the measured "
                "deflection over the quasi-static spring prediction φ ≈ -Rλ/β²; 1 means a quasi-static "
                "spring of stiffness β²/σ²; deviations come from the Baumgarte dynamics (α = β, the "
                "joint gains) and the coupling of the joints",
                "ratio_median": float(np.median(spring_ratio)),
                "ratio_min": float(np.min(spring_ratio)),
                "ratio_max": float(np.max(spring_ratio)),
            },
            "runs": [
                {
                    "sigma2_per_kg": sigma2[i].tolist(),
                    "status": status[i],
                    "max_position_violation_m": float(position_violation[i]),
                    "platform_position_deviation_m": float(deviation[i]),
                    "max_reaction_change_N": float(reaction_change[i]),
                }
                for i in range(count)
            ],
        },
        "wall_seconds_including_compile": timings,
    }
    violation = {"sigma2": list(sigma2), "position": position_violation}
    metrics["figures"] = _figures(
        out,
        args,
        np.asarray(ts),
        ref_pose,
        closed,
        u_kkt,
        u_ff,
        runs,
        levels_of,
        violation,
        deviation,
        reactions,
        names,
        params,
    )
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics, args)
    return metrics


def _print_summary(m: dict, args) -> None:
    inv, fwd, mc = m["inverse_dynamics"], m["forward_rigid"], m["clearance_monte_carlo"]
    lines = [
        f"3RRR (Orsino 2017), t1 = {args.t1:g} s, Tsit5 adaptive, rtol {args.rtol:g}, atol {args.atol:g}",
        f"  inverse dynamics (servo constraints): {status_name(inv['status'])}; |u - KKT solve| <= "
        f"{inv['max_abs_torque_minus_kkt_Nm']:.1e} N m, |u - feedforward| <= "
        f"{inv['max_abs_torque_minus_feedforward_Nm']:.1e} N m, passive violation <= "
        f"{inv['max_abs_passive_violation_m']:.1e} (m or rad)",
        f"  forward, recursive (Kalman) solver, rigid: {fwd['status_recursive']}; |q̈ recursive - one-shot| / "
        f"|q̈| <= {fwd['max_rel_qdd_recursive_minus_one_shot_along_run']:.1e}; platform off the prescribed "
        f"path by <= {fwd['max_abs_platform_error_vs_prescribed']:.1e} (m or rad)",
        f"  clearances (eq. 4.17-4.18), {args.samples} runs per level: σ² level (1/kg), platform deviation "
        "from the rigid run (m, max), constraint violation (m or rad, max), statuses",
    ]
    for level in mc["per_level"]:
        statuses = ", ".join(f"{count} {name}" for name, count in level["statuses"].items() if count)
        lines.append(
            f"    {level['sigma2_level_per_kg']:8.0e}  {level['platform_position_deviation_m']['max']:9.2e}  "
            f"{level['max_position_violation_m']['max']:9.2e}  {statuses}"
        )
    check = mc["compliant_joint_check"]
    lines.append(
        f"  joint deflection / quasi-static spring prediction Rλ/β²: median {check['ratio_median']:.2f} "
        f"(range {check['ratio_min']:.2f} ... {check['ratio_max']:.2f})"
    )
    print("\n".join(lines))
