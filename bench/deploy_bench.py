"""Deploy benchmarks against the local lab (bench/README.md, "Deploy").

1. Where a ``--push`` spends its time, in one run, on the same host and the same bytes (median
   of ``--repeat`` rounds, each round measuring every figure once, interleaved):
   ``docker save IMAGE >/dev/null`` here (the source alone), ``docker save IMAGE | ssh host
   'cat >/dev/null'`` (source + transport), ``docker load -i FILE`` on the host from a file
   already there (the sink alone: no SSH), ``docker save IMAGE | ssh host 'docker load'`` (a
   hand-rolled push) and ``umprov deploy --push`` to a host that lacks the image; the push as a
   ratio of each.
2. Incremental push: the host holds IMAGE (v1); v2 is IMAGE plus one small layer, built here.
   ``--push`` of v2 (only the new layer crosses) against a full ``--push`` of v2 to a host
   without v1: push time, deploy wall time and bytes sent.
3. ``--push`` to all hosts at once (one docker save, fanned out).
4. Deploy wall time to 1 and to all lab hosts (fresh containers, image already on the hosts),
   and the parallelism ratio t(N) / t(1) (1.0 would be perfect overlap).

    python bench/deploy_bench.py [--hosts 4] [--lab bench] [--image TAG] [--repeat 3]
                                 [--only push,incremental,fanout,deploy] [--json out.json]

Results go to bench/results/deploy.json (or --json FILE).

Needs root or a Docker engine, like the lab. Builds the lab image if it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def host_timed(base: str, command: str) -> float:
    """Seconds a command takes on the host, timed there (no SSH set-up in the figure)."""
    done = sh(f"{base} 's=$(date +%s.%N); {command}; rc=$?; e=$(date +%s.%N); "
              "echo \"$rc $s $e\"'")
    fields = done.stdout.split()
    if done.returncode != 0 or len(fields) < 3 or fields[-3] != "0":
        raise SystemExit(f"{command!r} on the host failed: {done.stdout[-300:]} "
                         f"{done.stderr[-300:]}")
    return float(fields[-1]) - float(fields[-2])


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def build_v2(image: str, tag: str) -> str:
    """IMAGE plus one small layer (a 4 KiB file), built on this machine's engine."""
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(f"FROM {image}\nCOPY v2.bin /etc/umprov-v2.bin\n")
        Path(ctx, "v2.bin").write_bytes(os.urandom(4096))
        done = sh(["docker", "build", "-q", "-t", tag, ctx])
    if done.returncode != 0:
        raise SystemExit(f"building {tag} failed: {done.stderr[-400:]}")
    return done.stdout.strip().splitlines()[-1]


def push(inv: str, host: str, image: str, pub: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    res = umprov("deploy", inv, "--limit", host, "--image", image, "--push",
                 "--authorized-key", pub)
    return res["hosts"][0], time.monotonic() - started


def bench_push(lab: dict[str, Any], image: str, inv: str, pub: str, repeat: int) -> dict[str, Any]:
    """Where a full push spends its time: each figure once per round, medians over rounds."""
    first = lab["hosts"][0]
    base = ssh_base(lab, first["port"])
    nbytes = int(sh(f"docker save {image} | wc -c").stdout.strip())
    tar = "/var/tmp/umprov-bench-image.tar"
    keys = ("save_devnull", "ssh_cat", "host_file_load", "ssh_docker_load", "umprov_push",
            "umprov_push_stream")
    runs: dict[str, list[float]] = {k: [] for k in keys}
    deploy_total: list[float] = []
    for _ in range(repeat):
        runs["save_devnull"].append(timed(f"docker save {image} >/dev/null"))
        runs["ssh_cat"].append(timed(f"docker save {image} | {base} 'cat >/dev/null'"))
        # The sink alone: the tar already on the host, docker load from the file.
        clean_host(lab, first["port"], image, remove_image=True)
        timed(f"docker save {image} | {base} 'cat >{tar}'")
        sh(f"{base} 'sync'")
        runs["host_file_load"].append(host_timed(base, f"docker load -i {tar} >/dev/null"))
        sh(f"{base} 'rm -f {tar}'")
        clean_host(lab, first["port"], image, remove_image=True)
        runs["ssh_docker_load"].append(
            timed(f"docker save {image} | {base} 'docker load >/dev/null'"))
        clean_host(lab, first["port"], image, remove_image=True)
        host, total = push(inv, first["name"], image, pub)
        if host["pushed_bytes"] < nbytes or host["skipped_bytes"]:
            raise SystemExit(f"expected a full push, got {host}")
        runs["umprov_push"].append(host["push_seconds"])
        # Until the host's engine had read the last byte; the rest is its docker load.
        runs["umprov_push_stream"].append(host["push_stream_seconds"])
        deploy_total.append(total)
    med = {k: median(v) for k, v in runs.items()}
    out: dict[str, Any] = {"bytes": nbytes, "rounds": repeat}
    for k in keys:
        out[f"{k}_s"] = med[k]
        out[f"{k}_MBps"] = round(nbytes / med[k] / 1e6, 1)
        out[f"{k}_runs_s"] = [round(x, 2) for x in runs[k]]
    out["umprov_deploy_total_s"] = median(deploy_total)
    # Throughput ratios (same bytes): push / X = t_X / t_push, median of the per-round ratios.
    for k in keys[:4]:
        out[f"push_vs_{k}"] = round(statistics.median(
            [a / b for a, b in zip(runs[k], runs["umprov_push"], strict=True)]), 2)
    # The transfer alone (what `ssh cat` measures) against the same bytes through OpenSSH.
    out["push_stream_vs_ssh_cat"] = round(statistics.median(
        [a / b for a, b in zip(runs["ssh_cat"], runs["umprov_push_stream"], strict=True)]), 2)
    return out


def bench_incremental(lab: dict[str, Any], image: str, inv: str, pub: str,
                      repeat: int) -> dict[str, Any]:
    """v1 (IMAGE) on the host, push v2 (IMAGE + a small layer) vs a full push of v2."""
    first = lab["hosts"][0]
    base = ssh_base(lab, first["port"])
    v2 = image.rsplit(":", 1)[0] + ":bench-v2"
    v2_id = build_v2(image, v2)
    v2_bytes = int(sh(f"docker save {v2} | wc -c").stdout.strip())
    inc: list[dict[str, Any]] = []
    full: list[dict[str, Any]] = []
    try:
        for _ in range(repeat):
            # incremental: v1 on the host (pushed in full when missing), v2 not
            clean_host(lab, first["port"], v2, remove_image=True)
            if sh(f"{base} docker image inspect {image}").returncode != 0:
                sh(f"docker save {image} | {base} 'docker load >/dev/null'")
            host, total = push(inv, first["name"], v2, pub)
            if host["image_id"] != v2_id or not host["skipped_bytes"]:
                raise SystemExit(f"expected an incremental push of {v2_id}, got {host}")
            inc.append({**host, "deploy_s": total})
            # full: neither v1 nor v2 on the host
            clean_host(lab, first["port"], v2, remove_image=True)
            clean_host(lab, first["port"], image, remove_image=True)
            host, total = push(inv, first["name"], v2, pub)
            if host["skipped_bytes"] or host["pushed_bytes"] < v2_bytes:
                raise SystemExit(f"expected a full push, got {host}")
            full.append({**host, "deploy_s": total})
        t_save = median([timed(f"docker save {v2} >/dev/null") for _ in range(repeat)])
    finally:
        clean_host(lab, first["port"], v2, remove_image=True)
        sh(["docker", "rmi", v2])

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "push_s": median([r["push_seconds"] for r in rows]),
            "deploy_s": median([r["deploy_s"] for r in rows]),
            "pushed_bytes": int(statistics.median([r["pushed_bytes"] for r in rows])),
            "skipped_bytes": int(statistics.median([r["skipped_bytes"] for r in rows])),
            "push_runs_s": [round(r["push_seconds"], 2) for r in rows],
        }

    out = {"v2_saved_bytes": v2_bytes, "rounds": repeat, "incremental": summary(inc),
           "full": summary(full), "local_save_devnull_s": t_save}
    out["push_time_ratio_incremental_vs_full"] = round(statistics.median(
        [a["push_seconds"] / b["push_seconds"] for a, b in zip(inc, full, strict=True)]), 3)
    out["bytes_ratio_incremental_vs_full"] = round(
        out["incremental"]["pushed_bytes"] / out["full"]["pushed_bytes"], 5)
    return out


def bench_fanout(lab: dict[str, Any], image: str, inv: str, pub: str) -> dict[str, Any]:
    """--push to every host at once: one docker save, fanned out."""
    for h in lab["hosts"]:
        clean_host(lab, h["port"], image, remove_image=True)
    started = time.monotonic()
    res = umprov("deploy", inv, "--image", image, "--push", "--authorized-key", pub)
    return {"hosts": len(lab["hosts"]), "seconds": round(time.monotonic() - started, 2),
            "per_host_MBps": [round(h["pushed_bytes"] / h["push_seconds"] / 1e6, 1)
                              for h in res["hosts"] if h["push_seconds"]]}


def bench_deploy(lab: dict[str, Any], image: str, inv: str, pub: str) -> dict[str, Any]:
    """Deploy wall time, image present, fresh containers: 1 host and every host."""
    names = [h["name"] for h in lab["hosts"]]
    for h in lab["hosts"]:  # the image on every host first
        if sh(f"{ssh_base(lab, h['port'])} docker image inspect {image}").returncode != 0:
            umprov("deploy", inv, "--limit", h["name"], "--image", image, "--push",
                   "--authorized-key", pub)
    walls = {}
    for count in (1, len(names)):
        runs = []
        for _ in range(3):
            for h in lab["hosts"]:
                clean_host(lab, h["port"], image, remove_image=False)
            started = time.monotonic()
            umprov("deploy", inv, "--limit", ",".join(names[:count]), "--image", image,
                   "--authorized-key", pub)
            runs.append(time.monotonic() - started)
        walls[count] = sorted(runs)[1]
    started = time.monotonic()
    umprov("deploy", inv, "--image", image, "--authorized-key", pub)
    unchanged = time.monotonic() - started
    return {
        "wall_1_host_s": round(walls[1], 2),
        f"wall_{len(names)}_hosts_s": round(walls[len(names)], 2),
        "parallel_ratio": round(walls[len(names)] / walls[1], 2),
        f"redeploy_unchanged_{len(names)}_hosts_s": round(unchanged, 2),
    }


def split_cpus(lab: dict[str, Any], name: str) -> Callable[[], None]:
    """Give the sender and the lab hosts CPUs of their own, as on separate machines.

    The last CPU goes to the lab hosts' containers (their sshd and their own dockerd, which
    runs `docker load`); the others to this process (and so the ssh client, the docker CLI and
    umprov it starts) and to this machine's dockerd and containerd (which run `docker save`).
    Returns the function that puts everything back.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--split-cpus needs 2 CPUs at least")
    sender, sink = cpus[:-1], cpus[-1]
    sender_list = ",".join(map(str, sender))
    everything = ",".join(map(str, cpus))
    containers = [f"umprov-lab-{name}-{i}" for i in range(1, len(lab["hosts"]) + 1)]
    # This machine's own daemons only: the lab hosts run a dockerd each, in their own PID
    # namespace, and theirs belong to the sink.
    own_ns = os.readlink("/proc/self/ns/pid")
    daemons = [p for d in ("dockerd", "containerd") for p in sh(["pidof", d]).stdout.split()
               if os.readlink(f"/proc/{p}/ns/pid") == own_ns]
    for container in containers:
        sh(["docker", "update", "--cpuset-cpus", str(sink), container])
    for pid in daemons:
        sh(["taskset", "-a", "-p", "-c", sender_list, pid])
    os.sched_setaffinity(0, sender)

    def restore() -> None:
        os.sched_setaffinity(0, cpus)
        for pid in daemons:
            sh(["taskset", "-a", "-p", "-c", everything, pid])
        for container in containers:
            sh(["docker", "update", "--cpuset-cpus", everything, container])

    return restore


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--lab", default="bench")
    parser.add_argument("--image", default="umprov/pytorch-cuda:0.1.0-lab")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--repeat", type=int, default=3, help="Rounds for the medians.")
    parser.add_argument("--only", default="push,incremental,fanout,deploy",
                        help="Comma-separated sections to run.")
    parser.add_argument("--keep", action="store_true", help="Leave the lab up afterwards.")
    parser.add_argument("--split-cpus", action="store_true",
                        help="Sender on all CPUs but the last, lab hosts on the last one "
                             "(separate machines, in miniature).")
    args = parser.parse_args()
    only = set(args.only.split(","))
    os.environ.setdefault("UMPROV_STATE_DIR", str(REPO / ".lab" / f"{args.lab}-state"))

    lab = umprov("lab", "up", "--hosts", str(args.hosts), "--name", args.lab)
    ensure_docker(lab)
    if sh(["docker", "image", "inspect", args.image]).returncode != 0:
        print(f"building {args.image}", file=sys.stderr)
        umprov("lab", "image", "--tag", args.image)
    size = int(sh(["docker", "image", "inspect", "-f", "{{.Size}}", args.image]).stdout.strip())
    inv = lab["inventory"]
    pub = str(Path(lab["key_file"]).with_suffix(".pub"))
    out: dict[str, Any] = {"image": args.image, "image_bytes": size, "hosts": args.hosts,
                           "cpus": os.cpu_count()}

    restore = split_cpus(lab, args.lab) if args.split_cpus else None
    out["split_cpus"] = bool(restore)
    try:
        if "push" in only:
            out["push"] = bench_push(lab, args.image, inv, pub, args.repeat)
        if "incremental" in only:
            out["incremental"] = bench_incremental(lab, args.image, inv, pub, args.repeat)
    finally:
        if restore is not None:
            restore()
    if "fanout" in only:
        out["push_all"] = bench_fanout(lab, args.image, inv, pub)
    if "deploy" in only:
        out["deploy"] = bench_deploy(lab, args.image, inv, pub)
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
