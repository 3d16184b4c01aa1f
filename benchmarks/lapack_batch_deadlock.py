"""Reproduce the jaxlib 0.10 batched-LAPACK deadlock on XLA:CPU, and show that ukjax's Cholesky avoids it.

The program: ``jit(vmap(...))`` of a few independent Cholesky factorizations of 12 x 12 SPD matrices (batch
1024), called repeatedly. ``--impl lapack`` uses ``jnp.linalg.cholesky`` (the batched ``lapack_dpotrf_ffi``
kernel), ``--impl ukjax`` uses :func:`ukjax.linalg.cholesky` (XLA code, no LAPACK), ``--impl uk-grad`` the
case of the user report: ``jit(vmap(grad(w · uk_acceleration)))`` over 12 x 12 problems.

Cause (native stacks taken with gdb on a hung run, jax/jaxlib 0.10.2, 2-core CPU): every XLA:CPU pool thread
("tf_XLAEigen") and the thread running the program sit in ``absl::BlockingCounter::Wait`` inside
``jax::ParallelBatchMap`` called from ``jax::CholeskyFactorization<F64>::Kernel`` (``lapack_dpotrf_ffi``).
jaxlib splits a batch over XLA's intra-op thread pool and blocks the calling thread until the pieces are
done; XLA's thunk executor runs independent custom calls concurrently on the same pool, so with as many
batched LAPACK calls in flight as the pool has threads, each blocked thread waits for pieces queued behind the
others, and nothing runs again (the CPU goes idle). The same kernel wrapper serves every batched LAPACK call
(potrf, trsm, getrf, geqrf, gesdd, syevd, ...: 24 kernels call ``ParallelBatchMap`` in jaxlib 0.10.2's
``_lapack.so``). Upstream: jax-ml/jax#39292 (batched eigh, the same ``ParallelBatchMap`` fan-out,
heap corruption on many-core hosts) and jax-ml/jax#39383 (its fix discussion notes that later open-source
jaxlib builds compile the parallel path out). No newer jax than 0.10.2 was available on this machine's
package index, so ukjax cannot pin past it; it avoids batched LAPACK on the UK path instead.

Each run goes in a subprocess with a timeout; a run that does not finish in time counts as hung.

    python3 benchmarks/lapack_batch_deadlock.py --impl lapack ukjax --runs 6
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys, time
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import ukjax
from ukjax.linalg import cholesky
impl, n, batch, k, iters = sys.argv[1], *(int(a) for a in sys.argv[2:6])
X = jax.random.normal(jax.random.PRNGKey(0), (k, batch, n, n))
Ms = X @ jnp.swapaxes(X, -1, -2) + n * jnp.eye(n)
if impl == "uk-grad":
    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    Q = jax.random.normal(ks[0], (batch, n))
    A = jax.random.normal(ks[1], (batch, n // 2, n))
    b = jax.random.normal(ks[2], (batch, n // 2))
    w = jnp.ones(n)
    loss = lambda M, Q, A, b: w @ ukjax.uk_acceleration(M, Q, A, b)
    g = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3))))
    args = (Ms[0], Q, A, b)
else:
    chol = jnp.linalg.cholesky if impl == "lapack" else cholesky
    g = jax.jit(jax.vmap(lambda *Ms: sum(jnp.sum(chol(M)) for M in Ms)))
    args = tuple(Ms)
jax.block_until_ready(g(*args))
t = time.perf_counter()
for _ in range(iters):
    jax.block_until_ready(g(*args))
print(f"finished {(time.perf_counter() - t) / iters * 1e3:.3f} ms per call", flush=True)
"""


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(impl, n=12, batch=1024, k=4, iters=200, timeout=60.0, env=None):
    """(finished, seconds, stdout tail) of one run in a fresh interpreter (environment ``env``, default this
    process's); the tail of a run that timed out gives the CPU seconds it used (a deadlocked run sits idle: a
    few CPU seconds in a long wall time; a run that is only slow on a loaded machine keeps using CPU)."""
    cmd = [sys.executable, "-c", CHILD, impl, str(n), str(batch), str(k), str(iters)]
    start, cpu = time.perf_counter(), _children_cpu()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=Path(__file__).resolve().parents[1], env=env)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start, f"timeout after {_children_cpu() - cpu:.1f} CPU s"
    tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or [""]
    return out.returncode == 0 and "finished" in out.stdout, time.perf_counter() - start, tail[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", nargs="+", default=["lapack", "ukjax"],
                        choices=["lapack", "ukjax", "uk-grad"])
    parser.add_argument("--runs", type=int, default=6, help="fresh processes per implementation")
    parser.add_argument("--iters", type=int, default=200, help="calls of the compiled program per run")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as hung")
    parser.add_argument("--out", default=None, help="JSON file for the counts")
    args = parser.parse_args(argv)
    results = {}
    for impl in args.impl:
        runs = []
        for i in range(args.runs):
            finished, seconds, tail = run_once(impl, iters=args.iters, timeout=args.timeout)
            runs.append({"finished": finished, "seconds": round(seconds, 2), "output": tail})
            print(f"{impl:8s} run {i + 1}: {'finished' if finished else 'HUNG'} ({seconds:.1f} s) {tail}",
                  flush=True)
        results[impl] = {"hung": sum(not r["finished"] for r in runs), "runs": runs}
    if args.out:
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import write_results

        write_results(args.out, {"timeout_s": args.timeout, "iters": args.iters, "results": results})
    return results


if __name__ == "__main__":
    main()
