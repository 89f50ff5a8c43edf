"""`umprov status`: each host's engine, GPUs and deployed container, at a glance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from umprov.cli.options import (
    fan_out_width,
    forks_option,
    inventory_options,
    json_option,
    limit_option,
    not_blank,
)
from umprov.errors import ExitCode
from umprov.hosts import render
from umprov.output import emit_json, print_outcomes, say_problems, say_untrusted

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "-")


def _ports(ports: dict[str, list[str]] | None) -> str:
    return " ".join(f"{k}->{','.join(v)}" for k, v in (ports or {}).items()) or "-"


COLUMNS: list[render.Field] = [
    ("host", render.host),
    ("reachable", lambda o: _yes_no(o.ok)),
    ("driver", lambda o: o.data.get("driver") or "-"),
    ("docker", lambda o: o.data.get("docker") or "-"),
    ("nvidia rt", lambda o: _yes_no(o.data.get("nvidia_runtime"))),
    ("container", lambda o: o.data.get("state") or "-"),
    ("health", lambda o: o.data.get("health") or "-"),
    ("image", lambda o: o.data.get("image") or "-"),
    ("ports", lambda o: _ports(o.data.get("ports"))),
    ("gpus", lambda o: o.data.get("container_gpus", o.data.get("host_gpus", "-"))),
    ("jupyter", lambda o: _yes_no(o.data.get("jupyter"))),
    ("managed memory", lambda o: render.managed_memory(o) or "-"),
    ("error", render.detail),
]


@click.command()
@inventory_options()
@limit_option()
@click.option("--name", metavar="NAME", help="Container name (default: umprov).")
@click.option("--connect", "connect_host", metavar="HOST", callback=not_blank,
              help="Print the ssh command and the Jupyter URL WITH its token for HOST.")
@click.option("--trust-new-hosts", is_flag=True, help="Record keys of hosts never seen before.")
@forks_option
@json_option
def status(
    inventory: InventoryRequest,
    limit: str | None,
    name: str | None,
    connect_host: str | None,
    trust_new_hosts: bool,
    forks: int | None,
    as_json: bool,
) -> int:
    """Per host: reachable, driver, Docker, nvidia runtime, container state, health, Jupyter.

    \b
    umprov status inventory/hosts.yml
    umprov status --connect gpu1     # prints the Jupyter token: for your eyes only
    """
    if connect_host is not None:
        from umprov.status import connect_info, connect_text

        if as_json:
            emit_json(connect_info(connect_host))
        else:
            click.echo(connect_text(connect_host))
        return ExitCode.OK
    from umprov.deploy.options import check_container_name
    from umprov.hosts.results import exit_code
    from umprov.inventory import load_inventory
    from umprov.status import HOST_FIELDS, probe

    if name is not None:
        check_container_name(name, "--name")
    hosts = list(load_inventory(inventory).select(limit))
    outcomes = probe(hosts, name, trust_new=trust_new_hosts,
                     forks=fan_out_width(forks, len(hosts)))
    if as_json:
        emit_json({"hosts": render.records(outcomes, HOST_FIELDS)})
    print_outcomes("status", outcomes, COLUMNS)
    say_problems(outcomes)
    say_untrusted(outcomes)
    return exit_code(outcomes)
