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


SUITE_FILES = {"environment", "tests", "throughput", "gradient", "sweep", "accuracy", "summary"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-suite")
    # The time shares of --budget-s size a GPU run; here they only guard against a hang. A smoke section's
    # cost is compilation, which a loaded 2-core machine stretches 3x (the gradient section, which compiles
    # both gradient modes, ran past the default 65 + 60 s at load 8), so the budget is generous.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--out", str(out),
         "--budget-s", "2400"],
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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["smoke"] is True and summary["schema"] == 1
    bad = {s: json.loads((out / f"{s}.json").read_text()).get("error") for s in summary["statuses"]}
    assert all(v == "ok" for v in summary["statuses"].values()), {s: e for s, e in bad.items() if e}
    assert done.returncode == 0 and "gpu_suite:" in done.stdout


def test_gpu_suite_smoke_measures_what_a_gpu_run_reports(smoke):
    out, _ = smoke
    read = lambda name: json.loads((out / f"{name}.json").read_text())
    parts = read("throughput")["parts"]
    assert [p["dtype"] for p in parts] == ["float64", "float32"]
    for part in parts:
        contenders = {r["contender"] for r in part["rows"]}
        assert {"ukjax_scara", "ukjax_user_scara", "naive_jax_scara", "ukjax_tree_chain"} <= contenders
        for row in part["rows"]:
            assert row["scenario_steps_per_s"] > 0 and row["finite_fraction"] == 1.0
            assert row["compile_s"] > 0 and row["dtype"] == part["dtype"]
        missing = {"mjx_jax_chain", "mjwarp_chain"} - contenders
        assert all(any(m in e for e in part["errors"]) for m in missing)  # a contender left out says why
    assert set(read("gradient")["grad_over_forward"]) == {"forward", "reverse"}
    assert all(ratio > 0 for ratio in read("gradient")["grad_over_forward"].values())
    sweep = read("sweep")
    assert sweep["complete"] and sweep["scenarios"] == 16
    accuracy = read("accuracy")["parts"]
    assert accuracy[0]["max_abs_q_device_vs_cpu"] == 0.0  # on a CPU-only machine both runs are the CPU's
    # float32 against float64 after 20 fixed steps of 5 ms: round-off, well above 0 and below 1e-3 rad
    assert 0 < accuracy[1]["max_abs_q_float32_cpu_vs_float64_cpu"] < 1e-3
    tests = read("tests")
    assert tests["passed"] >= 1 and tests["failures"] == tests["errors"] == 0
    env = read("environment")
    assert env["environment"]["versions"]["jax"] == jax.__version__ and env["devices"]


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
