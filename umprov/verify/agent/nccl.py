"""The host's collective checks: one rank per GPU in a process group over loopback.

Exact-value checks of all_reduce (float32, bfloat16), all_gather, reduce_scatter and broadcast
(every rank learns every rank's mismatch count), send/recv between every pair of GPUs
(pairs.py), bus bandwidth at 1 and 4 GiB and over a size sweep (busbw.py), one
DistributedDataParallel step (ddp.py) and, with ``--duration``, the burn-in (burnin.py).
The ranks start with the per-GPU children; once the monitor child has listed the GPUs'
processes they set up the process group, NCCL's communicator and the DDP model (no data moves)
while the per-GPU checks run, then in full mode wait at a gate, so no collective runs while
per-GPU bandwidth is measured. The parent opens it when every per-GPU child has finished its
checks; the exact-value checks and the DDP step (nothing timed) then run while those children
exit, and the timed ones (send/recv, bus bandwidth, the burn-in) wait at a second gate, opened
once they have exited.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any

from .burnin import burn_in
from .busbw import bus_bandwidth
from .ddp import ddp_prepare, ddp_step, ddp_warm_up
from .early_context import start_early_context
from .group import Rank
from .pairs import send_recv_pairs
from .runner import (
    Emitter,
    HostLinkLock,
    MiB,
    device_lock,
    oom_skip,
    out_of_memory,
    wait_for_gate,
)


def child_nccl(em: Emitter, opts: dict, rank: int) -> None:
    em.start("nccl.init", "host")
    early = (start_early_context(rank, opts.get("cuda_gate"))
             if opts.get("nccl_backend", "nccl") == "nccl" else None)  # not gloo's CPU test
    r = Rank(em, opts, rank)  # imports torch
    wait_for_gate(em, opts.get("cuda_gate"))  # the monitor child has listed the processes
    if early is not None:
        early.join()
    # The process group and NCCL's communicator (eager) and the DDP model are set up while
    # the per-GPU checks run; collectives wait for the gate. The communicator moves no data:
    # of its 0.4-0.6 s on one H100, 0.35-0.55 s load NCCL's kernels (NCCL's init timings,
    # bench/agent_costs.py), so it is made outside the GPU's lock (under it, the per-GPU
    # child's GEMM waited 0.9 s for it and for the oversubscription warm-up that queued
    # behind it). In full mode the first collective (join's barrier: peers connect), the DDP
    # model and the warm-up's kernels take the lock: never during the per-GPU child's timed
    # windows. Quick mode's figures are not judged.
    lock = None if r.cpu or r.quick else device_lock(opts, rank)
    # What DDP imports on first use (torch's compiler stack, 1.5 s), meanwhile in a thread:
    # the communicator's set-up is C++ that lets the interpreter go. Quick mode has no DDP.
    imports = None if r.quick else _import_meanwhile("torch._dynamo",
                                                     "torch.nn.parallel.distributed")
    em.event("mark", what="process group, NCCL communicator")
    try:
        init_s = r.join(lock)
        ddp_state = None
        if imports is not None:
            em.event("mark", what="import torch._dynamo")
            imports.join()
            em.event("mark", what="DDP model")
            with HostLinkLock(lock):
                ddp_state = ddp_prepare(r.torch, r.device, rank, r.cpu)
                em.event("mark", what="collectives' warm-up")
                warm_up(r, ddp_state)
    except Exception as exc:  # a GPU another process fills: busy, not broken
        if not out_of_memory(exc):
            raise
        em.record(oom_skip("host", "host", "nccl.init", exc, "for NCCL's communicator"))
        em.done()
        return
    gate, timed_gate = opts.get("gate"), opts.get("timed_gate")
    if gate and not r.quick:
        em.start("nccl.wait_for_gpu_checks", "host")
        wait_for_gate(em, gate, float("inf"))  # the parent opens it when the checks are done
    nccl_v = ""
    if not r.cpu:
        with contextlib.suppress(Exception):
            nccl_v = ".".join(str(x) for x in r.torch.cuda.nccl.version())
    r.emit("nccl.init", "pass", measured=round(init_s, 2), unit="s",
           detail=f"{r.backend} {nccl_v} process group of {r.world} rank(s) over loopback{r.one}")
    exact_collectives(r)
    if ddp_state is not None:  # all ranks must end with identical parameters
        em.start("ddp.step", "host")
        ddp_step(r, ddp_state)
    seconds = float(opts.get("duration") or 0)
    # Timed from here: with one rank nothing is, before a burn-in
    if (r.world > 1 and not r.quick) or seconds > 0:
        _wait_timed(r, timed_gate or gate)
    send_recv_pairs(r)
    bus_bandwidth(r)
    if seconds > 0:
        burn_in(r, seconds)
    em.done()  # no destroy_process_group: the child ends with os._exit, the driver frees all


def _import_meanwhile(*modules: str) -> threading.Thread:
    """Import ``modules`` in a daemon thread (a failure shows where they are first used)."""
    def run() -> None:
        for mod in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(mod)

    thread = threading.Thread(target=run, name="imports", daemon=True)
    thread.start()
    return thread


def _wait_timed(r: Rank, gate: str | None) -> None:
    """The gate of the timed collectives: every per-GPU child of the agent has ended."""
    if gate:
        r.em.start("nccl.wait_for_gpu_checks", "host")
        wait_for_gate(r.em, gate, float("inf"))


def warm_up(r: Rank, ddp_state: dict) -> None:
    """The judged checks' first calls, paid before the gate on small tensors, without records:
    NCCL's connections and kernels for each collective, torch's elementwise kernels (CUDA
    loads each module on first use) and DDP's first iterations. After the gate the checks
    then run warm (in the full run of 2026-12-07 the first all_reduce took 0.11 s, the DDP
    step 0.26 s, both on the run's longest path)."""
    torch, dist, world = r.torch, r.dist, r.world
    idx = torch.arange(4 * world, device=r.device)
    for dtype in (torch.float32, torch.bfloat16):
        x = ((idx % 3) * 2).to(dtype)
        dist.all_reduce(x)
        r.agree(int((x != x).sum()))
    f = (idx % 5).float()
    dist.all_gather_into_tensor(torch.empty(f.numel() * world, device=r.device), f)
    dist.reduce_scatter_tensor(torch.empty(4, device=r.device),
                               torch.cat([torch.full((4,), 1.0, device=r.device)] * world))
    dist.broadcast(f, src=0)
    ddp_warm_up(torch, ddp_state)
    r.sync()


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
