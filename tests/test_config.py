"""ukjax changes no JAX setting on import (float64 is one explicit call); it sets one XLA:CPU compilation
option where JAX has not started yet (small loops compiled whole)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = """
import warnings
import jax, jax.numpy as jnp
import ukjax
print("x64 after import:", jax.config.jax_enable_x64)
system = ukjax.System(mass=lambda q, t, p: jnp.eye(1), force=lambda q, qd, t, p: -q, n=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sol = ukjax.simulate(system, jnp.ones(1), jnp.zeros(1), {}, t1=0.1, dt=0.05)
print("dtype:", sol.q.dtype, "warned:", any("float32" in str(w.message) for w in caught))
ukjax.enable_float64()
print("x64 after enable:", jax.config.jax_enable_x64, ukjax.float64_enabled())
"""


def test_import_leaves_jax_config_alone_and_float64_is_opt_in():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    assert "x64 after import: False" in out
    assert "dtype: float32 warned: True" in out
    assert "x64 after enable: True True" in out


def test_ukjax_demo_and_no_other_command_asks_for_faster_cpu_compilation(monkeypatch):
    """``ukjax demo`` calls ``faster_cpu_compilation`` before any work (its chunk program compiles in ~0.7x
    the time and runs as fast: benchmarks/demo_first_result.py); another command does not. The calls are
    recorded, not made: this process's XLA backend is running already."""
    import ukjax._config
    from ukjax import cli

    calls = []
    monkeypatch.setattr(ukjax._config, "faster_cpu_compilation", lambda: calls.append(1) or True)
    assert cli.main(["demo", "--scenarios", "0"]) == cli.EXIT_USAGE  # refused before anything is compiled
    assert calls == [1]
    assert cli.main(["run", "no-such-study"]) != 0
    assert calls == [1]


@pytest.mark.parametrize("name", ["faster_cpu_compilation", "sequential_cpu_kernels"])
def test_cpu_flag_is_added_once_and_respects_the_users(monkeypatch, name):
    """``ukjax.faster_cpu_compilation`` (called by the ``ukjax`` command: XLA:CPU's elemental emitters) and
    ``ukjax.sequential_cpu_kernels`` (opt-in: a sequential kernel schedule) add their flag to ``XLA_FLAGS``
    and keep the user's other flags; a second call, or a user who set the flag either way, changes
    nothing."""
    import ukjax

    add = getattr(ukjax, name)
    flag = {"faster_cpu_compilation": ukjax._config.FASTER_CPU_COMPILATION_FLAG,
            "sequential_cpu_kernels": ukjax._config.SEQUENTIAL_CPU_KERNELS_FLAG}[name]  # fmt: skip
    option = flag.split("=")[0]
    monkeypatch.setattr(ukjax._config, "accelerator_plugins", lambda: [])  # a CPU-only machine (see below)
    other = "--xla_force_host_platform_device_count=2"
    monkeypatch.setenv("XLA_FLAGS", other)
    assert add() is True
    assert os.environ["XLA_FLAGS"] == f"{other} {flag}"
    assert add() is False
    assert os.environ["XLA_FLAGS"].count(option) == 1
    theirs = f"{option}={'true' if flag.endswith('false') else 'false'}"
    monkeypatch.setenv("XLA_FLAGS", theirs)
    assert add() is False
    assert os.environ["XLA_FLAGS"] == theirs
    monkeypatch.delenv("XLA_FLAGS")
    assert add() is True and os.environ["XLA_FLAGS"] == flag


def test_faster_cpu_compilation_stays_off_where_an_accelerator_may_start(monkeypatch):
    """The CUDA plugin aborts a process whose ``XLA_FLAGS`` holds the CPU flag ("Unknown flag in XLA_FLAGS",
    jax 0.11.2 on an H200): with an accelerator plugin installed the flag is added only where
    ``JAX_PLATFORMS`` names the CPU alone. And the real plugin lookup works here (a list of names)."""
    import ukjax

    assert isinstance(ukjax._config.accelerator_plugins(), list)
    monkeypatch.setattr(ukjax._config, "accelerator_plugins", lambda: ["xla_cuda13"])
    monkeypatch.setenv("XLA_FLAGS", "")
    for platforms in (None, "cuda,cpu", "cuda"):
        if platforms is None:
            monkeypatch.delenv("JAX_PLATFORMS", raising=False)
        else:
            monkeypatch.setenv("JAX_PLATFORMS", platforms)
        assert ukjax.faster_cpu_compilation() is False and os.environ["XLA_FLAGS"] == "", platforms
        assert ukjax.sequential_cpu_kernels() is False and os.environ["XLA_FLAGS"] == "", platforms
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert ukjax.faster_cpu_compilation() is True and "fusion_emitters=false" in os.environ["XLA_FLAGS"]


def test_whole_cpu_loops_option_joins_the_users_backend_options(monkeypatch):
    """``ukjax.whole_cpu_loops`` (called by ``import ukjax``) puts XLA:CPU's small-loop threshold into
    ``XLA_FLAGS``: a new ``--xla_backend_extra_options`` flag, or one more option of the user's own (XLA
    reads one such flag, the last); a threshold the user set is left as it is; nothing where an accelerator
    may start."""
    import ukjax

    option = f"{ukjax._config.CPU_LOOP_OPTION}={4 << 20}"
    monkeypatch.setattr(ukjax._config, "accelerator_plugins", lambda: [])
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert ukjax.whole_cpu_loops() is True
    assert os.environ["XLA_FLAGS"] == f"--xla_backend_extra_options={option}"
    assert ukjax.whole_cpu_loops() is False and os.environ["XLA_FLAGS"].count(option) == 1
    theirs = "--xla_force_host_platform_device_count=2 --xla_backend_extra_options=a=1,b"
    monkeypatch.setenv("XLA_FLAGS", theirs)
    assert ukjax.whole_cpu_loops() is True and os.environ["XLA_FLAGS"] == f"{theirs},{option}"
    own = f"--xla_backend_extra_options={ukjax._config.CPU_LOOP_OPTION}=1024"
    monkeypatch.setenv("XLA_FLAGS", own)
    assert ukjax.whole_cpu_loops() is False and os.environ["XLA_FLAGS"] == own
    monkeypatch.setattr(ukjax._config, "accelerator_plugins", lambda: ["xla_cuda13"])
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert ukjax.whole_cpu_loops() is False and os.environ["XLA_FLAGS"] == ""


def test_import_compiles_small_loops_whole_with_the_same_trajectory():
    """A fresh process that imports ukjax before JAX starts compiles a loop of ~16 KiB per iteration into one
    function (``cpu_loops_compiled_whole``: no import of ukjax's starts JAX), and one whose user set XLA's
    own threshold (1 KiB) runs it kernel by kernel, with ``ukjax.simulate``'s small-buffer workarounds. Both
    integrate the pinned 4-link chain (a kinematic tree with one loop-closing constraint, RK4 at 1 ms) to the
    same state: the same arithmetic, compiled differently (1e-14 for XLA's reassociation at ~1 rad). Both run
    with the suite's compile-time flags (``conftest.SUITE_XLA_FLAGS``; the hoisting is an HLO pass, which
    they leave on), which halve the two processes' compilation."""
    from ukjax._config import CPU_LOOP_OPTION

    script = (
        "import json, ukjax\n"
        "from ukjax._config import cpu_loops_compiled_whole\n"
        "from ukjax.models import chain\n"
        "ukjax.enable_float64()\n"
        "p = chain.default_params(4); q0, qd0 = chain.initial_state(p)\n"
        "sol = ukjax.simulate(chain.multibody_system(4), q0, qd0 + 0.3, p, t1=0.05, dt=1e-3,"
        " solver=ukjax.RK4())\n"
        "print(json.dumps([cpu_loops_compiled_whole(), sol.q.tolist()]))\n"
    )
    flags = os.environ.get("XLA_FLAGS", "")
    kernel_by_kernel = f"{flags} --xla_backend_extra_options={CPU_LOOP_OPTION}=1024".strip()
    (whole, q_whole), (not_whole, q_kernels) = (_printed_json(script, xla_flags=f)
                                                for f in (flags, kernel_by_kernel))  # fmt: skip
    assert whole is True and not_whole is False
    assert np.all(np.isfinite(q_whole)) and np.ptp(np.asarray(q_whole)[:, 0]) > 1e-3  # it moved
    np.testing.assert_allclose(q_whole, q_kernels, rtol=0, atol=1e-14)


def test_sequential_cpu_kernels_gives_the_same_trajectory():
    """A process with the sequential schedule computes a SCARA simulation (Bosh3, 5 ms, 40 steps) to the same
    numbers as one without it (both with the suite's other XLA flags): the schedule orders kernels, it does
    not change them (bitwise expected; 1e-14 allows for XLA's choices)."""
    from conftest import xla_flags_without

    from ukjax._config import SEQUENTIAL_CPU_KERNELS_FLAG

    script = (
        "import json, os, sys, ukjax\n"
        "if sys.argv[1] == 'on':\n"
        "    assert ukjax.sequential_cpu_kernels()\n"
        "from ukjax.models import scara\n"
        "ukjax.enable_float64()\n"
        "p = scara.default_params(); q0, qd0 = scara.initial_state(p)\n"
        "sol = ukjax.simulate(scara.system(), q0, qd0, p, t1=0.2, dt=5e-3)\n"
        "print(json.dumps([sol.q.tolist(), 'concurrency_optimized' in os.environ['XLA_FLAGS']]))\n"
    )
    # the suite's flags without this one (the suite sets it too: conftest.SUITE_XLA_FLAGS)
    flags = xla_flags_without(SEQUENTIAL_CPU_KERNELS_FLAG)
    (on, flagged), (off, unflagged) = (_printed_json(script, mode, xla_flags=flags) for mode in ("on", "off"))
    assert flagged and not unflagged
    np.testing.assert_allclose(on, off, rtol=0, atol=1e-14)


def _printed_json(script: str, *args: str, xla_flags: str):
    """What ``script`` prints last, as JSON, run with ``args`` in a fresh CPU-only process whose
    ``XLA_FLAGS`` are ``xla_flags`` (options XLA reads when JAX starts)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags)
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                          check=True, timeout=600)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])
