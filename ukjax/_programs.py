"""Compiled programs of ukjax's own commands kept on disk, so that a second run neither traces nor compiles.

JAX's persistent compilation cache (:func:`ukjax.enable_compilation_cache`) skips XLA's compilation in a later
process, not the tracing and lowering before it, which JAX needs to find the program in that cache: for
``ukjax demo``'s chunk program those were 2.5-3 s of the 3.5 s a second run still spent "compiling" (2-core
CPU). A program all of whose code is ukjax's (the demo's: the SCARA model of Xu & Liu 2017 and the demo's
options) is kept as its compiled executable (``jax.experimental.serialize_executable``) in ``programs/``
inside the compilation cache's folder, under a key that holds everything its trace and code could depend
on: the program's name and options, its arguments' tree, shapes and dtypes, the contents of every ukjax
source file, the versions of Python, jax, jaxlib, diffrax, equinox and lineax, the float64 mode,
``XLA_FLAGS``, the backend and its device and, on Linux, the CPU's model and instruction-set flags. A later
process with the same key loads it and calls it. Nothing else is kept: a user's own model (code this key
cannot see) is always traced.

The file is read with ``pickle``, as JAX's compilation cache loads executables: only from the user's own
cache folder. Where the executable cannot be serialized, where no compilation cache is on, or with
``UKJAX_PROGRAM_CACHE=off``, the program is traced and compiled as usual; an unreadable file is traced again
and replaced.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import jax

_PACKAGES = ("jax", "jaxlib", "diffrax", "equinox", "lineax")
TRACED, READ = "traced", "read from the program cache"
PROGRAM_CACHE_ENV = "UKJAX_PROGRAM_CACHE"
"""``UKJAX_PROGRAM_CACHE=off`` traces every program (the compilation cache, if on, still skips XLA)."""


@functools.cache
def _sources_digest() -> str:
    """SHA-256 over the relative path and contents of every ``.py`` file of the ukjax package."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _machine() -> str:
    """The processor an executable was compiled for: its architecture and, on Linux, the model name and
    instruction-set flags of /proc/cpuinfo (XLA:CPU compiles for the host's instruction set)."""
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    lines.append(line.strip())
                if len(lines) >= 2:
                    break
    except OSError:
        pass
    return "\n".join([platform.machine(), *lines])


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def program_key(name: str, options: dict, args) -> str:
    """The key of program ``name`` with ``options`` (static: part of the trace) called on ``args``."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    device = jax.devices()[0]
    parts = [
        name,
        repr(sorted(options.items())),
        str(treedef),
        repr([(tuple(x.shape), str(x.dtype)) for x in leaves]),
        _sources_digest(),
        sys.version,
        repr([_version(p) for p in _PACKAGES]),
        str(bool(jax.config.jax_enable_x64)),
        os.environ.get("XLA_FLAGS", ""),
        jax.default_backend(),
        device.device_kind,
        device.client.platform_version,
        _machine(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def program_folder() -> Path | None:
    """``programs/`` inside the folder of JAX's persistent compilation cache; None where none is on or
    ``UKJAX_PROGRAM_CACHE=off``."""
    cache = jax.config.jax_compilation_cache_dir
    if not cache or os.environ.get(PROGRAM_CACHE_ENV, "").lower() == "off":
        return None
    return Path(cache) / "programs"


def _path(name: str, options: dict, args, folder: Path | None) -> Path | None:
    """Where program ``name`` is kept (None: nowhere, no program cache)."""
    folder = program_folder() if folder is None else Path(folder)
    return None if folder is None else folder / f"{name}-{program_key(name, options, args)}.xla"


def _load(path: Path | None):
    """The executable kept at ``path``, or None (none there, or a partial or foreign file, then removed)."""
    from jax.experimental import serialize_executable

    if path is None or not path.exists():
        return None
    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    except Exception:  # a partial or foreign file: traced again and replaced
        path.unlink(missing_ok=True)
        return None


def _keep(path: Path | None, compiled) -> None:
    """Write ``compiled`` to ``path``, whole or not at all; an executable, or an argument or output tree,
    that does not serialize and read back is used, not kept."""
    from jax.experimental import serialize_executable

    if path is None:
        return
    try:
        blob = pickle.dumps(serialize_executable.serialize(compiled))
        _, in_tree, out_tree = pickle.loads(blob)
        for tree in (in_tree, out_tree):  # an equinox Module's tree pickles but does not unflatten after
            tree.unflatten(range(tree.num_leaves))
    except Exception:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(blob)
    os.replace(partial, path)  # whole or absent for a concurrent reader


def compiled_program(name: str, fn, args, options: dict, folder: Path | None = None):
    """``(compiled, how)``: ``jax.jit(fn)`` compiled for ``args``, loaded from the program cache where an
    earlier process with the same key (:func:`program_key`) left it (``how`` = :data:`READ`), traced,
    compiled and left there otherwise (:data:`TRACED`).

    ``fn`` must be code of ukjax's only, its behaviour fixed by ``options`` and the tree, shapes and dtypes of
    ``args``. ``folder``: where programs are kept (default :func:`program_folder`)."""
    (compiled,), how = _read_or_compiled(
        [_path(name, options, args, folder)], lambda: [jax.jit(fn).lower(*args).compile()]
    )
    return compiled, how


def _read_or_compiled(paths: list, compile_all) -> tuple[list, str]:
    """``(programs, how)``: the programs kept at ``paths``, all of them read back (:data:`READ`), or else
    ``compile_all()``'s, one per path, each kept at its path (:data:`TRACED`)."""
    programs = [_load(path) for path in paths]
    if all(program is not None for program in programs):
        return programs, READ
    programs = compile_all()
    for path, program in zip(paths, programs, strict=True):
        _keep(path, program)
    return programs, TRACED


def compiled_side_by_side(first, second, args) -> tuple:
    """``first`` and ``second`` compiled for ``args`` (``second`` takes ``first``'s output as its last
    argument): ``first`` traced, then XLA compiles it on a thread of its own while ``second`` is traced and
    compiled (XLA's compile releases Python's lock). XLA:CPU compiles one program on ~1.6 cores and tracing
    is Python on one, so on two cores or more the two compilations overlap each other and the second trace.
    An error in either reaches the caller."""
    lowered = jax.jit(first).lower(*args)
    with ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(lowered.compile)
        second_program = jax.jit(second).lower(*args, lowered.out_info).compile()
        return compiling.result(), second_program


def compiled_pipeline(name: str, first, second, args, options: dict, folder: Path | None = None):
    """``(run, how)``: ``run(*args)`` computes ``second(*args, first(*args))`` with two compiled programs,
    read from the program cache as :func:`compiled_program` reads one (``how`` = :data:`READ` when both were
    there), compiled side by side otherwise (:func:`compiled_side_by_side`, ``how`` = :data:`TRACED`) and
    kept; ``run``'s two calls are dispatched without waiting in between.

    ``first`` and ``second`` as ``fn`` of :func:`compiled_program` (ukjax's own code, fixed by ``options``
    and the arguments' tree, shapes and dtypes; the second's extra argument follows from the first)."""
    paths = [_path(f"{name}-{stage}", options, args, folder) for stage in ("first", "second")]
    (first_program, second_program), how = _read_or_compiled(
        paths, lambda: compiled_side_by_side(first, second, args)
    )
    return (lambda *xs: second_program(*xs, first_program(*xs))), how
