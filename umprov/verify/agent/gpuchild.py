"""One GPU as the per-GPU child's checks see it (gpu.py runs them; health.py and managed.py
take it too): its own module so those modules import it, never gpu.py back."""

from __future__ import annotations

from typing import Any

from .discover import device_identity
from .nvml import Nvml
from .profiles import select_profile
from .runner import Emitter, MiB, device_lock, guarded
from .schema import figure, record

HEADROOM = 256 * MiB  # left free beside a check's buffers (cuBLAS workspace, other children)
MIN_BYTES = 16 * MiB  # smaller buffers time nothing worth judging


def share_of(free: int, cap: int, share: float) -> int:
    """A buffer of ``share`` of the free memory, at most ``cap``, in whole MiB."""
    return int(min(cap, free * share)) // MiB * MiB


def skip_reason(nbytes: int, free: int) -> str | None:
    """None when ``nbytes`` of buffers fit in ``free`` bytes with room to spare; else why the
    check is skipped (never an out-of-memory error)."""
    if nbytes >= MIN_BYTES and free >= nbytes + HEADROOM:
        return None
    return (f"skipped: needs {max(nbytes, MIN_BYTES) // MiB} MiB and {HEADROOM // MiB} MiB "
            f"to spare, {free // MiB} MiB free on this GPU")


class GpuChild:
    """One GPU as its checks see it: torch on that device, its profile, NVML, the records
    and figures it has given, and whether buffers fit."""

    def __init__(self, em: Emitter, dev: int, opts: dict) -> None:
        import torch

        self.torch = torch
        self.em = em
        self.dev = dev
        self.opts = opts
        self.quick = bool(opts.get("quick"))
        self.tgt = f"gpu{dev}"
        self.lock = opts.get("lock")
        torch.cuda.set_device(dev)
        self.device = torch.device("cuda", dev)
        info = device_identity(torch, dev)
        # Each GPU is judged by its own model's profile (a mixed host stays right).
        self.profile = select_profile(opts["profiles"], info["name"], opts.get("forced"))
        em.facts(profile=self.profile["name"])
        self.uuid, self.pci = info.get("uuid"), info.get("pci_bus_id")
        self.dev_lock = device_lock(opts, dev)
        self.nv = Nvml()
        self.samples: list[dict] = []
        self.figures: dict[str, float] = {}  # what later checks compare with

    def rec(self, check: str, verdict: str, **kw: Any) -> None:
        self.em.record(record("gpu", self.tgt, check, verdict, **kw))

    def fig(self, check: str, measured: float | None, metric: str, **kw: Any) -> None:
        self.em.record(figure("gpu", self.tgt, check, measured, metric, self.profile, **kw))

    def sample(self) -> None:
        if self.nv.kind != "none":
            s = self.nv.sample(self.uuid, self.pci, self.dev)
            if s:
                self.samples.append(s)

    def guard(self, check: str, fn: Any) -> Any:
        return guarded(self.em, "gpu", self.tgt, check, fn)

    def fits(self, check: str, nbytes: int) -> bool:
        """Whether ``nbytes`` of buffers leave room on this GPU; else a skip record saying so
        (another process may hold the memory: gpu.processes names it)."""
        why = skip_reason(nbytes, self.torch.cuda.mem_get_info(self.dev)[0])
        if why:
            self.rec(check, "skip", detail=why)
        return why is None
