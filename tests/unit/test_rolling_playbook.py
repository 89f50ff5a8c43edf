"""playbooks/rolling.yml: its structure, its syntax, and one real ansible-playbook run of it.

The run is plain ansible-playbook over four inventory hosts that are this machine (local
connection, no become), each with its own stand-in Slurm node (verify_fakes/fake_slurm.py) and
stand-in NVML; the change itself is no role (umprov_rolling_roles: []), the gate the passive
checks. What it proves without a lab: the canary batch first, the failure budget stopping or
not, the sick host left drained with the failing check as its reason, every other host
resumed. The lab tests with a real slurmctld are listed in docs/slurm.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import fakebin
from umprov.verify.bundle import agent_zipapp

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "rolling.yml"
FAKES = Path(__file__).resolve().parent / "verify_fakes"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.cost(150)


def plays() -> list[dict]:
    return yaml.safe_load(PLAYBOOK.read_text())


def rolling_play() -> dict:
    (play,) = [p for p in plays() if "serial" in p]
    return play


def tasks_named(tasks: list[dict]) -> dict[str, dict]:
    out = {}
    for task in tasks:
        out[task["name"]] = task
        for part in ("block", "rescue", "always"):
            out.update(tasks_named(task.get(part, [])))
    return out


# -- structure
def test_preflight_comes_first_for_every_host():
    first = plays()[0]
    assert first["ansible.builtin.import_playbook"] == "preflight.yml"


@pytest.mark.parametrize(("given", "serial", "sizes"), [
    ({}, [1, "25%"], [1, 2]),
    ({"umprov_rolling_batch": 4}, [1, "4"], [1, 4]),  # what --batch 4 sends
    ({"umprov_rolling_batch": "3,4", "umprov_rolling_canary": 2}, [2, "3", "4"], [2, 3, 4]),
    ({"umprov_rolling_batch": "50%,100%"}, [1, "50%", "100%"], [1, 4, 8]),
])
def test_batches_come_from_variables_as_ansibles_serial_reads_them(given, serial, sizes):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from ansible.utils.helpers import pct_to_int

    play = rolling_play()
    templar = Templar(loader=DataLoader(), variables=given)
    templated = templar.template(trust_as_template(play["serial"]))  # a playbook's own text
    assert list(templated) == serial
    assert [pct_to_int(size, 8) for size in templated] == sizes  # for 8 hosts
    assert play["max_fail_percentage"] == (
        "{{ umprov_rolling_max_fail_percentage | default(0) | int }}")


def test_each_host_is_held_changed_and_gated_with_a_rescue_that_keeps_it_drained():
    play = rolling_play()
    (block,) = [t for t in play["tasks"] if "block" in t]
    steps = [t["name"] for t in block["block"]]
    assert steps == ["Hold the node for the change and wait for its jobs", "Run the change",
                     "Stop when the new driver needs a reboot that is not allowed",
                     "Verify the host and resume it only on a pass"]
    rescue = block["rescue"]
    assert "--if-held" in rescue[0]["ansible.builtin.command"]["argv"]  # relabel, never drain
    assert "ansible.builtin.fail" in rescue[-1]  # the host counts against the budget
    # no always section: it would let hosts the failure budget marked recover, and the next
    # batch start (the run below shows the budget stopping the rollout)
    assert "always" not in block
    skip = tasks_named(play["tasks"])["Leave the hosts already at the target and in service"]
    assert skip["ansible.builtin.meta"] == "end_host"


def test_the_change_reuses_the_roles_and_their_reboot():
    run = tasks_named(rolling_play()["tasks"])["Run the change"]
    assert run["ansible.builtin.include_role"]["name"] == "{{ __umprov_rolling_role }}"
    assert "nvidia_driver" in run["loop"] and "nvidia_container_toolkit" in run["loop"]


def test_the_playbook_passes_the_syntax_check():
    proc = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", "-i",
                           "inventory/hosts.yml", str(PLAYBOOK)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- a real run
class Fleet:
    """Four hosts that are this machine, each its own Slurm node with one H200."""

    NAMES = ("n1", "n2", "n3", "n4")

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        fakebin.slurm(self.bin)
        self.agent = agent_zipapp(cache=tmp / "agent")
        self.sick: set[str] = set()
        for name in self.NAMES:
            self.node(name, state="IDLE", reason="")

    def node(self, name: str, **fields) -> dict:
        path = self.tmp / f"{name}.slurm.json"
        data = json.loads(path.read_text()) if path.exists() else {"name": name}
        data.update(fields)
        path.write_text(json.dumps(data))
        return data

    def inventory(self) -> Path:
        hosts = {}
        for name in self.NAMES:
            gpu = {"name": "NVIDIA H200", "uuid": f"GPU-{name}", "pci": "00000000:18:00.0",
                   "processes": [], "links": None, "throttle": 0x4,
                   "remap": [0, 1, 0, 1] if name in self.sick else [0, 0, 0, 0]}
            (self.tmp / f"{name}.nvml.json").write_text(json.dumps({"gpus": [gpu]}))
            python = fakebin.program(
                self.tmp / f"{name}.python",
                f"#!/bin/sh\nexport PATH={self.bin}:$PATH PYTHONPATH={FAKES / 'fake_nvml'} "
                f"UMPROV_FAKE_NVML={self.tmp / (name + '.nvml.json')} "
                f"UMPROV_FAKE_SLURM={self.tmp / (name + '.slurm.json')}\n"
                f'exec {sys.executable} "$@"\n')
            hosts[name] = {
                "ansible_connection": "local", "ansible_become": False,
                "ansible_python_interpreter": sys.executable,
                "umprov_expected_gpus": 1,
                "slurm_gpu_health_agent_src": str(self.agent),
                "slurm_gpu_health_install_dir": str(self.tmp / name),
                "slurm_gpu_health_program": str(self.tmp / name / "umprov-gpu-health"),
                "slurm_gpu_health_python": str(python),
                "slurm_gpu_health_node_name": name,
                "slurm_gpu_health_manage_slurm_conf": False,
                "nvidia_driver_require_gpu": False,
            }
        path = self.tmp / "hosts.yml"
        path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        return path

    def roll(self, **extra) -> subprocess.CompletedProcess:
        variables = {"umprov_rolling_roles": [], "umprov_rolling_verify": "passive",
                     "umprov_rolling_drain_timeout": 5, **extra}
        (self.tmp / "extra.json").write_text(json.dumps(variables))
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(self.tmp / "at"),
               "ANSIBLE_GATHERING": "implicit"}
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(self.inventory()),
                               "-e", f"@{self.tmp / 'extra.json'}", str(PLAYBOOK)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env=env)

    def states(self) -> dict[str, tuple[str, str]]:
        return {n: (d["state"], d["reason"]) for n in self.NAMES
                for d in [json.loads((self.tmp / f"{n}.slurm.json").read_text())]}

    @staticmethod
    def batches(proc: subprocess.CompletedProcess) -> list[list[str]]:
        """The hosts of each batch, from ansible-playbook's own output (a PLAY line a batch)."""
        plays = proc.stdout.split("PLAY [")[1:]
        return [sorted(set(re.findall(r"^\w+: \[(n\d)\]", p, re.M))) for p in plays
                if p.startswith("Roll the change")]


@pytest.fixture
def fleet(tmp_path) -> Fleet:
    return Fleet(tmp_path)


@pytest.mark.slow  # two real ansible-playbook runs: a minute or more of CPU
def test_a_rollout_within_its_budget_then_a_rerun_that_exhausts_it(fleet):
    # 1. serial [1, 2]: n1 the canary; n2 sick in the second batch, one failure of two, within
    #    a 50% budget; n4 drained by an administrator, with a passing check.
    fleet.sick = {"n2"}
    fleet.node("n4", state="IDLE+DRAIN", reason="bad DIMM B3")
    proc = fleet.roll(umprov_rolling_batch=2, umprov_rolling_max_fail_percentage=50)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert fleet.batches(proc) == [["n1"], ["n2", "n3"], ["n4"]]
    states = fleet.states()
    assert states["n2"] == ("IDLE+DRAIN", "umprov: gpu0 ecc.row_remap_failure")
    assert states["n4"] == ("IDLE+DRAIN", "bad DIMM B3")
    assert states["n1"] == states["n3"] == ("IDLE", "")
    assert "resume: the rolling change" in proc.stdout  # how each was left
    # 2. A re-run, every driver now at the target (the probe's fact, given): n1 in service and
    #    passing is left alone; n2's GPU was replaced: the check it was drained for passes and
    #    it is resumed; n3 turned sick: drained, and with no budget the rollout stops before n4.
    fleet.sick = {"n3"}
    calls = len(fleet.node("n1")["calls"])
    proc = fleet.roll(umprov_rolling_batch=2, umprov_rolling_max_fail_percentage=0,
                      nvidia_driver_current=True)
    assert proc.returncode == 2
    assert fleet.batches(proc) == [["n1"], ["n2", "n3"]]
    states = fleet.states()
    assert states["n1"] == ("IDLE", "")
    assert all(c[:2] != ["scontrol", "update"] for c in fleet.node("n1")["calls"][calls:])
    assert states["n2"] == ("IDLE", "")  # resumed by its gate, though its batch failed
    assert states["n3"] == ("IDLE+DRAIN", "umprov: gpu0 ecc.row_remap_failure")
    assert states["n4"] == ("IDLE+DRAIN", "bad DIMM B3")
