"""Accuracy and speed of ukjax's generalized-inverse algorithms (seed 004, de Falco, Pennestri & Vita).

For the sizes of seed 004 Table 6 (m x n = 2 x 3, 15 x 18, 19 x 28) and the 12 x 12 rank-11 case of its
five-bar linkage, on a batch of random matrices (singular values in [0.5, 2], the rank-deficient case with one
zero singular value), every method of ``ukjax.PINV_METHODS`` is run as ``jax.jit(jax.vmap(pinv))`` and
compared with ``numpy.linalg.pinv`` called in a Python loop (the baseline) in the same run. Reported:

- the four Penrose residuals (seed 004 eq. 1a-1d), max abs over the batch;
- the relative error max|A⁺ - A⁺_ref| / max|A⁺_ref| against NumPy's float64 SVD pinv (same rtol);
- compile time, and time per matrix of the batched call (median of ``--repeats``, ``block_until_ready``);
- the speed-up over the NumPy loop; also ``jnp.linalg.pinv`` (vmapped) and NumPy's own stacked call.

    python3 benchmarks/pinv_methods.py                        # float64, batch 1024
    python3 benchmarks/pinv_methods.py --dtype float32 --out benchmarks/results/pinv_methods_f32.json
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

import ukjax  # noqa: E402
from ukjax.linalg import default_rtol  # noqa: E402

ukjax.enable_float64()

CASES = [  # (label, m, n, rank)
    ("2x3", 2, 3, 2),
    ("15x18", 15, 18, 15),
    ("19x28", 19, 28, 19),
    ("12x12 rank 11", 12, 12, 11),
]


def random_batch(rng, batch, m, n, rank):
    """``batch`` matrices U diag(s) Vᵀ of the given rank, s uniform in [0.5, 2] (condition number ≤ 4)."""
    U = np.linalg.qr(rng.normal(size=(batch, m, rank)))[0]
    V = np.linalg.qr(rng.normal(size=(batch, n, rank)))[0]
    s = rng.uniform(0.5, 2.0, size=(batch, 1, rank))
    return (U * s) @ np.swapaxes(V, 1, 2)


def penrose_residuals(A, P):
    """Max-abs residuals of eq. 1a-1d over the batch, in float64."""
    A, P = A.astype(np.float64), P.astype(np.float64)
    AP, PA = A @ P, P @ A
    return [float(np.max(np.abs(x))) for x in
            (np.swapaxes(AP, 1, 2) - AP, np.swapaxes(PA, 1, 2) - PA, AP @ A - A, PA @ P - P)]


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_jax(fn, X, repeats):
    """Compile time and median run time of a jitted function of the batch X."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(X).compile()
    compile_s = time.perf_counter() - start
    out = np.asarray(compiled(X))
    return out, compile_s, median_time(lambda: compiled(X), repeats)


def run_case(label, m, n, rank, args, rng):
    dtype = jnp.dtype(args.dtype)
    A64 = random_batch(rng, args.batch, m, n, rank)
    A = A64.astype(dtype)
    rtol = default_rtol((m, n), dtype)
    reference = np.linalg.pinv(A.astype(np.float64), rtol=rtol)
    ref_scale = np.max(np.abs(reference), axis=(1, 2))

    loop_s = median_time(lambda: [np.linalg.pinv(a, rtol=rtol) for a in A], max(1, args.repeats // 2))
    stacked_s = median_time(lambda: np.linalg.pinv(A, rtol=rtol), args.repeats)
    per_loop = loop_s / args.batch
    rows = [{"case": label, "m": m, "n": n, "rank": rank, "method": "numpy loop (baseline)",
             "compile_s": 0.0, "us_per_matrix": 1e6 * per_loop, "speedup_vs_numpy_loop": 1.0},
            {"case": label, "m": m, "n": n, "rank": rank, "method": "numpy stacked",
             "compile_s": 0.0, "us_per_matrix": 1e6 * stacked_s / args.batch,
             "speedup_vs_numpy_loop": loop_s / stacked_s}]

    contenders = [(method, jax.vmap(functools.partial(ukjax.pinv, method=method, rtol=rtol)))
                  for method in args.methods]
    contenders.append(("jnp.linalg.pinv", jax.vmap(lambda a: jnp.linalg.pinv(a, rtol=rtol))))
    Aj = jnp.asarray(A)
    for name, fn in contenders:
        P, compile_s, run_s = measure_jax(fn, Aj, args.repeats)
        err = np.max(np.max(np.abs(P.astype(np.float64) - reference), axis=(1, 2)) / ref_scale)
        rows.append({"case": label, "m": m, "n": n, "rank": rank, "method": name, "compile_s": compile_s,
                     "us_per_matrix": 1e6 * run_s / args.batch, "speedup_vs_numpy_loop": loop_s / run_s,
                     "rel_err_vs_numpy_f64": float(err), "penrose_1a_1d": penrose_residuals(A, P)})
    return rows


def print_table(rows):
    header = (f"{'case':14s} {'method':22s} {'compile s':>9s} {'us/matrix':>10s} {'x numpy':>8s} "
              f"{'rel err':>9s}  {'Penrose 1a, 1b, 1c, 1d (max abs)':s}")
    print(header)
    print("-" * len(header))
    for r in rows:
        err = f"{r['rel_err_vs_numpy_f64']:9.1e}" if "rel_err_vs_numpy_f64" in r else f"{'':9s}"
        pen = " ".join(f"{x:7.1e}" for x in r.get("penrose_1a_1d", []))
        print(f"{r['case']:14s} {r['method']:22s} {r['compile_s']:9.2f} {r['us_per_matrix']:10.2f} "
              f"{r['speedup_vs_numpy_loop']:8.1f} {err}  {pen}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024, help="matrices per batched call (default 1024)")
    parser.add_argument("--repeats", type=int, default=11, help="timed repeats, the median is reported")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--methods", nargs="+", default=list(ukjax.PINV_METHODS), choices=ukjax.PINV_METHODS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pinv_methods.json")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    rows = []
    for case in CASES:
        rows += run_case(*case, args, rng)
    print_table(rows)
    config = {"batch": args.batch, "repeats": args.repeats, "dtype": args.dtype, "seed": args.seed,
              "methods": args.methods, "rtol": "max(m, n) * eps(dtype)",
              "matrices": "U diag(s) V^T, s ~ U[0.5, 2]; rank-deficient case: one zero singular value",
              "timing": "jax.jit(jax.vmap(pinv)) on the whole batch, median of repeats, per matrix; "
                        "compile = lower + compile"}
    path = write_results(args.out, {"benchmark": "pinv_methods", "config": config, "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
