"""ukjax.plot draws the arrays of a real Solution, labels its axes with units, and refuses bad input.

Every helper is checked line by line against the Solution it was given: the x data are ``sol.ts`` and the y
data the Solution's own arrays, compared exactly (the helpers only pass arrays to matplotlib, so anything but
equality is a bug). The Solutions are one small compiled batch of a Cartesian pendulum (3 scenarios, 0.5 s,
fixed Tsit5 steps of 10 ms), shared by all tests; one scenario starts off its constraint so the batch has two
statuses.
"""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import ukjax  # noqa: E402
from ukjax import plot  # noqa: E402
from ukjax.constraints import Baumgarte, Holonomic  # noqa: E402
from ukjax.simulation import RESULTS, Solution, simulate_batch  # noqa: E402


@pytest.fixture(scope="module")
def batch() -> Solution:
    rod = Holonomic(
        phi=lambda q, t, p: q @ q - p["length"] ** 2,
        baumgarte=Baumgarte(gains=lambda p: (p["alpha"], p["beta"]), form="quadratic"),
    )
    pendulum = ukjax.System.from_lagrangian(
        kinetic=lambda q, qd, t, p: 0.5 * p["mass"] * qd @ qd,
        potential=lambda q, t, p: p["mass"] * 9.81 * q[1],
        n=2,
        constraints=(rod,),
    )
    params = {
        k: jnp.asarray(v, jnp.float64) for k, v in dict(mass=1.0, length=1.0, alpha=5.0, beta=5.0).items()
    }
    # The third start is off the circle (|q| = 0.99): its residual decays but stays above constraint_rtol.
    q0 = jnp.array([[1.0, 0.0], [0.0, -1.0], [0.7, 0.7]])
    sol = simulate_batch(
        pendulum, q0, jnp.zeros((3, 2)), params, t1=0.5, dt=0.01, ts=jnp.linspace(0, 0.5, 26)
    )
    assert {int(s) for s in sol.status} == {RESULTS.success, RESULTS.constraint_violated}
    return sol


@pytest.fixture(scope="module")
def single(batch) -> Solution:
    """Scenario 0 of the batch, as ``simulate`` returns one scenario (every array without the batch axis)."""
    return jax.tree_util.tree_map(lambda x: x[0], batch)


@pytest.fixture(autouse=True)
def no_show(monkeypatch):
    """No helper may call plt.show(); every figure is closed after each test."""

    def refuse(*args, **kwargs):
        raise AssertionError("ukjax.plot called plt.show()")

    monkeypatch.setattr(plt, "show", refuse)
    yield
    plt.close("all")


def assert_line(line, x, y):
    np.testing.assert_array_equal(line.get_xdata(), np.asarray(x))
    np.testing.assert_array_equal(line.get_ydata(), np.asarray(y))


@pytest.mark.parametrize("which, unit", [("q", "(m)"), ("qd", "(m/s)"), ("qdd", "(m/s²)")])
def test_trajectory_draws_each_coordinate(single, which, unit):
    ax = plot.trajectory(single, which=which, names=("x", "y"), units="m")
    assert isinstance(ax, matplotlib.axes.Axes)
    lines = ax.get_lines()
    assert len(lines) == 2
    values = getattr(single, which)
    for i, line in enumerate(lines):
        assert_line(line, single.ts, values[:, i])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x", "y"]
    assert ax.get_xlabel() == "t (s)" and ax.get_ylabel().endswith(unit)


def test_trajectory_options(single, batch):
    _, ax = plt.subplots()
    assert plot.trajectory(single, coordinates=[1], ax=ax) is ax  # draws on the given Axes
    assert len(ax.get_lines()) == 1
    assert_line(ax.get_lines()[0], single.ts, single.q[:, 1])
    assert ax.get_ylabel().endswith("(units of the model)")  # no units given: none invented
    ax = plot.trajectory(single, units=("m", "rad"))  # mixed units go to the legend
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["q0 (m)", "q1 (rad)"]
    ax = plot.trajectory(batch, scenario=2)
    assert_line(ax.get_lines()[0], batch.ts[2], batch.q[2, :, 0])
    assert "constraint_violated" in ax.get_title()  # a failed scenario says so


def test_constraint_violation(single, batch):
    ax = plot.constraint_violation(single, integrator="Tsit5, fixed step 10 ms")
    position, velocity, threshold = ax.get_lines()
    assert_line(position, single.ts, np.maximum(single.position_violation, plot.VIOLATION_FLOOR))
    assert_line(velocity, single.ts, np.maximum(single.velocity_violation, plot.VIOLATION_FLOOR))
    np.testing.assert_array_equal(threshold.get_ydata(), [1.0, 1.0])  # violations are in units of tolerance
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "t (s)"
    assert "Tsit5, fixed step 10 ms" in ax.get_title()
    assert float(np.max(single.position_violation)) > 0  # the data drawn are not the floor alone
    ax = plot.constraint_violation(batch, scenario=2, threshold=False)
    assert len(ax.get_lines()) == 2
    assert_line(ax.get_lines()[0], batch.ts[2], np.maximum(batch.position_violation[2], plot.VIOLATION_FLOOR))


@pytest.mark.parametrize("part", ["total", "ideal", "nonideal"])
def test_constraint_force(single, part):
    ax = plot.constraint_force(single, part=part, units="N")
    force = single.constraint_force
    values = force.total if part == "total" else getattr(force, part)
    assert len(ax.get_lines()) == 2
    for i, line in enumerate(ax.get_lines()):
        assert_line(line, single.ts, values[:, i])
    assert ax.get_ylabel() == f"{part} constraint force (N)"
    if part == "total":  # the pendulum's rod pulls: a force that is not zero
        assert float(np.max(np.abs(values))) > 1.0


def test_control_draws_each_actuator(batch):
    from ukjax.models import two_mass_spring as model
    from ukjax.simulation import simulate

    p = model.default_params()
    q0, qd0 = model.initial_state(p, offset=0.1)
    sol = simulate(model.system(), q0, qd0, p, t1=0.3, dt=0.01, ts=jnp.linspace(0, 0.3, 16))
    ax = plot.control(sol, names=("F",), units="N")
    (line,) = ax.get_lines()
    assert_line(line, sol.ts, sol.u[:, 0])
    assert ax.get_ylabel() == "u, control (N)" and ax.get_xlabel() == "t (s)"
    assert float(np.max(np.abs(sol.u))) > 1.0  # the actuator works to close the 0.1 m offset
    with pytest.raises(ValueError, match="sol has no controls"):
        plot.control(batch, scenario=0)  # the pendulum has no actuators
    with pytest.raises(ValueError, match="actuators must be indices in \\[0, 1\\)"):
        plot.control(sol, actuators=[1])


def test_batch_status_counts_every_status(batch):
    ax = plot.batch_status(batch)
    bars = ax.patches
    assert len(bars) == len(RESULTS)
    status = np.asarray(batch.status)
    heights = {
        tick.get_text(): bar.get_height() for tick, bar in zip(ax.get_xticklabels(), bars, strict=True)
    }
    assert heights == {code.name: int(np.sum(status == code)) for code in RESULTS}
    assert ax.get_title() == "3 scenarios: 2 succeeded"


def test_batch_status_unknown_code(batch):
    unknown = eqx.tree_at(lambda s: s.status, batch, jnp.array([0, 0, 42], jnp.int32))
    ax = plot.batch_status(unknown)
    assert ax.get_xticklabels()[-1].get_text() == "status 42"
    assert ax.patches[-1].get_height() == 1


def _history():
    losses = [1.0, 0.5, np.inf, 0.3, 0.4]
    accepted = [True, True, False, True, True]
    return [
        dict(step=i, loss=loss, grad_norm=1.0, values={"alpha": 1.0}, failures=0, accepted=ok, scale=1.0)
        for i, (loss, ok) in enumerate(zip(losses, accepted, strict=True))
    ]


def test_loss_history(tmp_path):
    from ukjax import tune

    history = _history()
    ax = plot.loss_history(history, units="m² s")
    accepted, rejected, best = ax.get_lines()
    assert_line(accepted, [0, 1, 3, 4], [1.0, 0.5, 0.3, 0.4])
    assert_line(rejected, [2], [np.inf])
    assert_line(best, [3], [0.3])
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss (m² s)"
    # the same from history.json as ukjax.tune writes it (by path to the folder and as loaded JSON)
    tune.write_history(tmp_path, history)
    for source in (tmp_path, json.loads((tmp_path / "history.json").read_text())):
        lines = plot.loss_history(source).get_lines()
        assert_line(lines[0], [0, 1, 3, 4], [1.0, 0.5, 0.3, 0.4])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda b, s: plot.trajectory(b), "batch of 3 scenarios.*scenario=i"),
        (lambda b, s: plot.constraint_violation(b), "batch of 3 scenarios"),
        (lambda b, s: plot.constraint_force(b), "batch of 3 scenarios"),
        (lambda b, s: plot.trajectory(b, scenario=3), "scenario must be an int in \\[0, 3\\)"),
        (lambda b, s: plot.trajectory(s, scenario=0), "single solution"),
        (lambda b, s: plot.batch_status(s), "must be a batch solution"),
        (lambda b, s: plot.trajectory(s, names=("x",)), "names must be 2 strings"),
        (lambda b, s: plot.trajectory(s, units=("m", "m", "m")), "units must be one string or 2"),
        (lambda b, s: plot.trajectory(s, which="q_dot"), "which must be one of"),
        (lambda b, s: plot.trajectory(s, coordinates=[2]), "coordinates must be indices in \\[0, 2\\)"),
        (lambda b, s: plot.constraint_force(s, part="passive"), "part must be one of"),
        (lambda b, s: plot.loss_history([]), "history is empty"),
        (lambda b, s: plot.loss_history([{"loss": 1.0}]), "lack \\['step'\\]"),
        (lambda b, s: plot.loss_history({"steps": []}), "'history' list"),
        (lambda b, s: plot.loss_history("/nonexistent/run"), "no history.json"),
    ],
)
def test_bad_input_is_refused(batch, single, call, match):
    with pytest.raises(ValueError, match=match):
        call(batch, single)


def test_not_a_solution():
    with pytest.raises(TypeError, match="sol must be a ukjax.Solution"):
        plot.trajectory({"q": np.zeros((3, 2))})
