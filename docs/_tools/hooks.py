"""MkDocs hook: the table of ukjax's public names on the API reference's front page, built at each build.

The page ``api/index.md`` holds the marker ``<!-- ukjax-namespace -->``; this hook replaces it with

* a table of every public name of the ``ukjax`` namespace (its ``__all__`` when it has one, else its explicit
  re-exports ``from ukjax.x import y as y``), each linked to where the reference documents it, with the first
  line of its docstring;
* the full documentation (a ``::: ukjax.NAME`` directive) of each name whose defining module has no page of
  its own (names from private modules such as ``ukjax._config``, or from a module added later).

A name the lead adds to ``ukjax/__init__.py`` (``ukjax.step``, ``ukjax.plot``) therefore appears in the table
without editing the docs; the strict build fails if its module's page is missing and it cannot be rendered.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

MARKER = "<!-- ukjax-namespace -->"
ROOT = Path(__file__).resolve().parents[2]


def _extension():
    spec = importlib.util.spec_from_file_location("griffe_ukjax", Path(__file__).with_name("griffe_ukjax.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documented_modules(docs_dir: Path) -> set[str]:
    """The module paths that some page renders with a ``::: module`` directive."""
    found = set()
    for page in docs_dir.rglob("*.md"):
        found.update(re.findall(r"^:::\s+(ukjax[\w.]*)\s*$", page.read_text(), flags=re.M))
    return found


def _summary(obj) -> str:
    doc = obj.docstring.value if obj.docstring else ""
    first = doc.strip().split("\n\n", 1)[0].replace("\n", " ")
    return first.replace("|", "\\|")


def namespace(docs_dir: Path) -> tuple[str, list[str]]:
    """(Markdown table of the public names, names to render in full on the page)."""
    import griffe

    extension = _extension()
    package = griffe.load(
        "ukjax",
        search_paths=[str(ROOT)],
        extensions=griffe.load_extensions(extension.UkjaxDocstrings),
        resolve_aliases=True,
        resolve_external=False,
    )
    documented = documented_modules(docs_dir)
    names = [str(n) for n in package.exports] if package.exports is not None else []
    rows, here = [], []
    for name in names:
        member = package.members[name]
        target = member.final_target if member.is_alias else member
        path = target.path
        owner = target.path if target.is_module else target.module.path
        private = any(part.startswith("_") for part in owner.split("."))
        if private or not any(owner == m or owner.startswith(m + ".") for m in documented):
            # No page renders its module: render it here, under its public name.
            here.append(name)
            path, where = f"ukjax.{name}", "below"
        else:
            module = next(m for m in sorted(documented, key=len, reverse=True) if owner.startswith(m))
            where = f"[`{module}`][{module}]"
        rows.append(f"| [`{name}`][{path}] | {where} | {_summary(target)} |")
    table = "| `ukjax.` | documented in | what it is |\n| --- | --- | --- |\n" + "\n".join(rows)
    return table, here


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if MARKER not in markdown:
        return markdown
    table, here = namespace(Path(config["docs_dir"]))
    full = ""
    if here:
        full = "\n\n## Defined outside the module pages\n\n" + "\n\n".join(
            f"::: ukjax.{name}\n    options:\n      heading_level: 3" for name in here
        )
    return markdown.replace(MARKER, table + full)
