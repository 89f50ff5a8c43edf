"""Host documents as the agent writes them, for report tests and the report benchmark.

GPU hosts are built with the agent's own record builders (schema.record/figure/host_report,
pairs.pair_records) and the built-in H200 profile, around the figures measured on the 2x H200
reference machine (../shared/reference/gpu-figures.md; bench/README.md): so each record has
the shape, units, limits, hints and details a real run gives. The host with no GPU is a
recorded run (`umprov verify --local --json --expected-gpus 2` on a machine without a GPU):
tests/data/verify/no_gpu_run.json.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import time
from pathlib import Path

from umprov.verify.agent.pairs import pair_records
from umprov.verify.agent.profiles import BUILTIN_PROFILES
from umprov.verify.agent.schema import figure, host_report, record

DATA = Path(__file__).resolve().parent / "data" / "verify"
H200 = BUILTIN_PROFILES["h200-sxm"]
VERSIONS = {"driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0+cu130", "nccl": "2.28.9"}
# (size in bytes, all_reduce busbw GB/s on 2x H200, torch.distributed)
SWEEP = [(1 << 20, 20.0), (8 << 20, 166.0), (64 << 20, 267.5), (256 << 20, 299.5),
         (1 << 30, 327.0), (4 << 30, 345.0)]


def uuid_of(host: str, index: int) -> str:
    h = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _facts(host: str, gpus: int, versions: dict) -> dict:
    devices = [{"index": i, "name": "NVIDIA H200", "uuid": uuid_of(host, i),
                "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "memory_gib": 139.8,
                "compute_capability": "9.0", "sms": 132} for i in range(gpus)]
    return {
        "precheck": {"kernel_module": f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 "
                     f"{versions['driver']}", "device_nodes": [f"/dev/nvidia{i}" for i in
                                                               range(gpus)],
                     "nvidiactl": True, "nvidia_uvm": True, "torch_importable": True},
        "discover": {
            "python": "3.12.3", "torch": versions["torch"], "torch_cuda_build": versions["cuda"],
            "cuda_available": True, "cuda_error": "", "devices": devices,
            "cuda_runtime": versions["cuda"], "nccl": versions["nccl"],
            "nvml": {"source": "pynvml", "driver": versions["driver"],
                     "cuda_driver": versions["cuda"], "count": gpus},
            "gpus_nvml": [{"uuid": d["uuid"], "persistence": True, "pcie_gen_max": 5,
                           "pcie_width_max": 16, "nvlink_active": 18} for d in devices],
        },
        "profile": {"name": "h200-sxm", "forced": False, "gpu_models": ["NVIDIA H200"]},
    }


def _gpu_records(tgt: str, f: dict) -> list[dict]:
    g = H200
    return [
        record("gpu", tgt, "gpu.smoke_kernel", "pass", measured=True, hint="reset",
               detail="elementwise + reduction over 16777216 int64, 41 ms"),
        record("gpu", tgt, "gpu.gemm_fp32_exact", "pass", measured=0, unit="wrong elements",
               limit=0, hint="isolate",
               detail="2048^3 fp32 on integer data vs CPU reference, must be exact"),
        record("gpu", tgt, "gpu.gemm_bf16_checked", "pass", measured=0.003906,
               unit="max rel error", limit=2.0 ** -7, hint="isolate",
               detail="2048^3 bf16 on integer data vs CPU reference; 0 elements not "
               "bit-identical"),
        figure("gpu", tgt, "gpu.gemm_bf16_rate", f["tflops"], "bf16_tflops", g,
               detail="8192^3 bf16 x50", hint="power"),
        record("gpu", tgt, "gpu.gemm_repeatable", "pass", measured=True, hint="isolate",
               detail="first and last of identical bf16 GEMMs are bit-identical"),
        record("gpu", tgt, "ecc.uncorrected_volatile", "pass", measured=0, unit="errors",
               limit=0.0, hint="reset",
               detail="volatile uncorrectable ECC errors since the last driver load"),
        record("gpu", tgt, "ecc.row_remap_failure", "pass", measured=False, hint="isolate",
               detail="no row remap failure"),
        record("gpu", tgt, "pcie.link_gen", "pass", measured=5, unit="gen", limit=5,
               hint="reseat", detail="current 5 of max 5 under load"),
        record("gpu", tgt, "pcie.link_width", "pass", measured=16, unit="lanes", limit=16,
               hint="reseat", detail="x16 of x16"),
        record("gpu", tgt, "gpu.throttle", "pass", measured="0x0", hint="cooling",
               detail="no thermal or power slowdown under load"),
        record("gpu", tgt, "gpu.temperature", f["temp_verdict"], measured=f["temp"], unit="C",
               limit=85.0, hint="cooling", detail="under load; fails at 92 C"),
        figure("gpu", tgt, "gpu.hbm_copy", f["hbm"], "hbm_copy_gbps", g, hint="reset",
               detail="2048 MiB device-to-device copy, read + write counted"),
        figure("gpu", tgt, "pcie.h2d_pinned", f["h2d"], "h2d_gbps", g, hint="reseat",
               detail="1024 MiB pinned host-to-device"),
        figure("gpu", tgt, "pcie.d2h_pinned", f["d2h"], "d2h_gbps", g, hint="reseat",
               detail="1024 MiB pinned device-to-host"),
        record("gpu", tgt, "managed.attr_managed_memory", "pass", measured=1, hint="driver",
               detail="cudaDevAttrManagedMemory"),
        record("gpu", tgt, "managed.attr_concurrent_access", "pass", measured=1, hint="driver",
               detail="cudaDevAttrConcurrentManagedAccess"),
        record("gpu", tgt, "managed.roundtrip_exact", "pass", measured=0,
               unit="wrong elements", limit=0, hint="isolate",
               detail="4096 MiB written by the CPU, doubled on the GPU, read back exactly"),
        figure("gpu", tgt, "managed.fault_migration", f["fault"], "managed_fault_gbps", g,
               hint="driver", detail="GPU first touch of host-resident managed pages"),
        record("gpu", tgt, "managed.prefetch_to_gpu_gbps", "pass", measured=f["prefetch"],
               unit="GB/s", detail="cudaMemPrefetchAsync to the GPU"),
        figure("gpu", tgt, "managed.prefetch_vs_pinned", f["prefetch"] / f["h2d"],
               "managed_prefetch_ratio", g, hint="driver",
               detail=f"prefetch {f['prefetch']:.1f} GB/s / pinned {f['h2d']:.1f} GB/s"),
        figure("gpu", tgt, "managed.prefetch_to_host", f["d2h_prefetch"],
               "managed_prefetch_d2h_gbps", g, hint="driver",
               detail="cudaMemPrefetchAsync back to the host"),
        record("gpu", tgt, "alloc.cuda_malloc_async", "pass", measured="cudaMallocAsync",
               hint="driver", detail="PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: backend "
               "reports cudaMallocAsync; matmul copied to the CPU matches the reference"),
    ]


def _gpu_figures(rng: random.Random) -> dict:
    h2d = rng.uniform(53.0, 54.2)
    temp = round(rng.uniform(38, 52), 1)
    return {"tflops": rng.uniform(770, 790), "hbm": rng.uniform(4255, 4292), "h2d": h2d,
            "d2h": rng.uniform(54.0, 55.2), "fault": rng.uniform(6.2, 8.8),
            "prefetch": h2d * rng.uniform(0.86, 0.9), "d2h_prefetch": rng.uniform(10.2, 12.0),
            "temp": temp, "temp_verdict": "pass"}


def _host_records(host: str, gpus: int, rng: random.Random, bad: dict) -> list[dict]:
    out = [
        record("host", "host", "host.driver", "pass", measured=VERSIONS["driver"], hint="driver",
               detail="NVIDIA driver (via pynvml); supports CUDA 13.0"),
        record("host", "host", "host.cuda_runtime", "pass", measured=VERSIONS["cuda"],
               hint="driver", detail="cudaRuntimeGetVersion of the libcudart torch loaded"),
        record("host", "host", "host.torch", "pass", measured=VERSIONS["torch"],
               detail="python 3.12.3"),
        record("host", "host", "host.nccl", "pass", measured=VERSIONS["nccl"], hint="driver",
               detail="NCCL version torch carries"),
        record("host", "host", "host.gpu_count", "pass", measured=gpus, unit="GPUs",
               limit=gpus, detail=f"{gpus} visible, {gpus} expected"),
        record("host", "host", "host.persistence_mode", "pass", measured=gpus, unit="GPUs",
               hint="persistence", detail="persistence mode on for every GPU"),
        record("host", "host", "nccl.init", "pass", measured=round(rng.uniform(1.6, 2.6), 2),
               unit="s", detail=f"nccl {VERSIONS['nccl']} process group of {gpus} rank(s)"),
    ]
    for check in ("nccl.all_reduce_f32", "nccl.all_reduce_bf16", "nccl.all_gather",
                  "nccl.reduce_scatter", "nccl.broadcast"):
        out.append(record("host", "host", check, "pass", measured=0, unit="wrong elements",
                          limit=0, hint="isolate", detail=f"{check[5:]} over {gpus} ranks"))
    scale = 1.0 if gpus == 2 else 1.07  # more ranks through NVSwitch: a little more busbw
    for gib, base in ((1, 327.0), (4, 345.0)):
        busbw = base * scale * rng.uniform(0.985, 1.01) * bad.get("busbw", 1.0)
        out.append(figure("host", "host", f"nccl.busbw_{gib}g", busbw, f"nccl_busbw_{gib}g_gbps",
                          H200, hint="reseat", detail=f"all_reduce float32 {gib} GiB, "
                          f"{gpus} ranks"))
    events = []
    for a in range(gpus):
        for b in range(gpus):
            if a != b:
                slow = bad.get("pair_gpu") in (a, b)
                gbps = rng.uniform(385, 395) * (bad.get("pair_factor", 0.55) if slow else 1.0)
                events.append({"src": a, "dst": b, "gbps": gbps, "wrong": 0,
                               "bytes": 1 << 30, "quick": False})
    return out + pair_records(events, H200, gpus)


def _timing(gpus: int, rng: random.Random, records: list[dict]) -> dict:
    walls = {"discover": round(rng.uniform(2.8, 3.6), 2)}
    lines: dict[str, list] = {"discover": [["host:host.discover", walls["discover"] - 0.4]]}
    for i in range(gpus):
        steps = [[f"gpu{i}:{r['check']}", round(rng.uniform(0.1, 1.4), 2)]
                 for r in records if r["target"] == f"gpu{i}" and r["check"].startswith(
                     ("gpu.", "managed.fault", "managed.prefetch_to_host", "pcie.h2d"))]
        steps.insert(0, [f"gpu{i}:gpu.init", round(rng.uniform(2.5, 3.2), 2)])
        lines[f"gpu{i}"] = steps
        walls[f"gpu{i}"] = round(sum(s[1] for s in steps) + rng.uniform(0.3, 0.8), 2)
    top = max(walls.values())
    for i in range(gpus):
        steps = [["host:nccl.wait_for_gpu_checks", round(top - 2.2, 2)],
                 ["host:nccl.init", 0.6], ["host:nccl.send_recv", 1.1],
                 ["host:nccl.busbw_1g", 0.4], ["host:nccl.busbw_4g", 0.9]]
        lines[f"nccl{i}"] = steps
        walls[f"nccl{i}"] = round(sum(s[1] for s in steps) + 0.3, 2)
    return {"children_wall_s": walls, "timeline": lines}


def gpu_host(host: str, *, gpus: int = 8, seed: int = 0, bad: dict | None = None,
             sweep: bool = False, samples: bool = False, started: float = 1764547200.0,
             versions: dict | None = None) -> dict:
    """A full-mode H200 host document; ``bad`` plants trouble: {"hbm_gpu": 5} (a GPU whose
    HBM copy fails), {"pair_gpu": 3} (slow NVLink of a GPU), {"hot_gpu": 1}, {"busbw": 0.9},
    {"scale": 0.9} (every figure of every GPU that much lower)."""
    bad = bad or {}
    rng = random.Random(f"{host}/{seed}")  # noqa: S311 (made-up figures, not secrets)
    records = []
    for i in range(gpus):
        f = _gpu_figures(rng)
        for key in ("tflops", "hbm", "h2d", "d2h", "prefetch"):
            f[key] *= bad.get("scale", 1.0)
        if bad.get("hbm_gpu") == i:
            f["hbm"] = 2610.0
        if bad.get("hot_gpu") == i:
            f["temp"], f["temp_verdict"] = 87.0, "warn"
        records += _gpu_records(f"gpu{i}", f)
    records += _host_records(host, gpus, rng, bad)
    if sweep:
        records += [record("host", "host", "nccl.allreduce_sweep", "pass",
                           measured=round(bw * rng.uniform(0.98, 1.02), 2), unit="GB/s",
                           detail=f"all_reduce float32 {size} bytes") | {"size_bytes": size}
                    for size, bw in SWEEP]
    extra = _timing(gpus, rng, records)
    if samples:
        extra["samples"] = [{"t": t * 5.0, "gpu": i, "temp_c": 40 + t * 0.8 + i * 2,
                             "power_w": 550 + rng.uniform(-20, 20), "sm_clock_mhz": 1980}
                            for t in range(24) for i in range(gpus)]
    return host_report(host, records, mode="full", profile="h200-sxm",
                       facts=_facts(host, gpus, versions or VERSIONS),
                       wall_s=max(extra["children_wall_s"].values()) + 0.6, started=started,
                       **extra)


def no_gpu_host(host: str = "build-01") -> dict:
    """The recorded run of a machine without a GPU, under another name."""
    doc = copy.deepcopy(json.loads((DATA / "no_gpu_run.json").read_text())["hosts"][0])
    doc["host"] = host
    return doc


def healthy_pair() -> dict:
    return gpu_host("h200-a", gpus=2, sweep=True, samples=True)


def failing_gpu_host() -> dict:
    return gpu_host("h200-b", gpus=8, bad={"hbm_gpu": 5, "pair_gpu": 5})


def fleet(n: int = 40, *, gpus: int = 8, started: float | None = None) -> list[dict]:
    """n hosts; gpu-017's gpu2 fails its HBM copy, gpu-023's gpu6 runs hot, gpu-031's NVLink
    to gpu4 is slow."""
    started = started or time.time()
    plan = {17: {"hbm_gpu": 2}, 23: {"hot_gpu": 6}, 31: {"pair_gpu": 4, "pair_factor": 0.72}}
    return [gpu_host(f"gpu-{i:03d}", gpus=gpus, seed=i, bad=plan.get(i), started=started)
            for i in range(1, n + 1)]
