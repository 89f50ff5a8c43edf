"""The wheel carries what umprov reads at run time from the repository's top level: ansible.cfg,
playbooks/, roles/, the image's build files and the example inventory, mapped into
umprov/_content/ (umprov.paths.content_dir). Git keeps one copy of each, at the top level;
MANIFEST.in puts the same files into the sdist, from which the wheel is built the same way.
Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CONTENT = ("ansible.cfg", "playbooks", "roles", "docker/pytorch-cuda", "inventory/hosts.yml",
           "inventory/group_vars")
# Made at run time or by tests, never shipped; playbooks/roles is a link to roles/ (plain
# ansible-playbook from any folder), which the wheel need not carry twice.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "context", ".*")
LINKS = ("playbooks/roles",)


class BuildWithContent(build_py):
    """build_py, then the repository's run-time files under umprov/_content/ (not for an
    editable install, which reads them from the checkout)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "umprov" / "_content"
        shutil.rmtree(target, ignore_errors=True)
        for item in CONTENT:
            source, dest = ROOT / item, target / item
            if not source.exists():
                raise SystemExit(f"setup.py: {source} is missing: build from a clone or the sdist")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, ignore=IGNORED, symlinks=True)
                for link in LINKS:
                    if (target / link).is_symlink():
                        (target / link).unlink()
            else:
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithContent})
