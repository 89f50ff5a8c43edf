"""Two verifier builds on one GPU host, interleaved: wall time of full and --quick runs.

A reshaping of the agent must not make verification slower. This runs another build of the
agent (``--old``: a single-file agent.py of an earlier commit, or another zipapp) and this
checkout's zipapp alternately, round by round, the order swapped every round, so both see the
same machine; each run is the command line users run (`--expected-gpus N`, then `--quick`).

    git show 418d645:umprov/verify/agent.py > /tmp/agent-418d645.py
    python3 bench/verify_ab.py --old /tmp/agent-418d645.py --repeat 3    # on the GPU host

Reports, per build and mode, the median and range of the wall time, the agent's own
``wall_s`` and the verdicts (bench/results/verify_ab.json). NVLink multicast stays off, as on
every run of the verifier here.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import save  # noqa: E402

from umprov.verify.bundle import agent_zipapp  # noqa: E402

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def run(agent: Path, args: list[str], out: Path) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, str(agent), "--quiet", "--json", str(out), *args],
                   check=False, env={**os.environ, **NVLS_OFF})
    wall = time.perf_counter() - started
    doc = json.loads(out.read_text())
    return {"wall_s": round(wall, 2), "agent_wall_s": doc.get("wall_s"),
            "verdict": doc.get("verdict"), "records": len(doc.get("records", []))}


def summary(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"median_s": round(statistics.median(walls), 2), "min_s": min(walls),
            "max_s": max(walls), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the other agent (agent.py or .pyz)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also copy the result here")
    args = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    builds = {"old": args.old.resolve(), "new": agent_zipapp()}
    modes = {"full": ["--expected-gpus", str(gpus)],
             "quick": ["--quick", "--expected-gpus", str(gpus)]}
    results: dict[str, dict[str, list[dict]]] = {b: {m: [] for m in modes} for b in builds}
    tmp = Path(tempfile.mkdtemp(prefix="verify-ab-"))
    for round_ in range(args.repeat):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for mode, mode_args in modes.items():
            for build in order:
                r = run(builds[build], mode_args, tmp / f"{build}-{mode}-{round_}.json")
                results[build][mode].append(r)
                print(f"round {round_ + 1} {mode} {build}: {r}", flush=True)
    result = {"gpus": gpus, "gpu_name": torch.cuda.get_device_name(0) if gpus else "none",
              "torch": torch.__version__, "old": str(args.old),
              **{b: {m: summary(rs) for m, rs in per.items()} for b, per in results.items()}}
    for mode in modes:
        result[f"{mode}_ratio_new_to_old"] = round(
            result["new"][mode]["median_s"] / result["old"][mode]["median_s"], 3)
    save("verify_ab", result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verify_ab.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
