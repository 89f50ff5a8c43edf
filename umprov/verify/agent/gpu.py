"""The per-GPU child: compute checked against the CPU, GEMM rate, HBM and pinned-copy
bandwidth; then NVML health (health.py) and managed memory (managed.py) on the same GPU.

The CPU's side of the exactness checks (CpuReferences) is computed in a thread from the moment
torch is imported: it overlaps the wait for the CUDA gate and the CUDA context's start, and
nothing on the CPU is timed."""

from __future__ import annotations

import threading
import time
from typing import Any

from .early_context import start_early_context
from .gpuchild import GpuChild, share_of
from .health import gpu_health
from .managed import ManagedTests
from .runner import (
    Emitter,
    GiB,
    HostLinkLock,
    MiB,
    oom_skip,
    out_of_memory,
    seconds_per_call,
    wait_for_gate,
)

SMOKE_N = 1 << 24  # int64 elements of the smoke kernel
# Pinned copies: PCIe's DMA rate is flat from a few MiB on, so 256 MiB (8 timed copies each way,
# about 40 ms at 55 GB/s) measures the link as 1 GiB did, without pinning and filling 1 GiB
# first (most of the check's 0.8-0.9 s).
PINNED_CAP = 256 * MiB


def gemm_size(quick: bool) -> int:
    """The side of the exactness checks' integer matrices."""
    return 1024 if quick else 2048


class CpuReferences:
    """What the exactness checks compare with, made on the CPU in a thread of its own: the
    integer matrices and their product (shared by the fp32 and bf16 checks) and the smoke
    kernel's sum. ``get()`` waits for them; an error there is raised in the check."""

    def __init__(self, torch: Any, dev: int, quick: bool) -> None:
        self.torch, self.dev, self.size = torch, dev, gemm_size(quick)
        self.mats: tuple[Any, Any, Any] | None = None
        self.smoke_sum: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._compute, name="cpu-references",
                                        daemon=True)
        self._thread.start()

    def _compute(self) -> None:
        torch, size = self.torch, self.size
        try:
            gen = torch.Generator().manual_seed(1234 + self.dev)
            a = torch.randint(-3, 4, (size, size), generator=gen).float()
            b = torch.randint(-3, 4, (size, size), generator=gen).float()
            # Small integers: every product and partial sum is exact in fp32 (< 2**24).
            self.mats = (a, b, a @ b)
            # the modulus makes a closed form awkward: the CPU computes the reference
            self.smoke_sum = int(((torch.arange(SMOKE_N, dtype=torch.int64) * 3 + 1)
                                  % 1000003).sum())
        except BaseException as exc:  # noqa: BLE001 (raised again in the check that needs it)
            self.error = exc

    def get(self) -> CpuReferences:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self


class GpuChecks(GpuChild):
    """The per-GPU child's checks, one after another on its GPU."""

    def __init__(self, em: Emitter, dev: int, opts: dict,
                 refs: CpuReferences | None = None) -> None:
        super().__init__(em, dev, opts)
        self.refs = refs

    def run(self) -> None:
        g = self.guard
        g("gpu.smoke_kernel", self.smoke)
        g("gpu.gemm_fp32_exact", self.gemm_fp32_exact)
        g("gpu.gemm_bf16_checked", self.gemm_bf16_checked)
        g("gpu.gemm_bf16_rate", self.gemm_rate)  # NVML is sampled during this burst
        g("gpu.health", self.health)
        if not self.quick:
            g("gpu.hbm_copy", self.hbm_copy)
            g("gpu.pinned_copy", self.pinned_copy)
        g("managed.setup", self.managed)
        self.em.done()

    # -- basic compute
    def smoke(self) -> None:
        torch = self.torch
        t0 = time.perf_counter()
        n = SMOKE_N
        if not self.fits("gpu.smoke_kernel", 4 * 8 * n):
            return
        x = torch.arange(n, device=self.device, dtype=torch.int64)
        y = (x * 3 + 1) % 1000003
        total = int(y.sum().item())
        expected = self._refs().smoke_sum
        ok = total == expected
        ms = (time.perf_counter() - t0) * 1000
        self.rec("gpu.smoke_kernel", "pass" if ok else "fail", measured=ok,
                 detail=f"elementwise + reduction over {n} int64, {ms:.0f} ms"
                 + ("" if ok else f"; got {total}, expected {expected}"), hint="reset")

    def _refs(self) -> CpuReferences:
        """The CPU references, started here where the child did not start them earlier."""
        if self.refs is None:
            self.refs = CpuReferences(self.torch, self.dev, self.quick)
        return self.refs.get()

    def _int_mats(self) -> tuple[Any, Any, Any]:
        """Integer matrices and their product on the CPU, made once: the fp32 and the bf16
        checks share them (the CPU product is the slow part)."""
        mats = self._refs().mats
        if mats is None:  # get() raised what stopped the thread; this is never reached
            raise RuntimeError("no CPU reference matrices")
        return mats

    def gemm_fp32_exact(self) -> None:
        torch = self.torch
        a, b, ref = self._int_mats()
        size = a.shape[0]
        torch.backends.cuda.matmul.allow_tf32 = False
        got = (a.to(self.device) @ b.to(self.device)).cpu()
        bad = int((got != ref).sum())
        self.rec("gpu.gemm_fp32_exact", "pass" if bad == 0 else "fail", measured=bad,
                 unit="wrong elements", limit=0,
                 detail=f"{size}^3 fp32 on integer data vs CPU reference, must be exact",
                 hint="isolate")

    def gemm_bf16_checked(self) -> None:
        torch = self.torch
        a, b, ref = self._int_mats()
        size = a.shape[0]
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        got = (a.to(self.device, torch.bfloat16) @ b.to(self.device, torch.bfloat16)).float().cpu()
        want = ref.to(torch.bfloat16).float()  # one rounding of the exact sum
        rel = ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()
        exact = int((got != want).sum())
        ok = rel <= 2.0 ** -7  # at most one bf16 rounding step apart
        self.rec("gpu.gemm_bf16_checked", "pass" if ok else "fail", measured=round(rel, 6),
                 unit="max rel error", limit=2.0 ** -7,
                 detail=f"{size}^3 bf16 on integer data vs CPU reference; "
                 f"{exact} elements not bit-identical", hint="isolate")

    def gemm_rate(self) -> None:
        torch = self.torch
        size = 4096 if self.quick else 8192
        # Full mode: the best of ROUNDS windows of ``iters`` products (about 60 ms each on an
        # H200), so a figure is stable to a few percent from run to run.
        iters, rounds = (30, 1) if self.quick else (40, 3)
        if not self.fits("gpu.gemm_bf16_rate", 4 * 2 * size * size):
            return
        gen = torch.Generator(device=self.device).manual_seed(7)
        a = torch.randn(size, size, device=self.device, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(size, size, device=self.device, dtype=torch.bfloat16, generator=gen)
        first = a @ b
        out = torch.empty_like(first)
        def sample_during() -> None:  # NVML while the burst runs: link, throttle, clocks
            for _ in range(3):
                time.sleep(0.02)
                self.sample()

        with HostLinkLock(self.dev_lock):
            # Clocks and power settle before the clock starts (about 90 ms in full mode).
            for _ in range(3 if self.quick else 60):
                torch.mm(a, b, out=out)
            secs = min(seconds_per_call(torch, lambda: torch.mm(a, b, out=out), iters,
                                        warmup=0, during=sample_during if r == 0 else None)
                       for r in range(rounds))
        tflops = 2 * size**3 / secs / 1e12
        self.figures["bf16_tflops"] = tflops
        self.fig("gpu.gemm_bf16_rate", tflops, "bf16_tflops", judged=not self.quick,
                 detail=f"{size}^3 bf16, best of {rounds} x {iters}", hint="power")
        same = bool(torch.equal(first, out))
        self.rec("gpu.gemm_repeatable", "pass" if same else "fail", measured=same,
                 detail="first and last of identical bf16 GEMMs are bit-identical"
                 if same else "identical GEMMs gave different bits: unstable GPU", hint="isolate")

    # -- NVML health
    def health(self) -> None:
        gpu_health(self)

    # -- bandwidth
    def hbm_copy(self) -> None:
        torch = self.torch
        free, _total = torch.cuda.mem_get_info(self.dev)
        n = share_of(free, 2 * GiB, 0.04)
        if not self.fits("gpu.hbm_copy", 2 * n):
            return
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        with HostLinkLock(self.dev_lock):
            # Best of three rounds of 25 copies (about 25 ms each for 2 GiB on an H200) after
            # a warm-up: stable to a few percent; 7-copy rounds ranged 0.88-0.99x a long loop.
            for _ in range(5):
                dst.copy_(src)
            secs = min(seconds_per_call(torch, lambda: dst.copy_(src), iters=25, warmup=0)
                       for _ in range(3))
        gbps = 2 * n / secs / 1e9  # bytes read + written
        self.figures["hbm_copy_gbps"] = gbps
        self.fig("gpu.hbm_copy", gbps, "hbm_copy_gbps", hint="reset",
                 detail=f"{n // MiB} MiB device-to-device copy, read + write counted")

    def pinned_copy(self) -> None:
        torch = self.torch
        free, _ = torch.cuda.mem_get_info(self.dev)
        n = share_of(free, PINNED_CAP, 0.02)
        if not self.fits("pcie.h2d_pinned", n):
            return
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        devbuf = torch.empty(n, dtype=torch.uint8, device=self.device)
        with HostLinkLock(self.lock), HostLinkLock(self.dev_lock):
            def h2d() -> None:
                devbuf.copy_(host, non_blocking=True)

            def sample_link() -> None:  # PCIe link state while data crosses it
                time.sleep(0.03)
                self.sample()

            up_s = seconds_per_call(torch, h2d, iters=8, warmup=2, during=sample_link)
            up = n / up_s / 1e9
            down_s = seconds_per_call(torch, lambda: host.copy_(devbuf, non_blocking=True),
                                      iters=8, warmup=2)
            down = n / down_s / 1e9
        self.figures["h2d_gbps"], self.figures["d2h_gbps"] = up, down
        self.fig("pcie.h2d_pinned", up, "h2d_gbps", hint="reseat",
                 detail=f"{n // MiB} MiB pinned host-to-device")
        self.fig("pcie.d2h_pinned", down, "d2h_gbps", hint="reseat",
                 detail=f"{n // MiB} MiB pinned device-to-host")

    # -- managed memory
    def managed(self) -> None:
        ManagedTests(self).run()



def child_gpu(em: Emitter, opts: dict, dev: int) -> None:
    em.start("gpu.init", f"gpu{dev}")
    early = start_early_context(dev, opts.get("cuda_gate"))
    import torch

    if dev >= torch.cuda.device_count():  # started on a guess that was too high
        em.event("absent", device=dev)
        em.done()
        return
    refs = CpuReferences(torch, dev, bool(opts.get("quick")))  # CPU only: starts at once
    wait_for_gate(em, opts.get("cuda_gate"))  # the monitor child has listed the processes
    early.join()
    em.event("mark", what="cuda init")
    try:
        child = GpuChecks(em, dev, opts, refs)
    except Exception as exc:  # no CUDA context or first buffer: a busy GPU, not a broken one
        if not out_of_memory(exc):
            raise
        em.record(oom_skip("gpu", f"gpu{dev}", "gpu.init", exc, "for CUDA to start on it"))
        em.done()
        return
    child.run()


