"""Bad inputs a user met, each refused before anything is compiled with a message naming the culprit: a solver
given by name, a parameter given as a string, a Baumgarte gains function returning one number, a state that
is not numbers, a NaN in the state or the parameters. Under a user's ``jax.jit`` (traced inputs) the checks
stay out of the way.

Compile budget: one tiny system (a point on a circle, n = 2), a few fixed steps; the solver-name test runs
RK4 and Heun for 3 steps.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ukjax.constraints import Baumgarte, Holonomic
from ukjax.simulation import simulate, simulate_batch
from ukjax.solvers import RK4
from ukjax.system import System


def _circle(gains=lambda p: (p["alpha"], p["beta"])):
    return System(
        mass=lambda q, t, p: p["mass"] * jnp.eye(2),
        force=lambda q, qd, t, p: jnp.stack([0.0 * q[0], -9.81 * p["mass"]]),
        n=2,
        constraints=(Holonomic(lambda q, t, p: jnp.stack([q @ q - 1.0]), Baumgarte(gains), name="circle"),),
    )


CIRCLE = _circle()
P = {"mass": jnp.asarray(1.0), "alpha": jnp.asarray(5.0), "beta": jnp.asarray(5.0)}
Q0, QD0 = jnp.asarray([1.0, 0.0]), jnp.asarray([0.0, 0.0])
SHORT = dict(t1=0.03, dt0=0.01, ts=jnp.asarray([0.0, 0.03]))


@pytest.mark.parametrize("name, cls", [("RK4", RK4), ("heun", diffrax.Heun)])
def test_a_solver_given_by_name_is_that_solver(name, cls):
    by_name = simulate(CIRCLE, Q0, QD0, P, solver=name, **SHORT)
    by_object = simulate(CIRCLE, Q0, QD0, P, solver=cls(), **SHORT)
    np.testing.assert_array_equal(by_name.q, by_object.q)
    per_step = 4 if cls is RK4 else 2
    assert int(by_name.num_function_evals) == per_step * 3


@pytest.mark.parametrize(
    "solver, match",
    [
        (
            "Tsit6",
            r"solver='Tsit6' is not a solver name .*Tsit5, Dopri5, Dopri8, Heun, Euler, Bosh3, Ralston, "
            r"Midpoint, RK4",
        ),
        (diffrax.Tsit5, r"solver must be a solver instance, got the class Tsit5: write Tsit5\(\)"),
        (42, r"solver must be a diffrax solver .* got int 42"),
    ],
)
def test_an_unknown_solver_is_refused_naming_the_accepted_names(solver, match):
    with pytest.raises(ValueError, match=match):
        simulate(CIRCLE, Q0, QD0, P, solver=solver, **SHORT)


def test_a_parameter_given_as_a_string_is_named():
    params = {**P, "mass": "1.0"}
    named = r"parameter params\['mass'\] is the string '1.0'"
    with pytest.raises(ValueError, match=named):
        simulate(CIRCLE, Q0, QD0, params, **SHORT)
    with pytest.raises(ValueError, match=named):
        simulate_batch(CIRCLE, Q0[None], QD0[None], params, **SHORT)
    with pytest.raises(ValueError, match=named):  # per-scenario parameters are checked leaf by leaf too
        spec = {"mass": True, "alpha": False, "beta": False}
        simulate_batch(CIRCLE, Q0[None], QD0[None], params, batch_params=spec, **SHORT)
    with pytest.raises(ValueError, match=r"parameter params\['alpha'\] is an array of <U3"):
        simulate(CIRCLE, Q0, QD0, {**P, "alpha": np.asarray(["5.0"])}, **SHORT)


def test_gains_returning_one_number_are_blamed_on_the_gains_function():
    scalar_gains = _circle(gains=lambda p: p["alpha"])
    with pytest.raises(
        ValueError,
        match=r"Baumgarte gains function gains\(p\) must return a pair \(alpha, "
        r"beta\); it returned a scalar",
    ) as error:
        simulate(scalar_gains, Q0, QD0, P, **SHORT)
    assert "phi(q, t, p)" not in str(error.value)  # not blamed on φ any more
    with pytest.raises(ValueError, match=r"it returned a tuple of 3 entries"):
        simulate(_circle(gains=lambda p: (1.0, 2.0, 3.0)), Q0, QD0, P, **SHORT)


@pytest.mark.parametrize(
    "q0, qd0, match",
    [
        ("abc", QD0, r"q0 must be an array of numbers of shape \(n,\); got the string 'abc'"),
        (Q0, ["0", "0"], r"qd0 must be an array of numbers .* got a list holding the string '0'"),
        (Q0.at[1].set(jnp.nan), QD0, r"q0 has a NaN or infinite entry at index \[1\]"),
        (Q0, QD0.at[0].set(jnp.inf), r"qd0 has a NaN or infinite entry at index \[0\]"),
    ],
)
def test_a_state_that_is_not_finite_numbers_is_named(q0, qd0, match):
    with pytest.raises(ValueError, match=match):
        simulate(CIRCLE, q0, qd0, P, **SHORT)


def test_a_nan_parameter_is_named():
    with pytest.raises(ValueError, match=r"parameter params\['beta'\] has a NaN or infinite value"):
        simulate(CIRCLE, Q0, QD0, {**P, "beta": jnp.asarray(jnp.nan)}, **SHORT)


def test_the_checks_stay_out_of_a_users_jit():
    # Traced q0 and params: no value checks, the same numbers as the eager call (solver by name included);
    # and a traced list entry (here of qd0: q0 and qd0 go through the same check) is numbers, not "a list
    # holding ...". One user's jit holds every traced input, so the simulation is compiled into one program
    # (a user's jit compiles the whole simulation again); the eager reference is the RK4 program that
    # test_a_solver_given_by_name_is_that_solver compiled.
    final = jax.jit(lambda q0, v, p: simulate(CIRCLE, q0, [v, 0.0], p, solver="rk4", **SHORT).q[-1])
    eager = simulate(CIRCLE, Q0, QD0, P, solver=RK4(), **SHORT).q[-1]
    np.testing.assert_allclose(final(Q0, QD0[0], P), eager, rtol=1e-12)


@pytest.mark.parametrize(
    "constraint_atol, match",
    [
        (-1e-6, r"constraint_atol must be positive and finite for every coordinate"),
        ([1e-6, 1e-6, 1e-6], r"constraint_atol must be a number or have shape \(2,\)"),
        ({"x": 1e-6}, r"constraint_atol is given by coordinate name, but the system has no coordinate_names"),
        ("1e-6", r"constraint_atol must be a positive number or an array of shape \(2,\)"),
    ],
)
def test_a_bad_constraint_tolerance_is_named(constraint_atol, match):
    with pytest.raises(ValueError, match=match):
        simulate(CIRCLE, Q0, QD0, P, constraint_atol=constraint_atol, **SHORT)
    with pytest.raises(ValueError, match=r"constraint_rtol must be >= 0"):
        simulate(CIRCLE, Q0, QD0, P, constraint_rtol=-1.0, **SHORT)


# ------------------------------------------- issue 39: the argument at fault named, with what was expected


@pytest.mark.parametrize(
    "params, kind", [([1.0, 5.0, 5.0], "a list of 3 entries"), ((1.0,), "a tuple of 1 entry")]
)
def test_params_that_are_not_a_dict_are_named(params, kind):
    """A list is a valid pytree, so the failure comes from the model's p["mass"]; it used to read "mass could
    not be called as mass(q, t, p): list indices must be integers", blaming the function's signature."""
    match = rf"mass: params is {kind}, and mass\(q, t, p\) could not index it .* pass params as the pytree"
    with pytest.raises(ValueError, match=match) as error:
        simulate(CIRCLE, Q0, QD0, params, **SHORT)
    assert "could not be called" not in str(error.value)
    with pytest.raises(ValueError, match=match):
        simulate_batch(CIRCLE, Q0[None], QD0[None], params, **SHORT)


def test_a_parameter_of_the_wrong_shape_is_named():
    """A mass given as an array of the wrong shape failed with JAX's "mul got incompatible shapes for
    broadcasting: (3,), (2,)", naming neither the parameter nor what the system needs."""
    spring = System(mass=lambda q, t, p: jnp.eye(2), force=lambda q, qd, t, p: -p["k"] * q, n=2)
    with pytest.raises(ValueError, match=r"force failed at the initial state: .*\(3,\), \(2,\); "
                       r"params\['k'\] has shape \(3,\), a shape this error names: check it against .* "
                       r"q has shape \(2,\)"):
        simulate(spring, Q0, QD0, {"k": jnp.ones(3)}, **SHORT)
    with pytest.raises(ValueError, match=r"mass failed at the initial state: mass\(q, t, p\) returned shape "
                       r"\(3,\); expected \(2, 2\)"):
        simulate(System(mass=lambda q, t, p: p["k"], force=spring.force, n=2), Q0, QD0, {"k": jnp.ones(3)},
                 **SHORT)
    with pytest.raises(ValueError, match=r"params\['k'\] is a list or tuple: give arrays"):
        simulate(spring, Q0, QD0, {"k": [1.0, 2.0]}, **SHORT)


def test_a_missing_key_lists_the_keys_there_are():
    keys = r"its top-level keys are \['alpha', 'beta', 'm'\]"
    with pytest.raises(ValueError, match=r"mass: the parameter pytree has no entry 'mass'; " + keys):
        simulate(CIRCLE, Q0, QD0, {"m": 1.0, "alpha": 5.0, "beta": 5.0}, **SHORT)


@pytest.mark.parametrize("field", ["mass", "force", "actuation"])
def test_a_model_function_given_as_an_array_is_named(field):
    """System(mass=<an array>) was equinox's 'static arguments should be comparable' at the first simulation;
    now the System refuses it at construction, naming the field and the signature it expects."""
    functions = dict(mass=lambda q, t, p: jnp.eye(2), force=lambda q, qd, t, p: q)
    functions[field] = jnp.eye(2)
    with pytest.warns(UserWarning), pytest.raises(TypeError, match=rf"System\.{field} must be a function \("):
        System(n=2, **functions)
