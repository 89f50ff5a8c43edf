"""`umprov image`: build the PyTorch-CUDA image (docker/pytorch-cuda)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from umprov.cli.options import inventory_options, json_option, not_blank
from umprov.output import emit_json, say

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest


@click.group()
def image() -> None:
    """Build the PyTorch-CUDA image with SSH and JupyterLab."""


@image.command()
@click.option("--base", metavar="IMAGE", help="Base image (default: the official PyTorch CUDA "
              "runtime image).")
@click.option("--tag", metavar="TAG", help="Tag for the built image.")
@click.option("--torch-wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="torch wheel to carry in the context, for a base without torch.")
@click.option("--python", "python_version", metavar="X.Y",
              help="Python of the base, when the base is not on the engine to ask.")
@click.option("--host", metavar="HOST", callback=not_blank,
              help="Build on this inventory host's engine (over SSH; the inventory: -i, else "
              "ansible.cfg's).")
@inventory_options(positional=False)
@click.option("--trust-new-hosts", is_flag=True,
              help="Record the host key of a host never seen before (first contact only).")
@json_option
def build(
    base: str | None,
    tag: str | None,
    torch_wheel: Path | None,
    python_version: str | None,
    host: str | None,
    inventory: InventoryRequest,
    trust_new_hosts: bool,
    as_json: bool,
) -> None:
    """Build the image; Python packages come from wheels downloaded here, never from inside.

    \b
    umprov image build                      # official PyTorch 2.9 CUDA 12.8 base
    umprov image build --host gpu1 -i hosts # build on a host's engine instead
    umprov lab image                        # the lab's image (Debian 12, CPU torch): umprov-lab
    """
    from umprov import image as image_mod
    from umprov.deploy.options import check_image
    from umprov.errors import ConfigError

    base = check_image(base or image_mod.DEFAULT_BASE, "--base")
    tag = check_image(tag or image_mod.DEFAULT_TAG, "--tag")
    if python_version is not None and not re.fullmatch(r"3\.\d{1,2}", python_version):
        raise ConfigError(f"--python {python_version!r}: not a Python version such as 3.11")
    image_mod.requirements(torch_wheel)  # a wheel not named as torch's: refused before a host
    if host is not None:
        from umprov.hosts.engine import docker_client
        from umprov.inventory import load_inventory

        hosts = load_inventory(inventory).select(host)
        if len(hosts) != 1:
            raise ConfigError(f"--host {host} matches {len(hosts)} hosts; name exactly one")
        client = docker_client(hosts[0], trust_new=trust_new_hosts)
        where = hosts[0].name
    else:
        from umprov.hosts.engine import local_engine

        client = local_engine()
        where = "the local engine"
    say(f"building on {where}")
    result = image_mod.build(
        client, base=base, tag=tag, torch_wheel=torch_wheel,
        python=python_version, progress=say,
    )
    if as_json:
        emit_json(result.to_dict())
    else:
        say(result.summary())
