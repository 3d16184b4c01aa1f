"""Tuning checkpoints that know what they belong to, damaged checkpoints, and tuning's bad inputs.

One small problem (the two-mass spring of Liu et al. 2015 §IV, 2 scenarios, 0.2 s at dt = 0.01, Adam) is run
once per module: uninterrupted, in two parts through a checkpoint, and interrupted and resumed. Every refused
resume stops at the fingerprint check, before anything is compiled, so the mismatch tests cost no compilation.
"""

import json
import os
import shutil
import warnings
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ukjax import tune
from ukjax.models import two_mass_spring as tms
from ukjax.tune import _checkpoint

SYSTEM = tms.system()
BASE = tms.default_params()
SPACE = tune.Parametrization(BASE, {"alpha": tune.log(), "beta": tune.log(lower=1.0, upper=30.0)})
OBJECTIVE = tune.servo_tracking() + 1e-3 * tune.control_effort()
OPTIONS = tune.simulation_options(t1=0.2, dt=0.01, num_saves=11)
STEPS = 4


def _batch(offsets=(0.2, -0.1)):
    offsets = jnp.asarray(offsets)
    q0 = jnp.stack([jnp.zeros_like(offsets), 2.0 * BASE["l"] + offsets], axis=1)
    return tune.Scenarios(q0, jnp.zeros_like(q0).at[:, 1].set(0.3))


BATCH = _batch()


class Interrupted(Exception):
    pass


def _fit(steps=STEPS, **changes):
    kwargs = dict(
        space=SPACE, scenarios=BATCH, objective=OBJECTIVE, options=OPTIONS, optimizer=optax.adam(0.1)
    )
    kwargs.update(changes)
    return tune.fit(SYSTEM, steps=steps, progress=False, **kwargs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run, a checkpoint of its first 2 steps, and an interrupted run's checkpoint."""
    folder = tmp_path_factory.mktemp("tune_integrity")
    full = _fit()
    half = folder / "half.npz"
    _fit(2, checkpoint=half)  # a finished 2-step run: continued below for more steps

    def stop_at_step_3(record):
        if record["step"] == 3:
            raise Interrupted

    killed = folder / "killed.npz"
    with pytest.raises(Interrupted):
        _fit(checkpoint=killed, checkpoint_every=1, callback=stop_at_step_3)  # last written after step 2
    return dict(full=full, half=half, killed=killed)


def _copy(runs, tmp_path, which="half"):
    path = tmp_path / f"{which}.npz"
    shutil.copy(runs[which], path)
    return path


def _same_theta(a, b):
    return all(np.array_equal(np.asarray(a[name]), np.asarray(b[name])) for name in SPACE.names)


def test_unchanged_resume_reproduces_the_uninterrupted_run(runs, tmp_path):
    full = runs["full"]
    assert len(full.history) == STEPS and full.history[-1]["loss"] < full.history[0]["loss"]
    # continuing a finished 2-step run for 2 more steps, and resuming an interrupted 4-step run
    for which in ("half", "killed"):
        resumed = _fit(checkpoint=_copy(runs, tmp_path, which))
        assert _same_theta(resumed.final_theta, full.final_theta), which
        assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history], which
    # the finished checkpoint of the resumed run is accepted again with the same steps and changes nothing
    again = _fit(checkpoint=tmp_path / "killed.npz")
    assert len(again.history) == STEPS and _same_theta(again.final_theta, full.final_theta)


def _refused(path, *fields, **changes):
    steps = changes.pop("steps", STEPS)
    with pytest.raises(ValueError) as caught:
        _fit(steps, checkpoint=path, **changes)
    message = str(caught.value)
    assert str(path) in message, message
    for field in fields:
        assert field in message, (field, message)
    return message


MISMATCHES = {
    "parametrization_names": (
        dict(space=tune.Parametrization(BASE, {"alpha": tune.log(), "k": tune.log()})),
        ['parametrization.leaves[1].name: "beta" in the checkpoint, "k" now'],
    ),
    "bounds": (
        dict(
            space=tune.Parametrization(BASE, {"alpha": tune.log(), "beta": tune.log(lower=1.0, upper=40.0)})
        ),
        ["parametrization.leaves[1].upper: 30.0 in the checkpoint, 40.0 now"],
    ),
    "transform": (
        dict(
            space=tune.Parametrization(
                BASE, {"alpha": tune.softplus(), "beta": tune.log(lower=1.0, upper=30.0)}
            )
        ),
        ['parametrization.leaves[0].transform: "log" in the checkpoint, "softplus" now'],
    ),
    "t1": (
        dict(options=tune.simulation_options(t1=0.3, dt=0.01, num_saves=11)),
        ["options.t1: 0.2", "0.3 now"],
    ),
    "optimizer": (dict(optimizer=optax.sgd(0.1)), ["optimizer.state.structure"]),
    # same state structure and initial state: told apart by the hyperparameters their closures capture
    "optimizer_learning_rate": (
        dict(optimizer=optax.adam(0.01)),
        ["optimizer.transformation.", "step_size: -0.1 in the checkpoint, -0.01 now"],
    ),
    "optimizer_nadam": (
        dict(optimizer=optax.nadam(0.1)),
        ["optimizer.transformation.", "nesterov: false in the checkpoint, true now"],
    ),
    "optimizer_description": (
        dict(optimizer=optax.adam(0.2), optimizer_description="adam 0.2"),
        ['optimizer.description: null in the checkpoint, "adam 0.2" now'],
    ),
    "scenarios": (dict(scenarios=_batch((0.2, -0.2))), ["scenarios.q0"]),
    "objective_weights": (dict(objective=OBJECTIVE.with_weights(control_effort=1e-2)), ["objective.weights"]),
    "objective_terms": (
        dict(objective=tune.servo_tracking() + 1e-3 * tune.peak_control()),
        ["objective.terms"],
    ),
    "risk": (dict(risk=tune.CVaR(0.5)), ["risk"]),
    "seed": (dict(seed=8), ["seed: 0 in the checkpoint, 8 now"]),
    "divergence_settings": (dict(max_increase=3.0), ["loop.max_increase: 10.0 in the checkpoint, 3.0 now"]),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_resume_of_another_run_is_refused_naming_the_file_and_the_fields(runs, tmp_path, case):
    changes, fields = MISMATCHES[case]
    path = _copy(runs, tmp_path)
    before = path.read_bytes()
    message = _refused(path, *fields, **changes)
    assert "delete the file or pass another checkpoint path" in message
    assert path.read_bytes() == before  # the refused run wrote nothing


def test_fewer_steps_than_the_checkpoint_holds_are_refused(runs, tmp_path):
    _refused(_copy(runs, tmp_path), "holds 2 steps, more than steps=1", steps=1)


def test_the_default_optimizers_schedule_length_is_checked_and_can_be_continued(tmp_path):
    # default_optimizer's cosine schedule spans `steps`: resuming with more steps would change it, so the
    # resume is refused, saying how to continue the same schedule; doing so is accepted.
    path = tmp_path / "default.npz"
    first = _fit(1, checkpoint=path, optimizer=None)
    assert len(first.history) == 1
    message = _refused(
        path, "optimizer.description", "optimizer=ukjax.tune.default_optimizer(1, ", steps=2, optimizer=None
    )
    assert "learning_rate=0.1)" in message
    _refused(path, "optimizer.description", optimizer=tune.default_optimizer(1, 0.05), steps=2)
    continued = _fit(2, checkpoint=path, optimizer=tune.default_optimizer(1))
    assert len(continued.history) == 2 and continued.history[0] == first.history[0]


def _entries(path):
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _edited_meta(path, **state):
    meta = json.loads(_entries(path)["meta"].tobytes())
    meta["state"].update(state)
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


def _resigned(entries):
    """``entries`` with the checksum recomputed over them: a damage the checksum does not see (a writer's
    bug), so that the checks behind it are exercised."""
    meta = json.loads(entries["meta"].tobytes())
    arrays = {k: v for k, v in entries.items() if k != "meta"}
    meta["checksum"] = _checkpoint.contents_digest(meta, arrays)
    return dict(arrays, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def _edited_entry(path, name, edit):
    entries = _entries(path)
    entries[name] = edit(entries[name])
    np.savez(path, **entries)


CHECKSUM = "do not match the checksum written with them"
CORRUPTIONS = {
    "truncated": (lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]), "damaged"),
    "random_bytes": (
        lambda path: path.write_bytes(np.random.default_rng(0).bytes(2000)),
        "neither an .npz archive nor a NumPy array",
    ),
    "no_meta": (
        lambda path: np.savez(path, **{k: v for k, v in _entries(path).items() if k != "meta"}),
        "has no 'meta' entry",
    ),
    "meta_not_json": (
        lambda path: np.savez(path, **dict(_entries(path), meta=np.frombuffer(b"\xff{not json", np.uint8))),
        "meta entry is not JSON",
    ),
    "older_layout": (
        lambda path: np.savez(path, **dict(_entries(path), meta=np.frombuffer(b'{"step": 2}', np.uint8))),
        "has no fingerprint",
    ),
    "wrong_entry_shape": (
        lambda path: np.savez(path, **_resigned(dict(_entries(path), **{"theta/0": np.zeros(3)}))),
        "entry 'theta/0' has shape (3,)",
    ),
    "inconsistent_state": (
        lambda path: np.savez(path, **_resigned(dict(_entries(path), meta=_edited_meta(path, step=3)))),
        "its state is inconsistent (step 3 with 2 history records)",
    ),
    "missing_entry": (
        lambda path: np.savez(
            path, **_resigned({k: v for k, v in _entries(path).items() if k != "opt_state/1"})
        ),
        "lacks the entry 'opt_state/1'",
    ),
    # contents edited in place, every entry of the right shape and dtype: only the checksum sees them
    "theta_nan": (lambda path: _edited_entry(path, "theta/0", lambda v: np.full_like(v, np.nan)), CHECKSUM),
    "theta_shifted": (lambda path: _edited_entry(path, "theta/1", lambda v: v + 0.5), CHECKSUM),
    "optimizer_state_zeroed": (lambda path: _edited_entry(path, "opt_state/1", np.zeros_like), CHECKSUM),
    "best_loss_edited": (
        lambda path: np.savez(path, **dict(_entries(path), meta=_edited_meta(path, best_loss=-1.0))),
        CHECKSUM,
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_damaged_checkpoint_is_refused_naming_the_file(runs, tmp_path, case):
    damage, expected = CORRUPTIONS[case]
    path = _copy(runs, tmp_path)
    damage(path)
    message = _refused(path, expected)
    assert "start afresh" in message


def test_an_optimizer_whose_hyperparameters_cannot_be_read_warns_naming_the_checkpoint(tmp_path):
    """A hyperparameter held in an object describe() cannot look into (no attributes): the fingerprint cannot
    tell it apart, so fit warns, unless optimizer_description identifies the optimizer. steps=0: nothing is
    compiled."""

    class Rate:
        __slots__ = ("value",)

    rate = Rate()
    rate.value = 0.1
    base = optax.sgd(0.1)

    def update(grads, state, params=None):
        return jax.tree_util.tree_map(lambda g: -rate.value * g, grads), state

    opaque = optax.GradientTransformation(base.init, update)
    path = tmp_path / "opaque.npz"
    with pytest.warns(RuntimeWarning, match="optimizer's hyperparameters cannot all be read") as caught:
        _fit(0, checkpoint=path, optimizer=opaque)
    assert str(path) in str(caught[0].message) and "rate" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fit(0, checkpoint=tmp_path / "described.npz", optimizer=opaque, optimizer_description="sgd rate 0.1")
        _fit(0, checkpoint=tmp_path / "adam.npz", optimizer=optax.adam(0.1))  # optax's own: all read


def test_a_resume_removes_only_the_temporary_files_of_dead_writers(runs, tmp_path):
    path = _copy(runs, tmp_path)
    # a dead process (999999999) and a live one (the parent of this one; this process writes its own .tmp-PID)
    dead, alive = tmp_path / "half.npz.tmp-999999999", tmp_path / f"half.npz.tmp-{os.getppid()}"
    dead.write_bytes(b"partial"), alive.write_bytes(b"being written")
    done = _fit(2, checkpoint=path)  # the checkpoint holds 2 steps already: nothing is computed
    assert len(done.history) == 2 and not dead.exists() and alive.exists()


def test_checkpoints_are_written_atomically_without_pickles(runs, tmp_path):
    with zipfile.ZipFile(runs["half"]) as archive:
        names = archive.namelist()
    assert "meta.npy" in names and all(name.endswith(".npy") for name in names)
    with np.load(runs["half"], allow_pickle=False) as data:  # no object arrays inside
        assert all(data[name].dtype != object for name in data.files)
    assert not list(runs["half"].parent.glob("*.tmp-*"))


@pytest.mark.parametrize(
    "transform, value, inside, bounds",
    [
        (tune.log(lower=10.0, upper=100.0), 5.0, 10.0, "[10.0, 100.0]"),
        (tune.box(0.0, 1.0), 1.5, 1.0, "[0.0, 1.0]"),
        (tune.sigmoid(1.0, 2.0), 2.0, 1.5, "(1.0, 2.0)"),
        (tune.Transform("free", -1.0, 1.0), -3.0, -1.0, "[-1.0, 1.0]"),
        (tune.box(lower=0.0), -0.5, 0.0, "[0.0, inf]"),
    ],
    ids=["log", "box", "sigmoid", "free", "box_lower_only"],
)
def test_an_initial_value_outside_the_bounds_is_refused_naming_it(transform, value, inside, bounds):
    def space(x):
        return tune.Parametrization({"gain": jnp.asarray(x), "other": jnp.asarray(1.0)}, {"gain": transform})

    with pytest.raises(ValueError) as caught:
        space(value).init()
    message = str(caught.value)
    assert "'gain'" in message and str(value) in message and bounds in message, message
    space(inside).init()  # a value inside the bounds (on a closed bound) is accepted
    with pytest.raises(ValueError, match="'gain' has a NaN"):
        space(np.nan).init()


def _with(field, index, value, where=None):
    q0, qd0 = np.array(BATCH.q0), np.array(BATCH.qd0)
    params = {k: np.broadcast_to(np.asarray(v), (2, *np.shape(v))).copy() for k, v in BASE.items()}
    target = {"q0": q0, "qd0": qd0}.get(field, params.get(field.removeprefix("params:")))
    target[(index, *(where or ()))] = value
    return tune.Scenarios(q0, qd0, params)


@pytest.mark.parametrize(
    "batch, expected",
    [
        (_with("q0", 1, np.nan, (0,)), "scenarios.q0 is NaN or infinite in scenario 1"),
        (_with("qd0", 0, np.inf, (1,)), "scenarios.qd0 is NaN or infinite in scenario 0"),
        (_with("params:m1", 1, np.nan), "scenarios.params['m1'] is NaN or infinite in scenario 1"),
        (tune.Scenarios(jnp.zeros((2, 3)), jnp.zeros((2, 3))), "scenarios.q0 has 3 coordinates"),
    ],
    ids=["q0_nan", "qd0_inf", "params_nan", "wrong_n"],
)
def test_a_bad_scenario_is_refused_naming_the_field_and_the_index(batch, expected):
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        _fit(scenarios=batch)


def test_scenarios_of_inconsistent_shapes_are_refused():
    with pytest.raises(ValueError, match=r"q0 and qd0 must both have shape \(batch, n\)"):
        tune.Scenarios(jnp.zeros((2, 2)), jnp.zeros((3, 2)))
    with pytest.raises(
        ValueError, match=r"params\['m1'\] has shape \(3,\); every params leaf needs the batch size 2"
    ):
        tune.Scenarios(jnp.zeros((2, 2)), jnp.zeros((2, 2)), {"m1": jnp.ones(3)})
    with pytest.raises(ValueError, match="must hold real numbers"):
        _fit(scenarios=tune.Scenarios(np.array([["a", "b"], ["c", "d"]]), np.zeros((2, 2))))


def test_an_edited_helper_in_a_user_module_changes_the_fingerprint(tmp_path, monkeypatch):
    # a user's objective term calls a helper of its module: editing the helper (not the term) must be seen
    import importlib
    import sys

    from ukjax.tune import _checkpoint

    module = tmp_path / "user_terms_for_fingerprint.py"
    module.write_text(
        "def helper(x):\n    return x\n\n\ndef term(sol, p):\n    return helper(sol.q[-1, 0])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    first = _checkpoint.describe(tune.custom(importlib.import_module(module.stem).term))
    module.write_text(
        "def helper(x):\n    return 2 * x\n\n\ndef term(sol, p):\n    return helper(sol.q[-1, 0])\n"
    )
    os.utime(module, ns=(1, 1))  # a new modification time, whatever the clock's resolution
    second = _checkpoint.describe(tune.custom(importlib.reload(sys.modules[module.stem]).term))
    assert first["fn"]["closure"]["fn"]["source_sha256"] == second["fn"]["closure"]["fn"]["source_sha256"]
    with pytest.raises(ValueError, match=r"objective.fn.closure.fn.module_sha256"):
        _checkpoint.check_fingerprint(tmp_path / "c.npz", dict(objective=first), dict(objective=second))


@pytest.mark.parametrize(
    ("tuned", "expected"),
    [
        ({"alpha": "log"}, ["it lacks ['beta', 'k', 'l', 'm1', 'm2']", "ukjax.tune.log()"]),
        (
            {**{k: False for k in BASE}, "alpha": True, "zeta": True},
            ["it has ['zeta'], which params does not"],
        ),
    ],
)
def test_a_partial_mask_names_the_missing_and_extra_leaves(tuned, expected):
    """{"alpha": "log"} (a dict whose values are no Transforms) is read as a mask; the refusal used to say
    only 'a tuned mask must have the same pytree structure'."""
    with pytest.raises(ValueError) as caught:
        tune.Parametrization(BASE, tuned)
    message = str(caught.value)
    assert "read as a boolean mask" in message and f"leaves of params {sorted(BASE)}" in message, message
    for text in expected:
        assert text in message, message
