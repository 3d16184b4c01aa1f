"""The program cache of ukjax's own commands (ukjax._programs): a traced program kept on disk and read back
by key, the same numbers either way, traced again whenever anything in its key differs or the file is bad."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ukjax import _programs
from ukjax._programs import READ, TRACED, compiled_pipeline, compiled_program, program_key


def _program(x, y):
    return {"sum": jnp.sin(x) @ y, "max": jnp.max(x, axis=0)}


ARGS = (jnp.arange(6.0).reshape(2, 3), jnp.ones(3))


def _kept(folder):
    return sorted(p.name for p in folder.glob("*.xla"))


def test_a_program_is_traced_once_then_read_back_with_the_same_numbers(tmp_path):
    compiled, how = compiled_program("p", _program, ARGS, {"k": 1}, folder=tmp_path)
    assert how == TRACED and len(_kept(tmp_path)) == 1
    again, how_again = compiled_program("p", _program, ARGS, {"k": 1}, folder=tmp_path)
    assert how_again == READ
    expected = jax.jit(_program)(*ARGS)
    for out in (compiled(*ARGS), again(*ARGS)):
        for name in expected:
            np.testing.assert_array_equal(out[name], expected[name])  # the same program: bitwise
    # other options or other argument shapes are other programs
    assert compiled_program("p", _program, ARGS, {"k": 2}, folder=tmp_path)[1] == TRACED
    wider = (jnp.ones((4, 3)), jnp.ones(3))
    assert compiled_program("p", _program, wider, {"k": 1}, folder=tmp_path)[1] == TRACED
    assert len(_kept(tmp_path)) == 3


def test_the_key_holds_ukjax_sources_versions_flags_and_the_processor(monkeypatch):
    base = program_key("p", {"k": 1}, ARGS)
    assert program_key("p", {"k": 1}, ARGS) == base
    assert program_key("q", {"k": 1}, ARGS) != base
    assert program_key("p", {"k": 2}, ARGS) != base
    assert program_key("p", {"k": 1}, (ARGS[0].astype(jnp.int32), ARGS[1])) != base
    assert program_key("p", {"k": 1}, [*ARGS]) != base  # another argument tree
    edits = [
        lambda m: m.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false"),
        lambda m: m.setattr(_programs, "_sources_digest", lambda: "an edited ukjax"),
        lambda m: m.setattr(_programs, "_version", lambda package: "0.0"),
        lambda m: m.setattr(_programs, "_machine", lambda: "another processor"),
    ]
    for edit in edits:
        with monkeypatch.context() as m:
            edit(m)
            assert program_key("p", {"k": 1}, ARGS) != base
    assert program_key("p", {"k": 1}, ARGS) == base


def test_a_bad_file_is_traced_again_and_replaced(tmp_path):
    compiled_program("p", _program, ARGS, {}, folder=tmp_path)
    (kept,) = tmp_path.glob("*.xla")
    kept.write_bytes(b"not a program")
    compiled, how = compiled_program("p", _program, ARGS, {}, folder=tmp_path)
    assert how == TRACED and kept.stat().st_size > 100
    np.testing.assert_array_equal(compiled(*ARGS)["sum"], jax.jit(_program)(*ARGS)["sum"])
    assert compiled_program("p", _program, ARGS, {}, folder=tmp_path)[1] == READ


def _rest(x, y, first):
    return {"total": first["sum"] + jnp.sum(first["max"]) * y[0], "twice": 2.0 * first["max"]}


def test_a_pipeline_compiles_two_programs_side_by_side_and_reads_both_back(tmp_path):
    """``compiled_pipeline`` (``ukjax demo``'s two chunk programs): ``run(*args)`` is
    ``second(*args, first(*args))`` bit for bit, the first compiled on a thread while the second is traced; a
    second call reads both programs back; with one of the two files gone both are traced again."""
    run, how = compiled_pipeline("pipe", _program, _rest, ARGS, {"k": 1}, folder=tmp_path)
    assert how == TRACED and len(_kept(tmp_path)) == 2
    expected = jax.jit(lambda x, y: _rest(x, y, _program(x, y)))(*ARGS)
    again, how_again = compiled_pipeline("pipe", _program, _rest, ARGS, {"k": 1}, folder=tmp_path)
    assert how_again == READ
    for out in (run(*ARGS), again(*ARGS)):
        for name in expected:
            np.testing.assert_array_equal(out[name], expected[name])
    (tmp_path / _kept(tmp_path)[0]).unlink()
    assert compiled_pipeline("pipe", _program, _rest, ARGS, {"k": 1}, folder=tmp_path)[1] == TRACED
    assert len(_kept(tmp_path)) == 2
    with pytest.raises(TypeError):  # an error in the first program reaches the caller
        compiled_pipeline("bad", lambda x, y: x @ jnp.ones((5, 5)), _rest, ARGS, {}, folder=tmp_path)


def test_without_serialization_or_a_cache_the_program_is_traced(tmp_path, monkeypatch):
    class Box:  # an output tree whose class (local to this test) pickle cannot name
        def __init__(self, value):
            self.value = value

    jax.tree_util.register_pytree_node(Box, lambda b: ((b.value,), None), lambda _, c: Box(*c))
    compiled, how = compiled_program("box", lambda x, y: Box(x + 1.0), ARGS, {}, folder=tmp_path)
    assert how == TRACED and _kept(tmp_path) == []
    np.testing.assert_array_equal(compiled(*ARGS).value, ARGS[0] + 1.0)

    from jax.experimental import serialize_executable

    def unsupported(compiled):
        raise ValueError("Compilation does not support serialization")

    monkeypatch.setattr(serialize_executable, "serialize", unsupported)
    assert compiled_program("p", _program, ARGS, {}, folder=tmp_path)[1] == TRACED
    assert _kept(tmp_path) == []
    monkeypatch.setenv("UKJAX_PROGRAM_CACHE", "off")
    assert _programs.program_folder() is None
    monkeypatch.delenv("UKJAX_PROGRAM_CACHE")
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)  # no compilation cache on: no program cache either
    try:
        assert _programs.program_folder() is None
        assert compiled_program("p", _program, ARGS, {})[1] == TRACED
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


@pytest.mark.parametrize("edit", ["options", "sources"])
def test_a_stale_program_is_never_read(tmp_path, monkeypatch, edit):
    """A program kept under one key is not read under another: a different ukjax (its sources) or
    different options trace again and give their own numbers."""
    compiled_program("p", _program, ARGS, {"scale": 1.0}, folder=tmp_path)
    if edit == "sources":
        monkeypatch.setattr(_programs, "_sources_digest", lambda: "another ukjax")
        scaled = lambda x, y: {"sum": 2.0 * (jnp.sin(x) @ y), "max": jnp.max(x, axis=0)}  # noqa: E731
        compiled, how = compiled_program("p", scaled, ARGS, {"scale": 1.0}, folder=tmp_path)
    else:
        scaled = lambda x, y: {"sum": 2.0 * (jnp.sin(x) @ y), "max": jnp.max(x, axis=0)}  # noqa: E731
        compiled, how = compiled_program("p", scaled, ARGS, {"scale": 2.0}, folder=tmp_path)
    assert how == TRACED
    np.testing.assert_allclose(compiled(*ARGS)["sum"], 2.0 * jax.jit(_program)(*ARGS)["sum"], rtol=1e-15)


def test_an_output_tree_that_does_not_read_back_is_not_kept(tmp_path):
    """An equinox Module's tree pickles, but its unpickled tree cannot rebuild the Module (the call of a read
    executable would fail): such a program is used, not kept."""
    import equinox as eqx

    class Pair(eqx.Module):
        a: jax.Array
        b: jax.Array

    compiled, how = compiled_program("module", lambda x, y: Pair(x + 1.0, y), ARGS, {}, folder=tmp_path)
    assert how == TRACED and _kept(tmp_path) == []
    np.testing.assert_array_equal(compiled(*ARGS).a, ARGS[0] + 1.0)
