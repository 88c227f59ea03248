"""coda_env's modules import one another without a circle (issue 27): each module's imports, at the top
and inside functions alike, are read from its source with `ast`, and the graph they make has no cycle. The
registry, in particular, knows nothing of task loading."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "coda_env"
pytestmark = pytest.mark.fast


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                target, names = "", [a.name for a in node.names]
            else:
                continue
            for t in [target, *names]:
                if t in mods and t != mod:
                    graph[mod].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def _cycles_between_modules(graph):
    """A package importing its own submodules (`__init__` registering its parts) is not a circle of
    modules; edges from a package to what it contains are left out."""
    return {m: {n for n in deps if not n.startswith(m + ".")} for m, deps in graph.items()}


def test_coda_env_has_no_import_cycle():
    cycle = _cycle(_cycles_between_modules(_graph()))
    assert cycle is None, " -> ".join(cycle)


def test_the_registry_knows_no_task_loading():
    graph = _graph()
    assert "coda_env.tasks" not in graph["coda_env.registry"]


def test_the_graph_is_read():
    graph = _graph()
    assert "coda_env.registry" in graph["coda_env.tasks"] and "coda_env.predicate" in graph["coda_env.checks"]


def _code_without_comments(path: Path) -> str:
    """A module's code with its comments and docstrings left out (what the names test reads)."""
    import io
    import tokenize

    out, prev = [], tokenize.INDENT
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING and prev in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL, tokenize.DEDENT):
            prev = tok.type
            continue  # a docstring (a string as a statement)
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            out.append(tok.string)
        prev = tok.type
    return " ".join(out)


def test_the_core_names_no_app_and_no_backend():
    """No app name and no backend name in coda_env's own modules (coda_env/*.py: comments and docstrings
    aside): adding either is one new room (apps/<app>/, a backends/ module), never an edit of the core."""
    import re

    apps = ("kalgebra", "grass", "texstudio", "chimerax", "celestia", "lean")
    backends = ("local", "libvirt", "fake")
    found = []
    for path in sorted(PKG.glob("*.py")):
        code = _code_without_comments(path).lower()
        for name in apps + backends:
            if re.search(rf"(?<![a-z_]){name}(?![a-z_])", code):
                found.append(f"{path.name}: {name}")
    assert not found, found
