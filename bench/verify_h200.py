"""Verify on a GPU host: wall times and where they go, NCCL bus bandwidth over the agent's
size sweep, managed-memory ratio, pair matrix.

    python3 bench/verify_h200.py [--repeat 2] [--out DIR]     # on the GPU host

Runs the agent's zipapp (full, then --quick) as users do, and in the same run a raw
torch.distributed all_reduce loop (one process per GPU, no agent code) over the sizes of the
agent's sweep (8 KiB to 4 GiB, nccl-tests' busbw = algbw * 2(n-1)/n) as the baseline for the
agent's bus bandwidth. The per-phase breakdown comes from the reports' ``timings``: for each
child process, when it started and how long each phase (start-up, torch import, CUDA set-up,
each check, each wait) took, and the median over the runs of each phase's end. Reference
figures are from ../shared/reference/gpu-figures.md (2x H200, torch.distributed busbw: 327
GB/s at 1 GiB, 345 GB/s at 4 GiB; nccl-tests gave 313-315 GB/s at 512 MiB).
Results: bench/results/verify_h200.json.
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import free_port, save  # noqa: E402

from umprov.verify.bundle import agent_zipapp  # noqa: E402

REFERENCE = {"busbw_1g": 327.0, "busbw_4g": 345.0, "nccl_tests_512m": 314.0,
             "prefetch_vs_pinned": 0.89}
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def run_agent(args: list[str], out: Path) -> tuple[float, dict]:
    agent = agent_zipapp()  # built (or found in the cache) before the clock starts
    started = time.perf_counter()
    subprocess.run([sys.executable, str(agent), "--quiet", "--json", str(out), *args],
                   check=False, env={**os.environ, **NVLS_OFF})
    return time.perf_counter() - started, json.loads(out.read_text())


def _raw_rank(rank: int, world: int, port: int, sizes: list[int], out: str) -> None:
    """all_reduce of each size: 3 warm-ups, then a timed loop; rank 0 writes the busbw."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    free = torch.cuda.mem_get_info(rank)[0]
    result = {}
    for size in sizes:
        if 4 * size >= free:
            continue
        x = torch.zeros(size // 4, dtype=torch.float32, device="cuda")
        iters = 10 if size >= 4 << 30 else (20 if size >= 256 << 20 else 100)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        secs = (time.perf_counter() - t0) / iters
        result[str(size)] = size / secs / 1e9 * 2 * (world - 1) / world
        del x
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def raw_baseline(world: int, sizes: list[int]) -> dict:
    import torch.multiprocessing as mp

    os.environ.update(NVLS_OFF)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "raw.json")
        mp.spawn(_raw_rank, args=(world, port, sizes, out), nprocs=world, join=True)
        return json.loads(Path(out).read_text())


def sweep(doc: dict) -> dict[int, float]:
    """The agent's all_reduce busbw by message size (bytes), from its sweep records."""
    return {r["size_bytes"]: r["measured"] for r in doc["records"]
            if r["check"] == "nccl.allreduce_sweep" and r["verdict"] == "pass"}


def phases(docs: list[dict]) -> list[dict]:
    """Each (child, phase) of the runs' timings: median start and length, in start order."""
    seen: dict[tuple[str, str], list[dict]] = {}
    for doc in docs:
        for t in doc.get("timings", []):
            seen.setdefault((t["child"], t["name"]), []).append(t)
    out = [{"child": child, "phase": name,
            "start_s": round(statistics.median(t["start_s"] for t in ts), 2),
            "seconds": round(statistics.median(t["seconds"] for t in ts), 2),
            "end_s": round(statistics.median(t["start_s"] + t["seconds"] for t in ts), 2),
            "runs": len(ts)} for (child, name), ts in seen.items()]
    return sorted(out, key=lambda p: (p["start_s"], p["child"]))


def print_phases(title: str, rows: list[dict], top: int = 40) -> None:
    """The longest phases, in start order: where the wall time goes."""
    longest = sorted(rows, key=lambda p: -p["seconds"])[:top]
    print(f"{title}: child, phase, start -> end (seconds since the run started)")
    for p in sorted(longest, key=lambda p: p["start_s"]):
        print(f"  {p['child']:10} {p['phase']:34} {p['start_s']:6.2f} -> {p['end_s']:6.2f}"
              f"  ({p['seconds']:.2f} s)")


def figures(doc: dict) -> dict:
    recs = doc["records"]

    def get(check: str, target: str = "host") -> float | None:
        for r in recs:
            if r["check"] == check and r["target"] == target:
                return r["measured"]
        return None

    gpus = sorted({r["target"] for r in recs if r["scope"] == "gpu"})
    per_gpu = {}
    for g in gpus:
        per_gpu[g] = {
            "bf16_tflops": get("gpu.gemm_bf16_rate", g),
            "hbm_copy_gbps": get("gpu.hbm_copy", g),
            "h2d_pinned_gbps": get("pcie.h2d_pinned", g),
            "d2h_pinned_gbps": get("pcie.d2h_pinned", g),
            "managed_fault_gbps": get("managed.fault_migration", g),
            "managed_prefetch_to_gpu_gbps": get("managed.prefetch_to_gpu_gbps", g),
            "managed_prefetch_vs_pinned": get("managed.prefetch_vs_pinned", g),
            "managed_prefetch_to_host_gbps": get("managed.prefetch_to_host", g),
            "managed_remote_read_ratio": get("managed.preferred_host_accessed_by", g),
            "managed_read_mostly_gbps": get("managed.read_mostly", g),
        }
    pairs = {r["target"]: {"gbps": r["measured"], "detail": r["detail"], "verdict": r["verdict"]}
             for r in recs if r["check"] == "nccl.send_recv"}
    return {"per_gpu": per_gpu, "pairs": pairs,
            "busbw_1g": get("nccl.busbw_1g"), "busbw_4g": get("nccl.busbw_4g")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also copy the reports and results here")
    args = ap.parse_args()
    import torch

    world = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if world else "none"
    tmp = Path(tempfile.mkdtemp(prefix="verify-bench-"))
    full_walls, quick_walls, docs, qdocs = [], [], [], []
    for i in range(args.repeat):
        wall, doc = run_agent(["--expected-gpus", str(world)], tmp / f"full{i}.json")
        full_walls.append(wall)
        docs.append(doc)
        print(f"full run {i}: {wall:.1f} s, {doc['verdict']}", flush=True)
    for i in range(args.repeat):
        wall, qdoc = run_agent(["--quick", "--expected-gpus", str(world)], tmp / f"quick{i}.json")
        quick_walls.append(wall)
        qdocs.append(qdoc)
        print(f"quick run {i}: {wall:.1f} s, {qdoc['verdict']}", flush=True)
    print_phases("full", phases(docs))
    print_phases("quick", phases(qdocs))
    sizes = sorted({size for d in docs for size in sweep(d)} | {1 << 30, 4 << 30})
    raw_by_size = raw_baseline(world, sizes) if world > 1 else {}
    raw = {"busbw_1g": raw_by_size.get(str(1 << 30)), "busbw_4g": raw_by_size.get(str(4 << 30))}
    print(f"raw torch.distributed loop: {raw_by_size}", flush=True)
    figs = [figures(d) for d in docs]
    last = figs[-1]

    def best(key: str) -> float | None:
        vals = [f[key] for f in figs if f[key] is not None]
        return max(vals) if vals else None

    nccl = {}
    for size in ("1g", "4g"):
        agent_bw = best(f"busbw_{size}")
        ref = REFERENCE[f"busbw_{size}"]
        raw_bw = raw.get(f"busbw_{size}")
        nccl[size] = {
            "agent_busbw_gbps": agent_bw and round(agent_bw, 1),
            "raw_torch_loop_busbw_gbps": raw_bw and round(raw_bw, 1),
            "reference_gbps": ref,
            "agent_vs_reference": agent_bw and round(agent_bw / ref, 3),
            "agent_vs_raw_loop": agent_bw and raw_bw and round(agent_bw / raw_bw, 3),
            "agent_vs_nccl_tests_512m": agent_bw and round(agent_bw / REFERENCE[
                "nccl_tests_512m"], 3),
        }
    ratios = [g["managed_prefetch_vs_pinned"] for f in figs for g in f["per_gpu"].values()
              if g["managed_prefetch_vs_pinned"] is not None]
    sweeps = [sweep(d) for d in docs]
    sweep_table = []
    for size in sizes:
        agent_bw = max((sw[size] for sw in sweeps if size in sw), default=None)
        raw_bw = raw_by_size.get(str(size))
        sweep_table.append({"size_bytes": size, "agent_busbw_gbps": agent_bw,
                            "raw_torch_loop_busbw_gbps": raw_bw and round(raw_bw, 2),
                            "agent_vs_raw_loop": agent_bw and raw_bw
                            and round(agent_bw / raw_bw, 3)})
        print(f"  all_reduce {size:>12} B: agent {agent_bw} GB/s, raw loop "
              f"{raw_bw and round(raw_bw, 1)} GB/s", flush=True)
    result = {
        "gpus": world,
        "gpu_name": name,
        "torch": torch.__version__,
        "verify_full_wall_s": {"median": round(statistics.median(full_walls), 2),
                               "runs": [round(w, 2) for w in full_walls], "target": 8},
        "verify_quick_wall_s": {"median": round(statistics.median(quick_walls), 2),
                                "runs": [round(w, 2) for w in quick_walls], "target": 5},
        "agent_reported_wall_s": [d["wall_s"] for d in docs],
        "children_wall_s": docs[-1].get("children_wall_s"),
        "phases_full": phases(docs),
        "phases_quick": phases(qdocs),
        "nccl_allreduce_sweep": sweep_table,
        "verdicts": [d["verdict"] for d in docs],
        "nccl_allreduce": nccl,
        "managed_prefetch_vs_pinned": {
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "all": [round(r, 3) for r in ratios], "reference": REFERENCE["prefetch_vs_pinned"]},
        "per_gpu": last["per_gpu"],
        "pairs": last["pairs"],
        "problems": [f"{r['target']} {r['check']} {r['verdict']}: {r['detail']}"
                     for d in docs for r in d["records"] if r["verdict"] in ("warn", "fail")],
    }
    save("verify_h200", result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verify_h200.json").write_text(json.dumps(result, indent=2))
        (args.out / "bench_full_report.json").write_text(json.dumps(docs[-1], indent=2))


if __name__ == "__main__":
    main()
