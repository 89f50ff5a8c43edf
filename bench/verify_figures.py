"""The agent's figures against plain loops in the same run, its wall times, and cold starts.

    python3 bench/verify_figures.py [--runs 5] [--quick-runs 3] [--cold 2]   # on the GPU host

1. ``--runs`` consecutive full agent runs (the zipapp, as users run it, with umprov's
   managed-memory allocator on its path so managed.oversubscription runs), after one warm-up.
   Per run: the bf16 GEMM rate and the HBM copy of every GPU, the oversubscription check's
   figures and the seconds its child spent.
2. The baseline, in the same run, before and after the agent runs: plain loops, no agent code,
   one process per GPU in turn: 8192^3 bf16 products and device copies of the agent's size,
   each a 1-second window after a warm-up; the better of the two measurements counts.
   Targets (issue 28): each agent figure >= 0.97x its plain loop; max/min over the runs <= 1.03.
3. ``--quick-runs`` quick runs (wall time).
4. ``--cold`` cold starts (root only): the page cache dropped before a full run, then a warm
   run; the floor beside it: a bare ``import torch`` and a first CUDA tensor, cold and warm.

Results: bench/results/verify_figures.json (UMPROV_BENCH_OUT moves them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import save  # noqa: E402

from umprov.verify.bundle import agent_zipapp  # noqa: E402

MANAGED = HERE.parent / "docker" / "pytorch-cuda" / "managed"
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}

PLAIN = r"""
import json, sys, time, torch
dev, copy_mib = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(dev)

def window(fn, seconds=1.0):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / n

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(a)
gemm = 2 * 8192**3 / window(lambda: torch.mm(a, b, out=out)) / 1e12
del a, b, out
src = torch.empty(copy_mib << 20, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
hbm = 2 * src.numel() / window(lambda: dst.copy_(src)) / 1e9
print(json.dumps({"bf16_tflops": gemm, "hbm_copy_gbps": hbm}))
"""

COLD_FLOOR = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"


def run_agent(agent: Path, env: dict, *args: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, str(agent), "--quiet", "--json", str(out), *args],
                       check=False, env=env)
        return time.perf_counter() - started, json.loads(out.read_text())


def per_gpu(doc: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in doc["records"]:
        if r["scope"] != "gpu":
            continue
        g = out.setdefault(r["target"], {})
        if r["check"] == "gpu.gemm_bf16_rate":
            g["bf16_tflops"] = r["measured"]
        elif r["check"] == "gpu.hbm_copy":
            g["hbm_copy_gbps"] = r["measured"]
            g["copy_mib"] = int(re.match(r"(\d+) MiB", r["detail"]).group(1))
        elif r["check"] == "managed.oversubscription":
            g["oversub"] = {k: r.get(k) for k in ("verdict", "measured", "unit", "detail")}
    for t in doc.get("timings", []):
        m = re.fullmatch(r"oversub(\d+)", t["child"])
        if m and t["name"] == "managed.oversubscription":
            g = out.setdefault(f"gpu{m.group(1)}", {})
            g["oversub_child_s"] = round(g.get("oversub_child_s", 0) + t["seconds"], 3)
    return out


def plain(gpus: dict[str, dict], env: dict) -> dict[str, dict]:
    out = {}
    for name, g in gpus.items():
        dev = name.removeprefix("gpu")
        proc = subprocess.run([sys.executable, "-c", PLAIN, dev, str(g.get("copy_mib", 2048))],
                              capture_output=True, text=True, env=env, check=True)
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(argv: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick-runs", type=int, default=3)
    ap.add_argument("--cold", type=int, default=2)
    args = ap.parse_args()
    agent = agent_zipapp()
    lib_dir = Path(tempfile.mkdtemp(prefix="umprov-managed-"))
    env = {**os.environ, **NVLS_OFF}
    if shutil.which("gcc"):
        lib = lib_dir / "libumprov_managed.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib),
                        str(MANAGED / "umprov_managed.c"), "-lpthread"], check=True)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MANAGED),
                                                          env.get("PYTHONPATH")]))
        env["UMPROV_MANAGED_LIBRARY"] = str(lib)
    run_agent(agent, env)  # warm-up: page cache, bytecode cache
    _, first = run_agent(agent, env)
    gpus = per_gpu(first)
    before = plain(gpus, env)
    runs = []
    for _ in range(args.runs):
        wall, doc = run_agent(agent, env)
        runs.append({"wall_s": round(wall, 2), "agent_wall_s": doc["wall_s"],
                     "verdict": doc["verdict"], "gpus": per_gpu(doc)})
    after = plain(gpus, env)
    baseline = {g: {k: max(before[g][k], after[g][k]) for k in before[g]} for g in before}
    summary: dict = {"full_wall_s": [r["wall_s"] for r in runs]}
    for g, base in baseline.items():
        for key, value in base.items():
            got = [r["gpus"][g].get(key) for r in runs if r["gpus"].get(g, {}).get(key)]
            if not got:
                continue
            summary[f"{g}.{key}"] = {
                "plain": round(value, 1), "agent": [round(x, 1) for x in got],
                "ratio_min": round(min(got) / value, 3), "ratio_max": round(max(got) / value, 3),
                "max_over_min": round(max(got) / min(got), 3)}
    quick = [round(run_agent(agent, env, "--quick")[0], 2) for _ in range(args.quick_runs)]
    summary["quick_wall_s"] = quick
    cold: dict = {}
    if args.cold and drop_caches():
        floor_argv = [sys.executable, "-c", COLD_FLOOR]
        cold["agent_cold_s"], cold["agent_warm_s"] = [], []
        cold["floor_cold_s"], cold["floor_warm_s"] = [], []
        for _ in range(args.cold):
            drop_caches()
            cold["floor_cold_s"].append(round(timed(floor_argv, env), 2))
            cold["floor_warm_s"].append(round(timed(floor_argv, env), 2))
            drop_caches()
            cold["agent_cold_s"].append(round(run_agent(agent, env)[0], 2))
            cold["agent_warm_s"].append(round(run_agent(agent, env)[0], 2))
        cold["agent_ratio"] = round(statistics.median(cold["agent_cold_s"])
                                    / statistics.median(cold["agent_warm_s"]), 2)
        cold["floor_ratio"] = round(statistics.median(cold["floor_cold_s"])
                                    / statistics.median(cold["floor_warm_s"]), 2)
    elif args.cold:
        cold["skipped"] = "cannot drop the page cache (not root?)"
    summary["cold"] = cold
    save("verify_figures", {"summary": summary, "baseline": {"before": before, "after": after},
                            "runs": runs, "first_report_timings": first.get("timings")})


if __name__ == "__main__":
    main()
