"""`umprov deploy`: the PyTorch container with SSH and Jupyter on every host of an inventory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from umprov.cli._common import (
    emit_json,
    inventory_argument,
    json_option,
    print_table,
    say,
)


@click.command()
@inventory_argument
@click.option("--limit", "-l", metavar="PATTERN",
              help="Only hosts or groups matching (globs, commas).")
@click.option("--image", metavar="IMAGE", help="Image to run (default: the host's umprov_image).")
@click.option("--pull", "delivery", flag_value="pull",
              help="Pull the image from its registry on each host (a private registry's CA: "
              "docker_engine_registry_ca_certs; credentials: this machine's docker login).")
@click.option("--push", "delivery", flag_value="push",
              help="Stream the image from this machine (docker save over SSH into docker load); "
              "hosts that have the same image ID are skipped, and layers a host already holds "
              "are left out of its stream.")
@click.option("--gpus", metavar="all|none|0,1", help="GPUs for the container (default: the host's "
              "umprov_gpus, else all).")
@click.option("--ssh-port", type=int, help="Host port for SSH into the container (default 2222).")
@click.option("--jupyter-port", type=int, help="Host port for Jupyter (default 8888).")
@click.option("--bind", metavar="ADDRESS", help="Host address the ports are published on "
              "(default 127.0.0.1: reach them through the host over SSH).")
@click.option("--authorized-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Public key allowed to log in (default: ~/.ssh/id_ed25519.pub or id_rsa.pub).")
@click.option("--name", metavar="NAME", help="Container name (default: umprov).")
@click.option("--shm-size", default="16g", show_default=True, help="Shared memory size for NCCL.")
@click.option("--force", is_flag=True,
              help="Replace the container even when its spec is unchanged.")
@click.option("--trust-new-hosts", is_flag=True,
              help="Record the host keys of hosts never seen before (first contact only; a "
              "changed key is still refused).")
@json_option
def deploy(
    inventory: str | None,
    limit: str | None,
    image: str | None,
    delivery: str | None,
    gpus: str | None,
    ssh_port: int | None,
    jupyter_port: int | None,
    bind: str | None,
    authorized_key: Path | None,
    name: str | None,
    shm_size: str,
    force: bool,
    trust_new_hosts: bool,
    as_json: bool,
) -> int:
    """Run the PyTorch container (SSH + Jupyter) on every host, in parallel.

    Re-running with the same settings changes nothing; changed settings replace the container.

    \b
    umprov deploy inventory/hosts.yml --image umprov/pytorch-cuda:0.1.0 --push
    umprov deploy lab/demo --push --gpus none --limit lab-demo-1
    umprov status --connect lab-demo-1      # ssh command and Jupyter URL
    """
    from umprov.deploy import (
        DeployOptions,
        check_bind,
        check_image,
        check_port,
        check_public_key,
        default_public_key,
        exit_code,
        parse_gpus,
    )
    from umprov.inventory import load_inventory

    # Validate what can be validated before touching any host.
    if image is not None:
        check_image(image)
    if gpus is not None:
        parse_gpus(gpus)
    if ssh_port is not None:
        check_port(ssh_port, "--ssh-port")
    if jupyter_port is not None:
        check_port(jupyter_port, "--jupyter-port")
    if bind is not None:
        check_bind(bind)
    key_path = authorized_key or default_public_key()
    keys = check_public_key(key_path.read_text(errors="replace"), str(key_path))
    private = key_path.with_suffix("") if key_path.suffix == ".pub" else None
    opts = DeployOptions(
        image=image,
        delivery=delivery or "none",
        gpus=gpus,
        ssh_port=ssh_port,
        jupyter_port=jupyter_port,
        bind=bind,
        name=name,
        authorized_keys=keys,
        identity_file=str(private) if private and private.is_file() else None,
        shm_size=shm_size,
        force=force,
        trust_new=trust_new_hosts,
    )
    hosts = list(load_inventory(inventory).select(limit))
    local_client = None
    if opts.delivery == "push":
        import docker
        from docker.errors import DockerException

        from umprov.errors import EnvironmentProblem

        try:
            local_client = docker.from_env(timeout=300)
            local_client.ping()
        except DockerException as exc:
            raise EnvironmentProblem(f"no Docker engine answers: {exc}") from None

    from umprov.cli._progress import HostProgress
    from umprov.deploy import deploy as run_deploy

    started = time.monotonic()
    with HostProgress([h.name for h in hosts]) as progress:
        results = run_deploy(hosts, opts, progress=progress, local_client=local_client)
    elapsed = time.monotonic() - started
    code = exit_code(results)
    if as_json:
        emit_json({
            "ok": code == 0,
            "exit_code": int(code),
            "seconds": round(elapsed, 2),
            "hosts": [r.to_dict() for r in results],
        })
    rows = [
        (r.host, r.status, (r.container_id or "")[:12], r.ssh or "", r.jupyter or "",
         _push_cell(r), r.message)
        for r in results
    ]
    print_table(f"deploy: {len(results)} host(s) in {elapsed:.1f} s",
                ["host", "status", "container", "ssh", "jupyter", "push", "message"], rows)
    failed = [r for r in results if not r.ok]
    if failed:
        say(f"umprov: {len(failed)} of {len(results)} host(s) failed")
    return int(code)


def _push_cell(result: Any) -> str:
    if not result.pushed_bytes:
        return ""
    sent = result.pushed_bytes
    cell = f"{sent / 1e6:.0f} MB" if sent >= 10**6 else f"{sent / 1e3:.0f} kB"
    cell += f" in {result.push_seconds:.0f} s"
    stream = result.push_stream_seconds
    rate = sent / stream / 1e6 if stream else 0.0
    if rate >= 1:
        # The transfer and the host's docker load, which registers the layers after it.
        cell += f": sent at {rate:.0f} MB/s, loaded in {result.push_seconds - stream:.0f} s"
    skipped = getattr(result, "skipped_bytes", 0)
    if skipped:
        cell += f" ({skipped / 1e6:.0f} MB already on the host)"
    return cell
