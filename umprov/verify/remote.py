"""Running the agent inside containers through the docker SDK, and over an inventory.

``run_agent_in_container`` is the unit: copy the agent's zipapp (and the profile JSON) in with
put_archive, run it with exec_run under a deadline, read its JSON report back with
get_archive. ``verify_hosts`` does that on every inventory host in parallel, each over
``umprov.hosts.engine.docker_client`` (verified host keys), in the deployed container or in a
container of ``--image`` started for the purpose. Nothing here raises for one host's trouble:
each host ends with a report document, failing ones saying why.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from umprov.errors import Cancelled, UmprovError
from umprov.hosts.engine import exec_in, start_throwaway, throwaway, untar_one
from umprov.hosts.fanout import Parallel, workers
from umprov.hosts.progress import Progress, quiet
from umprov.inventory import deployed_container
from umprov.verify.bundle import AGENT_NAME, FIND_PYTHON, NO_PYTHON, copy_agent
from umprov.verify.report import UNREACHABLE, checked, connect_failure, failed_host_report


def run_agent_in_container(
    client: Any,
    container: Any,
    *,
    args: Sequence[str] = (),
    timeout: float = 600.0,
    profile: Mapping[str, Any] | None = None,
    host: str | None = None,
    cancel: threading.Event | None = None,
) -> dict:
    """Run the agent in a running container; return its (validated) report document.

    ``container`` is a docker SDK Container or a name/ID. ``args`` are agent options
    (--quick, --expected-gpus N, --timeout S, --profile NAME); ``profile`` an override
    document for --profile-file. The agent runs under ``timeout`` (coreutils timeout inside
    the container where there is one, and a deadline here either way). Every process of the
    run is marked (an environment variable) and ended on the way out, so nothing is left
    running in the container when the deadline passed or the run was interrupted (``cancel``).
    """
    if isinstance(container, str):
        container = client.containers.get(container)
    name = host or getattr(container, "name", "container")
    run_id = secrets.token_hex(4)
    workdir = f"/tmp/umprov-verify-{run_id}"  # noqa: S108 (inside the container)
    files, agent_args = {}, [*args]
    if profile is not None:
        files["profile.json"] = json.dumps(profile).encode()
        agent_args += ["--profile-file", f"{workdir}/profile.json"]
    refused = copy_agent(container, workdir, files)
    if refused:
        return failed_host_report(name, "agent.copy", refused)
    report = f"{workdir}/report.json"
    quoted = " ".join(_sh_quote(a) for a in agent_args)
    limit = int(timeout)
    script = (
        # The mark names every process of this run; TMPDIR keeps the agent's own scratch
        # folder inside the run's, so both go when the run is ended.
        f"export {RUN_MARK}={run_id} TMPDIR={workdir}; cd {workdir} || exit 97; "
        f"{FIND_PYTHON}; "
        f"T=''; command -v timeout >/dev/null 2>&1 && T='timeout -k 10 {limit}'; "
        f'$T "$PY" {AGENT_NAME} --quiet --json {report} {quoted}'
    )
    try:
        rc, out = exec_in(container, ["sh", "-c", script], timeout + 30, cancel=cancel)
        if rc is None:
            return failed_host_report(name, "agent.run", f"the agent did not finish within "
                                      f"{timeout:.0f} s", hint="reset", reason="timeout")
        if rc == NO_PYTHON:
            return failed_host_report(name, "agent.run", "no python3 or python in the container",
                                      hint="config")
        try:
            stream, _stat = container.get_archive(report)
            doc = json.loads(untar_one(stream))
        except Exception as exc:  # no report: say what the agent printed
            tail = " | ".join(ln for ln in out.strip().splitlines()[-3:])
            return failed_host_report(
                name, "agent.run", f"the agent exited with code {rc} and wrote no report "
                f"({type(exc).__name__}): {tail[:300]}")
        if host:
            doc.setdefault("facts", {})["container_hostname"] = doc.get("host")
            doc["host"] = host
        return checked(doc, name)
    finally:
        with contextlib.suppress(Exception):
            exec_in(container, ["sh", "-c", _end_run_script(run_id, workdir)], 20)


RUN_MARK = "UMPROV_VERIFY_RUN"


def _end_run_script(run_id: str, workdir: str) -> str:
    """Shell that kills every process of one agent run (the shell, timeout, the agent, its
    per-GPU children in their own sessions: all carry RUN_MARK in their environment), then
    removes the run's folder."""
    mark = f"^{RUN_MARK}={run_id}$"
    return (
        f"pids=$(grep -lsz -e '{mark}' /proc/[0-9]*/environ | cut -d/ -f3); "
        '[ -n "$pids" ] && kill -9 $pids 2>/dev/null; '
        f"rm -rf {workdir}; true"
    )


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# ---------------------------------------------------------------------------------------------
# Over an inventory


@dataclass(frozen=True)
class VerifyOptions:
    quick: bool = False
    timeout: float = 120.0
    expected_gpus: int | None = None
    image: str | None = None
    profile: Mapping[str, Any] | None = None  # override document for the agent
    trust_new: bool = False
    duration: float = 0.0  # burn-in seconds (--duration)
    exclusive: bool = False
    passive: bool = False  # reads only, beside running jobs (--passive)

    @property
    def mode(self) -> str:
        return "passive" if self.passive else "quick" if self.quick else "full"

    def agent_args(self, host_vars: Mapping[str, Any]) -> list[str]:
        args = agent_flags(self.quick, self.timeout, self.duration, self.exclusive, self.passive)
        expected = self.expected_gpus
        if expected is None and host_vars.get("umprov_expected_gpus") is not None:
            expected = int(host_vars["umprov_expected_gpus"])
        if expected is not None:
            args += ["--expected-gpus", str(expected)]
        forced = host_vars.get("umprov_gpu_profile")
        if forced and not (self.profile or {}).get("profile"):
            args += ["--profile", str(forced)]
        return args

    def overall_timeout(self) -> float:
        # discover + per-GPU + NCCL phases, each with its own child deadline, plus start-up
        # and the burn-in
        return self.timeout * 3 + 120 + self.duration


def agent_flags(quick: bool, timeout: float, duration: float, exclusive: bool,
                passive: bool = False) -> list[str]:
    """The agent options every way of running it shares (here and umprov.verify.local)."""
    args = ["--timeout", str(timeout), *(["--passive"] if passive else [])]
    if quick:
        args.append("--quick")
    if duration:
        args += ["--duration", f"{duration:g}"]
    if exclusive:
        args.append("--exclusive")
    return args


def verify_hosts(hosts: Sequence[Any], opts: VerifyOptions, *,
                 progress: Progress = quiet, forks: int | None = None) -> list[dict]:
    """One report document per host, gathered in parallel."""
    if not hosts:
        return []
    # Daemon threads that Ctrl-C or SIGTERM stop within seconds (umprov.hosts.fanout); each host's
    # agent is ended in its container on the way out.
    pool = Parallel(workers(forks, len(hosts))[0])
    clients: list[Any] = []

    def close() -> None:
        for client in list(clients):
            with contextlib.suppress(Exception):
                client.close()

    def report(host: str, message: str) -> None:
        if not pool.cancel.is_set():
            progress(host, message)

    try:
        return pool.map(lambda h: _verify_one(h, opts, report, pool.cancel, clients), hosts,
                        "verify")
    except BaseException:
        pool.stop(close=close)
        raise


def _verify_one(host: Any, opts: VerifyOptions, progress: Progress,
                cancel: threading.Event | None = None, clients: list[Any] | None = None) -> dict:
    from umprov.hosts.engine import connection_lost, docker_client

    mode = opts.mode
    client = None
    try:
        progress(host.name, "connecting")
        client = docker_client(host, trust_new=opts.trust_new)
        if clients is not None:
            clients.append(client)
        if cancel is not None and cancel.is_set():
            raise Cancelled
        hv = getattr(host, "vars", {}) or {}
        args = opts.agent_args(hv)
        if opts.image:
            progress(host.name, f"starting {opts.image}")
            doc = _in_fresh_container(client, host.name, opts, args, cancel)
        else:
            name = deployed_container(hv)
            try:
                container = client.containers.get(name)
            except Exception:
                return failed_host_report(
                    host.name, "agent.container", f"no container {name!r} on the host (run "
                    "umprov deploy first, or pass --image)", hint="config", mode=mode)
            if container.status != "running":
                return failed_host_report(host.name, "agent.container",
                                          f"container {name} is {container.status}",
                                          hint="config", mode=mode)
            progress(host.name, f"running the agent in {name}")
            doc = run_agent_in_container(client, container, args=args, profile=opts.profile,
                                         timeout=opts.overall_timeout(), host=host.name,
                                         cancel=cancel)
        progress(host.name, f"{doc['verdict']} ({doc['wall_s']:.0f} s)")
        return doc
    except UmprovError as exc:  # unreachable before or during the run (no reconnect), ...
        state, detail, hint = connect_failure(exc)
        progress(host.name, state)
        return failed_host_report(host.name, "agent.connect", detail, hint=hint, mode=mode)
    except Exception as exc:  # one host's Docker trouble is its report, not the run's crash
        text = " ".join(str(exc).split())[:300]
        if client is not None and connection_lost(client, exc):
            progress(host.name, "unreachable")
            return failed_host_report(
                host.name, "agent.connect", f"{UNREACHABLE}{host.name}: the connection was "
                f"lost mid-run ({type(exc).__name__}: {text})", mode=mode)
        progress(host.name, "failed")
        return failed_host_report(host.name, "agent.docker", f"{type(exc).__name__}: {text}",
                                  mode=mode)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _in_fresh_container(client: Any, host_name: str, opts: VerifyOptions,
                        args: list[str], cancel: threading.Event | None = None) -> dict:
    """Run the agent in a throw-away container of --image with all GPUs, then remove it."""
    from docker.errors import APIError
    from docker.types import DeviceRequest, Ulimit

    kwargs: dict[str, Any] = {
        **throwaway(opts.overall_timeout()),
        "image": opts.image,
        "name": f"umprov-verify-{secrets.token_hex(3)}",
        "shm_size": "16g",
        "ulimits": [Ulimit(name="memlock", soft=-1, hard=-1)],
        "labels": {"org.umprov.verify": "1"},
    }
    note = ""
    try:
        container = start_throwaway(
            client, device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])], **kwargs)
    except APIError as exc:
        text = " ".join(str(getattr(exc, "explanation", "") or exc).split())
        if "device driver" not in text and "gpu" not in text.lower():
            raise
        # No NVIDIA runtime on the host: run without GPUs so the agent reports that honestly.
        note = f"the container could not get GPUs: {text[:200]}"
        kwargs.pop("ulimits")
        container = start_throwaway(client, **kwargs)
    try:
        doc = run_agent_in_container(client, container, args=args, profile=opts.profile,
                                     timeout=opts.overall_timeout(), host=host_name,
                                     cancel=cancel)
        if note:
            doc.setdefault("facts", {})["container_note"] = note
            for rec in doc["records"]:
                if rec["check"] == "host.gpu_visible":
                    rec["detail"] += f"; {note}"
        return doc
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)
