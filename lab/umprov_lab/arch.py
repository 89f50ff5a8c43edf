"""The one architecture detection of the lab.

Lab hosts are containers on this machine, so they share its architecture; each consumer spells
it its own way: Debian (the host image, the stand-in packages and the toolkit repository's
folder), NVIDIA's CUDA repository folders, and the platform tags of Python wheels.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

from umprov.errors import EnvironmentProblem


@dataclass(frozen=True)
class Arch:
    debian: str  # amd64, arm64
    cuda: str  # x86_64, sbsa: the folder under compute/cuda/repos/DISTRO/
    machine: str  # x86_64, aarch64: manylinux wheel tags


KNOWN = {
    "x86_64": Arch(debian="amd64", cuda="x86_64", machine="x86_64"),
    "aarch64": Arch(debian="arm64", cuda="sbsa", machine="aarch64"),
}
# What the same machines call themselves elsewhere.
ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


@functools.cache
def host_arch() -> Arch:
    machine = platform.machine().lower()
    arch = KNOWN.get(ALIASES.get(machine, machine))
    if arch is None:
        raise EnvironmentProblem(f"the lab runs on x86_64 or aarch64 machines, not {machine}")
    return arch

