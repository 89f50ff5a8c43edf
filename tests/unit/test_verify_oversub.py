"""managed.oversubscription without a GPU: its sizes, its verdicts, its gate, and the step's
own arithmetic on the CPU (the GPU run is tests/gpu/test_managed_allocator_gpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import torch_with_dynamo
from umprov.verify.agent import host, oversub
from umprov.verify.agent.profiles import BUILTIN_PROFILES, LIMITS
from umprov.verify.agent.runner import child_env
from umprov.verify.agent.schema import validate_record

MiB = 1 << 20
RESULT = {"step_s": 0.1, "first_step_s": 0.5, "layers_differing": 0, "loss_first": 1.0,
          "loss_last": 0.9}


def test_the_working_set_is_oversub_times_the_budget_in_whole_cublas_tiles():
    n = oversub.layer_size(oversub.BUDGET)
    assert n % 256 == 0
    working = oversub.SHARDS * 4 * n * n * 4
    assert working == oversub.OVERSUB * oversub.BUDGET  # 512 MiB on a 64 MiB budget
    assert oversub.layer_size(1) == 256  # never below one tile


@pytest.mark.parametrize(("step", "verdict"), [(0.05, "pass"), (0.2, "warn"), (0.6, "fail")])
def test_the_step_is_judged_against_its_pcie_floor(step, verdict):
    # 1 GiB spilled at 53.7 GB/s pinned: a floor of 2 x 1.074 / 53.7 = 40 ms
    stats = {"peak_spilled": 1 << 30}
    rec = oversub.judge_oversub("gpu0", {**RESULT, "step_s": step}, stats, 53.7,
                                BUILTIN_PROFILES["h200-sxm"], 256 * MiB, 2048 * MiB)
    assert rec["verdict"] == verdict and rec["unit"] == "x"
    assert rec["measured"] == pytest.approx(step / 0.040, rel=0.01)
    assert "floor 40 ms" in rec["detail"] and validate_record(rec) == []


def test_layers_that_differ_fail_whatever_the_speed():
    rec = oversub.judge_oversub("gpu0", {**RESULT, "layers_differing": 3}, {"peak_spilled": 1},
                                50.0, BUILTIN_PROFILES["generic"], 256 * MiB, 2048 * MiB)
    assert rec["verdict"] == "fail" and rec["measured"] == 3 and rec["hint"] == "isolate"


def test_no_floor_without_a_rate_or_a_spill_is_a_plain_pass():
    rec = oversub.judge_oversub("gpu0", RESULT, {"peak_spilled": 0}, None,
                                BUILTIN_PROFILES["generic"], 256 * MiB, 2048 * MiB)
    assert rec["verdict"] == "pass" and "no PCIe floor" in rec["detail"]


def test_the_limits_are_in_every_profile_and_overridable():
    for name, profile in BUILTIN_PROFILES.items():
        assert profile["limits"]["managed_oversub_floor_ratio_warn"] == 3.0, name
        assert profile["limits"]["managed_oversub_floor_ratio_fail"] == 10.0, name
    assert "managed_oversub_floor_ratio_warn" in LIMITS


def test_the_gate_carries_the_pinned_rate(tmp_path):
    gate = oversub.gate_path(str(tmp_path), 3)
    oversub.open_oversub_gate(gate, 54.2)
    assert json.loads(Path(gate).read_text()) == {"h2d_gbps": 54.2}
    assert oversub._gate_rate(gate) == 54.2
    oversub.open_oversub_gate(gate, None)
    assert oversub._gate_rate(gate) is None
    assert oversub._gate_rate(str(tmp_path / "none")) is None


def test_the_parent_reads_the_rate_its_per_gpu_child_measured():
    class Done:
        def events(self):
            return [{"ev": "start", "check": "pcie.h2d_pinned"},
                    {"ev": "record", "record": {"check": "pcie.h2d_pinned", "measured": 55.1}}]

    class Skipped:
        def events(self):
            return [{"ev": "record", "record": {"check": "pcie.h2d_pinned", "measured": None}}]

    assert host._h2d_rate(Done()) == 55.1
    assert host._h2d_rate(Skipped()) is None


def test_the_step_keeps_identical_layers_identical_on_the_cpu():
    """In a process of its own: torch.optim pulls in torch._dynamo, which trips over the
    sys.intern patch ansible-core leaves in this one."""
    pytest.importorskip("torch")
    code = ("import json, torch\nfrom umprov.verify.agent import oversub\n"
            "print(json.dumps(oversub._train(torch, torch.device('cpu'), 256)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["layers_differing"] == 0
    assert result["loss_last"] < result["loss_first"]  # Adam made progress


ADAM_AGAINST_TORCH = """
import json, torch
from umprov.verify.agent.oversub import ForeachAdam
torch.manual_seed(0)
ours = [torch.nn.Parameter(torch.randn(64, 32)) for _ in range(3)]
theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
x = torch.randn(16, 64)
mine = ForeachAdam(torch, ours, lr=1e-2)
ref = torch.optim.Adam(theirs, lr=1e-2, foreach=True)
for _ in range(4):
    for params, opt in ((ours, mine), (theirs, ref)):
        sum((x @ p).tanh().square().mean() for p in params).backward()
        opt.step()
        opt.zero_grad()
print(json.dumps([float((a - b).abs().max()) for a, b in zip(ours, theirs)]))
"""


def test_the_checks_adam_takes_the_steps_torch_optim_adam_takes():
    """The check writes Adam out (torch.optim's first step imports torch's compiler stack, a
    second): four steps must land where torch.optim.Adam's foreach path lands."""
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-c", ADAM_AGAINST_TORCH], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    diffs = json.loads(out.strip().splitlines()[-1])
    assert len(diffs) == 3 and max(diffs) <= 1e-6, diffs


def test_children_never_inherit_the_containers_managed_allocator(monkeypatch):
    monkeypatch.setenv("UMPROV_MANAGED_MEMORY", "1")  # umprov deploy --managed-memory
    assert child_env()["UMPROV_MANAGED_MEMORY"] == "0"


class Emitter:
    """The child's emitter, keeping what it records (and "done")."""

    def __init__(self) -> None:
        self.records: list = []

    def start(self, *a) -> None:
        pass

    def event(self, *a, **kw) -> None:
        pass

    def record(self, rec) -> None:
        self.records.append(rec)

    def done(self) -> None:
        self.records.append("done")


def test_an_image_without_umprov_managed_skips_saying_why(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "umprov_managed", None)  # import fails
    em = Emitter()
    oversub.child_oversub(em, {"lock": str(tmp_path / "hostlink.lock")}, 0)
    (rec, done) = em.records
    assert rec["verdict"] == "skip" and "umprov_managed" in rec["detail"] and done == "done"


def test_a_container_whose_allocator_setting_leaves_the_pool_off_warns(tmp_path, monkeypatch):
    """PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync leaves the pool off for every job of the
    container: the check says so (warn, naming the setting) and never enables the pool."""
    torch_with_dynamo()
    enabled = []
    fake = types.SimpleNamespace(
        ruled_out=lambda: "PYTORCH_CUDA_ALLOC_CONF backend:cudaMallocAsync selects CUDA's own pool allocator",
        enable=lambda **kw: enabled.append(kw))
    monkeypatch.setitem(sys.modules, "umprov_managed", fake)
    em = Emitter()
    oversub.child_oversub(em, {"lock": str(tmp_path / "hostlink.lock")}, 0)
    (rec, done) = em.records
    assert rec["verdict"] == "warn" and "cudaMallocAsync" in rec["detail"], rec
    assert done == "done" and enabled == []
