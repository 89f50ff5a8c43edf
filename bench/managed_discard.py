"""Whether the driver gives back the host pages of the reservoir's free blocks (issue 36).

    python3 bench/managed_discard.py [--reservoir-gib 3] [--budget-gib 1] [--spill-gib 1.5]

The question it answers: with gradients down (``UMPROV_MANAGED_GRADS_DOWN=1``), the host peak
is 1.25x the working set because the first step's gradients spill into the reservoir and
their host pages stay resident after they are freed (docs/managed-memory.md, runs F and G).
CUDA 13's driver has ``cuMemDiscardBatchAsync``: a discarded range of managed memory may lose
its pages. Here: tensors past ``--budget-gib`` spill into a reservoir, are freed, and the
reservoir's free blocks (2 MiB-aligned insides) are discarded; the process's resident set is
read after each stage, then the same blocks are written and read again (right contents after
a discard). One process, one GPU; never more managed memory than the GPU has free.
Results: bench/results/managed_discard.json and one line per stage on stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from managed_alloc import GIB, SOURCE, build

ALIGN = 2 << 20  # the driver's large page: discard whole ones


@functools.cache
def driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def resident_mib() -> int:
    with open("/proc/self/status") as status:
        return next(int(ln.split()[1]) for ln in status if ln.startswith("VmRSS")) >> 10


def free_ranges(pool) -> list[tuple[int, int]]:  # noqa: ANN001 - a torch.cuda.MemPool
    """(address, bytes) of each free block's whole 2 MiB pages, from the pool's snapshot
    (its blocks in address order)."""
    ranges = []
    for segment in pool.snapshot():
        at = segment["address"]
        for block in segment["blocks"]:
            low, high = -(-at // ALIGN) * ALIGN, (at + block["size"]) // ALIGN * ALIGN
            if block["state"] == "inactive" and high > low:
                ranges.append((low, high - low))
            at += block["size"]
    return ranges


def discard(ranges: list[tuple[int, int]], stream: int,
            synchronize: Callable[[], None]) -> tuple[int | None, float]:
    """cuMemDiscardBatchAsync over the ranges, and its seconds to the stream's end (None:
    this driver has no such call)."""
    call = getattr(driver(), "cuMemDiscardBatchAsync", None)
    if call is None or not ranges:
        return None, 0.0
    call.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulonglong,
                     ctypes.c_void_p]
    n = len(ranges)
    pointers = (ctypes.c_uint64 * n)(*(a for a, _ in ranges))
    sizes = (ctypes.c_size_t * n)(*(s for _, s in ranges))
    started = time.perf_counter()
    rc = call(pointers, sizes, n, 0, ctypes.c_void_p(stream))
    synchronize()
    return rc, time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reservoir-gib", type=float, default=3)
    ap.add_argument("--budget-gib", type=float, default=1)
    ap.add_argument("--spill-gib", type=float, default=1.5)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    library = build(Path(tempfile.mkdtemp()))
    os.environ.update(UMPROV_MANAGED_LIBRARY=str(library),
                      UMPROV_MANAGED_RESERVOIR=f"{args.reservoir_gib}g",
                      UMPROV_MANAGED_BUDGET=f"{args.budget_gib}g")
    sys.path.insert(0, str(SOURCE))
    import torch
    import umprov_managed

    free, _ = torch.cuda.mem_get_info()
    if args.reservoir_gib * GIB > free:
        raise SystemExit(f"the GPU has {free / GIB:.1f} GiB free: less than the reservoir")
    umprov_managed.enable()
    torch.zeros(1, device="cuda")
    stages = {"start": resident_mib()}
    count = int((args.budget_gib + args.spill_gib) * 4)  # blocks of 256 MiB
    held = [torch.full((64 << 20,), float(i), device="cuda") for i in range(count)]
    torch.cuda.synchronize()
    spilled = umprov_managed.spilled()
    stages["spilled"] = resident_mib()
    del held
    torch.cuda.synchronize()
    stages["freed"] = resident_mib()
    pool = umprov_managed.reservoir(torch.cuda.current_device())
    ranges = free_ranges(pool)
    rc, seconds = discard(ranges, torch.cuda.current_stream().cuda_stream,
                          torch.cuda.synchronize)
    stages["discarded"] = resident_mib()
    again = [torch.full((64 << 20,), 2.0, device="cuda") for _ in range(count)]
    right = all(float(t.sum()) == 2.0 * (64 << 20) for t in again)
    stages["written_again"] = resident_mib()
    version = ctypes.c_int()
    driver().cuDriverGetVersion(ctypes.byref(version))
    result = {"driver_api": version.value, "discard_rc": rc, "discard_s": round(seconds, 4),
              "spilled_gib": round(spilled / GIB, 2), "discarded_gib": round(
                  sum(s for _, s in ranges) / GIB, 2), "resident_mib": stages,
              "right_after_discard": right}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "managed_discard.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
