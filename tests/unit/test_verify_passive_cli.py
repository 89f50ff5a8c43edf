"""`umprov verify --passive`: the agent's passive mode from the command line, here (--local)
and on inventory hosts (the flag reaches the agent; its mode names failed hosts' reports)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import fakebin
from umprov.verify import remote

FAKES = Path(__file__).resolve().parent / "verify_fakes"
GPU = {"name": "NVIDIA H200", "uuid": "GPU-0", "pci": "00000000:18:00.0", "processes": [],
       "links": [True] * 18, "throttle": 0x4}


def test_local_passive_reads_the_driver_and_never_loads_torch(umprov_cli, tmp_path, monkeypatch):
    (tmp_path / "nvml.json").write_text(json.dumps({"gpus": [GPU]}))
    monkeypatch.setenv("PYTHONPATH", f"{FAKES / 'fake_nvml'}:{FAKES / 'forbidden_torch'}")
    monkeypatch.setenv("UMPROV_FAKE_NVML", str(tmp_path / "nvml.json"))
    monkeypatch.setenv("UMPROV_TORCH_IMPORTED", str(tmp_path / "torch-imported"))
    journalctl = fakebin.journal(tmp_path / "bin", [{"MESSAGE": "Linux version 6.1"}])  # no Xid
    monkeypatch.setenv("PATH", f"{journalctl.parent}:{os.environ['PATH']}")
    result = umprov_cli("verify", "--local", "--passive", "--expected-gpus", "1", "--json")
    (doc,) = json.loads(result.stdout)["hosts"]
    assert doc["mode"] == "passive"
    assert {r["check"] for r in doc["records"]} >= {"host.driver", "host.gpu_count",
                                                    "ecc.uncorrected_volatile", "gpu.throttle"}
    assert not (tmp_path / "torch-imported").exists()
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("extra", [["--quick"], ["--duration", "5m"], ["--exclusive"],
                                   ["--multi-node"]])
def test_passive_refuses_what_would_load_the_gpus(umprov_cli, extra):
    result = umprov_cli("verify", "--local", "--passive", *extra)
    assert result.exit_code == 4
    assert "--passive reads only" in result.stderr


def test_the_flag_reaches_the_agent_on_hosts_and_names_the_mode():
    opts = remote.VerifyOptions(passive=True, timeout=30)
    assert opts.agent_args({"umprov_expected_gpus": 8}) == [
        "--timeout", "30", "--passive", "--expected-gpus", "8"]
    assert opts.mode == "passive"
    assert remote.VerifyOptions(quick=True).mode == "quick"
    assert "--passive" not in remote.VerifyOptions().agent_args({})
