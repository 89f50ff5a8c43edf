"""The CUDA runtime through ctypes: the libcudart that torch loaded (one context, one runtime).

Managed memory (cudaMallocManaged, prefetch, advice) has no torch API; both call forms are
handled: CUDA 13's cudaMemLocation by value, and CUDA 12's int device.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from typing import Any


class CudaError(RuntimeError):
    pass


class MemLocation(ctypes.Structure):
    # CUDA 13's cudaMemLocation, passed BY VALUE to cudaMemPrefetchAsync / cudaMemAdvise
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


LOC_DEVICE, LOC_HOST = 1, 2
CPU_DEVICE_ID = -1  # cudaCpuDeviceId in CUDA 12's int-device forms
ADVISE = {"read_mostly": 1, "unset_read_mostly": 2, "preferred": 3, "unset_preferred": 4,
          "accessed_by": 5, "unset_accessed_by": 6}
RANGE_ATTR = {"read_mostly": 1, "preferred": 2, "accessed_by": 3, "last_prefetch": 4}


def find_cudart() -> str | None:
    """The path of the libcudart mapped into this process (torch loads it), if any."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as fh:
        for line in fh:
            if "libcudart.so" in line:
                return line.split()[-1]
    return None


class CudaRt:
    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib = lib
        self.path = path
        ver = ctypes.c_int()
        self._check(lib.cudaRuntimeGetVersion(ctypes.byref(ver)), "cudaRuntimeGetVersion")
        self.version = ver.value
        self.v13 = self.version >= 13000
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                          ctypes.c_uint]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                               ctypes.c_int]
        lib.cudaMemRangeGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                 ctypes.c_void_p, ctypes.c_size_t]
        if self.v13:
            lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, MemLocation,
                                                 ctypes.c_uint, ctypes.c_void_p]
            lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                          MemLocation]
        else:
            lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                 ctypes.c_void_p]
            lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                          ctypes.c_int]

    @classmethod
    def load(cls) -> CudaRt:
        path = find_cudart()
        candidates = [path] if path else []
        candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        found = ctypes.util.find_library("cudart")
        if found:
            candidates.append(found)
        errors = []
        for cand in candidates:
            try:
                return cls(ctypes.CDLL(cand), cand)
            except OSError as exc:
                errors.append(str(exc))
        raise CudaError("no libcudart found (torch may link it statically): " + "; ".join(
            errors[:2]))

    def _check(self, rc: int, what: str) -> None:
        if rc:
            try:
                text = self.lib.cudaGetErrorString(rc).decode()
            except Exception:
                text = ""
            raise CudaError(f"{what} returned {rc} {text}".strip())

    def form(self) -> str:
        return "cudaMemLocation (CUDA 13)" if self.v13 else "int device (CUDA 12)"

    def attr(self, attr: int, dev: int) -> int:
        v = ctypes.c_int()
        self._check(self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, dev),
                    f"cudaDeviceGetAttribute({attr})")
        return v.value

    def set_device(self, dev: int) -> None:
        self._check(self.lib.cudaSetDevice(dev), "cudaSetDevice")

    def malloc_managed(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaMallocManaged(ctypes.byref(p), nbytes, 1), "cudaMallocManaged")
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def _loc(self, dev: int) -> Any:
        if self.v13:
            return MemLocation(LOC_HOST, 0) if dev == CPU_DEVICE_ID else MemLocation(
                LOC_DEVICE, dev)
        return dev

    def prefetch(self, ptr: int, nbytes: int, dev: int, stream: int = 0) -> None:
        """Prefetch to a device, or to the host with dev=-1; the call form by runtime version."""
        if self.v13:
            rc = self.lib.cudaMemPrefetchAsync(ctypes.c_void_p(ptr), nbytes, self._loc(dev), 0,
                                               ctypes.c_void_p(stream))
        else:
            rc = self.lib.cudaMemPrefetchAsync(ctypes.c_void_p(ptr), nbytes, dev,
                                               ctypes.c_void_p(stream))
        self._check(rc, "cudaMemPrefetchAsync")

    def advise(self, ptr: int, nbytes: int, advice: str, dev: int) -> None:
        rc = self.lib.cudaMemAdvise(ctypes.c_void_p(ptr), nbytes, ADVISE[advice], self._loc(dev))
        self._check(rc, f"cudaMemAdvise({advice})")

    def range_attr(self, ptr: int, nbytes: int, attr: str) -> int | None:
        v = ctypes.c_int()
        rc = self.lib.cudaMemRangeGetAttribute(ctypes.byref(v), 4, RANGE_ATTR[attr],
                                               ctypes.c_void_p(ptr), nbytes)
        return None if rc else v.value


class DevArray:
    """Describes raw device (or managed) memory so torch.as_tensor can view it zero-copy."""

    def __init__(self, ptr: int, count: int, typestr: str = "<i4") -> None:
        self.__cuda_array_interface__ = {
            "shape": (count,), "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": None, "stream": None,
        }

