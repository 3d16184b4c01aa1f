"""One measurement of ``compile_and_gradient.py`` in a fresh process: ``MODE N STEPS`` -> ``RESULT {json}``.

Runs on whichever ukjax source tree is first on PYTHONPATH (the current one or a baseline), so it uses only
API that both have: ``ukjax.simulate_batch``, ``ukjax.models.scara``, ``ukjax.demo.sample_scenarios``.
"""

import inspect
import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
if os.environ.get("BENCH_CACHE"):
    jax.config.update("jax_compilation_cache_dir", os.environ["BENCH_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import ukjax  # noqa: E402
from ukjax.demo import sample_scenarios  # noqa: E402
from ukjax.models import scara  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(thunk):
    tic = time.perf_counter()
    value = jax.block_until_ready(thunk())
    return value, time.perf_counter() - tic


def staged_compile(fn, *args):
    """(compiled ``jax.jit(fn)`` for ``args``, {"trace_s", "lower_s", "compile_s"}, the lowered program): the
    seconds of each stage of a first call, timed apart (``jax.jit(...).trace``, ``.lower()``,
    ``.compile()``)."""
    out = {}
    tic = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    out["trace_s"] = time.perf_counter() - tic
    tic = time.perf_counter()
    lowered = traced.lower()
    out["lower_s"] = time.perf_counter() - tic
    tic = time.perf_counter()
    compiled = lowered.compile()
    out["compile_s"] = time.perf_counter() - tic
    return compiled, out, lowered


def first_call(system, q0s, qd0s, batch, steps, split):
    dt = 5e-3
    t1 = steps * dt
    ts = jnp.linspace(0.0, t1, 201)

    def integrate(q0s, qd0s, batch):
        return ukjax.simulate_batch(
            system, q0s, qd0s, batch, batch_params=True, t1=t1, ts=ts, dt=dt, max_steps=steps + 1
        )

    if not split:
        cpu = cpu_seconds()
        sol, wall = timed(lambda: integrate(q0s, qd0s, batch))
        return dict(wall_s=wall, cpu_s=cpu_seconds() - cpu, statuses=sorted(set(map(int, sol.status))))
    compiled, out, lowered = staged_compile(integrate, q0s, qd0s, batch)
    _, out["run_s"] = timed(lambda: compiled(q0s, qd0s, batch))
    text = lowered.as_text()
    out.update(stablehlo_lines=text.count("\n"), host_callbacks=text.count("callback("))
    return out


def gradient(system, params, q0s, qd0s, batch, steps):
    dt, t1 = 1e-3, steps * 1e-3
    ts = jnp.linspace(0.0, t1, 101)
    gains = {"alpha": params["alpha"], "beta": params["beta"]}

    def loss(gains, q0s, qd0s, batch):
        full = dict(batch)
        for key in gains:
            full[key] = jnp.broadcast_to(gains[key], batch[key].shape)
        # each tree's default max_steps and adjoint: what a user gets
        sol = ukjax.simulate_batch(system, q0s, qd0s, full, batch_params=True, t1=t1, ts=ts, dt=dt)
        return jnp.mean(jnp.sum(sol.position_residual**2, axis=(1, 2)))

    args = (gains, q0s, qd0s, batch)
    out = {"states_bytes": q0s.shape[0] * steps * 8 * 8}
    programs = {}
    for name, fn in (("forward", jax.jit(loss)), ("gradient", jax.jit(jax.value_and_grad(loss)))):
        tic = time.perf_counter()
        programs[name] = fn.lower(*args).compile()
        out[name + "_compile_s"] = time.perf_counter() - tic
        out[name + "_temp_bytes"] = int(getattr(programs[name].memory_analysis(), "temp_size_in_bytes", -1))
        jax.block_until_ready(programs[name](*args))
    times = {"forward": [], "gradient": []}
    for _ in range(3):  # interleaved, so a change of load hits both alike
        for name, program in programs.items():
            value, seconds = timed(lambda program=program: program(*args))
            times[name].append(seconds)
    for name in programs:
        out[name + "_s"] = sorted(times[name])[1]
    out["loss"] = float(value[0])
    out["grad"] = {k: jnp.asarray(v).tolist() for k, v in value[1].items()}
    return out


def rhs(system, q0s, qd0s, batch):
    from jax.flatten_util import ravel_pytree

    from ukjax import dynamics
    from ukjax.constraints import stack_blocks

    method = inspect.signature(ukjax.simulate).parameters["method"].default
    rtol = jnp.asarray(dynamics.gram_rtol(4, 4), q0s.dtype)

    def acceleration(q, qd, p, custom):
        M, Q = system.mass_matrix(q, 0.3, p), system.given_force(q, qd, 0.3, p)
        A, b = stack_blocks(system.constraint_blocks(q, qd, 0.3, p), 4, q.dtype)
        if custom:
            return dynamics._eq35_terms(method, M, Q, A, b, None, rtol)[0]
        return dynamics._eq35_forward(method, M, Q, A, b, None, rtol)[0][0]

    def per_scenario_ns(f, *a):
        """(median ns per scenario of 21 calls, the value)."""
        f = jax.jit(f)
        value = jax.block_until_ready(f(*a))
        return sorted(timed(lambda: f(*a))[1] for _ in range(21))[10] / q0s.shape[0] * 1e9, value

    tq, tqd = jnp.ones_like(q0s), jnp.ones_like(qd0s)
    out, values = {}, {}
    for custom, key in ((True, "custom_derivative"), (False, "autodiff_through_factorization")):
        f = jax.vmap(lambda q, qd, p, custom=custom: acceleration(q, qd, p, custom))

        def jvp(q, qd, p, f=f):
            return jax.jvp(lambda q_, qd_: f(q_, qd_, p), (q, qd), (tq, tqd))

        def vjp(q, qd, p, f=f):
            return jax.vjp(lambda q_, qd_: f(q_, qd_, p), q, qd)[1](tq)

        measured = {name: per_scenario_ns(g, q0s, qd0s, batch)
                    for name, g in (("forward_ns", f), ("jvp_ns", jvp), ("vjp_ns", vjp))}  # fmt: skip
        out[key] = {name: ns for name, (ns, _) in measured.items()}
        values[key] = {name: ravel_pytree(value)[0] for name, (_, value) in measured.items()}
    # both derivatives of the same function: they must agree to rounding
    for name in ("jvp", "vjp"):
        a, b = (values[key][f"{name}_ns"] for key in values)
        out[f"{name}_relative_difference"] = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    return out


def main():
    mode, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    params = scara.default_params()
    q0, qd0 = scara.initial_state(params)
    key = jax.random.PRNGKey(0)
    batch, q0s, qd0s = sample_scenarios(key, params, q0, qd0, n, spread=0.05, angle_noise_deg=1.0)
    system = scara.system()
    if mode in ("first_call", "split"):
        out = first_call(system, q0s, qd0s, batch, steps, split=mode == "split")
    elif mode == "gradient":
        out = gradient(system, params, q0s, qd0s, batch, steps)
    else:
        out = rhs(system, q0s, qd0s, batch)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
