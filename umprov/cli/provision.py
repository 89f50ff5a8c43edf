"""`umprov provision`: run the playbooks with live progress and a per-host summary."""

from __future__ import annotations

import click

from umprov.cli.options import inventory_argument, json_option
from umprov.hosts import render
from umprov.output import emit_json, print_outcomes, say

ONLY = ("preflight", "driver", "docker", "toolkit")
COLUMNS: list[render.Field] = [
    ("host", render.host),
    ("status", render.state),
    *render.data_fields("ok", "changed", "failed", "unreachable"),
    ("notes", lambda o: "; ".join(o.data["notes"]) or o.detail),
]


@click.command()
@inventory_argument
@click.option("--limit", "-l", help="Only these hosts or groups (Ansible pattern).")
@click.option(
    "--only",
    type=click.Choice(ONLY),
    multiple=True,
    help="Run only this component (repeatable); the preflight checks always run.",
)
@click.option("--check", is_flag=True, help="Dry run: report what would change.")
@click.option("--diff", is_flag=True, help="Show file and template differences.")
@click.option(
    "-e", "--extra-vars", "extra", multiple=True, metavar="KEY=VALUE", help="Set a variable."
)
@click.option("--forks", type=click.IntRange(1, 1000), help="Hosts handled in parallel.")
@click.option(
    "--playbook", default="site.yml", show_default=True, help="Playbook under playbooks/."
)
@click.option(
    "--strategy",
    type=click.Choice(["auto", "mitogen", "linear"]),
    default="auto",
    show_default=True,
    help="Ansible strategy: mitogen (faster; needs the mitogen package), linear (Ansible's own, "
    "tuned), auto (mitogen when installed, else linear).",
)
@json_option
def provision(
    inventory: str | None,
    limit: str | None,
    only: tuple[str, ...],
    check: bool,
    diff: bool,
    extra: tuple[str, ...],
    forks: int | None,
    playbook: str,
    strategy: str,
    as_json: bool,
) -> int:
    """Install NVIDIA drivers, Docker and the NVIDIA Container Toolkit on INVENTORY.

    Runs playbooks/site.yml through ansible-runner. Exit code 0 when every host converged,
    10 when a host failed, 11 when a host was unreachable.

    \b
    Examples:
      umprov provision hosts
      umprov provision lab/demo --only docker --check --diff
    """
    from umprov import provision as prov
    from umprov.cli._progress import ProvisionProgress
    from umprov.inventory import load_inventory

    inv = load_inventory(inventory)
    extra_vars = prov.parse_extra_vars(extra)
    tags = ["preflight", *only] if only else []
    with ProvisionProgress(inv.select(limit) if limit else inv.hosts) as progress:
        result = prov.run_playbook(
            inv,
            playbook=playbook,
            limit=limit,
            tags=tags,
            check=check,
            diff=diff,
            extra_vars=extra_vars,
            forks=forks,
            on_event=progress.update,
            strategy=strategy,
        )
    if as_json:
        emit_json(result.to_dict())
    mode = " (check mode)" if check else ""
    print_outcomes(
        f"provision{mode}: {result.playbook} on {len(result.hosts)} host(s) in "
        f"{result.elapsed_s:.0f} s ({result.strategy})",
        result.hosts,
        COLUMNS,
    )
    for h in result.hosts:
        if h.detail and h.data["notes"]:  # the notes took the failure's cell
            say(f"{h.host}: {h.detail}")
    return int(result.exit_code)
