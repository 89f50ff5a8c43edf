"""Building the PyTorch-CUDA image (docker/pytorch-cuda) with no index or registry inside.

The build context is assembled on the control machine in umprov's state folder (image-context/,
kept so that its wheels are downloaded once): the Dockerfile and its scripts, plus a wheels/
folder filled here with ``pip download`` for the base image's Python and glibc, and a
requirements.txt naming what to install. Inside the build
``pip install --no-index --find-links`` installs from those wheels only.

Two flavours of the one Dockerfile:

- the default: the official PyTorch CUDA runtime image, which already has torch (its conda
  Python is reused through a ``--system-site-packages`` venv);
- a base without torch (e.g. the lab's Debian 12 host image: python3.11, no pip): torch comes
  from a wheel carried in the context (``torch_wheel``), or, without one, the image has no
  torch (JupyterLab and SSH work; ``umprov verify`` reports that torch cannot be imported).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umprov import __version__
from umprov.errors import ConfigError, EnvironmentProblem, UmprovError
from umprov.hosts.progress import quiet
from umprov.paths import content_file, state_dir

Progress = Callable[[str], None]  # one line about the build

DEFAULT_BASE = "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime"
DEFAULT_TAG = f"umprov/pytorch-cuda:{__version__}"
# What the official image runs on (Ubuntu 22.04, conda Python 3.11), used when the base image
# is not on this machine to ask.
DEFAULT_PYTHON = "3.11"
DEFAULT_GLIBC = "2.35"
# Installed in every flavour; torch joins them for bases without it.
PACKAGES = ("jupyterlab", "ipykernel", "numpy", "pip")
# Files of docker/pytorch-cuda/ that make up the context (wheels/ and requirements are added).
CONTEXT_FILES = (
    "Dockerfile",
    "entrypoint.sh",
    "healthcheck.py",
    "install-python-packages.sh",
    "jupyter_server_config.py",
    "sshd_config",
    "user-setup.sh",
    "managed/umprov_managed.c",  # the managed-memory allocator (docs/managed-memory.md)
    "managed/build.sh",
    "managed/umprov_managed.py",
    "managed/umprov_managed_conf.py",
    "managed/umprov_managed_step.py",
    "managed/umprov_managed_grads.py",
    "managed/umprov_managed_pinned.py",
)


def source_dir() -> Path:
    return content_file("docker", "pytorch-cuda")


@dataclass(frozen=True)
class Target:
    """The interpreter the wheels are downloaded for."""

    python: str  # "3.11"
    glibc: str  # "2.36"

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def platforms(self) -> list[str]:
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        if major != 2 or minor < 17:
            raise ConfigError(f"glibc {self.glibc} is too old for manylinux2014 wheels")
        # pip does not widen manylinux_2_X to older X by itself: name each one.
        return ["manylinux2014_x86_64"] + [f"manylinux_2_{m}_x86_64" for m in range(17, minor + 1)]


@dataclass
class BuildResult:
    tag: str
    image_id: str
    base: str
    size_bytes: int
    seconds: float
    context: Path
    wheels: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "image_id": self.image_id,
            "base": self.base,
            "size_bytes": self.size_bytes,
            "seconds": round(self.seconds, 1),
            "context": str(self.context),
            "wheels": self.wheels,
        }

    def summary(self) -> str:
        """The line people read once the build is done."""
        return (f"built {self.tag} ({self.image_id[7:19]}, {self.size_bytes / 1e9:.2f} GB) "
                f"in {self.seconds:.0f} s")


# ---------------------------------------------------------------------------------------------
# The base image's Python


_PROBE = (
    "import platform, sys; "
    "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.libc_ver()[1])"
)


def probe_base(client: Any, base: str) -> Target | None:
    """Ask a local copy of the base image which Python and glibc it has; None if not local."""
    from docker.errors import ContainerError, ImageNotFound

    try:
        client.images.get(base)
    except ImageNotFound:
        return None
    try:
        out = client.containers.run(
            base,
            ["-c", f"python3 -c \"{_PROBE}\" 2>/dev/null || python -c \"{_PROBE}\""],
            entrypoint="/bin/sh",
            remove=True,
            network_disabled=True,
            user="root",
        )
    except ContainerError as exc:
        raise ConfigError(f"base image {base} has no working python3: {exc}") from None
    fields = out.decode().split()
    if len(fields) != 2 or not re.fullmatch(r"\d+\.\d+", fields[0]):
        raise ConfigError(f"base image {base}: cannot tell its Python version ({out[:80]!r})")
    return Target(python=fields[0], glibc=fields[1])


# ---------------------------------------------------------------------------------------------
# The context


def requirements(torch_wheel: Path | None) -> list[str]:
    reqs = list(PACKAGES)
    if torch_wheel is not None:
        match = re.match(r"torch-([^-]+)-", torch_wheel.name)
        if not match:
            raise ConfigError(f"{torch_wheel}: not a torch wheel file name")
        reqs.insert(0, f"torch=={match.group(1)}")
    return reqs


def download_wheels(
    dest: Path,
    reqs: list[str],
    target: Target,
    *,
    find_links: list[Path],
    progress: Progress = quiet,
) -> int:
    """pip download every wheel the requirements need, for the target interpreter."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = json.dumps({"python": target.python, "glibc": target.glibc, "reqs": reqs})
    stamp = dest / ".target.json"
    if not stamp.exists() or stamp.read_text() == wanted:
        return _pip_download(dest, reqs, target, wanted, find_links, progress)
    # Another interpreter or other requirements: a folder of their own, which replaces the
    # cache only once pip got every wheel (a failed download keeps the old cache).
    fresh = Path(tempfile.mkdtemp(prefix=".wheels-", dir=dest.parent))
    try:
        count = _pip_download(fresh, reqs, target, wanted, find_links, progress)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    shutil.rmtree(dest)
    fresh.rename(dest)
    return count


def _pip_download(dest: Path, reqs: list[str], target: Target, wanted: str,
                  find_links: list[Path], progress: Progress) -> int:
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--dest", str(dest),
        "--only-binary=:all:",
        "--python-version", target.python,
        "--implementation", "cp",
        "--abi", target.abi,
    ]
    for plat in target.platforms():
        cmd += ["--platform", plat]
    for link in find_links:
        cmd += ["--find-links", str(link)]
    cmd += reqs
    progress(f"downloading wheels for Python {target.python} (glibc {target.glibc}) into {dest}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or [
            proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"
        ]
        raise EnvironmentProblem(f"pip download failed: {tail[0]}")
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (dest / ".target.json").write_text(wanted)
    return sum(1 for _ in dest.glob("*.whl"))


def prepare_context(
    target: Target,
    *,
    torch_wheel: Path | None,
    context: Path | None = None,
    progress: Progress = quiet,
) -> tuple[Path, int]:
    """Assemble the build context; return (path, number of wheels)."""
    src = source_dir()
    context = context or state_dir() / "image-context"
    context.mkdir(parents=True, exist_ok=True)
    for name in CONTEXT_FILES:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, context / name)
    find_links: list[Path] = []
    if torch_wheel is not None:
        if not torch_wheel.is_file():
            raise EnvironmentProblem(f"torch wheel not found: {torch_wheel}")
        find_links.append(torch_wheel.parent)
    count = download_wheels(
        context / "wheels",
        requirements(torch_wheel),
        target,
        find_links=find_links,
        progress=progress,
    )
    return context, count


# ---------------------------------------------------------------------------------------------
# Building


def build(
    client: Any,
    *,
    base: str,
    tag: str,
    torch_wheel: Path | None = None,
    python: str | None = None,
    managed_allocator: bool = True,
    progress: Progress = quiet,
) -> BuildResult:
    """Prepare the context and build the image with the docker SDK on ``client``'s engine;
    ``torch_wheel``: torch installed from that wheel, for a base that has none;
    ``managed_allocator``: build umprov's managed-memory allocator into it (gcc in a stage)."""
    from docker.errors import APIError

    started = time.monotonic()
    target = probe_base(client, base)
    if target is None:
        target = Target(python=python or DEFAULT_PYTHON, glibc=DEFAULT_GLIBC)
        progress(
            f"{base} is not on this engine: assuming Python {target.python}, glibc "
            f"{target.glibc} (the build pulls it)"
        )
    elif python and python != target.python:
        raise ConfigError(f"--python {python} does not match {base}'s Python {target.python}")
    context, wheels = prepare_context(target, torch_wheel=torch_wheel, progress=progress)
    progress(f"building {tag} from {base} ({wheels} wheels in the context)")
    last_step = ""
    try:
        stream = client.api.build(
            path=str(context),
            tag=tag,
            buildargs={"BASE_IMAGE": base,
                       "UMPROV_MANAGED_ALLOCATOR": "1" if managed_allocator else "0"},
            labels={"org.umprov.version": __version__, "org.umprov.base": base},
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                raise UmprovError(f"image build failed at {last_step or 'start'}: {detail}")
            line = str(chunk.get("stream", "")).rstrip()
            if line.startswith("Step "):
                last_step = line.split(" :", 1)[0]
                progress(line)
            elif line and not line.startswith(" ---> "):
                progress(f"  {line}")
    except APIError as exc:
        raise UmprovError(f"image build failed: {exc.explanation or exc}") from None
    image = client.images.get(tag)
    return BuildResult(
        tag=tag,
        image_id=image.id,
        base=base,
        size_bytes=int(image.attrs.get("Size", 0)),
        seconds=time.monotonic() - started,
        context=context,
        wheels=wheels,
    )
