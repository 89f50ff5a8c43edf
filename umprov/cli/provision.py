"""`umprov provision`: run the playbooks with live progress and a per-host summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from umprov.cli.options import (
    ask_become_password,
    inventory_options,
    json_option,
    limit_option,
)
from umprov.hosts import render
from umprov.output import emit_json, print_outcomes, say, say_untrusted

if TYPE_CHECKING:
    from umprov.inventory import Inventory, InventoryRequest

ONLY = ("preflight", "driver", "docker", "toolkit")
COLUMNS: list[render.Field] = [
    ("host", render.host),
    ("status", render.state),
    *render.data_fields("ok", "changed", "failed", "unreachable"),
    ("notes", lambda o: "; ".join(o.data["notes"]) or o.detail),
]


@click.command()
@inventory_options()
@limit_option()
@click.option(
    "--only",
    type=click.Choice(ONLY),
    multiple=True,
    help="Run only this component (repeatable); the preflight checks always run.",
)
@click.option("--check", is_flag=True, help="Dry run: report what would change.")
@click.option("--diff", is_flag=True, help="Show file and template differences.")
@click.option(
    "-e", "--extra-vars", "extra", multiple=True, metavar="KEY=VALUE|@FILE",
    help="Set a variable, or every variable of a YAML or JSON file (repeatable; later wins).",
)
@click.option("-K", "--ask-become-pass", "--ask-become-password", "ask_become_pass",
              is_flag=True, help="Ask for the privilege escalation (sudo) password; it reaches "
              "ansible-playbook through a private file, never a command line.")
@click.option("--trust-new-hosts", is_flag=True,
              help="Record the host keys of hosts never seen before (first contact only; a "
              "changed key is still refused).")
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
@click.option("--rolling", is_flag=True, help="Roll the driver/toolkit change over the hosts in "
              "batches, each host drained, changed, verified and resumed only on a pass "
              "(playbooks/rolling.yml; docs/slurm.md).")
@click.option("--canary", type=click.IntRange(min=1), metavar="N",
              help="With --rolling: hosts in the first batch (default 1).")
@click.option("--batch", metavar="N|N%|N,N...",
              help="With --rolling: hosts in each later batch, a count or a percent (default 25%); "
                   "a list (3,4) gives the batches in turn, the last size repeated.")
@click.option("--max-fail-percent", "max_fail", type=click.IntRange(0, 100), metavar="P",
              help="With --rolling: stop when more than P% of a batch fails (default 0).")
@click.option("--verify", "verify_mode", type=click.Choice(["passive", "quick", "full"]),
              help="With --rolling: the gate after each host's change (default quick).")
@click.option("--drain-timeout", type=click.IntRange(min=0), metavar="S",
              help="With --rolling: seconds to wait for a held node's jobs (default 3600).")
@json_option
def provision(
    inventory: InventoryRequest,
    limit: str | None,
    only: tuple[str, ...],
    check: bool,
    diff: bool,
    extra: tuple[str, ...],
    ask_become_pass: bool,
    trust_new_hosts: bool,
    forks: int | None,
    playbook: str,
    strategy: str,
    rolling: bool,
    canary: int | None,
    batch: str | None,
    max_fail: int | None,
    verify_mode: str | None,
    drain_timeout: int | None,
    as_json: bool,
) -> int:
    """Install NVIDIA drivers, Docker and the NVIDIA Container Toolkit on INVENTORY.

    Runs playbooks/site.yml through ansible-runner. Exit code 0 when every host converged,
    10 when a host failed, 6 when a host's SSH key is unknown or changed, 11 when a host was
    unreachable. OpenSSH checks host keys against the known_hosts files every umprov command
    uses (umprov trust records there).

    \b
    Examples:
      umprov provision hosts
      umprov provision lab/demo --only docker --check --diff
      umprov provision -i site/ --ask-vault-pass -K -e @overrides.yml
      umprov provision hosts --rolling --batch 25% -e nvidia_driver_version=580.95.05
    """
    from umprov import provision as prov
    from umprov.cli._progress import ProvisionProgress
    from umprov.inventory import load_inventory
    from umprov.paths import Secret

    extra_vars = prov.parse_extra(extra)  # a bad pair fails before anything is read
    variables = rolling_options(rolling, check=check, playbook=playbook, only=only, canary=canary,
                                batch=batch, max_fail=max_fail, verify=verify_mode,
                                drain_timeout=drain_timeout)
    inv = load_inventory(inventory, extra=extra_vars)  # -e values checked as the inventory's
    become = None
    if ask_become_pass or prov.become_ask_pass_configured():
        become = Secret(ask_become_password())
    hosts = inv.select(limit)
    prov.playbook_path(playbook)  # a bad playbook or strategy stops before keys are recorded
    prov.resolve_strategy(strategy)
    if trust_new_hosts:
        from umprov.hosts.ssh import record_new_host_keys

        record_new_host_keys(hosts)
    if rolling:
        return run_rolling(inv, hosts, variables, limit=limit, extra=extra_vars,
                           become_password=become, forks=forks, strategy=strategy,
                           as_json=as_json)
    tags = ["preflight", *only] if only else []
    with ProvisionProgress(hosts) as progress:
        result = prov.run_playbook(
            inv,
            playbook=playbook,
            limit=limit,
            tags=tags,
            check=check,
            diff=diff,
            extra=extra_vars,
            become_password=become,
            forks=forks,
            on_event=progress.update,
            strategy=strategy,
        )
    summarize(result, check=check, as_json=as_json)
    return int(result.exit_code)


def summarize(result: Any, *, check: bool, as_json: bool) -> None:
    """A run's JSON on stdout (asked for), its table and the failures the table had no room
    for on stderr."""
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
    say_untrusted(result.hosts)


def rolling_options(rolling: bool, *, check: bool, playbook: str, only: tuple[str, ...],
                    **given: Any) -> dict[str, Any]:
    """The playbook variables of --rolling's options; ConfigError (exit 4) for a bad mix."""
    from umprov.errors import ConfigError
    from umprov.inventory import check_format
    from umprov.rolling import rolling_vars

    named = {"canary": "--canary", "batch": "--batch", "max_fail": "--max-fail-percent",
             "verify": "--verify", "drain_timeout": "--drain-timeout"}
    if not rolling:
        stray = [flag for key, flag in named.items() if given[key] is not None]
        if stray:
            raise ConfigError(f"{', '.join(stray)}: only with --rolling")
        return {}
    if check:
        raise ConfigError("--rolling cannot be a dry run (--check): it drains, changes, "
                          "verifies and resumes each host")
    if playbook != "site.yml":
        raise ConfigError("--rolling runs playbooks/rolling.yml; --playbook does not apply")
    if given["batch"] is not None:
        given["batch"] = check_format("batch", given["batch"], "--batch")
    return rolling_vars(only=only, **given)


def run_rolling(inv: Inventory, hosts: list[Any], variables: dict[str, Any], *,
                as_json: bool, **options: Any) -> int:
    """playbooks/rolling.yml with progress, then what each batch did; an interrupt first
    says how it left the hosts it reached."""
    from umprov import rolling
    from umprov.cli._progress import ProvisionProgress
    from umprov.verify.bundle import agent_zipapp

    rollout = rolling.Rollout()
    try:
        with ProvisionProgress(hosts) as progress:
            result = rolling.run_rolling(inv, rollout, agent=str(agent_zipapp()),
                                         variables=variables, on_event=progress.update,
                                         **options)
    except BaseException:
        lines = rolling.interrupted_lines(rollout)
        for line in lines:
            say(f"umprov: rollout stopped: {line}")
        if lines:
            say("umprov: a re-run continues where this one stopped")
        raise
    if as_json:
        emit_json(result.to_dict())
    for title, outcomes in result.batch_outcomes():
        print_outcomes(f"rolling {title}", outcomes, rolling.COLUMNS)
    say(f"rolling: {len(result.hosts)} host(s) in {len(result.batches)} of "
        f"{max(len(result.batches), len(result.planned))} batch(es), {result.elapsed_s:.0f} s")
    stopped = result.stopped_by_budget()
    if stopped:
        say(f"umprov: {stopped}")
    say_untrusted(result.hosts)
    return int(result.exit_code)
