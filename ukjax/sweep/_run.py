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
* **Resume.** A chunk whose Parquet file exists is skipped; files are written atomically, so a killed run
  loses at most the chunks in flight. Resuming needs the same spec (checked by a fingerprint in the manifest).
* Chunk results are fetched and written while the next chunk computes (JAX dispatches asynchronously).
* **Batched LAPACK on several CPU devices.** jaxlib 0.10's CPU LAPACK kernels (``lapack_*_ffi``: SVD, eigh,
  Cholesky, LU, QR, triangular solves) split a large enough batch (batch x cost >= 2e5 flop) over XLA:CPU's
  intra-op thread pool (one thread per core) and block the calling thread until the pieces are done
  (``jax::ParallelBatchMap``). With several simulated CPU devices each device's program runs on a thread of
  that same pool; once every pool thread is a device program blocked in such a call, the pieces they wait
  for can never run, and the sweep hangs at 0 % CPU (native stacks of a hung SCARA sweep on 2 devices:
  ``benchmarks/results/sweep-hang-stacks.txt``). So a sub-sweep whose lowered program calls a LAPACK kernel
  (:func:`lapack_calls`) runs on one device when the devices are CPUs, with a warning: the same table, at the
  throughput of one device (simulated CPU devices share the machine's cores anyway).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

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


def auto_chunk_size(model, spec: Spec, num_devices: int, total: int) -> int:
    """A chunk size that fits memory and leaves at least ~32 chunks (progress, resume) when that still gives
    every device >= 256 scenarios. Memory per scenario is estimated from the saved trajectory (num_saves x
    (8 n + 16) values) plus the integrator state, times 4 for intermediates; the budget is a quarter of the
    device's memory (``memory_stats()['bytes_limit']`` on GPUs, physical memory / devices on CPUs)."""
    n, saves = model.system.n, spec.integrator["num_saves"]
    per_scenario = 4 * 8 * (saves * (8 * n + 16) + 64 * n)
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        memory = stats["bytes_limit"]
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / len(jax.local_devices())
    fits = max(1, int(0.25 * memory // per_scenario)) * num_devices
    granular = max(math.ceil(total / 32), 256 * num_devices)
    return max(1, min(fits, granular, total))


def _numbers(options: dict, dtype) -> dict:
    return {k: jnp.asarray(v, dtype) for k, v in options.items() if v is not None}


def _user_metrics(spec: Spec) -> dict:
    return {name: _import(ref, f"metrics.user.{name}") for name, ref in spec.user_metrics.items()}


def _simulate(model, static, numbers, q0, qd0, params) -> tuple[Solution, jax.Array]:
    ts = jnp.linspace(numbers["t0"], numbers["t1"], static["num_saves"])
    sol = simulate_batch(
        model.system,
        q0,
        qd0,
        params,
        batch_params=True,
        t0=numbers["t0"],
        t1=numbers["t1"],
        ts=ts,
        dt=numbers.get("dt"),
        rtol=numbers["rtol"],
        atol=numbers["atol"],
        pinv_rtol=numbers.get("pinv_rtol"),
        consistency_rtol=numbers["consistency_rtol"],
        constraint_rtol=numbers["constraint_rtol"],
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

    def per_device(indices, numbers):
        params, q0, qd0, sampled = jax.vmap(build)(indices)
        sol, ts = _simulate(model, static, numbers, q0, qd0, params)
        reduce = reducer(model.system, ts, numbers["t0"], numbers["t1"], spec.tail, user_metrics)
        return sampled, jax.vmap(reduce)(sol, params)

    sharded = jax.shard_map(
        per_device, mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P(AXIS), check_vma=False
    )
    return jax.jit(sharded)


LAPACK_CALL = re.compile(r"custom_call @(lapack_\w+)")
"""A jaxlib CPU LAPACK kernel in a lowered (StableHLO) program."""


def lapack_calls(lowered) -> set[str]:
    """The jaxlib LAPACK kernels (``lapack_dgesdd_ffi``, ``lapack_dsyevd_ffi``, ...) that a lowered program
    calls."""
    return set(LAPACK_CALL.findall(lowered.as_text()))


def _blocks_on_cpu_pool(mesh: Mesh, lapack: set[str]) -> bool:
    """Several CPU devices would run batched LAPACK kernels at once on one thread pool: may deadlock."""
    return bool(lapack) and mesh.size > 1 and mesh.devices.flat[0].platform == "cpu"


def _prepare(spec, out, devices):
    """Everything checked before anything is compiled."""
    spec = load_spec(spec)
    model = load_model(spec.model)
    nominal_shapes(model, spec)
    user = _user_metrics(spec)
    mesh = _local_mesh(devices)
    out = Path(spec.out if out is None else out)
    return spec, model, user, mesh, out


def _resolve_chunk_size(spec, model, out, mesh, manifest) -> int:
    """The manifest's chunk size when resuming; else the spec's, or "auto"; never more than a sub-sweep (a
    larger chunk would only be padding)."""
    if manifest is not None:
        return manifest["chunk_size"]
    per_subsweep = Plan.from_spec(spec, 1).per_subsweep
    if spec.chunk_size is not None:
        return min(spec.chunk_size, per_subsweep)
    size = min(auto_chunk_size(model, spec, mesh.size, total_scenarios(spec)), per_subsweep)
    if jax.process_count() > 1:  # every process must cut the same chunks
        from jax.experimental import multihost_utils

        size = int(multihost_utils.broadcast_one_to_all(np.int64(size)))
    return size


def _check_manifest(spec: Spec, out: Path, manifest) -> None:
    if manifest is not None and manifest.get("fingerprint") != spec.fingerprint():
        raise ValueError(
            f"{out} holds a different sweep (manifest fingerprint {manifest.get('fingerprint')} != "
            f"{spec.fingerprint()}): resume only with the same spec, or use another out folder, or "
            "fresh=True (ukjax sweep --fresh) to discard it"
        )


def _fresh(out: Path) -> None:
    for name in (_store.CHUNKS, "report"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (_store.MANIFEST, "trajectories.npz"):
        (out / name).unlink(missing_ok=True)


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
    spec, *, out=None, devices: int | None = None, fresh: bool = False, progress: bool = True
) -> RunSummary:
    """Run (or resume) the sweep ``spec`` (a TOML path, a dict or a :class:`Spec`) into ``out`` (default the
    spec's ``out``); returns what this process did. ``devices``: how many local devices to use (default all).
    ``fresh``: discard the folder's earlier results of this sweep first."""
    spec, model, user, mesh, out = _prepare(spec, out, devices)
    process, processes = jax.process_index(), jax.process_count()
    if fresh and process == 0:
        _fresh(out)
    _barrier("ukjax-sweep-fresh")
    manifest = _store.read_manifest(out)
    _check_manifest(spec, out, manifest)
    chunk_size = _resolve_chunk_size(spec, model, out, mesh, manifest)
    plan = Plan.from_spec(spec, chunk_size)
    if manifest is None:
        manifest = _store.new_manifest(spec, model, plan, chunk_size=chunk_size)
        if process == 0:
            _store.write_manifest(out, manifest)
    if processes == 1:  # with several processes, another one may be writing its temporary file now
        _store.remove_temporary(out)
    done = _store.done_chunks(out)
    mine = [c for c in range(plan.num_chunks) if c % processes == process and c not in done]
    scenarios_mine = sum(plan.chunk(c)[2] - plan.chunk(c)[1] for c in mine)
    if process == 0:
        where = f" (process {process + 1} of {processes})" if processes > 1 else ""
        print(
            f"ukjax sweep {spec.name}: {plan.total} scenarios of model {spec.model} in "
            f"{plan.num_chunks} chunks of {chunk_size} on {mesh.size} "
            f"{mesh.devices.flat[0].platform} device(s){where}; {len(done)} chunks done before; results in "
            f"{out}",
            flush=True,
        )
    started = time.perf_counter()
    compile_s, one_device = _run_chunks(spec, plan, model, user, mesh, out, mine, scenarios_mine, progress)
    run_s = time.perf_counter() - started - compile_s
    _barrier("ukjax-sweep-done")
    complete = len(_store.done_chunks(out)) == plan.num_chunks
    if process == 0:
        if processes > 1:
            _store.remove_temporary(out)
        if complete and spec.trajectories and not (out / "trajectories.npz").exists():
            save_trajectories(spec, out, model)
        manifest = _store.read_manifest(out) or manifest
        manifest["runs"].append(
            {
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "processes": processes,
                "devices_per_process": mesh.size,
                "one_device_subsweeps": one_device,
                "device": str(mesh.devices.flat[0].device_kind),
                "chunks_written_by_process_0": len(mine),
                "scenarios_written_by_process_0": scenarios_mine,
                "compile_s": compile_s,
                "run_s": run_s,
                "complete": complete,
            }
        )
        _store.write_manifest(out, manifest)
    return RunSummary(out, plan.total, plan.num_chunks, len(mine), scenarios_mine, compile_s, run_s, complete)


def _run_chunks(spec, plan, model, user, mesh, out, mine, scenarios_mine, progress):
    """Compute and write the chunks ``mine``; returns the time spent compiling and, for each sub-sweep run on
    one device instead of ``mesh`` (batched LAPACK on CPU devices), the LAPACK kernels it calls."""
    from tqdm.auto import tqdm

    dtype = jnp.result_type(float)
    index_dtype = jnp.result_type(int)
    compiled, compile_s, one_device = {}, 0.0, {}
    bar = tqdm(
        total=scenarios_mine,
        unit="scenario",
        unit_scale=True,
        disable=not progress or not mine,
        desc=f"sweep {spec.name}",
        smoothing=0.1,
    )
    pending = None
    for c in mine:
        s, start, end = plan.chunk(c)
        _, number_options = integrator_options(spec, plan, s)
        numbers = _numbers(number_options, dtype)
        program = _program_of(spec, plan, s)
        if program not in compiled:
            tic = time.perf_counter()
            compiled[program] = _compiled(spec, plan, model, program, mesh, user, numbers)
            compile_s += time.perf_counter() - tic
        function, used, fallback = compiled[program]
        if fallback:
            one_device[s] = sorted(fallback)
        padded = -(-plan.chunk_size // used.size) * used.size
        indices = np.minimum(np.arange(start, start + padded), end - 1)
        # sub-sweep s runs the program of sub-sweep `program` (same static options) at that one's indices
        indices = (indices - (s - program) * plan.per_subsweep).astype(index_dtype)
        result = function(jax.device_put(indices, NamedSharding(used, P(AXIS))), numbers)
        if pending is not None:
            _finish(plan, out, bar, *pending)
        pending = (c, s, start, end - start, result)
    if pending is not None:
        _finish(plan, out, bar, *pending)
    bar.close()
    return compile_s, one_device


def _program_of(spec: Spec, plan: Plan, s: int) -> int:
    """The first sub-sweep whose program is that of sub-sweep ``s``: the same static integrator options
    (``method``, ``solver``, ``uk_solver``, ``max_steps``); sub-sweeps that differ only in traced numbers
    (``dt``, ``rtol``, ``pinv_rtol``, ...) share one compile. Their programs differ only in the index offset
    of the sub-sweep, so sub-sweep ``s`` runs at indices shifted by ``(s - program) * per_subsweep``."""

    def program(k):
        static, numbers = integrator_options(spec, plan, k)
        return static, sorted(name for name, value in numbers.items() if value is None)

    return next(k for k in range(s + 1) if program(k) == program(s))


class _Compiled(NamedTuple):
    function: object  # the compiled chunk function
    mesh: Mesh  # the devices it runs on
    lapack_fallback: set[str]  # LAPACK kernels that made it run on one device instead of several (or empty)


_COMPILED: dict = {}
"""Compiled chunk functions of this process, so that running the same sweep again (resuming) does not
recompile: keyed by everything the program depends on (the spec's fingerprint covers model, distributions,
integrator, metrics, seed and chunk size)."""


def _lower(spec, plan, model, s, mesh, user, numbers):
    padded = -(-plan.chunk_size // mesh.size) * mesh.size
    shape = jax.ShapeDtypeStruct((padded,), jnp.result_type(int), sharding=NamedSharding(mesh, P(AXIS)))
    return chunk_function(spec, plan, model, s, mesh, user).lower(shape, numbers)


def _compiled(spec, plan, model, s, mesh, user, numbers) -> _Compiled:
    """The compiled chunk function of sub-sweep ``s`` on ``mesh``, or on its first device alone when the
    program calls batched LAPACK kernels and the devices are CPUs (see the module docstring)."""
    key = (
        spec.fingerprint(),
        plan.chunk_size,
        s,
        tuple(d.id for d in mesh.devices.flat),
        jax.config.jax_enable_x64,
        tuple((k, v.dtype) for k, v in sorted(numbers.items())),
    )
    if key not in _COMPILED:
        lowered = _lower(spec, plan, model, s, mesh, user, numbers)
        lapack = lapack_calls(lowered)
        fallback = set()
        if _blocks_on_cpu_pool(mesh, lapack):
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


def _finish(plan, out, bar, c, s, start, count, result) -> None:
    sampled, metrics = jax.device_get(result)
    _store.write_chunk(out, c, _columns(plan, s, start, count, sampled, metrics))
    bar.update(count)


# ------------------------------------------------------------------------------ single scenarios again
class Scenario(NamedTuple):
    """One scenario re-simulated from its index: full trajectory, parameters and initial state."""

    index: int
    solution: Solution
    params: dict
    q0: jax.Array
    qd0: jax.Array
    integrator: dict


def rerun(source, indices) -> list[Scenario]:
    """Simulate the scenarios ``indices`` of a sweep again, with their full trajectories.

    ``source``: a result folder (its manifest holds the spec) or a spec. The draws depend only on the seed and
    the index, so this reproduces the scenario of the table (same inputs; same metrics to rounding)."""
    if isinstance(source, str | os.PathLike) and Path(source).is_dir():
        manifest = _store.read_manifest(source)
        if manifest is None:
            raise ValueError(f"{source} holds no sweep (no {_store.MANIFEST})")
        spec, chunk_size = load_spec(manifest["spec"]), manifest["chunk_size"]
    else:
        spec, chunk_size = load_spec(source), 1
    return _rerun(spec, load_model(spec.model), Plan.from_spec(spec, chunk_size or 1), indices)


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


def save_trajectories(spec: Spec, out: Path, model=None) -> Path:
    """Full trajectories of the spec's ``trajectories`` scenarios, into ``out/trajectories.npz``."""
    manifest = _store.read_manifest(out)
    plan = Plan.from_spec(spec, manifest["chunk_size"] if manifest else 1)
    scenarios = _rerun(spec, model or load_model(spec.model), plan, list(spec.trajectories))
    arrays = {"index": np.asarray([sc.index for sc in scenarios])}
    fields = ["ts", "q", "qd", "position_residual", "velocity_residual", "status"]
    if scenarios[0].solution.u is not None:
        fields += ["u", "servo_residual"]
    for field in fields:
        arrays[field] = np.stack([np.asarray(getattr(sc.solution, field)) for sc in scenarios])
    path = Path(out) / "trajectories.npz"
    np.savez_compressed(path, **arrays)
    return path
