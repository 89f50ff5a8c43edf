"""The cost of a rolling change's safety, and how fast Slurm's health check drains a sick node
(bench/README.md, "Rolling changes on Slurm").

On one Slurm lab (`umprov lab up --slurm`, 8 hosts by default), in the same run:

    unbatched  `umprov provision --only toolkit` over every host at once (the baseline)
    rolling    `umprov provision --rolling --only toolkit --canary 1 --batch 3,4`: batches
               1 + 3 + 4, each host held (scontrol drain), changed, gated by the passive
               checks, resumed

The toolkit is converged first (one unbatched run, not timed), so both figures are the same
idempotent change and the ratio is what holding, gating and resuming node by node costs, per
batch and per host. Then ``health``: the slurm_gpu_health role with HealthCheckInterval I on one
node that expects a GPU it lacks; Slurm's drain time (sinfo %H) minus the program's mtime is the
time from the node going sick to drained, against I.

    python bench/rolling_bench.py [--lab bench-roll] [--hosts 8] [--interval 15] [--keep]

Results go to bench/results/rolling.json. Needs the lab (a Docker engine, root).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402
from _common import umprov_json as umprov  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HEALTH_PLAY = [{"name": "The GPU health check", "hosts": "slurm_compute", "become": True,
                "gather_facts": False, "roles": ["slurm_gpu_health"]}]


def on_controller(lab: dict[str, Any], *argv: str) -> str:
    return subprocess.run(["docker", "exec", lab["slurm"]["controller"], *argv],
                          capture_output=True, text=True, check=True).stdout


def rolling_figures(lab: dict[str, Any], old: str | None = None,
                    rounds: int = 1) -> dict[str, Any]:
    """The unbatched run, then the rolling one; with ``old`` (a checkout), the rolling run of
    its playbooks too, interleaved round by round (UMPROV_PROJECT_DIR picks the content)."""
    inventory = lab["inventory"]
    umprov("provision", inventory, "--only", "toolkit")  # converge first: both runs are no-ops
    unbatched, _ = umprov("provision", inventory, "--only", "toolkit")
    builds = {"new": None, **({"old": old} if old else {})}
    times: dict[str, list[float]] = {name: [] for name in builds}
    doc: dict[str, Any] = {}
    for r in range(rounds):
        for name in (list(builds) if r % 2 == 0 else list(reversed(builds))):
            with _content(builds[name]):
                rolled, got = umprov("provision", inventory, "--rolling", "--only", "toolkit",
                                     "--canary", "1", "--batch", "3,4")
            times[name].append(round(rolled, 1))
            if name == "new":
                doc = got
    batches = [len(b) for b in doc["batches"]]
    rolled = sorted(times["new"])[len(times["new"]) // 2]
    out = {"hosts": len(lab["hosts"]), "batches": batches,
           "unbatched_s": round(unbatched, 1), "rolling_s": rolled, "rolling_runs_s": times,
           "ratio": round(rolled / unbatched, 2),
           "rolling_per_batch_s": round(rolled / len(batches), 1),
           "actions": sorted({h["action"] for h in doc["hosts"]})}
    if old:
        before = sorted(times["old"])[len(times["old"]) // 2]
        out.update(old_rolling_s=before, old_ratio=round(before / unbatched, 2))
    return out


@contextlib.contextmanager
def _content(folder: str | None) -> Any:
    saved = os.environ.get("UMPROV_PROJECT_DIR")
    if folder:
        os.environ["UMPROV_PROJECT_DIR"] = folder
    try:
        yield
    finally:
        os.environ.pop("UMPROV_PROJECT_DIR", None)
        if saved is not None:
            os.environ["UMPROV_PROJECT_DIR"] = saved


def apply_health(lab: dict[str, Any], node: str, expected: int, interval: int,
                 folder: Path) -> None:
    inv = yaml.safe_load(Path(lab["inventory"]).read_text())
    inv["all"]["children"]["slurm_compute"]["hosts"][node] = {"umprov_expected_gpus": expected}
    (folder / "inv.yml").write_text(yaml.safe_dump(inv))
    (folder / "play.yml").write_text(yaml.safe_dump(HEALTH_PLAY))
    subprocess.run([str(BIN / "ansible-playbook"), "-i", str(folder / "inv.yml"),
                    str(folder / "play.yml"), "--limit", node,
                    "-e", f"slurm_gpu_health_interval={interval}"],
                   cwd=REPO, capture_output=True, check=True,
                   env={**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles")})


def health_figures(lab: dict[str, Any], interval: int) -> dict[str, Any]:
    node, container = lab["hosts"][-1]["name"], lab["hosts"][-1]["container"]
    with tempfile.TemporaryDirectory() as tmp:
        apply_health(lab, node, 1, interval, Path(tmp))
        deadline = time.monotonic() + 10 * interval
        while not on_controller(lab, "sinfo", "-h", "-N", "-n", node, "-o", "%T").startswith(
                "drained"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{node} not drained within {10 * interval} s")
            time.sleep(0.5)
        at = on_controller(lab, "sinfo", "-h", "-N", "-n", node, "-o", "%H").strip()
        mtime = subprocess.run(["docker", "exec", container, "stat", "-c", "%Y",
                                "/usr/local/sbin/umprov-gpu-health"],
                               capture_output=True, text=True, check=True).stdout
        drained = datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp() - float(mtime)
        apply_health(lab, node, 0, 300, Path(tmp))  # healed, and the default interval back
    return {"interval_s": interval, "sick_to_drained_s": round(drained),
            "in_intervals": round(drained / interval, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="bench-roll")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--interval", type=int, default=15, help="HealthCheckInterval, seconds")
    ap.add_argument("--only", default="rolling,health")
    ap.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    ap.add_argument("--old", metavar="CHECKOUT", help="also the rolling run of this checkout's "
                    "playbooks, interleaved (an A/B)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    took, lab = umprov("lab", "up", "--slurm", "--name", args.lab, "--hosts", str(args.hosts))
    results: dict[str, Any] = {"lab_up_s": round(took, 1)}
    try:
        if "rolling" in args.only:
            results["rolling"] = rolling_figures(lab, args.old, args.rounds)
        if "health" in args.only:
            results["health"] = health_figures(lab, args.interval)
    finally:
        if not args.keep:
            umprov("lab", "down", "--name", args.lab)
    results["load_average"] = os.getloadavg()
    save("rolling", results)


if __name__ == "__main__":
    main()
