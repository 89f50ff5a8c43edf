"""umprov-lab's version is umprov's (umprov/__init__.py, one place): read from the checkout
beside this folder, or from PKG-INFO when built from the lab's sdist. Everything else is in
pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def version() -> str:
    source = HERE.parent / "umprov" / "__init__.py"
    if source.is_file():
        found = re.search(r'^__version__ = "([^"]+)"', source.read_text(), re.M)
    else:
        found = re.search(r"^Version: (\S+)", (HERE / "PKG-INFO").read_text(), re.M)
    if not found:
        raise SystemExit("lab/setup.py: umprov's version not found")
    return found.group(1)


setup(version=version())
