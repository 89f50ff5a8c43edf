"""SSH sessions that docker requests open on a host, and what they cost (README "Engine sessions").

Every HTTP connection of the docker SDK over SSH is one SSH session running ``docker system
dial-stdio`` on the host. The SDK keeps a pool of connections per URL (9 pools), and each exec
has URLs of its own: nearly every exec opens new sessions, while up to 9 stay open, idle, one
short of sshd's default MaxSessions (10). umprov's client keeps one pool for the engine
(umprov/hosts/engine.py). Both run here on one lab host, in alternating blocks (SDK, umprov,
SDK, umprov): N ``exec_run`` of ``cat`` each, first with the host idle, then with ``--host-load``
shell loops spinning on it. Counted: seconds, sessions opened, the most dial-stdio processes
on the host at once (sampled every 0.1 s), and execs that failed (a refused session).

    python bench/engine_sessions.py [--execs 100] [--host-load 0,2] [--lab bench-sessions] [--keep]

Results go to bench/results/engine_sessions.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import lab_options, on_host, save, tiny_container_lab  # noqa: E402

CONTAINER = "umprov-bench-sessions"


def with_sdk_pools(client: Any) -> Any:
    """``client`` given back the SDK's own pooling: a pool per URL, 9 pools of 10."""
    from docker import constants
    from docker.transport.sshconn import RecentlyUsedContainer, SSHHTTPAdapter

    adapter = client.api._custom_adapter
    adapter.pools = RecentlyUsedContainer(constants.DEFAULT_NUM_POOLS_SSH,
                                          dispose_func=lambda p: p.close())
    adapter.max_pool_size = constants.DEFAULT_MAX_POOL_SIZE
    adapter.get_connection = types.MethodType(SSHHTTPAdapter.get_connection, adapter)
    return client


def count_opens(client: Any) -> list[int]:
    """A counter of the sessions ``client``'s SSH connection opens from now on."""
    transport = client.api._custom_adapter.ssh_client.get_transport()
    opened = [0]
    open_session = transport.open_session

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened[0] += 1
        return open_session(*args, **kwargs)

    transport.open_session = counted
    return opened


class HostSessions:
    """The most ``docker system dial-stdio`` processes on the lab host at once while running."""

    def __init__(self, lab: str) -> None:
        self.lab, self.peak = lab, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.1):
            out = subprocess.run(["docker", "exec", f"umprov-lab-{self.lab}-1", "pgrep", "-c",
                                  "-f", "^docker system dial-stdio"],
                                 capture_output=True, text=True, check=False).stdout
            self.peak = max(self.peak, int(out.strip() or 0))

    def __enter__(self) -> HostSessions:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()


def block(lab: str, client: Any, execs: int) -> dict[str, Any]:
    container = client.containers.get(CONTAINER)
    opened = count_opens(client)
    failed, errors = 0, set()
    with HostSessions(lab) as host:
        started = time.perf_counter()
        for _ in range(execs):
            try:
                if container.exec_run(["cat", "/usr/lib/os-release"]).exit_code != 0:
                    failed += 1
            except Exception as exc:  # noqa: BLE001 - counted: a refused session
                failed += 1
                errors.add(f"{type(exc).__name__}: {exc}"[:120])
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "sessions_opened": opened[0],
            "peak_dial_stdio_on_host": host.peak, "failed": failed, "errors": sorted(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--host-load", default="0,2", help="shell loops on the host, per round")
    lab_options(parser, "bench-sessions")
    args = parser.parse_args()

    from umprov.hosts.engine import docker_client

    with tiny_container_lab(args.lab, CONTAINER, keep=args.keep) as host:
        rounds = []
        for load in (int(n) for n in args.host_load.split(",")):
            on_host(args.lab, "pkill -f '^sh -c while :' || true")
            for _ in range(load):
                subprocess.Popen(["docker", "exec", f"umprov-lab-{args.lab}-1", "sh", "-c",
                                  "while :; do :; done"])
            blocks: dict[str, list[dict[str, Any]]] = {"sdk": [], "umprov": []}
            for name in ("sdk", "umprov", "sdk", "umprov"):
                client = docker_client(host)
                if name == "sdk":
                    with_sdk_pools(client)
                blocks[name].append(block(args.lab, client, args.execs))
                client.close()
            sdk_s = sum(b["seconds"] for b in blocks["sdk"])
            ours_s = sum(b["seconds"] for b in blocks["umprov"])
            rounds.append({"host_load": load, "execs_per_block": args.execs, **blocks,
                           "umprov_time_ratio": round(ours_s / sdk_s, 3)})
        on_host(args.lab, "pkill -f '^sh -c while :' || true")
        save("engine_sessions", {"rounds": rounds})


if __name__ == "__main__":
    main()
