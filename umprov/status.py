"""`umprov status`: each host's driver, engine, GPUs and deployed container, probed in
parallel; and how to reach a deployed container from here (``connect_text``).

A host is "unreachable" when umprov cannot log in over SSH (refused, bad credentials), or
"untrusted" when its host key is unknown or changed: those are the states that fail the
command (exit 11; exit 6, as in every command, for a key). Everything after the login (no
driver, no engine, no container) is reported, not failed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from umprov.deploy.spec import LABEL, MANAGED_VARIABLE, POOL_LABEL
from umprov.deploy.state import load_connection, token_path
from umprov.errors import ConfigError, TrustError, UmprovError
from umprov.hosts import render
from umprov.hosts.engine import exec_in, one_line
from umprov.hosts.fanout import Parallel, workers
from umprov.hosts.results import HostOutcome
from umprov.inventory import deployed_container

# One shell line on the host; each probe prints KEY=VALUE and never fails the whole line.
_HOST_PROBE = (
    "printf 'driver=%s\\n' \"$( (nvidia-smi --query-gpu=driver_version --format=csv,noheader "
    "2>/dev/null | head -n1) || true)\"; "
    "printf 'gpus=%s\\n' \"$( (nvidia-smi -L 2>/dev/null | grep -c '^GPU') || echo 0)\""
)
EXEC_TIMEOUT = 60.0

# A host in `umprov status --json`; the probes a host did not get to are left out.
HOST_FIELDS: list[render.Field] = [
    ("host", render.host),
    ("reachable", render.ok),
    *render.data_fields("container", "driver", "driver_error", "host_gpus", "docker",
                        "nvidia_runtime", "state", "health", "image", "ports", "container_gpus",
                        "jupyter", "managed_memory", "managed_memory_pool"),
    ("error", lambda o: o.detail or render.ABSENT),
]


def probe(
    hosts: Sequence[Any], container_name: str | None, *, trust_new: bool = False,
    forks: int | None = None,
) -> list[HostOutcome]:
    """Every host probed, in parallel; one outcome each, in the order of ``hosts``."""
    pool = Parallel(workers(forks, len(hosts))[0])
    return pool.map(lambda h: host_status(h, container_name, trust_new), hosts, "status")


def host_status(host: Any, container_name: str | None, trust_new: bool) -> HostOutcome:
    """One host: over SSH its driver and GPUs, then through its engine the container."""
    from umprov.hosts.engine import docker_client
    from umprov.hosts.ssh import connect

    name = container_name or deployed_container(host.vars)
    outcome = HostOutcome(host.name, "unreachable", data={"container": name})
    try:
        ssh = connect(host, trust_new=trust_new)
    except UmprovError as exc:
        outcome.detail = str(exc)
        if isinstance(exc, TrustError):  # an unknown or changed key: exit 6, as everywhere
            outcome.state = "untrusted"
        return outcome
    outcome.state = "reachable"
    try:
        _probe_host(ssh, outcome.data)
        # The engine over the same connection: one SSH handshake a host, not two (a fleet's
        # status spends most of its time in handshakes).
        client = docker_client(host, trust_new=False, ssh=ssh)
    except UmprovError as exc:
        ssh.close()
        outcome.detail = str(exc)
        return outcome
    except BaseException:
        ssh.close()
        raise
    try:
        outcome.detail = _probe_engine(client, name, outcome.data)
    finally:
        client.close()
    return outcome


def _probe_host(ssh: Any, data: dict[str, Any]) -> None:
    from umprov.hosts.ssh import run_command

    _rc, out, _err = run_command(ssh, _HOST_PROBE, timeout=30)
    facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    driver = (facts.get("driver") or "").strip()
    # nvidia-smi prints its failure ("couldn't communicate with the NVIDIA driver") on
    # stdout: only a version number counts as a driver that answers.
    data["driver"] = driver if re.fullmatch(r"\d+(\.\d+)+", driver) else None
    if driver and data["driver"] is None:
        data["driver_error"] = driver[:120]
    data["host_gpus"] = int(facts.get("gpus") or 0)


def _probe_engine(client: Any, name: str, data: dict[str, Any]) -> str:
    """The engine and the container ``name``, into ``data``; the engine's error or ""."""
    from docker.errors import DockerException, NotFound

    try:
        info = client.info()
        data["docker"] = info.get("ServerVersion")  # no second request for `docker version`
        data["nvidia_runtime"] = "nvidia" in (info.get("Runtimes") or {})
        try:
            container = client.containers.get(name)
        except NotFound:
            data["state"] = "absent"
            return ""
        state = container.attrs["State"]
        data["state"] = state.get("Status")
        data["health"] = (state.get("Health") or {}).get("Status")
        data["image"] = container.labels.get(f"{LABEL}.image") or container.attrs["Config"]["Image"]
        _managed_memory(container, data)
        data["ports"] = {
            k: [f"{b['HostIp']}:{b['HostPort']}" for b in (v or [])]
            for k, v in (container.attrs["NetworkSettings"].get("Ports") or {}).items()
        }
        if state.get("Running"):
            count = ["sh", "-c", "nvidia-smi -L 2>/dev/null | grep -c '^GPU'"]
            _rc, out = exec_in(container, count, EXEC_TIMEOUT, user="root")
            data["container_gpus"] = int(out.strip() or 0) if out.strip().isdigit() else 0
            rc, _ = exec_in(container, ["/usr/local/bin/umprov-healthcheck"], EXEC_TIMEOUT,
                            user="root")
            data["jupyter"] = rc == 0
    except DockerException as exc:
        return one_line(exc, 200)
    return ""


def _managed_memory(container: Any, data: dict[str, Any]) -> None:
    """Whether the container runs with the pool switched on, and whether its image carries it
    (the image's label, which Docker copies into the container's)."""
    env = container.attrs["Config"].get("Env") or []
    data["managed_memory"] = f"{MANAGED_VARIABLE}=1" in env
    held = (container.labels or {}).get(POOL_LABEL)
    data["managed_memory_pool"] = {"1": True, "0": False}.get(held or "")


def connect_info(host_name: str) -> dict[str, Any]:
    """How to reach a deployed host's container from here: the ssh command, the tunnel to
    open first (None: none needed) and the Jupyter URL with its token."""
    conn = load_connection(host_name)
    if conn is None:
        raise ConfigError(f"{host_name}: nothing deployed from this machine (run umprov deploy)")
    path = token_path(host_name)
    if not path.is_file():
        raise ConfigError(f"{host_name}: no Jupyter token stored in {path}; re-run umprov deploy")
    token = path.read_text().strip()
    info: dict[str, Any] = {"host": host_name,
                            "ssh": f"ssh -F {conn['ssh_config']} {conn['alias']}",
                            "tunnel": None}
    if conn["via_host"]:
        port = conn["jupyter_port"]
        local = conn.get("tunnel_port", port)  # records of an older umprov have none
        info["tunnel"] = (f"ssh -F {conn['ssh_config']} -N -L {local}:{conn['address']}:{port} "
                          f"{conn['jump_alias']}")
        info["jupyter_url"] = f"http://127.0.0.1:{local}/lab?token={token}"
    else:
        info["jupyter_url"] = f"http://{conn['address']}:{conn['jupyter_port']}/lab?token={token}"
    return info


def connect_text(host_name: str) -> str:
    """The ssh command and the Jupyter URL (with its token) for a deployed host."""
    info = connect_info(host_name)
    lines = [info["ssh"]]
    if info["tunnel"]:
        lines.append(f"{info['tunnel']}   # then open:")
    lines.append(info["jupyter_url"])
    return "\n".join(lines)
