"""The suite compiles with XLA:CPU's legacy emitters, each program's machine code in one piece and LLVM
without optimization, and runs each program's kernels one after the other (``conftest.SUITE_XLA_FLAGS``, for
its time); users run JAX's default configuration. This checks that the two give the same numbers on the
paths every workflow goes through: a batch of SCARA simulations (default solver, method and chunking, with
the diagnostics at the saved times) and a forward-mode gradient through it, in a subprocess with the default
configuration against this process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import SUITE_XLA_FLAGS, xla_flags_without

SCRIPT = """
import json
import diffrax, jax, jax.numpy as jnp
import ukjax
from ukjax.models import scara

ukjax.enable_float64()


def run(alpha, adjoint):
    system, p = scara.system(), scara.default_params()
    p = dict(p, alpha=p["alpha"] * alpha)
    q0, qd0 = scara.initial_state(p)
    offsets = jnp.linspace(-0.02, 0.02, 4)[:, None] * jnp.array([1.0, -1.0, 0.0, 0.0])
    ts = jnp.linspace(0.0, 0.1, 6)
    return ukjax.simulate_batch(system, q0 + offsets, jnp.tile(qd0, (4, 1)), p, t1=0.1, dt=5e-3, ts=ts,
                                adjoint=adjoint)


def result():
    # one program: the forward-mode JVP gives the batch's solution (its primal) and the derivative of the
    # loss sum |φ|² + sum q(t1)² with respect to the Baumgarte gain's scale
    sol, tangent = jax.jvp(lambda alpha: run(alpha, diffrax.ForwardMode()), (1.0,), (1.0,))
    residual, final = sol.position_residual, sol.q[:, -1]
    loss = jnp.sum(residual**2) + jnp.sum(final**2)
    dloss = 2 * jnp.sum(residual * tangent.position_residual) + 2 * jnp.sum(final * tangent.q[:, -1])
    return {
        "q": sol.q.tolist(), "qdd": sol.qdd.tolist(), "force": sol.constraint_force.total.tolist(),
        "violation": sol.position_violation.tolist(), "status": sol.status.tolist(),
        "loss": float(loss), "dloss": float(dloss),
    }


if __name__ == "__main__":
    print(json.dumps(result()))
"""


def _run_here() -> dict:
    scope = {"__name__": "suite"}
    exec(SCRIPT, scope)  # noqa: S102 - the same program as the subprocess runs
    return scope["result"]()


def test_default_compiler_configuration_gives_the_suites_numbers():
    if not SUITE_XLA_FLAGS.strip():
        pytest.skip("UKJAX_SUITE_XLA_FLAGS is empty: the suite runs the default configuration itself")
    flags = xla_flags_without()
    env = dict(os.environ, XLA_FLAGS=flags)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, check=True
    )
    default = json.loads(done.stdout.strip().splitlines()[-1])
    suite = _run_here()
    # the offsets (±0.0067 and ±0.02 rad) start every scenario off the path: constraint_violated (6) is part
    # of what must agree
    assert default["status"] == suite["status"]
    # Two compilations of the same float64 program differ only in the order of floating-point operations
    # (fused multiply-adds, vectorized loops): a few ulps per step, grown over 20 steps.
    for key in ("q", "qdd", "force", "violation", "loss", "dloss"):
        a, b = np.asarray(default[key]), np.asarray(suite[key])
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * max(1.0, np.abs(b).max()), err_msg=key)
    assert SUITE_XLA_FLAGS in os.environ["XLA_FLAGS"] and SUITE_XLA_FLAGS not in flags

