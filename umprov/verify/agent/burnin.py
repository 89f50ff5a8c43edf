"""Burn-in (``--duration``): every GPU loaded at once for the given time, in the NCCL ranks
(one process per GPU) once the per-GPU checks are done.

Each rank keeps its GPU busy with bf16 GEMMs and HBM copies on two streams and, with more than
one GPU, all_reduces of known values, all together; every cycle ends with probes run alone (a
timed GEMM, checked bit for bit against the first one, and a timed copy) and a timed
all_reduce. The ranks agree on the cycle's length and on when to stop, so their collectives
always match. The monitor child samples clocks, temperature, power and clock event reasons
meanwhile (burnin_judge.py judges those); the probes here are judged against the profile: the
median of the second half of the run (the warm, steady state) must meet it.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
from typing import TYPE_CHECKING, Any

from .gpuchild import share_of, skip_reason
from .profiles import select_profile
from .runner import GiB, MiB, seconds_per_call
from .schema import figure, record

if TYPE_CHECKING:
    from .group import Rank

UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Seconds of "90", "90s", "10m", "1h", "1h30m"; ValueError names the bad value."""
    raw = str(text).strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|[smh]?)", raw)
    if not raw or "".join(f"{n}{u}" for n, u in parts) != raw.replace(" ", ""):
        raise ValueError(f"duration {text!r}: use seconds or a number with s, m or h "
                         "(90s, 10m, 1h)")
    seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if not math.isfinite(seconds):  # 400 digits read as a float are infinite
        raise ValueError(f"duration {text!r:.40}: too long")
    return seconds


def plan(free: int, cpu: bool, world: int) -> dict[str, int]:
    """Buffer sizes from the free memory (another process may hold most of it): the GEMM's
    side, the copy's and the all_reduce's bytes, and what they need in all."""
    n = 8192 if not cpu else 256
    copy = max(share_of(free, GiB if not cpu else 4 * MiB, 0.04), MiB)
    nccl = max(share_of(free, 256 * MiB if not cpu else MiB, 0.02), MiB) if world > 1 else 0
    return {"n": n, "copy": copy, "nccl": nccl, "total": 3 * n * n * 2 + 2 * copy + nccl}


class Load:
    """One rank's buffers: GEMM operands, copy buffers, the all_reduce buffer."""

    def __init__(self, r: Rank, sizes: dict[str, int]) -> None:
        torch = self.torch = r.torch
        self.r = r
        self.n = sizes["n"]
        dtype = torch.bfloat16 if not r.cpu else torch.float32
        gen = torch.Generator(device=r.device).manual_seed(11 + r.rank)
        self.a = torch.randn(self.n, self.n, device=r.device, dtype=dtype, generator=gen)
        self.b = torch.randn(self.n, self.n, device=r.device, dtype=dtype, generator=gen)
        self.out = torch.empty_like(self.a)
        self.src = torch.ones(sizes["copy"], dtype=torch.uint8, device=r.device)
        self.dst = torch.empty_like(self.src)
        self.x = None
        if r.world > 1:  # every rank the same size: the least any rank can spare
            elems = r.agree_min(sizes["nccl"] // 4)
            self.x = torch.empty(elems, dtype=torch.float32, device=r.device)
        self.streams = ((torch.cuda.Stream(), torch.cuda.Stream()) if not r.cpu
                        else (None, None))
        self.reference: Any = None

    def on(self, stream: Any) -> Any:
        return self.torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def chunk(self, gemms: int = 10, copies: int = 10) -> None:
        """GEMMs, copies and (with peers) one all_reduce of known values, all in flight."""
        s_gemm, s_copy = self.streams
        with self.on(s_gemm):
            for _ in range(gemms):
                self.torch.matmul(self.a, self.b, out=self.out)
        with self.on(s_copy):
            for _ in range(copies):
                self.dst.copy_(self.src)
        if self.x is not None:
            self.x.fill_(float(self.r.rank + 1))
            self.r.dist.all_reduce(self.x)
        self.r.sync()

    def nccl_wrong(self) -> int:
        """Elements of the last all_reduce that are not 1 + 2 + ... + world."""
        if self.x is None:
            return 0
        world = self.r.world
        return int((self.x != float(world * (world + 1) // 2)).sum())

    def timed(self, fn: Any, reps: int) -> float:
        """Seconds per call, the GPU otherwise idle in this process (CUDA events on a GPU)."""
        if self.r.cpu:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps
        return seconds_per_call(self.torch, fn, reps, warmup=0)

    def probe(self) -> dict:
        gemm_s = self.timed(lambda: self.torch.matmul(self.a, self.b, out=self.out), 20)
        if self.reference is None:
            self.reference = self.out.clone()
        same = bool(self.torch.equal(self.out, self.reference))
        copy_s = self.timed(lambda: self.dst.copy_(self.src), 10)
        out = {"tflops": 2 * self.n ** 3 / gemm_s / 1e12, "same": same,
               "gbps": 2 * self.src.numel() / copy_s / 1e9, "nccl_wrong": self.nccl_wrong()}
        if self.x is not None:
            secs = self.r.slowest_all_reduce_s(self.x, 5)
            world = self.r.world
            out["busbw"] = self.x.numel() * 4 / secs / 1e9 * 2 * (world - 1) / world
        return out


def burn_in(r: Rank, seconds: float) -> None:
    """Load this rank's GPU for ``seconds``; a probe event every cycle, records at the end."""
    em = r.em
    tgt = f"gpu{r.rank}"
    em.start("burnin.load", tgt)
    free = r.torch.cuda.mem_get_info(r.rank)[0] if not r.cpu else 8 * GiB
    sizes = plan(free, r.cpu, r.world)
    why = None if r.cpu else skip_reason(sizes["total"], free)
    if r.agree_max(int(why is not None)):  # all ranks load, or none (their collectives match)
        em.record(record("gpu", tgt, "burnin.load", "skip",
                         detail=why or "skipped: another GPU of the host lacks free memory"))
        return
    load = Load(r, sizes)
    load.chunk()  # warm-up (cuBLAS, NCCL channels): not a measure of a chunk's length
    t0 = time.perf_counter()
    load.chunk()
    cycle = min(5.0, max(1.0, seconds / 10))
    chunks = r.agree_max(max(1, round(cycle / max(time.perf_counter() - t0, 1e-3))))
    em.event("burnin_start", seconds=seconds, chunks_per_cycle=chunks)
    probes: list[dict] = []
    start = time.perf_counter()
    while True:
        for _ in range(chunks):
            load.chunk()
        p = load.probe()
        p["t"] = round(time.perf_counter() - start, 2)
        probes.append(p)
        em.event("burnin_probe", **{k: round(v, 2) if isinstance(v, float) else v
                                    for k, v in p.items()})
        if r.agree_max(int(time.perf_counter() - start >= seconds)):
            break
    em.event("burnin_end", cycles=len(probes))
    burnin_rank_records(r, probes, seconds)


def burnin_rank_records(r: Rank, probes: list[dict], seconds: float) -> None:
    """What a rank judges itself: its GPU's probes against its own profile, and (the lead)
    the all_reduces of the whole burn-in."""
    tgt = f"gpu{r.rank}"
    name = r.torch.cuda.get_device_name(r.rank) if not r.cpu else "cpu"
    profile = select_profile(r.opts["profiles"], name, r.opts.get("forced"))
    judged = not r.cpu
    for check, key, metric in (("burnin.gemm_bf16_rate", "tflops", "bf16_tflops"),
                               ("burnin.hbm_copy", "gbps", "hbm_copy_gbps")):
        vals = [p[key] for p in probes]
        steady = statistics.median(vals[len(vals) // 2:])
        r.em.record(figure("gpu", tgt, check, steady, metric, profile, judged=judged,
                           hint="cooling", detail=f"median of the second half of {len(vals)} "
                           f"probes over {seconds:.0f} s: first {vals[0]:.0f}, min "
                           f"{min(vals):.0f}, last {vals[-1]:.0f}"))
    differ = sum(1 for p in probes if not p["same"])
    r.em.record(record("gpu", tgt, "burnin.gemm_repeatable", "fail" if differ else "pass",
                       measured=differ, unit="probes differing", limit=0, hint="isolate",
                       detail=f"{len(probes)} GEMM probes under load compared bit for bit "
                       "with the first"))
    if r.world == 1:
        return
    wrong = r.agree(sum(p["nccl_wrong"] for p in probes))
    if r.lead:
        bus = [p["busbw"] for p in probes if "busbw" in p]
        r.em.record(record(
            "host", "host", "burnin.nccl", "fail" if wrong else "pass", measured=wrong,
            unit="wrong elements", limit=0, hint="isolate",
            detail=f"all_reduce of known values under load on {r.world} ranks, checked every "
            f"cycle; timed busbw {statistics.median(bus):.0f} GB/s (median of {len(bus)}, "
            "buffer sized to free memory, not judged)"))
