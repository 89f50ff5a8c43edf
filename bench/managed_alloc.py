"""umprov's managed-memory allocator for PyTorch (docker/pytorch-cuda/managed) on a GPU host:
a training step that fits, and one at twice the device memory left to it, against baselines
measured in the same run.

    python3 bench/managed_alloc.py [--dim 8192] [--fit-layers 4] [--left-gib 8] [--steps 5]

The reservoir's own path: every case runs with UMPROV_MANAGED_GRADS_DOWN=0 (gradients down,
the default since run J of docs/managed-memory.md, is bench/managed_peers.py's). Each case runs
in a child process of its own (an allocator is chosen before the first CUDA tensor): an MLP of
Linear(dim, dim, bias=False) layers, fp32, Adam, batch 256, ``--steps`` steps; each layer's
working set is 16 * dim^2 bytes (weights, gradients, two moments).

- fitted: ``--fit-layers`` layers under PyTorch's default allocator (the baseline), then under
  the managed allocator; target: managed <= 1.2x the default per step after the first, and the
  same losses.
- oversubscribed: device memory reserved with plain cudaMalloc until ``--left-gib`` is free,
  then a model of twice that under the managed allocator (it must complete) and under the
  default one (out of memory, the contrast). The PCIe floor: every byte that spilled to the host
  crossing the bus once each way a step (2 x spilled / pinned host-to-device rate, the rate
  measured in the same run); target: a step <= 3x that floor.

Safety on a shared GPU: the managed working set never exceeds what the GPU had free before the
reservation (the reservation is the pressure), nor what the host has available; every child
gives everything back on exit. Compiles the allocator with gcc (no CUDA headers needed).
Results: bench/results/managed_alloc.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "docker" / "pytorch-cuda" / "managed"
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
GIB = 1 << 30


def build(out: Path, source: Path = SOURCE) -> Path:
    library = out / "libumprov_managed.so"
    subprocess.run(["sh", str(source / "build.sh"), str(library)], check=True)
    return library


# ---- the child: one case ------------------------------------------------------------------
def child(case: dict) -> dict:
    import ctypes

    import torch

    sys.path.insert(0, str(SOURCE))
    import umprov_managed

    reservation = None
    if case.get("left_gib"):
        cudart = umprov_managed._cudart()
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
        keep = free.value - int(case["left_gib"] * GIB)
        reservation = ctypes.c_void_p()
        if cudart.cudaMalloc(ctypes.byref(reservation), ctypes.c_size_t(keep)) != 0:
            return {"error": f"could not reserve {keep / GIB:.1f} GiB"}
    if case["allocator"] == "managed":  # its reservoir: the working set, at most what was free
        umprov_managed.enable(reservoir=int(max(2 * (case.get("left_gib") or 0), 1) * GIB))
    torch.manual_seed(0)
    dim, layers = case["dim"], case["layers"]
    try:
        model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim, bias=False)
                                      for _ in range(layers)]).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(256, dim, device="cuda")
        times, losses = [], []
        for _ in range(case["steps"]):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
    except torch.OutOfMemoryError as exc:
        return {"oom": True, "detail": str(exc).splitlines()[0][:200]}
    out = {"step_s": times, "losses": losses, "working_set_gib": 16 * dim * dim * layers / GIB}
    if case["allocator"] == "managed":
        out["stats"] = umprov_managed.stats()
    return out


def pinned_h2d(gib: float = 2.0) -> float:
    """GB/s of a pinned host-to-device copy, the best of 5."""
    import torch

    n = int(gib * GIB)
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t0) / 1e9)
    del host, dev
    torch.cuda.empty_cache()  # a later neighbour or child sees the GPU as before
    return best


def run_case(library: Path, **case: object) -> dict:
    # the reservoir's own path, as these figures were first measured: gradients down (the
    # default since run J) would keep the gradients out of it
    env = {**os.environ, **NVLS_OFF, "UMPROV_MANAGED_LIBRARY": str(library),
           "UMPROV_MANAGED_GRADS_DOWN": "0"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    try:
        return {**case, **json.loads(proc.stdout.strip().splitlines()[-1])}
    except (IndexError, ValueError):
        return {**case, "error": f"exit {proc.returncode}: {proc.stderr[-600:]}"}


def after_first(result: dict) -> float | None:
    steps = result.get("step_s") or []
    return statistics.median(steps[1:]) if len(steps) > 1 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--fit-layers", type=int, default=4)
    ap.add_argument("--left-gib", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    import torch

    free = torch.cuda.mem_get_info()[0]
    layer = 16 * args.dim * args.dim
    over_layers = max(1, round(2 * args.left_gib * GIB / layer))
    if over_layers * layer > free:
        raise SystemExit("the oversubscribed model would ask for more than the GPU has free")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = int(next(ln.split()[1] for ln in meminfo if ln.startswith("MemAvailable"))) * 1024
    if over_layers * layer * 1.5 > available:
        raise SystemExit("not enough host memory for the spilled working set")
    rate = pinned_h2d()
    with tempfile.TemporaryDirectory() as tmp:
        library = build(Path(tmp))
        common = {"dim": args.dim, "steps": args.steps}
        cases = {
            "fit_default": run_case(library, allocator="default", layers=args.fit_layers,
                                    **common),
            "fit_managed": run_case(library, allocator="managed", layers=args.fit_layers,
                                    **common),
            "over_managed": run_case(library, allocator="managed", layers=over_layers,
                                     left_gib=args.left_gib, **common),
            "over_default": run_case(library, allocator="default", layers=over_layers,
                                     left_gib=args.left_gib, steps=1, dim=args.dim),
        }
    fit_d, fit_m = after_first(cases["fit_default"]), after_first(cases["fit_managed"])
    over = cases["over_managed"]
    spilled = (over.get("stats") or {}).get("peak_spilled", 0)
    floor = 2 * spilled / (rate * 1e9) if spilled else None
    over_step = after_first(over)
    summary = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "pinned_h2d_gbs": round(rate, 1),
        "fit_step_s": {"default": fit_d, "managed": fit_m},
        "fit_ratio": round(fit_m / fit_d, 3) if fit_d and fit_m else None,
        "fit_losses_equal": cases["fit_default"].get("losses") == cases["fit_managed"].get(
            "losses"),
        "over_working_set_gib": over.get("working_set_gib"),
        "over_spilled_gib": round(spilled / GIB, 2),
        "over_step_s": over_step,
        "pcie_floor_s": floor,
        "over_ratio_to_floor": round(over_step / floor, 2) if over_step and floor else None,
        "default_oom_at_that_size": bool(cases["over_default"].get("oom")),
        "targets": {"fit_ratio_max": 1.2, "over_ratio_to_floor_max": 3.0},
    }
    doc = {"summary": summary, "cases": cases}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "managed_alloc.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
