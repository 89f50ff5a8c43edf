"""The local lab: simulated GPU hosts in containers, so the whole flow runs without GPUs.

Each lab host is a Debian 12 container running systemd as PID 1 and sshd with key-only login,
published on 127.0.0.1. The host image is built without any registry (debootstrap, then
``docker import``) and cached by a tag that hashes its recipe. ``lab up`` writes an inventory
(inventory/lab/NAME.yml) and a known_hosts file holding the hosts' real host keys, so nothing
downstream weakens host key checking.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, EnvironmentProblem, UmprovError
from umprov.paths import project_dir, state_dir, write_atomic, write_private

LABEL = "umprov.lab"
PREFIX = "umprov-lab"
LAB_USER = "lab"
FIRST_PORT = 22201
DEBIAN_MIRROR = os.environ.get("UMPROV_LAB_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"

# What the host image holds: a small Debian server with systemd, sshd, Python for Ansible,
# and the tools the roles expect on a real server (kmod, initramfs-tools, gnupg, python3-apt).
PACKAGES = (
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "ca-certificates",
    "gnupg",
    "iproute2",
    "kmod",
    "procps",
    "initramfs-tools",
)

# Runs inside the debootstrapped tree (chroot) once, before the tree is imported.
SETUP_SCRIPT = f"""#!/bin/sh
set -eu
rm -f /etc/apt/sources.list
cat > /etc/apt/sources.list.d/debian.sources <<'SRC'
Types: deb
URIs: {DEBIAN_MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
printf 'APT::Install-Recommends "false";\\n' > /etc/apt/apt.conf.d/90lab-no-recommends
groupadd --system docker
useradd --create-home --shell /bin/bash --groups sudo,docker {LAB_USER}
passwd --lock {LAB_USER}
printf '{LAB_USER} ALL=(ALL) NOPASSWD:ALL\\n' > /etc/sudoers.d/{LAB_USER}
chmod 0440 /etc/sudoers.d/{LAB_USER}
cat > /etc/ssh/sshd_config.d/10-lab.conf <<'SSHD'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UseDNS no
SSHD
# Every container makes its own host keys at first boot, before sshd starts.
rm -f /etc/ssh/ssh_host_*
cat > /etc/systemd/system/lab-ssh-hostkeys.service <<'UNIT'
[Unit]
Description=Generate this lab host's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
systemctl enable lab-ssh-hostkeys.service ssh.service
# Units that have no meaning in a container, and apt timers that would race the tests for
# the apt lock at random moments.
systemctl mask getty.target console-getty.service systemd-udevd.service \\
  systemd-udevd-kernel.socket systemd-udevd-control.socket systemd-modules-load.service \\
  sys-kernel-config.mount sys-kernel-debug.mount systemd-remount-fs.service \\
  apt-daily.timer apt-daily-upgrade.timer
: > /etc/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/lib/apt/periodic/*
# An emptied list folder must look old, as on a host that never ran apt-get update, or apt
# clients that trust its age (Ansible's cache_valid_time) skip the update.
touch -d @0 /var/lib/apt/lists
"""


def recipe_tag() -> str:
    digest = hashlib.sha256(
        "\n".join([SUITE, DEBIAN_MIRROR, *PACKAGES, SETUP_SCRIPT]).encode()
    ).hexdigest()[:12]
    return f"{PREFIX}-host:{SUITE}-{digest}"


@dataclass
class LabHost:
    name: str
    container: str
    port: int
    state: str
    host_keys: list[str] = field(default_factory=list)


@dataclass
class LabResult:
    lab: str
    inventory: Path
    known_hosts: Path
    key_file: Path
    hosts: list[LabHost]
    changes: list[str]
    registry: Any = None  # lab_registry.LabRegistry when the lab has one

    def to_dict(self) -> dict[str, Any]:
        return {
            "lab": self.lab,
            "registry": self.registry.to_dict() if self.registry else None,
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


Progress = Callable[[str], None]


def _quiet(_msg: str) -> None:
    return None


def check_lab_name(name: str) -> str:
    if not name or not all(c.isalnum() or c == "-" for c in name) or name.startswith("-"):
        raise ConfigError(f"lab name '{name}' must be letters, digits and '-' only")
    if len(name) > 24:
        raise ConfigError(f"lab name '{name}' is longer than 24 characters")
    return name


def lab_dir(name: str) -> Path:
    return project_dir() / ".lab" / name


def inventory_path(name: str) -> Path:
    return project_dir() / "inventory" / "lab" / f"{name}.yml"


# ---------------------------------------------------------------------------------------------
# The Docker engine


def docker_engine(progress: Progress = _quiet, *, start: bool = True) -> Any:
    """A docker SDK client for the local engine, starting dockerd when root and none runs."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=300)
        client.ping()
        return client
    except DockerException as exc:
        first_error = exc
    dockerd = shutil.which("dockerd")
    if not start:
        raise EnvironmentProblem(f"no Docker engine answers: {first_error}")
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "no Docker engine answers; start one (e.g. `sudo systemctl start docker`) "
            "or run as root so the lab starts dockerd itself"
        )
    if dockerd is None:
        raise EnvironmentProblem(
            "no Docker engine answers and dockerd is not installed: `apt-get install docker.io`"
        )
    log = state_dir() / "logs" / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    progress(f"starting dockerd (log: {log})")
    with open(log, "ab") as fh:
        subprocess.Popen(  # noqa: S603 - fixed argv, found on PATH above
            [dockerd], stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            client = docker.from_env(timeout=300)
            client.ping()
            return client
        except DockerException:
            time.sleep(0.5)
    raise EnvironmentProblem(f"dockerd did not answer within 60 s; see {log}")


# ---------------------------------------------------------------------------------------------
# The host image


def ensure_host_image(client: Any, progress: Progress = _quiet) -> tuple[str, bool]:
    """Return (tag, built): the cached host image, built with debootstrap if missing."""
    from docker.errors import ImageNotFound

    tag = recipe_tag()
    try:
        client.images.get(tag)
        return tag, False
    except ImageNotFound:
        pass
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            f"the lab host image {tag} is not built yet and building it needs root "
            "(debootstrap): run `umprov lab up` once as root"
        )
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None
    )
    if debootstrap is None:
        raise EnvironmentProblem("debootstrap is not installed: `apt-get install debootstrap`")
    work = Path(tempfile.mkdtemp(prefix="umprov-lab-rootfs-", dir="/var/tmp"))
    root = work / "root"
    log = state_dir() / "logs" / "debootstrap.log"
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        progress(f"building the lab host image {tag} with debootstrap (about a minute; log: {log})")
        with open(log, "wb") as fh:
            rc = subprocess.call(  # noqa: S603 - fixed argv
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(root),
                    DEBIAN_MIRROR,
                ],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if rc != 0:
            raise EnvironmentProblem(f"debootstrap failed (exit {rc}); see {log}")
        script = root / "tmp" / "lab-setup.sh"
        script.write_text(SETUP_SCRIPT)
        with open(log, "ab") as fh:
            rc = subprocess.call(  # noqa: S603 - fixed argv
                ["chroot", str(root), "/bin/sh", "/tmp/lab-setup.sh"],  # noqa: S108, S607
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        script.unlink()
        if rc != 0:
            raise EnvironmentProblem(f"setting up the lab host image failed (exit {rc}); see {log}")
        progress("importing the root file system into Docker")
        repo, _, version = tag.partition(":")
        with subprocess.Popen(  # noqa: S603
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."],  # noqa: S607
            stdout=subprocess.PIPE,
        ) as tar:
            client.api.import_image(
                src=tar.stdout,
                repository=repo,
                tag=version,
                stream_src=True,
                changes=[
                    "ENV container=docker",
                    'CMD ["/sbin/init"]',
                    f"LABEL {LABEL}.image=host",
                ],
            )
        if tar.returncode != 0:
            raise EnvironmentProblem("packing the lab root file system failed")
        client.images.get(tag)
        return tag, True
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Keys


def _ensure_key(path: Path) -> bool:
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


# ---------------------------------------------------------------------------------------------
# Containers


def _containers(client: Any, name: str) -> dict[int, Any]:
    found = client.containers.list(all=True, filters={"label": f"{LABEL}={name}"})
    out: dict[int, Any] = {}
    for c in found:
        index = c.labels.get(f"{LABEL}.index")
        if index and index.isdigit():
            out[int(index)] = c
    return out


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
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        port = c.labels.get(f"{LABEL}.port", "")
        if port.isdigit():
            used.add(int(port))
    return used


def _pick_port(client: Any, taken: set[int]) -> int:
    used = _used_ports(client) | taken
    for port in range(FIRST_PORT, FIRST_PORT + 2000):
        if port not in used and _port_free(port):
            return port
    raise EnvironmentProblem(f"no free port on 127.0.0.1 from {FIRST_PORT} to {FIRST_PORT + 1999}")


def _exec(container: Any, cmd: list[str], *, user: str = "root") -> str:
    result = container.exec_run(cmd, user=user, demux=False)
    output = (result.output or b"").decode(errors="replace")
    if result.exit_code != 0:
        raise UmprovError(
            f"lab host {container.name}: `{' '.join(cmd)}` failed ({result.exit_code}): "
            f"{output.strip()[:200]}"
        )
    return output


def _wait_for_sshd(container: Any, timeout: float = 90.0) -> None:
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


def _install_key(container: Any, public_key: str) -> None:
    home = f"/home/{LAB_USER}/.ssh"
    script = (
        f"install -d -m 0700 -o {LAB_USER} -g {LAB_USER} {home} && "
        f"printf '%s\\n' \"$KEY\" > {home}/authorized_keys && "
        f"chown {LAB_USER}:{LAB_USER} {home}/authorized_keys && chmod 0600 {home}/authorized_keys"
    )
    result = container.exec_run(["sh", "-c", script], environment={"KEY": public_key.strip()})
    if result.exit_code != 0:
        raise UmprovError(f"lab host {container.name}: cannot install the lab key")


def _host_keys(container: Any) -> list[str]:
    text = _exec(container, ["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"])
    return [" ".join(line.split()[:2]) for line in text.splitlines() if line.strip()]


def _network(client: Any, name: str) -> Any:
    from docker.errors import NotFound

    net_name = f"{PREFIX}-{name}"
    try:
        return client.networks.get(net_name), False
    except NotFound:
        return client.networks.create(net_name, driver="bridge", labels={LABEL: name}), True


def _create_host(client: Any, name: str, index: int, image: str, port: int) -> Any:
    container_name = f"{PREFIX}-{name}-{index}"
    return client.containers.run(
        image,
        name=container_name,
        hostname=f"lab-{name}-{index}",
        detach=True,
        network=f"{PREFIX}-{name}",
        labels={
            LABEL: name,
            f"{LABEL}.index": str(index),
            f"{LABEL}.port": str(port),
            f"{LABEL}.image": image,
        },
        ports={"22/tcp": ("127.0.0.1", port)},
        cap_add=["ALL"],
        cap_drop=["SYS_RESOURCE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        tmpfs={"/run": "rw,mode=755", "/run/lock": "rw,mode=1777"},
        volumes={
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "ro"},
            f"{container_name}-docker": {"bind": "/var/lib/docker", "mode": "rw"},
        },
        restart_policy={"Name": "always"},
        environment={"container": "docker"},
        stop_signal="SIGRTMIN+3",  # systemd's clean shutdown signal
    )


def host_name(name: str, index: int) -> str:
    return f"lab-{name}-{index}"


# ---------------------------------------------------------------------------------------------
# Inventory


def render_inventory(
    name: str, hosts: list[LabHost], key_file: Path, known_hosts: Path, registry: Any = None
) -> str:
    import yaml

    extra: dict[str, Any] = {}
    if registry is not None:
        # The docker_engine role installs the lab CA where the engines look for it.
        extra["docker_engine_registry_ca_certs"] = [
            {"registry": registry.address, "certificate": registry.ca_file.read_text()}
        ]

    group = {
        "hosts": {h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for h in hosts},
        "vars": {
            "ansible_user": LAB_USER,
            "ansible_become": True,
            "ansible_ssh_private_key_file": str(key_file),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
            ),
            "umprov_known_hosts": str(known_hosts),
            "umprov_lab": True,
            "umprov_gpus": "none",
            "umprov_image": lab_image_tag(),
            **lab_role_vars(name),
            **extra,
        },
    }
    body = yaml.safe_dump({"all": {"children": {"gpu_hosts": group}}}, sort_keys=False)
    return (
        f"# Generated by `umprov lab up --name {name}`;"
        f" `umprov lab down --name {name}` removes it.\n"
        "# Lab hosts are containers on this machine; host keys are pinned in the known_hosts\n"
        "# file named below, so host key checking stays on.\n" + body
    )


def lab_image_tag() -> str:
    """The PyTorch image `umprov image build --lab` makes, which lab hosts run."""
    from umprov.image import LAB_TAG

    return LAB_TAG


REPO_PORT = 8080
# PID 1's start time (jiffies after the kernel's boot) changes when a lab host's container
# restarts, which the kernel's boot_id, shared with the machine, does not.
LAB_BOOT_TIME_COMMAND = "cut -d' ' -f22 /proc/1/stat"


def repo_url(name: str) -> str:
    return f"http://{PREFIX}-{name}-repo:{REPO_PORT}"


def lab_role_vars(name: str) -> dict[str, Any]:
    """Role variables that point the roles at the lab: its stand-in repositories, no GPU."""
    from umprov.lab_repo import role_variables

    base = repo_url(name) + "/"
    relative = {
        "relative_urls": {
            "cuda_repo": "compute/cuda/repos/debian12/x86_64/",
            "toolkit_repo": "libnvidia-container/stable/deb/amd64/",
            "public_key_asc": "umprov-lab.asc",
        }
    }
    return {
        **role_variables(base, relative),
        "nvidia_driver_require_gpu": False,
        # A container runs the machine's kernel, whose headers no apt repository has.
        "nvidia_driver_require_kernel_headers": False,
        "nvidia_driver_reboot_boot_time_command": LAB_BOOT_TIME_COMMAND,
        "docker_engine_source": "distribution",
    }


def _repo_stamp() -> str:
    import umprov.lab_repo as lab_repo

    return hashlib.sha256(Path(lab_repo.__file__).read_bytes()).hexdigest()[:16]


def ensure_repo(client: Any, name: str, image: str, progress: Progress = _quiet) -> list[str]:
    """Build the signed stand-in repository (once per recipe) and serve it on the lab network."""
    from docker.errors import NotFound

    from umprov.lab_repo import LabRepoError, build_stand_in_repo

    changes: list[str] = []
    directory = lab_dir(name)
    root = directory / "repo"
    stamp = directory / "repo.stamp"
    if not stamp.exists() or stamp.read_text() != _repo_stamp():
        progress("building the lab's signed stand-in apt repository")
        try:
            build_stand_in_repo(root, key_dir=directory / "repo-key")
        except LabRepoError as exc:
            raise EnvironmentProblem(f"cannot build the lab repository: {exc}") from None
        stamp.write_text(_repo_stamp())
        changes.append("built the stand-in apt repository")
    container_name = f"{PREFIX}-{name}-repo"
    try:
        container = client.containers.get(container_name)
        if container.status != "running":
            container.start()
            changes.append(f"started {container_name}")
    except NotFound:
        progress(f"serving the repository from {container_name}")
        client.containers.run(
            image,
            ["python3", "-m", "http.server", str(REPO_PORT), "--directory", "/srv/repo"],
            name=container_name,
            hostname=container_name,
            detach=True,
            network=f"{PREFIX}-{name}",
            labels={LABEL: name, f"{LABEL}.role": "repo"},
            volumes={str(root): {"bind": "/srv/repo", "mode": "ro"}},
            restart_policy={"Name": "always"},
            user="nobody",
        )
        changes.append(f"created {container_name}")
    return changes


def ensure_registry(
    client: Any, name: str, image: str, taken: set[int], progress: Progress = _quiet
) -> tuple[Any, list[str]]:
    """The lab's TLS registry (lab_registry), on the lab network and on a loopback port."""
    from docker.errors import NotFound

    from umprov import lab_registry

    changes: list[str] = []
    container_name = lab_registry.container_name(PREFIX, name)
    tls_dir = lab_dir(name) / "registry"
    remade = lab_registry.ensure_tls(tls_dir, container_name)
    if remade:
        changes.append("made the lab registry's CA and certificate")
    config = tls_dir / "config.yml"
    if _write_if_changed(config, lab_registry.CONFIG):
        changes.append(f"wrote {config}")
    try:
        container = client.containers.get(container_name)
    except NotFound:
        container = None
    if container is not None and remade:
        # A new certificate: the running registry still serves the old one.
        container.remove(force=True)
        container = None
    if container is not None and container.status != "running":
        container.start()
        changes.append(f"started {container_name}")
    if container is None:
        binary = lab_registry.registry_binary()
        with machine_lock():  # from the probed port to the container that holds it
            port = _pick_port(client, taken)
            progress(f"serving the lab registry from {container_name} (127.0.0.1:{port})")
            container = client.containers.run(
                image,
                ["/usr/local/bin/docker-registry", "serve", "/etc/umprov-registry/config.yml"],
                entrypoint=[],
                name=container_name,
                hostname=container_name,
                detach=True,
                network=f"{PREFIX}-{name}",
                labels={LABEL: name, f"{LABEL}.role": "registry", f"{LABEL}.port": str(port)},
                ports={f"{lab_registry.REGISTRY_PORT}/tcp": ("127.0.0.1", port)},
                volumes={
                    binary: {"bind": "/usr/local/bin/docker-registry", "mode": "ro"},
                    str(tls_dir): {"bind": "/etc/umprov-registry", "mode": "ro"},
                    f"{container_name}-data": {"bind": "/var/lib/registry", "mode": "rw"},
                },
                restart_policy={"Name": "always"},
            )
        changes.append(f"created {container_name}")
    port = int(container.labels[f"{LABEL}.port"])
    taken.add(port)
    registry = lab_registry.LabRegistry(
        address=lab_registry.address(PREFIX, name), local=f"127.0.0.1:{port}",
        ca_file=tls_dir / "ca.crt", container=container_name,
    )
    return registry, changes


def render_known_hosts(hosts: list[LabHost]) -> str:
    lines = []
    for h in hosts:
        for key in h.host_keys:
            lines.append(f"[127.0.0.1]:{h.port} {key}")
    return "\n".join(lines) + ("\n" if lines else "")


def _write_if_changed(path: Path, text: str, *, private: bool = False) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    (write_private if private else write_atomic)(path, text)
    return True


# ---------------------------------------------------------------------------------------------
# Commands


# Every lab host runs systemd (and its own dockerd), each holding inotify instances; past about
# ten hosts the kernel's default of 128 per user runs out and systemd in a new host stalls at
# boot ("Failed to create inotify object: Too many open files"), so sshd never starts.
INOTIFY_LIMITS = {"max_user_instances": 8192, "max_user_watches": 524288}
INOTIFY_DIR = Path("/proc/sys/fs/inotify")


def ensure_inotify_limits(progress: Progress = _quiet) -> list[str]:
    """Raise fs.inotify limits that are too low for a lab (root), or say how (otherwise)."""
    raised = []
    for key, wanted in INOTIFY_LIMITS.items():
        path = INOTIFY_DIR / key
        try:
            current = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if current >= wanted:
            continue
        try:
            path.write_text(f"{wanted}\n")
        except OSError:
            raise EnvironmentProblem(
                f"fs.inotify.{key} is {current}, too low for lab hosts that each run systemd: "
                f"run `sysctl -w fs.inotify.{key}={wanted}` as root"
            ) from None
        progress(f"raised fs.inotify.{key} from {current} to {wanted}")
        raised.append(f"raised fs.inotify.{key} to {wanted}")
    return raised


def up(name: str, count: int, progress: Progress = _quiet, *, registry: bool = False) -> LabResult:
    """Create or complete a lab; ``registry`` adds the lab registry (kept by later calls)."""
    check_lab_name(name)
    if not 1 <= count <= 64:
        raise ConfigError(f"--hosts {count}: a lab holds 1 to 64 hosts")
    with machine_lock():  # one dockerd, one host image build, however many callers
        client = docker_engine(progress)
        ensure_inotify_limits(progress)
        image, built = ensure_host_image(client, progress)
    changes: list[str] = []
    if built:
        changes.append(f"built image {image}")
    _net, net_created = _network(client, name)
    if net_created:
        changes.append(f"created network {PREFIX}-{name}")
    directory = lab_dir(name)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file = directory / "id_ed25519"
    if _ensure_key(key_file):
        changes.append("created the lab SSH key")
    changes += ensure_repo(client, name, image, progress)
    public_key = key_file.with_suffix(".pub").read_text()

    existing = _containers(client, name)
    for index, container in sorted(existing.items()):
        if index > count:
            progress(f"removing {container.name} (lab now has {count} hosts)")
            container.remove(force=True, v=True)
            _remove_volume(client, f"{container.name}-docker")
            changes.append(f"removed {container.name}")
    hosts: list[LabHost] = []
    taken: set[int] = set()
    for index in range(1, count + 1):
        container = existing.get(index)
        if container is None:
            with machine_lock():  # from the probed port to the container that holds it
                port = _pick_port(client, taken)
                progress(f"creating {PREFIX}-{name}-{index} (ssh on 127.0.0.1:{port})")
                container = _create_host(client, name, index, image, port)
            changes.append(f"created {container.name}")
        else:
            port = int(container.labels[f"{LABEL}.port"])
            if container.status != "running":
                progress(f"starting {container.name}")
                container.start()
                changes.append(f"started {container.name}")
        taken.add(port)
        hosts.append(LabHost(host_name(name, index), container.name, port, "running"))
    for host in hosts:
        container = client.containers.get(host.container)
        _wait_for_sshd(container)
        _install_key(container, public_key)
        host.host_keys = _host_keys(container)
        host.state = container.status

    lab_registry = None
    if registry or _has_registry(client, name):
        lab_registry, made = ensure_registry(client, name, image, taken, progress)
        changes += made

    known_hosts = directory / "known_hosts"
    if _write_if_changed(known_hosts, render_known_hosts(hosts)):
        changes.append(f"wrote {known_hosts}")
    inventory = inventory_path(name)
    text = render_inventory(name, hosts, key_file, known_hosts, lab_registry)
    if _write_if_changed(inventory, text):
        changes.append(f"wrote {inventory}")
    return LabResult(name, inventory, known_hosts, key_file, hosts, changes, lab_registry)


def _has_registry(client: Any, name: str) -> bool:
    found = client.containers.list(
        all=True, filters={"label": [f"{LABEL}={name}", f"{LABEL}.role=registry"]}
    )
    return bool(found)


def status(name: str | None = None) -> list[dict[str, Any]]:
    client = docker_engine(start=False)
    filters = {"label": f"{LABEL}={name}" if name else LABEL}
    rows = []
    for c in client.containers.list(all=True, filters=filters):
        if f"{LABEL}.index" not in c.labels:
            continue
        health = c.attrs.get("State", {}).get("Health", {}).get("Status")
        rows.append(
            {
                "lab": c.labels[LABEL],
                "host": host_name(c.labels[LABEL], int(c.labels[f"{LABEL}.index"])),
                "container": c.name,
                "state": c.status + (f" ({health})" if health else ""),
                "ssh": f"127.0.0.1:{c.labels.get(f'{LABEL}.port', '?')}",
                "image": c.labels.get(f"{LABEL}.image", ""),
            }
        )
    rows.sort(key=lambda r: (r["lab"], r["container"]))
    return rows


def _remove_volume(client: Any, volume: str) -> None:
    from docker.errors import NotFound

    with contextlib.suppress(NotFound):
        client.volumes.get(volume).remove(force=True)


def down(name: str, *, purge: bool = False, progress: Progress = _quiet) -> list[str]:
    from docker.errors import NotFound

    check_lab_name(name)
    client = docker_engine(progress, start=False)
    removed: list[str] = []
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}={name}"}):
        progress(f"removing {container.name}")
        container.remove(force=True, v=True)
        removed.append(container.name)
        for suffix in ("-docker", "-data"):  # a host's Docker storage, the registry's data
            _remove_volume(client, f"{container.name}{suffix}")
    try:
        client.networks.get(f"{PREFIX}-{name}").remove()
        removed.append(f"network {PREFIX}-{name}")
    except NotFound:
        pass
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
