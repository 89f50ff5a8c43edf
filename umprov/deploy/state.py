"""What deploy keeps on the control machine for each host, under state_dir().

    tokens/HOST.token       the Jupyter token (0600, in a 0700 folder)
    ssh/HOST.conf           ssh_config for `ssh -F FILE umprov-HOST`, keys checked as umprov does
    connections/HOST.json   what `umprov status --connect` prints, without the token

A host's name becomes a file name and an SSH alias only as it is (umprov.paths.safe_name), and
every value written into an ssh_config is quoted or refused (``config_value``): an inventory
value can neither place a file outside these folders nor add a directive.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

from umprov.deploy.options import HostSettings
from umprov.errors import ConfigError
from umprov.hosts import HostLike, is_loopback
from umprov.hosts.ssh import (
    host_pattern,
    known_hosts_files,
    umprov_known_hosts,
    unpin_host_keys,
)
from umprov.paths import locked, private_dir, safe_name, state_dir, state_file, write_atomic


def host_file(folder: str, host_name: str, suffix: str) -> Path:
    """The file of ``host_name`` in a state folder; a name that cannot be one is refused."""
    try:
        return state_file(folder, host_name, suffix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def token_path(host_name: str) -> Path:
    path = host_file("tokens", host_name, ".token")
    private_dir(path.parent)
    return path


def stored_token(host_name: str) -> str | None:
    try:
        return token_path(host_name).read_text().strip() or None
    except OSError:
        return None


def ssh_config_path(host_name: str) -> Path:
    return host_file("ssh", host_name, ".conf")


CONNECTIONS = "connections"  # the folder of the connection records


def connection_path(host_name: str) -> Path:
    return host_file(CONNECTIONS, host_name, ".json")


def forget(host_name: str) -> list[Path]:
    """Remove what deploy keeps of a host that no longer exists (its token, ssh_config,
    connection record and its container's pinned key), so that `status --connect` offers no
    login to it; the files removed or changed."""
    removed = []
    if unpin_host_keys(_pinned_under(host_name)):
        removed.append(umprov_known_hosts())
    for path in (token_path(host_name), ssh_config_path(host_name), connection_path(host_name)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    _forget_tunnel_port(host_name)
    return removed


def _pinned_under(host_name: str) -> list[str]:
    """The names the host's container key was pinned under (key_patterns), from its record."""
    patterns = [container_alias(host_name)]
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        record = json.loads(connection_path(host_name).read_text())
        if not record["via_host"]:
            patterns.append(host_pattern(record["address"], int(record["ssh_port"])))
    return patterns


def _forget_tunnel_port(host_name: str) -> None:
    path = tunnel_ports_path()
    if not path.is_file():
        return
    with locked(path):
        ports = _tunnel_ports(path)
        if ports.pop(host_name, None) is not None:
            _save_tunnel_ports(path, ports)


def container_alias(host_name: str) -> str:
    try:
        return f"umprov-{safe_name(host_name, 'host name')}"
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def jump_alias(host_name: str) -> str:
    return f"{container_alias(host_name)}-host"


# Needs no quotes in ssh_config; anything else is written in double quotes.
_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+~-]+")
# Not representable in one ssh_config argument, quoted or not: OpenSSH ends or escapes quoting
# at these (a quote, a backslash), a control character ends or breaks the line, and "${"
# is expanded as an environment variable in paths.
_UNWRITABLE = re.compile(r'["\\\x00-\x1f\x7f]|\$\{')


def config_value(value: object, what: str, host_name: str, *, tokens: bool = False) -> str:
    """``value`` as one ssh_config argument: quoted where needed, "%" doubled where OpenSSH
    expands %-tokens (``tokens``); a value that cannot be written is refused, naming it."""
    text = str(value)
    if not text or _UNWRITABLE.search(text):
        raise ConfigError(
            f"{host_name}: {what} {text!r:.100} cannot be written into an ssh_config line "
            "(empty, or a quote, backslash, control character or ${)"
        )
    if tokens:
        text = text.replace("%", "%%")
    elif "%" in text:
        raise ConfigError(f"{host_name}: {what} {text!r:.100} holds a '%', which ssh expands")
    return text if _PLAIN.fullmatch(text) else f'"{text}"'


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

    def value(what: str, text: object, *, tokens: bool = False) -> str:
        return config_value(text, what, host.name, tokens=tokens)

    def known(files: list[Path]) -> str:
        return " ".join(value("known_hosts file", p, tokens=True) for p in files)

    lines = [
        f"# Written by `umprov deploy` for host {host.name}; `umprov status --connect {host.name}`",
        f"Host {alias}",
        f"  HostName {value('address', address, tokens=True)}",
        f"  Port {int(settings.ssh_port)}",
        f"  User {value('container user', login_user)}",
        f"  HostKeyAlias {alias}",
        f"  UserKnownHostsFile {known([umprov_known_hosts()])}",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
    ]
    if identity_file:
        lines += [f"  IdentityFile {value('identity file', identity_file, tokens=True)}",
                  "  IdentitiesOnly yes"]
    if via_host:
        lines.append(f"  ProxyJump {jump_alias(host.name)}")
        lines += [
            "",
            f"Host {jump_alias(host.name)}",
            f"  HostName {value('address (ansible_host)', host.address, tokens=True)}",
            f"  Port {int(host.port)}",
        ]
        if host.user:
            lines.append(f"  User {value('user (ansible_user)', host.user)}")
        if host.key_file:
            what = "key file (ansible_ssh_private_key_file)"
            value(what, host.key_file, tokens=True)  # refused as the inventory gave it
            # Absolute, as Ansible takes it from the working directory: ssh runs from anywhere.
            key = value(what, str(Path(host.key_file).expanduser().absolute()), tokens=True)
            lines += [f"  IdentityFile {key}", "  IdentitiesOnly yes"]
        lines += [
            f"  UserKnownHostsFile {known(known_hosts_files(host))}",
            "  StrictHostKeyChecking yes",
            "  UpdateHostKeys no",
        ]
    return "\n".join(lines) + "\n"


def check_host(host: HostLike, settings: HostSettings, identity_file: str | None) -> None:
    """Before a host is touched: its name can name its files, and its ssh_config can be written
    (the container's user, known only from the image, is checked when the file is written)."""
    connection_path(host.name)
    render_ssh_config(host, settings, "umprov", identity_file)


def record_connection(
    host: HostLike, settings: HostSettings, login_user: str, identity_file: str | None
) -> dict[str, Any]:
    """What `status --connect` needs, without the token (that stays in its own 0600 file)."""
    address, via_host = container_address(host, settings)
    data = {
        "host": host.name,
        "tunnel_port": tunnel_port(host.name),
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
    write_atomic(connection_path(host.name), json.dumps(data, indent=2), 0o600)
    return data


# Local ports for the Jupyter tunnels `status --connect` prints: one per host, so that two
# hosts' tunnels can be open at once; a host keeps its port across deploys. One index file
# holds them all (a deploy over n hosts reads it n times, not n records n times).
TUNNEL_BASE = 18888


def tunnel_ports_path() -> Path:
    return state_dir() / "tunnel-ports.json"


def tunnel_port(host_name: str) -> int:
    """The host's local tunnel port: the one on record, else the lowest free one from
    TUNNEL_BASE that no other host holds."""
    return reserve_tunnel_ports([host_name])[host_name]


def reserve_tunnel_ports(host_names: list[str]) -> dict[str, int]:
    """Each host's tunnel port, those without one given the lowest free ones in the order
    named (a deploy names its hosts in inventory order before any finishes: lab-1 gets
    18888, lab-2 18889, whichever is done first)."""
    path = tunnel_ports_path()
    with locked(path):
        ports = _tunnel_ports(path)
        new = [name for name in dict.fromkeys(host_names) if name not in ports]
        if new:
            used = set(ports.values())
            free = (p for p in range(TUNNEL_BASE, 65536) if p not in used)
            ports.update(zip(new, free, strict=False))
            _save_tunnel_ports(path, ports)
        return {name: ports[name] for name in host_names}


def _tunnel_ports(path: Path) -> dict[str, int]:
    """The index; the first time (or when it is unreadable), rebuilt from the connection
    records, whose ports an older umprov wrote there."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return {str(k): int(v) for k, v in data.items()}
    ports: dict[str, int] = {}
    for record_path in (state_dir() / CONNECTIONS).glob("*.json"):
        # A record of an older umprov may have no tunnel port; an unreadable one holds none.
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
            record = json.loads(record_path.read_text())
            ports[str(record["host"])] = int(record["tunnel_port"])
    return ports


def _save_tunnel_ports(path: Path, ports: dict[str, int]) -> None:
    write_atomic(path, json.dumps(ports, indent=1, sort_keys=True), 0o600)


CONNECTION_KEYS = ("address", "jupyter_port", "via_host", "ssh_config", "alias")


def load_connection(host_name: str) -> dict[str, Any] | None:
    """The record deploy left for ``host_name`` (None: none); a damaged one is a ConfigError
    naming its file."""
    path = connection_path(host_name)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc}); re-run umprov deploy") from None
    wanted = [*CONNECTION_KEYS, *(["jump_alias"] if isinstance(data, dict)
                                  and data.get("via_host") else [])]
    missing = [k for k in wanted if not isinstance(data, dict) or k not in data]
    if missing:
        raise ConfigError(f"{path}: not a connection record (no {missing[0]}); "
                          "re-run umprov deploy")
    return data
