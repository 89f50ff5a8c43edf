"""The agent on a real GPU host (run on the H200 machine: `pytest -m gpu tests/gpu`).

Each test runs the agent the way users do, its zipapp as a separate process, and reads its
JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from umprov.verify import report
from umprov.verify.agent.schema import EXIT_FAIL, EXIT_PASS

HUNG_GEMM = Path(__file__).resolve().parent / "hung_gemm"  # its sitecustomize hangs gpu0's GEMM
OUT = Path(os.environ.get("UMPROV_GPU_TEST_OUT", "")) if os.environ.get("UMPROV_GPU_TEST_OUT") else None

pytestmark = pytest.mark.gpu


def run_agent(agent: Path, tmp_path: Path, *args: str, env: dict | None = None,
              name: str = "report", timeout: float = 300) -> tuple[int, dict, float]:
    out = tmp_path / f"{name}.json"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(agent), "--json", str(out), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    wall = time.monotonic() - started
    assert out.is_file(), proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert report.validate(doc) == [], report.validate(doc)
    if OUT is not None:  # keep the reports of the device run
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.json").write_text(out.read_text())
    return proc.returncode, doc, wall


def problems(doc: dict) -> list[str]:
    return [f"{r['target']} {r['check']} {r['verdict']}: {r['measured']} {r['detail']}"
            for r in doc["records"] if r["verdict"] in ("warn", "fail")]


def by_check(doc: dict, check: str) -> list[dict]:
    return [r for r in doc["records"] if r["check"] == check]


def test_every_check_passes_on_a_healthy_host(agent, tmp_path, gpu_count):
    rc, doc, _wall = run_agent(agent, tmp_path, "--expected-gpus", str(gpu_count), name="full")
    assert doc["verdict"] == "pass", problems(doc)
    assert rc == EXIT_PASS
    checks = {r["check"] for r in doc["records"]}
    for needed in ("host.gpu_count", "gpu.smoke_kernel", "gpu.gemm_fp32_exact",
                   "gpu.gemm_bf16_checked", "gpu.hbm_copy", "pcie.h2d_pinned",
                   "managed.roundtrip_exact", "managed.prefetch", "managed.read_mostly",
                   "managed.preferred_host_accessed_by", "managed.concurrent_access",
                   "alloc.cuda_malloc_async", "nccl.all_reduce_f32", "nccl.all_reduce_bf16",
                   "nccl.all_gather", "nccl.reduce_scatter", "nccl.broadcast", "ddp.step"):
        assert needed in checks, needed
    # every GPU got its own per-GPU records, every pair its send/recv record
    for i in range(gpu_count):
        assert any(r["target"] == f"gpu{i}" and r["check"] == "managed.prefetch"
                   for r in doc["records"])
    pairs = by_check(doc, "nccl.send_recv")
    assert len(pairs) == gpu_count * (gpu_count - 1) // 2
    if gpu_count > 1:
        assert by_check(doc, "nccl.busbw_1g")[0]["measured"] > 0
        sweep = by_check(doc, "nccl.allreduce_sweep")
        assert [r["size_bytes"] for r in sweep][:3] == [8 << 10, 64 << 10, 1 << 20]
        assert all(r["unit"] == "GB/s" and r["measured"] > 0 for r in sweep
                   if r["verdict"] == "pass")
    # the fleet-depth checks ran: other processes, the kernel log, NVLink
    assert len(by_check(doc, "gpu.processes")) == gpu_count
    assert "host.xid" in checks or any(c.startswith("xid.") for c in checks)
    assert by_check(doc, "nvlink.links")
    # where the time went: every child, and the parent's own phases
    children = {t["child"] for t in doc["timings"]}
    assert {"agent", "monitor", "discover", "gpu0", "nccl0", "oversub0"} <= children, children
    # no umprov_managed on this Python's path: the oversubscription check says so
    for rec in by_check(doc, "managed.oversubscription"):
        assert rec["verdict"] == "skip" and "umprov_managed" in rec["detail"], rec
    assert len(by_check(doc, "managed.oversubscription")) == gpu_count
    assert doc["samples"] and {s["gpu"] for s in doc["samples"]} == set(range(gpu_count))


def test_collectives_follow_the_per_gpu_checks_and_the_buffers_say_their_sizes(agent, tmp_path,
                                                                              gpu_count):
    """Full mode (issue 38): the ranks' first collective starts only once every per-GPU and
    oversubscription child has finished its checks; pinned copies and managed memory use
    256 MiB on an idle GPU of 80 GB or more."""
    _rc, doc, _ = run_agent(agent, tmp_path, name="order")
    t = doc["timings"]

    def ends(prefix: str) -> list[float]:  # a child's checks, not its exit (the gate's rule)
        return [max(x["start_s"] + x["seconds"] for x in t if x["child"] == c
                    and x["name"] != "exit")
                for c in {x["child"] for x in t} if c.startswith(prefix)]

    # Warm, the exact collectives can take under the timings' 5 ms floor (the H100 of
    # 2026-12-07): the gate's opening is the end of the ranks' wait for it, and what they ran
    # after it starts no sooner.
    nccl = [x for x in t if x["child"].startswith("nccl")]
    after_gate = ("nccl.all_", "nccl.reduce_scatter", "nccl.broadcast", "ddp.step")
    first = min(x["start_s"] for x in nccl if x["name"].startswith(after_gate)
                or x["name"] == "exit")
    waits = [x["start_s"] + x["seconds"] for x in nccl if x["name"] == "wait: nccl.gate"]
    opened = min(waits) if waits else first  # no wait: the ranks came after it opened
    assert opened >= max(ends("gpu") + ends("oversub")) - 0.01, t
    assert first >= opened - 0.01, t
    assert {"agent.wait_per_gpu_checks", "agent.wait_per_gpu_exit"} <= {x["name"] for x in t}
    for i in range(gpu_count):
        (h2d,) = [r for r in by_check(doc, "pcie.h2d_pinned") if r["target"] == f"gpu{i}"]
        (rt,) = [r for r in by_check(doc, "managed.roundtrip_exact") if r["target"] == f"gpu{i}"]
        assert h2d["detail"].startswith("256 MiB") and "256 MiB" in rt["detail"], (h2d, rt)


def test_expected_gpu_count_above_the_real_one_fails(agent, tmp_path, gpu_count):
    rc, doc, _ = run_agent(agent, tmp_path, "--quick", "--expected-gpus", str(gpu_count + 1),
                           name="count")
    assert rc == EXIT_FAIL
    (rec,) = by_check(doc, "host.gpu_count")
    assert rec["verdict"] == "fail"
    assert rec["measured"] == gpu_count and rec["limit"] == gpu_count + 1
    assert rec["hint"] == "reboot"
    # and nothing else failed: the count is the one reason
    assert [r["check"] for r in doc["records"] if r["verdict"] == "fail"] == ["host.gpu_count"]


def test_a_profile_limit_above_the_measured_value_fails(agent, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"profile": "h200-sxm", "profiles": {"h200-sxm": {
        "expect": {"hbm_copy_gbps": 1_000_000}}}}))
    rc, doc, _ = run_agent(agent, tmp_path, "--profile-file", str(prof), name="limit")
    assert rc == EXIT_FAIL
    fails = [r for r in doc["records"] if r["verdict"] == "fail"]
    assert fails and {r["check"] for r in fails} == {"gpu.hbm_copy"}, problems(doc)
    for r in fails:
        assert r["expected"] == 1_000_000 and r["limit"] == pytest.approx(850_000)
        assert r["measured"] < r["limit"]


def test_a_hung_child_is_killed_at_its_timeout(agent, tmp_path):
    started = time.monotonic()
    path = os.pathsep.join(p for p in (str(HUNG_GEMM), os.environ.get("PYTHONPATH")) if p)
    rc, doc, wall = run_agent(agent, tmp_path, "--quick", "--timeout", "20",
                              env={"PYTHONPATH": path}, name="hang")
    assert rc == EXIT_FAIL
    timeouts = [r for r in doc["records"] if r["reason"] == "timeout"]
    assert len(timeouts) == 1, timeouts
    (rec,) = timeouts
    assert rec["target"] == "gpu0" and rec["check"] == "gpu.gemm_bf16_rate"
    assert rec["verdict"] == "fail" and "timeout" in rec["detail"]
    # the checks gpu0 finished before the hang are still there; the other GPUs are unaffected
    assert any(r["target"] == "gpu0" and r["check"] == "gpu.gemm_fp32_exact"
               and r["verdict"] == "pass" for r in doc["records"])
    assert wall < 20 + 25, wall
    assert time.monotonic() - started < 60


def test_one_gpu_still_initialises_nccl(agent, tmp_path):
    rc, doc, _ = run_agent(agent, tmp_path, "--quick", env={"CUDA_VISIBLE_DEVICES": "0"},
                           name="one")
    (init,) = by_check(doc, "nccl.init")
    assert init["verdict"] == "pass" and "one rank" in init["detail"]
    (bw,) = by_check(doc, "nccl.busbw_1g")
    assert bw["verdict"] == "skip" and "one rank" in bw["detail"]
    assert by_check(doc, "nccl.send_recv") == []
    assert rc == EXIT_PASS, problems(doc)


def test_cli_local_quick(umprov_cli, tmp_path):
    junit, prom = tmp_path / "v.xml", tmp_path / "prom"
    result = umprov_cli("verify", "--local", "--quick", "--python", sys.executable, "--json",
                        "--junit", str(junit), "--prometheus", str(prom))
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, result.stderr[-3000:]
    assert doc["verdict"] == "pass" and doc["hosts"][0]["mode"] == "quick"
    assert 'failures="0"' in junit.read_text()
    assert "umprov_verify_host_verdict" in (prom / "umprov_verify.prom").read_text()


EARLY_CONTEXT = """
import ctypes, json, sys, time
sys.path.insert(0, sys.argv[1])
from umprov.verify.agent.early_context import start_early_context
cuda = ctypes.CDLL("libcuda.so.1")
def active():
    flags, on = ctypes.c_uint(), ctypes.c_int()
    cuda.cuInit(0)
    cuda.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(on))
    return on.value
before = active()
early = start_early_context(0, None)
import torch  # beside the thread, as in the agent's children
early.join(30)
made = active()
t = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print(json.dumps({"before": before, "made": made, "torch_s": time.perf_counter() - t,
                  "sum": float(torch.ones(4, device="cuda").sum())}))
"""


def test_the_early_context_is_the_one_torch_then_uses(tmp_path):
    """A child retains its GPU's primary context through the driver while torch imports
    (import torch alone makes none); torch's runtime then starts on that context and works."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", EARLY_CONTEXT, str(repo)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["before"] == 0 and facts["made"] == 1 and facts["sum"] == 4.0, facts
