"""Installed, not cloned: ukjax built as a wheel, installed into a fresh virtual environment outside the
repository, runs its commands from a folder that is not a clone.

The wheel is built from a copy of what the package is made of (pyproject.toml, README.md, ukjax/), so the
build leaves nothing in the repository and nothing outside ukjax/ can reach the wheel unnoticed. The build is
offline (``python -m build --no-isolation``: the ``dev`` extra installs setuptools and wheel). The virtual
environment sees the machine's packages (``--system-site-packages``: jax, diffrax, ... are not downloaded
again) but ukjax comes from the wheel (``pip install --no-deps``), which the tests check through
``ukjax.__file__``; every command runs with its working folder in a temporary folder and without PYTHONPATH,
so neither the repository nor an editable install of it can answer in its place.

Measured on the 2-core CPU shared with other jobs (``pytest -m slow -n 0``, 115 s in all): build, venv and
install 10 s, import and ``ukjax sweep --list`` 7 s, ``ukjax demo`` 26 s, ``ukjax run spiral`` 17 s,
``ukjax sweep scara`` (4 scenarios, then the report) 55 s; compiling dominates each command.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_studies import SHORT_RUNS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("pyproject.toml", "README.md", "ukjax")  # what the wheel is built from

pytestmark = pytest.mark.slow


def _run(command, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of a fresh venv with ukjax installed from its wheel, a work folder, the environment)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in PACKAGE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["UKJAX_CACHE_DIR"] = str(base / "xla-cache")
    dist = base / "dist"
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)]
    _run(build, base, env)
    (wheel,) = dist.glob("ukjax-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], base, env)
    bin_ = venv / "bin"
    _run([bin_ / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], base, env)
    work = base / "work"
    work.mkdir()
    return bin_, work, env


def test_ukjax_comes_from_the_wheel_with_its_specs(installed):
    bin_, work, env = installed
    script = (
        "import json, ukjax, ukjax.sweep, ukjax.studies.jansen as leg; "
        "print(json.dumps([ukjax.__file__, sorted(ukjax.sweep.shipped_specs()), str(leg.MODEL_FILE), "
        "leg.MODEL_FILE.is_file()]))"
    )
    where, names, leg_file, leg_shipped = json.loads(_run([bin_ / "python", "-c", script], work, env).stdout)
    assert Path(where).is_relative_to(bin_.parent), where
    assert {"scara", "five_bar", "coordinated_robots"} <= set(names)
    assert leg_shipped and Path(leg_file).is_relative_to(bin_.parent), leg_file  # the Jansen leg's MJCF
    listing = _run([bin_ / "ukjax", "sweep", "--list"], work, env).stdout
    assert "scara" in listing and str(bin_.parent) in listing  # the files are the installed ones


def test_demo_runs_installed(installed):
    bin_, work, env = installed
    out = work / "demo"
    small = ["--scenarios", "8", "--duration", "0.2", "--dt", "0.01", "--saves", "5", "--chunk", "8"]
    _run(
        [bin_ / "ukjax", "demo", *small, "--paper-comparison", "0", "--no-progress", "--out", "demo"],
        work,
        env,
    )
    assert json.loads((out / "metrics.json").read_text())
    assert list(out.glob("*.png"))


def test_a_study_runs_installed(installed):
    bin_, work, env = installed
    out = work / "spiral"
    printed = _run(
        [bin_ / "ukjax", "run", "spiral", "--out", "spiral", *SHORT_RUNS["spiral"]], work, env
    ).stdout
    assert printed.rstrip().endswith("ukjax run spiral: results in spiral")
    assert json.loads((out / "metrics.json").read_text())
    assert list(out.glob("*.png"))


def test_a_shipped_sweep_runs_installed_by_name(installed):
    bin_, work, env = installed
    out = work / "sweep"
    command = [bin_ / "ukjax", "sweep", "scara", "--scenarios", "4", "--chunk-size", "4", "--out", "sweep"]
    printed = _run([*command, "--no-progress"], work, env).stdout
    assert "ukjax sweep scara: 4 scenarios" in printed, printed
    assert (out / "manifest.json").is_file() and (out / "report" / "report.json").is_file()
    assert [p.name for p in (out / "chunks").glob("*.parquet")] == ["chunk_000000.parquet"]
