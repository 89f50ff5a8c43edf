"""All_reduce bus bandwidth on the host's ranks (nccl.py), as nccl-tests reports it: busbw =
algbw * 2(n-1)/n, judged at 1 GiB (and 4 GiB in full mode) and, in full mode, over a sweep of
sizes from 8 KiB to 4 GiB (one ``nccl.allreduce_sweep`` record a size, with ``size_bytes``),
so small-message latency shows as well as large-message bandwidth. One GPU moves no data: the
checks are skipped, saying so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .runner import GiB, MiB
from .schema import figure

if TYPE_CHECKING:
    from .group import Rank

KiB = 1 << 10
SWEEP = (8 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB, 4 * GiB)
SWEEP_CHECK = "nccl.allreduce_sweep"
CPU_CAP = 16 * MiB  # the CPU self-test (gloo) only exercises the code path
ONE_RANK = "collective test had one rank: no bus bandwidth"


def _reps(size: int, quick: bool) -> int:
    if size >= 4 * GiB:
        return 5
    if size >= 256 * MiB:
        return 3 if quick else 10
    return 50 if size <= MiB else 20


def bus_bandwidth(r: Rank) -> None:
    """all_reduce bus bandwidth as nccl-tests reports it (algbw * 2(n-1)/n): judged at 1 GiB
    (and 4 GiB in full mode), and over a sweep of sizes from 8 KiB in full mode, one record a
    size, never larger than free memory allows (a quarter of the least free on any rank)."""
    torch = r.torch
    judged = [(GiB, "nccl.busbw_1g")] + ([] if r.quick else [(4 * GiB, "nccl.busbw_4g")])
    sweep = [] if r.quick else [s for s in SWEEP if not r.cpu or s <= CPU_CAP]
    if r.world == 1:
        for _size, check in judged:
            r.emit(check, "skip", detail=ONE_RANK)
        if sweep:
            r.emit(SWEEP_CHECK, "skip", detail=ONE_RANK + " (all_reduce on one GPU moves "
                   "no data)")
        return
    free = r.agree_min(torch.cuda.mem_get_info(r.rank)[0] if not r.cpu else 64 * GiB)
    room = sizes_that_fit(sorted(set(sweep) | {s for s, _c in judged}), free)
    buf = torch.zeros(min(room[-1], CPU_CAP if r.cpu else room[-1]) // 4, dtype=torch.float32,
                      device=r.device) if room else None
    names = {s: c for s, c in judged}
    timed: dict[int, tuple[int, float]] = {}
    for size in room:
        r.em.start(names.get(size, SWEEP_CHECK), "host")
        n = min(size, CPU_CAP) if r.cpu else size
        timed[size] = (n, r.slowest_all_reduce_s(buf[: n // 4], _reps(size, r.quick)))
    del buf
    for size in sweep:
        _sweep_record(r, size, timed.get(size), free)
    for size, check in judged:
        _judged_record(r, size, check, timed.get(size))


def sizes_that_fit(sizes: list[int], free: int) -> list[int]:
    """The message sizes an all_reduce may use with ``free`` bytes free on the fullest GPU:
    a quarter of it at most (NCCL's own buffers and the other children need the rest)."""
    return [s for s in sizes if 4 * s < free]


def _busbw(r: Rank, nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e9 * 2 * (r.world - 1) / r.world


def _sweep_record(r: Rank, size: int, got: tuple[int, float] | None, free: int) -> None:
    if got is None:
        r.emit(SWEEP_CHECK, "skip", size_bytes=size,
               detail=f"{size_text(size)} skipped: {free // MiB} MiB free on the fullest GPU")
        return
    n, secs = got
    r.emit(SWEEP_CHECK, "pass", measured=_busbw(r, n, secs), unit="GB/s", size_bytes=n,
           detail=f"all_reduce float32 {size_text(n)}, {r.world} ranks: {secs * 1e6:.0f} us "
           f"each, algbw {n / secs / 1e9:.1f} GB/s (busbw = algbw x 2(n-1)/n; not judged)")


def _judged_record(r: Rank, size: int, check: str, got: tuple[int, float] | None) -> None:
    gib = size // GiB
    if got is None:
        r.emit(check, "skip", detail=f"not enough free GPU memory for {gib} GiB")
        return
    n, secs = got
    reps = _reps(size, r.quick)
    if r.lead:
        r.em.record(figure(
            "host", "host", check, _busbw(r, n, secs), f"nccl_busbw_{gib}g_gbps", r.profile,
            judged=not r.quick and not r.cpu, hint="reseat",
            detail=f"all_reduce float32 {size_text(n)} x{reps}, {r.world} ranks, "
            f"algbw {n / secs / 1e9:.1f} GB/s"
            + ("; quick: measured while other checks ran" if r.quick else "")))


def size_text(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


