"""Another process on GPU 0, for tests/gpu/test_verify_fleet_gpu.py (run as a script).

    python gpu_hog.py memory 0.85   # holds 85% of GPU 0's FREE memory (never more), then idles
    python gpu_hog.py leave 0.6     # holds all of GPU 0's free memory but 0.6 GiB, then idles
    python gpu_hog.py matmul        # bf16 matrix products on GPU 0, back to back, until killed

Prints "ready" on stdout once it holds the memory or runs its first products.
"""

from __future__ import annotations

import sys
import time

import torch


def main() -> None:
    kind = sys.argv[1]
    torch.cuda.set_device(0)
    if kind in ("memory", "leave"):
        free, _total = torch.cuda.mem_get_info(0)
        if kind == "leave":
            nbytes = free - int(float(sys.argv[2]) * (1 << 30))
        else:
            share = float(sys.argv[2])
            if not 0 < share < 1:
                raise SystemExit("the share of free memory must be between 0 and 1")
            nbytes = int(free * share)
        if not 0 < nbytes < free:
            raise SystemExit(f"cannot hold {nbytes} of {free} free bytes")
        held = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        held.fill_(1)
        torch.cuda.synchronize()
        print("ready", flush=True)
        while True:
            time.sleep(3600)
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    print("ready", flush=True)
    while True:
        for _ in range(20):  # keep a queue of work: the GPU never waits for this process
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
