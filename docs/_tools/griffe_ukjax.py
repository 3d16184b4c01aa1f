"""A griffe extension that lets ukjax's docstrings render as Markdown in the API reference.

ukjax's docstrings are written for ``help()``: Google-style sections ("Args:", "Attributes:") in free-form
text with a few reStructuredText habits. This extension rewrites, for the rendered reference only (the
source files are not touched):

* Sphinx roles (``:func:`simulate```, ``:class:`~ukjax.system.System```, ``:mod:`ukjax.linalg```) into code
  that links to the object when the reference documents it, and stays plain code when it does not (a private
  module, an object of another library): an *optional* cross-reference of mkdocs-autorefs, so a role never
  breaks the strict build;
* brackets that Markdown would read as a reference link ("[Aᵀ B][λ; u]"), escaped;
* reST literal-block markers (``Example::``) into a plain colon, so the indented block after them renders as
  Markdown code, and reST simple tables (rows framed by ``=====  =====`` lines) into text code blocks, where
  Markdown would otherwise read the ``====`` lines as headings;
* the seed-file names of the specification papers ("seed 000 eq. 11") into the papers' authors and year,
  as everything a user reads must cite them ("Liu et al. 2015, eq. 11").

It also makes the names a package re-exports explicitly (``from ukjax.x import y as y``, the convention of
:mod:`ukjax`, ``ukjax.tune`` and ``ukjax.sweep``, as in diffrax) public for griffe, which otherwise treats
every imported name as private when a module has no ``__all__``; a module with ``__all__`` is left alone.
"""

from __future__ import annotations

import ast
import html
import re

import griffe

PAPERS = {
    "000": "Liu et al. 2015",
    "001": "Xu & Liu 2017",
    "002": "the UK review (Chin. J. Mech. Eng.)",
    "003": "Orsino 2017",
    "004": "de Falco et al.",
}
"""The specification papers by seed number, cited as the README cites them."""

_ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
_AUTHOR = (
    r"(?:(?:Udwadia-Kalaba |UK )?review|de Falco(?: et al\.|, Pennestrì & Vita)?|Orsino(?: 2017)?"
    r"|Liu et al\.(?: 2015)?|Xu & Liu(?: 2017)?)"
)
_SEEDS = re.compile(
    rf"(?:(?P<author>{_AUTHOR})(?P<sep>,?\s+))?"
    r"\bseeds?\s+(?P<list>\d{3}(?:\s*(?:,|and|&|…|\.\.\.)\s*\d{3})*)"
)
_KEYS = {"000": "Liu", "001": "Xu", "002": "review", "003": "Orsino", "004": "Falco"}
_LOCATOR = re.compile(r"\s+(?:eq|§|Lemma|Case|Fig|Table|Assumption|Theorem|Prop|Cor|Section|appendix)")
_TABLE_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def cite(text: str) -> str:
    """Replace "seed 000" (and "seeds 000 and 004", "seeds 000…004") by the papers' authors and year.

    "Orsino 2017, seed 003 §2" becomes "Orsino 2017, §2" (the author is already named), "seed 000 eq. 27"
    becomes "Liu et al. 2015, eq. 27".
    """

    def names(match: re.Match) -> str:
        listed, author = match["list"], match["author"]
        numbers = re.findall(r"\d{3}", listed)
        comma = "," if _LOCATOR.match(text, match.end()) else ""
        if "…" in listed or "..." in listed:
            cited = "the five specification papers"
        elif any(n not in PAPERS for n in numbers):
            return match[0]
        elif author and len(numbers) == 1 and _KEYS[numbers[0]] in author:
            # "Orsino, seed 003" -> "Orsino 2017"; "de Falco et al., seed 004" stays "de Falco et al."
            return (PAPERS[numbers[0]] if PAPERS[numbers[0]].startswith(author) else author) + comma
        else:
            cited = " and ".join(PAPERS[n] for n in numbers)
        return (author + match["sep"] if author else "") + cited + comma

    cited = _SEEDS.sub(names, text)
    # "Liu et al. 2015, eq. 11 and 12 (Liu et al. 2015)": the source named the paper twice.
    papers = "|".join(re.escape(name) for name in PAPERS.values())
    cited = re.sub(rf"({papers})([^()\n]{{0,40}}?) \(\1\)", r"\1\2", cited)
    # "Liu et al. (2015, Liu et al. 2015, eq. 8)": the author and year were given around the seed.
    cited = re.sub(
        rf"\b(?P<who>[A-Z][\w-]+)(?P<rest>(?: et al\.| & [A-Z][\w-]+)? \(\d{{4}}, )(?P<paper>{papers}),? ?",
        lambda m: m[0] if m["who"] not in m["paper"] else m["who"] + m["rest"],
        cited,
    )
    # The specification as a whole ("the seed papers", "the seeds use", "section II of the seed").
    cited = re.sub(r"\bseed (papers?)\b", r"\1", cited)
    cited = re.sub(r"\b([Tt]he) seeds\b", r"\1 papers", cited)
    return re.sub(r"\b(of|in) the seed(?:'s)?\b(?!\s*=)", lambda m: m[0].replace("seed", "paper"), cited)


def _table(lines: list[str]) -> list[str]:
    """A reST simple table as a Markdown text block; its "(seed 000)" cells are blanked (the header names the
    papers already), and rows left empty are dropped."""
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    rows = [re.sub(r"\(seeds? \d{3}\)", lambda m: " " * len(m[0]), line).rstrip() for line in lines]
    return [f"{indent}```text", *(row for row in rows if row.strip()), f"{indent}```"]


def _prose(obj: griffe.Object, lines: list[str]) -> list[str]:
    """Literal-block markers, entries naming several parameters, roles and citations of prose lines."""
    out = []
    for line in lines:
        if line.strip() == "::":
            line = ""
        elif line.rstrip().endswith("::") and not line.rstrip().endswith(":::"):
            line = line.rstrip()[:-1]
        # "final_params, final_theta: ..." in an Attributes section: griffe reads "name (type)" at a space,
        # so the names are joined by a no-break space.
        line = re.sub(r"^(\s+[\w.]+(?:, [\w.]+)+)(?=:\s)", lambda m: m[1].replace(", ", ",\u00a0"), line)
        out.append(line)
    return cite(_roles(obj, _brackets("\n".join(out)))).split("\n")


def _brackets(text: str) -> str:
    """Escape "][" outside code spans: in maths such as "[Aᵀ B][λ; u]" Markdown would see a reference link
    (docstrings cross-reference with roles, never with Markdown links)."""
    parts = re.split(r"(``.*?``|`[^`]*`)", text)
    return "".join(part if part.startswith("`") else part.replace("][", "]\\[") for part in parts)


def markdown(obj: griffe.Object, text: str) -> str:
    """The docstring ``text`` of ``obj`` rewritten for the rendered reference (see the module docstring)."""
    lines, out, prose = text.split("\n"), [], []
    i = 0
    while i < len(lines):
        if _TABLE_BORDER.match(lines[i]):
            end, borders = i, 0
            while end < len(lines) and lines[end].strip():
                borders += bool(_TABLE_BORDER.match(lines[end]))
                end += 1
            if borders >= 3:  # top border, header, border, rows, bottom border
                out += _prose(obj, prose) + _table(lines[i:end])
                prose, i = [], end
                continue
        prose.append(lines[i])
        i += 1
    return "\n".join(out + _prose(obj, prose))


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of a role's target as seen from ``obj``'s scope (best effort: unresolved names are
    returned as written, and then simply stay unlinked)."""
    head, _, rest = target.partition(".")
    scopes = [obj] + [parent for parent in _parents(obj)]
    for scope in scopes:
        try:
            path = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, ValueError):
            continue
        return f"{path}.{rest}" if rest else path
    return target


def _parents(obj):
    parent = obj.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _roles(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match) -> str:
        target = match["target"].strip()
        plain = target.startswith("!")
        target = target.lstrip("!~")
        shown = target.rsplit(".", 1)[-1] if match["target"].strip().lstrip("!").startswith("~") else target
        if plain:
            return f"`{shown}`"
        identifier = html.escape(_resolve(obj, target), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'

    return _ROLE.sub(link, text)


def _reexports(node: ast.AST, package: str) -> list[str]:
    """Names bound by ``from X import y as y`` / ``import x.y as y`` at the top level of a module, and
    whether each is a submodule of the package itself (``from ukjax import tune as tune``), which griffe adds
    to the members only after this hook."""
    names = []
    for statement in getattr(node, "body", []):
        if isinstance(statement, ast.ImportFrom | ast.Import):
            own = isinstance(statement, ast.ImportFrom) and statement.module == package
            names += [
                (a.asname, own) for a in statement.names if a.asname and a.asname == a.name.rsplit(".", 1)[-1]
            ]
    return names


class UkjaxDocstrings(griffe.Extension):
    """See the module docstring."""

    def on_instance(self, *, node, obj: griffe.Object, agent, **kwargs) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = markdown(obj, obj.docstring.value)

    def on_module_members(self, *, node, mod: griffe.Module, agent, **kwargs) -> None:
        if mod.exports is not None or not isinstance(node, ast.Module):
            return
        public = [name for name, own in _reexports(node, mod.path) if own or name in mod.members]
        if public:
            # As if the module said __all__ = [its explicit re-exports and the public names it defines].
            defined = [n for n, m in mod.members.items() if not m.is_alias and not n.startswith("_")]
            mod.exports = public + [n for n in defined if n not in public and not mod.members[n].is_module]
