"""An Ansible host turned into a checked Host record: its variables templated by Ansible first,
then judged on the values a play would see (address, port, user, key file; umprov's and the
roles' variables by their argument_specs types and the value rules). Every fault is one line
naming the file and line the value came from, and the template when there was one.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from umprov.errors import InventoryError
from umprov.inventory.ansible_io import Parsed, first_line
from umprov.inventory.container_env import env_problem
from umprov.inventory.model import Host
from umprov.inventory.origins import variable_origin
from umprov.inventory.rules import ValueRules, did_you_mean
from umprov.inventory.specs import (
    VarSpec,
    flag,
    is_ascii_number,
    plain,
    short,
    too_big,
    type_name,
    type_ok,
)
from umprov.inventory.values import value_problem

_TEMPLATE = ("{{", "{%")
_ADDRESS = ("ansible_host",)
_PORT = ("ansible_port", "ansible_ssh_port")
ENDPOINT = frozenset(_ADDRESS + _PORT)  # the variables a host's address and port are read from
_USER = ("ansible_user", "ansible_ssh_user")
_KEY_FILE = ("ansible_ssh_private_key_file", "ansible_private_key_file")
_CONNECTION = _ADDRESS + _PORT + _USER + _KEY_FILE  # what umprov reads to reach a host
_UNRESOLVED = object()  # a role variable whose template needs what only a play has (facts)
_SOME_HOST = "host '\0'"  # a message's host, while alike messages are merged
_WHERE = re.compile(r"^(?P<path>[^:\s]+)(?::(?P<line>\d+))?:")
T = TypeVar("T")


@dataclass(frozen=True)
class Checks:
    """What a host is checked against, loaded once per inventory."""

    specs: Mapping[str, VarSpec]
    prefixes: tuple[str, ...]
    rules: ValueRules
    fallback: str  # where a value came from when Ansible did not record it
    given: Mapping[str, str] = field(default_factory=dict)  # -e variables: where each came from


class HostVars:
    """One host's variables, each templated on first use, with its origin for messages."""

    def __init__(self, parsed: Parsed, name: str, all_vars: dict[str, Any], checks: Checks) -> None:
        self.parsed, self.name, self.all_vars = parsed, name, all_vars
        self.fallback, self.given = checks.fallback, checks.given

    def where(self, key: str) -> str:
        return (self.given.get(key) or variable_origin(key, self.name, self.all_vars)
                or self.fallback)

    def raw(self, key: str) -> Any:
        return self.all_vars.get(key)

    def first(self, keys: Iterable[str]) -> str | None:
        return next((k for k in keys if self.all_vars.get(k) is not None), None)

    def value(self, key: str, *, strict: bool = True) -> Any:
        """The templated value, inline vault values decrypted; a template that fails is an
        error naming it, or, when not ``strict`` and it only lacks a variable a play would
        have, _UNRESOLVED."""
        from ansible.errors import AnsibleError, AnsibleUndefinedVariable

        raw = self.all_vars.get(key)
        if not is_template(raw):
            return _revealed(raw)
        try:
            return _revealed(self.parsed.templated(self.all_vars, raw))
        except AnsibleUndefinedVariable as exc:
            if not strict:
                return _UNRESOLVED
            problem, error = "uses a variable that is not defined", exc
        except AnsibleError as exc:
            problem, error = "cannot be templated", exc
        raise InventoryError(
            f"{self.where(key)}: variable '{key}' on host '{self.name}' {problem}: "
            f"{short(raw, 60)!r} ({first_line(error)})"
        ) from None

    def shown(self, key: str, value: Any) -> str:
        """``value`` as a message may show it: never a secret's (umprov_env's, or a value
        that was vault-encrypted in the inventory or an -e file)."""
        if key in SECRET_VARIABLES or _vaulted(self.all_vars.get(key)):
            return "<hidden>"
        return short(value)

    def from_template(self, key: str) -> str:
        raw = self.all_vars.get(key)
        return f", from the template {short(raw, 60)!r}" if is_template(raw) else ""


SECRET_VARIABLES = {"umprov_env"}  # the container's environment: tokens, passwords


def _vaulted(value: Any) -> bool:
    from ansible.parsing.vault import EncryptedString

    if isinstance(value, EncryptedString):
        return True
    if isinstance(value, Mapping):
        return any(_vaulted(v) for v in value.values())
    return isinstance(value, list | tuple) and any(_vaulted(v) for v in value)


def _revealed(value: Any) -> Any:
    """Inline vault values (``!vault``) as the text they hold, as a play would see them."""
    from ansible.parsing.vault import EncryptedString

    if isinstance(value, EncryptedString):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _revealed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(v) for v in value]
    return value


def is_template(value: Any) -> bool:
    """Whether Ansible would template ``value`` (or anything inside it)."""
    if isinstance(value, str):
        return any(mark in value for mark in _TEMPLATE)
    if isinstance(value, Mapping):
        return any(is_template(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(is_template(v) for v in value)
    return False


class Problems:
    """One host's problems, gathered so that all of them are reported at once."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def attempt(self, check: Callable[..., T], *args: Any) -> T | None:
        """``check(*args)``; an InventoryError it raises is kept, and None returned."""
        try:
            return check(*args)
        except InventoryError as exc:
            self.found.extend(exc.lines())
            return None


def to_host(parsed: Parsed, ans_host: Any, all_vars: dict[str, Any], checks: Checks) -> Host:
    """The checked Host; an InventoryError listing every problem of the host otherwise."""
    name = str(ans_host.name)
    hv = HostVars(parsed, name, all_vars, checks)
    problems = Problems()
    problems.attempt(_refuse_replaced_ssh_args, hv)
    problems.attempt(_refuse_misspelt_connection, hv)
    address = problems.attempt(_address, hv, name)
    port_key = hv.first(_PORT)
    port = problems.attempt(_port, hv, port_key) if port_key else 22
    ours = sorted(str(k) for k in hv.all_vars if str(k).startswith(checks.prefixes))
    umprov_vars = {key: problems.attempt(_checked, hv, key, checks) for key in ours}
    user, key_file = (problems.attempt(_text, hv, hv.first(keys), what) for keys, what in
                      ((_USER, "user"), (_KEY_FILE, "key file")))
    if problems.found or address is None or port is None:
        raise InventoryError(problems.found[0], more=problems.found[1:])
    known = umprov_vars.get("umprov_known_hosts")
    return Host(
        name=name,
        address=address,
        port=port,
        user=user,
        key_file=None if key_file is None else local_path(key_file),
        groups=tuple(sorted(str(g.name) for g in ans_host.get_groups() if g.name != "all")),
        known_hosts=None if known is None else local_path(str(known)),
        vars=umprov_vars,
        secret=frozenset(k for k in ours if _vaulted(hv.raw(k))),
    )


def listed(problems: Iterable[tuple[str, str]]) -> list[str]:
    """(host, message) problems as a linter lists them: by file and line, and one line for a
    setting that fails alike on several hosts (a group's), naming them."""
    hosts_of: dict[str, list[str]] = {}
    for host, message in problems:
        hosts_of.setdefault(message.replace(f"host '{host}'", _SOME_HOST), []).append(host)
    return sorted((_naming(message, hosts) for message, hosts in hosts_of.items()),
                  key=_position)


def _naming(message: str, hosts: list[str]) -> str:
    if len(hosts) == 1:
        return message.replace(_SOME_HOST, f"host '{hosts[0]}'")
    names = ", ".join(f"'{h}'" for h in hosts[:3])
    more = f" and {len(hosts) - 3} more" if hosts[3:] else ""
    return message.replace(_SOME_HOST, f"hosts {names}{more}")


def _position(message: str) -> tuple[str, int]:
    """The file and line a message starts with, for sorting (messages without come last)."""
    found = _WHERE.match(message)
    if not found:
        return ("\uffff", 0)
    return (found.group("path"), int(found.group("line") or 0))


def local_path(path: str) -> str:
    """A path on this machine as Ansible's ssh connection and argument specs take one: ``~``
    expanded, a relative one from the working directory (where ansible-playbook runs)."""
    return os.path.abspath(os.path.expanduser(path))


def _address(hv: HostVars, name: str) -> str:
    key = "ansible_host"
    value = hv.value(key) if hv.raw(key) is not None else name
    shown = f"{short(value)}{hv.from_template(key)}"
    if isinstance(value, bool | Mapping | list | tuple) or too_big(value):
        raise InventoryError(f"{hv.where(key)}: host '{name}' has address {shown}, "
                             "expected a host name or IP address")
    address = "" if value is None else str(value).strip()
    if not address:
        raise InventoryError(f"{hv.where(key)}: host '{name}' has an empty address"
                             f"{hv.from_template(key)}")
    if any(c.isspace() or not c.isprintable() for c in address):
        raise InventoryError(f"{hv.where(key)}: host '{name}' has address {address!r}, which "
                             f"holds spaces or control characters{hv.from_template(key)}")
    return address


def _refuse_replaced_ssh_args(hv: HostVars) -> None:
    """A host variable ``ansible_ssh_args`` outranks the ANSIBLE_SSH_ARGS through which
    provision makes OpenSSH check host keys against umprov's files: refused rather than let
    one host be trusted differently from what status, deploy and verify check."""
    key = "ansible_ssh_args"
    if hv.raw(key) is not None:
        raise InventoryError(
            f"{hv.where(key)}: host '{hv.name}' sets {key}, which would replace the options "
            "umprov checks host keys with; put them in ansible_ssh_common_args instead"
        )


def _refuse_misspelt_connection(hv: HostVars) -> None:
    """A near miss of a variable a host is reached by (``ansbile_host``, ``ansible_usr``):
    Ansible takes it as any other variable and connects by the host's name, as its user."""
    for key in map(str, hv.all_vars):
        meant = _connection_meant(key)
        if meant:
            raise InventoryError(f"{hv.where(key)}: host '{hv.name}' sets '{key}', which "
                                 f"Ansible does not read (did you mean '{meant}'?)")


@cache
def _connection_meant(key: str) -> str | None:
    """The connection variable ``key`` is a near miss of; None for Ansible's own names."""
    from ansible import constants  # loaded already: the inventory came through Ansible

    known = {n for names in constants.MAGIC_VARIABLE_MAPPING.values() for n in names}
    if key in known or not 8 <= len(key) <= 32:
        return None
    close = difflib.get_close_matches(key, _CONNECTION, n=1, cutoff=0.9)
    return close[0] if close else None


def _port(hv: HostVars, key: str) -> int:
    value = hv.value(key)
    if isinstance(value, bool):
        raise InventoryError(f"{hv.where(key)}: host '{hv.name}' has port {value!r}, not a number")
    text = "0" if too_big(value) else str(value).strip()
    if not is_ascii_number(text) or not 1 <= int(text) <= 65535:
        raise InventoryError(
            f"{hv.where(key)}: host '{hv.name}' has port '{short(value)}', "
            f"expected a number from 1 to 65535{hv.from_template(key)}"
        )
    return int(text)


def _text(hv: HostVars, key: str | None, what: str) -> str | None:
    if key is None:
        return None
    value = hv.value(key)
    if isinstance(value, bool | Mapping | list | tuple) or too_big(value):
        raise InventoryError(f"{hv.where(key)}: host '{hv.name}' has {what} {short(value)}, "
                             f"expected a string{hv.from_template(key)}")
    return None if value is None else str(value)


def _checked(hv: HostVars, key: str, checks: Checks) -> Any:
    """One of umprov's or the roles' variables: known, and of its type, choices and rules."""
    spec = checks.specs.get(key)
    where, name = hv.where(key), hv.name
    if spec is None:
        raise InventoryError(f"{where}: unknown umprov variable '{key}' on host '{name}'"
                             f"{did_you_mean(key, checks.specs)}")
    if too_big(hv.raw(key)):
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' holds a number too "
                             f"large ({hv.shown(key, hv.raw(key))})")
    value = hv.value(key, strict=spec.owner == "umprov")
    if value is _UNRESOLVED:  # needs facts: Ansible's role validation checks it at run time
        return plain(hv.raw(key))
    templ = hv.from_template(key)
    if too_big(value):
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' holds a number too "
                             f"large ({hv.shown(key, value)}){templ}")
    if not type_ok(value, spec.type):
        typ = spec.type + (" (finite)" if spec.type == "float" else "")
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' must be of type "
                             f"{typ}, not {type_name(value)} ({hv.shown(key, value)}){templ}")
    if spec.choices and plain(value) not in spec.choices:
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' is "
                             f"{hv.shown(key, value)}, expected one of "
                             f"{', '.join(map(str, spec.choices))}{templ}")
    problem = checks.rules.problem(key, value)
    if problem:
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' is "
                             f"{hv.shown(key, value)!r}, {problem}{templ}")
    problem = value_problem(key, plain(value), f"variable '{key}' on host '{name}'")
    if problem:  # deploy's own check of the value (umprov/inventory/values.py)
        raise InventoryError(f"{where}: {problem}{templ}")
    problem = _container_env_problem(hv, key, value)
    if problem:  # never the value itself: it may hold secrets
        raise InventoryError(f"{where}: variable '{key}' on host '{name}': {problem}{templ}")
    return plain(value)


def _container_env_problem(hv: HostVars, key: str, value: Any) -> str | None:
    """umprov_env against the container environment's rules, with the host's
    umprov_managed_memory (umprov/inventory/container_env.py)."""
    if key != "umprov_env":
        return None
    managed = hv.value("umprov_managed_memory", strict=False)
    return env_problem(plain(value), managed is not _UNRESOLVED and flag(plain(managed), False))


def duplicates(hosts: Iterable[Host], where: str) -> list[str]:
    """A line for each host whose address and port another host uses already."""
    seen: dict[tuple[str, int], str] = {}
    problems: list[str] = []
    for host in hosts:
        key = (host.address.lower(), host.port)
        if key in seen:
            problems.append(f"{where}: hosts '{seen[key]}' and '{host.name}' both use "
                            f"{host.address}:{host.port}")
        else:
            seen[key] = host.name
    return problems
