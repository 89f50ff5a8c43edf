"""Deploy benchmarks against the local lab (bench/README.md, "Deploy").

1. Deploy wall time to 1 and to 4 lab hosts (fresh containers, image already on the hosts),
   and the parallelism ratio: t(4) / t(1) (1.0 would be perfect overlap).
2. ``--push`` throughput against plain OpenSSH in the same run, on the same host and the same
   bytes: ``docker save IMAGE | ssh host 'cat >/dev/null'`` (the transfer alone) and
   ``docker save IMAGE | ssh host 'docker load'`` (what a hand-rolled push costs), versus
   ``umprov deploy --push`` to a host that lacks the image.

    python bench/deploy_bench.py [--hosts 4] [--lab bench] [--image TAG] [--json out.json]

Results go to bench/results/deploy.json (or --json FILE).

Needs root or a Docker engine, like the lab. Builds the lab image if it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
UMPROV = [sys.executable, "-m", "umprov"]


def sh(cmd: list[str] | str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, capture_output=True, shell=isinstance(cmd, str),  # noqa: S602
                          check=False, **kw)


def umprov(*args: str) -> dict[str, Any]:
    done = sh([*UMPROV, *args, "--json"], cwd=REPO)
    if done.returncode != 0:
        what = " ".join(args)
        raise SystemExit(f"umprov {what} failed ({done.returncode}): {done.stderr[-600:]}")
    return json.loads(done.stdout) if done.stdout.strip() else {}


def ssh_base(lab: dict[str, Any], port: int) -> str:
    return (f"ssh -i {lab['key_file']} -p {port} -o UserKnownHostsFile={lab['known_hosts']} "
            "-o StrictHostKeyChecking=yes -o BatchMode=yes -o IdentitiesOnly=yes lab@127.0.0.1")


def ensure_docker(lab: dict[str, Any]) -> None:
    for host in lab["hosts"]:
        base = ssh_base(lab, host["port"])
        if sh(f"{base} docker version").returncode != 0:
            done = sh(f"{base} 'sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive "
                      "apt-get install -y -qq docker.io >/dev/null'")
            if done.returncode != 0:
                raise SystemExit(f"installing docker.io on {host['name']} failed: {done.stderr}")


def clean_host(lab: dict[str, Any], port: int, image: str, *, remove_image: bool) -> None:
    base = ssh_base(lab, port)
    sh(f"{base} 'docker rm -f umprov >/dev/null 2>&1; true'")
    if remove_image:
        sh(f"{base} 'docker rmi -f {image} >/dev/null 2>&1; docker image prune -f >/dev/null'")


def timed(cmd: str) -> float:
    started = time.monotonic()
    done = sh(cmd)
    if done.returncode != 0:
        raise SystemExit(f"{cmd!r} failed: {done.stderr[-400:]}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--lab", default="bench")
    parser.add_argument("--image", default="umprov/pytorch-cuda:0.1.0-lab")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--keep", action="store_true", help="Leave the lab up afterwards.")
    args = parser.parse_args()
    os.environ.setdefault("UMPROV_STATE_DIR", str(REPO / ".lab" / "bench-state"))

    lab = umprov("lab", "up", "--hosts", str(args.hosts), "--name", args.lab)
    ensure_docker(lab)
    if sh(["docker", "image", "inspect", args.image]).returncode != 0:
        print(f"building {args.image}", file=sys.stderr)
        umprov("image", "build", "--lab", "--tag", args.image)
    size = int(sh(["docker", "image", "inspect", "-f", "{{.Size}}", args.image]).stdout.strip())
    inv = lab["inventory"]
    pub = str(Path(lab["key_file"]).with_suffix(".pub"))
    names = [h["name"] for h in lab["hosts"]]
    first = lab["hosts"][0]
    out: dict[str, Any] = {"image": args.image, "image_bytes": size, "hosts": args.hosts,
                           "cpus": os.cpu_count()}

    # --- push throughput, same host, same bytes, same run -----------------------------------
    base = ssh_base(lab, first["port"])
    clean_host(lab, first["port"], args.image, remove_image=True)
    bytes_saved = int(sh(f"docker save {args.image} | wc -c").stdout.strip())
    t_cat = timed(f"docker save {args.image} | {base} 'cat >/dev/null'")
    t_load = timed(f"docker save {args.image} | {base} 'docker load >/dev/null'")
    clean_host(lab, first["port"], args.image, remove_image=True)
    started = time.monotonic()
    res = umprov("deploy", inv, "--limit", first["name"], "--image", args.image, "--push",
                 "--authorized-key", pub)
    t_deploy = time.monotonic() - started
    host = res["hosts"][0]
    t_push = host["push_seconds"]
    out["push"] = {
        "bytes": bytes_saved,
        "ssh_cat_s": round(t_cat, 2),
        "ssh_docker_load_s": round(t_load, 2),
        "umprov_push_s": round(t_push, 2),
        "umprov_deploy_total_s": round(t_deploy, 2),
        "ssh_cat_MBps": round(bytes_saved / t_cat / 1e6, 1),
        "ssh_docker_load_MBps": round(bytes_saved / t_load / 1e6, 1),
        "umprov_push_MBps": round(host["pushed_bytes"] / t_push / 1e6, 1) if t_push else None,
        "ratio_vs_ssh_cat": round(t_cat / t_push, 2) if t_push else None,
        "ratio_vs_ssh_docker_load": round(t_load / t_push, 2) if t_push else None,
    }

    # --- push to all hosts at once (one docker save, fanned out) ----------------------------
    for h in lab["hosts"]:
        clean_host(lab, h["port"], args.image, remove_image=True)
    started = time.monotonic()
    res = umprov("deploy", inv, "--image", args.image, "--push", "--authorized-key", pub)
    out["push_all"] = {"hosts": len(names), "seconds": round(time.monotonic() - started, 2),
                       "per_host_MBps": [round(h["pushed_bytes"] / h["push_seconds"] / 1e6, 1)
                                         for h in res["hosts"] if h["push_seconds"]]}

    # --- deploy wall time, image present, fresh containers ----------------------------------
    walls = {}
    for count in (1, len(names)):
        runs = []
        for _ in range(3):
            for h in lab["hosts"]:
                clean_host(lab, h["port"], args.image, remove_image=False)
            started = time.monotonic()
            umprov("deploy", inv, "--limit", ",".join(names[:count]), "--image", args.image,
                   "--authorized-key", pub)
            runs.append(time.monotonic() - started)
        walls[count] = sorted(runs)[1]
    started = time.monotonic()
    umprov("deploy", inv, "--image", args.image, "--authorized-key", pub)
    unchanged = time.monotonic() - started
    out["deploy"] = {
        "wall_1_host_s": round(walls[1], 2),
        f"wall_{len(names)}_hosts_s": round(walls[len(names)], 2),
        "parallel_ratio": round(walls[len(names)] / walls[1], 2),
        f"redeploy_unchanged_{len(names)}_hosts_s": round(unchanged, 2),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    else:
        from _common import save  # bench/_common.py: bench/results/deploy.json

        save("deploy", out)
    if not args.keep:
        umprov("lab", "down", "--name", args.lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
