"""Underactuated two-mass spring of Liu et al. 2015 (§IV) under servo-constraint control (eq. 36-47;
seed file 000_501f497dd266e1a0.txt).

Two runs of :mod:`ukjax.models.two_mass_spring` in one compiled batch: a start that satisfies the servo
constraint x2 - x1 = 2l (both masses moving at the same speed), and one that violates it by ``--offset``.
The study reports the computed control F against the closed form eq. 47 along the simulated trajectory (and,
off the constraint, against eq. 47 plus the Baumgarte terms m1(2αφ̇ + β²φ)), and the servo-constraint
error φ(t) against the critically damped solution (φ0 + (φ̇0 + αφ0)t)e^{-αt} of φ̈ + 2αφ̇ + β²φ = 0
with α = β.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ukjax.models import two_mass_spring as model
from ukjax.simulation import RESULTS, simulate_batch
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
    "Liu et al. 2015, §IV: underactuated two-mass spring; control F vs closed form eq. 47, Baumgarte decay"
)
PAPER_DEFAULTS: dict[str, str] = {}  # Liu et al. 2015 print no masses, stiffness, length or gains for §IV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = model.default_params()
    add_output_arguments(parser, "two_mass_spring")
    for name, text in (
        ("m1", "mass m1 (kg)"),
        ("m2", "mass m2 (kg)"),
        ("k", "spring stiffness (N/m)"),
        ("l", "spring rest length (m)"),
        ("alpha", "Baumgarte α (1/s)"),
        ("beta", "Baumgarte β (1/s)"),
    ):
        parser.add_argument(
            f"--{name}", type=float, default=float(d[name]), help=f"{text}; Liu et al. 2015 give none"
        )
    parser.add_argument("--offset", type=float, default=0.2, help="initial violation of x2 - x1 = 2l (m)")
    parser.add_argument(
        "--velocity", type=float, default=0.5, help="initial speed of the compatible run (m/s)"
    )
    parser.add_argument("--t1", type=float, default=3.0, help="end time (s)")
    add_integrator_arguments(parser, tolerance=1e-11, num_saves=301)


def _figures(out: Path, sols, F_closed, phi_closed, labels):
    plt = pyplot()

    ts = np.asarray(sols.ts[0])
    fig, axes = plt.subplots(3, 1, figsize=(6.5, 8), sharex=True)
    for i, label in enumerate(labels):
        axes[0].plot(ts, sols.q[i, :, 0], label=f"x1, {label}")
        axes[0].plot(ts, sols.q[i, :, 1], "--", label=f"x2, {label}")
        axes[1].plot(ts, sols.u[i, :, 0], label=f"F simulated, {label}")
        axes[1].plot(ts, F_closed[i], "k:", lw=1)
        err = np.maximum(np.abs(np.asarray(sols.servo_residual[i, :, 0])), 1e-18)
        axes[2].semilogy(ts, err, label=f"|x2 - x1 - 2l|, {label}")
    axes[2].semilogy(ts, np.maximum(np.abs(phi_closed), 1e-18), "k:", lw=1, label="closed form (α = β)")
    axes[1].plot([], [], "k:", label="closed form eq. 47 (+ Baumgarte terms)")
    axes[0].set(
        ylabel="position (m)", title="Two-mass spring, servo constraint x2 - x1 = 2l (Liu et al. 2015, §IV)"
    )
    axes[1].set(ylabel="control F (N)")
    axes[2].set(xlabel="t (s)", ylabel="servo constraint error (m)")
    for ax in axes:
        ax.legend(fontsize=7)
    save_figure(fig, out / "two_mass_spring.png")


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    params = {k: jnp.asarray(getattr(args, k), jnp.float64) for k in ("m1", "m2", "k", "l", "alpha", "beta")}
    system = model.system()
    starts = [
        model.initial_state(params, velocity=args.velocity),
        model.initial_state(params, offset=args.offset),
    ]
    labels = ["compatible start", f"start off by {args.offset:g} m"]
    q0 = jnp.stack([s[0] for s in starts])
    qd0 = jnp.stack([s[1] for s in starts])
    ts = jnp.linspace(0.0, args.t1, args.num_saves)
    start = time.perf_counter()
    sols = simulate_batch(system, q0, qd0, params, t1=args.t1, ts=ts, rtol=args.rtol, atol=args.atol)
    jax.block_until_ready(sols.q)
    wall = time.perf_counter() - start

    closed = jax.vmap(jax.vmap(model.closed_form_control, in_axes=(0, 0, None)), in_axes=(0, 0, None))
    F_closed = np.asarray(closed(sols.q, sols.qd, params))
    stretch = sols.q[0, :, 1] - sols.q[0, :, 0] - params["l"]
    eq47 = np.asarray(-(1 + params["m1"] / params["m2"]) * params["k"] * stretch)
    phi_closed = np.asarray(model.servo_error_closed_form(ts, args.offset, 0.0, params))
    phi = np.asarray(sols.servo_residual[:, :, 0])
    u = np.asarray(sols.u[:, :, 0])
    metrics = {
        "paper": "Liu et al. 2015, §IV, eq. 36-47",
        "params": {k: float(v) for k, v in params.items()},
        "integrator": integrator_record(args),
        "wall_seconds_including_compile": wall,
        "compatible_start": {
            "status": RESULTS.message(sols.status[0]),
            "num_steps": int(sols.num_steps[0]),
            "max_abs_F_minus_eq47": float(np.max(np.abs(u[0] - eq47))),
            "max_abs_F": float(np.max(np.abs(u[0]))),
            "max_abs_servo_constraint_error": float(np.max(np.abs(phi[0]))),
        },
        "incompatible_start": {
            "status": RESULTS.message(sols.status[1]),
            "num_steps": int(sols.num_steps[1]),
            "initial_servo_constraint_error": args.offset,
            "final_servo_constraint_error": float(abs(phi[1, -1])),
            "max_abs_phi_minus_closed_form_decay": float(np.max(np.abs(phi[1] - phi_closed))),
            "max_abs_F_minus_closed_form_with_baumgarte": float(np.max(np.abs(u[1] - F_closed[1]))),
        },
        "figures": ["two_mass_spring.png"],
    }
    _figures(out, sols, F_closed, phi_closed, labels)
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics, args)
    return metrics


def _print_summary(m: dict, args) -> None:
    good, bad = m["compatible_start"], m["incompatible_start"]
    print(
        f"two-mass spring (Liu et al. 2015, §IV), t1 = {args.t1:g} s, Tsit5 adaptive, rtol {args.rtol:g}, "
        f"atol {args.atol:g}\n"
        f"  compatible start: {status_name(good['status'])}; control F against eq. 47: max |F - F_eq47| = "
        f"{good['max_abs_F_minus_eq47']:.2e} N (max |F| {good['max_abs_F']:.3g} N); max |servo error| = "
        f"{good['max_abs_servo_constraint_error']:.2e} m\n"
        f"  start off by {args.offset:g} m: {status_name(bad['status'])}; servo error {args.offset:g} -> "
        f"{bad['final_servo_constraint_error']:.2e} m at t1; |φ - closed-form decay| <= "
        f"{bad['max_abs_phi_minus_closed_form_decay']:.2e} m; |F - closed form with Baumgarte terms| <= "
        f"{bad['max_abs_F_minus_closed_form_with_baumgarte']:.2e} N"
    )
