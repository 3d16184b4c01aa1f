"""No loop inside the right-hand side of the GPU program (issue 40, "Tuning"), checked without a GPU.

``jax.export`` lowers a program for CUDA on a CPU-only machine (it lowers, it does not compile). On a GPU
every trip of a ``stablehlo.while`` costs kernel launches and, unless XLA captures the loop in a CUDA graph,
a device-to-host copy of its condition; a loop nested in the solver's step loop pays that at every
evaluation of the right-hand side. The entrywise SCARA right-hand side assembles its outputs behind
``ukjax._entrywise._fence``, a one-trip while loop that pays on XLA:CPU only, so it must be lowered for CPU
and not for CUDA.

The outer loops (diffrax's step loop and the loops of its bounded while, ukjax's loop over the saved
times, the ``lax.map`` over chunks) are told apart from loops inside the right-hand side by a baseline:
the same program with the entrywise path off (``entrywise_min_batch=None``: the ``vmap`` program, whose
SCARA right-hand side is unrolled small-matrix code without any loop). The CUDA program must hold exactly
the baseline's loops at the baseline's nesting depths; the CPU program one more, nested deeper (the fence).
``benchmarks/cuda_lowering.py`` counts them (results in benchmarks/results/cuda-lowering-loops.json).
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cuda_lowering  # noqa: E402

_CACHE: dict = {}
# The platforms each program is lowered for: both, except the SCARA vmap program, which only the tree test
# reads, as the CUDA baseline of the outer loops (its CPU lowering was never read).
_PLATFORMS = {"scara_forward_vmap": ("cuda",)}


def _loops(program: str, platform: str) -> dict:
    """The loops of a program of benchmarks/cuda_lowering.py lowered for a platform: traced once, lowered
    for the platforms the tests read (CUDA and CPU; lowering only, nothing compiled)."""
    if program not in _CACHE:
        fn, args = cuda_lowering.PROGRAMS[program]()
        texts = cuda_lowering.lowered_texts(fn, *args, platforms=_PLATFORMS.get(program, ("cuda", "cpu")))
        _CACHE[program] = {p: cuda_lowering.loops(text) for p, text in texts.items()}
    return _CACHE[program][platform]


def test_lowering_for_cuda_is_what_jax_export_gives():
    import jax.numpy as jnp

    from ukjax._entrywise import _fence, _objects

    def f(x):
        entries = [_objects((2,), [x, 2 * x])]
        return _fence(lambda es: [jnp.stack(list(e.flat)) for e in es], entries)

    texts = cuda_lowering.lowered_texts(f, jnp.ones(3))
    for platform, count in (("cuda", 0), ("cpu", 1)):
        exported = cuda_lowering.export_text(f, jnp.ones(3), platform=platform)
        assert texts[platform].count("stablehlo.while") == exported.count("stablehlo.while") == count


def test_loop_count_sees_nesting_through_calls():
    import jax
    import jax.numpy as jnp

    def inner(x):
        return jax.lax.fori_loop(0, 3, lambda i, v: v * 2, x)

    def f(x):
        return jax.lax.fori_loop(0, jnp.int32(x[0]) + 2, lambda i, v: jax.jit(inner)(v), x)

    found = cuda_lowering.loops(cuda_lowering.export_text(f, jnp.ones(3)))
    assert found["while"] == 2 and found["while_by_depth"] == {"0": 1, "1": 1}


@pytest.mark.parametrize(
    "program",
    [
        "scara_forward_chunked",  # 128 scenarios in two chunks of 64: the values behind the fence on CPU
        "scara_tuner_gradient",  # forward-mode gradient (ForwardMode): the tangents behind the fence on CPU
    ],
)
def test_cuda_program_has_no_loop_inside_the_right_hand_side(program):
    baseline = _loops(program + "_vmap", "cuda")
    cuda = _loops(program, "cuda")
    assert cuda["while"] == baseline["while"], (cuda, baseline)
    assert cuda["while_by_depth"] == baseline["while_by_depth"], (cuda, baseline)
    assert cuda["custom_calls"] == {}, cuda


@pytest.mark.parametrize("program", ["scara_forward_chunked", "scara_tuner_gradient"])
def test_cpu_program_keeps_the_fence(program):
    baseline = _loops(program + "_vmap", "cpu")
    cpu = _loops(program, "cpu")
    assert cpu["while"] == baseline["while"] + 1, (cpu, baseline)
    deepest = max(int(d) for d in baseline["while_by_depth"])
    assert cpu["while_by_depth"].get(str(deepest + 1)) == 1, (cpu, baseline)


def test_tree_recursions_are_loop_free_on_cuda_and_loops_on_cpu():
    """The 8-link chain's kinematic-tree recursions (``Tree._down``/``_up``: ``lax.scan`` over the joints)
    are unrolled in the CUDA program (issue 41) and stay loops on the CPU (fast to compile there). The
    outer loops are the SCARA vmap program's: the same ``simulate_batch`` structure (one chunk, fixed step,
    saves) around a right-hand side without any loop."""
    outer = _loops("scara_forward_vmap", "cuda")
    cuda, cpu = _loops("chain8_forward", "cuda"), _loops("chain8_forward", "cpu")
    assert cuda["while_by_depth"] == outer["while_by_depth"], (cuda, outer)
    deepest_outer = max(map(int, outer["while_by_depth"]))
    inner = sum(v for d, v in cpu["while_by_depth"].items() if int(d) > deepest_outer)
    assert inner >= 2, cpu  # at least one downward and one upward scan per evaluation on the CPU
