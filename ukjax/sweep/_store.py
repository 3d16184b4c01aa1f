"""A sweep on disk that proves what it holds: Parquet chunks and a manifest carrying the sweep's identity.

Layout of the output folder::

    manifest.json                 identity and fingerprint, spec, model, integrator, versions, machine, runs
    chunks/chunk_000000.parquet   one row per scenario: index, replicate, varied values, metrics, status
    trajectories.npz              full trajectories of the scenarios the spec's ``trajectories`` names
    report/                       quantiles, failures, histograms, scatter plots (:func:`ukjax.sweep.report`)
    .ukjax-lock                   the PID of the run writing the folder (one writer per folder)

**Identity.** Everything that determines a row (:func:`identity`): the resolved spec (distributions,
integrator, metrics, scenario count; not ``out``, ``name``, ``chunk_size`` or ``trajectories``), the seed, the
model's identity (the SHA-256 of the source file of the module that provides it and of every module of the
user's it imports, directly or not: :func:`ukjax.sweep._models.module_identity`) and of every user metric's
module, the chunk layout (chunk size, number of chunks, scenarios), float64 or not, and the versions of ukjax,
JAX, jaxlib, diffrax, equinox and NumPy with the JAX backend. Its SHA-256 is the sweep's *fingerprint*.
Code of the user's without a source file to hash (a module built in memory) cannot be proven unchanged: a
sweep that depends on it runs, with a warning, but is never resumed or re-simulated (:func:`unverifiable`).

**Every file proves itself.** The manifest holds the identity and its fingerprint; :func:`read_manifest`
refuses a manifest whose fingerprint is not that of its identity, or whose spec, seed or chunk layout
disagree with the identity (an edited ``chunk_size`` or ``seed``). Each chunk's Parquet key-value metadata
(``ukjax.chunk``) holds the fingerprint and identity, the chunk's number, row count, index range and the
SHA-256 of its contents (:func:`content_digest`: every column's name, type and values); Parquet page checksums
are written and verified (CRC-32 of every data page). :func:`check_chunk` reads a chunk and verifies all of
it: a copied, swapped, truncated, bit-flipped or foreign chunk is found and named.

**Versions.** A change of ukjax, JAX, jaxlib, diffrax, equinox, NumPy or the JAX backend between a sweep's
runs changes the fingerprint, and a resume refuses it unless the caller passes
``allow_version_change=True`` (``ukjax sweep --allow-version-change``). Refusing is the default because a
new compiler or library version can move results (rounding, a changed default, a fixed bug), and a table
whose rows come from two versions is not the table of either; the override is for users who know their
change is immaterial. The manifest then lists every accepted set of versions (``accepted_versions``) and
each chunk records the versions it was computed with.

Every file is written atomically (:mod:`ukjax._io`): a file with its final name is complete.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ukjax._io import ResultWriteError, atomic_savez, atomic_write, environment, read_json, write_json

MANIFEST = "manifest.json"
CHUNKS = "chunks"
TRAJECTORIES = "trajectories.npz"
FORMAT_VERSION = 2
CHUNK_KEY = b"ukjax.chunk"
"""Key of a chunk's Parquet key-value metadata (JSON: fingerprint, identity, chunk, rows, indices, sha256)."""
IDENTITY_PARTS = ("spec", "seed", "model", "metrics", "layout", "float64", "versions")
ROLE_PREFIXES = ("params", "q0", "qd0", "integrator")
"""Columns that start with one of these (then '.' or '[') hold varied values; ``index``, ``replicate``,
``status`` and ``status_name`` identify the scenario; every other column is a metric."""
_CHUNK_NAME = re.compile(r"^chunk_(\d+)\.parquet$")


def chunk_path(out: Path, c: int) -> Path:
    return Path(out) / CHUNKS / f"chunk_{c:06d}.parquet"


def chunk_files(out) -> Iterator[tuple[int | None, Path]]:
    """``(chunk number, path)`` of every ``chunk_*.parquet`` file in ``out/chunks`` (number ``None`` when the
    name is not one ukjax writes), in name order."""
    folder = Path(out) / CHUNKS
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("chunk_*.parquet")):
        match = _CHUNK_NAME.match(path.name)
        yield (int(match[1]) if match else None), path


def done_chunks(out: Path) -> set[int]:
    """Chunks whose Parquet file exists (complete, by the atomic rename; :func:`check_chunk` proves them)."""
    return {c for c, _ in chunk_files(out) if c is not None}


# ---------------------------------------------------------------------------------------------- identity
def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def spec_digest(spec) -> str:
    """SHA-256 of the resolved spec, without what does not change a row (out, name, description,
    trajectories), what has its own part of the identity (seed) and the requested chunk size (the layout part
    holds the one in use)."""
    ignored = ("out", "name", "description", "trajectories", "seed", "chunk_size")
    source = {k: v for k, v in spec.source.items() if k not in ignored}
    return _digest({"source": source, "integrator": spec.integrator, "tail": spec.tail})


def versions() -> dict:
    """The library versions and the JAX backend a row depends on."""
    import jax

    import ukjax

    found = {"ukjax": ukjax.__version__, **environment()["versions"], "backend": jax.default_backend()}
    found.pop("python", None)
    return found


def identity(spec, plan) -> dict:
    """Everything that determines a row of the sweep ``spec`` cut by ``plan`` (see the module docstring)."""
    import jax

    from ukjax.sweep._models import module_identity, reference_module

    return {
        "spec": spec_digest(spec),
        "seed": spec.seed,
        "model": {"reference": spec.model, **module_identity(reference_module(spec.model))},
        "metrics": {
            name: {"reference": ref, **module_identity(reference_module(ref))}
            for name, ref in sorted(spec.user_metrics.items())
        },
        "layout": {
            "scenarios_total": plan.total,
            "chunk_size": plan.chunk_size,
            "num_chunks": plan.num_chunks,
        },
        "float64": bool(jax.config.jax_enable_x64),
        "versions": versions(),
    }


def fingerprint(ident: dict) -> str:
    return _digest(ident)


def differences(old: dict, new: dict) -> list[str]:
    """What changed from identity ``old`` to ``new``, in words, one item per changed part."""
    words = []
    for part in IDENTITY_PARTS:
        a, b = old.get(part), new.get(part)
        if a == b:
            continue
        if part == "spec":
            words.append("the spec's settings (distributions, integrator, metrics or scenario count)")
        elif part == "seed":
            words.append(f"the seed ({a} -> {b})")
        elif part == "model":
            if isinstance(a, dict) and isinstance(b, dict) and a.get("reference") == b.get("reference"):
                words.append(_code_change(a, b, "the model's module"))
            else:
                words.append(f"the model ({(a or {}).get('reference')} -> {(b or {}).get('reference')})")
        elif part == "metrics":
            a, b = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
            ref = lambda code: code.get("reference") if isinstance(code, dict) else None
            same = [k for k in sorted(set(a) & set(b)) if ref(a[k]) == ref(b[k])]
            if set(a) == set(b) == set(same):
                changes = [_code_change(a[k], b[k], f"metric {k}'s module") for k in same if a[k] != b[k]]
                words.append("; ".join(changes) or "the code of the user metrics")
            else:
                words.append(f"the user metrics ({sorted(a)} -> {sorted(b)}, or the functions they name)")
        elif part == "layout":
            words.append(f"the chunk layout ({a} -> {b})")
        elif part == "float64":
            words.append(f"float64 ({a} -> {b})")
        else:
            a, b = a or {}, b or {}
            changed = [
                f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            ]
            words.append(f"the versions ({', '.join(changed)})")
    return words


def _code_change(old: dict, new: dict, what: str) -> str:
    """In words, which source files of a model's or metric's code changed from ``old`` to ``new``
    (:func:`ukjax.sweep._models.module_identity`)."""
    name = new.get("module")
    if "imports" not in old:
        return (
            f"the record of {what} {name}'s code (written by an older ukjax, without the modules it imports)"
        )
    words = []
    if old.get("sha256") != new.get("sha256"):
        words.append(f"the source of {what} {name} (edited since)")
    a, b = old.get("imports") or {}, new.get("imports") or {}
    edited = [m for m in sorted(set(a) & set(b)) if a[m] != b[m]]
    if edited:
        words.append(
            f"the source of module(s) {', '.join(edited)}, which {what} {name} imports (edited since)"
        )
    if set(a) != set(b):
        words.append(
            f"the modules {what} {name} imports (now also {sorted(set(b) - set(a))}, no longer "
            f"{sorted(set(a) - set(b))})"
        )
    return "; ".join(words) or f"the code of {what} {name}"


def unverifiable(ident: dict) -> list[str]:
    """The modules of an identity's model and metric code that have no source file to hash (digest
    ``None``): that such code is unchanged between runs cannot be proven, so a resume refuses it."""
    codes = [ident.get("model") or {}] + list((ident.get("metrics") or {}).values())
    found = []
    for code in codes:
        if not isinstance(code, dict):
            continue
        if "sha256" in code and code["sha256"] is None:
            found.append(str(code.get("module")))
        found += [name for name, digest in (code.get("imports") or {}).items() if digest is None]
    return sorted(set(found))


def unverifiable_message(out, ident: dict) -> str | None:
    """Why the sweep in ``out`` of identity ``ident`` cannot be resumed or re-simulated (``None``: it can)."""
    modules = unverifiable(ident)
    if not modules:
        return None
    return (
        f"cannot prove that the sweep in {out} ({Path(out) / MANIFEST}) is computed by unchanged code: the "
        f"module(s) {', '.join(modules)} of its model or metrics have no source file whose hash could be "
        "recorded (built in memory, or loaded without a file); put that code in a .py file, or discard the "
        "folder's results with fresh=True (ukjax sweep --fresh)"
    )


def matches(expected: dict, found: dict, accepted_versions) -> bool:
    """Whether a file of identity ``found`` belongs to the sweep of identity ``expected``: equal identities,
    or equal but for versions the sweep accepted (``accepted_versions``, see the module docstring)."""
    if fingerprint(found) == fingerprint(expected):
        return True
    strip = lambda ident: {k: v for k, v in ident.items() if k != "versions"}
    return strip(found) == strip(expected) and found.get("versions") in list(accepted_versions or [])


# ---------------------------------------------------------------------------------------------- chunks
def content_digest(table) -> str:
    """SHA-256 of a table's contents: each column's name, type, null count and values, in column order."""
    h = hashlib.sha256()
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        h.update(f"{name}\0{column.type}\0{column.null_count}\0".encode())
        values = column.to_numpy(zero_copy_only=False)
        if values.dtype == object:
            h.update("\0".join(map(str, values)).encode())
        else:
            h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


def write_chunk(out: Path, c: int, columns: dict, *, ident: dict, index_range: tuple[int, int]) -> Path:
    """Write one chunk's rows (``{column: 1-D array or list}``) atomically, with its proof in the metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({name: pa.array(values) for name, values in columns.items()})
    proof = {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint(ident),
        "identity": ident,
        "chunk": c,
        "rows": table.num_rows,
        "first_index": int(index_range[0]),
        "end_index": int(index_range[1]),
        "sha256": content_digest(table),
    }
    table = table.replace_schema_metadata({CHUNK_KEY: json.dumps(proof, sort_keys=True, default=str)})
    # dictionary encoding only for the text columns (status names, integrator methods: a few values each):
    # on the metrics' floats it finds no repeats and made the write ~4x slower. The encoding is not part of
    # the contents' digest, so chunks written either way prove themselves alike.
    text = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    path = chunk_path(out, c)
    return atomic_write(
        path, lambda f: pq.write_table(table, f, write_page_checksum=True, use_dictionary=text)
    )


class ChunkCheck(NamedTuple):
    path: Path
    table: object  # pyarrow.Table, or None when the chunk does not prove itself
    reason: str | None  # why it does not (None: it does)


def check_chunk(path: Path, c: int | None, plan, expected: dict, accepted_versions=()) -> ChunkCheck:
    """Read chunk file ``path`` (number ``c`` by its name) and verify it against the sweep of identity
    ``expected`` cut by ``plan``: page checksums, metadata, fingerprint, number, index range, row count,
    contents checksum. Never raises for a bad file: the reason says what is wrong."""
    import pyarrow.parquet as pq

    fail = lambda reason: ChunkCheck(path, None, reason)
    if c is None:
        return fail("is not named chunk_NUMBER.parquet")
    if not 0 <= c < plan.num_chunks:
        return fail(f"has a number beyond the sweep's {plan.num_chunks} chunks")
    try:
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
        raw = (parquet.metadata.metadata or {})[CHUNK_KEY]
        table = parquet.read()
        if (table.schema.metadata or {}).get(CHUNK_KEY, raw) != raw:  # the copy in the stored Arrow schema
            return fail("holds two copies of its ukjax metadata that differ (damaged)")
        proof = json.loads(raw)
        found = proof["identity"]
        stated = (
            proof["fingerprint"],
            proof["chunk"],
            proof["rows"],
            proof["first_index"],
            proof["end_index"],
        )
        digest = proof["sha256"]
    except KeyError:
        return fail("carries no proof of what it holds (its ukjax metadata is missing or incomplete)")
    except Exception as error:  # whatever a damaged file makes pyarrow or json raise: the reason is kept
        return fail(f"cannot be read ({type(error).__name__}: {error})")
    if not isinstance(found, dict) or stated[0] != fingerprint(found):
        return fail("has metadata whose fingerprint is not that of its identity (edited or damaged)")
    if not matches(expected, found, accepted_versions):
        return fail(f"belongs to another sweep (it differs in {'; '.join(differences(expected, found))})")
    _, start, end = plan.chunk(c)
    if stated[1:] != (c, end - start, start, end):
        return fail(
            f"holds chunk {stated[1]} (indices {stated[3]}..{stated[4] - 1}, {stated[2]} rows), not chunk "
            f"{c} (indices {start}..{end - 1}) (copied or renamed)"
        )
    if table.num_rows != end - start or "index" not in table.column_names:
        return fail(f"holds {table.num_rows} rows, not the {end - start} its metadata states")
    if not np.array_equal(table.column("index").to_numpy(), np.arange(start, end)):
        return fail(f"does not hold the indices {start}..{end - 1} in order")
    if content_digest(table) != digest:
        return fail("has contents whose checksum differs from the one written with them (damaged)")
    return ChunkCheck(path, table.replace_schema_metadata(None), None)


def remove_file(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise ResultWriteError(error.errno, f"cannot remove {path}: {error.strerror or error}") from error


# ---------------------------------------------------------------------------------------------- manifest
def write_manifest(out: Path, manifest: dict) -> None:
    write_json(Path(out) / MANIFEST, manifest, with_environment=False)


_MANIFEST_KEYS = {
    "format": int,
    "name": str,
    "fingerprint": str,
    "identity": dict,
    "accepted_versions": list,
    "spec": dict,
    "seed": int,
    "model": dict,
    "integrator": dict,
    "scenarios_total": int,
    "chunk_size": int,
    "num_chunks": int,
    "runs": list,
}


def read_manifest(out) -> dict | None:
    """The manifest of ``out`` after proving it (``None`` when there is none); a manifest that is not JSON,
    not a table, lacks a key, or whose contents disagree with its fingerprint raises ``ValueError`` naming it.
    The spec it holds is parsed and checked against the identity: an edited seed, chunk size or spec field is
    found here."""
    from ukjax.sweep._scenarios import Plan
    from ukjax.sweep._spec import load_spec

    path = Path(out) / MANIFEST
    if not path.is_file():
        return None
    manifest = read_json(path, what="sweep manifest")

    def refuse(reason):
        raise ValueError(f"the sweep manifest {path} {reason}")

    if not isinstance(manifest, dict):
        refuse(f"is a JSON {type(manifest).__name__}, not a table")
    for key, kind in _MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            refuse(
                f"lacks {key!r} (or it is not a {kind.__name__}): it was written by an older ukjax or edited"
            )
    ident = manifest["identity"]
    if set(ident) != set(IDENTITY_PARTS) or not isinstance(ident.get("layout"), dict):
        refuse("holds an identity without the parts " + ", ".join(IDENTITY_PARTS))
    if manifest["fingerprint"] != fingerprint(ident):
        refuse("holds an identity whose fingerprint is not the one it records (edited or damaged)")
    layout = ident["layout"]
    stated = (manifest["seed"], manifest["chunk_size"], manifest["num_chunks"], manifest["scenarios_total"])
    proven = (
        ident["seed"],
        layout.get("chunk_size"),
        layout.get("num_chunks"),
        layout.get("scenarios_total"),
    )
    if stated != proven:
        refuse(
            f"states seed, chunk size, chunks, scenarios {stated} where its fingerprinted identity has "
            f"{proven} (edited)"
        )
    try:
        spec = load_spec(manifest["spec"])
    except ValueError as error:
        refuse(f"holds a spec that is not valid ({error})")
    plan = Plan.from_spec(spec, layout["chunk_size"])
    if spec.seed != ident["seed"] or spec_digest(spec) != ident["spec"]:
        refuse("holds a spec that is not the one its fingerprint was made of (edited)")
    if (plan.total, plan.num_chunks) != (layout["scenarios_total"], layout["num_chunks"]):
        refuse("holds a chunk layout that does not cut its spec's scenarios")
    if ident["versions"] not in manifest["accepted_versions"]:
        refuse("does not list its own versions among the accepted ones (edited)")
    return manifest


def manifest_plan(manifest: dict):
    """(spec, plan) of a proven manifest."""
    from ukjax.sweep._scenarios import Plan
    from ukjax.sweep._spec import load_spec

    spec = load_spec(manifest["spec"])
    return spec, Plan.from_spec(spec, manifest["identity"]["layout"]["chunk_size"])


def new_manifest(spec, model, plan, ident: dict) -> dict:
    """What a result folder records about its sweep: enough to know what produced every number."""
    system = model.system
    env = environment()
    return {
        "format": FORMAT_VERSION,
        "name": spec.name,
        "fingerprint": fingerprint(ident),
        "identity": ident,
        "accepted_versions": [ident["versions"]],
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
        "chunk_size": plan.chunk_size,
        "num_chunks": plan.num_chunks,
        "tail": spec.tail,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": ident["versions"],
        "machine": env["machine"],
        "runs": [],
    }


# ---------------------------------------------------------------------------------------------- trajectories
def write_trajectories(out: Path, arrays: dict, fp: str) -> Path:
    return atomic_savez(Path(out) / TRAJECTORIES, **arrays, fingerprint=np.asarray(fp))


def trajectories_problem(out: Path, fp: str, indices) -> str | None:
    """Why ``out/trajectories.npz`` is not the trajectories of the sweep of fingerprint ``fp`` for
    ``indices`` (``None``: it is)."""
    path = Path(out) / TRAJECTORIES
    if not path.is_file():
        return "is missing"
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except Exception as error:  # a damaged zip: BadZipFile, EOFError, ValueError, OSError...
        return f"cannot be read ({type(error).__name__}: {error})"
    if str(arrays.get("fingerprint", "")) != fp:
        return "belongs to another sweep (its fingerprint differs)"
    if list(np.asarray(arrays.get("index", [])).tolist()) != list(indices):
        return f"holds the scenarios {np.asarray(arrays.get('index')).tolist()}, not {list(indices)}"
    if any(k not in arrays or arrays[k].shape[:1] != (len(indices),) for k in ("ts", "q", "qd", "status")):
        return "lacks an array of the trajectories"
    return None


# ---------------------------------------------------------------------------------------------- load
def load(out, *, allow_partial: bool = False, allow_version_change: bool = False):
    """The whole sweep in ``out`` as one ``pyarrow.Table``, sorted by scenario index, after proving every
    file: a manifest or chunk that does not prove itself raises ``ValueError`` naming the file.

    ``.to_pandas()`` or ``polars.from_arrow(...)`` turn it into a data frame. Raises ``ValueError`` when
    chunks are missing (an unfinished run) unless ``allow_partial``. Chunks computed with other library
    versions than the manifest's are refused unless the sweep accepted them (``allow_version_change`` at its
    resume) or ``allow_version_change`` is given here."""
    import pyarrow as pa

    manifest = read_manifest(out)
    if manifest is None:
        raise ValueError(f"{out} holds no sweep (no {MANIFEST})")
    _, plan = manifest_plan(manifest)
    tables = list(proven_chunks(out, manifest, plan, allow_version_change=allow_version_change))
    missing = plan.num_chunks - len(tables)
    if missing and not allow_partial:
        raise ValueError(
            f"{out}: {missing} of {plan.num_chunks} chunks are missing (an unfinished "
            "run: run the sweep again to resume it, or pass allow_partial=True)"
        )
    if not tables:
        raise ValueError(f"{out}: no chunk has been written yet")
    return pa.concat_tables(tables, promote_options="default").sort_by("index")


def proven_chunks(out, manifest: dict, plan, *, allow_version_change: bool = False) -> Iterator:
    """The table of every chunk file of ``out`` (in name order) after :func:`check_chunk` proved it against
    the proven ``manifest``: the first that does not prove itself raises ``ValueError`` naming it (what
    :func:`load` and :func:`ukjax.sweep.rerun` check of a folder)."""
    accepted = manifest["accepted_versions"]
    for c, path in chunk_files(out):
        found = check_chunk(path, c, plan, manifest["identity"], accepted)
        if found.reason and allow_version_change and found.reason.startswith("belongs to another sweep"):
            found = check_chunk(path, c, plan, manifest["identity"], accepted + [_versions_of(path)])
        if found.reason:
            raise ValueError(
                f"the chunk file {path} {found.reason}; run the sweep again (same spec and output folder) to "
                "compute it again"
            )
        yield found.table


def _versions_of(path: Path):
    import pyarrow.parquet as pq

    try:
        return json.loads(pq.read_schema(path).metadata[CHUNK_KEY])["identity"]["versions"]
    except Exception:
        return None


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
