"""Host memory the GPU copies to and reads across the bus, for the optimizer's host step and
gradients down (umprov_managed_step.py, umprov_managed_grads.py; docs/managed-memory.md):
page-locked buffers of their own pages, their CUDA views, and CPU views of host-resident
managed memory."""

from __future__ import annotations

import contextlib
import ctypes
import os
import weakref
from typing import Any

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


class _Mapped:
    """Pinned host memory as a CUDA array (``__cuda_array_interface__``) for torch.as_tensor;
    it holds the host tensor while a view of it lives."""

    def __init__(self, pointer: int, nbytes: int, host: torch.Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (pointer, False), "version": 3}


def device_view(flat: torch.Tensor, device: torch.device,
                pins: list[weakref.finalize]) -> torch.Tensor | None:
    """A CUDA tensor over the pinned host memory of ``flat`` (kernels read it across the
    bus), or None where it is not mapped. ``pins``: ``flat``'s page lock, moved onto the
    view's memory (kept locked while any view lives), or released at once with None."""
    if not flat.numel():
        return torch.empty(0, dtype=flat.dtype, device=device)
    pointer = ctypes.c_void_p()
    if not pins or _cudart().cudaHostGetDevicePointer(
            ctypes.byref(pointer), ctypes.c_void_p(flat.data_ptr()), 0) != 0:
        for release in pins:
            release()
        return None
    nbytes = flat.numel() * flat.element_size()
    mapped = _Mapped(int(pointer.value or 0), nbytes, flat)
    pins[0].detach()
    weakref.finalize(mapped, unpin, flat, device)
    return torch.as_tensor(mapped, device=device).view(flat.dtype)


def pinned_home(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pinned host memory of ``p``'s size, and a CUDA view of it (None where not mapped)."""
    pins: list[weakref.finalize] = []
    flat = pinned(p.numel(), p.dtype, p.device, pins=pins, mapped=True)
    view = device_view(flat, p.device, pins)
    return None if view is None else (flat.view_as(p), view.view_as(p))


def host_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same (host-resident managed) memory: no copy."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = (ctypes.c_byte * nbytes).from_address(tensor.data_ptr())
    return torch.frombuffer(raw, dtype=tensor.dtype).view_as(tensor)


def pinned(numel: int, dtype: torch.dtype, device: torch.device, owner: Any = None,
           pins: list | None = None, mapped: bool = False) -> torch.Tensor:
    """Host memory of this size, page-locked for ``device``'s copy engines (PyTorch's pinned
    allocator rounds up to a power of two: 12 GiB would take 16), unlocked with its owner or
    by the finalizer appended to ``pins``; ``mapped``: kernels can address it too
    (cudaHostRegisterMapped), unlocked with its device view (``device_view``). Its pages are
    its own: a page shared with another allocation (a small tensor's neighbour) could not be
    locked twice."""
    nbytes = numel * dtype.itemsize
    locked = -(-nbytes // PAGE) * PAGE
    buffer = torch.empty(locked + PAGE, dtype=torch.uint8)
    start = -buffer.data_ptr() % PAGE
    # Its pages faulted in by every intra-op thread: cudaHostRegister faults the missing ones
    # one at a time in this thread (first touch 1.8 GiB/s on one core, 3.7 on two: seconds
    # for a model's masters and gradient homes in the first step).
    buffer[start:start + locked].zero_()
    flat = buffer[start:start + nbytes].view(dtype)
    flags = 2 if mapped else 0
    if nbytes and _cudart().cudaHostRegister(ctypes.c_void_p(flat.data_ptr()),
                                             ctypes.c_size_t(locked), flags) == 0:
        lock = weakref.finalize(flat if owner is None else owner, unpin, flat, device)
        if pins is not None:
            pins.append(lock)
    return flat


def unpin(flat: torch.Tensor, device: torch.device) -> None:
    """Unlocked once ``device`` is done with it: its owner may go with copies or kernels over
    it still queued (an optimizer dropped after its step, gradients read after the host step
    was left)."""
    if torch.cuda.is_initialized():
        with contextlib.suppress(RuntimeError):  # CUDA torn down already (the process's exit)
            torch.cuda.synchronize(device)
    _cudart().cudaHostUnregister(ctypes.c_void_p(flat.data_ptr()))


def _cudart() -> Any:
    import umprov_managed  # imported by now: it installs the step that uses this module

    return umprov_managed._cudart()
