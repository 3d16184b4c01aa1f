"""Two-link flexible-joint manipulator under the UK-based control of the UK review (Chin. J.
Mech. Eng., §8.3, eq. 66-72; seed file 002_083747a4dba3b0ed.txt).

The paper starts the links with rates q̇⁽²⁾ = 1, q̇⁽⁴⁾ = -0.1 (β(0) = 0.9 off the task q̇⁽²⁾ + q̇⁽⁴⁾ = 0)
and reports |β| below 10⁻³ within 2 s (its Fig. 10) and the link rates (its Fig. 11). This study simulates
the model of :mod:`ukjax.models.flexible_joint` twice with ``ukjax.simulate`` (one compiled program): motors
started on the torque manifold (β then follows the closed form exp(-t/P) β(0) of eq. 72 exactly) and motors
started with relaxed springs (the motor servo constraint must first build up the elastic torque). It reports
for each the time at which |β| falls to the tolerance, the deviation from the closed form, the
servo-constraint residual, the motor torques, and the integrator settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.models import flexible_joint as model
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
DESCRIPTION = f"{PAPER}, §8.3: flexible-joint manipulator, UK-based control eq. 71-72, |β| 0.9 -> 1e-3 in 2 s"
PAPER_DEFAULTS = {"--tolerance": f"{PAPER}, §8.3 and Fig. 10: |β| below 1e-3 within 2 s"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = model.default_params()
    add_output_arguments(parser, "flexible_joint")
    parser.add_argument("--t1", type=float, default=3.0, help="end time (s)")
    parser.add_argument(
        "--P", type=float, default=float(defaults["P"][0, 0]), help="P (s) of eq. 72 (1 x 1), not printed"
    )
    for flag, key, text in (("--alpha-motor", "alpha_motor", "α_m"), ("--beta-motor", "beta_motor", "β_m")):
        default = float(defaults[key])
        parser.add_argument(flag, type=float, default=default, help=f"motor-loop gain {text} (1/s)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="|β| (rad/s) to report the time of")
    add_integrator_arguments(parser, tolerance=1e-10, num_saves=601)


def params_from_args(args) -> dict:
    params = model.default_params()
    params["P"] = jnp.full((1, 1), args.P, jnp.float64)
    params["alpha_motor"] = jnp.asarray(args.alpha_motor, jnp.float64)
    params["beta_motor"] = jnp.asarray(args.beta_motor, jnp.float64)
    return params


def _scenario(system, params, motor, ts, args):
    q0, qd0 = model.initial_state(params, motor=motor)
    sol = simulate(system, q0, qd0, params, t1=args.t1, ts=ts, rtol=args.rtol, atol=args.atol)
    beta = np.asarray(jax.vmap(lambda q, qd: model.tracking_error(q, qd, params))(sol.q, sol.qd))[:, 0]
    e = np.asarray(jax.vmap(lambda q, qd: model.torque_error(q, qd, params))(sol.q, sol.qd))
    closed = np.asarray(model.beta_closed_form(sol.ts, jnp.asarray(beta[:1]), params))[:, 0]
    metrics = {
        "motor_start": motor,
        "status": RESULTS.message(sol.status),
        "num_steps": int(sol.num_steps),
        "beta0": float(beta[0]),
        "time_to_tolerance_s": first_time_below(sol.ts, beta, args.tolerance),
        "closed_form_time_to_tolerance_s": float(model.time_to_tolerance(beta[0], args.tolerance, params)),
        "final_abs_beta": float(abs(beta[-1])),
        "max_abs_beta_minus_closed_form": float(np.max(np.abs(beta - closed))),
        "max_abs_servo_residual": float(np.max(np.abs(np.asarray(sol.servo_residual)))),
        "max_abs_torque_error_Nm": float(np.max(np.abs(e))),
        "max_abs_motor_torque_Nm": float(np.max(np.abs(np.asarray(sol.u)))),
    }
    return sol, beta, closed, e, metrics


def _figures(out: Path, runs, tolerance):
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (sol, beta, _, _, _) in runs.items():
        ax.semilogy(sol.ts, np.abs(beta), label=f"|β|, motors {name}")
    sol, _, closed, _, _ = runs["matched"]
    ax.semilogy(sol.ts, np.abs(closed), "k:", label="closed form 0.9 exp(-t/P)")
    ax.axhline(tolerance, color="gray", lw=0.8)
    ax.set(xlabel="t (s)", ylabel="|β| = |q̇(2) + q̇(4)| (rad/s)", title=f"Constraint error ({PAPER}, Fig. 10)")
    ax.legend(fontsize=8)
    save_figure(fig, out / "constraint_error.png")

    fig, axes = plt.subplots(3, 1, figsize=(6, 7), sharex=True)
    for name, (sol, _, _, e, _) in runs.items():
        qd = np.asarray(sol.qd)
        axes[0].plot(sol.ts, qd[:, 0], label=f"q̇(2), {name}")
        axes[0].plot(sol.ts, qd[:, 1], "--", label=f"q̇(4), {name}")
        for k in range(2):
            axes[1].plot(sol.ts, np.asarray(sol.u)[:, k], label=f"u{k + 1}, {name}")
        axes[2].semilogy(sol.ts, np.linalg.norm(e, axis=1) + 1e-18, label=f"‖e‖, {name}")
    axes[0].set(ylabel="link rates (rad/s)", title=f"Link rates ({PAPER}, Fig. 11), torques, torque error")
    axes[1].set(ylabel="u (N m)")
    axes[2].set(xlabel="t (s)", ylabel="‖K(q₂-q₁) - τ_d‖ (N m)")
    for ax in axes:
        ax.legend(fontsize=7)
    save_figure(fig, out / "link_rates_and_torques.png")


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    params = params_from_args(args)
    system = model.system()
    ts = jnp.linspace(0.0, args.t1, args.num_saves)
    runs = {motor: _scenario(system, params, motor, ts, args) for motor in model.MOTOR_STARTS}
    metrics = {
        "paper": f"{PAPER}, §8.3, eq. 66-72; reported: |β| < 1e-3 within 2 s from β(0) = 0.9",
        "integrator": integrator_record(args),
        "parameters": {k: np.asarray(v).tolist() for k, v in params.items()},
        "tolerance": args.tolerance,
        "constraint_violation": "β = q̇(2) + q̇(4) (eq. 69); servo residual: ë + 2α_m ė + β_m² e (motors)",
        "scenarios": {name: run_[4] for name, run_ in runs.items()},
    }
    _figures(out, runs, args.tolerance)
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics, args)
    return metrics


def _print_summary(m: dict, args) -> None:
    lines = [
        f"flexible-joint manipulator ({PAPER}, §8.3), P = {args.P:g} s, t1 = {args.t1:g} s, Tsit5 adaptive, "
        f"rtol {args.rtol:g}, atol {args.atol:g}; paper: |β| < 1e-3 within 2 s"
    ]
    for name, r in m["scenarios"].items():
        lines.append(
            f"  motors {name}: {status_name(r['status'])}; |β| {r['beta0']:.2g} -> {r['final_abs_beta']:.1e} "
            f"rad/s, {time_text(r['time_to_tolerance_s'], args.tolerance)} (closed form "
            f"{r['closed_form_time_to_tolerance_s']:.3f} s, |β - closed form| <= "
            f"{r['max_abs_beta_minus_closed_form']:.1e}); max |u| {r['max_abs_motor_torque_Nm']:.3g} N m; "
            f"servo residual <= {r['max_abs_servo_residual']:.1e} N m/s²"
        )
    print("\n".join(lines))
