"""``agent.pyz --slurm-health / --slurm-gate / --slurm-hold`` end to end: the zipapp in its own
process against a stand-in scontrol and squeue (verify_fakes/fake_slurm.py), a stand-in NVML
and a torch that must not load. What the node ends as, what the agent prints, its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fakebin
from umprov.verify.agent.schema import EXIT_FAIL, EXIT_PASS, EXIT_WARN, host_report, record
from umprov.verify.bundle import agent_zipapp

FAKES = Path(__file__).resolve().parent / "verify_fakes"
H200 = {"name": "NVIDIA H200", "processes": [], "links": [True] * 18, "throttle": 0x4}
ADMIN = "bad DIMM B3, ticket 4711"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_zipapp(cache=tmp_path_factory.mktemp("agent"))


class Cluster:
    """One node of a stand-in Slurm, with two H200s behind a stand-in NVML."""

    def __init__(self, agent: Path, tmp: Path) -> None:
        self.agent, self.tmp = agent, tmp
        self.bin = tmp / "bin"
        fakebin.slurm(self.bin)
        self.gpus = [{**H200, "uuid": f"GPU-{i}", "pci": f"00000000:{i + 0x18:02X}:00.0"}
                     for i in range(2)]
        self.set(state="IDLE")

    def set(self, **node) -> None:
        (self.tmp / "node.json").write_text(json.dumps({"name": "gpu07", "reason": "", **node}))

    @property
    def node(self) -> dict:
        return json.loads((self.tmp / "node.json").read_text())

    def run(self, *args: str) -> tuple[int, dict, str]:
        (self.tmp / "nvml.json").write_text(json.dumps({"gpus": self.gpus}))
        env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
               "PYTHONPATH": os.pathsep.join([str(FAKES / "fake_nvml"),
                                              str(FAKES / "forbidden_torch")]),
               "UMPROV_FAKE_NVML": str(self.tmp / "nvml.json"),
               "UMPROV_FAKE_SLURM": str(self.tmp / "node.json"),
               "UMPROV_TORCH_IMPORTED": str(self.tmp / "torch-imported"),
               "SLURMD_NODENAME": "gpu07"}
        proc = subprocess.run([sys.executable, str(self.agent), *args], capture_output=True,
                              text=True, timeout=60, env=env)
        assert not (self.tmp / "torch-imported").exists()
        lines = proc.stdout.strip().splitlines()
        return proc.returncode, json.loads(lines[-1]) if lines else {}, proc.stderr

    def updates(self) -> list[list[str]]:
        return [c for c in self.node.get("calls", []) if c[:2] == ["scontrol", "update"]]


@pytest.fixture
def cluster(agent, tmp_path) -> Cluster:
    return Cluster(agent, tmp_path)


def test_a_failing_passive_check_drains_with_its_reason(cluster):
    cluster.gpus[1]["remap"] = [0, 2, 0, 1]
    rc, out, err = cluster.run("--slurm-health", "--passive", "--expected-gpus", "2")
    assert rc == EXIT_FAIL
    assert out["action"] == "drain" and out["mode"] == "passive"
    assert out["reason"] == "umprov: gpu1 ecc.row_remap_failure"
    assert cluster.node["state"] == "IDLE+DRAIN"
    assert cluster.updates() == [["scontrol", "update", "nodename=gpu07", "state=drain",
                                  "reason=umprov: gpu1 ecc.row_remap_failure"]]
    assert "gpu07: passive fail; drain: umprov: gpu1 ecc.row_remap_failure" in err


def test_a_later_pass_resumes_what_umprov_drained(cluster):
    cluster.set(state="IDLE+DRAIN", reason="umprov: gpu1 ecc.row_remap_failure")
    rc, out, _ = cluster.run("--slurm-health", "--passive", "--expected-gpus", "2")
    assert rc == EXIT_PASS and out["action"] == "resume"
    assert cluster.node["state"] == "IDLE" and cluster.node["reason"] == ""


def test_a_node_an_administrator_drained_stays_drained_after_a_pass(cluster):
    cluster.set(state="IDLE+DRAIN", reason=ADMIN)
    rc, out, _ = cluster.run("--slurm-health", "--passive", "--expected-gpus", "2")
    assert rc == EXIT_PASS and out["action"] == "leave"
    assert cluster.node["reason"] == ADMIN and cluster.updates() == []


def test_dry_run_decides_and_changes_nothing(cluster):
    cluster.gpus[0]["throttle"] = 0x40
    rc, out, _ = cluster.run("--slurm-health", "--passive", "--dry-run")
    assert rc == EXIT_FAIL and out["action"] == "drain" and out["dry_run"] is True
    assert cluster.updates() == []


def test_the_gate_judges_a_given_report_and_ends_its_hold(cluster, tmp_path):
    cluster.set(state="IDLE+DRAIN", reason="umprov: rolling driver change 2024-03-04T17:40Z")
    doc = host_report("gpu07", [record("gpu", "gpu0", "gpu.hbm_copy", "pass", measured=4100.0)],
                      mode="quick", profile="h200-sxm")
    (tmp_path / "report.json").write_text(json.dumps(doc))
    rc, out, _ = cluster.run("--slurm-gate", "--report", str(tmp_path / "report.json"))
    assert rc == EXIT_PASS and out["action"] == "resume" and out["mode"] == "quick"
    assert cluster.node["state"] == "IDLE"


def test_active_checks_that_cannot_start_fall_back_to_passive_and_warn(cluster):
    fakebin.shell(cluster.bin, "docker", "echo 'No such container: umprov' >&2\nexit 1\n")
    rc, out, _ = cluster.run("--slurm-health", "--active-when-idle", "--container", "umprov")
    assert rc == EXIT_WARN and out["action"] == "leave" and out["mode"] == "passive"
    assert cluster.updates() == []  # umprov's own set-up never drains a node


def test_a_busy_node_gets_the_passive_checks_only(cluster):
    cluster.set(state="MIXED")
    rc, out, _ = cluster.run("--slurm-health", "--active-when-idle", "--container", "absent")
    assert rc == EXIT_PASS and out["mode"] == "passive"  # docker was never asked


def test_the_hold_drains_then_waits_for_the_jobs(cluster):
    cluster.set(state="MIXED", jobs=["4711", "4712"], jobs_end_after=2)
    rc, out, err = cluster.run("--slurm-hold", "driver change", "--wait", "30", "--poll", "0.05")
    assert rc == 0, err
    assert out["action"] == "drain" and out["jobs"] == []
    assert out["reason"].startswith("umprov: rolling driver change 20")
    assert cluster.node["state"] == "MIXED+DRAIN"


def test_jobs_still_running_at_the_deadline_are_named_and_the_hold_stays(cluster):
    cluster.set(state="ALLOCATED", jobs=["4711", "4712"])
    rc, out, err = cluster.run("--slurm-hold", "driver change", "--wait", "0.2", "--poll", "0.05")
    assert rc == 1 and out["jobs"] == ["4711", "4712"]
    assert "job(s) 4711, 4712 still running after 0 s; the node stays drained" in err
    assert cluster.node["reason"].startswith("umprov: rolling driver change")


def test_a_failed_step_relabels_the_hold_but_never_drains_a_node_in_service(cluster):
    rc, out, _ = cluster.run("--slurm-hold", "failed: Install the driver", "--if-held")
    assert rc == 0 and out["action"] == "leave" and cluster.updates() == []
    cluster.set(state="IDLE+DRAIN", reason="umprov: rolling driver change 2024-03-04T17:40Z")
    cluster.run("--slurm-hold", "failed: Install the driver", "--if-held")
    assert cluster.node["reason"] == "umprov: rolling failed: Install the driver"


def test_an_unknown_node_is_one_line_and_exit_1(cluster):
    rc, out, err = cluster.run("--slurm-health", "--passive", "--node", "gpu99")
    assert rc == 1 and "Node gpu99 not found" in out["error"]
    assert err.strip().splitlines() == [
        "umprov gpu health: gpu99: scontrol show node: Node gpu99 not found"]


def test_other_schedulers_through_hook_commands(cluster, tmp_path):
    log = tmp_path / "hooks.log"
    hooks = ["--scheduler", "hooks", "--marker", str(tmp_path / "drained"),
             "--drain-command", f'echo "drain $UMPROV_NODE $UMPROV_REASON" >> {log}',
             "--resume-command", f'echo "resume $UMPROV_NODE" >> {log}']
    cluster.gpus[0]["throttle"] = 0x80
    rc, out, _ = cluster.run("--slurm-health", "--passive", *hooks)
    assert rc == EXIT_FAIL and out["action"] == "drain"
    cluster.gpus[0]["throttle"] = 0x4
    rc, out, _ = cluster.run("--slurm-health", "--passive", *hooks)
    assert rc == EXIT_PASS and out["action"] == "resume"
    assert log.read_text().splitlines() == ["drain gpu07 umprov: gpu0 throttle 0x80",
                                            "resume gpu07"]
    assert not (tmp_path / "drained").exists()
