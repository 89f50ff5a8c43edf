"""PyTorch's allocator settings beside umprov's reservoir (umprov_managed.py,
docs/managed-memory.md): which settings rule the reservoir out, expandable segments off while
it is made, and a job's own memory fraction kept a fraction of device memory; and the pool's
own settings (UMPROV_MANAGED_*), which umprov checks too before a container gets them
(umprov/inventory/container_env.py loads this file: the standard library only, at import).

PyTorch reads its settings from PYTORCH_CUDA_ALLOC_CONF and (the newer name) PYTORCH_ALLOC_CONF;
a key set in either counts here.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# The pool's settings in the environment: sizes (bytes, or with k/m/g/t), switches and the
# values they take (any other would be read as one of them: "off" as on), and the rest.
SIZES = ("UMPROV_MANAGED_RESERVOIR", "UMPROV_MANAGED_BUDGET", "UMPROV_MANAGED_HOST_RESERVE",
         "UMPROV_MANAGED_HEADROOM")
SWITCHES = {"UMPROV_MANAGED_MEMORY": ("0", "1"), "UMPROV_MANAGED_GRADS_DOWN": ("0", "1"),
            "UMPROV_MANAGED_HOST_STEP": ("auto", "0", "1")}
OTHERS = ("UMPROV_MANAGED_LIBRARY", "UMPROV_MANAGED_ALLOCATOR")  # the image marks the latter
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SMALL = 256  # reservoir blocks of 1 MiB: PyTorch keeps allocations of 1 MiB or less apart
_EXPANDABLE_ON = re.compile(r"(expandable_segments\s*:\s*)true", re.IGNORECASE)


def size_of(text: str) -> int:
    """'2g', '512m', '1073741824' as bytes; ValueError otherwise."""
    text = text.strip().lower().rstrip("ib").rstrip("b")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    if not math.isfinite(number) or number < 0:
        raise ValueError(text)
    return int(number)


def setting_problem(name: str, value: str) -> str | None:
    """What is wrong with one of the pool's settings (a name starting UMPROV_MANAGED_), or
    None: a name the pool does not read, a size that is not one, a switch's other value."""
    if name in SIZES:
        try:
            size_of(value)
        except ValueError:
            return f"{name}={value[:40]!r} is not a size (bytes, or with k/m/g)"
    elif name in SWITCHES:
        if value.strip() not in SWITCHES[name]:
            return f"{name}={value[:40]!r}: expected {' or '.join(SWITCHES[name])}"
    elif name not in OTHERS:
        close = difflib.get_close_matches(name, SIZES + tuple(SWITCHES) + OTHERS, n=1)
        meant = f" (did you mean {close[0]}?)" if close else ""
        return f"{name} is not a setting of umprov's managed-memory pool{meant}"
    return None


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
