"""Multi-node verification: one torchrun per host, c10d rendezvous on the first host.

Flow (``verify_multinode``), every stage under a deadline:

1. prepare, per host in parallel: docker SDK over verified SSH, the deployed container's image,
   a throwaway container of it with ``network_mode=host`` (the deployed one publishes ports on
   the host's loopback only, and ranks on different hosts need to reach each other's peer
   ports), the same GPU device requests, then the agent's zipapp copied in;
2. addresses: the rendezvous endpoint (``--rendezvous``, else the first host's inventory address
   and ``umprov_rendezvous_port``; a loopback inventory address, as in the lab, is replaced by
   the first host's own address seen from its container) and each host's local address (the
   one that routes to the rendezvous);
3. run: ``python -m torch.distributed.run`` per host with ``--rdzv-backend c10d``; each rank is
   the agent ``--child multinode`` and writes JSON lines (events) to a file per rank;
4. collect the event files and judge here (exact values, bus bandwidth against
   ``umprov_internode_busbw_gbps``);
5. always (success, failure, Ctrl-C): stop the launcher (Slurm: cancel the job), then remove
   every throwaway container, which ends torchrun.

Step 3 is the launcher's: ``SshLauncher`` (the default) execs torchrun in each container over
the engine's SSH connection; ``umprov.verify.slurm_launch.SlurmLauncher`` has one ``srun`` on a
submit host start a task per node that execs the same script in that node's container. Both
plan the same torchrun (``plan_torchrun``) and read the same event files (``read_ranks``).

A host that cannot be prepared never joins: it is named so, and the job is not started (the
others would only wait for it). A reachable host that does not reach the rendezvous is named by
torchrun's failure on it, the others by the join timeout.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from umprov.errors import ConfigError, UmprovError
from umprov.hosts import is_loopback
from umprov.hosts.engine import engine_error, exec_in, start_throwaway
from umprov.hosts.fanout import settle
from umprov.hosts.progress import Progress, quiet
from umprov.inventory import deployed_container, flag
from umprov.verify.bundle import AGENT_NAME, FIND_PYTHON, NO_PYTHON, copy_agent
from umprov.verify.multinode_judge import HostRun, host_reports, parse_events
from umprov.verify.multinode_plan import (
    LABEL,
    WORKDIR,
    MultiNodeOptions,
    container_kwargs,
    container_name,
    node_env,
    nproc_for,
    parse_endpoint,
    rendezvous_port,
    shell_script,
    torchrun_command,
)
from umprov.verify.report import connect_failure

START_WAIT_S = 60.0  # cleanup waits this long for a container start under way


class HostState:
    """Live state of one host during a run (client, container) beside its HostRun."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.run = HostRun(host.name, dict(getattr(host, "vars", {}) or {}))
        self.client: Any = None
        self.container: Any = None
        self.python = "python3"
        self.net: dict[str, Any] = {}
        self.run_id = ""
        # Handoff between a container start under way and cleanup (Ctrl-C mid-prepare): cleanup
        # sets ``closing`` under the lock, then waits for ``started`` before it looks.
        self.lock = threading.Lock()
        self.closing = False
        self.started = threading.Event()
        self.started.set()  # no start under way


class Launcher(Protocol):
    """Starts torchrun on every prepared host (step 3), and stops what it started."""

    name: str

    def open(self, progress: Progress) -> None:
        """Before any host is prepared: check what the launcher itself needs."""

    def launch(self, states: list[HostState], opts: MultiNodeOptions, endpoint: str,
               run_id: str, progress: Progress) -> None:
        """Run the job; fill in each host's run (rc, output, ranks)."""

    def stop(self, progress: Progress) -> None:
        """Always, before the containers go: end what was started (success, error, Ctrl-C)."""


class SshLauncher:
    """torchrun exec'd in each host's container over its engine connection."""

    name = "ssh"

    def open(self, progress: Progress) -> None:
        return None

    def launch(self, states: list[HostState], opts: MultiNodeOptions, endpoint: str,
               run_id: str, progress: Progress) -> None:
        _launch_all(states, opts, endpoint, run_id, progress)

    def stop(self, progress: Progress) -> None:
        return None  # removing the containers ends torchrun


def verify_multinode(hosts: Sequence[Any], opts: MultiNodeOptions, *,
                     progress: Progress = quiet, launcher: Launcher | None = None) -> list[dict]:
    """Run the job over ``hosts``; one host document each. Never leaves a container behind."""
    if opts.backend not in ("nccl", "gloo"):
        raise ConfigError(f"--backend {opts.backend!r}: nccl or gloo")
    if len(hosts) < 2 and not opts.rendezvous:
        raise ConfigError("--multi-node needs two or more hosts")
    started = time.monotonic()
    run_id = f"umprov-{secrets.token_hex(4)}"
    states = [HostState(h) for h in hosts]
    for st in states:
        st.run_id = run_id
    endpoint: str | None = None
    launcher = launcher or SshLauncher()
    try:
        launcher.open(progress)
        for st, res in zip(states, settle(lambda s: _prepare(s, opts, run_id, progress),
                                          states, opts.timeout + 60), strict=True):
            if isinstance(res, BaseException):
                _failed(st, "prepare", f"not ready within {opts.timeout + 60:.0f} s"
                        if isinstance(res, TimeoutError) else engine_error(res, named=True))
        ready = [s for s in states if not s.run.error]
        if len(ready) == len(states):
            endpoint = _rendezvous(states, opts)
            launcher.launch(states, opts, endpoint, run_id, progress)
    finally:
        try:
            launcher.stop(progress)
        finally:
            _cleanup(states, progress)
    first = states[0].run.vars if states else {}
    expected = first.get("umprov_internode_busbw_gbps")
    return host_reports([s.run for s in states], backend=opts.backend, endpoint=endpoint,
                        rdzv_id=run_id, timeout=opts.timeout,
                        wall_s=time.monotonic() - started, launcher=launcher.name,
                        expected_busbw=float(expected) if expected is not None else None)


def _failed(st: HostState, stage: str, why: str, hint: str = "investigate") -> None:
    st.run.stage, st.run.error, st.run.hint = stage, why, hint


def _prepare(st: HostState, opts: MultiNodeOptions, run_id: str, progress: Progress) -> None:
    """Step 1 on one host: connect, start the throwaway container beside the deployed one,
    copy the agent in and probe it; a stage that fails says why in the host's run."""
    t0 = time.monotonic()
    progress(st.run.name, "connecting")
    if not (_connect(st, opts) and _start_container(st, opts, run_id, progress)
            and _probe(st, opts)):
        return
    st.run.stage = "prepared"
    st.run.prepare_s = time.monotonic() - t0
    progress(st.run.name, f"ready ({st.run.nproc} process(es))")


def _connect(st: HostState, opts: MultiNodeOptions) -> bool:
    from umprov.hosts.engine import docker_client

    try:
        st.client = docker_client(st.host, trust_new=opts.trust_new, timeout=opts.timeout)
        st.client.ping()
    except UmprovError as exc:  # written as verify writes it; the host did not join: exit 13
        _state, detail, hint = connect_failure(exc)
        _failed(st, "connect", detail, hint)
        return False
    except Exception as exc:  # the engine is down or refuses: the host cannot join
        _failed(st, "connect", f"Docker unreachable: {engine_error(exc, named=True)}", "config")
        return False
    return True


def _start_container(st: HostState, opts: MultiNodeOptions, run_id: str,
                     progress: Progress) -> bool:
    """The run's host-network container, of the deployed container's image and devices."""
    deployed_name = deployed_container(st.run.vars)
    try:
        deployed = st.client.containers.get(deployed_name)
    except Exception:
        _failed(st, "container", f"no container {deployed_name!r} (run umprov deploy)",
                "config")
        return False
    st.run.image = (deployed.attrs.get("Config") or {}).get("Image") or deployed.image.id
    progress(st.run.name, "starting a host-network container")
    kwargs = container_kwargs(deployed.image.id, container_name(run_id), run_id,
                              deployed.attrs.get("HostConfig") or {},
                              raise_limits=flag(st.run.vars.get("umprov_container_limits"),
                                                default=True),
                              run_s=opts.run_bound())
    with st.lock:
        if st.closing:
            _failed(st, "container", "interrupted before its container started")
            return False
        st.started.clear()
    try:
        st.container = start_throwaway(st.client, **kwargs)
    except Exception as exc:
        _failed(st, "container", f"cannot start a container: {engine_error(exc, named=True)}")
        return False
    finally:
        st.started.set()
    st.run.container = st.container.name
    return True


def _probe(st: HostState, opts: MultiNodeOptions) -> bool:
    """The agent copied in, then its Python, the GPUs and the network it sees."""
    refused = copy_agent(st.container, WORKDIR,
                         {"opts.json": json.dumps(opts.worker_opts()).encode()})
    if refused:
        _failed(st, "container", f"cannot copy the agent: {refused}")
        return False
    probe = (f"{FIND_PYTHON}; " + "echo \"PY=$PY\"; "
             "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L | grep -c '^GPU ' || "
             "echo 0; \"$PY\" " + f"{WORKDIR}/{AGENT_NAME} --net-info")
    rc, out = exec_in(st.container, ["sh", "-c", probe], 60)
    if rc is None or rc == NO_PYTHON or not out.strip():
        _failed(st, "container", "no python in the image" if rc == NO_PYTHON else
                f"the probe did not answer (code {rc})", "config")
        return False
    lines = out.strip().splitlines()
    st.python = lines[0].removeprefix("PY=").strip()
    gpus = int(lines[1]) if lines[1].strip().isdigit() else 0
    with contextlib.suppress(ValueError, IndexError):
        st.net = json.loads(lines[-1])
    st.run.nproc = nproc_for(opts.backend, gpus, opts.nproc_per_node)
    if st.run.nproc < 1:
        _failed(st, "container", "no NVIDIA GPU visible in the container (use "
                "--backend gloo to test the orchestration without GPUs)", "driver")
        return False
    return True


def _rendezvous(states: list[HostState], opts: MultiNodeOptions) -> str:
    head = states[0]
    port = rendezvous_port(head.run.vars)
    if opts.rendezvous:
        addr, port = parse_endpoint(opts.rendezvous, port)
    else:
        addr = head.host.address
        if is_loopback(addr):  # reached through a tunnel or published port (the lab)
            addr = (head.net.get("route") or {}).get("ip") or addr
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def plan_torchrun(st: HostState, states: list[HostState], opts: MultiNodeOptions,
                  endpoint: str, run_id: str) -> str:
    """The ``sh -c`` script that runs torchrun on this host (both launchers): its local address
    (the one that routes to the rendezvous) and environment go into its run."""
    rdzv_host, _port_no = parse_endpoint(endpoint)
    run = st.run
    rc, out = exec_in(st.container, [st.python, f"{WORKDIR}/{AGENT_NAME}", "--net-info",
                                   rdzv_host], 60)
    with contextlib.suppress(ValueError):
        st.net = json.loads(out.strip().splitlines()[-1]) if rc == 0 else st.net
    route = st.net.get("route") or {}
    addr = st.host.address
    run.local_addr = route.get("ip") if is_loopback(addr) else addr
    run.env = node_env(run.vars, route.get("ifname"))
    cmd = torchrun_command(
        python=st.python, agent=f"{WORKDIR}/{AGENT_NAME}", nnodes=len(states), nproc=run.nproc,
        endpoint=endpoint, rdzv_id=run_id, join_timeout=opts.timeout,
        local_addr=run.local_addr, is_host=st is states[0] and not opts.rendezvous,
        opts_path=f"{WORKDIR}/opts.json", out_prefix=f"{WORKDIR}/rank")
    return shell_script(cmd, run.env, workdir=WORKDIR, deadline=opts.run_deadline())


def _launch_all(states: list[HostState], opts: MultiNodeOptions, endpoint: str, run_id: str,
                progress: Progress) -> None:
    deadline = opts.run_deadline()

    def launch(st: HostState) -> None:
        run = st.run
        script = plan_torchrun(st, states, opts, endpoint, run_id)
        run.stage, run.launched_at = "launched", time.time()
        progress(run.name, "torchrun started")
        rc, out = exec_in(st.container, ["sh", "-c", script], deadline + 30)
        run.finished_at = time.time()
        run.rc, run.output = (None if rc in (None, 124, 137) else rc), out
        run.stage = "finished"
        run.ranks = read_ranks(st)
        progress(run.name, f"torchrun ended ({'deadline' if run.rc is None else run.rc})")

    for st, res in zip(states, settle(launch, states, deadline + 120), strict=True):
        if isinstance(res, BaseException) and not st.run.ranks:
            st.run.output = st.run.output or engine_error(res, named=True)


def read_ranks(st: HostState) -> dict[int, list[dict]]:
    """Each rank's events, from the files the ranks wrote in the host's container."""
    rc, out = exec_in(st.container, ["sh", "-c", f"cd {WORKDIR} && for f in rank.*; do "
                                   "[ -f \"$f\" ] && echo \"### $f\" && cat \"$f\"; done"], 60)
    ranks: dict[int, list[dict]] = {}
    current: int | None = None
    for line in (out or "").splitlines():
        if line.startswith("### rank."):
            suffix = line.removeprefix("### rank.").strip()
            current = int(suffix) if suffix.isdigit() else None
            if current is not None:
                ranks[current] = []
        elif current is not None:
            ranks[current] += parse_events(line)
    return ranks


def _cleanup(states: list[HostState], progress: Progress) -> None:
    """Remove every throwaway container (ending torchrun and its ranks), then the clients."""

    def remove(st: HostState) -> None:
        with st.lock:
            st.closing = True  # no container start begins after this
        st.started.wait(START_WAIT_S)  # one under way ends (st.container set) or gives up
        if st.client is not None and st.container is None:  # a start still under way
            with contextlib.suppress(Exception):
                for c in st.client.containers.list(all=True, filters={"label": LABEL}):
                    if (c.labels or {}).get(LABEL) == st.run_id:
                        c.remove(force=True)
        if st.container is not None:
            try:
                st.container.remove(force=True)
                progress(st.run.name, "container removed")
            except Exception as exc:
                if "No such container" not in str(exc) and "404" not in str(exc):
                    progress(st.run.name, f"could not remove {st.run.container}: "
                             f"{engine_error(exc, named=True)}")
        if st.client is not None:
            with contextlib.suppress(Exception):
                st.client.close()

    settle(remove, states, 90)
