"""One scenario's integration loop holds no buffer above 512 bytes, so XLA:CPU runs its kernels in order.

XLA:CPU's runtime runs a compiled loop body's kernels one after the other in the calling thread only when
every buffer the body touches is at most 512 bytes (``execute_sequential_buffer_threshold`` of its
``ThunkExecutor``); one larger buffer makes it dispatch them to its thread pool, which for one scenario's
~200 tiny kernels per step cost the Panda 2.5x per step. Two things keep a tree's buffers small: the
parameters enter diffrax's loop split into rows (``ukjax.simulation._in_small_pieces``) and a tree whose
recursions are unrolled keeps its per-body values body by body (``ukjax.multibody.per_body_values``), both
only where the integrated state is that small and XLA:CPU runs the loop kernel by kernel: ``import ukjax``
has it compile such loops into one function instead (``ukjax.whole_cpu_loops``), so this module traces as a
process would where that is not in effect (``simulation.cpu_loops_compiled_whole`` False). Checked on the
compiled program's text, not by timing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ukjax
from ukjax import multibody, simulation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import hlo_computations  # noqa: E402

_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


@pytest.fixture(autouse=True, scope="module")
def loops_run_kernel_by_kernel():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulation, "cpu_loops_compiled_whole", lambda: False)
        yield


def loop_buffers(hlo: str) -> list[tuple[str, int]]:
    """(array type, bytes) of every array value inside the while loops of an HLO module: the bodies and
    conditions and the computations they call, not the inside of fusions (held in registers)."""
    _, computations = hlo_computations(hlo)
    called = re.compile(r"(?:body|condition|to_apply|branch_computations)=\{?((?:%[\w.\-]+(?:, )?)+)\}?")
    pending = [name for lines in computations.values() for line in lines if " while(" in line
               for name in re.findall(r"(?:body|condition)=%([\w.\-]+)", line)]  # fmt: skip
    seen, found = set(), []
    while pending:
        name = pending.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for line in computations[name]:
            for group in called.findall(line):
                pending += re.findall(r"%([\w.\-]+)", group)
            value = re.match(r"\s*(?:ROOT )?%[\w.\-]+ = (\w+)\[([\d,]*)\]", line)
            if value and value.group(1) in _BYTES:
                count = int(np.prod([int(d) for d in value.group(2).split(",") if d]))
                found.append((f"{value.group(1)}[{value.group(2)}]", count * _BYTES[value.group(1)]))
    return found


def _nine_bodies():
    """A Panda-like tree: a chain of 7 revolute joints about skew axes with rotated joint frames, and two
    prismatic fingers on its last body (9 bodies, 9 velocities; (9, 3, 3) float64 arrays are 648 bytes)."""
    rng = np.random.default_rng(3)
    axes = [(0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (0.0, 0.6, 0.8), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0),
            (0.8, 0.0, 0.6), (0.0, 1.0, 0.0)]  # fmt: skip
    joints = (*(multibody.revolute(a) for a in axes), multibody.prismatic((0.0, 1.0, 0.0)),
              multibody.prismatic((0.0, -1.0, 0.0)))  # fmt: skip
    tree = multibody.Tree((-1, 0, 1, 2, 3, 4, 5, 6, 6), joints)
    n = tree.num_bodies
    inertia = np.stack([m @ m.T + np.eye(3) for m in 0.1 * rng.normal(size=(n, 3, 3))])
    params = {
        "offset": jnp.asarray(0.3 * rng.normal(size=(n, 3))), "mass": jnp.asarray(1.0 + rng.random(n)),
        "com": jnp.asarray(0.1 * rng.normal(size=(n, 3))), "inertia": jnp.asarray(0.1 * inertia),
        "rotation": jnp.asarray(np.stack([np.linalg.qr(m)[0] for m in rng.normal(size=(n, 3, 3))])),
        "gravity": jnp.asarray([0.0, 0.0, -9.81]),
    }  # fmt: skip
    bodies = lambda p: multibody.Bodies(p["offset"], p["mass"], p["com"], p["inertia"], p["rotation"])
    system = tree.system(bodies, lambda p: p["gravity"])
    q0 = jnp.asarray(rng.uniform(-1.0, 1.0, n))
    qd0 = jnp.asarray(rng.uniform(-1.0, 1.0, n))
    return system, params, q0, qd0


def test_parameters_split_into_rows_and_restacked_exactly():
    """Arrays of more than 512 bytes per scenario with two axes or more are split into rows (recursively,
    batch axis kept); vectors, small arrays and scalars pass as they are; restacking gives them back bit
    for bit."""
    params = {"inertia": jnp.arange(81.0).reshape(9, 3, 3), "table": jnp.arange(100.0),
              "small": jnp.ones((6, 3, 3)), "scalar": jnp.asarray(2.0),
              "big": jnp.ones((3, 20, 20))}  # fmt: skip
    for batched, batch in ((False, ()), (True, (2,))):
        given = jax.tree.map(lambda x, batch=batch: jnp.broadcast_to(x, batch + x.shape), params)
        pieces, restore = simulation._in_small_pieces(given, batched)
        for leaf in jax.tree.leaves(pieces):
            per_scenario = leaf.shape[len(batch):]
            assert len(per_scenario) < 2 or leaf[(0,) * len(batch)].nbytes <= simulation.SMALL_BUFFER_BYTES
        assert len(jax.tree.leaves(pieces)) == 9 + 1 + 1 + 1 + 3 * 20
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), restore(pieces), given)


@pytest.fixture(scope="module")
def nine_bodies_one_scenario():
    system, params, q0, qd0 = _nine_bodies()
    run = lambda q0, qd0, p: ukjax.simulate(system, q0, qd0, p, t1=0.02, dt=1e-3, ts=[0.02],
                                            solver=ukjax.RK4()).q  # fmt: skip
    return jax.jit(run), (q0, qd0, params)


def _eight_link_chain():
    """The unconstrained 8-link planar chain of ``ukjax.models.chain`` as a kinematic tree: a serial chain,
    whose recursions one scenario's solve unrolls, its bodies kept apart ((8, 3, 3) is 576 bytes)."""
    from ukjax.models import chain

    system = chain.tree(8).system(chain.bodies, chain._gravity, applied_force=chain.joint_damping)
    params = chain.default_params(8)
    q0, qd0 = chain.initial_state(params)
    run = lambda q0, qd0, p: ukjax.simulate(system, q0, qd0, p, t1=0.02, dt=1e-3, ts=[0.02],
                                            solver=ukjax.RK4()).q  # fmt: skip
    return jax.jit(run), (q0, qd0 + 0.3, params)


@pytest.mark.parametrize("model", ["nine-body tree", "eight-link chain"])
def test_one_scenario_loops_over_small_buffers(model, nine_bodies_one_scenario):
    """The compiled one-scenario RK4 solve of the 9-body tree and of the unconstrained 8-link chain:
    diffrax's step loop and everything it calls hold no array above 512 bytes (before, the (9, 3, 3)
    inertias and rotations, the joint rotations evaluated for all bodies at once and a chain's stacked
    per-body values were 576-648 bytes each)."""
    program, args = nine_bodies_one_scenario if model == "nine-body tree" else _eight_link_chain()
    hlo = program.lower(*args).compile().as_text()
    buffers = loop_buffers(hlo)
    assert len(buffers) > 100  # the loops were found
    big = sorted({b for b in buffers if b[1] > simulation.SMALL_BUFFER_BYTES})
    assert not big, f"arrays above {simulation.SMALL_BUFFER_BYTES} bytes inside the loop: {big}"


def test_split_parameters_give_the_same_trajectory(nine_bodies_one_scenario, monkeypatch):
    """The same solve with the parameters passed whole (the engine before): the same final state to
    1e-14 (the same arithmetic; only the buffers differ)."""
    program, args = nine_bodies_one_scenario
    split = program(*args)
    monkeypatch.setattr(simulation, "_small_state", lambda y0: False)
    jax.clear_caches()
    whole = jax.jit(program.__wrapped__)(*args)
    assert np.all(np.isfinite(split))
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-14)
