"""The documentation builds in strict mode, holds the API of ukjax, and a broken reference breaks the build.

`mkdocs build --strict` turns every warning into a failure: a `::: module` directive that griffe cannot load,
a cross-reference that resolves nowhere, a page missing from the site. The first test builds the real site and
checks what a reader looks for (the signature of `ukjax.simulate`, every public name of `ukjax` in the
namespace table); the second builds the same configuration on a page with a reference to an object that does
not exist and requires the build to fail, so the first test cannot pass by building nothing.

Every ```python block of every page is run by the slow test at the end (the blocks of a page in order, in one
namespace, as a reader would paste them; it compiles a few dozen simulations), to be run after an API change:
`pytest -m slow tests/test_docs.py`. A block meant not to run is marked by an HTML comment on the line before
it, `<!-- not run: REASON -->`. Two examples that the README points to (tuning a gain with optax, a kinematic
tree) are also run by fast tests here, which check their numbers.
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
DOCS = ROOT / "docs"
_BLOCK = re.compile(
    r"(?:<!-- not run: (?P<reason>[^\n]*?) -->\n(?:[ \t]*\n)*)?```python\n(?P<code>.*?)```", flags=re.S
)


def python_blocks(page: str) -> list[tuple[str, str | None]]:
    """The ```python blocks of a docs page in order, each with the reason it is not run (None: it runs)."""
    return [(m["code"], m["reason"]) for m in _BLOCK.finditer((DOCS / page).read_text())]


def pages_with_code() -> list[str]:
    """Every page of the site (docs/, without its build tools) that holds a ```python block."""
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_tools" not in p.parts)
    return [page for page in pages if python_blocks(page)]


def run_blocks(code: list[str], page: str, namespace: dict) -> dict:
    """Run ``code`` (blocks of ``page``) in order in ``namespace``, with JAX's default dtype promotion: a
    reader runs with the standard promotion, not the suite's strict one, which optax's Adam itself does not
    satisfy (its bias correction raises a float to an int32 step count)."""
    with jax.numpy_dtype_promotion("standard"):
        for i, block in enumerate(code):
            exec(compile(block, f"{page}, Python block {i + 1}", "exec"), namespace)
    return namespace


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
        "benchmarks",
        "papers",
        "guide/cli",
        "guide/simulation-options",
        "guide/statuses",
        "guide/precision",
        "guide/trees",
        "guide/robots",
        "guide/linearization",
        "guide/gpu",
        "examples/simulate",
        "examples/batch",
        "examples/tuning",
        "examples/sweeps",
        "examples/servo",
        "api/plot",
        "api/multibody",
        "api/robots",
        "api/linearize",
        "api/lagrangian",
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


def test_quickstart_tuning_example_lowers_the_loss():
    """The quickstart's optax block (continuing its first block, the pendulum) takes 15 Adam steps from a poor
    gain: the loss must fall by at least a factor 10 and the gain must grow."""
    code = [block for block, reason in python_blocks("quickstart.md") if reason is None]
    tuning = next(block for block in code if "optax.adam" in block)
    losses = []
    namespace = {"print": lambda *args, **kwargs: losses.append(args[0]), "__name__": "__docs__"}
    run_blocks([code[0], tuning], "quickstart.md", namespace)
    values = [float(line.split("loss ")[1].split(" ")[0]) for line in losses
              if isinstance(line, str) and line.startswith("step")]
    assert len(values) == 15 and values[-1] < values[0] / 10, values
    assert float(namespace["log_k"]) > 0.0


def test_kinematic_tree_example_runs():
    """The kinematic-tree block of guide/trees.md runs as printed: every scenario succeeds, the pin holds."""
    code = next(block for block, _ in python_blocks("guide/trees.md") if "multibody.Tree.chain" in block)
    namespace = run_blocks([code], "guide/trees.md", {"print": lambda *args, **kwargs: None})
    sol = namespace["sol"]
    assert bool(sol.ok.all())
    # Baumgarte-stabilized from consistent starts, Tsit5 at 5 ms on 32 links: the step's truncation error
    # leaves |φ| at ~5e-8 m after 1 s (measured 4.6e-8); a broken pin or solve misses 1e-6 m by far
    assert float(abs(sol.position_residual).max()) < 1e-6


def test_every_page_with_code_is_run():
    """The slow test below runs every page that holds Python; a marked block says why it does not run."""
    pages = pages_with_code()
    expected = {"quickstart.md", "examples/tuning.md", "examples/sweeps.md", "guide/trees.md"}
    assert expected <= set(pages), pages
    for page in pages:
        for _, reason in python_blocks(page):
            assert reason is None or reason.strip(), f"{page}: a block marked not to run gives no reason"


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_code())
def test_page_code_runs(page, tmp_path, monkeypatch):
    """Each page's Python blocks run in order, in one namespace, as a reader would paste them, in a fresh
    folder (their figures and results go there) that holds nothing of the repository: the shipped sweep specs
    they run are named, found in the package (ukjax/sweep/specs), as an installed ukjax finds them."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    code = [block for block, reason in python_blocks(page) if reason is None]
    assert code, f"{page} has no Python block to run"
    run_blocks(code, page, {"print": lambda *args, **kwargs: None, "__name__": "__docs__"})
