"""Five mobile robots under the velocity-level swarm constraint of the UK review (Chin. J. Mech. Eng.,
§8.2, eq. 60-65; seed file 002_083747a4dba3b0ed.txt).

The paper reports that the robots never collide, aggregate when far apart and separate when too close (its
Fig. 7), and that ‖β(t)‖ falls from a large initial value below 0.01 (its Fig. 8); its table of initial
conditions is missing. This study simulates :mod:`ukjax.models.swarm` (initial positions chosen there,
robots at rest) with ``ukjax.simulate`` and reports ‖β‖ against the closed form e^{-κt}‖β(0)‖ the stabilized
UK force imposes, the time at which ‖β‖ falls to 0.01, the minimum distance between any two robots over the
saved times, the drift of the centroid, and the final formation against the regular pentagon that balances
eq. 61.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import brentq

from ukjax.models import swarm as model
from ukjax.simulation import RESULTS, simulate
from ukjax.studies._common import (
    add_integrator_arguments,
    add_output_arguments,
    first_time_below,
    integrator_record,
    prepare_output,
    pyplot,
    save_figure,
    status_name,
    time_text,
    write_json,
)

PAPER = "UK review, Chin. J. Mech. Eng."  # the review's text names no authors or year
DESCRIPTION = f"{PAPER}, §8.2: five robots under the swarm constraint eq. 61-62; ‖β‖ < 0.01, no collisions"
PAPER_DEFAULTS = {
    "--mass": f"{PAPER}, §8.2",
    "--tolerance": f"{PAPER}, §8.2 and Fig. 8: ‖β‖ falls below 0.01",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = model.default_params()
    add_output_arguments(parser, "swarm")
    parser.add_argument("--t1", type=float, default=10.0, help="end time (s)")
    parser.add_argument("--mass", type=float, default=2.0, help="robot mass m_i (kg)")
    parser.add_argument(
        "--kappa", type=float, default=float(defaults["kappa"]), help="stabilization κ (1/s): ‖β‖ ∝ e^(-κt)"
    )
    parser.add_argument("--tolerance", type=float, default=0.01, help="‖β‖ level (m/s) to report the time of")
    add_integrator_arguments(parser, tolerance=1e-10, num_saves=1001)


def pentagon_distances(params) -> tuple[float, float]:
    """(side, diagonal) of the regular pentagon in which every robot satisfies q̇ = -∇U = 0 (eq. 61).

    With circumradius R, a vertex sees its neighbours at d₁ = 2R sin 36° and the others at d₂ = 2R sin 72°;
    the radial component of eq. 61 vanishes when Σ (1 - cos θ_k)(a_a - a_r/d_k) = 0 over θ = 72°, 144°.
    """
    a_r, a_a = float(params["repulsion"]), float(params["attraction"])
    s1, s2 = np.sin(np.pi / 5), np.sin(2 * np.pi / 5)
    c1, c2 = 1 - np.cos(2 * np.pi / 5), 1 - np.cos(4 * np.pi / 5)

    def radial(R):
        return c1 * (a_a - a_r / (2 * R * s1)) + c2 * (a_a - a_r / (2 * R * s2))

    R = brentq(radial, 1e-6 * a_r / a_a, 10 * a_r / a_a)
    return 2 * R * s1, 2 * R * s2


def _figures(out: Path, sol, beta_norm, closed_norm, dmin, tolerance):
    plt = pyplot()

    x = np.asarray(sol.q).reshape(len(sol.ts), -1, 2)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i in range(x.shape[1]):
        (line,) = ax.plot(x[:, i, 0], x[:, i, 1], lw=1, label=f"robot {i + 1}")
        ax.plot(x[0, i, 0], x[0, i, 1], "o", color=line.get_color())
        ax.plot(x[-1, i, 0], x[-1, i, 1], "s", color=line.get_color(), ms=4)
    ax.set(xlabel="x (m)", ylabel="y (m)", title=f"Robot trajectories ({PAPER}, Fig. 7); o start, ■ end")
    ax.set_aspect("equal")
    ax.legend(fontsize=7)
    save_figure(fig, out / "trajectories.png")

    fig, axes = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    axes[0].semilogy(sol.ts, beta_norm, label="‖β(t)‖ simulated")
    axes[0].semilogy(sol.ts, closed_norm, "k:", label="closed form e^{-κt}‖β(0)‖")
    axes[0].axhline(tolerance, color="gray", lw=0.8)
    axes[0].set(ylabel="‖β‖ (m/s)", title=f"Swarm performance error ({PAPER}, Fig. 8)")
    axes[0].legend(fontsize=8)
    axes[1].plot(sol.ts, dmin)
    axes[1].set(xlabel="t (s)", ylabel="min distance (m)", title="Closest pair of robots")
    save_figure(fig, out / "error_and_distance.png")


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    params = model.default_params()
    params["mass"] = jnp.full_like(params["mass"], args.mass)
    params["kappa"] = jnp.asarray(args.kappa, jnp.float64)
    system = model.system()
    q0, qd0 = model.initial_state(params)
    ts = jnp.linspace(0.0, args.t1, args.num_saves)
    sol = simulate(system, q0, qd0, params, t1=args.t1, ts=ts, rtol=args.rtol, atol=args.atol)

    beta = np.asarray(sol.velocity_residual)
    beta_norm = np.linalg.norm(beta, axis=1)
    closed_norm = np.linalg.norm(np.asarray(model.beta_closed_form(sol.ts, beta[0], params)), axis=1)
    distances = np.asarray(jax.vmap(model.pairwise_distances)(sol.q))
    dmin = distances.min(axis=1)
    k = int(np.argmin(dmin))
    i, j = model.pairs(model.NUM_ROBOTS)
    closest = int(np.argmin(distances[k]))
    centroid = np.asarray(sol.q).reshape(len(sol.ts), -1, 2).mean(axis=1)
    side, diagonal = pentagon_distances(params)
    final = np.sort(distances[-1])
    metrics = {
        "paper": f"{PAPER}, §8.2, eq. 60-65; reported: no collisions, ‖β‖ falls below 0.01",
        "integrator": integrator_record(args),
        "status": RESULTS.message(sol.status),
        "num_steps": int(sol.num_steps),
        "parameters": {name: np.asarray(v).tolist() for name, v in params.items()},
        "initial_positions_m": model.INITIAL_POSITIONS.tolist(),
        "constraint_violation": "β = q̇ + ∇U (eq. 65), all robots stacked",
        "beta0_norm": float(beta_norm[0]),
        "final_beta_norm": float(beta_norm[-1]),
        "time_to_tolerance_s": first_time_below(sol.ts, beta_norm, args.tolerance),
        "closed_form_time_to_tolerance_s": float(np.log(beta_norm[0] / args.tolerance) / args.kappa),
        "max_rel_beta_minus_closed_form": float(np.max(np.abs(beta_norm - closed_norm) / closed_norm)),
        "min_pairwise_distance_m": float(dmin[k]),
        "min_pairwise_distance_time_s": float(sol.ts[k]),
        "min_pairwise_distance_pair": [int(i[closest]) + 1, int(j[closest]) + 1],
        "save_interval_s": float(sol.ts[1] - sol.ts[0]),
        "centroid_drift_m": float(np.max(np.linalg.norm(centroid - centroid[0], axis=1))),
        "final_pairwise_distances_m": final.tolist(),
        "pentagon_side_diagonal_m": [side, diagonal],
        "max_final_distance_minus_pentagon_m": float(
            np.max(np.abs(final - np.array([side] * 5 + [diagonal] * 5)))
        ),
    }
    _figures(out, sol, beta_norm, closed_norm, dmin, args.tolerance)
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics, args)
    return metrics


def _print_summary(m: dict, args) -> None:
    print(
        f"swarm of five robots ({PAPER}, §8.2), t1 = {args.t1:g} s, Tsit5 adaptive, rtol {args.rtol:g}, "
        f"atol {args.atol:g}: {status_name(m['status'])}\n"
        f"  ‖β‖ (m/s): {m['beta0_norm']:.3g} at t = 0 -> {m['final_beta_norm']:.2e} at t1; "
        f"{time_text(m['time_to_tolerance_s'], args.tolerance)} (closed form e^(-κt)‖β(0)‖: "
        f"{m['closed_form_time_to_tolerance_s']:.3f} s; largest relative gap "
        f"{m['max_rel_beta_minus_closed_form']:.1e})\n"
        f"  closest approach {m['min_pairwise_distance_m']:.3f} m (robots {m['min_pairwise_distance_pair']} "
        f"at t = {m['min_pairwise_distance_time_s']:.2f} s); final distances within "
        f"{m['max_final_distance_minus_pentagon_m']:.1e} m of the regular pentagon; centroid drift "
        f"{m['centroid_drift_m']:.1e} m"
    )
