"""A sweep folder proves what it holds: every fault inflicted on a results folder ends either in the table of
an uninterrupted run or in a refusal whose message names the file.

One tiny sweep (the pendulum of tests/sweep_models.py, 16 scenarios in chunks of 4, four Heun steps) is run
once, uninterrupted, as the reference; every test copies its folder, inflicts one fault, and resumes (or
loads, or re-runs a scenario). The resumes reuse the reference's compiled chunk function (the run module
caches it by the sweep's fingerprint), so the module compiles once. Tables are compared exactly
(``Table.equals``): the same compiled program on the same inputs gives the same bits.

Disk full and read-only folders are injected (a write function raising ``OSError(ENOSPC)`` / ``EROFS``),
since the tests run as root, for whom ``chmod`` does not stop writes; the ``chmod`` variant runs when not
root.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomllib

from ukjax import sweep
from ukjax._io import LOCK_NAME, FolderInUseError
from ukjax.cli import main
from ukjax.sweep import _models, _run, _store

TESTS = Path(__file__).resolve().parent
SPEC_TOML = """
name = "tiny"
model = "sweep_models:pendulum"
scenarios = 16
chunk_size = 4
seed = 11
trajectories = [2, 9]

[integrator]
t1 = 0.2
dt = 0.05
solver = "Heun"
max_steps = 8
num_saves = 5
constraint_rtol = 1.0

[vary]
"params.mass" = { dist = "uniform", low = 0.5, high = 1.5 }
"params.length" = { dist = "relative", spread = 0.05 }

[metrics]
user = { energy_drift = "sweep_models:energy_drift" }
"""
SPEC = tomllib.loads(SPEC_TOML)
CHUNKS = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("integrity") / "reference"
    summary = sweep.run(SPEC, out=out, progress=False)
    assert summary.complete and summary.chunks_total == CHUNKS
    with np.load(out / "trajectories.npz") as saved:
        trajectories = {k: saved[k] for k in saved.files}
    return out, sweep.load(out), trajectories


@pytest.fixture
def folder(reference, tmp_path):
    """A copy of the reference folder to damage."""
    return Path(shutil.copytree(reference[0], tmp_path / "sweep"))


def chunk(folder: Path, c: int) -> Path:
    return folder / "chunks" / f"chunk_{c:06d}.parquet"


def resume(folder: Path, spec=SPEC, **options):
    """Run the sweep again into ``folder``; returns (summary, warning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = sweep.run(spec, out=folder, progress=False, **options)
    return summary, [str(w.message) for w in caught]


def assert_reference(folder: Path, reference):
    _, table, trajectories = reference
    assert sweep.load(folder).equals(table)
    assert _store.read_manifest(folder) is not None  # the manifest proves itself again
    with np.load(folder / "trajectories.npz") as saved:
        for name, values in trajectories.items():
            np.testing.assert_array_equal(saved[name], values, err_msg=name)


def refusal(call, *names) -> str:
    """The ValueError/OSError message of ``call()``, which must name every path of ``names``."""
    with pytest.raises((ValueError, OSError)) as info:
        call()
    message = str(info.value)
    for name in names:
        assert str(name) in message, message
    return message


@pytest.fixture
def no_compile(monkeypatch):
    """Refusals happen before anything is compiled."""

    def fail(*args, **kwargs):
        raise AssertionError("compiled a sweep that should have been refused")

    monkeypatch.setattr(_run, "chunk_function", fail)
    monkeypatch.setattr(_run, "_COMPILED", {})


# ------------------------------------------------------------------------------------ manifest
def test_manifest_deleted_and_another_chunk_size_resumes_to_the_same_table(folder, reference):
    """The issue's 2,720 of 4,000 rows: the chunk size comes from the chunks' own metadata, not from the
    request, and the missing chunk is computed again."""
    (folder / "manifest.json").unlink()
    chunk(folder, 2).unlink()
    summary, said = resume(folder, {**SPEC, "chunk_size": 8})
    assert summary.chunks_total == CHUNKS and summary.chunks_written == 1
    assert any("chunk size 8 ignored" in w and "chunks of 4" in w for w in said), said
    assert_reference(folder, reference)


@pytest.mark.parametrize(
    "damage",
    ["not json", "a list", "no runs", "chunk_size edited", "seed edited", "fingerprint edited"],
)
def test_damaged_manifest_is_refused_by_load_and_rebuilt_by_a_resume(damage, folder, reference):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    if damage == "not json":
        path.write_text(path.read_text()[:100])
    elif damage == "a list":
        path.write_text(json.dumps([manifest]))
    elif damage == "no runs":
        del manifest["runs"]
        path.write_text(json.dumps(manifest))
    elif damage == "chunk_size edited":
        manifest["chunk_size"] = 8
        path.write_text(json.dumps(manifest))
    elif damage == "seed edited":
        manifest["spec"]["seed"] = 12
        path.write_text(json.dumps(manifest))
    else:
        manifest["identity"]["layout"]["chunk_size"] = 8
        path.write_text(json.dumps(manifest))
    refusal(lambda: sweep.load(folder), path)
    refusal(lambda: sweep.rerun(folder, [5]), path)  # an edited seed would re-simulate another scenario
    summary, said = resume(folder)
    assert summary.chunks_written == 0
    assert any(str(path) in w and "rebuilding it from the chunks" in w for w in said), said
    assert_reference(folder, reference)


# ------------------------------------------------------------------------------------ another sweep
@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"seed": 12}, "the seed (11 -> 12)"),
        ({"vary": {**SPEC["vary"], "params.g": {"dist": "relative", "spread": 0.1}}}, "the spec's settings"),
        ({"scenarios": 20}, "the spec's settings"),
    ],
)
def test_another_spec_is_refused_naming_the_file(change, part, folder, reference, no_compile):
    spec = {**SPEC, **change}
    message = refusal(lambda: sweep.run(spec, out=folder, progress=False), folder / "manifest.json")
    assert part in message and "--fresh" in message
    (folder / "manifest.json").unlink()  # without the manifest, the chunks' own metadata refuse it
    message = refusal(lambda: sweep.run(spec, out=folder, progress=False), folder / "chunks")
    assert part in message and ".parquet" in message
    assert not (folder / "manifest.json").exists()
    assert [c for c, _ in _store.chunk_files(folder)] == list(range(CHUNKS))  # nothing was discarded


def test_a_spec_moved_renamed_and_described_resumes_the_same_sweep(folder, reference, tmp_path, no_compile):
    """The same spec read from a file elsewhere, under another file name, with comments and a description
    added (what moving the shipped specs from experiments/sweep_NAME.toml into the package did): the same
    sweep, so a resume finds every chunk done and computes nothing."""
    moved = tmp_path / "elsewhere" / "tiny.toml"
    moved.parent.mkdir()
    described = SPEC_TOML.replace('name = "tiny"\n', 'name = "tiny"\ndescription = "a tiny sweep"\n')
    assert described != SPEC_TOML
    moved.write_text("# the tiny sweep, moved\n" + described)
    summary, said = resume(folder, spec=str(moved))
    assert summary.complete and summary.chunks_written == 0, summary
    assert not said, said
    assert_reference(folder, reference)


def test_edited_model_module_is_refused(folder, tmp_path, monkeypatch, no_compile):
    """The user's module changed (same name, the nominal mass x 1.5): resuming or re-running is refused."""
    source = (TESTS / "sweep_models.py").read_text()
    assert '"mass": 1.0' in source
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "sweep_models.py").write_text(source.replace('"mass": 1.0', '"mass": 1.5'))
    monkeypatch.syspath_prepend(str(edited))  # a new process importing the edited file
    monkeypatch.delitem(sys.modules, "sweep_models")
    monkeypatch.delitem(_models._LOADED, "sweep_models:pendulum", raising=False)
    message = refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / "manifest.json")
    assert "the source of the model's module sweep_models" in message
    message = refusal(lambda: sweep.rerun(folder, [3]), folder / "manifest.json")
    assert "sweep_models" in message


PROVIDER = """
import sweep_models
{import_line}


def pendulum():
    system, params, initial_state = sweep_models.pendulum()
    return system, {{**params, "mass": {value}}}, initial_state
"""


def _user_model(monkeypatch, root: Path, import_line: str, value: str, helper: str | None) -> dict:
    """The spec of the tiny sweep on fault_provider:pendulum, whose nominal mass comes from a helper module
    (``helper``: its source; None: none written), importable from ``root``; earlier imports forgotten (a new
    process)."""
    root.mkdir(exist_ok=True)
    (root / "fault_provider.py").write_text(PROVIDER.format(import_line=import_line, value=value))
    if helper is not None:
        (root / "fault_helper.py").write_text(helper)
    monkeypatch.syspath_prepend(str(root))
    for name in ("fault_provider", "fault_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(_models._LOADED, "fault_provider:pendulum", raising=False)
    return {**SPEC, "model": "fault_provider:pendulum", "scenarios": 4, "chunk_size": 2, "trajectories": []}


@pytest.mark.parametrize(
    ("import_line", "value"),
    [("from fault_helper import M1", "M1"), ("import fault_helper as constants", "constants.M1")],
)
def test_an_edited_helper_module_of_the_model_is_refused(import_line, value, tmp_path, monkeypatch):
    """The provider module is unchanged; a module it imports changed its constant (1.0 -> 1.5): a partial
    folder is not resumed with rows of both (the issue's silent mix), nor are its scenarios re-simulated."""
    spec = _user_model(monkeypatch, tmp_path / "v1", import_line, value, "M1 = 1.0\n")
    out = tmp_path / "sweep"
    summary = sweep.run(spec, out=out, progress=False)
    assert summary.complete and summary.chunks_total == 2
    assert list(_store.read_manifest(out)["identity"]["model"]["imports"]) == ["fault_helper", "sweep_models"]
    chunk(out, 1).unlink()  # a run stopped after its first chunk
    spec = _user_model(monkeypatch, tmp_path / "v2", import_line, value, "M1 = 1.5\n")
    assert sweep.load_model(spec["model"]).params["mass"] == 1.5
    message = refusal(lambda: sweep.run(spec, out=out, progress=False), out / "manifest.json")
    assert "module(s) fault_helper, which the model's module fault_provider imports" in message, message
    assert not chunk(out, 1).exists()
    message = refusal(lambda: sweep.rerun(out, [0]), out / "manifest.json")
    assert "fault_helper" in message


def test_a_model_whose_helper_has_no_source_file_is_not_resumed(tmp_path, monkeypatch, no_compile):
    """A helper module built in memory (no file to hash): the run warns that it cannot be resumed, and a
    resume or re-simulation is refused, naming the module and the manifest."""
    helper = type(sys)("fault_helper")
    helper.M1 = 1.0
    spec = _user_model(monkeypatch, tmp_path / "v1", "from fault_helper import M1", "M1", None)
    monkeypatch.setitem(sys.modules, "fault_helper", helper)
    out = tmp_path / "sweep"
    with pytest.warns(RuntimeWarning, match="fault_helper .*cannot be resumed"):
        with pytest.raises(AssertionError, match="compiled"):  # no_compile: the manifest is written first
            sweep.run(spec, out=out, progress=False)
    assert _store.read_manifest(out)["identity"]["model"]["imports"]["fault_helper"] is None
    for call in (lambda: sweep.run(spec, out=out, progress=False), lambda: sweep.rerun(out, [0])):
        message = refusal(call, out / "manifest.json")
        assert "fault_helper" in message and "no source file" in message and "--fresh" in message


def test_rerun_refuses_a_manifest_copied_from_another_sweep(folder, tmp_path, no_compile):
    """manifest.json copied from a sweep of seed 12 into the folder of seed 11: the manifest proves itself,
    but the chunks do not belong to it. load, a resume and rerun all refuse, naming a file; rerun used to
    simulate the other sweep's scenario."""
    other = tmp_path / "other"
    spec = sweep.load_spec({**SPEC, "seed": 12})
    model = sweep.load_model(spec.model)
    _run._resume_state(spec, model, other, _run._local_mesh(None), False)  # the other sweep's manifest
    shutil.copyfile(other / "manifest.json", folder / "manifest.json")
    message = refusal(lambda: sweep.load(folder), folder / "chunks")
    assert "belongs to another sweep" in message and "the seed (12 -> 11)" in message
    message = refusal(lambda: sweep.rerun(folder, [3]), folder / "chunks")
    assert "belongs to another sweep" in message and "the seed (12 -> 11)" in message
    refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / "manifest.json")


def test_other_library_versions_are_refused_unless_allowed(folder, reference, monkeypatch):
    real = _store.versions
    monkeypatch.setattr(_store, "versions", lambda: {**real(), "jax": "0.0.1"})
    message = refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / "manifest.json")
    assert "jax " in message and "0.0.1" in message and "--allow-version-change" in message
    chunk(folder, 3).unlink()
    summary, said = resume(folder, allow_version_change=True)
    assert summary.chunks_written == 1 and any("as allowed" in w for w in said)
    manifest = _store.read_manifest(folder)
    assert [v["jax"] for v in manifest["accepted_versions"]] == [real()["jax"], "0.0.1"]
    monkeypatch.setattr(_store, "versions", real)
    assert_reference(folder, reference)  # chunk 3 (other versions) is accepted: the manifest lists them


# ------------------------------------------------------------------------------------ damaged chunks
def test_chunk_copied_over_another_is_found_and_computed_again(folder, reference):
    shutil.copyfile(chunk(folder, 1), chunk(folder, 2))
    message = refusal(lambda: sweep.load(folder), chunk(folder, 2))
    assert "holds chunk 1" in message
    summary, said = resume(folder)
    assert summary.chunks_written == 1
    assert any(str(chunk(folder, 2)) in w and "computing it again" in w for w in said), said
    assert_reference(folder, reference)


def _flip(path: Path, position: int, bit: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_flipped_bit_in_a_data_page_fails_its_page_checksum(folder, reference):
    path = chunk(folder, 0)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)  # the index column
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    _flip(path, start + column.total_compressed_size - 2)  # the last byte but one of its data page
    check = _store.check_chunk(path, 0, _store.manifest_plan(_store.read_manifest(folder))[1], {}, [])
    assert "CRC checksum verification failed" in check.reason, check.reason
    summary, _ = resume(folder)
    assert summary.chunks_written == 1
    assert_reference(folder, reference)


def test_flipped_bits_anywhere_end_in_the_same_table(folder, reference):
    """A bit flipped at 12 places spread over a chunk file: load refuses naming the file, or returns the same
    table (a bit that changes nothing the table holds: the page headers' min/max statistics, which the page
    checksums do not cover, or the copy of the metadata inside the stored Arrow schema; the contents checksum
    proves the values are unchanged); a resume always ends in the reference table. Measured: 7 of the 12
    refused."""
    _, table, _ = reference
    path = chunk(folder, 1)
    size = path.stat().st_size
    refused = 0
    for position in np.linspace(4, size - 9, 12).astype(int):
        _flip(path, int(position))
        try:
            assert sweep.load(folder).equals(table)
        except ValueError as error:
            assert str(path) in str(error), error
            refused += 1
        resume(folder)
        assert sweep.load(folder).equals(table)
    assert refused >= 6, refused


def test_corrupted_and_truncated_chunks_are_named_and_computed_again(folder, reference):
    data = bytearray(chunk(folder, 1).read_bytes())
    middle = len(data) // 2
    data[middle : middle + 20] = b"\xa5" * 20
    chunk(folder, 1).write_bytes(bytes(data))
    truncated = chunk(folder, 3).read_bytes()
    chunk(folder, 3).write_bytes(truncated[: len(truncated) // 2])
    refusal(lambda: sweep.load(folder), chunk(folder, 1))
    refusal(lambda: sweep.report(folder, quiet=True), chunk(folder, 1))
    summary, said = resume(folder)
    assert summary.chunks_written == 2
    for c in (1, 3):
        assert any(str(chunk(folder, c)) in w for w in said), said
    assert_reference(folder, reference)


def test_stray_chunk_beyond_the_sweep_is_refused_by_load(folder, reference):
    shutil.copyfile(chunk(folder, 0), chunk(folder, 7))
    message = refusal(lambda: sweep.load(folder), chunk(folder, 7))
    assert "beyond the sweep's 4 chunks" in message
    resume(folder)
    assert not chunk(folder, 7).exists()
    assert_reference(folder, reference)


# ------------------------------------------------------------------------------------ trajectories
def test_corrupt_trajectories_are_written_again(folder, reference):
    path = folder / "trajectories.npz"
    path.write_bytes(path.read_bytes()[:200])
    summary, said = resume(folder)
    assert summary.chunks_written == 0 and any(str(path) in w and "cannot be read" in w for w in said)
    assert_reference(folder, reference)


def test_disk_full_while_writing_trajectories(folder, reference, monkeypatch):
    (folder / "trajectories.npz").unlink()

    def full(file, **arrays):
        file.write(b"PK\x03\x04 a partial zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full)
    refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / "trajectories.npz")
    assert not (folder / "trajectories.npz").exists()  # no corrupt zip left for a resume to accept
    assert not list(folder.glob("*.tmp-*"))
    monkeypatch.undo()
    resume(folder)
    assert_reference(folder, reference)


# ------------------------------------------------------------------------------------ disk full, read-only
def test_disk_full_while_writing_chunks(folder, reference, monkeypatch, capsys, tmp_path):
    for c in (1, 2, 3):
        chunk(folder, c).unlink()
    real, calls = pq.write_table, []

    def fills_the_disk(table, where, **options):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **options)

    monkeypatch.setattr(pq, "write_table", fills_the_disk)
    message = refusal(lambda: sweep.run(SPEC, out=folder, progress=False), chunk(folder, 2))
    assert "No space left on device" in message
    assert not list((folder / "chunks").glob("*.tmp-*"))
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SPEC_TOML)
    calls.clear()
    assert main(["sweep", str(spec_file), "--out", str(folder), "--no-progress", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert str(chunk(folder, 3)) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.undo()
    resume(folder)
    assert_reference(folder, reference)


def test_read_only_folder_with_nothing_left_to_compute(folder, reference, monkeypatch, capsys, tmp_path):
    """Injected EROFS (root ignores chmod): first on every file opened for writing in the folder (the lock
    file is the first), then only on the final fsync (the run record in the manifest)."""
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / LOCK_NAME)
    monkeypatch.undo()

    def fsync_fails(fd):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    message = refusal(lambda: sweep.run(SPEC, out=folder, progress=False), folder / "manifest.json")
    assert "Read-only file system" in message
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SPEC_TOML)
    assert main(["sweep", str(spec_file), "--out", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(folder / "manifest.json") in err and "Traceback" not in err
    monkeypatch.undo()
    assert_reference(folder, reference)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the injected test runs")
def test_read_only_folder_by_chmod(folder, reference):
    for path in (folder, folder / "chunks"):
        path.chmod(0o555)
    try:
        with pytest.raises(OSError) as info:
            sweep.run(SPEC, out=folder, progress=False)
        assert str(folder) in str(info.value)
    finally:
        for path in (folder, folder / "chunks"):
            path.chmod(0o755)


# ------------------------------------------------------------------------------------ one writer per folder
def test_a_folder_in_use_is_refused_and_a_dead_writers_lock_taken_over(folder, reference, no_compile):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.ftruncate(fd, 0); os.write(fd, f'{os.getpid()} testhost\\n'.encode())\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
            str(folder / LOCK_NAME),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderInUseError) as info:
            sweep.run(SPEC, out=folder, progress=False)
        assert str(folder) in str(info.value) and f"process {holder.pid} on host testhost" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock (the file still names its PID) is taken over
    assert (folder / LOCK_NAME).read_text().split()[0] == str(holder.pid)
    summary, _ = resume(folder)
    assert summary.complete and (folder / LOCK_NAME).read_text().split()[0] == str(os.getpid())


def test_cleanup_removes_only_temporary_files_of_dead_writers(folder, reference):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "120"])
    try:
        stale = folder / "chunks" / f"chunk_000001.parquet.tmp-{dead.pid}"
        live = folder / "chunks" / f"chunk_000002.parquet.tmp-{alive.pid}"
        stale_manifest = folder / f"manifest.json.tmp-{dead.pid}"
        for path in (stale, live, stale_manifest):
            path.write_bytes(b"partial")
        resume(folder)
        assert not stale.exists() and not stale_manifest.exists()
        assert live.read_bytes() == b"partial"
    finally:
        alive.kill()
        alive.wait()
    assert_reference(folder, reference)


# ------------------------------------------------------------------------------------ sizes and spans
def test_a_trillion_scenarios_are_refused_quickly(tmp_path, capsys):
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SPEC_TOML)
    out = tmp_path / "huge"
    started = time.perf_counter()
    code = main(["sweep", str(spec_file), "--out", str(out), "--scenarios", "1000000000000", "--no-progress"])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2 and "1,000,000,000,000 scenarios" in err and "free on the disk" in err, err
    assert "bytes per scenario" in err and elapsed < 60
    assert not out.exists()


def test_scenario_indices_beyond_int64_and_chunks_beyond_memory_are_refused(tmp_path, no_compile):
    grid = {"params.alpha": {"dist": "grid", "values": [4.0, 5.0, 6.0]}}
    spec = {**SPEC, "scenarios": 2**62, "vary": {**SPEC["vary"], **grid}}
    message = refusal(lambda: sweep.run(spec, out=tmp_path / "a", progress=False))
    assert f"{3 * 2**62:,} scenarios do not fit the int64 scenario index" in message
    spec = {**SPEC, "scenarios": 10**12, "chunk_size": 10**12}
    message = refusal(lambda: sweep.run(spec, out=tmp_path / "b", progress=False))
    assert "spec field chunk_size: a chunk of 1,000,000,000,000 scenarios needs at least" in message
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("where", ["--seed", "spec file"])
def test_a_seed_beyond_the_key_range_is_refused_before_anything_is_written(where, tmp_path, capsys):
    """--seed 10**20 ended in an OverflowError after the manifest was written; now the spec is refused."""
    seed = 10**20
    spec_file = tmp_path / "tiny.toml"
    if where == "spec file":
        spec_file.write_text(SPEC_TOML.replace("seed = 11", f"seed = {seed}"))
    else:
        spec_file.write_text(SPEC_TOML)
    out = tmp_path / "out"
    flags = ["--seed", str(seed)] if where == "--seed" else []
    code = main(["sweep", str(spec_file), "--out", str(out), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "spec field seed: must lie in 0..9223372036854775807" in err, err
    assert "OverflowError" not in err and not out.exists()
    with pytest.raises(ValueError, match="spec field seed"):
        sweep.load_spec({**SPEC, "seed": 2**63})
    assert sweep.load_spec({**SPEC, "seed": 2**63 - 1}).seed == 2**63 - 1


def test_capacity_estimate_is_a_lower_bound_of_the_table(reference):
    out, table, _ = reference
    spec = sweep.load_spec(SPEC)
    model = sweep.load_model(spec.model)
    shapes = _run.nominal_shapes(model, spec)
    numbers = [c for c in table.column_names if pa.types.is_integer(table.column(c).type)]
    numbers += [c for c in table.column_names if pa.types.is_floating(table.column(c).type)]
    per_row = _run.row_bytes(spec, model, shapes)
    assert per_row <= 8 * len(numbers)
    assert per_row >= 8 * (len(numbers) - 3)  # all but replicate, status and the integrator grid columns


@pytest.mark.parametrize(
    ("integrator", "vary", "field"),
    [
        ({"t1": 0.2, "dt": 0.5}, {}, "spec field integrator.dt"),
        ({"t1": 0.2, "dt": 0.2}, {}, "spec field integrator.dt"),
        ({"t1": 0.2}, {"integrator.dt": {"dist": "grid", "values": [0.05, 0.3]}}, "vary.integrator.dt"),
        ({"t1": 0.2, "t0": 0.5}, {}, "spec field integrator.t1"),
    ],
)
def test_a_step_longer_than_the_span_is_refused(integrator, vary, field):
    spec = {**SPEC, "integrator": {**SPEC["integrator"], **integrator}, "vary": {**SPEC["vary"], **vary}}
    if "dt" not in integrator:
        spec["integrator"].pop("dt")
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        sweep.load_spec(spec)
