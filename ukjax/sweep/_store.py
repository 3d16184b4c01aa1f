"""A sweep on disk: one Parquet file per chunk, written atomically, and a JSON manifest.

Layout of the output folder::

    manifest.json              spec, seed, model, integrator, versions, machine, chunking, runs
    chunks/chunk_000000.parquet   one row per scenario: index, replicate, varied values, metrics, status
    trajectories.npz           full trajectories of the scenarios the spec's ``trajectories`` names
    report/                    quantiles, failures, histograms and scatter plots (:func:`ukjax.sweep.report`)

A chunk file is written to ``chunk_XXXXXX.parquet.tmp-PID`` first, flushed to disk and renamed (``os.replace``
is atomic on POSIX file systems), so a file named ``*.parquet`` is always complete: a killed run leaves at
most a temporary file, which is ignored and removed by the next run.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import numpy as np

from ukjax._io import environment

MANIFEST = "manifest.json"
CHUNKS = "chunks"
FORMAT_VERSION = 1
ROLE_PREFIXES = ("params", "q0", "qd0", "integrator")
"""Columns that start with one of these (then '.' or '[') hold varied values; ``index``, ``replicate``,
``status`` and ``status_name`` identify the scenario; every other column is a metric."""


def chunk_path(out: Path, c: int) -> Path:
    return Path(out) / CHUNKS / f"chunk_{c:06d}.parquet"


def done_chunks(out: Path) -> set[int]:
    """Chunks whose Parquet file exists (complete, by the atomic rename)."""
    folder = Path(out) / CHUNKS
    if not folder.is_dir():
        return set()
    return {int(p.stem.split("_")[1]) for p in folder.glob("chunk_*.parquet")}


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_chunk(out: Path, c: int, columns: dict) -> Path:
    """Write one chunk's rows (``{column: 1-D array or list}``) atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = chunk_path(out, c)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({name: pa.array(values) for name, values in columns.items()})
    _atomic_write_bytes(path, lambda f: pq.write_table(table, f))
    return path


def remove_temporary(out: Path) -> int:
    """Remove temporary chunk files a killed run left behind; returns how many."""
    folder = Path(out) / CHUNKS
    removed = 0
    for tmp in folder.glob("*.tmp-*") if folder.is_dir() else ():
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def write_manifest(out: Path, manifest: dict) -> None:
    path = Path(out) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_jsonable(manifest), indent=2, default=str) + "\n"
    _atomic_write_bytes(path, lambda f: f.write(text.encode()))


def read_manifest(out) -> dict | None:
    path = Path(out) / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def new_manifest(spec, model, plan, *, chunk_size: int) -> dict:
    """What a result folder records about its sweep: enough to know what produced every number."""
    import ukjax

    system = model.system
    return {
        "format": FORMAT_VERSION,
        "name": spec.name,
        "fingerprint": spec.fingerprint(),
        "spec": spec.source,
        "seed": spec.seed,
        "model": {
            "name": spec.model,
            "n": system.n,
            "coordinate_names": list(system.coordinate_names) if system.coordinate_names else None,
            "controlled": system.actuation is not None and bool(system.servo_constraints),
        },
        "integrator": {
            **spec.integrator,
            "step": "adaptive PID" if spec.integrator["dt"] is None else "fixed",
        },
        "scenarios_total": plan.total,
        "replicates_per_cell": plan.replicates,
        "grid_cells": plan.cells,
        "subsweeps": plan.subsweeps,
        "chunk_size": chunk_size,
        "num_chunks": plan.num_chunks,
        "tail": spec.tail,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"ukjax": ukjax.__version__, **environment()["versions"]},
        "machine": environment()["machine"],
        "runs": [],
    }


def load(out, *, allow_partial: bool = False):
    """The whole sweep in ``out`` as one ``pyarrow.Table``, sorted by scenario index.

    ``.to_pandas()`` or ``polars.from_arrow(...)`` turn it into a data frame. Raises ``ValueError`` when
    chunks are missing (an unfinished run) unless ``allow_partial``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = read_manifest(out)
    if manifest is None:
        raise ValueError(f"{out} holds no sweep (no {MANIFEST})")
    done = done_chunks(out)
    missing = manifest["num_chunks"] - len(done)
    if missing and not allow_partial:
        raise ValueError(
            f"{out}: {missing} of {manifest['num_chunks']} chunks are missing (an unfinished "
            "run: run the sweep again to resume it, or pass allow_partial=True)"
        )
    if not done:
        raise ValueError(f"{out}: no chunk has been written yet")
    table = pa.concat_tables(
        [pq.read_table(chunk_path(out, c)) for c in sorted(done)], promote_options="default"
    )
    return table.sort_by("index")


def column_roles(names) -> dict[str, list[str]]:
    """{"id": ..., "varied": ..., "metrics": ...} column names, by :data:`ROLE_PREFIXES`."""
    roles = {"id": [], "varied": [], "metrics": []}
    for name in names:
        if name in ("index", "replicate", "status", "status_name"):
            roles["id"].append(name)
        elif any(name.startswith(p) and name[len(p) : len(p) + 1] in (".", "[") for p in ROLE_PREFIXES):
            roles["varied"].append(name)
        else:
            roles["metrics"].append(name)
    return roles
