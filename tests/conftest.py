"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

The suite runs in one process. Three full runs aborted inside XLA ~460 tests in (compiling, or writing the
3RRR test's program to JAX's persistent compilation cache); each file alone passed. The process's count of
memory maps was growing towards the kernel's limit (``vm.max_map_count``, 65530): ~14,700 within one test
module, falling back after ``jax.clear_caches()``. So every test module's compiled programs are released when
it ends (the fixture below). The persistent cache stays off for the suite: tests that call the ``ukjax``
command in-process would turn it on (``ukjax.cli.main`` does, as the command should), and a run with it on,
in a fresh folder, was 1035 s against 1129 s without (one run each, load ~1.5), and one folder shared by both
workers with the compiler flags below 554 s against 542 s: too small a gain to bring back the code path of
the first aborts. The cache itself is tested in a subprocess
(``tests/test_compile_and_gradient.py``), which this file does not affect.
"""

import os
import tempfile

# Compile faster: the suite's time is XLA compilation (~60 % of it backend compilation, measured with
# jax.monitoring's compile events over the whole suite), and what it checks is what the programs compute, not
# how fast they run. XLA:CPU's legacy elemental emitters compile in about 0.6x the time of the default fusion
# emitters: the whole suite took 542 s against 918 s (2 workers, load ~3). tests/test_suite_compiler.py
# checks that the default configuration, which users run, gives the same numbers. (LLVM at -O0 on top,
# --xla_backend_optimization_level=0, took it to 432 s but made successful scenarios of tests/test_sweep.py
# report a consistency residual of exactly 1.0 in one chunking and 1e-14 in another: not used.) Read when JAX
# starts its CPU backend, so set before any test runs; subprocesses (the command line, the GPU suite's smoke
# run) inherit it.
SUITE_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

import ukjax._config  # noqa: E402

os.environ["UKJAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ukjax-test-xla-")
ukjax._config.enable_compilation_cache = lambda path=None: None
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory compiled programs after each test module: a test module's programs are not
    reused by the next, and one process holding every program of the suite aborted inside XLA (compiling or
    serializing the 3RRR tests' programs, ~460 tests in; each file alone passes)."""
    yield
    jax.clear_caches()
