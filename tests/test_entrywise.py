"""Entry-by-entry batch evaluation (ukjax._entrywise) against jax.vmap of the same function.

Every rule of the interpreter (structural, elementwise, products, reductions, conditionals, calls inlined)
and the fallback for equations without a rule (loops, gathers, LAPACK) is compared with the ordinary
batched program, which shares none of the interpreter's code. Tolerance: products and reductions add the
same terms in a possibly different order, so values agree to a few ulps of the largest term (rtol 1e-13 in
float64, 1e-5 in float32); structural and elementwise results are bitwise equal.
"""

import functools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_normal

import ukjax
import ukjax.options as options
from ukjax import _entrywise
from ukjax._entrywise import batched_by_entries, evaluate_entrywise
from ukjax.models import scara

ukjax.enable_float64()


def _record_evaluations(monkeypatch):
    """A list that records, for every entrywise evaluation from now on (``_entrywise._evaluate``), whether
    its outputs were assembled behind the fence."""
    calls = []
    evaluate = _entrywise._evaluate

    def recorded(traced, fenced=False):
        calls.append(fenced)
        return evaluate(traced, fenced)

    monkeypatch.setattr(_entrywise, "_evaluate", recorded)
    return calls


def _compare(f, args, batched, rtol=1e-13, atol=1e-13):
    in_axes = [0 if b else None for b in batched]
    expected = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)  # one program (op by op: one per primitive)
    got = jax.jit(lambda *a: evaluate_entrywise(f, a, batched))(*args)
    for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got), strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=atol)


def _structural(x, s):
    m = x.reshape(2, 3)
    return (
        m.T,
        jnp.concatenate([m, 2 * m], axis=0),
        jnp.stack([x, s * x], axis=1),
        jnp.split(x, [2])[1],
        x[::-1],
        jnp.pad(m, ((1, 0), (0, 2))),
        jax.lax.pad(x, 0.5 * s, [(1, -1, 1)]),
        jnp.broadcast_to(x[:, None], (6, 2)),
        jnp.arange(6.0) * x,
        jnp.expand_dims(m, 1).squeeze(1),
    )


def _products(x, s):
    m = x.reshape(2, 3)
    t = jnp.stack([m, m + s])  # (2, 2, 3)
    return (
        m @ m.T,
        jnp.einsum("bij,bkj->bik", t, t),
        jnp.dot(x, x),
        m.sum(axis=1),
        t.max(axis=(0, 2)),
        jnp.min(x),
        jnp.prod(m, axis=0),
        jnp.all(x > 0),
        jnp.any(m < s, axis=1),
        jnp.argmax(m, axis=1),
        jnp.argmin(x),
    )


def _control_flow(x, s):
    def body(carry):
        i, v = carry
        return i + 1, v * 0.5 + s

    _, looped = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))
    chosen = jax.lax.cond(x[0] > 0, lambda v: jnp.sin(v), lambda v: v**2, x)
    fixed = jax.lax.cond(s > 0, lambda v: v + 1, lambda v: v - 1, x)
    index = jnp.argmax(x)
    m = x.reshape(2, 3)
    running = (jnp.cumsum(m, axis=1), jax.lax.cumsum(m, axis=0, reverse=True), jax.lax.cummax(x),
               jax.lax.cumprod(m, axis=1, reverse=True), jax.lax.cumlogsumexp(x))  # fmt: skip
    return looped, chosen, fixed, x[index], running, jnp.where(x > s, x, -x), jnp.clip(x, -0.5, 0.5)


def _linalg(x, s):
    a = x.reshape(2, 3)
    spd = a @ a.T + (1.0 + s**2) * jnp.eye(2)
    w, v = jnp.linalg.eigh(spd)
    return w, jnp.abs(v), jnp.linalg.solve(spd, a[:, 0]), ukjax.linalg.cholesky(spd)


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


_softplus.defjvp(lambda p, t: (_softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))


@jax.jit
def _nested(x, s):
    return _softplus(x) * s, jnp.hypot(x, s), jnp.int32(3) * (x > 0).astype(jnp.int32)


@pytest.mark.parametrize("f", [_structural, _products, _control_flow, _linalg, _nested])
def test_rules_equal_vmap(f):
    x = jnp.asarray(random_normal(jax.random.key(0), (5, 6)))
    _compare(f, (x, jnp.asarray(0.3)), [True, False])
    if f is _control_flow:  # the second argument batched: cond on a batched predicate, batched loop bounds
        _compare(f, (x, jnp.asarray(random_normal(jax.random.key(1), (5,)))), [True, True])


def test_argmax_ties_and_nan_as_lax():
    x = jnp.array([[1.0, 3.0, 3.0, 0.0], [jnp.nan, 1.0, jnp.nan, 2.0], [2.0, 2.0, 2.0, 2.0]])
    _compare(lambda v: (jnp.argmax(v), jnp.argmin(v)), (x,), [True])


def test_float32():
    x = jnp.asarray(random_normal(jax.random.key(2), (4, 6)), jnp.float32)
    _compare(_products, (x, jnp.float32(0.3)), [True, False], rtol=1e-5, atol=1e-5)


def test_bad_batched_flags_refused():
    x = jnp.ones((3, 2))
    with pytest.raises(ValueError, match="do not match"):
        evaluate_entrywise(lambda a, b: a + b, (x, x), [True])
    with pytest.raises(ValueError, match="common batch size"):
        evaluate_entrywise(lambda a, b: a + b[0], (x, jnp.ones((4, 2))), [True, True])


def test_batched_by_entries_values_and_derivatives(monkeypatch):
    """Under vmap values equal f's (below min_batch by vmap itself); jvp and grad are f's own (custom_jvp)."""

    def f(t, y, p):
        q, v = y
        m = jnp.array([[2 + jnp.cos(q[1]), 0.3], [0.3, 1.0 + p["m"]]])
        return v, jnp.linalg.solve(m, -jnp.sin(q) * p["g"] + t)

    g = batched_by_entries(f)
    ts = jnp.linspace(0.0, 1.0, 5)
    ys = (jnp.asarray(random_normal(jax.random.key(3), (5, 2))),) * 2
    p = {"m": jnp.asarray(0.5), "g": jnp.asarray(9.8)}
    batched = lambda h, p: jax.vmap(h, in_axes=(0, 0, None))(ts, ys, p)
    # every reference is one compiled program too (op by op, JAX compiles one small program per primitive)
    expected = jax.jit(batched, static_argnums=0)(f, p)
    for e, got in zip(expected, jax.jit(batched, static_argnums=0)(g, p), strict=True):
        np.testing.assert_allclose(got, e, rtol=1e-13, atol=1e-14)
    one = jax.jit(lambda h, t, y, p: h(t, y, p)[1], static_argnums=0)
    np.testing.assert_allclose(one(g, ts[1], (ys[0][1], ys[1][1]), p), one(f, ts[1], (ys[0][1], ys[1][1]), p))
    loss = lambda p, h: jnp.sum(batched(h, p)[1] ** 2)
    grads = [jax.jit(jax.grad(loss), static_argnums=1)(p, h) for h in (f, g)]
    for key in p:
        np.testing.assert_allclose(grads[1][key], grads[0][key], rtol=1e-13)
    calls = _record_evaluations(monkeypatch)
    small = batched_by_entries(f, min_batch=6)
    for e, got in zip(expected, jax.jit(batched, static_argnums=0)(small, p), strict=True):
        np.testing.assert_allclose(got, e, rtol=1e-13, atol=1e-14)
    assert not calls, "a batch below min_batch is vmap's program"
    halve = lambda t, y, p: jax.lax.while_loop(lambda v: v[0] < 1.0, lambda v: v + 0.5, y[0])
    looping = batched_by_entries(halve)
    jax.jit(jax.vmap(looping, in_axes=(0, 0, None)))(ts, ys, p)
    assert not calls, "a function with an equation that has no entry rule (a while loop) is vmap's program"
    tangent = {"m": jnp.asarray(1.0), "g": jnp.asarray(0.0)}
    jvps = [jax.jit(lambda p, t, h=h: jax.jvp(functools.partial(loss, h=h), (p,), (t,))[1])(p, tangent)
            for h in (f, g)]
    np.testing.assert_allclose(jvps[1], jvps[0], rtol=1e-13)


# The SCARA batch of the tests below: two chunks as large as the smallest batch that is evaluated entry by
# entry (options.ENTRYWISE_MIN_BATCH), 200 RK4 steps. One size and one set of options for the three tests: the
# run in one piece is computed once (the fixture), the chunked run's program is also the forward-mode test's
# finite differences (a batch of 64 in one piece and one of 128 compiled two more SCARA programs before).
SCARA_SIZE = 2 * options.ENTRYWISE_MIN_BATCH
SCARA_RUN = dict(t1=0.2, dt=1e-3, ts=[0.1, 0.2], solver=ukjax.RK4())


@functools.cache  # one System object for the module: a new one retraced the chunked program for the central
def _scara_batch():  # differences of the forward-mode test (its compilation read back from the disk cache)
    system, p = scara.system(), scara.default_params()
    q0, qd0 = scara.initial_state(p)
    q0s = q0 + jnp.linspace(0.0, 1e-3, SCARA_SIZE)[:, None] * jnp.array([0.0, 1.0, -1.0, 0.0])
    return system, p, q0s, jnp.tile(qd0, (SCARA_SIZE, 1))


@pytest.fixture(scope="module")
def scara_whole():
    """The SCARA batch in one piece, and whether each entrywise evaluation traced for it was fenced."""
    system, p, q0s, qd0s = _scara_batch()
    with pytest.MonkeyPatch.context() as patch:
        calls = _record_evaluations(patch)
        sol = ukjax.simulate_batch(system, q0s, qd0s, p, chunk_size=None, **SCARA_RUN)
    return jax.block_until_ready(sol), calls


def test_simulate_batch_runs_entrywise_with_the_same_trajectory(scara_whole, monkeypatch):
    """simulate_batch of the SCARA evaluates its right-hand side entry by entry (the rule is traced), and
    the trajectory equals the ordinary vmap program's (200 RK4 steps: rounding differences of the reordered
    sums stay below 1e-12 rad). A batch of exactly ENTRYWISE_MIN_BATCH is evaluated entry by entry too: the
    chunks of the next test."""
    system, p, q0s, qd0s = _scara_batch()
    entrywise, entrywise_calls = scara_whole
    assert entrywise_calls, "the batched right-hand side was not evaluated entry by entry"
    calls = _record_evaluations(monkeypatch)
    monkeypatch.setattr(options, "ENTRYWISE_MAX_N", -1)
    ordinary = jax.block_until_ready(ukjax.simulate_batch(system, q0s, qd0s, p, chunk_size=None, **SCARA_RUN))
    assert not calls
    np.testing.assert_allclose(entrywise.q, ordinary.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(entrywise.qd, ordinary.qd, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(entrywise.status, ordinary.status)


def test_chunked_batch_fences_its_values_and_keeps_the_trajectory(scara_whole, monkeypatch):
    """simulate_batch looping over chunks (of ENTRYWISE_MIN_BATCH scenarios) assembles the entrywise values
    behind the fence (measured faster there), in one piece it does not; the trajectories agree to rounding
    (the fence multiplies by 1: the same values; the chunked program is another compilation, 1e-13 rad)."""
    system, p, q0s, qd0s = _scara_batch()
    whole, whole_calls = scara_whole
    calls = _record_evaluations(monkeypatch)
    chunked = ukjax.simulate_batch(system, q0s, qd0s, p, chunk_size=options.ENTRYWISE_MIN_BATCH, **SCARA_RUN)
    assert whole_calls and not any(whole_calls), "in one piece: entry by entry, not fenced"
    assert calls and all(calls), "over chunks: entry by entry, fenced"
    np.testing.assert_allclose(chunked.q, whole.q, rtol=0, atol=1e-13)
    np.testing.assert_allclose(chunked.qd, whole.qd, rtol=0, atol=1e-11)


def _model_cases():
    from ukjax.control import closed_loop_acceleration
    from ukjax.models import chain, coordinated_robots, flexible_joint, spiral, two_mass_spring

    passive = lambda system: (lambda q, qd, p: system.acceleration(q, qd, 0.3, p))
    controlled = lambda system: (lambda q, qd, p: closed_loop_acceleration(system, q, qd, 0.3, p).qdd)
    return {
        "scara": (passive(scara.system()), scara.default_params(), scara.initial_state),
        "scara_lagrangian": (passive(scara.system(lagrangian=True)), scara.default_params(),
                             scara.initial_state),
        "spiral": (passive(spiral.system()), spiral.default_params(), spiral.initial_state),
        "chain_3": (passive(chain.system(3)), chain.default_params(3), chain.initial_state),
        "coordinated_robots": (controlled(coordinated_robots.system()), coordinated_robots.default_params(),
                               coordinated_robots.initial_state),
        "flexible_joint": (controlled(flexible_joint.system()), flexible_joint.default_params(),
                           flexible_joint.initial_state),
        "two_mass_spring": (controlled(two_mass_spring.system()), two_mass_spring.default_params(),
                            two_mass_spring.initial_state),
    }  # fmt: skip


_SLOW_MODELS = {"scara", "flexible_joint", "two_mass_spring"}  # covered in the fast suite by the others


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_MODELS else n for n in _model_cases()]
)
def test_shipped_models_right_hand_side_equals_vmap(name):
    """The right-hand side (passive: System.acceleration; servo-controlled: the closed loop of Liu et al.
    2015) of every shipped model with n <= 8 that has an initial state, at three perturbed states, entry by
    entry against vmap: equal to 1e-9 relative to the largest acceleration (sums reordered inside the UK
    solve and, for the Lagrangian SCARA, inside its autodiff-derived M and Q)."""
    f, p, initial_state = _model_cases()[name]
    q0, qd0 = initial_state(p)
    noise = jnp.asarray(random_normal(jax.random.key(4), (2, 3, q0.shape[0])))
    qs, qds = q0 + 1e-2 * noise[0], qd0 + 1e-2 * noise[1]
    expected = jax.jit(jax.vmap(f, in_axes=(0, 0, None)))(qs, qds, p)  # one program, not op by op
    got = jax.jit(lambda q, qd, p: evaluate_entrywise(f, (q, qd, p), [True, True, False]))(qs, qds, p)
    assert bool(jnp.all(jnp.isfinite(expected)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * float(jnp.max(jnp.abs(expected))))


def test_tangents_by_entries_equal_the_ordinary_jvp_under_two_vmaps(monkeypatch):
    """batched_by_entries(..., tangents_by_entries=True) under the tuner's nesting (vmap over directions of
    jvp of vmap over scenarios) evaluates the JVP's jaxpr entry by entry, its outputs assembled behind the
    fence (a while loop of one trip: in the compiled program), and gives the ordinary JVP's values (reordered
    sums: rtol 1e-13); the fence alone returns its input exactly."""

    def f(t, y, p):  # every equation has an entry rule (a 2 x 2 solve by Cramer's rule, not LAPACK)
        q, v = y
        a, b, d = 2 + jnp.cos(q[1]), 0.3, 1.0 + p["m"]
        r = -jnp.sin(q) * p["g"] + t * v
        return v, jnp.stack([d * r[0] - b * r[1], a * r[1] - b * r[0]]) / (a * d - b * b)

    calls = _record_evaluations(monkeypatch)
    g = batched_by_entries(f, tangents_by_entries=True)
    ts = jnp.linspace(0.0, 1.0, 6)
    ys = tuple(jnp.asarray(random_normal(jax.random.key(k), (6, 2))) for k in (4, 5))
    p = {"m": jnp.asarray(0.5), "g": jnp.asarray(9.8)}
    directions = jnp.asarray(random_normal(jax.random.key(6), (2, 2, 6, 2)))

    def tangents(h):
        def along(d):
            return jax.jvp(lambda y: jax.vmap(h, in_axes=(0, 0, None))(ts, y, p), (ys,), ((d[0], d[1]),))

        return jax.vmap(along)(directions)

    expected = jax.jit(lambda: tangents(f))()
    program = jax.jit(lambda: tangents(g))
    got = program()
    assert True in calls, "the tangent rule ran entry by entry, fenced"
    assert " while(" in program.lower().compile().as_text(), "the fence's loop survives XLA"
    for e, x in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_allclose(x, e, rtol=1e-13, atol=1e-13)
    values = (jnp.asarray([1.5, -0.0, jnp.inf]), jnp.asarray([jnp.nan, 2.0, -3.0]))

    def fence(a, b):
        objects = _entrywise._objects((2,), [a, b])
        return _entrywise._fence(lambda e: [jnp.stack(list(e[0].flat), -1)], [objects])[0]

    fenced = jax.jit(fence)(*values)
    np.testing.assert_array_equal(fenced, jnp.stack(values, -1))
    assert bool(jnp.signbit(fenced[1, 0])), "-0.0 * 1 stays -0.0"


def test_forward_mode_gradient_of_a_large_batch(monkeypatch):
    """diffrax's ForwardMode (the tuner's forward-mode gradients) over two chunks as large as the entrywise
    threshold (values fenced), tangents along two directions under vmap as the tuner takes them: the
    tangents run entry by entry (fenced), the program compiles (it did not when the entrywise primal stood
    beside the ordinary tangent rule) and the derivative matches a central difference (step 1e-6 relative:
    agreement to ~1e-6) and reverse mode through the same chunks (the ordinary tangent rule transposed;
    measured 3e-16). The SCARA batch and run of the tests above: the central difference's program (values
    only: the adjoint does not change them) is the chunked test's."""
    import diffrax

    system, p, q0s, qd0s = _scara_batch()
    forward_mode = diffrax.ForwardMode()

    def loss(scale, adjoint=forward_mode):
        pp = dict(p, beta=p["beta"] * scale[0], alpha=p["alpha"] * scale[1])
        sol = ukjax.simulate_batch(system, q0s, qd0s, pp, adjoint=adjoint,
                                   chunk_size=options.ENTRYWISE_MIN_BATCH, **SCARA_RUN)  # fmt: skip
        return jnp.sum(sol.qd[:, -1] ** 2)

    calls = _record_evaluations(monkeypatch)
    ones = jnp.ones(2)
    tangents = jax.jit(jax.vmap(lambda d: jax.jvp(loss, (ones,), (d,))[1]))(jnp.eye(2))
    assert True in calls, "ForwardMode's tangents ran entry by entry, fenced"
    h = 1e-6
    for k in range(2):
        e = jnp.eye(2)[k]
        difference = (loss(ones + h * e, None) - loss(ones - h * e, None)) / (2 * h)
        np.testing.assert_allclose(tangents[k], difference, rtol=1e-5)
    # reverse mode in one compiled program: an eager grad compiled the forward and transposed halves apart,
    # with op-by-op glue (this gradient alone: 39 compilations and 44 CPU-s against 14 and 33, load ~8)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda s: loss(s, None)))(ones), tangents, rtol=1e-12)


FORWARD_MODE = diffrax.ForwardMode()


def test_jacfwd_through_forward_mode_keeps_the_primal_unbatched():
    """jax.jacfwd of a simulation under diffrax's ForwardMode: the tangent rule's ``custom_vmap`` sees a
    ``vmap`` over tangent directions with unbatched primals, and must return the primal outputs unbatched
    (jacfwd refused them before: "got axis spec None but output was batched"). The Jacobian equals the
    tangents of jvp one direction at a time (the same program: 1e-14) and a central difference (step 1e-6
    relative, agreement to ~1e-7). A damped pendulum, RK4 at 20 ms for 0.5 s, d q(t1) / d(rod, drag)."""
    from helpers import PENDULUM

    values = dict(m=1.3, g=9.81, l=0.8, c=0.1, alpha=2.0, beta=4.0)
    base = {k: jnp.asarray(v, jnp.float64) for k, v in values.items()}
    q0, qd0 = jnp.asarray([0.8 * np.sin(0.7), -0.8 * np.cos(0.7)]), jnp.zeros(2)
    run = dict(t1=0.5, dt=0.02, solver=ukjax.RK4())

    def final(x, adjoint=FORWARD_MODE):
        q0_ = q0 * x[0] / base["l"]  # the start stays on the rod
        sol = ukjax.simulate(PENDULUM, q0_, qd0, dict(base, l=x[0], c=x[1]), adjoint=adjoint, **run)
        return sol.q[-1]

    x = jnp.asarray([0.8, 0.1])
    jacobian = jax.jit(jax.jacfwd(final))(x)
    columns = jax.jit(jax.vmap(lambda d: jax.jvp(final, (x,), (d,))[1]))(jnp.eye(2))
    np.testing.assert_allclose(jacobian, columns.T, rtol=1e-14, atol=1e-14)
    h = 1e-6
    for k in range(2):
        step = h * x[k] * jnp.eye(2)[k]
        difference = (final(x + step, None) - final(x - step, None)) / (2 * h * x[k])
        np.testing.assert_allclose(jacobian[:, k], difference, rtol=1e-6, atol=1e-9)


def test_single_and_batch_agree_on_a_well_conditioned_system(monkeypatch):
    """Issue 39: a scenario through simulate and the same scenario inside simulate_batch, whose right-hand
    side is evaluated entry by entry (64 scenarios), agree to 1e-12 relative (q and q̇ at every save, against
    the largest magnitude of each) on a pendulum (Cartesian, modest Baumgarte gains, 1 s), fixed step and
    adaptive (with the same step count); measured 7e-16 and 2e-15. The two programs order some sums
    differently (and XLA contracts other products into FMAs), nothing more: the bound is round-off, and it
    would catch a different computation, since the entrywise right-hand side off by a factor 1 + 1e-10 moves
    the fixed-step trajectory past it (3e-10). docs/guide/precision.md, "Single vs batch", has the SCARA's
    numbers, where the dynamics amplify the same round-off as much as a one-ulp change of q0."""
    from helpers import PENDULUM

    size = options.ENTRYWISE_MIN_BATCH
    theta = jnp.linspace(0.3, 1.2, size)
    length = 0.8
    q0s = length * jnp.stack([jnp.sin(theta), -jnp.cos(theta)], axis=1)
    qd0s = 0.5 * jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1)
    values = dict(m=1.3, g=9.81, l=length, c=0.1, alpha=2.0, beta=4.0)
    p = {k: jnp.asarray(v, jnp.float64) for k, v in values.items()}
    ts = jnp.linspace(0.0, 1.0, 11)
    fixed = dict(t1=1.0, ts=ts, dt=0.02, solver=ukjax.RK4())
    adaptive = dict(t1=1.0, ts=ts, rtol=1e-9, atol=1e-9)
    picks = (0, 37, size - 1)

    singles = {}

    def deviation(batch, **kw):
        worst = 0.0
        for k in picks:
            key = (k, "dt" in kw)
            if key not in singles:
                singles[key] = ukjax.simulate(PENDULUM, q0s[k], qd0s[k], p, **kw)
            single = singles[key]
            assert int(batch.num_steps[k]) == int(single.num_steps)
            for got, expected in ((batch.q[k], single.q), (batch.qd[k], single.qd)):
                worst = max(worst, float(jnp.max(jnp.abs(got - expected)) / jnp.max(jnp.abs(expected))))
        return worst

    calls = _record_evaluations(monkeypatch)
    for kw in (fixed, adaptive):
        calls.clear()
        batch = ukjax.simulate_batch(PENDULUM, q0s, qd0s, p, chunk_size=None, **kw)
        assert calls, "the batch's right-hand side was not evaluated entry by entry"
        assert deviation(batch, **kw) <= 1e-12
    evaluate = _entrywise._evaluate

    def off_by_1e_10(traced, fenced=False):
        return jax.tree_util.tree_map(lambda x: x * (1 + 1e-10), evaluate(traced, fenced))

    monkeypatch.setattr(_entrywise, "_evaluate", off_by_1e_10)
    # Another step budget (the same 50 steps) is another program: traced again, with the perturbed evaluation.
    batch = ukjax.simulate_batch(PENDULUM, q0s, qd0s, p, chunk_size=None, max_steps=64, **fixed)
    assert deviation(batch, **fixed) > 1e-11, "the bound would not catch a different computation"
