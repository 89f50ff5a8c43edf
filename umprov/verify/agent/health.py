"""Health from the driver's own counters: per GPU (ECC, row remapping, PCIe link, clock event
reasons, temperature, read while the GPU works) and per host (driver, CUDA, torch and NCCL
versions, GPU count, persistence mode, fabric manager)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from .gpuchild import GpuChild

    Rec = Callable[..., None]  # rec(check, verdict, **record fields)


def gpu_health(gc: GpuChild) -> None:
    """NVML's view of one GPU, with the samples taken under load (gc.samples)."""
    if gc.nv.kind == "none":
        gc.rec("gpu.health", "skip", detail=f"no NVML (nvidia-ml-py) and no nvidia-smi: "
               f"{gc.nv.error}")
        return
    info = gc.nv.info(gc.uuid, gc.pci, gc.dev)
    gc.em.facts(**{f"nvml_gpu{gc.dev}": info})
    lim = gc.profile.get("limits", {})
    ecc(gc.rec, info, lim)
    _pcie_link(gc.rec, info, gc.samples)
    throttle(gc.rec, gc.samples)
    temperature(gc.rec, info, gc.samples, lim)


def ecc(rec: Rec, info: dict, lim: dict) -> None:
    """Uncorrectable ECC errors since the driver loaded, row remapping (or page retirement)."""
    unc = info.get("ecc_uncorrected_volatile")
    if info.get("ecc_enabled") is False:
        rec("ecc.mode", "warn", measured="disabled", detail="ECC is off on this GPU",
            hint="config")
    if unc is None:
        rec("ecc.uncorrected_volatile", "skip", detail="not reported")
    else:
        cap = lim.get("ecc_uncorrected_max", 0)
        rec("ecc.uncorrected_volatile", "pass" if unc <= cap else "fail", measured=unc,
            unit="errors", limit=cap, hint="reset",
            detail="volatile uncorrectable ECC errors since the last driver load")
    if info.get("remap_failure") is not None:
        bad = bool(info["remap_failure"])
        rec("ecc.row_remap_failure", "fail" if bad else "pass", measured=bad,
            hint="isolate", detail="row remapping failed: the GPU needs replacing"
            if bad else "no row remap failure")
    if info.get("remap_pending") is not None:
        pend = bool(info["remap_pending"])
        rec("ecc.row_remap_pending", "warn" if pend else "pass", measured=pend,
            hint="reset", detail="a row remap waits for a GPU reset" if pend else
            f"{info.get('remap_uncorrectable_rows') or 0} rows remapped for "
            "uncorrectable errors, none pending")
    elif info.get("retired_pending") is not None:
        pend = bool(info["retired_pending"])
        rec("ecc.retired_pages_pending", "warn" if pend else "pass", measured=pend,
            hint="reset", detail="page retirement waits for a reset" if pend else "")


def _pcie_link(rec: Rec, info: dict, samples: list[dict]) -> None:
    """The link read while busy (it trains down when idle) against its maximum."""
    gens = [s.get("pcie_gen") for s in samples if s.get("pcie_gen")]
    widths = [s.get("pcie_width") for s in samples if s.get("pcie_width")]
    gen, width = (max(gens) if gens else None), (max(widths) if widths else None)
    gmax, wmax = info.get("pcie_gen_max"), info.get("pcie_width_max")
    if gen is None or gmax is None:
        rec("pcie.link_gen", "skip", detail="link generation not reported")
    else:
        rec("pcie.link_gen", "pass" if gen >= gmax else "warn", measured=gen,
            unit="gen", limit=gmax, hint="reseat",
            detail=f"read while busy over {len(gens)} samples; max Gen{gmax}")
    if width is None or wmax is None:
        rec("pcie.link_width", "skip", detail="link width not reported")
    else:
        rec("pcie.link_width", "pass" if width >= wmax else "fail", measured=width,
            unit="lanes", limit=wmax, hint="reseat",
            detail=f"read while busy; max x{wmax}")


# NVML's clock event (throttle) reasons, by bit
THROTTLE_REASONS = ((0x1, "gpu-idle"), (0x2, "applications-clocks"), (0x4, "sw-power-cap"),
                    (0x8, "hw-slowdown"), (0x10, "sync-boost"), (0x20, "sw-thermal"),
                    (0x40, "hw-thermal"), (0x80, "hw-power-brake"), (0x100, "display-clocks"))
POWER_CAP = 0x4  # sw-power-cap: the power limit holds the clocks (expected under load)
SW_THERMAL = 0x20
HW_SLOWDOWNS = 0x8 | 0x40 | 0x80  # hw-slowdown, hw-thermal, hw-power-brake
THERMAL = 0x20 | 0x40
SLOWDOWNS = HW_SLOWDOWNS | SW_THERMAL  # clocks held down by a limit other than the power cap


def throttle_names(mask: int | None) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS if int(mask or 0) & bit]


def throttle(rec: Rec, samples: list[dict], when: str = "under load") -> None:
    """Clock event (throttle) reasons seen in the samples (while busy, or one reading now)."""
    masks = [s.get("throttle_mask") for s in samples if s.get("throttle_mask") is not None]
    if not masks:
        rec("gpu.throttle", "skip", detail="clock event reasons not reported")
        return
    mask = 0
    for m in masks:
        mask |= int(m)
    names = throttle_names(mask)
    verdict = "fail" if mask & HW_SLOWDOWNS else ("warn" if mask & SW_THERMAL else "pass")
    rec("gpu.throttle", verdict, measured=hex(mask),
        hint="cooling" if mask & THERMAL else "power",
        detail=f"clock event reasons {when}: {', '.join(names) or 'none'}")


def temperature(rec: Rec, info: dict, samples: list[dict], lim: dict,
                check: str = "gpu.temperature", when: str = "under load") -> None:
    """The hottest sample against the profile's limits (the GPU's slowdown threshold wins)."""
    temps = [s.get("temperature_c") for s in samples if s.get("temperature_c")]
    temp = max(temps) if temps else info.get("temperature_c")
    if temp is None:
        rec(check, "skip", detail="not reported")
        return
    slow = info.get("temp_slowdown_c")
    warn_at = float(lim.get("temperature_warn_c", 85))
    fail_at = float(lim.get("temperature_fail_c", 92))
    if slow:
        warn_at = min(warn_at, float(slow) - 3)
        fail_at = min(fail_at, float(slow))
    verdict = "fail" if temp >= fail_at else ("warn" if temp >= warn_at else "pass")
    rec(check, verdict, measured=temp, unit="C", limit=warn_at,
        hint="cooling", detail=f"{when}; fails at {fail_at:g} C"
        + (f" (slowdown {slow} C)" if slow else ""))


def host_health(rec: Rec, disc: dict, pre: dict, expected_gpus: int | None) -> None:
    """Host-wide records from the discover child's facts and the pre-checks."""
    infos = disc.get("gpus_nvml") or []
    _versions(rec, disc, pre)
    _gpu_count(rec, disc, pre, expected_gpus)
    _persistence(rec, infos)
    _fabric_manager(rec, infos)


def _versions(rec: Rec, disc: dict, pre: dict) -> None:
    nvml = disc.get("nvml") or {}
    km = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", pre.get("kernel_module") or "")
    driver = nvml.get("driver") or (km.group(1) if km else None)
    rec("host.driver", "pass" if driver else "warn", measured=driver, hint="driver",
        detail=f"NVIDIA driver (via {nvml.get('source')}); supports CUDA "
        f"{nvml.get('cuda_driver') or '?'}")
    rec("host.cuda_runtime", "pass" if disc.get("cuda_runtime") else "warn",
        measured=disc.get("cuda_runtime"), hint="driver",
        detail=f"cudaRuntimeGetVersion of the libcudart torch loaded; torch built for "
        f"CUDA {disc.get('torch_cuda_build')}")
    rec("host.torch", "pass", measured=disc.get("torch"),
        detail=f"python {disc.get('python')}")
    rec("host.nccl", "pass" if disc.get("nccl") else "warn", measured=disc.get("nccl"),
        hint="driver", detail="NCCL version torch carries")


def _gpu_count(rec: Rec, disc: dict, pre: dict, exp: int | None) -> None:
    count = len(disc["devices"])
    nvml_count = (disc.get("nvml") or {}).get("count")
    gpu_count(rec, count, exp, f"torch sees {count}; NVML sees {nvml_count}; /dev nodes "
              f"{len(pre.get('device_nodes') or [])}")


def gpu_count(rec: Rec, count: int, exp: int | None, detail: str) -> None:
    """The GPUs seen against the inventory's expectation (umprov_expected_gpus)."""
    if exp is None:
        rec("host.gpu_count", "pass", measured=count, unit="GPUs",
            detail=detail + "; no expected count given")
    elif count < exp:
        rec("host.gpu_count", "fail", measured=count, unit="GPUs", limit=exp,
            hint="reboot", detail=detail + f"; expected {exp}: a GPU is missing "
            "(fell off the bus, Xid 79?) or hidden by CUDA_VISIBLE_DEVICES")
    elif count > exp:
        rec("host.gpu_count", "warn", measured=count, unit="GPUs", limit=exp,
            hint="config", detail=detail + f"; expected only {exp}: update the "
            "inventory (umprov_expected_gpus)")
    else:
        rec("host.gpu_count", "pass", measured=count, unit="GPUs", limit=exp,
            detail=detail)


def _persistence(rec: Rec, infos: list[dict]) -> None:
    pm = [i.get("persistence") for i in infos if i.get("persistence") is not None]
    if not pm:
        rec("host.persistence_mode", "skip", detail="not reported")
        return
    on = sum(1 for x in pm if x)
    rec("host.persistence_mode", "pass" if on == len(pm) else "warn",
        measured=f"{on}/{len(pm)} enabled", hint="persistence",
        detail="persistence mode keeps the driver loaded between jobs")


def _fabric_manager(rec: Rec, infos: list[dict]) -> None:
    switch = any(i.get("nvswitch") for i in infos)
    states = [(i.get("fabric_state"), i.get("fabric_status")) for i in infos]
    reported = [s for s in states if s[0] not in (None, 0)]
    if reported:
        bad = [s for s in reported if s[0] != 3 or (s[1] not in (None, 0))]
        names = {1: "not started", 2: "in progress", 3: "completed"}
        text = ", ".join(f"gpu{i}: {names.get(s[0], s[0])}" for i, s in enumerate(states))
        rec("host.fabric_manager", "fail" if bad else "pass",
            measured="completed" if not bad else "incomplete", hint="fabric-manager",
            detail=f"GPU fabric state: {text}" + (
                "; start nvidia-fabricmanager at the driver's version" if bad else ""))
    elif switch:
        rec("host.fabric_manager", "skip",
            detail="NVLinks end on an NVSwitch but the driver reports no fabric state "
            "(N/A, e.g. managed by a hypervisor); the NCCL checks test the fabric")
    else:
        rec("host.fabric_manager", "skip", detail="no NVSwitch seen")


def nvlink_active(disc: dict) -> list[int]:
    """Active NVLinks per GPU, where NVML reports them."""
    infos = disc.get("gpus_nvml") or []
    return [i.get("nvlink_active") for i in infos if i.get("nvlink_active") is not None]
