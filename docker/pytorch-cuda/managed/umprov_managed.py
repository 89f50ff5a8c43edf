"""PyTorch on CUDA managed (unified) memory: umprov's allocator (docs/managed-memory.md).

    import umprov_managed
    umprov_managed.enable()          # before the process's first CUDA tensor
    ...
    umprov_managed.stats()           # bytes placed on the GPU and spilled to the host

In umprov's image, UMPROV_MANAGED_MEMORY=1 (`umprov deploy --managed-memory`) enables it in
every Python that imports torch: umprov_managed.pth installs ``after_torch_import``.

UMPROV_MANAGED_BUDGET (bytes, or with k/m/g) caps the device memory allocations are placed in;
by default it is what the GPU has free at the first allocation, less UMPROV_MANAGED_RESERVE
(default 1g) for what allocates outside PyTorch (CUDA's own context, NCCL, cuDNN).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

LIBRARY = Path(os.environ.get("UMPROV_MANAGED_LIBRARY",
                              str(Path(__file__).with_name("libumprov_managed.so"))))
STATS = ("budget", "placed", "spilled", "peak_placed", "peak_spilled", "allocations",
         "failed_advice", "reused", "kept")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_of(text: str) -> int:
    """'2g', '512m', '1073741824' as bytes; ValueError otherwise."""
    text = text.strip().lower().rstrip("ib").rstrip("b")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = float(text[: len(text) - len(unit)])
    if number < 0:
        raise ValueError(text)
    return int(number * _UNITS[unit])


def _cudart() -> ctypes.CDLL:
    """The libcudart torch loaded: one CUDA runtime and context in the process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("torch has loaded no CUDA runtime (a CPU build of torch?)")


def enable(budget: int | None = None, reserve: int | None = None) -> None:
    """Make PyTorch allocate every CUDA tensor of this process as managed memory."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is available to torch")
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA is already initialised in this process: enable it before the "
                           "first CUDA tensor")
    env_budget = os.environ.get("UMPROV_MANAGED_BUDGET", "")
    budget = budget if budget is not None else size_of(env_budget) if env_budget else -1
    reserve = reserve if reserve is not None else size_of(
        os.environ.get("UMPROV_MANAGED_RESERVE", "1g"))
    cudart = _cudart()
    version = ctypes.c_int()
    cudart.cudaRuntimeGetVersion(ctypes.byref(version))

    def address(name: str) -> int | None:
        return ctypes.cast(getattr(cudart, name), ctypes.c_void_p).value

    lib = ctypes.CDLL(str(LIBRARY))
    lib.umprov_um_init.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_longlong,
                                                           ctypes.c_longlong]
    rc = lib.umprov_um_init(address("cudaMallocManaged"), address("cudaFree"),
                            address("cudaMemGetInfo"), address("cudaMemAdvise"),
                            address("cudaMemPrefetchAsync"), version.value, budget, reserve)
    if rc != 0:
        raise RuntimeError(f"{LIBRARY}: umprov_um_init failed ({rc})")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(LIBRARY), "umprov_um_malloc",
                                                         "umprov_um_free")
    torch.cuda.memory.change_current_allocator(allocator)


def empty_cache() -> None:
    """Give back the blocks the allocator keeps for reuse (torch.cuda.empty_cache does not)."""
    ctypes.CDLL(str(LIBRARY)).umprov_um_empty_cache()


def stats() -> dict[str, int]:
    """What the allocator placed: its budget, bytes on the device and on the host (now and at
    their peak, blocks kept for reuse included), allocations made and served from kept blocks,
    advice calls the driver refused, bytes kept."""
    lib = ctypes.CDLL(str(LIBRARY))
    out = (ctypes.c_longlong * len(STATS))()
    lib.umprov_um_stats(out)
    return dict(zip(STATS, out, strict=True))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs ``enable`` once torch's own module has run (before any CUDA tensor can exist)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                enable()
            except Exception as exc:  # noqa: BLE001 - torch works on; say why it is not managed
                print(f"umprov managed memory: not enabled: {exc}", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_torch_import() -> None:
    """With UMPROV_MANAGED_MEMORY=1: enable the allocator as soon as torch is imported."""
    if (os.environ.get("UMPROV_MANAGED_MEMORY") == "1" and "torch" not in sys.modules
            and not any(isinstance(f, _AfterTorch) for f in sys.meta_path)):
        sys.meta_path.insert(0, _AfterTorch())
