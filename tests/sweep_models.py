"""A tiny model for the sweep tests, given the way a user gives their own (``module:function``)."""

import jax.numpy as jnp

import ukjax
from ukjax.constraints import Baumgarte, Holonomic


def pendulum():
    """A Cartesian pendulum (n = 2) held on a circle by φ = q·q - L² with Baumgarte gains as parameters."""
    rod = Holonomic(
        phi=lambda q, t, p: q @ q - p["length"] ** 2,
        baumgarte=Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="quadratic"),
    )
    system = ukjax.System(
        mass=lambda q, t, p: p["mass"] * jnp.eye(2, dtype=q.dtype),
        force=lambda q, qd, t, p: jnp.stack([jnp.zeros_like(p["g"]), -p["mass"] * p["g"]]),
        n=2,
        constraints=(rod,),
        coordinate_names=("x", "y"),
    )
    params = {"mass": 1.0, "length": 1.0, "alpha": 5.0, "beta": 5.0, "g": 9.81}

    def initial_state(p):
        return jnp.stack([p["length"], jnp.zeros_like(p["length"])]), jnp.zeros(2, p["length"].dtype)

    return system, params, initial_state


def energy_drift(solution, params):
    """A user metric: the largest drift of the total energy over the saved times."""
    q, qd = solution.q, solution.qd
    energy = 0.5 * params["mass"] * jnp.sum(qd * qd, axis=-1) + params["mass"] * params["g"] * q[:, 1]
    return jnp.max(jnp.abs(energy - energy[0]))
