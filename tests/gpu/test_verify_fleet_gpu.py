"""Fleet-depth checks on a real GPU (the H200 machine: `pytest -m gpu tests/gpu`): another
process holding most of GPU 0's memory or running matrix products on it, and a 60 s burn-in.

Each test runs the agent's zipapp as users do; the other process is a script of its own
(gpu_hog.py), killed and waited for when the test ends, so the next test finds the GPU free.
"""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from umprov.verify.agent.schema import EXIT_FAIL, EXIT_PASS, EXIT_WARN

from .test_verify_gpu import by_check, problems, run_agent

HOG = Path(__file__).resolve().parent / "gpu_hog.py"
THROUGHPUT_UNITS = ("GB/s", "TFLOP/s", "x")

pytestmark = pytest.mark.gpu


def start_hog(*args: str, within: float = 180) -> subprocess.Popen:
    """The other process, once it holds GPU 0 (it prints "ready"); killed if it does not."""
    proc = subprocess.Popen([sys.executable, str(HOG), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _w, _x = select.select([proc.stdout], [], [], within)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        proc.wait(timeout=60)
        raise AssertionError(f"the hog did not start within {within:.0f} s: "
                             f"{proc.stderr.read()[-2000:]}")
    return proc


@pytest.fixture
def memory_hog() -> Iterator[subprocess.Popen]:
    proc = start_hog("memory", "0.85")  # 85% of the FREE memory, never more than is free
    yield proc
    proc.kill()
    proc.wait(timeout=60)


@pytest.fixture
def matmul_hog() -> Iterator[subprocess.Popen]:
    proc = start_hog("matmul")
    yield proc
    proc.kill()
    proc.wait(timeout=60)


def hog_named(rec: dict, hog: subprocess.Popen) -> bool:
    return f"pid {hog.pid} (" in rec["detail"]


def test_a_process_holding_most_memory_warns_and_fails_under_exclusive(agent, tmp_path,
                                                                       memory_hog):
    rc, doc, _ = run_agent(agent, tmp_path, name="memory-hog")
    (busy,) = [r for r in by_check(doc, "gpu.processes") if r["target"] == "gpu0"]
    assert busy["verdict"] == "warn" and hog_named(busy, memory_hog), busy
    assert not [r for r in doc["records"] if r["reason"] in ("crash", "timeout")], problems(doc)
    assert doc["verdict"] == "warn" and rc == EXIT_WARN, problems(doc)  # the warning alone
    rc, doc, _ = run_agent(agent, tmp_path, "--quick", "--exclusive", name="memory-hog-excl")
    (busy,) = [r for r in by_check(doc, "gpu.processes") if r["target"] == "gpu0"]
    assert busy["verdict"] == "fail" and hog_named(busy, memory_hog), busy
    assert rc == EXIT_FAIL
    assert not [r for r in doc["records"] if r["reason"] in ("crash", "timeout")], problems(doc)


def test_a_gpu_another_process_filled_is_busy_not_broken(agent, tmp_path):
    """Another process leaves about 0.6 GiB free (#28: gpu.init and nccl.init crashed with
    torch's CUBLAS/DSA text): the checks that cannot get memory are skipped, saying so and
    naming the process; the verdict is gpu.processes' (warn; fail with --exclusive)."""
    hog = start_hog("leave", "0.6")  # sized in the hog: this process keeps off the GPU
    try:
        rc, doc, _ = run_agent(agent, tmp_path, name="memory-full")
        rc_x, doc_x, _ = run_agent(agent, tmp_path, "--exclusive", name="memory-full-excl")
    finally:
        hog.kill()
        hog.wait(timeout=60)
    assert not [r for r in doc["records"] if r["reason"] in ("crash", "timeout")], problems(doc)
    texts = " ".join(r["detail"] or "" for r in doc["records"])
    assert "TORCH_USE_CUDA_DSA" not in texts and "Search for" not in texts
    short = [r for r in doc["records"] if r["verdict"] == "skip"
             and "out of GPU memory" in (r["detail"] or "")]
    assert short and all(hog_named(r, hog) for r in short), problems(doc)
    assert doc["verdict"] == "warn" and rc == EXIT_WARN, problems(doc)
    assert doc_x["verdict"] == "fail" and rc_x == EXIT_FAIL, problems(doc_x)


def test_a_process_computing_meanwhile_fails_throughput_and_is_named(agent, tmp_path,
                                                                     matmul_hog):
    rc, doc, _ = run_agent(agent, tmp_path, name="matmul-hog")
    assert rc == EXIT_FAIL, problems(doc)
    (gemm,) = [r for r in by_check(doc, "gpu.gemm_bf16_rate") if r["target"] == "gpu0"]
    assert gemm["verdict"] == "fail", gemm
    short = [r for r in doc["records"] if r["verdict"] in ("warn", "fail")
             and r["unit"] in THROUGHPUT_UNITS and r["gpu"] in (0, None)]
    assert short and all(hog_named(r, matmul_hog) for r in short), problems(doc)
    (busy,) = [r for r in by_check(doc, "gpu.processes") if r["target"] == "gpu0"]
    assert busy["verdict"] == "warn" and hog_named(busy, matmul_hog)


def test_a_burn_in_of_60_s_passes_and_its_samples_are_in_the_report(agent, tmp_path,
                                                                   gpu_count):
    rc, doc, wall = run_agent(agent, tmp_path, "--duration", "60s", "--expected-gpus",
                              str(gpu_count), name="burn-in", timeout=600)
    assert doc["verdict"] == "pass" and rc == EXIT_PASS, problems(doc)
    assert 60 <= wall < 180
    for i in range(gpu_count):
        for check in ("burnin.gemm_bf16_rate", "burnin.hbm_copy", "burnin.gemm_repeatable",
                      "burnin.throttle", "burnin.ecc", "burnin.temperature"):
            assert any(r["target"] == f"gpu{i}" for r in by_check(doc, check)), check
    if gpu_count > 1:
        assert by_check(doc, "burnin.nccl")[0]["verdict"] == "pass"
    samples = doc["samples"]
    keys = {"t", "gpu", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz", "throttle"}
    assert samples and all(set(s) == keys for s in samples)
    assert {s["gpu"] for s in samples} == set(range(gpu_count))
    assert max(s["t"] for s in samples) >= 60  # sampled through the whole burn-in
    assert all(isinstance(s["throttle"], list) for s in samples)
    busy = [s for s in samples if s["power_w"] is not None and s["power_w"] > 200]
    assert busy, "no sample shows a loaded GPU"
