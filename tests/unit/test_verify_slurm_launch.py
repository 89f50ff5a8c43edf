"""`umprov verify --multi-node --launcher slurm` without Slurm: the srun line, node names, the
task each node runs, and the orchestration against fake engines and a fake submit host."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import EngineHost, FakeContainer, Fleet, fake_fleet
from umprov.errors import (
    ConfigError,
    EnvironmentProblem,
    ExitCode,
    InventoryError,
    SchedulerFailed,
    Unreachable,
)
from umprov.verify.multinode import verify_multinode
from umprov.verify.multinode_plan import WORKDIR, MultiNodeOptions
from umprov.verify.slurm_launch import (
    MARK,
    TASK,
    WRONG_NODE,
    SlurmLauncher,
    SlurmOptions,
    check_nodes,
    compute_hosts,
    node_name,
    pick_submit_host,
    srun_command,
    srun_error,
    task_marks,
    task_script,
)

NODE_LINE = "NodeName={name} Arch=x86_64 CPUTot=1 State={state} Partitions=lab{reason}"


def scontrol_out(**nodes: str) -> str:
    """``scontrol -o show node`` lines: name -> "STATE" or "STATE|reason"."""
    lines = []
    for name, spec in nodes.items():
        state, _, reason = spec.partition("|")
        lines.append(NODE_LINE.format(name=name, state=state,
                                      reason=f" Reason={reason} [root@2026-12-02T05:00:00]"
                                      if reason else ""))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Pure parts


def test_srun_command_asks_for_exactly_these_nodes() -> None:
    cmd = srun_command(job_name="umprov-ab12", nodes=["n1", "n2", "n3"], time_limit_s=181,
                       wait_s=60, container="umprov-mn-ab12",
                       opts=SlurmOptions(partition="gpu", account="ops"))
    assert cmd[0] == "srun"
    split = cmd.index("docker")
    srun = set(cmd[1:split])
    assert {"--job-name=umprov-ab12", "--nodes=3", "--nodelist=n1,n2,n3", "--ntasks=3",
            "--ntasks-per-node=1", "--time=4", "--immediate=60", "--label", "--exclusive",
            "--kill-on-bad-exit=0", "--partition=gpu", "--account=ops"} == srun
    assert cmd[split:split + 2] == ["docker", "exec"]
    passed = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"]
    assert passed == ["SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURM_NNODES",
                      "SLURMD_NODENAME"]  # names only: docker takes the task's values
    assert cmd[-3:] == ["umprov-mn-ab12", "sh", f"{WORKDIR}/{TASK}"]
    plain = srun_command(job_name="j", nodes=["a"], time_limit_s=10, wait_s=0.5,
                         container="c", opts=SlurmOptions())
    assert "--time=1" in plain and "--immediate=1" in plain
    assert not any(a.startswith(("--partition", "--account")) for a in plain)


def test_node_name_is_the_roles_rule() -> None:
    assert node_name({}, "gpu-07.cluster.example") == "gpu-07"
    assert node_name({"slurm_gpu_health_node_name": "nid0007"}, "gpu-07") == "nid0007"
    assert node_name({"slurm_gpu_health_node_name": ""}, "lab-b1-1") == "lab-b1-1"


def test_submit_host_and_the_jobs_hosts() -> None:
    ctl = EngineHost("ctl", groups=("slurm_controller",))
    a, b = (EngineHost(n, groups=("slurm_compute",)) for n in ("a", "b"))
    plain = EngineHost("c")
    assert pick_submit_host([a, ctl, b], None, "hosts.yml") is ctl
    assert pick_submit_host([a, ctl, b], "b", "hosts.yml") is b
    with pytest.raises(InventoryError, match="hosts.yml: no host in group 'slurm_controller'"):
        pick_submit_host([a, b], None, "hosts.yml")
    with pytest.raises(InventoryError, match="--slurm-submit-host 'x' is not an inventory"):
        pick_submit_host([a, b], "x", "hosts.yml")
    assert compute_hosts([ctl, a, b, plain], limited=False) == [a, b]
    assert compute_hosts([ctl, plain], limited=False) == [plain]
    assert compute_hosts([ctl, plain], limited=True) == [ctl, plain]


def test_nodes_unknown_to_slurm_or_out_of_service_are_named() -> None:
    out = scontrol_out(n1="IDLE", n2="IDLE+DRAIN|disk swap", n3="DOWN+NOT_RESPONDING")
    assert [n.name for n in check_nodes(out, {"n1": "gpu1"})] == ["n1"]
    with pytest.raises(ConfigError) as unknown:
        check_nodes(out, {"n1": "gpu1", "n9": "gpu9"})
    assert "gpu9 (node 'n9')" in str(unknown.value) and "gpu1" not in str(unknown.value)
    assert unknown.value.exit_code == ExitCode.CONFIG
    with pytest.raises(SchedulerFailed) as drained:
        check_nodes(out, {"n1": "gpu1", "n2": "gpu2", "n3": "gpu3"})
    text = str(drained.value)
    assert "gpu2 (node n2 IDLE+DRAIN: disk swap)" in text and "gpu3 (node n3 DOWN" in text
    assert drained.value.exit_code == ExitCode.SCHEDULER == 14


def test_task_script_runs_torchrun_and_keeps_its_output(tmp_path: Path) -> None:
    script = task_script(host="gpu1", node="n1", torchrun_script="echo ranks ran; exit 3",
                         workdir=str(tmp_path))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1"}
    res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 3
    marks = task_marks(f"0: {res.stdout}")
    assert marks["gpu1"]["job"] == "77" and marks["gpu1"]["node"] == "n1"
    assert float(marks["gpu1"]["at"]) > 0
    assert (tmp_path / "torchrun.log").read_text() == "ranks ran\n"
    assert (tmp_path / "torchrun.rc").read_text().strip() == "3"
    wrong = subprocess.run(["sh", "-c", script], env={**env, "SLURMD_NODENAME": "n2"},
                           capture_output=True, text=True, check=False)
    assert wrong.returncode == WRONG_NODE and "task of gpu1 (node n1) on node n2" in wrong.stdout


def test_srun_error_is_one_line() -> None:
    out = ("srun: Requested partition configuration not available now\n"
           "srun: error: Unable to allocate resources: Invalid node name specified\n")
    assert srun_error(out, 1) == ("srun failed (exit 1): srun: error: Unable to allocate "
                                  "resources: Invalid node name specified")
    assert srun_error("", None) == "srun failed (no answer before its deadline)"
    assert task_marks(out) == {}


# ---------------------------------------------------------------------------------------------
# Orchestration: fake engines on the hosts, a fake Slurm on the submit host


def events(rank: int, world: int) -> str:
    evs = [{"ev": "started", "rank": rank, "at": 1000.5},
           {"ev": "joined", "init_s": 0.4, "torch": "2.13.0", "at": 1001.0},
           {"ev": "check", "check": "multinode.all_reduce", "wrong": 0, "elements": 8,
            "world": world},
           {"ev": "check", "check": "multinode.all_gather", "wrong": 0, "elements": 2,
            "world": world},
           {"ev": "busbw", "bytes": 1 << 24, "reps": 3, "seconds": 0.5, "algbw": 0.03,
            "busbw": 0.03},
           {"ev": "collectives", "seconds": 1.0, "at": 1002.0}, {"ev": "done"}]
    return "\n".join(json.dumps(e) for e in evs)


class Cluster:
    """Hosts whose containers answer as torchrun left them, and a submit host whose srun runs
    each node's task script (checking it was copied in) and says what Slurm says."""

    def __init__(self, names: list[str], fleet_log: list[str]) -> None:
        self.names = names
        self.log = fleet_log
        self.nodes = {n: "IDLE" for n in names}
        self.missing_tools = ""
        self.srun_answer: tuple[int, str] | None = None
        self.interrupt = False
        self.lost = False
        self.cancelled = threading.Event()
        self.ran: set[str] = set()

    def exec_hook(self, box: FakeContainer, text: str) -> tuple[int, str] | None:
        rank = self.names.index(box.host)
        if text.startswith("sh -c cd /tmp/umprov-mn ||"):  # the SSH launcher's torchrun
            self.ran.add(box.host)
            return 0, "torchrun output\n"
        if "torchrun.rc" in text:
            return 0, "0\n===\ntorchrun output\n" if box.host in self.ran else "===\n"
        if "for f in rank.*" in text and box.host in self.ran:
            return 0, f"### rank.{rank}\n{events(rank, len(self.names))}\n"
        return None

    def answer(self, fleet: Fleet, command: str) -> tuple[int, str, str]:
        self.log.append(f"ssh {command.split()[0]}")
        if command.startswith("for t in"):
            return 0, self.missing_tools, ""
        if command.startswith("scontrol"):
            return 0, scontrol_out(**self.nodes), ""
        if command.startswith("scancel"):
            if self.lost:
                self.lost = False  # the old connection is gone; a new one works
                raise OSError("Socket is closed")
            self.cancelled.set()
            return 0, "", ""
        assert command.startswith("srun ") and command.endswith(" 2>&1")
        if self.interrupt:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            self.cancelled.wait(30)
            return 1, "srun: Job step aborted\n", ""
        if self.srun_answer:
            return self.srun_answer[0], self.srun_answer[1], ""
        if self.lost:
            raise OSError("Socket is closed")
        argv = shlex.split(command[:-5])
        nodes = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        lines = []
        for i, node in enumerate(nodes):
            box = fleet.containers[node]
            assert argv[-3] == box.name  # the container the task execs into
            script = box.files[f"{WORKDIR}/{TASK}"].decode()
            assert f"[ \"$SLURMD_NODENAME\" = {node} ]" in script and "--rdzv-endpoint" in script
            self.ran.add(node)
            lines.append(f"{i}: {MARK} job=4242 node={node} host={node} at=1000.0")
        return 0, "\n".join(lines) + "\n", ""


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Cluster, Fleet]:
    import umprov.hosts.ssh

    names = ["n1", "n2"]
    holder: dict[str, Cluster] = {}
    fleet = fake_fleet(monkeypatch, tmp_path, down=set(),
                       exec_hook=lambda box, text: holder["c"].exec_hook(box, text))
    holder["c"] = Cluster(names, fleet)
    monkeypatch.setattr(umprov.hosts.ssh, "connect", lambda host, **_kw: object())
    monkeypatch.setattr(umprov.hosts.ssh, "run_command",
                        lambda _client, command, **_kw: holder["c"].answer(fleet, command))
    return holder["c"], fleet


HOSTS = [EngineHost("n1", "10.0.0.1"), EngineHost("n2", "10.0.0.2")]
OPTS = MultiNodeOptions(backend="gloo", timeout=5)


def slurm_run() -> list[dict]:
    return verify_multinode(HOSTS, OPTS, launcher=SlurmLauncher(EngineHost("ctl")))


def records(docs: list[dict]) -> list[tuple[Any, ...]]:
    return [(d["host"], r["check"], r["verdict"], r.get("measured"))
            for d in docs for r in d["records"]]


def removed_all(fleet: Fleet) -> bool:
    return sorted(x.split()[1].split(":")[0] for x in fleet if x.startswith("removed")) == [
        "n1", "n2"]


def test_slurm_gives_the_records_of_the_ssh_launcher(cluster: tuple[Cluster, Fleet]) -> None:
    c, fleet = cluster
    over_ssh = verify_multinode(HOSTS, OPTS)
    c.ran.clear()
    del fleet[:]
    over_slurm = slurm_run()
    assert records(over_slurm) == records(over_ssh)
    assert {r[2] for r in records(over_slurm)} == {"pass", "skip"}  # gloo: busbw not judged
    for doc in over_slurm:
        facts = doc["facts"]
        assert facts["launcher"] == "slurm" and facts["slurm_job_id"] == "4242"
        assert facts["slurm_node"] == doc["host"] and facts["slurm_submit_host"] == "ctl"
        assert facts["rendezvous"] == "10.0.0.1:29400"  # the first host, as over SSH
    assert over_ssh[0]["facts"]["launcher"] == "ssh"
    assert removed_all(fleet)
    assert fleet.index("ssh scontrol") < fleet.index("ssh srun") < fleet.index(
        next(x for x in fleet if x.startswith("removed")))


def test_srun_refused_is_one_line_and_cleans_up(cluster: tuple[Cluster, Fleet]) -> None:
    c, fleet = cluster
    c.srun_answer = (1, "srun: error: Unable to allocate resources: Requested nodes are busy\n")
    with pytest.raises(SchedulerFailed) as err:
        slurm_run()
    assert str(err.value) == ("ctl: srun failed (exit 1): srun: error: Unable to allocate "
                              "resources: Requested nodes are busy")
    assert removed_all(fleet) and "ssh scancel" not in fleet  # srun ended: nothing to cancel


def test_srun_whose_end_was_not_seen_is_cancelled(cluster: tuple[Cluster, Fleet]) -> None:
    """The connection lost while srun ran: the job may still hold the nodes, so it is
    cancelled (over a new connection) before the containers go."""
    c, fleet = cluster
    c.lost = True
    with pytest.raises(Unreachable, match=r"ctl: the connection was lost while srun ran "
                       r"\(Socket is closed\)"):
        slurm_run()
    assert c.cancelled.is_set()
    first_removed = next(i for i, x in enumerate(fleet) if x.startswith("removed"))
    assert fleet.index("ssh scancel") < first_removed and removed_all(fleet)


def test_node_unknown_to_slurm_stops_before_srun(cluster: tuple[Cluster, Fleet]) -> None:
    c, fleet = cluster
    c.nodes = {"n1": "IDLE"}
    with pytest.raises(ConfigError, match=r"not Slurm nodes: n2 \(node 'n2'\)"):
        slurm_run()
    assert "ssh srun" not in fleet and removed_all(fleet)


def test_missing_slurm_commands_stop_before_any_container(
        cluster: tuple[Cluster, Fleet]) -> None:
    c, fleet = cluster
    c.missing_tools = "srun\nscancel\n"
    with pytest.raises(EnvironmentProblem, match="ctl: no srun, scancel on the Slurm submit"):
        slurm_run()
    assert not any(x.startswith("started") for x in fleet)


def test_ctrl_c_cancels_the_job_then_removes_the_containers(
        cluster: tuple[Cluster, Fleet]) -> None:
    c, fleet = cluster
    c.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        slurm_run()
    assert c.cancelled.is_set()
    first_removed = next(i for i, x in enumerate(fleet) if x.startswith("removed"))
    assert fleet.index("ssh scancel") < first_removed and removed_all(fleet)


def test_task_that_did_not_start_names_its_host(cluster: tuple[Cluster, Fleet],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    c, fleet = cluster
    real = c.answer

    def n2_has_no_docker(fl: Fleet, command: str) -> tuple[int, str, str]:
        rc, out, err = real(fl, command)
        if command.startswith("srun"):
            c.ran.discard("n2")
            out = out.splitlines()[0] + "\n1: docker: permission denied\nsrun: error: n2: " \
                "task 1: Exited with exit code 126\n"
            return 126, out, err
        return rc, out, err

    monkeypatch.setattr(c, "answer", n2_has_no_docker)
    docs = {d["host"]: d for d in slurm_run()}
    join = {r["check"]: r for r in docs["n2"]["records"]}["multinode.join"]
    assert join["verdict"] == "fail"
    assert join["detail"].startswith("did not join: the Slurm task did not start on node n2")
    assert "exit code 126" in join["detail"]
    assert removed_all(fleet)


def test_cli_slurm_options_need_the_slurm_launcher(tmp_path: Path, umprov_cli: Any) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a: {ansible_host: 10.0.0.1}\n"
                   "    b: {ansible_host: 10.0.0.2}\n")
    res = umprov_cli("verify", str(inv), "--launcher", "slurm")
    assert res.exit_code == 4 and "apply to --multi-node" in res.stderr
    res = umprov_cli("verify", str(inv), "--multi-node", "--slurm-partition", "p")
    assert res.exit_code == 4 and "apply to --launcher slurm" in res.stderr
    res = umprov_cli("verify", str(inv), "--multi-node", "--launcher", "slurm")
    assert res.exit_code == 3, res.stderr
    assert "no host in group 'slurm_controller'" in res.stderr and "\n" not in res.stderr.strip()
