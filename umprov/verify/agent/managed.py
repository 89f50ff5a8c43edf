"""Managed (unified) memory on one GPU: cudaMallocManaged through ctypes, viewed by torch on
both sides; exact values after migrations, prefetch in both directions, memory advice
(preferred location, accessed-by, read-mostly) and concurrent CPU/GPU access.

Buffers are never more than 3% of the free device memory: managed oversubscription can hang a
shared GPU. Full mode's buffer is FULL_BYTES: 256 MiB is 128 of the driver's 2 MiB migration
units each way and a few milliseconds of every timed transfer, on the flat part of its rate;
1 GiB proved nothing more and cost a second, mostly the CPU faulting its pages in and out.
Every timed transfer or read holds the host-link lock and this GPU's lock, as the other timed
checks do: no other child's work (the oversubscription step's warm-up, NCCL's set-up, the
allocator check) is on this GPU or the host link meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import TYPE_CHECKING, Any

from .cudart import CPU_DEVICE_ID, CudaRt, DevArray
from .runner import HostLinkLock, MiB, seconds_per_call

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .gpuchild import GpuChild

QUICK_BYTES = 64 * MiB
FULL_BYTES = 256 * MiB
# managed.concurrent_access: GPU updates of one half while the CPU works on the other, as many
# bytes in all as 400 passes over the 512 MiB half of the earlier 1 GiB buffer (about 0.14 s of
# GPU work on an H100), whatever the buffer: several CPU passes still fall inside it.
CONCURRENT_BYTES = 400 * 512 * MiB


class ManagedTests:
    """cudaMallocManaged through ctypes, viewed by torch on both sides."""

    def __init__(self, gc: GpuChild) -> None:
        self.gc = gc
        self.torch = gc.torch
        self.dev = gc.dev
        self.quick = gc.quick

    def run(self) -> None:
        gc, torch = self.gc, self.torch
        rt = CudaRt.load()
        rt.set_device(self.dev)
        self.rt = rt
        a83, a89 = self.attributes()
        if a83 != 1:
            return
        free, _ = torch.cuda.mem_get_info(self.dev)
        want = int(gc.opts.get("managed_mib") or 0) * MiB or (
            QUICK_BYTES if self.quick else FULL_BYTES)
        # Never more than 3% of what is free: managed oversubscription can hang a shared GPU.
        n = int(min(want, free * 0.03)) // (2 * MiB) * (2 * MiB)
        if n < 4 * MiB:  # another process may hold the memory: gpu.processes names it
            gc.rec("managed.roundtrip_exact", "skip", measured=free, unit="bytes free",
                   detail=f"skipped: {free // MiB} MiB free on this GPU, too little for a "
                   "managed buffer of at most 3% of it")
            return
        self.n, self.k = n, n // 4
        ptr = rt.malloc_managed(n)
        self.ptr = ptr
        try:
            self.g = torch.as_tensor(DevArray(ptr, self.k), device=gc.device)
            # A float view for timed reads: the int32 sum (used to check values) widens to
            # int64 and runs far below memory speed; a float sum reads at full speed.
            self.gf = torch.as_tensor(DevArray(ptr, self.k, "<f4"), device=gc.device)
            self.c = torch.frombuffer((ctypes.c_byte * n).from_address(ptr), dtype=torch.int32)
            gc.guard("managed.roundtrip_exact", self.roundtrip)
            if a89 == 1:
                gc.guard("managed.prefetch", self.prefetch)
                if not self.quick:
                    gc.guard("managed.preferred_host_accessed_by", self.preferred)
                    gc.guard("managed.read_mostly", self.read_mostly)
                gc.guard("managed.concurrent_access", self.concurrent)
            else:
                for check in ("managed.prefetch", "managed.concurrent_access"):
                    gc.rec(check, "skip", detail="attribute 89 (concurrent managed access) is 0")
        finally:
            self.g = self.gf = self.c = None
            torch.cuda.synchronize()
            rt.free(ptr)

    def attributes(self) -> tuple[int, int]:
        """The device attributes managed memory depends on, as records; (83, 89)."""
        gc, rt = self.gc, self.rt
        a83, a88, a89 = (rt.attr(83, self.dev), rt.attr(88, self.dev), rt.attr(89, self.dev))
        gc.em.facts(**{f"managed_gpu{self.dev}": {
            "cudart": rt.path, "runtime_version": rt.version, "call_form": rt.form(),
            "attr_managed_83": a83, "attr_pageable_88": a88, "attr_concurrent_89": a89}})
        gc.rec("managed.attr_managed_memory", "pass" if a83 == 1 else "fail", measured=a83,
               limit=1, hint="driver", detail="cudaDevAttrManagedMemory (83)")
        gc.rec("managed.attr_concurrent_access", "pass" if a89 == 1 else "warn", measured=a89,
               limit=1, hint="driver",
               detail="cudaDevAttrConcurrentManagedAccess (89)" + (
                   "" if a89 == 1 else ": no on-demand migration; prefetch/concurrency skipped"))
        gc.rec("managed.attr_pageable_access", "pass", measured=a88,
               detail="cudaDevAttrPageableMemoryAccess (88), reported only: "
               + ("HMM on" if a88 else "HMM off on this host"))
        return a83, a89

    # helpers
    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        """The host link and this GPU to this check alone while it times something."""
        with HostLinkLock(self.gc.lock), HostLinkLock(self.gc.dev_lock):
            yield

    def _chunks(self, size: int = 16 * MiB) -> Any:
        for a in range(0, self.k, size):
            yield a, min(self.k, a + size)

    def _cpu_fill(self, offset: int = 0) -> None:
        torch = self.torch
        for a, b in self._chunks():
            self.c[a:b] = torch.arange(a + offset, b + offset, dtype=torch.int32)

    def _cpu_mismatches(self, offset: int) -> int:
        torch = self.torch
        bad = 0
        for a, b in self._chunks():
            bad += int((self.c[a:b] != torch.arange(a + offset, b + offset,
                                                    dtype=torch.int32)).sum())
        return bad

    def _expected_sum(self, offset: int) -> int:
        k = self.k
        return k * (k - 1) // 2 + offset * k

    def _gpu_read(self) -> tuple[float, int]:
        """(GB/s of one timed GPU pass reading the whole buffer, exact int sum of a second)."""
        secs = self._timed(self.gf.sum)
        return self.n / secs / 1e9, int(self.g.sum().item())

    def _timed(self, fn: Any) -> float:
        """Seconds of one call (a migration must be timed once: a second finds it done)."""
        return seconds_per_call(self.torch, fn, 1, warmup=0)

    def roundtrip(self) -> None:
        gc, torch = self.gc, self.torch
        self._cpu_fill(0)  # CPU writes: the pages are now host-resident
        with self._timing():
            secs = self._timed(lambda: self.g.add_(1))  # GPU first touch: fault migration
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bad = self._cpu_mismatches(1)  # CPU reads back what the GPU wrote
        cpu_secs = time.perf_counter() - t0
        gc.rec("managed.roundtrip_exact", "pass" if bad == 0 else "fail", measured=bad,
               unit="wrong values", limit=0, hint="isolate",
               detail=f"cudaMallocManaged {self.n // MiB} MiB: CPU write, GPU +1, CPU read "
               f"back ({self.n / cpu_secs / 1e9:.1f} GB/s CPU-side)")
        fault = self.n / secs / 1e9
        gc.fig("managed.fault_migration", fault, "managed_fault_gbps", judged=not self.quick,
               hint="driver", detail="GPU first touch of host-resident pages")

    def prefetch(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        torch.cuda.synchronize()
        with self._timing():
            up = n / self._timed(lambda: rt.prefetch(ptr, n, dev)) / 1e9
        loc_dev = rt.range_attr(ptr, n, "last_prefetch")
        with self._timing():
            resident_bw, total = self._gpu_read()
            resident_bw = max(resident_bw, self._gpu_read()[0])
        with self._timing():
            down = n / self._timed(lambda: rt.prefetch(ptr, n, CPU_DEVICE_ID)) / 1e9
        loc_host = rt.range_attr(ptr, n, "last_prefetch")
        bad = self._cpu_mismatches(1)
        self.resident_bw = resident_bw
        pinned = gc.figures.get("h2d_gbps")
        right_sum = total == self._expected_sum(1)
        moved = resident_bw > 4 * (pinned or 60)  # reads at HBM speed: the pages moved
        loc_ok = loc_dev in (None, dev) and loc_host in (None, CPU_DEVICE_ID)
        ok = right_sum and bad == 0 and loc_ok and (moved or self.quick)
        gc.rec("managed.prefetch", "pass" if ok else "fail", measured=ok, hint="driver",
               detail=f"call form {rt.form()}; last prefetch location {loc_dev} then {loc_host}; "
               f"GPU read after prefetch {resident_bw:.0f} GB/s; values "
               + ("exact" if right_sum and bad == 0 else f"WRONG ({bad} on CPU)"))
        if self.quick:
            return
        gc.rec("managed.prefetch_to_gpu_gbps", "pass", measured=up, unit="GB/s",
               detail="cudaMemPrefetchAsync to the GPU (judged as a ratio to pinned below)")
        if pinned:
            gc.fig("managed.prefetch_vs_pinned", up / pinned, "managed_prefetch_ratio",
                   hint="driver", detail=f"{up:.1f} GB/s prefetch / {pinned:.1f} GB/s pinned H2D")
        gc.fig("managed.prefetch_to_host", down, "managed_prefetch_d2h_gbps", hint="driver",
               detail="cudaMemPrefetchAsync back to the host")

    def preferred(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.advise(ptr, n, "preferred", CPU_DEVICE_ID)
        rt.advise(ptr, n, "accessed_by", dev)
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        torch.cuda.synchronize()
        pref = rt.range_attr(ptr, n, "preferred")
        with self._timing():
            self._gpu_read()
            bw, total = self._gpu_read()  # second read: still remote if nothing migrated
        rt.advise(ptr, n, "unset_accessed_by", dev)
        rt.advise(ptr, n, "unset_preferred", CPU_DEVICE_ID)
        stayed = bw < 0.5 * getattr(self, "resident_bw", bw * 10)
        right = total == self._expected_sum(1)
        ok = stayed and right and pref in (None, CPU_DEVICE_ID)
        pinned = gc.figures.get("h2d_gbps")
        detail = (f"preferred location host (attribute reads {pref}) + accessed-by GPU; second "
                  f"GPU read {bw:.1f} GB/s vs {getattr(self, 'resident_bw', 0):.0f} GB/s "
                  "GPU-resident: " + ("pages stayed on the host" if stayed else
                                      "pages MIGRATED despite the advice"))
        if not ok:
            gc.rec("managed.preferred_host_accessed_by", "fail", measured=round(bw, 2),
                   unit="GB/s", hint="driver",
                   detail=detail + ("" if right else "; values WRONG"))
        elif pinned:
            gc.fig("managed.preferred_host_accessed_by", bw / pinned, "managed_remote_read_ratio",
                   hint="driver", detail=detail + f"; {bw:.1f} / {pinned:.1f} GB/s pinned")
        else:
            gc.rec("managed.preferred_host_accessed_by", "pass", measured=round(bw, 2),
                   unit="GB/s", detail=detail)

    def read_mostly(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        rt.advise(ptr, n, "read_mostly", dev)
        torch.cuda.synchronize()
        flag = rt.range_attr(ptr, n, "read_mostly")
        with self._timing():
            self._gpu_read()  # faults create read-only copies on the GPU
            dup_bw, total = max(self._gpu_read(), self._gpu_read())
        # The CPU reads too: with read-mostly nothing is invalidated, the GPU copy stays.
        cpu_sum = int(self.c[: 1 << 20].sum(dtype=torch.int64))
        with self._timing():
            again_bw, _ = self._gpu_read()
        # A CPU write must invalidate the copies: the GPU then sees the new values.
        self.c[: 1 << 20] += 1
        _bw, after = self._gpu_read()
        rt.advise(ptr, n, "unset_read_mostly", dev)
        self.c[: 1 << 20] -= 1
        torch.cuda.synchronize()
        fast = dup_bw > 4 * (gc.figures.get("h2d_gbps") or 60)
        kept = again_bw > 0.5 * dup_bw
        coherent = after == total + (1 << 20)
        right = total == self._expected_sum(1) and cpu_sum == (1 << 20) * ((1 << 20) + 1) // 2
        ok = fast and coherent and right and flag in (None, 1)
        verdict = "pass" if ok else ("warn" if right and coherent else "fail")
        gc.rec("managed.read_mostly", verdict, measured=round(dup_bw, 1), unit="GB/s",
               hint="driver",
               detail=f"attribute reads {flag}; second GPU read {dup_bw:.0f} GB/s (GPU copy "
               f"{'made' if fast else 'NOT made'}); after a CPU read {again_bw:.0f} GB/s (copy "
               f"{'kept' if kept else 'dropped'}); CPU write then "
               f"{'seen' if coherent else 'NOT seen'} by the GPU"
               + ("" if right else "; values WRONG"))

    def concurrent(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        half = (self.k // 2) // (512 * 1024) * (512 * 1024)  # 2 MiB aligned split
        if half == 0:
            half = self.k // 2
        a = self.g[:half]
        rt.prefetch(self.ptr, half * 4, self.dev)
        torch.cuda.synchronize()
        before = int(a.sum().item())
        # Enough GPU work on managed pages to outlast several CPU passes over the other half.
        reps = 200 if self.quick else concurrent_reps(half * 4)
        done = torch.cuda.Event()
        for _ in range(reps):
            a.add_(1)
        done.record()
        cpu_part = self.c[half:]
        cpu_part = cpu_part[: min(cpu_part.numel(), 16 * MiB)]  # 64 MiB per CPU pass at most
        passes = busy_passes = 0
        cpu_ok = True
        while passes < 100:
            gpu_busy = not done.query()
            cpu_part.fill_(passes + 7)
            cpu_ok = cpu_ok and bool((cpu_part == passes + 7).all())
            passes += 1
            busy_passes += int(gpu_busy and not done.query())
            if not gpu_busy:
                break
        torch.cuda.synchronize()
        after = int(a.sum().item())
        gpu_ok = after == before + reps * half
        ok = cpu_ok and gpu_ok
        gc.rec("managed.concurrent_access", "pass" if ok else "fail", measured=ok, hint="driver",
               detail=f"CPU wrote and read one half {passes} times, {busy_passes} of them "
               f"while GPU kernels updated the other half; GPU values "
               f"{'exact' if gpu_ok else 'WRONG'}, CPU values {'exact' if cpu_ok else 'WRONG'}")


def concurrent_reps(half_bytes: int) -> int:
    """Full mode's GPU updates of a half of ``half_bytes``: CONCURRENT_BYTES in all, at least
    400 (the earlier count) and at most 4000 (a small buffer on a crowded GPU: launches, not
    bytes, would then take the time)."""
    return min(4000, max(400, CONCURRENT_BYTES // max(half_bytes, 1)))
