"""A CPU batch in chunks whose loops XLA:CPU compiles whole (``chunk_size="auto"``,
:func:`ukjax.options.whole_loop_chunk`): the chunk chosen from the step's bytes, the loop compiled as one
function, and the trajectories those of the batch in one ``vmap``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax import simulation
from ukjax.models import chain
from ukjax.options import DEFAULT_CPU_CHUNK, WHOLE_LOOP_STEP_BYTES, whole_loop_chunk


def test_whole_loop_chunk_is_the_largest_power_of_two_within_the_budget():
    budget = WHOLE_LOOP_STEP_BYTES
    assert whole_loop_chunk(budget // 16, 256) == 16  # 16 x step = the budget exactly
    assert whole_loop_chunk(budget // 16 + 1, 256) == 8
    assert whole_loop_chunk(budget, 256) == 1 and whole_loop_chunk(10 * budget, 256) == 1  # at least one
    assert whole_loop_chunk(1, 256) == 256 and whole_loop_chunk(1, 100) == 64  # never above chunk_size
    # a system evaluated entry by entry keeps the entrywise batch, where the chunk allows it
    assert whole_loop_chunk(budget // 4, 256, entrywise_min_batch=64) == 64
    assert whole_loop_chunk(budget // 4, 32, entrywise_min_batch=64) == 4
    assert whole_loop_chunk(1, 256, entrywise_min_batch=64) == 256


def _chain_batch(batch: int):
    params = chain.default_params(4)
    q0, qd0 = chain.initial_state(params)
    qd0s = jnp.tile(qd0, (batch, 1)) + 0.05 * jnp.linspace(-1.0, 1.0, batch)[:, None]
    return chain.multibody_system(4), jnp.tile(q0, (batch, 1)), qd0s, params


def _chosen_chunk(system, q0s, qd0s, params, chunk_size="auto", cost=False):
    arguments = dict(simulation.OPTION_DEFAULTS, system=system, q0=q0s, qd0=qd0s, params=params,
                     batch_params=False, chunk_size=chunk_size, solver=ukjax.RK4(), dt=1e-3,
                     t1=0.02)  # fmt: skip
    config, numbers, q0s, qd0s, params, chunk = simulation._batch_arguments(arguments)
    return (chunk, simulation._step_cost(system, config, numbers, q0s, qd0s, params)) if cost else chunk


def test_auto_chunks_are_compiled_whole_and_give_the_one_vmap_trajectories():
    """The pinned 4-link chain (a kinematic tree with a loop-closing constraint, RK4 at 1 ms), 64 scenarios:
    "auto" takes the chunk of ``whole_loop_chunk`` (16 of its ~230 kB steps within 6 MB; not entry by
    entry, since the tree's recursions have no entry rules); XLA:CPU compiles that chunk's loop into one
    function (one more ``xla_cpu_small_call`` in the compiled program than in the whole batch's); every
    scenario's state after 20 steps is the one of the whole batch in one ``vmap`` (``chunk_size=None``, run
    kernel by kernel: the same arithmetic, compiled differently; 1e-13 of states of order 1)."""
    if not ukjax._config.cpu_loops_compiled_whole():
        pytest.skip("this process's XLA:CPU does not compile small loops whole (XLA_FLAGS set a threshold)")
    system, q0s, qd0s, params = _chain_batch(64)
    chunk, (step_bytes, entrywise) = _chosen_chunk(system, q0s, qd0s, params, cost=True)
    assert not entrywise and chunk == whole_loop_chunk(step_bytes, DEFAULT_CPU_CHUNK) and 1 < chunk < 64

    def final(chunk_size):
        run = lambda q0, qd0, p: ukjax.simulate_batch(  # noqa: E731
            system, q0, qd0, p, t1=0.02, ts=[0.02], dt=1e-3, solver=ukjax.RK4(), chunk_size=chunk_size
        ).q[:, -1]
        compiled = jax.jit(run).lower(q0s, qd0s, params).compile()
        return compiled.as_text(), np.asarray(compiled(q0s, qd0s, params))

    (text, chunked), (text_whole_batch, whole_batch) = final("auto"), final(None)
    # one more loop compiled as one function: the chunk's integration (the whole batch's is above 4 MiB)
    assert text.count("xla_cpu_small_call") > text_whole_batch.count("xla_cpu_small_call")
    assert np.ptp(chunked[:, 0]) > 1e-3  # the scenarios differ
    np.testing.assert_allclose(chunked, whole_batch, rtol=0, atol=1e-13)


def test_auto_keeps_chunks_of_256_kernel_by_kernel_and_under_differentiation(monkeypatch):
    """Where XLA:CPU runs loops kernel by kernel (a threshold of the user's), small chunks would pay for
    every kernel's dispatch with fewer scenarios, and a differentiated batch (reverse or forward mode)
    compiled up to 2.2x longer in small chunks: "auto" stays at :data:`DEFAULT_CPU_CHUNK` for both; a chunk
    size given is kept either way."""
    system, q0s, qd0s, params = _chain_batch(8)
    monkeypatch.setattr(simulation, "cpu_loops_compiled_whole", lambda: True)
    assert _chosen_chunk(system, q0s, qd0s, params) < DEFAULT_CPU_CHUNK
    assert _chosen_chunk(system, q0s, qd0s, params, chunk_size=128) == 128
    seen = []

    def chosen(scale):
        seen.append(_chosen_chunk(system, q0s, qd0s * scale, params))
        return scale

    jax.grad(chosen)(1.0)
    jax.jvp(chosen, (1.0,), (1.0,))
    jax.jit(chosen)(1.0)  # traced, not differentiated
    assert seen[:2] == [DEFAULT_CPU_CHUNK] * 2 and seen[2] < DEFAULT_CPU_CHUNK
    monkeypatch.setattr(simulation, "cpu_loops_compiled_whole", lambda: False)
    assert _chosen_chunk(system, q0s, qd0s, params) == DEFAULT_CPU_CHUNK


def test_step_costs_are_kept_for_a_bounded_number_of_systems(monkeypatch):
    """The step's bytes are traced once per system, configuration and shapes and kept, at most
    ``kept`` of them (a script that builds systems in a loop keeps no more), the oldest going
    first; a system seen again is read back, not traced."""
    counted = []
    count = simulation.entry_operations
    monkeypatch.setattr(simulation, "entry_operations", lambda jaxpr: counted.append(1) or count(jaxpr))
    monkeypatch.setattr(simulation, "_STEP_COSTS", simulation._PerProgram(kept=2))
    monkeypatch.setattr(simulation, "cpu_loops_compiled_whole", lambda: True)
    systems = {links: chain.multibody_system(links) for links in (2, 3, 4)}
    for links in (2, 3, 2, 4, 3, 2):
        params = chain.default_params(links)
        q0, qd0 = chain.initial_state(params)
        _chosen_chunk(systems[links], q0[None], qd0[None], params)
    # traced: 2, 3, (2 read back), 4 (2 goes), (3 read back), 2 again
    assert len(counted) == 4 and len(simulation._STEP_COSTS) == 2
