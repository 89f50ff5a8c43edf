"""The agent's wall times beside PyTorch's own start, its figures against plain loops in the
same run, and cold starts (issue 38's targets; issue 28's for the figures).

    UMPROV_BENCH_OUT=DIR python3 bench/verify_figures.py [--runs 5] [--quick-runs 5]
        [--floor 5] [--cold 1] [--old OLD.pyz] [--ab 3]          # on the GPU host, root for --cold

1. ``--runs`` consecutive full agent runs (the zipapp, as users run it, with umprov's
   managed-memory allocator on its path so managed.oversubscription runs), after a warm-up
   run. Per run: wall, verdict, the warnings and failures, the bf16 GEMM rate and HBM copy of
   every GPU, the oversubscription check's step and phases.
2. The figures' baseline, in the same run, before and after those runs: plain loops, no agent
   code, one process per GPU in turn: 8192^3 bf16 products and device copies of the agent's
   size, each a 1-second window after a warm-up; the better of the two counts. Targets: every
   figure >= 0.97x its plain loop, max/min over the runs <= 1.03.
3. ``--quick-runs`` quick runs. Targets (one GPU, warm): quick <= 2.5 s, full <= 5 s.
4. The floor, ``--floor`` samples of each: ``import torch``, a first CUDA tensor and a
   synchronize, in a plain environment and in the agent's children's (its private bytecode
   cache: a machine that ships torch without bytecode imports it from source otherwise), timed
   to the line it prints when ready and to its exit (interpreter and CUDA teardown), and once
   more ending with ``os._exit(0)`` as the agent's children do.
5. ``--cold`` (root only): the page cache dropped (``echo 3 > /proc/sys/vm/drop_caches``)
   before a full run, then a warm one, and the floor likewise; where the cache cannot be
   dropped the result says so. Target: cold <= 1.5x warm.
6. ``--old PYZ``: another build of the agent (the previous one, built beforehand), ``--ab``
   rounds of full and quick runs interleaved with this one, the order swapped every round.

Every run's phases (the reports' ``timings``, median start and end over the runs) say where
the time goes. Results: verify_figures.json in UMPROV_BENCH_OUT (default bench/results/); the
card's name is in it (``card``), and each figure is that card's.
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

from _common import RESULTS, save  # noqa: E402

from umprov.verify.agent.runner import child_env  # noqa: E402
from umprov.verify.bundle import agent_zipapp  # noqa: E402

MANAGED = HERE.parent / "docker" / "pytorch-cuda" / "managed"
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
TARGETS = {"quick_s": 2.5, "full_s": 5.0, "cold_ratio": 1.5, "figure_ratio_min": 0.97,
           "figure_max_over_min": 1.03}

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
print(json.dumps({"bf16_tflops": gemm, "hbm_copy_gbps": hbm,
                  "card": torch.cuda.get_device_name(dev)}))
"""

FLOOR = ("import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
         "print('ready', flush=True)")
FLOOR_OS_EXIT = FLOOR + "; import os; os._exit(0)"


def run_agent(agent: Path, env: dict, *args: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, str(agent), "--quiet", "--json", str(out), *args],
                       check=False, env=env)
        wall = time.perf_counter() - started
        return wall, (json.loads(out.read_text()) if out.is_file() else {})


def per_gpu(doc: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in doc.get("records", []):
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
        if m:  # each phase of that child: its import, warm-up step, gate, timed steps
            g = out.setdefault(f"gpu{m.group(1)}", {})
            g.setdefault("oversub_phases", []).append(
                {"name": t["name"], "start_s": t["start_s"], "seconds": t["seconds"]})
    return out


def problems(doc: dict) -> list[str]:
    return [f"{r['target']} {r['check']} {r['verdict']}: {r['measured']} {r['detail'][:160]}"
            for r in doc.get("records", []) if r["verdict"] in ("warn", "fail")]


def card_of(doc: dict) -> str | None:
    devices = ((doc.get("facts") or {}).get("discover") or {}).get("devices") or []
    return devices[0]["name"] if devices else None


def phases(docs: list[dict], top: int = 40) -> list[dict]:
    """The longest (child, phase) pairs of the runs' timings: median start, end and length,
    in start order: where the wall time goes."""
    seen: dict[tuple[str, str], list[dict]] = {}
    for doc in docs:
        for t in doc.get("timings", []):
            seen.setdefault((t["child"], t["name"]), []).append(t)
    rows = [{"child": child, "phase": name,
             "start_s": round(statistics.median(t["start_s"] for t in ts), 2),
             "end_s": round(statistics.median(t["start_s"] + t["seconds"] for t in ts), 2),
             "seconds": round(statistics.median(t["seconds"] for t in ts), 2),
             "runs": len(ts)} for (child, name), ts in seen.items()]
    longest = sorted(rows, key=lambda p: -p["seconds"])[:top]
    return sorted(longest, key=lambda p: (p["start_s"], p["child"]))


def plain(gpus: dict[str, dict], env: dict) -> dict[str, dict]:
    out = {}
    for name, g in gpus.items():
        dev = name[len("gpu"):]
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


def floor_once(code: str, env: dict) -> dict:
    """Seconds to the floor's 'ready' line and to its exit."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    ready = time.perf_counter() - started
    rc = proc.wait()
    ended = time.perf_counter() - started
    return {"ready_s": round(ready, 3), "exit_s": round(ended, 3),
            "ok": rc == 0 and line.strip() == "ready"}


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "all": [round(v, 2) for v in values]} if values else {}


def floor(samples: int, plain_env: dict, agent_env: dict) -> dict:
    """The floor in both environments, each sample ready/exit, and once with os._exit."""
    out: dict = {}
    for env_name, env in (("plain_env", plain_env), ("agent_env", agent_env)):
        floor_once(FLOOR, env)  # warm: page cache, and the agent's bytecode cache
        normal = [floor_once(FLOOR, env) for _ in range(samples)]
        fast = [floor_once(FLOOR_OS_EXIT, env) for _ in range(samples)]
        out[env_name] = {"ready_s": spread([s["ready_s"] for s in normal]),
                         "exit_s": spread([s["exit_s"] for s in normal]),
                         "os_exit_s": spread([s["exit_s"] for s in fast]),
                         "all_ok": all(s["ok"] for s in normal + fast)}
    return out


def cold(samples: int, agent: Path, env: dict, agent_env: dict) -> dict:
    if not samples:
        return {}
    if not drop_caches():
        return {"skipped": "cannot drop the page cache (/proc/sys/vm/drop_caches is not "
                "writable here: not root, or a container)"}
    out: dict = {k: [] for k in ("agent_cold_s", "agent_warm_s", "floor_cold_s",
                                 "floor_warm_s", "floor_agent_env_cold_s",
                                 "floor_agent_env_warm_s")}
    for _ in range(samples):
        drop_caches()
        out["floor_cold_s"].append(floor_once(FLOOR, env)["exit_s"])
        out["floor_warm_s"].append(floor_once(FLOOR, env)["exit_s"])
        drop_caches()
        out["floor_agent_env_cold_s"].append(floor_once(FLOOR, agent_env)["exit_s"])
        out["floor_agent_env_warm_s"].append(floor_once(FLOOR, agent_env)["exit_s"])
        drop_caches()
        out["agent_cold_s"].append(round(run_agent(agent, env)[0], 2))
        out["agent_warm_s"].append(round(run_agent(agent, env)[0], 2))
    for what in ("agent", "floor", "floor_agent_env"):
        out[f"{what}_ratio"] = round(statistics.median(out[f"{what}_cold_s"])
                                     / statistics.median(out[f"{what}_warm_s"]), 2)
    out["note"] = ("page cache dropped, not the agent's bytecode cache (~/.cache/umprov-agent), "
                   "which a first run on a fresh machine also writes")
    return out


def ab(old: Path, new: Path, env: dict, rounds: int) -> dict:
    """Full and quick runs of both builds, interleaved, the order swapped every round; each
    build's phases beside its walls, so a change's effect shows where it acts."""
    keys = [f"{b}_{m}" for b in ("old", "new") for m in ("full", "quick")]
    walls: dict[str, list[float]] = {k: [] for k in keys}
    docs: dict[str, list[dict]] = {k: [] for k in keys}
    for i in range(rounds):
        order = [("old", old), ("new", new)][:: 1 if i % 2 == 0 else -1]
        for mode, args in (("full", ()), ("quick", ("--quick",))):
            for build, pyz in order:
                wall, doc = run_agent(pyz, env, *args)
                walls[f"{build}_{mode}"].append(wall)
                docs[f"{build}_{mode}"].append(doc)
    out: dict = {k: spread(v) for k, v in walls.items()}
    for mode in ("full", "quick"):
        out[f"new_over_old_{mode}"] = round(statistics.median(walls[f"new_{mode}"])
                                            / statistics.median(walls[f"old_{mode}"]), 3)
    out["phases"] = {k: phases(v, top=25) for k, v in docs.items()}
    return out


def figure_summary(runs: list[dict], baseline: dict) -> dict:
    out = {}
    for g, base in baseline.items():
        for key in ("bf16_tflops", "hbm_copy_gbps"):
            got = [r["gpus"][g].get(key) for r in runs if r["gpus"].get(g, {}).get(key)]
            if not got or not base.get(key):
                continue
            value = base[key]
            out[f"{g}.{key}"] = {
                "plain": round(value, 1), "agent": [round(x, 1) for x in got],
                "ratio_min": round(min(got) / value, 3), "ratio_max": round(max(got) / value, 3),
                "max_over_min": round(max(got) / min(got), 3)}
    return out


def managed_env(env: dict) -> dict:
    """umprov's managed-memory allocator on the agent's path (gcc builds it), else unchanged:
    managed.oversubscription then skips, saying so."""
    if not shutil.which("gcc"):
        return env
    lib = Path(tempfile.mkdtemp(prefix="umprov-managed-")) / "libumprov_managed.so"
    subprocess.run(["sh", str(MANAGED / "build.sh"), str(lib)], check=True)
    return {**env, "UMPROV_MANAGED_LIBRARY": str(lib),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(MANAGED), env.get("PYTHONPATH")]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick-runs", type=int, default=5)
    ap.add_argument("--floor", type=int, default=5, help="samples of the floor, each kind")
    ap.add_argument("--cold", type=int, default=1)
    ap.add_argument("--old", type=Path, help="another agent build (.pyz) to interleave with")
    ap.add_argument("--ab", type=int, default=3, help="rounds with --old")
    args = ap.parse_args()
    started = time.monotonic()
    agent = agent_zipapp()
    plain_env = {**os.environ, **NVLS_OFF}
    env = managed_env(plain_env)
    agent_env = child_env()  # what the agent's children get: its bytecode cache among it

    partial: dict = {}

    def say(text: str, **found: object) -> None:
        """Progress on stderr, and what is known so far in verify_figures.partial.json (a
        run stopped at its time limit still leaves it)."""
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)
        partial.update(found)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "verify_figures.partial.json").write_text(json.dumps(partial, indent=1))

    run_agent(agent, env)  # warm-up: page cache, bytecode cache
    _, first = run_agent(agent, env)
    gpus = per_gpu(first)
    before = plain(gpus, env)
    say(f"plain loops before: {before}", before=before, first_timings=first.get("timings"))
    runs, docs = [], []
    for _ in range(args.runs):
        wall, doc = run_agent(agent, env)
        docs.append(doc)
        runs.append({"wall_s": round(wall, 2), "agent_wall_s": doc.get("wall_s"),
                     "verdict": doc.get("verdict"), "problems": problems(doc),
                     "gpus": per_gpu(doc)})
        say(f"full: {wall:.2f} s, {doc.get('verdict')}", runs=runs)
    after = plain(gpus, env)
    baseline = {g: {k: max(before[g][k], after[g][k]) for k in ("bf16_tflops", "hbm_copy_gbps")}
                for g in before}
    quick, qdocs = [], []
    for _ in range(args.quick_runs):
        wall, doc = run_agent(agent, env, "--quick")
        quick.append({"wall_s": round(wall, 2), "agent_wall_s": doc.get("wall_s"),
                      "verdict": doc.get("verdict"), "problems": problems(doc)})
        qdocs.append(doc)
        say(f"quick: {wall:.2f} s, {doc.get('verdict')}", quick_runs=quick)
    floors = floor(args.floor, plain_env, agent_env) if args.floor else {}
    say(f"floor: {json.dumps(floors)}", floor=floors, after=after)
    ab_result = ab(args.old, agent, env, args.ab) if args.old else {}
    say(f"ab: {json.dumps(ab_result)}", ab=ab_result)
    cold_result = cold(args.cold, agent, env, agent_env)
    say(f"cold: {json.dumps(cold_result)}", cold=cold_result)
    full_walls = [r["wall_s"] for r in runs]
    quick_walls = [q["wall_s"] for q in quick]
    figures = figure_summary(runs, baseline)
    summary = {
        "card": card_of(first) or before.get("gpu0", {}).get("card"),
        "gpus": len(gpus),
        "full_wall_s": spread(full_walls), "quick_wall_s": spread(quick_walls),
        "verdicts": sorted({r["verdict"] or "none" for r in [*runs, *quick]}),
        "floor": floors, "figures": figures, "cold": cold_result, "ab": ab_result,
        "targets": TARGETS,
        "met": {
            "quick": bool(quick_walls) and statistics.median(quick_walls) <= TARGETS["quick_s"],
            "full": statistics.median(full_walls) <= TARGETS["full_s"],
            "cold": cold_result["agent_ratio"] <= TARGETS["cold_ratio"]
            if "agent_ratio" in cold_result else None,
            "figures": all(f["ratio_min"] >= TARGETS["figure_ratio_min"]
                           and f["max_over_min"] <= TARGETS["figure_max_over_min"]
                           for f in figures.values()) if figures else None},
        "bench_s": round(time.monotonic() - started, 1)}
    save("verify_figures", {"summary": summary, "baseline": {"before": before, "after": after},
                            "runs": runs, "quick_runs": quick,
                            "full_phases": phases(docs), "quick_phases": phases(qdocs)})
    print(json.dumps(summary, indent=1))  # the end of the output: the part read first


if __name__ == "__main__":
    main()
