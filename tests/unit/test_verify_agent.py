"""The agent on a machine without a GPU: honest failures, child processes and their deadlines.

The agent runs as users run it: its zipapp, in a separate process. Stand-in torch packages
under verify_fakes/ play a CPU-only build, a CUDA build without a driver, a broken install and
one whose import hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fakebin
from tests.unit.ranks import start_ranks
from umprov.verify import report
from umprov.verify.agent.pairs import pair_records
from umprov.verify.agent.precheck import guess_gpu_count, no_gpu_reasons
from umprov.verify.agent.profiles import BUILTIN_PROFILES
from umprov.verify.agent.runner import MULTICAST_OFF, child_env
from umprov.verify.agent.schema import EXIT_FAIL, EXIT_USAGE
from umprov.verify.bundle import agent_zipapp

FAKES = Path(__file__).resolve().parent / "verify_fakes"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_zipapp(cache=tmp_path_factory.mktemp("agent"))


def run_agent(agent: Path, tmp_path: Path, *args: str, fake: str | None = None,
              python: str = sys.executable) -> tuple[int, dict, str]:
    out = tmp_path / "report.json"
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if fake:
        full_env["PYTHONPATH"] = str(FAKES / fake)
    proc = subprocess.run([python, str(agent), "--json", str(out), *args], capture_output=True,
                          text=True, timeout=120, env=full_env)
    doc = json.loads(out.read_text()) if out.is_file() else {}
    return proc.returncode, doc, proc.stderr


def gpu_visible(doc: dict) -> dict:
    (rec,) = [r for r in doc["records"] if r["check"] == "host.gpu_visible"]
    return rec


def test_no_torch_is_an_honest_failure(agent, tmp_path):
    if sys.modules.get("torch") or __import__("importlib.util").util.find_spec("torch"):
        pytest.skip("this Python has torch; the no-torch case needs one without")
    rc, doc, err = run_agent(agent, tmp_path, "--expected-gpus", "8")
    assert rc == EXIT_FAIL
    assert report.validate(doc) == []
    rec = gpu_visible(doc)
    assert rec["verdict"] == "fail" and rec["measured"] == 0
    assert rec["detail"].startswith("no NVIDIA GPU visible: ")
    assert "cannot import torch" in rec["detail"]
    count = [r for r in doc["records"] if r["check"] == "host.gpu_count"]
    assert count[0]["verdict"] == "fail" and count[0]["limit"] == 8
    assert "FAIL" in err and "no NVIDIA GPU visible" in err


def test_a_cpu_only_torch_is_named(agent, tmp_path):
    rc, doc, _ = run_agent(agent, tmp_path, fake="cpu_torch")
    assert rc == EXIT_FAIL and doc["verdict"] == "fail"
    detail = gpu_visible(doc)["detail"]
    assert "torch 2.99.0+cpu is a CPU-only build" in detail
    assert doc["records"] == [gpu_visible(doc)]  # nothing pretends to have passed


def test_the_cuda_error_text_is_reported(agent, tmp_path):
    rc, doc, _ = run_agent(agent, tmp_path, "--quick", fake="nodriver_torch")
    assert rc == EXIT_FAIL
    detail = gpu_visible(doc)["detail"]
    assert "CUDA error: Found no NVIDIA driver on your system" in detail
    assert doc["mode"] == "quick"


def test_the_report_says_where_the_time_went(agent, tmp_path):
    rc, doc, _ = run_agent(agent, tmp_path, "--duration", "90s", "--exclusive",
                           fake="cpu_torch")
    assert rc == EXIT_FAIL and report.validate(doc) == []
    assert doc["facts"]["options"] == {"quick": False, "timeout_s": 120.0, "duration_s": 90.0,
                                       "exclusive": True}
    timings = doc["timings"]
    assert {t["child"] for t in timings} >= {"agent", "discover", "monitor"}
    for t in timings:
        assert set(t) == {"name", "start_s", "seconds", "gpu", "child"}
        assert t["start_s"] >= 0 and t["seconds"] > 0
    assert [t["start_s"] for t in timings] == sorted(t["start_s"] for t in timings)
    assert doc["samples"] == []  # no GPU, nothing sampled


def test_a_gpu_that_fell_off_the_bus_explains_why_none_is_visible(agent, tmp_path):
    bindir = tmp_path / "bin"
    fakebin.journal(bindir, [{
        "__CURSOR": "c", "_SOURCE_MONOTONIC_TIMESTAMP": "5112309562",
        "MESSAGE": "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus."}])
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, str(agent), "--json", str(out), "--quiet"], timeout=120,
                   env={**env, "PYTHONPATH": str(FAKES / "cpu_torch"),
                        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, check=False)
    doc = json.loads(out.read_text())
    fell = [r for r in doc["records"] if r["check"] == "xid.79"]
    assert len(fell) == 1 and fell[0]["verdict"] == "fail" and fell[0]["hint"] == "reboot"
    assert fell[0]["target"] == "host" and "PCI 0000:18:00" in fell[0]["detail"]
    assert gpu_visible(doc)["verdict"] == "fail"


def test_bad_durations_are_usage_errors(agent, tmp_path):
    rc, doc, err = run_agent(agent, tmp_path, "--duration", "10x")
    assert rc == EXIT_USAGE and doc == {} and "--duration: duration '10x'" in err


def test_a_crashing_child_is_a_failure_with_its_last_words(agent, tmp_path):
    rc, doc, _ = run_agent(agent, tmp_path, fake="broken_torch")
    assert rc == EXIT_FAIL
    (rec,) = [r for r in doc["records"] if r["verdict"] == "fail"]
    assert rec["check"] == "host.discover" and rec["reason"] == "crash"
    assert "libtorch_cuda.so" in rec["detail"]


def test_a_hung_child_is_killed_at_its_deadline(agent, tmp_path):
    started = time.monotonic()
    rc, doc, _ = run_agent(agent, tmp_path, "--timeout", "3", fake="hung_torch")
    elapsed = time.monotonic() - started
    assert rc == EXIT_FAIL
    (rec,) = doc["records"]
    assert rec["reason"] == "timeout" and rec["check"] == "host.discover"
    assert rec["verdict"] == "fail" and rec["hint"] == "reset"
    assert "timeout" in rec["detail"] and "killed" in rec["detail"]
    assert 3 <= elapsed < 20


def test_a_bad_profile_file_is_a_usage_error(agent, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"profiles": {"h200-sxm": {"expect": {"nope": 1}}}}))
    rc, doc, err = run_agent(agent, tmp_path, "--profile-file", str(bad))
    assert rc == EXIT_USAGE and doc == {}
    assert "unknown expect key 'nope'" in err


def test_json_to_stdout_and_list_profiles(agent):
    proc = subprocess.run([sys.executable, str(agent), "--json", "-", "--quiet"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(FAKES / "cpu_torch")})
    assert json.loads(proc.stdout)["schema_version"] == 1 and proc.stderr == ""
    listed = subprocess.run([sys.executable, str(agent), "--list-profiles"], capture_output=True,
                            text=True, timeout=60)
    assert json.loads(listed.stdout) == BUILTIN_PROFILES


def test_the_agent_copied_alone_still_runs(agent, tmp_path):
    lone = tmp_path / "elsewhere" / "agent.pyz"
    lone.parent.mkdir()
    lone.write_bytes(agent.read_bytes())
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(lone), "--json", str(out), "--quiet"], timeout=60,
                   env={"PATH": os.environ["PATH"], "PYTHONPATH": str(FAKES / "cpu_torch")},
                   cwd=tmp_path, check=False)
    assert report.validate(json.loads(out.read_text())) == []


def test_children_keep_nvlink_multicast_off(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    env = child_env({"EXTRA": "1"}, threads=4)
    for key, value in MULTICAST_OFF.items():
        assert env[key] == value
    assert env["OMP_NUM_THREADS"] == "4" and env["EXTRA"] == "1"


@pytest.mark.parametrize(
    ("nodes", "cvd", "guess"),
    [(8, None, 8), (8, "0,1", 2), (2, "0,1,2,3", 2), (0, None, None), (8, "", None),
     (8, "MIG-abc", None)],
)
def test_gpu_count_guess(monkeypatch, nodes, cvd, guess):
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    pre = {"device_nodes": [f"/dev/nvidia{i}" for i in range(nodes)]}
    assert guess_gpu_count(pre) == guess


def test_no_gpu_reasons_name_each_missing_piece():
    pre = {"torch_importable": True, "kernel_module": "NVRM version: 580.1", "libcuda": None,
           "device_nodes": [], "nvidia_uvm": False, "cuda_visible_devices": "-1"}
    reasons = " | ".join(no_gpu_reasons(pre, {"torch": "2.9", "torch_cuda_build": "12.8",
                                              "cuda_error": "CUDA driver initialization failed"}))
    for part in ("libcuda.so.1 not loadable", "no device", "no /dev/nvidia-uvm",
                 "CUDA error: CUDA driver initialization failed",
                 "CUDA_VISIBLE_DEVICES='-1' hides every GPU"):
        assert part in reasons


def run_ranks(agent: Path, tmp_path: Path, world: int, **opts: object) -> list[dict]:
    """The NCCL rank children over gloo on the CPU, as the parent starts them; their events."""
    procs = start_ranks(agent, tmp_path, world, **opts)
    assert [p.wait(timeout=180) for p in procs] == [0] * world
    return [json.loads(ln) for r in range(world)
            for ln in (tmp_path / f"r{r}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("world", [1, 2])
def test_collective_checks_on_cpu_with_gloo(agent, tmp_path, world):
    """The NCCL rank code, run over gloo on the CPU (needs a torch: UMPROV_TEST_TORCH_PYTHON)."""
    events = run_ranks(agent, tmp_path, world)
    records = {e["record"]["check"]: e["record"] for e in events if e["ev"] == "record"}
    for check in ("nccl.init", "nccl.all_reduce_f32", "nccl.all_reduce_bf16", "nccl.all_gather",
                  "nccl.reduce_scatter", "nccl.broadcast", "ddp.step"):
        assert records[check]["verdict"] == "pass", records[check]
    pairs = pair_records([e for e in events if e["ev"] == "pair"], BUILTIN_PROFILES["generic"],
                         world)
    assert len(pairs) == world * (world - 1) // 2
    sweep = [e["record"] for e in events if e["ev"] == "record"
             and e["record"]["check"] == "nccl.allreduce_sweep"]
    if world == 1:
        assert "one rank" in records["nccl.init"]["detail"]
        assert records["nccl.busbw_1g"]["verdict"] == "skip"
        assert [(r["verdict"], "size_bytes" in r) for r in sweep] == [("skip", False)]
        assert "one rank" in sweep[0]["detail"]
    else:  # the CPU run sweeps up to 16 MiB: one record a size, bus bandwidth in GB/s
        assert [r["size_bytes"] for r in sweep] == [8 << 10, 64 << 10, 1 << 20, 16 << 20]
        assert all(r["verdict"] == "pass" and r["unit"] == "GB/s" and r["measured"] > 0
                   and r["scope"] == "host" and r["target"] == "host" for r in sweep)


def test_an_odd_number_of_ranks_measures_every_pair_in_rounds(agent, tmp_path):
    """Three ranks: each round one rank sits out and still keeps step (the same barriers)."""
    events = run_ranks(agent, tmp_path, 3, quick=True)
    pairs = pair_records([e for e in events if e["ev"] == "pair"], BUILTIN_PROFILES["generic"],
                         3)
    assert [p["target"] for p in pairs] == ["gpu0-gpu1", "gpu0-gpu2", "gpu1-gpu2"]
    assert all(p["verdict"] == "pass" and "->" in p["detail"] for p in pairs)


def test_burn_in_on_cpu_with_gloo_keeps_the_ranks_in_step(agent, tmp_path):
    """Two ranks load, probe and stop together (the same collectives on both); every GEMM probe
    is bit-identical and every all_reduce exact."""
    events = run_ranks(agent, tmp_path, 2, quick=True, duration=2)
    records = {(e["record"]["target"], e["record"]["check"]): e["record"] for e in events
               if e["ev"] == "record"}
    for key in (("gpu0", "burnin.gemm_bf16_rate"), ("gpu1", "burnin.hbm_copy"),
                ("gpu1", "burnin.gemm_repeatable"), ("host", "burnin.nccl")):
        assert records[key]["verdict"] == "pass", records[key]
    probes = [e for e in events if e["ev"] == "burnin_probe"]
    assert probes and all(p["same"] and p["nccl_wrong"] == 0 for p in probes)
    ends = [e["cycles"] for e in events if e["ev"] == "burnin_end"]
    assert len(ends) == 2 and ends[0] == ends[1] >= 1
