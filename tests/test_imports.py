"""Both packages' modules import one another without a circle (issues 27, 33): each module's imports, at the
top and inside functions alike, are read from its source with `ast`, and the graph they make has no cycle. The
registry, in particular, knows nothing of task loading; coda_env imports nothing of coda_agent; in coda_agent
nothing imports upward into train/ (the trainers' shared vocabulary lives in coda_agent.steps), and a method
file imports nothing private from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "coda_env"
AGENT = PKG.parent / "coda_agent"
pytestmark = pytest.mark.fast


def _module(path: Path) -> str:  # the dotted name of a file in either package
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(pkg: Path = PKG):
    """(module, imported module, imported name or None for a plain `import X`) for every import of the
    package's modules, at the top and inside functions alike."""
    mods = {_module(p): p for p in pkg.rglob("*.py")}
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
                for a in node.names:
                    yield mod, target, a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield mod, a.name, None


def _graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a `from X import name` counts X, and X.name where that is a
    module)."""
    mods = {_module(p) for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, target, name in _imports(pkg):
        for t in (target, f"{target}.{name}") if name else (target,):
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


def test_coda_agent_has_no_import_cycle():
    graph = _graph(AGENT)
    assert "coda_agent.steps" in graph["coda_agent.states"]  # the graph is read
    cycle = _cycle(_cycles_between_modules(graph))
    assert cycle is None, " -> ".join(cycle)


def test_coda_env_imports_nothing_of_coda_agent():
    found = [(m, t) for m, t, _ in _imports(PKG) if t.split(".")[0] == "coda_agent"]
    assert not found, found


def test_nothing_in_coda_agent_imports_upward_into_train():
    """train/ sits on top: only the command line (cli.py) dispatches into it."""
    found = [
        (m, t)
        for m, t, _ in _imports(AGENT)
        if t.startswith("coda_agent.train") and not m.startswith("coda_agent.train") and m != "coda_agent.cli"
    ]
    assert not found, found


def test_no_method_file_imports_a_private_name_from_another_module():
    """Method files (train/*.py) use each other's and the base's public names only."""
    found = [
        (m, f"{t}.{n}")
        for m, t, n in _imports(AGENT)
        if m.startswith("coda_agent.train")
        and t.startswith("coda_agent")
        and n
        and n.startswith("_")
        and n != "__future__"
        and t != m
    ]
    assert not found, found


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
