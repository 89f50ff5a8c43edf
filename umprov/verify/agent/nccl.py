"""The host's collective checks: one rank per GPU in a process group over loopback.

Exact-value checks of all_reduce (float32, bfloat16), all_gather, reduce_scatter and broadcast
(every rank learns every rank's mismatch count), send/recv between every ordered pair of GPUs
(the receiver reports; ``pair_records`` judges the pairs in the parent), bus bandwidth at 1 and
4 GiB (nccl-tests' definition: algbw * 2(n-1)/n) and one DistributedDataParallel step (ddp.py).
In full mode the ranks start early (torch import, NCCL set-up and the DDP model overlap the
per-GPU checks) and wait at a gate, so no collective runs while per-GPU bandwidth is measured.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from typing import Any

from .ddp import ddp_prepare, ddp_step
from .profiles import select_profile
from .runner import Emitter, GiB, MiB
from .schema import figure, record


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

    def agree(self, bad: int) -> int:
        """Sum of a per-rank mismatch count over all ranks (every rank learns it)."""
        t = self.torch.tensor([bad], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t)
        return int(t.item())

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
    r = Rank(em, opts, rank)
    if not r.quick:
        # What DDP imports on first use (torch's compiler stack, seconds): done now, while the
        # per-GPU checks run; nothing here touches a GPU.
        for mod in ("torch._dynamo", "torch.nn.parallel.distributed"):
            with contextlib.suppress(Exception):
                importlib.import_module(mod)
    gate = opts.get("gate")
    if gate:
        em.start("nccl.wait_for_gpu_checks", "host")
        while not os.path.exists(gate):  # the parent opens it when the GPUs are free
            time.sleep(0.02)
        em.start("nccl.init", "host")
    init_s = r.join()
    # Quick mode leaves the DDP step out (its set-up alone costs seconds).
    ddp_state = None if r.quick else ddp_prepare(r.torch, r.device, rank, r.cpu)
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


def send_recv_pairs(r: Rank) -> None:
    """send/recv between every ordered pair; the receiver reports (the parent pairs them up)."""
    torch, dist, rank = r.torch, r.dist, r.rank
    pair_bytes = (16 if r.quick else 256) * MiB
    iters = 3 if r.quick else 5
    k = pair_bytes // 4
    buf = torch.empty(k, dtype=torch.int32, device=r.device)
    base = torch.arange(k, dtype=torch.int32, device=r.device)
    for src in range(r.world):
        for dst in range(r.world):
            if src == dst:
                continue
            r.em.start("nccl.send_recv", f"gpu{min(src, dst)}-gpu{max(src, dst)}")
            pattern = base ^ (src * 1000 + dst)
            if rank == src:
                dist.send(pattern, dst)  # warm-up: connects the pair
            elif rank == dst:
                dist.recv(buf, src)
            r.sync()
            dist.barrier()
            t1 = time.perf_counter()
            for _ in range(iters):
                if rank == src:
                    dist.send(pattern, dst)
                elif rank == dst:
                    dist.recv(buf, src)
            r.sync()
            secs = time.perf_counter() - t1
            if rank == dst:
                wrong = int((buf != pattern).sum())
                r.em.event("pair", src=src, dst=dst, gbps=pair_bytes * iters / secs / 1e9,
                           wrong=wrong, bytes=pair_bytes, quick=r.quick)


def bus_bandwidth(r: Rank) -> None:
    """all_reduce bus bandwidth at one large size (two in full mode)."""
    torch, world = r.torch, r.world
    for gib in ([1] if r.quick else [1, 4]):
        check = f"nccl.busbw_{gib}g"
        r.em.start(check, "host")
        if world == 1:
            r.emit(check, "skip", detail="collective test had one rank: no bus bandwidth")
            continue
        free = torch.cuda.mem_get_info(r.rank)[0] if not r.cpu else 64 * GiB
        nbytes = gib * GiB
        if r.agree(0 if free > 4 * nbytes else 1) != 0:
            r.emit(check, "skip", detail=f"not enough free GPU memory for {gib} GiB")
            continue
        if r.cpu:
            nbytes = 16 * MiB  # the CPU self-test only exercises the code path
        x = torch.zeros(nbytes // 4, dtype=torch.float32, device=r.device)
        reps = 3 if r.quick else (10 if gib == 1 else 5)
        secs = r.slowest_all_reduce_s(x, reps)
        busbw = nbytes / secs / 1e9 * 2 * (world - 1) / world
        if r.lead:
            r.em.record(figure(
                "host", "host", check, busbw, f"nccl_busbw_{gib}g_gbps", r.profile,
                judged=not r.quick and not r.cpu, hint="reseat",
                detail=f"all_reduce float32 {gib} GiB x{reps}, {world} ranks, "
                f"algbw {nbytes / secs / 1e9:.1f} GB/s"
                + ("; quick: measured while other checks ran" if r.quick else "")))
        del x


def pair_records(events: list[dict], profile: dict, world: int) -> list[dict]:
    """One record per GPU pair from the receivers' per-direction events."""
    by_pair: dict[tuple[int, int], dict[tuple[int, int], dict]] = {}
    for e in events:
        a, b = sorted((int(e["src"]), int(e["dst"])))
        by_pair.setdefault((a, b), {})[(int(e["src"]), int(e["dst"]))] = e
    if not by_pair:
        return []
    best = max(min(d["gbps"] for d in dirs.values()) for dirs in by_pair.values())
    outlier = float(profile.get("limits", {}).get("pair_outlier_ratio", 0.7))
    out = []
    for (a, b), dirs in sorted(by_pair.items()):
        tgt = f"gpu{a}-gpu{b}"
        quick = any(d.get("quick") for d in dirs.values())
        size = int(next(iter(dirs.values())).get("bytes") or 0)
        text = ", ".join(f"{s}->{d} {e['gbps']:.1f} GB/s" for (s, d), e in sorted(dirs.items()))
        wrong = sum(int(e["wrong"]) for e in dirs.values())
        slow = min(e["gbps"] for e in dirs.values())
        missing = 2 - len(dirs)
        if wrong or missing:
            out.append(record("pair", tgt, "nccl.send_recv", "fail", measured=wrong,
                              unit="wrong elements", limit=0, hint="isolate",
                              detail=f"{text}; " + (f"{wrong} wrong elements" if wrong else
                                                    "a direction did not report")))
            continue
        rec = figure("pair", tgt, "nccl.send_recv", slow, "p2p_gbps", profile, judged=not quick,
                     hint="reseat", detail=f"slower direction of {text}"
                     + (f"; quick: {size // MiB} MiB transfers" if quick else ""))
        if not quick and world > 2 and slow < outlier * best and rec["verdict"] == "pass":
            rec["verdict"], rec["hint"] = "warn", "reseat"
            rec["detail"] += f"; below {outlier:g} x the best pair ({best:.0f} GB/s)"
        out.append(rec)
    return out
