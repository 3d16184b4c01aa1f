"""A batch split over several devices (``simulate_batch(..., devices=)``, ``ukjax.use_cpu_cores``).

The suite's processes have one CPU device, so the split itself runs in a subprocess with two
(``ukjax.use_cpu_cores(2)``): there the SCARA batch split over both devices must equal the one-device program
exactly (each share is integrated by the same program, with no communication), for a batch that fills both
shares and one whose last share is padded; the split program's output lies on both devices; a gradient (a
traced call) runs on one device and equals the one-device gradient; a batch inside a ``jit`` of the user's
is not split. Here: the argument checks and ``use_cpu_cores`` refusing a started backend.
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
import json, sys
import ukjax
devices = ukjax.use_cpu_cores(2)
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from ukjax.models import scara

system, p = scara.system(), scara.default_params()
q0, qd0 = scara.initial_state(p)
kw = dict(t1=0.05, ts=[0.025, 0.05], dt=5e-3, solver=ukjax.RK4())
out = {"devices": devices, "jax_devices": len(jax.devices())}
for n in (8, 5):  # 8: two shares of 4 (no padding); 5: shares of 3, the last padded
    q0s = jnp.tile(q0, (n, 1)) + 1e-3 * jnp.arange(n, dtype=q0.dtype)[:, None]
    qd0s = jnp.tile(qd0, (n, 1))
    one = ukjax.simulate_batch(system, q0s, qd0s, p, devices=1, **kw)
    both = ukjax.simulate_batch(system, q0s, qd0s, p, **kw)
    out[f"q_{n}"] = float(jnp.max(jnp.abs(one.q - both.q)))
    out[f"status_{n}"] = bool(jnp.all(one.status == both.status))
    out[f"devices_{n}"] = len(both.q.sharding.device_set)
    out[f"one_devices_{n}"] = len(one.q.sharding.device_set)

def loss(pp, devices):
    return jnp.sum(ukjax.simulate_batch(system, q0s, qd0s, pp, devices=devices, **kw).q[:, -1] ** 2)

g1, g2 = jax.grad(loss)(p, 1), jax.grad(loss)(p, "all")
out["grad"] = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)))
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
    assert out["devices"] == 2 and out["jax_devices"] == 2
    # the same program per share, no communication: the same numbers bit for bit
    assert out["q_8"] == 0.0 and out["q_5"] == 0.0 and out["status_8"] and out["status_5"]
    assert out["devices_8"] == 2 and out["one_devices_8"] == 1  # the split program's output spans both
    assert out["grad"] == 0.0  # a traced call (grad) runs on one device: the one-device gradient itself
    assert out["jit_devices"] == 1  # inside the user's jit nothing is split


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
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert ukjax.use_cpu_cores() == 3  # a count the user set in XLA_FLAGS is left as it is
