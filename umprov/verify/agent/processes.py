"""Other processes on the GPUs: each one a warning (``--exclusive``: a failure), and named in
the detail of any throughput check that fell short while it was there.

The monitor child lists the compute processes of every GPU twice: before the agent's own
children create their CUDA contexts (each child waits for that list) and after they have all
ended. Every process in either list is someone else's: inside a container NVML reports host
PIDs, which the agent could not tell from its own children otherwise. Names come from
/proc/PID/comm where this PID namespace shows the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .libnvml import NvmlError
from .runner import OUT_OF_MEMORY
from .xid import pci_key

if TYPE_CHECKING:
    from collections.abc import Callable

GiB = 1 << 30
# Units of the figures a busy GPU pulls down (figures judged against a profile).
THROUGHPUT_UNITS = ("GB/s", "TFLOP/s", "x")


def describe(p: dict) -> str:
    name = p.get("name") or "name not visible here"
    held = p.get("used_bytes")
    mem = f", {held / GiB:.1f} GiB" if held is not None else ""
    return f"pid {p['pid']} ({name}{mem})"


def foreign_by_gpu(start: dict | None, end: dict | None, devices: list[dict],
                   ours: frozenset[int] = frozenset()) -> dict[str, list[dict]] | None:
    """{"gpuN": [process, ...]} of the GPUs torch sees; None when no list could be read.
    ``ours``: the agent's own PIDs, left out where NVML's PIDs are this namespace's."""
    gpu_of = {pci_key(d.get("pci_bus_id")): d["index"] for d in devices}
    found: dict[str, dict[int, dict]] = {}
    readable = False
    for snap in (start, end):
        for g in (snap or {}).get("gpus", []):
            idx = gpu_of.get(pci_key(g.get("pci_bus_id")))
            if idx is None or g.get("processes") is None:
                continue
            readable = True
            procs = found.setdefault(f"gpu{idx}", {})
            for p in g["processes"]:
                if int(p["pid"]) not in ours:
                    procs.setdefault(int(p["pid"]), p)
    if not readable:
        return None
    return {tgt: list(procs.values()) for tgt, procs in found.items()}


def process_records(start: dict | None, end: dict | None, devices: list[dict],
                    exclusive: bool, record: Callable[..., dict],
                    ours: frozenset[int] = frozenset()) -> list[dict]:
    """gpu.processes per GPU: pass (none), warn, or fail under --exclusive."""
    found = foreign_by_gpu(start, end, devices, ours)
    if found is None:
        why = (start or {}).get("error") or "the driver lists no processes"
        return [record("host", "host", "gpu.processes", "skip",
                       detail=f"compute processes not listed: {why}")]
    out = []
    free = {pci_key(g.get("pci_bus_id")): g.get("memory")
            for g in (start or {}).get("gpus", [])}
    for d in devices:
        tgt = f"gpu{d['index']}"
        if tgt not in found:
            out.append(record("gpu", tgt, "gpu.processes", "skip",
                              detail="the driver did not list this GPU's processes"))
            continue
        procs = found[tgt]
        mem = free.get(pci_key(d.get("pci_bus_id")))
        at_start = (f"; {mem[1] / GiB:.1f} of {mem[0] / GiB:.1f} GiB free at the start"
                    if mem else "")
        if not procs:
            out.append(record("gpu", tgt, "gpu.processes", "pass", measured=0,
                              unit="processes", detail="no other compute process" + at_start))
            continue
        verdict = "fail" if exclusive else "warn"
        out.append(record(
            "gpu", tgt, "gpu.processes", verdict, measured=len(procs), unit="processes",
            limit=0, hint="investigate",
            detail=("another process uses this GPU: " if len(procs) == 1 else
                    f"{len(procs)} other processes use this GPU: ")
            + ", ".join(describe(p) for p in procs) + at_start
            + ("; --exclusive: the GPU must be free" if exclusive else
               "; its figures may be low")))
    return out


def name_other_processes(records: list[dict], found: dict[str, list[dict]] | None) -> None:
    """Name the other processes in every throughput figure that warns or fails, and in every
    check skipped because the GPU's memory was taken (a busy GPU, not a broken one)."""
    busy = {tgt: procs for tgt, procs in (found or {}).items() if procs}
    if not busy:
        return
    for r in records:
        short = r["verdict"] == "skip" and OUT_OF_MEMORY in (r["detail"] or "")
        if not short and (r["verdict"] not in ("warn", "fail") or r["unit"] not in
                          THROUGHPUT_UNITS):
            continue
        if short:
            tgts = [r["target"]] if r["target"] in busy else sorted(busy)
            r["detail"] += "; the memory is held by " + "; ".join(
                f"{t}: " + ", ".join(describe(p) for p in busy[t]) for t in tgts)
            continue
        if r["scope"] == "host":
            tgts = sorted(busy)
        else:
            tgts = [t for t in (f"gpu{r['gpu']}", f"gpu{r['peer']}") if t in busy]
        if tgts:
            who = "; ".join(f"{t}: " + ", ".join(describe(p) for p in busy[t]) for t in tgts)
            r["detail"] += f"; another process was using the GPU during the run: {who}"


def snapshot(nv: Any) -> dict:
    """Compute processes and memory of every GPU NVML sees (the monitor child's first and last
    act); ``nv`` is an nvml.Nvml."""
    if nv.lib is None:
        by_bus = nv.processes_smi()
        if by_bus is None:
            return {"gpus": [], "error": nv.error or "no NVML and no nvidia-smi"}
        return {"gpus": [{"pci_bus_id": bus, "processes": procs, "memory": None}
                         for bus, procs in by_bus.items()], "source": "nvidia-smi"}
    gpus = []
    for h in nv.handles():
        ident = nv.identity(h)
        try:
            mem = nv.lib.memory(h)
        except NvmlError:
            mem = None
        gpus.append({**ident, "processes": nv.processes(h), "memory": mem})
    return {"gpus": gpus, "source": "nvml"}
