"""Multi-node verification: one torchrun per host, c10d rendezvous on the first host.

Flow (``verify_multinode``), every stage under a deadline:

1. prepare, per host in parallel: docker SDK over verified SSH, the deployed container's image,
   a throwaway container of it with ``network_mode=host`` (the deployed one publishes ports on
   the host's loopback only, and ranks on different hosts need to reach each other's peer
   ports), the same GPU device requests, then agent.py copied in;
2. addresses: the rendezvous endpoint (``--rendezvous``, else the first host's inventory address
   and ``umprov_rendezvous_port``; a loopback inventory address, as in the lab, is replaced by
   the first host's own address seen from its container) and each host's local address (the
   one that routes to the rendezvous);
3. run: ``python -m torch.distributed.run`` per host with ``--rdzv-backend c10d``; each rank is
   agent.py ``--child multinode`` and writes JSON lines (events) to a file per rank;
4. collect the event files and judge here (exact values, bus bandwidth against
   ``umprov_internode_busbw_gbps``);
5. always (success, failure, Ctrl-C): remove every throwaway container, which ends torchrun.

A host that cannot be prepared never joins: it is named so, and the job is not started (the
others would only wait for it). A reachable host that does not reach the rendezvous is named by
torchrun's failure on it, the others by the join timeout.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from umprov.errors import ConfigError, UmprovError
from umprov.verify.agent import (
    AGENT_VERSION,
    DEFAULT_RATIOS,
    MULTICAST_OFF,
    SCHEMA,
    SCHEMA_VERSION,
    exit_code_for,
    record,
    worst,
)
from umprov.verify.report import UNREACHABLE

Progress = Callable[[str, str], None]
LABEL = "org.umprov.multinode"
DEFAULT_RDZV_PORT = 29400
WORKDIR = "/tmp/umprov-mn"  # noqa: S108 (inside the throwaway container)
MODE = "multi-node"
NCCL_VARS = {
    "umprov_nccl_socket_ifname": ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
    "umprov_nccl_ib_hca": ("NCCL_IB_HCA",),
    "umprov_nccl_debug": ("NCCL_DEBUG",),
}


def _quiet(_host: str, _message: str) -> None:
    pass


@dataclass(frozen=True)
class MultiNodeOptions:
    backend: str = "nccl"
    rendezvous: str | None = None  # HOST[:PORT], overrides the inventory
    timeout: float = 120.0  # join timeout, collective timeout, container start each
    nproc_per_node: int | None = None
    busbw_bytes: int | None = None  # default: 1 GiB (nccl), 16 MiB (gloo)
    trust_new: bool = False

    def worker_opts(self) -> dict[str, Any]:
        gloo = self.backend == "gloo"
        return {
            "backend": self.backend,
            "timeout": self.timeout,
            "elements": (1 if gloo else 4) << 20,
            "busbw_bytes": self.busbw_bytes or ((16 << 20) if gloo else (1 << 30)),
            "reps": 3 if gloo else 10,
        }

    def run_deadline(self) -> float:
        """How long torchrun may run on a host: start-up, join, collectives, shutdown."""
        return 60 + self.timeout * 3


# ---------------------------------------------------------------------------------------------
# Pure parts


def parse_endpoint(text: str, default_port: int = DEFAULT_RDZV_PORT) -> tuple[str, int]:
    """HOST, HOST:PORT or [V6]:PORT."""
    text = text.strip()
    host, port = text, default_port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"rendezvous {text!r}: expected [ADDRESS]:PORT")
            port = _port(rest[1:], text)
    elif text.count(":") == 1:
        host, raw = text.split(":")
        port = _port(raw, text)
    if not host:
        raise ConfigError(f"rendezvous {text!r}: no host")
    return host, port


def _port(raw: str, text: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"rendezvous {text!r}: port must be 1-65535")
    return int(raw)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def rendezvous_port(host_vars: Mapping[str, Any]) -> int:
    raw = host_vars.get("umprov_rendezvous_port")
    return int(raw) if raw is not None else DEFAULT_RDZV_PORT


def node_env(host_vars: Mapping[str, Any], route_ifname: str | None = None) -> dict[str, str]:
    """Environment of torchrun on a host: NCCL settings from its inventory variables, multicast
    off, and gloo bound to the interface that reaches the rendezvous unless one is named."""
    env = dict(MULTICAST_OFF)
    for var, names in NCCL_VARS.items():
        value = host_vars.get(var)
        if value not in (None, ""):
            for name in names:
                env[name] = str(value)
    if route_ifname and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = route_ifname
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun_command(*, python: str, agent: str, nnodes: int, nproc: int, endpoint: str,
                     rdzv_id: str, join_timeout: float, local_addr: str | None,
                     is_host: bool | None, opts_path: str, out_prefix: str) -> list[str]:
    """PyTorch's own launcher, c10d rendezvous, no restarts; each rank is agent.py."""
    conf = [f"join_timeout={int(join_timeout)}", f"read_timeout={int(join_timeout)}",
            f"last_call_timeout={max(1, min(30, int(join_timeout) // 4))}"]
    if is_host is not None:
        conf.append(f"is_host={'true' if is_host else 'false'}")
    cmd = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
           str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
           rdzv_id, "--rdzv-conf", ",".join(conf), "--max-restarts", "0",
           "--monitor-interval", "1"]
    if local_addr:
        cmd += ["--local-addr", local_addr]
    return [*cmd, agent, "--child", "multinode", "--child-opts", opts_path,
            "--child-out", out_prefix]


def shell_script(cmd: Sequence[str], env: Mapping[str, str], *, workdir: str,
                 deadline: float) -> str:
    """The torchrun command for ``sh -c`` inside the container, under coreutils timeout."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    quoted = " ".join(shlex.quote(c) for c in cmd)
    return (f"cd {shlex.quote(workdir)} || exit 97; "
            f"T=''; command -v timeout >/dev/null 2>&1 && T='timeout -k 10 {int(deadline)}'; "
            f"export {exports}; exec $T {quoted} 2>&1")


def nproc_for(backend: str, gpus: int, override: int | None) -> int:
    if override:
        return override
    return 1 if backend == "gloo" else gpus


def parse_events(text: str) -> list[dict]:
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                events.append(obj)
    return events


@dataclass
class HostRun:
    """What happened on one host; filled in by the orchestration (or by a test)."""

    name: str
    vars: Mapping[str, Any] = field(default_factory=dict)
    stage: str = "pending"  # pending, prepared, launched, finished, or the stage that failed
    error: str = ""  # why the host could not take part (set: it did not join)
    hint: str = "investigate"
    nproc: int = 0
    image: str = ""
    container: str = ""
    local_addr: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    rc: int | None = None  # torchrun's exit code; None: killed at the deadline or not run
    output: str = ""
    ranks: dict[int, list[dict]] = field(default_factory=dict)  # rank -> its events
    prepare_s: float = 0.0
    launched_at: float | None = None  # time.time() when torchrun was started
    finished_at: float | None = None


def _first(evs: Sequence[dict], kind: str, **match: Any) -> dict | None:
    for ev in evs:
        if ev.get("ev") == kind and all(ev.get(k) == v for k, v in match.items()):
            return ev
    return None


def _tail(text: str, lines: int = 3) -> str:
    keep = [ln.strip() for ln in text.strip().splitlines() if ln.strip()
            and "NumPy" not in ln and "_conversion_method_template" not in ln]
    return " | ".join(keep[-lines:])[:400]


def judge_busbw(measured: float | None, expected: float | None, backend: str,
                ratios: tuple[float, float] = DEFAULT_RATIOS) -> tuple[str, float | None, str]:
    """(verdict, pass limit, why) for the inter-node bus bandwidth."""
    if measured is None:
        return "fail", None, "no measurement"
    if backend == "gloo":
        return "skip", None, "not judged (gloo on CPU: the code path only)"
    if expected is None:
        return "skip", None, "not judged (no umprov_internode_busbw_gbps)"
    ok, warn = ratios
    if measured >= expected * ok:
        return "pass", round(expected * ok, 3), ""
    if measured >= expected * warn:
        return "warn", round(expected * ok, 3), f"below {ok:g} x expected {expected:g}"
    return "fail", round(expected * ok, 3), f"below {warn:g} x expected {expected:g}"


def host_reports(runs: Sequence[HostRun], *, backend: str, endpoint: str | None, rdzv_id: str,
                 timeout: float, wall_s: float, expected_busbw: float | None = None) -> list[dict]:
    """One host document (schema umprov.verify.host) per host, mode "multi-node"."""
    missing = [r.name for r in runs if r.error]
    # Launched but never joined: those that waited at the rendezvous until its timeout, and
    # those that could not take part at all (no store connection, a crash): the latter are the
    # hosts that did not join.
    unjoined = [r for r in runs if not r.error and r.stage not in ("pending", "prepared")
                and not any(_first(e, "joined") for e in r.ranks.values())]
    missing += [r.name for r in unjoined if not _waited(r)]
    world = sum(r.nproc for r in runs)
    docs = []
    for node, run in enumerate(runs):
        recs: list[dict] = []

        def rec(check: str, verdict: str, _recs: list[dict] = recs, **kw: Any) -> None:
            _recs.append(record("host", "host", check, verdict, **kw))

        facts: dict[str, Any] = {
            "backend": backend, "rendezvous": endpoint, "rdzv_id": rdzv_id, "node": node,
            "nnodes": len(runs), "nproc_per_node": run.nproc, "world_size": world,
            "image": run.image, "container": run.container, "network_mode": "host",
            "local_addr": run.local_addr, "env": dict(run.env), "torchrun_rc": run.rc,
            "timings": timings(run),
        }
        if run.error:
            rec("multinode.join", "fail", hint=run.hint, reason="error",
                detail=f"did not join: {run.error}")
        elif run.stage in ("pending", "prepared"):
            others = ", ".join(missing) or "another host"
            rec("multinode.join", "skip", detail=f"ready, but the job did not start: {others} "
                f"did not join")
        else:
            _judge_ran(run, rec, facts, backend=backend, timeout=timeout, world=world,
                       missing=missing, expected_busbw=expected_busbw)
        verdict = worst(r["verdict"] for r in recs)
        summary = {v: sum(1 for r in recs if r["verdict"] == v)
                   for v in ("pass", "warn", "fail", "skip")}
        docs.append({
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "agent_version": AGENT_VERSION,
            "host": run.name, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(wall_s, 2), "mode": MODE, "verdict": verdict,
            "exit_code": exit_code_for(verdict), "profile": "internode", "summary": summary,
            "facts": facts, "records": recs,
        })
    return docs


def _judge_ran(run: HostRun, rec: Callable[..., None], facts: dict[str, Any], *, backend: str,
               timeout: float, world: int, missing: list[str],
               expected_busbw: float | None) -> None:
    evs = [ev for rank in sorted(run.ranks) for ev in run.ranks[rank]]
    joined = [r for r, e in run.ranks.items() if _first(e, "joined")]
    why = f"torchrun exited with code {run.rc}" if run.rc is not None else (
        f"torchrun did not finish within its deadline ({timeout:.0f} s per stage)")
    tail = _tail(run.output)
    if not joined:
        others = [m for m in missing if m != run.name]
        if _waited(run) and others:
            rec("multinode.join", "skip", detail=f"waited at the rendezvous for {timeout:.0f} s; "
                f"the job did not start: {', '.join(others)} did not join")
            return
        if _waited(run):
            rec("multinode.join", "fail", hint="config", reason="timeout",
                detail=f"did not join within {timeout:.0f} s: the rendezvous timed out with "
                "every host waiting (check the addresses, ports and firewalls between hosts)")
            return
        if "RendezvousConnectionError" in run.output or "DistNetworkError" in run.output:
            rec("multinode.join", "fail", hint="config", reason="error",
                detail=f"did not join: cannot reach the rendezvous store: {why}"
                + (f": {tail}" if tail else ""))
            return
        rec("multinode.join", "fail", hint="investigate",
            reason="timeout" if run.rc is None else "error",
            detail=f"did not join: {why}" + (f": {tail}" if tail else ""))
        return
    first = min(joined)
    j = _first(run.ranks[first], "joined") or {}
    ranks = sorted(run.ranks)
    facts["torch"] = j.get("torch")
    if j.get("nccl"):
        facts["nccl"] = j["nccl"]
    rec("multinode.join", "pass", measured=j.get("init_s"), unit="s",
        detail=f"ranks {ranks[0]}-{ranks[-1]} of {world} joined "
        f"(process group init {j.get('init_s')} s)")
    for check, what in (("multinode.all_reduce", "all_reduce sum"),
                        ("multinode.all_gather", "all_gather")):
        ev = _first(evs, "check", check=check)
        if ev is None:
            rec(check, "fail", hint="investigate", reason="timeout" if run.rc is None else "error",
                detail=f"no result: {why}" + (f": {tail}" if tail else ""))
            continue
        bad = int(ev.get("wrong", -1))
        rec(check, "pass" if bad == 0 else "fail", measured=bad, unit="wrong elements", limit=0,
            hint="isolate", detail=f"{what} of {ev.get('elements')} float32 per rank over "
            f"{ev.get('world')} ranks, exact integers")
    bw = _first(evs, "busbw")
    if bw is None:
        rec("multinode.busbw", "fail", hint="investigate", reason="error",
            detail=f"no measurement: {why}")
    else:
        measured = bw.get("busbw")
        verdict, limit, note = judge_busbw(measured, expected_busbw, backend)
        size = int(bw.get("bytes", 0))
        rec("multinode.busbw", verdict, measured=measured, unit="GB/s", limit=limit,
            expected=expected_busbw, hint="reseat",
            detail=(f"{note}; " if note else "") + f"all_reduce float32 {size / (1 << 20):.0f} "
            f"MiB x{bw.get('reps')} over {world} ranks, algbw {bw.get('algbw')} GB/s")
    if run.rc != 0:  # the ranks' results stand; a torchrun that did not end cleanly fails too
        rec("multinode.exit", "fail", hint="investigate",
            reason="timeout" if run.rc is None else "error",
            detail=why + (f": {tail}" if tail else ""))


def _waited(run: HostRun) -> bool:
    """torchrun on this host reached the rendezvous and gave up waiting for the others."""
    return "RendezvousTimeoutError" in run.output


def timings(run: HostRun) -> dict[str, float | None]:
    """Where the time went on a host: container start and copy, torchrun start-up until the
    ranks run, rendezvous and process-group init, collectives."""
    evs = [ev for rank in sorted(run.ranks) for ev in run.ranks[rank]]
    started = [e["at"] for e in evs if e.get("ev") == "started" and "at" in e]
    joined = [e["at"] for e in evs if e.get("ev") == "joined" and "at" in e]
    coll = [e.get("seconds") for e in evs if e.get("ev") == "collectives"]
    out: dict[str, float | None] = {"container_s": round(run.prepare_s, 2), "startup_s": None,
                                    "rendezvous_s": None, "collectives_s": None, "torchrun_s": None}
    if run.launched_at and started:
        out["startup_s"] = round(max(started) - run.launched_at, 2)
    if started and joined:
        out["rendezvous_s"] = round(max(joined) - max(started), 2)
    if coll:
        out["collectives_s"] = max(c for c in coll if c is not None)
    if run.launched_at and run.finished_at:
        out["torchrun_s"] = round(run.finished_at - run.launched_at, 2)
    return out


# ---------------------------------------------------------------------------------------------
# Orchestration


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any], timeout: float) -> list[Any]:
    """fn over items in daemon threads; each result, or the exception, or TimeoutError when late.
    Daemon threads: a Ctrl-C here is not held up by a blocked docker call."""
    results: list[Any] = [TimeoutError(f"no answer within {timeout:.0f} s")] * len(items)

    def target(i: int, item: Any) -> None:
        try:
            results[i] = fn(item)
        except Exception as exc:  # reported per item
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i, it), daemon=True)
               for i, it in enumerate(items)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return results


def _docker_text(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", "") or exc)
    return f"{type(exc).__name__}: {' '.join(text.split())}"[:300]


def container_kwargs(image: str, name: str, run_id: str, deployed_host_config: Mapping[str, Any],
                     *, lab: bool) -> dict[str, Any]:
    """A throwaway container of the deployed image on the host's network, with its GPUs."""
    from docker.types import DeviceRequest, Ulimit

    kw: dict[str, Any] = {
        "image": image, "name": name, "command": ["sleep", "infinity"], "entrypoint": [],
        "detach": True, "network_mode": "host", "shm_size": "16g",
        "labels": {LABEL: run_id, "org.umprov.managed": "false"},
    }
    if not lab:  # lab hosts lack CAP_SYS_RESOURCE: no raised limits there (see deploy.py)
        kw["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1),
                         Ulimit(name="stack", soft=67108864, hard=67108864)]
    runtime = deployed_host_config.get("Runtime")
    if runtime and runtime != "runc":
        kw["runtime"] = runtime
    reqs = deployed_host_config.get("DeviceRequests") or []
    if reqs:
        kw["device_requests"] = [
            DeviceRequest(driver=r.get("Driver") or "", count=r.get("Count") or 0,
                          device_ids=r.get("DeviceIDs") or None,
                          capabilities=r.get("Capabilities") or None,
                          options=r.get("Options") or None) for r in reqs]
    return kw


class _Host:
    """Live state of one host during a run (client, container) beside its HostRun."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.run = HostRun(host.name, dict(getattr(host, "vars", {}) or {}))
        self.client: Any = None
        self.container: Any = None
        self.python = "python3"
        self.net: dict[str, Any] = {}
        self.run_id = ""


def verify_multinode(hosts: Sequence[Any], opts: MultiNodeOptions, *,
                     progress: Progress = _quiet) -> list[dict]:
    """Run the job over ``hosts``; one host document each. Never leaves a container behind."""
    if opts.backend not in ("nccl", "gloo"):
        raise ConfigError(f"--backend {opts.backend!r}: nccl or gloo")
    if len(hosts) < 2 and not opts.rendezvous:
        raise ConfigError("--multi-node needs two or more hosts")
    started = time.monotonic()
    run_id = f"umprov-{secrets.token_hex(4)}"
    states = [_Host(h) for h in hosts]
    for st in states:
        st.run_id = run_id
    endpoint: str | None = None
    try:
        for st, res in zip(states, _parallel(lambda s: _prepare(s, opts, run_id, progress),
                                             states, opts.timeout + 60), strict=True):
            if isinstance(res, BaseException):
                _failed(st, "prepare", f"not ready within {opts.timeout + 60:.0f} s"
                        if isinstance(res, TimeoutError) else _docker_text(res))
        ready = [s for s in states if not s.run.error]
        if len(ready) == len(states):
            endpoint = _rendezvous(states, opts)
            _launch_all(states, opts, endpoint, run_id, progress)
    finally:
        _cleanup(states, progress)
    first = states[0].run.vars if states else {}
    expected = first.get("umprov_internode_busbw_gbps")
    return host_reports([s.run for s in states], backend=opts.backend, endpoint=endpoint,
                        rdzv_id=run_id, timeout=opts.timeout,
                        wall_s=time.monotonic() - started,
                        expected_busbw=float(expected) if expected is not None else None)


def _failed(st: _Host, stage: str, why: str, hint: str = "investigate") -> None:
    st.run.stage, st.run.error, st.run.hint = stage, why, hint


def _prepare(st: _Host, opts: MultiNodeOptions, run_id: str, progress: Progress) -> None:
    from umprov.ssh import docker_client
    from umprov.verify.remote import AGENT_PATH, _exec, _tar

    t0 = time.monotonic()
    name = st.run.name
    try:
        progress(name, "connecting")
        st.client = docker_client(st.host, trust_new=opts.trust_new, timeout=opts.timeout)
        st.client.ping()
    except UmprovError as exc:
        return _failed(st, "connect", f"{UNREACHABLE}{exc}", "config")
    except Exception as exc:  # the engine is down or refuses: the host cannot join
        return _failed(st, "connect", f"Docker unreachable: {_docker_text(exc)}", "config")
    deployed_name = str(st.run.vars.get("umprov_container_name") or "umprov")
    try:
        deployed = st.client.containers.get(deployed_name)
    except Exception:
        return _failed(st, "container", f"no container {deployed_name!r} (run umprov deploy)",
                       "config")
    st.run.image = (deployed.attrs.get("Config") or {}).get("Image") or deployed.image.id
    progress(name, "starting a host-network container")
    kwargs = container_kwargs(deployed.image.id, f"umprov-mn-{run_id[7:]}", run_id,
                              deployed.attrs.get("HostConfig") or {},
                              lab=not st.run.vars.get("umprov_container_limits", True))
    try:
        st.container = st.client.containers.run(**kwargs)
    except Exception as exc:
        with contextlib.suppress(Exception):  # created but not started: do not leave it
            st.client.containers.get(kwargs["name"]).remove(force=True)
        return _failed(st, "container", f"cannot start a container: {_docker_text(exc)}")
    st.run.container = st.container.name
    rc, out = _exec(st.container, ["mkdir", "-p", WORKDIR], 60)
    worker = json.dumps(opts.worker_opts()).encode()
    if rc != 0 or not st.container.put_archive(
            WORKDIR, _tar({"agent.py": AGENT_PATH.read_bytes(), "opts.json": worker})):
        return _failed(st, "container", f"cannot copy the agent: {out.strip()[:200]}")
    probe = ("PY=$(command -v python3 || command -v python) || exit 98; echo \"PY=$PY\"; "
             "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L | grep -c '^GPU ' || "
             "echo 0; \"$PY\" " + WORKDIR + "/agent.py --net-info")
    rc, out = _exec(st.container, ["sh", "-c", probe], 60)
    if rc is None or rc == 98 or not out.strip():
        return _failed(st, "container", "no python in the image" if rc == 98 else
                       f"the probe did not answer (code {rc})", "config")
    lines = out.strip().splitlines()
    st.python = lines[0].removeprefix("PY=").strip()
    gpus = int(lines[1]) if lines[1].strip().isdigit() else 0
    with contextlib.suppress(ValueError, IndexError):
        st.net = json.loads(lines[-1])
    st.run.nproc = nproc_for(opts.backend, gpus, opts.nproc_per_node)
    if st.run.nproc < 1:
        return _failed(st, "container", "no NVIDIA GPU visible in the container (use "
                       "--backend gloo to test the orchestration without GPUs)", "driver")
    st.run.stage = "prepared"
    st.run.prepare_s = time.monotonic() - t0
    progress(name, f"ready ({st.run.nproc} process(es))")
    return None


def _rendezvous(states: list[_Host], opts: MultiNodeOptions) -> str:
    head = states[0]
    port = rendezvous_port(head.run.vars)
    if opts.rendezvous:
        addr, port = parse_endpoint(opts.rendezvous, port)
    else:
        addr = head.host.address
        if is_loopback(addr):  # reached through a tunnel or published port (the lab)
            addr = (head.net.get("route") or {}).get("ip") or addr
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _launch_all(states: list[_Host], opts: MultiNodeOptions, endpoint: str, run_id: str,
                progress: Progress) -> None:
    from umprov.verify.remote import _exec

    rdzv_host, _port_no = parse_endpoint(endpoint)
    deadline = opts.run_deadline()

    def launch(st: _Host) -> None:
        run = st.run
        rc, out = _exec(st.container, [st.python, f"{WORKDIR}/agent.py", "--net-info",
                                       rdzv_host], 60)
        with contextlib.suppress(ValueError):
            st.net = json.loads(out.strip().splitlines()[-1]) if rc == 0 else st.net
        route = st.net.get("route") or {}
        addr = st.host.address
        run.local_addr = route.get("ip") if is_loopback(addr) else addr
        run.env = node_env(run.vars, route.get("ifname"))
        cmd = torchrun_command(
            python=st.python, agent=f"{WORKDIR}/agent.py", nnodes=len(states), nproc=run.nproc,
            endpoint=endpoint, rdzv_id=run_id, join_timeout=opts.timeout,
            local_addr=run.local_addr, is_host=st is states[0] and not opts.rendezvous,
            opts_path=f"{WORKDIR}/opts.json", out_prefix=f"{WORKDIR}/rank")
        run.stage, run.launched_at = "launched", time.time()
        progress(run.name, "torchrun started")
        rc, out = _exec(st.container, ["sh", "-c", shell_script(cmd, run.env, workdir=WORKDIR,
                                                                deadline=deadline)],
                        deadline + 30)
        run.finished_at = time.time()
        run.rc, run.output = (None if rc in (None, 124, 137) else rc), out
        run.stage = "finished"
        run.ranks = _read_ranks(st)
        progress(run.name, f"torchrun ended ({'deadline' if run.rc is None else run.rc})")

    for st, res in zip(states, _parallel(launch, states, deadline + 120), strict=True):
        if isinstance(res, BaseException) and not st.run.ranks:
            st.run.output = st.run.output or _docker_text(res)


def _read_ranks(st: _Host) -> dict[int, list[dict]]:
    from umprov.verify.remote import _exec

    rc, out = _exec(st.container, ["sh", "-c", f"cd {WORKDIR} && for f in rank.*; do "
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


def _cleanup(states: list[_Host], progress: Progress) -> None:
    """Remove every throwaway container (ending torchrun and its ranks), then the clients."""

    def remove(st: _Host) -> None:
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
                             f"{_docker_text(exc)}")
        if st.client is not None:
            with contextlib.suppress(Exception):
                st.client.close()

    _parallel(remove, states, 90)
