"""Non-finite input never hangs or stalls a public function that can reach LAPACK (issue 39).

LAPACK's SVD never returned on a 3 x 3 matrix holding one inf (``jnp.linalg.svd`` of [[inf, 2, 3], [4, 5, 6],
[7, 8, 9]], jax 0.10.2), so every path to an SVD or eigensolver screens its input first (``ukjax.linalg``,
"Non-finite input"). This file runs each public linear-algebra, dynamics and control function that can reach
a factorization on NaN and on inf input, in one subprocess under a time limit (a regression fails instead of
hanging the suite), and checks the documented result: all NaN, rank -1 under jit, or the documented error.

Each case runs first on NaN (compile and run), then on inf with the program compiled, and the inf run must
return within ``RUN_LIMIT_S``: a stall like the 38 s that ``pinv`` once took fails even when it ends.
pinv's LAPACK-free methods (no SVD to hang) are checked on NaN and inf in
``tests/test_linalg.py::test_non_finite_input_gives_all_nan``; here pinv runs with the SVD, directly and
under the reference UK form, the KKT form and the controls. Runtime: ~25-45 s on a loaded 2-core machine
(the subprocess's compiles).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_LIMIT_S = 10.0
TOTAL_LIMIT_S = 400

CHILD = r"""
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
import jax.numpy as jnp
import numpy as np
import ukjax
from ukjax import control, linalg
from ukjax.constraints import Holonomic
from ukjax.system import System

def matrix(bad):  # the matrix whose SVD never returned, with ``bad`` in its first entry
    A = np.arange(1.0, 10.0).reshape(3, 3)
    A[0, 0] = bad
    return A

def spd(bad, i=0, k=0):
    M = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])
    M[i, k] = M[k, i] = bad
    return M

Q, A, b = np.ones(3), np.array([[1.0, 2.0, 3.0]]), np.ones(1)
SYSTEM = System(
    mass=lambda q, t, p: p["m"] * jnp.eye(3),
    force=lambda q, qd, t, p: -q,
    n=3,
    constraints=(Holonomic(lambda q, t, p: (q[0] - q[1])[None], name="passive"),),
    actuation=lambda q, t, p: jnp.eye(3)[:, 1:],
    servo_constraints=(Holonomic(lambda q, t, p: (q[2] - jnp.sin(t))[None], name="servo"),),
)
q0, t0 = jnp.array([0.1, 0.1, 0.2]), jnp.asarray(0.3)

def system_case(fn):
    return lambda bad: fn(SYSTEM, q0, 0.5 * q0, t0, {"m": jnp.asarray(bad)})

def uk(method, **where):
    M_, Q_, A_ = where.get("M", False), where.get("Q", False), where.get("A", False)
    return lambda bad: ukjax.uk_acceleration(spd(bad) if M_ else spd(1.0), np.where(Q_, bad, Q),
                                             np.where(A_, bad, A), b, method=method)

controllability = lambda bad: control.servo_controllability(matrix(bad), Q)

CASES = {
    "pinv/svd": lambda bad: linalg.pinv(matrix(bad)),
    "pinv/jit_vmap": lambda bad: jax.jit(jax.vmap(linalg.pinv))(jnp.stack([matrix(bad), np.eye(3)]))[0],
    "psd_pinv": lambda bad: linalg.psd_pinv(spd(bad)),
    "psd_ginv": lambda bad: linalg.psd_ginv(spd(bad, 0, 1)),
    "matrix_rank": lambda bad: linalg.matrix_rank(matrix(bad)),
    "matrix_rank/jit": lambda bad: jax.jit(linalg.matrix_rank)(matrix(bad)),
    "constraint_consistency": lambda bad: ukjax.constraint_consistency(matrix(bad), np.ones(3)),
    "uk/cholesky/M": uk("cholesky", M=True),
    "uk/ldl/M": uk("ldl", M=True),
    "uk/ldl/A": uk("ldl", A=True),
    "uk/svd/M": uk("svd", M=True),
    "uk/svd/Q": uk("svd", Q=True),
    "uk/greville/A": uk("greville", A=True),
    "uk_constraint_force/svd/M": lambda bad: ukjax.uk_constraint_force(spd(bad, 1, 2), Q, A, b,
                                                                       method="svd").ideal,
    "uk/check": lambda bad: ukjax.uk_acceleration(spd(bad), Q, A, b, check=True),
    "kkt_acceleration": lambda bad: ukjax.kkt_acceleration(spd(bad), Q, A, b)[0],
    "singular_mass/falco": lambda bad: ukjax.singular_mass_acceleration(spd(bad), Q, A, b),
    "singular_mass/phohomsiri": lambda bad: ukjax.singular_mass_acceleration(spd(1.0), Q, A, np.full(1, bad),
                                                                              form="phohomsiri"),
    "recursive_uk_acceleration": lambda bad: ukjax.recursive_uk_acceleration(spd(bad), Q, [(A, b)]),
    "servo_controllability/residual": lambda bad: controllability(bad).residual,
    "servo_controllability/rank": lambda bad: controllability(bad).rank,
    "servo_controllability/feasible": lambda bad: controllability(bad).feasible,
    "constraint_following_control/svd": lambda bad: control.constraint_following_control(matrix(bad), Q),
    "constraint_following_control/householder/r": lambda bad: control.constraint_following_control(
        np.eye(3), np.full(3, bad), pinv_method="householder"),
    "servo_control": system_case(control.servo_control),
    "closed_loop_acceleration": system_case(lambda *a: control.closed_loop_acceleration(*a).qdd),
    "controllability/rank": system_case(lambda *a: control.controllability(*a).rank),
}

def summary(value):
    x = np.asarray(value)
    if x.dtype == bool or np.issubdtype(x.dtype, np.integer):
        return x.tolist()
    return "nan" if np.isnan(x).all() else x.tolist()

only = sys.argv[1:]
print(json.dumps({"cases": [name for name in CASES if not only or name in only]}), flush=True)
for name, fn in CASES.items():
    if only and name not in only:
        continue
    for bad in (float("nan"), float("inf")):
        print(json.dumps({"start": name, "bad": repr(bad)}), flush=True)
        start = time.perf_counter()
        try:
            out = summary(fn(bad))
        except Exception as error:
            out = f"{type(error).__name__}: {error}"
        print(json.dumps({"case": name, "bad": repr(bad), "out": out, "s": time.perf_counter() - start}),
              flush=True)
"""

NAN = "nan"
EXPECTED = {
    "matrix_rank": "ValueError: matrix_rank: A has a NaN or inf entry",
    "matrix_rank/jit": -1,
    "uk/check": "ValueError: uk_acceleration: an input (M, Q, A, b or c) has a NaN or inf entry",
    "servo_controllability/rank": -1,
    "servo_controllability/feasible": False,
    "controllability/rank": -1,
}


def _run_child(*only):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *only], capture_output=True, text=True,
                              timeout=TOTAL_LIMIT_S, cwd=root, env=env)
    except subprocess.TimeoutExpired as timeout:
        out = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
        started = [json.loads(line) for line in out.splitlines() if line.startswith('{"start"')]
        last = started[-1] if started else None
        pytest.fail(f"no return within {TOTAL_LIMIT_S} s; the case running then: {last}")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines[0]["cases"], [line for line in lines if "case" in line]


@pytest.fixture(scope="module")
def results():
    return _run_child()


def test_every_case_ran(results):
    names, results = results
    assert len(names) == 27
    assert [(r["case"], r["bad"]) for r in results] == [(n, bad) for n in names for bad in ("nan", "inf")]


def test_nonfinite_input_gives_the_documented_result(results):
    wrong = []
    for r in results[1]:
        expected = EXPECTED.get(r["case"], NAN)
        if isinstance(expected, str) and expected != NAN:
            ok = isinstance(r["out"], str) and r["out"].startswith(expected)
        else:
            ok = r["out"] == expected
        if not ok:
            wrong.append(f"{r['case']} on {r['bad']}: got {str(r['out'])[:200]}, expected {expected}")
    assert not wrong, "\n".join(wrong)


def test_nonfinite_input_returns_at_once(results):
    """The inf run of every case reuses the NaN run's compiled program: it must not stall in a
    factorization (pinv of a matrix holding inf once took 38 s to return NaN)."""
    slow = [f"{r['case']}: {r['s']:.1f} s" for r in results[1] if r["bad"] == "inf" and r["s"] > RUN_LIMIT_S]
    assert not slow, slow
