"""One rank's view of a process group: what every collective check of the host (nccl.py and
the modules it runs: pairs.py, busbw.py, ddp.py, burnin.py) and across hosts (multinode.py)
needs; its own module so those modules import it, never each other in a circle."""

from __future__ import annotations

import time
from typing import Any

from .profiles import select_profile
from .runner import Emitter, HostLinkLock
from .schema import record


def init_process_group(dist: Any, kw: dict[str, Any]) -> None:
    """With ``device_id`` (an eager NCCL communicator: its set-up cost shows here, not in the
    first collective) where this torch takes it."""
    try:
        dist.init_process_group(**kw)
    except TypeError:
        kw.pop("device_id", None)
        dist.init_process_group(**kw)


class Group:
    """What every collective check of one rank needs: torch, its device, the process group."""

    def __init__(self, torch: Any, dist: Any, device: Any, cpu: bool) -> None:
        self.torch, self.dist, self.device, self.cpu = torch, dist, device, cpu

    def sync(self) -> None:
        if not self.cpu:
            self.torch.cuda.synchronize()

    def agree(self, bad: int, op: str = "SUM") -> int:
        """Sum (or MAX) of a per-rank number over all ranks (every rank learns it)."""
        t = self.torch.tensor([bad], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t, op=getattr(self.dist.ReduceOp, op))
        return int(t.item())

    def agree_max(self, n: int) -> int:
        return self.agree(n, "MAX")

    def agree_min(self, n: int) -> int:
        return -self.agree(-n, "MAX")

    def slowest_all_reduce_s(self, x: Any, reps: int) -> float:
        """Seconds per all_reduce of ``x`` after two warm-ups; the slowest rank's time is the
        collective's time."""
        dist = self.dist
        for _ in range(2):
            dist.all_reduce(x)
        self.sync()
        dist.barrier()
        t1 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x)
        self.sync()
        secs = (time.perf_counter() - t1) / reps
        tt = self.torch.tensor([secs], dtype=self.torch.float64, device=self.device)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())


class Rank(Group):
    """One rank of the host's checks; rank 0 (the lead) writes the host records."""

    def __init__(self, em: Emitter, opts: dict, rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.em, self.opts, self.rank = em, opts, rank
        self.world = int(opts["world"])
        self.quick = bool(opts.get("quick"))
        self.backend = opts.get("nccl_backend", "nccl")  # "gloo" only in the CPU self-test
        cpu = self.backend == "gloo"
        super().__init__(torch, dist, torch.device("cpu") if cpu else torch.device("cuda", rank),
                         cpu)
        self.lead = rank == 0
        self.one = " (collective test had one rank)" if self.world == 1 else ""
        self.profile: dict = {}

    def emit(self, check: str, verdict: str, **k: Any) -> None:
        if self.lead:
            self.em.record(record("host", "host", check, verdict, **k))

    def join(self, lock: str | None = None) -> float:
        """Set up the process group over loopback; seconds it took. The first collective (a
        barrier: NCCL connects its peers and launches a kernel) under ``lock``."""
        import datetime

        torch, opts = self.torch, self.opts
        if not self.cpu:
            torch.cuda.set_device(self.rank)
        name0 = torch.cuda.get_device_name(0) if not self.cpu else "cpu"
        self.profile = select_profile(opts["profiles"], name0, opts.get("forced"))
        kw: dict[str, Any] = {
            "backend": self.backend, "init_method": f"tcp://127.0.0.1:{opts['port']}",
            "rank": self.rank, "world_size": self.world,
            "timeout": datetime.timedelta(seconds=float(opts["timeout"])),
        }
        t0 = time.perf_counter()
        if not self.cpu:
            kw["device_id"] = self.device
        init_process_group(self.dist, kw)
        with HostLinkLock(lock):
            self.dist.barrier()
        return time.perf_counter() - t0
