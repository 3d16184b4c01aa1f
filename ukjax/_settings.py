"""Settings that a function reads while it is traced (``contextvars``), such as whether a kinematic tree's
recursions are unrolled (:func:`ukjax.multibody.unrolled_recursions`) or the small factorizations looped
(:func:`ukjax.linalg.looped_factorizations`). Jitted callers whose trace depends on one pass its value as a
static argument, so that each setting gets its own program."""

from __future__ import annotations

import contextlib
import contextvars


@contextlib.contextmanager
def trace_setting(variable: contextvars.ContextVar, value):
    """``variable`` set to ``value`` inside the ``with`` block, restored after it."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)
