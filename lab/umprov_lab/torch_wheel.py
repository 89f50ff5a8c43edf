"""The CPU torch wheel for the lab image (and for the venv's CPU self-tests), found where a user
would expect it, in this order:

1. named: ``--torch-wheel`` or ``UMPROV_LAB_TORCH_WHEEL``, a wheel file or a folder of wheels
   (``none``: build without torch). A name that leads to no wheel is an error, not a fallback;
2. on this machine: ``/opt/wheels`` and the lab's own wheel folder (``.lab/wheels``), where a
   wheel downloaded once is kept;
3. PyTorch's own CPU wheel index (https://download.pytorch.org/whl/cpu), where it answers:
   ``pip download`` into the lab's wheel folder, reusing pip's HTTP cache. PyPI's plain
   ``torch`` is not a fallback: for Linux x86_64 it is the CUDA build, gigabytes the lab
   cannot use.

None of these: no wheel. The lab image is then built without torch, and ``umprov verify`` says
so in its report ("no torch"), a failing check as every lab verify is, never a crash.

``python -m umprov_lab.torch_wheel`` prints the wheel for the running Python (the Makefile's
venv step installs it), or exits 1 having said why on stderr.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess  # noqa: S404 - pip, run as the user would run it
import sys
from dataclasses import dataclass
from pathlib import Path

from umprov.errors import EnvironmentProblem
from umprov.paths import project_dir
from umprov_lab.arch import host_arch
from umprov_lab.layout import Progress, quiet

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LOCAL_DIRS = (Path("/opt/wheels"),)
ENV = "UMPROV_LAB_TORCH_WHEEL"
# pip's own connect and read timeout, and no retries: an index that does not answer costs seconds.
CONNECT_TIMEOUT_S = 15
NONE = ("none", "no", "off", "")


@dataclass(frozen=True)
class Target:
    """The interpreter a wheel must fit: the lab base's Python 3.11 on glibc 2.36 (Debian 12)."""

    python: str = "3.11"
    glibc_minor: int = 36

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")


def wheel_dir() -> Path:
    """Where wheels downloaded for the lab are kept (git-ignored, like all of .lab/)."""
    return project_dir() / ".lab" / "wheels"


def fits(name: str, target: Target, machine: str) -> bool:
    """Whether a wheel file name is a CPU torch for this interpreter, machine and glibc."""
    match = re.fullmatch(r"torch-([^-]+)-(cp\d+)-(cp\d+)-(.+)\.whl", name)
    if not match:
        return False
    version, python, abi, platforms = match.groups()
    if python != target.abi or abi != target.abi:
        return False
    # x86_64's CPU builds say so (+cpu); aarch64's plain wheels are CPU builds.
    if "+" in version and not version.endswith("+cpu"):
        return False
    if "+" not in version and machine == "x86_64":
        return False
    for tag in platforms.split("."):
        glibc = re.fullmatch(rf"manylinux_2_(\d+)_{machine}", tag)
        if tag == f"manylinux2014_{machine}" or (glibc and int(glibc[1]) <= target.glibc_minor):
            return True
    return False


def newest(found: list[Path]) -> Path | None:
    def key(path: Path) -> tuple[int, ...]:
        version = path.name.split("-")[1].split("+")[0]
        return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))

    return max(found, key=key) if found else None


def in_folder(folder: Path, target: Target, machine: str) -> Path | None:
    if not folder.is_dir():
        return None
    return newest([p for p in folder.glob("torch-*.whl") if fits(p.name, target, machine)])


def named(value: str, target: Target, machine: str) -> Path | None:
    """The wheel a user named (a file, or a folder holding one); None for 'none'."""
    if value.strip().lower() in NONE:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        found = in_folder(path, target, machine)
        if found is not None:
            return found
        raise EnvironmentProblem(
            f"no CPU torch wheel for Python {target.python} on {machine} in {path} "
            f"(give a wheel, or 'none' to build without torch)")
    raise EnvironmentProblem(
        f"torch wheel not found: {path} (give a wheel or a folder of wheels, or 'none' to build "
        "without torch)")


def run_pip(cmd: list[str]) -> subprocess.CompletedProcess:
    """pip, as the user would run it (its HTTP cache reused); half an hour at most."""
    return subprocess.run(cmd, capture_output=True, text=True, check=False,  # noqa: S603
                          timeout=1800)


def download(dest: Path, target: Target, machine: str, progress: Progress = quiet) -> Path | None:
    """The newest CPU torch from PyTorch's index, into ``dest``; None where it cannot be had."""
    progress(f"looking for a CPU torch wheel on PyTorch's index ({CPU_INDEX}; "
             f"{CONNECT_TIMEOUT_S} s to answer)")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "torch", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--index-url", CPU_INDEX, "--timeout", str(CONNECT_TIMEOUT_S), "--retries", "0",
        "--dest", str(dest), "--python-version", target.python, "--implementation", "cp",
        "--abi", target.abi, "--platform", f"manylinux2014_{machine}",
    ]
    for minor in range(17, target.glibc_minor + 1):
        cmd += ["--platform", f"manylinux_2_{minor}_{machine}"]
    try:
        proc = run_pip(cmd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        progress(f"PyTorch's index: {exc}")
        return None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no output"]
        progress(f"PyTorch's index gave no wheel: {errors[0][:200]}")
        return None
    return in_folder(dest, target, machine)


def find(
    explicit: str | Path | None = None,
    *,
    target: Target | None = None,
    progress: Progress = quiet,
    fetch: bool = True,
) -> Path | None:
    """The CPU torch wheel to use, or None: build without torch (see the module's docstring)."""
    target = target or Target()
    machine = host_arch().machine
    if explicit is not None:
        return named(str(explicit), target, machine)
    if ENV in os.environ:
        return named(os.environ[ENV], target, machine)
    for folder in (*LOCAL_DIRS, wheel_dir()):
        found = in_folder(folder, target, machine)
        if found is not None:
            return found
    return download(wheel_dir(), target, machine, progress) if fetch else None


def _main() -> int:
    """The wheel for this Python on stdout; exit 1 (why on stderr) when there is none."""
    libc = platform.libc_ver()[1].split(".")
    here = Target(python=f"{sys.version_info[0]}.{sys.version_info[1]}",
                  glibc_minor=int(libc[1]) if len(libc) > 1 and libc[1].isdigit() else 17)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    try:
        wheel = find(target=here, progress=say)
    except EnvironmentProblem as exc:
        say(str(exc))
        return 1
    if wheel is None:
        say(f"no CPU torch wheel for Python {here.python} (named, in /opt/wheels or .lab/wheels, "
            f"or from {CPU_INDEX})")
        return 1
    if not fits(wheel.name, here, host_arch().machine):
        say(f"{wheel} is not a CPU torch wheel for this Python {here.python}")
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
