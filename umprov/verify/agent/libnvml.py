"""NVML through ctypes: the driver's own libnvidia-ml.so.1, no Python package needed.

Only what the agent reads (nvml.py turns it into facts). Every call returns Python values or
raises NvmlError with NVML's code and text; NOT_SUPPORTED (3) is how a GPU says it lacks a
feature (no NVLink, no row remapper). The library is present wherever the driver is, in
containers too (the NVIDIA container toolkit mounts it).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
ELSEWHERE = ("/usr/local/nvidia/lib64/" + LIBRARY, "/usr/lib64/" + LIBRARY)
SUCCESS, NOT_SUPPORTED, NO_PERMISSION, INSUFFICIENT_SIZE = 0, 3, 4, 7
FUNCTION_NOT_FOUND, GPU_IS_LOST = 13, 15
VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot say
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (Hopper: 18 links per GPU)
# nvmlNvLinkErrorCounter_t
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


class NvmlError(RuntimeError):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"NVML error {code}: {text}")
        self.code = code


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3 layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_t (v1)
    _fields_ = [("clusterUuid", ctypes.c_char * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]


class MemoryInfo(ctypes.Structure):  # nvmlMemory_t (v1)
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class LibNvml:
    """One initialised NVML. Method names say what they read; ``call`` is the raw C call."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.call("nvmlInit_v2")

    @classmethod
    def load(cls) -> LibNvml:
        """Raises OSError (no library) or NvmlError (no driver, version mismatch)."""
        try:
            return cls(ctypes.CDLL(LIBRARY))
        except OSError:
            for path in ELSEWHERE:  # driver trees mounted outside the loader's path
                if os.path.exists(path):
                    return cls(ctypes.CDLL(path))
            raise

    def text(self, code: int) -> str:
        fn = getattr(self.lib, "nvmlErrorString", None)
        if fn is None:
            return ""
        fn.restype = ctypes.c_char_p
        raw = fn(code)
        return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")

    def call(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name, None)  # an old driver lacks newer symbols
        if fn is None:
            raise NvmlError(FUNCTION_NOT_FOUND, f"{name} not in this driver's NVML")
        rc = fn(*args)
        if rc != SUCCESS:
            raise NvmlError(rc, self.text(rc))

    def _out(self, ctype: Any, name: str, *args: Any) -> Any:
        """A call whose last argument is a pointer to one value; that value."""
        value = ctype()
        self.call(name, *args, ctypes.byref(value))
        return value.value

    def _string(self, name: str, *args: Any, size: int = 96) -> str:
        buf = ctypes.create_string_buffer(size)
        self.call(name, *args, buf, ctypes.c_uint(size))
        return buf.value.decode(errors="replace")

    # -- system
    def driver_version(self) -> str:
        return self._string("nvmlSystemGetDriverVersion", size=80)

    def cuda_driver_version(self) -> int:
        return self._out(ctypes.c_int, "nvmlSystemGetCudaDriverVersion_v2")

    def count(self) -> int:
        return self._out(ctypes.c_uint, "nvmlDeviceGetCount_v2")

    # -- handles
    def handle_by_index(self, index: int) -> Any:
        h = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def handle_by_uuid(self, uuid: str) -> Any:
        h = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(h))
        return h

    def handle_by_pci(self, bus_id: str) -> Any:
        h = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByPciBusId_v2", bus_id.encode(), ctypes.byref(h))
        return h

    # -- identity
    def name(self, h: Any) -> str:
        return self._string("nvmlDeviceGetName", h)

    def uuid(self, h: Any) -> str:
        return self._string("nvmlDeviceGetUUID", h)

    def pci_bus_id(self, h: Any) -> str:
        info = PciInfo()
        self.call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(info))
        return info.busId.decode(errors="replace")

    # -- one unsigned value of a device, with optional leading arguments (sensor, link, ...)
    def uint(self, name: str, h: Any, *args: int) -> int:
        return self._out(ctypes.c_uint, name, h, *[ctypes.c_uint(a) for a in args])

    def ulonglong(self, name: str, h: Any, *args: int) -> int:
        return self._out(ctypes.c_ulonglong, name, h, *[ctypes.c_uint(a) for a in args])

    def ecc_mode(self, h: Any) -> int:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self.call("nvmlDeviceGetEccMode", h, ctypes.byref(current), ctypes.byref(pending))
        return current.value

    def remapped_rows(self, h: Any) -> tuple[int, int, int, int]:
        """(correctable rows, uncorrectable rows, remap pending, remap failed)."""
        vals = [ctypes.c_uint() for _ in range(4)]
        self.call("nvmlDeviceGetRemappedRows", h, *[ctypes.byref(v) for v in vals])
        return vals[0].value, vals[1].value, vals[2].value, vals[3].value

    def clock_event_reasons(self, h: Any) -> int:
        try:
            return self.ulonglong("nvmlDeviceGetCurrentClocksEventReasons", h)
        except NvmlError as exc:
            if exc.code != FUNCTION_NOT_FOUND:
                raise
            return self.ulonglong("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def memory(self, h: Any) -> tuple[int, int, int]:
        """(total, free, used) bytes of device memory."""
        mem = MemoryInfo()
        self.call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
        return mem.total, mem.free, mem.used

    def fabric(self, h: Any) -> tuple[int, int]:
        """(state, status) of the GPU fabric (NVSwitch systems); NOT_SUPPORTED elsewhere."""
        info = FabricInfo()
        self.call("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info))
        return int(info.state), int(info.status)

    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]:
        """(pid, bytes held or None) of every compute process on the device."""
        size = 16
        name = "nvmlDeviceGetComputeRunningProcesses_v3"
        for _ in range(5):  # the list can grow between the two calls
            count = ctypes.c_uint(size)
            infos = (ProcessInfo * size)()
            try:
                self.call(name, h, ctypes.byref(count), infos)
            except NvmlError as exc:
                if exc.code == FUNCTION_NOT_FOUND and name.endswith("_v3"):
                    name = name[:-1] + "2"  # drivers before 510: the same structure
                    continue
                if exc.code != INSUFFICIENT_SIZE:
                    raise
                size = max(size * 2, count.value + 8)
                continue
            return [(int(p.pid), None if p.usedGpuMemory == VALUE_NOT_AVAILABLE
                     else int(p.usedGpuMemory)) for p in infos[: count.value]]
        raise NvmlError(INSUFFICIENT_SIZE, "the process list kept growing")
