"""Tuning study: servo-constraint gains of the underactuated two-mass spring (Liu et al. 2015, §IV) under an
actuator limit, and the trade-off between tracking error and peak control force.

The actuator on m1 enforces the servo constraint x2 - x1 = 2l (Liu et al. 2015, eq. 44) through the control
F = (C B̄)⁺ b̄ (eq. 35, closed form eq. 47), with Baumgarte error dynamics φ̈ + 2αφ̇ + β²φ = 0 (§III-B). Large
gains pull φ to zero fast but need a large F at the start, where the constraint is violated. Per scenario:

    J = ∫ φ² dt + w_u · smoothmax_t |F(t)| + w_lim · ∫ max(|F| - F_max, 0)² dt,

risk = mean over a Monte-Carlo batch (initial violation φ(0) uniform in [0.1, 0.3] m, masses and stiffness
±5 %, initial speed 0.5 ± 0.1 m/s). One gradient fit (:func:`ukjax.tune.fit`, Adam in log-gains, bounded by
the stability interval of Tsit5 at the step) per weight w_u gives the trade-off curve of tracking error
against peak |F|; w_u = 0 is "minimize tracking error subject to |F| ≤ F_max" by the penalty. Every fit
reuses one compiled step (weights are traced). Each result is scored on a held-out batch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import tune
from ukjax.models import two_mass_spring as model
from ukjax.simulation import simulate_batch
from ukjax.studies._common import (
    add_batch_arguments,
    add_optimizer_arguments,
    fit_from_args,
    fixed_step_record,
    prepare_output,
    pyplot,
    save_figure,
    scale_uniformly,
    train_and_heldout,
    write_json,
)

DESCRIPTION = (
    "servo gains of the two-mass spring (Liu et al. 2015, §IV) under |F| <= F_max: tracking error vs "
    "peak |F| trade-off"
)
PAPER_DEFAULTS: dict[str, str] = {}  # Liu et al. 2015 print no gains, masses or limits for §IV
PERTURBED = ("m1", "m2", "k")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_batch_arguments(parser, "tune_servo", train_scenarios=32, heldout_scenarios=128, t1=3.0, dt=5e-3)
    parser.add_argument("--u-max", type=float, default=20.0, help="actuator limit F_max (N)")
    parser.add_argument("--limit-weight", type=float, default=1.0, help="weight w_lim of the limit penalty")
    parser.add_argument(
        "--weights",
        type=float,
        nargs="+",
        default=[0.0, 3e-4, 1e-3, 3e-3, 1e-2],
        help="weights w_u on peak |F|",
    )
    parser.add_argument("--grid", type=int, default=16, help="landscape grid points per gain")
    add_optimizer_arguments(parser, steps=40, learning_rate=0.1, steps_help="optimizer steps per weight")


def scenarios(key, count):
    """Initial violations φ(0) ~ U[0.1, 0.3] m, speeds 0.5 ± 0.1 m/s, m1, m2, k ±5 % (uniform)."""
    p = model.default_params()
    keys = jax.random.split(key, len(PERTURBED) + 2)
    batch = {k: jnp.broadcast_to(v, (count,)) for k, v in p.items()}
    batch.update(scale_uniformly(p, PERTURBED, keys, count))
    offset = jax.random.uniform(keys[-2], (count,), jnp.float64, 0.1, 0.3)
    speed = 0.5 + 0.1 * jax.random.uniform(keys[-1], (count,), jnp.float64, -1.0, 1.0)
    q0 = jnp.stack([jnp.zeros(count), 2.0 * p["l"] + offset], axis=1)
    qd0 = jnp.stack([speed, speed], axis=1)
    return tune.Scenarios(q0, qd0, batch)


def objective(u_max, limit_weight):
    return (
        tune.servo_tracking(name="tracking")
        + 0.0 * tune.peak_control(name="peak_control")
        + limit_weight * tune.actuator_limit(u_max, name="actuator_limit")
    )


def _score(system, space, batch, options, u_max):
    """Held-out metrics at θ: mean ∫φ² dt, per-scenario peak |F| (true max over saved times), failures."""

    @jax.jit
    def score(theta):
        params = jax.vmap(lambda base: space.params(theta, base))(batch.params)

        sol = simulate_batch(system, batch.q0, batch.qd0, params, batch_params=True, **options)
        tracking = jax.vmap(lambda s, p: tune.servo_tracking()(system, s, p))(sol, params)
        peak = jnp.max(jnp.abs(sol.u), axis=(1, 2))
        return tracking, peak, sol.ok

    def run(theta):
        tracking, peak, ok = (np.asarray(x) for x in score(theta))
        return {
            "tracking_mean": float(tracking[ok].mean()),
            "tracking_p95": float(np.percentile(tracking[ok], 95)),
            "peak_u_max": float(peak[ok].max()),
            "peak_u_median": float(np.median(peak[ok])),
            "fraction_over_limit": float(np.mean(peak[ok] > u_max * (1 + 1e-9))),
            "failures": int(np.sum(~ok)),
            "per_scenario_tracking": tracking,
        }

    return run


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    system = model.system()
    bounds = tune.baumgarte_gain_bounds(diffrax.Tsit5(), args.dt, form="quadratic", safety=0.5)
    p = model.default_params()
    space = tune.Parametrization(
        p,
        {
            "alpha": tune.log(lower=0.1, upper=bounds["alpha"]),
            "beta": tune.log(lower=0.1, upper=bounds["beta"]),
        },
    )
    train, heldout = train_and_heldout(scenarios, args)
    options = tune.simulation_options(t1=args.t1, dt=args.dt, num_saves=301)
    base = objective(args.u_max, args.limit_weight)
    optimizer = tune.default_optimizer(args.steps, args.learning_rate)
    score = _score(system, space, heldout, options, args.u_max)
    before = score(space.init())
    curve = []
    fits = {}
    for w in args.weights:
        print(f"[tune_servo] weight on peak |F|: {w:g}", flush=True)
        obj = base.with_weights(peak_control=w)
        tic = time.perf_counter()
        result = fit_from_args(
            system, space, train, obj, options, args, out / f"fit_w{w:g}", optimizer=optimizer
        )
        wall = time.perf_counter() - tic
        held = score(result.theta)
        fits[w] = (result, held)
        curve.append(
            {
                "weight_peak_u": w,
                "alpha": float(result.values["alpha"]),
                "beta": float(result.values["beta"]),
                "train_loss": result.best_loss,
                "heldout": {k: v for k, v in held.items() if k != "per_scenario_tracking"},
                "simulations": result.simulations,
                "wall_s": wall,
                "stopped": result.stopped,
            }
        )
    grid = _landscape(
        system, space, train, base.with_weights(peak_control=args.weights[0]), options, args.grid
    )
    figures = _figures(out, fits, curve, grid, before, args)
    metrics = {
        "model": "two-mass spring of Liu et al. 2015 §IV (eq. 36-47), servo x2 - x1 = 2l (eq. 44), "
        "Baumgarte φ̈ + 2αφ̇ + β²φ = 0 (§III-B)",
        "parameters": {k: float(v) for k, v in p.items()},
        "objective": "∫ φ² dt + w_u · smoothmax_t |F| (power mean, p = 16) + w_lim ∫ max(|F| - F_max, 0)² dt",
        "u_max_N": args.u_max,
        "limit_weight": args.limit_weight,
        "integrator": fixed_step_record(args.dt, 301, t1=args.t1),
        "batches": {
            "train": train.size,
            "heldout": heldout.size,
            "seed": args.seed,
            "perturbation": "φ(0) ~ U[0.1, 0.3] m; speed 0.5 ± 0.1 m/s; m1, m2, k ±5 %",
        },
        "gain_box": {"alpha": [0.1, bounds["alpha"]], "beta": [0.1, bounds["beta"]], "stability": bounds},
        "initial_gains": {"alpha": float(p["alpha"]), "beta": float(p["beta"])},
        "heldout_before": {k: v for k, v in before.items() if k != "per_scenario_tracking"},
        "tradeoff": curve,
        "figures": figures,
    }
    write_json(out / "metrics.json", metrics)
    print(f"{'w_u':>8}{'α (1/s)':>10}{'β (1/s)':>10}{'∫φ² m² s':>16}{'max |F| N':>10}{'over limit':>12}")
    print("(∫φ²: held-out mean; max |F|: over the held-out batch; over limit: fraction of scenarios)")
    b = before
    print(
        f"{'initial':>8}{float(p['alpha']):>10.3f}{float(p['beta']):>10.3f}{b['tracking_mean']:>16.4e}"
        f"{b['peak_u_max']:>10.2f}{b['fraction_over_limit']:>12.3f}"
    )
    for c in curve:
        h = c["heldout"]
        print(
            f"{c['weight_peak_u']:>8g}{c['alpha']:>10.3f}{c['beta']:>10.3f}{h['tracking_mean']:>16.4e}"
            f"{h['peak_u_max']:>10.2f}{h['fraction_over_limit']:>12.3f}"
        )
    return metrics


def _landscape(system, space, batch, obj, options, n):
    """Training loss over an n x n grid of (log α, log β) in the box, for the landscape figure."""
    lo = np.array([space.transforms[k].lower for k in ("alpha", "beta")])
    hi = np.array([space.transforms[k].upper for k in ("alpha", "beta")])
    axes = [np.linspace(np.log(lo[k]), np.log(hi[k]), n) for k in range(2)]
    la, lb = np.meshgrid(*axes, indexing="ij")

    @jax.jit
    def losses(pairs):
        return jax.vmap(
            lambda lg: tune.batch_loss(
                system, space, {"alpha": lg[0], "beta": lg[1]}, batch, obj, options=options
            )[0]
        )(pairs)

    values = np.concatenate([np.asarray(losses(jnp.asarray(np.stack([la[i], lb[i]], 1)))) for i in range(n)])
    return axes, values.reshape(n, n)


def _figures(out, fits, curve, grid, before, args):
    plt = pyplot()

    files = []
    fig, ax = plt.subplots(figsize=(6, 4.2))
    peaks = [c["heldout"]["peak_u_max"] for c in curve]
    tracks = [c["heldout"]["tracking_mean"] for c in curve]
    ax.plot(peaks, tracks, "o-")
    for c, x, y in zip(curve, peaks, tracks, strict=True):
        ax.annotate(
            f"w={c['weight_peak_u']:g}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points"
        )
    ax.plot(before["peak_u_max"], before["tracking_mean"], "ks", label="initial α = β = 5")
    ax.axvline(args.u_max, color="red", lw=0.8, label=f"F_max = {args.u_max:g} N")
    ax.set(
        yscale="log",
        xlabel="max |F| over the held-out batch (N)",
        ylabel="mean ∫ φ² dt (m² s)",
        title="Tracking error vs peak control (Liu et al. 2015, §IV)",
    )
    ax.legend(fontsize=8)
    files.append(save_figure(fig, out / "tradeoff.png"))

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for w, (result, _) in fits.items():
        steps = [r["step"] for r in result.history]
        axes[0].semilogy(steps, [r["loss"] for r in result.history], label=f"w={w:g}")
        axes[1].semilogy(steps, [r["values"]["alpha"] for r in result.history], label=f"α, w={w:g}")
        axes[2].semilogy(steps, [r["values"]["beta"] for r in result.history], label=f"β, w={w:g}")
    axes[0].set(xlabel="step", ylabel="training loss J (m² s)", title="Loss")
    axes[1].set(xlabel="step", ylabel="α (1/s)", title="Servo gain α")
    axes[2].set(xlabel="step", ylabel="β (1/s)", title="Servo gain β")
    for ax in axes:
        ax.legend(fontsize=6)
    files.append(save_figure(fig, out / "loss_and_gains.png"))

    (la, lb), values = grid
    fig, ax = plt.subplots(figsize=(6.2, 5))
    mesh = ax.pcolormesh(np.exp(la), np.exp(lb), np.log10(values).T, shading="nearest", cmap="viridis")
    fig.colorbar(mesh, ax=ax, label="log10 training loss J (J in m² s)")
    result = fits[args.weights[0]][0]
    path = np.array([[r["values"]["alpha"], r["values"]["beta"]] for r in result.history if r["accepted"]])
    ax.plot(path[:, 0], path[:, 1], "w.-", ms=3, label=f"Adam path, w_u = {args.weights[0]:g}")
    ax.set(xscale="log", yscale="log", xlabel="α (1/s)", ylabel="β (1/s)", title="Loss landscape and path")
    ax.legend(fontsize=7)
    files.append(save_figure(fig, out / "loss_landscape.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    after = fits[args.weights[0]][1]
    values = np.concatenate([before["per_scenario_tracking"], after["per_scenario_tracking"]])
    bins = np.logspace(np.log10(values.min()), np.log10(values.max()), 30)
    ax.hist(before["per_scenario_tracking"], bins=bins, alpha=0.6, label="initial α = β = 5")
    ax.hist(after["per_scenario_tracking"], bins=bins, alpha=0.6, label=f"tuned, w_u = {args.weights[0]:g}")
    ax.set(
        xscale="log",
        xlabel="∫ φ² dt per scenario (m² s)",
        ylabel="scenarios",
        title="Servo violation on the held-out batch",
    )
    ax.legend(fontsize=8)
    files.append(save_figure(fig, out / "violation_histogram.png"))
    return [Path(f).name for f in files]
