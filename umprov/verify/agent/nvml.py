"""NVML facts per GPU: nvidia-ml-py (pynvml) when importable, else nvidia-smi's CSV query."""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
from typing import Any


class Nvml:
    """Per-GPU management facts. ``info`` returns a dict; missing facts are None."""

    def __init__(self) -> None:
        self.kind = "none"
        self.pynvml: Any = None
        self.smi = shutil.which("nvidia-smi")
        self.error = ""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.kind = "pynvml"
        except Exception as exc:  # not installed, or no driver: fall back
            self.error = f"{type(exc).__name__}: {exc}"
            if self.smi:
                self.kind = "nvidia-smi"

    # -- system
    def system(self) -> dict:
        out: dict[str, Any] = {"source": self.kind, "driver": None, "cuda_driver": None,
                               "count": None}
        n = self.pynvml
        if n is not None:
            with contextlib.suppress(Exception):
                out["driver"] = _s(n.nvmlSystemGetDriverVersion())
            with contextlib.suppress(Exception):
                v = n.nvmlSystemGetCudaDriverVersion_v2()
                out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
            with contextlib.suppress(Exception):
                out["count"] = n.nvmlDeviceGetCount()
        elif self.smi:
            rows = self._smi(["driver_version", "uuid"], None)
            if rows:
                out["driver"] = rows[0].get("driver_version")
                out["count"] = len(rows)
        return out

    def handle(self, uuid: str | None, pci: str | None, index: int) -> Any:
        n = self.pynvml
        for how, key in ((n.nvmlDeviceGetHandleByUUID, uuid), (n.nvmlDeviceGetHandleByPciBusId,
                                                                pci)):
            if key:
                with contextlib.suppress(Exception):
                    return how(key)
        return n.nvmlDeviceGetHandleByIndex(index)

    def info(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        if self.pynvml is not None:
            return self._info_pynvml(self.handle(uuid, pci, index))
        if self.smi:
            return self._info_smi(uuid, pci, index)
        return {}

    def sample(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        """The fast-changing facts, read while the GPU works: link, throttle, temperature."""
        if self.pynvml is not None:
            return self.sample_from_handle(self.handle(uuid, pci, index))
        if self.smi:
            keys = ["pcie_gen", "pcie_width", "throttle_mask", "temperature_c", "sm_clock_mhz",
                    "power_w"]
            full = self._info_smi(uuid, pci, index, keys)
            return {k: full.get(k) for k in keys}
        return {}

    def _info_pynvml(self, h: Any) -> dict:
        n = self.pynvml
        out: dict[str, Any] = {}
        out["name"] = _s(_try(n.nvmlDeviceGetName, h))
        out["uuid"] = _s(_try(n.nvmlDeviceGetUUID, h))
        pci = _try(n.nvmlDeviceGetPciInfo, h)
        out["pci_bus_id"] = _s(getattr(pci, "busId", None)) if pci is not None else None
        pm = _try(n.nvmlDeviceGetPersistenceMode, h)
        out["persistence"] = None if pm is None else bool(pm)
        out["temperature_c"] = _try(n.nvmlDeviceGetTemperature, h, 0)
        out["temp_slowdown_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, 1)
        out["temp_shutdown_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, 0)
        ecc = _try(n.nvmlDeviceGetEccMode, h)
        out["ecc_enabled"] = None if ecc is None else bool(ecc[0])
        # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
        out["ecc_uncorrected_volatile"] = _try(n.nvmlDeviceGetTotalEccErrors, h, 1, 0)
        rows = _try(n.nvmlDeviceGetRemappedRows, h)
        out["remap_pending"] = None if rows is None else bool(rows[2])
        out["remap_failure"] = None if rows is None else bool(rows[3])
        out["remap_uncorrectable_rows"] = None if rows is None else rows[1]
        pend = _try(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        out["retired_pending"] = None if pend is None else bool(pend)
        out["pcie_gen_max"] = _try(n.nvmlDeviceGetMaxPcieLinkGeneration, h)
        out["pcie_width_max"] = _try(n.nvmlDeviceGetMaxPcieLinkWidth, h)
        out.update(self.sample_from_handle(h))
        out.update(self._nvlinks(h))
        out.update(self._fabric(h, out.get("uuid")))
        return out

    def _nvlinks(self, h: Any) -> dict:
        """NVLink: how many links, how many active, and whether they end on an NVSwitch."""
        n = self.pynvml
        active = 0
        switch = False
        links = 0
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            state = _try(n.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break
            links += 1
            if state:
                active += 1
                rtype = _try(n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
                if rtype == 2:  # NVML_NVLINK_DEVICE_TYPE_SWITCH
                    switch = True
        return {"nvlink_links": links or None, "nvlink_active": active if links else None,
                "nvswitch": switch if links else None}

    def _fabric(self, h: Any, uuid: str | None) -> dict:
        """The GPU fabric (fabric manager) state and status, where the driver reports one."""
        n = self.pynvml
        for fn_name, struct_name in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                                     ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            fn, struct = getattr(n, fn_name, None), getattr(n, struct_name, None)
            if fn is None or struct is None:
                continue
            fab = struct()  # the versioned struct's constructor sets its version field
            if _try(fn, h, ctypes.byref(fab)) is not None and int(fab.state) != 0:
                return {"fabric_state": int(fab.state), "fabric_status": int(fab.status)}
        if self.smi and uuid:
            # Some drivers answer only through nvidia-smi (seen: NVML v1 says N/A, smi says
            # Completed on the same GPU).
            smi = self._info_smi(uuid, None, 0, ["fabric_state_text", "fabric_status_text"])
            return {"fabric_state": smi.get("fabric_state"),
                    "fabric_status": smi.get("fabric_status")}
        return {"fabric_state": None, "fabric_status": None}

    def sample_from_handle(self, h: Any) -> dict:
        n = self.pynvml
        out: dict[str, Any] = {}
        out["pcie_gen"] = _try(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        out["pcie_width"] = _try(n.nvmlDeviceGetCurrPcieLinkWidth, h)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        out["throttle_mask"] = _try(reasons, h) if reasons else None
        out["temperature_c"] = _try(n.nvmlDeviceGetTemperature, h, 0)
        out["sm_clock_mhz"] = _try(n.nvmlDeviceGetClockInfo, h, 1)
        power = _try(n.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = power / 1000 if power is not None else None
        return out

    # nvidia-smi field -> our key (and a converter)
    SMI_FIELDS: dict[str, tuple[str, Any]] = {
        "name": ("name", str),
        "uuid": ("uuid", str),
        "pci_bus_id": ("pci.bus_id", str),
        "persistence": ("persistence_mode", lambda v: v.lower() == "enabled"),
        "temperature_c": ("temperature.gpu", float),
        "temp_slowdown_c": ("temperature.gpu.tlimit", None),
        "ecc_enabled": ("ecc.mode.current", lambda v: v.lower() == "enabled"),
        "ecc_uncorrected_volatile": ("ecc.errors.uncorrected.volatile.total", int),
        "remap_pending": ("remapped_rows.pending", lambda v: v.lower() in ("yes", "1")),
        "remap_failure": ("remapped_rows.failure", lambda v: v.lower() in ("yes", "1")),
        "retired_pending": ("retired_pages.pending", lambda v: v.lower() in ("yes", "1")),
        "pcie_gen": ("pcie.link.gen.current", int),
        "pcie_gen_max": ("pcie.link.gen.max", int),
        "pcie_width": ("pcie.link.width.current", int),
        "pcie_width_max": ("pcie.link.width.max", int),
        "throttle_mask": ("clocks_event_reasons.active", lambda v: int(v, 16)),
        "sm_clock_mhz": ("clocks.sm", float),
        "power_w": ("power.draw", float),
        "fabric_state_text": ("fabric.state", str),
        "fabric_status_text": ("fabric.status", str),
    }

    def _info_smi(self, uuid: str | None, pci: str | None, index: int,
                  keys: list[str] | None = None) -> dict:
        keys = keys or [k for k, (_f, conv) in self.SMI_FIELDS.items() if conv is not None]
        fields = [self.SMI_FIELDS[k][0] for k in keys]
        ident = uuid or pci or str(index)
        rows = self._smi(fields, ident)
        out: dict[str, Any] = {}
        row = rows[0] if rows else {}
        for key in keys:
            field, conv = self.SMI_FIELDS[key]
            raw = row.get(field)
            if raw is None or conv is None or raw.startswith("[") or raw in ("N/A", ""):
                out[key] = None
                continue
            try:
                out[key] = conv(raw)
            except ValueError:
                out[key] = None
        if out.get("fabric_state_text"):
            state = {"not supported": 0, "not started": 1, "in progress": 2,
                     "completed": 3}.get(out["fabric_state_text"].lower())
            out["fabric_state"] = state
            status = out.get("fabric_status_text") or ""
            out["fabric_status"] = 0 if status.lower() in ("success", "") else 1
        return out

    def _smi(self, fields: list[str], ident: str | None) -> list[dict]:
        """Rows of a --query-gpu; a field this nvidia-smi does not know is left out."""
        assert self.smi  # noqa: S101 (callers check)

        def query(fs: list[str]) -> list[list[str]] | None:
            argv = [self.smi, f"--query-gpu={','.join(fs)}", "--format=csv,noheader,nounits"]
            if ident is not None:
                argv.insert(1, f"--id={ident}")
            try:
                res = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # noqa: S603
            except (OSError, subprocess.TimeoutExpired):
                return None
            if res.returncode != 0:
                return None
            return [[c.strip() for c in ln.split(",")] for ln in res.stdout.strip().splitlines()]

        rows = query(fields)
        good = fields
        if rows is None:  # one unknown field fails the whole query: keep the ones that work
            good = [f for f in fields if query([f]) is not None]
            rows = query(good) if good else None
        out = []
        for row in rows or []:
            out.append(dict(zip(good, row)))  # noqa: B905 (Python 3.8 compatible)
        return out


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: the fact is unknown
        return None

