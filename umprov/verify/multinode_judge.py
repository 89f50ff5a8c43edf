"""Multi-node verification, judged: what happened on each host (``HostRun``, filled in by
umprov/verify/multinode.py or by a test) and the ranks' events become one host document each.

A host that never joined is named as such; hosts that waited at the rendezvous for it are
skipped, not failed. Exact-value checks fail on any wrong element; the inter-node bus
bandwidth is judged against ``umprov_internode_busbw_gbps`` where the inventory gives it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from umprov.verify.agent.profiles import DEFAULT_RATIOS
from umprov.verify.agent.schema import host_report, record

MODE = "multi-node"


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
    facts: dict[str, Any] = field(default_factory=dict)  # the launcher's (Slurm: job, node)


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
                 timeout: float, wall_s: float, expected_busbw: float | None = None,
                 launcher: str = "ssh") -> list[dict]:
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
            "timings": timings(run), "launcher": launcher, **run.facts,
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
        docs.append(host_report(run.name, recs, mode=MODE, profile="internode", facts=facts,
                                wall_s=wall_s))
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
        _not_joined(run, rec, timeout=timeout, missing=missing, why=why, tail=tail)
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
    _busbw(rec, _first(evs, "busbw"), why, backend=backend, world=world,
           expected_busbw=expected_busbw)
    if run.rc != 0:  # the ranks' results stand; a torchrun that did not end cleanly fails too
        rec("multinode.exit", "fail", hint="investigate",
            reason="timeout" if run.rc is None else "error",
            detail=why + (f": {tail}" if tail else ""))


def _busbw(rec: Callable[..., None], bw: dict | None, why: str, *, backend: str, world: int,
           expected_busbw: float | None) -> None:
    if bw is None:
        rec("multinode.busbw", "fail", hint="investigate", reason="error",
            detail=f"no measurement: {why}")
        return
    measured = bw.get("busbw")
    verdict, limit, note = judge_busbw(measured, expected_busbw, backend)
    size = int(bw.get("bytes", 0))
    rec("multinode.busbw", verdict, measured=measured, unit="GB/s", limit=limit,
        expected=expected_busbw, hint="reseat",
        detail=(f"{note}; " if note else "") + f"all_reduce float32 {size / (1 << 20):.0f} "
        f"MiB x{bw.get('reps')} over {world} ranks, algbw {bw.get('algbw')} GB/s")


def _not_joined(run: HostRun, rec: Callable[..., None], *, timeout: float, missing: list[str],
                why: str, tail: str) -> None:
    """Why no rank of this host joined: it waited for others, or it could not take part."""
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

