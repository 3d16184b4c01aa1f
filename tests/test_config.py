"""ukjax changes no global JAX setting on import; float64 is one explicit call."""

import subprocess
import sys

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


def test_faster_cpu_compilation_adds_its_flag_once_and_respects_the_users(monkeypatch):
    """``ukjax.faster_cpu_compilation`` (called by the ``ukjax`` command) adds XLA:CPU's elemental-emitter
    flag to ``XLA_FLAGS`` and keeps the user's other flags; a second call, or a user who set the flag either
    way, changes nothing."""
    import os

    import ukjax
    from ukjax._config import FASTER_CPU_COMPILATION_FLAG

    monkeypatch.setattr(ukjax._config, "accelerator_plugins", lambda: [])  # a CPU-only machine (see below)
    other = "--xla_force_host_platform_device_count=2"
    monkeypatch.setenv("XLA_FLAGS", other)
    assert ukjax.faster_cpu_compilation() is True
    assert os.environ["XLA_FLAGS"] == f"{other} {FASTER_CPU_COMPILATION_FLAG}"
    assert ukjax.faster_cpu_compilation() is False
    assert os.environ["XLA_FLAGS"].count("fusion_emitters") == 1
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert ukjax.faster_cpu_compilation() is False
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=true"
    monkeypatch.delenv("XLA_FLAGS")
    assert ukjax.faster_cpu_compilation() is True and os.environ["XLA_FLAGS"] == FASTER_CPU_COMPILATION_FLAG


def test_faster_cpu_compilation_stays_off_where_an_accelerator_may_start(monkeypatch):
    """The CUDA plugin aborts a process whose ``XLA_FLAGS`` holds the CPU flag ("Unknown flag in XLA_FLAGS",
    jax 0.11.2 on an H200): with an accelerator plugin installed the flag is added only where
    ``JAX_PLATFORMS`` names the CPU alone. And the real plugin lookup works here (a list of names)."""
    import os

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
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert ukjax.faster_cpu_compilation() is True and "fusion_emitters=false" in os.environ["XLA_FLAGS"]
