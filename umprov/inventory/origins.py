"""Where a host's variable was set, as ``file:line`` for messages.

ansible-core 2.19 tags every value it loads with its origin, but a bool (or a null) cannot carry
a tag: ``umprov_manged_memory: true`` comes back with no origin. Its key, a string, does carry
one, yet the key object Ansible keeps is the first one merged (the lowest precedence), so it is
right only while the key is set in one place. For such a value the files the host's other
variables came from are read for the key: a setting of this host (its entry in an inventory
file, its host_vars file) before a group's, as Ansible ranks them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

HOST, GROUP = 0, 1  # a setting's scope, the more specific first
_SECTION = re.compile(r"^\s*\[([^\]]+)\]")


def origin(value: Any) -> str | None:
    """'file:line' where Ansible's data tags know it (ansible-core 2.19+), else None."""
    try:
        from ansible.module_utils._internal._datatag import AnsibleTagHelper
    except ImportError:  # older ansible-core: no origin tracking
        return None
    for tag in AnsibleTagHelper.tags(value):
        path, line = getattr(tag, "path", None), getattr(tag, "line_num", None)
        if path:
            return f"{path}:{line}" if line else str(path)
    return None


def variable_origin(key: str, host: str, all_vars: Mapping[str, Any]) -> str | None:
    """Where ``key`` of ``host`` was set: its value's tag, else its setting found in the files
    the host's variables came from, else its key's tag; None when nothing names a file."""
    found = origin(all_vars.get(key))
    if found:
        return found
    keyed = next((origin(k) for k in all_vars if k == key), None)
    settings = sorted(
        ((scope, f"{path}:{line}") for path in origin_files(all_vars)
         for scope, line in settings_in(path, key, host)),
        key=lambda setting: setting[0],
    )
    if not settings:
        return keyed
    best = [where for scope, where in settings if scope == settings[0][0]]
    # Of several group settings the key's tag names the first merged, which the others outrank.
    return next((w for w in best if w != keyed), best[0])


def origin_files(all_vars: Mapping[str, Any]) -> list[str]:
    """The files a host's variables (their values and keys) were read from, first seen first."""
    files: dict[str, None] = {}
    for key, value in all_vars.items():
        for item in (value, key):
            where = origin(item)
            if where:
                files.setdefault(where.rsplit(":", 1)[0] if _has_line(where) else where)
    return list(files)


def _has_line(where: str) -> bool:
    return where.rpartition(":")[2].isdigit()


def settings_in(path: str, key: str, host: str) -> list[tuple[int, int]]:
    """(scope, line) of each setting of ``key`` in the file at ``path`` that applies to ``host``:
    its own entry or host_vars file (HOST), a group's vars or group_vars file (GROUP)."""
    file = Path(path)
    try:
        stamp = file.stat().st_mtime_ns
    except OSError:
        return []
    in_host_vars = "host_vars" in file.parts
    if in_host_vars and host not in (file.name, file.stem, file.parent.name):
        return []
    found = _settings(str(file), stamp, key)
    return [(HOST if in_host_vars else scope, line) for scope, owner, line in found
            if owner in ("", host)]


@lru_cache(maxsize=256)
def _settings(path: str, _stamp: int, key: str) -> tuple[tuple[int, str, int], ...]:
    """(scope, owning host or '', line) of every setting of ``key`` in a YAML or INI file."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ()
    if Path(path).suffix in (".yml", ".yaml", ".json", ""):
        found = _yaml_settings(text, key)
        if found is not None:
            return tuple(found)
    return tuple(_ini_settings(text.splitlines(), key))


def _yaml_settings(text: str, key: str) -> list[tuple[int, str, int]] | None:
    """Settings of ``key`` in a YAML inventory or vars file; None when it is not YAML."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    found: list[tuple[int, str, int]] = []
    for line, path in _key_nodes(root, key, ()):
        if not path or path[-1] == "vars":
            found.append((GROUP, "", line))  # a vars file's top level, or a group's vars:
        elif len(path) >= 2 and path[-2] == "hosts":
            found.append((HOST, path[-1], line))
    return found


def _key_nodes(node: Any, key: str, path: tuple[str, ...]) -> Iterable[tuple[int, tuple[str, ...]]]:
    """(line, the mapping keys above it) of each mapping key ``key`` under ``node``."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        for name_node, value in node.value:
            name = str(name_node.value) if isinstance(name_node, yaml.ScalarNode) else ""
            if name == key:
                yield name_node.start_mark.line + 1, path
            yield from _key_nodes(value, key, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _key_nodes(item, key, path)


def _ini_settings(lines: list[str], key: str) -> Iterable[tuple[int, str, int]]:
    """Settings of ``key`` in an INI inventory: a ``[group:vars]`` line, or a host's line."""
    setting = re.compile(rf"(?:^|\s){re.escape(key)}\s*=")
    section = ""
    for number, line in enumerate(lines, 1):
        header = _SECTION.match(line)
        if header:
            section = header.group(1)
        elif setting.search(line) and not line.lstrip().startswith(("#", ";")):
            if section.endswith(":vars"):
                yield GROUP, "", number
            else:
                yield HOST, line.split()[0], number
