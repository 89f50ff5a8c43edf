"""Multi-node verification benchmark against the local lab (bench/README.md, "Multi-node").

Time from command to report of ``umprov verify INVENTORY --multi-node --backend gloo`` over
N lab hosts (default 3), repeated, and where the time goes, from the reports' timings:
container start and agent copy, torchrun start-up until the ranks run, rendezvous with process
group init, collectives, and the rest (connections, cleanup, the CLI itself).

    python bench/multinode_bench.py [--hosts 3] [--lab bench-mn] [--repeat 3] [--keep]

Results go to bench/results/multinode.json. Brings up its own lab (Docker provisioned with
``provision --only docker``, the lab image built or reused, deployed with --push) and takes it
down afterwards unless --keep. The 2-GPU NCCL figure comes from tests/gpu/test_multinode_gpu.py
on the H200 machine (README).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
UMPROV = [sys.executable, "-m", "umprov"]
TAG = "umprov/pytorch-cuda:pytest-lab"


def umprov(*args: str, ok: tuple[int, ...] = (0,)) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    done = subprocess.run([*UMPROV, *args, "--json"], cwd=REPO, text=True,  # noqa: S603
                          capture_output=True, check=False)
    secs = time.perf_counter() - t0
    if done.returncode not in ok:
        raise SystemExit(f"umprov {' '.join(args)} failed ({done.returncode}): "
                         f"{done.stderr[-600:]}")
    return (json.loads(done.stdout) if done.stdout.strip() else {}), secs


def med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--lab", default="bench-mn")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    lab, up_s = umprov("lab", "up", "--hosts", str(args.hosts), "--name", args.lab)
    try:
        inv = lab["inventory"]
        _, prov_s = umprov("provision", inv, "--only", "docker")
        _, build_s = umprov("lab", "image", "--tag", TAG)
        pub = str(Path(lab["key_file"]).with_suffix(".pub"))
        _, deploy_s = umprov("deploy", inv, "--image", TAG, "--authorized-key", pub, "--push")
        runs = []
        for _ in range(args.repeat):
            doc, secs = umprov("verify", inv, "--multi-node", "--backend", "gloo", "--timeout",
                               "60")
            if doc.get("verdict") != "pass":
                raise SystemExit(f"verify did not pass: {json.dumps(doc)[:800]}")
            t = [h["facts"]["timings"] for h in doc["hosts"]]
            phases = {k: max((x[k] or 0) for x in t) for k in
                      ("container_s", "startup_s", "rendezvous_s", "collectives_s", "torchrun_s")}
            phases["other_s"] = round(secs - phases["container_s"] - phases["torchrun_s"], 2)
            runs.append({"command_s": round(secs, 2), **phases,
                         "busbw_gbps": doc["hosts"][0]["records"][-1]["measured"]})
            print(json.dumps(runs[-1]), flush=True)
        summary = {k: med([r[k] for r in runs]) for k in runs[0]}
        save("multinode", {"hosts": args.hosts, "backend": "gloo", "setup_s": {
            "lab_up": round(up_s, 1), "provision_docker": round(prov_s, 1),
            "image_build": round(build_s, 1), "deploy_push": round(deploy_s, 1)},
            "runs": runs, "median": summary})
    finally:
        if not args.keep:
            subprocess.run([*UMPROV, "lab", "down", "--name", args.lab], cwd=REPO,  # noqa: S603
                           capture_output=True, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
