"""The tables of the Benchmarks page are the JSON files in benchmarks/results/, as benchmarks/tables.py
writes them: regenerating the page reproduces it to the character, so a number edited on the page, or a
JSON file replaced by a new run without regenerating the page, fails here."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tables():
    spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_holds_the_tables_of_the_json(tables):
    page = tables.PAGE.read_text()
    names = tables.regions(page)
    assert sorted(names) == sorted(tables.TABLES), "every generated table stands on the page exactly once"
    assert tables.render(page) == page, "the page differs from the JSON: run python3 benchmarks/tables.py"
    assert tables.main(["--check"]) == 0


def test_an_edited_page_or_json_is_noticed(tables, tmp_path, monkeypatch):
    page = tables.PAGE.read_text()
    edited = page.replace("| **624× (421×)** |", "| **625× (421×)** |")  # the headline throughput ratio
    assert edited != page and tables.render(edited) != edited
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    data = json.loads((results / "integrators-cpu-amd-epyc-2c.json").read_text())
    data["results"][0]["solvers"]["Bosh3"]["rate_vs_tsit5"] = 3.0
    (results / "integrators-cpu-amd-epyc-2c.json").write_text(json.dumps(data))
    monkeypatch.setattr(tables, "RESULTS", results)
    assert tables.render(page) != page
    assert tables.main(["--check"]) == 1
