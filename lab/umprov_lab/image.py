"""`umprov lab image`: the PyTorch image for lab hosts, built with umprov's image builder on
this machine's engine: the lab host image as the base (Debian 12, python3.11, no pip) and
torch from a CPU wheel carried in the build context (found by ``torch_wheel``), or no torch at
all where none can be had: verify then reports "no torch" for the lab's containers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from umprov import __version__
from umprov_lab import torch_wheel as wheels
from umprov_lab.layout import Progress, quiet

# What lab hosts run: the lab inventory names it as umprov_image.
LAB_TAG = f"umprov/pytorch-cuda:{__version__}-lab"


def build(
    client: Any,
    *,
    tag: str | None = None,
    torch_wheel: Path | str | None = None,
    progress: Progress = quiet,
) -> Any:
    """Build the lab image on ``client``'s engine (the host image first, if it is missing);
    returns umprov.image's BuildResult. ``torch_wheel``: a wheel, a folder of wheels or "none"
    (default: UMPROV_LAB_TORCH_WHEEL, else one found as umprov_lab.torch_wheel finds it)."""
    from umprov import image
    from umprov_lab.host_image import ensure_host_image

    wheel = wheels.find(torch_wheel, progress=progress)
    if wheel is None:
        progress("no CPU torch wheel: building the lab image WITHOUT torch (umprov verify will "
                 "report 'no torch'; --torch-wheel or UMPROV_LAB_TORCH_WHEEL names one)")
    else:
        progress(f"torch from {wheel}")
    base, _built = ensure_host_image(client, progress)
    # No managed-memory allocator: the lab has no GPU or CUDA to run it on, and leaving it out
    # keeps a compiler (gcc from Debian's mirror) out of every lab image build. Its logic is
    # tested here by tests/unit/test_managed_allocator.py, on a GPU by tests/gpu.
    return image.build(client, base=base, tag=tag or LAB_TAG, torch_wheel=wheel,
                       managed_allocator=False, progress=progress)
