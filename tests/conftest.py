"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes.

The suite's programs are released when each test module ends (``jax.clear_caches()``, the fixture below):
earlier, three full runs aborted inside XLA ~460 tests in, with the process's memory maps growing towards
``vm.max_map_count`` (~14,700 within one module). With jax 0.10.2 and the modules' programs released, a
process holds at most 3,440 maps (median 1,900; measured per module by the profile below), and one persistent
compilation cache shared by both workers, every module and the ``ukjax`` subprocesses (below) ran the whole
suite and three heavy modules (3RRR, command line, studies) in one process without an abort. It reads back
2,801 of the suite's 5,663 compilations and saved 6 % of its CPU time: 1101 s wall / 2041 CPU-s against 1175 s
/ 2175 CPU-s without it (same tree, one run each, load ~2.7 from the suite itself). The cache itself is tested
in a subprocess with its own folder (``tests/test_compile_and_gradient.py``).
"""

import os
import tempfile

from ukjax._config import cpu_only_process as _cpu_only_process  # starts no JAX backend

# Compile faster: the suite's time is XLA compilation (~60 % of it backend compilation, measured with
# jax.monitoring's compile events over the whole suite), and what it checks is what the programs compute, not
# how fast they run. tests/test_suite_compiler.py checks that the default configuration, which users run,
# gives the same numbers. Read when JAX starts its CPU backend, so set before any test runs; subprocesses (the
# command line, the GPU suite's smoke run) inherit it. Only where JAX can start the CPU's backend alone: the
# CUDA plugin aborts the process on these CPU flags (ukjax._config.faster_cpu_compilation says more).
# ``UKJAX_SUITE_XLA_FLAGS=...`` replaces them (empty: the users' configuration).
# - XLA:CPU's legacy elemental emitters (--xla_cpu_use_fusion_emitters=false) compile in about 0.6x the time
#   of the default fusion emitters: the whole suite took 542 s against 918 s (2 workers, load ~3).
# - Each program's machine code generated in one piece (--xla_cpu_parallel_codegen_split_count=1): XLA:CPU
#   otherwise splits a program's LLVM module into parts compiled on parallel threads, which costs CPU (the
#   demo's 256-scenario chunk program: 4.5 CPU-s in one piece against 5.6 split) that the other worker would
#   use, since the two workers keep both cores busy. Pairs of modules, interleaved (load 1.3-3.2): entrywise +
#   multibody 121 against 129 s wall, linalg + sweep 105 against 110 s.
# - LLVM without optimization (--xla_backend_optimization_level=0): the programs run ~3.5x slower (the demo's
#   integration 9.1-9.4 s against 2.7 s) but compile in two thirds of the time, and the suite's programs run
#   briefly. Whole suite, same tree (88d7db0), 2 workers: 825 passed in 688 s wall, 1266 + 45 CPU-s, XLA's
#   compilation 536 worker-s, against 771-957 s, 1437-1789 + 41-50 CPU-s and 796 worker-s without it (load
#   1.7-2.1); at d3f49b7, 540 s and 988 + 40 CPU-s at load 1.0. Levels 1 and 2 compile alike (entrywise +
#   docs modules: 113 s both, 79 s at 0). A risk, kept in view: at -O0 XLA once computed wrong numbers. The
#   tree of 521afa6 fails tests/test_sweep.py's chunking check at -O0, deterministically (the same 8 of 400
#   pendulum scenarios report a consistency residual of exactly 1.0 in one chunking, 1e-14 in the other; its
#   residual then came from a batched SVD at every saved time, which the default path no longer computes;
#   that SVD alone, batched the same way, is right at -O0). The suite of 88d7db0 and later passes whole at
#   -O0 (four full runs, 540-688 s), its checks compare programs with each other (batch against single,
#   chunkings, engines), and the users' default configuration is checked against this one
#   (tests/test_suite_compiler.py). A failure seen only here: rerun with ``UKJAX_SUITE_XLA_FLAGS=`` (the
#   users' configuration) before looking for it in ukjax.
# - Kernels one after the other (--xla_cpu_enable_concurrency_optimized_scheduler=false, what
#   ukjax.sequential_cpu_kernels sets): most of the suite's programs are one scenario or a few, whose small
#   kernels lose time being handed between threads. Five heavy modules (README, simulation, UR5 tuning,
#   entrywise, multibody), 2 interleaved rounds: 92 and 136 s wall (172 and 236 user CPU-s) against 103 and
#   142 s (192 and 246); the same numbers (tests/test_config.py).
SUITE_XLA_FLAGS = os.environ.get(
    "UKJAX_SUITE_XLA_FLAGS",
    "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    " --xla_backend_optimization_level=0 --xla_cpu_enable_concurrency_optimized_scheduler=false",
)
if _cpu_only_process() and SUITE_XLA_FLAGS.strip():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()


def xla_flags_without(flags: str = SUITE_XLA_FLAGS) -> str:
    """This process's ``XLA_FLAGS`` without ``flags`` (default: the suite's, which leaves the users'
    configuration), for a subprocess that must run without them."""
    return os.environ.get("XLA_FLAGS", "").replace(flags, "").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

import ukjax._config  # noqa: E402

# One persistent compilation cache for the whole run: a fresh folder, made by the first process that loads
# this file (pytest's main process, whose environment the xdist workers and the command-line subprocesses
# inherit), so a program compiled by one test module, worker or ``ukjax`` subprocess is read back by the
# others instead of compiled again (``jax.clear_caches()`` below releases each module's programs from memory).
# Every program is written, however fast it compiled. ``UKJAX_SUITE_CACHE=off`` runs without it; ``=DIR`` uses
# DIR.
if "UKJAX_SUITE_CACHE" not in os.environ:
    os.environ["UKJAX_SUITE_CACHE"] = tempfile.mkdtemp(prefix="ukjax-test-xla-")
SUITE_CACHE = os.environ["UKJAX_SUITE_CACHE"]
if SUITE_CACHE != "off":
    jax.config.update("jax_compilation_cache_dir", SUITE_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # ... and for every Python subprocess a test starts (the GPU suite's smoke workers, benchmark scripts):
    # JAX reads these variables when it is imported. A test that needs a cold or private cache sets its own.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", SUITE_CACHE)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The ``ukjax`` command turns the cache on (``ukjax.cli.main``): in-process it keeps the suite's setting, in a
# subprocess it uses the suite's folder, never the user's ~/.cache/ukjax/xla.
os.environ["UKJAX_CACHE_DIR"] = (
    SUITE_CACHE if SUITE_CACHE != "off" else tempfile.mkdtemp(prefix="ukjax-test-xla-")
)
ukjax._config.enable_compilation_cache = lambda path=None: None
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

# Python's cyclic garbage collector, cheaper (ukjax._config.fewer_garbage_collections, as the ``ukjax``
# command does): the imported modules' objects moved out of its generations, fewer collections; each module's
# leftovers join them when it ends (below). Four modules (3RRR, Jansen, control, dynamics), 2 workers, 2
# interleaved rounds: JAX's tracing 23.7 and 21.8 against 27.7 and 28.1 worker-s, lowering and XLA unchanged
# (within the spread). ``UKJAX_SUITE_GC=default`` keeps Python's own behaviour.
SUITE_GC = os.environ.get("UKJAX_SUITE_GC", "fewer")
if SUITE_GC != "default":  # `import ukjax._config` above imported all of ukjax: frozen with the rest
    ukjax._config.fewer_garbage_collections()


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


# The suite's modules run longest first: ``--dist loadfile --no-loadscope-reorder`` hands whole files to the
# two workers in collection order, so a long file collected last kept one worker busy alone at the end.
# (Without ``--no-loadscope-reorder``, pytest-xdist orders the files by their number of tests instead: in a
# run of 12df523 the README's and the compiler-configuration modules, 44 s together, ran last on one worker,
# which ended 42 s after the other.) The seconds per module come from a profile of the suite
# (``benchmarks/suite_profile.py --costs``); a module not in the table counts as the median.
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
    if SUITE_GC != "default":
        ukjax._config.fewer_garbage_collections()
