"""Numerical precision and XLA:CPU options: ukjax never changes JAX's configuration on import.

Accuracy work on constrained dynamics needs float64 (constraint residuals of 1e-10 lie below float32
round-off), and JAX computes in float32 unless ``jax_enable_x64`` is on. ukjax leaves that choice to the
program that imports it:

* in a script, call :func:`enable_float64` (or ``jax.config.update("jax_enable_x64", True)``) once, before
  creating arrays;
* the ``ukjax`` command does it for you (``ukjax --float32 ...`` keeps float32 for throughput runs).

Compilation cache: a simulation is one XLA program, and compiling it costs seconds on a CPU. JAX can keep
compiled programs on disk and reuse them in a later process (its persistent compilation cache);
:func:`enable_compilation_cache` turns that on for a per-user folder, and the ``ukjax`` command does so by
default (``ukjax --no-cache`` does not). Programs that hold host callbacks are never cached by JAX, which is
why ukjax compiles none unless asked (``simulate(..., throw=True)``, ``progress=True``).

One XLA:CPU compilation option is set on import, where JAX has not started yet in a CPU-only process
(:func:`whole_cpu_loops`): loops of less than 4 MiB per iteration compiled into one function, which changes
how fast one scenario and a batch's chunks step (2-10x and 1.2-2x), not what they compute.

Every entry point integrates in the dtype of the state it is given and says so (``Solution.q.dtype``; the
command line prints it). :func:`simulate <ukjax.simulation.simulate>` warns once when float64 was not
enabled, since a float64 NumPy array then becomes float32 silently.
"""

import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp


def enable_float64() -> None:
    """Turn on JAX's float64 mode (``jax_enable_x64``) for this process: one line, explicit, opt-in."""
    jax.config.update("jax_enable_x64", True)


def float64_enabled() -> bool:
    """Whether JAX computes in float64 by default in this process."""
    return bool(jax.config.jax_enable_x64)


JAX_TESTED = ((0, 10), (0, 12))
"""The jax releases ukjax is tested with: >= 0.10 and < 0.12 (the CPU machines' jax 0.10.2 runs the whole
test suite; the GPU machine's jax 0.11.2 runs ``benchmarks/gpu_suite.py``). ukjax uses public jax APIs only
(``jax.shard_map``, ``jax.export``, ``jax.sharding``), so nearby releases may work; outside this range
nothing has been checked."""


def jax_version_supported() -> dict:
    """The running jax version against :data:`JAX_TESTED`: ``{"jax", "tested_range", "in_range"}``."""
    parts = [int(x) for x in jax.__version__.split(".")[:2] if x.isdigit()]
    low, high = JAX_TESTED
    return {
        "jax": jax.__version__,
        "tested_range": f">={low[0]}.{low[1]}, <{high[0]}.{high[1]}",
        "in_range": low <= tuple(parts) < high,
    }


FASTER_CPU_COMPILATION_FLAG = "--xla_cpu_use_fusion_emitters=false"
"""The XLA flag of :func:`faster_cpu_compilation`: XLA:CPU's legacy elemental emitters instead of its fusion
emitters."""


def accelerator_plugins() -> list[str]:
    """The JAX PJRT plugins installed for accelerators (``jax_plugins`` entry points and modules, e.g.
    ``xla_cuda13``), found without starting JAX's backends."""
    import importlib.util
    import pkgutil
    from importlib import metadata

    names = {entry.name for entry in metadata.entry_points(group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
    return sorted(names)


def cpu_only_process() -> bool:
    """Whether JAX in this process can start no backend but the CPU's: ``JAX_PLATFORMS`` names only ``cpu``,
    or no accelerator plugin is installed (:func:`accelerator_plugins`)."""
    platforms = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    return (bool(platforms) and set(platforms) == {"cpu"}) or not accelerator_plugins()


def faster_cpu_compilation() -> bool:
    """Compile CPU programs with XLA's legacy elemental emitters (``--xla_cpu_use_fusion_emitters=false`` in
    ``XLA_FLAGS``): opt-in, for work where compilation dominates (tests, short studies, a first look).

    Measured on the demo's program (``benchmarks/cpu_compile_flags.py``, results in
    ``benchmarks/results/cpu-compile-flags.json``; the SCARA of Xu & Liu 2017, Tsit5 at a fixed 5 ms step,
    1000 steps, float64, 2-core CPU, load 1-2): XLA's compilation takes 0.54-0.57x the time (256 scenarios:
    7.3-8.5 s against 12.6-14.9 s), but 1024 scenarios (the demo's default, four chunks of 256) run 1.85x
    slower (4.7-5.3 s against 2.7 s; 256 scenarios: as fast); the states agree to 7e-15. ukjax's test suite
    runs with it, and so does ``ukjax demo``, which compiles one 256-scenario chunk and calls it once per
    chunk (``benchmarks/demo_first_result.py``); the other commands do not.

    Only in a CPU-only process (:func:`cpu_only_process`): ``XLA_FLAGS`` is read by every backend, and the
    CUDA plugin aborts the process on this CPU flag ("Unknown flag in XLA_FLAGS", jax 0.11.2 on an H200,
    2026-11-28). Call it before the first JAX computation (XLA reads its flags when JAX starts its CPU
    backend). Does nothing, and returns False, where an accelerator may start or ``XLA_FLAGS`` already sets
    the flag either way; True where it added the flag."""
    return _add_cpu_flag(FASTER_CPU_COMPILATION_FLAG)


CPU_LOOP_BYTES = 4 << 20
"""The one-iteration memory traffic (bytes, XLA's cost analysis) below which XLA:CPU compiles a ``while``
loop into one function once :func:`whole_cpu_loops` is in effect (XLA's own default: 1024). 4 MiB: one
scenario of every model measured (70-170 KB per step) and the chunks of a CPU batch
(:func:`ukjax.options.whole_loop_chunk`)."""

CPU_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
"""XLA:CPU's backend option (``--xla_backend_extra_options=KEY=VALUE`` in ``XLA_FLAGS``) that
:func:`whole_cpu_loops` sets."""


def whole_cpu_loops(byte_threshold: int = CPU_LOOP_BYTES) -> bool:
    """Let XLA:CPU compile every ``while`` loop whose one iteration touches fewer than ``byte_threshold``
    bytes into one function (``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=N`` in
    ``XLA_FLAGS``). ``import ukjax`` calls it.

    XLA:CPU otherwise runs a loop's body as a chain of kernels, each dispatched by its runtime on its own:
    one UR5 scenario's RK4 step is ~460 kernels of 40-70 ns of dispatch each, more than the arithmetic.
    Compiled whole (XLA's small-loop hoisting, which it applies by default only below 1 KiB), one scenario's
    step ran 2.2-9.5x faster on the 2-core CPU (``benchmarks/one_scenario_cpu.py``, fresh processes: the Panda
    14.0 against 63.8 µs per RK4 step, MuJoCo's 15.6; a pinned 8-link chain 20.8 against 198 µs), the final
    states equal to 1.1e-15. A CPU batch is integrated in chunks small enough for it
    (:func:`ukjax.simulate_batch`'s ``chunk_size="auto"``, :func:`ukjax.options.whole_loop_chunk`); a loop
    above the threshold (a chunk of 256 UR5 scenarios touches ~20 MB per step) is left as it is: compiled
    whole it ran no faster (``benchmarks/robots_speed.py``, 1024 scenarios on two devices, 5.7-6.7 against
    5.7 µs); in chunks compiled whole, see ``benchmarks/batch_chunks_cpu.py``.

    Only in a CPU-only process (:func:`cpu_only_process`), where ``XLA_FLAGS`` does not set this option
    already (a threshold of your own wins: ``xla_cpu_small_while_loop_byte_threshold=1024`` restores XLA's
    default). XLA reads ``XLA_FLAGS`` when JAX starts its CPU backend, so this takes effect only if that has
    not happened yet in the process (:func:`cpu_loops_compiled_whole` says whether it did). True where the
    option was added."""
    flags = os.environ.get("XLA_FLAGS", "")
    if CPU_LOOP_OPTION in flags or not cpu_only_process():
        return False
    option, words = f"{CPU_LOOP_OPTION}={int(byte_threshold)}", flags.split()
    extra = [i for i, word in enumerate(words) if word.startswith("--xla_backend_extra_options=")]
    if extra:  # one flag holds every backend option: extend the last one (XLA reads the last)
        words[extra[-1]] += f",{option}"
    else:
        words.append(f"--xla_backend_extra_options={option}")
    os.environ["XLA_FLAGS"] = " ".join(words)
    return True


@functools.cache
def cpu_loops_compiled_whole() -> bool:
    """Whether this process's XLA:CPU compiles a loop of tens of kilobytes per iteration into one function
    (:func:`whole_cpu_loops` in effect, or a threshold of the user's at least as large): a probe program is
    compiled once and its HLO read (``xla_cpu_small_call``). :func:`ukjax.simulate` keeps its workarounds
    for a loop run kernel by kernel (:data:`ukjax._settings.SMALL_BUFFER_BYTES`) for processes where it is
    not."""
    probe = jnp.zeros(2048, jnp.float32)  # 8 KiB in and out of an iteration: far above XLA's 1 KiB
    body = lambda i, x: jnp.sin(x) * x + jnp.cos(x)  # noqa: E731
    loop = lambda x, n: jax.lax.fori_loop(0, n, body, x)  # noqa: E731  (n traced: the loop stays a loop)
    program = jax.jit(loop).lower(probe, 2).compile()
    return "xla_cpu_small_call" in program.as_text()


def _add_cpu_flag(flag: str) -> bool:
    """Append the XLA:CPU ``flag`` to ``XLA_FLAGS`` in a CPU-only process where ``XLA_FLAGS`` does not set it
    already (either way); whether it was added."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag.split("=")[0] in flags or not cpu_only_process():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    return True


SEQUENTIAL_CPU_KERNELS_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""The XLA flag of :func:`sequential_cpu_kernels`."""


def sequential_cpu_kernels() -> bool:
    """Run each CPU program's kernels one after the other (``--xla_cpu_enable_concurrency_optimized_scheduler
    =false`` in ``XLA_FLAGS``): opt-in, for one scenario at a time (a model-predictive-control loop, a single
    :func:`ukjax.simulate`), where every kernel is small.

    XLA:CPU's default schedule runs independent kernels side by side on its thread pool; for one scenario's
    step, a chain of ~170 kernels of ~70 ns each per right-hand side (the UR5), handing kernels to another
    thread costs more than it saves. Measured in fresh processes, 3 interleaved rounds, load 0.6-1.5
    (``benchmarks/cpu_schedule.py``; RK4 at 1 ms, float64, the same final states): the UR5, one scenario,
    ``ukjax.simulate`` in a ``jit``, 46.7 against 64.5 µs per step (called as it is, 49.7 against 65.4); the
    SCARA 10.3 against 10.9. Batches lose a little (1024 scenarios: the UR5 13.9 against 13.1 µs per step per
    scenario, the SCARA 2.3 against 1.9), so the ``ukjax`` command, whose work is batches, does not set it;
    ukjax's test suite, mostly single scenarios and small batches, does. The flag is read when JAX starts its
    CPU backend (a per-program ``compiler_options`` setting measured no effect): call this before the first
    JAX computation. Only in a CPU-only process (:func:`cpu_only_process`), as
    :func:`faster_cpu_compilation`. Does nothing, and returns False, where an accelerator may start or
    ``XLA_FLAGS`` already sets the flag either way; True where it added the flag. These figures were
    measured with every loop run kernel by kernel: a loop that :func:`whole_cpu_loops` compiles into one
    function has no kernel schedule left to change."""
    return _add_cpu_flag(SEQUENTIAL_CPU_KERNELS_FLAG)


FORCE_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that also sets the number of CPU devices; :func:`use_cpu_cores` leaves a count set there."""


def use_cpu_cores(count: int | None = None) -> int:
    """Give this process ``count`` JAX CPU devices (default: one per core it may run on), so that
    :func:`ukjax.simulate_batch` splits a batch over them and the cores integrate their shares side by side.

    One CPU device runs a batch's program as one chain of kernels over its chunks: XLA:CPU keeps ~1.2 of 2
    cores busy (independent kernels side by side). With a device per core, ``simulate_batch`` (``devices=
    "all"``, its default) gives each device an equal share of the scenarios (``jax.shard_map``: no
    communication, each share integrated as one device would, the same results). Measured on the 2-core
    CPU (``benchmarks/robots_speed.py --cpu-devices 2``: the UR5 of example-robot-data, 1024 scenarios, RK4
    at 1 ms, float64, interleaved in one process, load 0.9-1.5): 5.94 µs per step per scenario split over
    two devices against 11.8 on one (1.9 against 1.3 cores busy); MuJoCo's RK4 on both cores 5.07. One
    scenario (``ukjax.simulate``) and a batch traced inside a ``jit``, ``grad`` or ``vmap`` of your own run
    on one device as before.

    JAX fixes its devices when it starts its backends: call this right after importing ukjax, before the
    first JAX computation (else ``RuntimeError``). A count set already in ``XLA_FLAGS``
    (``--xla_force_host_platform_device_count``) is left as it is. Returns the number of CPU devices the
    process will have."""
    flags = os.environ.get("XLA_FLAGS", "")
    if FORCE_DEVICE_COUNT_FLAG in flags:
        return int(flags.split(FORCE_DEVICE_COUNT_FLAG + "=")[1].split()[0])
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"use_cpu_cores: count must be a positive int or None, got {count!r}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        raise RuntimeError(
            "ukjax.use_cpu_cores() must be called before the first JAX computation of the process (JAX fixes "
            "its CPU devices when it starts); call it right after importing ukjax"
        ) from None
    return count


def use_cpu_cores_if_starting(count: int | None = None) -> int | None:
    """:func:`use_cpu_cores` for a command of ukjax's own (``ukjax sweep``): in a CPU-only
    process (:func:`cpu_only_process`) whose JAX has not started; where JAX has started already (the command
    run inside a Python program) or an accelerator may start, nothing. The number of CPU devices set, or
    None."""
    if not cpu_only_process():
        return None
    try:
        return use_cpu_cores(count)
    except RuntimeError:  # JAX has started in this process: its devices stay as they are
        return None


TRACING_GC_THRESHOLD = (10_000, 50, 100)
"""Python's cyclic garbage collector's thresholds while a process traces programs
(:func:`fewer_garbage_collections`; Python's default is (700, 10, 10))."""


def fewer_garbage_collections() -> None:
    """Make Python's cyclic garbage collector cheaper for a process that traces and lowers programs: the
    objects alive now (the imported modules: JAX, diffrax, ukjax, ~1e6 objects) are moved out of its
    generations (``gc.freeze``), which a full collection would otherwise traverse each time, and it runs less
    often (:data:`TRACING_GC_THRESHOLD`). Tracing allocates millions of short-lived objects; on the SCARA's
    simulate and simulate_batch programs this took JAX's tracing from 3.2 to 2.6-2.8 s and its lowering from
    1.1 to 0.8-1.0 s (3 interleaved fresh processes); the test suite's tracing by ~18 %; the demo's first
    compile (1.5 s of tracing) did not change beyond the spread between runs
    (``benchmarks/demo_first_result.py``: 6.0 against 5.9 s, medians of 4 rounds, load 1.0-1.3). Garbage
    without cycles is freed at once as always; cycles are collected less often. For a program's own process
    (the ``ukjax`` command, the test suite): a library never changes this on import."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*TRACING_GC_THRESHOLD)


CACHE_ENV = "UKJAX_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$UKJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/ukjax/xla``, else ``~/.cache/ukjax/xla``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ukjax" / "xla"


CACHE_MIN_COMPILE_S = 0.0
"""Compile seconds above which :func:`enable_compilation_cache` writes a program (JAX's default: 1 s)."""


def enable_compilation_cache(path=None) -> Path:
    """Turn on JAX's persistent compilation cache at ``path`` (default :func:`default_cache_dir`).

    Every program is written there, however fast it compiled, and read back by any later process with the
    same program, JAX version and machine kind. (Above :data:`CACHE_MIN_COMPILE_S` only, the ~50 small
    programs of ``ukjax demo`` besides the simulation, its scenario draws, its post-processing, the batch's
    bucket padding and op-by-op steps, were compiled again in every process: 1.5-2 s of a second run at
    load ~5, against milliseconds to read each back.) In a script::

        import ukjax
        ukjax.enable_compilation_cache()

    Returns the folder. Call it before the first compilation of the process.
    """
    folder = Path(path).expanduser() if path is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
