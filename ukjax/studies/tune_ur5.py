"""Tuning study: a UR5 arm, loaded in one line from its URDF, follows a task-space circle by servo constraints
(Liu et al. 2015) while carrying a payload its controller does not know; the servo gains (α, β) are tuned
over a batch of payloads.

The robot is example-robot-data's ``ur5_robot.urdf`` read by :func:`ukjax.robots.load` (6 revolute joints,
their masses and inertias as leaves of the parameter pytree). Actuation B = I (one torque per joint). The
servo constraints (Liu et al. 2015, §III) hold the tool frame ``tool0``:

    φ(q, t) = ( x(q) - c(t),  ½ vee(R₀ᵀ R(q) - R(q)ᵀ R₀) ) = 0        (3 + 3 rows),

its origin x on a horizontal circle c(t) = c₀ + r (cos ωt, sin ωt, 0) (r = 0.1 m, ω = 2π · 0.5 Hz, through
the tool's position at the home pose) and its orientation R fixed at the home pose's R₀ (the second block is
sin θ times the axis of the orientation error θ). Six rows for six joints: the servo equation
(A_s M⁻¹ B) u = b_s - A_s q̈₀ (Liu et al. 2015, eq. 32) is square and, away from singular poses, has one
solution. Baumgarte error dynamics φ̈ + 2αφ̇ + β²φ = 0 (Liu et al. 2015, §III-B), α and β parameters.

Model and plant. ``ukjax.simulate`` of a system with servo constraints computes the controls from that
same system, so it models a controller that knows the plant exactly. Here the plant is the arm with a
payload m_p ~ U[0, 3] kg at the tool flange (a point mass added to the last link: its mass, centre of mass
and inertia change, :func:`with_payload`), and the controller computes u from the arm with the NOMINAL
payload (1.5 kg): the plant is ``robot.system(applied_force=...)`` with the force
B u(q, q̇, t; nominal model) of :func:`ukjax.control.servo_force`. The payload error leaves a residual
acceleration in the error dynamics, so φ no longer decays to zero: larger gains shrink the tracking error
and raise the torques. Each scenario starts on the circle's tangent-consistent state
(:func:`ukjax.consistent_state` at t = 0) with every joint angle perturbed by U[-0.01, 0.01] rad.

Per scenario: the RMS tracking error e = (∫‖φ‖² dt / T)^{1/2} (metres and radians in one norm) and the peak
joint torque (smooth maximum over saved times and joints, :func:`ukjax.tune.smooth_max`). Objective, mean
over the training batch: J = e + w_τ · peak torque (w_τ = 1e-5 m/(N m) by default), minimized over log α and
log β (bounded by Tsit5's stability interval at the step, :func:`ukjax.tune.baumgarte_gain_bounds`) by
:func:`ukjax.tune.fit`, from α = β = 5 1/s (Liu et al. 2015 take α = β and print no numbers). The tuned and
the untuned gains are then scored on a held-out batch: position and orientation errors (m, rad) and peak
torque (N m) per scenario, and every joint the held-out trajectories took out of its range in the URDF (not
enforced; metrics.json's ``joint_ranges``, printed as a warning).
"""

from __future__ import annotations

import argparse
import time
import types
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ukjax import control, robots, tune
from ukjax.constraints import Baumgarte, Holonomic
from ukjax.control import consistent_state
from ukjax.simulation import simulate_batch
from ukjax.studies._common import (
    add_batch_arguments,
    add_optimizer_arguments,
    example_robot_file,
    fit_from_args,
    fixed_step_record,
    joint_range_lines,
    joint_range_record,
    prepare_output,
    pyplot,
    save_figure,
    train_and_heldout,
    write_json,
)
from ukjax.tune._objectives import integrate

DESCRIPTION = (
    "servo gains of a UR5 (URDF) following a task-space circle (Liu et al. 2015) under payload "
    "uncertainty; the controller's model carries the nominal payload"
)
PAPER_DEFAULTS: dict[str, str] = {}  # Liu et al. 2015 take α = β and print no gains for a robot arm
URDF = "ur_description/urdf/ur5_robot.urdf"
TOOL = "tool0"
HOME = (0.0, -1.2, 1.5, -1.9, -1.57, 0.0)  # rad: the tool 0.63 m out, 0.29 m up, pointing down
UNTUNED = 5.0  # α = β (1/s), Liu et al. 2015 §III-B form with α = β
FIGURE_PAYLOADS = (0.0, 1.5, 3.0)  # kg


# ------------------------------------------------------------------------------------------ the task
def load_ur5() -> robots.Robot:
    """The UR5 of example-robot-data (FileNotFoundError naming ``pip install 'ukjax[robots]'`` without it)."""
    return robots.load(example_robot_file(URDF))


def orientation_error(R, R_ref):
    """½ vee(E - Eᵀ) with E = R_refᵀ R: sin θ times the axis of the rotation θ from R_ref to R (in R_ref's
    frame); zero exactly when R = R_ref (for |θ| < π)."""
    E = R_ref.T @ R
    return 0.5 * jnp.stack([E[2, 1] - E[1, 2], E[0, 2] - E[2, 0], E[1, 0] - E[0, 1]])


def circle(center, radius: float, frequency: float):
    """c(t) = center + r (cos ωt, sin ωt, 0), ω = 2π · frequency: a horizontal circle (m), started at
    center + (r, 0, 0)."""
    center = jnp.asarray(center, jnp.float64)
    omega = 2.0 * jnp.pi * frequency

    def path(t):
        return center + radius * jnp.stack([jnp.cos(omega * t), jnp.sin(omega * t), jnp.zeros_like(t)])

    return path


def tracking_constraint(robot, frame: str, path, orientation=None) -> Holonomic:
    """The servo constraint φ(q, t) = (x(q) - path(t)[, ½ vee(R₀ᵀR - RᵀR₀)]) on the pose (R, x) of
    ``frame`` (3 rows, or 3 + 3 with a fixed ``orientation`` R₀), Baumgarte φ̈ + 2αφ̇ + β²φ = 0 with the gains
    ``p["alpha"]``, ``p["beta"]``."""
    pose = robot.frame(frame)
    R_ref = None if orientation is None else jnp.asarray(orientation, jnp.float64)

    def phi(q, t, p):
        R, x = pose(q, p)
        rows = x - path(t)
        return rows if R_ref is None else jnp.concatenate([rows, orientation_error(R, R_ref)])

    gains = Baumgarte(gains=lambda p: (p["alpha"], p["beta"]))
    return Holonomic(phi, baumgarte=gains, name=f"{frame} on its path")


def controlled_arm(robot, constraint: Holonomic):
    """(model, plant): ``model`` is the arm with one torque per joint (B = I) and the servo constraint;
    ``plant`` is the arm driven by the controls computed from ``model`` with the parameters
    ``p["controller"]`` (:func:`ukjax.control.servo_force`), its own parameters the rest of ``p``."""
    model = robot.system(servo_constraints=(constraint,), actuation=lambda q, t, p: jnp.eye(robot.n))
    plant = robot.system(applied_force=control.servo_force(model, lambda p: p["controller"]))
    return model, plant


def flange_point(robot, frame: str, q, params):
    """The origin of ``frame`` in the coordinates of the tree's last body (m): where a payload attaches."""
    R_body, x_body = (f[-1] for f in robot.tree.frames(q, robot.bodies(params)))
    _, x = robot.frame(frame)(q, params)
    return R_body.T @ (x - x_body)


def with_payload(params, mass, point):
    """``params`` with a point mass ``mass`` (kg) at ``point`` (m, last body's frame) fused into the last
    body: masses add, the centre of mass moves to the weighted mean, and both inertias are carried to it by
    the parallel-axis theorem (Featherstone 2008, eq. 2.63). Differentiable in all three."""
    m0, c0, I0 = params["mass"][-1], params["com"][-1], params["inertia"][-1]
    m = m0 + mass
    c = (m0 * c0 + mass * point) / m
    shift = lambda d: d @ d * jnp.eye(3) - jnp.outer(d, d)
    inertia = I0 + m0 * shift(c0 - c) + mass * shift(point - c)
    return {
        **params,
        "mass": params["mass"].at[-1].set(m),
        "com": params["com"].at[-1].set(c),
        "inertia": params["inertia"].at[-1].set(inertia),
    }


class Setup:
    """The UR5 task of this study: robot, path, model and plant, nominal controller parameters, start."""

    def __init__(self, args, robot=None, home=HOME, frame=TOOL):
        self.robot = load_ur5() if robot is None else robot
        self.frame = frame
        base = self.robot.params
        home = jnp.asarray(home, jnp.float64)
        self.point = flange_point(self.robot, frame, home, base)
        R0, x0 = self.robot.frame(frame)(home, base)
        self.path = circle(x0 - jnp.array([args.radius, 0.0, 0.0]), args.radius, args.frequency)
        self.constraint = tracking_constraint(self.robot, frame, self.path, R0)
        self.model, self.plant = controlled_arm(self.robot, self.constraint)
        gains = {"alpha": jnp.asarray(UNTUNED), "beta": jnp.asarray(UNTUNED)}
        self.controller = {**with_payload(base, jnp.asarray(args.nominal_payload), self.point), **gains}
        self.q_start, self.qd_start = consistent_state(
            self.model, home, jnp.zeros(self.robot.n), 0.0, self.controller
        )
        self.start_residual = float(
            jnp.max(jnp.abs(self.constraint.value(self.q_start, 0.0, self.controller)))
        )

    def params(self, payload):
        """The plant's parameters with ``payload`` (kg) and the controller's nominal model."""
        return {**with_payload(self.robot.params, payload, self.point), "controller": self.controller}

    def scenarios(self, args):
        """``scenarios(key, count)``: payloads U[0, payload_max] kg, joint offsets U[-δ, δ] rad."""

        def draw(key, count):
            k_mass, k_q = jax.random.split(key)
            payload = jax.random.uniform(k_mass, (count,), jnp.float64, 0.0, args.payload_max)
            offset = jax.random.uniform(k_q, (count, self.robot.n), jnp.float64, -1.0, 1.0)
            q0 = self.q_start + args.perturbation * offset
            qd0 = jnp.broadcast_to(self.qd_start, q0.shape)
            return tune.Scenarios(q0, qd0, jax.vmap(self.params)(payload)), payload

        return draw

    def errors(self, sol, p):
        """(position error ‖x - c‖ (T,) m, orientation error ‖½ vee(...)‖ (T,) rad, torques (T, 6) N m) at
        the saved times of one scenario."""
        phi = jax.vmap(lambda q, t: self.constraint.value(q, t, p["controller"]))(sol.q, sol.ts)
        torque = jax.vmap(
            lambda q, qd, t: control.servo_control(
                self.model, q, qd, t, p["controller"], pinv_method="householder"
            )
        )(sol.q, sol.qd, sol.ts)
        return jnp.linalg.norm(phi[:, :3], axis=1), jnp.linalg.norm(phi[:, 3:], axis=1), torque


def rms_tracking(setup: Setup) -> tune.Term:
    """e = (∫‖φ‖² dt / T)^{1/2}: the RMS servo residual of a scenario (m and rad)."""

    def fn(sol, p):
        position, orientation, _ = setup.errors(sol, p)
        mean_square = integrate(sol.ts, position**2 + orientation**2) / (sol.ts[-1] - sol.ts[0])
        return jnp.sqrt(mean_square + 1e-30)

    return tune.custom(fn, name="rms_tracking")


def peak_torque(setup: Setup) -> tune.Term:
    """Smooth maximum (power mean, p = 16) over saved times and joints of |τ_i(t)| (N m)."""
    return tune.custom(lambda sol, p: tune.smooth_max(jnp.ravel(setup.errors(sol, p)[2])), name="peak_torque")


# ------------------------------------------------------------------------------------------ the study
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_batch_arguments(parser, "tune_ur5", train_scenarios=16, heldout_scenarios=64, t1=2.0, dt=5e-3)
    parser.add_argument("--num-saves", type=int, default=201, help="evenly spaced save times over [0, t1]")
    parser.add_argument("--radius", type=float, default=0.1, help="radius of the tool's circle (m)")
    parser.add_argument("--frequency", type=float, default=0.5, help="revolutions per second (Hz)")
    parser.add_argument("--payload-max", type=float, default=3.0, help="payloads drawn from U[0, max] (kg)")
    parser.add_argument(
        "--nominal-payload", type=float, default=1.5, help="the payload the controller's model carries (kg)"
    )
    parser.add_argument(
        "--perturbation", type=float, default=0.01, help="initial joint offsets drawn from U[-δ, δ] (rad)"
    )
    parser.add_argument(
        "--torque-weight", type=float, default=1e-5, help="weight w_τ on the peak torque (m / (N m))"
    )
    add_optimizer_arguments(parser, steps=25, learning_rate=0.3)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes for a smoke test: 2 + 2 scenarios, 0.4 s, 2 steps"
    )


def _score(setup, space, batch, options):
    """Held-out numbers at θ, per scenario: RMS and max position error (m), RMS and max orientation error
    (rad), peak |τ| (N m), status; and the traced tool positions (for the figures)."""

    @jax.jit
    def score(theta):
        params = jax.vmap(lambda base: space.params(theta, base))(batch.params)
        sol = simulate_batch(setup.plant, batch.q0, batch.qd0, params, batch_params=True, **options)
        position, orientation, torque = jax.vmap(setup.errors)(sol, params)
        span = sol.ts[0, -1] - sol.ts[0, 0]
        rms = lambda e: jnp.sqrt(jax.vmap(integrate)(sol.ts, e**2) / span)
        tool = jax.vmap(jax.vmap(lambda q, p: setup.robot.frame(setup.frame)(q, p)[1], (0, None)))(
            sol.q, params
        )
        return {
            "rms_position_m": rms(position),
            "max_position_m": position.max(1),
            "final_position_m": position[:, -1],
            "rms_orientation_rad": rms(orientation),
            "max_orientation_rad": orientation.max(1),
            "peak_torque_Nm": jnp.abs(torque).max((1, 2)),
            "ok": sol.ok,
            "position_error_m": position,
            "tool_m": tool,
            "ts": sol.ts[0],
            "q": sol.q,
        }

    def run(theta):
        out = {k: np.asarray(v) for k, v in score(theta).items()}
        ok = out["ok"]
        summary = {
            f"{stat}_{name}": float(fn(out[name][ok]))
            for name in ("rms_position_m", "max_position_m", "rms_orientation_rad", "peak_torque_Nm")
            for stat, fn in (("mean", np.mean), ("max", np.max))
        }
        summary["failures"] = int(np.sum(~ok))
        return summary, out

    return run


def run(args) -> dict:
    if args.quick:
        args.train_scenarios, args.heldout_scenarios, args.t1, args.steps, args.num_saves = 2, 2, 0.4, 2, 21
    out = prepare_output(args.out, overwrite=args.overwrite)
    tic = time.perf_counter()
    setup = Setup(args)
    bounds = tune.baumgarte_gain_bounds(diffrax.Tsit5(), args.dt, form="quadratic", safety=0.5)
    lower = 0.5
    space = tune.Parametrization(
        setup.params(jnp.asarray(args.nominal_payload)),
        {
            "controller/alpha": tune.log(lower=lower, upper=bounds["alpha"]),
            "controller/beta": tune.log(lower=lower, upper=bounds["beta"]),
        },
    )
    draw = setup.scenarios(args)
    (train, train_payload), (heldout, heldout_payload) = train_and_heldout(draw, args)
    options = tune.simulation_options(t1=args.t1, dt=args.dt, num_saves=args.num_saves)
    objective = rms_tracking(setup) + args.torque_weight * peak_torque(setup)
    score = _score(setup, space, heldout, options)
    untuned_theta = space.init()
    before, before_raw = score(untuned_theta)
    print(f"[tune_ur5] held-out batch, untuned α = β = {UNTUNED:g}: {before}", flush=True)
    fit_tic = time.perf_counter()
    result = fit_from_args(setup.plant, space, train, objective, options, args, out / "fit")
    fit_s = time.perf_counter() - fit_tic
    after, after_raw = score(result.theta)
    tuned = {
        "alpha": float(result.values["controller/alpha"]),
        "beta": float(result.values["controller/beta"]),
    }
    figure_batch = _figure_batch(setup, args)
    figures = _figures(out, setup, space, figure_batch, options, untuned_theta, result, args)
    per_scenario = {
        "payload_kg": np.asarray(heldout_payload).tolist(),
        "untuned": {
            k: before_raw[k].tolist() for k in ("rms_position_m", "rms_orientation_rad", "peak_torque_Nm")
        },
        "tuned": {
            k: after_raw[k].tolist() for k in ("rms_position_m", "rms_orientation_rad", "peak_torque_Nm")
        },
    }
    metrics = {
        "model": f"UR5 of example-robot-data ({URDF}) loaded by ukjax.robots.load; B = I (6 joint torques); "
        f"servo constraints on {TOOL}: position on a horizontal circle and orientation fixed (3 + 3 rows, "
        "Liu et al. 2015 §III), Baumgarte φ̈ + 2αφ̇ + β²φ = 0",
        "controller": "u from the arm with the nominal payload (ukjax.control.servo_force); the plant "
        "carries the scenario's payload",
        "path": {"radius_m": args.radius, "frequency_Hz": args.frequency, "home_q_rad": list(HOME)},
        "objective": "mean over scenarios of RMS ‖φ‖ (m, rad) + w_τ · smoothmax |τ| (power mean p = 16)",
        "torque_weight_m_per_Nm": args.torque_weight,
        "integrator": fixed_step_record(args.dt, args.num_saves, t1=args.t1)
        | {"tolerance": "none: fixed step (no error control)"},
        "start": {
            "consistent_state_residual_max": setup.start_residual,
            "q_rad": np.asarray(setup.q_start).tolist(),
            "qd_rad_per_s": np.asarray(setup.qd_start).tolist(),
        },
        "batches": {
            "train": train.size,
            "heldout": heldout.size,
            "seed": args.seed,
            "payload": f"U[0, {args.payload_max:g}] kg at the tool flange; the model carries "
            f"{args.nominal_payload:g} kg",
            "perturbation": f"every joint angle + U[-{args.perturbation:g}, {args.perturbation:g}] rad",
        },
        "gain_box": {"alpha": [lower, bounds["alpha"]], "beta": [lower, bounds["beta"]], "stability": bounds},
        "untuned_gains": {"alpha": UNTUNED, "beta": UNTUNED},
        "tuned_gains": tuned,
        "fit": {
            "steps": args.steps,
            "best_train_loss": result.best_loss,
            "simulations": result.simulations,
            "stopped": result.stopped,
            "wall_s": fit_s,
        },
        "heldout_untuned": before,
        "heldout_tuned": after,
        "constraint_violation": {
            "note": "the servo residual φ of the plant (there are no passive constraints); max over the "
            "held-out batch and the span",
            "untuned_max_position_m": before["max_max_position_m"],
            "tuned_max_position_m": after["max_max_position_m"],
            "tuned_final_position_max_m": float(np.max(after_raw["final_position_m"])),
        },
        "joint_ranges": {
            label: joint_range_record(setup.robot, types.SimpleNamespace(ts=raw["ts"], q=raw["q"]))
            for label, raw in (("heldout_untuned", before_raw), ("heldout_tuned", after_raw))
        },
        "per_scenario_heldout": per_scenario,
        "wall_s": time.perf_counter() - tic,
        "figures": figures,
    }
    write_json(out / "metrics.json", metrics)
    print(f"{'gains':>28}{'RMS pos mm':>12}{'max pos mm':>12}{'RMS rot mrad':>14}{'peak |τ| N m':>14}")
    print("(held-out batch: mean of per-scenario RMS; max over scenarios and time; peak torque: max)")
    for label, g, s in (
        ("untuned", {"alpha": UNTUNED, "beta": UNTUNED}, before),
        ("tuned", tuned, after),
    ):
        text = f"{label} α={g['alpha']:.3g} β={g['beta']:.3g}"
        print(
            f"{text:>28}{1e3 * s['mean_rms_position_m']:>12.3f}{1e3 * s['max_max_position_m']:>12.3f}"
            f"{1e3 * s['mean_rms_orientation_rad']:>14.3f}{s['max_peak_torque_Nm']:>14.1f}"
        )
    for label, record in metrics["joint_ranges"].items():
        print("\n".join(joint_range_lines(record, label.replace("_", " "))))
    return metrics


def _figure_batch(setup, args):
    """The payloads of the figures, each from the unperturbed consistent start."""
    count = len(FIGURE_PAYLOADS)
    params = jax.vmap(setup.params)(jnp.asarray(FIGURE_PAYLOADS))
    q0 = jnp.broadcast_to(setup.q_start, (count, setup.robot.n))
    return tune.Scenarios(q0, jnp.broadcast_to(setup.qd_start, q0.shape), params)


def _figures(out, setup, space, batch, options, untuned_theta, result, args):
    plt = pyplot()
    score = _score(setup, space, batch, options)
    tuned = "tuned α = {alpha:.3g}, β = {beta:.3g}".format(
        alpha=float(result.values["controller/alpha"]), beta=float(result.values["controller/beta"])
    )
    runs = {f"untuned α = β = {UNTUNED:g}": score(untuned_theta)[1], tuned: score(result.theta)[1]}
    files = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    ts = np.linspace(0.0, 1.0 / args.frequency, 200)
    reference = np.asarray(jax.vmap(setup.path)(jnp.asarray(ts)))
    for ax, (label, raw) in zip(axes, runs.items(), strict=True):
        ax.plot(reference[:, 0], reference[:, 1], "k--", lw=1, label="path c(t)")
        for k, payload in enumerate(FIGURE_PAYLOADS):
            tool = raw["tool_m"][k]
            ax.plot(tool[:, 0], tool[:, 1], lw=1.2, label=f"payload {payload:g} kg")
        ax.set(xlabel="x (m)", ylabel="y (m)", title=f"Tool path, {label}", aspect="equal")
        ax.legend(fontsize=7)
    files.append(save_figure(fig, out / "tool_path.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (label, raw), style in zip(runs.items(), ("--", "-"), strict=True):
        for k, payload in enumerate(FIGURE_PAYLOADS):
            ax.semilogy(
                raw["ts"], raw["position_error_m"][k], style, color=f"C{k}", label=f"{label}, {payload:g} kg"
            )
    ax.set(
        xlabel="t (s)",
        ylabel="position error ‖x - c‖ (m)",
        title=f"Tracking error (controller's model: {args.nominal_payload:g} kg)",
    )
    ax.legend(fontsize=6)
    files.append(save_figure(fig, out / "tracking_error.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in result.history]
    ax.semilogy(steps, [r["loss"] for r in result.history], "k.-", label="J (m)")
    ax.semilogy(steps, [r["values"]["controller/alpha"] for r in result.history], label="α (1/s)")
    ax.semilogy(steps, [r["values"]["controller/beta"] for r in result.history], label="β (1/s)")
    ax.set(xlabel="step", ylabel="training loss J (m); gains (1/s)", title="Fit")
    ax.legend(fontsize=8)
    files.append(save_figure(fig, out / "fit.png"))
    return [Path(f).name for f in files]
