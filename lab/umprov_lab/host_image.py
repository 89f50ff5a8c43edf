"""The lab host image: a small Debian 12 server, built without any registry.

debootstrap makes the root file system, ``host/setup.sh`` configures it in a chroot (the lab
user, key-only sshd, host keys made at first boot, units that mean nothing in a container
masked), and ``docker import`` turns it into an image. The tag hashes the recipe, so a changed
recipe builds a new image and an unchanged one is reused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from umprov.errors import EnvironmentProblem
from umprov.paths import state_dir
from umprov_lab import data
from umprov_lab.layout import LAB_USER, LABEL, PREFIX, Progress, quiet

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


def setup_script() -> str:
    """What runs once inside the debootstrapped tree (chroot), before it is imported."""
    return data.render("host/setup.sh", MIRROR=DEBIAN_MIRROR, SUITE=SUITE, LAB_USER=LAB_USER)


def recipe_tag() -> str:
    digest = hashlib.sha256(
        "\n".join([SUITE, DEBIAN_MIRROR, *PACKAGES, setup_script()]).encode()
    ).hexdigest()[:12]
    return f"{PREFIX}-host:{SUITE}-{digest}"


def ensure_host_image(client: Any, progress: Progress = quiet) -> tuple[str, bool]:
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
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                str(root), DEBIAN_MIRROR]
        rc = _logged(argv, log, append=False)
        if rc != 0:
            raise EnvironmentProblem(f"debootstrap failed (exit {rc}); see {log}")
        script = root / "tmp" / "lab-setup.sh"
        script.write_text(setup_script())
        rc = _logged(["chroot", str(root), "/bin/sh", "/tmp/lab-setup.sh"], log)  # noqa: S108
        script.unlink()
        if rc != 0:
            raise EnvironmentProblem(f"setting up the lab host image failed (exit {rc}); see {log}")
        progress("importing the root file system into Docker")
        _import(client, root, tag)
        client.images.get(tag)
        return tag, True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _logged(argv: list[str], log: Path, *, append: bool = True) -> int:
    with open(log, "ab" if append else "wb") as fh:
        return subprocess.call(  # noqa: S603 - fixed argv
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _import(client: Any, root: Path, tag: str) -> None:
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
            changes=["ENV container=docker", 'CMD ["/sbin/init"]', f"LABEL {LABEL}.image=host"],
        )
    if tar.returncode != 0:
        raise EnvironmentProblem("packing the lab root file system failed")
