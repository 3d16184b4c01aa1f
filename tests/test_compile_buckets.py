"""Batch-size buckets (issue 40): ``simulate_batch`` pads a batch to a bucket size with copies of its last
scenario and drops their results, so nearby batch sizes share one compiled program.

Checked on the damped pendulum (n = 2, 20 fixed steps, 5 saves): the real scenarios' solutions, statuses
and step counts are bitwise those of the unpadded batch (the computation per scenario is the same; the
right-hand side is evaluated entry by entry exactly when the unpadded batch would be); one compilation per
bucket (counted by JAX's trace events of the simulation program); the gradient through a padded batch
equals the unpadded one to 1e-15 (the padded scenarios get zero cotangents; only the order of the batch sum
of a shared parameter's gradient can change); bad input raises the same errors, bucketed or not.
"""

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PENDULUM

from ukjax import options, simulation
from ukjax.simulation import RESULTS, simulate_batch

RUN = dict(t1=0.2, dt=0.01, ts=jnp.linspace(0.0, 0.2, 5))

_traced: list[str] = []


def _on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_trace_duration":
        _traced.append(str(kwargs.get("fun_name", "")))


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _simulations_traced(run) -> int:
    """How many times ``run()`` traced (and so compiled) the batch simulation program."""
    start = len(_traced)
    run()
    return sum(name == "_simulate_many" for name in _traced[start:])


def _batch(count):
    thetas = np.linspace(-1.0, 1.2, count)
    q0s = jnp.asarray(np.stack([0.8 * np.sin(thetas), -0.8 * np.cos(thetas)], axis=1))
    qd0s = jnp.asarray(np.stack([0.4 * np.cos(thetas), 0.4 * np.sin(thetas)], axis=1))
    fixed = dict(g=9.81, l=0.8, alpha=5.0, beta=20.0)
    params = dict(m=np.linspace(0.5, 2.0, count), c=np.linspace(0.0, 0.5, count))
    params |= {name: np.full(count, value) for name, value in fixed.items()}
    return q0s, qd0s, {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}


def _assert_identical(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_buckets_are_two_per_octave_and_whole_chunks_above_one_chunk():
    assert [options.bucket_of(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert [options.bucket_size(n, 256) for n in (100, 120, 200, 250, 256, 257, 1000, 1020)] == [
        128, 128, 256, 256, 256, 512, 1024, 1024]  # fmt: skip
    assert options.bucket_size(200, 150) == 300  # 2 chunks of 150, as unpadded (chunked either way)
    assert options.bucket_size(120, 100) == 200 and options.bucket_size(90, 100) == 96
    assert options.bucket_size(1_000_000, None) == 2**20
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="bucket"):
            options.bucket_of(bad)


def test_padded_chunks_are_bitwise_the_unpadded_chunks():
    """5 scenarios in chunks of 2: padded to 4 chunks of 2 (unpadded: 3 chunks of 2, one copy)."""
    q0s, qd0s, params = _batch(5)
    chunk_size = 2
    exact = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, chunk_size=chunk_size,
                           bucket=False, **RUN)  # fmt: skip
    padded = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, chunk_size=chunk_size, **RUN)
    assert padded.q.shape[0] == 5
    _assert_identical(padded, exact)
    assert exact.ok.all() and float(jnp.abs(exact.q[0, -1] - exact.q[4, -1]).max()) > 1e-2


def test_entrywise_choice_follows_the_unpadded_batch(monkeypatch):
    """With the entrywise threshold at 6, 5 scenarios are evaluated by vmap even when padded to 6 (bitwise
    the unpadded batch), and 6 scenarios entry by entry: two programs in that bucket, no other change."""
    monkeypatch.setattr(options, "ENTRYWISE_MIN_BATCH", 6)
    q0s, qd0s, params = _batch(6)
    five = lambda **kw: simulate_batch(PENDULUM, q0s[:5], qd0s[:5], {k: v[:5] for k, v in params.items()},
                                       batch_params=True, **kw, **RUN)  # fmt: skip
    _assert_identical(five(), five(bucket=False))
    six = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, **RUN)
    np.testing.assert_allclose(np.asarray(six.q[:5]), np.asarray(five().q), rtol=0, atol=1e-14)


def test_one_compilation_per_bucket():
    """5 and 6 scenarios share the bucket of 6: one program; unbucketed, 5 compiles one of its own, and
    the padded batch of 5 (one vmap of 6) is bitwise the unpadded one."""
    jax.clear_caches()
    q0s, qd0s, params = _batch(6)
    solutions = {}

    def run(count, bucket):
        pick = lambda x: x[:count]
        sol = simulate_batch(PENDULUM, pick(q0s), pick(qd0s), jax.tree_util.tree_map(pick, params),
                             batch_params=True, bucket=bucket, **RUN)  # fmt: skip
        solutions[count, bucket] = jax.block_until_ready(sol)
        assert sol.q.shape[0] == count

    assert _simulations_traced(lambda: [run(6, True), run(5, True), run(6, False)]) == 1
    assert _simulations_traced(lambda: run(5, False)) == 1
    _assert_identical(solutions[5, True], solutions[5, False])
    assert solutions[5, False].ok.all()


def test_gradient_through_a_padded_batch(monkeypatch):
    """The gradient of a shared parameter sums over the batch: the padded scenarios add zero cotangents,
    and only the order of floating-point operations may change (the fixed-step batch is one solve whose
    width is the padded batch's): agreement to 1e-15 of the largest gradient component (measured: 7e-16),
    where one padded scenario's contribution would be ~1/5 of it. The shared parameters are scenario 1's,
    whose drag (c = 0.125) makes the motion depend on the mass."""
    pads = []
    pad = simulation._pad_batch
    monkeypatch.setattr(simulation, "_pad_batch", lambda tree, size: pads.append(size) or pad(tree, size))
    q0s, qd0s, params = _batch(5)
    shared = {k: v[1] for k, v in params.items()}

    def loss(p, bucket, q0s=q0s):
        sol = simulate_batch(PENDULUM, q0s, qd0s, p, bucket=bucket, **RUN)
        return jnp.sum(sol.q[:, -1] ** 2) + jnp.sum(sol.qd[:, 2])

    # the unpadded reference in one compiled program (bucket=False: nothing is padded either way); an eager
    # grad compiles the forward and the transposed halves apart, with op-by-op glue. The padded gradient
    # stays eager: traced into a jit nothing would be padded (below).
    exact = jax.jit(jax.grad(loss), static_argnums=1)(shared, False)
    padded = jax.grad(loss)(shared, True)
    assert pads == [6]
    scale = max(float(jnp.abs(g)) for g in exact.values())
    for name in shared:
        np.testing.assert_allclose(np.asarray(padded[name]), np.asarray(exact[name]), rtol=1e-15,
                                   atol=1e-15 * scale, err_msg=name)  # fmt: skip
    assert all(float(jnp.abs(exact[name])) > 0 for name in ("m", "c", "alpha", "beta"))
    # Traced into a caller's own jit nothing is padded (no compilation to save there).
    jax.make_jaxpr(lambda q: loss(shared, True, q))(q0s)
    assert pads == [6]


def test_nonfinite_scenario_and_bad_input_as_unpadded():
    """A NaN parameter of the last scenario (the one copied into the padding) gives that scenario alone
    status nonfinite_state, as unpadded; wrong input raises the same errors with or without buckets."""
    q0s, qd0s, params = _batch(5)
    params = dict(params, m=params["m"].at[4].set(jnp.nan))
    with pytest.warns(UserWarning, match="nonfinite_state"):
        padded = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, **RUN)
    with pytest.warns(UserWarning, match="nonfinite_state"):
        exact = simulate_batch(PENDULUM, q0s, qd0s, params, batch_params=True, bucket=False, **RUN)
    _assert_identical(padded, exact)
    assert padded.status.tolist() == [RESULTS.success] * 4 + [RESULTS.nonfinite_state]

    good = _batch(5)
    for bucket in (True, False):
        for change, match in (
            (lambda q, qd, p: (q[:, :1], qd, p), "q0"),
            (lambda q, qd, p: (q.at[1, 0].set(jnp.inf), qd, p), "q0"),
            (lambda q, qd, p: (q, qd[:4], p), "qd0"),
        ):
            with pytest.raises(ValueError, match=match):
                simulate_batch(PENDULUM, *change(*good), batch_params=True, bucket=bucket, **RUN)
        with pytest.raises(ValueError, match="chunk_size"):
            simulate_batch(PENDULUM, *good, batch_params=True, bucket=bucket, chunk_size=0, **RUN)
    with pytest.raises(ValueError, match="bucket"):
        simulate_batch(PENDULUM, *good, batch_params=True, bucket="yes", **RUN)
