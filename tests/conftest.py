"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

The suite runs in one process. Three full runs aborted inside XLA ~460 tests in (compiling, or writing the
3RRR test's program to JAX's persistent compilation cache); each file alone passed. The process's count of
memory maps was growing towards the kernel's limit (``vm.max_map_count``, 65530): ~14,700 within one test
module, falling back after ``jax.clear_caches()``. So every test module's compiled programs are released when
it ends (the fixture below). The persistent cache stays off for the suite: tests that call the ``ukjax``
command in-process would turn it on (``ukjax.cli.main`` does, as the command should), and a run with it on,
in a fresh folder, was 1035 s against 1129 s without (one run each, load ~1.5), and one folder shared by both
workers with the compiler flags below 554 s against 542 s: too small a gain to bring back the code path of
the first aborts. The cache itself is tested in a subprocess
(``tests/test_compile_and_gradient.py``), which this file does not affect.
"""

import os
import tempfile

# Compile faster: the suite's time is XLA compilation (~60 % of it backend compilation, measured with
# jax.monitoring's compile events over the whole suite), and what it checks is what the programs compute, not
# how fast they run. XLA:CPU's legacy elemental emitters compile in about 0.6x the time of the default fusion
# emitters: the whole suite took 542 s against 918 s (2 workers, load ~3). tests/test_suite_compiler.py
# checks that the default configuration, which users run, gives the same numbers. (LLVM at -O0 on top,
# --xla_backend_optimization_level=0, took it to 432 s but made successful scenarios of tests/test_sweep.py
# report a consistency residual of exactly 1.0 in one chunking and 1e-14 in another: not used.) Read when JAX
# starts its CPU backend, so set before any test runs; subprocesses (the command line, the GPU suite's smoke
# run) inherit it.
SUITE_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

import ukjax._config  # noqa: E402

os.environ["UKJAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ukjax-test-xla-")
ukjax._config.enable_compilation_cache = lambda path=None: None
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
if os.environ.get("UKJAX_SUITE_CACHE"):  # experiment: one persistent cache shared by the suite's workers
    jax.config.update("jax_compilation_cache_dir", os.environ["UKJAX_SUITE_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Opt-in profile of the suite's compile cost (issue 43's table): ``UKJAX_SUITE_PROFILE=DIR python3 -m pytest``
# writes one JSON file per worker to DIR with, per test module, its wall time, JAX's compile events (tracing,
# lowering to MLIR, XLA backend compilation: seconds and counts) and the number of backend compilations.
# benchmarks/suite_profile.py merges them into a table.
_PROFILE_DIR = os.environ.get("UKJAX_SUITE_PROFILE")
_PROFILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_profile_current: dict = {}


def _profile_listener(event, duration, **kwargs):
    name = _PROFILE_EVENTS.get(event)
    if name is not None and _profile_current:
        _profile_current[name + "_s"] = _profile_current.get(name + "_s", 0.0) + duration
        _profile_current[name + "_count"] = _profile_current.get(name + "_count", 0) + 1
        if name == "compile":
            programs = _profile_current.setdefault("programs", {})
            key = str(kwargs.get("fun_name", "?"))
            programs[key] = [programs.get(key, [0, 0.0])[0] + 1, programs.get(key, [0, 0.0])[1] + duration]


def _profile_event(event, **kwargs):
    if event.startswith("/jax/compilation_cache/") and _profile_current:
        name = event.rsplit("/", 1)[-1]
        _profile_current[name] = _profile_current.get(name, 0) + 1


if _PROFILE_DIR:
    import jax.monitoring  # noqa: E402

    jax.monitoring.register_event_duration_secs_listener(_profile_listener)
    jax.monitoring.register_event_listener(_profile_event)


# The suite's modules run longest first: ``--dist loadfile`` hands whole files to the two workers in collection
# order, so a long file collected last (alphabetically) kept one worker busy alone at the end. The seconds
# per module come from a profile of the suite (``benchmarks/suite_profile.py --costs``); a module not in the
# table counts as the median.
_COSTS_FILE = os.path.join(os.path.dirname(__file__), "suite_costs.json")


def pytest_collection_modifyitems(session, config, items):
    import json

    try:
        with open(_COSTS_FILE) as f:
            costs = json.load(f)
    except (OSError, ValueError):
        return
    known = sorted(costs.values())
    default = known[len(known) // 2] if known else 0.0
    module_of = lambda item: item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    order = {}
    for item in items:
        order.setdefault(module_of(item), len(order))
    items.sort(key=lambda item: (-costs.get(module_of(item), default), order[module_of(item)]))


@pytest.fixture(autouse=True, scope="module")
def _profile_module(request):
    """Per test module: wall time and JAX compile events, written where ``UKJAX_SUITE_PROFILE`` says."""
    if not _PROFILE_DIR:
        yield
        return
    import json
    import time

    _profile_current.clear()
    _profile_current["module"] = request.module.__name__
    start = time.perf_counter()
    yield
    _profile_current["wall_s"] = time.perf_counter() - start
    with open("/proc/self/maps") as maps:  # memory maps held (vm.max_map_count: see the module docstring)
        _profile_current["memory_maps"] = sum(1 for _ in maps)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs(_PROFILE_DIR, exist_ok=True)
    with open(os.path.join(_PROFILE_DIR, f"{worker}.jsonl"), "a") as f:
        f.write(json.dumps(_profile_current) + "\n")
    _profile_current.clear()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory compiled programs after each test module: a test module's programs are not
    reused by the next, and one process holding every program of the suite aborted inside XLA (compiling or
    serializing the 3RRR tests' programs, ~460 tests in; each file alone passes)."""
    yield
    jax.clear_caches()
