"""SSH trust, in one place: paramiko clients, host-key checking, umprov's known_hosts.

Rules this module keeps for every SSH connection umprov makes:

- Host keys are checked against known_hosts files: the host's own (inventory variable
  ``umprov_known_hosts``, which the lab writes), the user's ``~/.ssh/known_hosts``, and umprov's
  ``state_dir()/known_hosts`` (keys recorded by ``umprov trust`` and pinned container keys).
- An unknown host is refused with a message saying how to trust it; trusting on first use
  happens only when asked (``umprov trust`` after showing the fingerprint, or
  ``--trust-new-hosts``), and the key is then recorded in umprov's own file.
- A key that differs from the recorded one is always refused, loudly. Nothing here replaces a
  recorded host key on its own, except pinning a container's key that was read through an
  already verified connection (``pin_host_key``).

``umprov.hosts.engine.docker_client`` runs the docker SDK over one of these verified
connections.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from umprov.errors import AuthFailed, ConfigError, TrustError, UmprovError, Unreachable
from umprov.hosts import HostLike
from umprov.paths import locked, state_dir, write_private

if TYPE_CHECKING:
    import paramiko

CONNECT_TIMEOUT = 15.0


# ---------------------------------------------------------------------------------------------
# known_hosts files and patterns


def umprov_known_hosts() -> Path:
    """umprov's own known_hosts: keys recorded by `umprov trust` and pinned container keys."""
    return state_dir() / "known_hosts"


def user_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def known_hosts_files(host: HostLike | None = None) -> list[Path]:
    """The files checked for a host, in order: the host's own, the user's, umprov's."""
    files: list[Path] = []
    if host is not None and host.known_hosts:
        files.append(Path(host.known_hosts).expanduser().absolute())  # from any folder
    files += [user_known_hosts(), umprov_known_hosts()]
    return files


def host_pattern(address: str, port: int) -> str:
    """The name a key is recorded under in known_hosts (as OpenSSH and paramiko look it up)."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_label(key: paramiko.PKey) -> str:
    kind = key.get_name().removeprefix("ssh-").upper()
    return f"{kind} {fingerprint(key)}"


def load_known_hosts(files: Iterable[Path]) -> paramiko.HostKeys:
    """One HostKeys holding the entries of every readable file (missing files are skipped)."""
    import paramiko

    keys = paramiko.HostKeys()
    for path in files:
        if path.is_file():
            try:
                keys.load(str(path))
            except (OSError, paramiko.SSHException) as exc:
                raise TrustError(f"cannot read known_hosts file {path}: {exc}") from None
    return keys


@dataclass(frozen=True)
class KeyCheck:
    """How a server's key compares with what known_hosts holds for its name."""

    state: str  # "known", "unknown" or "changed"
    expected: list[paramiko.PKey]


def check_key(known: paramiko.HostKeys, pattern: str, key: paramiko.PKey) -> KeyCheck:
    entries = known.lookup(pattern)
    if entries is None or len(entries) == 0:
        return KeyCheck("unknown", [])
    recorded = [entries[k] for k in entries.keys()]  # noqa: SIM118 (HostKeys' own mapping)
    if any(r == key for r in recorded):
        return KeyCheck("known", recorded)
    return KeyCheck("changed", recorded)


def files_holding(pattern: str, files: Iterable[Path]) -> list[Path]:
    """The known_hosts files that have an entry for ``pattern``."""
    found = []
    for path in files:
        if path.is_file() and load_known_hosts([path]).lookup(pattern):
            found.append(path)
    return found


# What a known_hosts name may hold: no space, comma, newline or "#" (which would end the name or
# the line, or add another entry) and no wildcard or negation ("*", "?", "!": a pattern that
# would match other hosts); "[name]:port" as OpenSSH writes a port other than 22.
_KNOWN_HOSTS_NAME = re.compile(r"(?:\[[A-Za-z0-9._:%-]+\]:[0-9]+|[A-Za-z0-9._:%-]+)", re.ASCII)


def _entry(patterns: list[str], key: paramiko.PKey) -> str:
    for pattern in patterns:
        if not _KNOWN_HOSTS_NAME.fullmatch(pattern):
            raise ConfigError(f"{pattern!r:.80} cannot be recorded as a known_hosts name")
    return f"{','.join(patterns)} {key.get_name()} {key.get_base64()}"


def record_host_key(pattern: str, key: paramiko.PKey, path: Path | None = None) -> Path:
    """Add a trusted key for a host never seen before (refuses to overwrite a different key)."""
    path = path or umprov_known_hosts()
    with locked(path):
        current = load_known_hosts([path])
        check = check_key(current, pattern, key)
        if check.state == "known":
            return path
        if check.state == "changed":
            raise TrustError(
                f"{path} already holds a different key for {pattern}; refusing to add another"
            )
        text = path.read_text() if path.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        write_private(path, text + _entry([pattern], key) + "\n")
    return path


def pinned_keys(pattern: str, path: Path | None = None) -> list[str]:
    """The keys ("TYPE BASE64") recorded under ``pattern`` in umprov's known_hosts file."""
    path = path or umprov_known_hosts()
    if not path.is_file():
        return []
    keys = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#") and pattern in fields[0].split(","):
            keys.append(f"{fields[1]} {fields[2]}")
    return keys


def pin_host_key(patterns: list[str], key_line: str, path: Path | None = None) -> Path:
    """Pin a container's host key (read through a verified connection) under ``patterns``.

    Entries for these patterns are replaced: the key came from the container itself over an
    authenticated channel, so it is the truth, e.g. after the key volume was recreated.
    """
    import paramiko

    path = path or umprov_known_hosts()
    fields = key_line.split()
    if len(fields) < 2:
        raise UmprovError(f"not an SSH public key: {key_line[:40]!r}")
    try:
        key = paramiko.PKey.from_type_string(fields[0], base64.b64decode(fields[1]))
    except (ValueError, paramiko.SSHException) as exc:
        raise UmprovError(f"not an SSH public key ({exc})") from None
    with locked(path):
        kept = _lines_without(path, set(patterns))
        kept.append(_entry(patterns, key))
        write_private(path, "\n".join(kept) + "\n")
    return path


def unpin_host_keys(patterns: list[str], path: Path | None = None) -> bool:
    """Drop the keys pinned under ``patterns`` (a container that is gone for good); whether
    any was there."""
    path = path or umprov_known_hosts()
    if not path.is_file():
        return False
    with locked(path):
        lines = path.read_text().splitlines()
        kept = _lines_without(path, set(patterns))
        if len(kept) != len(lines):
            write_private(path, "\n".join(kept) + "\n" if kept else "")
    return len(kept) != len(lines)


def _lines_without(path: Path, patterns: set[str]) -> list[str]:
    """The known_hosts file's lines but those of entries naming one of ``patterns``."""
    kept = []
    for line in path.read_text().splitlines() if path.exists() else []:
        comment = not line or line.startswith("#")
        names = [] if comment else line.split(" ", 1)[0].split(",")
        if not patterns.intersection(names):
            kept.append(line)
    return kept


# ---------------------------------------------------------------------------------------------
# Connecting


def _unknown_message(pattern: str, key: paramiko.PKey, host_name: str) -> str:
    return (
        f"host key for {pattern} is not known ({key_label(key)}); run `umprov trust {host_name}` "
        "to check and record it, or pass --trust-new-hosts"
    )


def _changed_message(pattern: str, key: paramiko.PKey, check: KeyCheck, files: list[Path]) -> str:
    where = ", ".join(str(p) for p in files_holding(pattern, files)) or "known_hosts"
    expected = ", ".join(key_label(k) for k in check.expected)
    return (
        f"HOST KEY CHANGED for {pattern}: it presents {key_label(key)} but {where} records "
        f"{expected}; refusing to connect (possible man-in-the-middle). If the host was "
        "reinstalled, remove the old entry and run `umprov trust` again"
    )


def _verifying_policy(
    files: list[Path], host_name: str, trust_new: bool
) -> paramiko.MissingHostKeyPolicy:
    """A policy for keys paramiko did not find: refuse, or record when trust_new was asked."""
    import paramiko

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
            if not trust_new:
                raise TrustError(_unknown_message(hostname, key, host_name))
            # First contact, explicitly asked for: record in umprov's own file.
            record_host_key(hostname, key)

    return _Policy()


def _transport_factory() -> Any:
    """paramiko's Transport preferring AES-GCM: an AEAD cipher needs no separate MAC pass, which
    makes bulk transfers (image push) about a quarter faster; the rest of the list is unchanged,
    so servers without GCM still negotiate as before."""
    import paramiko

    class _Transport(paramiko.Transport):
        _preferred_ciphers = (
            "aes128-gcm@openssh.com",
            "aes256-gcm@openssh.com",
            *(c for c in paramiko.Transport._preferred_ciphers if "gcm" not in c),
        )

    return _Transport


def connect(host: HostLike, *, trust_new: bool = False, timeout: float = CONNECT_TIMEOUT) -> Any:
    """An authenticated paramiko.SSHClient to ``host`` whose host key has been verified."""
    import paramiko

    files = known_hosts_files(host)
    client = paramiko.SSHClient()
    known = load_known_hosts(files)
    for name in known.keys():  # noqa: SIM118
        for key_type, key in known[name].items():
            client.get_host_keys().add(name, key_type, key)
    client.set_missing_host_key_policy(_verifying_policy(files, host.name, trust_new))
    pattern = host_pattern(host.address, host.port)
    kwargs: dict[str, Any] = {
        "hostname": host.address,
        "port": host.port,
        "username": host.user or getpass.getuser(),
        "timeout": timeout,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
        "allow_agent": host.key_file is None,
        "look_for_keys": host.key_file is None,
        "transport_factory": _transport_factory(),
    }
    if host.key_file:
        kwargs["key_filename"] = os.path.expanduser(host.key_file)
    try:
        client.connect(**kwargs)
    except paramiko.BadHostKeyException as exc:
        client.close()
        check = check_key(known, pattern, exc.key)
        raise TrustError(_changed_message(pattern, exc.key, check, files)) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthFailed(
            f"{host.name}: SSH login as {kwargs['username']}@{pattern} refused ({exc})"
        ) from None
    except (TrustError, UmprovError):
        client.close()
        raise
    except (OSError, paramiko.SSHException, EOFError) as exc:
        client.close()
        reason = plain_reason(exc) or type(exc).__name__
        raise Unreachable(f"{host.name}: cannot reach {pattern} over SSH ({reason})") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(30)
    return client


# What paramiko and Mitogen put before an SSH failure's own words: "[Errno None] Unable to
# connect to port 22 on 10.0.0.5" (paramiko's NoValidConnectionsError, whose errno is None) and
# "EOF on stream; last 100 lines received: ..." (the connection closed before a reply).
_ERRNO_NONE = re.compile(r"\[Errno None\]\s*")
_EOF_ON_STREAM = re.compile(r"EOF on stream(?:; last \d+ lines received:)?\s*")


def plain_reason(text: object) -> str:
    """An SSH failure's text on one line, without the transport's prefixes that tell a user
    nothing ("[Errno None]"), and an early EOF said as what it is."""
    line = _ERRNO_NONE.sub("", " ".join(str(text).split()))
    eof = _EOF_ON_STREAM.search(line)
    if eof:
        said = line[eof.end():].strip()
        line = (line[:eof.start()] + "the connection closed before the host answered"
                + (f"; it said: {said}" if said else ""))
    return line


def scan_host_key(address: str, port: int, timeout: float = CONNECT_TIMEOUT) -> paramiko.PKey:
    """The host key a server presents (no authentication; for `umprov trust` to show)."""
    import paramiko

    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        raise Unreachable(f"cannot reach {host_pattern(address, port)}: {plain_reason(exc)}"
                          ) from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise Unreachable(f"{host_pattern(address, port)} did not speak SSH: "
                          f"{plain_reason(exc) or type(exc).__name__}") from None
    finally:
        transport.close()


def run_command(client: Any, command: str, *, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run a command on an SSH connection; (exit status, stdout, stderr)."""
    _stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
    out = stdout.read().decode(errors="replace")
    err = stderr.read().decode(errors="replace")
    return stdout.channel.recv_exit_status(), out, err


@dataclass(frozen=True)
class Presented:
    """A host's key as its server presents it (for `umprov trust` to show), against what
    the known_hosts files record."""

    pattern: str
    key: paramiko.PKey
    known: bool  # recorded already; otherwise unknown (a changed key raises)

    @property
    def label(self) -> str:
        return key_label(self.key)


def presented_key(host: HostLike) -> Presented:
    """The key ``host``'s server presents, checked against its known_hosts files; a key that
    differs from the recorded one is refused (TrustError), never offered for recording."""
    pattern = host_pattern(host.address, host.port)
    files = known_hosts_files(host)
    key = scan_host_key(host.address, host.port)
    check = check_key(load_known_hosts(files), pattern, key)
    if check.state == "changed":
        raise TrustError(_changed_message(pattern, key, check, files))
    return Presented(pattern, key, check.state == "known")


def untrusted_message(host: HostLike) -> str:
    """What every umprov command says of a host whose key was refused (by paramiko here, or
    by OpenSSH under ansible-playbook): the key is read again to say whether it is unknown or
    changed, and which it is."""
    try:
        shown = presented_key(host)
    except TrustError as exc:
        return str(exc)
    except UmprovError as exc:  # gone meanwhile: what OpenSSH said is all there is
        return f"{host.name}: SSH host key refused ({exc})"
    if shown.known:  # recorded since (another run, `umprov trust`): worth a retry
        return f"{host.name}: SSH host key refused, but {shown.pattern} is trusted now; run again"
    return _unknown_message(shown.pattern, shown.key, host.name)


def record_new_host_keys(hosts: Iterable[HostLike]) -> list[str]:
    """--trust-new-hosts for a command whose SSH is OpenSSH's (provision): each host never
    seen before has its key recorded in umprov's known_hosts; a changed key is refused
    (TrustError) and an unreachable host left for the run to report. The patterns recorded."""
    recorded = []
    for host in hosts:
        try:
            shown = presented_key(host)
        except Unreachable:
            continue
        if not shown.known:
            record_host_key(shown.pattern, shown.key)
            recorded.append(shown.pattern)
    return recorded


# ---------------------------------------------------------------------------------------------
# OpenSSH command lines that keep the same trust


def openssh_options(files: Iterable[Path], *, key_file: str | None = None) -> list[str]:
    """-o options making OpenSSH check keys against exactly umprov's files, never asking."""
    known = " ".join(str(p) for p in files)
    opts = [
        "-o", f"UserKnownHostsFile={known}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UpdateHostKeys=no",
        "-o", "BatchMode=yes",
    ]
    if key_file:
        opts += ["-o", "IdentitiesOnly=yes", "-i", os.path.expanduser(key_file)]
    return opts


def ansible_ssh_args(hosts: Iterable[HostLike], base: str) -> str:
    """ssh_args (ANSIBLE_SSH_ARGS) for ansible-playbook: ``base`` (what it would use anyway)
    and the options that make OpenSSH check keys against the files umprov itself checks (every
    host's own known_hosts, the user's, umprov's), refusing unknown ones. ssh_args come first
    on ssh's command line, and the first value of an option wins there, so an inventory's
    ansible_ssh_common_args (a ProxyJump, say) keeps working without changing whom we trust."""
    import shlex

    files: list[Path] = []
    for host in [*hosts, None]:
        files += [f for f in known_hosts_files(host) if f not in files]
    quoted = " ".join(_ssh_config_word(str(f)) for f in files)
    trust = ["-o", f"UserKnownHostsFile={quoted}", "-o", "StrictHostKeyChecking=yes",
             "-o", "UpdateHostKeys=no"]
    return f"{base} {shlex.join(trust)}".strip()


def _ssh_config_word(text: str) -> str:
    """A path as one word of an ssh_config value: quoted when it holds a space; % and ~ are
    OpenSSH's tokens, so a literal % is doubled."""
    text = text.replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text
