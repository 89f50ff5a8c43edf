"""A lab's Slurm cluster (`umprov lab up --slurm`): Debian 12's own slurm-wlm and munge.

The hosts and one more container, the controller (``umprov-lab-NAME-slurmctld``, not an
inventory host), run a derived image: the lab host image with the two packages installed
(``slurm_files/Dockerfile``, tag keyed by its recipe, built once per machine like the host
image). systemd is PID 1 in every lab container, so the daemons are Debian's own units:
munge and slurmctld on the controller, munge and slurmd on each host; they come back after a
container restart. One MUNGE key per lab (``.lab/NAME/munge.key``, 0400 munge in each
container) and one slurm.conf in ``.lab/NAME/slurm/``, a folder every container of the lab
mounts at /etc/slurm, as a cluster shares /etc/slurm: a role that edits it on one node
(slurm_gpu_health's block) edits it for the controller and every node at once.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, EnvironmentProblem, UmprovError
from umprov.paths import write_private
from umprov_lab import data
from umprov_lab.hosts import LabHost, lab_containers, machine_lock, systemd_container
from umprov_lab.layout import (
    LABEL,
    PREFIX,
    Progress,
    container_name,
    lab_dir,
    network_name,
    quiet,
    write_if_changed,
)

ROLE = "slurmctld"  # the controller's role label
CONF_DIR = "/etc/slurm"
SLURMD_TIMEOUT_S = 30
PARTITION_LINE = "PartitionName=lab "  # the last line of the lab's part of slurm.conf
SETTLED_WAIT_S = 120.0


@dataclass
class LabSlurm:
    controller: str  # its container name, also its host name and SlurmctldHost
    conf: Path  # slurm.conf on this machine (the hosts' /etc/slurm/slurm.conf)
    nodes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"controller": self.controller, "conf": str(self.conf), "nodes": self.nodes}


# -- pure parts: the image recipe, slurm.conf
def image_recipe(base: str) -> str:
    return data.render("slurm_files/Dockerfile", BASE=base)


def image_tag(base: str) -> str:
    digest = hashlib.sha256(image_recipe(base).encode()).hexdigest()[:12]
    return f"{PREFIX}-host:slurm-{digest}"


def controller_name(name: str) -> str:
    return container_name(name, ROLE)


def conf_dir(name: str) -> Path:
    return lab_dir(name) / "slurm"


def render_conf(name: str, hosts: list[LabHost], *, slurmd_timeout: int = SLURMD_TIMEOUT_S) -> str:
    """The lab's part of slurm.conf: the controller, the nodes (by host name, reached by
    container name on the lab network), one partition with them all."""
    nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.container} CPUs=1 State=UNKNOWN"
                      for h in hosts)
    return data.render("slurm_files/slurm.conf", LAB=name, CONTROLLER=controller_name(name),
                       SLURMD_TIMEOUT=str(slurmd_timeout), NODES=nodes)


def merge_conf(lab_part: str, existing: str | None) -> str:
    """slurm.conf with the lab's part first and what others added after it kept."""
    if not existing:
        return lab_part
    tail = ""
    lines = existing.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(PARTITION_LINE):
            tail = "".join(lines[i + 1:])
            break
    return lab_part + tail


# -- the image
def ensure_image(client: Any, base: str, progress: Progress = quiet) -> tuple[str, bool]:
    """(tag, built): the Slurm host image on ``base``, built with apt-get if missing."""
    from docker.errors import BuildError, ImageNotFound

    tag = image_tag(base)
    with machine_lock():
        try:
            client.images.get(tag)
            return tag, False
        except ImageNotFound:
            pass
        progress(f"building the lab's Slurm host image {tag} (apt-get install slurm-wlm munge)")
        recipe = io.BytesIO(image_recipe(base).encode())
        try:
            client.images.build(fileobj=recipe, tag=tag, rm=True, forcerm=True, pull=False)
        except BuildError as exc:
            said = " ".join(str(c.get("stream", "")).strip() for c in exc.build_log)[-300:]
            raise EnvironmentProblem(f"building {tag} failed: {exc.msg}: {said}") from None
    return tag, True


# -- the cluster
def has_slurm(client: Any, name: str) -> bool:
    return bool(lab_containers(client, f"{LABEL}={name}", f"{LABEL}.role={ROLE}"))


def mounts(name: str) -> dict[str, dict[str, str]]:
    return {str(conf_dir(name)): {"bind": CONF_DIR, "mode": "rw"}}


def ensure_slurm(client: Any, name: str, hosts: list[LabHost], image: str,
                 progress: Progress = quiet) -> tuple[LabSlurm, list[str]]:
    """The controller and slurmd on every host, running and registered; what changed."""
    changes: list[str] = []
    containers = [client.containers.get(h.container) for h in hosts]
    for container in containers:
        if not _mounts_conf(container):
            raise ConfigError(f"lab '{name}': {container.name} was made without --slurm; "
                              f"`umprov lab down --name {name}` first")
    conf = conf_dir(name) / "slurm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    old = conf.read_text() if conf.exists() else None
    conf_changed = write_if_changed(conf, merge_conf(render_conf(name, hosts), old))
    if conf_changed:
        changes.append(f"wrote {conf}")
    key = _ensure_key(lab_dir(name) / "munge.key", changes)
    controller, created = _ensure_controller(client, name, image, progress)
    if created:
        changes.append(f"created {controller.name}")
    restart = conf_changed and old is not None  # nodes came or went: every daemon re-reads
    _start(controller, key, ["munge.service", "slurmctld.service"], restart, changes)
    for container in containers:
        _start(container, key, ["munge.service", "slurmd.service"], restart, changes)
    nodes = [h.name for h in hosts]
    wait_settled(controller, nodes, progress)
    return LabSlurm(controller.name, conf, nodes), changes


def _mounts_conf(container: Any) -> bool:
    return any(m.get("Destination") == CONF_DIR for m in container.attrs.get("Mounts") or [])


def _ensure_key(path: Path, changes: list[str]) -> bytes:
    if not path.exists():
        write_private(path, os.urandom(1024))  # munge's own key size
        changes.append("made the lab's MUNGE key")
    return path.read_bytes()


def _ensure_controller(client: Any, name: str, image: str,
                       progress: Progress) -> tuple[Any, bool]:
    from docker.errors import NotFound

    server = controller_name(name)
    try:
        container = client.containers.get(server)
        if container.status != "running":
            container.start()
        return container, False
    except NotFound:
        pass
    progress(f"creating {server} (slurmctld)")
    container = client.containers.run(
        image, name=server, hostname=server, detach=True, network=network_name(name),
        labels={LABEL: name, f"{LABEL}.role": ROLE, f"{LABEL}.image": image},
        **systemd_container(mounts(name)),
    )
    return container, True


def _exec(container: Any, argv: list[str]) -> str:
    result = container.exec_run(argv, user="root")
    text = (result.output or b"").decode(errors="replace").strip()
    if result.exit_code != 0:
        raise UmprovError(f"lab host {container.name}: `{' '.join(argv)}` failed "
                          f"({result.exit_code}): {text[-300:]}")
    return text


def _wait_systemd(container: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = container.exec_run(["systemctl", "is-system-running"]).output or b""
        if state.strip() in (b"running", b"degraded"):
            return
        time.sleep(0.5)
    raise UmprovError(f"lab host {container.name}: systemd did not finish booting in {timeout} s")


def _start(container: Any, key: bytes, units: list[str], restart: bool,
           changes: list[str]) -> None:
    """The lab's MUNGE key in place, then ``units`` enabled (so a restarted container brings
    them back) and running; ``restart``: running ones restart too (slurm.conf changed)."""
    _wait_systemd(container)
    new_key = container.exec_run(["test", "-s", "/etc/munge/munge.key"]).exit_code != 0
    if new_key:
        uid = int(_exec(container, ["id", "-u", "munge"]))
        gid = int(_exec(container, ["id", "-g", "munge"]))
        container.put_archive("/etc/munge", _one_file_tar("munge.key", key, uid, gid))
        changes.append(f"gave {container.name} the MUNGE key")

    def ok(verb: str, unit: str) -> bool:  # one unit at a time: several answer "any of them"
        return container.exec_run(["systemctl", verb, "--quiet", unit]).exit_code == 0

    running = [u for u in units if ok("is-active", u)]
    again = [u for u in running if restart or (new_key and u.startswith("munge"))]
    if again:
        _exec(container, ["systemctl", "restart", *again])
        changes.append(f"restarted {', '.join(again)} on {container.name}")
    off = [u for u in units if u not in running or not ok("is-enabled", u)]
    if off:
        _exec(container, ["systemctl", "enable", "--now", *off])
        changes.append(f"enabled {', '.join(off)} on {container.name}")


def _one_file_tar(name: str, content: bytes, uid: int, gid: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.uid, info.gid = len(content), 0o400, uid, gid
        tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def parse_states(sinfo: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N %T'``'s lines as node -> state (``idle``, ``drained``, ``down*``)."""
    return dict(line.split(None, 1) for line in sinfo.splitlines() if " " in line)


def wait_settled(controller: Any, nodes: list[str], progress: Progress = quiet,
                 timeout: float = SETTLED_WAIT_S) -> None:
    """Until every node answers slurmctld (no ``*``, not down or unknown): its state is then
    Slurm's own (idle, or drained with the reason someone gave it)."""
    progress(f"waiting for {len(nodes)} Slurm node(s) to register")
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        ok = controller.exec_run(["sinfo", "-h", "-N", "-o", "%N %T"])
        said = (ok.output or b"").decode(errors="replace")
        if ok.exit_code == 0:
            states = parse_states(said)
            if all(_answers(states.get(n, "")) for n in nodes):
                return
        time.sleep(1.0)
    late = ", ".join(f"{n} {states.get(n, 'unknown to slurmctld')}" for n in nodes
                     if not _answers(states.get(n, ""))) or " ".join(said.split())[-200:]
    raise UmprovError(f"lab Slurm: nodes not registered within {timeout:.0f} s: {late} "
                      f"(logs: /var/log/slurm/ in the containers)")


def _answers(state: str) -> bool:
    return bool(state) and not state.endswith("*") and state.split("+")[0] not in (
        "down", "unknown", "future")
