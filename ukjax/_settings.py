"""Settings that a function reads while it is traced (``contextvars``), such as whether a kinematic tree's
recursions are unrolled (:func:`ukjax.multibody.unrolled_recursions`) or the small factorizations looped
(:func:`ukjax.linalg.looped_factorizations`). Jitted callers whose trace depends on one pass its value as a
static argument, so that each setting gets its own program."""

from __future__ import annotations

import contextlib
import contextvars

SMALL_BUFFER_BYTES = 512
"""The largest buffer with which XLA:CPU runs a compiled loop body's kernels one after the other in the
calling thread: one larger buffer anywhere in the body makes it dispatch them to its thread pool
(``execute_sequential_buffer_threshold`` of XLA's ``ThunkExecutor``, not settable from outside), which for
one scenario's step of ~200 tiny kernels costs more than it gains (the Panda: 1.65-1.84x per step)."""


@contextlib.contextmanager
def trace_setting(variable: contextvars.ContextVar, value):
    """``variable`` set to ``value`` inside the ``with`` block, restored after it."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)
