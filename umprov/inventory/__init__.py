"""Inventories: found, read by Ansible itself, validated, and turned into Host records.

This is the one place that reads inventories; provision, deploy, verify and status all take
the Host records made here. Ansible reads them exactly as ``ansible-playbook -i`` does: every
source (files, folders, plugin configurations such as ``plugin: constructed``, comma lists),
group_vars/host_vars, precedence, vault-encrypted files and values, and templated variables.
umprov then checks what Ansible does not: addresses, ports, duplicate endpoints, the names and
types of umprov's and the roles' variables (argument_specs) and their value rules.

    model.py       Host, Inventory (select: Ansible's --limit patterns), InventoryRequest
    sources.py     which sources: a command line's, or ansible.cfg's
    vault.py       vault passwords, gathered as ansible-playbook gathers them
    ansible_io.py  Ansible's InventoryManager, VariableManager, Templar; errors naming files
    specs.py       variable definitions and types (UMPROV_VARIABLES + argument_specs)
    rules.py       value rules (roles/gpu_preflight/files/value_rules.yml), shared with the play
    container_env.py  the container's environment (umprov_env, deploy --env): its rules
    values.py      the container's image, name, GPUs and bind address (and deploy's options)
    validate.py    one Ansible host -> one checked Host; every problem listed at once
    origins.py     where a variable was set (file:line), a bool's too
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from umprov.errors import InventoryError
from umprov.inventory.model import Host, Inventory, InventoryRequest
from umprov.inventory.rules import check_format, value_rules
from umprov.inventory.sources import is_host_list, resolve_source, resolve_sources
from umprov.inventory.specs import (
    UMPROV_PREFIX,
    UMPROV_VARIABLES,
    VarSpec,
    deployed_container,
    flag,
    umprov_prefixes,
    variable_specs,
)
from umprov.inventory.vault import Vault, resolve_vault

__all__ = [
    "UMPROV_PREFIX", "UMPROV_VARIABLES", "Host", "Inventory", "InventoryRequest", "VarSpec",
    "Vault", "check_format", "deployed_container", "flag", "is_host_list", "load_inventory",
    "resolve_source", "resolve_sources", "umprov_prefixes", "value_rules", "variable_specs",
]


def load_inventory(
    request: InventoryRequest | str | Sequence[str] | None, *, roles_dir: Path | None = None,
    extra: Sequence[Mapping[str, Any] | Path] = (),
) -> Inventory:
    """Find, read and validate an inventory; raise InventoryError with one line on a fault.
    ``extra``: the -e variables in order (KEY=VALUE mappings, @FILE paths), over every host's
    own as ansible-playbook puts them, and checked as the inventory's are."""
    from umprov.inventory.ansible_io import Parsed
    from umprov.inventory.validate import ENDPOINT, Checks, duplicates, listed, to_host

    request = as_request(request)
    sources = resolve_sources(request.sources)
    vault = resolve_vault(request.vault_ids, request.vault_password_files,
                          request.ask_vault_pass, request.prompt)
    given, origins = _extra_vars(extra, vault)
    parsed = Parsed(sources, vault)
    specs = variable_specs(roles_dir)
    checks = Checks(specs, umprov_prefixes(specs), value_rules(roles_dir), ", ".join(sources),
                    origins)
    hosts: list[Host] = []
    problems: list[tuple[str, str]] = []  # (host, message): every one is reported at once
    for ans_host in parsed.hosts():
        # a vars file that cannot be read ends it here
        all_vars = {**parsed.host_vars(ans_host), **given}
        try:
            hosts.append(to_host(parsed, ans_host, all_vars, checks))
        except InventoryError as exc:
            problems.extend((str(ans_host.name), line) for line in exc.lines())
    if not origins.keys() & ENDPOINT:  # -e gives every host one address: Ansible's way
        problems.extend(("", line) for line in duplicates(hosts, checks.fallback))
    if problems:
        first, *more = listed(problems)
        raise InventoryError(first, more=more)
    return Inventory(sources=sources, hosts=tuple(hosts), vault=vault, matcher=parsed.matching)


def _extra_vars(extra: Sequence[Mapping[str, Any] | Path], vault: Vault
                ) -> tuple[dict[str, Any], dict[str, str]]:
    """The -e variables merged as ansible-playbook merges them (a later one wins), and where
    each came from ("-e" or "-e @FILE") for messages."""
    from ansible.template import trust_as_template

    from umprov.inventory.ansible_io import load_vars_file

    def trusted(value: Any) -> Any:  # as ansible-playbook's own -e: templates are templated
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, Mapping):
            return {k: trusted(v) for k, v in value.items()}
        return [trusted(v) for v in value] if isinstance(value, list) else value

    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for item in extra:
        values = load_vars_file(item, vault) if isinstance(item, Path) else trusted(dict(item))
        merged.update(values)
        origins.update(dict.fromkeys(values, f"-e @{item}" if isinstance(item, Path) else "-e"))
    return merged, origins


def as_request(request: InventoryRequest | str | Sequence[str] | None) -> InventoryRequest:
    """An INVENTORY given as a request, one source, several, or none (ansible.cfg's)."""
    if isinstance(request, InventoryRequest):
        return request
    if request is None or request == "":
        return InventoryRequest()
    if isinstance(request, str | Path):
        return InventoryRequest(sources=(str(request),))
    return InventoryRequest(sources=tuple(str(s) for s in request))
