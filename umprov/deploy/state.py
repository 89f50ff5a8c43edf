"""What deploy keeps on the control machine for each host, under state_dir().

    tokens/HOST.token       the Jupyter token (0600, in a 0700 folder)
    ssh/HOST.conf           ssh_config for `ssh -F FILE umprov-HOST`, keys checked as umprov does
    connections/HOST.json   what `umprov status --connect` prints, without the token
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

from umprov.deploy.options import HostSettings
from umprov.hosts import HostLike, is_loopback
from umprov.hosts.ssh import host_pattern, known_hosts_files, umprov_known_hosts
from umprov.paths import private_dir, state_dir, write_atomic


def token_path(host_name: str) -> Path:
    return private_dir(state_dir() / "tokens") / f"{host_name}.token"


def stored_token(host_name: str) -> str | None:
    try:
        return token_path(host_name).read_text().strip() or None
    except OSError:
        return None


def ssh_config_path(host_name: str) -> Path:
    return state_dir() / "ssh" / f"{host_name}.conf"


def container_alias(host_name: str) -> str:
    return f"umprov-{host_name}"


def jump_alias(host_name: str) -> str:
    return f"umprov-{host_name}-host"


def container_address(host: HostLike, settings: HostSettings) -> tuple[str, bool]:
    """(address the published ports are reached at, whether through the host via SSH)."""
    if is_loopback(settings.bind):
        return settings.bind, True
    if ipaddress.ip_address(settings.bind).is_unspecified:
        return host.address, False
    return settings.bind, False


def key_patterns(host: HostLike, settings: HostSettings) -> list[str]:
    """Names the container's host key is pinned under: the alias, and its real address when
    that address means the same container from anywhere (not a host's loopback)."""
    address, via_host = container_address(host, settings)
    patterns = [container_alias(host.name)]
    if not via_host:
        patterns.append(host_pattern(address, settings.ssh_port))
    return patterns


def render_ssh_config(
    host: HostLike, settings: HostSettings, login_user: str, identity_file: str | None
) -> str:
    """An ssh_config for `ssh -F FILE umprov-HOST`, checking keys exactly as umprov does."""
    address, via_host = container_address(host, settings)
    alias = container_alias(host.name)
    lines = [
        f"# Written by `umprov deploy` for host {host.name}; `umprov status --connect {host.name}`",
        f"Host {alias}",
        f"  HostName {address}",
        f"  Port {settings.ssh_port}",
        f"  User {login_user}",
        f"  HostKeyAlias {alias}",
        f"  UserKnownHostsFile {umprov_known_hosts()}",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
    ]
    if identity_file:
        lines += [f"  IdentityFile {identity_file}", "  IdentitiesOnly yes"]
    if via_host:
        lines.append(f"  ProxyJump {jump_alias(host.name)}")
        files = " ".join(str(p) for p in known_hosts_files(host))
        lines += [
            "",
            f"Host {jump_alias(host.name)}",
            f"  HostName {host.address}",
            f"  Port {host.port}",
        ]
        if host.user:
            lines.append(f"  User {host.user}")
        if host.key_file:
            lines += [f"  IdentityFile {host.key_file}", "  IdentitiesOnly yes"]
        lines += [
            f"  UserKnownHostsFile {files}",
            "  StrictHostKeyChecking yes",
            "  UpdateHostKeys no",
        ]
    return "\n".join(lines) + "\n"


def record_connection(
    host: HostLike, settings: HostSettings, login_user: str, identity_file: str | None
) -> dict[str, Any]:
    """What `status --connect` needs, without the token (that stays in its own 0600 file)."""
    address, via_host = container_address(host, settings)
    data = {
        "host": host.name,
        "container": settings.name,
        "user": login_user,
        "address": address,
        "ssh_port": settings.ssh_port,
        "jupyter_port": settings.jupyter_port,
        "via_host": via_host,
        "ssh_config": str(ssh_config_path(host.name)),
        "alias": container_alias(host.name),
        "jump_alias": jump_alias(host.name) if via_host else None,
    }
    write_atomic(
        state_dir() / "connections" / f"{host.name}.json", json.dumps(data, indent=2), 0o600
    )
    return data


def load_connection(host_name: str) -> dict[str, Any] | None:
    path = state_dir() / "connections" / f"{host_name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())
