"""A batch split over several devices (``simulate_batch(..., devices=)``, ``ukjax.use_cpu_cores``).

The suite's processes have one CPU device, so the split itself runs in a subprocess with two
(``ukjax.use_cpu_cores(2)``): there the SCARA batch split over both devices must equal the one-device program
exactly (each share is integrated by the same program, with no communication), for a batch whose last share
is padded, also from inputs the user put on one device; the split program's output lies on both devices; a
derivative (a traced call: ``jax.jvp``, which compiles faster than ``jax.grad``; one check of the arguments
for tracers decides both) runs on one device and equals the one-device derivative; a batch inside a ``jit``
of the user's is not split; a program calling jaxlib's batched LAPACK kernels runs on one CPU device, warned
once. Here: the argument checks and ``use_cpu_cores`` refusing a started backend.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

import ukjax
from ukjax.models import scara

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys, warnings
import ukjax
devices = ukjax.use_cpu_cores(2)
import diffrax, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from ukjax.models import scara

system, p = scara.system(), scara.default_params()
q0, qd0 = scara.initial_state(p)
kw = dict(t1=0.05, ts=[0.025, 0.05], dt=5e-3, solver=ukjax.RK4())
out = {"cores": devices, "jax_devices": len(jax.devices())}
n = 5  # two shares of 3, the last padded with a copy of the last scenario
q0s = jnp.tile(q0, (n, 1)) + 1e-3 * jnp.arange(n, dtype=q0.dtype)[:, None]
qd0s = jnp.tile(qd0, (n, 1))
one = ukjax.simulate_batch(system, q0s, qd0s, p, devices=1, **kw)
both = ukjax.simulate_batch(system, q0s, qd0s, p, **kw)
out["q"] = float(jnp.max(jnp.abs(one.q - both.q)))
out["qdd"] = float(jnp.max(jnp.abs(one.qdd - both.qdd)))
out["status"] = bool(jnp.all(one.status == both.status))
out["devices"] = len(both.q.sharding.device_set)
out["one_devices"] = len(one.q.sharding.device_set)
# inputs the user put on one device (the second) are split too: the same program, the same numbers
on_second = jax.device_put((q0s, qd0s, p), jax.devices()[1])
placed = ukjax.simulate_batch(system, *on_second, **kw)
out["committed"] = float(jnp.max(jnp.abs(placed.q - one.q)))
out["committed_devices"] = len(placed.q.sharding.device_set)

def final(q, devices):
    forward = diffrax.ForwardMode()
    return ukjax.simulate_batch(system, q, qd0s, p, devices=devices, adjoint=forward, **kw).q[:, -1]

# a derivative (forward mode: its program compiles faster than reverse mode's) is traced: on one device
t1, t2 = (jax.jvp(lambda q: final(q, d), (q0s,), (jnp.ones_like(q0s),))[1] for d in (1, "all"))
out["tangent"] = float(jnp.max(jnp.abs(t1 - t2)))
out["tangent_devices"] = len(t2.sharding.device_set)
# a program that calls jaxlib's batched LAPACK kernels (here the SVD of method="svd") could deadlock on
# several CPU devices (ukjax.linalg.blocks_on_cpu_pool): it runs on one, with a warning, once
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lapack = [ukjax.simulate_batch(system, q0s, qd0s, p, method="svd", **kw) for _ in range(2)]
out["lapack_devices"] = len(lapack[-1].q.sharding.device_set)
out["lapack_warnings"] = sum("LAPACK" in str(w.message) for w in caught)
inside = jax.jit(lambda q: ukjax.simulate_batch(system, q, qd0s, p, **kw).q)(q0s)
out["jit_devices"] = len(inside.sharding.device_set)
print("RESULT " + json.dumps(out))
"""


def test_a_batch_split_over_two_cpu_devices_equals_one_device():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-c", SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["cores"] == 2 and out["jax_devices"] == 2
    # the same program per share, no communication: the same numbers bit for bit
    assert out["q"] == 0.0 and out["qdd"] == 0.0 and out["status"]
    assert out["devices"] == 2 and out["one_devices"] == 1  # the split program's output lies on both
    assert out["committed"] == 0.0 and out["committed_devices"] == 2
    # a traced call (a derivative) runs on one device: the one-device derivative itself
    assert out["tangent"] == 0.0 and out["tangent_devices"] == 1
    assert out["jit_devices"] == 1  # inside the user's jit nothing is split
    assert out["lapack_devices"] == 1 and out["lapack_warnings"] == 1  # LAPACK on CPU devices: on one, warned


@pytest.mark.parametrize("devices", [0, 2, True, "some"])
def test_devices_out_of_range_are_refused(devices):
    p = scara.default_params()
    q0, qd0 = scara.initial_state(p)
    with pytest.raises(ValueError, match="devices must be 'all' or a number of devices from 1 to 1"):
        ukjax.simulate_batch(scara.system(), q0[None], qd0[None], p, t1=0.01, dt=5e-3, devices=devices)


def test_use_cpu_cores_checks_its_count_and_refuses_a_started_backend(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    jnp.zeros(1).block_until_ready()  # this process's backend has started
    with pytest.raises(ValueError, match="positive int"):
        ukjax.use_cpu_cores(0)
    with pytest.raises(RuntimeError, match="before the first JAX computation"):
        ukjax.use_cpu_cores(2)
    # ukjax's own commands ask only where JAX has not started (run inside a Python program: devices kept)
    monkeypatch.setattr(ukjax._config, "cpu_only_process", lambda: True)
    assert ukjax._config.use_cpu_cores_if_starting(2) is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert ukjax.use_cpu_cores() == 3  # a count the user set in XLA_FLAGS is left as it is


@pytest.mark.parametrize("argv, expected", [([], [None]), (["--devices", "3"], [3]), (["--devices", "0"], []),
                                            (["--coordinator", "localhost:1", "--num-processes", "1",
                                              "--process-id", "0"], [])])  # fmt: skip
def test_ukjax_sweep_asks_one_cpu_device_per_core_in_one_cpu_only_process(monkeypatch, argv, expected):
    """``ukjax sweep`` in one process of a CPU-only machine asks for one CPU device per core (``--devices D``:
    D), before any JAX computation; a multi-process run (``--coordinator``) does not, and neither does an
    invalid count (the sweep names it). Recorded here instead of done: this process's JAX has started."""
    from ukjax import _config, cli
    from ukjax.sweep import _cli

    asked = []
    monkeypatch.setattr(_config, "use_cpu_cores", lambda count=None: asked.append(count) or 1)
    monkeypatch.setattr(_config, "cpu_only_process", lambda: True)
    monkeypatch.setattr("ukjax.sweep.initialize_distributed", lambda *args: None)
    parser, _ = cli._parser()
    _cli.initialize(parser.parse_args(["sweep", "scara", *argv]))
    assert asked == expected
