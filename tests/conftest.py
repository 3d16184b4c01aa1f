"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

Tests that call the ``ukjax`` command in-process would turn on JAX's persistent compilation cache for the rest
of the session (``ukjax.cli.main`` does, as the command should). The suite keeps it off: with it on, a full
run aborted inside JAX's executable serialization (``compilation_cache.put_executable_and_time``) while
writing the 3RRR test's program, twice, with the user's and with a fresh cache folder (not reproduced with
that test file alone). The cache itself is tested in a subprocess (``tests/test_compile_and_gradient.py``),
which this file does not affect.
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
