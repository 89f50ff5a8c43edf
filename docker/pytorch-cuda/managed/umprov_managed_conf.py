"""PyTorch's allocator settings beside umprov's reservoir (umprov_managed.py,
docs/managed-memory.md): which settings rule the reservoir out, expandable segments off while
it is made, and a job's own memory fraction kept a fraction of device memory.

PyTorch reads its settings from PYTORCH_CUDA_ALLOC_CONF and (the newer name) PYTORCH_ALLOC_CONF;
a key set in either counts here.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
SMALL = 256  # reservoir blocks of 1 MiB: PyTorch keeps allocations of 1 MiB or less apart
_EXPANDABLE_ON = re.compile(r"(expandable_segments\s*:\s*)true", re.IGNORECASE)


def alloc_conf() -> dict[str, tuple[str, str]]:
    """PyTorch's allocator settings from the environment: key -> (value, the variable), both
    in lower case."""
    found: dict[str, tuple[str, str]] = {}
    for name in ALLOC_CONF:
        for item in os.environ.get(name, "").replace(" ", "").lower().split(","):
            key, _, value = item.partition(":")
            if key:
                found.setdefault(key, (value, name))
    return found


def ruled_out() -> str | None:
    """Why PyTorch's allocator settings rule the reservoir out, or None. cudaMallocAsync has
    no memory pools of PyTorch's (and replacing it would trip torch's backend assertion);
    with max_split_size_mb PyTorch never splits a block that large, and the reservoir is one
    large block."""
    conf = alloc_conf()
    value, name = conf.get("backend", ("", ""))
    if value == "cudamallocasync":
        return (f"{name} backend:cudaMallocAsync selects CUDA's own pool allocator, which "
                "takes no memory pool: PyTorch runs on it, without managed memory")
    value, name = conf.get("max_split_size_mb", ("", ""))
    if value:
        return (f"{name} max_split_size_mb:{value} keeps PyTorch from splitting the "
                "reservoir's one large block: PyTorch runs without managed memory")
    return None


@contextlib.contextmanager
def expandable_off(torch: Any) -> Iterator[None]:
    """Expandable segments off for the block, where they are on: PyTorch refuses them in a
    pool of its own allocator. Torch's runtime setter resets the settings it is not given, so
    it is given the job's own settings each time, with only that one changed."""
    if alloc_conf().get("expandable_segments", ("", ""))[0] != "true":
        yield
        return
    text = ",".join(v for v in (os.environ.get(n, "") for n in ALLOC_CONF) if v.strip())
    apply = torch.cuda.memory._set_allocator_settings
    apply(_EXPANDABLE_ON.sub(r"\1False", text))
    try:
        yield
    finally:
        apply(text)


def torch_set_fraction(torch: Any) -> Callable[..., None]:
    """torch's own set_per_process_memory_fraction, beneath patch_memory_fraction's."""
    fn = torch.cuda.set_per_process_memory_fraction
    return getattr(fn, "_umprov_inner", fn)


def fraction_with(torch: Any, device: int, fraction: float, reservoir: int) -> float:
    """The fraction PyTorch is given for ``fraction`` of device memory beside a reservoir of
    ``reservoir`` bytes (PyTorch counts every segment in); one line on stderr where the two
    pass the GPU's memory."""
    if not reservoir:
        return fraction
    total = torch.cuda.get_device_properties(device).total_memory
    wanted = fraction + reservoir / total
    if wanted > 1:
        room = max(total - reservoir, 0) >> 20
        print(f"umprov managed memory: a memory fraction of {fraction} and the reservoir's "
              f"{reservoir >> 20} MiB pass GPU {device}'s {total >> 20} MiB (PyTorch counts "
              f"the reservoir in): device memory is capped at {room} MiB"
              f"{', so the job runs from host memory' if room == 0 else ''}; "
              f"UMPROV_MANAGED_RESERVOIR={max((int((1 - fraction) * total) >> 20) - SMALL, 0)}m"
              " or less keeps the fraction", file=sys.stderr)
    return min(wanted, 1.0)


def patch_memory_fraction(torch: Any, reservoir: Callable[[int], int],
                          wanted: dict[int, float]) -> None:
    """set/get_per_process_memory_fraction keep to device memory: a fraction the job sets is
    recorded in ``wanted`` (by device) and given to PyTorch with ``reservoir(device)`` bytes
    added, and reads back as set. Once: a second call changes nothing."""
    if hasattr(torch.cuda.set_per_process_memory_fraction, "_umprov_inner"):
        return
    inner, read = torch_set_fraction(torch), torch.cuda.get_per_process_memory_fraction

    @functools.wraps(inner)
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            inner(fraction, device)  # torch's own error
            return
        torch.cuda.init()  # the device's reservoir is made at CUDA's start
        index = torch.cuda._utils._get_device_index(device, optional=True)
        wanted[index] = fraction
        inner(fraction_with(torch, index, fraction, reservoir(index)), device)

    @functools.wraps(read)
    def get_per_process_memory_fraction(device: Any = None) -> float:
        torch.cuda.init()
        index = torch.cuda._utils._get_device_index(device, optional=True)
        return wanted[index] if index in wanted else read(device)

    set_per_process_memory_fraction._umprov_inner = inner  # type: ignore[attr-defined]
    for namespace in (torch.cuda, torch.cuda.memory):
        namespace.set_per_process_memory_fraction = set_per_process_memory_fraction
        namespace.get_per_process_memory_fraction = get_per_process_memory_fraction
