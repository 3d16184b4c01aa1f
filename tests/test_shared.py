"""ukjax._shared.evaluate_shared: the user's model evaluated from one jaxpr with transcendental results
materialized gives the same values and derivatives as calling it, through nested jit, custom derivative
rules, loops and conditionals; where JAX's jaxpr internals differ, it falls back to calling the function."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ukjax import _shared


def model(q, p, scale):
    @jax.jit
    def inner(x):
        return jnp.sin(x) * jnp.cos(x)

    s = inner(q)
    branch = jax.lax.cond(q[0] > 0, lambda x: jnp.exp(x), lambda x: jnp.tanh(x), q)
    loop = jax.lax.fori_loop(0, 3, lambda i, x: x + jnp.sqrt(1.0 + x**2), q)
    relu = jax.nn.relu(q - 0.2)  # a custom_jvp rule
    M = jnp.outer(s, jnp.cos(q)) * p["m"] + jnp.eye(q.size)
    return {"M": M * scale, "Q": branch + loop + relu * p["m"], "label": jnp.sum(jnp.atan2(q, p["m"]))}


Q0 = jnp.array([0.3, -0.7, 1.1])
P = {"m": jnp.array(1.7)}


def test_values_and_derivatives_equal_calling_the_model():
    direct = model(Q0, P, 2.0)
    shared = _shared.evaluate_shared(model, Q0, P, 2.0)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-15, atol=0), direct, shared)

    def loss(evaluate, q, p):
        out = evaluate(model, q, p, 2.0)
        return jnp.sum(out["M"] ** 2) + jnp.sum(out["Q"]) + out["label"]

    call = lambda f, *a: f(*a)  # noqa: E731
    for argnums in (1, 2):
        g_direct = jax.grad(loss, argnums)(call, Q0, P)
        g_shared = jax.grad(loss, argnums)(_shared.evaluate_shared, Q0, P)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-13), g_direct, g_shared)
    batched = jax.vmap(lambda q: _shared.evaluate_shared(model, q, P, 2.0)["Q"])(jnp.stack([Q0, -Q0]))
    np.testing.assert_allclose(batched[1], model(-Q0, P, 2.0)["Q"], rtol=1e-15)


def test_each_transcendental_value_is_materialized_once():
    """The jaxpr of the shared evaluation passes every transcendental result through
    ukjax.linalg.materialize (one call of its program ``_materialize`` each: sin, cos, atan2, exp, tanh, sqrt;
    the model's own nested jit and cond are evaluated inline); calling the model materializes nothing."""
    shared = str(jax.make_jaxpr(lambda q: _shared.evaluate_shared(model, q, P, 2.0))(Q0))
    direct = str(jax.make_jaxpr(lambda q: model(q, P, 2.0))(Q0))
    assert "_materialize" not in direct
    assert shared.count("name=_materialize") >= 4, shared


def test_an_unknown_jax_release_falls_back_to_calling_the_model(monkeypatch):
    def broken(*args):
        raise AttributeError("'JaxprEqn' object has no attribute 'ctx'")

    monkeypatch.setattr(_shared, "_eval", broken)
    monkeypatch.setattr(_shared, "_warned", [])
    with pytest.warns(RuntimeWarning, match="shared evaluation of the model is unavailable"):
        out = _shared.evaluate_shared(model, Q0, P, 2.0)
    np.testing.assert_array_equal(out["M"], model(Q0, P, 2.0)["M"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per process
        _shared.evaluate_shared(model, Q0, P, 2.0)
