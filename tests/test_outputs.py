"""Where results go: never into the repository unless asked.

Studies, tuning studies and the demo write to ``./ukjax-results/NAME`` by default (ignored by git), and refuse
a folder that already holds results (a metrics.json or history.json, or files git tracks such as the committed
``results/NAME``) unless ``--overwrite`` is given.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ukjax.cli import main
from ukjax.studies._common import prepare_output

ROOT = Path(__file__).resolve().parents[1]
# The cheapest study (about 10 s compiling, well under a second integrating) with flags that keep it small;
# the same flags as tests/test_studies.py, so in-process runs share one compiled program.
SPIRAL = ["--t1", "2", "--tols", "1e-6", "--num-saves", "21"]


def _git(*args, cwd):
    command = ["git", "-c", "user.name=ukjax tests", "-c", "user.email=tests@ukjax.invalid", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def repository_copy(tmp_path_factory):
    """A git repository holding the files this checkout tracks, as they are in the working tree (so that the
    test sees uncommitted edits too), committed: a stand-in for a user's clone."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("this test needs git and a git checkout of ukjax")
    copy = tmp_path_factory.mktemp("clone") / "ukjax"
    for name in _git("ls-files", "-z", cwd=ROOT).split("\0"):
        source = ROOT / name
        if name and source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    _git("init", "-q", cwd=copy)
    _git("add", "-A", cwd=copy)
    _git("commit", "-q", "-m", "copy of the working tree", cwd=copy)
    assert _git("status", "--porcelain", cwd=copy) == ""
    return copy


def test_study_without_out_leaves_the_repository_clean(repository_copy):
    """`ukjax run spiral` in a clone, without --out: results in ./ukjax-results/spiral, `git status` clean."""
    committed = (repository_copy / "results" / "spiral" / "metrics.json").read_text()
    env = dict(os.environ, PYTHONPATH=str(repository_copy))  # the copy's ukjax, not this checkout's
    result = subprocess.run(
        [sys.executable, "-m", "ukjax.cli", "run", "spiral", *SPIRAL],
        cwd=repository_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "results in ukjax-results/spiral" in result.stdout
    metrics = json.loads((repository_copy / "ukjax-results" / "spiral" / "metrics.json").read_text())
    assert list(metrics["runs"]) == ["1e-06"]
    assert list((repository_copy / "ukjax-results" / "spiral").glob("*.png"))
    assert _git("status", "--porcelain", cwd=repository_copy) == ""
    assert (repository_copy / "results" / "spiral" / "metrics.json").read_text() == committed


def test_committed_results_and_the_repository_are_refused(repository_copy, monkeypatch, capsys):
    """Writing into the committed results/spiral (tracked by git) or the repository root needs --overwrite;
    the refusal comes before any work and names the folder and the flag."""
    monkeypatch.chdir(repository_copy)
    committed = (repository_copy / "results" / "spiral" / "metrics.json").read_text()
    for out in ("results/spiral", "."):
        assert main(["run", "spiral", "--out", out, *SPIRAL]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ukjax: error: ") and f"--out {Path(out)} already holds results" in err
        assert "--overwrite" in err
    tracked_only = repository_copy / "results" / "five_bar"  # a tracked file but no history.json
    (tracked_only / "metrics.json").rename(tracked_only / "grid.json")
    with pytest.raises(ValueError, match="tracked by git"):
        prepare_output(tracked_only)
    (tracked_only / "grid.json").rename(tracked_only / "metrics.json")
    assert (repository_copy / "results" / "spiral" / "metrics.json").read_text() == committed
    assert _git("status", "--porcelain", cwd=repository_copy) == ""


def test_existing_results_need_overwrite(tmp_path, capsys):
    out = tmp_path / "spiral"
    assert main(["run", "spiral", "--out", str(out), *SPIRAL]) == 0
    first = (out / "metrics.json").read_text()
    capsys.readouterr()

    assert main(["run", "spiral", "--out", str(out), *SPIRAL]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already holds results (metrics.json)" in err and "--overwrite" in err
    assert (out / "metrics.json").read_text() == first

    (out / "metrics.json").write_text("{}")  # so that the rewrite is visible
    assert main(["run", "spiral", "--out", str(out), "--overwrite", *SPIRAL]) == 0
    assert "runs" in json.loads((out / "metrics.json").read_text())


def test_tune_and_demo_refuse_existing_results(tmp_path, capsys):
    """The same rule for `ukjax tune` (history.json counts as results) and `ukjax demo`, before compiling."""
    tuned = tmp_path / "tune"
    tuned.mkdir()
    (tuned / "history.json").write_text("[]")
    assert main(["tune", "servo", "--out", str(tuned), "--steps", "1"]) == 2
    assert "already holds results (history.json)" in capsys.readouterr().err
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "metrics.json").write_text("{}")
    assert main(["demo", "--scenarios", "2", "--out", str(demo)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (demo / "metrics.json").read_text() == "{}"


def test_prepare_output_allows_new_and_empty_folders(tmp_path):
    assert prepare_output(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "a" / "b" / "notes.txt").write_text("not a result")
    assert prepare_output(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        prepare_output(tmp_path / "file")


def test_default_output_folders_are_outside_the_repository():
    """Every study, tuning study and the demo defaults to ukjax-results/NAME, which git ignores."""
    import argparse

    from ukjax import cli, demo, studies

    for name in studies.STUDIES:
        parser = cli.study_parser(f"ukjax run {name}", studies.load(name), name)
        assert parser.parse_args([]).out == f"ukjax-results/{name}"
    for name in studies.TUNE_STUDIES:
        parser = cli.study_parser(f"ukjax tune {name}", studies.load_tune(name), f"tune_{name}")
        assert parser.parse_args([]).out == f"ukjax-results/tune_{name}"
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert parser.parse_args([]).out == "ukjax-results/demo"
    for path in ("ukjax-results/x/metrics.json", "sub/ukjax-results/x/metrics.json"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
