"""The documentation builds in strict mode, holds the API of ukjax, and a broken reference breaks the build.

`mkdocs build --strict` turns every warning into a failure: a `::: module` directive that griffe cannot load,
a cross-reference that resolves nowhere, a page missing from the site. The first test builds the real site and
checks what a reader looks for (the signature of `ukjax.simulate`, every public name of `ukjax` in the
namespace table); the second builds the same configuration on a page with a reference to an object that does
not exist and requires the build to fail, so the first test cannot pass by building nothing.

The examples' code is run by the slow test at the end (it compiles a dozen simulations), to be run after an
API change: `pytest -m slow tests/test_docs.py`.
"""

import ast
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import yaml  # PyYAML, installed with mkdocs (the dev extra)

ROOT = Path(__file__).resolve().parents[1]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's banner about its successor
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def page_text(path: Path) -> str:
    """The visible text of a built page (tags removed, entities decoded, whitespace collapsed)."""
    text = re.sub(r"<[^>]+>", "", path.read_text())
    return re.sub(r"\s+", " ", html.unescape(text))


def public_names() -> list[str]:
    """ukjax's public names read from its source: ``__all__`` if it has one, else its explicit re-exports
    (``from ukjax.x import y as y``), the convention of ukjax/__init__.py."""
    tree = ast.parse((ROOT / "ukjax" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return [
        alias.asname
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site


def test_site_documents_the_api(site):
    simulation = page_text(site / "api" / "simulation" / "index.html")
    assert "simulate(system, q0, qd0, params, *," in simulation  # the signature, from the source
    assert "simulate_batch(system, q0, qd0, params, *," in simulation
    assert "Integrate system from (q0, q̇0) at t0 to t1" in simulation  # the docstring
    assert "Liu et al. 2015" in simulation  # papers cited by authors and year, never by seed file
    for page in sorted((site / "api").rglob("index.html")):
        assert not re.search(r"\bseeds? \d{3}", page_text(page)), page
    namespace = (site / "api" / "index.html").read_text()
    names = public_names()
    assert {"simulate", "simulate_batch", "Solution", "System", "RESULTS"} <= set(names)
    missing = [name for name in names if f"<code>{name}</code></a>" not in namespace]
    assert not missing, f"public names without a linked entry in the API reference: {missing}"
    for page in (
        "quickstart",
        "examples/simulate",
        "examples/batch",
        "examples/tuning",
        "examples/sweeps",
        "examples/servo",
        "api/plot",
        "api/multibody",
        "api/models",
        "api/tune",
        "api/sweep",
    ):
        assert (site / page / "index.html").is_file(), page
    models = (site / "api" / "models" / "index.html").read_text()
    for module in sorted((ROOT / "ukjax" / "models").glob("[!_]*.py")):  # every model module has a section
        assert f'id="ukjax.models.{module.stem}"' in models, module.stem


def test_broken_reference_fails_the_strict_build(tmp_path):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Broken\n\n::: ukjax.nope\n")
    config.pop("nav", None)
    config.pop("extra_css", None)
    config["docs_dir"] = str(docs)
    for key in ("hooks", "watch"):  # paths relative to the repository
        config[key] = [str(ROOT / path) for path in config.get(key, [])]
    python = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    handler = python["handlers"]["python"]
    handler["paths"] = [str(ROOT)]
    handler["options"]["extensions"] = [
        str(ROOT / e) if isinstance(e, str) else e for e in handler["options"].get("extensions", [])
    ]
    broken = tmp_path / "mkdocs.yml"
    broken.write_text(yaml.safe_dump(config, allow_unicode=True))
    result = mkdocs_build(broken, tmp_path / "site")
    assert result.returncode != 0
    assert "ukjax.nope" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "page, blocks",
    [
        ("quickstart.md", slice(None)),
        ("examples/simulate.md", slice(None)),
        ("examples/batch.md", slice(None)),
        ("examples/servo.md", slice(None)),
        ("examples/tuning.md", slice(0, 2)),  # without the ukjax.tune block (about two minutes)
    ],
)
def test_examples_run(page, blocks, tmp_path, monkeypatch):
    """Each example page's Python blocks run in order, as a reader would paste them (their figures go to a
    temporary folder)."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    code = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)[blocks]
    assert code, f"{page} has no Python block"
    namespace = {"print": lambda *args, **kwargs: None, "__name__": "__docs__"}
    # A reader runs with JAX's default (standard) dtype promotion, not the suite's strict one, which optax's
    # Adam itself does not satisfy (its bias correction raises a float to an int32 step count).
    with jax.numpy_dtype_promotion("standard"):
        exec(compile("\n".join(code), page, "exec"), namespace)
