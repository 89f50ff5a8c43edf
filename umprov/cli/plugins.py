"""Commands other distributions add through the entry point group ``umprov.commands``.

``umprov --help`` names them, so the group is looked up on every start. importlib.metadata
would cost about 35 ms of imports (email, zipfile, csv) before the lookup itself, more than the
rest of the help together; installed distributions declare their entry points in a plain
``entry_points.txt`` beside their metadata, so this module reads those files directly and
imports a plugin's module only when its command runs.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass

GROUP = "umprov.commands"


@dataclass(frozen=True)
class Plugin:
    name: str  # the command's name
    value: str  # "module:attribute"
    source: str  # the distribution that declares it

    def load(self) -> object:
        module, _, attribute = self.value.partition(":")
        target: object = importlib.import_module(module.strip())
        for part in attribute.strip().split(".") if attribute.strip() else ():
            target = getattr(target, part)
        return target


@functools.cache
def installed() -> tuple[Plugin, ...]:
    """Every plugin of the installed distributions, in sys.path order; as importlib.metadata
    does, the first distribution of a name on sys.path hides later ones of the same name."""
    found: list[Plugin] = []
    seen: set[str] = set()
    for entry in sys.path:
        for meta in _metadata_dirs(entry or "."):
            dist = _normalized(meta.name.rsplit(".", 1)[0].split("-", 1)[0])
            if dist in seen:
                continue
            seen.add(dist)
            declared = _group(os.path.join(meta.path, "entry_points.txt"))
            if declared:
                source = _dist_name(meta.path) or dist
                found.extend(Plugin(name, value, source) for name, value in declared)
    return tuple(found)


def _metadata_dirs(entry: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(entry) as it:
            dirs = [e for e in it if e.name.endswith((".dist-info", ".egg-info"))]
    except OSError:  # a zip, a missing folder: no metadata folders to read
        return []
    return sorted(dirs, key=lambda e: e.name)


def _group(path: str) -> list[tuple[str, str]]:
    """The ``name = module:attribute`` lines of GROUP's section in an entry_points.txt."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return []
    if f"[{GROUP}]" not in text:
        return []
    out: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            inside = line == f"[{GROUP}]"
        elif inside and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


def _dist_name(meta_dir: str) -> str | None:
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta_dir, filename), encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        return line[5:].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


def _normalized(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()
