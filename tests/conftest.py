"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

Tests that call the ``ukjax`` command in-process turn on JAX's persistent compilation cache for the rest of
the session (``ukjax.cli.main`` does, as the command should); ``UKJAX_CACHE_DIR`` points it at a fresh
folder of this session, so the suite neither reads nor writes the user's cache (``~/.cache/ukjax/xla``),
which other processes and other versions of ukjax share.
"""

import os
import tempfile

import jax

os.environ["UKJAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ukjax-test-xla-")
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
