"""Everything ukjax measures on a GPU, in one command: ``python benchmarks/gpu_suite.py --out DIR``.

GPU time comes in leases of about 15 minutes, at most 10 minutes a command, so one call of this script must
produce the whole GPU table, compilation included, in its time plan: ``--budget-s`` (default 450 s, 7.5
minutes on one H100). It runs each section in its own Python process (a fresh process per dtype, since
JAX's float64 switch is global, and so that one section's GPU memory is freed before the next). Each
section gets a share of the time still left when it starts (time a section does not use passes to the
next). Inside a section every row (one contender at one size) is **predicted** before it runs, from the
same contender's previous row (its compile time, and its run time scaled by the batch) or, for a first
row, from :data:`FIRST_ROW_S`; a row that would not end before the section's deadline is skipped with a
message. Every row is appended to ``DIR/rows.jsonl`` as soon as it is measured, so a worker killed at its
limit (or a whole command killed at the lease's) keeps its finished rows. Contenders that take minutes per
run are capped (:data:`CAPS`: naive JAX, MJX and MJWarp stop at 1e5 scenarios). DIR receives at most eight
files (what a GPU lease brings back):

=====================  ===================================================================================
``summary.json``       the environment (devices, memory, driver, versions, optional packages), each
                       section's status, time and budget, the rows skipped and why, and the summary table
``rows.jsonl``         every measured row, appended as it is measured
``throughput.json``    SCARA batches in float64 and float32: ukjax on the shipped model, ukjax on the
                       user-written model (``benchmarks/user_scara.py``), naive JAX
                       (``benchmarks/throughput.py``); scenario-steps/s, compile time, XLA's memory per
                       scenario, peak device memory
``robots.json``        kinematic trees (RK4): the pinned 8-link chain (``ukjax.models.chain``), the UR5 and
                       the Panda loaded from their URDFs (``ukjax.robots.load``), in float32 and float64,
                       against MJX and MJWarp (``mujoco.mjx.put_model(impl="jax" | "warp")``) on the same
                       models where they import
``gradient.json``      the SCARA tuning objective (``benchmarks/tune_gradient.py``, 4096 scenarios x 1000
                       steps): forward pass, forward-mode and reverse-mode gradients, compile and run
                       times and the grad/forward ratios
``sweep.json``         a 1,000,000-scenario SCARA sweep (``ukjax.sweep``) and its overhead against one bare
                       ``simulate_batch`` of the same scenarios
``accuracy.json``      the largest difference of the SCARA batch after 1000 steps between the default device
                       and the CPU (float64), and float32 against float64 on both
``tests.json``         the GPU-relevant test files (``pytest -m "not slow"``, several workers), each test's
                       outcome as it finished (kept if the section's time runs out)
=====================  ===================================================================================

``--smoke`` runs exactly the same code paths at tiny sizes (CI runs it on the CPU and checks the files); on a
CPU-only machine the "device" rows are CPU rows and say so. ``--sections`` runs a subset (a later call
keeps the files of the sections it does not run and rewrites the summary).

On the GPU machine (no package index): ``pip install --no-deps -e .`` (or ``PYTHONPATH=.``) then
``python benchmarks/gpu_suite.py --out $OUT``. The UR5 and Panda files come from example-robot-data where it
is installed, else from the folder ``UKJAX_ROBOT_DATA`` names (its ``robots`` folder, e.g. the two URDFs
unzipped from the wheel: docs/guide/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
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
SCHEMA = 2
SECTIONS = ("environment", "throughput", "robots", "gradient", "sweep", "accuracy", "tests")
SHARES = {
    "environment": 0.02,
    "throughput": 0.20,
    "robots": 0.28,
    "gradient": 0.18,
    "sweep": 0.14,
    "accuracy": 0.07,
    "tests": 0.11,
}
"""Each section's share of the time left when it starts (``--budget-s`` at first)."""
DTYPED = {
    "throughput": ("float64", "float32"),
    "robots": ("float32", "float64"),
    "accuracy": ("float64", "float32"),
}
FIRST_ROW_S = 20.0
"""Predicted cost of a process's first row (compile + runs) on a GPU: on the H200 (2026-11-27) the SCARA
batch compiled in 5-11 s, the UR5 in 12-15 s, the tuning gradients in 9-35 s."""
CAPS = {"naive_jax": 10_000, "mjx": 100_000, "mjwarp": 100_000}
"""Largest batch of the contenders that take minutes per run at larger sizes (naive JAX's batched eigh and
SVD: 29 s per run at 1e5 scenarios on the H200), by name prefix."""
OPTIONAL = (
    "pytest",
    "xdist",
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
    "test_gpu_ready.py",
    "test_simulation.py",
    "test_entrywise.py",
    "test_solvers.py",
    "test_sweep.py",
    "test_tune.py",
    "test_scara.py",
    "test_multibody.py",
    "test_config.py",
)
SMOKE_TEST = "test_gpu_ready.py"
# --smoke runs one test that compiles nothing: it checks the pytest-and-report path
SMOKE_SELECTION = "jax_version"
ROBOT_FILES = {
    "ur5": "ur_description/urdf/ur5_robot.urdf",
    "panda": "panda_description/urdf/panda.urdf",
    "arm2": str(ROOT / "tests" / "data" / "arm2.urdf"),  # --smoke: a two-link URDF of the test suite
}


def sizes(smoke: bool) -> dict:
    """Problem sizes of every section: full (one H100 in ``--budget-s``) or ``--smoke`` (a CPU, seconds)."""
    if smoke:
        return {
            "scara": {
                "ukjax_scara": [8],
                "ukjax_user_scara": [8],
                "ukjax_user_scara_vmap": [8],
                "ukjax_user_scara_fused": [8],
                "naive_jax_scara": [8],
            },
            # the fused kernel's interpret mode compiles slowly on a CPU (tests/test_fused.py checks both
            # dtypes' arithmetic): one dtype here
            "fused_dtypes": ("float32",),
            # float32 runs the float64 part's code with another dtype: its fused row (float32 only, above)
            # goes through the same rows, dtype and rate code, so no XLA contender is compiled again here
            "float32_contenders": (),
            "trees": [8],
            "chains": [8],
            "trees_former": [8],
            "trees_others": [8],
            "robots": ("arm2",),
            "dtypes": {"robots": ("float32",)},  # its float64 run is the same code
            "steps": 5,
            "dt": 5e-3,
            "repeats": 1,
            "chain_links": 4,
            "gradient": (4, 10),
            "gradient_modes": ("forward",),
            "sweep_scenarios": 16,
            "sweep_t1": 0.05,
            "accuracy": (8, 5),  # the throughput rows' program (steps, batch): read back from the cache
        }
    return {
        "scara": {
            "ukjax_scara": [1_000_000],
            "ukjax_user_scara": [100_000, 1_000_000],
            "ukjax_user_scara_vmap": [1_000_000],
            "ukjax_user_scara_fused": [100_000, 1_000_000],
            "naive_jax_scara": [10_000],
        },
        "trees": [1_000_000],  # the robots (ukjax)
        "chains": [100_000, 1_000_000],  # the pinned chain (ukjax)
        "trees_former": [100_000],  # the chain's recursions as loops (before they were unrolled)
        "trees_others": [100_000],  # MJX, MJWarp
        "robots": ("ur5", "panda"),
        "steps": 200,
        "dt": 5e-3,
        "repeats": 2,
        "chain_links": 8,
        "gradient": (4096, 1000),
        "gradient_modes": ("forward", "reverse"),
        "sweep_scenarios": 1_000_000,
        "sweep_t1": None,
        "accuracy": (1024, 1000),
    }


# ================================================================================================ workers
class Plan:
    """A worker's deadline, its row log and its predictions: :meth:`row` measures one contender at one
    size if its predicted cost fits before the deadline, appends it to the log, and remembers its cost."""

    def __init__(self, deadline: float, log: Path | None, section: str, dtype: str):
        self.deadline, self.log, self.section, self.dtype = deadline, log, section, dtype
        self.rows, self.skipped, self.errors = [], [], []
        self.skip = set(filter(None, os.environ.get("UKJAX_GPU_SUITE_SKIP", "").split(",")))
        self._last: dict = {}  # contender -> (batch, compile_s, run_s)

    def left(self) -> float:
        return self.deadline - time.time()

    def predict(self, contender: str, batch: int, repeats: int) -> float:
        """A row's seconds: the contender's compile time and its run time scaled by the batch (repeats + 1
        runs: the first call and the timed ones); a first row: the slowest compile in this process so far
        plus 5 s, or :data:`FIRST_ROW_S` before any."""
        if contender not in self._last:
            compiles = [c for _, c, _ in self._last.values()]
            return max(compiles) + 5.0 if compiles else FIRST_ROW_S
        b, compile_s, run_s = self._last[contender]
        return compile_s + (repeats + 1) * run_s * batch / b

    def capped(self, contender: str, batch: int) -> bool:
        if contender in self.skip:
            self.skipped.append(f"{contender}: left out (--skip)")
            return True
        cap = next((c for prefix, c in CAPS.items() if contender.startswith(prefix)), None)
        if cap is not None and batch > cap:
            self.skipped.append(f"{contender} at {batch}: above its cap of {cap} scenarios (CAPS)")
            return True
        return False

    def fits(self, contender: str, batch: int, repeats: int) -> bool:
        predicted = self.predict(contender, batch, repeats)
        if predicted > self.left():
            self.skipped.append(
                f"{contender} at {batch}: predicted {predicted:.0f} s, {max(0.0, self.left()):.0f} s left"
            )
            return False
        return True

    def record(self, row: dict, contender: str | None = None, batch: int | None = None) -> dict:
        row = {"section": self.section, "dtype": self.dtype, **row}
        self.rows.append(row)
        if contender is not None and "compile_s" in row and "run_s" in row:
            self._last[contender] = (batch or 1, row["compile_s"], row["run_s"])
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        return row

    def result(self, **extra) -> dict:
        return {
            "dtype": self.dtype,
            "rows": self.rows,
            "skipped": self.skipped,
            "errors": self.errors,
            **extra,
        }


def _setup(dtype: str):
    """Import JAX, ukjax and the benchmark modules in a worker, then set the dtype's float64 switch (the
    benchmark modules switch float64 on when imported, so the switch is set after them)."""
    sys.path[:0] = [str(HERE), str(ROOT)]  # this checkout's ukjax, installed or not
    import cuda_lowering  # noqa: F401
    import jax
    import scaling  # noqa: F401
    import throughput  # noqa: F401
    import tune_gradient  # noqa: F401
    import validate_robots  # noqa: F401

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


def _time(jax, fn, args, repeats: int) -> tuple[float, float, object, object]:
    """(compile seconds, best run seconds, outputs, compiled) of ``jax.jit(fn)(*args)``."""
    tic = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - tic
    best, out = float("inf"), None
    for _ in range(repeats):
        tic = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - tic)
    return compile_s, best, out, compiled


def worker_environment(dtype: str, size: dict, plan: Plan) -> dict:
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
    robot_files = {}
    for name in ROBOT_FILES:
        try:
            robot_files[name] = str(robot_file(name))
        except FileNotFoundError as error:
            robot_files[name] = f"unavailable: {error}"
    return {
        "environment": env,
        "devices": devices,
        "nvidia_smi": driver,
        "optional_packages": optional,
        "robot_files": robot_files,
    }


def _final_states(ukjax, system, p, t1, dt):
    """run(q0, qd0) -> (q, position violation) of a batch at t1 by ``simulate_batch`` with a fixed step dt:
    the program of the throughput rows and of the accuracy section, so that ``--smoke``'s accuracy worker
    reads back the throughput worker's programs from a shared persistent compilation cache (the test suite's)
    instead of compiling them again."""

    def run(q0, qd0):
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=t1, ts=[t1], dt=dt)
        return sol.q[:, -1], sol.position_violation[:, -1]

    return run


def _batch_rows(plan: Plan, jax, name, model, fn, make, batches, size, solver="Tsit5", extra=None) -> None:
    """One row per batch size, in order, while each row's predicted cost fits and none fails; ``extra(batch,
    run_s, final)`` adds entries to a row. ``fn`` returns the final states, or a tuple that starts with
    them."""
    import numpy as np

    steps, repeats = size["steps"], size["repeats"]
    for batch in batches:
        if plan.capped(name, batch) or not plan.fits(name, batch, repeats):
            break
        try:
            args = make(batch)
            compile_s, run_s, out, compiled = _time(jax, fn, args, repeats)
        except Exception as error:  # out of memory, a contender that cannot run here: record, go on
            plan.errors.append(f"{name} at batch {batch}: {type(error).__name__}: {str(error)[:300]}")
            break
        final = np.asarray(out[0] if isinstance(out, tuple) else out)
        row = {
            "contender": name,
            "model": model,
            "solver": solver,
            "batch": batch,
            "steps": steps,
            "compile_s": compile_s,
            "run_s": run_s,
            "scenario_steps_per_s": batch * steps / run_s,
            "finite_fraction": float(np.isfinite(final).all(axis=tuple(range(1, final.ndim))).mean()),
            **_memory(compiled, batch),
        }
        if extra is not None:
            row |= extra(batch, run_s, final)
        plan.record(row, name, batch)
        del compiled, out, args


def worker_throughput(dtype: str, size: dict, plan: Plan) -> dict:
    jax, ukjax = _setup(dtype)
    import cuda_lowering
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
        return _final_states(ukjax, system, p, t1, dt)

    def without_entrywise(run):
        return lambda q0, qd0: cuda_lowering._without_entrywise(lambda: run(q0, qd0))

    contenders = {
        "ukjax_scara": on_batch(scara.system(), shipped),
        "ukjax_user_scara": on_batch(user_scara.system(), user_params),
        # the same with the right-hand side as the plain vmap program (the entrywise evaluation off)
        "ukjax_user_scara_vmap": without_entrywise(on_batch(user_scara.system(), user_params)),
        "naive_jax_scara": lambda q0, qd0: throughput.naive_jax(q0, qd0, paper, dt, steps=steps)[0],
    }
    make = lambda b: throughput.scenarios(base, b, 0, np_dtype)
    if dtype == "float32" and "float32_contenders" in size:
        contenders = {k: v for k, v in contenders.items() if k in size["float32_contenders"]}
    for name, fn in contenders.items():
        _batch_rows(plan, jax, name, "scara", fn, make, size["scara"][name], size)
    # the fused engine (simulate_batch(engine="fused"): one kernel per save interval, ukjax.fused) on the same
    # user-written model, the same Tsit5 steps: its rate, the
    # arithmetic it achieves (XLA's flop count of one right-hand side x 6 stages per step) against the chip's
    # peak, and its final states against the XLA program's at the same scenarios (same device)
    system = user_scara.system()
    xla_run = on_batch(system, user_params)
    flops_per_step = 6 * _rhs_flops(jax, system, user_params, make(2))
    peak = _peak_flops(jax, dtype)

    def fused_run(q0, qd0):
        sol = ukjax.simulate_batch(system, q0, qd0, user_params, t1=t1, ts=[0.0, t1], dt=dt, engine="fused")
        return sol.q[:, -1]

    def fused_extra(batch, run_s, final):
        out = {
            "flops_per_scenario_step": flops_per_step,
            "flop_per_s": flops_per_step * batch * steps / run_s,
        }
        if peak:
            out["peak_flop_per_s"], out["peak_fraction"] = peak, out["flop_per_s"] / peak
        if batch == size["scara"]["ukjax_user_scara_fused"][0]:
            reference = np.asarray(jax.jit(xla_run)(*make(batch))[0])
            out["max_abs_q_vs_xla_engine"] = float(np.max(np.abs(final - reference)))
        return out

    name = "ukjax_user_scara_fused"
    batches = size["scara"][name] if dtype in size.get("fused_dtypes", (dtype,)) else []
    _batch_rows(plan, jax, name, "scara", fused_run, make, batches, size, extra=fused_extra)
    return plan.result(
        steps=steps, dt=dt, device=str(jax.devices()[0]), peak_device_bytes=_peak_device_bytes(jax)
    )


def _rhs_flops(jax, system, params, states) -> float | None:
    """XLA's floating-point operation count of one scenario's right-hand side (q̈ of the system) on this
    device, from the compiled program's cost analysis."""
    q, qd = (x[0] for x in states)
    try:
        compiled = jax.jit(lambda q, qd: system.acceleration(q, qd, 0.0, params)).lower(q, qd).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost["flops"])
    except Exception:  # a backend without cost analysis
        return None


PEAK_FLOPS = {"H100": {"float64": 34e12, "float32": 67e12}, "H200": {"float64": 34e12, "float32": 67e12}}
"""Vector (non-tensor-core) peak of the SXM parts by the vendor's datasheets, FLOP/s."""


def _peak_flops(jax, dtype: str) -> float | None:
    kind = jax.devices()[0].device_kind
    return next((v[dtype] for k, v in PEAK_FLOPS.items() if k in kind), None)


def robot_file(name: str) -> Path:
    """The URDF of a robot of example-robot-data: from the installed package, else from the folder
    ``UKJAX_ROBOT_DATA`` names (example-robot-data's ``robots`` folder, or a copy of the files used)."""
    from ukjax.studies._common import example_robot_file

    relative = ROBOT_FILES[name]
    return Path(relative) if Path(relative).is_absolute() else example_robot_file(relative)


def _with_looped_tree_scans(thunk):
    """``thunk()`` traced with the kinematic tree's recursions as ``lax.scan`` loops on every platform, as
    they were before they were unrolled for the GPU (``ukjax.multibody._scan_per_platform``)."""
    from ukjax import multibody

    original = multibody._scan_per_platform
    multibody._scan_per_platform = multibody._scanned
    try:
        return thunk()
    finally:
        multibody._scan_per_platform = original


def worker_robots(dtype: str, size: dict, plan: Plan) -> dict:
    """Kinematic trees with RK4: ukjax's tree model of the pinned chain and the UR5 and Panda loaded from
    their URDFs, then MJX and MJWarp on the same models (the chain's MJCF from ``benchmarks/scaling.py``,
    the robots' URDFs compiled by MuJoCo without visual and collision elements; no contacts, no limits, no
    equalities; the robots' states about their home poses as in ``benchmarks/robots_speed.py``)."""
    jax, ukjax = _setup(dtype)
    import jax.numpy as jnp
    import numpy as np
    import scaling
    from _common import HOMES, robot_states

    from ukjax import robots
    from ukjax.models import chain

    np_dtype = np.float64 if dtype == "float64" else np.float32
    cast = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x, np_dtype), tree)
    links, steps, dt = size["chain_links"], size["steps"], size["dt"]
    t1 = steps * dt
    models = {}  # name -> (system, params, make(batch), MuJoCo model factory)

    def chain_states(batch):
        q0, qd0 = chain.scenarios(chain.default_params(links), batch, seed=0)
        return jnp.asarray(q0, np_dtype), jnp.asarray(qd0, np_dtype)

    def chain_mujoco():
        import mujoco

        return mujoco.MjModel.from_xml_string(scaling.mjcf(chain.default_params(links), 1, dt, "RK4"))

    for name in size["robots"]:
        try:
            path = robot_file(name)
            robot = robots.load(path)
        except Exception as error:  # example-robot-data or mujoco missing here
            plan.errors.append(f"ukjax_{name}: not measured ({type(error).__name__}: {str(error)[:200]})")
            continue

        home = HOMES.get(name, (0.0,) * robot.n)  # arm2 (--smoke): about q = 0

        def states(batch, robot=robot, home=home):
            return robot_states(robot, home, batch, 0, np_dtype)

        def robot_mujoco(path=path):
            import mujoco
            from validate_robots import mujoco_urdf_model

            model = mujoco_urdf_model(path)
            model.opt.timestep, model.opt.integrator = dt, mujoco.mjtIntegrator.mjINT_RK4
            off = mujoco.mjtDisableBit.mjDSBL_CONSTRAINT | mujoco.mjtDisableBit.mjDSBL_CONTACT
            model.opt.disableflags |= off
            return model

        # MuJoCo's (and MJX's) constraints are disabled, the Panda's finger mimic equality with them
        models[name] = (robot.system(loops=False), cast(robot.params), states, robot_mujoco)

    models[f"chain{links}"] = (
        chain.multibody_system(links),
        cast(chain.default_params(links)),
        chain_states,
        chain_mujoco,
    )
    for model, (system, params, make, _) in models.items():

        def run(q0, qd0, system=system, params=params):
            sol = ukjax.simulate_batch(system, q0, qd0, params, t1=t1, ts=[t1], dt=dt, solver=ukjax.RK4())
            return sol.q[:, -1]

        batches = size["chains"] if model.startswith("chain") else size["trees"]
        _batch_rows(plan, jax, f"ukjax_{model}", model, run, make, batches, size, solver="RK4")
        if model.startswith("chain"):  # before/after: the recursions as the lax.scan loop on every platform
            looped = lambda q0, qd0, run=run: _with_looped_tree_scans(lambda: run(q0, qd0))
            name = f"ukjax_{model}_scan"
            _batch_rows(plan, jax, name, model, looped, make, size["trees_former"], size, solver="RK4")
    for impl in ("jax", "warp"):
        for model, (_, _, make, mujoco_model) in models.items():
            name = f"mjx_{model}" if impl == "jax" else f"mjwarp_{model}"
            try:
                from mujoco import mjx

                mx = mjx.put_model(mujoco_model(), impl=impl)
                blank = mjx.make_data(mx, impl=impl)
            except Exception as error:  # not installed here, or no GPU for MJWarp (each model says so)
                plan.errors.append(f"{name}: not measured ({type(error).__name__}: {str(error)[:200]})")
                continue

            def run(q0, qd0, mx=mx, blank=blank):
                def one(q, qd):
                    data = blank.replace(qpos=q, qvel=qd)
                    data = jax.lax.fori_loop(0, steps, lambda _, d: mjx.step(mx, d), data)
                    return data.qpos

                return jax.vmap(one)(q0, qd0)

            _batch_rows(plan, jax, name, model, run, make, size["trees_others"], size, solver="RK4")
    return plan.result(
        steps=steps, dt=dt, device=str(jax.devices()[0]), peak_device_bytes=_peak_device_bytes(jax)
    )


def worker_gradient(dtype: str, size: dict, plan: Plan) -> dict:
    """The SCARA tuning objective of ``benchmarks/tune_gradient.py``: its forward pass, then its value and
    gradient in each mode, each compiled and timed as its own row (predicted from the forward pass's)."""
    jax, _ = _setup("float64")
    import numpy as np
    import tune_gradient

    scenarios, steps = size["gradient"]
    dt, repeats = 5e-3, size["repeats"]
    batch, box, forward_of, gradient_of = tune_gradient._objective(scenarios, steps, dt)
    space = tune_gradient.tune_scara.space_for(box, 0.5, 200.0)
    theta = space.init()
    programs = {"forward": forward_of(space)}
    programs |= {f"gradient_{mode}": gradient_of(space, mode) for mode in size["gradient_modes"]}
    out = {}
    for name, fn in programs.items():
        # a gradient costs a few forward passes to run and ~2x its compile: predicted from the forward row
        if name != "forward" and "forward" in plan._last:
            b, c, r = plan._last["forward"]
            plan._last[name] = (b, 2.0 * c, 4.0 * r)
        if not plan.fits(name, scenarios, repeats):
            continue
        compile_s, run_s, result, compiled = _time(jax, fn, (theta, batch), repeats)
        out[name] = result
        plan.record(
            {"program": name, "scenarios": scenarios, "steps": steps, "compile_s": compile_s, "run_s": run_s,
             **_memory(compiled, scenarios)},
            name,
            scenarios,
        )  # fmt: skip
    runs = {r["program"]: r["run_s"] for r in plan.rows}
    ratios = {
        k[len("gradient_") :]: v / runs["forward"]
        for k, v in runs.items()
        if k != "forward" and "forward" in runs
    }
    grads = {k: np.asarray([float(x) for x in v[1].values()]) for k, v in out.items() if k != "forward"}
    extra = {}
    if len(grads) == 2:
        f, r = grads["gradient_forward"], grads["gradient_reverse"]
        extra["forward_vs_reverse_relative_difference"] = float(np.linalg.norm(f - r) / np.linalg.norm(r))
    return plan.result(
        what="ukjax.tune.batch_loss and batch_value_and_grad, SCARA objective of `ukjax tune scara`, "
        "2 tuned numbers (log α, log β), Tsit5 fixed step, float64",
        scenarios=scenarios, steps=steps, dt=dt, grad_over_forward=ratios, target_ratio=3.0,
        compile_s={r["program"]: r["compile_s"] for r in plan.rows}, **extra,
    )  # fmt: skip


def worker_sweep(dtype: str, size: dict, plan: Plan) -> dict:
    """A SCARA sweep (the shipped spec at ``sweep_scenarios``) against one bare ``simulate_batch`` of the
    same scenarios with the same integrator: overhead = sweep run time / bare run time - 1."""
    jax, ukjax = _setup("float64")
    import jax.numpy as jnp

    from ukjax import sweep
    from ukjax.sweep import _scenarios

    spec = sweep.load_spec("scara").source  # the shipped spec's fields, as read from its TOML (a fresh dict)
    spec["scenarios"] = size["sweep_scenarios"]
    spec["trajectories"] = []
    if size["sweep_t1"] is not None:
        dt = spec["integrator"]["dt"]
        spec["integrator"].update(
            t1=size["sweep_t1"], max_steps=round(size["sweep_t1"] / dt) + 1, num_saves=5
        )
    integ = spec["integrator"]
    steps = round(integ["t1"] / integ["dt"])
    total = size["sweep_scenarios"]
    # the bare batch integrates the sweep's own scenarios (drawn beforehand, not timed: the spec varies the
    # masses, lengths and inertias, so every scenario has its own parameters) with the same integrator and
    # saves, in one simulate_batch call (as benchmarks/sweep.py does per chunk on a CPU)
    parsed = sweep.load_spec(spec)
    model = sweep.load_model(parsed.model)
    subsweeps = _scenarios.Plan.from_spec(parsed, total)
    static, _ = _scenarios.integrator_options(parsed, subsweeps, 0)
    build = jax.jit(jax.vmap(_scenarios.scenario_builder(parsed, subsweeps, model, 0)))
    params, Q0, QD0, _ = build(jnp.arange(total))
    ts = jnp.linspace(0.0, integ["t1"], static["num_saves"])

    def bare(Q0, QD0, params):
        sol = ukjax.simulate_batch(model.system, Q0, QD0, params, batch_params=True, t1=integ["t1"], ts=ts,
                                   dt=integ["dt"], max_steps=static["max_steps"])  # fmt: skip
        return sol.q[:, -1]

    result = {"scenarios": total, "steps": steps}
    if plan.fits("bare_simulate_batch", total, 1):
        compile_s, bare_s, _, _ = _time(jax, bare, (Q0, QD0, params), 1)
        plan.record({"program": "bare_simulate_batch", "scenarios": total, "steps": steps,
                     "compile_s": compile_s, "run_s": bare_s}, "bare_simulate_batch", total)  # fmt: skip
        result |= {"bare_compile_s": compile_s, "bare_run_s": bare_s}
        # the sweep compiles its chunk program (~1.6x the bare one's time on the H200, 2026-11-27) and runs
        # the same scenarios plus its host work
        plan._last["sweep"] = (total, 1.6 * compile_s, 1.3 * bare_s)
    del Q0, QD0, params
    if not plan.fits("sweep", total, 0):
        return plan.result(**result)
    out = Path(tempfile.mkdtemp(prefix="ukjax-gpu-sweep-"))
    try:
        tic = time.perf_counter()
        summary = sweep.run(spec, out=out, fresh=True, progress=False)
        wall = time.perf_counter() - tic
        manifest = json.loads((out / "manifest.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    row = plan.record(
        {"program": "sweep", "scenarios": summary.scenarios_total, "chunks": summary.chunks_total,
         "chunk_size": int(manifest["chunk_size"]), "steps": steps, "compile_s": summary.compile_s,
         "run_s": summary.run_s, "wall_s": wall, "complete": summary.complete}, "sweep", total,
    )  # fmt: skip
    result |= {k: row[k] for k in ("chunks", "chunk_size", "compile_s", "run_s", "wall_s", "complete")}
    result["scenario_steps_per_s"] = (
        summary.scenarios_written * steps / summary.run_s if summary.run_s else None
    )
    if "bare_run_s" in result:
        result["overhead"] = summary.run_s / result["bare_run_s"] - 1.0
    return plan.result(**result)


def worker_accuracy(dtype: str, size: dict, plan: Plan, scratch: Path) -> dict:
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

    run = jax.jit(_final_states(ukjax, system, p, t1, dt))

    def final(device):
        with jax.default_device(device):
            q, violation = run(jnp.asarray(q0), jnp.asarray(qd0))
            return np.asarray(q, np.float64), np.asarray(violation, np.float64)

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
    plan.record(result)
    return result


_WORD = r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b"
_OUTCOME = re.compile(_WORD + r"\s+(tests/\S+::\S+)|(tests/\S+::\S+)\s+" + _WORD)


def outcomes(text: str) -> dict:
    """{test id: outcome} from pytest's verbose output (``-v``, with or without xdist's ``[gwN]`` prefix):
    read as the tests finish, so a run stopped at its time limit still reports what it ran."""
    found = {}
    for m in _OUTCOME.finditer(text):
        outcome, test = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        found[test] = outcome
    return found


def worker_tests(dtype: str, size: dict, plan: Plan, smoke: bool) -> dict:
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed on this machine"}
    files, left_out = [], {}
    for name in (SMOKE_TEST,) if smoke else size.get("test_files", TEST_FILES):
        path = ROOT / "tests" / name
        imports = set(re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.M))
        missing = sorted(m for m in imports if importlib.util.find_spec(m) is None and m not in ("helpers",))
        if missing:
            left_out[name] = f"needs {', '.join(missing)}"
        else:
            files.append(f"tests/{name}")
    # several workers share the GPU: each allocates what it uses instead of 75 % of the device up front
    workers = [] if smoke or importlib.util.find_spec("xdist") is None else ["-n", "6"]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "not slow", "-v",
               "-p", "no:cacheprovider", *workers, *files]  # fmt: skip
    if smoke:
        command += ["-k", SMOKE_SELECTION]
    tic = time.perf_counter()
    limit = max(20.0, plan.left() - 5.0)
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=limit, env=env)
        text, returncode, finished = done.stdout + done.stderr, done.returncode, True
    except subprocess.TimeoutExpired as stopped:
        text = (
            (stopped.stdout or b"").decode(errors="replace")
            if isinstance(stopped.stdout, bytes)
            else (stopped.stdout or "")
        )
        returncode, finished = None, False
    found = outcomes(text)
    counts = {k: sum(v == k for v in found.values()) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    result = {
        "files": [Path(f).name for f in files],
        "left_out": left_out,
        "finished": finished,
        "time_limit_s": limit,
        "returncode": returncode,
        "tests": len(found),
        "passed": counts["PASSED"],
        "failures": counts["FAILED"],
        "errors": counts["ERROR"],
        "skipped_tests": counts["SKIPPED"],
        "failed": sorted(t for t, v in found.items() if v in ("FAILED", "ERROR"))[:30],
        "wall_s": time.perf_counter() - tic,
        "output_tail": text[-2500:],
    }
    plan.record({k: v for k, v in result.items() if k != "output_tail"})
    return result


# ================================================================================================ parent
def run_worker(section: str, dtype: str, args, deadline: float, scratch: Path, rows: Path) -> dict:
    """Run one section (one dtype) in a fresh process until ``deadline`` (epoch seconds; killed 30 s after
    it); its result, or the error that ended it with the rows it had measured."""
    part = scratch / f"{section}-{dtype}.json"
    command = [
        sys.executable, __file__, "--worker", section, "--dtype", dtype, "--out", str(part),
        "--scratch", str(scratch), "--deadline", f"{deadline:.3f}", "--rows", str(rows),
    ] + (["--smoke"] if args.smoke else [])  # fmt: skip
    tic = time.perf_counter()
    limit = max(10.0, deadline - time.time()) + 30.0
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        tail = (done.stdout[-1000:] + done.stderr[-2000:]).strip()
        ok = done.returncode == 0 and part.exists()
    except subprocess.TimeoutExpired:
        ok, tail = False, f"killed {limit:.0f} s after it started (its deadline + 30 s)"
    result = json.loads(part.read_text()) if part.exists() else {}
    if not part.exists() and rows.exists():  # killed: the rows it had appended are all there is
        lines = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
        result["rows"] = [r for r in lines if r.get("section") == section and r.get("dtype") == dtype]
    result["status"] = "ok" if ok else "error"
    result["wall_s"] = time.perf_counter() - tic
    if not ok:  # the worker's own traceback where it wrote one (its output may be empty), else its output
        result["error"] = result.get("error") or tail[-2500:] or "the worker exited with no output"
    return result


def _as_list(value) -> list:
    return value if isinstance(value, list) else []


def summary_rows(results: dict) -> list[list]:
    """The printed table: one line per headline figure."""
    rows = []
    for section in ("throughput", "robots"):
        found = results.get(section, {})
        for part in found.get("parts", [found]):
            for r in part.get("rows", []):
                rows.append(
                    [
                        f"{section} {r['dtype']}",
                        f"{r['contender']} ({r['solver']})",
                        r["batch"],
                        f"{r['scenario_steps_per_s']:.3g} scen-steps/s",
                        f"{(r.get('bytes_per_scenario') or 0) / 1024:.1f} KiB/scen, "
                        f"compile {r['compile_s']:.1f} s",
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
    if "overhead" in s:
        rows.append(
            [
                "sweep",
                "SCARA (shipped spec scara)",
                s["scenarios"],
                f"{(s['scenario_steps_per_s'] or 0):.3g} scen-steps/s",
                f"overhead {100 * s['overhead']:.0f} % ({s['chunks']} chunks), "
                f"compile {s['compile_s']:.1f} s",
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
                f"{t['failures'] + t['errors']} failed" + ("" if t["finished"] else " (stopped at its time)"),
            ]
        )
    return rows


def _pairs(parser, items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"expected KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    return pairs


def _overrides(parser, items: list[str]) -> dict:
    """``--set KEY=JSON`` pairs as problem sizes (a worker gets them through ``UKJAX_GPU_SUITE_SET``)."""
    out = json.loads(os.environ.get("UKJAX_GPU_SUITE_SET", "{}"))
    for key, value in _pairs(parser, items).items():
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError as error:
            parser.error(f"--set {key}: not JSON ({error})")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the files (at most 8)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, the same code paths (CPU, CI)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=450.0, help="time plan of the whole run (s)")
    parser.add_argument(
        "--skip", default="", help="comma list of contenders to leave out (rows measured in an earlier call)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help='replace one problem size for this run, e.g. trees=[100000], dtypes={"robots":["float32"]}, '
        'test_files=["test_fused.py"] (repeatable; every worker reads it)',
    )
    parser.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="SECTION=FRACTION",
        help="a section's share of the time left when it starts (repeatable; defaults: "
        + ", ".join(f"{k} {v}" for k, v in SHARES.items())
        + ")",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float64", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    overrides = _overrides(parser, args.set)
    size = sizes(args.smoke) | overrides
    shares = SHARES | {k: float(v) for k, v in _pairs(parser, args.share).items()}
    if args.set:  # read by every worker
        os.environ["UKJAX_GPU_SUITE_SET"] = json.dumps(overrides)
    if args.skip:  # read by every worker's Plan
        os.environ["UKJAX_GPU_SUITE_SKIP"] = args.skip
    if args.worker:
        scratch = Path(args.scratch)
        plan = Plan(args.deadline, Path(args.rows) if args.rows else None, args.worker, args.dtype)
        work = {
            "environment": lambda: worker_environment(args.dtype, size, plan),
            "tests": lambda: worker_tests(args.dtype, size, plan, args.smoke),
            "throughput": lambda: worker_throughput(args.dtype, size, plan),
            "robots": lambda: worker_robots(args.dtype, size, plan),
            "gradient": lambda: worker_gradient(args.dtype, size, plan),
            "sweep": lambda: worker_sweep(args.dtype, size, plan),
            "accuracy": lambda: worker_accuracy(args.dtype, size, plan, scratch),
        }[args.worker]
        try:
            result = work()
        except Exception:
            result = plan.result(error=traceback.format_exc()[-3000:])
        sys.path.insert(0, str(ROOT))
        from ukjax._io import write_json

        write_json(args.out, result, with_environment=False)
        return 1 if "error" in result else 0

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted((set(sections) | set(shares)) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    sys.path.insert(0, str(ROOT))
    from ukjax._io import write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_log = out / "rows.jsonl"
    scratch = Path(tempfile.mkdtemp(prefix="ukjax-gpu-suite-"))
    results, budgets, started = {}, {}, time.time()
    end = started + args.budget_s

    def write_summary():
        done = {s: results[s] for s in results if s != "environment"}
        for section in SECTIONS:  # sections of an earlier call into the same folder
            if section not in results and section != "environment" and (out / f"{section}.json").exists():
                done[section] = json.loads((out / f"{section}.json").read_text())
        table = summary_rows(done)
        # a section file of an older schema in the same folder may hold "skipped" as a count: lists only
        skipped = {
            s: [x for p in r.get("parts", [r]) for x in _as_list(p.get("skipped"))] for s, r in done.items()
        }
        write_json(
            out / "summary.json",
            {"schema": SCHEMA, "smoke": args.smoke, "budget_s": args.budget_s, "sizes": size,
             "environment": results.get("environment"), "statuses": {s: r["status"] for s, r in done.items()},
             "section_budgets_s": budgets, "skipped": {s: v for s, v in skipped.items() if v},
             "wall_s": time.time() - started, "table": table},
        )  # fmt: skip
        return table, done

    try:
        for i, section in enumerate(sections):
            left = end - time.time()
            budget = max(0.0, left) * shares[section] / sum(shares[s] for s in sections[i:])
            budgets[section] = budget
            dtypes = size.get("dtypes", {}).get(section, DTYPED.get(section, ("float64",)))
            print(
                f"gpu_suite: {section} ({', '.join(dtypes)}), {budget:.0f} s of {left:.0f} s left", flush=True
            )
            parts = []
            section_end = time.time() + budget
            for j, dtype in enumerate(dtypes):  # each dtype an equal share of what the section has left
                deadline = time.time() + (section_end - time.time()) / (len(dtypes) - j)
                parts.append(run_worker(section, dtype, args, deadline, scratch, rows_log))
            result = {"parts": parts} if len(parts) > 1 else parts[0]
            result |= {
                "schema": SCHEMA,
                "section": section,
                "smoke": args.smoke,
                "status": "ok" if all(p["status"] == "ok" for p in parts) else "error",
            }
            if section != "environment":
                write_json(out / f"{section}.json", result, with_environment=False)
            results[section] = result
            write_summary()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows, done = write_summary()
    statuses = {s: r["status"] for s, r in {**done, **{k: v for k, v in results.items()}}.items()}
    width = [max(len(str(r[i])) for r in rows) if rows else 0 for i in range(5)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, width, strict=True)))
    print(f"gpu_suite: {time.time() - started:.0f} s of a {args.budget_s:.0f} s plan; "
          + ", ".join(f"{s} {v}" for s, v in statuses.items()) + f"; files in {out}")  # fmt: skip
    return 0 if all(v == "ok" for v in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
