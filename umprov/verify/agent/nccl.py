"""The host's collective checks: one rank per GPU in a process group over loopback.

Exact-value checks of all_reduce (float32, bfloat16), all_gather, reduce_scatter and broadcast
(every rank learns every rank's mismatch count), send/recv between every pair of GPUs
(pairs.py), bus bandwidth at 1 and 4 GiB and over a size sweep (busbw.py), one
DistributedDataParallel step (ddp.py) and, with ``--duration``, the burn-in (burnin.py).
The ranks start with the per-GPU children; once the monitor child has listed the GPUs'
processes they set up the process group, NCCL's communicator and the DDP model (no data moves)
while the per-GPU checks run, then in full mode wait at a gate, so no collective runs while
per-GPU bandwidth is measured.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import Any

from .burnin import burn_in
from .busbw import bus_bandwidth
from .ddp import ddp_prepare, ddp_step
from .pairs import send_recv_pairs
from .profiles import select_profile
from .runner import (
    Emitter,
    HostLinkLock,
    MiB,
    device_lock,
    oom_skip,
    out_of_memory,
    wait_for_gate,
)
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

    def join(self) -> float:
        """Set up the process group over loopback; seconds it took."""
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
        self.dist.barrier()
        return time.perf_counter() - t0


def child_nccl(em: Emitter, opts: dict, rank: int) -> None:
    em.start("nccl.init", "host")
    r = Rank(em, opts, rank)  # imports torch
    wait_for_gate(em, opts.get("cuda_gate"))  # the monitor child has listed the processes
    # The process group and NCCL's communicator (eager, seconds) and the DDP model are set up
    # while the per-GPU checks run: they move no data; collectives wait for the gate. In full
    # mode each takes this GPU's lock: never during its per-GPU child's timed windows (GEMM,
    # HBM, pinned copies). Quick mode's figures are not judged and its collectives run
    # meanwhile anyway.
    lock = None if r.cpu or r.quick else device_lock(opts, rank)
    em.event("mark", what="process group, NCCL communicator")
    try:
        with HostLinkLock(lock):
            init_s = r.join()
        ddp_state = None
        if not r.quick:  # quick mode leaves the DDP step out (its set-up alone costs seconds)
            # What DDP imports on first use (torch's compiler stack, seconds), after the
            # communicator, out of the lock: nothing here touches a GPU.
            em.event("mark", what="import torch._dynamo")
            for mod in ("torch._dynamo", "torch.nn.parallel.distributed"):
                with contextlib.suppress(Exception):
                    importlib.import_module(mod)
            em.event("mark", what="DDP model")
            with HostLinkLock(lock):
                ddp_state = ddp_prepare(r.torch, r.device, rank, r.cpu)
    except Exception as exc:  # a GPU another process fills: busy, not broken
        if not out_of_memory(exc):
            raise
        em.record(oom_skip("host", "host", "nccl.init", exc, "for NCCL's communicator"))
        em.done()
        return
    gate = opts.get("gate")
    if gate and not r.quick:
        em.start("nccl.wait_for_gpu_checks", "host")
        wait_for_gate(em, gate, float("inf"))  # the parent opens it when the GPUs are free
    nccl_v = ""
    if not r.cpu:
        with contextlib.suppress(Exception):
            nccl_v = ".".join(str(x) for x in r.torch.cuda.nccl.version())
    r.emit("nccl.init", "pass", measured=round(init_s, 2), unit="s",
           detail=f"{r.backend} {nccl_v} process group of {r.world} rank(s) over loopback{r.one}")
    exact_collectives(r)
    send_recv_pairs(r)
    bus_bandwidth(r)
    if ddp_state is not None:  # all ranks must end with identical parameters
        em.start("ddp.step", "host")
        ddp_step(r, ddp_state)
    seconds = float(opts.get("duration") or 0)
    if seconds > 0:
        if gate and r.quick:
            em.start("nccl.wait_for_gpu_checks", "host")
            wait_for_gate(em, gate, float("inf"))
        burn_in(r, seconds)
    em.done()
    with contextlib.suppress(Exception):
        r.dist.destroy_process_group()


def exact_collectives(r: Rank) -> None:
    """all_reduce, all_gather, reduce_scatter, broadcast on integer data: exact results."""
    torch = r.torch
    weights = [(i % 3) + 1 for i in range(r.world)]
    wsum = sum(weights)
    n = (4 if r.quick else 16) * MiB  # elements
    idx = torch.arange(n, device=r.device)
    _all_reduce(r, idx, weights, torch.float32, 1024, "nccl.all_reduce_f32")
    # Integers up to 256 are exact in bf16; every partial sum stays below that.
    _all_reduce(r, idx, weights, torch.bfloat16,
                max(2, 256 // wsum + 1) if wsum <= 256 else 2, "nccl.all_reduce_bf16")
    chunk = n // 4
    _all_gather(r, idx[:chunk])
    _reduce_scatter(r, chunk)
    _broadcast(r, idx[:chunk])


def _wrong(r: Rank, check: str, bad: int, detail: str) -> None:
    r.emit(check, "pass" if bad == 0 else "fail", measured=bad, unit="wrong elements", limit=0,
           hint="isolate", detail=detail)


def _all_reduce(r: Rank, idx: Any, weights: list[int], dtype: Any, modulus: int,
                name: str) -> None:
    r.em.start(name, "host")
    x = ((idx % modulus) * weights[r.rank]).to(dtype)
    r.dist.all_reduce(x)
    want = ((idx % modulus) * sum(weights)).to(dtype)
    bad = r.agree(int((x != want).sum()))
    _wrong(r, name, bad, f"sum of {idx.numel()} {str(dtype).replace('torch.', '')} over "
           f"{r.world} rank(s), exact integers{r.one}")


def _all_gather(r: Rank, head: Any) -> None:
    torch, chunk = r.torch, head.numel()
    r.em.start("nccl.all_gather", "host")
    mine = (head % 251 + r.rank * 1000).float()
    out = torch.empty(chunk * r.world, device=r.device)
    r.dist.all_gather_into_tensor(out, mine)
    want = torch.cat([(head % 251 + i * 1000).float() for i in range(r.world)])
    bad = r.agree(int((out != want).sum()))
    _wrong(r, "nccl.all_gather", bad, f"{chunk} float32 per rank{r.one}")


def _reduce_scatter(r: Rank, chunk: int) -> None:
    torch, rank, world = r.torch, r.rank, r.world
    r.em.start("nccl.reduce_scatter", "host")
    inp = torch.cat([torch.full((chunk,), float((rank + 1) * (j + 1)), device=r.device)
                     for j in range(world)])
    res = torch.empty(chunk, device=r.device)
    r.dist.reduce_scatter_tensor(res, inp)
    bad = r.agree(int((res != float((rank + 1) * world * (world + 1) // 2)).sum()))
    _wrong(r, "nccl.reduce_scatter", bad, f"{chunk} float32 per rank{r.one}")


def _broadcast(r: Rank, head: Any) -> None:
    torch, chunk = r.torch, head.numel()
    r.em.start("nccl.broadcast", "host")
    roots = list(range(r.world)) if r.world <= 8 else [0, r.world - 1]
    bad = 0
    for root in roots:
        want = (head % 241 + root).float()
        t = want.clone() if r.rank == root else torch.zeros(chunk, device=r.device)
        r.dist.broadcast(t, src=root)
        bad += int((t != want).sum())
    _wrong(r, "nccl.broadcast", r.agree(bad), f"from root(s) {roots}{r.one}")
