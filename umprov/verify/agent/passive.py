"""The passive checks (``--passive``): reads only, seconds, safe beside a running job.

Only the driver's management library (NVML, else nvidia-smi) and the kernel log are read: no
torch, no CUDA context, nothing a job on the GPUs would notice. Records: the driver answering
(``host.driver``), the GPU count against the expectation (``host.gpu_count``), per GPU the
uncorrectable ECC errors since the driver loaded and over the GPU's life, row remapping
(failed: fail; pending: warn), the clock event reasons now (a slowdown other than the power
cap or idle), NVLink links down; and the Xid errors of this boot. GPU targets are NVML's
indices (nvidia-smi's order). What needs load (bandwidth, temperature under load, NCCL) is
the active checks' business.

A host that expects no GPU (``--expected-gpus 0``) and has no NVIDIA driver passes: its
honest expectation is met.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from .health import ecc, gpu_count, throttle
from .nvlink import nvlink_records
from .nvlink import snapshot as nvlink_snapshot
from .nvml import Nvml
from .profiles import select_profile
from .schema import host_report, record
from .xid import read_kernel_log, xid_records


def passive_report(expected_gpus: int | None, profiles: dict[str, dict],
                   forced: str | None = None) -> dict:
    """The host document of one passive pass (mode ``passive``)."""
    t0, started = time.monotonic(), time.time()
    nv = Nvml()
    system = nv.system()
    records: list[dict] = []
    devices = _devices(nv, system)
    driver: list[dict] = []  # after the count: a missing GPU is the reason a node drains
    answers = _driver(driver, nv, system, expected_gpus)
    if devices or expected_gpus is not None:
        gpu_count(lambda *a, **kw: records.append(record("host", "host", *a, **kw)),
                  len(devices), expected_gpus, f"NVML ({nv.kind}) sees {len(devices)}"
                  if answers else "no NVIDIA driver answers")
    else:  # nothing seen and nothing said: never a pass
        records.append(record("host", "host", "host.gpu_count", "fail", measured=0,
                              unit="GPUs", limit=1, hint="driver", detail="no NVIDIA GPU "
                              "visible; give the expected count (0 on a host that has none)"))
    records += driver

    def profile_of(index: int) -> dict:
        return select_profile(profiles, devices[index].get("name"), forced)

    for d in devices:
        _gpu_records(records, d, profile_of(d["index"]).get("limits", {}))
    log = read_kernel_log()
    if answers or log.get("xids"):  # no driver: only an Xid that explains why is worth a line
        records += xid_records(log, None, devices, record)
    if devices and nv.lib is not None:
        records += [r for r in nvlink_records(nvlink_snapshot(nv), None, devices, profile_of,
                                              record) if r["check"] == "nvlink.links"]
    names = sorted({d.get("name") or "?" for d in devices})
    profile = profile_of(0)["name"] if devices else "generic"
    facts = {"nvml": system, "nvml_error": nv.error or None, "gpu_models": names,
             "kernel_log": {k: log.get(k) for k in ("source", "messages", "unreadable")},
             "options": {"passive": True, "expected_gpus": expected_gpus}}
    return host_report(socket.gethostname(), records, mode="passive", profile=profile,
                       facts=facts, wall_s=time.monotonic() - t0, started=started)


def _devices(nv: Nvml, system: dict) -> list[dict]:
    """Every GPU the driver lists, with its NVML facts, by NVML index."""
    if nv.kind == "none" or not system.get("driver"):
        return []
    out = []
    for index in range(int(system.get("count") or 0)):
        info = nv.info(index=index)
        out.append({**info, "index": index})
    return out


def _driver(records: list[dict], nv: Nvml, system: dict, expected: int | None) -> bool:
    """host.driver; whether the driver answers."""
    driver = system.get("driver")
    if driver:
        records.append(record("host", "host", "host.driver", "pass", measured=driver,
                              detail=f"the NVIDIA driver answers ({nv.kind}); supports CUDA "
                              f"{system.get('cuda_driver') or '?'}"))
        return True
    why = nv.error or "no libnvidia-ml.so.1 and no nvidia-smi"
    if nv.kind == "none" and expected == 0:
        records.append(record("host", "host", "host.driver", "skip",
                              detail=f"no NVIDIA driver, and this host expects no GPU ({why})"))
    else:
        records.append(record("host", "host", "host.driver", "fail", measured=None,
                              hint="reboot" if nv.kind != "none" else "driver",
                              detail=f"the NVIDIA driver does not answer: {why}"))
    return False


def _gpu_records(records: list[dict], info: dict, limits: dict) -> None:
    target = f"gpu{info['index']}"

    def rec(check: str, verdict: str, **kw: Any) -> None:
        records.append(record("gpu", target, check, verdict, **kw))

    ecc(rec, info, limits)
    lifetime = info.get("ecc_uncorrected_aggregate")
    if lifetime is not None:
        rec("ecc.uncorrected_aggregate", "warn" if lifetime else "pass", measured=lifetime,
            unit="errors", limit=0, hint="investigate",
            detail="uncorrectable ECC errors over the GPU's life (row remapping says whether "
            "they were repaired)")
    throttle(rec, [info], when="now")
