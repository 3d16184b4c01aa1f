"""Running a sweep: chunks, every local device, many hosts, resumable.

* **Chunks.** The scenarios are cut into chunks of ``chunk_size`` (the last chunk of each sub-sweep is padded
  to the same shape, the padding dropped), so every chunk of a sub-sweep reuses ONE compiled function.
* **Devices.** Each chunk is split over the local devices with ``jax.shard_map`` over a one-axis mesh
  (``NamedSharding`` of the scenario axis): each device samples, integrates and reduces its share of the
  chunk independently (no cross-device traffic inside the integration loop, so an adaptive integration on one
  device does not wait for the slowest scenario of another). Only the per-scenario metrics come back.
* **Hosts.** After :func:`initialize_distributed` (``jax.distributed.initialize``: auto-detected on SLURM and
  the other clusters JAX knows, or an explicit coordinator), process p of P takes chunks ``c ≡ p (mod P)``,
  computes them on its own devices and writes their files into the shared output folder; a barrier at the end
  lets process 0 finish the manifest and write trajectories.
* **Resume, proven.** Every file carries the sweep's identity and fingerprint (:mod:`ukjax.sweep._store`:
  resolved spec, seed, the source hashes of the model's and the user metrics' modules and of the user's
  modules they import, chunk layout, float64, library versions). A resume first proves the manifest (a
  manifest that is missing, not JSON or edited is rebuilt from the chunks' own metadata, or refused: never
  guessed), refuses a folder whose sweep differs from the one asked for (naming the manifest or chunk and
  what changed: spec, seed, model source, versions), and one whose model or metric code has no source file to
  prove it unchanged (:func:`ukjax.sweep._store.unverifiable`), takes the chunk size from the proven layout
  (a different requested ``chunk_size`` is ignored, with a warning), then verifies every chunk (page
  checksums, fingerprint, number, index range, row count, contents checksum) and computes again, with a
  warning naming the file and the reason, every chunk that does not prove itself. So a resume ends in the
  table of an uninterrupted run, or in a refusal naming the file.
* **One writer per folder** (:func:`ukjax._io.folder_lock`): a second run on the same folder refuses, naming
  the folder and the PID writing it; start-up cleanup removes only the temporary files of dead writers.
* **Sizes checked first.** The scenario count is checked against the scenario index's integer type and the
  estimated table size against the free space of the output's disk before anything is allocated; chunk
  numbers are iterated lazily, never listed.
* **Pipelined** (:func:`_run_chunks`): chunk k+1 is dispatched before chunk k is fetched (JAX dispatches
  asynchronously), and a writer thread (:class:`_ChunkWriter`: bounded queue, its errors raised in the caller)
  builds the columns and writes the Parquet file of chunk k while the next chunks are dispatched: the device
  waits between chunks only for a fetch and a dispatch, never for a write.
* **Chunk size** (``chunk_size = "auto"``, :func:`chunk_size_for`): on a GPU from the device's
  ``bytes_limit`` (two chunks in flight in half of it), at least 16 chunks so that the host's work overlaps
  the device's; on a CPU at least 32 chunks in a quarter of the memory.
* **Batched LAPACK on several CPU devices.** jaxlib 0.10's CPU LAPACK kernels (``lapack_*_ffi``: SVD, eigh,
  Cholesky, LU, QR, triangular solves) split a large enough batch (batch x cost >= 2e5 flop) over XLA:CPU's
  intra-op thread pool (one thread per core) and block the calling thread until the pieces are done
  (``jax::ParallelBatchMap``). With several simulated CPU devices each device's program runs on a thread of
  that same pool; once every pool thread is a device program blocked in such a call, the pieces they wait
  for can never run, and the sweep hangs at 0 % CPU (native stacks of a hung SCARA sweep on 2 devices:
  ``benchmarks/results/sweep-hang-stacks.txt``). So a sub-sweep whose lowered program calls a LAPACK kernel
  (:func:`ukjax.linalg.lapack_calls`) runs on one device when the devices are CPUs, with a warning: the same
  table, at the throughput of one device (simulated CPU devices share the machine's cores anyway).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import math
import os
import queue
import re
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ukjax._io import ResultWriteError, folder_lock, stale_temporary
from ukjax.fused import is_explicit_runge_kutta
from ukjax.linalg import blocks_on_cpu_pool, lapack_calls
from ukjax.simulation import RESULTS, Solution, simulate_batch
from ukjax.sweep import _store
from ukjax.sweep._models import _import, load_model
from ukjax.sweep._scenarios import METRIC_DESCRIPTIONS, Plan, integrator_options, reducer, scenario_builder
from ukjax.sweep._spec import (
    STATIC_INTEGRATOR,
    Spec,
    load_spec,
    nominal_shapes,
    solver_class,
    total_scenarios,
)

AXIS = "scenarios"
_STATUS_NAMES = np.array([code.name for code in RESULTS] + ["unknown"])


def initialize_distributed(coordinator_address=None, num_processes=None, process_id=None) -> None:
    """Join a multi-process JAX run (``jax.distributed.initialize``); call it before any JAX computation.

    Without arguments the cluster is auto-detected (SLURM, Open MPI, Kubernetes/GKE, Cloud TPU: whatever JAX
    supports). On CPUs the cross-process collectives use gloo (``jax_cpu_collectives_implementation``)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _local_mesh(devices: int | None) -> Mesh:
    local = jax.local_devices()
    if devices is not None:
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices must lie in 1..{len(local)} (the local devices), got {devices}")
        local = local[:devices]
    return Mesh(np.array(local), (AXIS,))


def scenario_bytes(model, spec: Spec) -> int:
    """Device memory one scenario of a chunk needs, at least: its saved trajectory (num_saves x (8 nq + 16)
    values: states, residuals, forces) plus the integrator state, 8 bytes each."""
    n, saves = model.system.nq, spec.integrator["num_saves"]
    return 8 * (saves * (8 * n + 16) + 64 * n)


def device_memory() -> float:
    """Memory of one local device: ``memory_stats()['bytes_limit']`` on GPUs, physical memory / devices on
    CPUs."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return stats["bytes_limit"]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / len(jax.local_devices())


INTERMEDIATES = 4
"""Device memory of a scenario in flight, in units of :func:`scenario_bytes` (the saved trajectory and the
integrator state): the integrator's stages, the reductions' temporaries and the drawn inputs."""
IN_FLIGHT = 2
"""Chunks on a device at once: the one computing and the next, dispatched before the first is fetched (the
pipeline of :func:`_run_chunks`)."""
MEMORY_FRACTION = 0.5
"""Share of an accelerator's memory (``bytes_limit``) the chunks in flight may take: the rest is XLA's, the
compiled program's and the allocator's."""
PIPELINE_CHUNKS = 16
"""Chunks an accelerator's sweep is cut into at least: the host's work on the last chunk (fetch, columns,
Parquet) has no next chunk to hide under, so 1/16 of the host's work adds to the device's time (measured,
``benchmarks/sweep.py --host-overhead``: the host's ~2 CPU-s per 1e6 SCARA scenarios leave ~0.15 s after the
last chunk at 32 chunks, ~0.45 s at 8; an H200 computes 1e6 in ~7.5 s). Fewer, larger chunks would save a
GPU's per-chunk costs, more would shorten that tail."""
CPU_CHUNKS = 32
"""Chunks a CPU sweep is cut into at least (progress and resume), while every device keeps >= 256
scenarios."""


def chunk_size_for(memory: float, per_scenario: float, *, devices: int, total: int, accelerator: bool) -> int:
    """Scenarios per chunk (a pure function of the numbers given; :func:`auto_chunk_size` feeds it the
    device's).

    ``memory``: bytes of one device; ``per_scenario``: bytes one scenario in flight takes on it
    (:func:`scenario_bytes` x :data:`INTERMEDIATES`); ``devices``: devices a chunk is split over.

    * **Accelerator** (``accelerator=True``: ``memory`` is the device's ``bytes_limit``): the largest chunk
      of which :data:`IN_FLIGHT` fit in :data:`MEMORY_FRACTION` of every device's memory, but no more than
      ``total / PIPELINE_CHUNKS``: few large chunks keep a GPU's per-call costs (one launch per chunk and
      integration step) small, and :data:`PIPELINE_CHUNKS` leave the host's work on all but the last chunk
      hidden under the next chunk's computation.
    * **CPU**: a quarter of the device's share of physical memory (the budget of earlier ukjax, unchanged),
      and at least :data:`CPU_CHUNKS` chunks while every device keeps >= 256 scenarios (CPU devices compute
      at the host's pace: smaller chunks give progress and resume at no cost).

    Never more than ``total`` nor less than 1."""
    if accelerator:
        fits = max(1, int(MEMORY_FRACTION * memory // (IN_FLIGHT * per_scenario))) * devices
        granular = math.ceil(total / PIPELINE_CHUNKS)
    else:
        fits = max(1, int(0.25 * memory // per_scenario)) * devices
        granular = max(math.ceil(total / CPU_CHUNKS), 256 * devices)
    return max(1, min(fits, granular, total))


def auto_chunk_size(model, spec: Spec, num_devices: int, total: int) -> int:
    """``chunk_size = "auto"``: :func:`chunk_size_for` with the first local device's memory
    (:func:`device_memory`) and :data:`INTERMEDIATES` x :func:`scenario_bytes` per scenario.

    The estimate is analytic, not the compiled program's ``memory_analysis()``: that would take a second
    compilation (tens of seconds on a GPU) before the first chunk, and the chunk size must be known to
    compile the program that runs."""
    accelerator = jax.local_devices()[0].platform != "cpu"
    return chunk_size_for(
        device_memory(),
        INTERMEDIATES * scenario_bytes(model, spec),
        devices=num_devices,
        total=total,
        accelerator=accelerator,
    )


def _numbers(options: dict, dtype) -> dict:
    return {k: jnp.asarray(v, dtype) for k, v in options.items() if v is not None}


def _user_metrics(spec: Spec) -> dict:
    return {name: _import(ref, f"metrics.user.{name}") for name, ref in spec.user_metrics.items()}


HOST_TIME_PLATFORMS = ("gpu",)
"""Platforms on which a fixed-step explicit Runge-Kutta sweep compiles its times into its program (see
:func:`host_times`)."""


def host_times(spec: Spec, plan: Plan, s: int) -> tuple[float, float, float] | None:
    """(t0, t1, dt) of sub-sweep ``s`` as constants of its chunk program, or None where they stay traced.

    ``simulate_batch(engine="auto")`` runs the fused one-kernel integrator (:mod:`ukjax.fused`) on a GPU when
    the steps between saves are known while tracing, which traced times hide. So on the platforms of
    :data:`HOST_TIME_PLATFORMS`, a fixed-step (``dt`` given) explicit Runge-Kutta sub-sweep gets its times as
    numbers of the program (a grid over them compiles once per value); elsewhere a grid over ``t1`` or ``dt``
    shares one compiled program."""
    if jax.local_devices()[0].platform not in HOST_TIME_PLATFORMS:
        return None
    static, numbers = integrator_options(spec, plan, s)
    if numbers.get("dt") is None or not is_explicit_runge_kutta(solver_class(static["solver"])):
        return None
    return float(numbers["t0"]), float(numbers["t1"]), float(numbers["dt"])


def _times(numbers, times):
    """(t0, t1, dt): the host constants ``times`` (:func:`host_times`) where given, else the traced
    ``numbers``' ones."""
    return times if times is not None else (numbers["t0"], numbers["t1"], numbers.get("dt"))


def _simulate(model, static, numbers, q0, qd0, params, times=None) -> tuple[Solution, jax.Array]:
    """The sub-sweep's ``simulate_batch`` and its saved times; ``times`` as :func:`_times` takes them."""
    t0, t1, dt = _times(numbers, times)
    ts = (np if times is not None else jnp).linspace(t0, t1, static["num_saves"])
    sol = simulate_batch(
        model.system,
        q0,
        qd0,
        params,
        batch_params=True,
        t0=t0,
        t1=t1,
        ts=ts,
        dt=dt,
        rtol=numbers["rtol"],
        atol=numbers["atol"],
        pinv_rtol=numbers.get("pinv_rtol"),
        consistency_rtol=numbers["consistency_rtol"],
        constraint_rtol=numbers["constraint_rtol"],
        constraint_atol=numbers.get("constraint_atol"),
        solver=solver_class(static["solver"])(),
        max_steps=static["max_steps"],
        method=static["method"],
        uk_solver=static["uk_solver"],
    )
    return sol, ts


def chunk_function(spec: Spec, plan: Plan, model, s: int, mesh: Mesh, user_metrics: dict):
    """``f(indices, numbers) -> (sampled, metrics)`` for sub-sweep ``s``: jit of shard_map over ``mesh``."""
    static, _ = integrator_options(spec, plan, s)
    build = scenario_builder(spec, plan, model, s)
    times = host_times(spec, plan, s)

    def per_device(indices, numbers):
        params, q0, qd0, sampled = jax.vmap(build)(indices)
        sol, ts = _simulate(model, static, numbers, q0, qd0, params, times)
        t0, t1, _ = _times(numbers, times)
        reduce = reducer(model.system, ts, t0, t1, spec.tail, user_metrics)
        return sampled, jax.vmap(reduce)(sol, params)

    sharded = jax.shard_map(
        per_device, mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P(AXIS), check_vma=False
    )
    return jax.jit(sharded)


def _prepare(spec, out, devices):
    """Everything checked before anything is compiled or written."""
    spec = load_spec(spec)
    model = load_model(spec.model)
    shapes = nominal_shapes(model, spec)
    user = _user_metrics(spec)
    mesh = _local_mesh(devices)
    out = Path(spec.out if out is None else out)
    check_capacity(spec, model, shapes, out, mesh)
    return spec, model, user, mesh, out


def row_bytes(spec: Spec, model, shapes: dict) -> int:
    """A lower bound of the bytes one scenario takes in the table: 8 per number of the index, the varied
    values and the metrics every sweep has (built-in, final state, one per user metric)."""
    varied = sum(math.prod(shape) for shape, _ in shapes.values()) + sum(
        1 for leaf in spec.leaves.values() if leaf.root == "integrator"
    )
    always = [m for m in METRIC_DESCRIPTIONS if "[" not in m and "servo" not in m and m != "peak_abs_u"]
    metrics = len(always) + model.system.nq + model.system.n + len(spec.user_metrics)
    return 8 * (1 + varied + metrics)


def _existing_folder(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_capacity(spec: Spec, model, shapes: dict, out: Path, mesh: Mesh) -> None:
    """Refuse, before anything is allocated (``ValueError`` giving the estimate): a scenario count whose
    indices overflow the index type, a requested chunk whose saved trajectories alone exceed a device's
    memory, a table larger than the free space of the output's disk."""
    total = total_scenarios(spec)
    index_type = np.dtype(jnp.result_type(int))
    if total - 1 > np.iinfo(index_type).max:
        hint = (
            "" if index_type == np.int64 else " or turn float64 on (ukjax.enable_float64()) for int64 indices"
        )
        raise ValueError(
            f"sweep {spec.name}: {total:,} scenarios do not fit the {index_type} scenario index (at most "
            f"{np.iinfo(index_type).max + 1:,}); lower spec field scenarios (--scenarios){hint}"
        )
    if spec.chunk_size is not None:
        size = min(spec.chunk_size, Plan.from_spec(spec, 1).per_subsweep)
        need, memory = -(-size // mesh.size) * scenario_bytes(model, spec), device_memory()
        if need > memory:
            raise ValueError(
                f"spec field chunk_size: a chunk of {size:,} scenarios needs at least {_size(need)} on each "
                f"of the {mesh.size} device(s) (saved trajectories alone), more than their {_size(memory)}; "
                'lower chunk_size (--chunk-size) or use chunk_size = "auto"'
            )
    per_row = row_bytes(spec, model, shapes)
    written = sum(path.stat().st_size for _, path in _store.chunk_files(out)) if out.is_dir() else 0
    need = total * per_row - written
    free = shutil.disk_usage(_existing_folder(out)).free
    if need > free:
        raise ValueError(
            f"sweep {spec.name}: {total:,} scenarios make a table of about {_size(total * per_row)} "
            f"({per_row} bytes per scenario at least), but only {_size(free)} are free on the disk of {out}; "
            "lower spec field scenarios (--scenarios) or choose another output folder"
        )


def _size(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000


def _resolve_chunk_size(spec, model, mesh) -> int:
    """The spec's chunk size, or "auto"; never more than a sub-sweep (a larger one would only be padding)."""
    per_subsweep = Plan.from_spec(spec, 1).per_subsweep
    if spec.chunk_size is not None:
        return min(spec.chunk_size, per_subsweep)
    return min(auto_chunk_size(model, spec, mesh.size, total_scenarios(spec)), per_subsweep)


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _other_sweep(out: Path, where: Path, changed: list[str]) -> ValueError:
    versions = any(w.startswith("the versions") for w in changed)
    return ValueError(
        f"{out} holds a different sweep: since {where} was written, {'; '.join(changed)} changed. Resume "
        "only with the same spec and model code, or use another output folder, or discard the folder's "
        "results with fresh=True (ukjax sweep --fresh)"
        + (
            ", or accept the new versions with allow_version_change=True (--allow-version-change)"
            if versions
            else ""
        )
    )


def _proven_chunk_size(spec: Spec, out: Path, allow_version_change: bool):
    """(chunk size, versions to accept) proven by the chunks' own metadata when there is no valid manifest;
    (None, []) without readable chunks. Refuses chunks of another sweep, naming one."""
    import json

    import pyarrow.parquet as pq

    by_size: dict = {}
    for _, path in _store.chunk_files(out):
        try:
            found = json.loads(pq.read_schema(path).metadata[_store.CHUNK_KEY])["identity"]
            size = int(found["layout"]["chunk_size"])
        except Exception:  # unreadable: it will be computed again
            continue
        by_size.setdefault(size, []).append((path, found))
    proven, first_other = [], None
    for size, files in sorted(by_size.items()):
        current = _store.identity(spec, Plan.from_spec(spec, size))
        extra = [found["versions"] for _, found in files if allow_version_change]
        good = [found for _, found in files if _store.matches(current, found, [current["versions"], *extra])]
        if good:
            proven.append((size, [v for v in extra if v != current["versions"]]))
        elif first_other is None:
            first_other = (files[0][0], _store.differences(files[0][1], current))
    if len(proven) > 1:
        raise ValueError(
            f"{out / _store.CHUNKS} holds chunks of this sweep cut in sizes {[p[0] for p in proven]}: which "
            "layout the folder holds cannot be proven; discard it with fresh=True (ukjax sweep --fresh)"
        )
    if proven:
        return proven[0]
    if first_other is not None:
        raise _other_sweep(out, first_other[0], first_other[1])
    return None, []


def _resume_state(spec: Spec, model, out: Path, mesh, allow_version_change: bool):
    """(manifest, plan, identity) of the sweep in ``out``, proven; chunks that do not prove themselves are
    removed (to be computed again) with a warning naming each and why."""
    path = out / _store.MANIFEST
    try:
        manifest = _store.read_manifest(out)
    except ValueError as error:
        _warn(f"{error}; rebuilding it from the chunks' own metadata")
        manifest = None
    extra_versions = []
    if manifest is not None:
        chunk_size = manifest["identity"]["layout"]["chunk_size"]
    else:
        chunk_size, extra_versions = _proven_chunk_size(spec, out, allow_version_change)
    requested = _resolve_chunk_size(spec, model, mesh) if spec.chunk_size is not None else None
    if chunk_size is None:
        chunk_size = requested or _resolve_chunk_size(spec, model, mesh)
    elif requested is not None and requested != chunk_size:
        _warn(
            f"chunk size {requested} ignored: the results in {out} are cut in chunks of {chunk_size}, which "
            "the resume keeps (the table does not depend on it; fresh=True / --fresh starts over in another "
            "size)"
        )
    plan = Plan.from_spec(spec, chunk_size)
    ident = _store.identity(spec, plan)
    if manifest is not None or _store.done_chunks(out):  # results to resume: their code must be provable
        for found in ([manifest["identity"]] if manifest is not None else []) + [ident]:
            if problem := _store.unverifiable_message(out, found):
                raise ValueError(problem)
    if _store.unverifiable(ident):
        _warn(
            f"sweep {spec.name}: the module(s) {', '.join(_store.unverifiable(ident))} of its model or "
            "metrics have no source file whose hash could be recorded: this run cannot be resumed"
        )
    if manifest is None:
        manifest = _store.new_manifest(spec, model, plan, ident)
        manifest["accepted_versions"] += extra_versions
        _store.write_manifest(out, manifest)
    elif not _store.matches(manifest["identity"], ident, manifest["accepted_versions"]):
        changed = _store.differences(manifest["identity"], ident)
        if not (allow_version_change and all(w.startswith("the versions") for w in changed)):
            raise _other_sweep(out, path, changed)
        _warn(f"{out}: resuming with other library versions ({'; '.join(changed)}), as allowed")
        manifest["accepted_versions"].append(ident["versions"])
        _store.write_manifest(out, manifest)
    for c, chunk in _store.chunk_files(out):
        check = _store.check_chunk(chunk, c, plan, manifest["identity"], manifest["accepted_versions"])
        if check.reason:
            _warn(f"the chunk file {chunk} {check.reason}: computing it again")
            _store.remove_file(chunk)
    return manifest, plan, ident


def _fresh(out: Path) -> None:
    for name in (_store.CHUNKS, "report"):
        if (out / name).exists():
            try:
                shutil.rmtree(out / name)
            except OSError as error:
                raise ResultWriteError(
                    error.errno, f"cannot remove {out / name}: {error.strerror}"
                ) from error
    for name in (_store.MANIFEST, _store.TRAJECTORIES):
        _store.remove_file(out / name)


def _remove_stale(out: Path) -> int:
    """Remove the temporary files of dead writers (``NAME.tmp-PID``, PID not running); returns how many."""
    stale = [tmp for folder in (out, out / _store.CHUNKS, out / "report") for tmp in stale_temporary(folder)]
    for tmp in stale:
        _store.remove_file(tmp)
    return len(stale)


def _columns(plan: Plan, s: int, start: int, count: int, sampled: dict, metrics: dict) -> dict:
    index = np.arange(start, start + count, dtype=np.int64)
    columns = {"index": index, "replicate": (index - s * plan.per_subsweep) % plan.replicates}
    for option, value in plan.integrator_values(s).items():
        columns[f"integrator.{option}"] = [value] * count
    columns.update({k: np.asarray(sampled[k])[:count] for k in sorted(sampled, key=_natural)})
    status = np.asarray(metrics["status"])[:count]
    columns["status"] = status
    columns["status_name"] = _STATUS_NAMES[np.clip(status, 0, len(_STATUS_NAMES) - 1)]
    columns.update({k: np.asarray(metrics[k])[:count] for k in sorted(metrics, key=_metric_order)})
    return columns


def _natural(name: str):
    """Sort key: 'x[10]' after 'x[9]'."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _metric_order(name: str):
    """Built-in metrics in the order of METRIC_DESCRIPTIONS, then the final state, then user metrics."""
    known = list(METRIC_DESCRIPTIONS)
    if name in known:
        return (0, known.index(name), [])
    if name.startswith(("q_final[", "qd_final[")):
        return (1, 0, _natural(name))
    return (2, 0, _natural(name))


class RunSummary(NamedTuple):
    out: Path
    scenarios_total: int
    chunks_total: int
    chunks_written: int
    scenarios_written: int
    compile_s: float
    run_s: float
    complete: bool

    @property
    def scenarios_per_s(self) -> float:
        return self.scenarios_written / self.run_s if self.run_s > 0 else float("nan")


def run(
    spec,
    *,
    out=None,
    devices: int | None = None,
    fresh: bool = False,
    progress: bool = True,
    allow_version_change: bool = False,
) -> RunSummary:
    """Run (or resume) the sweep ``spec`` (a TOML path, the name of a shipped spec such as ``"scara"``, a dict
    or a :class:`Spec`; :func:`~ukjax.sweep.load_spec`) into ``out`` (default the spec's ``out``); returns
    what this process did. ``devices``: how many local devices to use (default all).
    ``fresh``: discard the folder's earlier results of this sweep first. ``allow_version_change``: resume a
    sweep begun with other library versions (refused by default; :mod:`ukjax.sweep._store`).

    Raises ``ValueError`` (bad spec, a folder holding another sweep, a folder in use by another run, a table
    too large for the disk) and :class:`ukjax._io.ResultWriteError` (read-only folder, disk full), each naming
    the file or folder."""
    spec, model, user, mesh, out = _prepare(spec, out, devices)
    process, processes = jax.process_index(), jax.process_count()
    with contextlib.ExitStack() as held:
        if process == 0:  # the other processes of a jax.distributed run write chunks under process 0's lock
            held.enter_context(folder_lock(out, what="sweep folder"))
            if fresh:
                _fresh(out)
            if processes == 1:  # with several processes, another one may be writing its temporary file now
                _remove_stale(out)
            manifest, plan, ident = _resume_state(spec, model, out, mesh, allow_version_change)
        _barrier("ukjax-sweep-ready")
        if process != 0:
            manifest = _store.read_manifest(out)
            plan = Plan.from_spec(spec, manifest["identity"]["layout"]["chunk_size"])
            ident = _store.identity(spec, plan)
        return _run_proven(spec, model, user, mesh, out, manifest, plan, ident, progress)


def _mine(plan: Plan, done: set) -> range | filter:
    """This process's chunks still to compute, lazily (chunk numbers are never listed)."""
    process, processes = jax.process_index(), jax.process_count()
    return filter(lambda c: c not in done, range(process, plan.num_chunks, processes))


def _run_proven(spec, model, user, mesh, out, manifest, plan, ident, progress) -> RunSummary:
    process, processes = jax.process_index(), jax.process_count()
    done = _store.done_chunks(out)
    chunks_mine = sum(1 for _ in _mine(plan, done))
    scenarios_mine = sum(plan.chunk(c)[2] - plan.chunk(c)[1] for c in _mine(plan, done))
    if process == 0:
        where = f" (process {process + 1} of {processes})" if processes > 1 else ""
        print(
            f"ukjax sweep {spec.name}: {plan.total} scenarios of model {spec.model} in "
            f"{plan.num_chunks} chunks of {plan.chunk_size} on {mesh.size} "
            f"{mesh.devices.flat[0].platform} device(s){where}; {len(done)} chunks done before; results in "
            f"{out}",
            flush=True,
        )
    started = time.perf_counter()
    compile_s, one_device = _run_chunks(
        spec, plan, model, user, mesh, out, ident, _mine(plan, done), scenarios_mine, progress
    )
    run_s = time.perf_counter() - started - compile_s
    _barrier("ukjax-sweep-done")
    complete = len(_store.done_chunks(out)) == plan.num_chunks
    if process == 0:
        if processes > 1:
            _remove_stale(out)
        if complete and spec.trajectories:
            problem = _store.trajectories_problem(out, manifest["fingerprint"], spec.trajectories)
            if problem is not None:
                if problem != "is missing":
                    _warn(f"{out / _store.TRAJECTORIES} {problem}: writing it again")
                save_trajectories(spec, out, model, fingerprint=manifest["fingerprint"])
        manifest["runs"].append(
            {
                "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "processes": processes,
                "devices_per_process": mesh.size,
                "one_device_subsweeps": one_device,
                "device": str(mesh.devices.flat[0].device_kind),
                "versions": ident["versions"],
                "chunks_written_by_process_0": chunks_mine,
                "scenarios_written_by_process_0": scenarios_mine,
                "compile_s": compile_s,
                "run_s": run_s,
                "complete": complete,
            }
        )
        _store.write_manifest(out, manifest)
    return RunSummary(
        out, plan.total, plan.num_chunks, chunks_mine, scenarios_mine, compile_s, run_s, complete
    )


def _run_chunks(spec, plan, model, user, mesh, out, ident, mine, scenarios_mine, progress):
    """Compute and write the chunks ``mine``; returns the time spent compiling and, for each sub-sweep run on
    one device instead of ``mesh`` (batched LAPACK on CPU devices), the LAPACK kernels it calls.

    The pipeline: chunk k+1 is dispatched (:func:`_dispatch`: JAX returns before the device has run it) before
    chunk k's metrics are fetched (:func:`_fetch`, which waits for chunk k alone), and the fetched metrics go
    to the :class:`_ChunkWriter` thread, which turns them into columns and writes the Parquet file while this
    thread dispatches chunk k+2. So the device computes chunk k+1 while the host fetches chunk k, and waits
    between chunks only for what this thread does per chunk (a fetch and a dispatch), never for a write."""
    from tqdm.auto import tqdm

    dtype = jnp.result_type(float)
    index_dtype = jnp.result_type(int)
    compiled, compile_s, one_device = {}, 0.0, {}
    bar = tqdm(
        total=scenarios_mine,
        unit="scenario",
        unit_scale=True,
        disable=not progress or not scenarios_mine,
        desc=f"sweep {spec.name}",
        smoothing=0.1,
    )

    def write(c, s, start, count, sampled, metrics):
        columns = _columns(plan, s, start, count, sampled, metrics)
        _store.write_chunk(out, c, columns, ident=ident, index_range=(start, start + count))
        bar.update(count)

    in_flight, numbers_of = collections.deque(), {}
    with _ChunkWriter(write, threaded=WRITER_THREAD) as writer:
        for c in mine:
            s, start, end = plan.chunk(c)
            if s not in numbers_of:  # the sub-sweep's traced numbers, put on the device once
                numbers_of[s] = _numbers(integrator_options(spec, plan, s)[1], dtype)
            numbers = numbers_of[s]
            program = _program_of(spec, plan, s)
            if program not in compiled:
                tic = time.perf_counter()
                compiled[program] = _compiled(spec, plan, model, program, mesh, user, numbers, ident)
                compile_s += time.perf_counter() - tic
            function, used, fallback = compiled[program]
            if fallback:
                one_device[s] = sorted(fallback)
            # the last chunk of a sub-sweep is padded (repeating its last index) to the shape of the others,
            # so one compiled program serves every chunk; _columns drops the padded rows
            padded = -(-plan.chunk_size // used.size) * used.size
            indices = np.minimum(np.arange(start, start + padded), end - 1)
            # sub-sweep s runs the program of sub-sweep `program` (same static options) at that one's indices
            indices = (indices - (s - program) * plan.per_subsweep).astype(index_dtype)
            result = _dispatch(c, function, jax.device_put(indices, NamedSharding(used, P(AXIS))), numbers)
            in_flight.append((c, s, start, end - start, result))
            if len(in_flight) == IN_FLIGHT:  # the oldest chunk computes; the newest waits behind it
                writer.submit(*_fetch(*in_flight.popleft()))
        while in_flight:
            writer.submit(*_fetch(*in_flight.popleft()))
    bar.close()
    return compile_s, one_device


WRITER_THREAD = True
"""Write chunks on the :class:`_ChunkWriter` thread (False: in the calling thread, between dispatches, as
ukjax did before; the same files, for comparison: ``benchmarks/sweep.py --host-overhead``)."""
WRITER_QUEUE = 2
"""Fetched chunks that may wait for the writer thread (bounds the host memory they hold); a full queue makes
the dispatching thread wait for the writer, so a disk slower than the device slows the sweep, not memory."""


def _dispatch(c: int, function, indices, numbers):
    """Start chunk ``c`` on the device (JAX dispatches asynchronously: this returns before it is computed)."""
    return function(indices, numbers)


def _fetch(c: int, s: int, start: int, count: int, result):
    """Wait for chunk ``c`` and copy its draws and metrics to the host (numpy arrays)."""
    sampled, metrics = jax.device_get(result)
    return c, s, start, count, sampled, metrics


class _ChunkWriter:
    """Runs ``write(*chunk)`` for every submitted chunk, in order, on one background thread.

    * **Bounded**: at most :data:`WRITER_QUEUE` chunks wait; :meth:`submit` blocks while the queue is full.
    * **Errors reach the caller**: the first exception of ``write`` (a :class:`~ukjax._io.ResultWriteError`
      naming the file, from :func:`ukjax._io.atomic_write`) stops the thread, which writes nothing more; the
      next :meth:`submit` or the exit of the ``with`` block raises that same exception in the calling thread.
    * **Resume unchanged**: each chunk file is still written atomically with its proof
      (:func:`ukjax.sweep._store.write_chunk`), so a run killed with chunks in the queue leaves complete
      files or none: a resume recomputes the missing ones. When the ``with`` block exits by an exception the
      thread finishes the file it is writing and drops the queued chunks (computed again on resume).
    * ``threaded=False`` writes in :meth:`submit` itself (the synchronous path of earlier ukjax).
    """

    _STOP = object()

    def __init__(self, write, *, threaded: bool = True, queue_size: int | None = None):
        self._write = write
        self._error: BaseException | None = None
        self._thread = None
        if threaded:
            self._queue = queue.Queue(maxsize=WRITER_QUEUE if queue_size is None else queue_size)
            self._abandon = threading.Event()
            self._thread = threading.Thread(target=self._loop, name="ukjax-sweep-writer", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while (chunk := self._queue.get()) is not self._STOP:
            if self._error is None and not self._abandon.is_set():
                try:
                    self._write(*chunk)
                except BaseException as error:  # handed to the calling thread, raised there
                    self._error = error

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, *chunk) -> None:
        self._raise()
        if self._thread is None:
            self._write(*chunk)
            return
        while True:  # wait for room, but not on a writer that failed meanwhile
            try:
                self._queue.put(chunk, timeout=0.1)
                return
            except queue.Full:
                self._raise()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self._thread is None:
            return
        if kind is not None:
            self._abandon.set()
        self._queue.put(self._STOP)
        self._thread.join()
        if kind is None:
            self._raise()


def _program_of(spec: Spec, plan: Plan, s: int) -> int:
    """The first sub-sweep whose program is that of sub-sweep ``s``: the same static integrator options
    (``method``, ``solver``, ``uk_solver``, ``max_steps``); sub-sweeps that differ only in traced numbers
    (``dt``, ``rtol``, ``pinv_rtol``, ...) share one compile. Their programs differ only in the index offset
    of the sub-sweep, so sub-sweep ``s`` runs at indices shifted by ``(s - program) * per_subsweep``."""

    def program(k):
        static, numbers = integrator_options(spec, plan, k)
        return (
            static,
            sorted(name for name, value in numbers.items() if value is None),
            host_times(spec, plan, k),
        )

    return next(k for k in range(s + 1) if program(k) == program(s))


class _Compiled(NamedTuple):
    function: object  # the compiled chunk function
    mesh: Mesh  # the devices it runs on
    lapack_fallback: set[str]  # LAPACK kernels that made it run on one device instead of several (or empty)


_COMPILED: dict = {}
"""Compiled chunk functions of this process, so that running the same sweep again (resuming) does not
recompile: keyed by everything the program depends on (the sweep's fingerprint covers the spec, the model's
and metrics' source, seed, chunk layout and versions)."""


def _lower(spec, plan, model, s, mesh, user, numbers):
    padded = -(-plan.chunk_size // mesh.size) * mesh.size
    shape = jax.ShapeDtypeStruct((padded,), jnp.result_type(int), sharding=NamedSharding(mesh, P(AXIS)))
    return chunk_function(spec, plan, model, s, mesh, user).lower(shape, numbers)


def _compiled(spec, plan, model, s, mesh, user, numbers, ident) -> _Compiled:
    """The compiled chunk function of sub-sweep ``s`` on ``mesh``, or on its first device alone when the
    program calls batched LAPACK kernels and the devices are CPUs (see the module docstring)."""
    key = (  # this process's versions are those of its identity: the rest of it determines the program
        _store.fingerprint({part: value for part, value in ident.items() if part != "versions"}),
        s,
        tuple(d.id for d in mesh.devices.flat),
        jax.config.jax_enable_x64,
        tuple((k, v.dtype) for k, v in sorted(numbers.items())),
        host_times(spec, plan, s),  # times compiled into the program (a GPU's fixed-step sweeps)
    )
    if key not in _COMPILED:
        lowered = _lower(spec, plan, model, s, mesh, user, numbers)
        lapack = lapack_calls(lowered)
        fallback = set()
        if blocks_on_cpu_pool(mesh.devices.flat, lapack):
            fallback = lapack
            values = {k: v for k, v in plan.integrator_values(s).items() if k in STATIC_INTEGRATOR}
            where = f" (integrator {values})" if values else ""
            warnings.warn(
                f"sweep {spec.name}: the program{where} calls jaxlib's batched LAPACK kernels "
                f"({', '.join(sorted(lapack))}), which can deadlock when {mesh.size} CPU devices run them at "
                "once on one thread pool (jaxlib 0.10, jax::ParallelBatchMap); running it on one CPU device "
                "instead (the same results, at the throughput of one device)",
                RuntimeWarning,
                stacklevel=4,
            )
            mesh = Mesh(np.array([mesh.devices.flat[0]]), (AXIS,))
            lowered = _lower(spec, plan, model, s, mesh, user, numbers)
        _COMPILED[key] = _Compiled(lowered.compile(), mesh, fallback)
    return _COMPILED[key]


# ------------------------------------------------------------------------------ single scenarios again
class Scenario(NamedTuple):
    """One scenario re-simulated from its index: full trajectory, parameters and initial state."""

    index: int
    solution: Solution
    params: dict
    q0: jax.Array
    qd0: jax.Array
    integrator: dict


def rerun(source, indices, *, allow_version_change: bool = False) -> list[Scenario]:
    """Simulate the scenarios ``indices`` of a sweep again, with their full trajectories.

    ``source``: a result folder or a spec (as :func:`run` takes it; a folder of that name wins over a shipped
    spec's name). The draws depend only on the seed and the index, so this reproduces
    the scenario of the table (same inputs; same metrics to rounding). A folder's manifest and chunks must
    prove themselves as :func:`ukjax.sweep.load` checks them (an edited seed or spec, a manifest copied from
    another sweep is refused, naming the file), and the model's and metrics' code and the library versions
    must be those the sweep recorded (else ``ValueError`` saying what changed; ``allow_version_change``
    accepts other versions)."""
    if isinstance(source, str | os.PathLike) and Path(source).is_dir():
        manifest = _store.read_manifest(source)
        if manifest is None:
            raise ValueError(f"{source} holds no sweep (no {_store.MANIFEST})")
        spec, plan = _store.manifest_plan(manifest)
        # what load checks: a chunk of another sweep (a manifest copied over) is refused, naming the file
        for _ in _store.proven_chunks(source, manifest, plan, allow_version_change=allow_version_change):
            pass
        model = load_model(spec.model)
        _user_metrics(spec)
        current = _store.identity(spec, plan)
        for found in (manifest["identity"], current):
            if problem := _store.unverifiable_message(source, found):
                raise ValueError(problem)
        accepted = manifest["accepted_versions"] + ([current["versions"]] if allow_version_change else [])
        if not _store.matches(manifest["identity"], current, accepted):
            changed = _store.differences(manifest["identity"], current)
            raise ValueError(
                f"cannot re-simulate scenarios of {source}: since {Path(source) / _store.MANIFEST} was "
                f"written, {'; '.join(changed)} changed, so the scenarios would not be those of the table"
            )
    else:
        spec = load_spec(source)
        model, plan = load_model(spec.model), Plan.from_spec(spec, 1)
    return _rerun(spec, model, plan, indices)


def _rerun(spec, model, plan, indices) -> list[Scenario]:
    indices = [int(i) for i in np.atleast_1d(indices)]
    for i in indices:
        if not 0 <= i < plan.total:
            raise ValueError(f"scenario index {i} is not in 0..{plan.total - 1}")
    dtype = jnp.result_type(float)
    out = {}
    for s in sorted({plan.subsweep_of(i) for i in indices}):
        group = [i for i in indices if plan.subsweep_of(i) == s]
        static, number_options = integrator_options(spec, plan, s)
        numbers = _numbers(number_options, dtype)
        build = jax.jit(jax.vmap(scenario_builder(spec, plan, model, s)))
        params, q0, qd0, _ = build(jnp.asarray(group, jnp.result_type(int)))
        sol, _ = _simulate(model, static, numbers, q0, qd0, params)
        options = {**spec.integrator, **plan.integrator_values(s)}
        for k, i in enumerate(group):
            pick = lambda tree, k=k: jax.tree_util.tree_map(lambda x: x[k], tree)
            out[i] = Scenario(i, pick(sol), pick(params), q0[k], qd0[k], options)
    return [out[i] for i in indices]


def save_trajectories(spec: Spec, out: Path, model=None, *, fingerprint: str) -> Path:
    """Full trajectories of the spec's ``trajectories`` scenarios, into ``out/trajectories.npz`` (written
    atomically, with the sweep's ``fingerprint``, which a resume checks before keeping the file)."""
    plan = Plan.from_spec(spec, 1)
    scenarios = _rerun(spec, model or load_model(spec.model), plan, list(spec.trajectories))
    arrays = {"index": np.asarray([sc.index for sc in scenarios])}
    fields = ["ts", "q", "qd", "position_residual", "velocity_residual", "status"]
    if scenarios[0].solution.u is not None:
        fields += ["u", "servo_residual"]
    for field in fields:
        arrays[field] = np.stack([np.asarray(getattr(sc.solution, field)) for sc in scenarios])
    return _store.write_trajectories(out, arrays, fingerprint)
