"""Multi-node: one worker per rank, started by torchrun on every host (umprov.verify.multinode
drives it), and the network facts (``--net-info``) that pick the rendezvous and local addresses.

Workers write events, not records: the controller judges, since it knows the inventory.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

from .group import Group, init_process_group
from .runner import Emitter, GiB, MiB


def net_info(target: str | None) -> dict:
    """This network namespace's IPv4 addresses, and the one (with its interface) that routes to
    ``target`` (a UDP connect sends nothing). Used to pick rendezvous and local addresses."""
    import fcntl
    import struct

    addrs: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _idx, ifname in socket.if_nameindex():
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                  struct.pack("256s", ifname[:15].encode()))
                addrs[ifname] = socket.inet_ntoa(raw[20:24])
    route: dict[str, Any] = {"ip": None, "ifname": None}
    probe = target or "192.0.2.1"  # TEST-NET-1: any route out, default route first
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((probe, 9))
        ip = s.getsockname()[0]
        route = {"ip": ip, "ifname": next((n for n, a in addrs.items() if a == ip), None)}
    loopback_only = route["ip"] is not None and route["ip"].startswith("127.")
    if route["ip"] is None or (loopback_only and not (target or "").startswith("127.")):
        outside = [(n, a) for n, a in addrs.items() if not a.startswith("127.")]
        if outside:
            route = {"ip": outside[0][1], "ifname": outside[0][0]}
    return {"addresses": addrs, "route": route, "hostname": socket.gethostname()}


def child_multinode(em: Emitter, opts: dict) -> None:
    """One rank of the multi-node job: torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK, ...) says
    who it is."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    em.event("started", rank=rank, world=world, local_rank=local, node=node,
             host=socket.gethostname(), master=os.environ.get("MASTER_ADDR"), at=time.time())
    g = _join(em, opts, local)
    n = int(opts.get("elements", 4 * MiB))
    t1 = time.perf_counter()
    _exact(em, g, rank, world, n)
    _busbw(em, g, opts, world)
    em.event("collectives", seconds=round(time.perf_counter() - t1, 3), at=time.time())
    em.done()
    with contextlib.suppress(Exception):
        g.dist.destroy_process_group()


def _join(em: Emitter, opts: dict, local: int) -> Group:
    """The process group through torchrun's rendezvous (its env:// variables)."""
    import datetime

    import torch
    import torch.distributed as dist

    backend = opts.get("backend", "nccl")
    cpu = backend == "gloo"
    if not cpu:
        torch.cuda.set_device(local)
    device = torch.device("cpu") if cpu else torch.device("cuda", local)
    em.start("multinode.init", "host")
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"backend": backend,
                          "timeout": datetime.timedelta(seconds=float(opts["timeout"]))}
    if not cpu:
        kw["device_id"] = device
    init_process_group(dist, kw)
    dist.barrier()
    em.event("joined", init_s=round(time.perf_counter() - t0, 3), torch=torch.__version__,
             at=time.time(),
             nccl=".".join(str(x) for x in torch.cuda.nccl.version()) if not cpu else None)
    return Group(torch, dist, device, cpu)


def _exact(em: Emitter, g: Group, rank: int, world: int, n: int) -> None:
    torch, dist = g.torch, g.dist
    idx = torch.arange(n, device=g.device)
    # all_reduce: each rank adds (i % 1024) * w(rank); the exact sum is known (f32-exact ints)
    em.start("multinode.all_reduce", "host")
    weights = [(r % 3) + 1 for r in range(world)]
    x = ((idx % 1024) * weights[rank]).float()
    dist.all_reduce(x)
    bad = g.agree(int((x != ((idx % 1024) * sum(weights)).float()).sum()))
    em.event("check", check="multinode.all_reduce", wrong=bad, elements=n, world=world)
    # all_gather: rank r contributes (i % 251) + 1000 r; every rank checks all pieces
    em.start("multinode.all_gather", "host")
    chunk = max(1, n // 4)
    mine = (idx[:chunk] % 251 + rank * 1000).float()
    parts = [torch.empty(chunk, device=g.device) for _ in range(world)]
    dist.all_gather(parts, mine)
    wrong = sum(int((p != (idx[:chunk] % 251 + r * 1000).float()).sum())
                for r, p in enumerate(parts))
    bad = g.agree(wrong)
    em.event("check", check="multinode.all_gather", wrong=bad, elements=chunk, world=world)


def _busbw(em: Emitter, g: Group, opts: dict, world: int) -> None:
    """all_reduce of one large buffer (nccl-tests' busbw = algbw * 2(n-1)/n)."""
    em.start("multinode.busbw", "host")
    nbytes = int(opts.get("busbw_bytes", GiB))
    buf = g.torch.zeros(nbytes // 4, dtype=g.torch.float32, device=g.device)
    reps = int(opts.get("reps", 5))
    secs = g.slowest_all_reduce_s(buf, reps)
    algbw = nbytes / secs / 1e9
    em.event("busbw", bytes=nbytes, reps=reps, seconds=round(secs, 6), algbw=round(algbw, 4),
             busbw=round(algbw * 2 * (world - 1) / world, 4) if world > 1 else None)
