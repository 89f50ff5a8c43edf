"""umprov's managed-memory allocator on a real GPU: the same losses as PyTorch's default
allocator on a step that fits, a step at twice the device memory left to it completes where the
default allocator runs out of memory, and UMPROV_MANAGED_MEMORY=1 switches it on at torch's
import, as the image's .pth hook does. Timings are bench/managed_alloc.py's, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def test_a_step_past_the_memory_left_runs_and_a_fitting_one_is_unchanged(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "managed_alloc.py"), "--dim",
                           "4096", "--fit-layers", "2", "--left-gib", "2", "--steps", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **NVLS_OFF})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "managed_alloc.json").read_text())
    summary, cases = doc["summary"], doc["cases"]
    assert summary["fit_losses_equal"], cases
    over = cases["over_managed"]
    assert "error" not in over and "oom" not in over, over
    assert len(over["step_s"]) == 3 and all(x == x for x in over["losses"])  # finite
    assert over["stats"]["peak_spilled"] > 0 and over["stats"]["failed_advice"] == 0
    assert summary["default_oom_at_that_size"], cases["over_default"]


def test_the_environment_switch_enables_it_at_torchs_import(tmp_path):
    library = tmp_path / "libumprov_managed.so"
    subprocess.run(["sh", str(MANAGED / "build.sh"), str(library)], check=True)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import umprov_managed; "
        "umprov_managed.after_torch_import(); import torch; "
        "x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
        "import json; print(json.dumps(umprov_managed.stats()))")
    env = {**os.environ, **NVLS_OFF, "UMPROV_MANAGED_MEMORY": "1",
           "UMPROV_MANAGED_LIBRARY": str(library)}
    proc = subprocess.run([sys.executable, "-c", script, str(MANAGED)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["reservoir"] >= 1 << 30 and stats["placed"] >= 4 << 20, stats
    off = subprocess.run([sys.executable, "-c", script, str(MANAGED)], capture_output=True,
                         text=True, timeout=300, env={**env, "UMPROV_MANAGED_MEMORY": "0"})
    assert off.returncode == 0 and json.loads(off.stdout.strip().splitlines()[-1])[
        "reservoir"] == 0, off.stderr[-2000:]


def test_the_agent_proves_a_step_past_its_device_budget(agent, tmp_path, gpu_count):
    """managed.oversubscription in a full run, with the allocator on the agent's path as in
    umprov's image: every GPU's step completes, its layers on the host and on the GPU end
    bit-identical, and the step is within the warn limit of its PCIe floor."""
    library = tmp_path / "libumprov_managed.so"
    subprocess.run(["sh", str(MANAGED / "build.sh"), str(library)], check=True)
    path = os.pathsep.join(p for p in (str(MANAGED), os.environ.get("PYTHONPATH")) if p)
    out = tmp_path / "oversub.json"
    env = {**os.environ, **NVLS_OFF, "PYTHONPATH": path, "UMPROV_MANAGED_LIBRARY": str(library),
           "UMPROV_MANAGED_MEMORY": "1"}  # a --managed-memory container: ignored by the others
    proc = subprocess.run([sys.executable, str(agent), "--json", str(out)], capture_output=True,
                          text=True, timeout=600, env=env)
    doc = json.loads(out.read_text())
    recs = [r for r in doc["records"] if r["check"] == "managed.oversubscription"]
    assert len(recs) == gpu_count, proc.stderr[-2000:]
    for rec in recs:
        assert rec["verdict"] == "pass", rec
        assert rec["unit"] == "x" and 0 < rec["measured"] <= 3.0, rec
        facts = doc["facts"]["gpus"][rec["target"]][f"oversub_{rec['target']}"]
        assert facts["layers_differing"] == 0 and facts["peak_spilled"] > 0, facts
        assert facts["failed_advice"] == 0 and facts["budget"] == 64 << 20, facts
    # the other checks ran on PyTorch's own allocator, as without the switch
    assert doc["verdict"] == "pass", [r for r in doc["records"] if r["verdict"] != "pass"
                                      and r["verdict"] != "skip"]


@pytest.fixture(autouse=True)
def _needs_gcc() -> None:
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the allocator with")
