"""A stand-in for libnvidia-ml.so.1 with the C calling convention the agent uses through ctypes:
each function takes the C arguments (handles, ctypes values, byref() pointers, buffers) and
returns an nvmlReturn_t code. The GPUs it shows come from a JSON-able description::

    {"gpus": [{"name": "NVIDIA H200", "uuid": "GPU-0", "pci": "00000000:18:00.0",
               "processes": [[pid, bytes]] or null (NOT_SUPPORTED),
               "links": [true, ...] or null (no NVLink),
               "errors": {"replay": [per link], "crc_flit": [...], ...},
               "temperature": 40, "power_mw": 300000, "throttle": 4,
               "memory": [total, free, used], "ecc": [uncorrected, corrected],
               "ecc_aggregate": [uncorrected, corrected] (default: "ecc"),
               "remap": [correctable rows, uncorrectable rows, pending, failure]}]}

``bump(kind, link, by)`` makes the counters of every GPU grow (a flaky link during a run).
"""

from __future__ import annotations

import ctypes
from typing import Any

SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, INSUFFICIENT_SIZE = 0, 2, 3, 7
COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}


def _set(ptr: Any, value: Any) -> None:
    ptr._obj.value = value  # a byref() argument: write through to the C value


class _Function:
    """A callable that, like a ctypes function pointer, takes a ``restype``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.restype: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeNvmlLib:
    def __init__(self, desc: dict) -> None:
        self.gpus = desc["gpus"]
        self.nvmlErrorString = _Function(self._error_string)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)  # a symbol this "driver" lacks

    def _gpu(self, h: Any) -> dict:
        return self.gpus[int(h.value if hasattr(h, "value") else h) - 1]

    def nvmlInit_v2(self) -> int:
        return SUCCESS

    def _error_string(self, code: int) -> bytes:
        return {NOT_SUPPORTED: b"Not Supported", INSUFFICIENT_SIZE: b"Insufficient Size"}.get(
            code, b"Unknown Error")

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = b"580.159.04"
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, ptr: Any) -> int:
        _set(ptr, len(self.gpus))
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ptr: Any) -> int:
        if index.value >= len(self.gpus):
            return INVALID_ARGUMENT
        _set(ptr, index.value + 1)  # handles are 1-based so that none is NULL
        return SUCCESS

    def nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(h)["name"].encode()
        return SUCCESS

    def nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(h)["uuid"].encode()
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, h: Any, ptr: Any) -> int:
        ptr._obj.busId = self._gpu(h)["pci"].encode()
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, h: Any, ptr: Any) -> int:
        total, free, used = self._gpu(h).get("memory", [1 << 37, 1 << 37, 0])
        ptr._obj.total, ptr._obj.free, ptr._obj.used = total, free, used
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count: Any, infos: Any) -> int:
        procs = self._gpu(h).get("processes")
        if procs is None:
            return NOT_SUPPORTED
        if count._obj.value < len(procs):
            _set(count, len(procs))
            return INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(procs):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        _set(count, len(procs))
        return SUCCESS

    def nvmlDeviceGetNvLinkState(self, h: Any, link: Any, ptr: Any) -> int:
        links = self._gpu(h).get("links")
        if links is None:
            return NOT_SUPPORTED
        if link.value >= len(links):
            return INVALID_ARGUMENT
        _set(ptr, int(links[link.value]))
        return SUCCESS

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: Any, ptr: Any) -> int:
        _set(ptr, 2)  # NVSwitch
        return SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: Any, counter: Any,
                                        ptr: Any) -> int:
        errors = self._gpu(h).get("errors")
        kind = COUNTERS.get(counter.value)
        if not errors or kind not in errors:
            return NOT_SUPPORTED
        _set(ptr, errors[kind][link.value])
        return SUCCESS

    def nvmlDeviceGetTemperature(self, h: Any, sensor: Any, ptr: Any) -> int:
        _set(ptr, self._gpu(h).get("temperature", 40))
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, h: Any, ptr: Any) -> int:
        _set(ptr, self._gpu(h).get("power_mw", 300000))
        return SUCCESS

    def nvmlDeviceGetClockInfo(self, h: Any, kind: Any, ptr: Any) -> int:
        _set(ptr, 1980 if kind.value == 1 else 3201)
        return SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any, ptr: Any) -> int:
        _set(ptr, self._gpu(h).get("throttle", 0))
        return SUCCESS

    def nvmlDeviceGetTotalEccErrors(self, h: Any, etype: Any, ctype: Any, ptr: Any) -> int:
        gpu = self._gpu(h)
        volatile = gpu.get("ecc", [0, 0])
        unc, cor = gpu.get("ecc_aggregate", volatile) if ctype.value == 1 else volatile
        _set(ptr, unc if etype.value == 1 else cor)
        return SUCCESS

    def nvmlDeviceGetEccMode(self, h: Any, current: Any, pending: Any) -> int:
        _set(current, 1)
        _set(pending, 1)
        return SUCCESS

    def nvmlDeviceGetRemappedRows(self, h: Any, *ptrs: Any) -> int:
        """[correctable rows, uncorrectable rows, pending, failure]; null: NOT_SUPPORTED."""
        remap = self._gpu(h).get("remap", [0, 0, 0, 0])
        if remap is None:
            return NOT_SUPPORTED
        for ptr, value in zip(ptrs, remap, strict=True):
            _set(ptr, value)
        return SUCCESS

    def bump(self, kind: str, link: int, by: int) -> None:
        for g in self.gpus:
            if g.get("errors") and kind in g["errors"]:
                g["errors"][kind][link] += by


def install(desc: dict) -> FakeNvmlLib:
    """Make ctypes.CDLL("libnvidia-ml.so.1") return a fake of ``desc`` in this process."""
    fake = FakeNvmlLib(desc)
    real = ctypes.CDLL

    def cdll(name: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "libnvidia-ml.so.1":
            return fake
        return real(name, *args, **kwargs)

    ctypes.CDLL = cdll  # type: ignore[misc,assignment]
    return fake
