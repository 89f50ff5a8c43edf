"""Load: one lab of N hosts provisioned and deployed in one run each (bench/README.md, "Load").

Brings up a lab of ``--hosts`` hosts (default 16), then runs, once each and timed:

    umprov provision INVENTORY --json [--only docker]
    umprov deploy INVENTORY --push --image TAG --json      (one docker save, fanned out)
    umprov status INVENTORY --json

and checks that nothing is lost or reported twice: every host appears exactly once in each JSON
document and in each summary table (stderr), every host converged (provision: ok or changed,
nothing failed or unreachable), was deployed (created, replaced or unchanged) and runs its
container with Jupyter answering. Reported: wall time per command, hosts held in one run, and
per-host timings (provision: from the ansible-runner events, first task start to last task end,
and the busiest task; deploy: total, push seconds and bytes).

    python bench/load_bench.py [--hosts 16] [--lab load] [--only docker] [--image TAG] [--keep]

Results go to bench/results/load.json (or --json FILE). The lab's stand-in of NVIDIA's repositories
makes the full site.yml possible; ``--only docker`` runs the preflight checks and the Docker role
only (what deploy needs), for machines where the full converge of N hosts takes too long.
Needs root or a Docker engine, like the lab; builds the lab image when the tag is missing.
The lab is taken down at the end (its hosts hold a copy of the image each) unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
UMPROV = [sys.executable, "-m", "umprov"]


def run(label: str, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[dict[str, Any], str, float]:
    """`umprov ARGS --json`: (JSON document, stderr, wall seconds); stops the bench on failure."""
    started = time.monotonic()
    done = subprocess.run([*UMPROV, *args, "--json"], cwd=REPO, capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    print(f"{label}: exit {done.returncode} in {seconds:.1f} s", file=sys.stderr, flush=True)
    if done.returncode not in ok:
        raise SystemExit(f"umprov {' '.join(args)} failed ({done.returncode}): "
                         f"{done.stderr[-1500:]}")
    return (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr, seconds


def summary_rows(stderr: str, title: str) -> list[str]:
    """The first cell of each row of the last plain-text table titled ``title...``."""
    start = stderr.rfind(title)
    if start < 0:
        raise SystemExit(f"no summary table titled {title!r} on stderr")
    lines = stderr[start:].splitlines()[2:]  # the title, then the header
    return [ln.split()[0] for ln in lines if ln.strip() and not ln.startswith("umprov:")]


def exactly_once(what: str, names: list[str], seen: list[str]) -> dict[str, Any]:
    counts = Counter(seen)
    missing = sorted(set(names) - set(counts))
    twice = sorted(n for n, c in counts.items() if c > 1)
    extra = sorted(set(counts) - set(names))
    return {"what": what, "rows": len(seen), "missing": missing, "twice": twice, "extra": extra,
            "ok": not (missing or twice or extra)}


def provision_host_timings(artifacts: str) -> dict[str, dict[str, Any]]:
    """Per host, from ansible-runner's events: first task start to last task end, task count,
    and the slowest task."""
    from datetime import datetime

    per: dict[str, dict[str, Any]] = {}
    for path in Path(artifacts).glob("artifacts/*/job_events/*.json"):
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data = event.get("event_data") or {}
        host, start, end = data.get("host"), data.get("start"), data.get("end")
        if not (host and start and end and event.get("event", "").startswith("runner_on_")):
            continue
        t0, t1 = datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()
        row = per.setdefault(host, {"first": t0, "last": t1, "tasks": 0, "slowest": ("", 0.0)})
        row["first"], row["last"] = min(row["first"], t0), max(row["last"], t1)
        row["tasks"] += 1
        if t1 - t0 > row["slowest"][1]:
            row["slowest"] = (str(data.get("task", "")), t1 - t0)
    return {
        host: {"span_s": round(r["last"] - r["first"], 1), "task_results": r["tasks"],
               "slowest_task": r["slowest"][0], "slowest_task_s": round(r["slowest"][1], 1)}
        for host, r in sorted(per.items())
    }


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1),
            "max": round(max(values), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--lab", default="load")
    parser.add_argument("--only", choices=["docker"], help="provision --only docker (faster)")
    parser.add_argument("--image", default="umprov/pytorch-cuda:0.1.0-lab")
    parser.add_argument("--json", dest="json_out", help="Write the results here instead.")
    parser.add_argument("--keep", action="store_true", help="Leave the lab up afterwards.")
    args = parser.parse_args()
    os.environ.setdefault("UMPROV_STATE_DIR", str(REPO / ".lab" / f"{args.lab}-state"))

    out: dict[str, Any] = {"hosts": args.hosts, "lab": args.lab, "image": args.image,
                           "provision_only": args.only or "site.yml (all roles)"}
    try:
        lab, _, t_up = run("lab up", "lab", "up", "--hosts", str(args.hosts), "--name", args.lab)
        names = [h["name"] for h in lab["hosts"]]
        inv = lab["inventory"]
        pub = str(Path(lab["key_file"]).with_suffix(".pub"))
        if subprocess.run(["docker", "image", "inspect", args.image],
                          capture_output=True, check=False).returncode:
            run("lab image", "lab", "image", "--tag", args.image)

        only = ["--only", args.only] if args.only else []
        prov, prov_err, t_prov = run("provision", "provision", inv, *only, ok=(0, 10, 11))
        dep, dep_err, t_dep = run("deploy --push", "deploy", inv, "--push", "--image", args.image,
                                  "--authorized-key", pub, ok=(0, 10, 11))
        stat, _, t_stat = run("status", "status", inv, ok=(0, 11))

        checks = [
            exactly_once("provision JSON", names, [h["host"] for h in prov["hosts"]]),
            exactly_once("provision summary", names, summary_rows(prov_err, "provision: ")),
            exactly_once("deploy JSON", names, [h["host"] for h in dep["hosts"]]),
            exactly_once("deploy summary", names,
                         summary_rows(dep_err, f"deploy: {len(names)} host(s) in")),
            exactly_once("status JSON", names, [h["host"] for h in stat["hosts"]]),
        ]
        converged = [h["host"] for h in prov["hosts"]
                     if h["status"] in ("ok", "changed") and not h["failed"]]
        deployed = [h["host"] for h in dep["hosts"] if h["ok"]]
        running = [r["host"] for r in stat["hosts"]
                   if r.get("state") == "running" and r.get("jupyter")]
        prov_hosts = provision_host_timings(prov["artifacts"])
        dep_hosts = {h["host"]: {"status": h["status"], "seconds": h["seconds"],
                                 "push_seconds": h["push_seconds"],
                                 "pushed_MB": round(h["pushed_bytes"] / 1e6, 1)}
                     for h in dep["hosts"]}
        out.update({
            "cpus": os.cpu_count(),
            "wall_s": {"lab_up": round(t_up, 1), "provision": round(t_prov, 1),
                       "deploy_push": round(t_dep, 1), "status": round(t_stat, 1)},
            "provision_strategy": prov.get("strategy"),
            "provision_exit_code": prov.get("exit_code"),
            "deploy_exit_code": dep.get("exit_code"),
            "hosts_held": {"provisioned": len(converged), "deployed": len(deployed),
                           "running_with_jupyter": len(running), "of": len(names)},
            "exactly_once": checks,
            "all_ok": all(c["ok"] for c in checks)
            and len(converged) == len(deployed) == len(running) == len(names),
            "per_host_spread": {
                "provision_span_s": spread([r["span_s"] for r in prov_hosts.values()]),
                "deploy_s": spread([r["seconds"] for r in dep_hosts.values()]),
                "push_s": spread([r["push_seconds"] for r in dep_hosts.values()
                                  if r["pushed_MB"]]),
            },
            "pushed_GB_total": round(sum(r["pushed_MB"] for r in dep_hosts.values()) / 1e3, 2),
            "per_host": {n: {"provision": prov_hosts.get(n), "deploy": dep_hosts.get(n)}
                         for n in names},
        })
        failed = [c["what"] for c in checks if not c["ok"]]
        if failed or not out["all_ok"]:
            print(f"LOAD CHECK FAILED: {failed or out['hosts_held']}", file=sys.stderr)
    finally:
        if not args.keep:
            subprocess.run([*UMPROV, "lab", "down", "--name", args.lab], cwd=REPO,
                           capture_output=True, check=False)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    else:
        save("load", out)
    return 0 if out.get("all_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
