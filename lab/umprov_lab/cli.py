"""`umprov lab up|status|down|image`: the local lab of simulated GPU hosts.

umprov finds this group through the entry point group ``umprov.commands``; only click and
umprov's output helpers load with it, so `umprov --help` stays fast."""

from __future__ import annotations

import click

from umprov.cli.options import json_option
from umprov.output import emit_json, print_table, say

lab_name_option = click.option(
    "--name", default="default", show_default=True, help="Name of the lab (several can coexist)."
)


@click.group()
def lab() -> None:
    """Simulated GPU hosts in local containers (needs a Docker engine)."""


@lab.command("up")
@click.option("--hosts", "count", type=int, default=2, show_default=True, help="Number of hosts.")
@lab_name_option
@click.option("--registry", is_flag=True,
              help="Also run a private registry behind TLS on the lab network (needs Debian's "
                   "docker-registry here); the inventory gives the hosts its CA.")
@click.option("--slurm", is_flag=True,
              help="Also run a Slurm cluster (Debian's slurm-wlm and munge): slurmctld in one "
                   "more container, slurmd on every host; the inventory gets slurm_compute.")
@click.option("--from-image", "base", metavar="IMAGE",
              help="Start new hosts from this image, a snapshot of a converged lab host "
                   "(`umprov lab snapshot`), instead of the plain host image.")
@json_option
def up(count: int, name: str, registry: bool, slurm: bool, base: str | None,
       as_json: bool) -> int:
    """Create (or complete) a lab and write its inventory and known_hosts.

    Idempotent: a second call with the same arguments changes nothing and says so.

    \b
    Example:
      umprov lab up --hosts 3
      umprov inventory check inventory/lab/default.yml
      umprov lab up --registry      # then: docker push 127.0.0.1:PORT/IMAGE, deploy --pull
      umprov lab up --slurm --hosts 4   # then: umprov provision lab/default --rolling
    """
    from umprov_lab import lab as lab_mod

    result = lab_mod.up(name, count, progress=say, registry=registry, base=base, slurm=slurm)
    if as_json:
        emit_json(result.to_dict())
    else:
        rows = [(h.name, h.container, f"127.0.0.1:{h.port}", h.state) for h in result.hosts]
        print_table(f"lab '{name}'", ["host", "container", "ssh", "state"], rows)
        say(f"inventory: {result.inventory}")
        say(f"known_hosts: {result.known_hosts}")
        say(f"key: {result.key_file} (and .pub: the inventory's umprov_authorized_key, "
            "the key deploy lets into the lab's containers)")
        if result.registry:
            reg = result.registry
            say(f"registry: hosts pull from {reg.address}; push from here to {reg.local} "
                f"(CA: {reg.ca_file})")
        if result.slurm:
            say(f"slurm: slurmctld in {result.slurm.controller}, slurmd on "
                f"{len(result.slurm.nodes)} host(s); slurm.conf: {result.slurm.conf}")
        say("changed: " + "; ".join(result.changes) if result.changes else "nothing changed")
    return 0


@lab.command("snapshot")
@lab_name_option
@click.option("--host", "index", type=click.IntRange(min=1), default=1, show_default=True,
              help="Which host of the lab (its number).")
@click.option("--tag", required=True, metavar="REPOSITORY:TAG", help="Name of the image to save.")
@json_option
def snapshot(name: str, index: int, tag: str, as_json: bool) -> int:
    """Save a converged lab host as an image that `lab up --from-image` starts hosts from.

    The copy leaves out the host's SSH host keys, machine id and authorised lab key (new
    hosts make their own); the host itself keeps running untouched.

    \b
    Example:
      umprov provision lab/seed --only docker
      umprov lab snapshot --name seed --tag umprov-lab-host:docker
      umprov lab up --name work --hosts 3 --from-image umprov-lab-host:docker
    """
    from umprov_lab import snapshot as snapshot_mod

    image_id = snapshot_mod.snapshot(name, index, tag, progress=say)
    if as_json:
        emit_json({"lab": name, "host": index, "tag": tag, "image_id": image_id})
    else:
        say(f"saved lab '{name}' host {index} as {tag} ({image_id[:19]})")
    return 0


@lab.command("status")
@click.option("--name", default=None, help="Only this lab (default: all labs).")
@json_option
def status(name: str | None, as_json: bool) -> int:
    """Show lab hosts and their state."""
    from umprov_lab import lab as lab_mod

    rows = lab_mod.status(name)
    if as_json:
        emit_json({"hosts": rows})
    elif not rows:
        say("no lab hosts" + (f" in lab '{name}'" if name else ""))
    else:
        cols = ["lab", "host", "container", "state", "ssh", "image"]
        print_table("lab hosts", cols, [[r[c] for c in cols] for r in rows])
    return 0


@lab.command("down")
@lab_name_option
@click.option("--purge", is_flag=True, help="Also remove the cached host image.")
@json_option
def down(name: str, purge: bool, as_json: bool) -> int:
    """Remove a lab's containers, volumes, network, inventory and keys."""
    from umprov_lab import lab as lab_mod

    removed = lab_mod.down(name, purge=purge, progress=say)
    if as_json:
        emit_json({"lab": name, "removed": removed})
    else:
        say(
            f"lab '{name}': removed {len(removed)} item(s)"
            if removed
            else f"lab '{name}': nothing to remove"
        )
    return 0


@lab.command("image")
@click.option("--tag", metavar="TAG", help="Tag for the built image (default: the one lab "
              "inventories name, umprov/pytorch-cuda:VERSION-lab).")
@click.option("--torch-wheel", metavar="WHEEL|FOLDER|none",
              help="CPU torch wheel to carry in the context, a folder holding one, or 'none' to "
                   "build without torch (default: UMPROV_LAB_TORCH_WHEEL, else /opt/wheels, "
                   ".lab/wheels, then PyTorch's CPU index where it answers; without any, the "
                   "image has no torch and verify says so).")
@json_option
def image(tag: str | None, torch_wheel: str | None, as_json: bool) -> int:
    """Build the PyTorch image lab hosts run: the lab's Debian 12 base with a CPU torch.

    Built on this machine's engine; `umprov deploy --push` takes it to the hosts.

    \b
    Example:
      umprov lab image
      umprov deploy lab/default --push    # the lab's key logs in (umprov_authorized_key)
    """
    from umprov_lab import image as image_mod
    from umprov_lab.engine import docker_engine

    client = docker_engine(say)
    say("building on the local engine")
    result = image_mod.build(client, tag=tag, torch_wheel=torch_wheel, progress=say)
    if as_json:
        emit_json(result.to_dict())
    else:
        say(result.summary())
    return 0
