"""The report of a sweep: quantiles per metric, failures by status with their indices, histograms and
metric-versus-parameter scatter plots (PNG), written to ``OUT/report/`` and printed.

Joint ranges. Where the table has columns ``joint_range_excess.NAME`` (:data:`RANGE_COLUMN`: per scenario,
the largest distance of coordinate NAME beyond the range its model states, max over saved times,
:func:`ukjax.diagnostics.range_excess`; 0 inside; NaN for a scenario that did not complete), the report
counts, per coordinate and in all, the scenarios that left a stated range, with their indices, and prints a
warning: the ranges are not enforced and leaving them does not change a scenario's status. None of the
registered sweep models is a robot or states ranges, so their reports have no such section.

The table is read by :func:`ukjax.sweep.load` (every file proven); every report file is written atomically
(figures are drawn into memory and written with :func:`ukjax._io.atomic_write_bytes`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ukjax.sweep import _store
from ukjax.sweep._scenarios import METRIC_DESCRIPTIONS, RANGE_COLUMN

QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
MAX_INDICES = 100  # failing indices listed per status
MAX_POINTS = 20000  # scatter plots subsample beyond this
MAX_PANELS = 9
KEY_METRICS = ("peak_abs_u", "max_abs_phi", "tail_abs_phi", "peak_constraint_force", "max_abs_servo_residual")


def _is_final_state(name: str) -> bool:
    return name.startswith(("q_final[", "qd_final["))


def _range_columns(names) -> dict[str, str]:
    """Coordinate name -> column of its range excess (:data:`RANGE_COLUMN`)."""
    prefix = RANGE_COLUMN + "."
    return {name[len(prefix) :]: name for name in names if name.startswith(prefix)}


def _joint_ranges(table, index: np.ndarray) -> dict | None:
    """The scenarios that left a stated range, per coordinate and in all; None without range columns."""
    columns = _range_columns(table.column_names)
    if not columns:
        return None
    checked = np.ones(table.num_rows, bool)
    outside_any = np.zeros(table.num_rows, bool)
    by_coordinate = {}
    for name, column in columns.items():
        excess = _numeric(table.column(column))
        checked &= np.isfinite(excess)
        outside = np.isfinite(excess) & (excess > 0)
        outside_any |= outside
        by_coordinate[name] = {
            "scenarios": int(outside.sum()),
            "max_excess": float(excess[outside].max()) if outside.any() else 0.0,
            "indices": index[outside][:MAX_INDICES].tolist(),
        }
    return {
        "note": "ranges stated by the model (e.g. a robot file's joint limits), not enforced; excess: the "
        "largest distance beyond the range over the saved times (rad or m); scenarios that did not "
        "complete are not checked",
        "scenarios_checked": int(checked.sum()),
        "scenarios_outside": int(outside_any.sum()),
        "by_coordinate": by_coordinate,
    }


def _numeric(column) -> np.ndarray | None:
    values = column.to_numpy(zero_copy_only=False)
    return values.astype(np.float64) if np.issubdtype(values.dtype, np.number) else None


def _quantiles(values: np.ndarray) -> dict:
    finite = values[np.isfinite(values)]
    out = {"count": int(values.size), "nonfinite": int(values.size - finite.size)}
    if finite.size:
        out["mean"] = float(finite.mean())
        out.update({f"q{int(round(q * 100)):02d}": float(np.quantile(finite, q)) for q in QUANTILES})
    return out


def _groups(
    table, varied: list[str], discrete: list[str], key_metric: str | None, ok: np.ndarray
) -> list[dict]:
    """Success rate (and the median key metric) per combination of the grid and choice values (e.g. per
    pinv method x tolerance)."""
    grid = [c for c in varied if any(c == path or c.startswith(path + "[") for path in discrete)]
    if not grid:
        return []
    keys = list(zip(*(table.column(c).to_pylist() for c in grid), strict=True))
    metric = _numeric(table.column(key_metric)) if key_metric else None
    rows = []
    for combo in sorted(set(keys), key=str):
        mask = np.array([k == combo for k in keys])
        row = {
            **dict(zip(grid, combo, strict=True)),
            "scenarios": int(mask.sum()),
            "succeeded": int((mask & ok).sum()),
        }
        if metric is not None and (mask & ok).any():
            row[f"median_{key_metric}"] = float(np.median(metric[mask & ok]))
        rows.append(row)
    return rows


def report(out, *, quiet: bool = False) -> dict:
    """Write ``OUT/report/report.json`` and the figures for the sweep in ``out``; returns the report."""
    from ukjax._io import write_json

    out = Path(out)
    manifest = _store.read_manifest(out)
    table = _store.load(out, allow_partial=True)
    roles = _store.column_roles(table.column_names)
    status = table.column("status").to_numpy()
    names = table.column("status_name").to_numpy(zero_copy_only=False)
    index = table.column("index").to_numpy()
    ok = status == 0
    metrics = [m for m in roles["metrics"] if _numeric(table.column(m)) is not None]
    # what the figures show first: the user's own metrics, then the peak control, then the violation
    ranges = set(_range_columns(metrics).values())  # reported in their own section
    user = [m for m in metrics if m not in METRIC_DESCRIPTIONS and not _is_final_state(m) and m not in ranges]
    key = user + [m for m in KEY_METRICS if m in metrics]
    folder = out / "report"
    result = {
        "sweep": manifest["name"],
        "model": manifest["model"]["name"],
        "integrator": manifest["integrator"],
        "scenarios_total": manifest["scenarios_total"],
        "scenarios_in_table": int(table.num_rows),
        "complete": table.num_rows == manifest["scenarios_total"],
        "succeeded": int(ok.sum()),
        "failures_by_status": {},
        "quantiles_over_successful_scenarios": {
            m: _quantiles(_numeric(table.column(m))[ok]) for m in metrics if m not in ("status",)
        },
        "groups": _groups(table, roles["varied"], _discrete(manifest), key[0] if key else None, ok),
        "rerun": "ukjax.sweep.rerun(OUT, [index]) re-simulates a scenario with its full trajectory",
        "figures": [],
    }
    joint_ranges = _joint_ranges(table, index)
    if joint_ranges is not None:
        result["joint_ranges"] = joint_ranges
    for name in sorted(set(names[~ok])):
        failing = index[names == name]
        result["failures_by_status"][str(name)] = {
            "count": int(failing.size),
            "indices": failing[:MAX_INDICES].tolist(),
        }
    result["figures"].append(_histograms(folder, table, key + ["num_steps"], ok, manifest))
    for metric in key[:2]:
        figure = _scatter(folder, table, metric, roles["varied"], ok, manifest)
        if figure:
            result["figures"].append(figure)
    write_json(folder / "report.json", result)
    if not quiet:
        _print(result, folder)
    return result


def _save_figure(fig, path: Path) -> str:
    """Lay out, draw (PNG, 120 dpi) into memory, close, and write the figure atomically; returns its name."""
    import io

    import matplotlib.pyplot as plt

    from ukjax._io import atomic_write_bytes

    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path.name


def _discrete(manifest) -> list[str]:
    """Leaf paths that vary on a grid or among a choice of values."""
    vary = manifest["spec"].get("vary", {})
    from ukjax.sweep._spec import _flatten_vary

    return [path for path, table in _flatten_vary(vary).items() if table.get("dist") in ("grid", "choice")]


def _setting(manifest) -> str:
    integ = manifest["integrator"]
    step = f"fixed step {integ['dt']:g} s" if integ.get("dt") else f"adaptive rtol {integ['rtol']:g}"
    t1 = integ.get("t1")
    return f"{manifest['model']['name']}, {integ['solver']} {step}, t1 = " + (f"{t1:g} s" if t1 else "grid")


def _log_scale(values: np.ndarray) -> bool:
    positive = values[np.isfinite(values) & (values > 0)]
    return (
        positive.size > 0
        and positive.size == values[np.isfinite(values)].size
        and (positive.max() / positive.min() > 100)
    )


def _histograms(folder: Path, table, metrics: list[str], ok, manifest) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in dict.fromkeys(metrics) if m in table.column_names][:MAX_PANELS]
    cols = min(3, max(1, len(metrics)))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        values = _numeric(table.column(metric))[ok]
        values = values[np.isfinite(values)]
        if values.size and _log_scale(values):
            ax.hist(values, bins=np.logspace(np.log10(values.min()), np.log10(values.max()) + 1e-12, 40))
            ax.set_xscale("log")
        elif values.size:
            ax.hist(values, bins=40)
        ax.set_xlabel(metric)
        ax.set_ylabel("scenarios")
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"Sweep {manifest['name']}: {int(ok.sum())} successful scenarios\n{_setting(manifest)}", fontsize=10
    )
    return _save_figure(fig, folder / "histograms.png")


def _scatter(folder: Path, table, metric: str, varied: list[str], ok, manifest) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y_all = _numeric(table.column(metric))
    panels = []
    for column in varied:
        x = _numeric(table.column(column))
        if x is not None and np.nanmax(x) > np.nanmin(x):
            panels.append((column, x))
    panels = panels[:MAX_PANELS]
    if not panels:
        return None
    rng = np.random.default_rng(0)
    shown = np.flatnonzero(ok & np.isfinite(y_all))
    if shown.size > MAX_POINTS:
        shown = np.sort(rng.choice(shown, MAX_POINTS, replace=False))
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False, sharey=True)
    log = _log_scale(y_all[shown])
    for ax, (column, x) in zip(axes.flat, panels, strict=False):
        ax.scatter(x[shown], y_all[shown], s=2, alpha=0.4, rasterized=True)
        ax.set_xlabel(column)
        if log:
            ax.set_yscale("log")
    for ax in axes[:, 0]:
        ax.set_ylabel(metric)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{metric} against the varied values, {shown.size} successful scenarios\n{_setting(manifest)}",
        fontsize=10,
    )
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in metric)
    return _save_figure(fig, folder / f"scatter_{safe}.png")


def _print(result: dict, folder: Path) -> None:
    print(
        f"sweep {result['sweep']} ({result['model']}): {result['succeeded']}/{result['scenarios_in_table']} "
        f"scenarios succeeded"
        + ("" if result["complete"] else f" (incomplete: {result['scenarios_total']} planned)")
    )
    for name, failure in result["failures_by_status"].items():
        shown = ", ".join(map(str, failure["indices"][:10]))
        print(f"  {name}: {failure['count']} scenarios, e.g. indices {shown}")
    ranges = result.get("joint_ranges")
    if ranges is not None and ranges["scenarios_outside"] == 0:
        print(
            f"joint ranges: {len(ranges['by_coordinate'])} stated, held in all {ranges['scenarios_checked']} "
            "completed scenarios (not enforced)"
        )
    elif ranges is not None:
        print(
            f"WARNING joint ranges: {ranges['scenarios_outside']} of {ranges['scenarios_checked']} completed "
            "scenarios left a range stated by the model (not enforced; the status does not show it)"
        )
        for name, entry in ranges["by_coordinate"].items():
            if entry["scenarios"]:
                shown = ", ".join(map(str, entry["indices"][:10]))
                print(
                    f"  {name}: {entry['scenarios']} scenarios, up to {entry['max_excess']:.3g} beyond, "
                    f"e.g. indices {shown}"
                )
    print(f"{'metric (successful scenarios)':<34}{'median':>11}{'95th pct':>11}{'99th pct':>11}{'max':>11}")
    for metric, q in result["quantiles_over_successful_scenarios"].items():
        if _is_final_state(metric) or "q50" not in q:
            continue
        print(f"  {metric:<32}{q['q50']:>11.3e}{q['q95']:>11.3e}{q['q99']:>11.3e}{q['q100']:>11.3e}")
    if result["groups"]:
        print(f"by grid cell: {len(result['groups'])} groups in report.json")
    print(f"report: {folder}/report.json, {', '.join(result['figures'])}")
