"""Small helpers shared by the benchmarks: timing, umprov's JSON, a one-host lab with a tiny
container on it, and a JSON result file per benchmark."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("UMPROV_BENCH_OUT", Path(__file__).parent / "results"))


def wall(argv: Sequence[str], *, repeat: int = 7, env: dict[str, str] | None = None) -> dict:
    """Median and spread of a command's wall time over `repeat` runs (after one warm-up)."""
    subprocess.run(argv, capture_output=True, check=True, env=env)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, env=env)
        times.append(time.perf_counter() - start)
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "runs": repeat,
    }


def umprov_json(*args: str, ok: tuple[int, ...] = (0,)) -> tuple[float, dict]:
    """Wall seconds and the JSON document of `umprov ARGS --json`, run from the repository; a
    run whose exit code is not in ``ok`` ends the benchmark, naming it and its stderr's end."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "umprov", *args, "--json"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if done.returncode not in ok:
        raise SystemExit(f"umprov {' '.join(args)} failed ({done.returncode}): "
                         f"{done.stderr[-800:]}")
    return took, json.loads(done.stdout) if done.stdout.strip() else {}


# The host's own cat, sh, sleep and base64 with the C library: an image made on the host itself.
TINY = ("tar -C / -c bin lib lib64 etc/ld.so.cache usr/bin/cat usr/bin/sh usr/bin/dash "
        "usr/bin/sleep usr/bin/base64 usr/lib64 usr/lib/x86_64-linux-gnu/libc.so.6 "
        "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 usr/lib/os-release "
        "| docker import - umprov-bench/tiny:1 >/dev/null")


def on_host(lab: str, command: str) -> str:
    """``sh -c COMMAND`` on the lab's first host (its container, from this machine): stdout."""
    done = subprocess.run(["docker", "exec", f"umprov-lab-{lab}-1", "sh", "-c", command],
                          text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"on the lab host: {command}: {done.stderr[-600:]}")
    return done.stdout


def lab_options(parser: argparse.ArgumentParser, lab: str) -> None:
    parser.add_argument("--lab", default=lab, help="name of the benchmark's own lab")
    parser.add_argument("--keep", action="store_true", help="leave the lab up at the end")


@contextmanager
def tiny_container_lab(lab: str, container: str, *, keep: bool = False) -> Iterator[Any]:
    """A one-host lab (`lab up`, `provision --only docker`) running CONTAINER, of an image made
    on the host from its own binaries; its inventory host. `lab down` after, unless ``keep``."""
    from umprov.inventory import load_inventory

    _, up = umprov_json("lab", "up", "--name", lab, "--hosts", "1")
    try:
        umprov_json("provision", up["inventory"], "--only", "docker")
        on_host(lab, f"docker rm -f {container} >/dev/null 2>&1; {TINY}; docker run -d "
                     f"--name {container} umprov-bench/tiny:1 sleep infinity >/dev/null")
        yield load_inventory(up["inventory"]).hosts[0]
    finally:
        if not keep:
            subprocess.run([sys.executable, "-m", "umprov", "lab", "down", "--name", lab],
                           cwd=REPO, capture_output=True, check=False)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (a rendezvous for a child)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict:
    """What tells two lent machines apart: figures of one card model still differ by host
    (quick runs of one agent: 2.4-2.5 s on one H100 lease, 3.1-3.4 s on another)."""
    cpu = ""
    with suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "kernel": platform.release()}


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **data,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    return path
