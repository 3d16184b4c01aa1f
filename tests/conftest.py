"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

The suite runs in one process. Three full runs aborted inside XLA ~460 tests in (compiling, or writing the
3RRR test's program to JAX's persistent compilation cache); each file alone passed. The process's count of
memory maps was growing towards the kernel's limit (``vm.max_map_count``, 65530): ~14,700 within one test
module, falling back after ``jax.clear_caches()``. So every test module's compiled programs are released when
it ends (the fixture below). The persistent cache stays off for the suite: tests that call the ``ukjax``
command in-process would turn it on (``ukjax.cli.main`` does, as the command should), and a run with it on,
in a fresh folder, was 1035 s against 1129 s without (one run each, load ~1.5): too small a gain to bring
back the code path of the first aborts. The cache itself is tested in a subprocess
(``tests/test_compile_and_gradient.py``), which this file does not affect.
"""

import os
import tempfile

import jax
import pytest

import ukjax._config

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
