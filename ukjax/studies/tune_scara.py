"""Tuning study: the SCARA's Baumgarte gains (Xu & Liu 2017, eq. 52), robust over a Monte-Carlo batch, by
gradient descent, beside a dense grid search and a random search on the same objective.

The SCARA of Xu & Liu 2017 (:mod:`ukjax.models.scara`) starts off its helical path (eq. 40, 47-48) and the
Baumgarte terms φ̈ + αφ̇ + βφ = 0 (eq. 52, one α and one β for all four rows) pull it back. The paper's
gains α = 0.5, β = 200 give an error dynamics of damping ratio α / (2√β) ≈ 0.018, which rings for seconds.
Objective, per scenario, over [0, t1] (fixed-step Tsit5):

    J = ∫ (e_x² + e_y² + e_z²) dt + w · smoothmax_t ‖Q^c_{1..3}(t)‖,

the integrated squared path error (rows x, y, z of eq. 48) plus a weight on the peak constraint torque of
the three revolute joints (Q^c of eq. 50-51; a power mean, :func:`ukjax.tune.smooth_max`), so that infinitely
stiff gains are not the answer; risk = mean over the batch. The Monte-Carlo batch perturbs every mass, length
and inertia by ±5 % (uniform) and the initial joint angles by 1° (normal), as ``ukjax demo``
(:func:`ukjax.models.scara.sample_scenarios`).

Three contenders search the same box of gains (lower bounds α ≥ 0.1, β ≥ 10; upper bounds from the
stability interval of Tsit5 at the step, :func:`ukjax.tune.baumgarte_gain_bounds`) on the same training
batch, each with one compiled function: (1) a log-spaced grid of N × N gain pairs, (2) random search
(log-uniform in the box) with the simulation budget of (3), the gradient tuner (:func:`ukjax.tune.fit`,
Adam in log-gains from the paper's gains). Each winner is then scored on a held-out batch: the same
objective, and the tail path error (peak of e(t) over the last fifth of a longer run) against the paper's
gains.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import tune
from ukjax.models import scara as model
from ukjax.simulation import RESULTS, simulate_batch
from ukjax.studies._common import (
    add_batch_arguments,
    add_optimizer_arguments,
    fit_from_args,
    fixed_step_record,
    prepare_output,
    pyplot,
    save_figure,
    train_and_heldout,
    write_json,
)

DESCRIPTION = (
    "Baumgarte gains of the SCARA (Xu & Liu 2017, eq. 52) tuned over a Monte-Carlo batch; "
    "gradient tuner vs 32 x 32 grid vs random search"
)
PAPER_DEFAULTS = {"--alpha0": "Xu & Liu 2017, eq. 52-54", "--beta0": "Xu & Liu 2017, eq. 52-54"}
PATH_ROWS = (0, 1, 3)  # x, y, z rows of φ (eq. 48); row 2 is the orientation
TORQUE_ROWS = (0, 1, 2)  # revolute joints
TAIL = 0.8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_batch_arguments(
        parser,
        "tune_scara",
        train_scenarios=32,
        heldout_scenarios=256,
        t1=2.0,
        dt=5e-3,
        t1_help="span of the objective (s)",
    )
    parser.add_argument("--tail-t1", type=float, default=5.0, help="span of the tail path-error run (s)")
    parser.add_argument("--weight", type=float, default=1e-7, help="weight w of the peak constraint torque")
    parser.add_argument("--grid", type=int, default=32, help="grid points per gain (N x N grid)")
    parser.add_argument("--alpha0", type=float, default=0.5, help="initial α (1/s)")
    parser.add_argument("--beta0", type=float, default=200.0, help="initial β (1/s²)")
    parser.add_argument("--chunk", type=int, default=16, help="gain pairs per compiled grid/random call")
    parser.add_argument("--skip-baselines", action="store_true", help="only the gradient tuner")
    add_optimizer_arguments(
        parser,
        steps=90,
        learning_rate=0.3,
        steps_help="gradient-tuner steps",
        seed_help="seed of batches and random search",
    )


def scenarios(key, count):
    """A Monte-Carlo batch of the SCARA (±5 % masses, lengths, inertias; 1° initial angle noise)."""
    p = model.default_params()
    q0, qd0 = model.initial_state(p)
    batch, q0s, qd0s = model.sample_scenarios(key, p, q0, qd0, count, spread=0.05, angle_noise_deg=1.0)
    return tune.Scenarios(q0s, qd0s, batch)


def objective(weight):
    """∫|e|² dt + w · smooth peak of the revolute constraint torques (module docstring)."""
    path = tune.position_violation(rows=PATH_ROWS, name="path_error_sq_integral")
    torque = tune.peak_constraint_force(rows=TORQUE_ROWS, name="peak_constraint_torque")
    return path + weight * torque


def gain_box(dt):
    """Lower bounds and the stability-derived upper bounds of (α, β)."""
    bounds = tune.baumgarte_gain_bounds(diffrax.Tsit5(), dt, form="linear", safety=0.5)
    return {"alpha": (0.1, bounds["alpha"]), "beta": (10.0, bounds["beta"]), "stability": bounds}


def space_for(box, alpha0, beta0):
    p = model.default_params()
    p["alpha"] = jnp.full(4, alpha0)
    p["beta"] = jnp.full(4, beta0)
    return tune.Parametrization(
        p,
        {
            "alpha": tune.log(lower=box["alpha"][0], upper=box["alpha"][1], shared=True),
            "beta": tune.log(lower=box["beta"][0], upper=box["beta"][1], shared=True),
        },
    )


def _candidate_evaluator(system, space, batch, obj, options, chunk):
    """One compiled function: losses of ``chunk`` gain pairs (log α, log β) on ``batch``."""

    @jax.jit
    def losses(log_gains):
        def one(lg):
            loss, info = tune.batch_loss(
                system, space, {"alpha": lg[0], "beta": lg[1]}, batch, obj, options=options
            )
            return loss, info["failures"]

        return jax.vmap(one)(log_gains)

    def evaluate(log_gains, progress_label=None):
        log_gains = np.asarray(log_gains)
        count = log_gains.shape[0]
        padded = np.concatenate([log_gains, np.repeat(log_gains[-1:], (-count) % chunk, 0)])
        out, fails = [], []
        chunks = range(0, padded.shape[0], chunk)
        if progress_label:
            from tqdm.auto import tqdm

            chunks = tqdm(chunks, desc=progress_label, unit="chunk", dynamic_ncols=True)
        for start in chunks:
            loss, fail = losses(jnp.asarray(padded[start : start + chunk]))
            out.append(np.asarray(loss))
            fails.append(np.asarray(fail))
        return np.concatenate(out)[:count], np.concatenate(fails)[:count]

    return evaluate


def _tail_path_error(system, batch, gains, t1, dt):
    """Per-scenario peak of e(t) over t ≥ 0.8 t1, peak |φ|, status, for gains (α, β) on ``batch``."""
    steps = int(math.ceil(t1 / dt - 1e-9))
    ts = jnp.linspace(0.0, t1, min(steps, 500) + 1)
    params = dict(batch.params)
    size = batch.size
    params["alpha"] = jnp.full((size, 4), gains[0])
    params["beta"] = jnp.full((size, 4), gains[1])
    sol = simulate_batch(
        system, batch.q0, batch.qd0, params, batch_params=True, t1=t1, ts=ts, dt=dt, max_steps=steps + 1
    )
    errors = np.asarray(jax.jit(jax.vmap(model.path_error, in_axes=(None, 0, 0)))(ts, sol.q, params))
    tail = np.asarray(ts) >= TAIL * t1
    ok = np.asarray(sol.ok)
    return {
        "tail_peak": errors[:, tail].max(axis=1),
        "peak": errors.max(axis=1),
        "ok": ok,
        "max_position_residual": np.asarray(sol.max_position_residual),
    }


def _stats(values, ok):
    values = np.asarray(values)[np.asarray(ok)]
    if values.size == 0:
        return {"median": float("nan"), "p95": float("nan"), "max": float("nan")}
    return {
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "max": float(np.max(values)),
    }


def run(args) -> dict:
    out = prepare_output(args.out, overwrite=args.overwrite)
    if args.train_scenarios < 1 or args.heldout_scenarios < 1 or args.grid < 2 or args.steps < 1:
        raise ValueError("--train-scenarios, --heldout-scenarios and --steps must be positive, --grid >= 2")
    system = model.system()
    box = gain_box(args.dt)
    space = space_for(box, args.alpha0, args.beta0)
    train, heldout = train_and_heldout(scenarios, args)
    obj = objective(args.weight)
    options = tune.simulation_options(t1=args.t1, dt=args.dt, num_saves=201)
    progress = not args.no_progress
    log_lo = np.log([box["alpha"][0], box["beta"][0]])
    log_hi = np.log([box["alpha"][1], box["beta"][1]])
    contenders = {}

    # (3) the gradient tuner
    print(f"[tune_scara] gradient tuner: {args.steps} steps x {train.size} scenarios", flush=True)
    tic, cpu = time.perf_counter(), time.process_time()
    result = fit_from_args(system, space, train, obj, options, args, out)
    tuner_wall = time.perf_counter() - tic
    tuner_gains = [float(result.values["alpha"][0]), float(result.values["beta"][0])]
    contenders["gradient"] = {
        "gains": tuner_gains,
        "train_loss": result.best_loss,
        "simulations": result.simulations,
        "wall_s": tuner_wall,
        "cpu_s": time.process_time() - cpu,
        "wall_s_note": "includes compiling the value-and-gradient step",
        "steps": len(result.history),
        "stopped": result.stopped,
    }
    evaluate = _candidate_evaluator(system, space, train, obj, options, args.chunk)
    grid_axes = None
    if not args.skip_baselines:
        # (1) the grid
        n = args.grid
        grid_axes = [np.linspace(log_lo[k], log_hi[k], n) for k in range(2)]
        la, lb = np.meshgrid(*grid_axes, indexing="ij")
        pairs = np.stack([la.ravel(), lb.ravel()], axis=1)
        print(f"[tune_scara] grid search: {n} x {n} gain pairs x {train.size} scenarios", flush=True)
        tic, cpu = time.perf_counter(), time.process_time()
        grid_loss, grid_fail = evaluate(pairs, "grid" if progress else None)
        grid_wall, grid_cpu = time.perf_counter() - tic, time.process_time() - cpu
        best = int(np.nanargmin(np.where(grid_fail > 0, np.nan, grid_loss)))
        contenders["grid"] = {
            "gains": np.exp(pairs[best]).tolist(),
            "train_loss": float(grid_loss[best]),
            "simulations": int(pairs.shape[0] * train.size),
            "wall_s": grid_wall,
            "cpu_s": grid_cpu,
            "wall_s_note": "includes compiling the batched forward evaluation",
            "candidates": int(pairs.shape[0]),
            "candidates_with_failures": int(np.sum(grid_fail > 0)),
            "candidates_outside_stability_region": int(
                np.sum(tune.baumgarte_amplification(diffrax.Tsit5(), args.dt, *np.exp(pairs).T) > 1.0)
            ),
        }
        # (2) random search on the gradient tuner's simulation budget
        count = max(result.simulations // train.size, 1)
        rng = np.random.default_rng(args.seed)
        random_pairs = log_lo + (log_hi - log_lo) * rng.uniform(size=(count, 2))
        print(f"[tune_scara] random search: {count} gain pairs x {train.size} scenarios", flush=True)
        tic, cpu = time.perf_counter(), time.process_time()
        random_loss, random_fail = evaluate(random_pairs)
        random_wall, random_cpu = time.perf_counter() - tic, time.process_time() - cpu
        rbest = int(np.nanargmin(np.where(random_fail > 0, np.nan, random_loss)))
        contenders["random"] = {
            "gains": np.exp(random_pairs[rbest]).tolist(),
            "train_loss": float(random_loss[rbest]),
            "simulations": int(count * train.size),
            "wall_s": random_wall,
            "cpu_s": random_cpu,
            "wall_s_note": "the forward evaluation was compiled for the grid already",
            "candidates": count,
        }

    # held-out scoring: the same objective on the held-out batch, and the tail path error
    print(f"[tune_scara] held-out batch: {heldout.size} scenarios", flush=True)
    heldout_eval = _candidate_evaluator(system, space, heldout, obj, options, 1)
    paper = [args.alpha0, args.beta0]
    rows = {"paper": {"gains": paper, "train_loss": result.history[0]["loss"], "simulations": 0}}
    rows.update(contenders)
    for entry in rows.values():
        entry["amplification_per_step"] = float(
            tune.baumgarte_amplification(diffrax.Tsit5(), args.dt, *entry["gains"])
        )
        loss, fail = heldout_eval(np.log([entry["gains"]]))
        entry["heldout_loss"] = float(loss[0])
        entry["heldout_failures"] = int(fail[0])
    before = _tail_path_error(system, heldout, paper, args.tail_t1, args.dt)
    after = _tail_path_error(system, heldout, tuner_gains, args.tail_t1, args.dt)
    tail = {
        "window_s": [TAIL * args.tail_t1, args.tail_t1],
        "note": "tail = peak of e(t) over the window, per scenario; the whole-run peak is the initial "
        "offset at t = 0, which no gain can change",
        "paper_gains": {
            "tail_path_error_m": _stats(before["tail_peak"], before["ok"]),
            "peak_path_error_m_whole_run": _stats(before["peak"], before["ok"]),
            "max_position_residual": _stats(before["max_position_residual"], before["ok"]),
            "failures": int(np.sum(~before["ok"])),
        },
        "tuned_gains": {
            "tail_path_error_m": _stats(after["tail_peak"], after["ok"]),
            "peak_path_error_m_whole_run": _stats(after["peak"], after["ok"]),
            "max_position_residual": _stats(after["max_position_residual"], after["ok"]),
            "failures": int(np.sum(~after["ok"])),
        },
    }
    comparison = {}
    if "grid" in rows:
        grid_best = rows["grid"]["heldout_loss"]
        comparison = {
            "gradient_heldout_loss_over_grid": rows["gradient"]["heldout_loss"] / grid_best,
            "gradient_train_loss_over_grid": rows["gradient"]["train_loss"] / rows["grid"]["train_loss"],
            "gradient_simulations_over_grid": rows["gradient"]["simulations"] / rows["grid"]["simulations"],
            "target": "gradient within 1 % of the grid's best loss with at most a tenth of its simulations",
        }
        comparison["target_met_heldout"] = bool(
            comparison["gradient_heldout_loss_over_grid"] <= 1.01
            and comparison["gradient_simulations_over_grid"] <= 0.1
        )
        comparison["target_met_train"] = bool(
            comparison["gradient_train_loss_over_grid"] <= 1.01
            and comparison["gradient_simulations_over_grid"] <= 0.1
        )

    figures = _figures(
        out,
        result,
        rows,
        grid_axes,
        locals().get("grid_loss"),
        locals().get("random_pairs"),
        before,
        after,
        args,
    )
    metrics = {
        "model": "SCARA of Xu & Liu 2017 (eq. 34-54); Baumgarte φ̈ + αφ̇ + βφ = 0 (eq. 52), shared α, β",
        "objective": {
            "per_scenario": "∫ (e_x² + e_y² + e_z²) dt + w · smoothmax_t ‖Q^c_1..3(t)‖ (power mean, p = 16)",
            "weight": args.weight,
            "risk": "mean over the batch",
            "span_s": args.t1,
        },
        "integrator": fixed_step_record(args.dt, 201),
        "batches": {
            "perturbation": "masses, lengths, inertias ±5 % uniform; joint angles 1° normal; velocities 1 %",
            "train_scenarios": train.size,
            "heldout_scenarios": heldout.size,
            "seed": args.seed,
        },
        "gain_box": {
            "alpha": box["alpha"],
            "beta": box["beta"],
            "stability": box["stability"],
            "note": "upper bounds from Tsit5's real-axis stability limit (safety 0.5); lightly damped pairs "
            "near the β bound lie outside the stability region (amplification_per_step > 1)",
        },
        "load_average": {"end_of_run": os.getloadavg()},
        "optimizer": {
            "name": "Adam, cosine-decayed step",
            "learning_rate": args.learning_rate,
            "parametrization": "log α, log β, projected onto the box",
        },
        "contenders": rows,
        "comparison": comparison,
        "tail_path_error_heldout": tail,
        "fit": tune.summary(result, space),
        "status_codes": {code.name: int(code) for code in RESULTS},
        "figures": figures,
    }
    write_json(out / "metrics.json", metrics)
    _print(rows, tail, comparison)
    return metrics


def _print(rows, tail, comparison):
    header = ("contender", "α (1/s)", "β (1/s²)", "train J", "held-out J", "sims", "wall s", "cpu s")
    print("".join(f"{h:<10}" if k == 0 else f"{h:>12}" for k, h in enumerate(header)))
    for name, r in rows.items():
        print(
            f"{name:<10}{r['gains'][0]:>12.3f}{r['gains'][1]:>12.1f}{r.get('train_loss', np.nan):>12.4e}"
            f"{r['heldout_loss']:>12.4e}{r.get('simulations', 0):>12}{r.get('wall_s', 0.0):>12.1f}"
            f"{r.get('cpu_s', 0.0):>12.1f}"
        )
    print("(J: mean over the batch of ∫|e|² dt + w · peak constraint torque, in m² s)")
    for key in ("paper_gains", "tuned_gains"):
        s = tail[key]["tail_path_error_m"]
        print(f"tail path error, {key}: median {s['median']:.3e} m, 95th percentile {s['p95']:.3e} m")
    if comparison:
        print(
            f"gradient / grid: held-out loss {comparison['gradient_heldout_loss_over_grid']:.4f}, "
            f"simulations {comparison['gradient_simulations_over_grid']:.4f}"
        )


def _figures(out, result, rows, grid_axes, grid_loss, random_pairs, before, after, args):
    plt = pyplot()

    files = []
    history = result.history
    steps = [r["step"] for r in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].semilogy(steps, [r["loss"] for r in history])
    axes[0].set(xlabel="step", ylabel="training loss J (m² s)", title="Loss")
    axes[1].semilogy(steps, [r["values"]["alpha"] for r in history], label="α")
    axes[1].semilogy(steps, [r["values"]["beta"] for r in history], label="β")
    axes[1].set(xlabel="step", ylabel="α (1/s), β (1/s²)", title="Gains (Xu & Liu 2017, eq. 52)")
    axes[1].legend()
    axes[2].semilogy(steps, [r["grad_norm"] for r in history])
    axes[2].set(xlabel="step", ylabel="‖∂J/∂(log α, log β)‖ (m² s)", title="Gradient norm")
    files.append(save_figure(fig, out / "loss_and_gains.png"))

    if grid_axes is not None and grid_loss is not None:
        fig, ax = plt.subplots(figsize=(6.5, 5.2))
        n = len(grid_axes[0])
        z = np.log10(np.asarray(grid_loss).reshape(n, n))
        alphas, betas = np.exp(grid_axes[0]), np.exp(grid_axes[1])
        finite = z[np.isfinite(z)]
        vmax = np.percentile(finite, 90) if finite.size else None
        mesh = ax.pcolormesh(alphas, betas, z.T, shading="nearest", cmap="viridis", vmax=vmax)
        fig.colorbar(mesh, ax=ax, label="log10 training loss J (J in m² s; clipped at the 90th percentile)")
        path = np.array([[r["values"]["alpha"], r["values"]["beta"]] for r in history if r["accepted"]])
        ax.plot(path[:, 0], path[:, 1], "w.-", lw=1, ms=3, label="gradient tuner")
        if random_pairs is not None:
            ax.plot(*np.exp(random_pairs).T, "x", color="orange", ms=4, label="random search")
        for name, marker in (("grid", "s"), ("random", "^"), ("gradient", "*"), ("paper", "o")):
            if name in rows:
                ax.plot(
                    *rows[name]["gains"],
                    marker,
                    color="red",
                    ms=9,
                    mfc="none",
                    label=name if name == "paper" else f"{name} best",
                )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="α (1/s)",
            ylabel="β (1/s²)",
            title=f"Loss landscape ({n} x {n} grid) and the optimizer's path",
        )
        ax.legend(fontsize=7, loc="lower right")
        files.append(save_figure(fig, out / "loss_landscape.png"))

    fig, ax = plt.subplots(figsize=(6.5, 4))
    b, a = before["tail_peak"][before["ok"]], after["tail_peak"][after["ok"]]
    values = np.concatenate([b, a])
    values = values[values > 0]
    bins = np.logspace(np.log10(values.min()), np.log10(values.max()), 40) if values.size else 20
    ax.hist(b, bins=bins, alpha=0.6, label=f"paper α = {args.alpha0:g}, β = {args.beta0:g}")
    ax.hist(a, bins=bins, alpha=0.6, label="tuned α = {:.3g}, β = {:.4g}".format(*rows["gradient"]["gains"]))
    ax.set(
        xscale="log",
        xlabel=f"peak path error over t ≥ {TAIL * args.tail_t1:g} s (m)",
        ylabel="scenarios",
        title=f"Tail path error on the held-out batch ({len(before['ok'])} scenarios)",
    )
    ax.legend(fontsize=8)
    files.append(save_figure(fig, out / "violation_histogram.png"))
    return [Path(f).name for f in files]
