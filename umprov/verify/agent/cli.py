"""The agent's command line (``python3 agent.pyz ARGS``), and the entry of its own children."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable

from .burnin import parse_duration
from .profiles import BUILTIN_PROFILES
from .report import write_report
from .runner import DEFAULT_TIMEOUT, Emitter
from .schema import EXIT_USAGE

DESCRIPTION = "umprov's GPU verification agent: standard library and torch only."


def prog_name() -> str:
    """The name users typed: agent.pyz (or whatever the zipapp is called), else the module."""
    base = os.path.basename(sys.argv[0] or "")
    return base if base and base != "__main__.py" else "python3 -m umprov.verify.agent"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog_name(), description=DESCRIPTION)
    p.add_argument("--json", metavar="OUT", help="write the JSON report here ('-': stdout)")
    p.add_argument("--quick", action="store_true", help="fast subset (seconds)")
    p.add_argument("--expected-gpus", type=int, metavar="N", help="fail with fewer GPUs than N")
    p.add_argument("--profile-file", metavar="F", help="profile overrides (JSON, or YAML)")
    p.add_argument("--profile", metavar="NAME", help="use this profile instead of detecting")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"per child process (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--duration", default="0", metavar="T",
                   help="burn-in: load every GPU at once for T (90s, 10m, 1h) after the checks, "
                   "sampling clocks, temperature, power and throttling (default 0: none)")
    p.add_argument("--exclusive", action="store_true",
                   help="fail, not warn, when another process uses a GPU (a scheduler prolog)")
    p.add_argument("--managed-mib", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no summary on stderr")
    p.add_argument("--list-profiles", action="store_true", help="print the profiles as JSON")
    p.add_argument("--passive", action="store_true",
                   help="reads only, seconds, safe beside a running job: GPU count, driver, "
                   "ECC and row remapping, clock slowdowns, Xids, NVLink links (no torch, no CUDA)")
    add_scheduler_options(p)
    # internal: how the agent starts its own children
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-opts", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--device", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--net-info", nargs="?", const="", metavar="TARGET", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def add_scheduler_options(p: argparse.ArgumentParser) -> None:
    """Check this node, then drain, resume or leave it in the scheduler (docs/slurm.md)."""
    g = p.add_argument_group("scheduler", "check, then act on the scheduler (docs/slurm.md)")
    what = g.add_mutually_exclusive_group()
    what.add_argument("--slurm-health", action="store_true",
                      help="health check: drain on a failing check, resume what umprov drained")
    what.add_argument("--slurm-gate", action="store_true",
                      help="a rolling change's gate: as --slurm-health, and a pass ends its hold")
    what.add_argument("--slurm-hold", metavar="TEXT",
                      help="hold the node for a change (drain, reason 'umprov: rolling TEXT')")
    g.add_argument("--if-held", action="store_true",
                   help="with --slurm-hold: only relabel a hold, never drain a node in service")
    g.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="with --slurm-hold: wait up to S seconds for the node's jobs to end")
    g.add_argument("--poll", type=float, default=10.0, help=argparse.SUPPRESS)
    g.add_argument("--active-when-idle", action="store_true",
                   help="active checks when no job holds the node, else the passive ones")
    g.add_argument("--container", metavar="NAME", help="run active checks in this container")
    g.add_argument("--report", metavar="FILE", help="judge this host report, run no checks")
    g.add_argument("--node", metavar="NAME", help="the node's name (default: SLURMD_NODENAME, "
                   "else the short host name)")
    g.add_argument("--dry-run", action="store_true", help="decide and say, change nothing")
    g.add_argument("--scheduler", choices=("slurm", "hooks"), default="slurm")
    g.add_argument("--drain-command", metavar="CMD", help="hooks: drain (UMPROV_NODE, "
                   "UMPROV_REASON in its environment)")
    g.add_argument("--resume-command", metavar="CMD", help="hooks: resume")
    g.add_argument("--jobs-command", metavar="CMD", help="hooks: print the node's job ids")
    g.add_argument("--marker", metavar="FILE", help=argparse.SUPPRESS)


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for r in doc["records"]:
        if r["verdict"] in ("warn", "fail"):
            unit = f" {r['unit']}" if r["unit"] else ""
            m = "" if r["measured"] is None else f" {r['measured']}{unit}"
            lines.append(f"  {r['verdict'].upper():4} {r['target']:12} {r['check']}:{m} "
                         f"{r['detail']}")
    s = doc["summary"]
    lines.append(f"umprov verify agent: {doc['verdict']} ({s['fail']} fail, {s['warn']} warn, "
                 f"{s['pass']} pass, {s['skip']} skip) in {doc['wall_s']:.1f} s, profile "
                 f"{doc['profile']}")
    return lines


def child_main(args: argparse.Namespace) -> int:
    with open(args.child_opts) as fh:
        opts = json.load(fh)
    kind = args.child
    name = {"gpu": f"gpu{args.device}", "nccl": f"nccl{args.rank}",
            "oversub": f"oversub{args.device}"}.get(kind, kind)
    out = args.child_out
    if kind == "multinode":  # one file per rank: torchrun starts them all with the same argv
        out = f"{out}.{os.environ.get('RANK', '0')}"
    em = Emitter(out, name)
    try:
        if kind == "discover":
            from .discover import child_discover

            child_discover(em, opts)
        elif kind == "gpu":
            from .gpu import child_gpu

            child_gpu(em, opts, int(args.device))
        elif kind == "oversub":
            from .oversub import child_oversub

            child_oversub(em, opts, int(args.device))
        elif kind == "nccl":
            from .nccl import child_nccl

            child_nccl(em, opts, int(args.rank))
        elif kind == "multinode":
            from .multinode import child_multinode

            child_multinode(em, opts)
        elif kind == "monitor":
            from .monitor import child_monitor

            child_monitor(em, opts)
        else:
            raise ValueError(f"unknown child {kind}")
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        em.fh.flush()
        os._exit(1)
    em.fh.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter and CUDA teardown: the parent only needs the file


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.net_info is not None:
        from .multinode import net_info

        print(json.dumps(net_info(args.net_info or None)))
        return 0
    if args.list_profiles:
        print(json.dumps(BUILTIN_PROFILES, indent=2))
        return 0
    prog = prog_name()
    acting = args.slurm_health or args.slurm_gate or args.slurm_hold is not None
    if args.passive and (args.quick or args.duration != "0" or args.exclusive):
        print(f"{prog}: --passive takes no --quick, --duration or --exclusive", file=sys.stderr)
        return EXIT_USAGE
    if not args.json and not acting:
        print(f"{prog}: --json OUT is required", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout <= 0 or (args.expected_gpus is not None and args.expected_gpus < 0):
        print(f"{prog}: --timeout must be > 0 and --expected-gpus >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        args.duration = parse_duration(args.duration)
    except ValueError as exc:
        print(f"{prog}: --duration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if acting:
        from .nodehealth import main as node_main

        return node_main(args)
    try:
        run = prepare(args)
    except (OSError, ValueError) as exc:
        print(f"{prog}: profile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = run()
    write_report(args.json, doc)
    if not args.quiet:
        print("\n".join(summary_lines(doc)), file=sys.stderr)
    return int(doc["exit_code"])


def prepare(args: argparse.Namespace) -> Callable[[], dict]:
    """What gives the host report: a passive or an active run; OSError/ValueError for a
    profile that cannot be read or does not exist."""
    if args.passive:
        from .passive import passive_report
        from .profiles import profiles_for

        profiles, forced = profiles_for(args.profile_file, args.profile)
        return lambda: passive_report(args.expected_gpus, profiles, forced)
    from .host import Agent

    return Agent(args).run
