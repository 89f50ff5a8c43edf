"""`umprov lab up --hosts 3`: from a cached host image (target < 30 s) and, with --cold, from
nothing (the image removed first; target < 3 minutes). Needs root and a Docker engine."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _common import save

UMPROV = str(Path(sys.executable).parent / "umprov")
NAME = "bench"


def timed(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([UMPROV, *args], check=True, capture_output=True)
    return round(time.perf_counter() - start, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="also time a build from nothing")
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args()
    result: dict = {"hosts": args.hosts}
    subprocess.run([UMPROV, "lab", "down", "--name", NAME], check=True, capture_output=True)
    if args.cold:
        subprocess.run([UMPROV, "lab", "down", "--name", NAME, "--purge"], check=True,
                       capture_output=True)
        result["cold_up_s"] = timed("lab", "up", "--hosts", str(args.hosts), "--name", NAME)
        result["cold_target_s"] = 180
        subprocess.run([UMPROV, "lab", "down", "--name", NAME], check=True, capture_output=True)
    result["warm_up_s"] = timed("lab", "up", "--hosts", str(args.hosts), "--name", NAME)
    result["warm_target_s"] = 30
    result["idempotent_up_s"] = timed("lab", "up", "--hosts", str(args.hosts), "--name", NAME)
    result["down_s"] = timed("lab", "down", "--name", NAME)
    save("lab_up", result)


if __name__ == "__main__":
    main()
