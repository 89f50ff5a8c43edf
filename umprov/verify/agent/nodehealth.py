"""``agent.pyz --slurm-health | --slurm-gate | --slurm-hold TEXT``: check this node, then act
on the scheduler by the rules of slurm.py.

``--slurm-health`` is what Slurm runs (HealthCheckProgram, epilog, prolog): the passive checks
(``--passive``), the active ones, or (``--active-when-idle``) the active ones only when no job
holds the node. ``--slurm-gate`` is the rolling change's gate: the same, and a pass releases
the change's hold. ``--slurm-hold TEXT`` drains the node for a change and waits (``--wait S``)
until its jobs ended. Each prints one JSON object on stdout (what it found, did and why) and
one line on stderr. Exit codes: the report's (0 pass, 12 warn, 13 fail) for a check; 0 for a
hold; 1 when the scheduler could not be read or told, or jobs still ran at the deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from .profiles import profiles_for
from .report import write_report
from .scheduler import Hooks, SchedulerError, Slurm, run_command
from .schema import host_report, record
from .slurm import Action, decide, decide_hold, describe, failing

EXIT_SCHEDULER = 1
POLL_S = 10.0


def node_name() -> str:
    """Slurm's name for this node (slurmd sets SLURMD_NODENAME for the programs it runs)."""
    return os.environ.get("SLURMD_NODENAME") or short_name(socket.gethostname())


def short_name(hostname: str) -> str:
    """A host's Slurm NodeName unless configured otherwise: its short host name (also
    umprov verify --launcher slurm's rule, umprov/verify/slurm_launch.py)."""
    return hostname.split(".")[0]


def scheduler(args: argparse.Namespace) -> Slurm | Hooks:
    if args.scheduler == "hooks":
        return Hooks(args.drain_command or "", args.resume_command or "",
                     args.jobs_command or "", args.marker or "")
    return Slurm()


def main(args: argparse.Namespace) -> int:
    name = args.node or node_name()
    try:
        sched = scheduler(args)
        if args.slurm_hold is not None:
            return hold(sched, name, args)
        return check(sched, name, args)
    except (SchedulerError, ValueError, OSError) as exc:
        say(f"{name}: {exc}")
        emit({"node": name, "error": str(exc)})
        return EXIT_SCHEDULER


def check(sched: Slurm | Hooks, name: str, args: argparse.Namespace) -> int:
    before = sched.show(name)
    active = not args.passive and (not args.active_when_idle or not before.busy)
    doc = read_report(args.report) if args.report else run_checks(args, active)
    node = sched.show(name)  # again: someone may have drained it while the checks ran
    action = decide(node, doc, gate=args.slurm_gate)
    act(sched, name, action, args.dry_run)
    if args.json:
        write_report(args.json, doc)
    emit({"node": name, "mode": doc["mode"], "verdict": doc["verdict"],
          "exit_code": doc["exit_code"], "action": action.kind, "reason": action.reason,
          "why": action.why, "before": node.to_dict(), "dry_run": bool(args.dry_run),
          "failing": [describe(r) for r in failing(doc)][:10]})
    say(f"{name}: {doc['mode']} {doc['verdict']}; {action.kind}: {action.reason or action.why}")
    return int(doc["exit_code"])


def hold(sched: Slurm | Hooks, name: str, args: argparse.Namespace) -> int:
    node = sched.show(name)
    stamp = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    what = args.slurm_hold if args.if_held else f"{args.slurm_hold} {stamp}"
    action = decide_hold(node, what, only_if_held=args.if_held)
    act(sched, name, action, args.dry_run)
    started = time.monotonic()
    jobs = sched.jobs(name) if args.wait > 0 else []
    while jobs and time.monotonic() - started < args.wait:
        time.sleep(min(args.poll, max(0.0, args.wait - (time.monotonic() - started))))
        jobs = sched.jobs(name)
    reason = action.reason or node.reason
    out: dict[str, Any] = {"node": name, "action": action.kind, "reason": reason,
                           "why": action.why, "before": node.to_dict(), "jobs": jobs,
                           "waited_s": round(time.monotonic() - started, 1),
                           "dry_run": bool(args.dry_run)}
    emit(out)
    if jobs:
        say(f"{name}: job(s) {', '.join(jobs)} still running after {args.wait:.0f} s; the node "
            f"stays drained ({reason})")
        return EXIT_SCHEDULER
    say(f"{name}: {action.kind}: {reason or action.why}")
    return 0


def act(sched: Slurm | Hooks, name: str, action: Action, dry_run: bool) -> None:
    if dry_run or action.kind == "leave":
        return
    if action.kind == "drain":
        sched.drain(name, action.reason or "umprov:")
    elif action.kind == "resume":
        sched.resume(name)


def read_report(path: str) -> dict:
    with (sys.stdin if path == "-" else open(path)) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or "records" not in doc or "exit_code" not in doc:
        raise ValueError(f"{path}: not a host report")
    return doc


def run_checks(args: argparse.Namespace, active: bool) -> dict:
    """The passive checks, or the active ones where they can run; active checks that cannot
    start (no torch, no container) fall back to the passive ones with a warning, so a node is
    never drained for umprov's own set-up."""
    from .passive import passive_report

    profiles, forced = profiles_for(args.profile_file, args.profile)
    if not active:
        return passive_report(args.expected_gpus, profiles, forced)
    doc, why = (in_container(args) if args.container else in_process(args))
    if doc is not None:
        return doc
    doc = passive_report(args.expected_gpus, profiles, forced)
    records = [*doc["records"], record("host", "host", "agent.active", "warn", hint="config",
                                       detail=f"active checks not run: {why}")]
    return host_report(doc["host"], records, mode="passive", profile=doc["profile"],
                       facts=doc["facts"], wall_s=doc["wall_s"])


def in_process(args: argparse.Namespace) -> tuple[dict | None, str]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, (f"{sys.executable} cannot import torch (give the Python that has it, or "
                      "the container to run in)")
    from .host import Agent

    return Agent(args).run(), ""


def in_container(args: argparse.Namespace) -> tuple[dict | None, str]:
    """The active checks in a running container (the deployed one): the agent copied in,
    run with ``docker exec``, its report read from its stdout."""
    box, inside = args.container, f"/tmp/umprov-agent-{os.getpid()}.pyz"  # noqa: S108
    flags = ["--json", "-", "--quiet", "--timeout", str(args.timeout)]
    flags += ["--quick"] if args.quick else []
    flags += ["--expected-gpus", str(args.expected_gpus)] if args.expected_gpus is not None else []
    flags += ["--profile", args.profile] if args.profile else []
    try:
        rc, out, err = run_command(["docker", "cp", os.path.abspath(sys.argv[0]),
                                    f"{box}:{inside}"])
        if rc != 0:
            return None, f"docker cp into {box}: {' '.join(err.split())[:160]}"
        rc, out, err = run_command(["docker", "exec", box, "python3", inside, *flags],
                                   timeout=args.timeout * 3 + 120)
        run_command(["docker", "exec", box, "rm", "-f", inside])
    except SchedulerError as exc:
        return None, str(exc)
    try:
        return json.loads(out), ""
    except ValueError:
        return None, f"the agent in {box} exited {rc} without a report: " \
            f"{' '.join(err.split())[-160:]}"


def emit(data: dict) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def say(text: str) -> None:
    print(f"umprov gpu health: {text}", file=sys.stderr, flush=True)

