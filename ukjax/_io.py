"""Writing results that survive a crash: atomic files, JSON, and the environment block every record carries.

Every file ukjax writes for a user (sweep chunks and manifests, trajectories, reports, tuning checkpoints and
histories, study metrics) goes through :func:`atomic_write`: the bytes go to a temporary name in the same
folder (``NAME.tmp-PID``), are flushed and fsynced, and the temporary file is renamed over ``NAME`` with
``os.replace`` (atomic on POSIX file systems). A reader therefore sees either the old file or the whole new
one, never a truncated one, and a disk-full or killed writer leaves at most a ``*.tmp-PID`` file that
names the process that wrote it (so cleanup can tell a dead writer's file from a live one's:
:func:`stale_temporary`).

An ``OSError`` while writing (read-only folder, disk full) is re-raised as :class:`ResultWriteError`, an
``OSError`` whose message names the file, and the temporary file is removed.

One writer per folder: :func:`folder_lock` holds an exclusive ``fcntl.flock`` on ``FOLDER/.ukjax-lock`` (which
records the holder's PID and host) while a run writes the folder; a second run refuses with
:class:`FolderInUseError`. The kernel releases the lock when its holder exits, however it ends, so the lock
of a killed run (a dead PID) is taken over by the next run without any cleanup.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import platform
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

TEMPORARY_MARK = ".tmp-"
"""Temporary files are named ``NAME.tmp-PID``."""


class ResultWriteError(OSError):
    """A result file could not be written (read-only folder, disk full, ...); the message names the file."""


class FolderInUseError(ValueError):
    """Another live process holds the folder's lock; the message names the folder and that process."""


def _write_error(path, error: OSError) -> ResultWriteError:
    return ResultWriteError(error.errno, f"cannot write {path}: {error.strerror or error}")


def temporary_name(path: Path, pid: int | None = None) -> Path:
    return path.with_name(f"{path.name}{TEMPORARY_MARK}{os.getpid() if pid is None else pid}")


def atomic_write(path, write: Callable[[io.BufferedWriter], object]) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a binary file object that is flushed, fsynced and renamed
    over ``path``. Creates the parent folder. Raises :class:`ResultWriteError` naming ``path`` on failure."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise _write_error(path, error) from error
    return path


def atomic_write_bytes(path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_savez(path, compressed: bool = True, **arrays) -> Path:
    """``numpy.savez[_compressed]`` written atomically (a disk-full run leaves no corrupt zip behind)."""
    save = np.savez_compressed if compressed else np.savez
    return atomic_write(path, lambda f: save(f, **arrays))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def stale_temporary(folder, pattern: str = "*") -> list[Path]:
    """Temporary files (``*.tmp-PID``) under ``folder`` whose writer process no longer runs."""
    folder = Path(folder)
    stale = []
    for tmp in folder.glob(f"{pattern}{TEMPORARY_MARK}*") if folder.is_dir() else ():
        pid = tmp.name.rsplit(TEMPORARY_MARK, 1)[1].split(".")[0]
        if not pid.isdigit() or not pid_alive(int(pid)):
            stale.append(tmp)
    return stale


def not_a_folder(folder, *, what: str = "output folder") -> str | None:
    """Why ``folder`` or one of its parents cannot be (created as) a folder, naming the path: a regular file,
    a dangling symbolic link (naming its target), or another file that is not a folder; ``None`` when none is
    in the way."""
    folder = Path(folder)
    for path in [folder, *folder.parents]:
        if path.is_dir():
            return None
        if path.is_symlink() and not path.exists():
            where = "it" if path == folder else f"its parent {path}"
            return (
                f"the {what} {folder} cannot be created: {where} is a dangling symbolic link (to "
                f"{os.readlink(path)}, which does not exist); remove the link, create its target, or choose "
                "another --out"
            )
        if path.exists():
            kind = "a regular file" if path.is_file() else "a device, socket or pipe"
            if path == folder:
                return f"the {what} {folder} is {kind}, not a folder; choose another --out"
            return f"the {what} {folder} cannot be created: its parent {path} is {kind}; choose another --out"
    return None


LOCK_NAME = ".ukjax-lock"


@contextlib.contextmanager
def folder_lock(folder, *, what: str = "results folder") -> Iterator[Path]:
    """Hold the exclusive lock of ``folder`` (created if needed) during the ``with`` block: one writer.

    Raises :class:`FolderInUseError` naming the folder and the holder (PID and host, as the holder wrote them)
    when another process holds it, and :class:`ResultWriteError` naming the folder when it is a file or a
    dangling symbolic link (:func:`not_a_folder`) and the lock file when it cannot be created (read-only
    folder, disk full). A file system without ``flock`` support only warns."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    if problem := not_a_folder(folder, what=what):
        raise ResultWriteError(errno.ENOTDIR, problem)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _write_error(path, error) from error
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = Path(path).read_text().split()
            except OSError:
                holder = []
            who = f"process {holder[0]} on host {holder[1]}" if len(holder) >= 2 else "another process"
            raise FolderInUseError(
                f"the {what} {folder} is being written by {who} (lock file {path}); wait until it ends or "
                "use another output folder"
            ) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise _write_error(path, error) from error
            warnings.warn(
                f"the file system of {folder} does not support locks ({error.strerror}): nothing stops "
                "two runs from writing it at once",
                RuntimeWarning,
                stacklevel=3,
            )
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        except OSError as error:
            raise _write_error(path, error) from error
        yield path
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race with a process opening it)


# ------------------------------------------------------------------------------------------------- JSON
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Machine, backend and library versions, for every metrics.json, manifest and benchmark result."""
    import diffrax
    import equinox
    import jax

    devices = jax.devices()
    return {
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "backend": jax.default_backend(),
            "devices": [d.device_kind for d in devices],
        },
        "versions": {
            "python": sys.version.split()[0],
            "jax": jax.__version__,
            "jaxlib": getattr(jax.lib, "__version__", None) or jax.__version__,
            "diffrax": diffrax.__version__,
            "equinox": equinox.__version__,
            "numpy": np.__version__,
        },
        "float64": bool(jax.config.jax_enable_x64),
    }


def jsonable(value):
    """``value`` with arrays, NumPy scalars and tuples as JSON types (non-finite floats as strings)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray) or type(value).__module__.startswith(("jax", "jaxlib")):
        return jsonable(np.asarray(value).tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def write_json(path, payload: dict, *, with_environment: bool = True) -> Path:
    """Write ``payload`` (numbers, arrays, nested dicts) as indented JSON, atomically, adding the environment
    block unless ``with_environment=False``."""
    data = dict(payload)
    if with_environment:
        data.setdefault("environment", environment())
    return atomic_write_text(path, json.dumps(jsonable(data), indent=2, default=str) + "\n")


def read_json(path, *, what: str = "file") -> object:
    """``json.loads`` of ``path``; an unreadable or malformed file raises ``ValueError`` naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path}: {error.strerror or error}") from error
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"the {what} {path} is not valid JSON ({error})") from error
