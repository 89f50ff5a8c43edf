"""`umprov trust`: check a host's SSH key fingerprint and record it on confirmation."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from umprov.cli.options import (
    fan_out_width,
    forks_option,
    inventory_options,
    json_option,
    not_blank,
)
from umprov.hosts import HostLike
from umprov.output import emit_json, say

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest


@dataclass(frozen=True)
class _Target:
    name: str
    address: str
    port: int
    known_hosts: str | None = None
    user: str | None = None  # not needed to read a key: it asks for no login
    key_file: str | None = None


def _parse_address(text: str) -> _Target | None:
    """ADDRESS, ADDRESS:PORT or [ADDRESS]:PORT, as known_hosts writes them."""
    match = re.fullmatch(r"\[(?P<a>[^\]]+)\]:(?P<p>\d+)|(?P<b>[^:\s]+)(?::(?P<q>\d+))?", text)
    if not match:
        return None
    address = match.group("a") or match.group("b")
    port = int(match.group("p") or match.group("q") or 22)
    return _Target(text, address, port) if 1 <= port <= 65535 else None


@click.command()
@click.argument("host", callback=not_blank)
@inventory_options(positional=False)
@click.option("--yes", "-y", is_flag=True, help="Record without asking (scripted use).")
@forks_option
@json_option
def trust(host: str, inventory: InventoryRequest, yes: bool, forks: int | None,
          as_json: bool) -> int:
    """Show a host's SSH key fingerprint and record it in umprov's known_hosts if confirmed.

    With -i, HOST is a name or group pattern of that inventory; without, an address:
    ADDRESS, ADDRESS:PORT or [ADDRESS]:PORT. Compare the fingerprint with one read on the
    host's console (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) before saying yes. A
    key that differs from one already recorded is refused, never replaced. Every command
    (provision's OpenSSH included) checks keys against the file this records in.

    \b
    umprov trust gpu1 -i inventory/hosts.yml
    umprov trust '[10.0.0.5]:2222' --yes
    """
    from umprov.errors import ConfigError, ExitCode, TrustError
    from umprov.hosts.ssh import presented_key, record_host_key

    targets: list[HostLike]
    if inventory.sources:
        from umprov.inventory import load_inventory

        targets = list(load_inventory(inventory).select(host))
    else:
        parsed = _parse_address(host)
        if parsed is None:
            raise ConfigError(f"'{host}' is not an address (ADDRESS, ADDRESS:PORT with a port "
                              "from 1 to 65535, [ADDRESS]:PORT); pass --inventory to use host "
                              "names")
        targets = [parsed]
    from umprov.hosts.fanout import Parallel

    # Every host's key read at once (--forks at a time); the questions come one by one.
    pool = Parallel(fan_out_width(forks, len(targets)))
    keys = pool.map(presented_key, targets, "trust") if targets else []
    report = []
    for target, shown in zip(targets, keys, strict=True):
        pattern = shown.pattern
        entry = {"host": target.name, "endpoint": pattern, "key": shown.label}
        if shown.known:
            say(f"{target.name} ({pattern}): already trusted, {shown.label}")
            report.append({**entry, "recorded": False, "already_known": True})
            continue
        say(f"{target.name} ({pattern}) presents {shown.label}")
        if not yes and not sys.stdin.isatty():
            raise TrustError(
                f"not recorded: {pattern} presents {shown.label} and there is no terminal to "
                "confirm on; check the fingerprint, then pass --yes"
            )
        if not yes and not click.confirm("Trust this key and record it?", err=True, default=False):
            say("not recorded")
            report.append({**entry, "recorded": False, "already_known": False})
            continue
        path = record_host_key(pattern, shown.key)
        say(f"recorded in {path}")
        report.append({**entry, "recorded": True, "already_known": False})
    if as_json:
        emit_json({"hosts": report})
    untrusted = [r for r in report if not r["recorded"] and not r["already_known"]]
    return ExitCode.TRUST if untrusted else ExitCode.OK
