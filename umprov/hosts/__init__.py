"""Reaching hosts: everything umprov's commands share to work on many hosts at once.

    ssh.py       SSH trust: known_hosts files, verified connections, `umprov trust`'s scan
    engine.py    the docker SDK over a verified connection, this machine's engine, one-line
                 engine errors, a command in a container under a deadline, tar helpers
    fanout.py    per-host work in parallel threads that an interrupt stops within seconds
    progress.py  the per-host progress callback and its no-op
    results.py   one host's outcome, and the exit code of a set of them
    render.py    outcomes as table rows and JSON records

Heavy libraries (paramiko, docker) are imported inside the functions that need them.
"""

from __future__ import annotations

from typing import Protocol


class HostLike(Protocol):
    """What the host layer needs of umprov.inventory.Host."""

    name: str
    address: str
    port: int
    user: str | None
    key_file: str | None
    known_hosts: str | None


def is_loopback(address: str) -> bool:
    """Whether an address (or the name localhost) is this machine's own: reached through the
    host, never from elsewhere."""
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
