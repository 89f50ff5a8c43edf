"""`umprov verify --multi-node --launcher slurm` on the lab's real Slurm (`lab up --slurm`):
srun on a node starts torchrun in each host's throwaway container; the records are those of
the SSH launcher on the same hosts, and Ctrl-C leaves no job in Slurm and no container.

The Slurm lab's image has no Docker: the module provisions it (`provision --only docker`) and
deploys the lab's PyTorch image, as tests/lab/test_multinode.py's hosts have them. The lab's
controller is not an inventory host; srun runs on the first node (`--slurm-submit-host`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from tests.lab.conftest import LAB_IMAGE_TAG, SlurmLab, cli, sigint_when, umprov_argv

pytestmark = [pytest.mark.lab, pytest.mark.cost(500)]

SLURM_LAB = "pytest-slurm-mn"
SLURM_HOSTS = 2
SLURM_SEED_ENGINES = True  # deploy finds the lab image on the hosts: the push is not our subject
TIMEOUT = 60


@pytest.fixture(scope="module")
def lab(slurm_lab: SlurmLab, request: pytest.FixtureRequest) -> SlurmLab:
    inventory = str(slurm_lab.inventory)
    prov = cli("provision", inventory, "--only", "docker", "--json")
    assert prov.exit_code == 0, prov.stdout[-2000:] + prov.stderr[-2000:]
    dep = cli("deploy", inventory, "--image", LAB_IMAGE_TAG, "--authorized-key",
              str(slurm_lab.key_file.with_suffix(".pub")), "--push", "--json")
    assert dep.exit_code == 0, dep.stderr[-2000:]
    assert [h["pushed_bytes"] for h in json.loads(dep.stdout)["hosts"]] == [0, 0]
    return slurm_lab


def verify(lab: SlurmLab, *extra: str) -> tuple[Any, dict[str, dict], float]:
    t0 = time.monotonic()
    result = cli("verify", str(lab.inventory), "--multi-node", "--backend", "gloo",
                 "--timeout", str(TIMEOUT), "--json", *extra)
    wall = time.monotonic() - t0
    data = json.loads(result.stdout) if result.stdout.strip() else {"hosts": []}
    return result, {d["host"]: d for d in data["hosts"]}, wall


def slurm_args(lab: SlurmLab) -> list[str]:
    return ["--launcher", "slurm", "--slurm-submit-host", lab.nodes[0]]


def jobs(lab: SlurmLab) -> list[str]:
    return lab.run("squeue", "-h", "-o", "%i %j %T").stdout.split("\n")[:-1]


def leftovers(lab: SlurmLab) -> list[str]:
    """Throwaway containers or torchrun processes on any node."""
    found = []
    for node in lab.nodes:
        out = lab.ssh(node, "docker ps -aq --filter label=org.umprov.multinode; "
                            "ps -eo args | grep '[t]orch.distributed.run' || true").stdout
        if out.strip():
            found.append(f"{node}: {out.strip()}")
    return found


def same_records(doc: dict) -> list[tuple[Any, ...]]:
    """What must not depend on the launcher: checks, verdicts, exact-value results."""
    return [(r["check"], r["verdict"], r["measured"] if r["unit"] == "wrong elements" else None)
            for r in doc["records"]]


def test_slurm_gives_the_records_of_ssh(lab: SlurmLab) -> None:
    over_ssh, ssh_hosts, ssh_wall = verify(lab)
    assert over_ssh.exit_code == 0, over_ssh.stderr[-3000:]
    over_slurm, hosts, wall = verify(lab, *slurm_args(lab))
    assert over_slurm.exit_code == 0, over_slurm.stderr[-3000:]
    assert set(hosts) == set(ssh_hosts) == set(lab.nodes)
    job_ids = set()
    for name, doc in hosts.items():
        assert same_records(doc) == same_records(ssh_hosts[name]), (doc, ssh_hosts[name])
        assert {r["check"] for r in doc["records"]} == {
            "multinode.join", "multinode.all_reduce", "multinode.all_gather", "multinode.busbw"}
        facts = doc["facts"]
        assert facts["launcher"] == "slurm" and facts["slurm_node"] == name
        assert facts["world_size"] == 2 and facts["rendezvous"] == ssh_hosts[name]["facts"][
            "rendezvous"]
        job_ids.add(facts["slurm_job_id"])
    assert len(job_ids) == 1 and job_ids.pop().isdigit()
    assert jobs(lab) == [] and leftovers(lab) == []
    print(f"\nmulti-node gloo, 2 hosts: ssh {ssh_wall:.1f} s, slurm {wall:.1f} s")


def test_ctrl_c_cancels_the_job_and_removes_the_containers(lab: SlurmLab) -> None:
    proc = subprocess.Popen(  # noqa: S603
        umprov_argv("verify", str(lab.inventory), "--multi-node", "--backend", "gloo",
                    "--timeout", str(TIMEOUT), *slurm_args(lab)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    err = sigint_when(proc, lambda: any(" umprov-" in j for j in jobs(lab)), within=120,
                      exit_within=120, what="Slurm job")
    gone = time.monotonic() + 30  # scancel is asynchronous: the job goes through COMPLETING
    while jobs(lab) and time.monotonic() < gone:
        time.sleep(1)
    assert jobs(lab) == [], err[-2000:]
    assert leftovers(lab) == []


def test_a_node_out_of_service_is_named_before_any_job(lab: SlurmLab) -> None:
    node = lab.nodes[1]
    lab.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=disk swap")
    try:
        result, _hosts, _wall = verify(lab, *slurm_args(lab))
    finally:
        lab.run("scontrol", "update", f"nodename={node}", "state=resume")
    assert result.exit_code == 14, result.stderr[-2000:]
    assert f"{node} (node {node} IDLE+DRAIN: disk swap)" in result.stderr
    assert jobs(lab) == [] and leftovers(lab) == []
