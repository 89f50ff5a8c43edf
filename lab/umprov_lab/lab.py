"""A lab as a whole: ``up`` creates or completes it, ``status`` shows it, ``down`` removes it.

``up`` is idempotent: the host image (cached by recipe), the network, the SSH key, the
stand-in apt repository, the hosts, the registry when asked for, then the known_hosts file with
the hosts' real keys and the inventory; each step reports what it changed.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError
from umprov_lab import hosts as lab_hosts
from umprov_lab import slurm as lab_slurm
from umprov_lab.engine import docker_engine, ensure_inotify_limits
from umprov_lab.host_image import ensure_host_image
from umprov_lab.hosts import LabHost
from umprov_lab.inventory import render_inventory
from umprov_lab.layout import (
    LABEL,
    PREFIX,
    Progress,
    check_lab_name,
    container_name,
    host_name,
    inventory_path,
    lab_dir,
    network_name,
    quiet,
    write_if_changed,
)
from umprov_lab.registry import LabRegistry, ensure_registry, has_registry
from umprov_lab.stand_in_repo import ensure_repo


@dataclass
class LabResult:
    lab: str
    inventory: Path
    known_hosts: Path
    key_file: Path
    hosts: list[LabHost]
    changes: list[str]
    registry: LabRegistry | None = None
    slurm: lab_slurm.LabSlurm | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "lab": self.lab,
            "registry": self.registry.to_dict() if self.registry else None,
            "slurm": self.slurm.to_dict() if self.slurm else None,
            "inventory": str(self.inventory),
            "known_hosts": str(self.known_hosts),
            "key_file": str(self.key_file),
            "changed": bool(self.changes),
            "changes": self.changes,
            "hosts": [
                {
                    "name": h.name,
                    "container": h.container,
                    "address": "127.0.0.1",
                    "port": h.port,
                    "state": h.state,
                }
                for h in self.hosts
            ],
        }


def up(name: str, count: int, progress: Progress = quiet, *, registry: bool = False,
       base: str | None = None, slurm: bool = False) -> LabResult:
    """Create or complete a lab; ``registry`` adds the lab registry, ``slurm`` a Slurm cluster
    (both kept by later calls); ``base``: new hosts start from this image (a snapshot) instead
    of the host image."""
    check_lab_name(name)
    if not 1 <= count <= 64:
        raise ConfigError(f"--hosts {count}: a lab holds 1 to 64 hosts")
    with lab_hosts.machine_lock():  # one dockerd, one host image build, however many callers
        client = docker_engine(progress)
        ensure_inotify_limits(progress)
        image, built = ensure_host_image(client, progress)
    if base is not None:
        _check_base(client, base)
    changes: list[str] = []
    if built:
        changes.append(f"built image {image}")
    slurm = slurm or lab_slurm.has_slurm(client, name)
    if slurm:
        if base is not None:
            raise ConfigError(f"--from-image {base}: lab '{name}' runs Slurm (--slurm), whose "
                              "hosts start from its own image (the host image with slurm-wlm "
                              "and munge)")
        base, built = lab_slurm.ensure_image(client, image, progress)
        if built:
            changes.append(f"built image {base}")
    if lab_hosts.ensure_network(client, name):
        changes.append(f"created network {network_name(name)}")
    directory = lab_dir(name)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file = directory / "id_ed25519"
    if lab_hosts.ensure_key(key_file):
        changes.append("created the lab SSH key")
    changes += ensure_repo(client, name, image, progress)

    taken: set[int] = set()
    mounts = lab_slurm.mounts(name) if slurm else None
    hosts = _ensure_hosts(client, name, count, base or image, taken, changes, progress, mounts)
    public_key = key_file.with_suffix(".pub").read_text()
    for host in hosts:
        container = client.containers.get(host.container)
        lab_hosts.wait_for_sshd(container)
        lab_hosts.install_key(container, public_key)
        host.host_keys = lab_hosts.host_keys(container)
        host.state = container.status

    lab_registry = None
    if registry or has_registry(client, name):
        lab_registry, made = ensure_registry(client, name, image, taken, progress)
        changes += made

    lab_cluster = None
    if slurm:
        lab_cluster, made = lab_slurm.ensure_slurm(client, name, hosts, base or image, progress)
        changes += made

    known_hosts = directory / "known_hosts"
    if write_if_changed(known_hosts, lab_hosts.render_known_hosts(hosts)):
        changes.append(f"wrote {known_hosts}")
    inventory = inventory_path(name)
    if write_if_changed(inventory, render_inventory(name, hosts, key_file, known_hosts,
                                                    lab_registry, slurm=slurm)):
        changes.append(f"wrote {inventory}")
    return LabResult(name, inventory, known_hosts, key_file, hosts, changes, lab_registry,
                     lab_cluster)


def _check_base(client: Any, base: str) -> None:
    from docker.errors import ImageNotFound

    try:
        client.images.get(base)
    except ImageNotFound:
        raise ConfigError(f"--from-image {base}: no such image on this engine "
                          "(`umprov lab snapshot` makes one from a lab host)") from None


def _ensure_hosts(client: Any, name: str, count: int, image: str, taken: set[int],
                  changes: list[str], progress: Progress,
                  mounts: dict[str, dict[str, str]] | None = None) -> list[LabHost]:
    """Hosts 1..count running (those past ``count`` removed); their ports join ``taken``."""
    existing = lab_hosts.host_containers(client, name)
    for index, container in sorted(existing.items()):
        if index > count:
            progress(f"removing {container.name} (lab now has {count} hosts)")
            container.remove(force=True, v=True)
            lab_hosts.remove_volume(client, f"{container.name}-docker")
            changes.append(f"removed {container.name}")
    hosts: list[LabHost] = []
    for index in range(1, count + 1):
        container = existing.get(index)
        if container is None:
            with lab_hosts.machine_lock():  # from the probed port to the container holding it
                port = lab_hosts.pick_port(client, taken)
                progress(f"creating {container_name(name, index)} (ssh on 127.0.0.1:{port})")
                container = lab_hosts.create_host(client, name, index, image, port, mounts)
            changes.append(f"created {container.name}")
        else:
            port = int(container.labels[f"{LABEL}.port"])
            if container.status != "running":
                progress(f"starting {container.name}")
                container.start()
                changes.append(f"started {container.name}")
        taken.add(port)
        hosts.append(LabHost(host_name(name, index), container.name, port, "running"))
    return hosts


def status(name: str | None = None) -> list[dict[str, Any]]:
    client = docker_engine(start=False)
    rows = []
    for c in lab_hosts.lab_containers(client, *([f"{LABEL}={name}"] if name else [])):
        controller = c.labels.get(f"{LABEL}.role") == lab_slurm.ROLE
        if f"{LABEL}.index" not in c.labels and not controller:
            continue
        health = c.attrs.get("State", {}).get("Health", {}).get("Status")
        rows.append(
            {
                "lab": c.labels[LABEL],
                "host": (f"{c.name} (slurmctld)" if controller
                         else host_name(c.labels[LABEL], int(c.labels[f"{LABEL}.index"]))),
                "container": c.name,
                "state": c.status + (f" ({health})" if health else ""),
                "ssh": "" if controller else f"127.0.0.1:{c.labels.get(f'{LABEL}.port', '?')}",
                "image": c.labels.get(f"{LABEL}.image", ""),
            }
        )
    rows.sort(key=lambda r: (r["lab"], r["container"]))
    return rows


def down(name: str, *, purge: bool = False, progress: Progress = quiet) -> list[str]:
    from docker.errors import NotFound

    from umprov.deploy.state import forget as forget_host
    from umprov.verify.history import forget as forget_history

    check_lab_name(name)
    client = docker_engine(progress, start=False)
    removed: list[str] = []
    for container in lab_hosts.lab_containers(client, f"{LABEL}={name}"):
        progress(f"removing {container.name}")
        index = container.labels.get(f"{LABEL}.index", "")
        if index.isdigit():  # what umprov kept of the host: no login, no report of it
            gone = host_name(name, int(index))
            removed += [str(p) for p in (*forget_host(gone), *forget_history(gone))]
        with contextlib.suppress(NotFound):  # removed meanwhile by another `lab down`
            container.remove(force=True, v=True)
        removed.append(container.name)
    for volume in lab_hosts.lab_volumes(client, name):  # once the containers are gone
        lab_hosts.remove_volume(client, volume)
        if volume.rpartition("-")[0] not in removed:  # an orphan: said, as a container is
            removed.append(f"volume {volume}")
    for network in lab_hosts.lab_networks(client, name):  # twins too (lab_networks says why)
        with contextlib.suppress(NotFound):
            network.remove()
        removed.append(f"network {network_name(name)}")
    inventory = inventory_path(name)
    if inventory.exists():
        inventory.unlink()
        removed.append(str(inventory))
    directory = lab_dir(name)
    if directory.exists():
        shutil.rmtree(directory)
        removed.append(str(directory))
    if purge:
        for image in client.images.list(name=f"{PREFIX}-host"):
            for tag in image.tags:
                progress(f"removing image {tag}")
                client.images.remove(tag, force=True)
                removed.append(f"image {tag}")
    return removed
