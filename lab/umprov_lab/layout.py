"""What a lab's containers, folders and files are called, and where they live.

Every lab object carries the label ``umprov.lab=NAME``; containers, the network and volumes are
named ``umprov-lab-NAME-...``. The inventory and the lab's private files live in the project
(``inventory/lab/NAME.yml``, ``.lab/NAME/``), both git-ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from umprov.errors import ConfigError
from umprov.paths import project_dir, write_atomic, write_private

LABEL = "umprov.lab"
PREFIX = "umprov-lab"
LAB_USER = "lab"

# Every step reports what it does through one of these (the CLI passes its stderr printer).
Progress = Callable[[str], None]


def quiet(_msg: str) -> None:
    return None


def check_lab_name(name: str) -> str:
    if not name or not all(c.isalnum() or c == "-" for c in name) or name.startswith("-"):
        raise ConfigError(f"lab name '{name}' must be letters, digits and '-' only")
    if len(name) > 24:
        raise ConfigError(f"lab name '{name}' is longer than 24 characters")
    return name


def lab_dir(name: str) -> Path:
    return project_dir() / ".lab" / name


def inventory_path(name: str) -> Path:
    return project_dir() / "inventory" / "lab" / f"{name}.yml"


def network_name(name: str) -> str:
    return f"{PREFIX}-{name}"


def container_name(name: str, role: str | int) -> str:
    """``umprov-lab-NAME-1`` for a host, ``umprov-lab-NAME-repo`` for the repository, ..."""
    return f"{PREFIX}-{name}-{role}"


def host_name(name: str, index: int) -> str:
    """The inventory name of a lab host."""
    return f"lab-{name}-{index}"


def write_if_changed(path: Path, text: str, *, private: bool = False) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    (write_private if private else write_atomic)(path, text)
    return True
