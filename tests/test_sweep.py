"""ukjax.sweep: the table does not depend on chunk size, device count or process count; a killed run resumes
to the same table; bad specs are refused before compiling; draws follow their distributions; report; CLI;
the SCARA on 4 simulated devices finishes (it hung in jaxlib's batched LAPACK before) with the same table.

All on a tiny model (tests/sweep_models.py, given as ``module:function`` the way a user gives their own): a
Cartesian pendulum, Heun fixed step, 512 scenarios. Several devices are simulated in a subprocess
(``--xla_force_host_platform_device_count=4`` added to ``XLA_FLAGS``, fixed when JAX starts); two processes
run ``jax.distributed`` on a localhost coordinator (gloo CPU collectives). The 4-device subprocesses start
when the module's first sweep test runs and are collected later, so their compiles overlap the in-process
ones; the two processes start after the in-process reference run, whose compiled programs they read from the
suite's persistent compilation cache.

Tolerance of the invariance checks: 1e-12 of max(1, each column's largest magnitude). The inputs and the
integrated states agree to the last bit; XLA vectorizes the reductions over saved times differently for
different batch shapes, which moves the last bit of a few metrics (and noise-level values such as
‖A A⁺ b - b‖ ~ 1e-15 by 100 %).
"""

import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
import tomllib

import ukjax
from ukjax import sweep
from ukjax.cli import main
from ukjax.linalg import blocks_on_cpu_pool, lapack_calls
from ukjax.sweep import _run

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

SPEC_TOML = """
name = "pendulum"
model = "sweep_models:pendulum"
scenarios = 100
chunk_size = 64
seed = 7
trajectories = [3, 300]

[integrator]
t1 = 1.0
solver = "Heun"
max_steps = 60
num_saves = 11
constraint_rtol = 1.0   # coarse Heun steps (20-50 ms) leave |φ| far above 1e-6: this test is about m <= 0
constraint_atol = 1e-3

[vary]
"params.mass" = { dist = "uniform", low = -0.2, high = 2.0 }   # m <= 0 fails (M not positive definite)
"params.g" = { dist = "lognormal", sigma = 0.1 }
"params.beta" = { dist = "choice", values = [4.0, 6.0], weights = [1.0, 3.0] }
"params.alpha" = { dist = "grid", values = [2.0, 5.0] }
"params.length" = { dist = "relative", spread = 0.05 }
"q0[0]" = { dist = "normal", std = 0.01 }     # mean: the initial state of the drawn length
"qd0[1]" = { dist = "uniform", low = -0.1, high = 0.1 }
"integrator.dt" = { dist = "grid", values = [0.02, 0.05] }

[metrics]
user = { energy_drift = "sweep_models:energy_drift" }
"""
SPEC = tomllib.loads(SPEC_TOML)
TOTAL = 100 * 2 * 2

SCARA_TOML = """
name = "scara_devices"
model = "scara"
scenarios = 32
chunk_size = 32
seed = 3

[integrator]
t1 = 0.25
dt = 5e-3
solver = "Tsit5"
max_steps = 51
num_saves = 101   # 8 scenarios x 101 saved times per device: enough for the old per-save SVD to hang

[vary]
"integrator.method" = { dist = "grid", values = ["cholesky", "svd"] }   # svd calls LAPACK (gesdd, syevd)
"params.m1" = { dist = "relative", spread = 0.05 }
"params.l1" = { dist = "relative", spread = 0.05 }
"params.Iz2" = { dist = "relative", spread = 0.05 }
"q0[0]" = { dist = "normal", std = 0.017453292519943295 }
"qd0" = { dist = "relative", spread = 0.01 }
"""
SCARA = tomllib.loads(SCARA_TOML)
TIMEOUT = 600  # a hung subprocess fails the test instead of freezing CI


def _env(devices: int = 1) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    env["JAX_PLATFORMS"] = "cpu"
    # The suite's own XLA flags (conftest.SUITE_XLA_FLAGS: faster compiles) kept: without them each of the
    # module's five sweep subprocesses compiled with the default emitters and shared no program with this
    # process through the suite's persistent cache (XLA_FLAGS is part of its key).
    flags = os.environ.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _cli(spec_path, out, *flags):
    return [
        sys.executable,
        "-m",
        "ukjax.cli",
        "sweep",
        str(spec_path),
        "--out",
        str(out),
        "--no-progress",
        "--no-report",
        *flags,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "sweep_pendulum.toml"
    path.write_text(SPEC_TOML)
    path.with_name("sweep_scara_devices.toml").write_text(SCARA_TOML)
    return path


@pytest.fixture(scope="module")
def background(spec_file, tmp_path_factory):
    """Start the 4-device runs now; tests collect them with ``_finish``. (The two-process run starts after the
    reference: see :func:`reference`.)"""
    root = tmp_path_factory.mktemp("background")
    jobs = {}
    jobs["devices4"] = [
        subprocess.Popen(
            _cli(spec_file, root / "devices4"),
            env=_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    ]
    jobs["scara4"] = [
        subprocess.Popen(
            _cli(spec_file.with_name("sweep_scara_devices.toml"), root / "scara4"),
            env=_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    ]
    yield root, jobs
    for procs in jobs.values():
        for p in procs:
            if p.poll() is None:
                p.kill()


def _start_two_processes(spec_file, root, jobs):
    """The two-process run (each process one device, chunks of 64: the reference's programs)."""
    port = _free_port()
    jobs["processes2"] = [
        subprocess.Popen(
            _cli(
                spec_file,
                root / "processes2",
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ),
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _finish(procs) -> list[str]:
    outputs = []
    for p in procs:
        try:
            output, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a sweep subprocess did not finish within the time limit")
        assert p.returncode == 0, output
        outputs.append(output)
    return outputs


@pytest.fixture(scope="module")
def reference(background, spec_file, tmp_path_factory):
    """The sweep in this process on one device, chunks of 64.

    The two-process run starts only once this one has finished: each of its processes runs this same chunk
    program (one device, chunks of 64) and the same trajectory programs, which it then reads from the suite's
    persistent compilation cache instead of compiling them again (started together with this run, three
    processes compiled the same programs at once: ~20 CPU-s more)."""
    out = tmp_path_factory.mktemp("reference")
    summary = sweep.run(SPEC, out=out, devices=1, progress=False)
    assert summary.complete and summary.scenarios_written == TOTAL
    _start_two_processes(spec_file, *background)
    return out, sweep.load(out)


def assert_same_table(a, b):
    """Same columns, same rows; numbers equal to 1e-12 of max(1, the column's largest finite magnitude), NaN
    where the other has NaN."""
    assert a.column_names == b.column_names
    assert a.num_rows == b.num_rows
    for name in a.column_names:
        x, y = a.column(name).to_numpy(zero_copy_only=False), b.column(name).to_numpy(zero_copy_only=False)
        if np.issubdtype(x.dtype, np.number):
            finite = np.abs(x[np.isfinite(x)])
            scale = max(finite.max() if finite.size else 0.0, 1.0)
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-12 * scale, equal_nan=True, err_msg=name)
        else:
            assert list(x) == list(y), name


# ---------------------------------------------------------------------------------------- bad specs
BAD = [
    ({"vary": {"params.nope": {"dist": "normal", "std": 1.0}}}, "vary.params.nope", "unknown leaf 'nope'"),
    (
        {"vary": {"params.mass": {"dist": "normal", "std": -1.0}}},
        "vary.params.mass.std",
        "must not be negative",
    ),
    ({"scenarios": 0}, "scenarios", "must be >= 1"),
    ({"scenarios": -5}, "scenarios", "must be >= 1"),
    ({"model": "no_such_model"}, "model", "unknown model 'no_such_model'"),
    ({"model": "sweep_models:nothing"}, "model", "has no attribute 'nothing'"),
    ({"vary": {"q0[5]": {"dist": "normal", "std": 1.0}}}, "vary.q0[5]", "out of range"),
    ({"vary": {"params.g": {"dist": "gamma"}}}, "vary.params.g.dist", "unknown distribution 'gamma'"),
    ({"integrator": {"t1": 1.0, "method": "lu"}}, "integrator.method", "unknown method 'lu'"),
    ({"integrator": {"t1": 1.0, "constraint_atol": -1e-6}}, "integrator.constraint_atol", "must be positive"),
    (
        {"vary": {"integrator.dt": {"dist": "normal", "std": 0.1}}},
        "vary.integrator.dt",
        "only vary on a grid",
    ),
]


@pytest.mark.parametrize(("change", "field", "message"), BAD, ids=[b[1] + ":" + b[2][:12] for b in BAD])
def test_bad_spec_is_refused_before_compiling(change, field, message, tmp_path, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled a sweep whose spec is invalid")

    monkeypatch.setattr(_run, "chunk_function", no_compile)
    change = dict(change)
    spec = {**SPEC, "vary": {**SPEC["vary"], **change.pop("vary", {})}, **change}
    with pytest.raises(ValueError) as info:
        sweep.run(spec, out=tmp_path / "out", progress=False)
    assert f"spec field {field}" in str(info.value) and message in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists()


def test_bad_spec_on_the_command_line_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(SPEC_TOML.replace("scenarios = 100", "scenarios = 0"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "spec field scenarios" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- what is drawn
def test_draws_follow_their_distributions(reference):
    """Sample statistics against the spec: bounds exactly, moments within 4 standard errors."""
    _, table = reference
    col = lambda name: table.column(name).to_numpy(zero_copy_only=False)
    replicate = col("replicate")
    first = (col("params.alpha") == 2.0) & (
        col("integrator.dt") == 0.02
    )  # one grid cell: 128 independent draws
    n = first.sum()
    assert n == 100 and sorted(replicate[first]) == list(range(100))
    names = ("params.mass", "params.g", "params.beta", "params.length", "q0[0]", "qd0[1]")
    mass, g, beta, length, x0, v0 = (col(c)[first] for c in names)
    assert mass.min() >= -0.2 and mass.max() <= 2.0
    assert abs(mass.mean() - 0.9) < 4 * (2.2 / math.sqrt(12)) / math.sqrt(n)
    log_g = np.log(g / 9.81)
    assert abs(log_g.mean()) < 4 * 0.1 / math.sqrt(n) and 0.07 < log_g.std() < 0.13
    assert set(beta) <= {4.0, 6.0} and abs(np.mean(beta == 6.0) - 0.75) < 4 * math.sqrt(0.75 * 0.25 / n)
    assert (
        length.min() >= 0.95 and length.max() <= 1.05 and abs(length.mean() - 1) < 4 * 0.05 / math.sqrt(3 * n)
    )
    offset = x0 - length  # normal about the initial state of the drawn length
    assert abs(offset.mean()) < 4 * 0.01 / math.sqrt(n) and 0.007 < offset.std() < 0.013
    assert v0.min() >= -0.1 and v0.max() <= 0.1 and abs(v0.mean()) < 4 * 0.2 / math.sqrt(12 * n)
    # grid: each cell holds the same 100 draws (common random numbers), in every integrator sub-sweep
    for cell in ((2.0, 0.05), (5.0, 0.02), (5.0, 0.05)):
        other = (col("params.alpha") == cell[0]) & (col("integrator.dt") == cell[1])
        assert other.sum() == 100
        np.testing.assert_array_equal(col("params.mass")[other], mass)
        np.testing.assert_array_equal(col("q0[0]")[other], x0)
    np.testing.assert_array_equal(col("index"), np.arange(TOTAL))


def test_rows_match_an_independent_simulation(reference):
    """Scenario k's metrics equal ukjax.simulate run on the sampled values read back from the table."""
    out, table = reference
    rows = table.to_pylist()
    model = sweep.load_model("sweep_models:pendulum")  # the sweep's System object: its compiled programs
    system, params, initial_state = model.system, model.params, model.initial_state
    for k in (0, 300, 399):
        row = rows[k]
        p = {
            name: jnp.asarray(row.get(f"params.{name}", value), jnp.float64) for name, value in params.items()
        }
        q0, qd0 = initial_state(p)
        q0, qd0 = q0.at[0].set(row["q0[0]"]), qd0.at[1].set(row["qd0[1]"])
        sol = ukjax.simulate(
            system,
            q0,
            qd0,
            p,
            t1=1.0,
            ts=jnp.linspace(0.0, 1.0, 11),
            dt=row["integrator.dt"],
            solver=__import__("diffrax").Heun(),
            max_steps=60,
            constraint_rtol=1.0,
            constraint_atol=1e-3,
        )
        assert int(sol.status) == row["status"]
        if row["status"] == 0:
            np.testing.assert_allclose(row["max_abs_phi"], np.max(np.abs(sol.position_residual)), rtol=1e-12)
            np.testing.assert_allclose(row["q_final[1]"], sol.q[-1, 1], rtol=1e-12)
            late = np.asarray(sol.ts) >= 0.8
            np.testing.assert_allclose(
                row["tail_abs_phi"], np.max(np.abs(sol.position_residual[late])), rtol=1e-12
            )
            energy = 0.5 * p["mass"] * np.sum(sol.qd**2, axis=1) + p["mass"] * p["g"] * sol.q[:, 1]
            np.testing.assert_allclose(row["energy_drift"], np.max(np.abs(energy - energy[0])), rtol=1e-10)
    # rerun by index gives the same inputs and trajectories
    again = sweep.rerun(out, [300])[0]
    assert float(again.params["mass"]) == rows[300]["params.mass"]
    np.testing.assert_allclose(again.solution.q[-1, 1], rows[300]["q_final[1]"], rtol=1e-12)
    saved = np.load(out / "trajectories.npz")
    assert list(saved["index"]) == [3, 300] and saved["q"].shape == (2, 11, 2)
    np.testing.assert_allclose(saved["q"][1], again.solution.q, rtol=1e-12)


# ---------------------------------------------------------------------------------------- invariance
def test_same_table_for_chunks_of_64_and_256(reference, tmp_path):
    _, table = reference
    compiled = len(_run._COMPILED)
    summary = sweep.run({**SPEC, "chunk_size": 256}, out=tmp_path, devices=1, progress=False)
    assert summary.chunks_total == 2
    assert len(_run._COMPILED) == compiled + 1  # the two dt sub-sweeps share one program (dt is traced)
    assert_same_table(sweep.load(tmp_path), table)


def test_times_as_program_constants_and_the_fused_engine_give_the_same_table(
    reference, tmp_path, monkeypatch
):
    """Where a sweep compiles its times into its chunk program (on a GPU, so that simulate_batch's "auto"
    picks the fused kernel there; here forced on the CPU, the kernel in interpret mode), each dt of the grid
    gets its own program and the table is the traced-times XLA one. (The chunk program runs under shard_map,
    whose placement annotations in the right-hand side once kept the fused kernel out of every sweep.)"""
    _, table = reference
    monkeypatch.setattr(_run, "HOST_TIME_PLATFORMS", ("cpu",))
    monkeypatch.setattr(_run, "simulate_batch", functools.partial(ukjax.simulate_batch, engine="fused"))
    spec = sweep.load_spec(SPEC)
    plan = _run.Plan.from_spec(spec, 64)
    assert [_run.host_times(spec, plan, s) for s in range(2)] == [(0.0, 1.0, 0.02), (0.0, 1.0, 0.05)]
    compiled = len(_run._COMPILED)
    summary = sweep.run(SPEC, out=tmp_path, devices=1, progress=False)
    assert summary.complete
    assert len(_run._COMPILED) == compiled + 2  # one program per dt: the times are constants of each
    assert_same_table(sweep.load(tmp_path), table)


def test_the_scara_chunk_program_admits_the_fused_engine(monkeypatch):
    """The shipped SCARA's right-hand side, traced inside a sweep's chunk program (shard_map), holds only
    primitives the fused kernel evaluates (a placement annotation, reshard, kept it out before): with its
    times on the step grid and compiled in, "auto" would run it on a GPU. Traced only, not compiled."""
    from ukjax import simulation

    vary = {k: v for k, v in SCARA["vary"].items() if k != "integrator.method"}
    integrator = {**SCARA["integrator"], "t1": 0.05, "max_steps": 11, "num_saves": 11}  # 1 step per save
    spec = sweep.load_spec({**SCARA, "integrator": integrator, "vary": vary})
    monkeypatch.setattr(_run, "HOST_TIME_PLATFORMS", ("cpu",))
    seen, real = [], simulation._fused_steps

    def probe(engine, *args):
        seen.append(real("fused", *args))  # raises, with the reason, where the kernel cannot run it
        return real(engine, *args)

    monkeypatch.setattr(simulation, "_fused_steps", probe)
    plan = _run.Plan.from_spec(spec, 32)
    numbers = _run._numbers(_run.integrator_options(spec, plan, 0)[1], jnp.float64)
    _run._lower(spec, plan, sweep.load_model(spec.model), 0, _run._local_mesh(1), {}, numbers)
    assert seen == [(0, 1)]  # (steps to the first save, steps between saves)


def test_same_table_on_4_devices(reference, background):
    root, jobs = background
    (output,) = _finish(jobs["devices4"])
    assert "on 4 cpu device(s)" in output
    assert_same_table(sweep.load(root / "devices4"), reference[1])


def test_same_table_from_two_processes(reference, background):
    root, jobs = background
    outputs = _finish(jobs["processes2"])
    assert "process 1 of 2" in outputs[0]
    manifest = json.loads((root / "processes2" / "manifest.json").read_text())
    assert manifest["runs"][-1]["processes"] == 2 and manifest["runs"][-1]["chunks_written_by_process_0"] == 4
    assert_same_table(sweep.load(root / "processes2"), reference[1])


def test_scara_same_table_on_4_devices(background, tmp_path):
    """The SCARA sweep finishes on 4 simulated CPU devices (a subprocess under TIMEOUT: a hang fails the
    test) with the table of one device.

    Sub-sweep 0 (Cholesky form, the default) calls no LAPACK kernel and runs sharded over the 4 devices; its
    rows equal a one-device run in this process (tolerance of assert_same_table). Sub-sweep 1 (reference
    form, SVD pseudoinverse) calls batched LAPACK kernels, which can deadlock when several CPU devices run
    them at once (jaxlib 0.10; ukjax/sweep/_run.py), so the sweep runs it on one device and says so; its rows
    equal the Cholesky rows to 1e-10 of max(1, the column's magnitude) (two forms of the UK equation: they
    agree here to 4e-14, the rest is room for rounding).

    Against the code that hung (Solution.consistency by an SVD at every saved time, commit 0534cb2) this
    4-device run sat idle in jax::ParallelBatchMap (benchmarks/results/sweep-hang-stacks.txt, run 2)."""
    root, jobs = background
    (output,) = _finish(jobs["scara4"])
    assert "on 4 cpu device(s)" in output and "running it on one CPU device" in output, output
    manifest = json.loads((root / "scara4" / "manifest.json").read_text())
    one_device = manifest["runs"][-1]["one_device_subsweeps"]
    assert list(one_device) == ["1"] and "lapack_dgesdd_ffi" in one_device["1"], one_device
    four = sweep.load(root / "scara4")
    method = np.array(four.column("integrator.method").to_pylist())
    assert list(method) == ["cholesky"] * 32 + ["svd"] * 32
    # every scenario ran to t1 (the SCARA starts off its constraints; in 0.25 s |φ| has not settled below the
    # default constraint_rtol, so most report constraint_violated: a completed run, metrics kept)
    assert set(four.column("status_name").to_pylist()) <= {"success", "constraint_violated"}

    cholesky_only = {
        **SCARA,
        "integrator": {**SCARA["integrator"], "method": "cholesky"},
        "vary": {k: v for k, v in SCARA["vary"].items() if k != "integrator.method"},
    }
    summary = sweep.run(cholesky_only, out=tmp_path, devices=1, progress=False)
    assert summary.complete and summary.scenarios_written == 32
    first = four.filter(method == "cholesky").drop_columns(["integrator.method"])
    assert_same_table(first, sweep.load(tmp_path))

    svd = four.filter(method == "svd")
    for name in first.column_names:
        x = first.column(name).to_numpy(zero_copy_only=False)
        y = svd.column(name).to_numpy(zero_copy_only=False)
        if name == "index":
            np.testing.assert_array_equal(y, x + 32)
        elif np.issubdtype(x.dtype, np.floating):
            assert np.all(np.isfinite(x)), name
            np.testing.assert_allclose(y, x, rtol=0, atol=1e-10 * max(np.abs(x).max(), 1.0), err_msg=name)


@pytest.mark.parametrize("atol", [None, 2.5e-4])
def test_status_tolerances_reach_the_simulation(atol, monkeypatch):
    """The spec's constraint_atol and constraint_rtol are the ones simulate_batch is called with."""
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop before simulating")

    monkeypatch.setattr(_run, "simulate_batch", spy)
    integrator = {**SPEC["integrator"], "constraint_rtol": 0.0, "constraint_atol": atol}
    if atol is None:
        del integrator["constraint_atol"]
    spec = _run.load_spec({**SPEC, "integrator": integrator})
    static, numbers = _run.integrator_options(spec, _run.Plan.from_spec(spec, 64), 0)
    with pytest.raises(RuntimeError, match="stop before simulating"):
        model = types.SimpleNamespace(system=None)
        _run._simulate(model, static, _run._numbers(numbers, jnp.float64), 0, 0, 0)
    assert float(seen["constraint_rtol"]) == 0.0
    assert (seen["constraint_atol"] is None) if atol is None else float(seen["constraint_atol"]) == atol


def test_lapack_calls_are_found_in_the_lowered_program():
    """The check behind the one-device fallback: jaxlib's LAPACK custom calls in the lowered program, and
    only on several CPU devices."""
    x = jnp.eye(3)
    assert lapack_calls(jax.jit(jnp.linalg.svd).lower(x)) == {"lapack_dgesdd_ffi"}
    assert lapack_calls(jax.jit(jnp.linalg.eigh).lower(x)) == {"lapack_dsyevd_ffi"}
    assert lapack_calls(jax.jit(lambda a: a @ a).lower(x)) == set()
    one = _run._local_mesh(1)
    assert not blocks_on_cpu_pool(one.devices.flat, {"lapack_dgesdd_ffi"})


def test_killed_run_resumes_to_the_same_table(reference, spec_file, tmp_path):
    """SIGKILL mid-run: every chunk file left is complete, and resuming computes only the missing chunks.

    The killed run is the reference's spec (chunks of 64: 64, 64, 64 and a padded 8 per sub-sweep), so the
    resume in this process reuses the reference's compiled function."""
    out = tmp_path / "killed"
    chunks = out / "chunks"
    proc = subprocess.Popen(
        _cli(spec_file, out), env=_env(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + TIMEOUT
    try:
        while not (chunks.is_dir() and any(chunks.glob("*.parquet"))):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no chunk written within the time limit"
            time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    done = sorted(chunks.glob("*.parquet"))
    assert 0 < len(done) < 8, "the kill did not land mid-run"
    for path in done:  # complete files only: each reads, with whole chunks of rows
        assert pq.read_table(path).num_rows in (64, 8)
    summary = sweep.run(SPEC, out=out, progress=False)
    assert summary.chunks_written == 8 - len(done) and summary.compile_s < 1.0
    assert not list(chunks.glob("*.tmp-*"))
    assert_same_table(sweep.load(out), reference[1])


# ---------------------------------------------------------------------------------------- report, command
def test_report_quantiles_and_failures(reference):
    out, table = reference
    result = sweep.report(out, quiet=True)
    status = table.column("status").to_numpy()
    mass = table.column("params.mass").to_numpy()
    # the failures are exactly the scenarios with a mass matrix that is not positive definite
    failing = np.flatnonzero(status != 0)
    np.testing.assert_array_equal(failing, np.flatnonzero(mass <= 0))
    listed = [i for f in result["failures_by_status"].values() for i in f["indices"]]
    assert sorted(listed) == failing.tolist()[: len(listed)] and result["succeeded"] == TOTAL - failing.size
    phi = table.column("max_abs_phi").to_numpy()[status == 0]
    q = result["quantiles_over_successful_scenarios"]["max_abs_phi"]
    np.testing.assert_allclose(
        [q["q50"], q["q95"], q["q100"]], np.quantile(phi, [0.5, 0.95, 1.0]), rtol=1e-12
    )
    for figure in result["figures"]:
        assert (out / "report" / figure).stat().st_size > 1000
    assert {"histograms.png", "scatter_max_abs_phi.png"} <= set(result["figures"])
    assert len(result["groups"]) == 2 * 2 * 2  # alpha x beta x dt cells


def test_command_resumes_reports_and_refuses_another_sweep(reference, spec_file, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["sweep", str(spec_file), "--out", str(out), "--no-progress", "--no-report"]) == 0
    assert_same_table(sweep.load(out), reference[1])
    assert main(["sweep", str(spec_file), "--out", str(out), "--no-progress", "--no-report"]) == 0
    assert "8 chunks done before" in capsys.readouterr().out
    with pytest.raises(ValueError, match="holds a different sweep"):
        sweep.run({**SPEC, "seed": 8}, out=out, progress=False)
    assert main(["sweep", "--report", str(out)]) == 0
    assert "scenarios succeeded" in capsys.readouterr().out and (out / "report" / "report.json").is_file()
    assert main(["sweep", "--report", str(tmp_path / "nothing")]) == 2


SHIPPED = ("coordinated_robots", "five_bar", "scara")


def test_shipped_specs_are_package_data_and_valid():
    """Every spec in ukjax/sweep/specs/ is declared package data (pyproject.toml), resolves by name through
    importlib.resources, parses, and names leaves its model has (no compile)."""
    import importlib.resources

    from ukjax.sweep._spec import nominal_shapes

    assert tuple(sweep.shipped_specs()) == SHIPPED
    folder = importlib.resources.files("ukjax.sweep").joinpath("specs")
    files = {f.name for f in folder.iterdir() if f.name.endswith(".toml")}
    assert files == {f"{name}.toml" for name in SHIPPED}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "ukjax" / "sweep"
    packaged = {p.name for pattern in declared["ukjax.sweep"] for p in package.glob(pattern)}
    assert files <= packaged, f"not declared as package data in pyproject.toml: {files - packaged}"
    for name, description in sweep.shipped_specs().items():
        assert description, f"shipped spec {name} has no description for `ukjax sweep --list`"
        spec = sweep.load_spec(name)
        assert spec.name == name and spec.out == f"ukjax-results/sweep_{name}"
        assert spec.source == sweep.load_spec(str(folder.joinpath(f"{name}.toml"))).source  # name = path
        nominal_shapes(sweep.load_model(spec.model), spec)


def test_spec_names_and_paths_resolve(tmp_path, monkeypatch, capsys):
    """A bare name is a shipped spec, a path is a file (an existing file wins over a name); an unknown name
    or a missing file is refused listing the shipped names, through the command's one error line."""
    monkeypatch.chdir(tmp_path)
    shipped = "coordinated_robots, five_bar, scara"
    with pytest.raises(ValueError) as info:
        sweep.load_spec("scar")
    assert str(info.value) == f"unknown sweep spec 'scar': not a shipped spec ({shipped}) nor a file"
    with pytest.raises(ValueError) as info:
        sweep.load_spec("nowhere/scara.toml")
    assert str(info.value) == (
        f"sweep spec 'nowhere/scara.toml' is not a file (shipped specs, by name: {shipped})"
    )
    (tmp_path / "scara").write_text(SPEC_TOML)  # a file of a shipped spec's name, given as a path: the file
    assert sweep.load_spec("scara").name == "pendulum"
    assert sweep.load_spec(Path("scara")).name == "pendulum"
    (tmp_path / "scara").unlink()
    (tmp_path / "scara").mkdir()  # a folder (of results, say) does not hide the shipped spec
    assert sweep.load_spec("scara").model == "scara"
    assert main(["sweep", "no_such_spec"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "ukjax: error: unknown sweep spec 'no_such_spec': not a shipped spec (coordinated_robots, five_bar, "
        "scara) nor a file"
    )
    assert main(["sweep", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[:3]] == list(SHIPPED)
    assert listed[3].startswith("files: ") and str(ROOT / "ukjax" / "sweep" / "specs") in listed[3]
    assert main(["list"]) == 0
    assert "sweep specs (ukjax sweep NAME):\n" + "\n".join(listed) in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_files_run(name, tmp_path):
    spec = sweep.load_spec(name, scenarios=4, chunk_size=4)
    summary = sweep.run(spec, out=tmp_path, progress=False)
    assert summary.complete
    assert sweep.load(tmp_path).num_rows == summary.scenarios_total
    sweep.report(tmp_path, quiet=True)
