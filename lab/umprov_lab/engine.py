"""What the lab needs from this machine: a Docker engine, and kernel limits that fit a lab.

Unlike the product, which only talks to an engine that runs, the lab starts ``dockerd`` itself
when it runs as root and none answers, so ``make demo`` works on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from umprov.errors import EnvironmentProblem
from umprov.hosts.engine import local_engine
from umprov.paths import state_dir
from umprov_lab.layout import Progress, quiet


def docker_engine(progress: Progress = quiet, *, start: bool = True) -> Any:
    """A docker SDK client for the local engine (umprov's ``local_engine``), starting dockerd
    when root and none runs."""
    try:
        return local_engine()
    except EnvironmentProblem as exc:
        first_error = exc
    dockerd = shutil.which("dockerd")
    if not start:
        raise first_error
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
    start_detached([dockerd], log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return local_engine()
        except EnvironmentProblem:
            time.sleep(0.5)
    raise EnvironmentProblem(f"dockerd did not answer within 60 s; see {log}")


def start_detached(argv: list[str], log: Path) -> None:
    """Start ``argv`` as a daemon: its own session, and not this process's child (the
    intermediate process exits at once), so no process-tree clean-up of the caller (a test's,
    umprov's after an interrupt) can take the machine's engine down with it."""
    setsid = shutil.which("setsid")  # util-linux: on every Debian
    if setsid is None:
        raise EnvironmentProblem("setsid (util-linux) is not installed: it starts dockerd")
    with open(log, "ab") as fh:
        subprocess.run(  # noqa: S603 - fixed argv, found on PATH
            [setsid, "--fork", *argv], stdout=fh, stderr=fh, stdin=subprocess.DEVNULL,
            check=True, timeout=30,
        )


# Every lab host runs systemd (and its own dockerd), each holding inotify instances; past about
# ten hosts the kernel's default of 128 per user runs out and systemd in a new host stalls at
# boot ("Failed to create inotify object: Too many open files"), so sshd never starts.
INOTIFY_LIMITS = {"max_user_instances": 8192, "max_user_watches": 524288}
INOTIFY_DIR = Path("/proc/sys/fs/inotify")


def ensure_inotify_limits(progress: Progress = quiet) -> list[str]:
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
