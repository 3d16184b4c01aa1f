"""Everything ukjax measures on a GPU, in one command: ``python benchmarks/gpu_suite.py --out DIR``.

GPU time comes in slices of about 30 minutes, at most 10 minutes a command, so one call of this script must
produce the whole GPU table. It runs each section in its own Python process (a fresh process per dtype,
since JAX's float64 switch is global, and so that one section's GPU memory is freed before the next), with
a time limit per section, and writes at most seven small JSON files into DIR:

=====================  ===================================================================================
``environment.json``   devices, memory, driver (nvidia-smi), python/jax/jaxlib/diffrax/equinox versions,
                       which optional packages import (pytest, scipy, hypothesis, mujoco, MJX, MJWarp, ...)
``tests.json``         the GPU-relevant tests (``pytest -m "not slow"`` on simulate_batch, gradients, sweeps,
                       float32); files whose imports the machine lacks are left out, with the reason
``throughput.json``    SCARA batches of 1e3 ... 1e6 scenarios in float64 and float32: ukjax on the shipped
                       model, ukjax on the user-written model (``benchmarks/user_scara.py``), naive JAX
                       (``benchmarks/throughput.py``); the pinned 8-link chain with ukjax's tree model (RK4)
                       against MJX and MJWarp (``mujoco.mjx.put_model(impl="jax" | "warp")``, RK4) where they
                       import; scenario-steps/s, compile time, XLA's memory per scenario, peak device memory
``gradient.json``      gradient/forward cost of the SCARA tuning objective (256 scenarios x 1000 steps)
``sweep.json``         a 1,000,000-scenario SCARA sweep (``ukjax.sweep``) and its overhead against a bare
                       ``simulate_batch`` of the same scenarios
``accuracy.json``      the largest difference of the SCARA batch after 1000 steps between the default device
                       and the CPU (float64), and float32 against float64 on both
``summary.json``       each section's status and time, and the summary table that is also printed
=====================  ===================================================================================

``--smoke`` runs exactly the same code paths at tiny sizes (CI runs it on the CPU and checks the files); on a
CPU-only machine the "device" rows are CPU rows and say so. ``--sections`` runs a subset (e.g. to split the
suite over two calls; a later call keeps the files of the sections it does not run and rewrites the
summary). ``--budget-s`` is the whole run's time limit (default 540 s, inside one 10-minute device call); each
section gets a share, throughput rows stop growing the batch once one row takes longer than its share.

On the GPU machine (no package index): ``pip install --no-deps -e .`` then
``python benchmarks/gpu_suite.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHEMA = 1
SECTIONS = ("environment", "tests", "throughput", "gradient", "sweep", "accuracy")
SHARES = {
    "environment": 0.04,
    "tests": 0.22,
    "throughput": 0.34,
    "gradient": 0.12,
    "sweep": 0.14,
    "accuracy": 0.14,
}
"""Each section's share of ``--budget-s`` (its subprocesses' time limit)."""
DTYPED = {"throughput": ("float64", "float32"), "accuracy": ("float64", "float32")}
OPTIONAL = (
    "pytest",
    "scipy",
    "hypothesis",
    "pyarrow",
    "tqdm",
    "matplotlib",
    "mujoco",
    "mujoco.mjx",
    "warp",
    "mujoco_warp",
)
TEST_FILES = (
    "test_simulation.py",
    "test_solvers.py",
    "test_sweep.py",
    "test_tune.py",
    "test_scara.py",
    "test_config.py",
    "test_gpu_ready.py",
)
SMOKE_TEST = "test_gpu_ready.py"
# --smoke runs one test that compiles nothing: it checks the pytest-and-junit path
SMOKE_SELECTION = "jax_version"


def sizes(smoke: bool) -> dict:
    """Problem sizes of every section: full (one H100) or ``--smoke`` (a few seconds each on a CPU)."""
    if smoke:
        return {
            "batches": [8],
            "steps": 5,
            "dt": 5e-3,
            "repeats": 1,
            "chain_links": 4,
            "gradient": (4, 10),
            "sweep_scenarios": 16,
            "sweep_t1": 0.05,
            "accuracy": (8, 20),
        }
    return {
        "batches": [1_000, 10_000, 100_000, 1_000_000],
        "steps": 200,
        "dt": 5e-3,
        "repeats": 3,
        "chain_links": 8,
        "gradient": (256, 1000),
        "sweep_scenarios": 1_000_000,
        "sweep_t1": None,
        "accuracy": (1024, 1000),
    }


# ================================================================================================ workers
def _setup(dtype: str):
    """Import JAX, ukjax and the benchmark modules in a worker, then set the dtype's float64 switch (the
    benchmark modules switch float64 on when imported, so the switch is set after them)."""
    sys.path.insert(0, str(HERE))
    import jax
    import scaling  # noqa: F401
    import throughput  # noqa: F401
    import tune_gradient  # noqa: F401

    import ukjax

    jax.config.update("jax_enable_x64", dtype == "float64")
    return jax, ukjax


def _memory(compiled, batch: int) -> dict:
    """XLA's planned buffers (arguments + outputs + temporaries) of a compiled program, per scenario."""
    try:
        m = compiled.memory_analysis()
        total = sum(
            int(getattr(m, f, 0) or 0)
            for f in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
        )
    except Exception as error:  # not every backend reports it
        return {"bytes_per_scenario": None, "unavailable": str(error)[:200]}
    return {"bytes_per_scenario": total / batch, "planned_bytes": total}


def _peak_device_bytes(jax) -> int | None:
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)()
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def _time(jax, fn, args, repeats: int) -> tuple[float, float, object]:
    """(compile seconds, best run seconds, outputs) of ``jax.jit(fn)(*args)``."""
    tic = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - tic
    best, out = float("inf"), None
    for _ in range(repeats):
        tic = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - tic)
    return compile_s, best, out, compiled


def worker_environment(dtype: str, size: dict) -> dict:
    import importlib

    jax, ukjax = _setup(dtype)
    import jaxlib

    from ukjax._io import environment

    env = environment()
    env["versions"]["jaxlib"] = jaxlib.__version__
    env["versions"]["ukjax"] = ukjax.__version__
    env["jax_supported"] = ukjax.jax_version_supported()
    devices = []
    for d in jax.devices():
        stats = getattr(d, "memory_stats", lambda: None)() or {}
        devices.append(
            {"platform": d.platform, "kind": d.device_kind, "bytes_limit": stats.get("bytes_limit")}
        )
    optional = {}
    for name in OPTIONAL:
        try:
            module = importlib.import_module(name)
            optional[name] = getattr(module, "__version__", "installed")
        except Exception as error:  # ImportError, or a package that fails on import (no GPU driver, ...)
            optional[name] = f"unavailable: {type(error).__name__}: {str(error)[:120]}"
    driver = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    return {"environment": env, "devices": devices, "nvidia_smi": driver, "optional_packages": optional}


def worker_throughput(dtype: str, size: dict, budget: float) -> dict:
    jax, ukjax = _setup(dtype)
    import jax.numpy as jnp
    import numpy as np
    import throughput
    import user_scara

    from ukjax.models import scara

    np_dtype = np.float64 if dtype == "float64" else np.float32
    steps, dt = size["steps"], size["dt"]
    t1 = steps * dt
    base = tuple(np.asarray(x) for x in scara.initial_state(scara.default_params()))
    paper = {k: jnp.asarray(v, np_dtype) for k, v in throughput.PAPER.items()}
    shipped = jax.tree_util.tree_map(lambda x: jnp.asarray(x, np_dtype), scara.default_params())
    user_params = user_scara.params(np_dtype)

    def on_batch(system, p):
        def run(q0, qd0):
            sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=dt)
            return sol.q[:, -1]

        return run

    contenders = {
        "ukjax_scara": on_batch(scara.system(), shipped),
        "ukjax_user_scara": on_batch(user_scara.system(), user_params),
        "naive_jax_scara": lambda q0, qd0: throughput.naive_jax(q0, qd0, paper, dt, steps=steps)[0],
    }
    rows, errors = [], []
    share = budget / max(1, len(contenders) + 3)  # time per contender, its batch sizes together
    for name, fn in contenders.items():
        rows += _batch_rows(
            jax,
            name,
            "scara",
            fn,
            lambda b: throughput.scenarios(base, b, 0, np_dtype),
            size,
            steps,
            share,
            errors,
            dtype,
        )
    rows += _chain_rows(jax, ukjax, size, dtype, np_dtype, 3 * share, errors)
    return {
        "dtype": dtype,
        "steps": steps,
        "dt": dt,
        "rows": rows,
        "errors": errors,
        "device": str(jax.devices()[0]),
        "peak_device_bytes": _peak_device_bytes(jax),
    }


def _batch_rows(jax, name, model, fn, make, size, steps, share, errors, dtype, solver="Tsit5") -> list:
    """One row per batch size until a row costs more than ``share`` seconds (or fails)."""
    import numpy as np

    rows, spent = [], 0.0
    for batch in size["batches"]:
        if spent > share:
            errors.append(f"{name}: batch {batch} and larger left out (time share {share:.0f} s spent)")
            break
        tic = time.perf_counter()
        try:
            args = make(batch)
            compile_s, run_s, out, compiled = _time(jax, fn, args, size["repeats"])
        except Exception as error:  # out of memory, a contender that cannot run here: record, go on
            errors.append(f"{name} at batch {batch}: {type(error).__name__}: {str(error)[:300]}")
            break
        final = np.asarray(out)
        rows.append(
            {
                "contender": name,
                "model": model,
                "dtype": dtype,
                "solver": solver,
                "batch": batch,
                "steps": steps,
                "compile_s": compile_s,
                "run_s": run_s,
                "scenario_steps_per_s": batch * steps / run_s,
                "finite_fraction": float(np.isfinite(final).all(axis=tuple(range(1, final.ndim))).mean()),
                **_memory(compiled, batch),
            }
        )
        spent += time.perf_counter() - tic
    return rows


def _chain_rows(jax, ukjax, size, dtype, np_dtype, share, errors) -> list:
    """The pinned chain: ukjax's tree model with RK4 against MJX and MJWarp (RK4), where they import."""
    import jax.numpy as jnp
    import numpy as np
    import scaling

    from ukjax.models import chain

    links, steps, dt = size["chain_links"], size["steps"], size["dt"]
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, np_dtype), chain.default_params(links))
    system = chain.multibody_system(links)
    t1 = steps * dt

    def make(batch):
        q0, qd0 = chain.scenarios(chain.default_params(links), batch, seed=0)
        return jnp.asarray(q0, np_dtype), jnp.asarray(qd0, np_dtype)

    def ukjax_chain(q0, qd0):
        sol = ukjax.simulate_batch(system, q0, qd0, params, t1=t1, ts=[t1], dt=dt, solver=ukjax.RK4())
        return sol.q[:, -1]

    rows = _batch_rows(
        jax,
        "ukjax_tree_chain",
        f"chain{links}",
        ukjax_chain,
        make,
        size,
        steps,
        share / 3,
        errors,
        dtype,
        solver="RK4",
    )
    for impl in ("jax", "warp"):
        name = f"mjx_{impl}_chain" if impl == "jax" else "mjwarp_chain"
        try:
            import mujoco
            from mujoco import mjx

            mjm = mujoco.MjModel.from_xml_string(scaling.mjcf(chain.default_params(links), 1, dt, "RK4"))
            model = mjx.put_model(mjm, impl=impl)
            blank = mjx.make_data(model, impl=impl)
        except Exception as error:  # not installed here, or no GPU for MJWarp
            errors.append(f"{name}: not measured ({type(error).__name__}: {str(error)[:200]})")
            continue

        def run(q0, qd0, model=model, blank=blank):
            def one(q, qd):
                data = blank.replace(qpos=q, qvel=qd)
                data = jax.lax.fori_loop(0, steps, lambda _, d: mjx.step(model, d), data)
                return data.qpos

            return jax.vmap(one)(q0, qd0)

        rows += _batch_rows(
            jax, name, f"chain{links}", run, make, size, steps, share / 3, errors, dtype, solver="RK4"
        )
    del np
    return rows


def worker_gradient(dtype: str, size: dict, budget: float) -> dict:
    _setup("float64")
    import tune_gradient

    scenarios, steps = size["gradient"]
    return tune_gradient.tuner_costs(scenarios, steps, 5e-3, repeats=size["repeats"])


def worker_sweep(dtype: str, size: dict, budget: float) -> dict:
    jax, ukjax = _setup("float64")
    import jax.numpy as jnp

    from ukjax import sweep
    from ukjax.models import scara

    spec = sweep.load_spec("scara").source  # the shipped spec's fields, as read from its TOML (a fresh dict)
    spec["scenarios"] = size["sweep_scenarios"]
    spec["trajectories"] = []
    if size["sweep_t1"] is not None:
        dt = spec["integrator"]["dt"]
        spec["integrator"].update(
            t1=size["sweep_t1"], max_steps=round(size["sweep_t1"] / dt) + 1, num_saves=5
        )
    out = Path(tempfile.mkdtemp(prefix="ukjax-gpu-sweep-"))
    try:
        tic = time.perf_counter()
        summary = sweep.run(spec, out=out, fresh=True, progress=False)
        wall = time.perf_counter() - tic
        manifest = json.loads((out / "manifest.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    # a bare simulate_batch of one chunk of the same problem (the same spec's integrator, nominal scenario)
    integ = spec["integrator"]
    chunk = min(summary.scenarios_total, int(manifest["chunk_size"]))
    p = scara.default_params()
    q0, qd0 = scara.initial_state(p)
    Q0, QD0 = jnp.tile(q0, (chunk, 1)), jnp.tile(qd0, (chunk, 1))
    ts = jnp.linspace(0.0, integ["t1"], integ["num_saves"])

    def bare(Q0, QD0):
        sol = ukjax.simulate_batch(
            scara.system(), Q0, QD0, p, t1=integ["t1"], ts=ts, dt=integ["dt"], max_steps=integ["max_steps"]
        )
        return sol.q[:, -1]

    _, bare_s, _, _ = _time(jax, bare, (Q0, QD0), 1)
    steps = round(integ["t1"] / integ["dt"])
    per_scenario = summary.run_s / max(1, summary.scenarios_written)
    return {
        "scenarios": summary.scenarios_total,
        "chunks": summary.chunks_total,
        "chunk_size": chunk,
        "steps": steps,
        "compile_s": summary.compile_s,
        "run_s": summary.run_s,
        "wall_s": wall,
        "scenario_steps_per_s": summary.scenarios_written * steps / summary.run_s if summary.run_s else None,
        "bare_chunk_s": bare_s,
        "overhead": per_scenario / (bare_s / chunk) - 1.0,
        "complete": summary.complete,
    }


def worker_accuracy(dtype: str, size: dict, budget: float, scratch: Path) -> dict:
    jax, ukjax = _setup(dtype)
    import jax.numpy as jnp
    import numpy as np
    import throughput

    from ukjax.models import scara

    np_dtype = np.float64 if dtype == "float64" else np.float32
    batch, steps = size["accuracy"]
    dt = 5e-3
    t1 = steps * dt
    p = jax.tree_util.tree_map(lambda x: jnp.asarray(x, np_dtype), scara.default_params())
    base = tuple(np.asarray(x) for x in scara.initial_state(scara.default_params()))
    q0, qd0 = throughput.scenarios(base, batch, 1, np_dtype)
    system = scara.system()

    def final(device):
        with jax.default_device(device):
            sol = ukjax.simulate_batch(system, jnp.asarray(q0), jnp.asarray(qd0), p, t1=t1, ts=[t1], dt=dt)
            return np.asarray(sol.q[:, -1], np.float64), np.asarray(sol.position_violation[:, -1], np.float64)

    device, cpu = jax.devices()[0], jax.devices("cpu")[0]
    q_dev, viol = final(device)
    q_cpu, _ = final(cpu)
    result = {
        "dtype": dtype,
        "batch": batch,
        "steps": steps,
        "dt": dt,
        "solver": "Tsit5 (fixed step)",
        "device": str(device),
        "same_device": device.platform == "cpu",
        "max_abs_q_device_vs_cpu": float(np.max(np.abs(q_dev - q_cpu))),
        "max_position_violation": float(np.max(viol)),
    }
    reference = scratch / "accuracy-float64-cpu.npy"
    if dtype == "float64":
        np.save(reference, q_cpu)
    elif reference.exists():
        q64 = np.load(reference)
        result["max_abs_q_float32_device_vs_float64_cpu"] = float(np.max(np.abs(q_dev - q64)))
        result["max_abs_q_float32_cpu_vs_float64_cpu"] = float(np.max(np.abs(q_cpu - q64)))
    return result


def worker_tests(dtype: str, size: dict, budget: float, scratch: Path, smoke: bool) -> dict:
    import importlib.util
    import xml.etree.ElementTree as ET

    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed on this machine"}
    files, left_out = [], {}
    for name in (SMOKE_TEST,) if smoke else TEST_FILES:
        path = ROOT / "tests" / name
        imports = set(re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.M))
        missing = sorted(m for m in imports if importlib.util.find_spec(m) is None and m not in ("helpers",))
        if missing:
            left_out[name] = f"needs {', '.join(missing)}"
        else:
            files.append(str(path))
    report = scratch / "junit.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",  # the project's addopts ask for pytest-xdist, which a GPU machine may lack
        "-m",
        "not slow",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        *files,
    ]
    if smoke:
        command += ["-k", SMOKE_SELECTION]
    tic = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=max(30.0, budget))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    if report.exists():
        root = ET.parse(report).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in counts}
        for case in suite.iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                failed.append(
                    {
                        "test": f"{case.get('classname')}::{case.get('name')}",
                        "message": (bad.get("message") or "")[:300],
                    }
                )
    return {
        "files": [Path(f).name for f in files],
        "left_out": left_out,
        "returncode": done.returncode,
        **counts,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": failed[:20],
        "wall_s": time.perf_counter() - tic,
        "output_tail": done.stdout[-1500:] + done.stderr[-500:],
    }


# ================================================================================================ parent
def run_worker(section: str, dtype: str, args, budget: float, scratch: Path) -> dict:
    """Run one section (one dtype) in a fresh process; its result, or the error that ended it."""
    part = scratch / f"{section}-{dtype}.json"
    command = [
        sys.executable,
        __file__,
        "--worker",
        section,
        "--dtype",
        dtype,
        "--out",
        str(part),
        "--scratch",
        str(scratch),
        "--budget-s",
        str(budget),
    ] + (["--smoke"] if args.smoke else [])
    tic = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=budget + 60)
        tail = (done.stdout[-1000:] + done.stderr[-2000:]).strip()
        ok = done.returncode == 0 and part.exists()
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {budget + 60:.0f} s"
    result = json.loads(part.read_text()) if part.exists() else {}
    result["status"] = "ok" if ok else "error"
    result["wall_s"] = time.perf_counter() - tic
    if not ok:
        result["error"] = tail[-2500:]
    return result


def summary_rows(results: dict) -> list[list]:
    """The printed table: one line per headline figure."""
    rows = []
    for part in results.get("throughput", {}).get("parts", []):
        for r in part.get("rows", []):
            rows.append(
                [
                    f"throughput {r['dtype']}",
                    f"{r['contender']} ({r['solver']})",
                    r["batch"],
                    f"{r['scenario_steps_per_s']:.3g} scen-steps/s",
                    f"{(r['bytes_per_scenario'] or 0) / 1024:.1f} KiB/scen, compile {r['compile_s']:.1f} s",
                ]
            )
    g = results.get("gradient", {})
    for mode, ratio in g.get("grad_over_forward", {}).items():
        rows.append(
            [
                "gradient",
                f"SCARA tuning objective, {mode} mode",
                g["scenarios"],
                f"grad/forward {ratio:.2f}",
                f"compile {g['compile_s'][f'gradient_{mode}']:.1f} s",
            ]
        )
    s = results.get("sweep", {})
    if "scenarios" in s:
        rows.append(
            [
                "sweep",
                "SCARA (shipped spec scara)",
                s["scenarios"],
                f"{(s['scenario_steps_per_s'] or 0):.3g} scen-steps/s",
                f"overhead {100 * s['overhead']:.0f} %",
            ]
        )
    for part in results.get("accuracy", {}).get("parts", []):
        if "max_abs_q_device_vs_cpu" in part:
            extra = part.get("max_abs_q_float32_device_vs_float64_cpu")
            rows.append(
                [
                    f"accuracy {part['dtype']}",
                    "SCARA, device vs CPU",
                    part["batch"],
                    f"max|Δq| {part['max_abs_q_device_vs_cpu']:.2e}",
                    "" if extra is None else f"vs float64 CPU {extra:.2e}",
                ]
            )
    t = results.get("tests", {})
    if "passed" in t:
        rows.append(
            [
                "tests",
                ", ".join(t["files"]),
                t["tests"],
                f"{t['passed']} passed",
                f"{t['failures'] + t['errors']} failed",
            ]
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSON files (at most 7)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, the same code paths (CPU, CI)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=540.0, help="time limit of the whole run (s)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float64", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = sizes(args.smoke)
    if args.worker:
        scratch = Path(args.scratch)
        work = {
            "environment": lambda: worker_environment(args.dtype, size),
            "tests": lambda: worker_tests(args.dtype, size, args.budget_s, scratch, args.smoke),
            "throughput": lambda: worker_throughput(args.dtype, size, args.budget_s),
            "gradient": lambda: worker_gradient(args.dtype, size, args.budget_s),
            "sweep": lambda: worker_sweep(args.dtype, size, args.budget_s),
            "accuracy": lambda: worker_accuracy(args.dtype, size, args.budget_s, scratch),
        }[args.worker]
        try:
            result = work()
        except Exception:
            result = {"error": traceback.format_exc()[-3000:]}
        sys.path.insert(0, str(ROOT))
        from ukjax._io import write_json

        write_json(args.out, result, with_environment=False)
        return 1 if "error" in result else 0

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    sys.path.insert(0, str(ROOT))
    from ukjax._io import write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ukjax-gpu-suite-"))
    results, started = {}, time.perf_counter()
    try:
        for section in sections:
            budget = args.budget_s * SHARES[section] / sum(SHARES[s] for s in sections) * len(SECTIONS) / 6
            dtypes = DTYPED.get(section, ("float64",))
            print(f"gpu_suite: {section} ({', '.join(dtypes)}), time limit {budget:.0f} s", flush=True)
            parts = [run_worker(section, dtype, args, budget / len(dtypes), scratch) for dtype in dtypes]
            result = {"parts": parts} if len(parts) > 1 else parts[0]
            result |= {
                "schema": SCHEMA,
                "section": section,
                "smoke": args.smoke,
                "status": "ok" if all(p["status"] == "ok" for p in parts) else "error",
            }
            write_json(out / f"{section}.json", result, with_environment=False)
            results[section] = result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for section in SECTIONS:  # sections of an earlier call into the same folder
        if section not in results and (out / f"{section}.json").exists():
            results[section] = json.loads((out / f"{section}.json").read_text())
    rows = summary_rows(results)
    statuses = {s: results[s]["status"] for s in results}
    write_json(
        out / "summary.json",
        {
            "schema": SCHEMA,
            "smoke": args.smoke,
            "statuses": statuses,
            "sizes": size,
            "wall_s": time.perf_counter() - started,
            "table": rows,
        },
    )
    width = [max(len(str(r[i])) for r in rows) if rows else 0 for i in range(5)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, width, strict=True)))
    print("gpu_suite: " + ", ".join(f"{s} {v}" for s, v in statuses.items()) + f"; files in {out}")
    return 0 if all(v == "ok" for v in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
