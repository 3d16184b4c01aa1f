"""The GPU path, checked without a GPU.

* The SCARA batch of ``ukjax.simulate_batch`` (default solver, method and chunking) is exported for a CUDA
  target with ``jax.export`` (which lowers for any platform on a CPU-only machine): the export must succeed
  (``jax.export`` refuses programs holding host callbacks) and the CUDA program must call no custom kernels
  at all (no CPU LAPACK, no callbacks, no cuSOLVER: the UK solve is fused elementwise code). Positive
  controls show that the same inspection finds an SVD's and a Cholesky's kernels and refuses a callback.
* ``benchmarks/gpu_suite.py --smoke`` runs every section at tiny sizes on the CPU and writes the same JSON
  schema a GPU run writes.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax.models import scara

ROOT = Path(__file__).resolve().parents[1]
CUSTOM_CALL = re.compile(r"custom_call @([\w.$-]+)")


def custom_calls(fn, *args, platform="cuda") -> set[str]:
    text = jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()
    return set(CUSTOM_CALL.findall(text))


def test_scara_batch_export_for_gpu_has_no_callbacks_or_custom_kernels():
    system, p = scara.system(), scara.default_params()
    q0, qd0 = scara.initial_state(p)
    batch = (jnp.tile(q0, (4, 1)), jnp.tile(qd0, (4, 1)))

    def run(q0, qd0, p):
        sol = ukjax.simulate_batch(system, q0, qd0, p, t1=0.02, ts=[0.02], dt=5e-3)
        return sol.q[:, -1], sol.status

    assert custom_calls(run, *batch, p) == set()


def test_export_for_gpu_inspection_finds_kernels_and_refuses_callbacks():
    x = jnp.eye(3) + 0.1
    both = lambda a: jnp.linalg.svd(a, compute_uv=False).sum() + jnp.linalg.cholesky(a).sum()
    found = custom_calls(both, x)
    assert any("gesvd" in name for name in found) and any("potrf" in name for name in found)
    assert any(name.startswith("lapack_") for name in custom_calls(jnp.linalg.cholesky, x, platform="cpu"))

    def with_callback(a):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    with pytest.raises((NotImplementedError, ValueError)):
        custom_calls(with_callback, x)


def test_jax_version_is_reported_against_the_tested_range():
    info = ukjax.jax_version_supported()
    assert info["jax"] == jax.__version__ and ">=" in info["tested_range"]
    assert info["in_range"], f"this jax ({jax.__version__}) is outside ukjax's tested range {info}"


SUITE_FILES = {"summary", "rows", "throughput", "robots", "gradient", "sweep", "accuracy", "tests"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-suite")
    # --budget-s sizes a GPU run's time plan; here it only guards against a hang. A smoke section's cost is
    # compilation, which a loaded 2-core machine stretches 3x, so the plan is generous.
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_suite.py"),
            "--smoke",
            "--out",
            str(out),
            "--budget-s",
            "2400",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=2400,
    )
    return out, done


def test_gpu_suite_smoke_writes_every_section(smoke):
    out, done = smoke
    files = {p.stem for p in out.iterdir()}
    assert files == SUITE_FILES, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(files) <= 8  # what one GPU lease brings back
    summary = json.loads((out / "summary.json").read_text())
    assert summary["smoke"] is True and summary["schema"] == 2
    bad = {s: json.loads((out / f"{s}.json").read_text()).get("error") for s in summary["statuses"]}
    assert all(v == "ok" for v in summary["statuses"].values()), {s: e for s, e in bad.items() if e}
    assert done.returncode == 0 and "gpu_suite:" in done.stdout
    # every measured row is in the log, written as it was measured (a killed worker keeps its rows)
    logged = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    throughput_rows = [
        r for p in json.loads((out / "throughput.json").read_text())["parts"] for r in p["rows"]
    ]
    assert [r for r in logged if r["section"] == "throughput"] == throughput_rows


def test_gpu_suite_smoke_measures_what_a_gpu_run_reports(smoke):
    out, _ = smoke
    read = lambda name: json.loads((out / f"{name}.json").read_text())
    parts = read("throughput")["parts"]
    assert [p["dtype"] for p in parts] == ["float64", "float32"]
    every = {"ukjax_scara", "ukjax_user_scara", "ukjax_user_scara_vmap", "naive_jax_scara"}
    # --smoke's float32 part: the fused kernel's row alone (the XLA contenders' code is the float64 part's);
    # it runs in the suite's jit, where it must not be refused
    float32 = {"ukjax_user_scara_fused"}
    for part, expected in zip(parts, (every, float32), strict=True):
        contenders = {r["contender"] for r in part["rows"]}
        assert expected <= contenders, part.get("errors")
        for row in part["rows"]:
            assert row["scenario_steps_per_s"] > 0 and row["finite_fraction"] == 1.0
            assert row["compile_s"] > 0 and row["dtype"] == part["dtype"]
    (fused,) = [r for r in parts[1]["rows"] if r["contender"] == "ukjax_user_scara_fused"]
    assert fused["max_abs_q_vs_xla_engine"] <= 1e-5  # float32 kernel against float32 XLA: a few ulps of q ~ 1
    robots = read("robots")
    contenders = {r["contender"] for r in robots["rows"]}
    assert {"ukjax_chain4", "ukjax_chain4_scan", "ukjax_arm2"} <= contenders  # the tree, before/after, a URDF
    assert all(r["finite_fraction"] == 1.0 for r in robots["rows"])
    for other in ("mjx_chain4", "mjwarp_chain4"):  # a contender left out says why
        assert other in contenders or any(other in e for e in robots["errors"])
    gradient = read("gradient")
    assert {r["program"] for r in gradient["rows"]} == {"forward", "gradient_forward"}
    assert gradient["grad_over_forward"]["forward"] > 0
    sweep = read("sweep")
    assert sweep["complete"] and sweep["scenarios"] == 16 and sweep["overhead"] > -1
    accuracy = read("accuracy")["parts"]
    assert accuracy[0]["max_abs_q_device_vs_cpu"] == 0.0  # on a CPU-only machine both runs are the CPU's
    # float32 against float64 after 5 fixed steps of 5 ms: round-off, well above 0 and below 1e-3 rad
    assert 0 < accuracy[1]["max_abs_q_float32_cpu_vs_float64_cpu"] < 1e-3
    tests = read("tests")
    assert tests["passed"] >= 1 and tests["failures"] == tests["errors"] == 0 and tests["finished"]
    env = json.loads((out / "summary.json").read_text())["environment"]
    assert env["environment"]["versions"]["jax"] == jax.__version__ and env["devices"]


def test_time_plan_predicts_skips_and_caps():
    """A row whose predicted cost does not fit before the deadline is skipped with a message, a capped
    contender stops at its cap, and a prediction scales the previous row's run time with the batch."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import time

    import gpu_suite

    plan = gpu_suite.Plan(time.time() + 100.0, None, "throughput", "float64")
    assert plan.predict("a", 10, 2) == gpu_suite.FIRST_ROW_S
    plan.record({"compile_s": 5.0, "run_s": 1.0}, "a", 10)
    assert plan.predict("a", 100, 2) == 5.0 + 3 * 10.0
    assert plan.predict("b", 100, 2) == 5.0 + 5.0  # a first row: the slowest compile so far + 5 s
    assert plan.fits("a", 100, 2) and not plan.fits("a", 1000, 2)
    assert "a at 1000: predicted 305 s" in plan.skipped[-1]
    assert plan.capped("naive_jax_scara", 100_000) and not plan.capped("naive_jax_scara", 10_000)
    assert not plan.capped("ukjax_scara", 10**7)


def test_set_and_share_replace_sizes_and_shares(monkeypatch, tmp_path):
    """``--set KEY=JSON`` replaces a problem size (and reaches the workers through the environment),
    ``--share`` a section's time share; a malformed pair, non-JSON value or unknown section is refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import argparse

    import gpu_suite

    monkeypatch.delenv("UKJAX_GPU_SUITE_SET", raising=False)
    parser = argparse.ArgumentParser()
    sets = ["trees=[100000]", 'dtypes={"robots": ["float32"]}', 'test_files=["test_fused.py"]']
    assert gpu_suite._overrides(parser, sets) == {
        "trees": [100000], "dtypes": {"robots": ["float32"]}, "test_files": ["test_fused.py"]
    }  # fmt: skip
    monkeypatch.setenv("UKJAX_GPU_SUITE_SET", '{"trees": [8]}')  # what a worker reads
    assert gpu_suite._overrides(parser, [])["trees"] == [8]
    assert gpu_suite._pairs(parser, ["robots=0.5"]) == {"robots": "0.5"}
    for bad in (["--set", "trees"], ["--set", "trees=[1"], ["--share", "nonsense=0.5"]):
        with pytest.raises(SystemExit):
            gpu_suite.main(["--out", str(tmp_path), "--sections", "environment", *bad])


def test_pytest_outcomes_are_read_as_tests_finish():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_suite

    text = (
        "[gw0] [ 50%] PASSED tests/test_a.py::test_one \n"
        "tests/test_b.py::test_two[x] FAILED    [100%]\n"
        "[gw1] [ 75%] SKIPPED tests/test_c.py::test_three \n"
    )
    assert gpu_suite.outcomes(text) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_b.py::test_two[x]": "FAILED",
        "tests/test_c.py::test_three": "SKIPPED",
    }


def test_user_written_scara_matches_the_closed_form_of_the_paper():
    """benchmarks/user_scara.py against benchmarks/throughput.py's closed form of Xu & Liu 2017 (M eq. 34,
    C q̇ and G eq. 35-36, A and b eq. 49 with the Baumgarte terms of eq. 54) at a perturbed state, term by
    term: the SCARA is fully constrained (rank A = 4 = n), so q̈ alone would not see an error in M or Q."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import throughput
    import user_scara

    rng = np.random.default_rng(3)
    q = np.array([-0.52, 0.96, -0.42, 0.001]) + 0.05 * rng.normal(size=4)
    qd = np.array([-0.157, 0.0001, 0.157, 0.0195]) + 0.1 * rng.normal(size=4)
    M, Q, A, b, _ = throughput.scara_terms(np, q, qd, 0.3, throughput.PAPER)
    p, qj, qdj = user_scara.params(), jnp.asarray(q), jnp.asarray(qd)
    mine = (
        user_scara.mass_matrix(qj, 0.3, p),
        user_scara.forces(qj, qdj, 0.3, p),
        user_scara.constraint_matrix(qj, qdj, 0.3, p),
        user_scara.constraint_rhs(qj, qdj, 0.3, p),
    )
    for name, got, want in zip("M Q A b".split(), mine, (M, Q, A, b), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12, err_msg=name)
