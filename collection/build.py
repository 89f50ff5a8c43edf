"""Build the umprov.gpu collection from the repository's roles and playbooks (one copy in git).

    python collection/build.py [--output-path dist]

Stages ansible_collections/umprov/gpu/ under build/: galaxy.yml with umprov's version, the
roles (each role's library/ modules become the collection's plugins/modules/, since roles in a
collection carry no plugins), the playbooks, and the verifier agent zipapp in the gpu_agent
role's files/, so that the collection runs without umprov installed (AWX), and the pages of the
repository's docs/ that the roles, modules and playbooks cite (docs/NAME.md) in its docs/, so
that every citation resolves in the tarball too. Then `ansible-galaxy collection build`. Prints
the tarball's path.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "collection"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
CITED = re.compile(r"\bdocs/([\w-]+\.md)\b")


def version() -> str:
    text = (ROOT / "umprov" / "__init__.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not found:
        raise SystemExit("collection/build.py: umprov/__init__.py names no __version__")
    return found.group(1)


def stage(build_dir: Path) -> Path:
    galaxy = yaml.safe_load((HERE / "galaxy.yml").read_text())
    galaxy["version"] = version()
    target = build_dir / "ansible_collections" / galaxy["namespace"] / galaxy["name"]
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "galaxy.yml").write_text(yaml.safe_dump(galaxy, sort_keys=False))
    for doc in ("README.md", "CHANGELOG.md"):
        shutil.copy2(HERE / doc, target / doc)
    shutil.copytree(HERE / "meta", target / "meta")
    sanity_ignores(target / "tests" / "sanity")
    # playbooks/roles links to roles/ in the checkout; the collection's playbooks find its roles.
    shutil.copytree(ROOT / "playbooks", target / "playbooks", ignore=IGNORED, symlinks=True)
    (target / "playbooks" / "roles").unlink()
    modules = target / "plugins" / "modules"
    modules.mkdir(parents=True)
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        shutil.copytree(role, target / "roles" / role.name,
                        ignore=shutil.ignore_patterns("library", "__pycache__", "*.pyc", ".*"))
        for module in sorted((role / "library").glob("*.py")):
            shutil.copy2(module, modules / module.name)
    ship_agent(target / "roles" / "gpu_agent" / "files")
    ship_docs(target)
    return target


def ship_docs(target: Path) -> None:
    """The docs/ pages that the staged collection's files cite, and the pages those cite, copied
    to its docs/."""
    (target / "docs").mkdir()
    files = [p for p in target.rglob("*") if p.is_file() and p.suffix != ".pyz"]
    while files:
        cited = {name for path in files for name in CITED.findall(path.read_text(errors="replace"))}
        files = []
        for name in sorted(cited):
            source, dest = ROOT / "docs" / name, target / "docs" / name
            if not source.is_file():
                raise SystemExit(f"collection/build.py: docs/{name} is cited but does not exist")
            if not dest.exists():
                files.append(Path(shutil.copy2(source, dest)))


# The ansible-core versions the collection supports (meta/runtime.yml, pyproject.toml).
ANSIBLE_VERSIONS = ("2.17", "2.18", "2.19", "2.20")


def sanity_ignores(folder: Path) -> None:
    """ansible-test reads one ignore file per ansible-core version; the collection has one list.
    What it holds: the modules are Apache-2.0, as umprov is, not GPLv3 (a rule for modules in
    ansible-core itself)."""
    folder.mkdir(parents=True)
    text = (HERE / "tests" / "sanity" / "ignore.txt").read_text()
    for version in ANSIBLE_VERSIONS:
        (folder / f"ignore-{version}.txt").write_text(text)


def ship_agent(files: Path) -> None:
    """The agent zipapp umprov verify runs, built from umprov/verify/agent/ of this checkout."""
    sys.path.insert(0, str(ROOT))
    from umprov.verify.bundle import agent_zipapp

    files.mkdir(parents=True, exist_ok=True)
    cache = files.parent / ".agent-cache"
    shutil.copy2(agent_zipapp(cache=cache), files / "agent.pyz")
    shutil.rmtree(cache)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-path", type=Path, default=ROOT / "dist")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build" / "collection")
    args = parser.parse_args()
    target = stage(args.build_dir.resolve())
    args.output_path.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).with_name("ansible-galaxy"))
    proc = subprocess.run([galaxy, "collection", "build", str(target), "--force",  # noqa: S603
                           "--output-path", str(args.output_path.resolve())],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        return proc.returncode
    print(proc.stdout.strip().rsplit(" ", 1)[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
