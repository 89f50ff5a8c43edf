"""`umprov inventory check`: validate an inventory and show its hosts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from umprov.cli.options import inventory_options, json_option
from umprov.errors import ExitCode
from umprov.output import emit_json, print_table

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest


@click.group()
def inventory() -> None:
    """Inspect inventories."""


@inventory.command("check")
@inventory_options()
@json_option
def check(inventory: InventoryRequest, as_json: bool) -> int:
    """Validate INVENTORY and list its hosts.

    INVENTORY is what ansible-playbook -i takes (a YAML or INI file, a plugin configuration,
    a folder with group_vars/host_vars, a comma list such as gpu1,gpu2,), or a name under
    inventory/; -i adds more sources; without any, the inventory that ansible.cfg names.
    Variables are templated and vault-encrypted files decrypted as Ansible does.

    \b
    Example:
      umprov inventory check inventory/hosts.yml --json
      umprov inventory check -i site/ -i extra.yml --vault-password-file ~/.vault-pass
    """
    from umprov.inventory import load_inventory

    inv = load_inventory(inventory)
    if as_json:
        emit_json({"source": inv.source, "sources": list(inv.sources),
                   "hosts": [h.to_dict() for h in inv.hosts]})
    else:
        rows = [
            (h.name, h.address, h.port, h.user or "", ",".join(h.groups), len(h.vars))
            for h in inv.hosts
        ]
        print_table(
            f"{inv.source}: {len(inv.hosts)} host(s), valid",
            ["host", "address", "port", "user", "groups", "umprov vars"],
            rows,
        )
    return ExitCode.OK
