"""Slurm as the launcher of `umprov verify --multi-node --launcher slurm`.

umprov prepares the throwaway containers and plans each host's torchrun exactly as for the SSH
launcher (umprov/verify/multinode.py); then, over verified SSH to a submit host
(``--slurm-submit-host``, else the first host of the inventory group ``slurm_controller``), one
``srun`` asks for an allocation of those nodes, one task each, and every task ``docker exec``s
its node's planned script in that node's container. The event files are read back and judged
as for the SSH launcher: the same records, plus the job id in each host's facts.

Why torchrun with the c10d rendezvous on the first inventory host, not ranks computed from
SLURM_PROCID: both launchers then run the very same command (one plan, the same records), a
node with 8 GPUs still gets 8 ranks from one task, and the rendezvous address is the one umprov
already found to route (the lab's loopback inventory addresses included); Slurm's node order
does not matter. The sbatch script (docs/examples/multinode.sbatch), which has no umprov on the
nodes, uses Slurm's first node instead.

A node's Slurm name is ``slurm_gpu_health_node_name`` where the inventory sets it, else its short
host name as the node itself reports it: the rule of the slurm_gpu_health role's agent
(``nodehealth.short_name``). Before the job: every node must be known to Slurm (else exit 4)
and in service (else exit 14). Ctrl-C, SIGTERM or a deadline cancel the job by its name
(``scancel``) before the containers are removed.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from umprov.errors import (
    ConfigError,
    EnvironmentProblem,
    InventoryError,
    SchedulerFailed,
    Unreachable,
)
from umprov.hosts.engine import exec_in, tar_files
from umprov.hosts.fanout import settle
from umprov.hosts.progress import Progress
from umprov.verify.agent.nodehealth import short_name
from umprov.verify.agent.slurm import Node, parse_node
from umprov.verify.multinode import HostState, plan_torchrun, read_ranks
from umprov.verify.multinode_plan import WORKDIR, MultiNodeOptions, container_name

CONTROLLER_GROUP = "slurm_controller"
COMPUTE_GROUP = "slurm_compute"
NODE_NAME_VAR = "slurm_gpu_health_node_name"
TOOLS = ("srun", "scontrol", "scancel")
TASK = "slurm-task.sh"
MARK = "umprov-slurm-task"
WRONG_NODE = 96  # the task's exit code when Slurm ran it on another node than planned
# What docker exec hands from the task's environment to the script in the container.
TASK_ENV = ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURM_NNODES", "SLURMD_NODENAME")
_MARK_RE = re.compile(MARK + r" job=(\S*) node=(\S*) host=(\S*) at=(\S*)")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None


# ---------------------------------------------------------------------------------------------
# Pure parts


def pick_submit_host(hosts: Sequence[Any], name: str | None, source: str) -> Any:
    """The host srun runs on: the inventory host ``name``, else the first of slurm_controller."""
    if name:
        for host in hosts:
            if host.name == name:
                return host
        raise InventoryError(f"{source}: --slurm-submit-host {name!r} is not an inventory host")
    for host in hosts:
        if CONTROLLER_GROUP in host.groups:
            return host
    raise InventoryError(f"{source}: no host in group {CONTROLLER_GROUP!r} to run srun on "
                         "(add the Slurm controller or a login node there, or give "
                         "--slurm-submit-host)")


def compute_hosts(selected: Sequence[Any], limited: bool) -> list[Any]:
    """The job's hosts: without --limit, group slurm_compute where the inventory has one, else
    every host outside slurm_controller; with --limit, what it selected."""
    if limited:
        return list(selected)
    return ([h for h in selected if COMPUTE_GROUP in h.groups]
            or [h for h in selected if CONTROLLER_GROUP not in h.groups])


def node_name(host_vars: Any, hostname: str) -> str:
    """Slurm's name for a node: slurm_gpu_health_node_name, else the short host name."""
    configured = str((host_vars or {}).get(NODE_NAME_VAR) or "").strip()
    return configured or short_name(hostname)


def check_nodes(scontrol_out: str, wanted: dict[str, str]) -> list[Node]:
    """The wanted nodes (node -> inventory host) in ``scontrol -o show node``'s output; one-line
    errors for nodes Slurm does not know (exit 4) or keeps out of service (exit 14)."""
    known: dict[str, Node] = {}
    for line in scontrol_out.splitlines():
        with contextlib.suppress(ValueError):
            node = parse_node(line)
            known[node.name] = node
    missing = [f"{host} (node {node!r})" for node, host in wanted.items() if node not in known]
    if missing:
        raise ConfigError(f"not Slurm nodes: {', '.join(missing)}; set {NODE_NAME_VAR} to the "
                          "NodeName slurm.conf gives the host")
    out = [known[n] for n in wanted]
    bad = [f"{wanted[n.name]} (node {n.name} {n.to_dict()['state']}"
           + (f": {n.reason}" if n.reason else "") + ")"
           for n in out if n.out_of_service or n.drained]
    if bad:
        raise SchedulerFailed(f"Slurm nodes out of service: {', '.join(bad)}")
    return out


def srun_command(*, job_name: str, nodes: Sequence[str], time_limit_s: float, wait_s: float,
                 container: str, opts: SlurmOptions) -> list[str]:
    """One srun: an allocation of exactly these nodes, one task each, whose task execs the
    planned script in its node's container."""
    cmd = ["srun", f"--job-name={job_name}", f"--nodes={len(nodes)}",
           f"--nodelist={','.join(nodes)}", "--ntasks-per-node=1", f"--ntasks={len(nodes)}",
           f"--time={max(1, -(-int(time_limit_s) // 60))}", f"--immediate={max(1, int(wait_s))}",
           "--exclusive", "--kill-on-bad-exit=0", "--label"]
    if opts.partition:
        cmd.append(f"--partition={opts.partition}")
    if opts.account:
        cmd.append(f"--account={opts.account}")
    env = [arg for name in TASK_ENV for arg in ("-e", name)]
    return [*cmd, "docker", "exec", *env, container, "sh", f"{WORKDIR}/{TASK}"]


def task_script(*, host: str, node: str, torchrun_script: str, workdir: str = WORKDIR) -> str:
    """What a task runs in its node's container: check it is on the planned node, say which job
    it is, run torchrun with its output and exit code in files umprov reads back."""
    q = shlex.quote
    return (f'[ "$SLURMD_NODENAME" = {q(node)} ] || {{ echo "umprov: Slurm ran the task of '
            f'{host} (node {node}) on node $SLURMD_NODENAME"; exit {WRONG_NODE}; }}\n'
            f'echo "{MARK} job=$SLURM_JOB_ID node=$SLURMD_NODENAME host={host} '
            f'at=$(date +%s.%N)"\n'
            f"sh -c {q(torchrun_script)} > {q(workdir)}/torchrun.log 2>&1\n"
            f"rc=$?; echo $rc > {q(workdir)}/torchrun.rc; exit $rc\n")


def task_marks(srun_out: str) -> dict[str, dict[str, str]]:
    """inventory host -> {job, node, at} from the tasks' first lines in srun's output."""
    return {m.group(3): {"job": m.group(1), "node": m.group(2), "at": m.group(4)}
            for m in _MARK_RE.finditer(srun_out)}


def srun_error(srun_out: str, rc: int | None) -> str:
    """srun's own explanation: its first error line, else its last line."""
    lines = [ln.strip() for ln in srun_out.splitlines() if ln.strip()]
    said = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "")
    code = "no answer before its deadline" if rc is None else f"exit {rc}"
    return f"srun failed ({code})" + (f": {said[:300]}" if said else "")


# ---------------------------------------------------------------------------------------------
# Orchestration


class SlurmLauncher:
    """A multinode.Launcher: one srun on the submit host, over verified SSH."""

    name = "slurm"

    def __init__(self, submit: Any, opts: SlurmOptions | None = None, *,
                 trust_new: bool = False) -> None:
        self.submit = submit
        self.opts = opts or SlurmOptions()
        self.trust_new = trust_new
        self.client: Any = None
        self.job_name = ""
        self.in_flight = False  # srun started and not seen to end: stop() cancels the job

    def _run(self, command: str, timeout: float) -> tuple[int, str]:
        from umprov.hosts.ssh import run_command

        rc, out, err = run_command(self.client, command, timeout=timeout)
        return rc, out + err

    def open(self, progress: Progress) -> None:
        from umprov.hosts.ssh import connect

        progress(self.submit.name, "connecting (Slurm submit host)")
        self.client = connect(self.submit, trust_new=self.trust_new)
        _rc, out = self._run("for t in " + " ".join(TOOLS) + "; do command -v $t >/dev/null "
                             "2>&1 || echo $t; done", 30)
        if out.split():
            raise EnvironmentProblem(f"{self.submit.name}: no {', '.join(out.split())} on the "
                                     "Slurm submit host (Slurm's client commands)")
        progress(self.submit.name, "ready to submit")

    def launch(self, states: list[HostState], opts: MultiNodeOptions, endpoint: str,
               run_id: str, progress: Progress) -> None:
        nodes = self._nodes(states)

        def place_task(node: str) -> None:
            st = nodes[node]
            script = task_script(host=st.run.name, node=node,
                                 torchrun_script=plan_torchrun(st, states, opts, endpoint, run_id))
            if not st.container.put_archive(WORKDIR, tar_files({TASK: script.encode()})):
                raise SchedulerFailed(f"{st.run.name}: cannot copy the Slurm task script")
            st.run.facts = {"slurm_node": node, "slurm_submit_host": self.submit.name}

        for node, res in zip(nodes, settle(place_task, list(nodes), 90), strict=True):
            if isinstance(res, BaseException):
                raise res if isinstance(res, SchedulerFailed) else SchedulerFailed(
                    f"{nodes[node].run.name}: cannot place the Slurm task: {res}")
        limit = opts.run_deadline() + 60
        cmd = srun_command(job_name=run_id, nodes=list(nodes), time_limit_s=limit,
                           wait_s=opts.timeout, container=container_name(run_id),
                           opts=self.opts)
        self.job_name, self.in_flight = run_id, True
        for st in states:
            st.run.stage, st.run.launched_at = "launched", time.time()
        progress(self.submit.name, f"srun: job {run_id} on {len(nodes)} nodes")
        res = settle(lambda c: self._run(c, limit + opts.timeout + 30), [shlex.join(cmd)
                                                                          + " 2>&1"],
                     limit + opts.timeout + 60)[0]
        if isinstance(res, TimeoutError):  # srun's end not seen: stop() cancels the job
            rc, out = None, ""
        elif isinstance(res, BaseException):
            raise Unreachable(f"{self.submit.name}: the connection was lost while srun ran "
                              f"({' '.join(str(res).split())[:200]})")
        else:
            (rc, out), self.in_flight = res, False
        marks = task_marks(out)
        if not marks:
            raise SchedulerFailed(f"{self.submit.name}: {srun_error(out, rc)}")
        job = next(iter(marks.values()))["job"]
        progress(self.submit.name, f"Slurm job {job} ended ({'deadline' if rc is None else rc})")
        settle(lambda st: _collect(st, marks, out, job), states, 120)

    def _nodes(self, states: list[HostState]) -> dict[str, HostState]:
        """Slurm node name -> host, every node known to Slurm and in service."""
        nodes: dict[str, HostState] = {}
        for st in states:
            node = node_name(st.run.vars, str(st.net.get("hostname") or st.run.name))
            if node in nodes:
                raise ConfigError(f"{nodes[node].run.name} and {st.run.name} are both Slurm "
                                  f"node {node!r}: set {NODE_NAME_VAR}")
            nodes[node] = st
        rc, out = self._run("scontrol -o show node", 60)
        if rc != 0:
            raise SchedulerFailed(f"{self.submit.name}: scontrol show node failed: "
                                  f"{' '.join(out.split())[:300]}")
        check_nodes(out, {node: st.run.name for node, st in nodes.items()})
        return nodes

    def stop(self, progress: Progress) -> None:
        """Cancel the job if srun may still hold it (Ctrl-C, a deadline, a lost connection:
        then over a new one), then hang up."""
        try:
            if self.in_flight and self.client is not None:
                self._cancel(progress)
        finally:
            if self.client is not None:
                with contextlib.suppress(Exception):
                    self.client.close()

    def _cancel(self, progress: Progress) -> None:
        from umprov.hosts.ssh import connect

        command = f"scancel --name={shlex.quote(self.job_name)}"
        for attempt in range(2):
            try:
                if attempt:
                    self.client = connect(self.submit, trust_new=False)
                rc, out = self._run(command, 30)
            except Exception as exc:  # noqa: BLE001 - said below; the containers still go
                out, rc = " ".join(str(exc).split()), -1
                continue
            break
        self.in_flight = rc != 0
        progress(self.submit.name, f"Slurm job {self.job_name} cancelled" if rc == 0 else
                 f"could not cancel Slurm job {self.job_name} (run: {command}): {out[:200]}")


def _collect(st: HostState, marks: dict[str, dict[str, str]], srun_out: str, job: str) -> None:
    """One host's part of the job: torchrun's exit code and output, and the ranks' events."""
    run = st.run
    run.facts["slurm_job_id"] = job
    run.finished_at = time.time()
    mark = marks.get(run.name)
    if mark is None:
        node = run.facts.get("slurm_node")
        said = [ln.strip() for ln in srun_out.splitlines() if f"{node}" in ln or "error" in ln]
        run.stage, run.hint = "slurm", "investigate"
        run.error = (f"the Slurm task did not start on node {node}: "
                     + (" | ".join(said[-3:])[:300] or "srun said nothing"))
        return
    with contextlib.suppress(ValueError):
        run.launched_at = float(mark["at"])
    _rc, text = exec_in(st.container, ["sh", "-c", f"cat {WORKDIR}/torchrun.rc 2>/dev/null; "
                                       f"echo ===; cat {WORKDIR}/torchrun.log 2>/dev/null"], 60)
    code, _sep, log = (text or "").partition("===\n")
    code = code.strip()
    run.rc = int(code) if code.isdigit() and int(code) not in (124, 137) else None
    run.output, run.stage = log, "finished"
    run.ranks = read_ranks(st)
