"""Where the verifier's quick run and its bf16 figure lose time and steadiness (issue 38): on
a GPU host, each sample a fresh process.

    UMPROV_BENCH_OUT=DIR python3 bench/agent_costs.py [--samples 2] [--bursts 3]

1. NCCL's communicator for one rank, as the agent's nccl child makes it (a TCP store on
   loopback, ``device_id`` for an eager communicator, a barrier), under NCCL settings that
   could make it cheaper: seconds to import torch, to start CUDA, to make the communicator,
   for the first all_reduce, to destroy the group and to exit; and NCCL's own "Init timings"
   line (NCCL_DEBUG=INFO, subsystem INIT), which splits the set-up into its parts.
2. The bf16 GEMM rate over a 2-second burst of 8192^3 products, in windows of 10 products
   timed with CUDA events, several bursts each in a fresh process: how fast the rate falls
   from the first windows (boost clocks) to the sustained one, and how much each window
   position varies between bursts (the agent takes the best of three windows after 60
   products); the SM clock and board power (NVML) after each window, to tell whether a rate
   normalised by its clock would be steadier.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Results: agent_costs.json in
UMPROV_BENCH_OUT (default bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import free_port, machine  # noqa: E402

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
VARIANTS = {
    "as the agent": {},
    "NCCL_IB_DISABLE=1": {"NCCL_IB_DISABLE": "1"},
    "NCCL_NET=Socket": {"NCCL_NET": "Socket"},
    "CUDA_MODULE_LOADING=EAGER": {"CUDA_MODULE_LOADING": "EAGER"},
    "NCCL_RUNTIME_CONNECT=0": {"NCCL_RUNTIME_CONNECT": "0"},
    "no device_id (lazy)": {"PROBE_LAZY": "1"},
}

COMMUNICATOR = r"""
import datetime, json, os, sys, time
t0 = time.perf_counter()
import torch, torch.distributed as dist
t1 = time.perf_counter()
torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
kw = dict(backend="nccl", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1,
          timeout=datetime.timedelta(seconds=60))
if not os.environ.get("PROBE_LAZY"):
    kw["device_id"] = torch.device("cuda", 0)
dist.init_process_group(**kw); dist.barrier(); torch.cuda.synchronize()
t3 = time.perf_counter()
x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
t4 = time.perf_counter()
dist.destroy_process_group()
t5 = time.perf_counter()
print("PROBE", json.dumps({"import": t1 - t0, "cuda": t2 - t1, "communicator": t3 - t2,
                           "all_reduce": t4 - t3, "destroy": t5 - t4}), flush=True)
os._exit(0)
"""

BURST = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from umprov.verify.agent.discover import device_identity
from umprov.verify.agent.libnvml import LibNvml
nvml = LibNvml.load()
# NVML counts GPUs in PCI order, not CUDA_VISIBLE_DEVICES': CUDA device 0 by its bus id
handle = nvml.handle_by_pci(device_identity(torch, 0)["pci_bus_id"])
def clock_and_watts():
    return (nvml.uint("nvmlDeviceGetClockInfo", handle, 1),  # NVML_CLOCK_SM
            round(nvml.uint("nvmlDeviceGetPowerUsage", handle) / 1000))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(a)
torch.mm(a, b, out=out); torch.cuda.synchronize()
rates, clocks, spent = [], [], 0.0
while spent < 2.0:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.mm(a, b, out=out)
    end.record(); end.synchronize()
    ms = start.elapsed_time(end)
    spent += ms / 1000
    rates.append(round(10 * 2 * 8192 ** 3 / (ms / 1000) / 1e12, 1))
    clocks.append(clock_and_watts())
print("BURST", json.dumps({"tflops": rates, "sm_mhz_watts": clocks}), flush=True)
"""


def communicator(env: dict[str, str]) -> dict:
    full = {**os.environ, **NVLS_OFF, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT",
            **env}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", COMMUNICATOR, str(free_port())],
                              capture_output=True, text=True, timeout=120, env=full)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 120 s"}
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    found = re.search(r"PROBE (\{.*\})", text)
    init = re.findall(r"Init timings.*", text)
    out: dict = {"rc": proc.returncode, "wall_s": round(wall, 3),
                 "nccl_init_timings": init[-1] if init else None}
    if found:
        out.update({k: round(v, 3) for k, v in json.loads(found.group(1)).items()})
    else:
        out["tail"] = text[-1500:]
    return out


def bursts(count: int) -> list[dict]:
    """Each burst's rate and, read after each window, the SM clock and board power."""
    got = []
    for _ in range(count):
        try:
            proc = subprocess.run([sys.executable, "-c", BURST, str(HERE.parent)],
                                  capture_output=True, text=True, timeout=120,
                                  env={**os.environ, **NVLS_OFF})
        except subprocess.TimeoutExpired:
            got.append({"tflops": [], "error": "timed out after 120 s"})
            continue
        found = re.search(r"BURST (\{.*\})", proc.stdout)
        got.append(json.loads(found.group(1)) if found else {"tflops": [],
                                                              "tail": proc.stderr[-1500:]})
    return got


def spread(rates: list[list[float]]) -> list[dict]:
    """Per window position: median rate and max/min over the bursts."""
    n = min((len(r) for r in rates if r), default=0)
    rows = []
    for i in range(n):
        vals = [r[i] for r in rates if r]
        rows.append({"window": i, "median": statistics.median(vals),
                     "max_over_min": round(max(vals) / min(vals), 4)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--bursts", type=int, default=3)
    args = ap.parse_args()
    card = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                           "--format=csv,noheader"],
                          capture_output=True, text=True, check=False).stdout.strip()
    result: dict = {"benchmark": "agent_costs", "machine": machine(), "card": card,
                    "communicator": {}}
    print(card, flush=True)
    for name, env in VARIANTS.items():
        result["communicator"][name] = [communicator(env) for _ in range(args.samples)]
        print(name, json.dumps(result["communicator"][name]), flush=True)
    result["bursts"] = bursts(args.bursts)
    result["by_window"] = spread([b["tflops"] for b in result["bursts"]])
    for row in result["by_window"][::5]:
        print(json.dumps(row))
    out = Path(os.environ.get("UMPROV_BENCH_OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_costs.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
