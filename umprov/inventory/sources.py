"""Where an inventory comes from: the sources a command line names, or ansible.cfg's.

A source is what ``ansible-playbook -i`` takes: a file (YAML, INI, a plugin configuration such
as ``plugin: constructed``, a script), a folder of those with group_vars/ and host_vars/, or a
comma list of hosts (``gpu1,gpu2,``). Paths are taken from the working directory as Ansible
takes them, ``~`` expanded; umprov also finds a name under the project's inventory/ folder
(``hosts`` is inventory/hosts.yml). With no source, the ones ansible-playbook would use:
``ANSIBLE_INVENTORY``, else ansible.cfg's ``inventory`` (both comma-separated lists of paths).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Sequence
from pathlib import Path

from umprov.errors import InventoryError
from umprov.paths import project_dir


def is_host_list(source: str) -> bool:
    """A comma list of hosts, as Ansible's host_list plugin tells: a comma, and no such path."""
    return "," in source and not Path(os.path.expanduser(source)).exists()


def resolve_sources(sources: Sequence[str]) -> tuple[str, ...]:
    """Every source as Ansible will be given it: absolute paths, comma lists as they are."""
    if not sources:
        return tuple(str(path) for path in default_sources())
    resolved = []
    for source in sources:
        if is_host_list(source):
            resolved.append(source)
        else:
            resolved.append(str(resolve_source(source).absolute()))
    return tuple(resolved)


def resolve_source(source: str | None) -> Path:
    """One INVENTORY argument as a path, as the README describes (None: the first default)."""
    if source is None or source == "":
        return default_sources()[0]
    direct = Path(os.path.expanduser(source))
    if direct.exists():
        return direct
    tried = [direct]
    if not direct.is_absolute():
        for cand in _candidates(source):
            tried.append(cand)
            if cand.exists():
                return cand
    raise InventoryError(
        f"inventory not found: {source} (looked for {', '.join(str(t) for t in tried)})"
    )


INVENTORY_SUFFIXES = (".yml", ".yaml", ".ini", ".json")


def _candidates(source: str) -> list[Path]:
    """Where a relative source that is not in the working directory may be: a path from the
    project folder (``inventory/lab/demo.yml``), else a name under its inventory/ (``lab/demo``,
    with or without its suffix)."""
    project = project_dir()
    if Path(source).parts[0] == "inventory":
        return [project / source]
    names = [source] if Path(source).suffix in INVENTORY_SUFFIXES else [
        source, *(f"{source}{ext}" for ext in INVENTORY_SUFFIXES[:3])]
    return [project / "inventory" / name for name in names]


def default_sources() -> list[Path]:
    """The inventories ansible-playbook uses with no -i: every one that ANSIBLE_INVENTORY, else
    ansible.cfg's ``inventory``, lists; each must exist."""
    found = _configured()
    if not found:
        raise InventoryError(
            "no inventory given and ansible.cfg names none: pass one "
            "(`umprov inventory init` writes an example to start from)"
        )
    paths, origin = found
    for path in paths:
        if not path.exists():
            raise InventoryError(f"inventory not found: {path} (named by {origin})")
    return paths


def _configured() -> tuple[list[Path], str] | None:
    env = os.environ.get("ANSIBLE_INVENTORY")
    if env:
        return _path_list(env, Path.cwd()), "ANSIBLE_INVENTORY"
    for cfg in _config_files():
        if not cfg.is_file():
            continue
        parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
        try:
            parser.read(cfg)
        except configparser.Error as exc:
            raise InventoryError(f"{cfg}: cannot read ansible.cfg: {exc}") from None
        value = parser.get("defaults", "inventory", fallback=None)
        # Ansible reads only the first ansible.cfg it finds: the search stops here.
        return (_path_list(value, cfg.parent), str(cfg)) if value else None
    return None


def _config_files() -> list[Path]:
    """ansible.cfg files in Ansible's order, with the project's before the user's own."""
    candidates = []
    if os.environ.get("ANSIBLE_CONFIG"):
        candidates.append(Path(os.path.expanduser(os.environ["ANSIBLE_CONFIG"])))
    return [
        *candidates,
        Path.cwd() / "ansible.cfg",
        project_dir() / "ansible.cfg",
        Path.home() / ".ansible.cfg",
        Path("/etc/ansible/ansible.cfg"),
    ]


def _path_list(value: str, base: Path) -> list[Path]:
    """A comma-separated list of paths (Ansible's pathlist), relative ones from ``base``."""
    paths = []
    for part in value.split(","):
        if part.strip():
            path = Path(os.path.expanduser(part.strip()))
            paths.append(path if path.is_absolute() else base / path)
    return paths
