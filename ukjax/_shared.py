"""One evaluation of a user's model per right-hand side, with its transcendental intermediates shared.

A model written plainly (``jnp.cos(q[1])`` in every entry of M that needs it, the same sines in A and in b)
computes each value once in the program JAX traces, and XLA's common-subexpression elimination merges the
copies that the separate functions M, Q, A and b repeat. But XLA:CPU then fuses such a cheap elementwise
producer into *every* kernel that reads it (see :func:`ukjax.linalg.materialize`), so under ``vmap`` each of
those kernels calls the (libm) sine again. A hand-tuned model avoids that by materializing its trigonometry
(:mod:`ukjax.models.scara`); :func:`evaluate_shared` does it for any model: it traces the model functions
together into one jaxpr and evaluates it with the result of every transcendental primitive materialized,
so each is computed once per evaluation, in its own small kernel, and read by every entry of M, Q, A and b
(and by their derivatives, for constraints that ukjax differentiates).

Evaluation binds the same primitives the functions would have bound (nested ``jit`` calls are inlined;
custom derivative rules, loops and conditionals are bound as they are), so values are identical and
derivatives pass through unchanged (``materialize`` is the identity with derivative the identity).
"""

from __future__ import annotations

import warnings

import jax
import jax.extend.core as jex
import jax.extend.core.primitives as prims

from ukjax.linalg import materialize

SHARED_PRIMITIVES = frozenset(
    getattr(prims, name)
    for name in (
        "sin_p", "cos_p", "tan_p", "asin_p", "acos_p", "atan_p", "atan2_p", "sinh_p", "cosh_p", "tanh_p",
        "asinh_p", "acosh_p", "atanh_p", "exp_p", "exp2_p", "expm1_p", "log_p", "log1p_p", "logistic_p",
        "pow_p", "sqrt_p", "rsqrt_p", "cbrt_p", "erf_p", "erfc_p", "erf_inv_p",
    )
    if hasattr(prims, name)
)  # fmt: skip
"""Primitives whose results :func:`evaluate_shared` materializes: those XLA lowers to a libm-like call."""


def interpret(jaxpr, consts, args, apply, literal=lambda v: v.val):
    """The values of a jaxpr's outputs: each equation's ``apply(eqn, input values)`` (a list, one value per
    output variable) in order, from ``consts`` and ``args``; a literal's value is ``literal(v)``. The loop
    of every ukjax jaxpr interpreter (this module's, and :mod:`ukjax._entrywise`'s)."""
    env = {}

    def read(v):
        return literal(v) if isinstance(v, jex.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        outs = apply(eqn, [read(v) for v in eqn.invars])
        for v, x in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jex.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _eval(jaxpr, consts, args):
    return interpret(jaxpr, consts, args, _shared_equation)


def _shared_equation(eqn, invals):
    """One equation as bound by the model (nested jit inlined), transcendental results materialized."""
    if eqn.primitive is prims.jit_p:
        closed = eqn.params["jaxpr"]
        return _eval(closed.jaxpr, closed.consts, invals)
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    outs = outs if eqn.primitive.multiple_results else [outs]
    if eqn.primitive in SHARED_PRIMITIVES:
        outs = [materialize(x) for x in outs]
    return outs


def evaluate_shared(f, *args):
    """``f(*args)``, computed from one jaxpr of f with every transcendental result materialized.

    Array leaves of ``args`` (tracers included) are the jaxpr's inputs; other leaves (Python numbers,
    strings) stay constants of the trace, as they were for ``f``. The output has f's structure.
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    dynamic = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]

    def flat(*values):
        full = list(leaves)
        for i, x in zip(dynamic, values, strict=True):
            full[i] = x
        return f(*jax.tree_util.tree_unflatten(treedef, full))

    inputs = [leaves[i] for i in dynamic]
    closed, shape = jax.make_jaxpr(flat, return_shape=True)(*inputs)  # the user's errors are raised here
    try:
        out = _eval(closed.jaxpr, closed.consts, inputs)
    except (AttributeError, KeyError, TypeError) as error:  # jaxpr internals of a JAX release not tested
        _warn_unavailable(error)
        return f(*args)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), out)


_warned = []


def _warn_unavailable(error: Exception) -> None:
    """The interpreter reads jaxpr equations (``eqn.ctx``, ``Primitive.get_bind_params``), which JAX may
    change between releases: where it fails, the model is evaluated directly (same values, transcendental
    values recomputed per kernel), with one warning per process."""
    if not _warned:
        _warned.append(error)
        warnings.warn(
            f"ukjax: shared evaluation of the model is unavailable with jax {jax.__version__} "
            f"({type(error).__name__}: {error}); evaluating the model functions directly (same values, "
            "slower on CPU)",
            RuntimeWarning,
            stacklevel=3,
        )
