"""Stand-ins shared by the unit tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FakeHost:
    """What umprov reads of an inventory host (umprov.hosts.HostLike), without an inventory."""

    name: str = "gpu1"
    address: str = "10.0.0.5"
    port: int = 22
    user: str | None = "ops"
    key_file: str | None = None
    known_hosts: str | None = None
    vars: dict[str, Any] = field(default_factory=dict)
