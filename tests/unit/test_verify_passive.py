"""The passive mode (``agent.pyz --passive``) as users run it: the zipapp in its own process,
against a stand-in NVML (verify_fakes/fake_nvml), a kernel log from a stand-in journalctl, and
a torch whose import leaves a mark and fails: passive reads only, and never loads torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fakebin
from umprov.verify import report
from umprov.verify.agent.schema import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, EXIT_WARN
from umprov.verify.bundle import agent_zipapp

FAKES = Path(__file__).resolve().parent / "verify_fakes"


def h200(pci: str, **extra) -> dict:
    return {"name": "NVIDIA H200", "uuid": f"GPU-{pci}", "pci": pci, "processes": [],
            "links": [True] * 18, "throttle": 0x4, "ecc": [0, 3], **extra}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_zipapp(cache=tmp_path_factory.mktemp("agent"))


class Host:
    """One simulated host: its GPUs (None: no NVIDIA driver at all) and kernel log lines."""

    def __init__(self, agent: Path, tmp: Path) -> None:
        self.agent, self.tmp = agent, tmp
        self.gpus: list[dict] | None = [h200("00000000:18:00.0"), h200("00000000:3B:00.0")]
        self.kernel: list[str] = ["Linux version 6.1.0"]
        self.marker = tmp / "torch-imported"

    def run(self, *args: str) -> tuple[int, dict, str]:
        bindir = self.tmp / "bin"
        fakebin.journal(bindir, [{"__CURSOR": f"c{i}",
                                  "_SOURCE_MONOTONIC_TIMESTAMP": str(9_000_000 + i), "MESSAGE": m}
                                 for i, m in enumerate(self.kernel)])
        paths = [str(FAKES / "forbidden_torch")]
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
               "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
               "UMPROV_TORCH_IMPORTED": str(self.marker)}
        if self.gpus is not None:
            (self.tmp / "nvml.json").write_text(json.dumps({"gpus": self.gpus}))
            env["UMPROV_FAKE_NVML"] = str(self.tmp / "nvml.json")
            paths.insert(0, str(FAKES / "fake_nvml"))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        out = self.tmp / "report.json"
        proc = subprocess.run([sys.executable, str(self.agent), "--passive", "--json", str(out),
                               *args], capture_output=True, text=True, timeout=60, env=env)
        assert not self.marker.exists(), "the passive mode imported torch"
        doc = json.loads(out.read_text()) if out.is_file() else {}
        return proc.returncode, doc, proc.stderr


@pytest.fixture
def host(agent, tmp_path) -> Host:
    return Host(agent, tmp_path)


def by_check(doc: dict) -> dict[tuple[str, str], dict]:
    assert report.validate(doc) == []
    return {(r["target"], r["check"]): r for r in doc["records"]}


def test_a_healthy_host_passes_without_torch(host):
    rc, doc, err = host.run("--expected-gpus", "2")
    assert rc == EXIT_PASS, err
    assert doc["mode"] == "passive" and doc["verdict"] == "pass"
    recs = by_check(doc)
    assert recs[("host", "host.driver")]["measured"] == "580.159.04"
    assert recs[("host", "host.gpu_count")]["measured"] == 2
    for gpu in ("gpu0", "gpu1"):
        assert recs[(gpu, "ecc.uncorrected_volatile")]["verdict"] == "pass"
        assert recs[(gpu, "ecc.row_remap_failure")]["verdict"] == "pass"
        assert recs[(gpu, "gpu.throttle")]["detail"] == "clock event reasons now: sw-power-cap"
        assert recs[(gpu, "nvlink.links")]["measured"] == 18
    assert recs[("host", "host.xid")]["verdict"] == "pass"
    assert not any(r["check"].startswith(("nccl", "managed", "gpu.gemm")) for r in doc["records"])
    assert doc["wall_s"] < 30


def test_each_passive_finding_fails_or_warns_by_its_rule(host):
    assert host.gpus is not None
    host.gpus[0].update(throttle=0x4 | 0x8, links=[True] * 16 + [False] * 2)
    host.gpus[1].update(remap=[0, 2, 0, 1], ecc=[1, 0], ecc_aggregate=[5, 0])
    host.kernel.append("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
                       "GPU has fallen off the bus.")
    rc, doc, err = host.run("--expected-gpus", "2")
    assert rc == EXIT_FAIL
    recs = by_check(doc)
    assert recs[("gpu0", "gpu.throttle")]["verdict"] == "fail"
    assert "hw-slowdown" in recs[("gpu0", "gpu.throttle")]["detail"]
    links = recs[("gpu0", "nvlink.links")]
    assert (links["verdict"], links["measured"]) == ("fail", 16)
    assert "down: link 16, 17" in links["detail"]
    assert recs[("gpu1", "ecc.row_remap_failure")]["verdict"] == "fail"
    assert recs[("gpu1", "ecc.uncorrected_volatile")]["verdict"] == "fail"
    assert recs[("gpu1", "ecc.uncorrected_aggregate")]["verdict"] == "warn"
    assert recs[("gpu1", "xid.79")]["verdict"] == "fail"
    assert "FAIL" in err  # the summary on stderr, as in the active mode


def test_a_pending_remap_warns(host):
    assert host.gpus is not None
    host.gpus[1]["remap"] = [0, 1, 1, 0]
    rc, doc, _ = host.run("--expected-gpus", "2")
    assert rc == EXIT_WARN
    assert by_check(doc)[("gpu1", "ecc.row_remap_pending")]["hint"] == "reset"


def test_a_missing_gpu_fails_the_count(host):
    rc, doc, _ = host.run("--expected-gpus", "8")
    count = by_check(doc)[("host", "host.gpu_count")]
    assert rc == EXIT_FAIL and (count["measured"], count["limit"]) == (2, 8)


def test_a_host_without_driver_passes_only_when_it_expects_no_gpu(host):
    host.gpus = None
    rc, doc, err = host.run("--expected-gpus", "0")
    assert rc == EXIT_PASS, err
    recs = by_check(doc)
    assert recs[("host", "host.driver")]["verdict"] == "skip"
    assert recs[("host", "host.gpu_count")]["measured"] == 0
    rc, doc, _ = host.run("--expected-gpus", "4")
    assert rc == EXIT_FAIL
    assert by_check(doc)[("host", "host.driver")]["hint"] == "driver"
    rc, doc, _ = host.run()
    assert rc == EXIT_FAIL
    assert by_check(doc)[("host", "host.gpu_count")]["detail"].startswith("no NVIDIA GPU visible")


@pytest.mark.parametrize("extra", [["--quick"], ["--duration", "1m"], ["--exclusive"]])
def test_passive_refuses_the_options_of_an_active_run(host, extra):
    rc, doc, err = host.run(*extra)
    assert rc == EXIT_USAGE and doc == {} and "--passive takes no" in err
