"""Lab hosts: containers that behave like servers, reached over SSH on 127.0.0.1.

systemd runs as PID 1 (cgroups read-only, tmpfs on /run, every capability but SYS_RESOURCE,
seccomp and AppArmor unconfined, not privileged), a volume at /var/lib/docker gives the Docker
engine inside overlay2, and the restart policy ``always`` turns ``systemctl reboot`` into a
container restart. Each host makes its own SSH host keys at first boot; the lab reads them from
the container, so known_hosts holds the real keys. Ports live in container labels.
"""

from __future__ import annotations

import contextlib
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umprov.errors import EnvironmentProblem, UmprovError
from umprov.paths import write_atomic, write_private
from umprov_lab.layout import LAB_USER, LABEL, container_name, host_name, network_name

FIRST_PORT = 22201


@dataclass
class LabHost:
    name: str
    container: str
    port: int
    state: str
    host_keys: list[str] = field(default_factory=list)


def ensure_key(path: Path) -> bool:
    """Create the lab's SSH key pair (ed25519) if missing; True when created."""
    if path.exists() and path.with_suffix(".pub").exists():
        return False
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    write_private(path, private)
    write_atomic(path.with_suffix(".pub"), public + f" umprov-lab-{path.parent.name}\n".encode())
    return True


def lab_containers(client: Any, *labels: str) -> list[Any]:
    """Containers carrying every label filter given (default: any lab's), running or not. Labs
    share one engine: one that another lab's `down` removes between the engine's list and its
    inspect is left out, not an error (seen: `lab status` beside another lab's `down`)."""
    wanted = list(labels) or [LABEL]
    return client.containers.list(all=True, filters={"label": wanted}, ignore_removed=True)


def host_containers(client: Any, name: str) -> dict[int, Any]:
    """The lab's host containers by index (the repository and registry have none)."""
    found = lab_containers(client, f"{LABEL}={name}")
    out: dict[int, Any] = {}
    for c in found:
        index = c.labels.get(f"{LABEL}.index")
        if index and index.isdigit():
            out[int(index)] = c
    return out


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _used_ports(client: Any) -> set[int]:
    used = set()
    for c in lab_containers(client):
        port = c.labels.get(f"{LABEL}.port", "")
        if port.isdigit():
            used.add(int(port))
    return used


# Concurrent `lab up`s (side-by-side test workers, two shells) probe for free ports: two could
# pick the same port before either container holds it, or both start dockerd or debootstrap the
# host image. One machine-wide lock over each of those steps; sshd waits stay outside it.
LOCK_FILE = Path(tempfile.gettempdir()) / "umprov-lab.lock"


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    import fcntl

    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes; never nested
        yield


def pick_port(client: Any, taken: set[int]) -> int:
    """A loopback port no lab container holds, not in ``taken``, and free right now."""
    used = _used_ports(client) | taken
    for port in range(FIRST_PORT, FIRST_PORT + 2000):
        if port not in used and _port_free(port):
            return port
    raise EnvironmentProblem(f"no free port on 127.0.0.1 from {FIRST_PORT} to {FIRST_PORT + 1999}")


def lab_networks(client: Any, name: str) -> list[Any]:
    """Every network of the lab's name. Docker lets two `lab up` of one name that run at once
    both create it, and then refuses the name as ambiguous: there can be more than one."""
    wanted = network_name(name)
    found = [n for n in client.networks.list(names=[wanted], greedy=True) if n.name == wanted]
    return sorted(found, key=lambda n: -len(n.attrs.get("Containers") or {}))  # in use first


def ensure_network(client: Any, name: str) -> bool:
    """The lab's bridge network, exactly one of it; True when it was created."""
    from docker.errors import APIError, NotFound

    found = lab_networks(client, name)
    for twin in found[1:]:
        with contextlib.suppress(NotFound, APIError):  # APIError: containers still on it
            twin.remove()
    if len(found) > 1 and len(lab_networks(client, name)) > 1:
        raise EnvironmentProblem(
            f"two Docker networks are named {network_name(name)}, both in use: "
            f"umprov lab down --name {name} removes the lab and both")
    if found:
        return False
    client.networks.create(network_name(name), driver="bridge", labels={LABEL: name})
    return True


def systemd_container(mounts: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """The options that make a container a server with systemd as PID 1 (see the module's
    docstring); ``mounts`` adds volumes or folders of this machine."""
    return {
        "cap_add": ["ALL"],
        "cap_drop": ["SYS_RESOURCE"],
        "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
        "tmpfs": {"/run": "rw,mode=755", "/run/lock": "rw,mode=1777"},
        "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "ro"}, **(mounts or {})},
        "restart_policy": {"Name": "always"},
        "environment": {"container": "docker"},
        "stop_signal": "SIGRTMIN+3",  # systemd's clean shutdown signal
    }


def create_host(client: Any, name: str, index: int, image: str, port: int,
                mounts: dict[str, dict[str, str]] | None = None) -> Any:
    container = container_name(name, index)
    return client.containers.run(
        image,
        name=container,
        hostname=host_name(name, index),
        detach=True,
        network=network_name(name),
        labels={
            LABEL: name,
            f"{LABEL}.index": str(index),
            f"{LABEL}.port": str(port),
            f"{LABEL}.image": image,
        },
        ports={"22/tcp": ("127.0.0.1", port)},
        **systemd_container({f"{container}-docker": {"bind": "/var/lib/docker", "mode": "rw"},
                             **(mounts or {})}),
    )


def remove_volume(client: Any, volume: str) -> None:
    from docker.errors import NotFound

    with contextlib.suppress(NotFound):
        client.volumes.get(volume).remove(force=True)


def lab_volumes(client: Any, name: str) -> list[str]:
    """Lab ``name``'s storage (a host's Docker engine, the registry's data), its containers'
    and that of containers already gone (removed by hand, or a run killed between a volume and
    its container), which `lab up` would mount as it was. Roles have no '-', so another lab
    whose name starts with this one's is never matched."""
    pattern = re.compile(rf"{re.escape(container_name(name, ''))}(\d+|[a-z]+)-(docker|data)")
    return sorted(v.name for v in client.volumes.list() if pattern.fullmatch(v.name))


def wait_for_sshd(container: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            last = f"container is {container.status}"
        else:
            result = container.exec_run(
                [
                    "sh",
                    "-c",
                    "test -s /etc/ssh/ssh_host_ed25519_key.pub && "
                    "systemctl is-active --quiet ssh.service",
                ]
            )
            if result.exit_code == 0:
                return
            last = "sshd not active yet"
        time.sleep(0.5)
    raise UmprovError(
        f"lab host {container.name}: sshd did not come up within {timeout:.0f} s ({last})"
    )


def install_key(container: Any, public_key: str) -> None:
    home = f"/home/{LAB_USER}/.ssh"
    script = (
        f"install -d -m 0700 -o {LAB_USER} -g {LAB_USER} {home} && "
        f"printf '%s\\n' \"$KEY\" > {home}/authorized_keys && "
        f"chown {LAB_USER}:{LAB_USER} {home}/authorized_keys && chmod 0600 {home}/authorized_keys"
    )
    result = container.exec_run(["sh", "-c", script], environment={"KEY": public_key.strip()})
    if result.exit_code != 0:
        raise UmprovError(f"lab host {container.name}: cannot install the lab key")


def host_keys(container: Any, attempts: int = 3) -> list[str]:
    """The host's public SSH host keys ("TYPE BASE64"). An empty read is asked again and then
    refused: written as it is, it would leave the host out of known_hosts, and every client
    would call its key unknown (seen once under load, after a host was brought back)."""
    cmd = ["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"]
    for attempt in range(attempts):
        result = container.exec_run(cmd, user="root", demux=False)
        text = (result.output or b"").decode(errors="replace")
        if result.exit_code != 0:
            raise UmprovError(
                f"lab host {container.name}: `{' '.join(cmd)}` failed ({result.exit_code}): "
                f"{text.strip()[:200]}"
            )
        keys = [" ".join(line.split()[:2]) for line in text.splitlines() if line.strip()]
        if keys:
            return keys
        time.sleep(0.5 * (attempt + 1))
    raise UmprovError(f"lab host {container.name}: no SSH host key could be read")


def render_known_hosts(hosts: list[LabHost]) -> str:
    lines = []
    for h in hosts:
        for key in h.host_keys:
            lines.append(f"[127.0.0.1]:{h.port} {key}")
    return "\n".join(lines) + ("\n" if lines else "")
