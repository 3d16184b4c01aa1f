"""Every registered study runs end to end through ``ukjax run`` and writes metrics.json and PNG figures.

The physics of each study is tested in its model's test file; this checks the plumbing a user touches (the
command, the flags, the output folder) on short runs. One cheap study runs in CI; all of them run under
``pytest -m slow``.
"""

import json

import pytest

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
}


def test_every_registered_study_has_a_short_run():
    assert set(SHORT_RUNS) == set(STUDIES)


def _run_study(name, tmp_path):
    out = tmp_path / name
    assert main(["run", name, "--out", str(out), *SHORT_RUNS[name]]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "environment" in metrics and metrics["environment"]["float64"] is True
    assert list(out.glob("*.png")), f"{name} wrote no figure"
    return metrics


def test_spiral_study_writes_metrics_and_figures(tmp_path):
    _run_study("spiral", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SHORT_RUNS) - {"spiral"}))
def test_study_writes_metrics_and_figures(name, tmp_path):
    _run_study(name, tmp_path)
