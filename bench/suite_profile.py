"""Where a test run's time goes: a command (default `make test`) run while the machine's CPU is
sampled, split into the lab's hosts (each lab container's cgroup, grouped by lab) and the rest
(pytest, ansible-playbook, this machine's engine, ssh).

    .venv/bin/python bench/suite_profile.py                       # make test
    .venv/bin/python bench/suite_profile.py --by-command -- make test-lab

Wall time, CPU-seconds and how busy the cores were (CPU / (wall x cores)): a suite that keeps
them busy can only get quicker by doing less, one that does not can run more side by side.
`--by-command` (root, Debian's `acct` package) adds CPU-seconds per command name from process
accounting, short-lived processes included. The command's output passes through; the figures
go to stderr at the end and to bench/results/suite_profile.json. Containers that live less than
one interval (3 s) are missed; their CPU stays in the machine's total.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# A lab container's name without its role in the lab: umprov-lab-NAME-3, -repo, -registry, ...
LAB_OF = re.compile(r"^umprov-lab-(.+?)-(\d+|repo|registry|slurmctld)$")


def machine_busy_s() -> float:
    """CPU-seconds the machine has spent busy since boot (/proc/stat, all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def container_cpu_s(cid: str) -> float | None:
    """A container's CPU-seconds from its cgroup (v1 cpuacct, or v2 under either driver)."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    for v2 in (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
               Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat")):
        if v2.is_file():
            usage = dict(line.split() for line in v2.read_text().splitlines())
            return int(usage["usage_usec"]) / 1e6
    return None


class Sampler(threading.Thread):
    """Every ``interval`` s: each running container's CPU, kept as (name, first, last)."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        self.seen: dict[str, list] = {}
        self.before = set(self._running())  # their CPU before the run is not the run's

    def _running(self) -> dict[str, str]:
        out = subprocess.run(["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
                             capture_output=True, text=True, check=False).stdout
        return dict(line.split(maxsplit=1) for line in out.splitlines() if " " in line)

    def sample(self) -> None:
        for cid, name in self._running().items():
            used = container_cpu_s(cid)
            if used is None:
                continue
            entry = self.seen.setdefault(cid, [name, used if cid in self.before else 0.0, used])
            entry[2] = used

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()

    def by_lab(self) -> Counter:
        labs: Counter = Counter()
        for name, first, last in self.seen.values():
            match = LAB_OF.match(name)
            labs[match.group(1) if match else "other containers"] += last - first
        return labs


def by_command(pacct: Path) -> Counter:
    """CPU-seconds per command name from a process accounting file (dump-acct's fields)."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=False)
    totals: Counter = Counter()
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) > 3:
            totals[fields[0]] += (float(fields[2]) + float(fields[3])) / TICK
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--by-command", action="store_true",
                        help="CPU per command name through process accounting (root, acct)")
    parser.add_argument("command", nargs="*", default=["make", "test"])
    args = parser.parse_args()
    if args.by_command and not (shutil.which("accton") and shutil.which("dump-acct")):
        raise SystemExit("--by-command needs Debian's acct package (accton, dump-acct)")
    acct_dir = Path(tempfile.mkdtemp(prefix="umprov-acct-")) if args.by_command else None
    if acct_dir:
        (acct_dir / "pacct").touch()
        subprocess.run(["accton", str(acct_dir / "pacct")], check=True, capture_output=True)
    sampler = Sampler(args.interval)
    busy0, start = machine_busy_s(), time.monotonic()
    sampler.start()
    try:
        rc = subprocess.run(args.command, check=False).returncode
    finally:
        sampler.stop.set()
        if acct_dir:
            subprocess.run(["accton", "off"], check=False, capture_output=True)
    wall, busy = time.monotonic() - start, machine_busy_s() - busy0
    labs = sampler.by_lab()
    cores = os.cpu_count() or 1
    result = {
        "command": args.command, "exit_code": rc, "wall_s": round(wall, 1), "cores": cores,
        "cpu_s": round(busy, 1), "cores_busy": round(busy / (wall * cores), 3),
        "lab_hosts_cpu_s": round(sum(labs.values()), 1),
        "by_lab_cpu_s": {k: round(v, 1) for k, v in labs.most_common()},
    }
    if acct_dir:
        by_name = by_command(acct_dir / "pacct")
        result["by_command_cpu_s"] = {k: round(v, 1) for k, v in by_name.most_common(25)}
        shutil.rmtree(acct_dir, ignore_errors=True)
    path = save("suite_profile", result)
    print(f"\n{' '.join(args.command)}: exit {rc}, {wall:.0f} s, {busy:.0f} CPU-s on {cores} "
          f"cores ({result['cores_busy']:.0%} busy); in lab hosts {result['lab_hosts_cpu_s']:.0f} "
          f"CPU-s: " + ", ".join(f"{k} {v:.0f}" for k, v in labs.most_common(10))
          + f"\n{path}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
