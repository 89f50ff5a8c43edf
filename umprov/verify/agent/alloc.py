"""The cudaMallocAsync allocator backend, checked in the discover child (started with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) on every GPU."""

from __future__ import annotations

from typing import Any

from .runner import Emitter, HostLinkLock, MiB, device_lock, oom_skip, out_of_memory
from .schema import record


def alloc_checks(em: Emitter, torch: Any, opts: dict) -> None:
    em.start("alloc.cuda_malloc_async", "host")
    backend = torch.cuda.get_allocator_backend()
    for dev in range(torch.cuda.device_count()):
        tgt = f"gpu{dev}"
        em.start("alloc.cuda_malloc_async", tgt)
        try:
            with HostLinkLock(device_lock(opts, dev)):  # not during that GPU's timed checks
                em.record(alloc_check(torch, dev, backend))
        except Exception as exc:
            if out_of_memory(exc):
                em.record(oom_skip("gpu", tgt, "alloc.cuda_malloc_async", exc))
                continue
            em.record(record("gpu", tgt, "alloc.cuda_malloc_async", "fail", hint="investigate",
                             detail=f"{type(exc).__name__}: {exc}"[:400], reason="error"))


def alloc_check(torch: Any, dev: int, backend: str) -> dict:
    device = torch.device("cuda", dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(99 + dev)
    a = torch.randint(-3, 4, (512, 512), generator=gen).float()
    b = torch.randint(-3, 4, (512, 512), generator=gen).float()
    bufs = [torch.empty(64 * MiB, dtype=torch.uint8, device=device) for _ in range(4)]
    del bufs  # returns to the stream-ordered pool
    got = (a.to(device) @ b.to(device)).cpu()
    exact = bool(torch.equal(got, a @ b))
    ok = backend == "cudaMallocAsync" and exact
    return record(
        "gpu", f"gpu{dev}", "alloc.cuda_malloc_async", "pass" if ok else "fail",
        measured=backend, hint="driver" if exact else "isolate",
        detail=f"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: backend reports {backend}; "
        f"matmul copied to the CPU {'matches' if exact else 'DIFFERS from'} the reference")

