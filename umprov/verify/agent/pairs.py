"""GPU pairs on the host: send/recv between every pair in both directions (nccl.py's ranks
run it; the receiver reports each direction) and the one record per pair the parent makes of
those reports, judged against the profile and against the host's best pair."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .runner import MiB
from .schema import figure, record

if TYPE_CHECKING:
    from .group import Rank


def pair_rounds(world: int) -> list[list[tuple[int, int]]]:
    """Every pair of ranks once, in world-1 rounds (world rounds when odd) where each rank is
    in one pair at most: the circle method of a round-robin tournament."""
    n = world + world % 2  # an odd world gets a stand-in rank that sits out
    ring = list(range(n))
    rounds = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if max(a, b) < world))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def send_recv_pairs(r: Rank) -> None:
    """send/recv between every pair, one direction at a time as before, but the pairs of a
    round side by side (disjoint GPUs): 2(n-1) timed steps where there were n(n-1), so the time
    grows with the GPU count, not its square. The receiver reports each direction; the parent
    pairs them up."""
    torch, rank = r.torch, r.rank
    pair_bytes = (16 if r.quick else 256) * MiB
    k = pair_bytes // 4
    buf = torch.empty(k, dtype=torch.int32, device=r.device)
    base = torch.arange(k, dtype=torch.int32, device=r.device)
    for pairs in pair_rounds(r.world):
        mine = next((p for p in pairs if rank in p), None)
        target = f"gpu{mine[0]}-gpu{mine[1]}" if mine else "host"
        directions = [mine, mine[::-1]] if mine else [(None, None)] * 2
        for src, dst in directions:  # every rank takes both steps: barriers match
            r.em.start("nccl.send_recv", target)
            _one_way(r, src, dst, base, buf, pair_bytes)


def _one_way(r: Rank, src: int | None, dst: int | None, base: Any, buf: Any,
             pair_bytes: int) -> None:
    """src sends to dst (this rank may be either, or neither: it then only keeps step)."""
    dist, rank = r.dist, r.rank
    iters = 3 if r.quick else 5
    pattern = base ^ (src * 1000 + dst) if rank in (src, dst) else None

    def move() -> None:
        if rank == src:
            dist.send(pattern, dst)
        elif rank == dst:
            dist.recv(buf, src)

    move()  # warm-up: connects the pair
    r.sync()
    dist.barrier()
    t1 = time.perf_counter()
    for _ in range(iters):
        move()
    r.sync()
    secs = time.perf_counter() - t1
    if rank == dst:
        wrong = int((buf != pattern).sum())
        r.em.event("pair", src=src, dst=dst, gbps=pair_bytes * iters / secs / 1e9,
                   wrong=wrong, bytes=pair_bytes, quick=r.quick)


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
