"""An Ansible host turned into a checked Host record: its variables templated by Ansible first,
then judged on the values a play would see (address, port, user, key file; umprov's and the
roles' variables by their argument_specs types and the value rules). Every fault is one line
naming the file and line the value came from, and the template when there was one.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from umprov.errors import InventoryError
from umprov.inventory.ansible_io import Parsed, first_line
from umprov.inventory.model import Host
from umprov.inventory.rules import ValueRules
from umprov.inventory.specs import (
    VarSpec,
    is_ascii_number,
    plain,
    short,
    too_big,
    type_name,
    type_ok,
)

_TEMPLATE = ("{{", "{%")
_ADDRESS = ("ansible_host",)
_PORT = ("ansible_port", "ansible_ssh_port")
_USER = ("ansible_user", "ansible_ssh_user")
_KEY_FILE = ("ansible_ssh_private_key_file", "ansible_private_key_file")
_UNRESOLVED = object()  # a role variable whose template needs what only a play has (facts)


@dataclass(frozen=True)
class Checks:
    """What a host is checked against, loaded once per inventory."""

    specs: Mapping[str, VarSpec]
    prefixes: tuple[str, ...]
    rules: ValueRules
    fallback: str  # where a value came from when Ansible did not record it


class HostVars:
    """One host's variables, each templated on first use, with its origin for messages."""

    def __init__(self, parsed: Parsed, name: str, all_vars: dict[str, Any], fallback: str) -> None:
        self.parsed, self.name, self.all_vars, self.fallback = parsed, name, all_vars, fallback

    def where(self, key: str) -> str:
        return origin(self.all_vars.get(key)) or self.fallback

    def raw(self, key: str) -> Any:
        return self.all_vars.get(key)

    def first(self, keys: Iterable[str]) -> str | None:
        return next((k for k in keys if self.all_vars.get(k) is not None), None)

    def value(self, key: str, *, strict: bool = True) -> Any:
        """The templated value; a template that fails is an error naming it, or, when not
        ``strict`` and it only lacks a variable a play would have, _UNRESOLVED."""
        from ansible.errors import AnsibleError, AnsibleUndefinedVariable

        raw = self.all_vars.get(key)
        if not is_template(raw):
            return raw
        try:
            return self.parsed.templated(self.all_vars, raw)
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

    def from_template(self, key: str) -> str:
        raw = self.all_vars.get(key)
        return f", from the template {short(raw, 60)!r}" if is_template(raw) else ""


def is_template(value: Any) -> bool:
    """Whether Ansible would template ``value`` (or anything inside it)."""
    if isinstance(value, str):
        return any(mark in value for mark in _TEMPLATE)
    if isinstance(value, Mapping):
        return any(is_template(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(is_template(v) for v in value)
    return False


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


def to_host(parsed: Parsed, ans_host: Any, all_vars: dict[str, Any], checks: Checks) -> Host:
    name = str(ans_host.name)
    hv = HostVars(parsed, name, all_vars, checks.fallback)
    _refuse_replaced_ssh_args(hv)
    address = _address(hv, name)
    port_key = hv.first(_PORT)
    port = _port(hv, port_key) if port_key else 22
    umprov_vars = _umprov_vars(hv, checks)
    user, key_file = (_text(hv, hv.first(keys), what) for keys, what in
                      ((_USER, "user"), (_KEY_FILE, "key file")))
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
    )


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


def _umprov_vars(hv: HostVars, checks: Checks) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in sorted(str(k) for k in hv.all_vars):
        if key.startswith(checks.prefixes):
            found[key] = _checked(hv, key, checks)
    return found


def _checked(hv: HostVars, key: str, checks: Checks) -> Any:
    """One of umprov's or the roles' variables: known, and of its type, choices and rules."""
    spec = checks.specs.get(key)
    where, name = hv.where(key), hv.name
    if spec is None:
        hint = difflib.get_close_matches(key, list(checks.specs), n=1)
        suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise InventoryError(f"{where}: unknown umprov variable '{key}' on host '{name}'"
                             f"{suggestion}")
    if too_big(hv.raw(key)):
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' holds a number too "
                             f"large ({short(hv.raw(key))})")
    value = hv.value(key, strict=spec.owner == "umprov")
    if value is _UNRESOLVED:  # needs facts: Ansible's role validation checks it at run time
        return plain(hv.raw(key))
    templ = hv.from_template(key)
    if too_big(value):
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' holds a number too "
                             f"large ({short(value)}){templ}")
    if not type_ok(value, spec.type):
        typ = spec.type + (" (finite)" if spec.type == "float" else "")
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' must be of type "
                             f"{typ}, not {type_name(value)} ({short(value)}){templ}")
    if spec.choices and plain(value) not in spec.choices:
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' is {short(value)}, "
                             f"expected one of {', '.join(map(str, spec.choices))}{templ}")
    problem = checks.rules.problem(key, value)
    if problem:
        raise InventoryError(f"{where}: variable '{key}' on host '{name}' is "
                             f"{short(value)!r}, {problem}{templ}")
    return plain(value)


def check_duplicates(hosts: Iterable[Host], where: str) -> None:
    seen: dict[tuple[str, int], str] = {}
    for host in hosts:
        key = (host.address.lower(), host.port)
        if key in seen:
            raise InventoryError(f"{where}: hosts '{seen[key]}' and '{host.name}' both use "
                                 f"{host.address}:{host.port}")
        seen[key] = host.name
