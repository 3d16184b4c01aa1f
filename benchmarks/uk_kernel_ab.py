"""Per-matrix time of ukjax's UK throughput kernels, for A/B comparisons of two checkouts of ukjax.

Times ``jit(vmap(psd_pinv))`` on 2 x 2 rank-deficient Gram matrices and ``jit(vmap(uk_acceleration))``
(default Cholesky form) on n = 4, m = 2 problems with a repeated constraint row (the shape of the SCARA
right-hand side, Xu & Liu 2017), batch 1024, 200 calls per repetition, best of 7; prints one JSON line.
Run it alternately against the two checkouts (interleaved, recording ``uptime``), e.g.

    for r in 1 2 3; do for p in OLD NEW; do
        uptime; PYTHONPATH=$p python3 benchmarks/uk_kernel_ab.py
    done; done
"""

import json
import time

import jax
import jax.numpy as jnp

import ukjax
from ukjax.linalg import psd_pinv

ukjax.enable_float64() if hasattr(ukjax, "enable_float64") else jax.config.update("jax_enable_x64", True)
BATCH = 1024
k = jax.random.split(jax.random.PRNGKey(0), 4)
X = jax.random.normal(k[0], (BATCH, 4, 4))
M = X @ jnp.swapaxes(X, 1, 2) + 4 * jnp.eye(4)
Q = jax.random.normal(k[1], (BATCH, 4))
A = jax.random.normal(k[2], (BATCH, 2, 4))
A = A.at[:, 1].set(A[:, 0])  # a repeated constraint: rank 1, as in an overconstrained mechanism
b = jax.random.normal(k[3], (BATCH, 2))
G = jnp.einsum("bij,bkj->bik", A, A)
cases = {"psd_pinv_2x2": (jax.jit(jax.vmap(psd_pinv)), (G,)),
         "uk_acceleration_n4_m2": (jax.jit(jax.vmap(ukjax.uk_acceleration)), (M, Q, A, b))}
out = {}
for name, (f, args) in cases.items():
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(200):
            r = f(*args)
        jax.block_until_ready(r)
        best = min(best, (time.perf_counter() - t) / 200 / BATCH * 1e9)
    out[name + "_ns_per_matrix"] = round(best, 1)
print(json.dumps(out))
