"""``ukjax demo``: a Monte-Carlo batch of SCARA robots following a helix, integrated in compiled chunks.

The model is the SCARA of Xu & Liu 2017 (:mod:`ukjax.models.scara`): four joints, the end effector held on the
helix x = R sin ωt, y = y_c + R cos ωt, z = v_z t (eq. 40; R = 5 cm, y_c = 35 cm, one turn every 2π/ω = 5 s,
rising v_z = 2 cm/s) with fixed orientation (eq. 47-48) by the Udwadia-Kalaba constraint torques (eq. 50-51),
with Baumgarte stabilization φ̈ + αφ̇ + βφ = 0 (eq. 52; ``--alpha``, ``--beta``). The default gains settle:
α = 20 /s, β = 100 /s² is critically damped (α = 2√β), so the initial error decays as (1 + 10 t) e^(-10 t),
below 1e-6 of itself by t ≈ 1.7 s, well inside the 5 s turn. The paper's gains, α = 0.5, β = 200, give a
lightly damped oscillation (period 0.44 s, envelope e^(-t/4)) that keeps 29 % of the initial millimetres at
t1 = 5 s, so every scenario ends ``constraint_violated``; the demo runs the first ``--paper-comparison``
scenarios with them too (same compiled programs: the gains are parameters) and prints both.
Seen from above (x, y) the helix is a circle of radius R, which is how the paths figure draws it, next to the
height z(t). Each scenario perturbs the paper's values: every mass, length and moment of inertia by a
uniform factor in [1 - spread, 1 + spread], the joint angles of the (constraint-incompatible) initial state by
a normal error of ``--angle-noise`` degrees, the stroke by a tenth of a millimetre per degree of that, and the
initial velocities by 1 %.

Each chunk of scenarios gets what :func:`ukjax.simulate_batch` (``batch_params=True``) computes inside a
``jit``, on the CPU bit for bit from two programs that XLA compiles side by side
(:func:`ukjax._programs.compiled_pipeline`): the integration, then the UK solve and the diagnostics at the
saved times with the demo's post-processing (``ukjax.simulation._fixed_step_stage``; on a 2-core CPU they
compile in 4.2 s against 6.5 s as one program, ``benchmarks/demo_first_result.py``); elsewhere from one
program (on a GPU simulate_batch takes its fused kernel where it applies). The integration uses the explicit
Runge-Kutta solver ``--solver`` (default ``diffrax.Bosh3``: 3rd order, three evaluations per step; on this
batch at 5 ms it runs 2.1x as many scenario-steps per second as ``Tsit5`` and leaves the same constraint
residual, 2.3e-4, which the paper's Baumgarte gains set, not the integrator: ``benchmarks/integrators.py``) at
a fixed step: a fixed step makes the batch run in lockstep without adaptive rejections, which is what
throughput wants (accuracy studies use the adaptive default). The demo reports

* throughput: scenarios per second and scenario-steps per second of the integration, compile time apart;
* constraint violation: the end-effector path error e(t) = |p(q(t)) - p_d(t)| (eq. 39-40) and the residual
  norm |φ(q(t), t)| (eq. 48), each as the maximum, median and 95th percentile over scenarios of the
  per-scenario peak over the whole run and over its last fifth (the "tail": Baumgarte's error dynamics
  oscillate with a period of 2π/√β ≈ 0.44 s, so the value at t1 alone can sit on a zero crossing);
* failures by solver status (:data:`ukjax.RESULTS`),

and writes ``metrics.json`` (with the gains, the solver, the step and the scenario count) and three figures
(violation histograms, end-effector paths seen from above and their height, violation over time) into
``--out`` (default ``./ukjax-results/demo``; a folder that already holds results needs ``--overwrite``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ukjax.models.scara import PERTURBED, VELOCITY_NOISE, sample_scenarios  # noqa: F401 (re-exported)

DESCRIPTION = (
    "Monte-Carlo batch of SCARA robots following a helix (Xu & Liu 2017, eq. 40), compiled once: "
    "throughput and constraint violation"
)

TAIL = 0.8  # the "tail" statistics cover t >= TAIL * t1
PAPER_DEFAULTS = {"--duration": "Xu & Liu 2017, eq. 40: one turn of the helix, 2π/ω with ω = 0.4π rad/s"}
NOT_IN_PROGRAM = frozenset(
    {"command", "out", "overwrite", "no_progress", "no_cache", "paper_comparison", "scenarios", "seed",
     "spread", "angle_noise", "alpha", "beta"}
)  # fmt: skip
"""The demo's options that do not change its chunk program (output, display, or only the arrays' values): the
others are part of its key in the program cache (ukjax._programs)."""
PAPER_GAINS = {"alpha": 0.5, "beta": 200.0}  # Xu & Liu 2017, eq. 52-54: the comparison run


# --solver NAME -> the diffrax solver: explicit Runge-Kutta methods, which take the fixed step as it is.
SOLVERS = {
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
    "bosh3": diffrax.Bosh3,
    "ralston": diffrax.Ralston,
    "midpoint": diffrax.Midpoint,
    "heun": diffrax.Heun,
    "euler": diffrax.Euler,
}

FLAGS = (
    ("--scenarios", int, 1024, "number of scenarios"),
    ("--duration", float, 5.0, "simulated seconds; 5 s is one turn of the helix (Xu & Liu 2017, eq. 40)"),
    ("--dt", float, 5e-3, "fixed integrator step in seconds (smaller than --duration)"),
    ("--seed", int, 0, "random seed of the perturbations"),
    ("--spread", float, 0.05, "relative spread of masses, lengths, inertias"),
    ("--angle-noise", float, 1.0, "standard deviation of the initial joint-angle errors, degrees"),
    ("--saves", int, 201, "saved time points per scenario"),
    ("--chunk", int, 256, "scenarios per compiled call; the progress bar advances per chunk"),
    ("--alpha", float, 20.0, "Baumgarte gain α (1/s) of φ̈ + αφ̇ + βφ = 0, all four rows; default critically "
     "damped, α = 2√β (Xu & Liu 2017, eq. 52-54: 0.5, run for comparison, see --paper-comparison)"),
    ("--beta", float, 100.0, "Baumgarte gain β (1/s²), all four rows; with α = 20 the error decays as "
     "(1 + 10 t) e^(-10 t) (Xu & Liu 2017, eq. 52-54: 200)"),
    ("--paper-comparison", int, 256, "also run the first N scenarios with the paper's gains α = 0.5, "
     "β = 200 (Xu & Liu 2017, eq. 52-54) and print both; 0: off"),
)  # fmt: skip


def add_arguments(parser) -> None:
    """Flags of ``ukjax demo`` (defaults: 1024 scenarios over one turn of the paper's helix)."""
    from ukjax.studies._common import add_output_arguments

    for flag, kind, default, text in FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument(
        "--solver", choices=sorted(SOLVERS), default="bosh3",
        help="diffrax explicit Runge-Kutta solver; bosh3 (3rd order, 3 evaluations per step) runs the batch "
        "~2x faster than tsit5 and leaves the same constraint residual, which the Baumgarte gains set "
        "(benchmarks/integrators.py)"
    )
    add_output_arguments(parser, "demo")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar while integrating")


def side_by_side() -> bool:
    """Whether the demo compiles each chunk as two programs side by side (on the CPU, where XLA compiles a
    program on ~1.6 cores and tracing runs on one) rather than one program (elsewhere: on a GPU,
    :func:`ukjax.simulate_batch` integrates a fixed-step batch with its fused kernel where it applies)."""
    return jax.default_backend() == "cpu"


def _path_error(ts, q, params):
    """e(t) = |p(q(t)) - p_d(t)| for one scenario's saved trajectory (Xu & Liu 2017, eq. 39-40)."""
    from ukjax.models import scara

    return scara.path_error(ts, q, params)


def _paths(q, params):
    from ukjax.models import scara

    return jax.vmap(lambda qi: scara.end_effector(qi, params))(q)


@jax.jit
def _postprocess(ts, q, position_residual, params):
    """Path error e(t), |φ(t)| and end-effector paths of every scenario (batch, time[, 3])."""
    path_error = jax.vmap(_path_error, in_axes=(None, 0, 0))(ts, q, params)
    phi_norm = jnp.linalg.norm(position_residual, axis=-1)
    paths = jax.vmap(_paths)(q, params)
    return path_error, phi_norm, paths


def _stats(values) -> dict:
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return {"max": float("nan"), "median": float("nan"), "p95": float("nan")}
    return {
        "max": float(np.max(values)),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
    }


def _status_counts(status) -> dict:
    import ukjax

    status = np.asarray(status)
    counts = {}
    for code in ukjax.RESULTS:
        counts[code.name] = int(np.sum(status == int(code)))
    return counts


def _phase(number: int, text: str) -> float:
    print(f"[{number}/3] {text} ...", flush=True)
    return time.perf_counter()


def _figures(out: Path, ts, path_error, phi_norm, paths, desired, ok, args, dt, helix) -> list[str]:
    from ukjax.studies._common import pyplot

    plt = pyplot()

    setting = f"{SOLVERS[args.solver].__name__}, fixed step {dt:g} s, {len(path_error)} scenarios"
    floor = 1e-16
    files = []

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    tail = ts >= TAIL * ts[-1]
    for ax, values, label in (
        (axes[0], path_error, "tail peak of e(t) [m]"),
        (axes[1], phi_norm, "tail peak of |φ| (m or rad)"),
    ):
        late = np.maximum(values[ok][:, tail].max(axis=1), floor)
        bins = np.logspace(np.log10(late.min()), np.log10(late.max()) + 1e-9, 40) if late.size else 10
        ax.hist(late, bins=bins)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("scenarios")
    fig.suptitle(f"Constraint violation over t ≥ {TAIL:g} t1 = {TAIL * args.duration:g} s ({setting})")
    fig.tight_layout()
    files.append(_save(fig, out / "violation_histogram.png"))

    fig, (ax, ax_z) = plt.subplots(1, 2, figsize=(11, 5), width_ratios=(1, 1.2))
    shown = np.flatnonzero(ok)[:64]
    for i in shown:
        ax.plot(paths[i, :, 0], paths[i, :, 1], lw=0.6, alpha=0.6)
        ax_z.plot(ts, paths[i, :, 2], lw=0.6, alpha=0.6)
    desired_label = "desired helix (Xu & Liu 2017, eq. 40)"
    ax.plot(desired[:, 0], desired[:, 1], "k--", lw=1.5, label=desired_label)
    ax_z.plot(ts, desired[:, 2], "k--", lw=1.5, label=desired_label)
    ax.set_aspect("equal")
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.set_title(f"seen from above: the helix is a circle of radius R = {helix['radius']:g} m", fontsize=9)
    ax_z.set_xlabel("t [s]")
    ax_z.set_ylabel("height z [m]")
    ax_z.set_title(f"height: the helix rises at v_z = {helix['vz']:g} m/s", fontsize=9)
    ax_z.legend(loc="upper left", fontsize=8)
    worst = float(np.max(path_error[ok])) if ok.any() else float("nan")
    fig.suptitle(f"{len(shown)} end-effector paths on the helix; max path error {worst:.2e} m ({setting})",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    files.append(_save(fig, out / "end_effector_paths.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, values, label in (
        (axes[0], path_error, "path error e(t) [m]"),
        (axes[1], phi_norm, "|φ(t)| (m or rad)"),
    ):
        values = np.maximum(values[ok], floor)
        if values.size:
            lo, mid, hi = np.percentile(values, [5, 50, 95], axis=0)
            ax.fill_between(ts, lo, hi, alpha=0.3, label="5-95 %")
            ax.plot(ts, mid, label="median")
            ax.plot(ts, values.max(axis=0), "k:", lw=0.8, label="max")
        ax.set_yscale("log")
        ax.set_xlabel("t [s]")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    gains = f"Baumgarte α = {args.alpha:g} 1/s, β = {args.beta:g} 1/s²"
    fig.suptitle(f"Constraint violation over time, {gains} ({setting})")
    fig.tight_layout()
    files.append(_save(fig, out / "violation_over_time.png"))
    return files


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _settling(alpha: float, beta: float, t1: float) -> dict:
    """How φ̈ + αφ̇ + βφ = 0 decays: damping kind, decay rate σ (slowest root's real part), period if it
    oscillates, and the envelope e^(-σ t1) left at t1 (times a polynomial factor when critically damped)."""
    disc = alpha**2 - 4 * beta
    if disc < 0:
        kind, sigma, period = "underdamped", alpha / 2, 2 * math.pi / math.sqrt(-disc / 4)
    else:
        kind = "critically damped" if disc == 0 else "overdamped"
        sigma, period = (alpha - math.sqrt(disc)) / 2, None
    envelope = math.exp(-sigma * t1) * (1 + sigma * t1 if disc == 0 else 1)
    return {"kind": kind, "decay_rate_per_s": sigma, "period_s": period, "envelope_at_t1": envelope}


def _paper_comparison(compiled, piece, count: int, ts) -> dict | None:
    """The first ``count`` scenarios again with the paper's gains (same compiled programs, gains replaced in
    the batched parameters): status counts and path error in metres. None when ``count`` is 0."""
    import ukjax

    if count == 0:
        return None
    q0s, qd0s, batch = piece
    batch = dict(batch, **{k: jnp.full_like(batch[k], v) for k, v in PAPER_GAINS.items()})
    found = jax.block_until_ready(compiled(q0s, qd0s, batch))
    path_error = np.asarray(found["path_error"])[:count]
    status = np.asarray(found["status"])[:count]
    tail = np.asarray(ts) >= TAIL * ts[-1]
    return {
        "alpha": PAPER_GAINS["alpha"], "beta": PAPER_GAINS["beta"], "source": "Xu & Liu 2017, eq. 52-54",
        "scenarios": count,
        "succeeded": int(np.sum(status == int(ukjax.RESULTS.success))),
        "failures_by_status": {k: v for k, v in _status_counts(status).items() if k != "success" and v},
        "path_error_m": {"tail": _stats(path_error[:, tail].max(axis=1)), "at_t1": _stats(path_error[:, -1])},
        "settling": _settling(PAPER_GAINS["alpha"], PAPER_GAINS["beta"], float(ts[-1])),
    }  # fmt: skip


def run(args) -> dict:
    """Run the demo of ``args`` (see :func:`add_arguments`): print a summary, write files, return metrics."""
    import ukjax
    from ukjax._programs import compiled_pipeline, compiled_program
    from ukjax.models import scara
    from ukjax.options import bucket_of
    from ukjax.simulation import _fixed_step_stage
    from ukjax.studies._common import prepare_output, write_json

    if args.scenarios < 1 or args.duration <= 0 or args.dt <= 0 or args.saves < 2:
        raise ValueError("--scenarios, --duration, --dt must be positive and --saves at least 2")
    if args.dt >= args.duration:  # refused before any scenario is drawn or program compiled
        raise ValueError(f"--dt {args.dt:g} s is not smaller than --duration {args.duration:g} s")
    if args.paper_comparison < 0:
        raise ValueError(
            f"--paper-comparison must be 0 (off) or a number of scenarios, got {args.paper_comparison}"
        )
    if args.solver not in SOLVERS:
        raise ValueError(f"--solver must be one of {', '.join(sorted(SOLVERS))}, got {args.solver!r}")
    out = prepare_output(args.out, overwrite=args.overwrite)
    solver = SOLVERS[args.solver]()
    steps = int(math.ceil(args.duration / args.dt - 1e-9))
    dt = args.duration / steps
    started = time.perf_counter()

    params = scara.default_params()
    params["alpha"] = jnp.full_like(params["alpha"], args.alpha)
    params["beta"] = jnp.full_like(params["beta"], args.beta)
    q0, qd0 = scara.initial_state(params)
    batch, q0s, qd0s = sample_scenarios(
        jax.random.PRNGKey(args.seed), params, q0, qd0, args.scenarios, spread=args.spread,
        angle_noise_deg=args.angle_noise,
    )  # fmt: skip
    ts = jnp.linspace(0.0, args.duration, args.saves)
    system = scara.system()

    options = dict(batch_params=True, t1=args.duration, ts=ts, dt=dt, solver=solver)

    def summary(sol, batch):
        """A chunk's status and what the summary and figures need."""
        path_error, phi_norm, paths = _postprocess(ts, sol.q, sol.position_residual, batch)
        return {"status": sol.status, "path_error": path_error, "phi_norm": phi_norm, "paths": paths}

    def integrate(q0s, qd0s, batch):
        """One chunk's integration (the first of the chunk's two programs)."""
        return _fixed_step_stage(system, q0s, qd0s, batch, **options)

    def finish(q0s, qd0s, batch, states):
        """One chunk's summary from its integration (the second program)."""
        return summary(_fixed_step_stage(system, q0s, qd0s, batch, states, **options), batch)

    def simulate(q0s, qd0s, batch):
        """One chunk in one program: simulate_batch, whose engine="auto" takes the fused kernel on a GPU."""
        return summary(ukjax.simulate_batch(system, q0s, qd0s, batch, **options), batch)

    # A chunk of at most --chunk scenarios, a batch bucket (ukjax.options.bucket_of) when fewer: 100 and 120
    # scenarios run the program of 128 (one compilation, or one entry of the persistent cache, for both).
    chunk = max(1, min(args.chunk, bucket_of(args.scenarios)))
    count = math.ceil(args.scenarios / chunk)
    # Pad to whole chunks with copies of scenario 0 (dropped afterwards): every chunk reuses the programs.
    pad = count * chunk - args.scenarios
    padded = jax.tree_util.tree_map(
        lambda x: jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]), (q0s, qd0s, batch)
    )
    pieces = [
        jax.tree_util.tree_map(lambda x, k=k: x[k * chunk : (k + 1) * chunk], padded) for k in range(count)
    ]
    print(
        f"ukjax demo: {args.scenarios} SCARA scenarios following a helix (Xu & Liu 2017), "
        f"{args.duration:g} s, {type(solver).__name__} fixed step {dt:g} s ({steps} steps), Baumgarte "
        f"α = {args.alpha:g}, β = {args.beta:g}, {q0s.dtype}, backend {jax.default_backend()}; "
        f"{count} compiled call(s) of {chunk} scenarios",
        flush=True,
    )
    tic = _phase(1, "compiling (a second run reads it from the caches)")
    key = {"args": {k: v for k, v in vars(args).items() if k not in NOT_IN_PROGRAM}, "chunk": chunk}
    if side_by_side():
        compiled, how = compiled_pipeline("demo", integrate, finish, pieces[0], key)
    else:
        compiled, how = compiled_program("demo", simulate, pieces[0], key)
    compile_s = time.perf_counter() - tic
    print(f"      compiled in {compile_s:.1f} s ({how})", flush=True)

    tic = _phase(2, f"integrating {args.scenarios} scenarios x {steps} steps")
    from tqdm.auto import tqdm

    results = []
    with tqdm(total=args.scenarios, unit="scenario", disable=args.no_progress) as bar:
        for k, piece in enumerate(pieces):
            results.append(jax.block_until_ready(compiled(*piece)))
            bar.update(min(chunk, args.scenarios - k * chunk))
    sol = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs)[: args.scenarios], *results)
    integrate_s = time.perf_counter() - tic
    print(f"      integrated in {integrate_s:.2f} s", flush=True)
    tic = time.perf_counter()
    paper = _paper_comparison(compiled, pieces[0], min(args.paper_comparison, chunk, args.scenarios), ts)
    if paper:
        print(
            f"      the paper's gains on the first {paper['scenarios']} scenarios: "
            f"{time.perf_counter() - tic:.2f} s",
            flush=True,
        )

    tic = _phase(3, "post-processing (violation statistics, figures, metrics.json)")
    path_error, phi_norm, paths = (np.asarray(sol[name]) for name in ("path_error", "phi_norm", "paths"))
    desired = np.asarray(jax.vmap(lambda t: scara.desired_trajectory(t, params))(ts))
    status = np.asarray(sol["status"])
    # Statistics cover every scenario that ran to t1 (success, or constraint_violated: the constraints did not
    # settle to constraint_rtol, which the statistics then show); the status counts are reported beside them.
    completed = (int(ukjax.RESULTS.success), int(ukjax.RESULTS.constraint_violated))
    ok = np.isin(status, completed) & np.all(np.isfinite(path_error), axis=1)
    failures = {name: count for name, count in _status_counts(status).items() if name != "success" and count}
    tail = np.asarray(ts) >= TAIL * args.duration
    helix = {
        "shape": "helix x = R sin ωt, y = y_c + R cos ωt, z = v_z t (Xu & Liu 2017, eq. 40)",
        **{name: float(params[name]) for name in ("radius", "center_y", "omega", "vz")},
    }
    figures = _figures(out, np.asarray(ts), path_error, phi_norm, paths, desired, ok, args, dt, helix)
    postprocess_s = time.perf_counter() - tic

    final = path_error[:, -1]
    metrics = {
        "scenarios": args.scenarios,
        "succeeded": int(np.sum(status == int(ukjax.RESULTS.success))),
        "completed": int(ok.sum()),
        "failures_by_status": failures,
        "baumgarte": {"form": "linear (Xu & Liu 2017, eq. 52)", "alpha": args.alpha, "beta": args.beta},
        "solver": args.solver,
        "integrator": f"diffrax.{type(solver).__name__}, fixed step dt",
        "dt": dt,
        "steps": steps,
        "duration": args.duration,
        "path": helix,
        "dtype": str(q0s.dtype),
        "perturbation": {
            "parameters": list(PERTURBED),
            "relative_spread_uniform": args.spread,
            "angle_noise_deg": args.angle_noise,
            "velocity_noise_relative": VELOCITY_NOISE,
            "seed": args.seed,
        },
        "timing_s": {
            "compile": compile_s,
            "integrate": integrate_s,
            "postprocess": postprocess_s,
            "total": time.perf_counter() - started,
        },
        "throughput": {
            "scenarios_per_s": args.scenarios / integrate_s,
            "scenario_steps_per_s": args.scenarios * steps / integrate_s,
        },
        "tail_window_s": [float(ts[tail][0]), args.duration],
        "path_error_m": {
            "peak": _stats(path_error[ok].max(axis=1)),
            "tail": _stats(path_error[ok][:, tail].max(axis=1)),
            "at_t1": _stats(final[ok]),
        },
        "settling": _settling(args.alpha, args.beta, args.duration),
        "paper_gains_comparison": paper,
        "phi_norm": {
            "peak": _stats(phi_norm[ok].max(axis=1)),
            "tail": _stats(phi_norm[ok][:, tail].max(axis=1)),
        },
        "figures": figures,
    }
    write_json(out / "metrics.json", metrics)
    _print_summary(metrics, out)
    return metrics


def _gains_text(settling: dict) -> str:
    """'underdamped, period 0.44 s, envelope e^(-0.25 t): 0.29 left at t1' and the like."""
    sigma = settling["decay_rate_per_s"]
    text = settling["kind"]
    if settling["period_s"]:
        text += f", period {settling['period_s']:.2f} s"
    critical = settling["kind"] == "critically damped"
    envelope = f"(1 + {sigma:g} t) e^(-{sigma:g} t)" if critical else f"e^(-{sigma:g} t)"
    return f"{text}, the error decays as {envelope}: {settling['envelope_at_t1']:.2g} of it left at t1"


def _print_summary(m: dict, out: Path) -> None:
    import ukjax

    t, th = m["timing_s"], m["throughput"]
    print(
        f"\n{m['succeeded']}/{m['scenarios']} scenarios succeeded (status success: ran to t1 and the "
        "constraints held)"
    )
    for name, count in m["failures_by_status"].items():
        print(f"  {count} x {name}: {ukjax.RESULTS.message(ukjax.RESULTS[name])}")
    gains, at_t1 = m["baumgarte"], m["path_error_m"]["at_t1"]
    print(
        f"Baumgarte gains α = {gains['alpha']:g}, β = {gains['beta']:g}: {_gains_text(m['settling'])}; "
        f"end-effector path error at t1: max {at_t1['max']:.2e} m, median {at_t1['median']:.2e} m"
    )
    paper = m.get("paper_gains_comparison")
    if paper:
        count, flagged = paper["scenarios"], paper["scenarios"] - paper["succeeded"]
        at_t1 = paper["path_error_m"]["at_t1"]
        statuses = ", ".join(f"{v} x {k}" for k, v in paper["failures_by_status"].items())
        verdict = f"not settled by t1 = {m['duration']:g} s" if flagged else "settled"
        print(
            f"paper's gains (Xu & Liu 2017, eq. 52: α = {paper['alpha']:g}, β = {paper['beta']:g}) on the "
            f"first {count} scenarios: {flagged} of {count} flagged{f' ({statuses})' if statuses else ''}; "
            f"{_gains_text(paper['settling'])}, {verdict}: path error at t1 max {at_t1['max']:.2e} m, "
            f"median {at_t1['median']:.2e} m"
        )
    print(
        f"throughput: {th['scenarios_per_s']:.1f} scenarios/s, {th['scenario_steps_per_s']:.3g} "
        f"scenario-steps/s (compile {t['compile']:.1f} s, integrate {t['integrate']:.2f} s, "
        f"post-process {t['postprocess']:.1f} s)"
    )
    print(f"constraint violation over the {m['completed']} scenarios that ran to t1:")
    print(f"{'':<30}{'max':>10}{'median':>10}{'95th pct':>10}")
    for key, label in (("path_error_m", "path error [m]"), ("phi_norm", "|φ| [m or rad]")):
        for when in ("peak", "tail"):
            s = m[key][when]
            print(f"  {label + ', ' + when:<28}{s['max']:>10.2e}{s['median']:>10.2e}{s['p95']:>10.2e}")
    print(f"wrote metrics.json and {', '.join(m['figures'])} to {out}/ (total {t['total']:.1f} s)")
