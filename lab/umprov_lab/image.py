"""`umprov lab image`: the PyTorch image for lab hosts, built with umprov's image builder on
this machine's engine: the lab host image as the base (Debian 12, python3.11, no pip) and
torch from a CPU wheel carried in the build context."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from umprov import __version__
from umprov_lab.arch import host_arch
from umprov_lab.layout import Progress, quiet

# What lab hosts run: the lab inventory names it as umprov_image.
LAB_TAG = f"umprov/pytorch-cuda:{__version__}-lab"


def default_torch_wheel() -> Path:
    """The CPU torch wheel the lab image carries, unless UMPROV_LAB_TORCH_WHEEL names another."""
    machine = host_arch().machine
    return Path(os.environ.get(
        "UMPROV_LAB_TORCH_WHEEL",
        f"/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_{machine}.whl",
    ))


def build(
    client: Any,
    *,
    tag: str | None = None,
    torch_wheel: Path | None = None,
    progress: Progress = quiet,
) -> Any:
    """Build the lab image on ``client``'s engine (the host image first, if it is missing);
    returns umprov.image's BuildResult."""
    from umprov import image
    from umprov_lab.host_image import ensure_host_image

    base, _built = ensure_host_image(client, progress)
    return image.build(
        client, base=base, tag=tag or LAB_TAG,
        torch_wheel=torch_wheel or default_torch_wheel(), progress=progress,
    )
