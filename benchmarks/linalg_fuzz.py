"""Fuzz the generalized inverses and the Udwadia-Kalaba forms against NumPy references; count failures.

Random problems (float64 construction): A of m x n, 1 ≤ m, n ≤ 12, exact rank r (0 to full), nonzero singular
values from 1 down to 1/cond (cond = 10^U(0, 6)), overall scale 10^U(-8, 8); a third of the matrices get an
exactly repeated (or scaled) row and a third a near-repeated row (a row plus 1e-12 ‖A‖ times a random vector
of the row space, so that the rank stays r), as in overconstrained mechanisms. Each A is embedded in a 6 x 6
or 12 x 12 zero matrix, so that each method compiles twice (pinv((A 0; 0 0)) = (A⁺ 0; 0 0)). UK problems
(A as above; the padding coordinates are unconstrained) add an SPD mass matrix M of condition 10^U(0, 6), a
force Q and a consistent b = A x (one in four b is inconsistent: b = A x + noise).

References (NumPy, float64, SVD-based with the tolerance of ``matrix_rank``, max(m, n) eps; ``pinv``'s own
default rcond = 1e-15 would keep round-off singular values of the larger matrices):
  pinv: ``np.linalg.pinv(A, rtol=max(m, n) eps)``;
  UK:   q̈ = a + L⁻ᵀ (A L⁻ᵀ)⁺ (b - A a), a = M⁻¹Q, M = L Lᵀ: the minimizer of (q̈ - a)ᵀM(q̈ - a) subject to
        A q̈ = b in the least-squares sense (Udwadia & Kalaba 1992; Liu et al. 2015, eq. 13).

A case is *well conditioned* when cond = σ₁/σ_r ≤ 1e6 (float64; 1e3 in float32), of A (pinv) or of
B = A M^{-1/2} (UK), r its rank at NumPy's tolerance max(m, n) eps σ₁ (so a round-off singular value the SVD
keeps makes the case ill-conditioned, and one it drops must be dropped by every method). On these a method
*fails* when its relative error exceeds ``--tol`` (1e-8), or any output is not finite. pinv: Frobenius norm
of the difference over that of the reference. UK: ``fail`` relative to ‖q̈‖, ``fail_vs_terms`` relative to
the size of the terms, ‖q̈‖ + ‖L⁻ᵀ‖ ‖B⁺‖ ‖b - A a‖ (a backward-stable method errs ~ cond eps times the
latter; relative to ‖q̈‖ alone even the SVD reaches cond² eps when the terms cancel). In float32
(``--float32``) the rank decision is checked instead, on consistent problems: ``rank_lower`` /
``rank_higher`` count answers that enforce fewer / more directions of A q̈ = b than float64's rank (a
direction u_k of B counts as enforced when u_kᵀ(B y - c) is within 1 % of u_kᵀc), ``residual_over_1pct``
those with ‖A q̈ - b‖ > 1 % ‖b‖. Redundant cases (float64: consistent b, rank below the number of nonzero
rows of A, the SVD form within ``--tol``): ``redundant_fail_where_svd_passes`` counts those a method misses by
more than ``--tol``, or for the Cholesky forms by more than their documented 100 cond(B)² eps
(``redundant_worst_vs_bound``: the largest error over that bound).

    python3 benchmarks/linalg_fuzz.py --cases 2000 --out benchmarks/results/linalg_fuzz.json
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import ukjax
from ukjax.dynamics import ACCELERATION_METHODS, GRAM_METHODS
from ukjax.linalg import PINV_METHODS

MAX_DIM = 12
PADDED = [(6, 6), (12, 12)]  # one compilation per method and padded shape
EPS64 = float(np.finfo(np.float64).eps)
COND_LIMIT = {"float64": 1e6, "float32": 1e3}  # "well conditioned": cond eps ≤ 2e-10 / 1.2e-4


def pad(A, shape):
    """A in the top-left corner of a zero matrix of the given shape: pinv((A 0; 0 0)) = (A⁺ 0; 0 0)."""
    out = np.zeros(shape)
    out[: A.shape[0], : A.shape[1]] = A
    return out


def random_matrix(rng):
    """A random m x n matrix of the family described in the module docstring, embedded (zero rows and
    columns) in the smallest of the ``PADDED`` shapes that holds it."""
    m, n = (int(x) for x in rng.integers(1, MAX_DIM + 1, size=2))
    r = int(rng.integers(0, min(m, n) + 1))
    A = np.zeros((m, n))
    if r:
        U, _ = np.linalg.qr(rng.normal(size=(m, r)))
        V, _ = np.linalg.qr(rng.normal(size=(n, r)))
        s = np.geomspace(1.0, 10.0 ** -rng.uniform(0, 6), r) * 10.0 ** rng.uniform(-8, 8)
        A = (U * rng.permutation(s)) @ V.T
    kind = rng.integers(3)
    if m > 1 and kind > 0:
        k = int(rng.integers(1, m))
        src, dst = rng.choice(m, size=2, replace=False) if k == 1 else (rng.integers(m), rng.integers(m))
        A[dst] = A[src] * (1.0 if rng.random() < 0.5 else -2.0)
        if kind == 2 and r:  # a perturbation of relative size 1e-12 inside the row space: rank stays r
            V_r = np.linalg.svd(A)[2][:r]
            A[dst] += 1e-12 * np.linalg.norm(A, 2) * (rng.normal(size=r) @ V_r) / np.sqrt(r)
    return pad(A, next(p for p in PADDED if m <= p[0] and n <= p[1]))


def numerical_rank(s, shape):
    """(rank, cond): rank at NumPy's ``matrix_rank`` tolerance max(m, n) eps σ₁, cond = σ₁/σ_r."""
    if s.size == 0 or s[0] == 0:
        return 0, 1.0
    r = int(np.sum(s > max(shape) * EPS64 * s[0]))
    return r, s[0] / s[r - 1]


def random_spd(rng, n):
    Qm, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (Qm * np.geomspace(1.0, 10.0 ** rng.uniform(0, 6), n)) @ Qm.T * 10.0 ** rng.uniform(-2, 2)


def uk_reference(M, Q, A, b):
    """(q̈, B, scale): the reference q̈, B = A L⁻ᵀ, and the size of the terms q̈ is computed from,
    ‖q̈‖ + ‖L⁻ᵀ‖ ‖B⁺‖ ‖b - A a‖ (2-norms): the error of a backward-stable method is ~ cond(B) eps times it,
    while relative to ‖q̈‖ alone it can be ~ cond(B)² eps when the terms cancel (least squares)."""
    L = np.linalg.cholesky(M)
    a = np.linalg.solve(M, Q)
    Linv_T = np.linalg.inv(L).T
    B = A @ Linv_T
    B_pinv = np.linalg.pinv(B, rtol=max(B.shape) * EPS64)
    qdd = a + Linv_T @ (B_pinv @ (b - A @ a))
    terms = np.linalg.norm(Linv_T, 2) * np.linalg.norm(B_pinv, 2) * np.linalg.norm(b - A @ a)
    scale = np.linalg.norm(qdd) + terms
    return qdd, B, scale


def random_uk(rng):
    A = random_matrix(rng)
    m, n = A.shape
    M = random_spd(rng, n)
    Q = rng.normal(size=n) * 10.0 ** rng.uniform(-2, 2)
    b = A @ rng.normal(size=n)
    if rng.random() < 0.25:  # inconsistent (on the rows of the unpadded A only)
        b = b + (np.abs(A).sum(axis=1) > 0) * rng.normal(size=m) * (np.abs(b).max() + 1.0)
    return M, Q, A, b


@functools.cache
def pinv_fn(method):
    return jax.jit(jax.vmap(lambda A: ukjax.pinv(A, method)))


@functools.cache
def uk_fn(method):
    return jax.jit(jax.vmap(lambda M, Q, A, b: ukjax.uk_acceleration(M, Q, A, b, method=method)))


def rel_err(x, ref):
    x = np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        return np.inf
    scale = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (scale if scale > 0 else 1.0)


def by_shape(items, shape_of):
    groups = {}
    for i, item in enumerate(items):
        groups.setdefault(shape_of(item), []).append(i)
    return groups


def run(cases, seed, tol, dtype):
    """Failure counts per method (see the module docstring); one compiled vmap per method and shape."""
    rng = np.random.default_rng(seed)
    max_cond = COND_LIMIT[jnp.dtype(dtype).name]
    mats = [random_matrix(rng) for _ in range(cases)]
    uks = [random_uk(rng) for _ in range(cases)]
    pinv_stats = {m: {"well_conditioned": 0, "fail": 0, "worst": 0.0, "non_finite": 0} for m in PINV_METHODS}
    uk_stats = {m: {"well_conditioned": 0, "fail": 0, "worst": 0.0, "fail_vs_terms": 0, "worst_vs_terms": 0.0,
                    "non_finite": 0, "rank_lower": 0, "rank_higher": 0, "residual_over_1pct": 0,
                    "redundant_consistent": 0, "redundant_fail_where_svd_passes": 0,
                    "redundant_worst_vs_bound": 0.0}
                for m in ACCELERATION_METHODS}
    groups = by_shape(mats, lambda A: A.shape)
    for idx in tqdm(groups.values(), desc="pinv shapes", mininterval=10):
        As = np.stack([mats[i] for i in idx])
        refs = [np.linalg.pinv(A, rtol=max(A.shape) * EPS64) for A in As]
        good = []
        for A in As:
            r, cond = numerical_rank(np.linalg.svd(A, compute_uv=False), A.shape)
            good.append(cond <= max_cond)
        for method in PINV_METHODS:
            P = np.asarray(pinv_fn(method)(jnp.asarray(As, dtype)), np.float64)
            st = pinv_stats[method]
            for Pi, ref, ok in zip(P, refs, good, strict=True):
                st["non_finite"] += int(not np.all(np.isfinite(Pi)))
                if ok and dtype == jnp.float64:
                    err = rel_err(Pi, ref)
                    st["well_conditioned"] += 1
                    st["fail"] += int(err > tol)
                    st["worst"] = max(st["worst"], err)
    groups = by_shape(uks, lambda p: p[2].shape)
    for idx in tqdm(groups.values(), desc="UK shapes", mininterval=10):
        probs = [uks[i] for i in idx]
        info, cond_of, redundant = [], [], []
        for M, Q, A, b in probs:
            ref, B, scale = uk_reference(M, Q, A, b)
            r, cond = numerical_rank(np.linalg.svd(B, compute_uv=False), B.shape)
            consistent = np.linalg.norm(A @ np.linalg.pinv(A) @ b - b) <= 1e-8 * (1 + np.linalg.norm(b))
            info.append((ref, scale, r, cond <= max_cond, consistent))
            cond_of.append(cond)
            redundant.append(r < int(np.sum(np.abs(A).sum(axis=1) > 0)))
        args = [jnp.asarray(np.stack(x), dtype) for x in zip(*probs, strict=True)]
        svd_qdds = np.asarray(uk_fn("svd")(*args), np.float64)
        svd_ok = [rel_err(q, ref) <= tol for q, (ref, *_) in zip(svd_qdds, info, strict=True)]
        for method in ACCELERATION_METHODS:
            qdds = np.asarray(uk_fn(method)(*args), np.float64)
            st = uk_stats[method]
            for k, (qdd, (M, Q, A, b), (ref, scale, r, good, consistent)) in enumerate(
                zip(qdds, probs, info, strict=True)
            ):
                st["non_finite"] += int(not np.all(np.isfinite(qdd)))
                if not good:
                    continue
                st["well_conditioned"] += 1
                if dtype == jnp.float64:
                    err = rel_err(qdd, ref)
                    st["fail"] += int(err > tol)
                    st["worst"] = max(st["worst"], err)
                    err = np.linalg.norm(qdd - ref) / scale if scale > 0 else np.linalg.norm(qdd - ref)
                    st["fail_vs_terms"] += int(err > tol)
                    st["worst_vs_terms"] = max(st["worst_vs_terms"], err)
                    if consistent and redundant[k] and svd_ok[k]:  # what the default must pass too
                        excess = rel_err(qdd, ref) / gram_bound(method, tol, cond_of[k])
                        st["redundant_consistent"] += 1
                        st["redundant_fail_where_svd_passes"] += int(excess > 1)
                        st["redundant_worst_vs_bound"] = max(st["redundant_worst_vs_bound"], excess)
                elif consistent:
                    res = np.linalg.norm(A @ qdd - b) / max(np.linalg.norm(b), 1e-300)
                    enforced = enforced_rank(M, Q, A, b, qdd)
                    st["residual_over_1pct"] += int(res > 1e-2)
                    st["rank_lower"] += int(enforced < r)
                    st["rank_higher"] += int(enforced > r)
                    st["fail"] += int(res > 1e-2 or enforced != r)
    return {"pinv": pinv_stats, "uk_acceleration": uk_stats}


def gram_bound(method, tol, cond):
    """Error allowed on a redundant case the SVD form passes: ``tol``, or for the Cholesky forms their
    documented cond(B)² eps growth, 100 cond² eps (as tests/test_properties.py)."""
    return max(tol, 100 * cond**2 * EPS64) if method in GRAM_METHODS else tol


def enforced_rank(M, Q, A, b, qdd):
    """How many directions of A q̈ = b a float32 answer enforced: the rank of the constraint force part
    M(q̈ - a) measured in float64 (the force lies in range(Aᵀ), one dimension per enforced direction is not
    observable from one vector), so instead: the number of singular directions u_k of B whose equation
    u_kᵀ(B y - c) = 0 holds to 1e-2 relative, y = L^T (q̈ - a), c = b - A a."""
    L = np.linalg.cholesky(M)
    a = np.linalg.solve(M, Q)
    B = A @ np.linalg.inv(L).T
    U, s, _ = np.linalg.svd(B, full_matrices=False)
    y = L.T @ (qdd - a)
    c = b - A @ a
    r = numerical_rank(s, B.shape)[0]
    proj_res = np.abs(U[:, :r].T @ (B @ y - c))
    proj_c = np.abs(U[:, :r].T @ c) + 1e-30
    return int(np.sum(proj_res <= 1e-2 * np.maximum(proj_c, np.linalg.norm(c) * 1e-6)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="random matrices (and as many UK problems)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-8, help="relative error counted as a failure")
    parser.add_argument("--float32", action="store_true", help="run the methods in float32")
    parser.add_argument("--label", default="", help="stored with the counts (e.g. before/after)")
    parser.add_argument("--out", default=None, help="JSON file to write (benchmarks/_common.write_results)")
    args = parser.parse_args(argv)
    ukjax.enable_float64()
    dtype = jnp.float32 if args.float32 else jnp.float64
    start = time.perf_counter()
    counts = run(args.cases, args.seed, args.tol, dtype)
    payload = {"label": args.label, "cases": args.cases, "seed": args.seed, "tol": args.tol,
               "dtype": jnp.dtype(dtype).name, "seconds": time.perf_counter() - start, "counts": counts}
    for group, stats in counts.items():
        for method, st in stats.items():
            print(f"{group:16s} {method:12s} " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else
                                                          f"{k}={v}" for k, v in st.items()))
    if args.out:
        from _common import write_results

        write_results(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
