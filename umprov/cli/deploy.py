"""`umprov deploy`: the PyTorch container with SSH and Jupyter on every host of an inventory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from umprov.cli.options import (
    fan_out_width,
    forks_option,
    inventory_options,
    json_option,
    limit_option,
)
from umprov.hosts import render
from umprov.hosts.progress import size_text
from umprov.output import emit_json, print_outcomes, say, say_problems, say_untrusted

if TYPE_CHECKING:
    from umprov.hosts.results import HostOutcome
    from umprov.inventory import InventoryRequest


@click.command()
@inventory_options()
@limit_option()
@click.option("--image", metavar="IMAGE", help="Image to run (default: the host's umprov_image, "
              "else the tag `umprov image build` gives).")
@click.option("--pull", is_flag=True,
              help="Pull the image from its registry on each host (a private registry's CA: "
              "docker_engine_registry_ca_certs; credentials: this machine's docker login).")
@click.option("--push", is_flag=True,
              help="Stream the image from this machine (docker save over SSH into docker load); "
              "hosts that have the same image ID are skipped, and layers a host already holds "
              "are left out of its stream.")
@click.option("--gpus", metavar="all|none|0,1", help="GPUs for the container (default: the host's "
              "umprov_gpus, else all).")
@click.option("--ssh-port", type=int, help="Host port for SSH into the container (default 2222).")
@click.option("--jupyter-port", type=int, help="Host port for Jupyter (default 8888).")
@click.option("--bind", metavar="ADDRESS", help="Host address the ports are published on "
              "(default 127.0.0.1: reach them through the host over SSH; any other address "
              "makes SSH and Jupyter reachable from the network, and deploy warns).")
@click.option("--authorized-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Public key allowed to log in (default: the host's umprov_authorized_key, "
              "else ~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub).")
@click.option("--name", metavar="NAME", help="Container name (default: umprov).")
@click.option("--shm-size", default="16g", show_default=True, help="Shared memory size for NCCL.")
@click.option("--force", is_flag=True,
              help="Replace the container even when its spec is unchanged.")
@click.option("--trust-new-hosts", is_flag=True,
              help="Record the host keys of hosts never seen before (first contact only; a "
              "changed key is still refused).")
@click.option("--allow-agent-forwarding", is_flag=True,
              help="Let `ssh -A` forward your SSH agent into the container (off by default: "
              "root in the container could use your keys while you are logged in).")
@click.option("--managed-memory/--no-managed-memory", default=None,
              help="PyTorch in the container allocates CUDA managed memory, so a job may use "
              "more than the GPU's memory (default: the host's umprov_managed_memory, else off; "
              "docs/managed-memory.md).")
@click.option("--env", "env", metavar="KEY=VALUE", multiple=True,
              help="An environment variable for the container, over the host's umprov_env "
              "(repeatable); --env KEY takes KEY's value from this shell, which keeps a secret "
              "off the command line. Part of the container's spec: a change replaces it.")
@forks_option
@json_option
def deploy(
    inventory: InventoryRequest,
    limit: str | None,
    image: str | None,
    pull: bool,
    push: bool,
    gpus: str | None,
    ssh_port: int | None,
    jupyter_port: int | None,
    bind: str | None,
    authorized_key: Path | None,
    name: str | None,
    shm_size: str,
    force: bool,
    trust_new_hosts: bool,
    allow_agent_forwarding: bool,
    managed_memory: bool | None,
    env: tuple[str, ...],
    forks: int | None,
    as_json: bool,
) -> int:
    """Run the PyTorch container (SSH + Jupyter) on every host, in parallel.

    Re-running with the same settings changes nothing; changed settings replace the container.

    \b
    umprov deploy inventory/hosts.yml --image umprov/pytorch-cuda:0.1.0 --push
    umprov deploy lab/demo --push --gpus none --limit lab-demo-1
    umprov status --connect lab-demo-1      # ssh command and Jupyter URL
    """
    import os

    from umprov.deploy.options import (
        DeployOptions,
        checked,
        network_exposure,
        parse_env,
        settings_for_all,
    )
    from umprov.errors import ConfigError
    from umprov.hosts.results import exit_code
    from umprov.inventory import load_inventory

    if push and pull:
        raise ConfigError("--push and --pull: choose one way to deliver the image")
    opts = checked(DeployOptions(
        image=image,
        delivery="push" if push else "pull" if pull else "none",
        gpus=gpus,
        ssh_port=ssh_port,
        jupyter_port=jupyter_port,
        bind=bind,
        name=name,
        shm_size=shm_size,
        force=force,
        trust_new=trust_new_hosts,
        agent_forwarding=allow_agent_forwarding,
        managed_memory=managed_memory,
        env=parse_env(env, os.environ),
    ), authorized_key)
    hosts = list(load_inventory(inventory).select(limit))
    settings_for_all(hosts, opts)  # every host's values, before any host is contacted
    for warning in network_exposure(hosts, opts):
        say(f"umprov: {warning}")
    local_client = None
    if opts.delivery == "push":
        from umprov.hosts.engine import local_engine

        local_client = local_engine()

    from umprov.cli._progress import HostProgress
    from umprov.deploy.run import deploy as run_deploy

    started = time.monotonic()
    with HostProgress([h.name for h in hosts]) as progress:
        results = run_deploy(hosts, opts, progress=progress, local_client=local_client,
                             forks=fan_out_width(forks, len(hosts)))
    elapsed = time.monotonic() - started
    code = exit_code(results)
    if as_json:
        from umprov.deploy.outcome import HOST_FIELDS

        emit_json({
            "ok": code == 0,
            "exit_code": int(code),
            "seconds": round(elapsed, 2),
            "hosts": render.records(results, HOST_FIELDS),
        })
    print_outcomes(f"deploy: {len(results)} host(s) in {elapsed:.1f} s", results, COLUMNS)
    say_problems(results)
    say_untrusted(results)
    return int(code)


def push_cell(outcome: HostOutcome) -> str:
    """What the push to a host took: bytes, time, the transfer's rate apart from the load."""
    data = outcome.data
    sent = data["pushed_bytes"]
    if not sent:
        return ""
    cell = f"{size_text(sent)} in {data['push_seconds']:.0f} s"
    stream = data["push_stream_seconds"]
    rate = sent / stream / 1e6 if stream else 0.0
    if rate >= 1:
        # The transfer and the host's docker load, which registers the layers after it.
        cell += f": sent at {rate:.0f} MB/s, loaded in {data['push_seconds'] - stream:.0f} s"
    skipped = data["skipped_bytes"]
    if skipped:
        cell += f" ({skipped / 1e6:.0f} MB already on the host)"
    return cell


def message_cell(outcome: HostOutcome) -> str:
    """The host's message (a failure, or why it was replaced) and its warnings."""
    return "; ".join(m for m in (outcome.detail, *outcome.data["warnings"]) if m)


COLUMNS: list[render.Field] = [
    ("host", render.host),
    ("status", render.state),
    ("container", lambda o: (o.data["container_id"] or "")[:12]),
    ("ssh", lambda o: o.data["ssh"] or ""),
    ("jupyter", lambda o: o.data["jupyter"] or ""),
    ("managed memory", render.managed_memory),
    ("push", push_cell),
    ("message", message_cell),
]
