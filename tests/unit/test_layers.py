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
