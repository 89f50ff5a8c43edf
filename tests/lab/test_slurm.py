"""A real Slurm cluster in the lab (`umprov lab up --slurm`): Debian 12's slurmctld and slurmd,
and umprov's rolling change and health check acting through them.

One 4-host Slurm lab serves the module (tests/lab/conftest.py's `slurm_lab`). The lab hosts have
no GPU: a healthy node is one whose passive checks pass expecting none (the inventory's
`umprov_expected_gpus: 0`); a host given `umprov_expected_gpus: 1` in a copy of the inventory is
a sick node, found by the real checks, no result faked. Every verdict is read back from Slurm
itself (`sinfo`, on the controller). Each test first puts every node back in service, so they
run alone too (`-k`); the health check test runs last (it leaves HealthCheckInterval short).
About 10 minutes from no lab on a loaded 2-core machine, 6 of them the first rollout's apt work
(UMPROV_KEEP_LAB=1 keeps the lab for the next run). docs/slurm.md says what each test shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import REPO, _Boundary
from tests.lab.conftest import SlurmLab, sigint_when, umprov_argv

pytestmark = [pytest.mark.lab, pytest.mark.cost(580)]

SLURM_LAB = "pytest-slurm"
SLURM_HOSTS = 4


def test_lab_up_slurm_gives_a_cluster_whose_nodes_are_idle_and_run_jobs(slurm_lab: SlurmLab):
    assert slurm_lab.nodes_now() == {n: ("idle", "") for n in slurm_lab.nodes}
    # a job through munge and slurmctld, from a node as the lab user
    ran = slurm_lab.ssh(slurm_lab.nodes[0], f"srun -N {SLURM_HOSTS} hostname")
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.split()) == sorted(slurm_lab.nodes)


def test_a_restarted_host_comes_back_to_the_cluster_by_itself(slurm_lab: SlurmLab):
    # munged and slurmd are enabled units, and ReturnToService=2 takes the node back
    node, container = slurm_lab.nodes[-1], slurm_lab.up["hosts"][-1]["container"]
    subprocess.run(["docker", "restart", "-t", "5", container], check=True, capture_output=True)
    deadline = time.monotonic() + 90
    while slurm_lab.nodes_now().get(node) != ("idle", "") and time.monotonic() < deadline:
        time.sleep(1)
    assert slurm_lab.nodes_now()[node] == ("idle", "")
    # slurmctld reaches it again (a cached old address would leave it `idle*` later)
    done = slurm_lab.run("srun", "-w", node, "-t", "1", "hostname")
    assert done.stdout.strip() == node, done


# -- rolling changes (umprov provision --rolling), read back from sinfo
def inventory_with(slurm_lab: SlurmLab, folder: Path, sick: list[str]) -> Path:
    """A copy of the lab's inventory where the ``sick`` nodes expect a GPU they do not have."""
    inv = yaml.safe_load(slurm_lab.inventory.read_text())
    hosts = inv["all"]["children"]["slurm_compute"]["hosts"]
    for node in sick:
        hosts[node] = {"umprov_expected_gpus": 1}
    path = folder / f"sick-{len(sick)}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def in_service(slurm_lab: SlurmLab) -> None:
    """Every node back in service, whatever an earlier test left (scontrol, as an admin)."""
    for node, (state, _reason) in slurm_lab.nodes_now().items():
        if state != "idle":
            slurm_lab.run("scontrol", "update", f"nodename={node}", "state=resume")
    deadline = time.monotonic() + 60
    while set(slurm_lab.nodes_now().values()) != {("idle", "")}:
        assert time.monotonic() < deadline, slurm_lab.nodes_now()
        time.sleep(1)


def rolling(inventory: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`umprov provision INVENTORY --rolling --json ARGS`: its exit code and JSON."""
    done = CliRunner().invoke(_Boundary("umprov"), ["provision", str(inventory), "--rolling",
                                                    "--json", *args], catch_exceptions=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.exit_code, json.loads(done.stdout)


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def assert_sinfo_agrees(slurm_lab: SlurmLab, doc: dict[str, Any]) -> None:
    """Host by host: drained with umprov's reason where the summary says drained, else idle.
    A `*` that stays past its allowance (nodes_responding) fails the comparison."""
    now = slurm_lab.nodes_responding()
    for host, said in by_host(doc).items():
        if said["action"] in ("drained", "left drained"):
            assert now[host] == ("drained", said["reason"]), (host, said)
        else:
            assert now[host] == ("idle", ""), (host, said)


GPU_COUNT_REASON = "umprov: host gpu_count "  # the sick host's reason begins so


def test_rolling_change_stops_at_the_sick_hosts_batch_with_a_zero_failure_budget(
        slurm_lab: SlurmLab, tmp_path: Path):
    in_service(slurm_lab)
    one, sick, three, four = slurm_lab.nodes
    inventory = inventory_with(slurm_lab, tmp_path, [sick])
    # a real change (the container toolkit from the lab's repository), batches 1 + 2 + 1
    rc, doc = rolling(inventory, "--only", "toolkit", "--batch", "2", "--max-fail-percent", "0")
    assert rc == 10, doc
    assert doc["batches"] == [[one], [sick, three]]  # the canary first; no third batch
    hosts = by_host(doc)
    assert hosts[one]["action"] == "resumed" and hosts[one]["verified"] == "passive pass"
    assert "toolkit" in hosts[one]["changed"]
    assert hosts[sick]["action"] == "drained" and hosts[sick]["verified"] == "passive fail"
    assert hosts[sick]["reason"].startswith(GPU_COUNT_REASON), hosts[sick]
    assert hosts[three]["action"] == "resumed"  # same batch as the sick host, passed its gate
    assert hosts[four]["action"] == "not reached"
    assert_sinfo_agrees(slurm_lab, doc)


def test_rolling_change_goes_on_past_the_sick_host_within_its_failure_budget(
        slurm_lab: SlurmLab, tmp_path: Path):
    in_service(slurm_lab)
    one, sick, three, four = slurm_lab.nodes
    inventory = inventory_with(slurm_lab, tmp_path, [sick])
    rc, doc = rolling(inventory, "-e", "umprov_rolling_roles=[]", "--batch", "2",
                      "--max-fail-percent", "50")
    assert rc == 10, doc  # a host failed, though the rollout went on
    assert doc["batches"] == [[one], [sick, three], [four]]
    hosts = by_host(doc)
    assert hosts[sick]["action"] == "drained"
    assert hosts[sick]["reason"].startswith(GPU_COUNT_REASON), hosts[sick]
    assert [hosts[n]["action"] for n in (one, three, four)] == ["resumed"] * 3
    assert_sinfo_agrees(slurm_lab, doc)


def test_an_administrators_drain_outlasts_a_rollout_and_a_passing_health_check(
        slurm_lab: SlurmLab):
    in_service(slurm_lab)
    node = slurm_lab.nodes[-1]
    slurm_lab.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=disk swap")
    rc, doc = rolling(slurm_lab.inventory, "--limit", node, "-e", "umprov_rolling_roles=[]")
    assert rc == 0, doc
    said = by_host(doc)[node]
    assert (said["action"], said["verified"], said["reason"]) == (
        "left drained", "passive pass", "disk swap")
    # the health check as slurmd runs it (no arguments): it passes and leaves the node alone
    check = slurm_lab.ssh(node, "sudo /usr/local/sbin/umprov-gpu-health")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout.splitlines()[-1])["action"] == "leave"
    assert slurm_lab.nodes_now()[node] == ("drained", "disk swap")


def held(now: dict[str, tuple[str, str]], two: str, busy: str) -> bool:
    """Batch 2 holds both its nodes: ``two`` drained, ``busy`` draining (its job runs)."""
    return now[two][0] in ("drained", "draining") and now[busy][0] == "draining"


# Not `serial`: the signal goes to a umprov process in a session of its own and nothing here is
# bounded in time by seconds, so it shares the module's Slurm lab instead of bringing up its own.
def test_sigint_while_a_batch_waits_for_a_job_leaves_every_node_with_a_reason_then_a_rerun_ends(
        slurm_lab: SlurmLab):
    in_service(slurm_lab)
    one, two, busy, _four = slurm_lab.nodes
    job = slurm_lab.run("sbatch", "--parsable", "-w", busy, "-o", "/dev/null", "--wrap",
                        "sleep 600").stdout.strip()
    args = ["provision", str(slurm_lab.inventory), "--rolling", "-e", "umprov_rolling_roles=[]",
            "--batch", "2"]
    proc = subprocess.Popen(umprov_argv(*args), stdin=subprocess.DEVNULL,  # noqa: S603
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        # batch 2 holds both its nodes, and waits for the job on one (Slurm: draining). Each
        # node's hold is its own command over SSH: the busy node's can land first, so the signal
        # waits for both (sent after the busy one alone, it found the other not yet held).
        err = sigint_when(proc, lambda: held(slurm_lab.nodes_now(), two, busy), within=300,
                          exit_within=60, what=f"{two} and {busy} held")
        now = slurm_lab.nodes_now()
        assert now[one] == ("idle", "")  # the canary: done before the signal
        for node in (two, busy):
            assert now[node][0] in ("drained", "draining"), now
            assert now[node][1].startswith("umprov: rolling driver change "), now
            assert f"{node} (batch 2)" in err, err[-3000:]
        assert all(reason for state, reason in now.values() if state.startswith("drain")), now
    finally:  # the job ends (a failure above must not leave the next test a busy node)
        slurm_lab.run("scancel", job)
    # a re-run takes every node back into service
    rc, doc = rolling(slurm_lab.inventory, "-e", "umprov_rolling_roles=[]", "--batch", "2")
    assert rc == 0, doc
    assert set(slurm_lab.nodes_responding().values()) == {("idle", "")}
    assert_sinfo_agrees(slurm_lab, doc)


# -- the health check (role slurm_gpu_health) as Slurm runs it
HEALTH_INTERVAL_S = 15
# The check's own run: seconds on a quiet machine; on a 2-core machine at load 40 (other labs
# beside) runs of 5 s to over slurmd's 60 s limit were seen, and a drain 42 s after the change.
HEALTH_SLACK_S = 30
HEALTH_PLAY = [{"name": "The GPU health check on the Slurm nodes", "hosts": "slurm_compute",
                "become": True, "gather_facts": False, "roles": ["slurm_gpu_health"]}]


def apply_health_check(inventory: Path, folder: Path, node: str) -> None:
    """slurm_gpu_health on ``node`` (or a group) through plain ansible-playbook, with a short
    interval."""
    import sys

    play = folder / "health.yml"
    play.write_text(yaml.safe_dump(HEALTH_PLAY, sort_keys=False))
    done = subprocess.run(  # noqa: S603
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(play),
         "--limit", node, "-e", f"slurm_gpu_health_interval={HEALTH_INTERVAL_S}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles")})
    assert done.returncode == 0, done.stdout[-3000:]


def turned_at(slurm_lab: SlurmLab, node: str) -> float:
    """When the node's expectation changed: the health check program's mtime (epoch s)."""
    done = slurm_lab.ssh(node, "stat -c %Y /usr/local/sbin/umprov-gpu-health")
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def wait_for(slurm_lab: SlurmLab, node: str, wanted: tuple[str, str] | str, limit: float) -> None:
    """Until sinfo shows ``node`` as ``wanted`` ((state, reason), or drained with a reason
    that begins so); fails after ``limit`` seconds."""
    def ok(state: str, reason: str) -> bool:
        if isinstance(wanted, tuple):
            return (state, reason) == wanted
        return state == "drained" and reason.startswith(wanted)

    deadline = time.monotonic() + limit
    while not ok(*slurm_lab.nodes_now()[node]):
        assert time.monotonic() < deadline, (node, slurm_lab.nodes_now()[node])
        time.sleep(0.5)


def test_the_health_check_drains_a_sick_node_within_its_interval_and_resumes_it_healed(
        slurm_lab: SlurmLab, tmp_path: Path):
    # Every node's health program as the lab's inventory says first: a rollout over a planted
    # sick host left that host's program expecting a GPU, and Slurm now runs it every interval.
    apply_health_check(slurm_lab.inventory, tmp_path, "slurm_compute")
    in_service(slurm_lab)
    sick = slurm_lab.nodes[2]
    bound = HEALTH_INTERVAL_S + HEALTH_SLACK_S
    apply_health_check(inventory_with(slurm_lab, tmp_path, [sick]), tmp_path, sick)
    wait_for(slurm_lab, sick, GPU_COUNT_REASON, bound)
    # Slurm's own time of the drain (sinfo %H, 1 s steps) against the program's change
    at = slurm_lab.run("sinfo", "-h", "-N", "-n", sick, "-o", "%H").stdout.strip()
    drained = datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp() - turned_at(
        slurm_lab, sick)
    # healed: slurm.conf is as it was, so no reconfigure; Slurm's periodic run resumes it
    apply_health_check(slurm_lab.inventory, tmp_path, sick)
    wait_for(slurm_lab, sick, ("idle", ""), bound)
    resumed = time.time() - turned_at(slurm_lab, sick)  # an upper bound: polled
    print(f"\nHealthCheckInterval {HEALTH_INTERVAL_S} s: drained {drained:.0f} s after the "
          f"node turned sick, resumed at most {resumed:.1f} s after it was healed")
    assert drained <= bound and resumed <= bound + 5  # + ssh's own round trip
    others = {n: v for n, v in slurm_lab.nodes_now().items() if n != sick}
    assert set(others.values()) == {("idle", "")}, others
