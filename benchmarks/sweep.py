"""What a sweep costs beyond the integration, and how its throughput changes with the number of devices.

The SCARA of Xu & Liu 2017 (seed 001, Baumgarte α = 0.5, β = 200), ``--scenarios`` scenarios with every mass,
length and inertia ±5 %, Tsit5 at a fixed step ``--dt`` to ``--t1``, in chunks of ``--chunk-size``. For each
device count D in ``--device-counts`` a fresh process is started with D simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=D``, fixed when JAX starts). In it, timed alternately,
``--repeats`` times each (compilation excluded: both are compiled before timing):

* **bare**: ``ukjax.simulate_batch`` of the same scenarios on one device, chunk by chunk, inputs drawn
  beforehand (not timed), the full ``Solution`` left on the device;
* **sweep**: ``ukjax.sweep.run`` of the same spec over all D devices, whose time includes drawing the inputs,
  the sharding, the on-device reduction to metrics, the transfer and the Parquet writes.

Recorded per D: the medians, the sweep's overhead over bare (target <= 10 % at D = 1), scenarios per second,
the process's CPU time during each timed run (CPU seconds / wall seconds = cores kept busy), the load average,
whether any sub-sweep fell back to one device (batched LAPACK on several CPU devices; the SCARA's program
calls none), and the largest difference of the sweep's final states from the bare batch's (the same work).

On a CPU the simulated devices share the machine's cores (XLA:CPU already spreads one device's work over
its intra-op thread pool), so this measures the sharding's cost and how the cores are used, not a GPU's
scaling: on a 2-core machine 4 devices cannot be faster than 2.

    python3 benchmarks/sweep.py     # writes benchmarks/results/sweep-<machine>.json and sweep-<machine>.png

**Host overhead** (``--host-overhead``): what a sweep costs the host per 1e6 scenarios, to compare with the
~7.5 s an H200 computes 1e6 SCARA scenarios x 1000 steps in (1.35e8 scenario-steps/s), in this process on
one CPU device. The integration is replaced by a program that returns at once (``_run._simulate`` returns
zeros of the real ``Solution``'s structure, :func:`null_integration`), so the drawing of the inputs and the
reductions to metrics (the device program's other parts), the transfer, the columns, the Parquet files with
their proofs and the manifest all run for real. Timed alternately, ``--repeats`` times each, the pipelined
sweep (writer thread) and the synchronous path of earlier ukjax (``_run.WRITER_THREAD = False``: fetch,
columns and write between dispatches), and that path with the Parquet encoding of earlier ukjax (every column
dictionary-encoded), which is ukjax before the pipeline ("before"), compilation excluded:

* the host's seconds per 1e6 scenarios: its work summed (:class:`ChunkClock`: fetch, columns, Parquet
  write with its proof per chunk, in wall seconds and in CPU seconds of the thread doing it; setup before
  the first chunk; the last chunk's write and the manifest after it, in wall seconds), and the wall time of
  ``sweep.run`` (which on this CPU also holds the null program's own time, drawing and reductions, that a GPU
  spends on the device: ``null_program_s_per_chunk``);
* :class:`ChunkClock`: per chunk k, the host's seconds from chunk k ready to chunk k+2 dispatched, the time
  a device must cover with chunk k+1; with ``--device-s-per-million`` of device time (H200) the device waits
  the excess, summed over chunks (target <= 10 % of the device time), before the first chunk, and after the
  last (the last chunk's fetch and write, and the manifest).

    python3 benchmarks/sweep.py --host-overhead --scenarios 1000000 --chunk-size 31250
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import ukjax
from ukjax import sweep

RESULTS = Path(__file__).resolve().parent / "results"
PERTURBED = ("m1", "m2", "m3", "m4", "l1", "l2", "r1", "r2", "Iz1", "Iz2", "Iz3", "Iz4")


def make_spec(scenarios: int, chunk_size: int, t1: float, dt: float) -> dict:
    steps = int(round(t1 / dt))
    return {
        "name": "benchmark_scara",
        "model": "scara",
        "scenarios": scenarios,
        "chunk_size": chunk_size,
        "seed": 0,
        "integrator": {"t1": t1, "dt": dt, "solver": "Tsit5", "max_steps": steps + 1, "num_saves": 51},
        "vary": {f"params.{name}": {"dist": "relative", "spread": 0.05} for name in PERTURBED},
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _timed(function):
    """(wall seconds, CPU seconds of this process, result) of ``function()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(args) -> dict:
    """Bare simulate_batch on one device against the sweep on every local device, interleaved."""
    from ukjax.sweep import _scenarios

    spec = sweep.load_spec(make_spec(args.scenarios, args.chunk_size, args.t1, args.dt))
    model = sweep.load_model(spec.model)
    plan = _scenarios.Plan.from_spec(spec, spec.chunk_size)
    static, _ = _scenarios.integrator_options(spec, plan, 0)
    build = jax.jit(jax.vmap(_scenarios.scenario_builder(spec, plan, model, 0)))
    chunks = [plan.chunk(c) for c in range(plan.num_chunks)]
    inputs = [build(jnp.arange(start, start + spec.chunk_size)) for _, start, _ in chunks]  # not timed
    ts = jnp.linspace(0.0, args.t1, static["num_saves"])
    bare = jax.jit(
        lambda q0, qd0, p: ukjax.simulate_batch(
            model.system,
            q0,
            qd0,
            p,
            batch_params=True,
            t1=args.t1,
            ts=ts,
            dt=args.dt,
            max_steps=static["max_steps"],
        )
    )
    params, q0, qd0, _ = inputs[0]
    bare_compile_s, _, bare_compiled = _timed(lambda: bare.lower(q0, qd0, params).compile())

    def run_bare():
        for params, q0, qd0, _ in inputs:
            jax.block_until_ready(bare_compiled(q0, qd0, params))

    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        first = sweep.run(spec, out=tmp, fresh=True, progress=False)  # compiles
        bare_runs, sweep_runs = [], []
        for _ in range(args.repeats):
            wall, cpu, _ = _timed(run_bare)
            bare_runs.append({"wall_s": wall, "cpu_s": cpu})
            wall, cpu, summary = _timed(lambda: sweep.run(spec, out=tmp, fresh=True, progress=False))
            sweep_runs.append({"wall_s": summary.run_s, "cpu_s": cpu, "wall_with_setup_s": wall})
        table = sweep.load(tmp)
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())
    load_after = _load()
    final = np.concatenate(
        [np.asarray(bare_compiled(q0, qd0, params).q[:, -1, 0]) for params, q0, qd0, _ in inputs]
    )[: plan.total]
    same = float(np.max(np.abs(final - table.column("q_final[0]").to_numpy())))
    bare_med = float(np.median([r["wall_s"] for r in bare_runs]))
    sweep_med = float(np.median([r["wall_s"] for r in sweep_runs]))
    return {
        "devices": len(jax.local_devices()),
        "scenarios": plan.total,
        "chunk_size": spec.chunk_size,
        "steps_per_scenario": int(round(args.t1 / args.dt)),
        "bare_simulate_batch_runs": bare_runs,
        "sweep_runs": sweep_runs,
        "bare_median_s": bare_med,
        "sweep_median_s": sweep_med,
        "bare_scenarios_per_s": plan.total / bare_med,
        "sweep_scenarios_per_s": plan.total / sweep_med,
        "sweep_scenarios_per_s_range": [
            plan.total / max(r["wall_s"] for r in sweep_runs),
            plan.total / min(r["wall_s"] for r in sweep_runs),
        ],
        "sweep_over_bare_fraction": sweep_med / bare_med - 1.0,
        "sweep_cores_busy": float(np.median([r["cpu_s"] / r["wall_with_setup_s"] for r in sweep_runs])),
        "bare_cores_busy": float(np.median([r["cpu_s"] / r["wall_s"] for r in bare_runs])),
        "compile_s": {"sweep": first.compile_s, "bare": bare_compile_s},
        "one_device_subsweeps": manifest["runs"][-1]["one_device_subsweeps"],
        "max_final_state_difference_sweep_vs_bare": same,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_child(args, count: int) -> dict:
    """``measure`` in a fresh process with ``count`` simulated CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
    command = [sys.executable, __file__, "--child"]
    for name in ("scenarios", "chunk_size", "t1", "dt", "repeats"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    wall, cpu = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {
            "devices": count,
            "error": f"no result within {args.child_timeout} s ({_children_cpu() - cpu:.1f} CPU s used)",
        }
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"devices": count, "error": (done.stdout + done.stderr)[-2000:]}
    row = json.loads(line[len("RESULT ") :])
    row["process_wall_s"] = time.perf_counter() - wall
    row["process_cpu_s"] = _children_cpu() - cpu
    return row


def figure(result: dict, path: Path) -> None:
    from ukjax.studies._common import pyplot, save_figure

    plt = pyplot()

    rows = [r for r in result["devices"] if "error" not in r]
    d = np.array([r["devices"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    rate = np.array([r["sweep_scenarios_per_s"] for r in rows])
    low, high = np.array([r["sweep_scenarios_per_s_range"] for r in rows]).T
    ax.errorbar(
        d,
        rate,
        yerr=[rate - low, high - rate],
        marker="o",
        capsize=4,
        label="ukjax.sweep.run over D devices (median, min-max)",
    )
    ax.plot(
        d,
        [r["bare_scenarios_per_s"] for r in rows],
        "s--",
        color="gray",
        label="bare simulate_batch, one device, same process",
    )
    for r in rows:
        ax.annotate(
            f"{r['sweep_cores_busy']:.1f} cores busy",
            (r["devices"], r["sweep_scenarios_per_s"]),
            textcoords="offset points",
            xytext=(6, -14),
            fontsize=8,
        )
    for r in result["devices"]:
        if "error" in r:
            ax.axvline(r["devices"], color="red", alpha=0.3, label=f"{r['devices']} devices: no result")
    ax.set_xticks([r["devices"] for r in result["devices"]])
    ax.set_xlabel("simulated CPU devices (each run in its own process)")
    ax.set_ylabel("throughput (scenarios/s)")
    ax.set_ylim(bottom=0)
    o = rows[0] if rows else {}
    loads = [x for r in rows for x in (r["load_average_before"][0], r["load_average_after"][0])]
    ax.set_title(
        f"SCARA sweep (Xu & Liu 2017): {o.get('scenarios')} scenarios x {o.get('steps_per_scenario')} Tsit5 "
        f"steps,\n{result['environment_cores']}-core CPU, float64, load average "
        f"{min(loads, default=float('nan')):.1f}-{max(loads, default=float('nan')):.1f}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    save_figure(fig, path)


class ChunkClock:
    """Installed over ``_run._dispatch`` and ``_run._fetch``: when each chunk's dispatch returned and when its
    result was ready (``block_until_ready`` at the start of its fetch), on the host's clock.

    On a device the next chunk is queued behind the running one (the pipeline keeps one chunk queued), so
    after chunk k is ready the device computes chunk k+1 while the host fetches and hands over chunk k and
    dispatches chunk k+2: with ``seconds`` of device time per chunk the device waits
    max(0, dispatched[k+2] - ready[k] - seconds) before chunk k+2 (:meth:`waits`)."""

    def __init__(self):
        self.dispatched: dict[int, float] = {}
        self.ready: dict[int, float] = {}
        # host work summed over chunks: wall seconds (inflated when the cores are shared) and the CPU seconds
        # of the thread doing it (what it costs whatever the load)
        self.seconds = {"fetch": 0.0, "columns": 0.0, "write_chunk": 0.0}
        self.cpu_seconds = dict(self.seconds)

    def _timed(self, name, function):
        def timed(*args, **kwargs):
            tic, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - tic
                self.cpu_seconds[name] += time.thread_time() - cpu

        return timed

    @contextlib.contextmanager
    def installed(self):
        from ukjax.sweep import _run, _store

        saved = (_run._dispatch, _run._fetch, _run._columns, _store.write_chunk)
        dispatch, fetch = saved[:2]

        def timed_dispatch(c, *args):
            result = dispatch(c, *args)
            self.dispatched[c] = time.perf_counter()
            return result

        def timed_fetch(c, s, start, count, result):
            jax.block_until_ready(result)
            self.ready[c] = time.perf_counter()
            return self._timed("fetch", fetch)(c, s, start, count, result)

        _run._dispatch, _run._fetch = timed_dispatch, timed_fetch
        _run._columns = self._timed("columns", saved[2])
        _store.write_chunk = self._timed("write_chunk", saved[3])
        try:
            yield self
        finally:
            _run._dispatch, _run._fetch, _run._columns, _store.write_chunk = saved

    def waits(self, seconds: float, started: float, finished: float) -> dict:
        """With ``seconds`` of device time per chunk: what the device waits for before the first chunk,
        between chunks (and the largest such wait), and what the host does after the last chunk is ready."""
        chunks = sorted(self.dispatched)
        host = [self.dispatched[b] - self.ready[a] for a, b in zip(chunks[:-2], chunks[2:], strict=True)]
        # the device runs chunk 1 right after chunk 0 (both dispatched up front)
        waits = [max(0.0, h - seconds) for h in host]
        return {
            "host_s_per_chunk_ready_to_dispatch": float(np.median(host)) if host else 0.0,
            "before_first_chunk_s": self.dispatched[chunks[0]] - started,
            "between_chunks_s": float(sum(waits)),
            "largest_wait_s": max(waits, default=0.0),
            "after_last_chunk_s": finished - self.ready[chunks[-1]],
        }


def program_seconds(spec) -> float:
    """Seconds the compiled (null) chunk program takes on one chunk (median of 5, after a warm-up): on a GPU
    this is device time (drawing the inputs, the reductions), here it is CPU time of the same cores."""
    from ukjax.sweep import _run
    from ukjax.sweep._scenarios import Plan, integrator_options

    (function, mesh, _), *_ = _run._COMPILED.values()
    plan = Plan.from_spec(spec, spec.chunk_size)
    numbers = _run._numbers(integrator_options(spec, plan, 0)[1], jnp.result_type(float))
    indices = jax.device_put(jnp.arange(spec.chunk_size), jax.sharding.NamedSharding(mesh, _run.P(_run.AXIS)))
    jax.block_until_ready(function(indices, numbers))
    times = []
    for _ in range(5):
        tic = time.perf_counter()
        jax.block_until_ready(function(indices, numbers))
        times.append(time.perf_counter() - tic)
    return float(np.median(times))


@contextlib.contextmanager
def null_integration():
    """``_run._simulate`` returns at once: zeros of the real ``Solution``'s structure (shapes from
    ``jax.eval_shape`` of the real one), made to depend on the drawn initial state so that nothing downstream
    (reductions, transfer) is constant-folded away."""
    from ukjax.sweep import _run

    real = _run._simulate

    def null(model, static, numbers, q0, qd0, params):
        shapes, _ = jax.eval_shape(functools.partial(real, model, static), numbers, q0, qd0, params)
        zero = q0[:, :1] * 0  # (batch, 1): data-dependent zeros

        def leaf(shape):
            column = (
                zero.reshape((zero.shape[0],) + (1,) * (len(shape.shape) - 1)) if shape.shape else zero[0, 0]
            )
            return jnp.broadcast_to(column, shape.shape).astype(shape.dtype)

        ts = jnp.linspace(numbers["t0"], numbers["t1"], static["num_saves"])
        return jax.tree.map(leaf, shapes), ts

    _run._COMPILED.clear()
    _run._simulate = null
    try:
        yield
    finally:
        _run._simulate = real
        _run._COMPILED.clear()


@contextlib.contextmanager
def dictionary_encoded(every_column: bool):
    """``every_column``: Parquet files dictionary-encode every column (pyarrow's default, which ukjax used
    before: on the metrics' floats it finds no repeats and costs ~4x the rest of the write)."""
    import pyarrow.parquet as pq

    write = pq.write_table

    def default_encoding(table, where, use_dictionary=True, **kwargs):
        return write(table, where, **kwargs)

    if every_column:
        pq.write_table = default_encoding
    try:
        yield
    finally:
        pq.write_table = write


def host_overhead(args) -> dict:
    """See the module docstring (**Host overhead**)."""
    from ukjax.sweep import _run

    spec = sweep.load_spec("scara", scenarios=args.scenarios, chunk_size=args.chunk_size, trajectories=[])
    steps = round((spec.integrator["t1"] - spec.integrator["t0"]) / spec.integrator["dt"])
    chunks = -(-spec.scenarios // spec.chunk_size)
    device_per_chunk = args.device_s_per_million * spec.chunk_size / 1e6
    scale = 1e6 / spec.scenarios
    modes = {"pipelined": (True, False), "synchronous": (False, False), "before": (False, True)}
    rows = {mode: [] for mode in modes}
    with null_integration(), tempfile.TemporaryDirectory() as tmp:
        first = sweep.run(spec, out=tmp, fresh=True, progress=False)  # compiles the null program
        program_s = program_seconds(spec)
        for _ in range(args.repeats):
            for mode, (threaded, dictionary) in modes.items():
                clock = ChunkClock()
                _run.WRITER_THREAD = threaded
                try:
                    with clock.installed(), dictionary_encoded(dictionary):
                        started = time.perf_counter()
                        summary = sweep.run(spec, out=tmp, fresh=True, progress=False)
                        finished = time.perf_counter()
                finally:
                    _run.WRITER_THREAD = True
                wall = finished - started - summary.compile_s
                row = {
                    "wall_s": wall,
                    "run_s": summary.run_s,
                    "wall_s_per_million": wall * scale,
                    "wall_s_per_million_less_program": (wall - chunks * program_s) * scale,
                    **{f"{k}_s_per_million": v * scale for k, v in clock.seconds.items()},
                    **{f"{k}_cpu_s_per_million": v * scale for k, v in clock.cpu_seconds.items()},
                    **clock.waits(device_per_chunk, started, finished),
                }
                # the host's work, summed: per chunk (fetch, columns, Parquet with its proof), before the
                # first chunk (spec, model, identity, manifest), after the last (its write again, manifest)
                fixed = row["before_first_chunk_s"] + row["after_last_chunk_s"]
                row["host_s_per_million"] = sum(clock.seconds.values()) * scale + fixed
                row["host_cpu_s_per_million"] = sum(clock.cpu_seconds.values()) * scale + fixed
                row["device_waits_between_chunks_s_per_million"] = row["between_chunks_s"] * scale
                rows[mode].append(row)
                print(f"  {mode:11s} " + json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
        assert len(sweep.load(tmp)) == spec.scenarios
    median = {
        mode: {key: float(np.median([r[key] for r in found])) for key in found[0]}
        for mode, found in rows.items()
    }
    return {
        "what": "host overhead of a sweep per 1e6 SCARA scenarios, the integration replaced by a program "
        "that returns at once (module docstring, **Host overhead**)",
        "scenarios": spec.scenarios,
        "chunk_size": spec.chunk_size,
        "chunks": chunks,
        "steps_per_scenario": steps,
        "num_saves": spec.integrator["num_saves"],
        "device_s_per_million": args.device_s_per_million,
        "device_s_per_chunk": device_per_chunk,
        "null_program_s_per_chunk": program_s,
        "repeats": args.repeats,
        "compile_s_null_program": first.compile_s,
        "median": median,
        "targets": {
            "host_s_per_million": f"well below the {args.device_s_per_million} s of device time",
            "device_waits_between_chunks_s_per_million": 0.1 * args.device_s_per_million,
        },
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=4096)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--t1", type=float, default=1.0)
    parser.add_argument("--dt", type=float, default=5e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child-timeout", type=int, default=1800, help="seconds allowed per device count")
    parser.add_argument(
        "--device-counts", type=int, nargs="+", default=[1, 2, 4], help="simulated CPU devices"
    )
    parser.add_argument("--out", help="result file (default benchmarks/results/sweep-<machine>.json)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--host-overhead",
        action="store_true",
        help="measure the host's seconds per 1e6 scenarios with a null integration (module docstring)",
    )
    parser.add_argument(
        "--device-s-per-million",
        type=float,
        default=7.5,
        help="--host-overhead: device seconds per 1e6 scenarios (H200: 1e9 scenario-steps at 1.35e8/s)",
    )
    args = parser.parse_args()
    ukjax.enable_float64()
    if args.child:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    from _common import machine_info, write_results

    if args.host_overhead:
        print(
            f"sweep host overhead: {args.scenarios} SCARA scenarios in chunks of {args.chunk_size}, "
            f"null integration, device time {args.device_s_per_million} s per 1e6 scenarios",
            flush=True,
        )
        load_before = _load()
        result = host_overhead(args)
        result.update({"load_average_before": load_before, "load_average_after": _load()})
        machine = machine_info()["machine"]
        name = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-")
        path = Path(args.out or RESULTS / f"sweep-host-overhead-{name}-{os.cpu_count()}c.json")
        write_results(path, result)
        print(json.dumps(result["median"], indent=1))
        print(f"wrote {path}")
        return

    print(
        f"SCARA sweep: {args.scenarios} scenarios x {round(args.t1 / args.dt)} steps, chunks of "
        f"{args.chunk_size}, {args.repeats} repeats, on {args.device_counts} simulated CPU devices",
        flush=True,
    )
    load_before = _load()
    rows = []
    for count in args.device_counts:
        rows.append(run_child(args, count))
        r = rows[-1]
        if "error" in r:
            print(f"  {count} device(s): {r['error'][-300:]}", flush=True)
            continue
        print(
            f"  {count} device(s): sweep {r['sweep_scenarios_per_s']:.0f} scenarios/s "
            f"({r['sweep_cores_busy']:.2f} cores busy), bare simulate_batch on one device "
            f"{r['bare_scenarios_per_s']:.0f} scenarios/s: sweep/bare - 1 = "
            f"{100 * r['sweep_over_bare_fraction']:+.1f} %; load {r['load_average_before'][0]:.1f}"
            f"-{r['load_average_after'][0]:.1f}",
            flush=True,
        )
    result = {
        "description": __doc__,
        "devices": rows,
        "integrator": {"solver": "diffrax Tsit5", "step": "fixed", "dt": args.dt, "t1": args.t1},
        "load_average_before": load_before,
        "load_average_after": _load(),
        "gpu": "no GPU in this session: the SCARA sweep at 1,000,000 scenarios is still to be measured",
    }
    one = next((r for r in rows if r.get("devices") == 1 and "error" not in r), None)
    if one is not None:
        result["overhead_one_device"] = {
            "fraction": one["sweep_over_bare_fraction"],
            "target": 0.10,
            "bare_median_s": one["bare_median_s"],
            "sweep_median_s": one["sweep_median_s"],
        }
    machine = machine_info()["machine"]
    name = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-")
    path = Path(args.out or RESULTS / f"sweep-{name}-{os.cpu_count()}c.json")
    write_results(path, result)
    figure({**result, "environment_cores": machine["cores"]}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
