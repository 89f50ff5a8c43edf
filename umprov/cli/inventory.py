"""`umprov inventory check`: validate an inventory and show its hosts; `umprov inventory
init`: write the example inventory to start from."""

from __future__ import annotations

from pathlib import Path
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


@inventory.command("init")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default="inventory")
def init(folder: Path) -> int:
    """Write the example inventory into FOLDER (default: inventory): hosts.yml, with its groups
    and hosts under example.com to replace, and group_vars/all.yml, every role variable at its
    default. Nothing is overwritten: a file already there stops it before anything is written.

    \b
    Example:
      umprov inventory init site && umprov inventory check site
    """
    import contextlib
    import shutil

    from umprov.errors import ConfigError
    from umprov.paths import content_file

    files = {"hosts.yml": content_file("inventory", "hosts.yml"),
             "group_vars/all.yml": content_file("inventory", "group_vars", "all.yml")}
    there = [name for name in files if (folder / name).exists()]
    if there:
        raise ConfigError(f"{folder / there[0]}: already exists; umprov inventory init "
                          "overwrites nothing (choose another folder)")
    written = [d for d in (folder, folder / "group_vars") if not d.exists()]  # made here
    try:
        for name, source in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, folder / name)
            written.append(folder / name)
    except OSError as exc:  # a file where a folder goes, a read-only place: leave nothing
        for path in reversed(written):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        raise ConfigError(f"{exc.filename or folder}: cannot write the example inventory "
                          f"there ({exc.strerror or exc})") from None
    click.echo(f"wrote {folder / 'hosts.yml'} and {folder / 'group_vars' / 'all.yml'}: put your "
               f"hosts in, then: umprov inventory check {folder}", err=True)
    return ExitCode.OK
