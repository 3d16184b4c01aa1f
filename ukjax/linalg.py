"""Generalized (Moore-Penrose) inverses, after de Falco, Pennestri & Vita (seed 004, "Review of methods").

A⁺ is the unique matrix with (A A⁺)ᵀ = A A⁺, (A⁺ A)ᵀ = A⁺ A, A A⁺ A = A, A⁺ A A⁺ = A⁺ (seed 004 eq. 1a-1d).

Methods (``PINV_METHODS``), all written in JAX except the LAPACK SVD of ``"svd"``:

- ``"svd"``: A = U Σ Vᵀ, A⁺ = V Σ⁺ Uᵀ (seed 004 eq. 19).
- ``"greville"``: Greville's recursion, one row of A at a time (seed 004 eq. 22), rows in pivoted order.
- ``"householder"``: least squares by Householder QR with column pivoting, completed to an orthogonal
  decomposition so that the solutions for the m unit vectors are minimum-norm (seed 004 eq. 12-18).
- ``"mgs"``: the same least-squares route with modified Gram-Schmidt QR (with column pivoting).
- ``"varga"``: Householder QR of A, QR of G₁ᵀ, inverse of a triangular matrix (seed 004 eq. 20-21).

Fast kernels for the Udwadia-Kalaba equation: :func:`cholesky`, :func:`cho_solve` for small SPD matrices and
:func:`psd_pinv`, the Moore-Penrose inverse of a symmetric positive semi-definite matrix by pivoted Cholesky.

Fixed size: shapes are static and the rank, known only at run time, enters as a mask, so every factorization
is a ``lax.fori_loop`` over columns (or rows) whose body works on the whole fixed-size matrix. Measured on a
2-core CPU (jax 0.10, batches of 1024-4096 under ``vmap``): the same loops unrolled as static Python loops
compiled 5-20x slower (5-90 s at 12 x 12 to 30 x 30) and ran no faster; as ``fori_loop`` every method
compiles in about 1 s at any size up to 30 x 30, and the loop bodies still fuse across the batch. Per matrix,
the QR methods take 0.3 µs at 2 x 3 (``jnp.linalg.pinv``: 1.4 µs), 6-9 µs at 12 x 12 (11 µs) and about the
same as LAPACK at 19 x 28 (~32 µs); Greville is fastest throughout (``benchmarks/pinv_methods.py``;
measured before Greville's row pivoting and MGS's reorthogonalization, which add O(mn) and O(mk) work per
step).
:func:`cholesky` and :func:`cho_solve` are the exception: for n ≤ 8 they are unrolled into scalar
operations, which fuse into one elementwise kernel across the batch (Cholesky + solve 4.7x faster than
batched LAPACK at n = 4, 2x at n = 8; at n = 12 only 1.3x for 25x the compile time, slower at 16); above
n = 8 they are ``fori_loop`` code like the other factorizations (not LAPACK: see below). Under
:func:`looped_factorizations` the small ones are ``fori_loop`` code too: what a single scenario and a
``vmap`` below the entrywise threshold run on the CPU (:func:`ukjax.simulate`, :func:`ukjax.simulate_batch`).

Rank decision: a singular value (``"svd"``), a pivot |R_jj| of the column-pivoted QR (``"householder"``,
``"mgs"``, ``"varga"``) or Greville's ‖c_i‖ / (1 + ‖d_i‖) not larger than ``rtol`` times the largest one (σ₁,
|R_00|, the largest row norm) counts as zero. Seed 004 ("The problem of rank computation") shows that this
threshold decides whether a simulation of an overconstrained mechanism survives, so every function takes it.
``rtol`` may be a traced array (a leaf of a parameter pytree); it gets no derivative. Defaults
(:func:`default_rtol`), each scaled to the round-off its own factorization leaves in a null direction:

- ``"svd"``: ``max(m, n) eps``, NumPy's ``pinv(a, rtol=None)`` and ``matrix_rank``.
- ``"householder"``, ``"mgs"``, ``"varga"``, ``"greville"``: ``10 max(m, n) eps``. Their pivots are not the
  singular values: on exactly rank-deficient matrices (fuzzed, 1,500 each of A and B = A M^{-1/2}, cond of
  the nonzero part ≤ 1e6) the round-off pivot reached 1.6 max(m, n) eps in float64 where the SVD's
  round-off singular value stayed below its cut (1.15 in float32 at cond ≤ 1e3), so at the SVD's tolerance
  they kept round-off as rank and returned A⁺ with entries ~1e15. Ten times the SVD's tolerance drops it
  with a margin of 6, and real pivots are far above it (≥ 2e8 max(m, n) eps at cond ≤ 1e6 in float64,
  ≥ 365 at cond ≤ 1e3 in float32). With these defaults all five methods make the SVD's rank decision on
  every well-conditioned fuzzed case (``benchmarks/linalg_fuzz.py``).

Accuracy (float64, cond = σ₁/σ_r of the kept part): SVD, Householder, Varga and MGS (reorthogonalized, see
``_mgs_qr``) err like cond eps: on 1,944 fuzzed matrices with cond ≤ 1e6 (ranks 0 to full, repeated and
near-repeated rows, scales 1e-8 to 1e8; ``benchmarks/linalg_fuzz.py``) all agree with NumPy's SVD to 1e-8
relative, worst 1.6e-10. Greville's recursion is not backward stable: even in pivoted row order its error
grows like ~1e-3 cond² eps, within 1e-8 up to cond ≈ 1e5 and at most 1.5e-7 at cond ≤ 1e6 (20 of the 1,944
cases above 1e-8; in the seed's row order 75, worst 7e9). :func:`psd_pinv`, the Gram-matrix route of the UK
equation, errs like cond² eps (its docstring).

Derivatives: every method shares one ``jax.custom_jvp`` whose tangent is the Golub-Pereyra formula
    dA⁺ = -A⁺ dA A⁺ + A⁺ A⁺ᵀ dAᵀ (I - A A⁺) + (I - A⁺ A) dAᵀ A⁺ᵀ A⁺,
exact wherever the rank is locally constant (also at rank-deficient A) and always finite, unlike autodiff
through SVD factors, which is NaN at repeated (e.g. zero) singular values. (``jnp.linalg.pinv`` of jax 0.10
has a custom JVP with the same formula; the tests use it as an independent check.)

Non-finite input: no function of this module runs a factorization, LAPACK's or its own, on a matrix
holding NaN or ±inf. LAPACK's SVD (``gesdd`` with singular vectors) never returned on a 3 x 3 matrix holding
one inf (jax 0.10.2; ``jnp.linalg.svd`` of [[inf, 2, 3], [4, 5, 6], [7, 8, 9]] still ran after 20 s), so
every path that reaches a factorization screens its input first with one ``jnp.isfinite(A).all()`` and a
``jnp.where`` (``_finite_or_zero``): the factorization runs on a zero matrix and the result is put back to
NaN. What callers get:

- :func:`pinv` (every method), :func:`psd_pinv`, :func:`psd_ginv`: every entry NaN, no exception, also
  under ``jit``/``vmap``; the dynamics layer detects and reports it.
- :func:`matrix_rank`: a concrete non-finite A raises ``ValueError`` (a rank is an integer; there is no NaN
  rank); under ``jit``/``vmap``/``grad``, where A cannot be read on the host, the sentinel -1.
- :func:`cholesky`, :func:`cho_solve` (no iteration to converge, so nothing to hang): NaN propagates
  through the arithmetic.

The same screen guards the LAPACK calls outside this module: the symmetric square root (``eigh``) of the
reference UK form (:mod:`ukjax.dynamics`, whose forms all return NaN for non-finite input), and the SVD
of :mod:`ukjax._checks` (``motion_is_unique``, ``constraint_consistency`` by :func:`pinv`).
``tests/test_nonfinite.py`` runs every public function that can reach LAPACK on NaN and on inf under a
time limit. Bad arguments raise before JAX sees them: ``TypeError`` naming the argument for a non-numeric
array (:func:`as_real_array`), ``ValueError`` for a complex matrix and for a concrete ``rtol`` that is
negative, NaN or not a scalar (a traced one cannot be checked on the host and gives an all-NaN result
instead).

No batched LAPACK in the UK path: :func:`cholesky` and :func:`cho_solve` are XLA code at every size, because
jaxlib 0.10's batched LAPACK kernels can deadlock XLA:CPU's thread pool (:func:`cholesky` has the details).
The ``"svd"`` method, :func:`matrix_rank` and the reference UK form's eigendecomposition still call LAPACK
(``gesdd``, ``syevd``), which go through the same batch splitting; batched SVDs and eigendecompositions
did not hang in 6 and 3 runs of the reproduction, but only the LAPACK-free methods are immune.
"""

from __future__ import annotations

import contextvars
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from ukjax._settings import trace_setting

PINV_METHODS = ("svd", "greville", "householder", "mgs", "varga")

# Above this size cholesky/cho_solve call LAPACK instead of unrolled scalar code (see the module docstring).
_UNROLL_MAX = 8
_LOOPED = contextvars.ContextVar("ukjax_small_factorizations_looped", default=False)


def looped_factorizations(looped: bool = True):
    """Trace :func:`cholesky`, :func:`cho_solve` and :func:`psd_ginv` of n ≤ 8 as their ``fori_loop`` over
    columns (the code they run above n = 8) instead of unrolled scalar operations (``looped=False``:
    unrolled, the default). :func:`solve_lower` and :func:`solve_lower_t` stay unrolled: with their loops, an
    eager ``jax.grad`` of a ``vmap`` of ``simulate`` failed to lower (jax 0.10.2: a nested jit's operand in
    transposed layout, an MLIR verifier error); without them the speed is nearly the same (Jansen's leg,
    one scenario, 190 against 174 µs per step).

    The unrolled form fuses into one elementwise kernel across a large batch, which is what the entrywise
    right-hand side of :func:`ukjax.simulate_batch` evaluates; for one scenario, or a ``vmap`` below the
    entrywise threshold, its hundreds of scalar operations become hundreds of tiny kernels, each dispatched on
    its own by XLA:CPU. Measured (``benchmarks/looped_factorizations.py``, 2-core CPU, RK4 at 1 ms, µs per
    step per scenario, looped against unrolled): Jansen's leg (n = 7, 10 constraint rows) one
    :func:`ukjax.simulate` 198 against 428, :func:`ukjax.step` in a ``lax.scan`` 150 against 427,
    ``simulate_batch`` of 1 175 against 454, of 16 62 against 77; the SCARA (n = 4) 11.2 against 16.9, 9.9
    against 15.3, 10.8 against 16.7, 5.0 against 6.6; at 256 scenarios (entrywise) the unrolled code is
    faster (Jansen 35 against 39, SCARA 3.1 against 4.1). So :func:`ukjax.simulate`, :func:`ukjax.step` and
    the ``vmap`` program of :func:`ukjax.simulate_batch` trace their right-hand side and diagnostics inside
    this on the CPU, the entrywise evaluation outside it (``ukjax.options._loops_pay``); a GPU keeps
    straight-line code (a loop inside the right-hand side costs kernel launches at every trip there). Same
    values up to the order of floating-point operations. Jitted callers that trace these functions key
    their programs on :func:`factorizations_looped`."""
    return trace_setting(_LOOPED, bool(looped))


def factorizations_looped() -> bool:
    """Whether :func:`looped_factorizations` is in effect."""
    return _LOOPED.get()


def keyed_on_looping(fn):
    """fn with a keyword ``looped``, traced inside :func:`looped_factorizations` of it: wrapped in a jit
    with ``looped`` static (a bool argument of ``eqx.filter_jit`` is static anyway), one program per
    setting, which callers pass as :func:`factorizations_looped`."""

    def traced(*args, looped, **kwargs):
        with looped_factorizations(looped):
            return fn(*args, **kwargs)

    # not functools.wraps: its __wrapped__ would give jax.jit fn's signature, which has no ``looped`` to mark
    # static
    traced.__name__, traced.__qualname__, traced.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return traced


def _by_size(n: int, program, *args):
    """``program(*args, unrolled=...)``: unrolled for n ≤ 8; under :func:`looped_factorizations` the loop
    on the CPU and the unrolled code on every other platform, chosen when the program is lowered
    (``jax.lax.platform_dependent``, as :func:`ukjax.multibody._scan_per_platform` chooses), so that a
    program exported for a GPU from a CPU machine holds no loop."""
    if n > _UNROLL_MAX or not _LOOPED.get():
        return program(*args, unrolled=n <= _UNROLL_MAX)
    looped, unrolled = (functools.partial(program, unrolled=u) for u in (False, True))
    return jax.lax.platform_dependent(*args, cpu=looped, default=unrolled)


# Largest dimension for which small_matmul unrolls the product (measured: see small_matmul).
SMALL_MATMUL_MAX = 8
# From this size on the unrolled psd_ginv reads G from its own buffer (materialize): each of the m sweeps'
# kernels otherwise recomputes G and its producers. Measured (2-core CPU, legacy emitters): the Jansen leg
# (m = 7, G from the articulated-body solve) compiled its UK solve in 1.8 s instead of 3.5 s (HLO 47k -> 22k
# lines) and ran 4 % faster; the SCARA (m = 4, G from a 4 x 4 forward substitution) ran 6 % slower with it.
_MATERIALIZE_GRAM_FROM = 6


# Default rank tolerance per method, in units of max(m, n) eps (see the module docstring, "Rank decision").
_RTOL_FACTOR = {"svd": 1.0, "greville": 10.0, "householder": 10.0, "mgs": 10.0, "varga": 10.0}


LAPACK_CALL = re.compile(r"custom_call @(lapack_\w+)")
"""A jaxlib CPU LAPACK kernel in a lowered (StableHLO) program."""


def lapack_calls(lowered) -> set[str]:
    """The jaxlib LAPACK kernels (``lapack_dgesdd_ffi``, ``lapack_dsyevd_ffi``, ...) that a lowered program
    calls."""
    return set(LAPACK_CALL.findall(lowered.as_text()))


def blocks_on_cpu_pool(devices, lapack: set[str]) -> bool:
    """Whether several CPU ``devices`` would run the batched LAPACK kernels ``lapack`` at once on one thread
    pool, which may deadlock: jaxlib 0.10's CPU LAPACK kernels split a large enough batch over XLA:CPU's
    intra-op pool and block the calling thread until the pieces are done (``jax::ParallelBatchMap``); with
    several CPU devices each device's program runs on a thread of that same pool, and once every pool thread
    is a device program blocked in such a call, the pieces never run (``benchmarks/results/
    sweep-hang-stacks.txt``). A program that calls them runs on one CPU device instead (:mod:`ukjax.sweep`,
    :func:`ukjax.simulate_batch`)."""
    devices = list(devices)
    return bool(lapack) and len(devices) > 1 and devices[0].platform == "cpu"


def default_rtol(shape, dtype, method: str = "svd") -> float:
    """Default relative rank tolerance of ``method``: ``max(m, n) * eps`` for the SVD (NumPy's
    ``matrix_rank`` and ``pinv(a, rtol=None)``), a measured multiple of it for the other methods (module
    docstring, "Rank decision")."""
    return _RTOL_FACTOR[method] * max(shape[-2], shape[-1]) * float(jnp.finfo(dtype).eps)


def _describe(x) -> str:
    """What ``x`` is, for an error message: its dtype, or its type when it is not an array of one dtype."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(x).dtype
        except (TypeError, ValueError):
            return f"a {type(x).__name__} that is not a rectangular array of numbers"
    return f"dtype {dtype}" + (f" ({type(x).__name__})" if np.dtype(dtype).kind == "O" else "")


def as_real_array(x, where: str, name: str, what: str = "array"):
    """``x`` as a JAX array of a real floating-point dtype, its dtype checked before JAX reads it.

    Integer and boolean input is promoted to the default floating dtype (float64 with ``jax_enable_x64``), as
    ``jnp.linalg`` does, also under ``jax_numpy_dtype_promotion="strict"`` (the cast is explicit). Strings,
    other objects, ragged nested lists and None raise ``TypeError`` naming ``where`` and the argument
    ``name`` ("pinv: A must be a real floating-point array, got dtype <U3"); complex input raises
    ``ValueError`` (the imaginary part would be dropped).
    """
    leaves = jax.tree_util.tree_leaves(x) if isinstance(x, list | tuple) else [x]
    strings = any(isinstance(leaf, str | bytes) for leaf in leaves)
    try:
        if strings:  # (jnp.asarray would read a string as a dtype name)
            raise TypeError
        array = jnp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be a real floating-point {what}, got {_describe(x)}") from None
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        raise ValueError(f"{where}: {name} must be a real {what}, got dtype {array.dtype} "
                         "(complex is not supported)")
    if not jnp.issubdtype(array.dtype, jnp.floating):
        if not (jnp.issubdtype(array.dtype, jnp.integer) or array.dtype == bool):
            raise TypeError(f"{where}: {name} must be a real floating-point {what}, got dtype {array.dtype}")
        array = array.astype(jnp.result_type(float))
    return array


def promote_floats(*dtypes):
    """The floating dtype all of ``dtypes`` (real floating dtypes) convert to without loss, by JAX's standard
    lattice, also where ``jax_numpy_dtype_promotion`` is "strict" (the caller casts explicitly)."""
    with jax.numpy_dtype_promotion("standard"):
        return functools.reduce(jnp.promote_types, dtypes)


def as_real_arrays(where: str, matrices: tuple[str, ...] = (), **arrays) -> list:
    """The named arrays (None stays None) as real floating arrays of one dtype, in the order given, before
    any shape check: each through :func:`as_real_array` (the names in ``matrices`` called matrices in its
    message), then integers promoted and mixed floating precisions cast to the widest one
    (:func:`promote_floats`), explicitly, so that strict dtype promotion accepts them."""
    out = {
        k: None if x is None else as_real_array(x, where, k, "matrix" if k in matrices else "array")
        for k, x in arrays.items()
    }
    present = [x for x in out.values() if x is not None]
    dtype = promote_floats(*[x.dtype for x in present]) if present else None
    return [None if x is None else x.astype(dtype) for x in out.values()]


def _check_matrix(A, name="pinv", square=False, arg="A"):
    A = as_real_array(A, name, arg, "matrix")
    if A.ndim != 2 or (square and A.shape[0] != A.shape[1]):
        kind = "square 2-D" if square else "2-D"
        raise ValueError(f"{name} expects a {kind} matrix, got shape {A.shape}; use jax.vmap for batches")
    return A


def check_rtol(rtol, where="pinv"):
    """Raise ``ValueError`` naming ``rtol`` unless it is None, traced, or a real finite number ≥ 0.

    A traced ``rtol`` (a leaf of a parameter pytree under ``jit``/``grad``) cannot be read on the host; for
    it :func:`pinv`, :func:`psd_pinv` and :func:`matrix_rank` give an all-NaN result (rank -1) at run time
    when it is negative or NaN, never a silently wrong number.
    """
    if rtol is None or isinstance(rtol, jax.core.Tracer):
        return
    value = np.asarray(rtol)
    real = np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
    if value.ndim != 0 or not real or not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: rtol must be a real finite number >= 0, or None for the default; "
                         f"got {rtol!r}")


def _rtol_array(rtol, A, method="svd"):
    rtol = default_rtol(A.shape, A.dtype, method) if rtol is None else rtol
    return jnp.asarray(rtol, dtype=A.dtype)


def _finite_or_zero(A):
    """(A with every entry replaced by 0 where any entry is NaN or ±inf, the flag "all entries finite").

    LAPACK's SVD and eigensolvers iterate until convergence, and on a matrix holding inf or NaN they may never
    converge (a 3 x 3 matrix with one inf made ``jnp.linalg.svd`` loop forever, jax 0.10.2). Every
    factorization in ukjax therefore runs on the zeroed matrix and the caller puts NaN back afterwards.
    """
    finite = jnp.all(jnp.isfinite(A))
    return jnp.where(finite, A, 0), finite


# ------------------------------------------------------------------------------------------ building blocks


def _loop(n_steps, body, carry):
    """``carry = body(j, carry)`` for j = 0, ..., n_steps-1; bodies mask with j instead of slicing."""
    return jax.lax.fori_loop(0, n_steps, body, carry)


def _swap_index(j, p, n):
    """Index vector of the transposition of j and p (p differs across a batch: applied by a gather)."""
    return jnp.arange(n).at[j].set(p).at[p].set(j)


def _argmax_from(scores, j):
    """Position of the largest score among positions ≥ j (the pivot)."""
    return jnp.argmax(jnp.where(jnp.arange(scores.shape[0]) >= j, scores, -jnp.inf))


def _safe_div(num, den, ok):
    """``num / den`` where ``ok``, else 0, with finite derivatives on both branches."""
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0)


def sum_of_outer_products(a, b):
    """a @ b for 2-D a (m, c) and b (c, k) as Σ_c a[:, c] b[c, :], in order of c: elementwise operations that
    XLA fuses across a ``vmap`` batch (:func:`small_matmul`). Columns and rows are taken by one unstack each,
    whose transpose is one stack, not by indexing, whose transpose pads each cotangent to the operand's size
    and adds it (reverse mode paid c pads and adds)."""
    columns, rows = jnp.unstack(a, axis=1), jnp.unstack(b, axis=0)
    return functools.reduce(jnp.add, (c[:, None] * r[None, :] for c, r in zip(columns, rows, strict=True)))


def small_matmul(a, b):
    """``a @ b`` for a vector or matrix ``a`` and ``b``; for small static sizes, as sums of outer products.

    With every dimension ≤ ``SMALL_MATMUL_MAX`` the product is written as Σ_k a[:, k] b[k, :], elementwise
    operations that XLA fuses with their neighbours across a ``vmap`` batch; a batched ``dot_general`` of
    tiny matrices is not fused and, on CPU, costs ~40x more (4 x 4 @ 4 x 4 at a batch of 1024: 450 ns vs
    11 ns per matrix, ``benchmarks/throughput.py --profile``). Larger operands use ``jnp.matmul``. The sum
    runs over k in order, so results agree with ``a @ b`` to round-off.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim not in (1, 2) or b.ndim not in (1, 2) or a.shape[-1] != b.shape[0]:
        raise ValueError(f"small_matmul expects 1-D/2-D operands with a.shape[-1] == b.shape[0], "
                         f"got {a.shape} and {b.shape}")
    if a.shape[-1] == 0 or max(a.shape + b.shape) > SMALL_MATMUL_MAX:
        return a @ b
    a2 = a if a.ndim == 2 else a[None, :]
    b2 = b if b.ndim == 2 else b[:, None]
    out = sum_of_outer_products(a2, b2)
    out = out[0] if a.ndim == 1 else out
    return out[..., 0] if b.ndim == 1 else out


def _rank_mask(pivots, rtol):
    """Pivots (|R_jj| of a column-pivoted factorization, non-increasing) that count as nonzero.

    A pivot counts as zero when it is ``<= rtol * pivots[0]``; once one is zero all later ones are (cumulative
    minimum), so the mask is always r ones followed by zeros.
    """
    d = jnp.abs(pivots)
    return jax.lax.cummin(d) > rtol * d[0]


def _house(x, i):
    """Householder reflection H = I - β v vᵀ with H x = α e_i (LAPACK ``dlarfg`` convention).

    When x is already a multiple of e_i, β = 0 and H = I, so zero and already-reduced columns are left alone.
    """
    x0 = x[i]
    rest = x.at[i].set(0)
    tail2 = rest @ rest
    norm = jnp.sqrt(x0 * x0 + tail2)
    active = tail2 > 0
    alpha = jnp.where(active, jnp.where(x0 >= 0, -norm, norm), x0)
    v = rest.at[i].set(x0 - alpha)
    beta = _safe_div(2, (x0 - alpha) ** 2 + tail2, active)
    return v, beta, alpha


def _apply_reflectors(V, betas, C, reverse=False):
    """H_k ... H_1 C (or H_1 ... H_k C with ``reverse``), H_j = I - β_j v_j v_jᵀ, v_j = column j of V."""
    k = betas.shape[0]

    def body(t, C):
        j = k - 1 - t if reverse else t
        return C - betas[j] * jnp.outer(V[:, j], V[:, j] @ C)

    return _loop(k, body, C)


def _unpermute_rows(X, perm):
    """Rows of (A Π)⁺ → rows of A⁺ = Π (A Π)⁺, where column i of A Π is column perm[i] of A."""
    return jnp.zeros_like(X).at[perm].set(X)


def _solve_upper(T, C, keep):
    """Back substitution T Y = C for upper-triangular T (k x k); rows with ``keep[i]`` False are set to 0.

    Masked rows make this the minimum-norm solve with the leading r x r block of T, the rank-r case of
    seed 004 eq. 14.
    """
    k = T.shape[0]

    def body(t, Y):
        i = k - 1 - t
        s = C[i] - T[i] @ Y  # rows ≤ i of Y are still zero
        return Y.at[i].set(_safe_div(s, T[i, i], keep[i]))

    return _loop(k, body, jnp.zeros_like(C))


def _solve_lower(L, C, keep):
    """Forward substitution L Y = C for lower-triangular L, as back substitution on the reversed system."""
    return _solve_upper(L[::-1, ::-1], C[::-1], keep[::-1])[::-1]


# ------------------------------------------------------------------------------------------- factorizations


def _householder_qr(A, pivot):
    """A Π = Q R by Householder reflections, optionally with column pivoting (Golub & Van Loan alg. 5.4.1).

    Returns R (the first k = min(m, n) rows, upper trapezoidal), the permutation ``perm`` (column i of A Π is
    column perm[i] of A) and the reflectors (V, β) with Qᵀ C = ``_apply_reflectors(V, β, C)``.
    With pivoting, |R_00| ≥ |R_11| ≥ ... so the rank is revealed by the diagonal.
    """
    m, n = A.shape
    k = min(m, n)
    rows, cols = jnp.arange(m), jnp.arange(n)

    def body(j, carry):
        R, perm, V, betas = carry
        if pivot:
            norms = jnp.sum(jnp.where(rows[:, None] >= j, R, 0) ** 2, axis=0)
            swap = _swap_index(j, _argmax_from(norms, j), n)
            R, perm = R[:, swap], perm[swap]
        v, beta, alpha = _house(jnp.where(rows >= j, R[:, j], 0), j)
        R = R - jnp.where(cols > j, beta * jnp.outer(v, v @ R), 0)
        R = R.at[:, j].set(jnp.where(rows < j, R[:, j], jnp.where(rows == j, alpha, 0)))
        return R, perm, V.at[:, j].set(v), betas.at[j].set(beta)

    init = (A, cols, jnp.zeros((m, k), A.dtype), jnp.zeros(k, A.dtype))
    R, perm, V, betas = _loop(k, body, init)
    return R[:k], perm, (V, betas)


def _rz(R, keep):
    """Complete orthogonal decomposition of a rank-r upper trapezoid: R = [T 0] Z (LAPACK ``xTZRZF``).

    R is k x n with rows ≥ r zero. Working from the last row up, a reflection from the right on columns
    {i} ∪ {r, ..., n-1} zeroes row i outside the leading r x r block. Returns T (k x k, upper triangular, zero
    outside the r x r block) and the reflectors (V, β) with Zᵀ X = ``_apply_reflectors(V, β, X)``.
    """
    k, n = R.shape
    rows, cols = jnp.arange(k), jnp.arange(n)
    r = jnp.sum(keep)

    def body(t, carry):
        R, V, betas = carry
        i = k - 1 - t
        v, beta, _ = _house(jnp.where((cols == i) | (cols >= r), R[i], 0), i)
        R = R - jnp.where((rows <= i)[:, None], beta * jnp.outer(R @ v, v), 0)
        return R, V.at[:, i].set(v), betas.at[i].set(beta)

    R, V, betas = _loop(k, body, (R, jnp.zeros((n, k), R.dtype), jnp.zeros(k, R.dtype)))
    T = jnp.where(keep[:, None] & keep[None, :], jnp.triu(R[:, :k]), 0)
    return T, (V, betas)


def _mgs_qr(A, keep=None, rtol=None):
    """A Π = Q R by modified Gram-Schmidt (Björck 1967), column-pivoted when ``keep`` is None.

    Each new column is reorthogonalized once against the previous q's before it is normalized (Giraud,
    Langou & Rozložník 2005: "twice is enough"), so Q is orthogonal to working precision instead of losing
    orthogonality like cond(A) eps; without it the UK accelerations of fuzzed least-squares problems
    (cond(B) ≤ 1e6) erred by up to 1.8e-4 relative, with it as little as Householder's.

    With ``keep=None`` the rank is decided on the fly (pivot ≤ rtol·R_00 counts as zero) and returned; given a
    ``keep`` mask (columns known to be zero or dependent) there is no pivoting. Q is m x k with zero columns
    beyond the rank, R is k x n with zero rows beyond the rank.
    """
    m, n = A.shape
    k = min(m, n)
    cols = jnp.arange(n)
    pivot = keep is None
    if pivot:
        cutoff = rtol * jnp.sqrt(jnp.max(jnp.sum(A * A, axis=0), initial=0.0))

    def body(j, carry):
        W, R, Q, perm, alive, flags = carry
        if pivot:
            swap = _swap_index(j, _argmax_from(jnp.sum(W * W, axis=0), j), n)
            W, R, perm = W[:, swap], R[:, swap], perm[swap]
        # reorthogonalize against q_0 ... q_{j-1} (zero columns of Q beyond j): "twice is enough"
        corr = W[:, j] @ Q
        w = W[:, j] - Q @ corr
        rjj = jnp.sqrt(w @ w)
        ok = alive & (rjj > cutoff) if pivot else keep[j]
        q = _safe_div(w, rjj, ok)
        row = jnp.where(cols > j, q @ W, 0)
        W = W - jnp.outer(q, row)
        R = R.at[:, j].add(corr).at[j].set(row.at[j].set(jnp.where(ok, rjj, 0)))
        return W, R, Q.at[:, j].set(q), perm, ok, flags.at[j].set(ok)

    init = (A, jnp.zeros((k, n), A.dtype), jnp.zeros((m, k), A.dtype), cols, jnp.array(True),
            jnp.zeros(k, bool))
    _, R, Q, perm, _, flags = _loop(k, body, init)
    return Q, R, perm, flags


# --------------------------------------------------------------------------------------------- pinv methods


def _pinv_svd(A, rtol):
    """Seed 004 eq. 19: A = U Σ Vᵀ, A⁺ = V Σ⁺ Uᵀ, singular values ≤ rtol·σ₁ dropped."""
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)
    keep = s > rtol * jnp.max(s, initial=0.0)
    return (vt.T * _safe_div(1, s, keep)) @ u.T


def _greville(A, rtol):
    """Greville's recursion over the rows of A in pivoted order; returns (A⁺, the scaled pivots ‖c‖).

    See :func:`_pinv_greville`. The pivots, ‖c_i‖ / (max_j ‖a_j‖ (1 + ‖d_i‖)) in processing order, are what
    the rank decision compares with ``rtol`` (returned for tolerance measurements).
    """
    m, n = A.shape
    rows = jnp.arange(m)
    row_scale = jnp.sqrt(jnp.max(jnp.sum(A * A, axis=1), initial=0.0))

    def body(t, carry):
        P, R, done, pivots = carry
        k = jnp.argmax(jnp.where(done, -jnp.inf, jnp.sum(R * R, axis=1)))
        pick = rows == k
        a = jnp.sum(jnp.where(pick[:, None], A, 0), axis=0)
        d = a @ P
        c = a - d @ A
        c = c - (c @ P) @ A
        cc = c @ c
        pivot = _safe_div(jnp.sqrt(cc), row_scale * (1 + jnp.sqrt(d @ d)), row_scale > 0)
        independent = pivot > rtol
        b = jnp.where(independent, _safe_div(c, cc, independent), (P @ d) / (1 + d @ d))
        P = jnp.where(pick[None, :], b[:, None], P - jnp.outer(b, d))
        u = _safe_div(c, jnp.sqrt(cc), independent)
        R = jnp.where(pick[:, None], 0, R - jnp.outer(R @ u, u))
        return P, R, done | pick, pivots.at[t].set(pivot)

    init = (jnp.zeros((n, m), A.dtype), A, jnp.zeros(m, bool), jnp.zeros(m, A.dtype))
    P, _, _, pivots = _loop(m, body, init)
    return P, pivots


def _pinv_greville(A, rtol):
    """Greville's recursion (seed 004 eq. 22), one row at a time: with A_i = [A_{i-1}; a_i],

        d_i = a_i A_{i-1}⁺,   c_i = a_i - d_i A_{i-1},
        b_i = c_i / (c_i c_iᵀ)                       if ‖c_i‖ > tol,
        b_i = d_i (A_{i-1}⁺)ᵀ / (1 + d_i d_iᵀ)       otherwise,
        A_i⁺ = [A_{i-1}⁺ - b_iᵀ d_i,  b_iᵀ].

    (The seed prints the second case of b_i as d_i A_{i-1}⁺, which does not conform; the transpose is
    Greville's formula.) What ukjax changes: the order of the rows. The seed takes them top to bottom, so an
    intermediate A_{i-1} can be nearly singular although A is not (rows (1, 2), (1, 2 + 1e-12), (3, -1):
    cond(A) = 1.2, cond(A_2) = 1e12, A⁺ off by 8e-4 relative), and its round-off is amplified like
    cond(A_{i-1})². Since (Π A)⁺ = A⁺ Πᵀ for a row permutation Π, any order gives A⁺; ukjax takes next the
    row with the largest component outside the row space found so far (row pivoting, as in column-pivoted
    QR of Aᵀ): the residuals are kept for all rows and updated by the new direction c_i/‖c_i‖ after each
    independent row, O(mn) per step. Every A_i is then as well conditioned as the pivoted QR factors of A,
    and a dependent row is met only when all remaining rows are (numerically) in the row space. On fuzzed
    well-conditioned matrices this removed the failures of the seed's order (error up to 7e9 relative at
    cond ≤ 1e6); what remains is the recursion's own error growth, ~1e-3 cond² eps (module docstring).

    c_i is projected twice (c_i ← c_i - (c_i A_{i-1}⁺) A_{i-1}, "twice is enough"). A_{i-1}⁺ is kept in a
    fixed n x m array whose columns of unprocessed rows are zero, so d_i A_{i-1} needs no mask. Rank decision:
    row i counts as dependent when ‖c_i‖ ≤ rtol · max_j ‖a_j‖ · (1 + ‖d_i‖) (the round-off of c_i grows
    with ‖d_i‖); the default rtol is :func:`default_rtol` for ``"greville"``.
    """
    return _greville(A, rtol)[0]


def _pinv_householder(A, rtol):
    """Least squares by Householder QR (seed 004 eq. 15-18 with eq. 12-14), one solve for all m unit vectors.

    A Π = Q R with column pivoting; rows of R whose pivot is ≤ rtol·|R_00| are dropped (rank r); the trapezoid
    [R_11 R_12] is reduced to [T 0] Z by reflections from the right (complete orthogonal decomposition), so
    A Π = Q [T 0; 0 0] Z and the minimum-norm least-squares solution of A x = e_j is
    x_j = Π Zᵀ [T⁻¹ (Qᵀ e_j)_{1:r}; 0]. The columns x_1 ... x_m form A⁺ (eq. 17).
    """
    m, n = A.shape
    k = min(m, n)
    R, perm, (V, betas) = _householder_qr(A, True)
    keep = _rank_mask(jnp.diagonal(R), rtol)
    T, (Z, z_betas) = _rz(jnp.where(keep[:, None], R, 0), keep)
    QtE = _apply_reflectors(V, betas, jnp.eye(m, dtype=A.dtype))[:k]
    Y = _solve_upper(T, QtE, keep)
    X = jnp.zeros((n, m), A.dtype).at[:k].set(Y)
    return _unpermute_rows(_apply_reflectors(Z, z_betas, X), perm)


def _pinv_mgs(A, rtol):
    """Least squares by modified Gram-Schmidt QR (seed 004 eq. 15-18), one solve for all m unit vectors.

    A Π = Q R (pivoted MGS, rank r decided by pivot ≤ rtol·R_00), then MGS again on the r x n trapezoid:
    Rᵀ = W S, so A Π = Q Sᵀ Wᵀ and the minimum-norm solutions are (A Π)⁺ = W S⁻ᵀ Qᵀ (forward substitution
    with Sᵀ). Plain MGS is the cheapest of the QR methods and the least accurate, Q losing orthogonality in
    proportion to cond(A)·eps (seed 004, tables 7-12, saw more integration steps with it); ukjax's MGS
    reorthogonalizes each column once (see ``_mgs_qr``), which makes it as accurate as Householder.
    """
    Q, R, perm, keep = _mgs_qr(A, rtol=rtol)
    W, S, _, _ = _mgs_qr(R.T, keep=keep)
    Y = _solve_lower(S.T, Q.T, keep)
    return _unpermute_rows(W @ Y, perm)


def _pinv_varga(A, rtol):
    """Varga's method (seed 004 eq. 20-21): two Householder QR factorizations and a triangular inverse.

    A Π = U [G_1; 0] (column-pivoted, rows of G_1 beyond the rank dropped), G_1ᵀ = V [S; 0] (unpivoted), so
    A Π = U [Sᵀ 0; 0 0] Vᵀ and A⁺ = Π V [S⁻ᵀ 0; 0 0] Uᵀ, with S⁻¹ formed explicitly by back substitution.
    Seed 004 states it without pivoting; pivoting is what makes G_1 have full row rank for rank-deficient A.
    """
    m, n = A.shape
    k = min(m, n)
    G1, perm, (U, u_betas) = _householder_qr(A, True)
    keep = _rank_mask(jnp.diagonal(G1), rtol)
    S, _, (V, v_betas) = _householder_qr(jnp.where(keep[:, None], G1, 0).T, False)
    S_inv = _solve_upper(jnp.where(keep[None, :], S, 0), jnp.eye(k, dtype=A.dtype), keep)
    V_k = _apply_reflectors(V, v_betas, jnp.eye(n, k, dtype=A.dtype), reverse=True)
    Ut_k = _apply_reflectors(U, u_betas, jnp.eye(m, dtype=A.dtype))[:k]
    return _unpermute_rows(V_k @ (S_inv.T @ Ut_k), perm)


_IMPLEMENTATIONS = {
    "svd": _pinv_svd,
    "greville": _pinv_greville,
    "householder": _pinv_householder,
    "mgs": _pinv_mgs,
    "varga": _pinv_varga,
}


def _guarded(impl, A, rtol):
    """``impl(A, rtol)`` on finite input with a valid rtol; all NaN otherwise (LAPACK never sees NaN/inf)."""
    A0, finite = _finite_or_zero(A)
    valid = finite & (rtol >= 0)  # False for a NaN rtol too
    return jnp.where(valid, impl(A0, jnp.where(valid, rtol, 0)), jnp.nan)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _pinv(impl, A, rtol):
    return _guarded(impl, A, rtol)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _inverse_program(impl, A, rtol, symmetrize=False):
    """``_pinv(impl, A, rtol)``, of (A + Aᵀ)/2 with ``symmetrize``, as one compiled program per method and
    shapes (a nested jit inside traced code). Called on concrete arrays, op-by-op dispatch would compile
    every ``fori_loop`` of the factorization again at every call (a new loop body each time, ~0.15 s)."""
    return _pinv(impl, (A + A.T) / 2 if symmetrize else A, rtol)


@_pinv.defjvp
def _pinv_jvp(impl, primals, tangents):
    (A, rtol), (dA, _) = primals, tangents
    P = _pinv(impl, A, rtol)
    m, n = A.shape
    left = jnp.eye(m, dtype=A.dtype) - A @ P
    right = jnp.eye(n, dtype=A.dtype) - P @ A
    dP = -P @ dA @ P + P @ P.T @ dA.T @ left + right @ dA.T @ P.T @ P
    return P, dP


def pinv(A, method: str = "svd", rtol=None):
    """Moore-Penrose inverse A⁺ of a real m x n matrix by the algorithm ``method`` (one of ``PINV_METHODS``).

    ``rtol``: relative rank tolerance (see the module docstring); ``None`` means the method's default
    :func:`default_rtol`. Works for any m, n (including rank-deficient and zero A), float32 and float64;
    ``jax.jvp``/``jax.grad`` use the Golub-Pereyra formula. Non-finite A gives an all-NaN result without
    running the factorization on it (every method, also under ``jit``/``vmap``). Integer A is promoted to
    float; a non-numeric A (strings, objects) raises ``TypeError`` naming it, a complex A, or a concrete
    ``rtol`` that is negative, NaN or not a scalar, ``ValueError``; a traced invalid ``rtol`` gives an all-NaN
    result.
    """
    A = _check_matrix(A)
    if method not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown pinv method {method!r}; choose one of {PINV_METHODS}")
    check_rtol(rtol, "pinv")
    if A.size == 0:
        return jnp.zeros(A.shape[::-1], A.dtype)
    return _inverse_program(_IMPLEMENTATIONS[method], A, _rtol_array(rtol, A, method))


def matrix_rank(A, rtol=None):
    """Number of singular values of A larger than ``rtol * σ₁`` (default ``rtol = max(m, n) * eps``).

    Non-finite input: the rank of a matrix holding NaN or ±inf is undefined and the SVD is never run on it
    (LAPACK's SVD may not return on inf). A concrete A (known on the host) holding one raises ``ValueError``;
    under ``jit``/``vmap``/``grad``, where A is traced and cannot be read on the host, the result is the
    sentinel -1, which is never a rank (the same for a traced ``rtol`` that is negative or NaN). A concrete
    invalid ``rtol`` raises ``ValueError``; so do a complex A and (``TypeError``) a non-numeric one.
    """
    A = _check_matrix(A, "matrix_rank")
    check_rtol(rtol, "matrix_rank")
    if not isinstance(A, jax.core.Tracer) and not bool(np.isfinite(np.asarray(A)).all()):
        raise ValueError("matrix_rank: A has a NaN or inf entry; the rank of a non-finite matrix is "
                         "undefined (under jit, where A is traced, the result is -1 instead)")
    return _rank_or_minus_one(A, rtol)


def _rank_or_minus_one(A, rtol=None):
    """:func:`matrix_rank` without the host check: -1 for a non-finite A (or traced invalid ``rtol``) also
    when A is concrete. For callers that report flags instead of raising
    (:func:`ukjax.control.servo_controllability`)."""
    A = _check_matrix(A, "matrix_rank")
    return _matrix_rank(A, _rtol_array(rtol, A))


@jax.jit
def _matrix_rank(A, rtol):
    A0, finite = _finite_or_zero(A)
    s = jnp.linalg.svd(A0, compute_uv=False)
    rank = jnp.sum(s > rtol * jnp.max(s, initial=0.0))
    return jnp.where(finite & (rtol >= 0), rank, -1)


# ---------------------------------------------------------------------------------------- SPD / PSD kernels


def materialize(x):
    """x, computed once into its own buffer: a fusion boundary for unrolled small-matrix code (x + (-0) = x).

    XLA:CPU (jaxlib 0.10.2) fuses a producer made of cheap elementwise operations into *every* consumer
    kernel, so a value that several kernels read is recomputed in each of them, and its producers in turn.
    Under ``vmap``, unrolled scalar code (the n ≤ 8 paths of :func:`cholesky`, :func:`cho_solve`,
    :func:`psd_ginv`, a model's entries of M or φ) is exactly that: in the SCARA right-hand side each of the
    ~20 kernels of the UK solve recomputed most of M⁻¹Aᵀ and of G's factorization, and every entry of M
    that reads cos q₂ computed its own cosine (libm, ~10 ns per call). ``jax.lax.optimization_barrier``
    does not stop this on CPU (XLA removes it before fusion); a reduction does: XLA:CPU computes it once,
    in its own kernel (``tests/test_linalg.py`` checks this on the compiled program). So x is stacked with
    -0 and summed over that axis of length 2: x + (-0) = x for every x (NaN stays NaN, ±inf stays ±inf; a
    -0 may come back as +0). A sum is linear, so this also runs on tangents inside custom derivative rules
    (the solves in the derivative of :func:`ukjax.dynamics.uk_acceleration`) and reverse mode transposes
    it. Derivative: the identity. Cost: one small reduction kernel per call. On other platforms (GPU, TPU;
    chosen when the program is lowered, ``jax.lax.platform_dependent``) it is the plain identity: their
    fusion has not been measured with it.

    :func:`cho_solve` materializes its solution and :func:`psd_ginv` each sweep's pivot column (and G itself
    from m = 6 on); the SCARA model its sines and cosines (:mod:`ukjax.models.scara`). Measured on the SCARA
    right-hand side (n = m = 4, batch 1024, CPU seconds on one core of the 2-core CPU,
    ``benchmarks/throughput.py --profile``): 528 → 320 ns per evaluation. Use it in a model for a value that
    many entries share.
    """
    return _materialize(jnp.asarray(x))


@jax.jit
def _materialize(x):
    # One named call, so that ukjax._entrywise finds the boundaries and keeps them (on its batch vectors).
    return jax.lax.platform_dependent(x, cpu=_sum_with_negative_zero, default=lambda v: v)


def _sum_with_negative_zero(x):
    return jnp.sum(jnp.stack([x, jnp.full_like(x, -0.0)]), axis=0)


def _materialized(tree):
    """:func:`materialize` on every array of a (nested) list of entries."""
    return jax.tree_util.tree_map(materialize, tree)


def _entries(X):
    """The entries of a small matrix as nested lists of scalars (under ``vmap``: of batch vectors)."""
    return [[X[i, j] for j in range(X.shape[1])] for i in range(X.shape[0])]


def _stack(rows):
    return jnp.stack([jnp.stack(row) for row in rows])


def _cholesky_entries(m):
    """Cholesky-Banachiewicz on nested lists of scalars (Golub & Van Loan alg. 4.2.1), unrolled."""
    n = len(m)
    L = [[jnp.zeros_like(m[0][0])] * n for _ in range(n)]
    for j in range(n):
        L[j][j] = jnp.sqrt(m[j][j] - _dot(L[j][:j], L[j][:j], m[j][j]))
        for i in range(j + 1, n):
            L[i][j] = (m[i][j] - _dot(L[i][:j], L[j][:j], m[i][j])) / L[j][j]
    return L


def _cho_solve_entries(l, rows):
    """Forward then back substitution with L and Lᵀ (nested lists); each right-hand-side row is a scalar
    or a vector."""
    return _back_entries(l, _forward_entries(l, rows))


def _forward_entries(l, rows):
    """L y = rows by forward substitution (nested lists of scalars or vectors)."""
    y = []
    for i in range(len(l)):
        y.append((rows[i] - _dot(l[i][:i], y, rows[i])) / l[i][i])
    return y


def _back_entries(l, rows):
    """Lᵀ x = rows by back substitution (nested lists of scalars or vectors)."""
    n = len(l)
    x = [None] * n
    for i in reversed(range(n)):
        x[i] = (rows[i] - _dot([l[k][i] for k in range(i + 1, n)], x[i + 1:], rows[i])) / l[i][i]
    return x


def _dot(u, v, like):
    """Σ_k u_k v_k over two lists, in order; zero shaped like ``like`` for empty lists."""
    return functools.reduce(jnp.add, (a * b for a, b in zip(u, v, strict=False)), jnp.zeros_like(like))


def _cholesky_loop(M):
    """Right-looking Cholesky as a ``fori_loop`` over columns: column j of L is W[:, j] / √W_jj of the Schur
    complement W, then W ← W - l lᵀ (Golub & Van Loan alg. 4.2.2). Pure XLA, no LAPACK call."""
    n = M.shape[0]
    rows = jnp.arange(n)

    def body(j, carry):
        W, L = carry
        col = jnp.where(rows >= j, W[:, j], 0) / jnp.sqrt(W[j, j])
        return W - jnp.outer(col, col), L.at[:, j].set(col)

    return _loop(n, body, (M, jnp.zeros_like(M)))[1]


def cholesky(M):
    """Lower-triangular L with M = L Lᵀ for symmetric positive-definite M (n x n).

    Reads (M + Mᵀ)/2, like ``jnp.linalg.cholesky``. For n ≤ 8 the algorithm is unrolled into scalar
    operations that fuse across ``vmap``; larger n, and any n under :func:`looped_factorizations`, run a
    ``fori_loop`` over columns. Neither calls LAPACK:
    jaxlib 0.10's batched LAPACK kernels (``lapack_dpotrf_ffi`` and the others) split a ``vmap`` batch over
    XLA:CPU's intra-op thread pool and block a pool thread until the pieces finish
    (``jax::ParallelBatchMap`` → ``absl::BlockingCounter::Wait``); when the thunk executor runs as many
    independent batched LAPACK calls at once as the pool has threads, as in ``jit(vmap(grad(...)))`` of the
    UK equation, every thread waits for work queued behind itself and the program never returns (reproduced
    on 2 cores in 3 of 6 runs of 200 calls: ``benchmarks/lapack_batch_deadlock.py``; jax-ml/jax#39292 and
    #39383 describe the same ``ParallelBatchMap`` fan-out, and later jaxlib releases build open-source wheels
    without it; 0.10.2 is the newest jax on this project's package index, so it cannot be pinned away).
    The price: Cholesky + 3-column solve per matrix under ``vmap`` (batch 1024, 2-core CPU at load 17)
    3.9 µs against LAPACK's 1.1 µs at n = 12, 10.4 against 1.8 µs at n = 16; n ≤ 8 is unchanged.
    Derivatives by ordinary autodiff. A matrix that is not positive definite gives NaN entries, as
    ``jnp.linalg.cholesky`` does.
    """
    M = _check_matrix(M, "cholesky", square=True, arg="M")
    if M.shape[0] == 0:
        return M
    return _by_size(M.shape[0], _cholesky, M)


@functools.partial(jax.jit, static_argnums=1)
def _cholesky(M, unrolled):
    M = (M + M.T) / 2
    return _stack(_cholesky_entries(_entries(M))) if unrolled else _cholesky_loop(M)


def cho_solve(L, B):
    """Solve (L Lᵀ) X = B given the Cholesky factor L (n x n) of :func:`cholesky`; B is (n,) or (n, k).

    Forward then back substitution, unrolled for n ≤ 8, ``fori_loop`` substitution above (no LAPACK call,
    for the reason given in :func:`cholesky`).
    """
    L = _check_matrix(L, "cho_solve", square=True, arg="L")
    B = jnp.asarray(B)
    n = L.shape[0]
    if B.ndim not in (1, 2) or B.shape[0] != n:
        raise ValueError(f"cho_solve expects B of shape ({n},) or ({n}, k) for L of shape {L.shape}, "
                         f"got {B.shape}")
    if n == 0:
        return B.astype(jnp.result_type(L, B))
    B = B.astype(jnp.result_type(L, B))
    return _by_size(n, _cho_solve, L, B)


@functools.partial(jax.jit, static_argnums=2)
def _cho_solve(L, B, unrolled):
    n = L.shape[0]
    if unrolled:
        return jnp.stack(_materialized(_cho_solve_entries(_entries(L), [B[i] for i in range(n)])))
    return _substitution(L, _substitution(L, B, False, False), False, True)


def _triangular_rhs(L, B, where):
    L = _check_matrix(L, where, square=True, arg="L")
    B = jnp.asarray(B)
    if B.ndim not in (1, 2) or B.shape[0] != L.shape[0]:
        raise ValueError(f"{where} expects B of shape ({L.shape[0]},) or ({L.shape[0]}, k) for L of shape "
                         f"{L.shape}, got {B.shape}")
    return L, B.astype(jnp.result_type(L, B))


def solve_lower(L, B):
    """L⁻¹B for the Cholesky factor L of :func:`cholesky` (forward substitution; B is (n,) or (n, k)):
    half of :func:`cho_solve`, unrolled for n ≤ 8, a ``fori_loop`` above, no LAPACK call."""
    L, B = _triangular_rhs(L, B, "solve_lower")
    return B if L.shape[0] == 0 else _substitution(L, B, L.shape[0] <= _UNROLL_MAX, False)


def solve_lower_t(L, B):
    """L⁻ᵀB for the Cholesky factor L of :func:`cholesky` (back substitution; B is (n,) or (n, k)):
    ``cho_solve(L, B) = solve_lower_t(L, solve_lower(L, B))``."""
    L, B = _triangular_rhs(L, B, "solve_lower_t")
    return B if L.shape[0] == 0 else _substitution(L, B, L.shape[0] <= _UNROLL_MAX, True)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _substitution(L, B, unrolled, transposed):
    """L⁻¹B (forward substitution) or, ``transposed``, L⁻ᵀB (back substitution)."""
    n = L.shape[0]
    if not unrolled:
        every = jnp.ones(n, bool)
        return _solve_upper(L.T, B, every) if transposed else _solve_lower(L, B, every)
    entries = _back_entries if transposed else _forward_entries
    return jnp.stack(entries(_entries(L), [B[i] for i in range(n)]))


def gram(W):
    """WᵀW for W (n, m), exactly symmetric: for n, m ≤ ``SMALL_MATMUL_MAX`` the m(m + 1)/2 distinct entries
    as unrolled sums over the rows in order (each computed once, mirrored), else ``W.T @ W`` symmetrized."""
    W = jnp.asarray(W)
    n, m = W.shape
    if n == 0 or m == 0 or max(n, m) > SMALL_MATMUL_MAX:
        G = W.T @ W
        return (G + G.T) / 2
    cols = [[W[r, i] for r in range(n)] for i in range(m)]
    g = [[None] * m for _ in range(m)]
    for i in range(m):
        for k in range(i + 1):
            g[i][k] = g[k][i] = _dot(cols[i], cols[k], cols[i][0])
    return _stack(g)


def _psd_pinv_cholesky(G, rtol):
    """G⁺ for symmetric PSD G by pivoted (semi-definite) Cholesky, Πᵀ G Π = L Lᵀ (LAPACK ``xPSTRF``).

    At step j the largest diagonal entry of the Schur complement W among the rows not yet eliminated is the
    pivot p; once it is ≤ rtol·(first pivot) = rtol·max_i G_ii the rank r = j is reached and the remaining
    columns of F are zero. Column j of F is W[:, p] / √W_pp on the rows not yet eliminated, so F = Π L is
    built in G's own row order and nothing is permuted: p enters only through selects (gathers and
    scatters with a per-matrix index are slow under ``vmap``). With F (n x r, full column rank), G = F Fᵀ and
    G⁺ = F (Fᵀ F)⁻² Fᵀ = Y Yᵀ with Y = F (Fᵀ F)⁻¹; Fᵀ F is inverted by Cholesky on its r x r block (the
    identity is put on the unused diagonal).

    Written for XLA:CPU under ``vmap`` (``benchmarks/throughput.py --profile``): the pivot search and the
    column W[:, p] are unrolled compares and selects over static slices, not ``argmax``/``sum`` (reductions
    over an axis of length n are separate, slow kernels), and step j subtracts the rank-one term of step j-1
    from the loop carry, so that the new column is materialized before the n x n update reads it (fused,
    the update recomputed the pivot search for every entry). n = 4, batch 1024, 2-core CPU: 320 → 240 ns
    per matrix (G⁺ alone); in the SCARA right-hand side 640 → 555 ns.
    """
    n = G.shape[0]
    idx = jnp.arange(n)
    cutoff = rtol * functools.reduce(jnp.maximum, [G[i, i] for i in range(n)])

    def body(j, carry):
        W, col, F, free, alive, keep = carry
        W = W - col[:, None] * col[None, :]
        w_pp, p = jnp.where(free[0], W[0, 0], -jnp.inf), jnp.zeros((), idx.dtype)
        for i in range(1, n):
            d = jnp.where(free[i], W[i, i], -jnp.inf)
            p, w_pp = jnp.where(d > w_pp, i, p), jnp.maximum(d, w_pp)
        ok = alive & (w_pp > cutoff)
        w_p = functools.reduce(jnp.add, (jnp.where(p == k, W[:, k], 0) for k in range(n)))
        col = jnp.where(free, w_p, 0) * _safe_div(1, jnp.sqrt(jnp.where(ok, w_pp, 1)), ok)
        F = jax.lax.dynamic_update_slice(F, col[:, None], (0, j))
        return W, col, F, free & (idx != p), ok, keep | ((idx == j) & ok)

    init = (G, jnp.zeros(n, G.dtype), jnp.zeros_like(G), jnp.ones(n, bool), jnp.array(True),
            jnp.zeros(n, bool))
    *_, F, _, _, keep = _loop(n, body, init)
    FtF = small_matmul(F.T, F) + jnp.diag(jnp.where(keep, 0, 1).astype(G.dtype))
    Yt = jnp.where(keep[:, None], cho_solve(cholesky(FtF), F.T), 0)
    return small_matmul(Yt.T, Yt)


def _sweep_entries(g, cutoff):
    """Symmetric sweeps (Goodnight 1979) of a PSD matrix with diagonal pivoting, unrolled on nested lists of
    scalars (lower triangle); returns the lower triangle of -G⁻, G⁻ = Π [G_KK⁻¹ 0; 0 0] Πᵀ.

    Step j takes as pivot p the largest diagonal entry d = a_pp among the indices not yet swept (the
    diagonal of the Schur complement: complete pivoting for a semi-definite matrix, Higham 2002 §10.3) and
    sweeps on it: a_pp ← -1/d, a_ip ← a_ip/d, a_ij ← a_ij - a_ip a_pj/d (i, j ≠ p). After sweeping the set
    K of kept pivots, A holds -G_KK⁻¹ on K x K, G_KK⁻¹G_KU beside it and the Schur complement on the rest.
    A pivot ≤ ``cutoff`` (and every later one: the largest remaining diagonal is then at round-off level)
    is dropped instead: its row and column are set to 0 (1/d is replaced by 0), which leaves them 0 through
    later sweeps. The pivot is a per-matrix index: it enters through compares and selects only, and the
    column (a_ip)_i and 1/d of each step are materialized together in one kernel, so each entry of the next
    step is computed from its own previous value and those m + 1 numbers (without it XLA:CPU recomputed the
    whole chain of earlier steps in every kernel; see :func:`materialize`).
    """
    m = len(g)
    A = [[g[i][k] for k in range(i + 1)] for i in range(m)]
    zero = jnp.zeros_like(g[0][0])
    free, alive = [jnp.ones_like(zero, dtype=bool)] * m, jnp.ones_like(zero, dtype=bool)
    for _ in range(m):
        d_pp, p = jnp.where(free[0], A[0][0], -jnp.inf), zero
        for i in range(1, m):
            d = jnp.where(free[i], A[i][i], -jnp.inf)
            p, d_pp = jnp.where(d > d_pp, float(i), p), jnp.maximum(d, d_pp)
        alive = alive & (d_pp > cutoff)
        pick = [p == i for i in range(m)]
        col = [_select(pick, [A[max(i, k)][min(i, k)] for k in range(m)]) for i in range(m)]
        pivot = materialize(jnp.stack([*col, _safe_div(1, d_pp, alive), p]))
        col, inv, p = [pivot[i] for i in range(m)], pivot[m], pivot[m + 1]
        pick = [p == i for i in range(m)]
        v = [c * inv for c in col]
        A = [[jnp.where(pick[i], -inv, A[i][i] - col[i] * v[i]) if k == i else
              jnp.where(pick[i], v[k], jnp.where(pick[k], v[i], A[i][k] - col[i] * v[k]))
              for k in range(i + 1)] for i in range(m)]
        free = [f & ~s for f, s in zip(free, pick, strict=True)]
    return A


def _select(pick, values):
    """The value whose flag in ``pick`` is set (exactly one is), as a chain of selects."""
    out = values[0]
    for flag, value in zip(pick[1:], values[1:], strict=True):
        out = jnp.where(flag, value, out)
    return out


def _sweep_loop(G, cutoff):
    """:func:`_sweep_entries` as a ``fori_loop`` over pivot steps on the full matrix, for m above the unroll
    limit; returns -G⁻. The pivot search is unrolled compares over the diagonal and the pivot's column a
    sum of selects over static slices (no ``argmax``, no gather), as in :func:`psd_pinv`."""
    m = G.shape[0]
    idx = jnp.arange(m)

    def body(j, carry):
        A, free, alive = carry
        d_pp, p = jnp.where(free[0], A[0, 0], -jnp.inf), jnp.zeros((), idx.dtype)
        for i in range(1, m):
            d = jnp.where(free[i], A[i, i], -jnp.inf)
            p, d_pp = jnp.where(d > d_pp, i, p), jnp.maximum(d, d_pp)
        alive = alive & (d_pp > cutoff)
        inv = _safe_div(1, d_pp, alive)
        pick = idx == p
        col = functools.reduce(jnp.add, (jnp.where(p == k, A[:, k], 0) for k in range(m)))
        v = col * inv
        A = jnp.where(pick[:, None], v[None, :], jnp.where(pick[None, :], v[:, None], A - jnp.outer(col, v)))
        A = jnp.where(pick[:, None] & pick[None, :], -inv, A)
        return A, free & ~pick, alive

    return _loop(m, body, (G, jnp.ones(m, bool), jnp.array(True)))[0]


@functools.partial(jax.jit, static_argnums=2)
def _psd_ginv_program(G, rtol, unrolled):
    return _guarded(functools.partial(_psd_ginv_ldl, unrolled=unrolled), (G + G.T) / 2, rtol)


def _psd_ginv_ldl(G, rtol, unrolled):
    m = G.shape[0]
    cutoff = rtol * functools.reduce(jnp.maximum, [G[i, i] for i in range(m)])
    if unrolled:
        A = _sweep_entries(_entries(materialize(G) if m >= _MATERIALIZE_GRAM_FROM else G), cutoff)
        return -_stack([[A[max(i, k)][min(i, k)] for k in range(m)] for i in range(m)])
    return -_sweep_loop(G, cutoff)


def psd_ginv(G, rtol=None):
    """A symmetric reflexive generalized inverse G⁻ of a symmetric positive semi-definite m x m matrix by
    diagonally pivoted LDLᵀ in its sweep form: Πᵀ G Π = L D Lᵀ with the pivots in decreasing order, the
    pivots ≤ ``rtol * max_i G_ii`` (and all after them) dropped, and
    G⁻ = Π L⁻ᵀ D⁺ L⁻¹ Πᵀ = Π [G_KK⁻¹ 0; 0 0] Πᵀ, the inverse of the principal submatrix on the kept pivots
    K, computed by symmetric sweeps (Goodnight 1979) without forming L.

    G G⁻ G = G and G⁻ G G⁻ = G⁻ (Penrose conditions 1 and 2), but G G⁻ is an oblique projector, so G⁻ is the
    Moore-Penrose inverse only when G is nonsingular. That is all the UK equation needs for consistent
    constraints: every solution λ of G λ = r, r ∈ range(G) = range(A), gives the same Aᵀλ, because
    null(G) = null(Aᵀ) for G = A M⁻¹Aᵀ with positive-definite M; so q̈ = a + M⁻¹Aᵀ G⁻(b - A a) equals the
    Moore-Penrose form (de Falco et al., eq. 35) for redundant (rank-deficient) constraints too. For
    inconsistent b it is not the least-squares acceleration: A q̈ - b is then the residual of an oblique
    projection (use :func:`psd_pinv`).

    Pivoting (the largest remaining diagonal entry, Higham 2002 §10.3) is what makes the rank decision
    reliable: it keeps every multiplier |l_ij| ≤ 1, so the round-off left in the Schur complement of a
    dropped direction stays of order m eps ‖G‖, below the cut. Without it a tiny but kept pivot (a direction
    about to become singular, e.g. a linkage approaching a flat configuration, next to a redundant one)
    makes multipliers of order 1/pivot, and the redundant direction's pivot, exactly 0 in exact arithmetic,
    comes out as round-off times those multipliers squared, far above the cut: the five-bar linkage of
    :mod:`ukjax.models.five_bar` at 1e-6 rad from its flat configuration gave a pivot of 1e-4 instead of
    ~1e-16 and a G⁻ with entries 4e16 (‖G G⁻ G - G‖ = 6.5 for ‖G‖ = 8), and its simulation stopped there.

    Cost: for m ≤ 8 the sweeps are unrolled scalar code (the pivot enters through compares and selects, the
    rows are never permuted), which fuses across a ``vmap`` batch; above, one ``fori_loop`` over pivot steps;
    against :func:`psd_pinv`, no second factorization. The pivot search costs time the unpivoted LDLᵀ (the
    default before) did not spend: ``benchmarks/results/default-method-ab-cpu.json`` has the measurement.
    Default ``rtol``: m eps, as :func:`psd_pinv`. Derivatives by autodiff through the
    factorization, exact where the pivot order and the set of dropped pivots are locally constant (also at
    a rank-deficient G, along perturbations that keep its rank). Non-finite G gives an all-NaN result.
    """
    G = _check_matrix(G, "psd_ginv", square=True, arg="G")
    check_rtol(rtol, "psd_ginv")
    if G.size == 0:
        return G
    return _by_size(G.shape[0], _psd_ginv_program, G, jax.lax.stop_gradient(_rtol_array(rtol, G)))


def psd_pinv(G, rtol=None):
    """Moore-Penrose inverse of a symmetric positive semi-definite n x n matrix G by pivoted Cholesky.

    G = F Fᵀ with F of full column rank r, G⁺ = F (Fᵀ F)⁻² Fᵀ. This is the m x m generalized inverse of
    Q = A M⁻¹ Aᵀ in the UK equation (seed 004 eq. 34-36), at a fraction of the cost of an SVD.
    ``rtol`` is relative to G's own eigenvalue scale: a pivot ≤ ``rtol * max_i G_ii`` counts as zero (default
    ``n * eps``, the LAPACK ``xPSTRF`` default; :func:`ukjax.dynamics.gram_rtol` for the UK equation).
    Since λ(G) = σ(A M^{-1/2})², a singular-value tolerance τ of A corresponds to τ² here.

    Accuracy: G⁺ errs like cond(G) eps = cond(B)² eps for G = B Bᵀ, the square of what an SVD of B gives,
    and a direction of B with σ/σ₁ below √(rtol) is indistinguishable from round-off in G (float32:
    √(n eps) ≈ 1e-3). When G is formed from B to be inverted, as in the UK equation, and cond(B) is large,
    use :func:`pinv` on B instead (``uk_acceleration(method="svd")``, the reference form).

    Reads (G + Gᵀ)/2. Derivatives: the Golub-Pereyra formula of :func:`pinv`. Non-finite G gives an all-NaN
    result; a concrete negative or NaN ``rtol`` raises ``ValueError``, a traced one gives NaN.
    """
    G = _check_matrix(G, "psd_pinv", square=True, arg="G")
    check_rtol(rtol, "psd_pinv")
    if G.size == 0:
        return G
    return _inverse_program(_psd_pinv_cholesky, G, _rtol_array(rtol, G), True)
