"""The map in docs/architecture.md, checked: what each part of umprov may import.

Data flows one way (inventory -> hosts -> provision | deploy | verify -> outcomes ->
renderers -> cli), so a module may import only the parts below it. Read from the source with
ast, imports inside functions included: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "umprov"

BASE = {"umprov", "umprov.errors", "umprov.paths"}
HOSTS = BASE | {"umprov.hosts"}
# Part of the package (a path prefix under umprov/) -> the umprov modules it may import.
MAY_IMPORT: dict[str, set[str]] = {
    "errors.py": set(),
    "paths.py": {"umprov.errors"},  # EnvironmentProblem: a missing installed file
    "procs.py": set(),
    "__main__.py": {"umprov.cli"},
    "__init__.py": set(),
    "inventory/": BASE | {"umprov.inventory"},
    "hosts/": HOSTS,
    "output.py": HOSTS,
    "image.py": HOSTS,
    "provision/": HOSTS | {"umprov.inventory", "umprov.procs", "umprov.provision"},
    "rolling.py": HOSTS | {"umprov.provision"},
    "deploy/": HOSTS | {"umprov.inventory", "umprov.deploy", "umprov.image"},
    "status.py": HOSTS | {"umprov.inventory", "umprov.deploy"},
    "verify/agent/": {"umprov.verify.agent"},
    "verify/": HOSTS | {"umprov.inventory", "umprov.verify", "umprov.output"},
    "cli/": {"*"},
}


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).as_posix()
    return max((p for p in MAY_IMPORT if rel == p or rel.startswith(p)), key=len)


def umprov_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(("umprov", *path.relative_to(PACKAGE).parent.parts))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "umprov"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module and node.module.split(".")[0] in ("umprov", "umprov_lab"):
                found.append(node.module)
    return found


def allowed(module: str, rules: set[str]) -> bool:
    """A rule covers its submodules, except the package itself (`from umprov import
    __version__`), which covers only itself."""
    return "*" in rules or any(
        module == r or (r != "umprov" and module.startswith(r + ".")) for r in rules)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(
    p.relative_to(PACKAGE)))
def test_each_module_imports_only_the_parts_below_it(path: Path) -> None:
    rules = MAY_IMPORT[part_of(path)]
    wrong = [m for m in umprov_imports(path) if not allowed(m, rules)]
    assert not wrong, f"{path.relative_to(PACKAGE)} imports {wrong}; allowed: {sorted(rules)}"


def test_the_product_never_imports_the_lab() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert not [m for m in umprov_imports(path) if m.startswith("umprov_lab")], path


AGENT = PACKAGE / "verify" / "agent"


def agent_imports(path: Path) -> set[str]:
    """The agent's own modules that ``path`` imports (by stem), at any depth of the file:
    inside functions and under ``if TYPE_CHECKING`` too, a type's import is still an arrow."""
    names = {p.stem for p in AGENT.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import a, b
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "umprov.verify.agent."):
            found.add(node.module.split(".")[3])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[3] for a in node.names
                         if a.name.startswith("umprov.verify.agent."))
    return (found & names) - {path.stem}


def agent_graph() -> dict[str, set[str]]:
    return {p.stem: agent_imports(p) for p in sorted(AGENT.glob("*.py"))}


def a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (its modules in order, the first again at the end), or
    [] when every arrow runs one way."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_a_cycle_is_found_where_there_is_one() -> None:
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_agent_reads_function_level_and_type_only_imports() -> None:
    graph = agent_graph()
    assert "discover" in graph["cli"]  # from .discover import child_discover, in a function
    assert {"nvlink", "processes"} <= graph["monitor"]  # from . import nvlink, processes


def test_every_import_inside_the_agent_runs_one_way() -> None:
    cycle = a_cycle(agent_graph())
    assert not cycle, "the agent's modules import in a circle: " + " -> ".join(cycle)
