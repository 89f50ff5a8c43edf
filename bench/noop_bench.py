"""A converged host's cost: `site.yml` with nothing to change against trivial tasks.

    sudo .venv/bin/python bench/noop_bench.py [--lab bench-noop] [--hosts 8] [--rounds 3]
                                              [--tasks 58] [--old CHECKOUT]

On one lab (converged once first, not timed), interleaved round by round, both through
`umprov provision` (ansible-runner, umprov's strategy), from a scratch project that holds
umprov's ansible.cfg, roles and playbooks plus one more playbook: as many `ansible.builtin.ping`
tasks as site.yml starts per host on a converged host (the baseline: Ansible's floor per task).
Reports each run's wall time, the tasks ok / changed / skipped per host, and the ratio. With
--old, site.yml from another checkout's roles and playbooks runs too, in the same rounds (the
before of a change; `git worktree add /tmp/old REV`).
Results: bench/results/noop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import save  # noqa: E402

REPO = HERE.parent


def umprov(project: Path, *args: str) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "umprov", *args, "--json"], cwd=REPO,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "UMPROV_PROJECT_DIR": str(project)})
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"umprov {' '.join(args)} failed ({done.returncode}): "
                         f"{done.stderr[-800:]}")
    return took, json.loads(done.stdout)


def counts(doc: dict) -> dict:
    hosts = doc.get("hosts") or []
    first = hosts[0] if hosts else {}
    return {k: first.get(k) for k in ("ok", "changed", "skipped", "failed") if k in first}


def project(work: Path, tasks: int, source: Path = REPO) -> Path:
    root = work / "project"
    (root / "playbooks").mkdir(parents=True)
    shutil.copy(source / "ansible.cfg", root / "ansible.cfg")
    (root / "roles").symlink_to(source / "roles")
    (root / "playbooks" / "roles").symlink_to(source / "roles")
    (root / "inventory").symlink_to(REPO / "inventory")
    for play in (source / "playbooks").glob("*.yml"):
        (root / "playbooks" / play.name).symlink_to(play)
    pings = [{"name": f"ping {i}", "ansible.builtin.ping": {}} for i in range(tasks)]
    (root / "playbooks" / "pings.yml").write_text(json.dumps([
        {"name": "Trivial tasks", "hosts": "all", "gather_facts": False, "become": True,
         "tasks": pings}]))
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", default="bench-noop")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=0,
                    help="ping tasks (default: as many as site.yml starts per host)")
    ap.add_argument("--old", type=Path, help="another checkout whose site.yml runs too")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "umprov", "lab", "up", "--name", args.lab,
                    "--hosts", str(args.hosts)], cwd=REPO, check=True, capture_output=True)
    inventory = f"lab/{args.lab}"
    try:
        with tempfile.TemporaryDirectory(prefix="umprov-noop-") as tmp:
            root = project(Path(tmp), 1)
            umprov(root, "provision", inventory)  # converge (not timed)
            _, doc = umprov(root, "provision", inventory)
            site_counts = counts(doc)
            started = sum(v for k, v in site_counts.items() if k in ("ok", "changed",
                                                                     "skipped"))
            tasks = args.tasks or started or 57
            roots = {"site": project(Path(tmp) / "b", tasks)}
            roots["pings"] = roots["site"]
            if args.old:
                roots["old"] = project(Path(tmp) / "old", 1, args.old.resolve())
                _, doc = umprov(roots["old"], "provision", inventory)
                old_counts = counts(doc)
            times: dict[str, list[float]] = {name: [] for name in roots}
            for r in range(args.rounds):
                order = list(roots) if r % 2 == 0 else list(reversed(roots))
                for name in order:
                    playbook = ["--playbook", "pings.yml"] if name == "pings" else []
                    took, doc = umprov(roots[name], "provision", inventory, *playbook)
                    if name != "pings" and any(h.get("changed") for h in doc.get("hosts", [])):
                        raise SystemExit(f"{name}: the no-op changed something: {counts(doc)}")
                    times[name].append(round(took, 2))
            medians = {name: statistics.median(runs) for name, runs in times.items()}
            result = {"hosts": args.hosts, "site_counts_per_host": site_counts,
                      "ping_tasks": tasks, "runs_s": times, "site_s": medians["site"],
                      "pings_s": medians["pings"],
                      "ratio": round(medians["site"] / medians["pings"], 2)}
            if args.old:
                result.update(old_counts_per_host=old_counts, old_s=medians["old"],
                              old_ratio=round(medians["old"] / medians["pings"], 2))
            save("noop", result)
    finally:
        if not args.keep:
            subprocess.run([sys.executable, "-m", "umprov", "lab", "down", "--name", args.lab],
                           cwd=REPO, capture_output=True, check=False)


if __name__ == "__main__":
    main()
