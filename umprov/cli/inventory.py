"""`umprov inventory check`: validate an inventory and show its hosts."""

from __future__ import annotations

import click

from umprov.cli.options import inventory_argument, json_option
from umprov.errors import ExitCode
from umprov.output import emit_json, print_table


@click.group()
def inventory() -> None:
    """Inspect inventories."""


@inventory.command("check")
@inventory_argument
@json_option
def check(inventory: str | None, as_json: bool) -> int:
    """Validate INVENTORY and list its hosts.

    INVENTORY is what ansible-playbook -i takes (a YAML or INI file, or a folder with
    group_vars/host_vars), or a name under inventory/; without it, the inventory that
    ansible.cfg names.

    \b
    Example:
      umprov inventory check inventory/hosts.yml --json
    """
    from umprov.inventory import load_inventory

    inv = load_inventory(inventory)
    if as_json:
        emit_json({"source": str(inv.source), "hosts": [h.to_dict() for h in inv.hosts]})
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
