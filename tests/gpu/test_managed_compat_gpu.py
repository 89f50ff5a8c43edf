"""Nothing in PyTorch stops working on umprov's pool (issue #36 item 2): each case of
managed_cases.py runs with the pool switched on at torch's import, as in umprov's image, and
where it trains, against the same run on PyTorch's own allocator. The optimizer's host step
(umprov_managed_step) is forced on where training is compared, so it is what is proven."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
CASES = Path(__file__).with_name("managed_cases.py")
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the allocator with")
    out = tmp_path_factory.mktemp("managed") / "libumprov_managed.so"
    subprocess.run(["sh", str(MANAGED / "build.sh"), str(out)], check=True)
    return out


def run(library: Path, *args: str, pool: bool = True, host_step: str = "1", ok: bool = True,
        **env: str) -> tuple[dict, str]:
    """The case's facts and stderr; ``ok=False``: the case must fail out of memory."""
    path = os.pathsep.join(p for p in (str(MANAGED), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, **NVLS_OFF, "PYTHONPATH": path, "UMPROV_MANAGED_LIBRARY": str(library),
            "UMPROV_MANAGED_MEMORY": "1" if pool else "0",
            "UMPROV_MANAGED_HOST_STEP": host_step, **env}
    proc = subprocess.run([sys.executable, str(CASES), *args], capture_output=True, text=True,
                          timeout=600, env=full)
    if not ok:
        assert proc.returncode != 0 and "out of memory" in proc.stderr, proc.stderr[-3000:]
        return {}, proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def close(a: list[float], b: list[float], rel: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * max(abs(y), 1e-12)
                                    for x, y in zip(a, b, strict=True))


def test_cuda_malloc_async_leaves_the_pool_off_in_one_line_and_the_job_runs(library):
    facts, err = run(library, "stats", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    assert not facts["enabled"] and facts["allocated"] >= 256 << 20
    said = [ln for ln in err.splitlines() if "umprov managed memory" in ln]
    assert len(said) == 1 and "cudaMallocAsync" in said[0], err[-2000:]


def test_memory_statistics_tell_the_truth(library):
    facts, _ = run(library, "stats")
    assert facts["enabled"] and facts["pool"]["placed"] >= 256 << 20  # on the device
    assert facts["pool"]["spilled"] == 0 and facts["pool"]["reservoir"] >= 1 << 30
    assert facts["allocated"] >= 256 << 20 and facts["peak"] >= facts["allocated"]
    assert facts["after_free"] < 256 << 20 and facts["summary_lines"] > 10


def test_cudnn_benchmark_on_a_convolution(library):
    facts, _ = run(library, "cudnn")
    assert facts["enabled"] and facts["out"] == [8, 32, 64, 64] and facts["grad"] > 0


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile(library, mode):
    facts, _ = run(library, "compile", mode)
    assert facts["enabled"] and facts["max_diff"] < 1e-4, facts


@pytest.mark.parametrize("optim", ["adamw", "adamw_fused", "sgd"])
def test_accumulation_clipping_and_a_schedule_train_as_on_the_default_allocator(library, optim):
    base, _ = run(library, "train", optim, pool=False)
    pool, _ = run(library, "train", optim, UMPROV_MANAGED_GRADS_DOWN="0")
    assert pool["enabled"] and pool["host_step"] and not pool["grads_down"], pool
    assert close(pool["losses"], base["losses"]), (pool["losses"], base["losses"])
    down, _ = run(library, "train", optim)  # gradients down: the default since run J
    assert down["grads_down"] and close(down["losses"], base["losses"])


def test_gradients_down_keep_the_first_steps_out_of_the_reservoir(library):
    """Under a 1.75 GiB budget a 1 GiB model's gradients spill in the first backward, and then
    stay spilled on the host; gone down as backward makes them (the GPU nearly full), nothing
    spills, Adam's moments included (the first step is the host's), and the losses are the
    same (docs/managed-memory.md, runs H and I)."""
    budget = {"UMPROV_MANAGED_BUDGET": "1792m", "UMPROV_MANAGED_RESERVOIR": "8g",
              "UMPROV_MANAGED_HOST_STEP": "auto"}
    kept, _ = run(library, "first_steps", UMPROV_MANAGED_GRADS_DOWN="0", **budget)
    down, err = run(library, "first_steps", **budget)  # the default since run J
    assert kept["host_step"] and kept["pool"]["peak_spilled"] > 0, kept
    assert down["host_step"], err[-2000:]
    assert down["pool"]["peak_spilled"] < kept["pool"]["peak_spilled"] // 4, (down, kept)
    assert close(down["losses"], kept["losses"]), (down["losses"], kept["losses"])


def test_gradients_spilled_to_a_reservoir_running_short_go_down_and_free_it(library):
    """Under a 512 MiB budget about half of a 1 GiB model's weights spill, and every gradient
    lands in the reservoir: 1.25 GiB holds them only where gradients leave it as backward makes
    them (run K: the row with 9 GiB left ran out of its 9.25 GiB reservoir in backward)."""
    tight = {"UMPROV_MANAGED_BUDGET": "512m", "UMPROV_MANAGED_RESERVOIR": "1280m",
             "UMPROV_MANAGED_HOST_STEP": "auto"}
    run(library, "first_steps", UMPROV_MANAGED_GRADS_DOWN="0", ok=False, **tight)
    base, _ = run(library, "first_steps", pool=False)
    down, err = run(library, "first_steps", **tight)
    assert down["host_step"] and down["pool"]["peak_spilled"] > 256 << 20, err[-2000:]
    assert close(down["losses"], base["losses"]), (down["losses"], base["losses"])


def test_optimizer_state_saved_and_loaded_in_a_fresh_process(library, tmp_path):
    base_first, _ = run(library, "resume", str(tmp_path / "base.pt"), pool=False)
    base_then, _ = run(library, "resume", str(tmp_path / "base.pt"), pool=False)
    first, _ = run(library, "resume", str(tmp_path / "pool.pt"))
    then, _ = run(library, "resume", str(tmp_path / "pool.pt"))
    assert first["host_step"]
    assert close(first["losses"] + then["losses"], base_first["losses"] + base_then["losses"])


def test_a_side_stream_block_is_not_reused_early(library):
    facts, _ = run(library, "side_stream")
    assert facts["enabled"] and not facts["reused_early"]
    reserved = facts["reserved"]  # and it comes back at the step: nothing held for good
    assert reserved[1:] == reserved[1:2] * (len(reserved) - 1), reserved


def test_ddp_over_nccl(library):
    base, _ = run(library, "ddp", pool=False)
    pool, _ = run(library, "ddp", UMPROV_MANAGED_GRADS_DOWN="1")
    assert pool["enabled"] and close(pool["losses"], base["losses"])
    assert not pool["grads_down"]  # DDP's reducer writes .grad after backward's hooks


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_tensors_past_the_budget_spill_to_the_reservoir(library, conf):
    facts, err = run(library, "spill", PYTORCH_CUDA_ALLOC_CONF=conf,
                     UMPROV_MANAGED_BUDGET="1g", UMPROV_MANAGED_RESERVOIR="4g")
    assert facts["enabled"] and facts["right"] and facts["pool"]["spilled"] > 0, err[-2000:]


def test_the_jobs_own_memory_fraction_is_of_device_memory(library):
    """A fraction of 3 GiB, less than the 4 GiB reservoir PyTorch counts in every segment:
    without the reservoir added to it, no new device segment could be made."""
    facts, err = run(library, "fraction", UMPROV_MANAGED_RESERVOIR="4g")
    assert facts["enabled"] and facts["sum"] == 256 << 20, err[-2000:]
    assert facts["pool"]["spilled"] == 0 and facts["pool"]["placed"] >= 1 << 30, facts


def test_gradscalers_step_stays_the_devices_and_trains_as_written(library):
    base, _ = run(library, "scaler", pool=False)
    pool, _ = run(library, "scaler")
    assert pool["enabled"] and not pool["host_step"]
    assert close(pool["losses"], base["losses"]), (pool["losses"], base["losses"])


HOLDER = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(free - (int(sys.argv[1]) << 30), dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(600)
"""


def test_a_model_past_the_memory_left_trains_with_cudas_headroom_kept(library):
    """Another process leaves 3 GiB of the GPU (this one's CUDA context takes some), the
    model's 2.5 GiB of weights fill the rest: the caching allocator turns to the reservoir
    where it would take the headroom, and CUDA loads kernels and makes the backward's cuBLAS
    handle in it (both failed out of memory inside the library without it). The reservoir is
    no larger than the GPU memory left."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "3"], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "UMPROV_MANAGED_MEMORY": "0"})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        facts, err = run(library, "beyond", "40", UMPROV_MANAGED_RESERVOIR="3g")
    finally:
        holder.kill()
        holder.wait()
    pool = facts["pool"]
    assert facts["enabled"] and all(x == x for x in facts["losses"]), facts
    assert pool["headroom"] == 512 << 20 and pool["headroom_refused"] > 0, pool
    assert pool["peak_spilled"] > 0 and "no headroom" not in err, err[-2000:]
