"""Cost of a tuning gradient: the SCARA objective of ``ukjax tune scara`` at 256 scenarios x 1000 steps.

Times, in one run and interleaved (forward, gradient, forward, gradient, ...), the compiled functions the
tuner calls: the batch loss at the gains (``ukjax.tune.batch_loss``: simulate + objective + risk) and its
value and gradient with respect to (log α, log β) (``ukjax.tune.batch_value_and_grad``) in both modes: forward
mode (the default for up to ``tune.FORWARD_MODE_MAX_PARAMETERS`` tuned numbers: two tangents carried through
the time loop with diffrax's ``ForwardMode``) and reverse mode (``jax.vjp`` through diffrax's
``RecursiveCheckpointAdjoint``). Reports each grad/forward wall-time ratio (target ≤ 3), compile times, XLA's
memory analysis of each compiled program (arguments, outputs and temporaries: the peak buffer memory XLA plans
for; on CPU the process RSS is shared with the compiler) against the trajectory's states, and how far the two
gradients differ.

``--adjoints`` adds the same comparison for diffrax's adjoints directly (``ukjax.simulate`` does not take
an adjoint argument): the SCARA right-hand side ``System.acceleration`` integrated by ``diffrax.diffeqsolve``
with ``RecursiveCheckpointAdjoint`` (checkpointed reverse mode through the solver's steps: exact gradient of
the discrete solution) and ``BacksolveAdjoint`` (the continuous adjoint ODE solved backwards: memory
independent of the number of steps, but a gradient of the continuous problem that differs from the
discrete one by the integration error, and an extra backward solve with vector-Jacobian products).

``--tangent-costs`` adds what bounds the forward-mode gradient: the time of one right-hand-side evaluation
over the tuner's scenarios, its primal (``vmap``; entry by entry, as the forward loss runs it) against its
JVP along the tuner's two directions (the ``vmap`` program; entry by entry behind the output fence, as
diffrax's ``ForwardMode`` runs it; entry by entry without the fence), and the JVP's share of the gradient (6
evaluations per Tsit5 step).

``--former-tangents`` adds, interleaved, the forward-mode gradient as it was before its right-hand side's
tangents ran entry by entry: the ordinary ``vmap`` program for values and tangents
(``ukjax.simulation.batched_by_entries`` swapped out while tracing).

``--former-solve-tangents`` adds, interleaved, the forward-mode gradient with the tangent rule of the UK
solve (``ukjax.dynamics._eq35_terms``) as it was before it materialized the right-hand sides of its solves
and dropped the Golub-Pereyra r⊥ column for method "ldl" (``ukjax.dynamics._multiplier_tangent`` swapped
while tracing).

``--crossover`` adds forward- against reverse-mode gradients for 4 tuned numbers (α per joint), 5 (α per
joint and one β) and 8 (α and β per joint), where ``tune.FORWARD_MODE_MAX_PARAMETERS`` switches between
them.

``--former-saves`` adds, interleaved, the post-processing at the saved times as it was before each of two
changes to ``ukjax.simulation._at_saves`` (swapped while the program is traced), for their before/after: the
forward loss and the forward-mode gradient with it vectorized over the saves (``jax.vmap`` instead of a
loop), and the reverse-mode gradient with the loop not rematerialized (its pullback keeping every save's
intermediates instead of re-running the post-processing on the way back).

    python3 benchmarks/tune_gradient.py                  # 256 scenarios, 1000 steps, 3 repeats
    python3 benchmarks/tune_gradient.py --adjoints       # also the two diffrax adjoints
    python3 benchmarks/tune_gradient.py --former-saves   # also the two former post-processings
    python3 benchmarks/tune_gradient.py --tangent-costs  # also one right-hand side: primal against its JVP
    python3 benchmarks/tune_gradient.py --crossover      # also forward vs reverse mode for 4, 5 and 8 numbers
    python3 benchmarks/tune_gradient.py --former-tangents  # also forward mode with vmap-program tangents
    python3 benchmarks/tune_gradient.py --former-solve-tangents  # also the former UK-solve tangent rule
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import dynamics, simulation, tune
from ukjax.linalg import cho_solve, small_matmul
from ukjax.models import scara
from ukjax.studies import tune_scara

ukjax.enable_float64()


def _memory(compiled) -> dict:
    try:
        m = compiled.memory_analysis()
    except Exception as error:  # not every backend reports it
        return {"unavailable": str(error)}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes")
    out = {f: int(getattr(m, f, 0) or 0) for f in fields}
    out["peak_estimate_MiB"] = (
        out["argument_size_in_bytes"] + out["output_size_in_bytes"] + out["temp_size_in_bytes"]
    ) / 2**20
    return out


def _compile(fn, *args):
    tic = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - tic


def _interleaved(functions: dict, args: dict, repeats: int) -> dict:
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            tic = time.perf_counter()
            jax.block_until_ready(fn(*args[name]))
            times[name].append(time.perf_counter() - tic)
    return {name: {"median_s": float(np.median(t)), "all_s": t} for name, t in times.items()}


def _vectorized_at_saves(diagnose, ts, q, qd):
    """The post-processing at the saved times as it was first: vectorized over them."""
    return jax.vmap(diagnose)(ts, q, qd)


def _stored_at_saves(diagnose, ts, q, qd):
    """The post-processing at the saved times as it was next: a loop whose pullback stores every save's
    intermediates (not rematerialized)."""
    return jax.lax.map(lambda save: diagnose(*save), (ts, q, qd))


def _objective(scenarios: int, steps: int, dt: float):
    """The tuner's SCARA objective: (batch of scenarios, gain box, forward(space), gradient(space, mode)),
    where forward(space) is the batch loss at θ and gradient(space, mode) its value and gradient, both as
    functions of (θ, batch) to compile."""
    system = scara.system()
    batch = tune_scara.scenarios(jax.random.PRNGKey(0), scenarios)
    objective = tune_scara.objective(1e-7)
    options = tune.simulation_options(t1=steps * dt, dt=dt, num_saves=201)

    def forward(space):
        def loss(theta, batch):
            return tune.batch_loss(system, space, theta, batch, objective, options=options)[0]

        return loss

    def gradient(space, mode):
        def value_and_grad(theta, batch):
            loss, _, grad = tune.batch_value_and_grad(
                system, space, theta, batch, objective, options=options, gradient_mode=mode
            )
            return loss, grad

        return value_and_grad

    return batch, tune_scara.gain_box(dt), forward, gradient


def _plain_right_hand_side(field, *_):
    """The right-hand side as it was under ``ForwardMode`` before its tangents ran entry by entry: the
    ordinary ``vmap`` program for values and tangents (no entrywise wrapper at all)."""
    return field


def _former_multiplier_tangent(method, f, A, dM, dA, db, acc, lam, dforce):
    """``ukjax.dynamics._multiplier_tangent`` as it was: the r⊥ column for every method, no materialized
    right-hand sides."""
    mm = small_matmul
    rhs = jnp.stack([dforce - mm(dM, acc) + mm(dA.T, lam), mm(dA.T, f.r_perp)], axis=1)
    x_y = cho_solve(f.L, rhs)
    x, y = x_y[:, 0], x_y[:, 1]
    return x, mm(f.G_pinv, db - mm(dA, acc) - mm(A, x) + mm(f.G_pinv, mm(A, y)))


def tuner_costs(
    scenarios: int, steps: int, dt: float, repeats: int, former_saves: bool = False,
    former_tangents: bool = False, former_solve_tangents: bool = False,
) -> dict:  # fmt: skip
    batch, box, forward_of, gradient_of = _objective(scenarios, steps, dt)
    space = tune_scara.space_for(box, 0.5, 200.0)
    theta = space.init()
    forward = forward_of(space)

    def gradient(mode):
        return gradient_of(space, mode)

    modes = ("forward", "reverse")
    compiled, compile_s, memory = {}, {}, {}
    compiled["forward"], compile_s["forward"] = _compile(forward, theta, batch)
    for mode in modes:
        compiled[f"gradient_{mode}"], compile_s[f"gradient_{mode}"] = _compile(gradient(mode), theta, batch)
    # (module, name in it, its former version, suffix of the programs' keys, programs)
    formers = []
    if former_saves:
        formers += [
            (simulation, "_at_saves", _vectorized_at_saves, "former_saves",
             (("forward", forward), ("gradient_forward", gradient("forward")))),
            (simulation, "_at_saves", _stored_at_saves, "stored_saves",
             (("gradient_reverse", gradient("reverse")),)),
        ]  # fmt: skip
    if former_tangents:
        formers.append((simulation, "batched_by_entries", _plain_right_hand_side, "vmap_tangents",
                        (("gradient_forward", gradient("forward")),)))  # fmt: skip
    if former_solve_tangents:
        formers.append((dynamics, "_multiplier_tangent", _former_multiplier_tangent, "former_solve_tangents",
                        (("gradient_forward", gradient("forward")),)))  # fmt: skip
    for module, attribute, former, suffix, programs in formers:
        current = getattr(module, attribute)
        setattr(module, attribute, former)  # swapped while tracing
        try:
            jax.clear_caches()
            for name, fn in programs:
                key = f"{name}_{suffix}"
                compiled[key], compile_s[key] = _compile(fn, theta, batch)
        finally:
            setattr(module, attribute, current)
            jax.clear_caches()
    memory = {name: _memory(fn) for name, fn in compiled.items()}
    pairs = [(mode, "forward", f"gradient_{mode}") for mode in modes]
    if former_saves:
        pairs.append(("forward_former_saves", "forward_former_saves", "gradient_forward_former_saves"))
        pairs.append(("reverse_stored_saves", "forward", "gradient_reverse_stored_saves"))
    if former_tangents:
        pairs.append(("forward_vmap_tangents", "forward", "gradient_forward_vmap_tangents"))
    if former_solve_tangents:
        pairs.append(("forward_former_solve_tangents", "forward", "gradient_forward_former_solve_tangents"))
    timing = _interleaved(compiled, {name: (theta, batch) for name in compiled}, repeats)
    loss_f = float(compiled["forward"](theta, batch))
    results = {mode: compiled[f"gradient_{mode}"](theta, batch) for mode in modes}
    ref = np.asarray([float(v) for v in results["reverse"][1].values()])
    fwd = np.asarray([float(v) for v in results["forward"][1].values()])
    n = int(batch.q0.shape[1])
    # the states of the trajectory a reverse pass must keep: (q, q̇) of every scenario at every step
    trajectory_bytes = scenarios * (steps + 1) * 2 * n * 8
    return {
        "what": "ukjax.tune.batch_loss vs batch_value_and_grad (forward and reverse mode), SCARA objective "
        "of `ukjax tune scara`, 2 tuned numbers (log α, log β)",
        "default_mode": tune.resolve_gradient_mode("auto", theta),
        "scenarios": scenarios,
        "steps": steps,
        "dt": dt,
        "saves": 201,
        "compile_s": compile_s,
        "run": timing,
        "grad_over_forward": {
            ratio: timing[gradient]["median_s"] / timing[forward]["median_s"]
            for ratio, forward, gradient in pairs
        },
        "target_ratio": 3.0,
        "memory": memory,
        "trajectory_states_MiB": trajectory_bytes / 2**20,
        "memory_over_trajectory_states": {
            name: m.get("peak_estimate_MiB", float("nan")) * 2**20 / trajectory_bytes
            for name, m in memory.items()
        },
        "loss_forward_vs_gradient_calls": [loss_f] + [float(results[mode][0]) for mode in modes],
        "gradient": {mode: {k: float(v) for k, v in results[mode][1].items()} for mode in modes},
        "forward_vs_reverse_relative_difference": float(np.linalg.norm(fwd - ref) / np.linalg.norm(ref)),
    }


def tangent_costs(scenarios: int, steps: int, repeats: int, evaluations: int = 200) -> dict:
    """Microseconds per evaluation of the SCARA right-hand side (``System.acceleration``) over the tuner's
    ``scenarios`` states and per-scenario parameters, each program a ``fori_loop`` of ``evaluations``
    evaluations (one dispatch per loop, so its cost is not counted), timed interleaved: the primal under
    ``jax.vmap`` and entry by entry (``ukjax._entrywise``, as the forward loss evaluates it), and its JVP
    along two directions under ``jax.vmap`` over them (state and gain tangents) three ways: the ordinary
    ``vmap`` program, entry by entry with the outputs assembled behind ``ukjax._entrywise._fence`` (what
    the tuner's forward mode runs), and entry by entry without the fence (swapped out while tracing); and
    the JVP's share of a forward-mode gradient over ``steps`` Tsit5 steps (6 evaluations each)."""
    from ukjax import _entrywise
    from ukjax._entrywise import batched_by_entries, evaluate_entrywise

    system = scara.system()
    batch = tune_scara.scenarios(jax.random.PRNGKey(0), scenarios)
    q0, qd0, params = batch.q0, batch.qd0, batch.params
    key_q, key_v = jax.random.split(jax.random.PRNGKey(1))
    tangent_q = jax.random.normal(key_q, (2, *q0.shape), q0.dtype)
    tangent_v = jax.random.normal(key_v, (2, *qd0.shape), qd0.dtype)
    gains = {k: jnp.zeros((2, *jnp.shape(v)), jnp.result_type(v)) for k, v in params.items()}
    gains["alpha"] = gains["alpha"].at[0].set(1.0)
    gains["beta"] = gains["beta"].at[1].set(1.0)

    def acceleration(q, qd, p):
        return system.acceleration(q, qd, 0.3, p)

    def primal_vmap(q, qd):
        return jax.vmap(acceleration)(q, qd, params)

    def primal_entrywise(q, qd):
        return evaluate_entrywise(acceleration, (q, qd, params), (True, True, True))

    def jvp_two_directions(f):
        def evaluate(q, qd):
            def along(dq, dqd, dp):
                return jax.vmap(lambda *a: jax.jvp(f, a[:3], a[3:]))(q, qd, params, dq, dqd, dp)

            out, tangents = jax.vmap(along)(tangent_q, tangent_v, gains)
            return out[0] + tangents[0] + tangents[1]

        return evaluate

    by_entries = batched_by_entries(acceleration, tangents_by_entries=True)

    def looped(evaluate):
        def run(q, qd):
            body = lambda i, q_: q_ + 1e-12 * jnp.tanh(evaluate(q_, qd))
            return jax.lax.fori_loop(0, evaluations, body, q)

        return jax.jit(run).lower(q0, qd0).compile()

    programs = {
        "primal_vmap": looped(primal_vmap),
        "primal_entrywise": looped(primal_entrywise),
        "jvp_two_directions_vmap": looped(jvp_two_directions(acceleration)),
        "jvp_two_directions_entrywise": looped(jvp_two_directions(by_entries)),
    }
    fence, _entrywise._fence = _entrywise._fence, lambda assemble, entries: assemble(entries)
    try:
        programs["jvp_two_directions_entrywise_unfenced"] = looped(jvp_two_directions(by_entries))
    finally:
        _entrywise._fence = fence
    timing = _interleaved(programs, {name: (q0, qd0) for name in programs}, repeats)
    per_evaluation = {name: t["median_s"] / evaluations * 1e6 for name, t in timing.items()}
    jvp = per_evaluation["jvp_two_directions_entrywise"]
    return {
        "what": "SCARA right-hand side per evaluation over the tuner's scenarios (fori_loop, no dispatch)",
        "scenarios": scenarios,
        "evaluations_per_program": evaluations,
        "microseconds_per_evaluation": per_evaluation,
        "jvp_over_entrywise_primal": jvp / per_evaluation["primal_entrywise"],
        "jvp_seconds_per_forward_mode_gradient": 6 * steps * jvp * 1e-6,
    }


def mode_crossover(scenarios: int, steps: int, dt: float, repeats: int) -> dict:
    """Forward- against reverse-mode gradients of the same SCARA objective for k = 4 tuned numbers (α per
    joint), k = 5 (α per joint, one β) and k = 8 (α and β per joint), timed interleaved with the forward
    loss: where ``tune.FORWARD_MODE_MAX_PARAMETERS`` should switch (k = 2 is :func:`tuner_costs`)."""
    batch, box, forward_of, gradient_of = _objective(scenarios, steps, dt)
    params = scara.default_params()
    params["alpha"], params["beta"] = jnp.full(4, 0.5), jnp.full(4, 200.0)
    alpha = tune.log(lower=box["alpha"][0], upper=box["alpha"][1])
    beta = tune.log(lower=box["beta"][0], upper=box["beta"][1], shared=True)
    beta_per_joint = tune.log(lower=box["beta"][0], upper=box["beta"][1])
    out = {}
    for k, transforms in (
        (4, {"alpha": alpha}),
        (5, {"alpha": alpha, "beta": beta}),
        (8, {"alpha": alpha, "beta": beta_per_joint}),
    ):
        space = tune.Parametrization(params, transforms)
        theta = space.init()
        compiled = {"forward": _compile(forward_of(space), theta, batch)[0]}
        for mode in ("forward", "reverse"):
            compiled[f"gradient_{mode}"] = _compile(gradient_of(space, mode), theta, batch)[0]
        timing = _interleaved(compiled, {name: (theta, batch) for name in compiled}, repeats)
        out[str(k)] = {name: t["median_s"] for name, t in timing.items()}
    return out


def adjoint_costs(scenarios: int, steps: int, dt: float, repeats: int) -> dict:
    """diffrax directly on System.acceleration: RecursiveCheckpointAdjoint vs BacksolveAdjoint."""
    system = scara.system()
    batch = tune_scara.scenarios(jax.random.PRNGKey(0), scenarios)
    t1 = steps * dt
    ts = jnp.linspace(0.0, t1, 201)

    def solve(log_gains, q0, qd0, params, adjoint):
        params = dict(
            params, alpha=jnp.full(4, jnp.exp(log_gains[0])), beta=jnp.full(4, jnp.exp(log_gains[1]))
        )

        def field(t, y, args):
            q, qd = y
            return qd, system.acceleration(q, qd, t, args)

        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            0.0,
            t1,
            dt,
            (q0, qd0),
            params,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=steps + 1,
            adjoint=adjoint,
        )
        phi = jax.vmap(lambda t, q: scara.trajectory_constraint(q, t, params))(ts, sol.ys[0])
        return tune.integrate(ts, jnp.sum(phi[:, jnp.asarray(tune_scara.PATH_ROWS)] ** 2, -1))

    def loss(log_gains, adjoint):
        values = jax.vmap(lambda q0, qd0, prm: solve(log_gains, q0, qd0, prm, adjoint))(
            batch.q0, batch.qd0, batch.params
        )
        return jnp.mean(values)

    x = jnp.log(jnp.asarray([0.5, 200.0]))
    adjoints = {
        "recursive_checkpoint": diffrax.RecursiveCheckpointAdjoint(),
        "backsolve": diffrax.BacksolveAdjoint(),
    }
    compiled, compile_s, memory = {}, {}, {}
    compiled["forward"], compile_s["forward"] = _compile(
        lambda x: loss(x, adjoints["recursive_checkpoint"]), x
    )
    memory["forward"] = _memory(compiled["forward"])
    for name, adjoint in adjoints.items():
        fn = jax.value_and_grad(lambda x, adjoint=adjoint: loss(x, adjoint))
        compiled[name], compile_s[name] = _compile(fn, x)
        memory[name] = _memory(compiled[name])
    timing = _interleaved(compiled, {k: (x,) for k in compiled}, repeats)
    grads = {name: np.asarray(compiled[name](x)[1]) for name in adjoints}
    ref = grads["recursive_checkpoint"]
    return {
        "what": "diffrax.diffeqsolve on System.acceleration (no simulate post-processing), path objective",
        "compile_s": compile_s,
        "run": timing,
        "grad_over_forward": {n: timing[n]["median_s"] / timing["forward"]["median_s"] for n in adjoints},
        "memory": memory,
        "gradient": {n: g.tolist() for n, g in grads.items()},
        "backsolve_relative_gradient_difference": float(
            np.linalg.norm(grads["backsolve"] - ref) / np.linalg.norm(ref)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dt", type=float, default=5e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--adjoints", action="store_true", help="also compare diffrax's adjoints directly")
    parser.add_argument(
        "--crossover",
        action="store_true",
        help="also time forward- against reverse-mode gradients for 4 and 5 tuned numbers",
    )
    parser.add_argument(
        "--tangent-costs",
        action="store_true",
        help="also time one right-hand side: primal (vmap, entry by entry) against its two-direction JVP",
    )
    parser.add_argument(
        "--former-saves",
        action="store_true",
        help="also the two former post-processings at the saved times (before/after, interleaved)",
    )
    parser.add_argument(
        "--former-tangents",
        action="store_true",
        help="also the forward-mode gradient with its right-hand side's tangents by the vmap program",
    )
    parser.add_argument(
        "--former-solve-tangents",
        action="store_true",
        help="also the forward-mode gradient with the former tangent rule of the UK solve",
    )
    parser.add_argument(
        "--out", default=None, help="result file (default benchmarks/results/tune_gradient-<cpu>.json)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine_info, write_results

    load_before = os.getloadavg()
    results = {
        "tuner": tuner_costs(
            args.scenarios, args.steps, args.dt, args.repeats, args.former_saves, args.former_tangents,
            args.former_solve_tangents,
        )
    }
    r = results["tuner"]
    run, memory = r["run"], r["memory"]
    for mode in ("forward", "reverse"):
        name = f"gradient_{mode}"
        print(
            f"tuner, {mode} mode: forward pass {run['forward']['median_s']:.2f} s, gradient "
            f"{run[name]['median_s']:.2f} s, ratio {r['grad_over_forward'][mode]:.2f} (target <= 3); compile "
            f"{r['compile_s'][name]:.1f} s; planned memory "
            f"{memory[name].get('peak_estimate_MiB', 0):.0f} MiB "
            f"({r['memory_over_trajectory_states'][name]:.2f}x the trajectory's states)",
            flush=True,
        )
    for pair, ratio in r["grad_over_forward"].items():
        if pair not in ("forward", "reverse"):
            print(f"  {pair}: gradient / forward pass {ratio:.2f}")
    print(
        f"forward and reverse gradients differ by {r['forward_vs_reverse_relative_difference']:.1e}",
        "(relative)",
    )
    if args.adjoints:
        results["adjoints"] = adjoint_costs(args.scenarios, args.steps, args.dt, args.repeats)
        a = results["adjoints"]
        print(
            f"adjoints: grad/forward {a['grad_over_forward']}, backsolve gradient differs by "
            f"{a['backsolve_relative_gradient_difference']:.2e} (relative)"
        )
    if args.crossover:
        results["crossover"] = mode_crossover(args.scenarios, args.steps, args.dt, args.repeats)
        for k, t in results["crossover"].items():
            print(
                f"k = {k} tuned numbers: forward loss {t['forward']:.2f} s, forward-mode gradient "
                f"{t['gradient_forward']:.2f} s, reverse-mode gradient {t['gradient_reverse']:.2f} s"
            )
    if args.tangent_costs:
        results["tangents"] = tangent_costs(args.scenarios, args.steps, args.repeats)
        us = results["tangents"]["microseconds_per_evaluation"]
        share = results["tangents"]["jvp_seconds_per_forward_mode_gradient"]
        print(
            f"right-hand side per evaluation ({args.scenarios} scenarios): primal {us['primal_vmap']:.0f} us "
            f"(vmap) / {us['primal_entrywise']:.0f} us (entry by entry), JVP along 2 directions "
            f"{us['jvp_two_directions_vmap']:.0f} us (vmap), {us['jvp_two_directions_entrywise']:.0f} us "
            f"(entry by entry; {us['jvp_two_directions_entrywise_unfenced']:.0f} us unfenced): "
            f"{share:.2f} s of a forward-mode gradient "
            f"(6 evaluations per Tsit5 step x {args.steps} steps)"
        )
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    info = machine_info()
    cpu = info["machine"]["cpu"].split()
    tag = "-".join(re.sub(r"\(r\)|\W", "", w.lower()) for w in cpu[:2]) if cpu else "cpu"
    out = Path(
        args.out or f"benchmarks/results/tune_gradient-{jax.default_backend()}-{tag}-{os.cpu_count()}c.json"
    )
    write_results(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
