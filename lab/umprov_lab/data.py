"""The lab's files shipped as package data: the host set-up script (host/), the registry's
configuration, the stand-in packages' contents (repo/). Some hold ``@NAME@`` placeholders,
filled in when they are used."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from importlib.resources.abc import Traversable

_PLACEHOLDER = re.compile(r"@[A-Z][A-Z_]*@")


def path(relative: str) -> Traversable:
    return resources.files("umprov_lab").joinpath(*relative.split("/"))


def read(relative: str) -> str:
    return path(relative).read_text(encoding="utf-8")


def render(relative: str, **values: str) -> str:
    """The file with its placeholders filled (``fill``)."""
    return fill(read(relative), values, relative)


def fill(text: str, values: dict[str, str], where: str) -> str:
    """``text`` with each ``@NAME@`` replaced by ``values[NAME]``; every placeholder must be
    given, so a file and the code that fills it cannot drift apart unnoticed."""
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    left = _PLACEHOLDER.search(text)
    if left:
        raise ValueError(f"{where}: no value for {left.group(0)}")
    return text


def digest(folder: str) -> str:
    """A hash of every file under ``folder``, names included: changes when any of them does."""
    sha = hashlib.sha256()
    for name, item in sorted(_files(path(folder), folder)):
        sha.update(name.encode() + b"\0" + item.read_bytes() + b"\0")
    return sha.hexdigest()


def _files(folder: Traversable, prefix: str) -> list[tuple[str, Traversable]]:
    found = []
    for item in folder.iterdir():
        name = f"{prefix}/{item.name}"
        if item.is_dir():
            if item.name != "__pycache__":
                found += _files(item, name)
        else:
            found.append((name, item))
    return found
