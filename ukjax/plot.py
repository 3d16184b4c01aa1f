"""Plotting helpers for the figures every study draws: trajectories, constraint violation, constraint forces,
servo controls, the statuses of a batch, and the loss history of a tuning run.

Each helper draws on matplotlib Axes (``ax=``, or a new figure when not given) and returns them; none calls
``plt.show()`` or saves a file, so they compose into a user's own figures and scripts::

    import matplotlib.pyplot as plt
    from ukjax import plot

    fig, axes = plt.subplots(3, 1, sharex=True)
    plot.trajectory(sol, names=("x", "y"), units="m", ax=axes[0])
    plot.constraint_violation(sol, integrator="Tsit5, adaptive, rtol = atol = 1e-8", ax=axes[1])
    plot.constraint_force(sol, names=("x", "y"), units="N", ax=axes[2])
    fig.savefig("pendulum.png")

Time is in seconds on every time axis. Other quantities carry the units passed as ``units=`` (one string for
all coordinates, or one per coordinate); without it the axis says that the units are the model's. A helper
for one trajectory refuses a batch (a :func:`ukjax.simulate_batch` solution) unless told which scenario to
draw (``scenario=i``), and :func:`batch_status` refuses a single solution, with a ``ValueError`` naming the
argument. matplotlib is imported when a helper is first called, not when ukjax is imported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from ukjax.simulation import RESULTS, Solution

VIOLATION_FLOOR = 1e-18
"""Values below this are drawn at it on the logarithmic violation axis (an exact zero has no logarithm)."""

_QUANTITIES = {
    "q": ("coordinates", "q", ""),
    "qd": ("velocities", "q̇", "/s"),
    "qdd": ("accelerations", "q̈", "/s²"),
}
_FORCE_PARTS = ("total", "ideal", "nonideal")


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _axes(ax):
    """``ax``, or the Axes of a new figure."""
    if ax is not None:
        return ax
    return _pyplot().subplots(figsize=(6.4, 4.0), layout="constrained")[1]


def _check_solution(sol, name: str = "sol") -> None:
    if not isinstance(sol, Solution):
        raise TypeError(f"{name} must be a ukjax.Solution, got {type(sol).__name__}")


def _single(sol: Solution, scenario: int | None) -> Solution:
    """One scenario's solution: ``sol`` itself, or scenario ``scenario`` of a batch."""
    _check_solution(sol)
    batched = np.ndim(sol.status) == 1
    if np.ndim(sol.status) > 1:
        raise ValueError(f"sol has status of shape {np.shape(sol.status)}: nested batches are not supported")
    if not batched:
        if scenario is not None:
            raise ValueError(
                f"scenario={scenario} given but sol is a single solution (sol.q has shape "
                f"{np.shape(sol.q)}); pass scenario only with a simulate_batch solution"
            )
        return sol
    size = int(np.shape(sol.status)[0])
    if scenario is None:
        raise ValueError(
            f"sol is a batch of {size} scenarios (sol.q has shape {np.shape(sol.q)}); this plot draws one "
            "trajectory: pass scenario=i (0 <= i < batch size)"
        )
    if not isinstance(scenario, int | np.integer) or not 0 <= scenario < size:
        raise ValueError(f"scenario must be an int in [0, {size}), got {scenario!r}")
    return jax.tree_util.tree_map(lambda x: x[scenario], sol)


def _names(names, n: int, prefix: str) -> list[str]:
    if names is None:
        return [f"{prefix}{i}" for i in range(n)]
    names = list(names)
    if len(names) != n or not all(isinstance(x, str) for x in names):
        raise ValueError(f"names must be {n} strings (one per line drawn from the array), got {names!r}")
    return names


def _units(units, n: int) -> list[str] | None:
    """One unit string per coordinate, or None when not given."""
    if units is None:
        return None
    if isinstance(units, str):
        return [units] * n
    units = list(units)
    if len(units) != n or not all(isinstance(x, str) for x in units):
        raise ValueError(f"units must be one string or {n} strings (one per line), got {units!r}")
    return units


def _indices(indices, n: int, name: str = "coordinates") -> list[int]:
    if indices is None:
        return list(range(n))
    picked = [int(i) for i in np.atleast_1d(indices)]
    if not picked or any(not -n <= i < n for i in picked):
        raise ValueError(f"{name} must be indices in [0, {n}), got {indices!r}")
    return [i % n for i in picked]


def _ylabel(quantity: str, units: list[str] | None, suffix: str = "") -> str:
    """ "quantity (unit)" when all plotted units agree; else the units are in the legend."""
    if units is None:
        return f"{quantity} (units of the model)"
    distinct = sorted(set(units))
    if len(distinct) == 1:
        return f"{quantity} ({distinct[0]}{suffix})"
    return f"{quantity} (units in the legend)"


def _status_note(sol: Solution) -> str:
    code = int(np.asarray(sol.status))
    return "" if code == RESULTS.success else f" [{_status_name(code)}]"


def _status_name(code: int) -> str:
    try:
        return RESULTS(code).name
    except ValueError:
        return f"status {code}"


def _labelled(ax, *, xlabel: str, ylabel: str, title: str):
    """Label both axes, set the title and the legend (small type) of a line plot; returns ``ax``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return ax


def _components(sol, values, *, picked_from, what, names, prefix, units, quantity, title, ax, suffix=""):
    """One line per component (column) of ``values`` against sol.ts, labelled and with units: the body of
    :func:`trajectory`, :func:`constraint_force` and :func:`control`."""
    n = values.shape[-1]
    labels, unit_list = _names(names, n, prefix), _units(units, n)
    picked = _indices(picked_from, n, what)
    ax = _axes(ax)
    ts = np.asarray(sol.ts)
    mixed = unit_list is not None and len({unit_list[i] for i in picked}) > 1
    for i in picked:
        ax.plot(ts, values[:, i], label=labels[i] if not mixed else f"{labels[i]} ({unit_list[i]}{suffix})")
    ylabel = _ylabel(quantity, None if unit_list is None else [unit_list[i] for i in picked], suffix)
    return _labelled(ax, xlabel="t (s)", ylabel=ylabel, title=title)


def trajectory(
    sol: Solution,
    *,
    which: str = "q",
    coordinates: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    units: str | Sequence[str] | None = None,
    scenario: int | None = None,
    title: str | None = None,
    ax=None,
):
    """Coordinates (or velocities, accelerations) against time, one line per coordinate.

    Args:
        sol: a :class:`ukjax.Solution` of one scenario, or of a batch with ``scenario`` given.
        which: ``"q"`` (coordinates), ``"qd"`` (velocities) or ``"qdd"`` (accelerations).
        coordinates: indices of the coordinates to draw; default all n.
        names: the n coordinate names for the legend (e.g. ``system.coordinate_names``); default q0, q1, ...
        units: the unit of the coordinates, one string (``"m"``) or n of them (``("m", "rad")``); velocities
            and accelerations get ``/s`` and ``/s²``. Default: the axis says "units of the model".
        scenario: which scenario of a batch solution to draw.
        title: the axes title; default the quantity, with the status when it is not success.
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes.
    """
    sol = _single(sol, scenario)
    if which not in _QUANTITIES:
        raise ValueError(f"which must be one of {tuple(_QUANTITIES)}, got {which!r}")
    quantity, symbol, suffix = _QUANTITIES[which]
    return _components(
        sol, np.asarray(getattr(sol, which)), picked_from=coordinates, what="coordinates", names=names,
        prefix="q", units=units, quantity=f"{symbol}, {quantity}", suffix=suffix, ax=ax,
        title=title if title is not None else f"{quantity.capitalize()}{_status_note(sol)}",
    )  # fmt: skip


def constraint_violation(
    sol: Solution,
    *,
    integrator: str | None = None,
    threshold: bool = True,
    scenario: int | None = None,
    title: str | None = None,
    ax=None,
):
    """The position and velocity violation of the constraints against time, in units of their tolerance.

    Draws ``sol.position_violation`` (max over rows of |φ_i| divided by that row's own tolerance,
    constraint_atol + constraint_rtol × the motion of the coordinates the row touches) and
    ``sol.velocity_violation`` (the same for φ̇ and ψ): the numbers the status is judged by
    (:class:`ukjax.Solution`). A value above 1 is a violated constraint; values below
    :data:`VIOLATION_FLOOR` (an exact zero) are drawn at it.

    Args:
        sol: a :class:`ukjax.Solution` of one scenario, or of a batch with ``scenario`` given.
        integrator: what produced the trajectory (e.g. ``"Tsit5, fixed step 5 ms"``); stated in the title.
        threshold: draw the status threshold (1, the tolerance) as a dotted line.
        scenario: which scenario of a batch solution to draw.
        title: the axes title; default "Constraint violation", the integrator and a status other than
            success.
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes, with two lines (position, velocity) and a third for the threshold.
    """
    sol = _single(sol, scenario)
    ax = _axes(ax)
    ts = np.asarray(sol.ts)
    ax.semilogy(ts, np.maximum(np.asarray(sol.position_violation), VIOLATION_FLOOR), label="position (φ)")
    ax.semilogy(
        ts, np.maximum(np.asarray(sol.velocity_violation), VIOLATION_FLOOR), "--", label="velocity (φ̇, ψ)"
    )
    if threshold:
        ax.axhline(1.0, color="k", linestyle=":", linewidth=1, label="tolerance (status threshold)")
    if title is None:
        title = "Constraint violation" + (f", {integrator}" if integrator else "") + _status_note(sol)
    return _labelled(ax, xlabel="t (s)", ylabel="constraint violation / tolerance", title=title)


def constraint_force(
    sol: Solution,
    *,
    part: str = "total",
    coordinates: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    units: str | Sequence[str] | None = None,
    scenario: int | None = None,
    title: str | None = None,
    ax=None,
):
    """The generalized constraint force against time, one line per coordinate.

    ``sol.constraint_force`` holds the force of the passive constraints, M q̈ = Q [+ B u] + Q^c with
    Q^c = ideal + nonideal (Liu et al. 2015, eq. 11-12): :class:`ukjax.dynamics.ConstraintForce`.

    Args:
        sol: a :class:`ukjax.Solution` of one scenario, or of a batch with ``scenario`` given.
        part: ``"total"``, ``"ideal"`` or ``"nonideal"``.
        coordinates: indices of the coordinates to draw; default all n.
        names: the n coordinate names for the legend; default q0, q1, ...
        units: the unit of each generalized force component, one string (``"N"``) or n of them
            (``("N", "N m")`` for a length and an angle). Default: the axis says "units of the model".
        scenario: which scenario of a batch solution to draw.
        title: the axes title; default names the part, with the status when it is not success.
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes.
    """
    sol = _single(sol, scenario)
    if part not in _FORCE_PARTS:
        raise ValueError(f"part must be one of {_FORCE_PARTS}, got {part!r}")
    force = sol.constraint_force
    values = np.asarray(force.total if part == "total" else getattr(force, part))
    return _components(
        sol, values, picked_from=coordinates, what="coordinates", names=names, prefix="Q^c_", units=units,
        quantity=f"{part} constraint force", ax=ax,
        title=title if title is not None else f"Constraint force ({part}){_status_note(sol)}",
    )  # fmt: skip


def control(
    sol: Solution,
    *,
    actuators: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    units: str | Sequence[str] | None = None,
    scenario: int | None = None,
    title: str | None = None,
    ax=None,
):
    """The controls u(t) of a servo-controlled system (:mod:`ukjax.control`), one line per actuator.

    Args:
        sol: a :class:`ukjax.Solution` of a system with ``actuation`` and ``servo_constraints`` (``sol.u`` is
            not None), of one scenario or of a batch with ``scenario`` given.
        actuators: indices of the actuators to draw; default all n_u.
        names: the n_u actuator names for the legend; default u0, u1, ...
        units: the unit of each control, one string (``"N"``) or n_u of them (``("N m", "N")``). Default: the
            axis says "units of the model".
        scenario: which scenario of a batch solution to draw.
        title: the axes title; default "Controls", with the status when it is not success.
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes.
    """
    sol = _single(sol, scenario)
    if sol.u is None:
        raise ValueError(
            "sol has no controls (sol.u is None): its system has no actuation and servo constraints"
        )
    return _components(
        sol, np.asarray(sol.u), picked_from=actuators, what="actuators", names=names, prefix="u", units=units,
        quantity="u, control", ax=ax, title=title if title is not None else f"Controls{_status_note(sol)}",
    )  # fmt: skip


def batch_status(sol: Solution, *, title: str | None = None, ax=None):
    """A bar chart of how many scenarios of a batch ended with each :class:`ukjax.RESULTS` status.

    Every status of ``RESULTS`` gets a bar (zero included), in the order of their codes, so charts of two
    batches compare bar by bar; a code that ``RESULTS`` does not know gets its own bar "status k".

    Args:
        sol: a batch :class:`ukjax.Solution` (:func:`ukjax.simulate_batch`).
        title: the axes title; default "N scenarios: K succeeded".
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes, with one bar per status.
    """
    _check_solution(sol)
    status = np.asarray(sol.status)
    if status.ndim != 1:
        raise ValueError(
            f"sol must be a batch solution (simulate_batch), with one status per scenario; got status of "
            f"shape {status.shape}"
        )
    known = [int(code) for code in RESULTS]
    codes = known + sorted(set(int(c) for c in status) - set(known))
    labels = [_status_name(c) for c in codes]
    counts = [int(np.sum(status == c)) for c in codes]
    ax = _axes(ax)
    colors = ["tab:green" if c == RESULTS.success else "tab:red" for c in codes]
    bars = ax.bar(range(len(codes)), counts, color=colors)
    ax.bar_label(bars, fontsize="small")
    ax.set_xticks(range(len(codes)), labels, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("scenarios (count)")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ok = int(np.sum(status == RESULTS.success))
    ax.set_title(title if title is not None else f"{status.size} scenarios: {ok} succeeded")
    return ax


def _history_records(history) -> list[dict]:
    """The records of a tuning history: a FitResult, its ``history`` list, the dict of history.json, or the
    path of history.json (or of the folder holding it)."""
    if isinstance(history, str | Path):
        path = Path(history)
        if path.is_dir():
            path = path / "history.json"
        if not path.is_file():
            raise ValueError(f"history: no history.json at {path}")
        history = json.loads(path.read_text())
    if hasattr(history, "history") and not isinstance(history, dict):
        history = history.history
    if isinstance(history, dict):
        if "history" not in history:
            raise ValueError("history: a dict must be the content of history.json, with a 'history' list")
        history = history["history"]
    if not isinstance(history, list | tuple) or not all(isinstance(r, dict) for r in history):
        raise ValueError(
            "history must be a tune.FitResult, its .history (a list of dicts), the content of history.json "
            f"or its path; got {type(history).__name__}"
        )
    if not history:
        raise ValueError("history is empty: no step was evaluated")
    missing = [k for k in ("step", "loss") if k not in history[0]]
    if missing:
        raise ValueError(f"history records lack {missing} (expected the records of ukjax.tune.fit)")
    return list(history)


def loss_history(
    history, *, units: str | None = None, log: bool | None = None, title: str | None = None, ax=None
):
    """The loss of a tuning run (:func:`ukjax.tune.fit`) against the optimizer step.

    Accepted steps are joined by a line; rejected ones (divergence back-off: non-finite loss, too many failed
    scenarios, or a jump in loss) are marked with crosses at their loss (non-finite ones are not drawn), and
    the best accepted step with a circle.

    Args:
        history: a :class:`ukjax.tune.FitResult`, its ``history`` (records with ``step``, ``loss``,
            ``accepted``), the content of ``history.json`` written by ``fit(..., out=...)``, or its path.
        units: the unit of the loss (it depends on the objective, e.g. ``"m² s"`` for ∫‖φ‖² dt); default the
            axis says "units of the objective".
        log: logarithmic loss axis; default when every finite loss is positive.
        title: the axes title; default "Tuning loss" with the number of steps.
        ax: matplotlib Axes to draw on; default a new figure.

    Returns:
        The matplotlib Axes: one line for the accepted steps, one marker set for the rejected steps (if any)
        and one marker for the best step.
    """
    records = _history_records(history)
    steps = np.array([r["step"] for r in records], dtype=float)
    losses = np.array([np.nan if r["loss"] is None else float(r["loss"]) for r in records], dtype=float)
    accepted = np.array([bool(r.get("accepted", True)) for r in records])
    ax = _axes(ax)
    ax.plot(steps[accepted], losses[accepted], "o-", markersize=3, label="accepted steps")
    if not accepted.all():
        ax.plot(steps[~accepted], losses[~accepted], "x", color="tab:red", label="rejected steps (back-off)")
    finite = accepted & np.isfinite(losses)
    if finite.any():
        best = int(np.flatnonzero(finite)[np.argmin(losses[finite])])
        ax.plot(
            [steps[best]],
            [losses[best]],
            "o",
            markersize=9,
            markerfacecolor="none",
            color="k",
            label=f"best: {losses[best]:.4g} at step {int(steps[best])}",
        )
    all_finite = losses[np.isfinite(losses)]
    if log is None:
        log = all_finite.size > 0 and bool(np.all(all_finite > 0))
    if log:
        ax.set_yscale("log")
    return _labelled(
        ax,
        xlabel="optimizer step",
        ylabel=f"loss ({units})" if units else "loss (units of the objective)",
        title=title if title is not None else f"Tuning loss, {len(records)} steps",
    )
