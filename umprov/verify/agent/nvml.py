"""NVML facts per GPU: the driver's libnvidia-ml through ctypes (libnvml.py), else nvidia-smi's
CSV query. Missing facts are None: a GPU without a feature is not an error."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Any

from .libnvml import MAX_LINKS, NVLINK_COUNTERS, LibNvml, NvmlError

# nvmlTemperatureSensors_t, nvmlTemperatureThresholds_t, nvmlClockType_t, ECC counters
GPU_SENSOR, THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 0, 1
CLOCK_SM, CLOCK_MEM = 1, 2
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE, ECC_AGGREGATE = 0, 1, 0, 1
NVLINK_SWITCH = 2  # nvmlIntNvLinkDeviceType_t


class Nvml:
    """Per-GPU management facts. ``info`` returns a dict; missing facts are None."""

    def __init__(self) -> None:
        self.kind = "none"
        self.lib: LibNvml | None = None
        self.smi = shutil.which("nvidia-smi")
        self.error = ""
        self.cached: list[tuple[Any, str | None]] = []
        try:
            self.lib = LibNvml.load()
            self.kind = "nvml"
        except (OSError, NvmlError) as exc:  # no library or no driver: fall back
            self.error = f"{type(exc).__name__}: {exc}"
            if self.smi:
                self.kind = "nvidia-smi"

    # -- system
    def system(self) -> dict:
        out: dict[str, Any] = {"source": self.kind, "driver": None, "cuda_driver": None,
                               "count": None}
        n = self.lib
        if n is not None:
            out["driver"] = _try(n.driver_version)
            v = _try(n.cuda_driver_version)
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}" if v else None
            out["count"] = _try(n.count)
        elif self.smi:
            rows = self._smi(["driver_version", "uuid"], None)
            if rows:
                out["driver"] = rows[0].get("driver_version")
                out["count"] = len(rows)
        return out

    def handle(self, uuid: str | None, pci: str | None, index: int) -> Any:
        n = self.lib
        assert n is not None  # noqa: S101 (callers check the kind)
        for how, key in ((n.handle_by_uuid, uuid), (n.handle_by_pci, pci)):
            if key:
                with contextlib.suppress(NvmlError):
                    return how(key)
        return n.handle_by_index(index)

    def handles(self) -> list[Any]:
        """Every GPU NVML sees, in its (PCI) order; empty without the library."""
        n = self.lib
        if n is None:
            return []
        return [n.handle_by_index(i) for i in range(_try(n.count) or 0)]

    def info(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        if self.lib is not None:
            return self.info_from_handle(self.handle(uuid, pci, index))
        if self.smi:
            return self._info_smi(uuid, pci, index)
        return {}

    def sample(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        """The fast-changing facts, read while the GPU works: link, throttle, temperature."""
        if self.lib is not None:
            return self.sample_from_handle(self.handle(uuid, pci, index))
        if self.smi:
            keys = list(SAMPLE_KEYS)
            full = self._info_smi(uuid, pci, index, keys)
            return {k: full.get(k) for k in keys}
        return {}

    def sample_all(self) -> list[dict]:
        """One sample of every GPU (with its pci_bus_id): one nvidia-smi call for all, or
        NVML's handles (``self.cached``, kept between calls)."""
        if self.lib is not None:
            if not self.cached:
                self.cached = [(h, self.identity(h)["pci_bus_id"]) for h in self.handles()]
            return [{"pci_bus_id": pci, **self.sample_from_handle(h),
                     **self.ecc_counts(h)} for h, pci in self.cached]
        if not self.smi:
            return []
        keys = [*SAMPLE_KEYS, "pci_bus_id", "ecc_uncorrected_volatile"]
        rows = self._smi([self.SMI_FIELDS[k][0] for k in keys], None)
        return [{k: _convert(self.SMI_FIELDS[k][1], row.get(self.SMI_FIELDS[k][0]))
                 for k in keys} for row in rows]

    def identity(self, h: Any) -> dict:
        n = self.lib
        assert n is not None  # noqa: S101
        return {"name": _try(n.name, h), "uuid": _try(n.uuid, h),
                "pci_bus_id": _try(n.pci_bus_id, h)}

    def info_from_handle(self, h: Any) -> dict:
        n = self.lib
        assert n is not None  # noqa: S101
        out: dict[str, Any] = self.identity(h)
        pm = _try(n.uint, "nvmlDeviceGetPersistenceMode", h)
        out["persistence"] = None if pm is None else bool(pm)
        out["temp_slowdown_c"] = _try(n.uint, "nvmlDeviceGetTemperatureThreshold", h,
                                      THRESHOLD_SLOWDOWN)
        out["temp_shutdown_c"] = _try(n.uint, "nvmlDeviceGetTemperatureThreshold", h,
                                      THRESHOLD_SHUTDOWN)
        ecc = _try(n.ecc_mode, h)
        out["ecc_enabled"] = None if ecc is None else bool(ecc)
        out.update(self.ecc_counts(h))
        out["ecc_uncorrected_aggregate"] = _try(n.ulonglong, "nvmlDeviceGetTotalEccErrors", h,
                                                ECC_UNCORRECTED, ECC_AGGREGATE)
        rows = _try(n.remapped_rows, h)
        out["remap_pending"] = None if rows is None else bool(rows[2])
        out["remap_failure"] = None if rows is None else bool(rows[3])
        out["remap_uncorrectable_rows"] = None if rows is None else rows[1]
        pend = _try(n.uint, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        out["retired_pending"] = None if pend is None else bool(pend)
        out["pcie_gen_max"] = _try(n.uint, "nvmlDeviceGetMaxPcieLinkGeneration", h)
        out["pcie_width_max"] = _try(n.uint, "nvmlDeviceGetMaxPcieLinkWidth", h)
        out.update(self.sample_from_handle(h))
        out.update(self._nvlinks(h))
        out.update(self._fabric(h, out.get("uuid")))
        return out

    def ecc_counts(self, h: Any) -> dict:
        n = self.lib
        assert n is not None  # noqa: S101
        return {"ecc_uncorrected_volatile": _try(n.ulonglong, "nvmlDeviceGetTotalEccErrors", h,
                                                 ECC_UNCORRECTED, ECC_VOLATILE),
                "ecc_corrected_volatile": _try(n.ulonglong, "nvmlDeviceGetTotalEccErrors", h,
                                               ECC_CORRECTED, ECC_VOLATILE)}

    def _nvlinks(self, h: Any) -> dict:
        """NVLink: how many links, how many active, and whether they end on an NVSwitch."""
        n = self.lib
        assert n is not None  # noqa: S101
        states = self.nvlink_states(h)
        switch = any(_try(n.uint, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
                     == NVLINK_SWITCH for link, up in enumerate(states) if up)
        return {"nvlink_links": len(states) or None,
                "nvlink_active": sum(states) if states else None,
                "nvswitch": switch if states else None}

    def nvlink_states(self, h: Any) -> list[bool]:
        """Active or not, per link the GPU has ([] without NVLink)."""
        n = self.lib
        assert n is not None  # noqa: S101
        states = []
        for link in range(MAX_LINKS):
            state = _try(n.uint, "nvmlDeviceGetNvLinkState", h, link)
            if state is None:  # NOT_SUPPORTED / INVALID_ARGUMENT: past the last link
                break
            states.append(bool(state))
        return states

    def nvlink_errors(self, h: Any, links: int) -> dict[str, int] | None:
        """Error counters summed over the links, by kind; None where the GPU keeps none."""
        n = self.lib
        assert n is not None  # noqa: S101
        totals: dict[str, int] = {}
        for kind, counter in NVLINK_COUNTERS.items():
            values = [_try(n.ulonglong, "nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
                      for link in range(links)]
            known = [v for v in values if v is not None]
            if known:
                totals[kind] = sum(known)
        return totals or None

    def _fabric(self, h: Any, uuid: str | None) -> dict:
        """The GPU fabric (fabric manager) state and status, where the driver reports one."""
        n = self.lib
        assert n is not None  # noqa: S101
        fab = _try(n.fabric, h)
        if fab is not None and fab[0] != 0:
            return {"fabric_state": fab[0], "fabric_status": fab[1]}
        if self.smi and uuid:
            # Some drivers answer only through nvidia-smi (seen: NVML v1 says N/A, smi says
            # Completed on the same GPU).
            smi = self._info_smi(uuid, None, 0, ["fabric_state_text", "fabric_status_text"])
            return {"fabric_state": smi.get("fabric_state"),
                    "fabric_status": smi.get("fabric_status")}
        return {"fabric_state": None, "fabric_status": None}

    def sample_from_handle(self, h: Any) -> dict:
        n = self.lib
        assert n is not None  # noqa: S101
        power = _try(n.uint, "nvmlDeviceGetPowerUsage", h)
        return {
            "pcie_gen": _try(n.uint, "nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_width": _try(n.uint, "nvmlDeviceGetCurrPcieLinkWidth", h),
            "throttle_mask": _try(n.clock_event_reasons, h),
            "temperature_c": _try(n.uint, "nvmlDeviceGetTemperature", h, GPU_SENSOR),
            "sm_clock_mhz": _try(n.uint, "nvmlDeviceGetClockInfo", h, CLOCK_SM),
            "mem_clock_mhz": _try(n.uint, "nvmlDeviceGetClockInfo", h, CLOCK_MEM),
            "power_w": power / 1000 if power is not None else None,
        }

    def processes(self, h: Any) -> list[dict] | None:
        """Compute processes on the GPU: pid, name (where this PID namespace shows it), bytes
        held; None when the driver does not say."""
        n = self.lib
        assert n is not None  # noqa: S101
        procs = _try(n.compute_processes, h)
        if procs is None:
            return None
        return [{"pid": pid, "name": process_name(pid), "used_bytes": used}
                for pid, used in procs]

    def processes_smi(self) -> dict[str, list[dict]] | None:
        """nvidia-smi's compute apps, by the GPU's PCI bus id; None when it cannot say."""
        if not self.smi:
            return None
        text = _run_smi([self.smi, "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory",
                         "--format=csv,noheader,nounits"])
        if text is None:
            return None
        out: dict[str, list[dict]] = {r["pci.bus_id"]: [] for r in self._smi(["pci.bus_id"], None)
                                      if r.get("pci.bus_id")}
        for line in text.strip().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) < 4 or not cells[1].isdigit():
                continue
            used = int(cells[3]) * (1 << 20) if cells[3].isdigit() else None
            pid = int(cells[1])
            out.setdefault(cells[0], []).append(
                {"pid": pid, "name": process_name(pid) or cells[2] or None, "used_bytes": used})
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
        "ecc_uncorrected_aggregate": ("ecc.errors.uncorrected.aggregate.total", int),
        "remap_pending": ("remapped_rows.pending", lambda v: v.lower() in ("yes", "1")),
        "remap_failure": ("remapped_rows.failure", lambda v: v.lower() in ("yes", "1")),
        "retired_pending": ("retired_pages.pending", lambda v: v.lower() in ("yes", "1")),
        "pcie_gen": ("pcie.link.gen.current", int),
        "pcie_gen_max": ("pcie.link.gen.max", int),
        "pcie_width": ("pcie.link.width.current", int),
        "pcie_width_max": ("pcie.link.width.max", int),
        "throttle_mask": ("clocks_event_reasons.active", lambda v: int(v, 16)),
        "sm_clock_mhz": ("clocks.sm", float),
        "mem_clock_mhz": ("clocks.mem", float),
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
            out[key] = _convert(conv, row.get(field))
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
            text = _run_smi(argv)
            if text is None:
                return None
            return [[c.strip() for c in ln.split(",")] for ln in text.strip().splitlines()]

        rows = query(fields)
        good = fields
        if rows is None:  # one unknown field fails the whole query: keep the ones that work
            good = [f for f in fields if query([f]) is not None]
            rows = query(good) if good else None
        out = []
        for row in rows or []:
            out.append(dict(zip(good, row)))  # noqa: B905 (Python 3.8 compatible)
        return out


SAMPLE_KEYS = ("pcie_gen", "pcie_width", "throttle_mask", "temperature_c", "sm_clock_mhz",
               "mem_clock_mhz", "power_w")


def process_name(pid: int) -> str | None:
    """/proc/PID/comm, where this PID namespace shows the process (NVML gives host PIDs; in a
    container the host's processes are not visible)."""
    try:
        with open(os.path.join("/proc", str(pid), "comm")) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _convert(conv: Any, raw: str | None) -> Any:
    """One nvidia-smi CSV cell as a value; None for N/A, [Not Supported] and the like."""
    if raw is None or conv is None or raw.startswith("[") or raw in ("N/A", ""):
        return None
    try:
        return conv(raw)
    except ValueError:
        return None


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except NvmlError:  # NOT_SUPPORTED and friends: the fact is unknown
        return None
    except (OSError, ValueError, ArithmeticError):  # a ctypes argument this driver refuses
        return None


def _run_smi(argv: list[str]) -> str | None:
    """nvidia-smi's standard output, or None when it cannot be run or fails."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None
