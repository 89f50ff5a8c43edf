"""A converged lab host saved as an image, so that other labs start from it.

Converging Docker on fresh hosts (apt update, docker.io and its dependencies, dpkg) costs
minutes per lab; a lab whose tests are about what runs on Docker, not about installing it,
can start from a host that the roles already converged. The snapshot is the host's file system
as the roles left it, minus what makes a host itself: its SSH host keys (each new host makes
its own at first boot, as from the plain host image), its machine id and the lab key that was
authorised. /var/lib/docker is a volume, so no engine state travels; the running host is not
touched.
"""

from __future__ import annotations

import contextlib
from typing import Any

from umprov.errors import ConfigError, EnvironmentProblem
from umprov_lab.engine import docker_engine
from umprov_lab.hosts import host_containers
from umprov_lab.layout import LAB_USER, LABEL, Progress, check_lab_name, quiet

# What makes a host itself, removed from the copy (a shell script run in a stopped copy).
FORGET = (
    "rm -f /etc/ssh/ssh_host_* "
    f"/home/{LAB_USER}/.ssh/authorized_keys && "
    f"rm -rf /root/.ansible /home/{LAB_USER}/.ansible /tmp/* /var/tmp/* && "
    ": > /etc/machine-id"
)


def snapshot(name: str, index: int, tag: str, progress: Progress = quiet) -> str:
    """Save host ``index`` of lab ``name`` as the image ``tag``; return the image id."""
    check_lab_name(name)
    if ":" not in tag.rsplit("/", 1)[-1]:
        raise ConfigError(f"--tag {tag}: give a repository and a tag, e.g. lab-host:docker")
    client = docker_engine(progress, start=False)
    host = host_containers(client, name).get(index)
    if host is None:
        raise ConfigError(f"lab '{name}' has no host {index}")
    progress(f"copying {host.name}'s file system")
    raw = host.commit()  # pauses the host for the copy only
    try:
        return _forget_and_tag(client, raw.id, tag, progress)
    finally:
        with contextlib.suppress(Exception):
            client.images.remove(raw.id, noprune=False)


def _forget_and_tag(client: Any, raw: str, tag: str, progress: Progress) -> str:
    repository, _, version = tag.rpartition(":")
    copy = client.containers.create(
        raw, command=["/bin/sh", "-c", FORGET], network_mode="none",
        labels={LABEL: ""},  # the host's labels would make the copy one of its lab's hosts
    )
    try:
        copy.start()
        code = copy.wait(timeout=120).get("StatusCode")
        if code != 0:
            logs = copy.logs().decode(errors="replace").strip()[-200:]
            raise EnvironmentProblem(f"preparing the snapshot {tag} failed (exit {code}): {logs}")
        progress(f"saving the snapshot as {tag}")
        image = copy.commit(repository=repository, tag=version,
                            changes=['CMD ["/sbin/init"]', f"LABEL {LABEL}.image=snapshot"])
        return str(image.id)
    finally:
        copy.remove(force=True)
