"""The discover child: versions, the devices torch sees, NVML facts per GPU.

It runs with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, so it checks that allocator
backend too once the devices are out (alloc.py), while a thread reads NVML's facts (the driver's
calls, not the GPU's work: ctypes lets the check run meanwhile).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

from .alloc import alloc_checks
from .cudart import CudaRt
from .nvml import Nvml
from .runner import Emitter, GiB, wait_for_gate


def child_discover(em: Emitter, opts: dict) -> None:
    em.start("host.discover", "host")
    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    torch, count = _torch_facts(facts)
    devices = [device_identity(torch, i) for i in range(count)]
    facts["devices"] = devices
    # The parent starts the NCCL ranks on this; the slower facts follow.
    em.event("devices", devices=devices, cuda_error=facts["cuda_error"],
             torch=facts["torch"], torch_cuda_build=facts["torch_cuda_build"],
             cuda_available=facts["cuda_available"])
    _runtime_facts(torch, facts)
    em.facts(**facts)
    nvml_facts: dict[str, Any] = {}  # the thread's own: facts above are out already
    nvml = threading.Thread(target=_nvml_facts, args=(nvml_facts, devices), name="nvml-facts",
                            daemon=True)
    nvml.start()
    # This child was started with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync for this.
    if devices:
        wait_for_gate(em, opts.get("cuda_gate"))  # its CUDA contexts come after the list
        alloc_checks(em, torch, opts)
    nvml.join()
    em.facts(**nvml_facts)
    em.done()


def _torch_facts(facts: dict[str, Any]) -> tuple[Any, int]:
    """torch, imported here, and how many devices it sees; CUDA's own words when none."""
    import warnings

    caught: list[str] = []
    with warnings.catch_warnings(record=True) as warns:
        warnings.simplefilter("always")
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda_build"] = torch.version.cuda
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        caught = [str(w.message) for w in warns if "CUDA" in str(w.message)
                  or "driver" in str(w.message).lower()]
    facts["cuda_available"] = available
    facts["cuda_error"] = ""
    if not available and torch.version.cuda:
        try:
            torch.cuda.init()
        except Exception as exc:  # the CUDA error text is the diagnosis
            facts["cuda_error"] = " ".join(str(exc).split())[:400]
        if not facts["cuda_error"] and caught:
            facts["cuda_error"] = " ".join(caught[0].split())[:400]
    return torch, count


def _runtime_facts(torch: Any, facts: dict[str, Any]) -> None:
    """The NCCL torch carries and the CUDA runtime it loaded."""
    facts["cuda_runtime"] = None
    facts["nccl"] = None
    if not facts["cuda_available"]:
        return
    with contextlib.suppress(Exception):
        v = torch.cuda.nccl.version()
        facts["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    with contextlib.suppress(Exception):
        rt = CudaRt.load()
        facts["cuda_runtime"] = f"{rt.version // 1000}.{(rt.version % 1000) // 10}"
        facts["cudart_path"] = rt.path


def _nvml_facts(facts: dict[str, Any], devices: list[dict]) -> None:
    """The driver's view of the system and of each device torch sees (an error is a fact)."""
    try:
        _read_nvml(facts, devices)
    except Exception as exc:  # a thread's error would be lost: the report says it
        facts["nvml_error"] = f"{type(exc).__name__}: {exc}"[:300]


def _read_nvml(facts: dict[str, Any], devices: list[dict]) -> None:
    nv = Nvml()
    facts["nvml"] = nv.system()
    facts["nvml_error"] = nv.error if nv.kind != "nvml" else ""
    facts["gpus_nvml"] = []
    for d in devices:
        info = nv.info(d["uuid"], d["pci_bus_id"], d["index"]) if nv.kind != "none" else {}
        facts["gpus_nvml"].append(info)


def device_identity(torch: Any, i: int) -> dict:
    """Name, UUID and PCI address of torch's device i (NVML is matched by UUID, then PCI)."""
    p = torch.cuda.get_device_properties(i)
    uuid = getattr(p, "uuid", None)
    pci = None
    if hasattr(p, "pci_bus_id"):
        pci = f"{getattr(p, 'pci_domain_id', 0):08X}:{p.pci_bus_id:02X}:" \
              f"{getattr(p, 'pci_device_id', 0):02X}.0"
    return {
        "index": i, "name": p.name, "uuid": f"GPU-{uuid}" if uuid else None,
        "pci_bus_id": pci, "memory_gib": round(p.total_memory / GiB, 1),
        "compute_capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
    }

