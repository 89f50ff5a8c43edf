"""Command output through `docker exec` over umprov's SSH client: lost or whole (README "Exec").

The docker SDK's ``exec_start`` reads the upgraded connection past the HTTP client's buffer,
so output that arrived together with the response headers is dropped: exit code 0, empty
output. umprov's client reads through that buffer (umprov/hosts/engine.py, ``_exec_start``).
Both are run here in one session, against one container on one lab host, interleaved: N
``cat`` of a known file each, with ``--load`` threads spinning in this process beside them (a
busy control machine: the GIL and the CPUs taken), then one large output (stdout and stderr)
compared byte for byte.

    python bench/exec_output.py [--execs 300] [--load 0,2] [--lab bench-exec] [--keep]

Brings up a one-host lab (`umprov lab up`, `provision --only docker`), makes a tiny image on
that host from its own binaries, runs a container of it; `lab down` at the end unless --keep.
Results go to bench/results/exec_output.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import lab_options, save, tiny_container_lab  # noqa: E402

CONTAINER = "umprov-bench-exec"


def stock(container: Any, cmd: list[str], demux: bool = False) -> tuple[int | None, Any]:
    """The SDK's own exec_start (the class's method, not the one umprov's client mounts)."""
    import docker

    api = container.client.api
    exec_id = api.exec_create(container.id, cmd)["Id"]
    out = docker.APIClient.exec_start(api, exec_id, demux=demux)
    return api.exec_inspect(exec_id)["ExitCode"], out


def umprovs(container: Any, cmd: list[str], demux: bool = False) -> tuple[int | None, Any]:
    res = container.exec_run(cmd, demux=demux)
    return res.exit_code, res.output


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def round_of(container: Any, execs: int, load: int, expected: bytes) -> dict[str, Any]:
    stop = threading.Event()
    for _ in range(load):
        threading.Thread(target=spin, args=(stop,), daemon=True).start()
    counts = {name: {"empty": 0, "wrong": 0, "failed": 0} for name in ("sdk", "umprov")}
    cmd = ["cat", "/usr/lib/os-release"]
    try:
        for _ in range(execs):
            for name, run in (("sdk", stock), ("umprov", umprovs)):
                rc, out = run(container, cmd)
                if rc != 0:
                    counts[name]["failed"] += 1
                elif not out:
                    counts[name]["empty"] += 1
                elif out != expected:
                    counts[name]["wrong"] += 1
    finally:
        stop.set()
    return {"execs": execs, "busy_threads": load, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=300)
    parser.add_argument("--load", default="0,2", help="busy threads beside, per round")
    lab_options(parser, "bench-exec")
    args = parser.parse_args()

    from umprov.hosts.engine import docker_client

    with tiny_container_lab(args.lab, CONTAINER, keep=args.keep) as host:
        client = docker_client(host)
        container = client.containers.get(CONTAINER)
        content = subprocess.run(["docker", "exec", f"umprov-lab-{args.lab}-1", "cat",
                                  "/usr/lib/os-release"], capture_output=True, check=True).stdout
        rounds = [round_of(container, args.execs, int(n), content) for n in args.load.split(",")]
        big = ["sh", "-c", "base64 /usr/lib/x86_64-linux-gnu/libc.so.6; echo done >&2"]
        started = time.perf_counter()
        # Apart (demux): the engine copies stdout and stderr in two goroutines, so the order of
        # their frames in one stream differs from run to run.
        _, sdk_big = stock(container, big, demux=True)
        _, ours_big = umprovs(container, big, demux=True)
        large = {"stdout_bytes_sdk": len(sdk_big[0] or b""),
                 "stdout_bytes_umprov": len(ours_big[0] or b""),
                 "stderr_umprov": (ours_big[1] or b"").decode(), "equal": sdk_big == ours_big,
                 "seconds": round(time.perf_counter() - started, 2)}
        save("exec_output", {"rounds": rounds, "large_output": large})


if __name__ == "__main__":
    main()
