"""The sweep's pipeline (ukjax.sweep._run._run_chunks) and its chunk sizing.

* Chunk k+1 is dispatched before chunk k is written, and a slow write does not hold up the dispatches: the
  write of chunk 0 waits until chunk 2 has been dispatched, which the synchronous path (writes between
  dispatches) can never do.
* One compiled program serves every chunk (the last one padded, its padding dropped).
* The pipelined run writes the same table, bit for bit, as the synchronous path.
* A write that fails on the writer thread raises in the caller, naming the file; a resume completes the table.
* :func:`ukjax.sweep._run.chunk_size_for` on fake device memories.

A tiny model (tests/sweep_models.py: the Cartesian pendulum), 40 scenarios in chunks of 16 (the last one holds
8 scenarios and 8 of padding), one compile for the whole module.
"""

import errno
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest

from ukjax import sweep
from ukjax._io import ResultWriteError
from ukjax.sweep import _run, _store

SPEC = {
    "name": "pipeline",
    "model": "sweep_models:pendulum",
    "scenarios": 40,
    "chunk_size": 16,
    "seed": 11,
    "integrator": {
        "t1": 0.5,
        "dt": 0.05,
        "solver": "Heun",
        "max_steps": 20,
        "num_saves": 6,
        "constraint_rtol": 1.0,
        "constraint_atol": 1e-3,
    },
    "vary": {
        "params.mass": {"dist": "uniform", "low": 0.5, "high": 2.0},
        "params.length": {"dist": "relative", "spread": 0.05},
    },
}
CHUNKS = 3
WAIT_S = 60  # a write that never sees chunk 2 dispatched fails the test instead of hanging it


def _table(out):
    return sweep.load(out)


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    """A pipelined run whose events are recorded: ("dispatch", c), ("write", c) when chunk c's write begins,
    ("written", c); the write of chunk 0 waits until chunk 2 is dispatched (or WAIT_S)."""
    out = tmp_path_factory.mktemp("pipelined")
    events, lowered = [], []
    dispatched_2 = threading.Event()
    dispatch, write_chunk, lower = _run._dispatch, _store.write_chunk, _run._lower

    def recording_dispatch(c, *args):
        result = dispatch(c, *args)
        events.append(("dispatch", c))
        if c == 2:
            dispatched_2.set()
        return result

    def recording_write(out, c, *args, **kwargs):
        events.append(("write", c))
        if c == 0:
            events.append(("saw chunk 2 dispatched", dispatched_2.wait(WAIT_S)))
        path = write_chunk(out, c, *args, **kwargs)
        events.append(("written", c))
        return path

    def counting_lower(*args):
        lowered.append(args)
        return lower(*args)

    compiled = {}  # empty, so that this run compiles (and counts it); the later tests reuse its program
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_run, "_COMPILED", compiled)
        patch.setattr(_run, "_dispatch", recording_dispatch)
        patch.setattr(_store, "write_chunk", recording_write)
        patch.setattr(_run, "_lower", counting_lower)
        summary = sweep.run(SPEC, out=out, progress=False)
    _run._COMPILED.update(compiled)
    return {"out": out, "events": events, "lowered": lowered, "summary": summary}


def test_next_chunks_are_dispatched_before_a_chunk_is_written(pipelined):
    events = pipelined["events"]
    for c in range(CHUNKS - 1):
        assert events.index(("dispatch", c + 1)) < events.index(("write", c)), events
    # the writer thread held chunk 0's write while the caller went on to dispatch chunk 2
    assert ("saw chunk 2 dispatched", True) in events, events
    assert events.index(("dispatch", 2)) < events.index(("written", 0)), events
    assert [e for e in events if e[0] == "written"] == [("written", c) for c in range(CHUNKS)]


def test_one_program_serves_every_chunk_and_the_padding_is_dropped(pipelined):
    assert pipelined["summary"].complete and pipelined["summary"].chunks_written == CHUNKS
    assert len(pipelined["lowered"]) == 1  # the last chunk (8 scenarios) runs the program of 16
    table = _table(pipelined["out"])
    assert table.column("index").to_pylist() == list(range(SPEC["scenarios"]))
    last = pq.read_table(_store.chunk_path(pipelined["out"], CHUNKS - 1))
    assert last.num_rows == SPEC["scenarios"] - (CHUNKS - 1) * SPEC["chunk_size"]


def test_synchronous_path_writes_the_same_table(pipelined, tmp_path, monkeypatch):
    monkeypatch.setattr(_run, "WRITER_THREAD", False)
    writers = []
    writer = _run._ChunkWriter
    monkeypatch.setattr(_run, "_ChunkWriter", lambda *a, **k: writers.append(k) or writer(*a, **k))
    sweep.run(SPEC, out=tmp_path, progress=False)
    assert writers == [{"threaded": False}]
    synchronous, threaded = _table(tmp_path), _table(pipelined["out"])
    assert synchronous.equals(threaded)
    assert (
        synchronous.num_rows == SPEC["scenarios"]
        and not np.isnan(synchronous.column("q_final[0]").to_numpy()).any()
    )


def test_failing_write_raises_in_the_caller_naming_the_file_and_a_resume_completes(pipelined, tmp_path):
    real = pq.write_table
    failing = _store.chunk_path(tmp_path, 1)

    def disk_full(table, where, **kwargs):
        if str(getattr(where, "name", where)).startswith(str(failing)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pq, "write_table", disk_full)
        with pytest.raises(ResultWriteError, match=f"cannot write {failing}.*No space left on device"):
            sweep.run(SPEC, out=tmp_path, progress=False)
    assert 1 not in _store.done_chunks(tmp_path)
    assert not list((tmp_path / _store.CHUNKS).glob("*.tmp-*"))  # no temporary file left behind
    summary = sweep.run(SPEC, out=tmp_path, progress=False)
    assert summary.complete and _table(tmp_path).equals(_table(pipelined["out"]))


# ---------------------------------------------------------------------------------------------- the writer
def test_writer_error_stops_it_and_reaches_the_caller():
    written = []

    def write(k):
        if k == 1:
            raise ResultWriteError(errno.ENOSPC, "cannot write /out/chunks/chunk_000001.parquet: disk full")
        written.append(k)

    with pytest.raises(ResultWriteError, match="chunk_000001.parquet"):
        with _run._ChunkWriter(write) as writer:
            for k in range(20):
                writer.submit(k)
    assert written == [0]  # nothing after the failed chunk


def test_writer_drops_its_queue_when_the_caller_fails_and_keeps_the_callers_error():
    started, release, written = threading.Event(), threading.Event(), []

    def write(k):
        started.set()
        release.wait(WAIT_S)
        written.append(k)

    with pytest.raises(KeyError, match="caller"):
        with _run._ChunkWriter(write, queue_size=2) as writer:
            writer.submit(0)
            started.wait(WAIT_S)
            writer.submit(1)
            writer.submit(2)
            threading.Timer(0.2, release.set).start()
            raise KeyError("caller")
    assert written == [0]  # the file being written is finished, the queued ones are dropped


def test_writer_queue_is_bounded():
    release, taken = threading.Event(), []
    with _run._ChunkWriter(lambda k: (release.wait(WAIT_S), taken.append(k)), queue_size=1) as writer:
        writer.submit(0)  # taken by the thread, which waits
        writer.submit(1)  # queued
        blocked = threading.Thread(target=writer.submit, args=(2,))
        blocked.start()
        blocked.join(0.5)
        assert blocked.is_alive()  # no room for a third chunk
        release.set()
        blocked.join(WAIT_S)
    assert taken == [0, 1, 2]


# ---------------------------------------------------------------------------------------------- sizing
GB = 1e9


@pytest.mark.parametrize(
    "memory, per_scenario, devices, total, accelerator, expected",
    [
        # H200 (141 GB), 155 kB per scenario: memory allows 227,419 per chunk, the pipeline wants 16 chunks
        (141 * GB, 155e3, 1, 1_000_000, True, 62_500),
        # 16 GB, 100 kB: two chunks in flight in half of it -> 40,000 per device
        (16 * GB, 100e3, 1, 1_000_000, True, 40_000),
        (16 * GB, 100e3, 4, 1_000_000, True, 62_500),  # 4 devices: 160,000 fit, 16 chunks cap it
        (16 * GB, 100e3, 1, 100, True, 7),  # small sweeps still get 16 chunks
        (1e3, 100e3, 2, 1_000_000, True, 2),  # nothing fits: one scenario per device
        # CPU: a quarter of the memory, at least 32 chunks while each device keeps >= 256 scenarios
        (8 * GB, 100e3, 1, 1_000_000, False, 20_000),
        (64 * GB, 100e3, 1, 1_000_000, False, 31_250),
        (64 * GB, 100e3, 2, 1_000, False, 512),
        (64 * GB, 100e3, 2, 100, False, 100),
    ],
)
def test_chunk_size_for(memory, per_scenario, devices, total, accelerator, expected):
    size = _run.chunk_size_for(memory, per_scenario, devices=devices, total=total, accelerator=accelerator)
    assert size == expected


def test_auto_chunk_size_reads_a_gpus_bytes_limit(monkeypatch):
    class FakeGPU:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 16 * GB, "bytes_in_use": 0}

    spec = sweep.load_spec({**SPEC, "scenarios": 10**7})
    model = sweep.load_model(spec.model)
    monkeypatch.setattr(_run.jax, "local_devices", lambda: [FakeGPU()])
    per_scenario = _run.INTERMEDIATES * _run.scenario_bytes(model, spec)
    expected = int(_run.MEMORY_FRACTION * 16 * GB // (_run.IN_FLIGHT * per_scenario))
    assert expected < 10**7 / _run.PIPELINE_CHUNKS  # memory, not the pipeline, sets it
    assert _run.auto_chunk_size(model, spec, 1, 10**7) == expected
