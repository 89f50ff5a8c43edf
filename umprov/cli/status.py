"""`umprov status`: each host's engine, GPUs and deployed container, at a glance."""

from __future__ import annotations

import re
from typing import Any

import click

from umprov.cli._common import emit_json, inventory_argument, json_option, print_table, say

# One shell line on the host; each probe prints KEY=VALUE and never fails the whole line.
_HOST_PROBE = (
    "printf 'driver=%s\\n' \"$( (nvidia-smi --query-gpu=driver_version --format=csv,noheader "
    "2>/dev/null | head -n1) || true)\"; "
    "printf 'gpus=%s\\n' \"$( (nvidia-smi -L 2>/dev/null | grep -c '^GPU') || echo 0)\""
)


def host_status(host: Any, container_name: str | None, trust_new: bool) -> dict[str, Any]:
    from docker.errors import DockerException, NotFound

    from umprov.deploy.options import DEFAULT_NAME
    from umprov.deploy.spec import LABEL
    from umprov.errors import UmprovError
    from umprov.hosts.engine import docker_client, exec_in
    from umprov.hosts.ssh import connect, run_command

    name = container_name or str((host.vars or {}).get("umprov_container_name") or DEFAULT_NAME)
    row: dict[str, Any] = {"host": host.name, "reachable": False, "container": name}
    try:
        ssh = connect(host, trust_new=trust_new)
    except UmprovError as exc:
        row["error"] = str(exc)
        return row
    row["reachable"] = True
    try:
        _rc, out, _err = run_command(ssh, _HOST_PROBE, timeout=30)
        facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        driver = (facts.get("driver") or "").strip()
        # nvidia-smi prints its failure ("couldn't communicate with the NVIDIA driver") on
        # stdout: only a version number counts as a driver that answers.
        row["driver"] = driver if re.fullmatch(r"\d+(\.\d+)+", driver) else None
        if driver and row["driver"] is None:
            row["driver_error"] = driver[:120]
        row["host_gpus"] = int(facts.get("gpus") or 0)
    finally:
        ssh.close()
    try:
        client = docker_client(host, trust_new=False)
    except UmprovError as exc:
        row["error"] = str(exc)
        return row
    try:
        info = client.info()
        row["docker"] = client.version().get("Version")
        row["nvidia_runtime"] = "nvidia" in (info.get("Runtimes") or {})
        try:
            container = client.containers.get(name)
        except NotFound:
            row["state"] = "absent"
            return row
        state = container.attrs["State"]
        row["state"] = state.get("Status")
        row["health"] = (state.get("Health") or {}).get("Status")
        row["image"] = container.labels.get(f"{LABEL}.image") or container.attrs["Config"]["Image"]
        row["ports"] = {
            k: [f"{b['HostIp']}:{b['HostPort']}" for b in (v or [])]
            for k, v in (container.attrs["NetworkSettings"].get("Ports") or {}).items()
        }
        if state.get("Running"):
            rc, out = exec_in(container, ["sh", "-c", "nvidia-smi -L 2>/dev/null | grep -c '^GPU'"],
                              60, user="root")
            row["container_gpus"] = int(out.strip() or 0) if out.strip().isdigit() else 0
            rc, _ = exec_in(container, ["/usr/local/bin/umprov-healthcheck"], 60, user="root")
            row["jupyter"] = rc == 0
    except DockerException as exc:
        row["error"] = " ".join(str(exc).split())[:200]
    finally:
        client.close()
    return row


def connect_text(host_name: str) -> str:
    """The ssh command and the Jupyter URL (with its token) for a deployed host."""
    from umprov.deploy.state import load_connection, token_path
    from umprov.errors import ConfigError

    conn = load_connection(host_name)
    if conn is None:
        raise ConfigError(f"{host_name}: nothing deployed from this machine (run umprov deploy)")
    path = token_path(host_name)
    if not path.is_file():
        raise ConfigError(f"{host_name}: no Jupyter token stored in {path}; re-run umprov deploy")
    token = path.read_text().strip()
    lines = [f"ssh -F {conn['ssh_config']} {conn['alias']}"]
    if conn["via_host"]:
        port = conn["jupyter_port"]
        lines.append(
            f"ssh -F {conn['ssh_config']} -N -L {port}:{conn['address']}:{port} "
            f"{conn['jump_alias']}   # then open:"
        )
        lines.append(f"http://127.0.0.1:{port}/lab?token={token}")
    else:
        lines.append(f"http://{conn['address']}:{conn['jupyter_port']}/lab?token={token}")
    return "\n".join(lines)


@click.command()
@inventory_argument
@click.option("--limit", "-l", metavar="PATTERN", help="Only hosts or groups matching.")
@click.option("--name", metavar="NAME", help="Container name (default: umprov).")
@click.option("--connect", "connect_host", metavar="HOST",
              help="Print the ssh command and the Jupyter URL WITH its token for HOST.")
@click.option("--trust-new-hosts", is_flag=True, help="Record keys of hosts never seen before.")
@json_option
def status(
    inventory: str | None,
    limit: str | None,
    name: str | None,
    connect_host: str | None,
    trust_new_hosts: bool,
    as_json: bool,
) -> int:
    """Per host: reachable, driver, Docker, nvidia runtime, container state, health, Jupyter.

    \b
    umprov status inventory/hosts.yml
    umprov status --connect gpu1     # prints the Jupyter token: for your eyes only
    """
    if connect_host:
        click.echo(connect_text(connect_host))
        return 0
    from umprov.inventory import load_inventory

    hosts = list(load_inventory(inventory).select(limit))
    from umprov.hosts.fanout import Parallel

    rows = Parallel(min(32, len(hosts))).map(lambda h: host_status(h, name, trust_new_hosts), hosts)
    if as_json:
        emit_json({"hosts": rows})
    table = [
        (
            r["host"],
            "yes" if r["reachable"] else "no",
            r.get("driver") or "-",
            r.get("docker") or "-",
            {True: "yes", False: "no"}.get(r.get("nvidia_runtime"), "-"),
            r.get("state") or "-",
            r.get("health") or "-",
            r.get("image") or "-",
            " ".join(f"{k}->{','.join(v)}" for k, v in (r.get("ports") or {}).items()) or "-",
            r.get("container_gpus", r.get("host_gpus", "-")),
            {True: "yes", False: "no"}.get(r.get("jupyter"), "-"),
            r.get("error", ""),
        )
        for r in rows
    ]
    print_table(
        "status",
        ["host", "reachable", "driver", "docker", "nvidia rt", "container", "health", "image",
         "ports", "gpus", "jupyter", "error"],
        table,
    )
    bad = [r for r in rows if not r["reachable"]]
    if bad:
        say(f"umprov: {len(bad)} of {len(rows)} host(s) unreachable")
        return 11
    return 0
