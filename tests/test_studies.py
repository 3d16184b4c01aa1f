"""Every registered study runs end to end through ``ukjax run``: it writes metrics.json and PNG figures whose
axes all carry units, and prints a summary of its headline numbers.

The physics of each study is tested in its model's test file; this checks the plumbing a user touches (the
command, the flags, the output folder, the text) on short runs. One cheap study runs in CI; all of them run
under ``pytest -m slow``.
"""

import json

import pytest
from helpers import labels_without_units

from ukjax.cli import main
from ukjax.studies import STUDIES

SHORT_RUNS = {
    "scara": ["--t1", "1.2", "--num-saves", "21", "--rtol", "1e-7", "--atol", "1e-7"],
    "spiral": ["--t1", "2", "--tols", "1e-6", "--num-saves", "21"],
    "five_bar": ["--duration", "0.2", "--methods", "svd,greville", "--tols", "1e-6", "--num-saves", "11"],
    "two_mass_spring": ["--t1", "0.5", "--num-saves", "21"],
    "coordinated_robots": ["--t1", "0.3", "--num-saves", "11", "--skip-literal"],
    "flexible_joint": ["--t1", "0.5", "--num-saves", "21"],
    "swarm": ["--t1", "0.5", "--num-saves", "21"],
    "three_rrr": ["--t1", "0.3", "--num-saves", "7", "--samples", "2", "--levels", "1e-3,1e-2"],
    "jansen": ["--periods", "0.25", "--kkt-states", "2"],
}


# What each study's printed summary must contain (a headline number of the study, with its unit).
SUMMARIES = {
    "scara": "max error x",
    "spiral": "max ε1",
    "five_bar": "max Σψ² m²",
    "two_mass_spring": "max |F - F_eq47| =",
    "coordinated_robots": "range of u (N m)",
    "flexible_joint": "below 0.001",
    "swarm": "closest approach",
    "three_rrr": "|u - KKT solve| <=",
    "jansen": "foot vs closed form",
}


def test_every_registered_study_has_a_short_run_and_a_summary():
    assert set(SHORT_RUNS) == set(STUDIES) == set(SUMMARIES)


@pytest.fixture
def unlabelled_axes(monkeypatch):
    """Axis labels without a unit of every figure saved while the test runs."""
    from matplotlib.figure import Figure

    found, savefig = [], Figure.savefig

    def checked_savefig(fig, *args, **kwargs):
        found.extend(labels_without_units(fig))
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked_savefig)
    return found


def _run_study(name, tmp_path, capsys, unlabelled_axes):
    out = tmp_path / name
    assert main(["run", name, "--out", str(out), *SHORT_RUNS[name]]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert "environment" in metrics and metrics["environment"]["float64"] is True
    assert list(out.glob("*.png")), f"{name} wrote no figure"
    assert SUMMARIES[name] in printed, printed
    assert printed.rstrip().endswith(f"ukjax run {name}: results in {out}")
    assert "seed 0" not in printed.lower()
    assert unlabelled_axes == [], f"{name}: axis labels without a unit: {unlabelled_axes}"
    return metrics


def test_spiral_study_writes_metrics_and_figures(tmp_path, capsys, unlabelled_axes):
    _run_study("spiral", tmp_path, capsys, unlabelled_axes)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SHORT_RUNS) - {"spiral"}))
def test_study_writes_metrics_and_figures(name, tmp_path, capsys, unlabelled_axes):
    _run_study(name, tmp_path, capsys, unlabelled_axes)
