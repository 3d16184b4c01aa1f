"""A particle on a logarithmic spiral at a prescribed angular rate (UK review, Chin. J. Mech. Eng.,
§8.1, Figures 2-5; seed file 002_083747a4dba3b0ed.txt).

The paper integrates the UK equation eq. 57 (:mod:`ukjax.models.spiral`) from consistent initial conditions
and plots r against θ, r(t) and θ(t), the Cartesian path, and the position and velocity errors ε1 (eq. 58)
and ε2 (eq. 59); the magnitudes of ε1, ε2 are not printed in its text. Without stabilization the errors are
pure integration drift, so this study reports them for each integrator tolerance given (default 1e-6, 1e-8,
1e-10, one compiled program), together with the deviation from the exact motion θ = θ₀ - t, r = e^{kθ}.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.models import spiral as model
from ukjax.simulation import RESULTS, simulate
from ukjax.studies._common import (
    add_output_arguments,
    prepare_output,
    pyplot,
    save_figure,
    status_name,
    write_json,
)

DESCRIPTION = (
    "UK review, Chin. J. Mech. Eng., §8.1: particle on a logarithmic spiral; r(θ), r(t), θ(t), path, "
    "errors ε1, ε2 (eq. 58-59)"
)
PAPER = "UK review, Chin. J. Mech. Eng."  # the review's text names no authors or year
PAPER_DEFAULTS: dict[str, str] = {}  # the paper prints no tolerances, span or save times


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_output_arguments(parser, "spiral")
    parser.add_argument(
        "--t1", type=float, default=30.0, help="end time (s); θ runs from the paper's θ₀ = 30 rad to 30 - t1"
    )
    parser.add_argument(
        "--tols", type=_floats, default=[1e-6, 1e-8, 1e-10], help="Tsit5 rtol = atol values, comma-separated"
    )
    parser.add_argument("--num-saves", type=int, default=601, help="number of evenly spaced save times")


def _figures(out: Path, ts, runs, best):
    plt = pyplot()

    q = runs[best]["q"]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(q[:, 1], q[:, 0])
    ax.set_xlabel("θ (rad)")
    ax.set_ylabel("r (m)")
    ax.set_title(f"r against θ ({PAPER}, Fig. 2)", fontsize=9)
    paths.append(save_figure(fig, out / "r_theta.png"))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].plot(ts, q[:, 0])
    axes[0].set_ylabel("r (m)")
    axes[1].plot(ts, q[:, 1])
    axes[1].set_ylabel("θ (rad)")
    for ax in axes:
        ax.set_xlabel("t (s)")
    fig.suptitle(f"Time histories ({PAPER}, Fig. 3)")
    paths.append(save_figure(fig, out / "time_histories.png"))

    fig, ax = plt.subplots(figsize=(5, 5))
    x, y = q[:, 0] * np.cos(q[:, 1]), q[:, 0] * np.sin(q[:, 1])
    ax.plot(x, y)
    ax.plot(x[0], y[0], "ko")
    ax.annotate("G", (x[0], y[0]))
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"Trajectory ({PAPER}, Fig. 4)", fontsize=9)
    paths.append(save_figure(fig, out / "trajectory.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharex=True)
    for tol, run in runs.items():
        axes[0].semilogy(ts, np.maximum(run["eps1"], 1e-18), label=f"tol {tol:g}")
        axes[1].semilogy(ts, np.maximum(run["eps2"], 1e-18), label=f"tol {tol:g}")
    axes[0].set_ylabel("ε1, position error (eq. 58) (m or rad)")
    axes[1].set_ylabel("ε2, velocity error (eq. 59) (m/s or rad/s)")
    for ax in axes:
        ax.set_xlabel("t (s)")
        ax.legend(fontsize=7)
    fig.suptitle(f"Constraint errors, Tsit5 adaptive, rtol = atol = tol ({PAPER}, Fig. 5)")
    paths.append(save_figure(fig, out / "errors.png"))
    return paths


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    p = model.default_params()
    q0, qd0 = model.initial_state(p)
    system = model.system()
    ts = jnp.linspace(0.0, args.t1, args.num_saves)
    exact = np.stack([np.exp(0.1 * (30.0 - np.asarray(ts))), 30.0 - np.asarray(ts)], axis=1)
    runs, table = {}, {}
    lines = [f"spiral particle ({PAPER}, §8.1), t1 = {args.t1} s, diffrax Tsit5 adaptive, no stabilization"]
    for tol in args.tols:
        start = time.perf_counter()
        sol = simulate(system, q0, qd0, p, t1=args.t1, ts=ts, rtol=tol, atol=tol)
        jax.block_until_ready(sol.q)
        wall = time.perf_counter() - start
        eps1, eps2 = jax.vmap(model.errors, in_axes=(0, 0, 0, None))(sol.q, sol.qd, ts, p)
        runs[tol] = {"q": np.asarray(sol.q), "eps1": np.asarray(eps1), "eps2": np.asarray(eps2)}
        table[f"{tol:g}"] = {
            "status": RESULTS.message(int(sol.status)),
            "max_eps1": float(jnp.max(eps1)),
            "max_eps2": float(jnp.max(eps2)),
            "final_eps1": float(eps1[-1]),
            "final_eps2": float(eps2[-1]),
            "max_deviation_from_exact_motion": float(np.abs(np.asarray(sol.q) - exact).max()),
            "steps": int(sol.num_steps),
            "function_evals": int(sol.num_function_evals),
            "wall_time_s": wall,
        }
        row = table[f"{tol:g}"]
        lines.append(
            f"  tol {tol:7.0e}: max ε1 {row['max_eps1']:.2e} (m or rad), max ε2 {row['max_eps2']:.2e} "
            f"(m/s or rad/s), |q - exact| {row['max_deviation_from_exact_motion']:.2e} (m or rad), steps "
            f"{row['steps']}, {status_name(row['status'])}"
        )
    best = min(args.tols)
    metrics = {
        "setup": {
            "integrator": "diffrax Tsit5, adaptive PID controller, rtol = atol = tol",
            "t1_s": args.t1,
            "q0": q0,
            "qd0": qd0,
            "stabilization": "none (as in the paper)",
        },
        "paper": f"{PAPER}, §8.1: Figure 5 shows ε1, ε2 (eq. 58-59); the text prints no values of them",
        "runs": table,
        "figures": _figures(out, np.asarray(ts), runs, best),
    }
    print("\n".join(lines))
    write_json(out / "metrics.json", metrics)
    return metrics
