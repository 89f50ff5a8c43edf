"""Small helpers shared by the benchmarks: timing and a JSON result file per benchmark."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

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


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **data,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    return path
